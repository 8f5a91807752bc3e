//! notify (being written)
