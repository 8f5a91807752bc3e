//! Clients of the stores, apart from the lock's rules: etcd's v2 keys API (hand-written, over
//! [`crate::http`]), etcd v3 (the `etcd-client` crate: connection options, TLS, and how its
//! errors sort into transient and permanent ones) and the FleetLock protocol (over
//! [`crate::http`]). The lock adapters in [`crate::lock`] use them.

pub mod etcd_v2;
pub mod etcd_v3;
pub mod fleetlock;
