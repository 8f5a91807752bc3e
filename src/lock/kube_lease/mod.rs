//! Kubernetes lock backend (`lock.backend = "kubernetes"`): a counting semaphore of reboot slots
//! over coordination.k8s.io/v1 Lease objects in `lock.kubernetes.namespace`.
//!
//! # Object layout
//!
//! For a semaphore named `<name>` (`lock.kubernetes.name`, default `rebootd`), every object is a
//! Lease labelled `rebootd.io/semaphore=<name>`:
//!
//! - **Control Lease `<name>`** (label `rebootd.io/role=control`): holds no slot (no
//!   `holderIdentity`); its annotation `rebootd.io/max` is the number of slots. The first
//!   `acquire` (or `set-max`) creates it with `max` 1 (or, if slot Leases exist without it, with as
//!   many slots as there are slot Leases). A control Lease whose `rebootd.io/max` is missing or not
//!   a number is [`LockError::Corrupt`] and is never written over.
//! - **Slot Leases `<name>-<i>`** (labels `rebootd.io/role=slot`, `rebootd.io/slot=<i>`; the
//!   name is what counts), `i` in `0..max` (a slot at or above `max` may survive a forced
//!   shrink while held, until released). A slot is *free* when its
//!   `spec.holderIdentity` is unset or empty. A held slot has:
//!   - `spec.holderIdentity` = the node name, `spec.acquireTime` = when it was taken,
//!     `spec.renewTime` = the last write by the holder (take, phase report),
//!     `spec.leaseTransitions` = how many times the slot was taken (every take, reclaims
//!     included, adds 1); `spec.leaseDurationSeconds` is left unset: there is **no TTL**, a slot
//!     is held across the reboot until it is released or reclaimed;
//!   - annotations `rebootd.io/machine-id`, `rebootd.io/boot-id`, `rebootd.io/phase` (after the
//!     first phase report), `rebootd.io/since` (RFC 3339: when the slot was taken or the phase or
//!     boot id last changed) and `rebootd.io/node-uid` (the uid of the holder's Node object when
//!     it took the slot; absent when there was no such Node or it could not be read).
//!
//!   Slot Leases are created on demand: `acquire` creates the lowest missing slot below `max`
//!   already held (a create is atomic, so two creators cannot both win), `set-max` creates the
//!   missing free ones so `kubectl get leases` shows every slot.
//! - **Waiter Leases `<name>-waiter-<node>`** (label `rebootd.io/role=waiter`): one per node
//!   waiting for a slot, its place in a FIFO queue (see *Waiting*). `spec.acquireTime` = when it
//!   started waiting, `spec.renewTime` = its last renewal, `spec.leaseDurationSeconds` = its TTL
//!   ([`Timeouts::waiter_ttl`]); annotation `rebootd.io/waiter-node` = the node name. It has
//!   **no** `holderIdentity`, so nothing that counts Leases with a holder counts a waiter. The
//!   node part is the node name as is when that is a valid name part, not all digits and short
//!   enough; else escaped to `[a-z0-9-]`, shortened, with `-h<hash>` appended, so a waiter Lease
//!   never reads as a slot `<name>-<digits>`. `status()`, `set-max`, `release` and reclaim
//!   look at the control and slot Leases only; the holder's and the administrator's lists
//!   leave the waiter Leases out (`rebootd.io/role!=waiter`), so they cost O(max).
//! - **Pause Lease `<name>-paused`** (label `rebootd.io/role=pause`): there while the group is
//!   paused (`rebootctl pause --group`); its annotation `rebootd.io/paused` says why, since when
//!   and by whom (see [`pause`]). Labelled as the semaphore's, so the waiters' one list and
//!   watch bring it: a waiter follows the pause without a request of its own.
//!
//! `set-max` accepts at most [`MAX_SLOTS`] slots. `status()` reports the semaphore name as its
//! group, reads only, and creates nothing (without a control Lease it shows the `max` the first
//! `acquire` would create).
//!
//! A semaphore name must be a lowercase DNS label of at most 63 characters (it is a label value
//! and a Lease name prefix). Do not name one semaphore `<other>-<digits>`: its control Lease
//! would be a slot of `<other>`; such a collision is detected and refused, not resolved.
//!
//! # Concurrency
//!
//! Every write is a replace carrying the `resourceVersion` read (409 Conflict = someone else
//! wrote first: read again and retry), a create (409 AlreadyExists = read again), or a delete
//! with a `resourceVersion` precondition. Two processes racing for the last free slot both
//! replace the same Lease with the same `resourceVersion`: exactly one wins. A slot is taken
//! only while fewer than `max` slots (counting held slots above `max`) are held and only below
//! `max`; held slots at or above `max` only ever go away, so a forced shrink converges. A
//! `set-max` racing with a take can leave one holder above the new `max`, exactly as a forced
//! shrink does.
//!
//! # Waiting (an adapter on the lock core)
//!
//! `acquire` is the lock core's loop ([`super::acquire`]) over [`waiting`]: the arbiter decides
//! on a view of the Leases ([`snapshot`]), the adapter commits each decision by a replace
//! carrying the `resourceVersion` read (or a create), and waits by watch. Waiters queue first
//! come, first served. A waiter that finds no slot for itself creates its waiter Lease (after a
//! restart it finds and adopts it, keeping its place) and renews it every third of its TTL while
//! it waits (every two thirds while far back, below). The queue is ordered by (`acquireTime`,
//! name). A waiter is *live* while its Lease's `resourceVersion` changes (renewals) as the
//! observer's own clock sees it: unchanged for its TTL plus 2 s, it no longer counts, and one
//! unchanged for twice that is deleted (resourceVersion precondition) by the next waiter that
//! takes a slot. A waiter's *rank* is the number of live waiters ahead of it; it goes for a slot
//! only while the free slots outnumber its rank (and then for the rank-th free slot, so that the
//! eligible waiters do not race for one Lease). The taker deletes its own waiter Lease right
//! after taking the slot. Waiters of older rebootd (no waiter Lease) race for free slots as
//! before, which stays safe: every take is a CAS.
//! A lost race (409) waits for the change that beat it, which the watch brings (a list again only
//! if none comes within the request time limit).
//!
//! A waiter never polls. One kube-runtime watcher of the Leases labelled
//! `rebootd.io/semaphore=<name>` lists them (the read) and then watches from that list's
//! `resourceVersion`, resuming from the last one seen (bookmarks included) when the server ends
//! the watch, and listing again only on 410 Gone: every change is applied to the view and the
//! arbiter decides again locally, so a release costs the waiters behind the first no request.
//! The first live waiter also watches (a kube-runtime watcher each, field selector
//! `metadata.name=<node>`) the Node object of each holder that has a `rebootd.io/node-uid`, and
//! sleeps until the next holder would pass `lock.max_hold`.
//!
//! A waiter **far back** in a long queue (at least `max + 16` live waiters ahead) does not watch
//! the semaphore: each waiter's renewals would be events for every other waiter, the square of
//! the queue. It watches one waiter Lease `max + 8` places ahead of it, its *marker* (field
//! selector `metadata.name=<it>`, from the `resourceVersion` listed), renewing its own meanwhile
//! every two thirds of its TTL and deciding nothing. When the marker's Lease is deleted (it took
//! a slot or left) it lists the semaphore again and is placed again; a marker not renewed for
//! twice the waiter time-out, as its own clock sees it, is deleted as a dead waiter's
//! (resourceVersion precondition) before that list; a marker's watch answered 410 Gone is opened
//! again from the current state. A far waiter sees a pause or a new `max` at that list (see
//! [`marker`]).
//!
//! # Reclaim
//!
//! Only the first live waiter in the queue reclaims, when no slot is free (logged at warn,
//! `leaseTransitions` + 1), by a replace guarded by the slot's `resourceVersion`:
//! - the slot of a holder whose Node object no longer exists (the watch lists none, or sees it
//!   deleted), or now has another uid than `rebootd.io/node-uid` (deleted and re-registered). A
//!   holder without `rebootd.io/node-uid` (it had no Node object, or could not read it) is never
//!   reclaimed on this ground, so a fleet of machines that are not Kubernetes nodes is never
//!   mass-reclaimed;
//! - with `lock.max_hold` set, the slot of a holder whose slot Lease got no new
//!   `resourceVersion` (heartbeats write `renewTime`, phase reports the annotations) for
//!   `max_hold` of this waiter's own clock. `rebootd.io/since` is shown, never compared.
//!
//! When holders exceed `max` (forced shrink), a reclaimed slot is freed (or deleted when at or
//! above `max`) instead of taken over.
//!
//! # Identity
//!
//! A slot is a node's only through `spec.holderIdentity`, the one field the admission policy
//! binds to the writer (see the arbiter's rule, [`super::arbiter::whose`]): the annotations
//! (machine id, boot id, token, phase) are claims any node may write, and only tell two boots or
//! two installs of that node apart. Among the slots held under `me.node`, one with `me.id` and
//! `me.token` is held; one without a token, or under another machine id (a reinstalled node), is
//! adopted (warn) and its annotations rewritten; one with `me.id` and another token belongs to
//! another host with this node name and machine id: reported, and this host waits. A slot Lease
//! past `max` or without the slot role is foreign: counted as held, never anyone's. `release(me)`
//! frees only slots held under `me.node`; `unlock(id)` (an administrator's) matches a holder by
//! node name or machine id.
//!
//! # Permissions
//!
//! Leases in the namespace: get, list, watch, create, update, delete. Nodes: get (the node uid
//! and the reclaim check) and watch (waking on a holder's Node deletion); without them a waiter
//! still works, reclaiming only on `max_hold`.

mod calls;
mod far_back;
mod marker;
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
/// Annotations rebootd writes on a held slot and removes on release.
const HOLDER_ANNOTATIONS: [&str; 6] = [
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
            timeouts: Timeouts::default(),
            written: report::Written::default(),
            last_pause: super::pause::LastRead::default(),
            known_max: std::sync::atomic::AtomicU64::new(NO_MAX),
        }
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

    /// The lock core's acquire loop over this store (see the module documentation): waits by
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
        Ok(snap.holders_view().status(BACKEND, &self.name))
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
