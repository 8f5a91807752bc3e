//! fake_update_engine (being written)
