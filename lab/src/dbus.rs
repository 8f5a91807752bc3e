//! dbus (being written)
