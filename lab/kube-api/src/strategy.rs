//! Per-kind defaulting on create, like the real server's defaulters and create strategies: pods
//! get a grace period and a Pending status, controllers' statuses are recomputed, and so on.

use serde_json::{json, Value};

use crate::kind::Kind;
use crate::meta;

/// Annotation that makes the simulated kubelet leave a pod's readiness alone (for tests that
/// want a pod to stay not Ready or Pending).
pub const KUBELET_IGNORE_ANNOTATION: &str = "rebootd-lab.io/kubelet";

fn set_default(obj: &mut Value, pointer_parent: &str, key: &str, v: Value) {
    let parent = meta::object_mut(obj, pointer_parent);
    parent.entry(key.to_string()).or_insert(v);
}

/// Defaults applied to every create, from the API or in-process.
pub fn defaults(kind: Kind, obj: &mut Value) {
    match kind {
        Kind::Pod => {
            set_default(obj, "spec", "terminationGracePeriodSeconds", json!(30));
            set_default(obj, "spec", "restartPolicy", json!("Always"));
            set_default(obj, "spec", "schedulerName", json!("default-scheduler"));
            set_default(obj, "spec", "dnsPolicy", json!("ClusterFirst"));
            set_default(obj, "spec", "containers", json!([]));
            set_default(obj, "status", "phase", json!("Pending"));
            set_default(obj, "status", "qosClass", json!("BestEffort"));
        }
        Kind::Node => {
            set_default(obj, "spec", "unschedulable", Value::Null);
            if let Some(s) = obj.get_mut("spec").and_then(Value::as_object_mut) {
                if s.get("unschedulable").is_some_and(Value::is_null) {
                    s.remove("unschedulable");
                }
            }
            meta::object_mut(obj, "status");
        }
        Kind::Namespace => {
            set_default(obj, "spec", "finalizers", json!(["kubernetes"]));
            set_default(obj, "status", "phase", json!("Active"));
        }
        Kind::ReplicaSet => {
            set_default(obj, "spec", "replicas", json!(1));
        }
        Kind::Lease => {
            meta::object_mut(obj, "spec");
        }
        _ => {}
    }
}

/// What an API create resets before defaulting: the status of kinds whose status the server
/// owns.
pub fn api_create(kind: Kind, obj: &mut Value) {
    if let Some(m) = obj.as_object_mut() {
        match kind {
            Kind::Pod => {
                m.insert(
                    "status".into(),
                    json!({"phase": "Pending", "qosClass": "BestEffort"}),
                );
            }
            Kind::ReplicaSet | Kind::DaemonSet | Kind::PodDisruptionBudget => {
                m.remove("status");
            }
            _ => {}
        }
    }
    defaults(kind, obj);
}
