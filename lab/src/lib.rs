//! rebootd-lab: the stand-ins (update_engine, logind, Kubernetes API), the etcd launcher and the
//! fleet harness shared by the integration tests, the demo and the benchmarks.

pub use rebootd_lab_kube as kube_api;
