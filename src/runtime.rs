//! runtime (being written)
