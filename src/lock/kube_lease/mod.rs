//! Kubernetes lock backend (`lock.backend = "kubernetes"`): a counting semaphore of reboot slots
//! over coordination.k8s.io/v1 Lease objects in `lock.kubernetes.namespace`. A control Lease
//! holds `max`, slot Leases `<name>-<i>` are held by `spec.holderIdentity` (the one field the
//! admission policy binds to the writer; annotations are claims), waiter Leases queue, and a pause
//! Lease pauses the group. Every write is guarded by the `resourceVersion` read. The layout, the
//! queue, reclaim and permissions are in docs/lease-semaphore.md.

mod calls;
mod far_back;
mod marker;
pub mod members;
mod objects;
mod pause;
mod queue;
mod report;
mod snapshot;
pub(in crate::lock) mod waiting;

use crate::lock::Backend;
use crate::state::Phase;
use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::Api;

use super::{
    Acquired, Admin, Fence, GroupPause, Identity, LockError, Reported, Semaphore, SemaphoreStatus,
};
use crate::config;
use objects::{name_problem, Slot};
pub use pause::ANNOTATION_PAUSED;
pub use queue::ANNOTATION_WAITER_NODE;
use snapshot::Snapshot;

const BACKEND: Backend = Backend::Kubernetes;

/// Label on every Lease of a semaphore; its value is the semaphore name.
pub const LABEL_SEMAPHORE: &str = "rebootd.io/semaphore";
/// Label saying what a Lease is: [`ROLE_CONTROL`] or [`ROLE_SLOT`].
pub const LABEL_ROLE: &str = "rebootd.io/role";
pub const ROLE_CONTROL: &str = "control";
/// Label of a slot Lease: its index.
pub const LABEL_SLOT: &str = "rebootd.io/slot";
pub const ROLE_SLOT: &str = "slot";
/// Role of a waiter Lease `<name>-waiter-<node>` (its place in the queue of waiters).
pub const ROLE_WAITER: &str = "waiter";
/// Role of the group's pause Lease `<name>-paused` (`rebootctl pause --group`).
pub const ROLE_PAUSE: &str = "pause";
/// Annotation of the control Lease: the number of slots.
pub const ANNOTATION_MAX: &str = "rebootd.io/max";
/// Annotations of a held slot Lease.
pub const ANNOTATION_MACHINE_ID: &str = "rebootd.io/machine-id";
pub const ANNOTATION_BOOT_ID: &str = "rebootd.io/boot-id";
pub const ANNOTATION_PHASE: &str = "rebootd.io/phase";
pub const ANNOTATION_SINCE: &str = "rebootd.io/since";
pub const ANNOTATION_NODE_UID: &str = "rebootd.io/node-uid";
/// Annotation of a held slot: the holder token of the host that took it.
pub const ANNOTATION_HOLDER_TOKEN: &str = "rebootd.io/holder-token";
/// The zone a holder (on its slot Lease) or a waiter (on its waiter Lease) claims: its Node's
/// `zone_label`, for `lock.max_per_zone`.
pub const ANNOTATION_ZONE: &str = "rebootd.io/zone";
/// Annotations rebootd writes on a held slot and removes on release.
const HOLDER_ANNOTATIONS: [&str; 7] = [
    ANNOTATION_ZONE,
    ANNOTATION_MACHINE_ID,
    ANNOTATION_BOOT_ID,
    ANNOTATION_PHASE,
    ANNOTATION_SINCE,
    ANNOTATION_NODE_UID,
    ANNOTATION_HOLDER_TOKEN,
];
/// Slots of a semaphore whose control Lease does not exist yet.
pub const DEFAULT_MAX: u64 = 1;
/// Largest `max` `set-max` accepts (one Lease per slot).
pub const MAX_SLOTS: u64 = 1000;
/// Added to a waiter Lease's expiry before it counts as dead: the clocks of the waiters (who
/// write `renewTime`) and of the readers may differ by this much.
const WAITER_CLOCK_SLACK: Duration = Duration::from_secs(2);

/// Time limits of the Kubernetes backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// One request (get, list, replace, opening a watch).
    pub request: Duration,
    /// How long the server keeps one watch open (`timeoutSeconds`); the watch is then resumed
    /// from the last resourceVersion. A watch silent for this plus `request` is reopened too.
    pub watch: Duration,
    /// First pause after a transient error inside `acquire`; doubled each time, up to
    /// `backoff_max`.
    pub backoff_min: Duration,
    pub backoff_max: Duration,
    /// `leaseDurationSeconds` of a waiter Lease (whole seconds, at least 1); the waiter renews
    /// it every third of that (two thirds while far back in a long queue). A waiter not renewed
    /// for this (plus a little clock slack) is dead and no longer holds its place in the queue.
    pub waiter_ttl: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            request: Duration::from_secs(10),
            watch: Duration::from_secs(290),
            backoff_min: Duration::from_millis(100),
            backoff_max: Duration::from_secs(10),
            waiter_ttl: Duration::from_secs(30),
        }
    }
}

/// The Lease semaphore.
pub struct KubeLeaseSemaphore {
    leases: Api<Lease>,
    nodes: Api<Node>,
    namespace: String,
    name: String,
    /// `rebootd.io/semaphore=<name>`
    selector: String,
    /// `<name>-waiter-`: the names of the waiter Leases.
    waiter_prefix: String,
    /// What error messages say we talk to.
    target: String,
    /// Why `name` cannot be used, if it cannot.
    invalid: Option<String>,
    max_hold: Option<Duration>,
    /// `lock.max_per_zone`: at most this many holders in one zone.
    max_per_zone: Option<u64>,
    /// The Node label that names a node's zone.
    zone_label: String,
    /// `lock.max = "N%"`: the slots are this share of the Nodes `node_selector` matches.
    max_percent: Option<u8>,
    node_selector: Option<String>,
    /// How many Nodes matched, as the last `acquire` listed them (0: not yet).
    known_nodes: std::sync::atomic::AtomicU64,
    timeouts: Timeouts,
    /// My slot Lease as this process last wrote it (see [`report`]).
    written: report::Written,
    /// The pause as `group_pause` last listed it, for the wait that follows ([`pause`]).
    last_pause: super::pause::LastRead<String>,
    /// The last valid `max` the control Lease said ([`NO_MAX`]: none yet), used while the
    /// control Lease cannot be read, so that a broken one does not stall the group.
    known_max: std::sync::atomic::AtomicU64,
}

/// [`KubeLeaseSemaphore::known_max`] before any valid `max` was read.
const NO_MAX: u64 = u64::MAX;

impl std::fmt::Debug for KubeLeaseSemaphore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeLeaseSemaphore")
            .field("target", &self.target)
            .field("namespace", &self.namespace)
            .field("name", &self.name)
            .field("max_hold", &self.max_hold)
            .finish_non_exhaustive()
    }
}

impl KubeLeaseSemaphore {
    /// The semaphore `settings.name` in `settings.namespace`, through `client` (which should
    /// not retry 429/503 itself: `acquire` retries with its own backoff). Nothing is contacted
    /// until the first call. `max_hold` enables reclaiming holders without progress for that
    /// long.
    pub fn new(
        client: kube::Client,
        settings: &config::KubeLease,
        max_hold: Option<Duration>,
    ) -> KubeLeaseSemaphore {
        let name = settings.name.clone();
        let namespace = settings.namespace.clone();
        KubeLeaseSemaphore {
            leases: Api::namespaced(client.clone(), &namespace),
            nodes: Api::all(client),
            selector: format!("{LABEL_SEMAPHORE}={name}"),
            waiter_prefix: queue::prefix(&name),
            target: format!("the API server (Leases {namespace}/{name}*)"),
            invalid: name_problem(&name),
            namespace,
            name,
            max_hold,
            max_per_zone: None,
            zone_label: settings.zone_label.clone(),
            max_percent: None,
            node_selector: settings.node_selector.clone(),
            known_nodes: std::sync::atomic::AtomicU64::new(0),
            timeouts: Timeouts::default(),
            written: report::Written::default(),
            last_pause: super::pause::LastRead::default(),
            known_max: std::sync::atomic::AtomicU64::new(NO_MAX),
        }
    }

    /// With at most `max_per_zone` holders in one zone: each node's zone is its Node's
    /// `zone_label`, claimed on its waiter and slot Leases (`rebootd.io/zone`).
    pub fn with_max_per_zone(mut self, max_per_zone: Option<u64>) -> Self {
        self.max_per_zone = max_per_zone;
        self
    }

    /// With `max` a share of the Nodes (`lock.max = "N%"`, over `node_selector`) instead of
    /// the control Lease's count.
    pub fn with_max_percent(mut self, percent: Option<u8>) -> Self {
        self.max_percent = percent;
        self
    }

    /// Count only the Nodes `selector` matches for `lock.max = "N%"`.
    pub fn with_node_selector(mut self, selector: Option<String>) -> Self {
        self.node_selector = selector;
        self
    }

    /// Other time limits.
    pub fn with_timeouts(mut self, timeouts: Timeouts) -> Self {
        self.timeouts = timeouts;
        self
    }

    /// Name the API server in error messages (e.g. its URL).
    pub fn with_target(mut self, target: impl Into<String>) -> Self {
        self.target = format!(
            "{} (Leases {}/{}*)",
            target.into(),
            self.namespace,
            self.name
        );
        self
    }

    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The semaphore name: the control Lease's name and the slot Leases' prefix.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The label selector of the semaphore's Leases.
    pub fn label_selector(&self) -> &str {
        &self.selector
    }

    /// The name of the Lease of slot `index`.
    pub fn slot_name(&self, index: u64) -> String {
        format!("{}-{index}", self.name)
    }

    /// The name of the waiter Lease of `node`: `<name>-waiter-<node>` (the node escaped if
    /// need be; never `<name>-<digits>`).
    pub fn waiter_name(&self, node: &str) -> String {
        queue::waiter_name(&self.name, node)
    }

    fn check(&self) -> Result<(), LockError> {
        match &self.invalid {
            Some(reason) => Err(LockError::Refused(reason.clone())),
            None => Ok(()),
        }
    }
}

impl KubeLeaseSemaphore {
    /// Free the slots `me` may free ([`Self::releasable`]), first on `first`.
    async fn release_mine(&self, me: &Identity, first: Snapshot) -> Result<(), LockError> {
        self.update_from("release", Some(first), |snap| async move {
            match self.releasable(&snap, me) {
                Ok(mine) => self.free_slots(&mine, snap.max, &me.node).await,
                Err(why) => {
                    tracing::error!(id = %me.id, %why, "not releasing a slot another host holds under this node and machine id");
                    Ok(true)
                }
            }
        })
        .await
    }

    /// Free `slots` (each deleted when at or above `max`); `false` when one was lost to a race.
    async fn free_slots(&self, slots: &[&Slot], max: u64, who: &str) -> Result<bool, LockError> {
        if slots.is_empty() {
            tracing::debug!(%who, "holding no slot; nothing to release");
            return Ok(true);
        }
        let mut done = true;
        for slot in slots {
            if self.free_slot(slot, max).await? {
                tracing::info!(namespace = %self.namespace, lease = slot.name(), %who, deleted = slot.index >= max, "released");
            } else {
                done = false;
            }
        }
        Ok(done)
    }

    /// Free every slot held by `id`, first on `first` when given.
    async fn unlock_from(&self, id: &str, first: Option<Snapshot>) -> Result<(), LockError> {
        self.update_from("release", first, |snap| async move {
            let theirs: Vec<&Slot> = snap
                .held()
                .filter(|(_, h)| h.is(id))
                .map(|(s, _)| s)
                .collect();
            self.free_slots(&theirs, snap.max, id).await
        })
        .await
    }
}

#[async_trait]
impl Semaphore for KubeLeaseSemaphore {
    fn backend(&self) -> Backend {
        BACKEND
    }

    fn fleet(&self) -> Option<&dyn crate::fleet::FleetStore> {
        Some(self)
    }

    /// The lock core's acquire loop over this store (docs/lease-semaphore.md, "Waiting"): waits by
    /// watch; retries an unreachable or overloaded API server with capped exponential backoff;
    /// returns at once on anything else (a corrupt control Lease, permission denied).
    #[tracing::instrument(skip(self, me), fields(namespace = %self.namespace, semaphore = %self.name, id = %me.id))]
    async fn acquire(&self, me: &Identity) -> Result<(), LockError> {
        waiting::acquire(self, me).await
    }

    /// The pause Lease is listed and watched with the semaphore: no request of its own.
    #[tracing::instrument(skip(self, me, first), fields(namespace = %self.namespace, semaphore = %self.name, id = %me.id))]
    async fn acquire_unless_paused(
        &self,
        me: &Identity,
        first: Phase,
    ) -> Result<Acquired, LockError> {
        waiting::acquire_unless_paused(self, me, first).await
    }

    #[tracing::instrument(skip(self, me), fields(namespace = %self.namespace, semaphore = %self.name, id = %me.id))]
    async fn fence(&self, me: &Identity) -> Result<Fence, LockError> {
        self.check()?;
        Ok(self.fence_of(&self.read().await?, me))
    }

    fn heartbeat_every(&self) -> Option<Duration> {
        super::heartbeat_every(self.max_hold)
    }

    /// Writes `renewTime` on my slot Lease (a new resourceVersion), if I hold it.
    #[tracing::instrument(skip(self, me), fields(namespace = %self.namespace, semaphore = %self.name, id = %me.id))]
    async fn heartbeat(&self, me: &Identity) -> Result<Fence, LockError> {
        self.check()?;
        self.written.forget();
        let fence = std::sync::Mutex::new(Fence::Held);
        self.update("heartbeat", |snap| {
            let fence = &fence;
            async move {
                let f = self.fence_of(&snap, me);
                let held = f == Fence::Held;
                *fence.lock().unwrap_or_else(|p| p.into_inner()) = f;
                let Some((slot, _, _)) = snap.mine(me).filter(|_| held) else {
                    return Ok(true);
                };
                let mut lease = slot.lease.clone();
                lease.spec.get_or_insert_with(LeaseSpec::default).renew_time =
                    Some(MicroTime(jiff::Timestamp::now()));
                self.replace("heartbeat", &lease).await
            }
        })
        .await?;
        Ok(fence.into_inner().unwrap_or_else(|p| p.into_inner()))
    }

    /// Frees my slot, unless another host (another token) holds it under my machine id.
    #[tracing::instrument(skip(self, me), fields(namespace = %self.namespace, semaphore = %self.name, id = %me.id))]
    async fn release(&self, me: &Identity) -> Result<(), LockError> {
        self.check()?;
        // The Leases as a report listed them a moment ago (see `report`), or a list now.
        let recent = self.written.recent();
        self.written.forget();
        let snap = match recent {
            Some(snap) => snap,
            None => self.read().await?,
        };
        self.release_mine(me, snap).await
    }

    /// Records the phase (and boot id) on the held slot and renews `renewTime`; `since` moves
    /// only when the phase or boot id changes. Not holding a slot is a no-op.
    #[tracing::instrument(skip(self, me), fields(namespace = %self.namespace, semaphore = %self.name, id = %me.id))]
    async fn report_phase(&self, me: &Identity, phase: Phase) -> Result<Reported, LockError> {
        self.check()?;
        self.report(me, phase.as_str()).await
    }
}

#[async_trait]
impl Admin for KubeLeaseSemaphore {
    async fn pause_group(&self, pause: &GroupPause) -> Result<(), LockError> {
        self.put_pause(pause).await
    }

    fn fleet(&self) -> Option<&dyn crate::fleet::FleetStore> {
        Some(self)
    }

    async fn resume_group(&self) -> Result<(), LockError> {
        self.delete_pause().await
    }

    /// Frees every slot held by `id` (node name or machine id); a slot at or above `max` (left
    /// by a forced shrink) is deleted instead.
    #[tracing::instrument(skip(self), fields(namespace = %self.namespace, semaphore = %self.name))]
    async fn unlock(&self, id: &str) -> Result<(), LockError> {
        self.check()?;
        self.unlock_from(id, None).await
    }

    #[tracing::instrument(skip(self), fields(namespace = %self.namespace, semaphore = %self.name))]
    async fn status(&self) -> Result<SemaphoreStatus, LockError> {
        self.check()?;
        let snap = self.read().await?;
        let mut view = snap.holders_view();
        let share = self.share(&snap).await?;
        if let Some(share) = &share {
            view.max = share.max();
        }
        let mut status = view.status(BACKEND, &self.name);
        status.share = share;
        Ok(status)
    }

    /// Writes `max` on the control Lease (creating it if absent), then creates the missing
    /// free slots below `max` and deletes the free slots at or above it. Held slots above `max`
    /// (only with `force`) stay until released.
    #[tracing::instrument(skip(self), fields(namespace = %self.namespace, semaphore = %self.name))]
    async fn set_max(&self, max: u64, force: bool) -> Result<(), LockError> {
        self.check()?;
        if max > MAX_SLOTS {
            return Err(LockError::Refused(format!(
                "set-max {max} refused: at most {MAX_SLOTS} slots (one Lease each)"
            )));
        }
        self.update("set-max", |snap| async move {
            let holders = snap.holders();
            super::holding::may_set_max(max, holders, force)?;
            match &snap.control {
                None => {
                    if !self.create_control(&snap, max).await? {
                        return Ok(false);
                    }
                }
                Some(c) if snap.max != max => {
                    let mut c = c.clone();
                    c.metadata
                        .annotations
                        .get_or_insert_with(BTreeMap::new)
                        .insert(ANNOTATION_MAX.to_owned(), max.to_string());
                    if !self.replace("writing max", &c).await? {
                        return Ok(false);
                    }
                }
                Some(_) => {}
            }
            if (max as u128) < holders as u128 {
                tracing::warn!(namespace = %self.namespace, semaphore = %self.name, max, holders, "set-max below the current holders (forced); slots above max are deleted when released");
            } else {
                tracing::info!(namespace = %self.namespace, semaphore = %self.name, max, holders, "max set");
            }
            for index in (0..max).filter(|i| !snap.slots.contains_key(i)) {
                self.create("creating a free slot", &self.free_slot_lease(index))
                    .await?;
            }
            for slot in snap.slots.values().filter(|s| s.index >= max && s.holder.is_none()) {
                // Lost = someone took it meanwhile (from the old max): it goes on release.
                self.delete_slot(slot).await?;
            }
            Ok(true)
        })
        .await
    }
}
