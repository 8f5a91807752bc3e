//! Builders for the objects tests put in the cluster: Nodes, Pods, ReplicaSets, DaemonSets,
//! PodDisruptionBudgets and Leases, with realistic defaults (a Ready node with the usual
//! labels and conditions, a Running and Ready pod, ...).

use std::collections::BTreeMap;

use serde_json::{json, Value};

use crate::kind::Kind;
use crate::meta;

/// Something [`crate::Cluster::add`] can store.
pub trait Object {
    fn kind(&self) -> Kind;
    fn build(&self) -> Value;
}

const IMAGE: &str = "registry.k8s.io/pause:3.10";

fn map(m: &BTreeMap<String, String>) -> Value {
    json!(m)
}

/// A Node, Ready and schedulable unless told otherwise.
#[derive(Debug, Clone)]
pub struct NodeBuilder {
    name: String,
    labels: BTreeMap<String, String>,
    annotations: BTreeMap<String, String>,
    ready: bool,
    unschedulable: bool,
    boot_id: String,
}

impl NodeBuilder {
    pub fn new(name: &str) -> Self {
        let mut labels = BTreeMap::new();
        labels.insert("kubernetes.io/hostname".into(), name.to_string());
        labels.insert("kubernetes.io/os".into(), "linux".into());
        labels.insert("kubernetes.io/arch".into(), "amd64".into());
        NodeBuilder {
            name: name.to_string(),
            labels,
            annotations: BTreeMap::new(),
            ready: true,
            unschedulable: false,
            boot_id: meta::new_uid(),
        }
    }
    pub fn label(mut self, k: &str, v: &str) -> Self {
        self.labels.insert(k.into(), v.into());
        self
    }
    pub fn annotation(mut self, k: &str, v: &str) -> Self {
        self.annotations.insert(k.into(), v.into());
        self
    }
    pub fn ready(mut self, ready: bool) -> Self {
        self.ready = ready;
        self
    }
    pub fn unschedulable(mut self, u: bool) -> Self {
        self.unschedulable = u;
        self
    }
    /// `status.nodeInfo.bootID`.
    pub fn boot_id(mut self, id: &str) -> Self {
        self.boot_id = id.to_string();
        self
    }
}

impl Object for NodeBuilder {
    fn kind(&self) -> Kind {
        Kind::Node
    }
    fn build(&self) -> Value {
        let now = meta::now_rfc3339();
        let cond = |t: &str, s: &str, reason: &str, msg: &str| {
            json!({"type": t, "status": s, "reason": reason, "message": msg,
                "lastHeartbeatTime": now, "lastTransitionTime": now})
        };
        let ready = if self.ready {
            cond(
                "Ready",
                "True",
                "KubeletReady",
                "kubelet is posting ready status",
            )
        } else {
            cond(
                "Ready",
                "False",
                "KubeletNotReady",
                "container runtime network not ready",
            )
        };
        let mut spec = json!({"podCIDR": "10.244.0.0/24"});
        if self.unschedulable {
            spec["unschedulable"] = json!(true);
        }
        json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": self.name, "labels": map(&self.labels),
                "annotations": map(&self.annotations)},
            "spec": spec,
            "status": {
                "conditions": [
                    cond("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
                    cond("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
                    cond("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
                    ready,
                ],
                "addresses": [{"type": "InternalIP", "address": "127.0.0.1"},
                    {"type": "Hostname", "address": self.name}],
                "capacity": {"cpu": "2", "memory": "4Gi", "pods": "110"},
                "allocatable": {"cpu": "2", "memory": "4Gi", "pods": "110"},
                "nodeInfo": {"bootID": self.boot_id, "machineID": self.boot_id.replace('-', ""),
                    "systemUUID": self.boot_id, "kubeletVersion": "v1.32.0",
                    "kubeProxyVersion": "v1.32.0", "containerRuntimeVersion": "containerd://1.7.0",
                    "kernelVersion": "6.6.0", "osImage": "Flatcar Container Linux (rebootd lab)",
                    "operatingSystem": "linux", "architecture": "amd64"},
            },
        })
    }
}

/// A Pod: Running and Ready when it has a node, Pending otherwise.
#[derive(Debug, Clone)]
pub struct PodBuilder {
    ns: String,
    name: String,
    node: Option<String>,
    labels: BTreeMap<String, String>,
    annotations: BTreeMap<String, String>,
    owner: Option<Value>,
    phase: Option<String>,
    ready: bool,
    grace: Option<i64>,
    empty_dir: bool,
}

impl PodBuilder {
    pub fn new(ns: &str, name: &str) -> Self {
        PodBuilder {
            ns: ns.to_string(),
            name: name.to_string(),
            node: None,
            labels: BTreeMap::new(),
            annotations: BTreeMap::new(),
            owner: None,
            phase: None,
            ready: true,
            grace: None,
            empty_dir: false,
        }
    }
    pub fn on_node(mut self, node: &str) -> Self {
        self.node = Some(node.to_string());
        self
    }
    pub fn label(mut self, k: &str, v: &str) -> Self {
        self.labels.insert(k.into(), v.into());
        self
    }
    pub fn annotation(mut self, k: &str, v: &str) -> Self {
        self.annotations.insert(k.into(), v.into());
        self
    }
    /// A controller owner reference to `owner` (a stored ReplicaSet, DaemonSet, ...).
    pub fn owned_by(mut self, kind: Kind, owner: &Value) -> Self {
        self.owner = Some(meta::owner_reference(
            &kind.api_version(),
            kind.kind_name(),
            owner,
        ));
        self
    }
    /// `status.phase` (`Succeeded`, `Failed`, `Pending`, ...).
    pub fn phase(mut self, phase: &str) -> Self {
        self.phase = Some(phase.to_string());
        self
    }
    /// Not Ready, and left so by the simulated kubelet.
    pub fn not_ready(mut self) -> Self {
        self.ready = false;
        self.annotations.insert(
            crate::strategy::KUBELET_IGNORE_ANNOTATION.into(),
            "ignore".into(),
        );
        self
    }
    pub fn grace_period(mut self, seconds: i64) -> Self {
        self.grace = Some(seconds);
        self
    }
    /// Add an emptyDir volume (kubectl drain wants `--delete-emptydir-data` for it).
    pub fn empty_dir(mut self) -> Self {
        self.empty_dir = true;
        self
    }
    /// Make it a mirror (static) pod.
    pub fn mirror(self) -> Self {
        self.annotation("kubernetes.io/config.mirror", "lab")
    }
}

impl Object for PodBuilder {
    fn kind(&self) -> Kind {
        Kind::Pod
    }
    fn build(&self) -> Value {
        let mut metadata = json!({"name": self.name, "namespace": self.ns,
            "labels": map(&self.labels), "annotations": map(&self.annotations)});
        if let Some(o) = &self.owner {
            metadata["ownerReferences"] = json!([o]);
        }
        let mut spec = json!({"containers": [{"name": "app", "image": IMAGE}],
            "terminationGracePeriodSeconds": self.grace.unwrap_or(30)});
        if self.empty_dir {
            spec["volumes"] = json!([{"name": "scratch", "emptyDir": {}}]);
            spec["containers"][0]["volumeMounts"] =
                json!([{"name": "scratch", "mountPath": "/scratch"}]);
        }
        let mut pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec,
            "status": {"phase": "Pending"}});
        if let Some(n) = &self.node {
            pod["spec"]["nodeName"] = json!(n);
            if self.ready && self.phase.is_none() {
                crate::controllers::set_running(&mut pod, "", json!("127.0.0.1"));
            }
        }
        if let Some(p) = &self.phase {
            pod["status"]["phase"] = json!(p);
        }
        pod
    }
}

/// A ReplicaSet whose selector and template carry `labels`.
#[derive(Debug, Clone)]
pub struct ReplicaSetBuilder {
    ns: String,
    name: String,
    replicas: Option<i64>,
    labels: BTreeMap<String, String>,
    grace: i64,
}

impl ReplicaSetBuilder {
    pub fn new(ns: &str, name: &str) -> Self {
        let mut labels = BTreeMap::new();
        labels.insert("app".into(), name.to_string());
        ReplicaSetBuilder {
            ns: ns.to_string(),
            name: name.to_string(),
            replicas: None,
            labels,
            grace: 30,
        }
    }
    pub fn replicas(mut self, n: i64) -> Self {
        self.replicas = Some(n);
        self
    }
    /// Replace the default `app=<name>` labels.
    pub fn labels(mut self, labels: &[(&str, &str)]) -> Self {
        self.labels = labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        self
    }
    /// terminationGracePeriodSeconds of its pods.
    pub fn grace_period(mut self, seconds: i64) -> Self {
        self.grace = seconds;
        self
    }
    pub(crate) fn replicas_or(&self, n: i64) -> i64 {
        self.replicas.unwrap_or(n)
    }
}

impl Object for ReplicaSetBuilder {
    fn kind(&self) -> Kind {
        Kind::ReplicaSet
    }
    fn build(&self) -> Value {
        json!({
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "metadata": {"name": self.name, "namespace": self.ns, "labels": map(&self.labels)},
            "spec": {
                "replicas": self.replicas.unwrap_or(1),
                "selector": {"matchLabels": map(&self.labels)},
                "template": {
                    "metadata": {"labels": map(&self.labels)},
                    "spec": {"containers": [{"name": "app", "image": IMAGE}],
                        "terminationGracePeriodSeconds": self.grace},
                },
            },
        })
    }
}

/// A DaemonSet (its controller puts one pod on every node).
#[derive(Debug, Clone)]
pub struct DaemonSetBuilder {
    ns: String,
    name: String,
    labels: BTreeMap<String, String>,
}

impl DaemonSetBuilder {
    pub fn new(ns: &str, name: &str) -> Self {
        let mut labels = BTreeMap::new();
        labels.insert("app".into(), name.to_string());
        DaemonSetBuilder {
            ns: ns.to_string(),
            name: name.to_string(),
            labels,
        }
    }
}

impl Object for DaemonSetBuilder {
    fn kind(&self) -> Kind {
        Kind::DaemonSet
    }
    fn build(&self) -> Value {
        json!({
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": {"name": self.name, "namespace": self.ns, "labels": map(&self.labels)},
            "spec": {
                "selector": {"matchLabels": map(&self.labels)},
                "template": {
                    "metadata": {"labels": map(&self.labels)},
                    "spec": {"containers": [{"name": "agent", "image": IMAGE}],
                        "terminationGracePeriodSeconds": 5},
                },
            },
        })
    }
}

/// A PodDisruptionBudget (policy/v1).
#[derive(Debug, Clone)]
pub struct PdbBuilder {
    ns: String,
    name: String,
    match_labels: BTreeMap<String, String>,
    min_available: Option<Value>,
    max_unavailable: Option<Value>,
    unhealthy_policy: Option<String>,
}

impl PdbBuilder {
    pub fn new(ns: &str, name: &str) -> Self {
        PdbBuilder {
            ns: ns.to_string(),
            name: name.to_string(),
            match_labels: BTreeMap::new(),
            min_available: None,
            max_unavailable: None,
            unhealthy_policy: None,
        }
    }
    pub fn selector(mut self, k: &str, v: &str) -> Self {
        self.match_labels.insert(k.into(), v.into());
        self
    }
    /// `2` or `"50%"`.
    pub fn min_available(mut self, v: impl Into<Value>) -> Self {
        self.min_available = Some(v.into());
        self
    }
    /// `1` or `"25%"`.
    pub fn max_unavailable(mut self, v: impl Into<Value>) -> Self {
        self.max_unavailable = Some(v.into());
        self
    }
    /// `IfHealthyBudget` (default) or `AlwaysAllow`.
    pub fn unhealthy_pod_eviction_policy(mut self, p: &str) -> Self {
        self.unhealthy_policy = Some(p.to_string());
        self
    }
}

impl Object for PdbBuilder {
    fn kind(&self) -> Kind {
        Kind::PodDisruptionBudget
    }
    fn build(&self) -> Value {
        let mut spec = json!({"selector": {"matchLabels": map(&self.match_labels)}});
        if let Some(v) = &self.min_available {
            spec["minAvailable"] = v.clone();
        }
        if let Some(v) = &self.max_unavailable {
            spec["maxUnavailable"] = v.clone();
        }
        if let Some(p) = &self.unhealthy_policy {
            spec["unhealthyPodEvictionPolicy"] = json!(p);
        }
        json!({
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": self.name, "namespace": self.ns},
            "spec": spec,
        })
    }
}

/// A Lease (coordination.k8s.io/v1).
#[derive(Debug, Clone)]
pub struct LeaseBuilder {
    ns: String,
    name: String,
    holder: Option<String>,
    duration: Option<i64>,
}

impl LeaseBuilder {
    pub fn new(ns: &str, name: &str) -> Self {
        LeaseBuilder {
            ns: ns.to_string(),
            name: name.to_string(),
            holder: None,
            duration: None,
        }
    }
    pub fn holder(mut self, id: &str) -> Self {
        self.holder = Some(id.to_string());
        self
    }
    pub fn duration_seconds(mut self, s: i64) -> Self {
        self.duration = Some(s);
        self
    }
}

impl Object for LeaseBuilder {
    fn kind(&self) -> Kind {
        Kind::Lease
    }
    fn build(&self) -> Value {
        let mut spec = json!({});
        if let Some(h) = &self.holder {
            spec["holderIdentity"] = json!(h);
            spec["acquireTime"] = json!(micro_now());
            spec["renewTime"] = json!(micro_now());
            spec["leaseTransitions"] = json!(0);
        }
        if let Some(d) = self.duration {
            spec["leaseDurationSeconds"] = json!(d);
        }
        json!({
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self.name, "namespace": self.ns},
            "spec": spec,
        })
    }
}

/// Now as a `MicroTime`.
fn micro_now() -> String {
    let s = meta::now_rfc3339();
    format!("{}.000000Z", s.trim_end_matches('Z'))
}
