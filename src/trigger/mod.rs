//! Triggers (being written)
