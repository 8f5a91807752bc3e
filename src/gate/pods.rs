//! A pods gate, after the boot: the pods on this node matching a label selector must all be
//! Ready (finished pods aside) before rebootd makes the node schedulable and releases its slot,
//! e.g. the CNI, storage or log agents a workload needs on the node. None matching = go.

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};

use super::Verdict;

/// The pods, as "namespace/name", that run (not finished) and are not Ready.
pub fn not_ready(pods: &[Pod]) -> Vec<String> {
    let mut out: Vec<String> = pods
        .iter()
        .filter(|p| {
            let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
            !matches!(phase, Some("Succeeded") | Some("Failed"))
        })
        .filter(|p| {
            let ready = p
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
                .is_some_and(|c| c.status == "True");
            !ready
        })
        .map(|p| {
            format!(
                "{}/{}",
                p.metadata.namespace.as_deref().unwrap_or(""),
                p.metadata.name.as_deref().unwrap_or("")
            )
        })
        .collect();
    out.sort();
    out
}

#[derive(Clone)]
pub struct PodsGate {
    pods: Api<Pod>,
    node: String,
    pub selector: String,
}

impl std::fmt::Debug for PodsGate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PodsGate")
            .field("node", &self.node)
            .field("selector", &self.selector)
            .finish()
    }
}

impl PodsGate {
    pub fn new(client: kube::Client, node: &str, selector: &str) -> PodsGate {
        PodsGate {
            pods: Api::all(client),
            node: node.to_string(),
            selector: selector.to_string(),
        }
    }

    pub async fn check(&self) -> Verdict {
        let params = ListParams::default()
            .labels(&self.selector)
            .fields(&format!("spec.nodeName={}", self.node));
        match self.pods.list(&params).await {
            Err(e) => Verdict::Wait(format!(
                "the API server to list pods {:?} on node {} ({e})",
                self.selector, self.node
            )),
            Ok(list) => {
                let waiting = not_ready(&list.items);
                if waiting.is_empty() {
                    Verdict::Go
                } else {
                    Verdict::Wait(format!(
                        "pods {:?} on node {} to be Ready: {}",
                        self.selector,
                        self.node,
                        waiting.join(", ")
                    ))
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(name: &str, phase: &str, ready: Option<&str>) -> Pod {
        let conditions = match ready {
            Some(r) => json!([{"type": "Ready", "status": r}]),
            None => json!([]),
        };
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "kube-system"},
            "status": {"phase": phase, "conditions": conditions},
        }))
        .unwrap()
    }

    #[test]
    fn only_running_pods_that_are_not_ready_hold() {
        let pods = [
            pod("csi-b", "Running", Some("False")),
            pod("csi-a", "Running", None),
            pod("cni", "Running", Some("True")),
            pod("job", "Succeeded", Some("False")),
            pod("new", "Pending", Some("False")),
        ];
        assert_eq!(
            not_ready(&pods),
            ["kube-system/csi-a", "kube-system/csi-b", "kube-system/new"]
        );
        assert!(not_ready(&pods[2..4]).is_empty());
        assert!(not_ready(&[]).is_empty());
    }
}
