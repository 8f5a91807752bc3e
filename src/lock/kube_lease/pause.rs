//! The group's pause on the Lease store: a control Lease of its own, `<name>-paused`, whose
//! annotation `rebootd.io/paused` holds the pause (see [`crate::lock::pause`]); no such Lease,
//! no pause. It carries no semaphore label, so the waiters' watch of the semaphore's Leases
//! never sees it; a paused node watches it by name.

use std::collections::BTreeMap;

use futures_util::StreamExt;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use kube::api::{DeleteParams, ObjectMeta, PostParams};
use kube::runtime::watcher;

use super::super::pause::GroupPause;
use super::super::LockError;
use super::calls::CallError;
use super::KubeLeaseSemaphore;

/// The annotation on `<name>-paused` holding the pause (JSON).
pub const ANNOTATION_PAUSED: &str = "rebootd.io/paused";

fn pause_of(lease: &Lease) -> Option<GroupPause> {
    super::objects::annotation(lease, ANNOTATION_PAUSED).map(GroupPause::parse)
}

impl KubeLeaseSemaphore {
    /// The name of the Lease holding this group's pause.
    pub fn pause_name(&self) -> String {
        format!("{}-paused", self.name)
    }

    pub(super) async fn group_pause_now(&self) -> Result<Option<GroupPause>, LockError> {
        let name = self.pause_name();
        let lease = self
            .call("reading the group's pause", self.leases.get_opt(&name))
            .await?;
        Ok(lease.as_ref().and_then(pause_of))
    }

    #[tracing::instrument(skip(self, p), fields(namespace = %self.namespace, lease = %self.pause_name()))]
    pub(super) async fn put_pause(&self, p: &GroupPause) -> Result<(), LockError> {
        let name = self.pause_name();
        let annotations = BTreeMap::from([(ANNOTATION_PAUSED.to_owned(), p.to_json())]);
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(self.namespace.clone()),
                annotations: Some(annotations.clone()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec::default()),
        };
        let pp = PostParams::default();
        match self
            .call("pausing the group", self.leases.create(&pp, &lease))
            .await
        {
            Ok(_) => {}
            Err(CallError {
                code: Some(409), ..
            }) => {
                let mut existing = self
                    .call("reading the group's pause", self.leases.get(&name))
                    .await?;
                existing
                    .metadata
                    .annotations
                    .get_or_insert_with(BTreeMap::new)
                    .extend(annotations);
                self.call(
                    "pausing the group",
                    self.leases.replace(&name, &pp, &existing),
                )
                .await?;
            }
            Err(e) => return Err(e.error),
        }
        tracing::info!(lease = %name, "group paused");
        Ok(())
    }

    #[tracing::instrument(skip(self), fields(namespace = %self.namespace, lease = %self.pause_name()))]
    pub(super) async fn delete_pause(&self) -> Result<(), LockError> {
        let name = self.pause_name();
        match self
            .call(
                "resuming the group",
                self.leases.delete(&name, &DeleteParams::default()),
            )
            .await
        {
            Ok(_)
            | Err(CallError {
                code: Some(404), ..
            }) => {}
            Err(e) => return Err(e.error),
        }
        tracing::info!(lease = %name, "group resumed");
        Ok(())
    }

    /// Wait until the pause differs from `known`: a watcher of the one Lease, by name (its
    /// first list says what it is now).
    pub(super) async fn pause_changed(
        &self,
        known: Option<&GroupPause>,
    ) -> Result<Option<GroupPause>, LockError> {
        let name = self.pause_name();
        let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
        let mut events = watcher::watcher(self.leases.clone(), config).boxed();
        let mut listed: Option<Option<GroupPause>> = None;
        while let Some(event) = events.next().await {
            let now = match event {
                Ok(watcher::Event::Init) => {
                    listed = Some(None);
                    continue;
                }
                Ok(watcher::Event::InitApply(l)) => {
                    listed = Some(pause_of(&l));
                    continue;
                }
                Ok(watcher::Event::InitDone) => listed.take().flatten(),
                Ok(watcher::Event::Apply(l)) => pause_of(&l),
                Ok(watcher::Event::Delete(_)) => None,
                Err(e) => {
                    return Err(self.unreachable(format!("watching Lease {name}: {e}")));
                }
            };
            if now.as_ref() != known {
                return Ok(now);
            }
        }
        Err(self.unreachable(format!("the watch of Lease {name} ended")))
    }
}
