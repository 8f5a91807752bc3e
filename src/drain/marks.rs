//! What rebootd puts on its own Node while it reboots, besides the cordon: the configured labels
//! (`[kubernetes] reboot_labels`), the taint `rebootd.io/rebooting=true` with effect `NoSchedule`
//! or `PreferNoSchedule` (`reboot_taint`), and `node.kubernetes.io/exclude-from-external-load-balancers`
//! (`exclude_from_load_balancers`, with a wait before the evictions so load balancers drain
//! their connections first).
//!
//! Only what rebootd added is removed: a label already on the Node (any value) or a taint with
//! rebootd's key already there is left alone. What was added is recorded in the annotation
//! `rebootd.io/added` **in the same write** that adds it, and removed with it in the write that
//! takes them off, so a crash at any point leaves the record and the marks in step. Writes carry
//! the resourceVersion read (the taints are one list): a conflict is read again and retried.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

/// The taint's key (the admission policy's `managedTaint`).
pub const TAINT_KEY: &str = "rebootd.io/rebooting";

/// The label that takes a node out of external load balancers (service controller).
pub const EXCLUDE_LB: &str = "node.kubernetes.io/exclude-from-external-load-balancers";

/// Where rebootd records what it added (JSON [`Added`]).
pub const ADDED: &str = "rebootd.io/added";

/// Tries of a read-modify-write that meets conflicts (other writers of the Node).
const TRIES: usize = 5;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaintEffect {
    NoSchedule,
    PreferNoSchedule,
}

impl TaintEffect {
    pub fn as_str(self) -> &'static str {
        match self {
            TaintEffect::NoSchedule => "NoSchedule",
            TaintEffect::PreferNoSchedule => "PreferNoSchedule",
        }
    }
}

/// The configured marks.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Marks {
    pub labels: BTreeMap<String, String>,
    pub taint: Option<TaintEffect>,
    /// Label the node out of external load balancers and wait this long before evicting.
    pub exclude_lb: Option<Duration>,
}

impl Marks {
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty() && self.taint.is_none() && self.exclude_lb.is_none()
    }

    fn wanted_labels(&self) -> BTreeMap<String, String> {
        let mut l = self.labels.clone();
        if self.exclude_lb.is_some() {
            l.insert(EXCLUDE_LB.to_string(), "true".to_string());
        }
        l
    }
}

/// What rebootd added (and so may remove).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Added {
    #[serde(default)]
    pub labels: Vec<String>,
    #[serde(default)]
    pub taint: bool,
}

fn recorded(node: &Node) -> Added {
    node.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ADDED))
        .and_then(|v| serde_json::from_str(v).ok())
        .unwrap_or_default()
}

fn taints(node: &Node) -> Vec<Value> {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .map(|ts| {
            ts.iter()
                .filter_map(|t| serde_json::to_value(t).ok())
                .collect()
        })
        .unwrap_or_default()
}

fn rv(node: &Node) -> Value {
    node.metadata
        .resource_version
        .clone()
        .map_or(Value::Null, Value::from)
}

/// The merge patch that adds what is missing and records it (with what was recorded before),
/// and the labels it adds; `None` when everything is there already.
pub fn add_patch(marks: &Marks, node: &Node) -> Option<(Value, Vec<String>)> {
    let have = node.metadata.labels.clone().unwrap_or_default();
    let mut record = recorded(node);
    let mut labels = Map::new();
    let mut new_labels = Vec::new();
    for (k, v) in marks.wanted_labels() {
        if !have.contains_key(&k) {
            labels.insert(k.clone(), Value::from(v));
            new_labels.push(k.clone());
            if !record.labels.contains(&k) {
                record.labels.push(k);
            }
        }
    }
    let mut ts = taints(node);
    let add_taint = marks.taint.is_some() && !ts.iter().any(|t| t["key"] == TAINT_KEY);
    if add_taint {
        if let Some(effect) = marks.taint {
            ts.push(json!({"key": TAINT_KEY, "value": "true", "effect": effect.as_str()}));
        }
        record.taint = true;
    }
    if new_labels.is_empty() && !add_taint {
        return None;
    }
    let mut patch = json!({"metadata": {
        "resourceVersion": rv(node),
        "labels": labels,
        "annotations": {ADDED: serde_json::to_string(&record).unwrap_or_default()},
    }});
    if add_taint {
        patch["spec"] = json!({ "taints": ts });
    }
    Some((patch, new_labels))
}

/// The merge patch that removes what the record says rebootd added, and the record; `None`
/// when nothing is recorded.
pub fn remove_patch(node: &Node) -> Option<Value> {
    let has_record = node
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(ADDED));
    if !has_record {
        return None;
    }
    let record = recorded(node);
    let mut labels = Map::new();
    for k in &record.labels {
        labels.insert(k.clone(), Value::Null);
    }
    let mut patch = json!({"metadata": {
        "resourceVersion": rv(node),
        "labels": labels,
        "annotations": {ADDED: null},
    }});
    if record.taint {
        let ts: Vec<Value> = taints(node)
            .into_iter()
            .filter(|t| t["key"] != TAINT_KEY)
            .collect();
        patch["spec"] = json!({ "taints": ts });
    }
    Some(patch)
}

fn params() -> PatchParams {
    PatchParams {
        field_manager: Some("rebootd".to_string()),
        ..PatchParams::default()
    }
}

/// Read the Node, compute a patch, write it; a conflict starts again.
pub(super) async fn read_modify_write(
    nodes: &Api<Node>,
    name: &str,
    what: &str,
    mut f: impl FnMut(&Node) -> Option<Value>,
) -> Result<bool, super::DrainError> {
    let mut last = None;
    for _ in 0..TRIES {
        let node = nodes
            .get(name)
            .await
            .map_err(|e| super::DrainError::api(format!("read node {name}"), e))?;
        let Some(patch) = f(&node) else {
            return Ok(false);
        };
        match nodes.patch(name, &params(), &Patch::Merge(patch)).await {
            Ok(_) => return Ok(true),
            Err(e) if crate::kube_client::status_code(&e) == Some(409) => last = Some(e),
            Err(e) => return Err(super::DrainError::api(format!("{what} on node {name}"), e)),
        }
    }
    match last {
        Some(e) => Err(super::DrainError::api(
            format!("{what} on node {name} ({TRIES} conflicts)"),
            e,
        )),
        None => Ok(false),
    }
}

/// Put the marks on; returns how long to wait before evicting (the load-balancer exclusion was
/// added now).
pub async fn add(
    nodes: &Api<Node>,
    name: &str,
    marks: &Marks,
) -> Result<Option<Duration>, super::DrainError> {
    if marks.is_empty() {
        return Ok(None);
    }
    let mut added = Vec::new();
    let wrote = read_modify_write(nodes, name, "add the reboot labels and taint", |n| {
        add_patch(marks, n).map(|(p, l)| {
            added = l;
            p
        })
    })
    .await?;
    if wrote {
        tracing::info!(labels = ?added, taint = ?marks.taint.map(TaintEffect::as_str), "node {name} marked for the reboot");
    }
    Ok(marks
        .exclude_lb
        .filter(|_| wrote && added.iter().any(|l| l == EXCLUDE_LB)))
}

/// Take off what rebootd added (nothing when nothing is recorded).
pub async fn remove(nodes: &Api<Node>, name: &str) -> Result<(), super::DrainError> {
    if read_modify_write(
        nodes,
        name,
        "remove the reboot labels and taint",
        remove_patch,
    )
    .await?
    {
        tracing::info!("the labels and taint rebootd added are off node {name}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(v: Value) -> Node {
        serde_json::from_value(v).unwrap()
    }

    fn marks() -> Marks {
        Marks {
            labels: [("rebootd.io/rebooting".to_string(), "true".to_string())]
                .into_iter()
                .chain([("rebootd.io/maintenance".to_string(), "true".to_string())])
                .collect(),
            taint: Some(TaintEffect::PreferNoSchedule),
            exclude_lb: Some(Duration::from_secs(5)),
        }
    }

    #[test]
    fn adds_only_what_is_missing_and_records_it_in_the_same_write() {
        let n = node(json!({
            "metadata": {"name": "n", "resourceVersion": "7",
                "labels": {"rebootd.io/maintenance": "operator"}},
            "spec": {"taints": [{"key": "dedicated", "value": "db", "effect": "NoSchedule"}]},
        }));
        let (p, added) = add_patch(&marks(), &n).unwrap();
        assert_eq!(added, [EXCLUDE_LB, "rebootd.io/rebooting"]);
        assert_eq!(p["metadata"]["resourceVersion"], "7");
        assert_eq!(p["metadata"]["labels"]["rebootd.io/rebooting"], "true");
        assert!(
            p["metadata"]["labels"]
                .get("rebootd.io/maintenance")
                .is_none(),
            "an operator's label is left alone"
        );
        let record: Added =
            serde_json::from_str(p["metadata"]["annotations"][ADDED].as_str().unwrap()).unwrap();
        assert_eq!(
            record,
            Added {
                labels: vec![EXCLUDE_LB.into(), "rebootd.io/rebooting".into()],
                taint: true
            }
        );
        assert_eq!(
            p["spec"]["taints"],
            json!([{"key": "dedicated", "value": "db", "effect": "NoSchedule"},
                   {"key": TAINT_KEY, "value": "true", "effect": "PreferNoSchedule"}])
        );

        // Applied: nothing more to add; removal takes off exactly the record.
        let mut applied = p.clone();
        applied["metadata"]["labels"]["rebootd.io/maintenance"] = "operator".into();
        let n2 = node(json!({
            "metadata": {"name": "n", "resourceVersion": "8",
                "labels": applied["metadata"]["labels"], "annotations": applied["metadata"]["annotations"]},
            "spec": applied["spec"],
        }));
        assert_eq!(add_patch(&marks(), &n2), None);
        let r = remove_patch(&n2).unwrap();
        assert_eq!(
            r["metadata"]["labels"],
            json!({EXCLUDE_LB: null, "rebootd.io/rebooting": null})
        );
        assert_eq!(r["metadata"]["annotations"][ADDED], Value::Null);
        assert_eq!(
            r["spec"]["taints"],
            json!([{"key": "dedicated", "value": "db", "effect": "NoSchedule"}])
        );
        assert_eq!(remove_patch(&n), None, "nothing recorded, nothing removed");
    }

    #[test]
    fn a_taint_with_rebootds_key_already_there_is_not_rebootds() {
        let n = node(json!({
            "metadata": {"name": "n"},
            "spec": {"taints": [{"key": TAINT_KEY, "effect": "NoSchedule"}]},
        }));
        let m = Marks {
            taint: Some(TaintEffect::PreferNoSchedule),
            ..Marks::default()
        };
        assert_eq!(add_patch(&m, &n), None);
    }
}
