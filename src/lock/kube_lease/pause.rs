//! The group's pause on the Lease store: a Lease of its own, `<name>-paused`, whose annotation
//! `rebootd.io/paused` holds the pause (see [`crate::lock::pause`]); no such Lease, no pause. It
//! carries the semaphore's label (role `pause`), so the waiters' one list and watch of the
//! semaphore's Leases bring it (`acquire_unless_paused`); a paused node watches it by name.
//! Only a Lease with the semaphore's label and role `pause` is a pause: one found by name
//! without them (a forgery, or written by a rebootctl older than the labels) pauses nothing;
//! `group_pause` warns, and pausing again labels it.
//!
//! `group_pause` reads it by a list of that one name, whose resourceVersion says where the read
//! was even when there is no such Lease; a wait for the pause right after it watches from there
//! (see [`crate::lock::pause::LastRead`]) instead of listing again. A start the server no longer
//! has (410 Gone) or a watch that ends lists again (the lock core's `pause::changed`).

use std::collections::BTreeMap;

use async_trait::async_trait;
use futures_util::StreamExt;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use kube::api::{DeleteParams, ListParams, ObjectMeta, PostParams, WatchEvent, WatchParams};

use super::super::pause::{GroupPause, LastRead, PauseRecord};
use super::super::LockError;
use super::calls::CallError;
use super::{KubeLeaseSemaphore, LABEL_ROLE, LABEL_SEMAPHORE, ROLE_PAUSE};

/// The annotation on `<name>-paused` holding the pause (JSON).
pub const ANNOTATION_PAUSED: &str = "rebootd.io/paused";

pub(super) fn pause_of(lease: &Lease) -> Option<GroupPause> {
    super::objects::annotation(lease, ANNOTATION_PAUSED).map(GroupPause::parse)
}

impl KubeLeaseSemaphore {
    /// The name of the Lease holding this group's pause.
    pub fn pause_name(&self) -> String {
        format!("{}-paused", self.name)
    }

    /// Whether `lease` carries this semaphore's label (so the waiters' watch brings it).
    fn labelled(&self, lease: &Lease) -> bool {
        super::objects::label(&lease.metadata, LABEL_SEMAPHORE) == Some(self.name.as_str())
    }

    /// The pause `lease` says, if it is this group's pause Lease: labelled as this semaphore's,
    /// with role `pause` (a node identity may write neither, see the admission policy). By name
    /// alone, a Lease any node may create would do: the control Lease of a semaphore named
    /// `<name>-paused`.
    pub(super) fn pause_in(&self, lease: &Lease) -> Option<GroupPause> {
        let role = super::objects::label(&lease.metadata, LABEL_ROLE);
        if self.labelled(lease) && role == Some(ROLE_PAUSE) {
            pause_of(lease)
        } else {
            None
        }
    }

    /// The field selector of the pause Lease.
    fn pause_selector(&self) -> String {
        format!("metadata.name={}", self.pause_name())
    }

    /// Watch the pause Lease from resourceVersion `rv` until the pause differs from `known`
    /// (`Some` of it); `None` when the server no longer has `rv` (410 Gone) or the watch ends,
    /// and the caller lists again.
    async fn pause_changed_from(
        &self,
        rv: &str,
        known: Option<&GroupPause>,
    ) -> Result<Option<Option<GroupPause>>, LockError> {
        let name = self.pause_name();
        let secs = self.timeouts.watch.as_secs().clamp(1, 290);
        let wp = WatchParams::default()
            .fields(&self.pause_selector())
            .timeout(u32::try_from(secs).unwrap_or(290));
        let events = match self
            .call("watching the group's pause", self.leases.watch(&wp, rv))
            .await
        {
            Ok(events) => events,
            Err(CallError {
                code: Some(410), ..
            }) => return Ok(None),
            Err(e) => return Err(e.error),
        };
        let mut events = events.boxed();
        while let Some(event) = events.next().await {
            let now = match event {
                Ok(WatchEvent::Added(l) | WatchEvent::Modified(l)) => self.pause_in(&l),
                Ok(WatchEvent::Deleted(_)) => None,
                Ok(WatchEvent::Bookmark(_)) => continue,
                Ok(WatchEvent::Error(s)) if s.code == 410 => return Ok(None),
                Ok(WatchEvent::Error(s)) => {
                    return Err(self.status_error(&format!("watching Lease {name}"), &s))
                }
                Err(e) => return Err(self.unreachable(format!("watching Lease {name}: {e}"))),
            };
            if now.as_ref() != known {
                return Ok(Some(now));
            }
        }
        Ok(None)
    }

    #[tracing::instrument(skip(self, p), fields(namespace = %self.namespace, lease = %self.pause_name()))]
    pub(super) async fn put_pause(&self, p: &GroupPause) -> Result<(), LockError> {
        let name = self.pause_name();
        let annotations = BTreeMap::from([(ANNOTATION_PAUSED.to_owned(), p.to_json())]);
        let labels = self.labels(ROLE_PAUSE, None);
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(self.namespace.clone()),
                labels: Some(labels.clone()),
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
                existing
                    .metadata
                    .labels
                    .get_or_insert_with(BTreeMap::new)
                    .extend(labels);
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
}

#[async_trait]
impl PauseRecord for KubeLeaseSemaphore {
    type At = String;

    fn last_read(&self) -> &LastRead<String> {
        &self.last_pause
    }

    /// One list of the one Lease, by name; its resourceVersion is where the read was.
    async fn read_pause(&self) -> Result<(Option<GroupPause>, String), LockError> {
        let lp = ListParams::default().fields(&self.pause_selector());
        let list = self
            .call("reading the group's pause", self.leases.list(&lp))
            .await?;
        let found = list.items.first();
        let pause = found.and_then(|l| self.pause_in(l));
        if let Some(lease) = found.filter(|l| pause.is_none() && pause_of(l).is_some()) {
            tracing::warn!(namespace = %self.namespace, lease = ?lease.metadata.name, labels = ?lease.metadata.labels, "ignoring a pause on a Lease without this semaphore's labels ({LABEL_SEMAPHORE}={}, {LABEL_ROLE}={ROLE_PAUSE}): not written by rebootctl, or by one older than its labels; run `rebootctl pause --group` again to pause the group", self.name);
        }
        Ok((pause, list.metadata.resource_version.unwrap_or_default()))
    }

    async fn watch_pause(
        &self,
        rv: String,
        known: Option<&GroupPause>,
    ) -> Result<Option<Option<GroupPause>>, LockError> {
        self.pause_changed_from(&rv, known).await
    }
}
