//! reboot (being written)
