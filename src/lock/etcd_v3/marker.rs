//! How far back a v3 waiter is, and what it watches there. Far back ([`far_back`]) no change
//! can let it act, so changes go into its view without a decision and its lease is kept alive
//! half as often. Far enough back for a *marker* ([`marker`]), it watches two keys, not the
//! whole group: one queue entry ahead of it and the group's pause. On the group's watch every
//! change reached every waiter, about seven a reboot, so each waiter's events grew with the
//! fleet and the fleet's with its square; a far waiter's watch brings the pause and its
//! marker's end. It follows a marker from the first wait after a read: placed by the read, or,
//! when its entry came after a burst of writes that the read did not show ([`after_burst`]),
//! by one narrow read of the entries nearest ahead of it (its snapshot then lacks the queue
//! ahead, so every wake reads again before the arbiter decides). Or from the change on the
//! group's watch that showed it far enough back.
//!
//! The marker is the queue entry `max + FAR_BACK / 2` places ahead of mine, counting waiters'
//! entries only (a holder's left-over entry may go at any time). While it is there I cannot
//! act: whatever lets me take a slot lets it take one first, being ahead of me, and only the
//! head reclaims. It leaves when it takes a slot (the take deletes it), when its waiter goes,
//! or when its lease expires with a dead waiter (at most the entry's time to live, as any dead
//! waiter ahead holds the queue up). Any change of it makes the waiter read again and be placed
//! again: near the front by then, on the group's watch.
//!
//! What a far waiter does not see until it reads again: a larger `max` (the waiters near the
//! front take the new slots, the marker's take reaches it a read later than a watch would
//! bring it), and the document naming it a holder (a slot taken for its id elsewhere; adopted
//! a read later). Its liveness beats need no watch: a lease keep-alive is not a change.

use std::collections::HashSet;

use etcd_client::{
    GetOptions, SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse, WatchOptions, WatchStream,
};

use super::super::acquire::{self, FAR_BACK};
use super::super::LockError;
use super::snapshot::{Keys, Snapshot};
use super::EtcdSemaphore;

/// Whether the waiter of the queue entry `mine` is far back in `snap`
/// ([`acquire::far_back`]): entries live by their lease, so none ahead is judged dead by
/// silence; the uncertain ones are the left-over entries holders may have. `zoned`: waiters
/// ahead in full zones are passed over, so any change may let it act (never far).
pub(super) fn far_back(snap: &Snapshot, keys: &Keys, mine: &str, max: u64, zoned: bool) -> bool {
    let Some(my_ticket) = waiting_ticket(snap, keys, mine, zoned) else {
        return false;
    };
    let ahead = snap
        .queue
        .values()
        .filter(|e| e.create_revision < my_ticket)
        .count();
    acquire::far_back(max, ahead, snap.doc.holders.len())
}

/// How many waiters' entries beyond `max` ahead make a waiter far enough back for a marker:
/// the group's changes it then does not receive (about seven a reboot ahead of it) must
/// outweigh what the marker costs: a read of the group and three watch creates more.
const MARKER_BEYOND_MAX: usize = 4 * FAR_BACK;

/// The key of the queue entry a waiter behind `mine` in `snap` watches, when it is far enough
/// back (`max`, [`MARKER_BEYOND_MAX`] and one per holder ahead of it: a holder's left-over
/// entry may go at any time, so it is never the marker); `None` nearer the
/// front, where it watches the whole group. `zoned`: waiters in full zones are passed over, so
/// any change may let it act (never far).
pub(super) fn marker(
    snap: &Snapshot,
    keys: &Keys,
    mine: &str,
    max: u64,
    zoned: bool,
) -> Option<String> {
    let my_ticket = waiting_ticket(snap, keys, mine, zoned)?;
    let ahead = || {
        snap.queue
            .iter()
            .filter(move |(_, e)| e.create_revision < my_ticket)
    };
    // Counted first, a comparison per entry (this runs at every change while far back); the
    // entries holders may have left are not counted live, as in `far_back`.
    let live = ahead().count().saturating_sub(snap.doc.holders.len());
    let distance = acquire::marker_distance(max.max(1), live, MARKER_BEYOND_MAX)?;
    let holders: HashSet<String> = snap.doc.holders.iter().map(|h| keys.waiter(h)).collect();
    let mut waiters: Vec<(i64, &String)> = ahead()
        .filter(|(k, _)| !holders.contains(*k))
        .map(|(k, e)| (e.create_revision, k))
        .collect();
    waiters.sort_unstable();
    let at = waiters.len().checked_sub(distance)?;
    waiters.get(at).map(|(_, k)| (*k).clone())
}

/// The ticket (create revision) of the queue entry `mine`, when it is a waiter's that may be
/// far back: queued, not a holder's, and no zones to pass waiters over.
fn waiting_ticket(snap: &Snapshot, keys: &Keys, mine: &str, zoned: bool) -> Option<i64> {
    let ticket = snap.queue.get(mine)?.create_revision;
    let holder = snap.doc.holders.iter().any(|h| keys.waiter(h) == mine);
    (!zoned && !holder).then_some(ticket)
}

/// After a start burst: my entry `mine` was put after my read (`snap`), with enough writes
/// between them for a queue to have formed ahead of it that the read did not show (in a start
/// burst every waiter reads an empty queue), or after a read that counted a long queue without
/// listing it ([`read_newcomer`]). On the group's watch each of those entries would
/// reach me before I knew I was far back. So I ask etcd first, in one transaction, for the
/// document and the entries nearest ahead of mine (keys only, nearest first, at most `max` plus
/// [`MARKER_BEYOND_MAX`] plus the holders and [`FAR_BACK`] of them: bytes O(max)). My marker
/// among them, and the revision of that answer, when I am far enough back for one; `None` (the
/// group's watch, as read) otherwise.
pub(super) async fn after_burst(
    store: &EtcdSemaphore,
    snap: &Snapshot,
    mine: &str,
    max: u64,
    zoned: bool,
) -> Result<Option<(String, i64)>, LockError> {
    let keys = &store.keys;
    let Some(ticket) = waiting_ticket(snap, keys, mine, zoned) else {
        return Ok(None);
    };
    // Ahead of me at most: the entries read, and one per write between the read and my entry.
    let read_ahead = snap
        .queue
        .values()
        .filter(|e| e.create_revision < ticket)
        .count();
    let since_read = usize::try_from(ticket - snap.revision - 1).unwrap_or(0);
    let unread = since_read + snap.unlisted;
    let max = max.max(1);
    if unread == 0
        || acquire::marker_distance(max, read_ahead + unread, MARKER_BEYOND_MAX).is_none()
    {
        return Ok(None);
    }
    let limit = usize::try_from(max)
        .unwrap_or(usize::MAX)
        .saturating_add(MARKER_BEYOND_MAX + FAR_BACK + snap.doc.holders.len());
    let nearest = GetOptions::new()
        .with_prefix()
        .with_keys_only()
        .with_max_create_revision(ticket - 1)
        .with_sort(SortTarget::Create, SortOrder::Descend)
        .with_limit(i64::try_from(limit).unwrap_or(i64::MAX));
    let txn = Txn::new().and_then(vec![
        TxnOp::get(keys.doc.clone(), None),
        TxnOp::get(keys.queue.clone(), Some(nearest)),
    ]);
    let resp = store.txn(txn).await?;
    let at = resp.header().map(|h| h.revision()).unwrap_or_default();
    let mut now = Snapshot::empty(at);
    let mut gets = resp.op_responses().into_iter().filter_map(|op| match op {
        TxnOpResponse::Get(get) => Some(get),
        _ => None,
    });
    let (Some(doc), Some(queue)) = (gets.next(), gets.next()) else {
        return Err(LockError::Backend {
            backend: super::BACKEND,
            reason: format!("unexpected answer to a read of {}", keys.queue),
        });
    };
    for kv in doc.kvs() {
        now.put(keys, &super::snapshot::Kv::from(kv))?;
    }
    let holders: HashSet<String> = now.doc.holders.iter().map(|h| keys.waiter(h)).collect();
    let nearest = queue
        .kvs()
        .iter()
        .map(|kv| String::from_utf8_lossy(kv.key()).into_owned());
    Ok(nearest_marker(nearest, &holders, max).map(|k| (k, at)))
}

/// The marker among the queue's `nearest` keys ahead of mine (nearest first), the entries of
/// `holders` (left over, they may go at any time) not counted: when enough are live waiters.
fn nearest_marker(
    nearest: impl Iterator<Item = String>,
    holders: &HashSet<String>,
    max: u64,
) -> Option<String> {
    let waiters: Vec<String> = nearest.filter(|k| !holders.contains(k)).collect();
    let distance = acquire::marker_distance(max, waiters.len(), MARKER_BEYOND_MAX)?;
    waiters.into_iter().nth(distance.checked_sub(1)?)
}

/// How many queue entries a newcomer's read lists at most: beyond that it counts them.
const NEWCOMER_LISTS: i64 = 128;

/// The read of a waiter with no entry in the queue (a newcomer, or one whose entry went): the
/// document, the records and the pause, and the queue listed when it is short, or only counted
/// when it holds more than [`NEWCOMER_LISTS`] entries ([`Snapshot::unlisted`]). Each of those
/// is ahead of the entry I am about to put, so the arbiter needs how many, not which; after
/// the put, [`after_burst`] finds my marker among the nearest. The read costs O(1) bytes, not
/// O(N), however long the queue. Not with zones, where which zone each waiter ahead claims
/// decides.
pub(super) async fn read_newcomer(store: &EtcdSemaphore) -> Result<Snapshot, LockError> {
    let mut gets = store.read_ops(false, store.max_percent.is_some());
    let [_, pause] = store.queue_ops(None);
    let queue = GetOptions::new().with_prefix().with_limit(NEWCOMER_LISTS);
    gets.push(TxnOp::get(store.keys.queue.clone(), Some(queue)));
    gets.push(pause);
    let expected = gets.len();
    let resp = store.txn(Txn::new().and_then(gets)).await?;
    let counted = resp
        .op_responses()
        .into_iter()
        .filter_map(|op| match op {
            TxnOpResponse::Get(get) => Some(get),
            _ => None,
        })
        .nth(expected - 2)
        .filter(|queue| queue.more())
        .map(|queue| queue.count());
    let mut snap = store.snapshot_of(&resp, expected)?;
    if let Some(count) = counted {
        snap.queue.clear();
        snap.unlisted = usize::try_from(count).unwrap_or(usize::MAX);
    }
    Ok(snap)
}

/// One watch stream of `marker` from revision `marker_from` and the group's pause from
/// `pause_from`.
pub(super) async fn watch(
    store: &EtcdSemaphore,
    marker: &str,
    marker_from: i64,
    pause_from: i64,
) -> Result<WatchStream, LockError> {
    let from = |revision| WatchOptions::new().with_start_revision(revision);
    let watched = [
        (marker.to_owned(), from(marker_from)),
        (store.keys.pause.clone(), from(pause_from)),
    ];
    watchers(store, watched).await
}

/// One watch stream with a watcher for each of `watched` (a key, or the start of a range, with
/// its options).
pub(super) async fn watchers(
    store: &EtcdSemaphore,
    watched: impl IntoIterator<Item = (String, WatchOptions)>,
) -> Result<WatchStream, LockError> {
    let mut watched = watched.into_iter();
    let Some((key, options)) = watched.next() else {
        return Err(LockError::Backend {
            backend: super::BACKEND,
            reason: "a watch of nothing".into(),
        });
    };
    let mut watch = store.client.watch_client();
    let mut stream = store
        .request("opening a watch: ", watch.watch(key, Some(options)))
        .await?;
    for (key, options) in watched {
        if let Err(e) = stream.watch(key, Some(options)).await {
            return Err(store.classify(e));
        }
    }
    Ok(stream)
}

#[cfg(test)]
mod tests {
    use super::super::snapshot::QueueEntry;
    use super::*;

    const GROUP: &str = "default";

    /// `n` waiters queued in order (`w000`, `w001`, …), then me, `holders` holding.
    fn queue(n: usize, holders: &[&str]) -> (Snapshot, Keys, String) {
        let keys = Keys::new(GROUP);
        let mut snap = Snapshot::empty(1);
        for i in 0..=n {
            let id = if i == n {
                "me".to_owned()
            } else {
                format!("w{i:03}")
            };
            snap.queue.insert(
                keys.waiter(&id),
                QueueEntry {
                    create_revision: 10 + i64::try_from(i).unwrap(),
                    lease: 1,
                    record: None,
                },
            );
        }
        snap.doc.holders = holders.iter().map(|h| (*h).to_owned()).collect();
        let mine = keys.waiter("me");
        (snap, keys, mine)
    }

    #[test]
    fn after_a_burst_the_marker_is_counted_among_the_nearest_waiters() {
        let max = 3;
        let need = 3 + MARKER_BEYOND_MAX;
        let nearest = |n: usize| (0..n).map(|i| format!("w{i:03}"));
        let none = HashSet::new();
        assert_eq!(
            nearest_marker(nearest(need - 1), &none, max),
            None,
            "one too few"
        );
        let distance = 3 + FAR_BACK / 2;
        assert_eq!(
            nearest_marker(nearest(need), &none, max),
            Some(format!("w{:03}", distance - 1))
        );
        // A holder's left-over entry among them is neither counted nor the marker.
        let holder: HashSet<String> = [format!("w{:03}", distance - 1)].into();
        assert_eq!(nearest_marker(nearest(need), &holder, max), None);
        assert_eq!(
            nearest_marker(nearest(need + 1), &holder, max),
            Some(format!("w{distance:03}"))
        );
    }

    #[test]
    fn near_the_front_there_is_no_marker() {
        let (snap, keys, mine) = queue(MARKER_BEYOND_MAX + 2, &[]);
        assert_eq!(marker(&snap, &keys, &mine, 3, false), None, "one too few");
        assert!(marker(&snap, &keys, &mine, 2, false).is_some(), "enough");
        assert!(
            far_back(&snap, &keys, &mine, 3, false),
            "far back all the same"
        );
    }

    #[test]
    fn the_marker_is_max_and_half_far_back_ahead() {
        let (snap, keys, mine) = queue(80, &[]);
        // 80 ahead (w000..w079), max 4: the entry 4 + 8 places ahead, w068.
        let at = marker(&snap, &keys, &mine, 4, false);
        assert_eq!(at, Some(keys.waiter("w068")));
    }

    #[test]
    fn holders_entries_are_uncertain_and_never_watched() {
        let (snap, keys, mine) = queue(MARKER_BEYOND_MAX + 2, &["w005", "w017"]);
        assert_eq!(
            marker(&snap, &keys, &mine, 2, false),
            None,
            "two holders' ahead"
        );
        let (snap, keys, mine) = queue(80, &["w068"]);
        // w068 is a holder's: the next waiter's entry ahead takes its place.
        let at = marker(&snap, &keys, &mine, 4, false);
        assert_eq!(at, Some(keys.waiter("w067")));
    }

    #[test]
    fn zones_a_holder_or_no_entry_mean_no_marker() {
        let (snap, keys, mine) = queue(80, &[]);
        assert_eq!(marker(&snap, &keys, &mine, 1, true), None, "zoned");
        let gone = keys.waiter("gone");
        assert_eq!(marker(&snap, &keys, &gone, 1, false), None, "not queued");
        assert!(!far_back(&snap, &keys, &gone, 1, false), "not queued");
        let (snap, keys, mine) = queue(80, &["me"]);
        assert_eq!(marker(&snap, &keys, &mine, 1, false), None, "a holder");
        assert!(!far_back(&snap, &keys, &mine, 1, false), "a holder");
    }
}
