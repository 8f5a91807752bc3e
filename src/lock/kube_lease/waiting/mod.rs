//! `acquire` on the Lease store: the lock core's loop over [`LeaseWaiting`]. The semaphore's
//! Leases are read and then kept up to date by one kube-runtime watcher (its initial list is the
//! read; it resumes its watch from the last `resourceVersion` and bookmark when the server ends
//! it, and a 410 Gone reads again): each change is applied to the snapshot and the arbiter decides
//! again without a request. A waiter queues as its waiter Lease, renewed every third of its TTL
//! (far back, every two thirds). The head of the queue also watches the Node of each holder that
//! recorded one (a watcher on `metadata.name=<node>`), so a deleted or re-registered Node makes
//! that holder gone.
//!
//! Every decision is committed by a replace carrying the `resourceVersion` read (or a create);
//! a lost race (409) waits for the change of that Lease that beat it on the watch, deciding
//! nothing on the events before it (`lock::lost_race`; it lists again only if none comes within
//! the request time limit). A waiter far back in a long queue takes the changes into its view
//! without deciding on them (`far_back`); further back still, it stops watching the semaphore
//! and watches one waiter Lease ahead (`marker`) until that one leaves the queue. A dropped
//! `acquire` leaves its waiter Lease to expire: it stops holding its place after its TTL.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures_util::stream::{BoxStream, SelectAll, StreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use kube::runtime::watcher;

use super::super::acquire::{self, Settings, Waiting, Wake};
use super::super::arbiter::Policy;
use super::super::contact::Contact;
use super::super::lost_race::LostRace;
use super::super::view::View;
use super::super::{Acquired, GroupPause};
use crate::state::Phase;

use super::far_back::{self, FarBack};
use super::marker::Marker;
use super::objects::Slot;
use super::snapshot::{lease_ticket, ticket, Snapshot};
use super::*;

mod nodes;
mod renew;
mod watch;

use super::super::acquire::sleep_until;
use nodes::NodeWatches;
use watch::{initial, lease_watcher, watch_error};

type LeaseEvents = BoxStream<'static, Result<watcher::Event<Lease>, watcher::Error>>;
/// One event of a holder's Node watcher, with the node's name.
type NodeEvent = (String, Result<watcher::Event<Node>, watcher::Error>);
type NodeEvents = BoxStream<'static, NodeEvent>;

/// Take a slot for `me` in `store`, waiting in its queue as long as it takes.
pub(super) async fn acquire(store: &KubeLeaseSemaphore, me: &Identity) -> Result<(), LockError> {
    store.check()?;
    acquire::acquire(&mut waiting(store, me), me, &settings(store)).await
}

/// As [`acquire`], unless the group is paused before or while waiting: the pause Lease comes
/// with the waiter's own list and watch. Paused, its `resourceVersion` is kept for the wait for
/// the resume that follows (it watches from there); my waiter Lease is deleted as I leave.
pub(super) async fn acquire_unless_paused(
    store: &KubeLeaseSemaphore,
    me: &Identity,
    first: Phase,
) -> Result<Acquired, LockError> {
    store.check()?;
    let mut w = waiting(store, me);
    w.first = Some(first);
    let acquired = acquire::acquire_unless_paused(&mut w, me, &settings(store)).await?;
    if let Acquired::Paused(_) = &acquired {
        if let Some((pause, rv)) = w.snap.as_ref().and_then(|s| s.pause.clone()) {
            store.last_pause.set((Some(pause), rv));
        }
        // Paused, not done: my place in the queue goes (a dead waiter's Lease would hold up
        // the queue for its TTL).
        w.leave(Vec::new()).await;
    }
    Ok(acquired)
}

fn settings(store: &KubeLeaseSemaphore) -> Settings {
    let ttl = Duration::from_secs(u64::try_from(store.waiter_ttl_secs()).unwrap_or(1));
    Settings {
        backend: BACKEND,
        label: "Kubernetes API",
        target: format!("Leases {}/{}", store.namespace, store.name),
        policy: Policy {
            max_hold: store.max_hold,
            // Renewed every third of its TTL: not renewed for the TTL (plus slack), it is dead.
            waiter_timeout: ttl + WAITER_CLOCK_SLACK,
            max_per_zone: store.max_per_zone,
        },
        backoff_min: store.timeouts.backoff_min,
        backoff_max: store.timeouts.backoff_max,
    }
}

/// A waiter of `me` on `store` that has read nothing yet (the steps of `acquire`; tests drive
/// them one by one).
pub(in crate::lock) fn waiting<'a>(
    store: &'a KubeLeaseSemaphore,
    me: &'a Identity,
) -> LeaseWaiting<'a> {
    LeaseWaiting {
        store,
        me,
        my_waiter: store.waiter_name(&me.node),
        first: None,
        snap: None,
        relisting: None,
        leases: None,
        nodes: NodeWatches::default(),
        gone: HashMap::new(),
        own_node_uid: None,
        own_zone: None,
        node_access_warned: false,
        reread: false,
        decide_again: false,
        lost_race: LostRace::default(),
        far_back: None,
        marker: None,
        contact: Contact::new(store.timeouts.waiter_ttl),
    }
}

pub(in crate::lock) struct LeaseWaiting<'a> {
    store: &'a KubeLeaseSemaphore,
    me: &'a Identity,
    my_waiter: String,
    /// The phase written with the take (`Semaphore::acquire_unless_paused`'s `first`).
    first: Option<Phase>,
    snap: Option<Snapshot>,
    /// A list the watcher started again (after it lost its place): built until `InitDone`.
    relisting: Option<Snapshot>,
    leases: Option<LeaseEvents>,
    nodes: NodeWatches,
    /// Why holders' Nodes are gone: node name → (the uid the holder recorded, words).
    gone: HashMap<String, (String, String)>,
    /// Our own Node's uid, looked up once, when first about to take a slot.
    own_node_uid: Option<Option<String>>,
    /// My Node's zone (its `zone_label`), read with its uid; `None`: unknown.
    own_zone: Option<String>,
    node_access_warned: bool,
    /// The view cannot be right (or a waiter Lease of ours exists unseen): read again at once.
    reread: bool,
    /// My waiter Lease, just created, went ahead of waiters already queued (their clocks run
    /// ahead of mine: a later `acquireTime`): the decision made before it counted them ahead
    /// of me. Decide again, without a request, before placing or waiting.
    decide_again: bool,
    /// The Lease a write of mine lost on (409), until the watch brings its change.
    lost_race: LostRace,
    /// Where the arbiter last placed me in the queue, for passing over changes while far back.
    far_back: Option<FarBack>,
    /// Far back in a long queue: the one waiter Lease watched instead of the semaphore.
    marker: Option<Marker>,
    /// When the API server last answered: lists, watch events, renewals.
    contact: Contact,
}

/// What ended one `select!` of [`LeaseWaiting::wait`].
enum Woken {
    Timer,
    LostRace,
    Renew,
    Lease(Option<Box<Result<watcher::Event<Lease>, watcher::Error>>>),
    Node(Option<Box<NodeEvent>>),
}

impl LeaseWaiting<'_> {
    /// `slot` taken by me at `now`, with the phase I enter with it (the first report).
    fn taken(&self, slot: &Lease, now: jiff::Timestamp, node_uid: Option<&str>) -> Lease {
        let mut lease = KubeLeaseSemaphore::taken(slot, self.me, now, node_uid);
        let annotations = lease.metadata.annotations.get_or_insert_with(BTreeMap::new);
        if let Some(first) = self.first {
            annotations.insert(ANNOTATION_PHASE.to_owned(), first.as_str().to_owned());
        }
        if let Some(zone) = &self.own_zone {
            annotations.insert(ANNOTATION_ZONE.to_owned(), zone.clone());
        }
        lease
    }

    fn snap(&self) -> Result<&Snapshot, LockError> {
        self.snap.as_ref().ok_or(LockError::NotRead(BACKEND))
    }

    fn watch_error(&self, e: watcher::Error) -> LockError {
        watch_error(self.store, e)
    }

    /// The slot held by `holder` (its id as the view shows it).
    fn slot_of(&self, holder: &str) -> Result<Option<Slot>, LockError> {
        Ok(self
            .snap()?
            .held()
            .find(|(_, h)| h.id() == holder)
            .map(|(s, _)| s.clone()))
    }

    /// Whether the change just applied can be passed over: I am far back in the queue
    /// ([`FarBack`]).
    fn held_back(&self) -> bool {
        let (Some(snap), Some(fb)) = (&self.snap, &self.far_back) else {
            return false;
        };
        // A control Lease that does not parse is for the arbiter's view to report.
        self.store
            .max_of(snap)
            .is_ok_and(|max| fb.holds_back(snap, self.me, &self.my_waiter, max))
    }

    /// Whether a change of Lease `name` (to `new`; `None`: deleted) is a waiter's behind me,
    /// or my own renewal ([`far_back::behind_me`]): taken into the view, not decided on.
    fn behind_me(&self, name: &str, new: Option<&Lease>) -> bool {
        name.starts_with(&self.store.waiter_prefix)
            && self
                .snap
                .as_ref()
                .is_some_and(|s| far_back::behind_me(s, &self.my_waiter, name, new))
    }

    /// Whether a write to Lease `name` that changes the snapshot won; a loss is noted: the
    /// write that beat it is on its way on the watch, which the wait follows (no list) until
    /// that Lease changes; within the request time limit, or the wait lists again.
    fn won(&mut self, won: bool, name: &str) -> bool {
        if !won {
            self.lost_race.lost(name, self.store.timeouts.request);
        }
        won
    }
}

impl LeaseWaiting<'_> {
    /// Far back (see [`super::marker`]): wait, renewing my waiter Lease, until the marker
    /// leaves the queue or is dead, then read again. Nothing else is decided on here: the view
    /// is not kept up to date while far back.
    async fn wait_far(&mut self) -> Result<Wake, LockError> {
        let timeout = settings(self.store).policy.waiter_timeout;
        loop {
            let renew_at = self.renew_at();
            let Some(marker) = self.marker.as_mut() else {
                return Ok(Wake::Reread);
            };
            let dead_at = marker.dead_at(timeout);
            tokio::select! {
                () = sleep_until(renew_at), if renew_at.is_some() => {
                    if !self.renew().await? {
                        return Ok(Wake::Reread);
                    }
                }
                () = sleep_until(Some(dead_at)) => {
                    let deleted = marker.delete(self.store).await?;
                    tracing::info!(lease = marker.name(), deleted, "the waiter Lease ahead that this waiter watched was not renewed for twice the waiter time-out: deleted as a dead waiter's (unless it changed); reading the queue again");
                    return Ok(Wake::Reread);
                }
                left = marker.next(self.store) => {
                    if left? {
                        tracing::debug!(lease = marker.name(), "the waiter Lease ahead left the queue; reading it again");
                        return Ok(Wake::Reread);
                    }
                }
            }
        }
    }
}

#[async_trait]
impl Waiting for LeaseWaiting<'_> {
    async fn read(&mut self) -> Result<(), LockError> {
        self.reread = false;
        self.lost_race.clear();
        self.far_back = None;
        self.marker = None;
        self.relisting = None;
        self.leases = None;
        let mut created = false;
        loop {
            let mut stream = lease_watcher(self.store);
            let snap = initial(self.store, &mut stream).await?;
            if snap.control.is_none() && !created {
                let max = self.store.max_of(&snap)?;
                self.store.create_control(&snap, max).await?;
                created = true;
                continue;
            }
            self.leases = Some(stream);
            self.snap = Some(snap);
            self.contact.answered(Instant::now());
            if self.store.max_per_zone.is_some() {
                // My zone is my Node's label: read before the first decision.
                self.own_node_uid().await?;
            }
            if self.store.max_percent.is_some() {
                self.store.count_nodes().await?;
            }
            return Ok(());
        }
    }

    fn view(&self) -> Result<View, LockError> {
        let mut view = self.store.view(self.snap()?, &self.my_waiter, &self.gone)?;
        view.my_zone = self.own_zone.clone();
        Ok(view)
    }

    async fn take(&mut self, rank: usize) -> Result<bool, LockError> {
        let node_uid = self.own_node_uid().await?;
        let store = self.store;
        let snap = self.snap()?;
        let max = store.effective_max(snap)?;
        let now = jiff::Timestamp::now();
        // The waiters ahead of us go for the first free slots: we take the one after them,
        // so that the eligible waiters do not all race for the same Lease.
        let free: Vec<&Slot> = snap
            .slots
            .values()
            .filter(|s| s.index < max && s.holder.is_none())
            .collect();
        let missing: Vec<u64> = (0..max).filter(|i| !snap.slots.contains_key(i)).collect();
        let count = free.len() + missing.len();
        if count == 0 {
            self.reread = true;
            return Ok(false);
        }
        let pick = rank.min(count - 1);
        let (written, lease_name) = match free.get(pick) {
            Some(slot) => {
                let lease = self.taken(&slot.lease, now, node_uid.as_deref());
                let name = slot.name().to_owned();
                (store.replace_obj("taking a slot", &lease).await?, name)
            }
            None => {
                let index = missing[pick - free.len()];
                let lease = self.taken(&store.free_slot_lease(index), now, node_uid.as_deref());
                (
                    store.create_obj("creating a slot", &lease).await?,
                    store.slot_name(index),
                )
            }
        };
        let won = written.is_some();
        if let Some(lease) = written {
            tracing::debug!(namespace = %store.namespace, lease = %lease_name, "took a slot Lease");
            // The first phase report after the take then finds its phase on record (or is
            // one request).
            store.written.set(lease);
        }
        Ok(self.won(won, &lease_name))
    }

    async fn adopt(&mut self, holder: &str) -> Result<bool, LockError> {
        let Some(slot) = self.slot_of(holder)? else {
            self.reread = true;
            return Ok(false);
        };
        tracing::warn!(lease = slot.name(), node = %self.me.node, recorded = %holder, id = %self.me.id, "adopting a slot held under this node's name or machine id");
        let mut lease = slot.lease.clone();
        let annotations = lease.metadata.annotations.get_or_insert_with(BTreeMap::new);
        annotations.insert(ANNOTATION_MACHINE_ID.to_owned(), self.me.id.clone());
        annotations.insert(ANNOTATION_BOOT_ID.to_owned(), self.me.boot_id.clone());
        annotations.insert(ANNOTATION_HOLDER_TOKEN.to_owned(), self.me.token.clone());
        let won = self.store.replace("adopting a slot", &lease).await?;
        Ok(self.won(won, slot.name()))
    }

    async fn reclaim(&mut self, holder: &str, take_over: bool) -> Result<bool, LockError> {
        let Some(slot) = self.slot_of(holder)? else {
            self.reread = true;
            return Ok(false);
        };
        let max = self.store.effective_max(self.snap()?)?;
        if !take_over || slot.index >= max {
            let freed = self.store.free_slot(&slot, max).await?;
            // Not a take: the watch brings the freed slot.
            return Ok(freed && !take_over);
        }
        let node_uid = self.own_node_uid().await?;
        let lease = self.taken(&slot.lease, jiff::Timestamp::now(), node_uid.as_deref());
        let won = self.store.replace("reclaiming a slot", &lease).await?;
        Ok(self.won(won, slot.name()))
    }

    async fn enqueue(&mut self) -> Result<(), LockError> {
        if self.reread || self.snap()?.waiters.contains_key(&self.my_waiter) {
            return Ok(());
        }
        let mut lease = self.store.waiter_lease(self.me, jiff::Timestamp::now());
        if let Some(zone) = &self.own_zone {
            lease
                .metadata
                .annotations
                .get_or_insert_with(BTreeMap::new)
                .insert(ANNOTATION_ZONE.to_owned(), zone.clone());
        }
        match self.store.create_obj("joining the queue", &lease).await? {
            Some(created) => {
                tracing::debug!(lease = %self.my_waiter, "joined the queue of waiters");
                if let Some(snap) = self.snap.as_mut() {
                    let mine = lease_ticket(&created);
                    self.decide_again = snap.waiters.values().any(|w| ticket(w) > mine);
                    self.store.put_lease(snap, created);
                }
            }
            // There already (a previous process of ours): read again, and adopt it.
            None => self.reread = true,
        }
        Ok(())
    }

    async fn wait(&mut self, until: Option<Instant>, head: bool) -> Result<Wake, LockError> {
        if std::mem::take(&mut self.reread) {
            return Ok(Wake::Reread);
        }
        if std::mem::take(&mut self.decide_again) {
            tracing::debug!(lease = %self.my_waiter, "joined the queue ahead of waiters with later acquire times (their clocks run ahead): deciding again on my place");
            return Ok(Wake::Changed);
        }
        self.sync_node_watches(head)?;
        if self.marker.is_some() {
            return self.wait_far().await;
        }
        loop {
            let renew_at = self.renew_at();
            let lost_race = self.lost_race.deadline();
            let Some(leases) = self.leases.as_mut() else {
                return Ok(Wake::Reread);
            };
            let nodes = &mut self.nodes.streams;
            let watching_nodes = !nodes.is_empty();
            let woken = tokio::select! {
                () = sleep_until(until), if until.is_some() => Woken::Timer,
                () = sleep_until(lost_race), if lost_race.is_some() => Woken::LostRace,
                () = sleep_until(renew_at), if renew_at.is_some() => Woken::Renew,
                e = leases.next() => Woken::Lease(e.map(Box::new)),
                n = nodes.next(), if watching_nodes => Woken::Node(n.map(Box::new)),
            };
            match woken {
                Woken::Timer => return Ok(Wake::Changed),
                Woken::LostRace => {
                    self.lost_race.clear();
                    tracing::debug!(
                        "a lost race's change did not come on the watch in time; listing again"
                    );
                    return Ok(Wake::Reread);
                }
                Woken::Renew => {
                    if !self.renew().await? {
                        return Ok(Wake::Reread);
                    }
                }
                Woken::Node(Some(n)) => {
                    let (node, event) = *n;
                    if self.node_event(node, event) {
                        return Ok(Wake::Changed);
                    }
                }
                Woken::Node(None) => self.nodes.streams = SelectAll::new(),
                Woken::Lease(None) => {
                    return Err(self.store.unreachable("the Lease watch ended".into()))
                }
                Woken::Lease(Some(e)) => match *e {
                    Err(watcher::Error::WatchError(s)) if s.code == 410 => {
                        tracing::debug!("watch history expired (410 Gone); listing again");
                        return Ok(Wake::Reread);
                    }
                    Err(e) => return Err(self.watch_error(e)),
                    Ok(event) => {
                        self.contact.answered(Instant::now());
                        let store = self.store;
                        match event {
                            watcher::Event::Init => self.relisting = Some(Snapshot::empty()),
                            watcher::Event::InitApply(l) => {
                                if let Some(s) = self.relisting.as_mut() {
                                    store.put_lease(s, l);
                                }
                            }
                            watcher::Event::InitDone => {
                                if let Some(s) = self.relisting.take() {
                                    self.snap = Some(s);
                                    self.lost_race.clear();
                                    return Ok(Wake::Changed);
                                }
                            }
                            watcher::Event::Apply(l) => {
                                let name = l.metadata.name.clone().unwrap_or_default();
                                let behind = self.behind_me(&name, Some(&l));
                                if let Some(s) = self.snap.as_mut() {
                                    store.put_lease(s, l);
                                }
                                if self.lost_race.decides(&name) && !behind && !self.held_back() {
                                    return Ok(Wake::Changed);
                                }
                            }
                            watcher::Event::Delete(l) => {
                                let name = l.metadata.name.unwrap_or_default();
                                if name == self.my_waiter {
                                    tracing::info!(lease = %name, "our waiter Lease was deleted (taken for dead?); queueing again");
                                }
                                let behind = self.behind_me(&name, None);
                                if let Some(s) = self.snap.as_mut() {
                                    store.drop_lease(s, &name);
                                }
                                if let Some(fb) = self.far_back.as_mut() {
                                    fb.deleted(&name);
                                }
                                if self.lost_race.decides(&name) && !behind && !self.held_back() {
                                    return Ok(Wake::Changed);
                                }
                            }
                        }
                    }
                },
            }
        }
    }

    fn placed(&mut self, behind: Option<usize>) {
        // With zones, waiters ahead in full zones are passed over, and with a share of the
        // Nodes the count of slots moves: any change may let me act.
        let behind = behind
            .filter(|_| self.store.max_per_zone.is_none() && self.store.max_percent.is_none());
        if self.decide_again {
            // Counted before my Lease went ahead of some: placed at the next decision.
            self.far_back = None;
            return;
        }
        self.far_back = match (behind, &self.snap) {
            (Some(behind), Some(snap)) => FarBack::placed(snap, &self.my_waiter, behind),
            _ => None,
        };
        if self.marker.is_some() {
            return;
        }
        let (Some(behind), Some(snap)) = (behind, &self.snap) else {
            return;
        };
        let Ok(max) = self.store.max_of(snap) else {
            return;
        };
        if let Some(marker) = Marker::pick(snap, &self.my_waiter, behind, max) {
            tracing::info!(
                waiters_ahead = behind,
                marker = marker.name(),
                "far back in the queue: watching one waiter's Lease ahead (the marker) instead of the semaphore until it leaves the queue"
            );
            // Its watch is not opened, or stops here: the semaphore is read again when the
            // marker moves.
            self.leases = None;
            self.relisting = None;
            self.marker = Some(marker);
        }
    }

    fn paused(&self) -> Option<GroupPause> {
        self.snap
            .as_ref()
            .and_then(|s| s.pause.as_ref().map(|(p, _)| p.clone()))
    }

    fn contact(&self) -> &Contact {
        &self.contact
    }

    async fn leave(&mut self, dead: Vec<String>) {
        let Some(snap) = self.snap.as_ref() else {
            return;
        };
        if let Some(w) = snap.waiters.get(&self.my_waiter) {
            // Our own Lease: only its uid as precondition (a renewal may be in flight).
            let mut lease = w.lease.clone();
            lease.metadata.resource_version = None;
            match self
                .store
                .delete_lease("deleting the waiter Lease", &lease)
                .await
            {
                Ok(_) => tracing::debug!(lease = %self.my_waiter, "left the queue"),
                Err(e) => {
                    tracing::info!(lease = %self.my_waiter, error = %e, "could not delete the waiter Lease; it expires by itself")
                }
            }
        }
        for name in dead {
            let Some(w) = snap.waiters.get(&name) else {
                continue;
            };
            if let Ok(true) = self
                .store
                .delete_lease("deleting a dead waiter Lease", &w.lease)
                .await
            {
                tracing::info!(lease = %name, "deleted the Lease of a waiter that stopped renewing it");
            }
        }
    }
}
