//! A store-neutral snapshot of a semaphore, as a store adapter reads it: the number of slots,
//! the holders with what their records say, and the FIFO queue of waiters. The arbiter decides
//! on this alone, so every store follows the same rules.
//!
//! Nothing here is a wall-clock time written by another host. Whether a holder or a waiter is
//! alive is told by a [`Beat`]: a store revision that changes with each heartbeat (judged by the
//! observer's own monotonic clock, see [`Observations`]), or the store's own time to live.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Who is asking: the holder id (machine id, as locksmith uses), the node name, and the holder
/// token that tells this host from another one with the same machine id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Me<'a> {
    pub id: &'a str,
    pub node: &'a str,
    pub token: &'a str,
}

/// How the store shows that a holder or a waiter is alive.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Beat {
    /// Its record changes (a new store revision) with every heartbeat; the value is that
    /// revision. Unchanged for `max_hold`, as the observer's own clock measures it, means it
    /// stopped.
    Revision(String),
    /// The store keeps it only while it is alive (a TTL the store enforces): present is alive.
    Ttl,
    /// Nothing of it changes while it lives (a holder written by locksmith, without a record):
    /// the observer counts from when it first saw it.
    Silent,
}

/// One holder of a slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HolderView {
    /// Its holder id: the machine id (or, for a holder without one, what the store names it by).
    pub id: String,
    pub node: Option<String>,
    pub boot_id: Option<String>,
    pub phase: Option<String>,
    /// When it took the slot or last changed its phase, as its record says (for status only:
    /// another host's clock, never compared).
    pub since: Option<jiff::Timestamp>,
    /// The holder token of the host that took the slot; `None` when written by something that
    /// has none (locksmith, an older rebootd, a hand-written holder).
    pub token: Option<String>,
    pub beat: Beat,
    /// What the store knows for certain about it being gone (e.g. its Kubernetes Node was
    /// deleted), in words. Such a holder may be reclaimed without `max_hold`.
    pub gone: Option<String>,
    /// Why this holder is not one rebootd would have written (a slot past `max`, an object
    /// without the semaphore's role), if it is not: it counts as held, and is nobody's to hold
    /// or adopt but, where the store authenticated nodes, the node it is under.
    pub foreign: Option<String>,
    /// The waiter that claimed this slot to take it back (judging the holder stopped), where a
    /// store takes a slot back in two steps (etcd v2: no transaction over two keys). A claimed
    /// slot is no longer its holder's to use, only to give back.
    pub claimed_by: Option<String>,
    /// The zone its record claims (`None`: written by something that names none, such as
    /// locksmith or an older rebootd; under `max_per_zone` it counts in every zone).
    pub zone: Option<String>,
}

/// A waiter's place in the queue. Smaller is earlier. The parts are what the store orders by
/// (etcd: the entry's create revision; Leases: creation time, then name).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Ticket {
    pub order: (i64, i64),
    pub name: String,
}

/// One waiter in the queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WaiterView {
    /// The key the store keeps it under (for observations and logs).
    pub key: String,
    pub ticket: Ticket,
    /// Its holder id, when the store records one (so a holder's left-over entry is not counted).
    pub id: Option<String>,
    /// Its node, when the store records one.
    pub node: Option<String>,
    pub beat: Beat,
    /// Whether this is the asker's own entry.
    pub mine: bool,
    /// The zone its entry claims (`None`: unknown, counted in every zone).
    pub zone: Option<String>,
    /// When it started waiting, as its entry says (its writer's clock: shown only, never
    /// compared).
    pub since: Option<jiff::Timestamp>,
}

/// The semaphore as read, store-neutral.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct View {
    pub max: u64,
    pub holders: Vec<HolderView>,
    pub waiters: Vec<WaiterView>,
    /// Whether the store authenticated each holder's node (Kubernetes: a slot Lease's
    /// `holderIdentity`, bound to the writer by the admission policy). Then only a holder under
    /// my node name can be mine; its machine id and token only tell two boots or two installs
    /// of that node apart, since any node may write them. Elsewhere (etcd) the machine id is
    /// the identity.
    pub node_is_identity: bool,
    /// The asker's zone, as its store knows it (etcd: `lock.zone`; Leases: its Node's
    /// `zone_label`). `None`: unknown, so under `max_per_zone` it shares a zone with everyone.
    pub my_zone: Option<String>,
    /// Waiters the store counted but did not list, all ahead of me (a newcomer's read of a
    /// long queue): each counts as a live waiter ahead that wants a slot, in no known zone.
    pub unlisted_ahead: usize,
}

impl View {
    /// Free slots: negative when `max` was forced below the holders.
    pub fn free(&self) -> i64 {
        let max = i64::try_from(self.max).unwrap_or(i64::MAX);
        let held = i64::try_from(self.holders.len()).unwrap_or(i64::MAX);
        max.saturating_sub(held)
    }

    /// What `rebootctl status` shows of it: every holder as its record says, foreign ones
    /// marked.
    pub fn status(&self, backend: super::Backend, group: &str) -> super::SemaphoreStatus {
        let holders = self
            .holders
            .iter()
            .map(|h| super::Holder {
                id: h.id.clone(),
                node: h.node.clone(),
                phase: h.phase.clone(),
                since: h.since,
                boot_id: h.boot_id.clone(),
                foreign: h.foreign.clone(),
            })
            .collect();
        super::SemaphoreStatus {
            backend,
            group: group.to_owned(),
            max: self.max,
            free: self.free(),
            holders,
            share: None,
        }
    }

    /// My own queue entry, if I have one.
    pub fn my_ticket(&self) -> Option<&Ticket> {
        self.waiters.iter().find(|w| w.mine).map(|w| &w.ticket)
    }
}

/// What one observer has seen of each holder and waiter: the beat it last saw and since when
/// (its own monotonic clock). Staleness is measured here, never from a time another host wrote.
///
/// Run at every change a waiter sees, over every holder and waiter: it allocates nothing for an
/// entry it has seen before, and keeps nothing for entries kept alive by a TTL (their silence is
/// always zero), so a long queue on etcd costs it no more than its holders.
#[derive(Debug, Clone, Default)]
pub struct Observations {
    holders: Seen,
    waiters: Seen,
    /// The store's breaks in contact with this observer, as of the counts kept.
    breaks: u64,
}

/// The beat last seen of each entry, by key, and since when.
type Seen = HashMap<String, (Beat, Instant)>;

impl Observations {
    /// Note what `view` shows at `now`: a new beat restarts its entry's clock; entries no longer
    /// in the view are forgotten.
    pub fn update(&mut self, view: &View, now: Instant) {
        let holders = view.holders.iter().map(|h| (h.id.as_str(), &h.beat));
        note(&mut self.holders, holders, now);
        let waiters = view.waiters.iter().map(|w| (w.key.as_str(), &w.beat));
        note(&mut self.waiters, waiters, now);
    }

    /// Start every count afresh when the observer lost touch with its store since the counts
    /// began (`contact` had a break): a silence heard through a break is not the entry's.
    /// `true`: the counts were voided.
    pub fn in_touch(&mut self, contact: &super::contact::Contact) -> bool {
        if contact.breaks() == self.breaks {
            return false;
        }
        let voided = !self.holders.is_empty() || !self.waiters.is_empty();
        *self = Observations {
            breaks: contact.breaks(),
            ..Observations::default()
        };
        voided
    }

    /// How long holder `id` has shown no sign of life, as this observer saw it (zero when it
    /// beats by TTL or was never seen).
    pub fn holder_silent_for(&self, id: &str, beat: &Beat, now: Instant) -> Duration {
        silent_for(&self.holders, id, beat, now)
    }

    /// How long waiter `key` has shown no sign of life.
    pub fn waiter_silent_for(&self, key: &str, beat: &Beat, now: Instant) -> Duration {
        silent_for(&self.waiters, key, beat, now)
    }
}

/// Replace `seen` by `entries` (key, beat) as seen at `now`, keeping the time of each beat seen
/// before.
fn note<'a>(seen: &mut Seen, entries: impl Iterator<Item = (&'a str, &'a Beat)>, now: Instant) {
    let mut old = std::mem::take(seen);
    for (key, beat) in entries {
        if *beat == Beat::Ttl {
            continue;
        }
        let (key, entry) = match old.remove_entry(key) {
            Some((k, (b, at))) if b == *beat => (k, (b, at)),
            Some((k, _)) => (k, (beat.clone(), now)),
            None => (key.to_owned(), (beat.clone(), now)),
        };
        seen.insert(key, entry);
    }
}

fn silent_for(seen: &Seen, key: &str, beat: &Beat, now: Instant) -> Duration {
    if *beat == Beat::Ttl {
        return Duration::ZERO;
    }
    match seen.get(key) {
        Some((b, since)) if b == beat => now.saturating_duration_since(*since),
        _ => Duration::ZERO,
    }
}

/// Views for the lock core's unit tests, every field empty unless a test sets it:
/// `HolderView { token: Some("t".into()), ..holder("m-a") }`.
#[cfg(test)]
pub(crate) mod test_support {
    use super::{Beat, HolderView, Ticket, View, WaiterView};

    /// Holder `id`: no node, token or record, silent.
    pub(crate) fn holder(id: &str) -> HolderView {
        HolderView {
            id: id.into(),
            node: None,
            boot_id: None,
            phase: None,
            since: None,
            token: None,
            beat: Beat::Silent,
            gone: None,
            foreign: None,
            claimed_by: None,
            zone: None,
        }
    }

    /// A waiter under `key`, `order` in the queue, kept by a TTL, nobody's in particular.
    pub(crate) fn waiter(key: &str, order: i64) -> WaiterView {
        WaiterView {
            key: key.into(),
            ticket: Ticket {
                order: (order, 0),
                name: key.into(),
            },
            id: None,
            node: None,
            beat: Beat::Ttl,
            mine: false,
            zone: None,
            since: None,
        }
    }

    /// `max` slots, these holders and waiters, on a store keyed by machine id, no zone.
    pub(crate) fn view(max: u64, holders: Vec<HolderView>, waiters: Vec<WaiterView>) -> View {
        View {
            max,
            holders,
            waiters,
            node_is_identity: false,
            my_zone: None,
            unlisted_ahead: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::test_support::view;
    use super::*;

    fn holder(id: &str, beat: Beat) -> HolderView {
        HolderView {
            beat,
            ..test_support::holder(id)
        }
    }

    #[test]
    fn silence_restarts_with_each_new_beat_and_is_never_from_written_times() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut view = view(1, vec![holder("a", Beat::Revision("5".into()))], vec![]);
        let mut o = Observations::default();
        o.update(&view, t0);
        let beat = view.holders[0].beat.clone();
        assert_eq!(o.holder_silent_for("a", &beat, t0 + s(30)), s(30));
        view.holders[0].beat = Beat::Revision("9".into());
        o.update(&view, t0 + s(40));
        let beat = view.holders[0].beat.clone();
        assert_eq!(o.holder_silent_for("a", &beat, t0 + s(50)), s(10));
        // A TTL-kept entry is alive while present.
        view.holders[0].beat = Beat::Ttl;
        o.update(&view, t0 + s(60));
        assert_eq!(o.holder_silent_for("a", &Beat::Ttl, t0 + s(9000)), s(0));
        // Gone from the view: forgotten, so seen again it starts from zero.
        view.holders.clear();
        o.update(&view, t0 + s(70));
        assert_eq!(o.holder_silent_for("a", &Beat::Silent, t0 + s(80)), s(0));
    }

    fn waiter(key: &str, beat: Beat) -> WaiterView {
        WaiterView {
            beat,
            ..test_support::waiter(key, 0)
        }
    }

    /// Waiters kept by a TTL (etcd's queue) cost the observer nothing to keep; waiters that
    /// beat (Leases) are followed like holders, a holder and a waiter of the same name apart.
    #[test]
    fn waiters_kept_by_a_ttl_are_not_kept_and_beating_ones_are_followed() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let waiters = (0..1000).map(|i| waiter(&format!("q/{i}"), Beat::Ttl));
        let mut view = view(
            1,
            vec![holder("x", Beat::Revision("1".into()))],
            waiters.collect(),
        );
        let mut o = Observations::default();
        o.update(&view, t0);
        assert_eq!((o.holders.len(), o.waiters.len()), (1, 0));
        assert_eq!(o.waiter_silent_for("q/7", &Beat::Ttl, t0 + s(99)), s(0));

        view.waiters = vec![waiter("x", Beat::Revision("4".into()))];
        o.update(&view, t0 + s(10));
        o.update(&view, t0 + s(20));
        let four = Beat::Revision("4".into());
        assert_eq!(o.waiter_silent_for("x", &four, t0 + s(25)), s(15));
        assert_eq!(
            o.holder_silent_for("x", &Beat::Revision("1".into()), t0 + s(25)),
            s(25)
        );
        view.waiters[0].beat = Beat::Revision("5".into());
        o.update(&view, t0 + s(30));
        let five = Beat::Revision("5".into());
        assert_eq!(o.waiter_silent_for("x", &five, t0 + s(31)), s(1));
    }
}
