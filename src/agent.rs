//! agent (being written)
