//! status (being written)
