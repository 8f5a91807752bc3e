//! An in-memory Kubernetes API server stand-in for rebootd's lab, faithful enough for kubectl
//! and kube-rs on what rebootd uses: discovery, Nodes, Pods and their eviction,
//! PodDisruptionBudgets, Leases, Events, ReplicaSets and DaemonSets; get, list, watch, create,
//! replace, patch and delete; optimistic concurrency; and a small simulated control plane
//! (scheduler, kubelet readiness, ReplicaSet/DaemonSet controllers, disruption budgets,
//! graceful pod termination on a lab-wide time scale).
//!
//! ```no_run
//! # async fn demo() -> Result<(), rebootd_lab_kube::Error> {
//! use rebootd_lab_kube::{KubeApi, NodeBuilder, Options};
//! let api = KubeApi::start(Options::default()).await?;
//! api.cluster().add(&NodeBuilder::new("worker-1"))?;
//! api.write_kubeconfig(std::path::Path::new("/tmp/kubeconfig"))?;
//! # Ok(()) }
//! ```
//!
//! See `lab/kube-api/README.md` for what is covered and what is not.

mod admission;
mod cli;
mod cluster;
mod controllers;
mod discovery;
mod error;
mod events;
mod faults;
mod handlers;
mod http;
mod kind;
mod kubeconfig;
mod meta;
mod objects;
mod openapi;
mod patch;
mod pdb;
mod router;
mod selector;
mod server;
mod store;
mod strategy;
mod table;
mod timers;
mod watch;

pub use admission::{Admission, AdmissionFn};
pub use cli::{run, serve_cli, start as start_cli, CliArgs};
pub use cluster::{Cluster, Snapshot, WaitTimeout};
pub use error::{ApiError, Error};
pub use faults::{FaultAction, FaultRule, Faults, RequestLog, RequestRecord};
pub use kind::Kind;
pub use objects::{
    DaemonSetBuilder, LeaseBuilder, NodeBuilder, Object, PdbBuilder, PodBuilder, ReplicaSetBuilder,
};
pub use pdb::Budget;
pub use server::{KubeApi, KubeApiHandle, Options};
pub use strategy::KUBELET_IGNORE_ANNOTATION;
pub use watch::events_sent as watch_events_sent;
