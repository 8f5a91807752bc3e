//! What a drain does with the pods `kubectl drain` will not remove without a flag, and the
//! opt-in way past a PodDisruptionBudget that never allows an eviction:
//!
//! - pods with emptyDir volumes (their data goes with the pod) and pods no controller owns
//!   (nothing recreates them) make the drain fail before anything is evicted, naming the pods and
//!   the setting that allows them (`delete_emptydir_data = true`, `force = true`, as
//!   `kubectl drain --delete-emptydir-data` / `--force`);
//! - with `force_delete_after`, a pod whose eviction its budget still refuses that long after
//!   the drain began is deleted (DELETE with a uid precondition and the configured grace period),
//!   which PodDisruptionBudgets do not stop: logged at warn and recorded as a Warning Event
//!   `DeletedPastBudget`. Needs `pods` `delete` (the optional role in `deploy/kubernetes`).

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, Preconditions};

use super::evict::Evicted;
use super::pods::PodRef;
use super::{EventReason, KubeDrainer};
use crate::config::{EmptyDirPods, UnmanagedPods};
use crate::drain::DrainError;
use crate::kube_client::status_code;

/// Why `pod` may not be drained under these settings, if it may not.
pub(super) fn refusal(
    pod: &Pod,
    emptydir: EmptyDirPods,
    unmanaged: UnmanagedPods,
) -> Option<&'static str> {
    let has_emptydir = pod
        .spec
        .as_ref()
        .and_then(|s| s.volumes.as_ref())
        .is_some_and(|v| v.iter().any(|v| v.empty_dir.is_some()));
    let controlled = pod
        .metadata
        .owner_references
        .as_ref()
        .is_some_and(|r| r.iter().any(|r| r.controller == Some(true)));
    if !controlled && unmanaged == UnmanagedPods::Refuse {
        return Some("no controller: it would be gone for good (force = true drains it)");
    }
    if has_emptydir && emptydir == EmptyDirPods::Refuse {
        return Some("emptyDir data, lost with the pod (delete_emptydir_data = true drains it)");
    }
    None
}

impl KubeDrainer {
    /// Delete `pod` past its PodDisruptionBudget (`force_delete_after` has passed): `why` is the
    /// budget's last refusal.
    pub(super) async fn delete_past_budget(
        &self,
        pod: &PodRef,
        why: &str,
    ) -> Result<Evicted, DrainError> {
        let after = self
            .force_delete_after
            .map(|d| humantime::format_duration(d).to_string())
            .unwrap_or_default();
        tracing::warn!(
            "DELETING pod {} past its PodDisruptionBudget: its eviction was still {why} {after} \
             after the drain began (force_delete_after)",
            pod.key()
        );
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &pod.namespace);
        let dp = DeleteParams {
            grace_period_seconds: self.pod_grace_period.map(|d| d.as_secs_f64().ceil() as u32),
            preconditions: Some(Preconditions {
                uid: Some(pod.uid.clone()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match api.delete(&pod.name, &dp).await {
            Ok(_) => {}
            Err(e) if matches!(status_code(&e), Some(404 | 409)) => {
                tracing::info!("{} is already gone", pod.key());
                return Ok(Evicted::Gone);
            }
            Err(e) => {
                return Err(DrainError::api(
                    format!("delete pod {} past its PodDisruptionBudget", pod.key()),
                    e,
                ))
            }
        }
        let message = format!(
            "Deleted pod {} past its PodDisruptionBudget (force_delete_after {after}): eviction {why}",
            pod.key()
        );
        let reason = EventReason::DeletedPastBudget;
        if let Err(e) = self.record_event(reason, &message).await {
            tracing::warn!("could not record the {reason} event: {e}");
        }
        Ok(Evicted::Accepted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{EmptyDirVolumeSource, PodSpec, Volume};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

    fn pod(controller: Option<bool>, emptydir: bool) -> Pod {
        Pod {
            metadata: ObjectMeta {
                owner_references: controller.map(|c| {
                    vec![OwnerReference {
                        kind: "ReplicaSet".into(),
                        name: "web".into(),
                        controller: Some(c),
                        ..OwnerReference::default()
                    }]
                }),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec {
                volumes: emptydir.then(|| {
                    vec![Volume {
                        name: "scratch".into(),
                        empty_dir: Some(EmptyDirVolumeSource::default()),
                        ..Volume::default()
                    }]
                }),
                ..PodSpec::default()
            }),
            ..Pod::default()
        }
    }

    #[test]
    fn refuses_what_kubectl_drain_refuses_unless_allowed() {
        use EmptyDirPods as E;
        use UnmanagedPods as U;
        assert_eq!(refusal(&pod(Some(true), false), E::Refuse, U::Refuse), None);
        // An owner that is not the controller does not count.
        for p in [pod(None, false), pod(Some(false), false)] {
            assert!(refusal(&p, E::Refuse, U::Refuse)
                .unwrap()
                .contains("force = true"));
            assert_eq!(refusal(&p, E::Refuse, U::Evict), None);
        }
        let scratch = pod(Some(true), true);
        assert!(refusal(&scratch, E::Refuse, U::Refuse)
            .unwrap()
            .contains("delete_emptydir_data = true"));
        assert_eq!(refusal(&scratch, E::Evict, U::Refuse), None);
        assert_eq!(refusal(&pod(None, true), E::Evict, U::Evict), None);
    }
}
