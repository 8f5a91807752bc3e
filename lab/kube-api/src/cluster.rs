//! [`Cluster`]: the in-process API of the stand-in, for tests and the lab: read objects, add
//! and change them directly (no HTTP), mark nodes Ready/NotReady, wait for a condition on the
//! store, inject faults and read the request log.

use std::time::Duration;

use serde_json::{json, Value};

use crate::controllers;
use crate::error::ApiError;
use crate::events;
use crate::faults::{Faults, RequestLog};
use crate::kind::Kind;
use crate::meta;
use crate::objects::{Object, ReplicaSetBuilder};
use crate::pdb::{self, Budget};
use crate::store::{DeleteOptions, State, Store};
use crate::strategy;

/// A condition was not met in time.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("condition not met within {0:?}")]
pub struct WaitTimeout(pub Duration);

/// A read-only view of the store, for [`Cluster::wait_for`] conditions.
pub struct Snapshot<'a>(&'a State);

impl Snapshot<'_> {
    /// One object as clients of `kind` see it; `ns` is ignored for cluster-scoped kinds.
    pub fn get(&self, kind: Kind, ns: &str, name: &str) -> Option<Value> {
        self.0
            .get(kind, ns, name)
            .map(|o| events::to_view(kind, o.clone()))
    }

    /// Objects of a kind, in one namespace or all.
    pub fn list(&self, kind: Kind, ns: Option<&str>) -> Vec<Value> {
        self.0
            .iter(kind, ns)
            .map(|o| events::to_view(kind, o.clone()))
            .collect()
    }

    /// Objects of a kind as stored, borrowed: no copy (a condition run at every write of a
    /// large store, as the benches' outside watcher is, would spend its time copying them).
    pub fn stored(&self, kind: Kind, ns: Option<&str>) -> impl Iterator<Item = &Value> + '_ {
        self.0.iter(kind, ns)
    }

    /// The pods bound to a node.
    pub fn pods_on_node(&self, node: &str) -> Vec<Value> {
        self.0
            .iter(Kind::Pod, None)
            .filter(|p| meta::node_name(p) == node)
            .cloned()
            .collect()
    }

    pub fn resource_version(&self) -> u64 {
        self.0.resource_version()
    }
}

/// The in-process handle on the stand-in's state (cheap to clone).
#[derive(Clone)]
pub struct Cluster {
    store: Store,
    faults: Faults,
    log: RequestLog,
}

impl Cluster {
    pub(crate) fn new(store: Store, faults: Faults, log: RequestLog) -> Self {
        Cluster { store, faults, log }
    }

    /// Read under the lock (`f` must not call back into this `Cluster`).
    pub fn read<R>(&self, f: impl FnOnce(&Snapshot<'_>) -> R) -> R {
        self.store.read(|st| f(&Snapshot(st)))
    }

    pub fn get(&self, kind: Kind, ns: &str, name: &str) -> Option<Value> {
        self.read(|s| s.get(kind, ns, name))
    }

    pub fn list(&self, kind: Kind, ns: Option<&str>) -> Vec<Value> {
        self.read(|s| s.list(kind, ns))
    }

    pub fn node(&self, name: &str) -> Option<Value> {
        self.get(Kind::Node, "", name)
    }

    pub fn pod(&self, ns: &str, name: &str) -> Option<Value> {
        self.get(Kind::Pod, ns, name)
    }

    pub fn lease(&self, ns: &str, name: &str) -> Option<Value> {
        self.get(Kind::Lease, ns, name)
    }

    pub fn pods_on_node(&self, node: &str) -> Vec<Value> {
        self.read(|s| s.pods_on_node(node))
    }

    /// The numbers of a PodDisruptionBudget as the eviction subresource sees them now.
    pub fn budget(&self, ns: &str, name: &str) -> Option<Budget> {
        self.store.read(|st| {
            st.get(Kind::PodDisruptionBudget, ns, name)
                .map(|b| pdb::compute(st, b))
        })
    }

    /// The cluster-wide resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.store.read(State::resource_version)
    }

    /// Store an object as given (status included; defaults filled in).
    pub fn create(&self, kind: Kind, obj: Value) -> Result<Value, ApiError> {
        let mut stored = events::from_view(kind, obj);
        strategy::defaults(kind.storage(), &mut stored);
        let out = self.store.write(|st| st.create(kind, stored, false))?;
        Ok(events::to_view(kind, out))
    }

    /// Store a built object.
    pub fn add(&self, o: &impl Object) -> Result<Value, ApiError> {
        self.create(o.kind(), o.build())
    }

    /// Store a ReplicaSet and, in the same step, one Ready pod of it on each of `nodes` (its
    /// replicas default to `nodes.len()`), so the controller does not place them itself.
    pub fn add_replicaset(
        &self,
        rs: &ReplicaSetBuilder,
        nodes: &[&str],
    ) -> Result<(Value, Vec<Value>), ApiError> {
        let mut obj = rs.build();
        obj["spec"]["replicas"] = json!(rs.replicas_or(nodes.len() as i64));
        strategy::defaults(Kind::ReplicaSet, &mut obj);
        self.store.write(|st| {
            let rs = st.create(Kind::ReplicaSet, obj, false)?;
            let mut pods = Vec::new();
            for n in nodes {
                let mut pod = controllers::pod_from_template(&rs, Kind::ReplicaSet, Some(n));
                controllers::set_running(&mut pod, "", json!("127.0.0.1"));
                pods.push(st.create(Kind::Pod, pod, false)?);
            }
            Ok((rs, pods))
        })
    }

    /// Change an object in place: no resourceVersion check, status writable; uid, name,
    /// namespace, creation and deletion fields are kept.
    pub fn update(
        &self,
        kind: Kind,
        ns: &str,
        name: &str,
        f: impl FnOnce(&mut Value),
    ) -> Result<Value, ApiError> {
        let out = self.store.write(|st| {
            st.modify(kind, ns, name, |o| {
                let mut view = events::to_view(kind, o.clone());
                f(&mut view);
                *o = events::from_view(kind, view);
            })
        })?;
        Ok(events::to_view(kind, out))
    }

    /// Delete as a client would (pods on a node terminate over their grace period, owned pods
    /// of a ReplicaSet or DaemonSet go too).
    pub fn delete(&self, kind: Kind, ns: &str, name: &str) -> Result<Value, ApiError> {
        let out = self
            .store
            .write(|st| st.delete(kind, ns, name, &DeleteOptions::default()))?;
        Ok(events::to_view(kind, out))
    }

    /// Take an object out now, whatever it is.
    pub fn remove(&self, kind: Kind, ns: &str, name: &str) -> Option<Value> {
        self.store
            .write(|st| st.remove(kind, ns, name))
            .map(|o| events::to_view(kind, o))
    }

    /// Mark a node Ready or NotReady. Pods on a NotReady node lose readiness; they are Ready
    /// again the pod-ready delay after the node is.
    pub fn set_node_ready(&self, name: &str, ready: bool) -> Result<Value, ApiError> {
        self.store.write(|st| {
            st.modify(Kind::Node, "", name, |n| {
                if ready {
                    meta::set_condition(
                        n,
                        "Ready",
                        "True",
                        "KubeletReady",
                        "kubelet is posting ready status",
                    );
                } else {
                    meta::set_condition(
                        n,
                        "Ready",
                        "Unknown",
                        "NodeStatusUnknown",
                        "Kubelet stopped posting node status.",
                    );
                }
            })
        })
    }

    /// Change the lab-wide time scale (real time = simulated time x scale) for what is
    /// scheduled from now on.
    pub fn set_time_scale(&self, scale: f64) {
        self.store.update_sim(|s| s.time_scale = scale);
    }

    /// Change the simulated delay before a pod on a Ready node is Ready.
    pub fn set_pod_ready_delay(&self, d: Duration) {
        self.store.update_sim(|s| s.pod_ready_delay = d);
    }

    /// Wait until `f` returns `Some` (checked now and after every change), at most `timeout`.
    /// `f` runs under the store's lock: use the [`Snapshot`], never this `Cluster`, inside it.
    pub async fn wait_for<T>(
        &self,
        timeout: Duration,
        mut f: impl FnMut(&Snapshot<'_>) -> Option<T>,
    ) -> Result<T, WaitTimeout> {
        let mut rx = self.store.changes();
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            rx.borrow_and_update();
            if let Some(t) = self.read(&mut f) {
                return Ok(t);
            }
            match tokio::time::timeout_at(deadline, rx.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) | Err(_) => return Err(WaitTimeout(timeout)),
            }
        }
    }

    /// The fault rules.
    pub fn faults(&self) -> &Faults {
        &self.faults
    }

    /// The request log.
    pub fn requests(&self) -> &RequestLog {
        &self.log
    }
}
