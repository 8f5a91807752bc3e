//! The fleet view on the Lease store: one **node Lease** `<name>-node-<node>` per node (labels
//! `rebootd.io/semaphore=<name>`, `rebootd.io/role=member`), its annotation
//! `rebootd.io/member-node` the node and `rebootd.io/node-record` its record (JSON). It has no
//! `holderIdentity`: tools (and the lab's watchers) read a Lease with a holder as a held lock.
//! The admission policy lets a node identity write only the node Lease named after it, saying
//! its own node (`deploy/kubernetes/admission-policy.yaml`), so `rebootd.io/member-node` is
//! as good as the writer's name. A write is a replace guarded by the `resourceVersion` this
//! node's last write left (or a create); when that fails the Lease is read, and a record there
//! that does not parse is refused, never written over. The semaphore's one list brings the
//! node Leases too; a waiter skips them (one event per record written, no request). `--watch`
//! is one watch of the semaphore's Leases from that list.

use std::collections::{BTreeMap, HashMap};

use async_trait::async_trait;
use futures_util::StreamExt;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use kube::api::{ListParams, ObjectMeta, PostParams, WatchEvent, WatchParams};

use super::calls::CallError;
use super::objects::{annotation, label};
use super::snapshot::Snapshot;
use super::*;
use crate::fleet::{FleetRead, FleetStore, NodeRecord, RecordRead, Unreadable};

/// Role of a node Lease.
pub const ROLE_MEMBER: &str = "member";
/// Annotation of a node Lease: the node it is about (the writer, under the admission policy).
pub const ANNOTATION_MEMBER_NODE: &str = "rebootd.io/member-node";
/// Annotation of a node Lease: the node's record.
pub const ANNOTATION_NODE_RECORD: &str = "rebootd.io/node-record";

impl KubeLeaseSemaphore {
    /// The node Lease name of `node`: `<name>-node-<node>` (escaped as a waiter Lease's is when
    /// the node is not a valid name part; the admission policy then refuses it).
    pub fn member_name(&self, node: &str) -> String {
        let waiter = self.waiter_name(node);
        let rest = waiter.strip_prefix(&self.waiter_prefix).unwrap_or(node);
        format!("{}-node-{rest}", self.name)
    }

    /// Whether `lease` is one of this semaphore's node Leases.
    pub(super) fn is_member(&self, lease: &Lease) -> bool {
        let name = lease.metadata.name.as_deref().unwrap_or_default();
        name.starts_with(&format!("{}-node-", self.name))
            && label(&lease.metadata, LABEL_ROLE) == Some(ROLE_MEMBER)
    }

    fn member_lease(&self, me: &Identity, record: &NodeRecord, at: Option<&str>) -> Lease {
        Lease {
            metadata: ObjectMeta {
                name: Some(self.member_name(&me.node)),
                namespace: Some(self.namespace.clone()),
                labels: Some(self.labels(ROLE_MEMBER, None)),
                annotations: Some(BTreeMap::from([
                    (ANNOTATION_MEMBER_NODE.to_owned(), me.node.clone()),
                    (ANNOTATION_NODE_RECORD.to_owned(), record.to_json()),
                ])),
                resource_version: at.map(str::to_owned),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec::default()),
        }
    }

    /// Write the node Lease: a replace guarded by `at`, or a create. `Ok(None)`: lost a race.
    async fn put_member(&self, lease: &Lease) -> Result<Option<String>, LockError> {
        let name = lease.metadata.name.clone().unwrap_or_default();
        let pp = PostParams::default();
        let written = if lease.metadata.resource_version.is_some() {
            let what = "writing this node's fleet record";
            self.call(what, self.leases.replace(&name, &pp, lease))
                .await
        } else {
            let what = "creating this node's fleet record";
            self.call(what, self.leases.create(&pp, lease)).await
        };
        match written {
            Ok(l) => Ok(Some(l.metadata.resource_version.unwrap_or_default())),
            Err(CallError {
                code: Some(409 | 404),
                ..
            }) => Ok(None),
            Err(e) => Err(e.error),
        }
    }
}

/// The record a node Lease carries.
fn record_of(lease: &Lease) -> Result<NodeRecord, Unreadable> {
    match annotation(lease, ANNOTATION_NODE_RECORD) {
        Some(v) => NodeRecord::parse(v.as_bytes()),
        None => Err(Unreadable {
            value: String::new(),
            reason: format!("no annotation {ANNOTATION_NODE_RECORD}"),
        }),
    }
}

#[async_trait]
impl FleetStore for KubeLeaseSemaphore {
    #[tracing::instrument(level = "debug", skip_all)]
    async fn publish(
        &self,
        me: &Identity,
        record: &NodeRecord,
        at: Option<&str>,
    ) -> Result<String, LockError> {
        self.check()?;
        let mut at = at.map(str::to_owned);
        for _ in 0..3 {
            let lease = self.member_lease(me, record, at.as_deref());
            if let Some(rv) = self.put_member(&lease).await? {
                return Ok(rv);
            }
            let name = self.member_name(&me.node);
            let what = "reading this node's fleet record";
            at = match self.call(what, self.leases.get_opt(&name)).await? {
                None => None,
                Some(existing) => {
                    if let Err(u) = record_of(&existing) {
                        return Err(LockError::Refused(format!(
                            "the fleet record on Lease {}/{name} does not parse ({}); not \
                             writing over it: {}",
                            self.namespace, u.reason, u.value
                        )));
                    }
                    existing.metadata.resource_version
                }
            };
        }
        Err(self.unreachable("this node's fleet record kept changing".into()))
    }

    #[tracing::instrument(level = "debug", skip_all)]
    async fn read_fleet(&self) -> Result<FleetRead, LockError> {
        self.check()?;
        let lp = ListParams::default().labels(&self.selector);
        let list = self.call("listing Leases", self.leases.list(&lp)).await?;
        let at = list.metadata.resource_version.clone().unwrap_or_default();
        let mut snap = Snapshot::empty();
        let mut records = Vec::new();
        for lease in list.items {
            if self.is_member(&lease) {
                let name = annotation(&lease, ANNOTATION_MEMBER_NODE)
                    .map(str::to_owned)
                    .unwrap_or_else(|| lease.metadata.name.clone().unwrap_or_default());
                records.push(RecordRead {
                    name,
                    record: record_of(&lease),
                });
            } else {
                self.put_lease(&mut snap, lease);
            }
        }
        snap.max = self.max_of(&snap)?;
        let share = self.share(&snap).await?;
        if let Some(share) = &share {
            snap.max = share.max();
        }
        let view = self.view(&snap, "", &HashMap::new())?;
        Ok(FleetRead {
            backend: BACKEND,
            group: self.name.clone(),
            view,
            records,
            pause: snap.pause.as_ref().map(|(p, _)| p.clone()),
            share,
            at,
        })
    }

    async fn fleet_changed(&self, read: &FleetRead) -> Result<(), LockError> {
        let timeout = self.timeouts.watch.as_secs().clamp(1, 290) as u32;
        let wp = WatchParams::default()
            .labels(&self.selector)
            .timeout(timeout);
        loop {
            let opened = self.leases.watch(&wp, &read.at);
            let mut stream = self.call("watching Leases", opened).await?.boxed();
            while let Some(event) = stream.next().await {
                match event {
                    Ok(WatchEvent::Bookmark(_)) => {}
                    Ok(WatchEvent::Error(e)) if e.code == 410 => return Ok(()),
                    Ok(WatchEvent::Error(e)) => {
                        return Err(self.status_error("watching Leases", &e))
                    }
                    Ok(_) => return Ok(()),
                    Err(e) => return Err(self.classify("watching Leases", e).error),
                }
            }
        }
    }
}
