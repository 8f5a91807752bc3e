//! etcd v3 lock backend (locksmith-compatible). Work in progress.
