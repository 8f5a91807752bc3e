//! A Node gate, after FLUO's before-reboot contract: other controllers hold the reboot until they
//! set annotations on the Node.
//!
//! 1. Once this node holds a slot, rebootd labels its own Node `<label>=true` (default
//!    `rebootd.io/before-reboot`), first removing the configured annotations left from an earlier
//!    cycle. Marking happens only while the label is absent, so checks that already ran (a
//!    DaemonSet selecting the label sets its annotation once) are never undone.
//! 2. Other controllers see the label, run their checks and set each configured annotation to
//!    `"true"`; leaving one unset holds the reboot (and the slot: the rollout stops here, as FLUO).
//! 3. The gate goes when every annotation is `"true"`. Right before the call to logind (every
//!    gate went) rebootd removes the label and the annotations, so the next reboot needs fresh
//!    checks.
//!
//! The decision is pure ([`decide`]); the patches are JSON merge patches on the own Node.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{json, Map, Value};

use super::Verdict;

/// A Node the gate could not label, or unlabel.
#[derive(Debug, thiserror::Error)]
pub enum NodeGateError {
    #[error("cannot patch node {node}: {error}")]
    Patch { node: String, error: kube::Error },
}

/// What the Node says now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// The label is not there: remove stale annotations and set it, then wait.
    Mark,
    /// Labelled; these annotations are not `"true"` yet.
    Wait(Vec<String>),
    /// Every annotation is `"true"`.
    Go,
}

/// Decide from the Node's labels and annotations.
pub fn decide(
    labels: &BTreeMap<String, String>,
    annotations: &BTreeMap<String, String>,
    label: &str,
    wanted: &[String],
) -> Decision {
    if labels.get(label).map(String::as_str) != Some("true") {
        return Decision::Mark;
    }
    let missing: Vec<String> = wanted
        .iter()
        .filter(|a| annotations.get(*a).map(String::as_str) != Some("true"))
        .cloned()
        .collect();
    if missing.is_empty() {
        Decision::Go
    } else {
        Decision::Wait(missing)
    }
}

/// The merge patch that labels the Node and removes the annotations (`label_value` = `"true"`),
/// or removes both (`None`).
pub fn patch(label: &str, label_value: Option<&str>, annotations: &[String]) -> Value {
    let mut a = Map::new();
    for key in annotations {
        a.insert(key.clone(), Value::Null);
    }
    json!({"metadata": {
        "labels": {label: label_value},
        "annotations": a,
    }})
}

/// Field manager of rebootd's writes (as the drain's).
const FIELD_MANAGER: &str = "rebootd";

#[derive(Clone)]
pub struct NodeGate {
    nodes: Api<Node>,
    node: String,
    pub label: String,
    pub annotations: Vec<String>,
}

impl std::fmt::Debug for NodeGate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeGate")
            .field("node", &self.node)
            .field("label", &self.label)
            .field("annotations", &self.annotations)
            .finish()
    }
}

impl NodeGate {
    pub fn new(client: kube::Client, node: &str, label: &str, annotations: &[String]) -> NodeGate {
        NodeGate {
            nodes: Api::all(client),
            node: node.to_string(),
            label: label.to_string(),
            annotations: annotations.to_vec(),
        }
    }

    async fn apply(&self, body: Value) -> Result<(), NodeGateError> {
        let params = PatchParams {
            field_manager: Some(FIELD_MANAGER.to_string()),
            ..PatchParams::default()
        };
        self.nodes
            .patch(&self.node, &params, &Patch::Merge(body))
            .await
            .map(|_| ())
            .map_err(|error| NodeGateError::Patch {
                node: self.node.clone(),
                error,
            })
    }

    pub async fn check(&self) -> Verdict {
        let n = match self.nodes.get(&self.node).await {
            Ok(n) => n,
            Err(e) => {
                return Verdict::Wait(format!(
                    "the API server to answer (node {}: {e})",
                    self.node
                ))
            }
        };
        let labels = n.metadata.labels.unwrap_or_default();
        let annotations = n.metadata.annotations.unwrap_or_default();
        let list = |keys: &[String]| keys.join(", ");
        match decide(&labels, &annotations, &self.label, &self.annotations) {
            Decision::Go => Verdict::Go,
            Decision::Wait(missing) => Verdict::Wait(format!(
                "node annotations {} to be \"true\" (label {}=true is set)",
                list(&missing),
                self.label
            )),
            Decision::Mark => {
                let body = patch(&self.label, Some("true"), &self.annotations);
                match self.apply(body).await {
                    Ok(()) => {
                        tracing::info!(label = %self.label, annotations = ?self.annotations, "labelled the node {}=true for its before-reboot checks", self.label);
                        Verdict::Wait(format!(
                            "node annotations {} to be \"true\" (label {}=true set now)",
                            list(&self.annotations),
                            self.label
                        ))
                    }
                    Err(e) => Verdict::Wait(format!("the label {}=true ({e})", self.label)),
                }
            }
        }
    }

    /// Remove the label and the annotations (the checks were used).
    pub async fn clear(&self) -> Result<(), NodeGateError> {
        self.apply(patch(&self.label, None, &self.annotations))
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn unlabelled_marks_labelled_waits_for_every_annotation_to_be_true() {
        let want = vec!["a.io/backup".to_string(), "a.io/db".to_string()];
        let l = "rebootd.io/before-reboot";
        // Stale annotations from an earlier cycle do not count while the label is absent.
        let stale = map(&[("a.io/backup", "true"), ("a.io/db", "true")]);
        assert_eq!(decide(&map(&[]), &stale, l, &want), Decision::Mark);
        assert_eq!(
            decide(&map(&[(l, "false")]), &stale, l, &want),
            Decision::Mark
        );
        let labelled = map(&[(l, "true")]);
        assert_eq!(
            decide(&labelled, &map(&[("a.io/backup", "true")]), l, &want),
            Decision::Wait(vec!["a.io/db".into()])
        );
        assert_eq!(
            decide(
                &labelled,
                &map(&[("a.io/backup", "yes"), ("a.io/db", "true")]),
                l,
                &want
            ),
            Decision::Wait(vec!["a.io/backup".into()]),
            "only \"true\" counts"
        );
        assert_eq!(decide(&labelled, &stale, l, &want), Decision::Go);
    }

    #[test]
    fn patches_set_or_remove_the_label_and_remove_the_annotations() {
        let want = vec!["a.io/backup".to_string()];
        assert_eq!(
            patch("rebootd.io/before-reboot", Some("true"), &want),
            json!({"metadata": {"labels": {"rebootd.io/before-reboot": "true"}, "annotations": {"a.io/backup": null}}})
        );
        assert_eq!(
            patch("rebootd.io/before-reboot", None, &want),
            json!({"metadata": {"labels": {"rebootd.io/before-reboot": null}, "annotations": {"a.io/backup": null}}})
        );
    }
}
