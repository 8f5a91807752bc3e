//! What rebootd writes on this host's Node for everyone to see: the cordon, the annotations
//! saying the phase and the pauses, the labels and taint of a reboot (`marks`), and Events.

use std::sync::atomic::Ordering;

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

use super::{marks, DrainError, KubeDrainer};
use crate::kube_client::status_code;
use crate::state::Phase;

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
/// The reason of each Event rebootd records on its Node: the text operators filter on
/// (`kubectl get events --field-selector reason=DrainFailed`), and whether it is a Warning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventReason {
    /// The drain before a reboot began.
    DrainStarted,
    /// A PodDisruptionBudget refused an eviction (once per change of the budget).
    EvictionBlocked,
    /// A pod was deleted past its budget (`force_delete_after`).
    DeletedPastBudget,
    /// The drain failed.
    DrainFailed,
    /// rebootd is asking logind for the reboot.
    Rebooting,
    /// The node is schedulable again after its reboot.
    Uncordoned,
    /// The node was not Ready in time after its reboot.
    NotReadyAfterReboot,
}

impl EventReason {
    /// The Event's `reason`, as documented in docs/operations.md.
    pub const fn as_str(self) -> &'static str {
        match self {
            EventReason::DrainStarted => "DrainStarted",
            EventReason::EvictionBlocked => "EvictionBlocked",
            EventReason::DeletedPastBudget => "DeletedPastBudget",
            EventReason::DrainFailed => "DrainFailed",
            EventReason::Rebooting => "Rebooting",
            EventReason::Uncordoned => "Uncordoned",
            EventReason::NotReadyAfterReboot => "NotReadyAfterReboot",
        }
    }

    /// Whether the Event is a Warning (something needs a look) rather than Normal (a step).
    pub const fn is_warning(self) -> bool {
        match self {
            EventReason::EvictionBlocked
            | EventReason::DeletedPastBudget
            | EventReason::DrainFailed
            | EventReason::NotReadyAfterReboot => true,
            EventReason::DrainStarted | EventReason::Rebooting | EventReason::Uncordoned => false,
        }
    }
}

impl std::fmt::Display for EventReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Field manager for rebootd's patches.
const FIELD_MANAGER: &str = "rebootd";
/// Event messages longer than this are cut (the API server limits them).
const EVENT_MESSAGE_MAX: usize = 1024;

fn patch_params() -> PatchParams {
    PatchParams {
        field_manager: Some(FIELD_MANAGER.to_string()),
        ..PatchParams::default()
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

impl KubeDrainer {
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

    /// Whether the node is unschedulable now ([`super::Drainer::is_unschedulable`]).
    pub(super) async fn read_unschedulable(&self) -> Result<bool, DrainError> {
        let n = self
            .nodes
            .get(&self.node)
            .await
            .map_err(|e| DrainError::api(format!("get node {}", self.node), e))?;
        Ok(n.spec.and_then(|s| s.unschedulable).unwrap_or(false))
    }

    /// Take off rebootd's marks, then the cordon ([`super::Drainer::uncordon`]).
    pub(super) async fn make_schedulable(&self) -> Result<(), DrainError> {
        self.remove_marks().await?;
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

    /// Take off the labels and taint rebootd added, if it adds any ([`super::NodeStatus::unmark`]).
    pub(super) async fn remove_marks(&self) -> Result<(), DrainError> {
        if self.marks.is_empty() {
            return Ok(());
        }
        marks::remove(&self.nodes, &self.node).await
    }

    /// The phase annotations ([`super::NodeStatus::annotate`]).
    pub(super) async fn write_phase(
        &self,
        phase: Phase,
        since: jiff::Timestamp,
        reboot_needed: bool,
    ) -> Result<(), DrainError> {
        let patch = json!({"metadata": {"annotations": {
            ANNOTATION_PHASE: phase.as_str(),
            ANNOTATION_SINCE: format!("{since:.0}"),
            ANNOTATION_REBOOT_NEEDED: if reboot_needed { "true" } else { "false" },
        }}});
        self.nodes
            .patch(&self.node, &patch_params(), &Patch::Merge(patch))
            .await
            .map_err(|e| DrainError::api(format!("annotate node {}", self.node), e))?;
        Ok(())
    }

    /// Set (`Some(reason)`) or remove a flag annotation and its reason annotation.
    pub(super) async fn annotate_flag(
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

    /// A core/v1 Event on the Node ([`super::NodeStatus::event`]).
    pub(super) async fn record_event(
        &self,
        reason: EventReason,
        message: &str,
    ) -> Result<(), DrainError> {
        let events: Api<Event> = Api::namespaced(self.client.clone(), "default");
        let now = jiff::Timestamp::now();
        let type_ = if reason.is_warning() {
            "Warning"
        } else {
            "Normal"
        };
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
                reason: Some(reason.as_str().to_string()),
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
                    tracing::debug!(%reason, type_, "event recorded: {message}");
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
