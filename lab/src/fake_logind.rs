//! fake_logind (being written)
