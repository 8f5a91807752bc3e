//! Draining this host's Kubernetes node before a reboot, and the node's visible state.
//!
//! Two seams the agent uses: [`Drainer`] (the drain itself) and [`NodeStatus`] (what the Node
//! shows of the reboot). [`KubeDrainer`] implements both against the API server with a client
//! from [`crate::kube_client::connect`] (which never retries by itself, so every
//! PodDisruptionBudget refusal is seen here). The work is split by job:
//! - `pods`: which pods a drain evicts, which it leaves alone, which block a reboot;
//! - `evict`: the drain itself (cordon, evict, wait for the pods to be gone);
//! - `ready`: the wait for the Node to be Ready in this boot;
//! - `node_status`: what rebootd writes on the Node (cordon, annotations, marks, Events);
//! - `budget`, `fallback`, `order`, `marks`: the eviction's helpers and the reboot's labels and
//!   taint;
//! - `autoscaler`: the cluster autoscaler's scale-down-disabled annotation while holding a slot.

pub mod autoscaler;
mod budget;
mod evict;
mod fallback;
pub mod marks;
mod node_status;
mod order;
mod pods;
mod ready;

use std::sync::atomic::AtomicU64;
use std::sync::Mutex;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::Api;

use crate::config::{EmptyDirPods, Kubernetes, UnmanagedPods};
use crate::kube_client::status_code;
use crate::state::Phase;
pub use node_status::{
    EventReason, ANNOTATION_GROUP_PAUSED, ANNOTATION_GROUP_PAUSED_REASON, ANNOTATION_PAUSED,
    ANNOTATION_PAUSED_REASON, ANNOTATION_PHASE, ANNOTATION_REBOOT_NEEDED, ANNOTATION_SINCE,
    COMPONENT,
};

/// The drain of this host's node around a reboot: cordon, evict, wait for Ready, uncordon.
#[async_trait::async_trait]
pub trait Drainer: Send + Sync {
    /// Whether the node is unschedulable now (read before rebootd cordons it).
    async fn is_unschedulable(&self) -> Result<bool, DrainError>;
    /// Running pods matching `blocking_pods` on this node, as "namespace/name"; empty = none.
    async fn blocking_pods(&self) -> Result<Vec<String>, DrainError>;
    /// Cordon (idempotent), then evict every pod except DaemonSet, mirror and finished pods and
    /// `skip_pods`, concurrently; 429 retried with backoff (each blocked pod logged, once per
    /// change, with the PDB that blocks it, and an Event [`EventReason::EvictionBlocked`]); wait
    /// for each pod BY UID to be gone (watch, not polling); stop at `drain_timeout` with
    /// DrainError::Timeout listing what is left.
    async fn drain(&self) -> Result<(), DrainError>;
    /// Wait (watch) up to `timeout` for the Node to be Ready.
    async fn wait_ready(&self, timeout: Duration) -> Result<(), DrainError>;
    /// Make the node schedulable (idempotent).
    async fn uncordon(&self) -> Result<(), DrainError>;
}

/// What the node shows everyone about its reboot: annotations, the reboot's labels and taint,
/// Events. An implementation that cannot show a thing says so with [`DrainError::Unsupported`].
#[async_trait::async_trait]
pub trait NodeStatus: Send + Sync {
    /// Node annotations `rebootd.io/phase`, `rebootd.io/since` (RFC 3339),
    /// `rebootd.io/reboot-needed` ("true"/"false").
    async fn annotate(
        &self,
        phase: Phase,
        since: jiff::Timestamp,
        reboot_needed: bool,
    ) -> Result<(), DrainError>;
    /// Node annotations `rebootd.io/paused` ("true") and `rebootd.io/paused-reason` while
    /// paused (`Some(reason)`; an empty reason leaves the second out); both removed when not.
    async fn annotate_paused(&self, paused: Option<&str>) -> Result<(), DrainError>;
    /// Node annotations `rebootd.io/group-paused` ("true") and `rebootd.io/group-paused-reason`
    /// while this node waits on a paused group (as [`NodeStatus::annotate_paused`]).
    async fn annotate_group_paused(&self, paused: Option<&str>) -> Result<(), DrainError>;
    /// A core/v1 Event on the Node with this reason (and its type, see [`EventReason`]), source
    /// component "rebootd".
    async fn event(&self, reason: EventReason, message: &str) -> Result<(), DrainError>;
    /// Take off the labels and taint rebootd added for the reboot (`marks`), if any are left
    /// (the uncordon takes them off too; this is for a node rebootd did not cordon).
    async fn unmark(&self) -> Result<(), DrainError>;
    /// Node annotation `cluster-autoscaler.kubernetes.io/scale-down-disabled=true`, only where
    /// the annotation is absent; whether it was added (`false`: someone else's is there).
    async fn disable_scale_down(&self) -> Result<bool, DrainError>;
    /// Take that annotation off, only while it holds rebootd's value `true` (called only when
    /// rebootd added it).
    async fn enable_scale_down(&self) -> Result<(), DrainError>;
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
    /// This implementation cannot do `what` (e.g. a stand-in that shows nothing on a Node).
    #[error("{what} is not supported here")]
    Unsupported { what: &'static str },
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

impl KubeDrainer {
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
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[async_trait::async_trait]
impl Drainer for KubeDrainer {
    #[tracing::instrument(level = "debug", skip(self), fields(node = %self.node))]
    async fn is_unschedulable(&self) -> Result<bool, DrainError> {
        self.read_unschedulable().await
    }

    #[tracing::instrument(level = "debug", skip(self), fields(node = %self.node))]
    async fn blocking_pods(&self) -> Result<Vec<String>, DrainError> {
        self.running_blockers().await
    }

    #[tracing::instrument(level = "info", skip(self), fields(node = %self.node))]
    async fn drain(&self) -> Result<(), DrainError> {
        self.drain_by_deadline().await
    }

    #[tracing::instrument(level = "info", skip(self), fields(node = %self.node))]
    async fn wait_ready(&self, timeout: Duration) -> Result<(), DrainError> {
        self.watch_ready(timeout).await
    }

    #[tracing::instrument(level = "debug", skip(self), fields(node = %self.node))]
    async fn uncordon(&self) -> Result<(), DrainError> {
        self.make_schedulable().await
    }
}

#[async_trait::async_trait]
impl NodeStatus for KubeDrainer {
    #[tracing::instrument(level = "debug", skip(self), fields(node = %self.node))]
    async fn annotate(
        &self,
        phase: Phase,
        since: jiff::Timestamp,
        reboot_needed: bool,
    ) -> Result<(), DrainError> {
        self.write_phase(phase, since, reboot_needed).await
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
    async fn event(&self, reason: EventReason, message: &str) -> Result<(), DrainError> {
        self.record_event(reason, message).await
    }

    #[tracing::instrument(level = "debug", skip(self), fields(node = %self.node))]
    async fn unmark(&self) -> Result<(), DrainError> {
        self.remove_marks().await
    }

    #[tracing::instrument(level = "debug", skip(self), fields(node = %self.node))]
    async fn disable_scale_down(&self) -> Result<bool, DrainError> {
        autoscaler::disable(&self.nodes, &self.node).await
    }

    #[tracing::instrument(level = "debug", skip(self), fields(node = %self.node))]
    async fn enable_scale_down(&self) -> Result<(), DrainError> {
        autoscaler::enable(&self.nodes, &self.node).await
    }
}
