//! The Lease semaphore's requests: each bounded by the request time limit, its error sorted into
//! the lock core's transient ([`LockError::Unreachable`]) and permanent ones; reads, writes
//! guarded by the `resourceVersion` read, and the compare-and-swap loop of the calls other than
//! `acquire`.

use std::future::Future;

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{DeleteParams, ListParams, PostParams, Preconditions};
use kube::core::Status;

use super::objects::{label, Slot};
use super::snapshot::Snapshot;
use super::*;
use crate::lock::retry::{cas_loop, Cas};

/// What a GET of a Node said.
pub(super) enum NodeLookup {
    /// Its uid, and its zone (the `zone_label` label) when it names a valid one.
    Found {
        uid: String,
        zone: Option<String>,
    },
    Missing,
    /// Could not tell (e.g. 403): never a reason to reclaim.
    Unknown(String),
}

/// A failed call: the HTTP code when the server answered one, and the error to report.
pub(super) struct CallError {
    pub code: Option<u16>,
    pub error: LockError,
}

impl From<CallError> for LockError {
    fn from(e: CallError) -> Self {
        e.error
    }
}

fn is_transient_code(code: u16) -> bool {
    matches!(code, 408 | 429 | 500 | 502 | 503 | 504)
}

impl KubeLeaseSemaphore {
    pub(super) fn unreachable(&self, reason: String) -> LockError {
        LockError::Unreachable {
            backend: BACKEND,
            target: self.target.clone(),
            reason,
        }
    }

    pub(super) fn status_error(&self, what: &str, s: &Status) -> LockError {
        let reason = format!("{what}: {} ({} {})", s.message, s.code, s.reason);
        if is_transient_code(s.code) {
            self.unreachable(reason)
        } else {
            LockError::Backend {
                backend: BACKEND,
                reason: format!("{reason} at {}", self.target),
            }
        }
    }

    pub(super) fn classify(&self, what: &str, e: kube::Error) -> CallError {
        match e {
            kube::Error::Api(s) => CallError {
                code: Some(s.code),
                error: self.status_error(what, &s),
            },
            kube::Error::HyperError(_) | kube::Error::Service(_) | kube::Error::ReadEvents(_) => {
                CallError {
                    code: None,
                    error: self.unreachable(format!("{what}: {e}")),
                }
            }
            other => CallError {
                code: None,
                error: LockError::Backend {
                    backend: BACKEND,
                    reason: format!("{what}: {other} at {}", self.target),
                },
            },
        }
    }

    /// One request, bounded by `timeouts.request`.
    pub(super) async fn call<T>(
        &self,
        what: &str,
        fut: impl Future<Output = Result<T, kube::Error>>,
    ) -> Result<T, CallError> {
        match tokio::time::timeout(self.timeouts.request, fut).await {
            Err(_) => Err(CallError {
                code: None,
                error: self.unreachable(format!(
                    "{what}: no answer within {:?}",
                    self.timeouts.request
                )),
            }),
            Ok(Err(e)) => Err(self.classify(what, e)),
            Ok(Ok(t)) => Ok(t),
        }
    }

    /// The index of slot Lease `lease_name` (`<name>-<i>`, canonical digits).
    pub(super) fn slot_index(&self, lease_name: &str) -> Option<u64> {
        let digits = lease_name.strip_prefix(&self.name)?.strip_prefix('-')?;
        let canonical = !digits.is_empty()
            && digits.bytes().all(|b| b.is_ascii_digit())
            && (digits == "0" || !digits.starts_with('0'));
        canonical.then(|| digits.parse().ok()).flatten()
    }

    pub(super) fn corrupt(&self, value: &str, reason: String) -> LockError {
        LockError::Corrupt {
            key: format!(
                "Lease {}/{} annotation {ANNOTATION_MAX}",
                self.namespace, self.name
            ),
            value: crate::text::clean(value),
            reason,
        }
    }

    /// Count the Nodes `node_selector` matches (all without one), for `lock.max = "N%"`.
    pub(super) async fn count_nodes(&self) -> Result<u64, LockError> {
        let mut lp = ListParams::default();
        if let Some(selector) = &self.node_selector {
            lp = lp.labels(selector);
        }
        let list = self.call("listing Nodes", self.nodes.list(&lp)).await?;
        let known = list.items.len() as u64;
        let before = self
            .known_nodes
            .swap(known, std::sync::atomic::Ordering::Relaxed);
        if before != known {
            tracing::info!(nodes = known, selector = ?self.node_selector, "counted the Nodes lock.max is a share of");
        }
        Ok(known)
    }

    /// List the semaphore's control, slot and pause Leases, not its waiters: what a holder and
    /// an administrator read costs O(max), however long the queue. A control Lease whose max
    /// does not parse is [`LockError::Corrupt`].
    pub(super) async fn read(&self) -> Result<Snapshot, LockError> {
        let lp = ListParams::default().labels(&self.but_waiters());
        let list = self.call("listing Leases", self.leases.list(&lp)).await?;
        let mut snap = Snapshot::empty();
        for lease in list.items {
            self.put_lease(&mut snap, lease);
        }
        snap.max = self.max_of(&snap)?;
        Ok(snap)
    }

    /// The semaphore's Leases but the waiters' (a Lease without a role label is kept).
    fn but_waiters(&self) -> String {
        format!("{},{LABEL_ROLE}!={ROLE_WAITER}", self.selector)
    }

    /// Replace `lease` (guarded by the resourceVersion it carries). `false` = lost a race
    /// (409 Conflict, or 404: deleted meanwhile).
    pub(super) async fn replace(&self, what: &str, lease: &Lease) -> Result<bool, LockError> {
        Ok(self.replace_obj(what, lease).await?.is_some())
    }

    /// [`Self::replace`], returning the Lease written (with its new `resourceVersion`).
    pub(super) async fn replace_obj(
        &self,
        what: &str,
        lease: &Lease,
    ) -> Result<Option<Lease>, LockError> {
        let name = lease.metadata.name.as_deref().unwrap_or("");
        let pp = PostParams::default();
        match self.call(what, self.leases.replace(name, &pp, lease)).await {
            Ok(written) => Ok(Some(written)),
            Err(CallError {
                code: Some(409 | 404),
                ..
            }) => {
                tracing::debug!(lease = name, what, "lost a race; reading again");
                Ok(None)
            }
            Err(e) => Err(e.error),
        }
    }

    /// Create `lease`. `false` = it exists already (lost a race); refused when the existing
    /// Lease belongs to something else.
    #[tracing::instrument(level = "debug", skip(self, lease), fields(namespace = %self.namespace, lease = lease.metadata.name.as_deref().unwrap_or("")))]
    pub(super) async fn create(&self, what: &str, lease: &Lease) -> Result<bool, LockError> {
        Ok(self.create_obj(what, lease).await?.is_some())
    }

    /// [`Self::create`], returning the Lease created.
    pub(super) async fn create_obj(
        &self,
        what: &str,
        lease: &Lease,
    ) -> Result<Option<Lease>, LockError> {
        let name = lease.metadata.name.as_deref().unwrap_or("");
        match self
            .call(what, self.leases.create(&PostParams::default(), lease))
            .await
        {
            Ok(l) => Ok(Some(l)),
            Err(CallError {
                code: Some(409), ..
            }) => {
                let existing = self
                    .call("reading an existing Lease", self.leases.get_opt(name))
                    .await?;
                if let Some(existing) = existing {
                    let owner = label(&existing.metadata, LABEL_SEMAPHORE);
                    if owner != Some(self.name.as_str()) {
                        return Err(LockError::Refused(format!(
                            "Lease {}/{name} exists and is not part of semaphore {:?} (its label \
                             {LABEL_SEMAPHORE} is {owner:?}); rename lock.kubernetes.name or \
                             remove that Lease",
                            self.namespace, self.name
                        )));
                    }
                }
                tracing::debug!(lease = name, what, "lost a race; reading again");
                Ok(None)
            }
            Err(e) => Err(e.error),
        }
    }

    /// Delete slot `slot` if it did not change since read. `false` = it did (or is gone).
    #[tracing::instrument(level = "debug", skip(self, slot), fields(namespace = %self.namespace, lease = slot.name()))]
    pub(super) async fn delete_slot(&self, slot: &Slot) -> Result<bool, LockError> {
        self.delete_lease("deleting a slot Lease", &slot.lease)
            .await
    }

    /// Delete `lease` if it did not change since read. `false` = it did (or is gone).
    pub(super) async fn delete_lease(&self, what: &str, lease: &Lease) -> Result<bool, LockError> {
        let dp = DeleteParams {
            preconditions: Some(Preconditions {
                resource_version: lease.metadata.resource_version.clone(),
                uid: lease.metadata.uid.clone(),
            }),
            ..DeleteParams::default()
        };
        let name = lease.metadata.name.as_deref().unwrap_or("");
        match self.call(what, self.leases.delete(name, &dp)).await {
            Ok(_) => Ok(true),
            Err(CallError {
                code: Some(409 | 404),
                ..
            }) => Ok(false),
            Err(e) => Err(e.error),
        }
    }

    /// Give back `slot`: delete it when at or above `max`, else clear its holder.
    pub(super) async fn free_slot(&self, slot: &Slot, max: u64) -> Result<bool, LockError> {
        if slot.index >= max {
            self.delete_slot(slot).await
        } else {
            self.replace(
                "freeing a slot",
                &Self::freed(&slot.lease, jiff::Timestamp::now()),
            )
            .await
        }
    }

    /// Create the control Lease (absent in `snap`).
    pub(super) async fn create_control(
        &self,
        snap: &Snapshot,
        max: u64,
    ) -> Result<bool, LockError> {
        let created = self
            .create("creating the control Lease", &self.control_lease(max))
            .await?;
        if created {
            tracing::info!(namespace = %self.namespace, lease = %self.name, max, slots_found = snap.slots.len(), "created the semaphore's control Lease");
        }
        Ok(created)
    }

    /// GET a Node: its uid, or that it does not exist, or that we cannot tell.
    #[tracing::instrument(level = "debug", skip(self))]
    pub(super) async fn node_lookup(&self, node: &str) -> Result<NodeLookup, LockError> {
        match self.call("reading a Node", self.nodes.get_opt(node)).await {
            Ok(Some(n)) => {
                let label = n
                    .metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(&self.zone_label));
                Ok(NodeLookup::Found {
                    uid: n.metadata.uid.unwrap_or_default(),
                    zone: crate::lock::document::zone_of(label.map(String::as_str)),
                })
            }
            Ok(None) => Ok(NodeLookup::Missing),
            Err(CallError {
                error: e @ LockError::Unreachable { .. },
                ..
            }) => Err(e),
            Err(e) => Ok(NodeLookup::Unknown(e.error.to_string())),
        }
    }

    /// Optimistic-concurrency loop for the calls other than `acquire`: `f` does one attempt on
    /// a fresh read and says whether it is done.
    pub(super) async fn update<'a, F, Fut>(&'a self, what: &str, f: F) -> Result<(), LockError>
    where
        F: FnMut(Snapshot) -> Fut,
        Fut: Future<Output = Result<bool, LockError>> + 'a,
    {
        self.update_from(what, None, f).await
    }

    /// [`Self::update`], its first attempt on `first` (a read just made) when given: every
    /// write is guarded by the resourceVersion read, so a stale one only costs a retry.
    pub(super) async fn update_from<'a, F, Fut>(
        &'a self,
        what: &str,
        mut first: Option<Snapshot>,
        mut f: F,
    ) -> Result<(), LockError>
    where
        F: FnMut(Snapshot) -> Fut,
        Fut: Future<Output = Result<bool, LockError>> + 'a,
    {
        let target = format!("Leases {}/{}*", self.namespace, self.name);
        cas_loop!(BACKEND, what, &target, {
            let snap = match first.take() {
                Some(s) => Ok(s),
                None => self.read().await,
            };
            match snap {
                Ok(snap) => f(snap)
                    .await
                    .map(|done| if done { Cas::Done(()) } else { Cas::Conflict }),
                Err(e) => Err(e),
            }
        })
    }
}
