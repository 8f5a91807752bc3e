//! rebootd-lab: the stand-ins (update_engine, logind, Kubernetes API), the etcd launcher and the
//! fleet harness shared by the integration tests, the demo and the benchmarks.

pub mod airlock;
pub mod bench;
pub mod chaos;
pub mod count_proxy;
pub mod cut_proxy;
pub mod dbus;
pub mod etcd;
pub mod etcd_cluster;
pub mod fake_logind;
pub mod fake_update_engine;
pub mod fleet;
pub mod fleetlock;
pub mod http_stub;
pub mod locksmith;
pub mod node;
pub mod nspawn;
pub mod prometheus;
pub mod serve;
pub mod v2_watcher;
pub mod webhook;

pub use rebootd_lab_kube as kube_api;
