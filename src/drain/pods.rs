//! The pods on this host's node: which a drain evicts, which it leaves alone and why, and which
//! block a reboot (`blocking_pods`).

use std::collections::HashSet;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, ListParams};

use super::{fallback, order, DrainError, KubeDrainer};

/// The annotation the kubelet puts on mirror (static) pods.
const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";
/// How many pods a log line names before "and N more".
const LOG_NAMES_MAX: usize = 10;

/// One pod to evict and wait for.
#[derive(Debug, Clone)]
pub(super) struct PodRef {
    pub(super) namespace: String,
    pub(super) name: String,
    pub(super) uid: String,
}

impl PodRef {
    pub(super) fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

impl std::fmt::Display for PodRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{} (uid {})", self.namespace, self.name, self.uid)
    }
}

/// "a, b, c and 4 more"
pub(super) fn name_list<T: std::fmt::Display>(items: impl IntoIterator<Item = T>) -> String {
    let items: Vec<String> = items.into_iter().map(|i| i.to_string()).collect();
    let mut out = items
        .iter()
        .take(LOG_NAMES_MAX)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    if items.len() > LOG_NAMES_MAX {
        out.push_str(&format!(" and {} more", items.len() - LOG_NAMES_MAX));
    }
    out
}

pub(super) fn pod_key(p: &Pod) -> String {
    format!(
        "{}/{}",
        p.metadata.namespace.as_deref().unwrap_or(""),
        p.metadata.name.as_deref().unwrap_or("")
    )
}

fn pod_phase(p: &Pod) -> &str {
    p.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("")
}

fn is_finished(p: &Pod) -> bool {
    matches!(pod_phase(p), "Succeeded" | "Failed")
}

/// Why a pod on the node is not evicted, if it is not.
fn exemption(p: &Pod, skip: &HashSet<String>) -> Option<&'static str> {
    if p.metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(MIRROR_ANNOTATION))
    {
        return Some("mirror pod");
    }
    if p.metadata.owner_references.as_ref().is_some_and(|refs| {
        refs.iter()
            .any(|r| r.controller == Some(true) && r.kind == "DaemonSet")
    }) {
        return Some("DaemonSet pod");
    }
    if is_finished(p) {
        return Some(if pod_phase(p) == "Succeeded" {
            "Succeeded"
        } else {
            "Failed"
        });
    }
    if p.metadata.uid.as_ref().is_some_and(|u| skip.contains(u)) {
        return Some("matches skip_pods");
    }
    None
}

impl KubeDrainer {
    fn on_node(&self) -> ListParams {
        ListParams::default().fields(&format!("spec.nodeName={}", self.node))
    }

    /// The pods to evict, after logging the ones left alone and why.
    #[tracing::instrument(level = "debug", skip(self), fields(node = %self.node))]
    pub(super) async fn pods_to_evict(&self) -> Result<Vec<PodRef>, DrainError> {
        let pods: Api<Pod> = Api::all(self.client.clone());
        let lp = self.on_node();
        let all = pods
            .list(&lp)
            .await
            .map_err(|e| DrainError::api(format!("list pods on node {}", self.node), e))?;
        let skip: HashSet<String> = match &self.skip_pods {
            None => HashSet::new(),
            Some(sel) => pods
                .list(&lp.clone().labels(sel))
                .await
                .map_err(|e| {
                    DrainError::api(
                        format!("list pods on node {} matching skip_pods {sel:?}", self.node),
                        e,
                    )
                })?
                .items
                .into_iter()
                .filter_map(|p| p.metadata.uid)
                .collect(),
        };
        // Pods on the critical path first (see `order`); budgets that cannot be read only
        // cost the ordering.
        let budgets = match Api::<PodDisruptionBudget>::all(self.client.clone())
            .list(&ListParams::default())
            .await
        {
            Ok(list) => list.items,
            Err(e) => {
                tracing::debug!(
                    "cannot list PodDisruptionBudgets ({e}); evicting by grace period only"
                );
                Vec::new()
            }
        };
        let grace_override = self.pod_grace_period.map(|d| d.as_secs_f64().ceil() as i64);
        let mut evict = Vec::new();
        let mut left_alone = Vec::new();
        let mut refused = Vec::new();
        for p in &all.items {
            if let Some(why) = exemption(p, &skip) {
                left_alone.push(format!("{} ({why})", pod_key(p)));
                continue;
            }
            if let Some(why) = fallback::refusal(p, self.emptydir_pods, self.unmanaged_pods) {
                refused.push(format!("{} ({why})", pod_key(p)));
                continue;
            }
            let (Some(namespace), Some(name), Some(uid)) = (
                p.metadata.namespace.clone(),
                p.metadata.name.clone(),
                p.metadata.uid.clone(),
            ) else {
                tracing::warn!(pod = %pod_key(p), "pod without namespace, name or uid: ignored");
                continue;
            };
            if p.metadata
                .owner_references
                .as_ref()
                .is_none_or(|r| !r.iter().any(|r| r.controller == Some(true)))
            {
                tracing::warn!(
                    pod = %format!("{namespace}/{name}"),
                    "pod has no controller: evicting it deletes it for good (force = true)"
                );
            }
            evict.push((
                order::urgency(p, &budgets, grace_override),
                PodRef {
                    namespace,
                    name,
                    uid,
                },
            ));
        }
        if !refused.is_empty() {
            refused.sort();
            tracing::error!(
                "not draining node {}: {} pod(s) kubectl drain would not remove either: {}",
                self.node,
                refused.len(),
                refused.join("; ")
            );
            return Err(DrainError::Refused { pods: refused });
        }
        evict.sort_by_key(|(u, _)| std::cmp::Reverse(*u));
        let evict: Vec<PodRef> = evict.into_iter().map(|(_, p)| p).collect();
        if !left_alone.is_empty() {
            tracing::info!(
                "leaving {} pod(s) on node {}: {}",
                left_alone.len(),
                self.node,
                name_list(&left_alone)
            );
        }
        Ok(evict)
    }

    /// Running pods matching `blocking_pods` ([`super::Drainer::blocking_pods`]).
    pub(super) async fn running_blockers(&self) -> Result<Vec<String>, DrainError> {
        let Some(sel) = &self.blocking_pods else {
            return Ok(Vec::new());
        };
        let pods: Api<Pod> = Api::all(self.client.clone());
        let list = pods.list(&self.on_node().labels(sel)).await.map_err(|e| {
            DrainError::api(
                format!(
                    "list pods on node {} matching blocking_pods {sel:?}",
                    self.node
                ),
                e,
            )
        })?;
        let mut out: Vec<String> = list
            .items
            .iter()
            .filter(|p| !is_finished(p))
            .map(pod_key)
            .collect();
        out.sort();
        if !out.is_empty() {
            tracing::info!(
                "pods matching blocking_pods {sel:?} run on node {}: {}",
                self.node,
                name_list(&out)
            );
        }
        Ok(out)
    }
}
