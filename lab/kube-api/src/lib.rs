//! An in-memory Kubernetes API server stand-in for rebootd's lab (work in progress).
