//! `acquire` on the v3 store: the lock core's loop over [`V3Waiting`]. A waiter queues as the key
//! `…/rebootd/waiters/<id>` under an etcd lease it keeps alive (every third of its time to live,
//! on one keep-alive stream), and waits on one watch of the group's keys, from the group's pause
//! to the document (far back in a long queue: one entry ahead and the pause, [`super::marker`]),
//! opened after a read (of them all, the queue only up to my entry once I have one, in one
//! transaction) from the revision read:
//! the pause costs no request of its own (`acquire_unless_paused`); each change is applied to the
//! snapshot and the arbiter decides again without a request. Decisions are committed in one
//! transaction each, guarded by the document's mod revision (and, to reclaim or adopt a slot, by
//! the holder record's): taking a slot writes the document, my record and deletes my entry.
//! Dropped, an `acquire` revokes its lease from a spawned task; a dead one's entry expires with it.
//! One that took its slot in the transaction deleting its entry leaves the lease, holding no key,
//! to expire instead of revoking it.

mod keep_alive;
mod watch;

use std::time::Instant;

use async_trait::async_trait;
use etcd_client::{EventType, PutOptions, TxnOp, WatchStream};

use super::super::acquire::{self, sleep_until, Settings, Waiting, Wake};
use super::super::contact::Contact;
use super::super::document::{HolderRecord, WaiterRecord};
use super::super::lost_race::LostRace;
use super::super::view::View;
use super::super::{Acquired, GroupPause, Identity, LockError};
use super::lease_guard::LeaseGuard;
use super::snapshot::{Kv, QueueEntry, Snapshot};
use super::{EtcdSemaphore, BACKEND};
use crate::state::Phase;
use keep_alive::{keep_alive_response, KeepAlive};

/// gRPC NotFound: etcd's "requested lease not found" (it expired while etcd was away).
const GRPC_NOT_FOUND: i32 = 5;

/// Take a slot for `me` in `store`, waiting in its queue as long as it takes.
pub(super) async fn acquire(store: &EtcdSemaphore, me: &Identity) -> Result<(), LockError> {
    let settings = settings(store);
    acquire::acquire(&mut waiting(store, me), me, &settings).await
}

fn settings(store: &EtcdSemaphore) -> Settings {
    let t = &store.timeouts;
    let mut settings = Settings::etcd(
        &store.keys.doc,
        store.max_hold,
        t.queue_ttl,
        (t.backoff_min, t.backoff_max),
    );
    settings.policy.max_per_zone = store.max_per_zone;
    settings
}

/// As [`acquire`], unless the group is paused before or while waiting: the pause comes with
/// the waiter's own read and watch. Paused, the read is kept for the wait for the resume that
/// follows (it watches from there), and my queue entry's lease is revoked.
pub(super) async fn acquire_unless_paused(
    store: &EtcdSemaphore,
    me: &Identity,
    first: Phase,
) -> Result<Acquired, LockError> {
    let settings = settings(store);
    let mut w = waiting(store, me);
    w.first = Some(first);
    let acquired = acquire::acquire_unless_paused(&mut w, me, &settings).await?;
    if let (Acquired::Paused(pause), Some(snap)) = (&acquired, &w.snap) {
        store.last_pause.set((Some(pause.clone()), snap.revision));
    }
    Ok(acquired)
}

/// A waiter of `me` on `store` that has read nothing yet (the steps of `acquire`; tests drive
/// them one by one).
pub(in crate::lock) fn waiting<'a>(store: &'a EtcdSemaphore, me: &'a Identity) -> V3Waiting<'a> {
    V3Waiting {
        store,
        me,
        queue_key: store.keys.waiter(&me.id),
        first: None,
        started: jiff::Timestamp::now(),
        snap: None,
        lease: LeaseGuard {
            client: store.client.clone(),
            request: store.timeouts.request,
            lease: None,
        },
        watch: None,
        marker: None,
        queue_unread: false,
        puts_behind: 0,
        puts_left_out: false,
        keep_alive: None,
        kept_alive_at: None,
        left: false,
        lost_race: LostRace::default(),
        contact: Contact::new(store.timeouts.queue_ttl),
    }
}

pub(in crate::lock) struct V3Waiting<'a> {
    store: &'a EtcdSemaphore,
    me: &'a Identity,
    /// My queue entry's key.
    queue_key: String,
    /// The phase written with the take (`Semaphore::acquire_unless_paused`'s `first`).
    first: Option<Phase>,
    /// When this `acquire` started (written in the queue entry).
    started: jiff::Timestamp,
    snap: Option<Snapshot>,
    lease: LeaseGuard,
    /// The watch from the last read on; opened at the first wait after it.
    watch: Option<WatchStream>,
    /// The queue entry that watch follows in place of the group, far back ([`super::marker`]).
    marker: Option<String>,
    /// That marker was found after a start burst ([`super::marker::after_burst`]): the queue
    /// ahead of me is not in my snapshot, so every wake reads again first.
    queue_unread: bool,
    /// Entries put behind mine that the group's watch brought; from [`watch::LEAVE_OUT_AFTER`]
    /// on it leaves the queue's puts out ([`watch::without_queue_puts`]: `puts_left_out`).
    puts_behind: usize,
    puts_left_out: bool,
    keep_alive: Option<KeepAlive>,
    /// When my lease was granted or last kept alive.
    kept_alive_at: Option<Instant>,
    /// My queue entry went with the transaction that made me a holder.
    left: bool,
    /// The document's write that beat my take, until the watch brings it.
    lost_race: LostRace,
    /// When etcd last answered: reads, watch events, keep-alives.
    contact: Contact,
}

/// What ended one wait of the `select!` in [`V3Waiting::wait`].
enum Woken {
    Timer,
    LostRace,
    KeepAliveDue,
    KeepAlive(Result<Option<etcd_client::LeaseKeepAliveResponse>, etcd_client::Error>),
    Watch(Result<Option<etcd_client::WatchResponse>, etcd_client::Error>),
}

impl V3Waiting<'_> {
    fn snap(&self) -> Result<&Snapshot, LockError> {
        self.snap.as_ref().ok_or(LockError::NotRead(BACKEND))
    }

    /// A fresh record of mine, for a slot just taken.
    fn fresh_record(&self) -> HolderRecord {
        HolderRecord::after(None, self.me, Some(self.first.map(Phase::as_str)))
    }

    /// Watch my marker (from `seen`, the revision it was read at: by default the snapshot's)
    /// and the pause from the snapshot's revision on (it has every change before), in place of
    /// the group's watch.
    async fn follow(&mut self, marker: String, seen: Option<i64>) -> Result<(), LockError> {
        let read = self.snap()?.revision;
        let from = seen.unwrap_or(read) + 1;
        tracing::debug!(key = %self.queue_key, marker = %crate::text::clean(&marker), "far back: watching the entry ahead and the pause");
        self.watch = Some(super::marker::watch(self.store, &marker, from, read + 1).await?);
        self.marker = Some(marker);
        Ok(())
    }

    /// The watch of the first wait after a read: my marker when the snapshot or a start burst
    /// places me far enough back ([`super::marker`]), else the group.
    async fn open_first_watch(&mut self) -> Result<(), LockError> {
        if let Some(marker) = self.place_marker() {
            return self.follow(marker, None).await;
        }
        let snap = self.snap()?;
        let max = self.store.effective_max(snap);
        let zoned = self.store.max_per_zone.is_some();
        let burst = super::marker::after_burst(self.store, snap, &self.queue_key, max, zoned);
        let unlisted = snap.unlisted > 0;
        if let Some((marker, seen)) = burst.await? {
            self.queue_unread = true;
            return self.follow(marker, Some(seen)).await;
        }
        let from = snap.revision + 1;
        // Not far enough back for a marker, but the queue ahead was not listed.
        self.queue_unread = unlisted;
        self.watch = Some(watch::group(self.store, from).await?);
        Ok(())
    }

    /// The read of a waiter without an entry: a long queue counted, not listed
    /// ([`super::marker::read_newcomer`]), unless zones need each waiter's.
    async fn read_without_entry(&self) -> Result<Snapshot, LockError> {
        if self.store.max_per_zone.is_some() {
            self.store.read_waiter(None).await
        } else {
            super::marker::read_newcomer(self.store).await
        }
    }

    /// A wake on which the arbiter decides again: on the snapshot, or on a new read when the
    /// snapshot lacks the queue ahead of me.
    fn changed(&self) -> Wake {
        if self.queue_unread {
            Wake::Reread
        } else {
            Wake::Changed
        }
    }

    /// Whether `events` change nothing but other holders' records (their phase reports), which
    /// decide nothing for me without `max_hold` (with it, a record's new revision is a beat the
    /// arbiter must see). The snapshot takes them all the same; the arbiter is not asked again,
    /// which in a long queue is most of a waiter's work.
    fn only_others_records(&self, events: &[(bool, Kv)]) -> bool {
        let keys = &self.store.keys;
        let mine = keys.record(&self.me.id);
        self.store.max_hold.is_none()
            && events.iter().all(|(_, kv)| {
                kv.key.starts_with(keys.records.as_bytes()) && kv.key != mine.as_bytes()
            })
    }

    /// Whether I am far back in a long queue ([`super::marker::far_back`]). Nearer the head
    /// every change is decided on and logged.
    fn far_back(&self) -> bool {
        self.queue_unread
            || self.snap.as_ref().is_some_and(|snap| {
                let max = self.store.effective_max(snap);
                let zoned = self.store.max_per_zone.is_some();
                super::marker::far_back(snap, &self.store.keys, &self.queue_key, max, zoned)
            })
    }

    /// My marker in the snapshot, when I am far enough back for one ([`super::marker`]).
    fn place_marker(&self) -> Option<String> {
        let snap = self.snap.as_ref()?;
        let max = self.store.effective_max(snap);
        let zoned = self.store.max_per_zone.is_some();
        super::marker::marker(snap, &self.store.keys, &self.queue_key, max, zoned)
    }

    /// Note my entry, put at `revision`, in the snapshot (its revision stays: the watch still
    /// has to bring what happened before).
    fn note_entry(&mut self, revision: i64, lease: i64, record: WaiterRecord) {
        let key = self.queue_key.clone();
        if let Some(snap) = self.snap.as_mut() {
            let create_revision = snap.queue.get(&key).map_or(revision, |e| e.create_revision);
            snap.queue.insert(
                key,
                QueueEntry {
                    create_revision,
                    lease,
                    record: Some(record),
                },
            );
        }
    }
}

#[async_trait]
impl Waiting for V3Waiting<'_> {
    async fn read(&mut self) -> Result<(), LockError> {
        // The watch and the keep-alive stream start again from this read.
        self.watch = None;
        self.marker = None;
        self.queue_unread = false;
        self.puts_behind = 0;
        self.puts_left_out = false;
        self.keep_alive = None;
        let mine = self
            .snap
            .as_ref()
            .and_then(|s| s.queue.get(&self.queue_key));
        let ticket = mine.map(|e| e.create_revision);
        let mut snap = match ticket {
            Some(_) => self.store.read_waiter(ticket).await?,
            None => self.read_without_entry().await?,
        };
        if ticket.is_some() && !snap.queue.contains_key(&self.queue_key) {
            // My entry went (its lease expired) or came back further back: read as a newcomer.
            snap = self.read_without_entry().await?;
        }
        self.lost_race.clear();
        self.store.note_share(&snap);
        self.snap = Some(snap);
        self.contact.answered(Instant::now());
        Ok(())
    }

    fn view(&self) -> Result<View, LockError> {
        let snap = self.snap()?;
        let mut view = snap.view(&self.store.keys, Some(&self.me.as_me()));
        view.max = self.store.effective_max(snap);
        view.my_zone = self.me.zone.clone();
        Ok(view)
    }

    async fn take(&mut self, _rank: usize) -> Result<bool, LockError> {
        let snap = self.snap()?;
        let mut doc = snap.doc.clone();
        let max = self.store.effective_max(snap);
        if !matches!(doc.lock_within(&self.me.id, max), Ok(true)) {
            return Ok(false);
        }
        let store = self.store;
        let record = self.fresh_record();
        let mut ops = vec![
            store.put_doc(&doc),
            TxnOp::put(store.record_key(&self.me.id), record.to_json(), None),
        ];
        ops.extend(store.stale_record_deletes(snap, &doc));
        ops.push(TxnOp::delete(self.queue_key.clone(), None));
        let Some(at) = store.commit_at(snap, Vec::new(), ops).await? else {
            self.lost_race.lost(&store.keys.doc, store.timeouts.request);
            return Ok(false);
        };
        // The first phase report after the take is then one request.
        store.written.set(at, record);
        self.left = true;
        Ok(true)
    }

    async fn adopt(&mut self, _holder: &str) -> Result<bool, LockError> {
        let snap = self.snap()?;
        let store = self.store;
        let record = store.my_record(snap, self.me, None);
        let ops = vec![
            TxnOp::put(store.record_key(&self.me.id), record.to_json(), None),
            TxnOp::delete(self.queue_key.clone(), None),
        ];
        let guard = store.record_unchanged(snap, &self.me.id);
        if !store.commit(snap, vec![guard], ops).await? {
            return Ok(false);
        }
        self.left = true;
        Ok(true)
    }

    async fn reclaim(&mut self, holder: &str, take_over: bool) -> Result<bool, LockError> {
        let snap = self.snap()?;
        let store = self.store;
        let mut doc = snap.doc.clone();
        let max = store.effective_max(snap);
        doc.unlock(holder);
        if take_over && !matches!(doc.lock_within(&self.me.id, max), Ok(true)) {
            return Ok(false);
        }
        let mut ops = vec![store.put_doc(&doc)];
        if take_over {
            ops.push(TxnOp::put(
                store.record_key(&self.me.id),
                self.fresh_record().to_json(),
                None,
            ));
            ops.push(TxnOp::delete(self.queue_key.clone(), None));
        }
        ops.extend(store.stale_record_deletes(snap, &doc));
        // The holder did not beat since it was judged stopped.
        let guard = store.record_unchanged(snap, holder);
        if !store.commit(snap, vec![guard], ops).await? {
            return Ok(false);
        }
        self.left = take_over;
        Ok(true)
    }

    /// Put my entry under my lease (granting one when there is none or it expired), unless it
    /// is there under that lease already. A put keeps the key's create revision, so an entry
    /// left by my previous run keeps its place.
    async fn enqueue(&mut self) -> Result<(), LockError> {
        let existing = self.snap()?.queue.get(&self.queue_key).cloned();
        if let (Some(e), Some((lease, _))) = (&existing, self.lease.lease) {
            if e.lease == lease {
                return Ok(());
            }
        }
        let record = WaiterRecord {
            node: self.me.node.clone(),
            boot_id: self.me.boot_id.clone(),
            token: Some(self.me.token.clone()),
            since: existing
                .as_ref()
                .and_then(|e| e.record.as_ref())
                .map_or(self.started, |r| r.since),
            zone: self.me.zone.clone(),
        };
        for _ in 0..2 {
            let lease = match self.lease.lease {
                Some((id, _)) => id,
                None => self.grant().await?,
            };
            let mut kv = self.store.client.kv_client();
            let put = kv.put(
                self.queue_key.clone(),
                record.to_json(),
                Some(PutOptions::new().with_lease(lease)),
            );
            match tokio::time::timeout(self.store.timeouts.request, put).await {
                Err(_) => {
                    return Err(self.store.unreachable(format!(
                        "queueing: no answer within {:?}",
                        self.store.timeouts.request
                    )))
                }
                Ok(Ok(resp)) => {
                    let revision = resp.header().map(|h| h.revision()).unwrap_or_default();
                    tracing::debug!(key = %self.queue_key, lease, revision, kept_place = existing.is_some(), "queued");
                    self.note_entry(revision, lease, record);
                    return Ok(());
                }
                Ok(Err(etcd_client::Error::GRpcStatus(status)))
                    if i32::from(status.code()) == GRPC_NOT_FOUND =>
                {
                    tracing::debug!(lease, "queue lease expired; granting a new one");
                    self.lease.lease = None;
                }
                Ok(Err(e)) => return Err(self.store.classify(e)),
            }
        }
        Err(LockError::Backend {
            backend: BACKEND,
            reason: format!("{}: a lease just granted was not found", self.queue_key),
        })
    }

    async fn wait(&mut self, until: Option<Instant>, _head: bool) -> Result<Wake, LockError> {
        if self.watch.is_none() {
            self.open_first_watch().await?;
        }
        loop {
            let keep_alive_at = self.keep_alive_due();
            let lost_race = self.lost_race.deadline();
            let Some(watch) = self.watch.as_mut() else {
                return Ok(Wake::Reread);
            };
            let keep_alive = &mut self.keep_alive;
            let woken = tokio::select! {
                () = sleep_until(until), if until.is_some() => Woken::Timer,
                () = sleep_until(lost_race), if lost_race.is_some() => Woken::LostRace,
                () = sleep_until(keep_alive_at), if keep_alive_at.is_some() => Woken::KeepAliveDue,
                r = keep_alive_response(keep_alive) => Woken::KeepAlive(r),
                m = watch.message() => Woken::Watch(m),
            };
            match woken {
                Woken::Timer => return Ok(self.changed()),
                Woken::LostRace => {
                    self.lost_race.clear();
                    tracing::debug!(
                        "a lost race's winner did not come on the watch in time; reading again"
                    );
                    return Ok(Wake::Reread);
                }
                Woken::KeepAliveDue => {
                    if !self.send_keep_alive().await? {
                        self.lease_lost();
                        return Ok(self.changed());
                    }
                    self.kept_alive_at = Some(Instant::now());
                }
                Woken::KeepAlive(Ok(Some(r))) if r.ttl() <= 0 => {
                    self.lease_lost();
                    return Ok(self.changed());
                }
                Woken::KeepAlive(Ok(Some(_))) => self.contact.answered(Instant::now()),
                Woken::KeepAlive(Ok(None)) => {
                    return Err(self
                        .store
                        .unreachable("lease keep-alive stream ended".into()))
                }
                Woken::KeepAlive(Err(e)) => return Err(self.store.classify(e)),
                Woken::Watch(Ok(Some(resp))) => {
                    self.contact.answered(Instant::now());
                    if resp.compact_revision() > 0 {
                        tracing::debug!(
                            compact_revision = resp.compact_revision(),
                            "watch start compacted; reading again"
                        );
                        return Ok(Wake::Reread);
                    }
                    if resp.canceled() {
                        let keys = &self.store.keys;
                        return Err(self.store.watch_cancelled(
                            &keys.pause,
                            &keys.doc,
                            resp.cancel_reason(),
                        ));
                    }
                    let events: Vec<(bool, Kv)> = resp
                        .events()
                        .iter()
                        .filter_map(|e| {
                            e.kv()
                                .map(|kv| (e.event_type() == EventType::Put, Kv::from(kv)))
                        })
                        .collect();
                    if let Some(wake) = self.on_events(&events).await? {
                        return Ok(wake);
                    }
                }
                Woken::Watch(Ok(None)) => {
                    return Err(self.store.unreachable("watch stream ended".into()))
                }
                Woken::Watch(Err(e)) => return Err(self.store.classify(e)),
            }
        }
    }

    fn paused(&self) -> Option<GroupPause> {
        self.snap.as_ref().and_then(|s| s.pause.clone())
    }

    fn contact(&self) -> &Contact {
        &self.contact
    }

    async fn leave(&mut self, _dead: Vec<String>) {
        // Entries live by their lease: nobody else's is deleted here. Mine, when the slot came
        // without the transaction that deletes it (held already, after a restart), goes now.
        let left_over = self
            .snap
            .as_ref()
            .is_some_and(|s| s.queue.contains_key(&self.queue_key));
        if !self.left && left_over {
            let mut kv = self.store.client.kv_client();
            let delete = kv.delete(self.queue_key.clone(), None);
            if let Err(e) = self.store.request("leaving the queue: ", delete).await {
                tracing::debug!(key = %self.queue_key, error = %e, "queue entry not deleted; it expires");
            }
        }
        self.watch = None;
        self.keep_alive = None;
        if self.left {
            // My entry went with the transaction that made me a holder: the lease holds no key
            // any more. It is forgotten, not revoked (one request less), and expires by its TTL.
            self.lease.forget();
        } else {
            self.lease.revoke();
        }
    }
}
