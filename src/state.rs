//! state (being written)
