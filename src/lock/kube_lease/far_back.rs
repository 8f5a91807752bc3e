//! Whether a Lease waiter far back in a long queue may pass over a change without asking the
//! arbiter (the lock core's rule, `acquire::far_back`). Building the view and deciding at every
//! change of a long queue was most of a waiter's work. Pure: no I/O.
//!
//! Unlike etcd's entries, a waiter Lease lives by its renewals as each observer sees them, so
//! the count of Leases ahead of mine is not a count of live waiters: some may be dead or hold a
//! slot already. What bounds the live waiters ahead is the arbiter's own count at its last
//! decision (`behind`): of the waiter Leases then ahead of mine, `excluded` were not counted
//! (dead, or holders). Until the wait's timer (the first of them that could time out), the
//! others stay live; so the live waiters ahead are at least those of the Leases still there and
//! not holding, less `excluded`. While that is at least `max` (and `FAR_BACK`), no change can
//! let me act: the arbiter takes a slot only with fewer waiters ahead than free slots, and
//! reclaims only at the head. Observations of the waiters ahead are only delayed by it (their
//! renewals are seen at the next decision, which makes them look live longer, never shorter).

use std::collections::BTreeSet;

use k8s_openapi::api::coordination::v1::Lease;

use super::super::acquire::{far_back, far_back_at};
use super::objects::annotation;
use super::queue::{self, ANNOTATION_WAITER_NODE};
use super::snapshot::{lease_ticket, ticket, Snapshot};
use super::Identity;

/// The waiter Leases ahead of mine when the arbiter last placed me, and how many of them it
/// did not count as live waiters.
#[derive(Debug)]
pub(super) struct FarBack {
    ahead: BTreeSet<String>,
    excluded: usize,
}

impl FarBack {
    /// The arbiter counted `behind` live waiters ahead of my waiter Lease `mine` in `snap`.
    /// `None` when `mine` is not in the queue.
    pub(super) fn placed(snap: &Snapshot, mine: &str, behind: usize) -> Option<FarBack> {
        let my_ticket = ticket(snap.waiters.get(mine)?);
        let ahead: BTreeSet<String> = snap
            .waiters
            .values()
            .filter(|w| w.name != mine && ticket(w) < my_ticket)
            .map(|w| w.name.clone())
            .collect();
        let excluded = ahead.len().saturating_sub(behind);
        Some(FarBack { ahead, excluded })
    }

    /// Waiter Lease `name` was deleted.
    pub(super) fn deleted(&mut self, name: &str) {
        self.ahead.remove(name);
    }

    /// Whether no change of `snap` can let `me` (waiter Lease `mine`) act: far back, not
    /// paused, not a holder, still queued. `max`: the semaphore's, as the control Lease says.
    pub(super) fn holds_back(&self, snap: &Snapshot, me: &Identity, mine: &str, max: u64) -> bool {
        if snap.pause.is_some() || snap.mine(me).is_some() || !snap.waiters.contains_key(mine) {
            return false;
        }
        let holders: BTreeSet<&str> = snap.held().map(|(_, h)| h.node.as_str()).collect();
        // Counted only as far as needed: a long queue's far end costs nothing.
        let needed = far_back_at(max, self.excluded);
        let ahead = self
            .ahead
            .iter()
            .filter(|name| {
                snap.waiters.get(name.as_str()).is_some_and(|w| {
                    annotation(&w.lease, ANNOTATION_WAITER_NODE)
                        .is_none_or(|node| !holders.contains(node))
                })
            })
            .take(needed)
            .count();
        far_back(max, ahead, self.excluded)
    }
}

/// Whether a change of the waiter Lease `name` (to `new`; `None`: deleted) cannot let me (my
/// waiter Lease `mine`) act: the Lease of a waiter behind me, before the change and after it, or
/// a renewal of my own. The arbiter counts neither in my place nor in my wait's timer, so this
/// holds however near the front I am: at 600 waiters, their renewals were 60 decisions a second
/// for each waiter near the front, where the ones ahead of it make at most a few.
pub(super) fn behind_me(snap: &Snapshot, mine: &str, name: &str, new: Option<&Lease>) -> bool {
    let Some(me) = snap.waiters.get(mine) else {
        return false;
    };
    if name == mine {
        // Renewed, not moved; deleted (taken for dead?) is for the arbiter.
        return new.is_some_and(|l| queue::since(l) == me.since);
    }
    let mine = ticket(me);
    let after = new.is_none_or(|l| lease_ticket(l) > mine);
    let before = snap.waiters.get(name).is_none_or(|w| ticket(w) > mine);
    after && before
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;

    use super::super::objects::{Slot, SlotHolder};
    use super::super::queue::Waiter;
    use super::super::snapshot::fixtures::queue;
    use super::super::{LABEL_ROLE, ROLE_SLOT};
    use super::*;
    use crate::lock::acquire::FAR_BACK;

    fn me() -> Identity {
        Identity {
            id: "m-me".into(),
            node: "node-me".into(),
            boot_id: "b".into(),
            token: "t".into(),
            zone: None,
        }
    }

    fn hold(snap: &mut Snapshot, index: u64, node: &str) {
        let holder = SlotHolder {
            node: node.into(),
            machine_id: None,
            boot_id: None,
            phase: None,
            since: None,
            node_uid: None,
            token: None,
            zone: None,
        };
        snap.slots.insert(
            index,
            Slot {
                index,
                lease: slot_lease(),
                holder: Some(holder),
            },
        );
    }

    /// A slot Lease as rebootd labels one.
    fn slot_lease() -> Lease {
        let mut lease = Lease::default();
        lease.metadata.labels = Some(std::collections::BTreeMap::from([(
            LABEL_ROLE.to_owned(),
            ROLE_SLOT.to_owned(),
        )]));
        lease
    }

    const MINE: &str = "w-node-me";

    #[test]
    fn far_back_while_enough_live_waiters_stay_ahead() {
        let mut snap = queue(FAR_BACK + 1);
        let mut fb = FarBack::placed(&snap, MINE, FAR_BACK + 1).unwrap();
        assert!(fb.holds_back(&snap, &me(), MINE, 1));
        // The first takes a slot: its waiter Lease is still there, but it is a holder.
        hold(&mut snap, 0, "node-0");
        assert!(fb.holds_back(&snap, &me(), MINE, 1));
        snap.waiters.remove("w-node-0");
        fb.deleted("w-node-0");
        assert!(fb.holds_back(&snap, &me(), MINE, 1), "{FAR_BACK} ahead");
        hold(&mut snap, 1, "node-1");
        assert!(
            !fb.holds_back(&snap, &me(), MINE, 2),
            "one fewer than FAR_BACK"
        );
    }

    #[test]
    fn a_larger_max_a_pause_or_leaving_the_queue_decide() {
        let mut snap = queue(FAR_BACK + 1);
        let fb = FarBack::placed(&snap, MINE, FAR_BACK + 1).unwrap();
        assert!(!fb.holds_back(&snap, &me(), MINE, FAR_BACK as u64 + 2));
        let mut paused = queue(FAR_BACK + 1);
        paused.pause = Some((
            crate::lock::GroupPause::parse(r#"{"reason":"x"}"#),
            "1".into(),
        ));
        assert!(!fb.holds_back(&paused, &me(), MINE, 1));
        snap.waiters.remove(MINE);
        assert!(!fb.holds_back(&snap, &me(), MINE, 1));
        let mut mine = queue(FAR_BACK + 1);
        hold(&mut mine, 0, "node-me");
        assert!(!fb.holds_back(&mine, &me(), MINE, 1));
    }

    #[test]
    fn changes_of_waiters_behind_me_and_my_renewals_cannot_let_me_act() {
        let snap = queue(3);
        let lease = |name: &str, second: i64| {
            let mut l = snap.waiters["w-node-0"].lease.clone();
            l.metadata.name = Some(name.into());
            l.spec.as_mut().unwrap().acquire_time =
                Some(MicroTime(jiff::Timestamp::from_second(second).unwrap()));
            l
        };
        // Behind me (I joined at 1003): a renewal, a newcomer, a deletion.
        let mut with_later = snap.clone();
        let later = Waiter::from_lease(lease("w-later", 1_010));
        with_later.waiters.insert(later.name.clone(), later);
        assert!(behind_me(
            &with_later,
            MINE,
            "w-later",
            Some(&lease("w-later", 1_010))
        ));
        assert!(behind_me(
            &snap,
            MINE,
            "w-new",
            Some(&lease("w-new", 1_020))
        ));
        assert!(behind_me(&with_later, MINE, "w-later", None));
        // My own renewal; but not my Lease deleted or moved.
        let mut renewed = snap.waiters[MINE].lease.clone();
        renewed.metadata.resource_version = Some("99".into());
        assert!(behind_me(&snap, MINE, MINE, Some(&renewed)));
        assert!(!behind_me(&snap, MINE, MINE, None));
        assert!(!behind_me(&snap, MINE, MINE, Some(&lease(MINE, 1_000))));
        // Ahead of me, or moving ahead of me: decided on.
        assert!(!behind_me(
            &snap,
            MINE,
            "w-node-1",
            Some(&lease("w-node-1", 1_001))
        ));
        assert!(!behind_me(&snap, MINE, "w-node-1", None));
        assert!(!behind_me(
            &snap,
            MINE,
            "w-early",
            Some(&lease("w-early", 999))
        ));
        assert!(!behind_me(
            &with_later,
            MINE,
            "w-later",
            Some(&lease("w-later", 1_002))
        ));
        // Not queued myself: everything is decided on.
        assert!(!behind_me(
            &snap,
            "w-none",
            "w-new",
            Some(&lease("w-new", 1_020))
        ));
    }

    /// Waiters the arbiter judged dead (or holders) are not counted, whatever Leases remain: a
    /// queue of dead waiters never holds back the one live waiter behind it.
    #[test]
    fn waiters_the_arbiter_did_not_count_hold_nothing_back() {
        let snap = queue(FAR_BACK + 3);
        let fb = FarBack::placed(&snap, MINE, 0).unwrap();
        assert!(!fb.holds_back(&snap, &me(), MINE, 1));
        // Live waiters ahead are what count: at least max (and one) of them, in a long queue.
        let fb = FarBack::placed(&snap, MINE, 2).unwrap();
        assert!(fb.holds_back(&snap, &me(), MINE, 2));
        assert!(!fb.holds_back(&snap, &me(), MINE, 3));
        let short = queue(FAR_BACK - 1);
        let fb = FarBack::placed(&short, MINE, FAR_BACK - 1).unwrap();
        assert!(!fb.holds_back(&short, &me(), MINE, 1), "a short queue");
        assert!(FarBack::placed(&snap, "w-unknown", 3).is_none());
    }
}
