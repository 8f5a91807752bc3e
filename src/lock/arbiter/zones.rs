//! The two rules that bound holders by the fleet's shape: at most `max_per_zone` holders in one
//! zone ([`ZoneRoom`]), and `max` as a share of the nodes the store knows ([`share_of`]). Pure.
//!
//! # Zones
//!
//! A holder or waiter whose zone is unknown (written by locksmith, by a rebootd before zones,
//! or by a node whose zone could not be read) counts in **every** zone: it may be in any, so
//! counting it anywhere else could let a zone exceed its cap ([`shares`]). That is the
//! fail-closed side: an unknown zone can only make nodes wait.
//!
//! The queue stays FIFO among the waiters that could use a slot: walking it in ticket order, a
//! waiter is *eligible* when its zone has room for it beside the holders and the eligible
//! waiters ahead of it in the same zone. A waiter that is not (its zone is full) keeps its
//! ticket but is passed over: it neither counts ahead of anyone nor takes, so the waiters of
//! zones with room behind it are served; once its zone frees, it is eligible again at its old
//! place. Every waiter walks the same view the same way, so two of one zone never both go for
//! the last room of their zone.

use super::super::view::HolderView;

/// Whether something in zone `a` counts against zone `b`: the same zone, or either unknown.
pub fn shares(a: Option<&str>, b: Option<&str>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => a == b,
        _ => true,
    }
}

/// The holders that count in `zone`.
pub fn occupancy(holders: &[HolderView], zone: Option<&str>) -> usize {
    holders
        .iter()
        .filter(|h| shares(h.zone.as_deref(), zone))
        .count()
}

/// The queue walk of the zone rule: the holders, and the zones of the eligible waiters seen so
/// far. Without a cap every zone always has room.
#[derive(Debug)]
pub struct ZoneRoom<'a> {
    cap: Option<u64>,
    holders: &'a [HolderView],
    ahead: Vec<Option<&'a str>>,
}

impl<'a> ZoneRoom<'a> {
    pub fn new(cap: Option<u64>, holders: &'a [HolderView]) -> ZoneRoom<'a> {
        ZoneRoom {
            cap,
            holders,
            ahead: Vec::new(),
        }
    }

    /// Whether one more holder in `zone` stays within the cap, counting the holders and the
    /// eligible waiters seen so far ([`ZoneRoom::admit`]); `except`: leave that holder out (a
    /// slot taken over).
    pub fn has_room(&self, zone: Option<&str>, except: Option<&HolderView>) -> bool {
        let Some(cap) = self.cap else {
            return true;
        };
        let held = self
            .holders
            .iter()
            .filter(|h| except.is_none_or(|e| !std::ptr::eq(*h, e)))
            .filter(|h| shares(h.zone.as_deref(), zone))
            .count();
        let waiting = self.ahead.iter().filter(|z| shares(**z, zone)).count();
        u64::try_from(held + waiting).unwrap_or(u64::MAX) < cap
    }

    /// The next waiter in ticket order, of `zone`: eligible (counted from now on) when its
    /// zone has room.
    pub fn admit(&mut self, zone: Option<&'a str>) -> bool {
        let room = self.has_room(zone, None);
        if room {
            self.ahead.push(zone);
        }
        room
    }
}

/// `max` as `percent` of `known` nodes: rounded down (never more than the share), and at least
/// one slot (a small fleet still reboots, one node at a time).
pub fn share_of(percent: u8, known: u64) -> u64 {
    let share = u128::from(known) * u128::from(percent.min(100)) / 100;
    u64::try_from(share).unwrap_or(u64::MAX).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lock::view::Beat;

    fn holder(zone: Option<&str>) -> HolderView {
        HolderView {
            id: "h".into(),
            node: None,
            boot_id: None,
            phase: None,
            since: None,
            token: None,
            beat: Beat::Ttl,
            gone: None,
            foreign: None,
            claimed_by: None,
            zone: zone.map(Into::into),
        }
    }

    #[test]
    fn an_unknown_zone_counts_in_every_zone() {
        let holders = vec![holder(Some("a")), holder(None), holder(Some("b"))];
        assert_eq!(occupancy(&holders, Some("a")), 2);
        assert_eq!(occupancy(&holders, Some("c")), 1);
        assert_eq!(occupancy(&holders, None), 3);
        let room = ZoneRoom::new(Some(2), &holders);
        assert!(!room.has_room(Some("a"), None));
        assert!(room.has_room(Some("a"), Some(&holders[0])));
        assert!(room.has_room(Some("c"), None));
        assert!(!room.has_room(None, None));
    }

    #[test]
    fn eligible_waiters_fill_their_zone_in_ticket_order() {
        let holders = vec![holder(Some("a"))];
        let mut room = ZoneRoom::new(Some(2), &holders);
        assert!(room.admit(Some("a")));
        assert!(
            !room.admit(Some("a")),
            "zone a is full with one holder and one ahead"
        );
        assert!(room.admit(Some("b")));
        assert!(room.admit(Some("b")));
        assert!(
            !room.admit(None),
            "unknown: every zone, and a and b are full"
        );
        assert!(room.admit(Some("c")));
        let mut open = ZoneRoom::new(None, &holders);
        assert!((0..100).all(|_| open.admit(Some("a"))));
    }

    #[test]
    fn a_share_rounds_down_to_at_least_one() {
        assert_eq!(share_of(10, 100), 10);
        assert_eq!(share_of(10, 19), 1);
        assert_eq!(share_of(10, 9), 1);
        assert_eq!(share_of(10, 0), 1);
        assert_eq!(share_of(100, 7), 7);
        assert_eq!(share_of(33, 10), 3);
        assert_eq!(share_of(50, u64::MAX), u64::MAX / 2);
    }

    /// The share never exceeds `percent` of the nodes, unless that is below one; it grows with
    /// the nodes and with the percent.
    #[test]
    fn a_share_is_within_its_percent_and_monotone() {
        for percent in 1..=100u8 {
            let mut last = 0;
            for known in 0..400u64 {
                let m = share_of(percent, known);
                assert!(m >= 1);
                assert!(
                    m == 1 || m * 100 <= known * u64::from(percent),
                    "{percent}% of {known}: {m}"
                );
                assert!(
                    (m + 1) * 100 > known * u64::from(percent),
                    "not the largest: {percent}% of {known}"
                );
                assert!(m >= last);
                last = m;
                if percent > 1 {
                    assert!(m >= share_of(percent - 1, known));
                }
            }
        }
    }
}
