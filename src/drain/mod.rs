//! Draining this host's Kubernetes node before a reboot, and the node's visible state.
//!
//! [`Drainer`] is the seam the agent uses; [`KubeDrainer`] implements it against the API server
//! with a client from [`crate::kube_client::connect`] (which never retries by itself, so every
//! PodDisruptionBudget refusal is seen here).
//!
//! A drain, as `kubectl drain` does it but with the waits visible:
//! 1. cordon (strategic merge patch `{"spec":{"unschedulable":true}}`);
//! 2. list the pods on the node (`spec.nodeName=<node>`) and leave out DaemonSet pods (controller
//!    owner reference of kind DaemonSet), mirror pods (annotation `kubernetes.io/config.mirror`),
//!    finished pods (phase Succeeded or Failed) and the pods matching `skip_pods` (listed
//!    separately with that label selector and subtracted by uid);
//! 3. evict the others concurrently (policy/v1 Eviction with a uid precondition and the configured
//!    grace period); 404 means already gone, 409 that the uid precondition failed (checked: if the
//!    name now belongs to another pod, ours is gone, else the eviction is retried); 429 is a
//!    PodDisruptionBudget refusing for now: logged with the budget that blocks the pod (once per
//!    change), recorded as an `EvictionBlocked` Event, and retried as soon as a watch on that
//!    budget shows a disruption allowed (a replacement became Ready), else after 1 s, doubling
//!    up to 5 s (the timer alone when budgets cannot be watched);
//!    server errors and transport failures are retried the same way; any other answer fails the
//!    drain;
//! 4. wait, with one watch on the node's pods, until every pod evicted is gone *by uid* (a
//!    StatefulSet pod comes back with the same name);
//! 5. all of this within `drain_timeout`; past it the drain stops with [`DrainError::Timeout`]
//!    naming the pods still there (the node stays cordoned: the caller decides).

mod budget;
mod fallback;
pub mod marks;
mod order;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use futures_util::stream::FuturesUnordered;
use futures_util::{pin_mut, StreamExt};
use k8s_openapi::api::core::v1::{Event, EventSource, Node, ObjectReference, Pod};
use k8s_openapi::api::policy::v1::{Eviction, PodDisruptionBudget};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    DeleteOptions, ObjectMeta, Preconditions, Time,
};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{watcher, WatchStreamExt};
use serde_json::json;
use tokio::time::Instant;

use crate::config::{EmptyDirPods, Kubernetes, UnmanagedPods};
use crate::kube_client::status_code;
use budget::BudgetWatch;

/// Node annotation: the local phase (`idle`, `draining`, `rebooting`, ...).
pub const ANNOTATION_PHASE: &str = "rebootd.io/phase";
/// Node annotation: when the phase was entered (RFC 3339).
pub const ANNOTATION_SINCE: &str = "rebootd.io/since";
/// Node annotation: `"true"` when the host needs a reboot.
pub const ANNOTATION_REBOOT_NEEDED: &str = "rebootd.io/reboot-needed";
/// Node annotation: `"true"` while an operator paused this node (`rebootctl pause`); absent
/// otherwise.
pub const ANNOTATION_PAUSED: &str = "rebootd.io/paused";
/// Node annotation: the reason given to `rebootctl pause --reason`, while paused.
pub const ANNOTATION_PAUSED_REASON: &str = "rebootd.io/paused-reason";
/// Node annotation: `"true"` while this node waits for a slot of a group an operator paused
/// (`rebootctl pause --group`); absent otherwise.
pub const ANNOTATION_GROUP_PAUSED: &str = "rebootd.io/group-paused";
/// Node annotation: the reason given to `rebootctl pause --group --reason`, while so.
pub const ANNOTATION_GROUP_PAUSED_REASON: &str = "rebootd.io/group-paused-reason";
/// The Event source component and reporting controller.
pub const COMPONENT: &str = "rebootd";
/// The annotation the kubelet puts on mirror (static) pods.
const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";
/// Field manager for rebootd's patches.
const FIELD_MANAGER: &str = "rebootd";
/// The first wait after a refused eviction; doubled after each refusal up to [`BACKOFF_MAX`].
const BACKOFF_START: Duration = Duration::from_secs(1);
/// kubectl drain retries every 5 s.
const BACKOFF_MAX: Duration = Duration::from_secs(5);
/// How often the pods still awaited are logged at info level.
const PROGRESS_EVERY: Duration = Duration::from_secs(5);
/// Event messages longer than this are cut (the API server limits them).
const EVENT_MESSAGE_MAX: usize = 1024;
/// How many pods a log line names before "and N more".
const LOG_NAMES_MAX: usize = 10;

/// What the agent needs from Kubernetes around a reboot.
#[async_trait::async_trait]
pub trait Drainer: Send + Sync {
    /// Whether the node is unschedulable now (read before rebootd cordons it).
    async fn is_unschedulable(&self) -> Result<bool, DrainError>;
    /// Running pods matching `blocking_pods` on this node, as "namespace/name"; empty = none.
    async fn blocking_pods(&self) -> Result<Vec<String>, DrainError>;
    /// Cordon (idempotent), then evict every pod except DaemonSet, mirror and finished pods and
    /// `skip_pods`, concurrently; 429 retried with backoff (each blocked pod logged, once per
    /// change, with the PDB that blocks it, and an Event "EvictionBlocked"); wait for each pod BY
    /// UID to be gone (watch, not polling); stop at `drain_timeout` with DrainError::Timeout
    /// listing what is left.
    async fn drain(&self) -> Result<(), DrainError>;
    /// Wait (watch) up to `timeout` for the Node to be Ready.
    async fn wait_ready(&self, timeout: Duration) -> Result<(), DrainError>;
    /// Make the node schedulable (idempotent).
    async fn uncordon(&self) -> Result<(), DrainError>;
    /// Node annotations `rebootd.io/phase`, `rebootd.io/since` (RFC 3339),
    /// `rebootd.io/reboot-needed` ("true"/"false").
    async fn annotate(
        &self,
        phase: &str,
        since: jiff::Timestamp,
        reboot_needed: bool,
    ) -> Result<(), DrainError>;
    /// Node annotations `rebootd.io/paused` ("true") and `rebootd.io/paused-reason` while
    /// paused (`Some(reason)`; an empty reason leaves the second out); both removed when not.
    async fn annotate_paused(&self, paused: Option<&str>) -> Result<(), DrainError> {
        let _ = paused;
        Ok(())
    }
    /// Node annotations `rebootd.io/group-paused` ("true") and `rebootd.io/group-paused-reason`
    /// while this node waits on a paused group (as [`Drainer::annotate_paused`]).
    async fn annotate_group_paused(&self, paused: Option<&str>) -> Result<(), DrainError> {
        let _ = paused;
        Ok(())
    }
    /// A core/v1 Event on the Node (reason CamelCase e.g. DrainStarted, EvictionBlocked,
    /// DrainFailed, Rebooting, Uncordoned, NotReadyAfterReboot; type Normal or Warning), source
    /// component "rebootd".
    async fn event(&self, reason: &str, message: &str, warning: bool) -> Result<(), DrainError>;
    /// Take off the labels and taint rebootd added for the reboot (`marks`), if any are left
    /// (the uncordon takes them off too; this is for a node rebootd did not cordon).
    async fn unmark(&self) -> Result<(), DrainError> {
        Ok(())
    }
}

/// Why a Kubernetes operation did not succeed.
#[derive(Debug, thiserror::Error)]
pub enum DrainError {
    /// `drain_timeout` passed with pods still on the node ("namespace/name", sorted).
    #[error("drain did not finish in time: {} pod(s) left: {}", left.len(), left.join(", "))]
    Timeout { left: Vec<String> },
    /// The node was not Ready within the time allowed; `last` is what was seen last.
    #[error("node {node} not Ready after {}: {last}", humantime::format_duration(*waited))]
    NotReady {
        node: String,
        waited: Duration,
        last: String,
    },
    /// An API call failed; `call` says which (e.g. "evict pod default/web-1"), `status` is the
    /// HTTP status when the server answered.
    #[error("{call}: {detail}")]
    Api {
        call: String,
        status: Option<u16>,
        detail: String,
        #[source]
        source: kube::Error,
    },
    /// A label selector from the configuration cannot be used.
    #[error("[kubernetes] {setting} = {selector:?}: {reason}")]
    InvalidSelector {
        setting: &'static str,
        selector: String,
        reason: &'static str,
    },
    /// A watch stream ended, which kube's watcher never does by itself.
    #[error("the watch of {0} ended unexpectedly")]
    WatchEnded(String),
    /// The node name is not usable.
    #[error("invalid Kubernetes node name {0:?}")]
    InvalidNode(String),
    /// Pods the settings do not allow to drain, as `kubectl drain` refuses them without a flag
    /// ("namespace/name (why)"); nothing was evicted.
    #[error("drain refused, nothing evicted: {} pod(s) need a setting: {}", pods.len(), pods.join("; "))]
    Refused { pods: Vec<String> },
}

impl DrainError {
    fn api(call: impl Into<String>, source: kube::Error) -> DrainError {
        DrainError::Api {
            call: call.into(),
            status: status_code(&source),
            detail: describe(&source),
            source,
        }
    }

    /// The HTTP status of a failed API call, if the server answered.
    pub fn status(&self) -> Option<u16> {
        match self {
            DrainError::Api { status, .. } => *status,
            _ => None,
        }
    }
}

/// A short description of a client error: `429 TooManyRequests: message` for API answers,
/// `no answer from the Kubernetes API server within 10s: PATCH /api/v1/nodes/n` for a request
/// that got none in time.
fn describe(err: &kube::Error) -> String {
    if let Some(e) = crate::kube_client::no_answer(err) {
        return e.to_string();
    }
    match err {
        kube::Error::Api(s) => {
            let mut out = format!("{} {}", s.code, s.reason);
            if !s.message.is_empty() {
                out.push_str(": ");
                out.push_str(&s.message);
            }
            out
        }
        other => other.to_string(),
    }
}

/// [`Drainer`] over the Kubernetes API.
pub struct KubeDrainer {
    client: kube::Client,
    node: String,
    nodes: Api<Node>,
    drain_timeout: Duration,
    pod_grace_period: Option<Duration>,
    skip_pods: Option<String>,
    blocking_pods: Option<String>,
    boot_id: Option<String>,
    event_seq: AtomicU64,
    /// Where refused evictions are counted (`rebootd_evictions_blocked_total`).
    metrics: Option<crate::metrics::Metrics>,
    emptydir_pods: EmptyDirPods,
    unmanaged_pods: UnmanagedPods,
    force_delete_after: Option<Duration>,
    /// Labels, taint and load-balancer exclusion while rebooting.
    marks: marks::Marks,
}

impl std::fmt::Debug for KubeDrainer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeDrainer")
            .field("node", &self.node)
            .field("drain_timeout", &self.drain_timeout)
            .field("pod_grace_period", &self.pod_grace_period)
            .field("skip_pods", &self.skip_pods)
            .field("blocking_pods", &self.blocking_pods)
            .field("boot_id", &self.boot_id)
            .finish_non_exhaustive()
    }
}

fn check_selector(
    setting: &'static str,
    value: &Option<String>,
) -> Result<Option<String>, DrainError> {
    let Some(v) = value else { return Ok(None) };
    let trimmed = v.trim();
    if trimmed.is_empty() {
        return Err(DrainError::InvalidSelector {
            setting,
            selector: v.clone(),
            reason: "an empty selector matches every pod; leave the setting out instead",
        });
    }
    if trimmed.chars().any(char::is_control) {
        return Err(DrainError::InvalidSelector {
            setting,
            selector: v.clone(),
            reason: "contains control characters",
        });
    }
    Ok(Some(trimmed.to_string()))
}

/// One pod to evict and wait for.
#[derive(Debug, Clone)]
struct PodRef {
    namespace: String,
    name: String,
    uid: String,
}

impl PodRef {
    fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

impl std::fmt::Display for PodRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{} (uid {})", self.namespace, self.name, self.uid)
    }
}

/// "a, b, c and 4 more"
fn name_list<T: std::fmt::Display>(items: impl IntoIterator<Item = T>) -> String {
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

fn pod_key(p: &Pod) -> String {
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

/// The PodDisruptionBudget named in a 429 refusal ("The disruption budget web needs 2 healthy
/// pods and has 1 currently"), and the cause's message.
fn blocking_budget(err: &kube::Error) -> Option<(Option<String>, String)> {
    let kube::Error::Api(s) = err else {
        return None;
    };
    let cause = s
        .details
        .as_ref()
        .and_then(|d| d.causes.iter().find(|c| c.reason == "DisruptionBudget"));
    match cause {
        Some(c) => {
            let name = c
                .message
                .strip_prefix("The disruption budget ")
                .and_then(|rest| rest.split_whitespace().next())
                .map(str::to_string);
            Some((name, c.message.clone()))
        }
        None if s.message.contains("disruption budget") => Some((None, s.message.clone())),
        None => None,
    }
}

fn is_retryable(err: &kube::Error) -> bool {
    match status_code(err) {
        Some(code) => code == 429 || code >= 500,
        // Transport errors (connection refused or reset, no answer within
        // `kube_client::REQUEST_LIMIT`): the server may come back.
        None => !matches!(
            err,
            kube::Error::SerdeError(_) | kube::Error::BuildRequest(_)
        ),
    }
}

/// The Ready condition of a node: (is Ready, human description).
fn node_ready(n: &Node) -> (bool, String) {
    let cond = n
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"));
    match cond {
        None => (false, "no Ready condition reported".to_string()),
        Some(c) => {
            let mut d = format!("Ready={}", c.status);
            if let Some(r) = c.reason.as_deref().filter(|r| !r.is_empty()) {
                d.push_str(&format!(" ({r}"));
                if let Some(m) = c.message.as_deref().filter(|m| !m.is_empty()) {
                    d.push_str(&format!(": {m}"));
                }
                d.push(')');
            }
            (c.status == "True", d)
        }
    }
}

fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}

/// What became of one eviction.
enum Evicted {
    /// Accepted: the pod is terminating.
    Accepted,
    /// The pod (that uid) was already gone.
    Gone,
}

impl KubeDrainer {
    /// Set (`Some(reason)`) or remove a flag annotation and its reason annotation.
    async fn annotate_flag(
        &self,
        paused: Option<&str>,
        flag_key: &str,
        reason_key: &str,
    ) -> Result<(), DrainError> {
        let (flag, reason) = match paused {
            Some(r) => (
                json!("true"),
                if r.is_empty() { json!(null) } else { json!(r) },
            ),
            None => (json!(null), json!(null)),
        };
        let patch = json!({"metadata": {"annotations": {
            flag_key: flag,
            reason_key: reason,
        }}});
        self.nodes
            .patch(&self.node, &patch_params(), &Patch::Merge(patch))
            .await
            .map_err(|e| DrainError::api(format!("annotate node {}", self.node), e))?;
        Ok(())
    }

    /// A drainer for node `node` with the `[kubernetes]` settings.
    pub fn new(
        client: kube::Client,
        node: &str,
        settings: &Kubernetes,
    ) -> Result<KubeDrainer, DrainError> {
        if node.is_empty() || node.len() > 253 || node.chars().any(|c| c == '/' || c.is_control()) {
            return Err(DrainError::InvalidNode(node.to_string()));
        }
        Ok(KubeDrainer {
            nodes: Api::all(client.clone()),
            client,
            node: node.to_string(),
            drain_timeout: settings.drain_timeout,
            pod_grace_period: settings.pod_grace_period,
            skip_pods: check_selector("skip_pods", &settings.skip_pods)?,
            blocking_pods: check_selector("blocking_pods", &settings.blocking_pods)?,
            boot_id: None,
            event_seq: AtomicU64::new(0),
            metrics: None,
            emptydir_pods: settings.emptydir_pods,
            unmanaged_pods: settings.unmanaged_pods,
            force_delete_after: settings.force_delete_after,
            marks: settings.marks.clone(),
        })
    }

    /// Count every eviction a PodDisruptionBudget refuses in `metrics`.
    pub fn with_metrics(mut self, metrics: crate::metrics::Metrics) -> KubeDrainer {
        self.metrics = Some(metrics);
        self
    }

    /// Make [`Drainer::wait_ready`] also require that the kubelet reports this boot id
    /// (`status.nodeInfo.bootID`, the host's `/proc/sys/kernel/random/boot_id`). Right after a
    /// quick reboot the Node can still show the Ready=True its kubelet posted before the reboot
    /// (the node controller only marks it Unknown after its grace period, 40 s by default): the
    /// boot id tells that Ready from a Ready posted since this boot.
    pub fn with_boot_id(mut self, boot_id: &str) -> KubeDrainer {
        let id = boot_id.trim();
        self.boot_id = (!id.is_empty()).then(|| id.to_ascii_lowercase());
        self
    }

    /// The node this drainer acts on.
    pub fn node(&self) -> &str {
        &self.node
    }

    fn on_node(&self) -> ListParams {
        ListParams::default().fields(&format!("spec.nodeName={}", self.node))
    }

    /// Mark the node unschedulable (idempotent).
    #[tracing::instrument(level = "debug", skip(self), fields(node = %self.node))]
    pub async fn cordon(&self) -> Result<(), DrainError> {
        self.nodes
            .patch(
                &self.node,
                &patch_params(),
                &Patch::Strategic(json!({"spec": {"unschedulable": true}})),
            )
            .await
            .map_err(|e| DrainError::api(format!("cordon node {}", self.node), e))?;
        tracing::info!(node = %self.node, "node cordoned");
        Ok(())
    }

    /// The pods to evict, after logging the ones left alone and why.
    #[tracing::instrument(level = "debug", skip(self), fields(node = %self.node))]
    async fn pods_to_evict(&self) -> Result<Vec<PodRef>, DrainError> {
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

    /// One eviction request for `pod` (by uid).
    async fn evict_once(&self, pod: &PodRef) -> Result<(), kube::Error> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &pod.namespace);
        let eviction = Eviction {
            metadata: ObjectMeta {
                name: Some(pod.name.clone()),
                namespace: Some(pod.namespace.clone()),
                ..ObjectMeta::default()
            },
            delete_options: Some(DeleteOptions {
                grace_period_seconds: self.pod_grace_period.map(|d| d.as_secs_f64().ceil() as i64),
                preconditions: Some(Preconditions {
                    uid: Some(pod.uid.clone()),
                    resource_version: None,
                }),
                ..DeleteOptions::default()
            }),
        };
        // kube's `Api::evict` sends its DeleteParams as `delete_options`, a field the API server
        // does not know (it is `deleteOptions`), so the grace period and preconditions would be
        // dropped: post the policy/v1 Eviction ourselves.
        // The answer on success (a Status) says nothing more: not looked at.
        let _: serde_json::Value = api
            .create_subresource("eviction", &pod.name, &PostParams::default(), &eviction)
            .await?;
        Ok(())
    }

    /// Whether the pod with this uid may still exist (after a 409 to its eviction); a failed
    /// read counts as "may".
    async fn still_there(&self, pod: &PodRef) -> bool {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &pod.namespace);
        match api.get_opt(&pod.name).await {
            Ok(Some(p)) => p.metadata.uid.as_deref() == Some(pod.uid.as_str()),
            Ok(None) => false,
            Err(_) => true,
        }
    }

    /// Evict `pod` until the API server accepts (or the pod is gone), retrying refusals by a
    /// PodDisruptionBudget and transient failures with backoff. Only returns an error that
    /// retrying cannot cure.
    #[tracing::instrument(level = "debug", skip_all, fields(node = %self.node, pod = %pod))]
    async fn evict(
        &self,
        pod: &PodRef,
        blocked: &Mutex<HashMap<String, String>>,
        force_at: Option<Instant>,
    ) -> Result<Evicted, DrainError> {
        let mut backoff = BACKOFF_START;
        let mut refusals = 0u32;
        let mut last_log: Option<String> = None;
        let mut last_budget: Option<Option<String>> = None;
        let mut budget_watch: Option<BudgetWatch> = None;
        loop {
            let err = match self.evict_once(pod).await {
                Ok(()) => {
                    if refusals > 0 {
                        tracing::info!(
                            "eviction of {} accepted after {refusals} refusal(s)",
                            pod.key()
                        );
                    } else {
                        tracing::info!("eviction of {} accepted", pod.key());
                    }
                    lock(blocked).remove(&pod.uid);
                    return Ok(Evicted::Accepted);
                }
                Err(e) => e,
            };
            match status_code(&err) {
                Some(404) => {
                    tracing::info!("{} is already gone", pod.key());
                    return Ok(Evicted::Gone);
                }
                Some(409) if !self.still_there(pod).await => {
                    // The uid precondition failed: the name belongs to another pod now.
                    tracing::info!(
                        "{} is gone (the name now belongs to another pod)",
                        pod.key()
                    );
                    return Ok(Evicted::Gone);
                }
                _ => {}
            }
            if !is_retryable(&err) && status_code(&err) != Some(409) {
                return Err(DrainError::api(format!("evict pod {}", pod.key()), err));
            }
            refusals += 1;
            let (why, budget) = match blocking_budget(&err) {
                Some((Some(b), cause)) => {
                    let key = format!("{}/{b}", pod.namespace);
                    if budget_watch.as_ref().map(BudgetWatch::budget) != Some(key.as_str()) {
                        budget_watch =
                            Some(BudgetWatch::new(self.client.clone(), &pod.namespace, &b));
                    }
                    (
                        format!("blocked by PodDisruptionBudget {key}: {cause}"),
                        Some(key),
                    )
                }
                Some((None, cause)) => (
                    format!("blocked by a PodDisruptionBudget: {cause}"),
                    Some(String::new()),
                ),
                None => (format!("refused: {}", describe(&err)), None),
            };
            lock(blocked).insert(pod.uid.clone(), why.clone());
            if let (Some(m), Some(_)) = (&self.metrics, &budget) {
                m.evictions_blocked(1);
            }
            if last_log.as_deref() != Some(why.as_str()) {
                tracing::warn!(
                    "eviction of {} {why}; retrying (at least every {}s) until the drain deadline",
                    pod.key(),
                    BACKOFF_MAX.as_secs()
                );
                last_log = Some(why.clone());
            }
            let by_budget = budget.is_some();
            if let (Some(at), true) = (force_at, by_budget) {
                if Instant::now() >= at {
                    let outcome = self.delete_past_budget(pod, &why).await?;
                    lock(blocked).remove(&pod.uid);
                    return Ok(outcome);
                }
            }
            if budget.is_some() && last_budget.as_ref() != Some(&budget) {
                let message = format!("Eviction of pod {} {why}", pod.key());
                if let Err(e) = self.event("EvictionBlocked", &message, true).await {
                    tracing::warn!("could not record the EvictionBlocked event: {e}");
                }
                last_budget = Some(budget);
            }
            // Again when the budget allows a disruption (a replacement became Ready), or on the
            // timer: it also covers refusals without a named budget and a budget we cannot watch.
            let wake = async {
                match budget_watch.as_mut() {
                    Some(w) => w.allows().await,
                    None => std::future::pending().await,
                }
            };
            let force = async {
                match force_at.filter(|_| by_budget) {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = tokio::time::sleep(backoff) => {
                    backoff = (backoff * 2).min(BACKOFF_MAX);
                }
                () = force => {}
                () = wake => {
                    tracing::debug!("{}: the budget allows a disruption now; evicting again", pod.key());
                }
            }
        }
    }

    /// Cordon, evict, wait; without the deadline (the caller puts it around this).
    async fn drain_inner(
        &self,
        remaining: &Mutex<BTreeMap<String, PodRef>>,
        blocked: &Mutex<HashMap<String, String>>,
    ) -> Result<(), DrainError> {
        let force_at = self.force_delete_after.map(|d| Instant::now() + d);
        let lb_wait = marks::add(&self.nodes, &self.node, &self.marks).await?;
        self.cordon().await?;
        if let Some(wait) = lb_wait {
            tracing::info!(
                "node {} is out of external load balancers; waiting {} before evicting",
                self.node,
                humantime::format_duration(wait)
            );
            tokio::time::sleep(wait).await;
        }
        let pods = self.pods_to_evict().await?;
        if pods.is_empty() {
            tracing::info!("no pods to evict from node {}", self.node);
            return Ok(());
        }
        *lock(remaining) = pods.iter().map(|p| (p.uid.clone(), p.clone())).collect();
        tracing::info!(
            "evicting {} pod(s) from node {}: {}",
            pods.len(),
            self.node,
            name_list(pods.iter().map(PodRef::key))
        );

        // The watch that sees them go (by uid).
        let pod_api: Api<Pod> = Api::all(self.client.clone());
        let cfg = watcher::Config::default().fields(&format!("spec.nodeName={}", self.node));
        let stream = watcher(pod_api, cfg).default_backoff();
        pin_mut!(stream);
        let mut relisted: Option<HashSet<String>> = None;
        let mut last_info: Option<Instant> = None;

        let mut evictions: FuturesUnordered<_> = pods
            .iter()
            .map(|p| async move { (p, self.evict(p, blocked, force_at).await) })
            .collect();

        loop {
            if lock(remaining).is_empty() {
                tracing::info!("node {} drained", self.node);
                return Ok(());
            }
            tokio::select! {
                Some((pod, outcome)) = evictions.next(), if !evictions.is_empty() => {
                    match outcome? {
                        Evicted::Accepted => {}
                        Evicted::Gone => {
                            if lock(remaining).remove(&pod.uid).is_some() {
                                self.log_remaining(remaining, &format!("{} gone", pod.key()), &mut last_info);
                            }
                        }
                    }
                }
                ev = stream.next() => {
                    match ev {
                        Some(Ok(watcher::Event::Delete(p))) => {
                            if let Some(uid) = p.metadata.uid.as_deref() {
                                if lock(remaining).remove(uid).is_some() {
                                    self.log_remaining(remaining, &format!("{} gone", pod_key(&p)), &mut last_info);
                                }
                            }
                        }
                        Some(Ok(watcher::Event::Init)) => relisted = Some(HashSet::new()),
                        Some(Ok(watcher::Event::InitApply(p))) => {
                            if let (Some(seen), Some(uid)) = (relisted.as_mut(), p.metadata.uid) {
                                seen.insert(uid);
                            }
                        }
                        Some(Ok(watcher::Event::InitDone)) => {
                            if let Some(seen) = relisted.take() {
                                let gone: Vec<String> = {
                                    let mut rem = lock(remaining);
                                    let gone = rem
                                        .iter()
                                        .filter(|(uid, _)| !seen.contains(*uid))
                                        .map(|(_, p)| p.key())
                                        .collect();
                                    rem.retain(|uid, _| seen.contains(uid));
                                    gone
                                };
                                if !gone.is_empty() {
                                    self.log_remaining(
                                        remaining,
                                        &format!("{} gone", name_list(&gone)),
                                        &mut last_info,
                                    );
                                }
                            }
                        }
                        Some(Ok(watcher::Event::Apply(p))) => {
                            if let Some(uid) = p.metadata.uid.as_deref() {
                                if lock(remaining).contains_key(uid) {
                                    if let Some(t) = &p.metadata.deletion_timestamp {
                                        tracing::debug!(
                                            "{} terminating, gone by {}",
                                            pod_key(&p),
                                            t.0
                                        );
                                    }
                                }
                            }
                        }
                        Some(Err(e)) => {
                            tracing::warn!(
                                "watch of pods on node {} failed, resuming: {e}",
                                self.node
                            );
                        }
                        None => {
                            return Err(DrainError::WatchEnded(format!(
                                "pods on node {}",
                                self.node
                            )));
                        }
                    }
                }
            }
        }
    }

    /// Says which pods are still awaited: every change at debug level, at info level at most
    /// every [`PROGRESS_EVERY`] (a node with a hundred pods would otherwise log a hundred lines).
    fn log_remaining(
        &self,
        remaining: &Mutex<BTreeMap<String, PodRef>>,
        what: &str,
        last_info: &mut Option<Instant>,
    ) {
        let rem = lock(remaining);
        if rem.is_empty() {
            tracing::info!("{what}; no pods left on node {}", self.node);
            return;
        }
        let now = Instant::now();
        if last_info.is_none_or(|t| now.duration_since(t) >= PROGRESS_EVERY) {
            *last_info = Some(now);
            tracing::info!(
                "{what}; waiting for {} pod(s) to be gone: {}",
                rem.len(),
                name_list(rem.values())
            );
        } else {
            tracing::debug!(
                "{what}; waiting for {} pod(s) to be gone: {}",
                rem.len(),
                name_list(rem.values())
            );
        }
    }
}

fn patch_params() -> PatchParams {
    PatchParams {
        field_manager: Some(FIELD_MANAGER.to_string()),
        ..PatchParams::default()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[async_trait::async_trait]
impl Drainer for KubeDrainer {
    #[tracing::instrument(level = "debug", skip(self), fields(node = %self.node))]
    async fn is_unschedulable(&self) -> Result<bool, DrainError> {
        let n = self
            .nodes
            .get(&self.node)
            .await
            .map_err(|e| DrainError::api(format!("get node {}", self.node), e))?;
        Ok(n.spec.and_then(|s| s.unschedulable).unwrap_or(false))
    }

    #[tracing::instrument(level = "debug", skip(self), fields(node = %self.node))]
    async fn blocking_pods(&self) -> Result<Vec<String>, DrainError> {
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

    #[tracing::instrument(level = "info", skip(self), fields(node = %self.node))]
    async fn drain(&self) -> Result<(), DrainError> {
        let deadline = Instant::now() + self.drain_timeout;
        let remaining = Mutex::new(BTreeMap::new());
        let blocked = Mutex::new(HashMap::new());
        match tokio::time::timeout_at(deadline, self.drain_inner(&remaining, &blocked)).await {
            Ok(r) => r,
            Err(_) => {
                let rem = lock(&remaining);
                let blocked = lock(&blocked);
                let mut left: Vec<String> = rem.values().map(PodRef::key).collect();
                left.sort();
                for p in rem.values() {
                    match blocked.get(&p.uid) {
                        Some(why) => tracing::warn!("{p} still there: eviction {why}"),
                        None => tracing::warn!("{p} still there (evicted, terminating)"),
                    }
                }
                tracing::error!(
                    "drain of node {} stopped after {}: {} pod(s) left",
                    self.node,
                    humantime::format_duration(self.drain_timeout),
                    left.len()
                );
                Err(DrainError::Timeout { left })
            }
        }
    }

    #[tracing::instrument(level = "info", skip(self), fields(node = %self.node))]
    async fn wait_ready(&self, timeout: Duration) -> Result<(), DrainError> {
        let cfg = watcher::Config::default().fields(&format!("metadata.name={}", self.node));
        let stream = watcher(self.nodes.clone(), cfg).default_backoff();
        pin_mut!(stream);
        let mut last = "node not seen yet".to_string();
        let wait = async {
            while let Some(ev) = stream.next().await {
                match ev {
                    Ok(watcher::Event::Apply(n) | watcher::Event::InitApply(n)) => {
                        let (mut ready, mut what) = node_ready(&n);
                        if let (true, Some(ours)) = (ready, &self.boot_id) {
                            let reported = n
                                .status
                                .as_ref()
                                .and_then(|s| s.node_info.as_ref())
                                .map(|i| i.boot_id.trim().to_ascii_lowercase())
                                .unwrap_or_default();
                            if &reported != ours {
                                ready = false;
                                what = format!(
                                    "Ready=True, but reported from boot {reported:?}, not this boot {ours:?} (the kubelet has not reported since the reboot)"
                                );
                            }
                        }
                        if ready {
                            tracing::info!("node {} is Ready", self.node);
                            return true;
                        }
                        if what != last {
                            tracing::info!(
                                "waiting up to {} for node {} to be Ready: {what}",
                                humantime::format_duration(timeout),
                                self.node
                            );
                            last = what;
                        }
                    }
                    Ok(watcher::Event::Delete(_)) => {
                        last = "the Node object was deleted".to_string();
                        tracing::warn!("waiting for node {} to be Ready: {last}", self.node);
                    }
                    Ok(watcher::Event::Init | watcher::Event::InitDone) => {}
                    Err(e) => tracing::warn!("watch of node {} failed, resuming: {e}", self.node),
                }
            }
            false
        };
        match tokio::time::timeout(timeout, wait).await {
            Ok(true) => Ok(()),
            Ok(false) | Err(_) => {
                tracing::error!(
                    "node {} not Ready after {}: {last}",
                    self.node,
                    humantime::format_duration(timeout)
                );
                Err(DrainError::NotReady {
                    node: self.node.clone(),
                    waited: timeout,
                    last,
                })
            }
        }
    }

    #[tracing::instrument(level = "debug", skip(self), fields(node = %self.node))]
    async fn uncordon(&self) -> Result<(), DrainError> {
        self.unmark().await?;
        // As kubectl uncordon: the field is removed, not set to false.
        self.nodes
            .patch(
                &self.node,
                &patch_params(),
                &Patch::Strategic(json!({"spec": {"unschedulable": null}})),
            )
            .await
            .map_err(|e| DrainError::api(format!("uncordon node {}", self.node), e))?;
        tracing::info!(node = %self.node, "node uncordoned");
        Ok(())
    }

    async fn unmark(&self) -> Result<(), DrainError> {
        if self.marks.is_empty() {
            return Ok(());
        }
        marks::remove(&self.nodes, &self.node).await
    }

    #[tracing::instrument(level = "debug", skip(self), fields(node = %self.node))]
    async fn annotate(
        &self,
        phase: &str,
        since: jiff::Timestamp,
        reboot_needed: bool,
    ) -> Result<(), DrainError> {
        let patch = json!({"metadata": {"annotations": {
            ANNOTATION_PHASE: phase,
            ANNOTATION_SINCE: format!("{since:.0}"),
            ANNOTATION_REBOOT_NEEDED: if reboot_needed { "true" } else { "false" },
        }}});
        self.nodes
            .patch(&self.node, &patch_params(), &Patch::Merge(patch))
            .await
            .map_err(|e| DrainError::api(format!("annotate node {}", self.node), e))?;
        Ok(())
    }

    #[tracing::instrument(level = "debug", skip(self), fields(node = %self.node))]
    async fn annotate_paused(&self, paused: Option<&str>) -> Result<(), DrainError> {
        self.annotate_flag(paused, ANNOTATION_PAUSED, ANNOTATION_PAUSED_REASON)
            .await
    }

    #[tracing::instrument(level = "debug", skip(self), fields(node = %self.node))]
    async fn annotate_group_paused(&self, paused: Option<&str>) -> Result<(), DrainError> {
        self.annotate_flag(
            paused,
            ANNOTATION_GROUP_PAUSED,
            ANNOTATION_GROUP_PAUSED_REASON,
        )
        .await
    }

    #[tracing::instrument(level = "debug", skip(self, message), fields(node = %self.node))]
    async fn event(&self, reason: &str, message: &str, warning: bool) -> Result<(), DrainError> {
        let events: Api<Event> = Api::namespaced(self.client.clone(), "default");
        let now = jiff::Timestamp::now();
        let type_ = if warning { "Warning" } else { "Normal" };
        for attempt in 0..2u64 {
            let nanos = now.as_nanosecond()
                + i128::from(self.event_seq.fetch_add(1, Ordering::Relaxed) + attempt);
            let ev = Event {
                metadata: ObjectMeta {
                    // As the kubelet names node events.
                    name: Some(format!("{}.{:x}", self.node, nanos)),
                    namespace: Some("default".to_string()),
                    ..ObjectMeta::default()
                },
                // uid = the node's name, as the kubelet does: that is what `kubectl describe
                // node` looks for.
                involved_object: ObjectReference {
                    api_version: Some("v1".to_string()),
                    kind: Some("Node".to_string()),
                    name: Some(self.node.clone()),
                    uid: Some(self.node.clone()),
                    ..ObjectReference::default()
                },
                reason: Some(reason.to_string()),
                message: Some(truncate(message, EVENT_MESSAGE_MAX)),
                type_: Some(type_.to_string()),
                source: Some(EventSource {
                    component: Some(COMPONENT.to_string()),
                    host: Some(self.node.clone()),
                }),
                first_timestamp: Some(Time(now)),
                last_timestamp: Some(Time(now)),
                count: Some(1),
                reporting_component: Some(COMPONENT.to_string()),
                reporting_instance: Some(self.node.clone()),
                ..Event::default()
            };
            match events.create(&PostParams::default(), &ev).await {
                Ok(_) => {
                    tracing::debug!(reason, type_, "event recorded: {message}");
                    return Ok(());
                }
                Err(e) if status_code(&e) == Some(409) && attempt == 0 => continue,
                Err(e) => {
                    return Err(DrainError::api(
                        format!("create {reason} event on node {}", self.node),
                        e,
                    ))
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kube_client::deadline::NoAnswer;

    #[test]
    fn no_answer_in_time_is_retried_and_described_plainly() {
        let err = kube::Error::Service(Box::new(NoAnswer {
            limit: Duration::from_secs(10),
            method: hyper::Method::PATCH,
            path: "/api/v1/nodes/node-1".into(),
        }));
        assert!(is_retryable(&err));
        let e = DrainError::api("annotate node node-1", err);
        assert_eq!(e.status(), None);
        assert_eq!(
            e.to_string(),
            "annotate node node-1: no answer from the Kubernetes API server within 10s: PATCH /api/v1/nodes/node-1"
        );
    }
}
