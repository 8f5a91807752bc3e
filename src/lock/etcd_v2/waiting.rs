//! `acquire` on the v2 store: the lock core's loop over [`V2Waiting`]. A waiter queues as an
//! in-order key with a TTL under `rebootd/waiters/` (refreshed every third of the TTL, two
//! thirds far back, without waking anyone unless its stream went quiet: below), and waits on a
//! watch of the group's directory: each change is applied to the
//! snapshot, and the arbiter decides again. A release by locksmith or rebootd therefore reaches
//! the head of the queue as one watch event, never by polling. A cancelled `acquire` deletes its entry (from a spawned task); a dead one's entry
//! expires with its TTL.
//!
//! The group's pause sits in the same directory: the waiter's read and watch bring it, and
//! `acquire_unless_paused` ends the wait on it without a request of its own.
//!
//! The watch is one streaming watch (`stream=true`) kept for the whole `acquire`: every change
//! of the group comes on it without a new request (a long poll per change cost each waiter one
//! request per change, so a rollout's requests grew with the fleet). It opens before the read,
//! from etcd's next index, so it never starts in etcd's history (which etcd answers with one
//! event and closes); events the read already has are skipped by their index.
//!
//! etcd drops a streaming watcher whose events come faster than it can send them (its buffer of
//! 100 full: a burst of changes in a large group) without ending the answer, so the stream just
//! goes quiet. A quiet stream is therefore checked at no request's cost: when it brought
//! nothing for a whole refresh interval, the next refresh of my entry is a write of its value
//! (an event) instead of a TTL refresh (none), and the stream must bring that write back within
//! the request time limit. If it does not, or if a lost race's winner does not come in time,
//! the stream is given up for a new one and a read. Far back, refreshes are sparse only while
//! the stream is heard: a quiet one is checked at the near rate, so a dropped watcher costs a
//! waiter at most a third of the TTL and the request time limit.

use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;

use super::super::acquire::{self, sleep_until, Settings, Waiting, Wake};
use super::super::contact::Contact;
use super::super::lost_race::LostRace;
use super::super::view::View;
use super::super::{Acquired, GroupPause, Identity, LockError};
use super::tree::{DocState, QueueRecord, Snapshot};
use super::{lock_error, EtcdV2Semaphore, BACKEND};
use crate::clients::etcd_v2::{KeysClient, Put, Response, V2Error, WatchStream};
use crate::state::Phase;

/// Take a slot for `me` in `store`, waiting in its queue as long as it takes.
pub(super) async fn acquire(store: &EtcdV2Semaphore, me: &Identity) -> Result<(), LockError> {
    acquire::acquire(&mut waiting(store, me), me, &settings(store)).await
}

/// As [`acquire`], unless the group is paused before or while waiting: the pause comes with
/// the waiter's own read and watch. Paused, the read is kept for the wait for the resume that
/// follows (it watches from there); my queue entry goes with the waiter.
pub(super) async fn acquire_unless_paused(
    store: &EtcdV2Semaphore,
    me: &Identity,
    first: Phase,
) -> Result<Acquired, LockError> {
    let mut w = waiting(store, me);
    w.first = Some(first);
    let acquired = acquire::acquire_unless_paused(&mut w, me, &settings(store)).await?;
    if let (Acquired::Paused(pause), Some(snap)) = (&acquired, &w.snap) {
        store.last_pause.set((Some(pause.clone()), snap.index));
    }
    Ok(acquired)
}

fn settings(store: &EtcdV2Semaphore) -> Settings {
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

/// A waiter of `me` on `store` that has read nothing yet (the steps of `acquire`; tests drive
/// them one by one).
pub(in crate::lock) fn waiting<'a>(store: &'a EtcdV2Semaphore, me: &'a Identity) -> V2Waiting<'a> {
    V2Waiting {
        store,
        me,
        first: None,
        snap: None,
        started: jiff::Timestamp::now(),
        refreshed_at: None,
        entry: EntryGuard {
            client: store.client.clone(),
            key: None,
        },
        stream: None,
        next_index: None,
        behind: false,
        lost: LostRace::default(),
        heard: true,
        probe: None,
        contact: Contact::new(store.timeouts.queue_ttl),
    }
}

/// My queue entry's key; deleted (from a spawned task, best effort) when dropped, so an
/// `acquire` that returns or is cancelled leaves no entry behind.
struct EntryGuard {
    client: Arc<KeysClient>,
    key: Option<String>,
}

impl Drop for EntryGuard {
    fn drop(&mut self) {
        let Some(key) = self.key.take() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let client = self.client.clone();
        runtime.spawn(async move {
            match client.delete(&key, None).await {
                Ok(_) => tracing::debug!(%key, "queue entry deleted"),
                Err(e) => tracing::debug!(%key, error = %e, "queue entry not deleted; it expires"),
            }
        });
    }
}

pub(in crate::lock) struct V2Waiting<'a> {
    store: &'a EtcdV2Semaphore,
    me: &'a Identity,
    /// The phase written with the take (`Semaphore::acquire_unless_paused`'s `first`).
    first: Option<Phase>,
    snap: Option<Snapshot>,
    /// When this `acquire` started (written in the queue entry).
    started: jiff::Timestamp,
    /// When my entry was put or its TTL last refreshed (`None` with an entry: adopted after a
    /// restart, due at once).
    refreshed_at: Option<Instant>,
    entry: EntryGuard,
    /// The streaming watch of the group's keys, kept across waits, and the index after the last
    /// event it brought.
    stream: Option<WatchStream>,
    next_index: Option<u64>,
    /// The last stream brought an event from etcd's history with more changes after it: a read
    /// catches up in one request, where watching again would take one per change.
    behind: bool,
    /// The key a compare-and-swap of mine lost on, until the watch brings its change.
    lost: LostRace,
    /// Whether the stream brought anything since my entry's last refresh.
    heard: bool,
    /// The index of my entry's write that checks a quiet stream, and until when the stream must
    /// bring it back.
    probe: Option<(u64, Instant)>,
    /// When etcd last answered: reads, watch events and ends, refreshes, queueing.
    contact: Contact,
}

/// What ended one step of a wait.
enum Got {
    Event(Box<Result<Option<Response>, V2Error>>),
    LostRace,
    Refresh,
    Until,
    /// The stream did not bring my probing write back in time.
    Deaf,
}

impl V2Waiting<'_> {
    fn snap(&self) -> Result<&Snapshot, LockError> {
        self.snap.as_ref().ok_or(LockError::NotRead(BACKEND))
    }

    /// When my entry's TTL is due for a refresh ([`acquire::beat_due`]: sparser far back);
    /// `None` without an entry.
    fn refresh_at(&self) -> Option<Instant> {
        self.entry.key.as_ref()?;
        let Some(at) = self.refreshed_at else {
            return Some(Instant::now());
        };
        let ttl = self.store.timeouts.queue_ttl;
        // Sparse far back only while the stream is heard: a quiet one is checked at the near rate.
        let sparse = self.far_back() && (self.heard || self.probe.is_some());
        Some(acquire::beat_due(at, ttl, sparse))
    }

    /// Note a write of mine in the snapshot (without moving its index: the watch still has to
    /// bring what happened before it).
    fn note(&mut self, response: &Response) {
        if let Some(s) = self.snap.as_mut() {
            let index = s.index;
            s.apply(&self.store.keys, response);
            s.index = index;
        }
    }

    /// After taking a slot: my record, and my queue entry gone. The snapshot, with my
    /// writes, is kept a moment for the first phase report (see `lock::recent`).
    async fn holding(&mut self) {
        if let Ok(mut snap) = self.snap().cloned() {
            match self
                .store
                .write_record(&snap, self.me, Some(self.first.map(Phase::as_str)))
                .await
            {
                Ok(Some(written)) => {
                    snap.records
                        .insert(self.store.keys.record(&self.me.id), written);
                    self.store.before_report.set(snap);
                }
                Ok(None) => tracing::debug!(
                    "holder record changed meanwhile; written at the next phase report"
                ),
                Err(e) => {
                    tracing::warn!(error = %e, "took the slot but could not write its holder record; it shows by machine id until the next phase report")
                }
            }
        }
        self.drop_entry().await;
    }

    async fn drop_entry(&mut self) {
        if let Some(key) = self.entry.key.take() {
            if let Err(e) = self.store.client.delete(&key, None).await {
                if !e.is_key_not_found() {
                    tracing::debug!(%key, error = %e, "queue entry not deleted; it expires");
                }
            }
        }
        self.refreshed_at = None;
    }

    /// Refresh my entry's TTL; `Ok(false)` when it is gone (expired). After a quiet interval
    /// the refresh writes the entry's value, an event the stream must bring back (see the
    /// module's notes).
    async fn refresh(&mut self) -> Result<bool, LockError> {
        let Some(key) = self.entry.key.clone() else {
            return Ok(false);
        };
        let ttl = self.store.timeouts.queue_ttl;
        let value = (!self.heard && self.probe.is_none())
            .then(|| self.snap.as_ref()?.queue.get(&key)?.value.as_ref())
            .flatten()
            .map(QueueRecord::to_json);
        let answer = match &value {
            Some(value) => {
                let put = Put {
                    prev_exist: Some(true),
                    ttl: Some(ttl),
                    ..Put::default()
                };
                self.store.client.put(&key, value, put).await
            }
            None => self.store.client.refresh(&key, ttl).await,
        };
        match answer {
            Ok(written) => {
                let now = Instant::now();
                self.refreshed_at = Some(now);
                self.contact.answered(now);
                self.heard = false;
                // An earlier probe still awaited keeps its time limit.
                if value.is_some() && self.probe.is_none() {
                    let by = now + self.store.client.timeouts().request;
                    self.probe = Some((written.node.modified_index, by));
                }
                Ok(true)
            }
            Err(e) if e.is_key_not_found() => {
                tracing::warn!(%key, "my queue entry expired; queueing again at the end");
                self.entry.key = None;
                Ok(false)
            }
            Err(e) => Err(lock_error(e)),
        }
    }
}

#[async_trait]
impl Waiting for V2Waiting<'_> {
    async fn read(&mut self) -> Result<(), LockError> {
        // The watch first, from etcd's next index, then the read: a watch opened after a read
        // starts in etcd's history whenever anything changed in between, and etcd answers that
        // with one event and closes it (in a fleet's start, again and again). Events the read
        // already has are skipped by their index. A live watch is kept across reads.
        if self.stream.as_ref().is_none_or(|s| s.ended()) {
            self.stream = None;
            self.behind = false;
            let keys = &self.store.keys;
            let stream = self.store.client.watch_stream(&keys.root, true, 0).await;
            self.stream = Some(stream.map_err(lock_error)?);
        }
        let snap = self.store.read(false).await?;
        if let Some(doc) = snap.document() {
            self.store.note_share(&snap, &doc);
        }
        self.contact.answered(Instant::now());
        self.next_index = None;
        self.lost.clear();
        self.heard = true;
        self.probe = None;
        // A restarted rebootd (same token) takes its old entry over, keeping its place.
        if self.entry.key.is_none() {
            if let Some((key, _)) = snap.my_entry(&self.me.id, &self.me.token) {
                self.entry.key = Some(key.clone());
                self.refreshed_at = None;
            }
        }
        self.snap = Some(snap);
        Ok(())
    }

    fn view(&self) -> Result<View, LockError> {
        let snap = self.snap()?;
        let doc = self.store.document(snap)?;
        let mut view = snap.view(&self.store.keys, &doc, Some(&self.me.as_me()));
        view.max = self.store.effective_max(snap, &doc);
        view.my_zone = self.me.zone.clone();
        Ok(view)
    }

    async fn take(&mut self, _rank: usize) -> Result<bool, LockError> {
        let snap = self.snap()?.clone();
        let mut doc = self.store.document(&snap)?;
        let max = self.store.effective_max(&snap, &doc);
        if doc.lock_within(&self.me.id, max).is_err() {
            return Ok(false);
        }
        // My record, claimed when my slot was taken back, left by a reclaim that died before
        // it deleted it: gone first, or the slot about to be mine would show as claimed.
        if let Some(e) = snap.record(&self.store.keys, &self.me.id) {
            if self.store.claimed(&snap, &self.me.id) {
                let key = self.store.keys.record(&self.me.id);
                match self.store.client.delete(&key, Some(e.modified)).await {
                    Ok(_) => {}
                    Err(e) if e.is_compare_failed() || e.is_key_not_found() => {
                        return Ok(self.lost(&key))
                    }
                    Err(e) => return Err(lock_error(e)),
                }
            }
        }
        let Some(index) = self.store.write_doc_at(&snap, &doc).await? else {
            return Ok(self.lost(&self.store.keys.doc));
        };
        // My take, as written, in the snapshot `holding` keeps.
        if let Some(s) = self.snap.as_mut() {
            s.doc = DocState::Doc { doc, index };
        }
        self.holding().await;
        Ok(true)
    }

    async fn adopt(&mut self, _holder: &str) -> Result<bool, LockError> {
        self.holding().await;
        Ok(true)
    }

    async fn reclaim(&mut self, holder: &str, take_over: bool) -> Result<bool, LockError> {
        let snap = self.snap()?.clone();
        let mut doc = self.store.document(&snap)?;
        let max = self.store.effective_max(&snap, &doc);
        doc.unlock(holder);
        if take_over && doc.lock_within(&self.me.id, max).is_err() {
            return Ok(false);
        }
        // The holder's record first (its write and this claim exclude each other), then the
        // document. A claim that lands and a document write that loses a race are finished
        // by the next decision: the claimed holder shows as gone.
        let by = format!("{} ({})", self.me.node, self.me.id);
        if !self.store.claim(&snap, holder, &by).await? {
            tracing::info!(%holder, "the holder wrote its record since it was judged stopped; not reclaimed");
            return Ok(self.lost(&self.store.keys.record(holder)));
        }
        if !self.store.write_doc(&snap, &doc).await? {
            return Ok(self.lost(&self.store.keys.doc));
        }
        self.store.delete_orphans(&snap, &doc).await;
        if take_over {
            self.holding().await;
        }
        Ok(true)
    }

    async fn enqueue(&mut self) -> Result<(), LockError> {
        if self.entry.key.is_some() {
            if self.refresh_at().is_none_or(|at| Instant::now() >= at) && !self.refresh().await? {
                return self.enqueue_new().await;
            }
            return Ok(());
        }
        self.enqueue_new().await
    }

    async fn wait(&mut self, until: Option<Instant>, _head: bool) -> Result<Wake, LockError> {
        let keys = &self.store.keys;
        loop {
            let Some(mut stream) = self.open_stream().await? else {
                return Ok(Wake::Reread);
            };
            let refresh_at = self.refresh_at();
            let lost_by = self.lost.deadline();
            let probe_by = self.probe.map(|(_, by)| by);
            let got = tokio::select! {
                answer = stream.next() => Got::Event(Box::new(answer)),
                _ = sleep_until(lost_by), if lost_by.is_some() => Got::LostRace,
                _ = sleep_until(probe_by), if probe_by.is_some() => Got::Deaf,
                _ = sleep_until(refresh_at), if refresh_at.is_some() => Got::Refresh,
                _ = sleep_until(until), if until.is_some() => Got::Until,
            };
            let answer = match got {
                Got::Event(answer) => *answer,
                // The stream is dropped: the read opens another.
                Got::LostRace => {
                    self.lost.clear();
                    tracing::debug!(
                        "a lost race's winner did not come on the watch in time; reading again on a new watch"
                    );
                    return Ok(Wake::Reread);
                }
                Got::Deaf => {
                    self.probe = None;
                    tracing::info!(key = %keys.root, "the watch did not bring back a write of my own queue entry: etcd dropped this watcher (it does so, without ending the stream, when a watcher falls behind a burst of changes); reading again on a new watch");
                    return Ok(Wake::Reread);
                }
                Got::Refresh => {
                    self.stream = Some(stream);
                    if !self.refresh().await? {
                        // Expired: queue again (at the end) after deciding on a fresh view.
                        return Ok(Wake::Reread);
                    }
                    continue;
                }
                Got::Until => {
                    self.stream = Some(stream);
                    return Ok(Wake::Changed);
                }
            };
            if answer.is_ok() {
                self.contact.answered(Instant::now());
            }
            match answer {
                Ok(Some(event)) => {
                    self.heard = true;
                    if self
                        .probe
                        .is_some_and(|(i, _)| event.node.modified_index >= i)
                    {
                        self.probe = None;
                    }
                    self.behind = stream.ended() && event.node.modified_index < stream.opened_at();
                    self.stream = Some(stream);
                    self.next_index = Some(event.node.modified_index + 1);
                    // Not newer than the read (or the last event applied): already in the view.
                    let ours = self.snap.as_mut().is_some_and(|s| {
                        event.node.modified_index > s.index && s.apply(keys, &event)
                    });
                    // A node record decides something only when it counts for max.
                    let ours = ours
                        && (self.store.max_percent.is_some()
                            || keys.member(&event.node.key).is_none());
                    if ours && self.lost.decides(&event.node.key) && !self.far_back() {
                        return Ok(Wake::Changed);
                    }
                }
                // Silence for the watch time limit, or the stream ended: open another.
                Ok(None) => {}
                Err(e) if e.is_index_cleared() => {
                    tracing::debug!(error = %e, "watch index cleared; reading again");
                    return Ok(Wake::Reread);
                }
                Err(e) => return Err(lock_error(e)),
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
        // Entries live by TTL: nobody else's is deleted here.
        self.drop_entry().await;
    }
}

impl V2Waiting<'_> {
    /// A compare-and-swap on `key` lost a race: `false`, and the wait decides again only once
    /// the watch brings a change of `key` (within the request time limit, or it reads again).
    fn lost(&mut self, key: &str) -> bool {
        self.lost.lost(key, self.store.client.timeouts().request);
        false
    }

    /// Whether I am far back in a long queue ([`acquire::far_back`]): entries live by their
    /// TTL, so none ahead is judged dead by silence; the uncertain ones are one entry per
    /// holder. Paused, every change is decided on (the pause ends the wait anywhere).
    fn far_back(&self) -> bool {
        let (Some(snap), Some(mine)) = (&self.snap, &self.entry.key) else {
            return false;
        };
        let Some(doc) = snap.document() else {
            return false;
        };
        // With zones, waiters ahead in full zones are passed over: any change may let me act.
        if snap.pause.is_some()
            || self.store.max_per_zone.is_some()
            || doc.holds(&self.me.id)
            || !snap.queue.contains_key(mine)
        {
            return false;
        }
        let ahead = snap.queue.range::<String, _>(..mine).count();
        let max = self.store.effective_max(snap, &doc);
        acquire::far_back(max, ahead, doc.holders.len())
    }

    /// The streaming watch the wait goes on with: the one kept, or a new one from the index
    /// after the last event (or the read). `None`: read again instead (the last stream was
    /// behind, or etcd cleared the index).
    async fn open_stream(&mut self) -> Result<Option<WatchStream>, LockError> {
        if let Some(s) = self.stream.take().filter(|s| !s.ended()) {
            return Ok(Some(s));
        }
        if self.behind {
            self.behind = false;
            return Ok(None);
        }
        let from = self.next_index.unwrap_or(0).max(self.snap()?.index + 1);
        let keys = &self.store.keys;
        match self.store.client.watch_stream(&keys.root, true, from).await {
            Ok(s) => Ok(Some(s)),
            Err(e) if e.is_index_cleared() => {
                tracing::debug!(error = %e, "watch index cleared; reading again");
                Ok(None)
            }
            Err(e) => Err(lock_error(e)),
        }
    }

    /// Put a new in-order entry at the end of the queue. The watch is open first (the read
    /// opened it; if it has ended since, here): opened after the entry, it would start in
    /// etcd's history (at the entry's own event), which etcd answers with that one event and
    /// closes, so the wait would open a second one.
    async fn enqueue_new(&mut self) -> Result<(), LockError> {
        if self.stream.as_ref().is_none_or(|s| s.ended()) && !self.behind {
            // Trouble opening it is the wait's to deal with (it opens one again).
            if let Ok(Some(stream)) = self.open_stream().await {
                self.stream = Some(stream);
            }
        }
        let record = QueueRecord {
            id: self.me.id.clone(),
            node: self.me.node.clone(),
            boot_id: self.me.boot_id.clone(),
            token: self.me.token.clone(),
            since: self.started,
            zone: self.me.zone.clone(),
        };
        let created = self
            .store
            .client
            .create_in_order(
                &self.store.keys.queue,
                &record.to_json(),
                Some(self.store.timeouts.queue_ttl),
            )
            .await
            .map_err(lock_error)?;
        tracing::debug!(key = %created.node.key, "queued for a slot");
        self.entry.key = Some(created.node.key.clone());
        self.refreshed_at = Some(Instant::now());
        self.note(&created);
        Ok(())
    }
}

#[cfg(test)]
#[path = "claim_tests.rs"]
mod claim_tests;

#[cfg(test)]
#[path = "watch_tests.rs"]
mod watch_tests;

#[cfg(test)]
#[path = "retry_tests.rs"]
mod retry_tests;
