//! A Lease waiter far back in a long queue stops watching the whole semaphore and watches one
//! waiter Lease ahead of it instead: its *marker*. Every waiter renews its Lease every third
//! of its TTL, and on the semaphore's watch each renewal was an event for every waiter: at
//! 1000 waiters, 100 renewals a second made 100 000 watch events a second, the API server's and
//! the waiters' work growing with the square of the queue. A far waiter's watch brings the
//! renewals of one Lease.
//!
//! The marker is the waiter Lease `max + FAR_BACK / 2` places ahead of mine (counting every
//! waiter Lease ahead, live or not). While it is there I cannot act: it goes before me, and it
//! takes a slot only with fewer than `max` waiters ahead of it. When it leaves the queue (its
//! Lease deleted: it took a slot, left, or was deleted as dead), the waiter reads the semaphore
//! again and is placed again, near the front by then (it then watches the whole semaphore) or
//! far back still (a new marker). A watch that lost its place (410 Gone) is opened again from
//! the current state, not from a read of the semaphore. A marker whose
//! Lease does not change for twice the waiter time-out, as this waiter's own clock sees it on
//! the watch, is a dead waiter's: its Lease is deleted (precondition: the `resourceVersion`
//! watched, so a renewal the watch missed keeps it) and the waiter reads again.
//!
//! A far waiter renews its own Lease every two thirds of its TTL, not every third as near the
//! front (`lock::acquire::beat_due`, as on etcd): half the requests of the longest part of a long wait. Its
//! Lease is judged by the waiters near the front only when it stands among them, and there it
//! has been placed again by then (read again when its marker left, due at once: more than a
//! third since its last renewal); the waiter whose marker it is waits twice the time-out before
//! taking it for dead, and the arbiter counts it dead only after the whole time-out (TTL plus
//! clock slack): every judge has at least a third of the TTL to spare, as near the front one
//! renewal may fail before the time-out and two before the deletion.
//!
//! What a far waiter does not see until it reads again: waiters ahead that died (the arbiter
//! judges those at the next read, by the `resourceVersion`s it saw at the last one; they cannot
//! let it act while its marker, alive, is ahead), a pause (the waiters ahead leave the queue,
//! the marker among them) and a larger `max` (the waiters near the front take the new slots,
//! and the marker's take reaches it; it comes a read later than to a waiter that watches).

use std::time::{Duration, Instant};

use futures_util::stream::{BoxStream, StreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{WatchEvent, WatchParams};

use super::super::acquire::{self, FAR_BACK};
use super::calls::CallError;
use super::snapshot::{ticket, Snapshot};
use super::{KubeLeaseSemaphore, LockError};

type Events = BoxStream<'static, Result<WatchEvent<Lease>, kube::Error>>;

/// The waiter Lease a far waiter watches.
pub(super) struct Marker {
    /// Its Lease as last seen (the precondition of deleting it as dead).
    lease: Lease,
    /// When this waiter's clock last saw its `resourceVersion` change (or began watching).
    changed_at: Instant,
    /// Where the watch resumes: the last `resourceVersion` seen (an event or a bookmark).
    resume: String,
    events: Option<Events>,
}

impl std::fmt::Debug for Marker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Marker")
            .field("name", &self.name())
            .field("resume", &self.resume)
            .finish_non_exhaustive()
    }
}

impl Marker {
    /// The marker of my waiter Lease `mine` in `snap`, when the arbiter counted `behind` live
    /// waiters ahead of me with `max` slots: `None` unless I am far back (at least `max +
    /// FAR_BACK` ahead) and queued.
    pub(super) fn pick(snap: &Snapshot, mine: &str, behind: usize, max: u64) -> Option<Marker> {
        let distance = acquire::marker_distance(max, behind, FAR_BACK)?;
        let my_ticket = ticket(snap.waiters.get(mine)?);
        let mut ahead: Vec<_> = snap
            .waiters
            .values()
            .filter(|w| w.name != mine && ticket(w) < my_ticket)
            .collect();
        ahead.sort_by_cached_key(|w| std::cmp::Reverse(ticket(w)));
        let w = ahead.get(distance.checked_sub(1)?)?;
        Some(Marker {
            resume: w
                .lease
                .metadata
                .resource_version
                .clone()
                .unwrap_or_default(),
            lease: w.lease.clone(),
            changed_at: Instant::now(),
            events: None,
        })
    }

    pub(super) fn name(&self) -> &str {
        self.lease.metadata.name.as_deref().unwrap_or("")
    }

    /// When it counts as dead: twice the waiter time-out `timeout` after its last change.
    pub(super) fn dead_at(&self, timeout: Duration) -> Instant {
        self.changed_at + timeout.saturating_mul(2)
    }

    /// Whether the marker left the queue (its Lease deleted), after the next event of its watch
    /// (`false`: a renewal, a bookmark, or the watch ended or lost its place and is opened again
    /// on the next call). Opens the watch (from the last `resourceVersion` seen, field selector
    /// on its name) when it is not open. Cancel-safe: dropped while opening, it opens again on
    /// the next call.
    pub(super) async fn next(&mut self, store: &KubeLeaseSemaphore) -> Result<bool, LockError> {
        const WHAT: &str = "watching the waiter Lease ahead";
        let events = match self.events.as_mut() {
            Some(events) => events,
            None => {
                let wp = WatchParams::default()
                    .fields(&format!("metadata.name={}", self.name()))
                    .timeout(store.timeouts.watch.as_secs().clamp(1, 290 * 60) as u32);
                match store
                    .call(WHAT, store.leases.watch(&wp, &self.resume))
                    .await
                {
                    Ok(events) => self.events.insert(events.boxed()),
                    Err(CallError {
                        code: Some(410), ..
                    }) => {
                        self.expired();
                        return Ok(false);
                    }
                    Err(e) => return Err(e.error),
                }
            }
        };
        let event = match events.next().await {
            None => {
                self.events = None;
                return Ok(false);
            }
            Some(Err(e)) => {
                self.events = None;
                return Err(store.classify(WHAT, e).error);
            }
            Some(Ok(event)) => event,
        };
        match event {
            WatchEvent::Added(l) | WatchEvent::Modified(l) => {
                if let Some(rv) = l.metadata.resource_version.clone() {
                    if l.metadata.resource_version != self.lease.metadata.resource_version {
                        self.changed_at = Instant::now();
                    }
                    self.resume = rv;
                }
                self.lease = l;
                Ok(false)
            }
            WatchEvent::Deleted(_) => Ok(true),
            WatchEvent::Bookmark(b) => {
                self.resume = b.metadata.resource_version;
                Ok(false)
            }
            WatchEvent::Error(s) if s.code == 410 => {
                self.expired();
                Ok(false)
            }
            WatchEvent::Error(s) => {
                self.events = None;
                Err(store.status_error(WHAT, &s))
            }
        }
    }

    /// The watch's history no longer reaches the `resourceVersion` to resume from (410 Gone):
    /// a dead waiter's Lease, unchanged for longer than the server keeps, is one. The watch is
    /// opened again from the current state (an `ADDED` of the Lease as it is; its deletion in
    /// between is then seen only as silence, which ends at [`Marker::dead_at`]). Reading the
    /// semaphore again instead would pick the same marker and be told the same.
    fn expired(&mut self) {
        tracing::debug!(lease = self.name(), resume = %self.resume, "the watch history no longer reaches the waiter Lease ahead (410 Gone); watching it from now");
        self.events = None;
        self.resume = String::new();
    }

    /// Delete its Lease as a dead waiter's, unless it changed since last seen. Whether it was
    /// (`&mut`: a shared borrow of the watch could not be held across the request).
    pub(super) async fn delete(&mut self, store: &KubeLeaseSemaphore) -> Result<bool, LockError> {
        store
            .delete_lease("deleting a dead waiter Lease", &self.lease)
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::super::snapshot::fixtures::queue;
    use super::*;

    const MINE: &str = "w-node-me";

    #[test]
    fn a_waiter_is_far_from_max_plus_far_back_live_waiters_ahead() {
        let snap = queue(40);
        assert!(Marker::pick(&snap, MINE, 3 + FAR_BACK - 1, 3).is_none());
        let s = Marker::pick(&snap, MINE, 3 + FAR_BACK, 3).unwrap();
        // max + FAR_BACK / 2 = 11 places ahead of mine (w-node-39 is the first).
        assert_eq!(s.name(), "w-node-29");
        assert_eq!(s.resume, "129");
    }

    #[test]
    fn the_marker_counts_every_lease_ahead_and_needs_a_queue_entry() {
        // The arbiter counted 19 live of 20 Leases ahead: the marker is still 11 places ahead.
        let snap = queue(20);
        assert_eq!(Marker::pick(&snap, MINE, 19, 3).unwrap().name(), "w-node-9");
        assert!(Marker::pick(&snap, "w-none", 19, 3).is_none());
        // Fewer Leases ahead than the distance (the arbiter's count cannot exceed them, but a
        // view may change): no marker.
        let short = queue(5);
        assert!(Marker::pick(&short, MINE, 30, 3).is_none());
    }

    #[test]
    fn dead_after_twice_the_waiter_timeout_since_the_last_change() {
        let s = Marker::pick(&queue(40), MINE, 40, 3).unwrap();
        let t = Duration::from_secs(32);
        assert_eq!(s.dead_at(t) - s.changed_at, Duration::from_secs(64));
    }
}
