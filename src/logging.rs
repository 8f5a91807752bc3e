//! logging (being written)
