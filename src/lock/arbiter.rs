//! The one decision every store follows: given a [`View`] of the semaphore, who I am, what this
//! observer has seen (its own monotonic clock) and the policy, do I hold a slot, take one,
//! reclaim one, or wait, and until when. Pure: no I/O, the time is passed in.
//!
//! # Rules
//!
//! - **Mine.** Only a holder the store could have written for me counts: where the store
//!   authenticated each holder's node ([`View::node_is_identity`]), only one under my node name
//!   (foreign to the semaphore or not: past a forced-down `max`, it is still my node's);
//!   elsewhere never a foreign one ([`HolderView::foreign`]). Among those, one with my id
//!   and my token is me: [`Decision::Held`]. With my id and no token (locksmith, an older
//!   rebootd, a holder written by hand for this machine), or, where node names identify hosts,
//!   with my node name and another id (a reinstalled node): mine to adopt
//!   ([`Decision::Adopt`]). With my id and **another token**, another host runs with my machine
//!   id: [`Decision::Duplicate`], reported and never admitted while it holds.
//! - **Queue.** Waiters are served in ticket order. A waiter that is also a holder, or whose
//!   beat is a revision unchanged for `waiter_timeout` (as this observer saw it), does not
//!   count; with `max_per_zone`, neither does one whose zone is full ([`zones`]: passed over,
//!   not dropped). `behind` = the live waiters ahead of me (all of them while I have no entry).
//! - **Take** when the free slots outnumber the waiters ahead of me and my zone has room
//!   (beside its holders and the eligible waiters ahead of me in it): I go for the
//!   `behind`-th free slot, so the waiters a release lets in do not race for one.
//! - **Reclaim** only as the head of the queue (nobody ahead) with no free slot (or with my
//!   zone full, where a free slot elsewhere cannot serve me), and only a
//!   holder the store knows is gone ([`HolderView::gone`]) or, with `max_hold`, one whose beat
//!   did not change for `max_hold` of this observer's clock. Gone holders first, then the one
//!   silent longest. When the holders exceed `max` (a forced shrink), the slot is freed, not
//!   taken over; a slot is taken over only if my zone has room once its holder is out.
//! - Otherwise **wait**: for a change, or until the first holder would pass `max_hold` (head
//!   only) or a waiter ahead would time out.

use std::time::{Duration, Instant};

use super::view::{Beat, HolderView, Me, Observations, View, WaiterView};

/// What the arbiter needs of the configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    /// A holder silent this long may be reclaimed; `None`: holders are reclaimed only when the
    /// store knows they are gone.
    pub max_hold: Option<Duration>,
    /// A waiter whose beat is a revision, silent this long, no longer holds its place.
    pub waiter_timeout: Duration,
    /// At most this many holders in one zone (`lock.max_per_zone`); `None`: no zone rule.
    pub max_per_zone: Option<u64>,
}

/// Why a holder may be reclaimed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReclaimWhy {
    /// The store knows it is gone (e.g. its Node was deleted).
    Gone(String),
    /// Its beat did not change for this long (at least `max_hold`).
    Silent { for_: Duration, max_hold: Duration },
}

impl std::fmt::Display for ReclaimWhy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReclaimWhy::Gone(why) => f.write_str(why),
            ReclaimWhy::Silent { for_, max_hold } => write!(
                f,
                "no sign of life for {} (lock.max_hold is {}), as this waiter's own clock measures it",
                humantime::format_duration(Duration::from_secs(for_.as_secs())),
                humantime::format_duration(*max_hold)
            ),
        }
    }
}

/// What to do next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// I hold a slot.
    Held,
    /// A slot held under my id without a token, or under my node name: take it over as mine
    /// (write my record on it), then I hold it.
    Adopt { holder: String },
    /// Another host holds a slot under my id (its token is `token`): report it and wait.
    Duplicate { holder: String, token: String },
    /// Take the `rank`-th free slot (0 = the first).
    Take { rank: usize },
    /// Reclaim the slot of `holder`: take it over (`take_over`), or only free it when the
    /// holders exceed `max`.
    Reclaim {
        holder: String,
        why: ReclaimWhy,
        take_over: bool,
    },
    /// Wait for a change, or until `until`; `behind` live waiters are ahead of me.
    Wait {
        until: Option<Instant>,
        behind: usize,
    },
}

/// Decide on `view`. `observations` must have been updated with `view` at `now`.
pub fn decide(
    view: &View,
    me: &Me<'_>,
    observations: &Observations,
    policy: &Policy,
    now: Instant,
) -> Decision {
    if let Some(d) = mine(view, me) {
        return d;
    }
    let place = place(view, me, observations, policy, now);
    let behind = place.behind;
    let free = view.free();
    if place.room && free > i64::try_from(behind).unwrap_or(i64::MAX) {
        return Decision::Take { rank: behind };
    }
    let mut until = place.expiry;
    // With no free slot, or with my zone full: a dead holder in my zone frees room for nobody
    // else, and a free slot elsewhere does not help me.
    if behind == 0 && (free <= 0 || !place.room) {
        let take_over = view.holders.len() as u64 <= view.max;
        let mut best: Option<(&HolderView, ReclaimWhy, Duration)> = None;
        for h in &view.holders {
            let silent = observations.holder_silent_for(&h.id, &h.beat, now);
            let why = match (&h.gone, policy.max_hold) {
                (Some(gone), _) => Some((ReclaimWhy::Gone(gone.clone()), Duration::MAX)),
                // A holder the store keeps by TTL is alive while present, whatever max_hold is.
                (None, Some(max_hold)) if h.beat != Beat::Ttl && silent >= max_hold => Some((
                    ReclaimWhy::Silent {
                        for_: silent,
                        max_hold,
                    },
                    silent,
                )),
                (None, Some(max_hold)) if h.beat != Beat::Ttl => {
                    let at = now + (max_hold - silent);
                    until = Some(until.map_or(at, |u: Instant| u.min(at)));
                    None
                }
                _ => None,
            };
            // Taking its slot over puts me in my zone in its place.
            let fits = !take_over || place.zones.has_room(view.my_zone.as_deref(), Some(h));
            if let Some((why, rank)) = why.filter(|_| fits) {
                if best.as_ref().is_none_or(|(_, _, r)| rank > *r) {
                    best = Some((h, why, rank));
                }
            }
        }
        if let Some((h, why, _)) = best {
            return Decision::Reclaim {
                holder: h.id.clone(),
                why,
                take_over,
            };
        }
    }
    Decision::Wait { until, behind }
}

/// Whether the zone rule alone keeps me waiting: `max_per_zone` is set and my zone is full
/// (beside the eligible waiters ahead of me), as [`decide`] counts it.
pub fn zone_full(
    view: &View,
    me: &Me<'_>,
    observations: &Observations,
    policy: &Policy,
    now: Instant,
) -> bool {
    policy.max_per_zone.is_some() && !place(view, me, observations, policy, now).room
}

/// Whether I hold (or should adopt) a slot, or another host holds one under my id. Only holders
/// that could be mine are looked at: never a foreign one and, where the store authenticated
/// holders' nodes, only those under my node name (a machine id or token any node may write).
pub fn mine(view: &View, me: &Me<'_>) -> Option<Decision> {
    whose(&view.holders, view.node_is_identity, me).map(|(_, d)| d)
}

/// [`mine`] over `holders` (of a view with `node_is_identity`): the index of the holder it is
/// about, and the decision.
pub fn whose(
    holders: &[HolderView],
    node_is_identity: bool,
    me: &Me<'_>,
) -> Option<(usize, Decision)> {
    // Where the store authenticated the node, a slot under mine was written by my node, even
    // one foreign to the semaphore (past a max forced below the holders): it is mine to hold
    // and give back. Elsewhere a foreign holder is nobody's.
    let could_be_mine: Vec<(usize, &HolderView)> = holders
        .iter()
        .enumerate()
        .filter(|(_, h)| match node_is_identity {
            true => h.node.as_deref() == Some(me.node),
            false => h.foreign.is_none(),
        })
        .collect();
    let by_id: Vec<(usize, &HolderView)> = could_be_mine
        .iter()
        .copied()
        .filter(|(_, h)| h.id == me.id)
        .collect();
    if let Some((i, _)) = by_id
        .iter()
        .find(|(_, h)| h.token.as_deref() == Some(me.token))
    {
        return Some((*i, Decision::Held));
    }
    let adopt = |(i, h): (usize, &HolderView)| {
        (
            i,
            Decision::Adopt {
                holder: h.id.clone(),
            },
        )
    };
    if let Some(found) = by_id.iter().copied().find(|(_, h)| h.token.is_none()) {
        return Some(adopt(found));
    }
    if let Some((i, h)) = by_id.first() {
        let token = h.token.clone().unwrap_or_default();
        let holder = h.id.clone();
        return Some((*i, Decision::Duplicate { holder, token }));
    }
    // My node under another machine id: this node reinstalled.
    if node_is_identity {
        return could_be_mine.first().copied().map(adopt);
    }
    None
}

/// Whether `w` still holds a place in the queue.
pub fn waiter_live(
    w: &WaiterView,
    observations: &Observations,
    policy: &Policy,
    now: Instant,
) -> bool {
    observations.waiter_silent_for(&w.key, &w.beat, now) < policy.waiter_timeout
}

/// Whether `w` is a holder's left-over entry.
fn is_holder(view: &View, w: &WaiterView) -> bool {
    view.holders.iter().any(|h| {
        w.id.as_deref() == Some(h.id.as_str())
            || (view.node_is_identity && w.node.is_some() && w.node == h.node)
    })
}

/// Where I stand in the queue.
struct Place<'a> {
    /// The live, eligible waiters ahead of me.
    behind: usize,
    /// When the first of them would time out.
    expiry: Option<Instant>,
    /// The zone rule's count: the holders and the eligible waiters ahead of me.
    zones: zones::ZoneRoom<'a>,
    /// Whether my zone has room for me.
    room: bool,
}

/// The live waiters ahead of me that could use a slot (their zone has room), and when the
/// first of them would time out.
fn place<'a>(
    view: &'a View,
    me: &Me<'_>,
    observations: &Observations,
    policy: &Policy,
    now: Instant,
) -> Place<'a> {
    let mine = view.my_ticket();
    let mut behind = 0;
    let mut expiry: Option<Instant> = None;
    let mut zones = zones::ZoneRoom::new(policy.max_per_zone, &view.holders);
    // Stores list the queue in ticket order; the zone rule walks it so whatever the list.
    let mut queue: Vec<&WaiterView> = view.waiters.iter().collect();
    if !queue.is_sorted_by_key(|w| &w.ticket) {
        queue.sort_by_key(|w| &w.ticket);
    }
    for w in queue {
        if w.mine
            || w.id.as_deref() == Some(me.id)
            || mine.is_some_and(|t| w.ticket >= *t)
            || is_holder(view, w)
            || !waiter_live(w, observations, policy, now)
            || !zones.admit(w.zone.as_deref())
        {
            continue;
        }
        behind += 1;
        if w.beat != Beat::Ttl {
            let silent = observations.waiter_silent_for(&w.key, &w.beat, now);
            let at = now + policy.waiter_timeout.saturating_sub(silent);
            expiry = Some(expiry.map_or(at, |e: Instant| e.min(at)));
        }
    }
    // Counted, not listed: ahead of me, live and wanting a slot, their zones unknown.
    behind += view.unlisted_ahead;
    let room = zones.has_room(view.my_zone.as_deref(), None);
    Place {
        behind,
        expiry,
        zones,
        room,
    }
}

/// The waiters (not mine) silent for at least `factor` times the waiter time-out: the entries
/// of waiters that went away, which a store without TTLs may delete.
pub fn dead_waiters<'a>(
    view: &'a View,
    observations: &Observations,
    policy: &Policy,
    factor: u32,
    now: Instant,
) -> Vec<&'a WaiterView> {
    let limit = policy.waiter_timeout.saturating_mul(factor);
    view.waiters
        .iter()
        .filter(|w| !w.mine && w.beat != Beat::Ttl)
        .filter(|w| observations.waiter_silent_for(&w.key, &w.beat, now) >= limit)
        .collect()
}

#[cfg(any(test, fuzzing))]
pub mod props;

#[cfg(test)]
mod tests;

#[cfg(test)]
mod zone_tests;

pub mod share;
pub mod zones;
