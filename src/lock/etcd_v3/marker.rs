//! How far back a v3 waiter is, and what it watches there. Far back ([`far_back`]) no change
//! can let it act, so changes go into its view without a decision and its lease is kept alive
//! half as often. Far enough back for a *marker* ([`marker`]), it watches two keys, not the
//! whole group: one queue entry ahead of it and the group's pause. On the group's watch every
//! change reached every waiter, about seven a reboot, so each waiter's events grew with the
//! fleet and the fleet's with its square; a far waiter's watch brings the pause and its
//! marker's end. It follows a marker from the first wait after a read, or from the change on
//! the group's watch that showed it far enough back (the waiters that queued ahead of it after
//! its read).
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

use etcd_client::{WatchOptions, WatchStream};

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

/// One watch stream of `marker` and the group's pause, both from `revision`.
pub(super) async fn watch(
    store: &EtcdSemaphore,
    marker: &str,
    revision: i64,
) -> Result<WatchStream, LockError> {
    let from = WatchOptions::new().with_start_revision(revision);
    let mut watch = store.client.watch_client();
    let mut stream = store
        .request(
            "opening a watch: ",
            watch.watch(marker.to_owned(), Some(from.clone())),
        )
        .await?;
    if let Err(e) = stream.watch(store.keys.pause.clone(), Some(from)).await {
        return Err(store.classify(e));
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
