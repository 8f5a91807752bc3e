//! The arbiter's rules as properties, checked on a view built from arbitrary bytes: for the
//! fuzz target `arbiter` (`fuzz/fuzz_targets/arbiter.rs`) and the property test below, which
//! runs it on many pseudo-random inputs without cargo-fuzz. Compiled only for those two (tests,
//! and builds with `--cfg fuzzing`, which cargo-fuzz sets); the daemon does not carry it.

use std::time::{Duration, Instant};

use super::{decide, waiter_live, Decision, Policy, ReclaimWhy};
use crate::lock::view::{Beat, HolderView, Me, Observations, Ticket, View, WaiterView};

const ME: Me<'static> = Me {
    id: "m-me",
    node: "node-me",
    token: "t-me",
};

/// Bytes read one at a time; zeros once used up.
struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn next(&mut self) -> u8 {
        match self.0.split_first() {
            Some((b, rest)) => {
                self.0 = rest;
                *b
            }
            None => 0,
        }
    }

    fn pick<'s>(&mut self, of: &[&'s str]) -> &'s str {
        of[usize::from(self.next()) % of.len()]
    }

    /// Zones `a` and `b`, or unknown.
    fn zone(&mut self) -> Option<String> {
        match self.next() % 3 {
            0 => None,
            n => Some(if n == 1 { "a" } else { "b" }.to_owned()),
        }
    }

    fn beat(&mut self) -> Beat {
        match self.next() % 4 {
            0 => Beat::Ttl,
            1 => Beat::Silent,
            n => Beat::Revision(format!("{n}")),
        }
    }
}

/// Build a view, a policy and what one observer saw from `data`, decide, and check every rule
/// of the arbiter on the decision. Panics when one is broken.
pub fn check_bytes(data: &[u8]) {
    let case = Case::from_bytes(data);
    let d = decide(&case.view, &ME, &case.seen, &case.policy, case.now);
    assert_eq!(
        decide(&case.view, &ME, &case.seen, &case.policy, case.now),
        d,
        "not deterministic"
    );
    check_rules(&case, &Expected::of(&case), &d);
    check_holding(&case.view, &d);
    check_everyone(&case);
}

/// A holder's own calls follow the same rule of which slot is mine: the fence says held only
/// where the arbiter says held or adopt, on a slot nobody claimed; a release refuses exactly a
/// duplicate holder, and frees only slots of my node (where nodes identify hosts) or my id.
fn check_holding(view: &View, d: &Decision) {
    use crate::lock::holding;
    use crate::lock::Fence;
    let (at, fence) = holding::fence_at(view, &ME, "k");
    let claimed = at.is_some_and(|i| view.holders[i].claimed_by.is_some());
    let held_or_adopt = matches!(d, Decision::Held | Decision::Adopt { .. });
    assert_eq!(
        fence == Fence::Held,
        held_or_adopt && !claimed,
        "fence {fence:?} for {d:?}"
    );
    match holding::release(view, &ME, "k") {
        Err(_) => assert!(matches!(d, Decision::Duplicate { .. }), "refused for {d:?}"),
        Ok(freed) => {
            assert!(
                !matches!(d, Decision::Duplicate { .. }),
                "freed a duplicate's slot"
            );
            for i in freed {
                let h = &view.holders[i];
                match view.node_is_identity {
                    true => assert_eq!(h.node.as_deref(), Some(ME.node), "another node's slot"),
                    false => assert_eq!(h.id, ME.id, "another id's slot"),
                }
            }
        }
    }
}

/// One input to `decide`: a view, a policy, and what an observer saw of it at `t0` and `now`.
struct Case {
    view: View,
    policy: Policy,
    seen: Observations,
    t0: Instant,
    now: Instant,
}

impl Case {
    fn from_bytes(data: &[u8]) -> Case {
        let mut b = Bytes(data);
        let max = u64::from(b.next() % 4);
        let holders = holders(&mut b);
        let waiters = waiters(&mut b);
        let view = View {
            max,
            holders,
            waiters,
            node_is_identity: b.next().is_multiple_of(2),
            my_zone: b.zone(),
            unlisted_ahead: 0,
        };
        let policy = Policy {
            max_hold: b
                .next()
                .is_multiple_of(2)
                .then(|| Duration::from_secs(u64::from(b.next() % 4))),
            waiter_timeout: Duration::from_secs(u64::from(b.next() % 4 + 1)),
            max_per_zone: match b.next() % 4 {
                0 => None,
                n => Some(u64::from(n)),
            },
        };
        let t0 = Instant::now();
        let now = t0 + Duration::from_secs(u64::from(b.next() % 6));
        let mut seen = Observations::default();
        seen.update(&view, t0);
        seen.update(&view, now);
        Case {
            view,
            policy,
            seen,
            t0,
            now,
        }
    }
}

const IDS: [&str; 4] = ["m-me", "m-a", "m-b", "m-c"];
const NODES: [&str; 4] = ["node-me", "node-a", "node-b", "node-c"];

/// Up to four holders, each id once (a document lists each holder once).
fn holders(b: &mut Bytes) -> Vec<HolderView> {
    let mut holders: Vec<HolderView> = (0..b.next() % 5)
        .map(|_| HolderView {
            id: b.pick(&IDS).to_owned(),
            node: Some(b.pick(&NODES).to_owned()),
            boot_id: None,
            phase: None,
            token: match b.next() % 3 {
                0 => None,
                1 => Some("t-me".into()),
                _ => Some("t-other".into()),
            },
            beat: b.beat(),
            gone: b
                .next()
                .is_multiple_of(4)
                .then(|| "its Node is gone".to_owned()),
            claimed_by: b.next().is_multiple_of(5).then(|| "m-c".to_owned()),
            since: None,
            foreign: b
                .next()
                .is_multiple_of(5)
                .then(|| "a slot past max".to_owned()),
            zone: b.zone(),
        })
        .collect();
    let mut seen_ids = std::collections::HashSet::new();
    holders.retain(|h| seen_ids.insert(h.id.clone()));
    holders
}

/// Up to four waiters, mine among them or not.
fn waiters(b: &mut Bytes) -> Vec<WaiterView> {
    let mine_at = b.next() % 6;
    (0..b.next() % 5)
        .map(|i| {
            let mine = i == mine_at;
            WaiterView {
                key: format!("w{i}"),
                ticket: Ticket {
                    order: (i64::from(b.next() % 8), 0),
                    name: format!("w{i}"),
                },
                id: if mine {
                    Some(ME.id.to_owned())
                } else {
                    b.next()
                        .is_multiple_of(2)
                        .then(|| b.pick(&IDS[1..]).to_owned())
                },
                node: Some(b.pick(&NODES[1..]).to_owned()),
                beat: b.beat(),
                mine,
                zone: b.zone(),
                since: None,
            }
        })
        .collect()
}

/// What the rules say of a case, worked out here independently of `decide`.
struct Expected<'a> {
    /// The holders under my id that could be mine (not foreign, under my node where nodes are
    /// authenticated).
    by_id: Vec<&'a HolderView>,
    /// One of them has my token.
    mine: bool,
    /// A holder I may adopt: mine without a token, or by node where nodes are identity.
    adoptable: bool,
    /// Live waiters ahead of me that hold no slot and whose zone has room.
    ahead: usize,
    free: i64,
    /// My zone has room for me (beside its holders and the counted waiters ahead of me).
    room: bool,
    /// By holder id: my zone would have room with that holder out.
    room_without: std::collections::HashMap<String, bool>,
}

impl<'a> Expected<'a> {
    fn of(case: &'a Case) -> Expected<'a> {
        let view = &case.view;
        let could_be_mine: Vec<&HolderView> = view
            .holders
            .iter()
            .filter(|h| match view.node_is_identity {
                // Only my node writes under its name: foreign or not, it is mine.
                true => h.node.as_deref() == Some(ME.node),
                false => h.foreign.is_none(),
            })
            .collect();
        let by_id: Vec<&HolderView> = could_be_mine
            .iter()
            .copied()
            .filter(|h| h.id == ME.id)
            .collect();
        let mine = by_id.iter().any(|h| h.token.as_deref() == Some(ME.token));
        let adoptable = by_id.iter().any(|h| h.token.is_none())
            || (by_id.is_empty() && view.node_is_identity && !could_be_mine.is_empty());
        let my_ticket = view.my_ticket();
        let mut candidates: Vec<&WaiterView> = view
            .waiters
            .iter()
            .filter(|w| !w.mine && w.id.as_deref() != Some(ME.id))
            .filter(|w| my_ticket.is_none_or(|t| w.ticket < *t))
            .filter(|w| {
                !view.holders.iter().any(|h| {
                    w.id.as_deref() == Some(h.id.as_str())
                        || (view.node_is_identity && w.node.is_some() && w.node == h.node)
                })
            })
            .filter(|w| waiter_live(w, &case.seen, &case.policy, case.now))
            .collect();
        candidates.sort_by(|a, b| a.ticket.cmp(&b.ticket));
        // In ticket order, a waiter counts when its zone has room beside the holders and the
        // counted waiters before it; an unknown zone is in every zone.
        let cap = case.policy.max_per_zone;
        let in_zone = |z: Option<&str>, of: Option<&str>| z.is_none() || of.is_none() || z == of;
        let mut eligible: Vec<Option<&str>> = Vec::new();
        let fits = |eligible: &[Option<&str>], zone: Option<&str>, except: Option<&str>| {
            let held = view
                .holders
                .iter()
                .filter(|h| Some(h.id.as_str()) != except)
                .filter(|h| in_zone(h.zone.as_deref(), zone))
                .count();
            let queued = eligible.iter().filter(|z| in_zone(**z, zone)).count();
            cap.is_none_or(|c| ((held + queued) as u64) < c)
        };
        for w in &candidates {
            if fits(&eligible, w.zone.as_deref(), None) {
                eligible.push(w.zone.as_deref());
            }
        }
        let my_zone = view.my_zone.as_deref();
        let room = fits(&eligible, my_zone, None);
        let room_without = view
            .holders
            .iter()
            .map(|h| (h.id.clone(), fits(&eligible, my_zone, Some(&h.id))))
            .collect();
        let ahead = eligible.len();
        Expected {
            by_id,
            mine,
            adoptable,
            ahead,
            free: view.free(),
            room,
            room_without,
        }
    }
}

/// Check the decision `d` against what the rules say of the case.
fn check_rules(case: &Case, e: &Expected, d: &Decision) {
    let Case {
        view, policy, now, ..
    } = case;
    let ahead_i = i64::try_from(e.ahead).unwrap_or(i64::MAX);
    let context = || format!("{d:?} on {view:?} with {policy:?}");
    let (mine, adoptable, free) = (e.mine, e.adoptable, e.free);
    match d {
        Decision::Held => assert!(mine, "held without my id and token: {}", context()),
        Decision::Adopt { holder } => {
            assert!(!mine && adoptable, "adopted: {}", context());
            assert!(
                view.holders.iter().any(|h| &h.id == holder),
                "{}",
                context()
            );
        }
        Decision::Duplicate { token, .. } => {
            assert!(!mine && !adoptable, "duplicate: {}", context());
            assert!(
                e.by_id
                    .iter()
                    .any(|h| h.token.as_deref() == Some(token.as_str())),
                "{}",
                context()
            );
        }
        Decision::Take { rank } => {
            assert!(e.by_id.is_empty() && !adoptable, "took: {}", context());
            assert_eq!(*rank, e.ahead, "{}", context());
            assert!(
                free > ahead_i,
                "took without a slot for my place: {}",
                context()
            );
            assert!(e.room, "took in a full zone: {}", context());
        }
        Decision::Reclaim {
            holder,
            why,
            take_over,
        } => check_reclaim(case, e, (holder.as_str(), why, *take_over), &context),
        Decision::Wait { until, behind } => {
            assert!(e.by_id.is_empty() && !adoptable, "waited: {}", context());
            assert_eq!(*behind, e.ahead, "{}", context());
            assert!(
                free <= ahead_i || !e.room,
                "waited with a slot for my place and room in my zone: {}",
                context()
            );
            assert!(until.is_none_or(|u| u >= *now), "{}", context());
        }
    }
}

/// A reclaim (`holder`, why, take over): by the head of the queue, with no free slot, of a
/// holder gone or silent for `max_hold` (never of one kept by TTL).
fn check_reclaim(
    case: &Case,
    e: &Expected,
    (holder, why, take_over): (&str, &ReclaimWhy, bool),
    context: &dyn Fn() -> String,
) {
    let Case {
        view,
        policy,
        t0,
        now,
        ..
    } = case;
    assert!(
        e.by_id.is_empty() && !e.adoptable,
        "reclaimed: {}",
        context()
    );
    assert_eq!(e.ahead, 0, "reclaimed behind other waiters: {}", context());
    assert!(
        e.free <= 0 || !e.room,
        "reclaimed with a free slot and room in my zone: {}",
        context()
    );
    let h = view
        .holders
        .iter()
        .find(|h| h.id == holder)
        .unwrap_or_else(|| panic!("reclaimed no holder: {}", context()));
    match why {
        ReclaimWhy::Gone(_) => assert!(h.gone.is_some(), "{}", context()),
        ReclaimWhy::Silent { for_, max_hold } => {
            assert_eq!(policy.max_hold, Some(*max_hold), "{}", context());
            assert!(*for_ >= *max_hold, "{}", context());
            assert!(h.beat != Beat::Ttl, "a TTL-kept holder: {}", context());
            assert!(
                h.beat == Beat::Silent || *now - *t0 >= *max_hold,
                "{}",
                context()
            );
        }
    }
    assert_eq!(
        take_over,
        view.holders.len() as u64 <= view.max,
        "{}",
        context()
    );
    assert!(
        !take_over || e.room_without[holder],
        "took a slot over into a full zone: {}",
        context()
    );
}

/// Every live waiter deciding at once on the same view (a release lets them all in): the
/// slots they take, with the holders, never put more than `max` in all or `max_per_zone` in a
/// zone, where the holders were within both.
fn check_everyone(case: &Case) {
    let view = &case.view;
    let ids: Vec<Option<&str>> = view.waiters.iter().map(|w| w.id.as_deref()).collect();
    let distinct = ids.iter().all(|id| id.is_some())
        && (0..ids.len()).all(|i| !ids[i + 1..].contains(&ids[i]))
        && view.waiters.iter().all(|w| {
            !view.holders.iter().any(|h| {
                w.id.as_deref() == Some(h.id.as_str()) || w.node == h.node || h.id == ME.id
            })
        });
    if !distinct {
        return;
    }
    let zones = [Some("a"), Some("b")];
    let count = |zones_held: &[Option<&str>], z: Option<&str>| {
        zones_held
            .iter()
            .filter(|h| h.is_none() || **h == z)
            .count() as u64
    };
    let before: Vec<Option<&str>> = view.holders.iter().map(|h| h.zone.as_deref()).collect();
    let cap = case.policy.max_per_zone;
    let within =
        |held: &[Option<&str>]| cap.is_none_or(|c| zones.iter().all(|z| count(held, *z) <= c));
    if !within(&before) || before.len() as u64 > view.max {
        return;
    }
    let mut after = before.clone();
    let mut taken = 0;
    for (i, w) in view.waiters.iter().enumerate() {
        // A waiter the others count as gone may still take: the store's compare-and-swap, not
        // the rule, keeps that one apart.
        if !waiter_live(w, &case.seen, &case.policy, case.now) {
            continue;
        }
        let mut as_w = view.clone();
        for (j, x) in as_w.waiters.iter_mut().enumerate() {
            x.mine = i == j;
        }
        as_w.my_zone = w.zone.clone();
        let token = format!("t-{}", w.key);
        let me = Me {
            id: w.id.as_deref().unwrap_or_default(),
            node: w.node.as_deref().unwrap_or_default(),
            token: &token,
        };
        let mut seen = Observations::default();
        seen.update(&as_w, case.t0);
        seen.update(&as_w, case.now);
        match decide(&as_w, &me, &seen, &case.policy, case.now) {
            Decision::Take { .. } => {
                taken += 1;
                after.push(w.zone.as_deref());
            }
            Decision::Reclaim {
                holder,
                take_over: true,
                ..
            } => {
                let at = view.holders.iter().position(|h| h.id == holder);
                if let Some(at) = at {
                    after[at] = w.zone.as_deref();
                }
            }
            _ => {}
        }
    }
    assert!(
        before.len() as u64 + taken <= view.max,
        "{taken} took with {} free on {view:?}",
        view.free()
    );
    assert!(
        within(&after),
        "zones {after:?} past {cap:?} on {view:?} with {:?}",
        case.policy
    );
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_rules_hold_on_many_pseudo_random_views() {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut buf = [0u8; 48];
        for _ in 0..20_000 {
            for b in buf.iter_mut() {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                *b = x as u8;
            }
            super::check_bytes(&buf);
        }
        super::check_bytes(&[]);
    }
}
