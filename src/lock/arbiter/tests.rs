//! Table tests of the arbiter: each row a view, who asks, what was observed, and the decision.

use super::*;
use crate::lock::view::{test_support, WaiterView};

pub(super) const ME: Me<'static> = Me {
    id: "m-me",
    node: "node-me",
    token: "t-me",
};

pub(super) fn s(secs: u64) -> Duration {
    Duration::from_secs(secs)
}

pub(super) fn holder(id: &str, token: Option<&str>, beat: &str) -> HolderView {
    HolderView {
        node: Some(format!("node-{id}")),
        token: token.map(Into::into),
        beat: match beat {
            "silent" => Beat::Silent,
            "ttl" => Beat::Ttl,
            rev => Beat::Revision(rev.into()),
        },
        ..test_support::holder(id)
    }
}

pub(super) fn waiter(key: &str, order: i64, beat: Beat, mine: bool) -> WaiterView {
    WaiterView {
        id: Some(key.into()),
        beat,
        mine,
        ..test_support::waiter(key, order)
    }
}

pub(super) use crate::lock::view::test_support::view;

pub(super) fn policy(max_hold: Option<u64>) -> Policy {
    Policy {
        max_hold: max_hold.map(s),
        waiter_timeout: s(30),
        max_per_zone: None,
    }
}

/// Decide on `v` after observing it once at `t0` and again (unchanged) `after` later.
pub(super) fn after(v: &View, p: Policy, after: Duration) -> Decision {
    let t0 = Instant::now();
    let mut o = Observations::default();
    o.update(v, t0);
    o.update(v, t0 + after);
    decide(v, &ME, &o, &p, t0 + after)
}

pub(super) fn at_once(v: &View, p: Policy) -> Decision {
    after(v, p, Duration::ZERO)
}

#[test]
fn mine_held_adopted_or_duplicate() {
    let rows: Vec<(&str, View, Decision)> = vec![
        (
            "my id and token",
            view(1, vec![holder("m-me", Some("t-me"), "3")], vec![]),
            Decision::Held,
        ),
        (
            "my id, no token (locksmith, older rebootd, by hand)",
            view(1, vec![holder("m-me", None, "silent")], vec![]),
            Decision::Adopt {
                holder: "m-me".into(),
            },
        ),
        (
            "my id, another token: another host with my machine id",
            view(2, vec![holder("m-me", Some("t-other"), "3")], vec![]),
            Decision::Duplicate {
                holder: "m-me".into(),
                token: "t-other".into(),
            },
        ),
        (
            "my node name where node names are ids: reinstalled",
            View {
                node_is_identity: true,
                ..view(
                    1,
                    vec![HolderView {
                        node: Some("node-me".into()),
                        ..holder("m-old", Some("t-old"), "3")
                    }],
                    vec![],
                )
            },
            Decision::Adopt {
                holder: "m-old".into(),
            },
        ),
        (
            "my node name where it is not an id: someone else",
            view(
                1,
                vec![HolderView {
                    node: Some("node-me".into()),
                    ..holder("m-old", Some("t-old"), "3")
                }],
                vec![],
            ),
            Decision::Wait {
                until: None,
                behind: 0,
            },
        ),
        (
            "my id and no token under another node where nodes are authenticated: a forgery",
            View {
                node_is_identity: true,
                ..view(1, vec![holder("m-me", None, "3")], vec![])
            },
            Decision::Wait {
                until: None,
                behind: 0,
            },
        ),
        (
            "my id and my token under another node where nodes are authenticated: a forgery",
            View {
                node_is_identity: true,
                ..view(2, vec![holder("m-me", Some("t-me"), "3")], vec![])
            },
            Decision::Take { rank: 0 },
        ),
        (
            "my id and token on a foreign slot (past max): counted, never mine",
            view(
                2,
                vec![HolderView {
                    foreign: Some("slot 7 is past max 2".into()),
                    ..holder("m-me", Some("t-me"), "3")
                }],
                vec![],
            ),
            Decision::Take { rank: 0 },
        ),
        (
            "my node on a foreign slot where nodes are authenticated (past a forced-down max): mine",
            View {
                node_is_identity: true,
                ..view(
                    1,
                    vec![HolderView {
                        node: Some("node-me".into()),
                        foreign: Some("no role label".into()),
                        ..holder("m-me", Some("t-me"), "3")
                    }],
                    vec![],
                )
            },
            Decision::Held,
        ),
    ];
    for (what, v, want) in rows {
        assert_eq!(at_once(&v, policy(None)), want, "{what}");
    }
}

#[test]
fn take_only_what_my_place_in_the_queue_allows() {
    let live = |k: &str, o: i64| waiter(k, o, Beat::Ttl, false);
    let rows: Vec<(&str, View, Decision)> = vec![
        (
            "empty semaphore",
            view(1, vec![], vec![]),
            Decision::Take { rank: 0 },
        ),
        (
            "full",
            view(1, vec![holder("a", Some("ta"), "1")], vec![]),
            Decision::Wait {
                until: None,
                behind: 0,
            },
        ),
        (
            "one free, one waiter ahead (not queued myself: all are ahead)",
            view(2, vec![holder("a", Some("ta"), "1")], vec![live("w1", 5)]),
            Decision::Wait {
                until: None,
                behind: 1,
            },
        ),
        (
            "two free, one ahead: the second free slot",
            view(3, vec![holder("a", Some("ta"), "1")], vec![live("w1", 5)]),
            Decision::Take { rank: 1 },
        ),
        (
            "queued: only those with a smaller ticket are ahead",
            view(
                2,
                vec![holder("a", Some("ta"), "1")],
                vec![
                    live("w1", 5),
                    waiter("m-me", 7, Beat::Ttl, true),
                    live("w3", 9),
                ],
            ),
            Decision::Wait {
                until: None,
                behind: 1,
            },
        ),
        (
            "first in the queue with a free slot",
            view(
                2,
                vec![holder("a", Some("ta"), "1")],
                vec![waiter("m-me", 7, Beat::Ttl, true), live("w3", 9)],
            ),
            Decision::Take { rank: 0 },
        ),
        (
            "a holder's left-over entry does not count",
            view(2, vec![holder("a", Some("ta"), "1")], vec![live("a", 1)]),
            Decision::Take { rank: 0 },
        ),
        (
            "300 counted, not listed, and 300 free: all ahead of me",
            View {
                unlisted_ahead: 300,
                ..view(301, vec![holder("a", Some("ta"), "1")], vec![])
            },
            Decision::Wait {
                until: None,
                behind: 300,
            },
        ),
        (
            "one listed and 300 counted ahead, 302 free: the 302nd",
            View {
                unlisted_ahead: 300,
                ..view(303, vec![holder("a", Some("ta"), "1")], vec![live("w1", 5)])
            },
            Decision::Take { rank: 301 },
        ),
        (
            "max forced below the holders: nothing free",
            view(
                1,
                vec![holder("a", Some("ta"), "1"), holder("b", Some("tb"), "1")],
                vec![],
            ),
            Decision::Wait {
                until: None,
                behind: 0,
            },
        ),
        (
            "max 0",
            view(0, vec![], vec![]),
            Decision::Wait {
                until: None,
                behind: 0,
            },
        ),
    ];
    for (what, v, want) in rows {
        assert_eq!(at_once(&v, policy(None)), want, "{what}");
    }
}

#[test]
fn waiters_that_stopped_beating_lose_their_place() {
    let v = view(
        2,
        vec![holder("a", Some("ta"), "1")],
        vec![waiter("w1", 1, Beat::Revision("40".into()), false)],
    );
    assert_eq!(
        ignoring_until(after(&v, policy(None), s(29))),
        Decision::Wait {
            until: None,
            behind: 1
        },
        "alive for 29 s"
    );
    assert_eq!(after(&v, policy(None), s(30)), Decision::Take { rank: 0 });
}

impl Decision {
    /// The same decision with `until` dropped, for rows whose instant depends on the test's
    /// clock.
    fn with_until_ignored(self) -> Decision {
        match self {
            Decision::Wait { behind, .. } => Decision::Wait {
                until: None,
                behind,
            },
            other => other,
        }
    }
}

fn ignoring_until(d: Decision) -> Decision {
    d.with_until_ignored()
}

#[test]
fn a_waiter_ahead_wakes_me_when_it_would_time_out() {
    let t0 = Instant::now();
    let v = view(
        2,
        vec![holder("a", Some("ta"), "1")],
        vec![waiter("w1", 1, Beat::Revision("40".into()), false)],
    );
    let mut o = Observations::default();
    o.update(&v, t0);
    o.update(&v, t0 + s(10));
    assert_eq!(
        decide(&v, &ME, &o, &policy(None), t0 + s(10)),
        Decision::Wait {
            until: Some(t0 + s(30)),
            behind: 1
        }
    );
}

#[test]
fn reclaim_only_silent_or_gone_holders_and_only_as_head() {
    let p = policy(Some(100));
    let full = view(1, vec![holder("a", Some("ta"), "7")], vec![]);
    assert_eq!(
        ignoring_until(after(&full, p, s(99))),
        Decision::Wait {
            until: None,
            behind: 0
        },
        "99 s of silence is not 100"
    );
    assert_eq!(
        after(&full, p, s(100)),
        Decision::Reclaim {
            holder: "a".into(),
            why: ReclaimWhy::Silent {
                for_: s(100),
                max_hold: s(100)
            },
            take_over: true
        }
    );
    assert_eq!(
        ignoring_until(after(&full, policy(None), s(100_000))),
        Decision::Wait {
            until: None,
            behind: 0
        },
        "never without max_hold"
    );
    // A holder whose record the store keeps alive by TTL is never silent.
    let ttl = view(1, vec![holder("a", Some("ta"), "ttl")], vec![]);
    assert_eq!(
        after(&ttl, p, s(100_000)),
        Decision::Wait {
            until: None,
            behind: 0
        }
    );
    // Not the head: someone else ahead of me reclaims, not me.
    let queued = view(
        1,
        vec![holder("a", Some("ta"), "7")],
        vec![waiter("w1", 1, Beat::Ttl, false)],
    );
    assert_eq!(
        after(&queued, p, s(500)),
        Decision::Wait {
            until: None,
            behind: 1
        }
    );
    // Nor with waiters counted ahead of me, not listed.
    let counted = View {
        unlisted_ahead: 3,
        ..full.clone()
    };
    assert_eq!(
        after(&counted, p, s(500)),
        Decision::Wait {
            until: None,
            behind: 3
        }
    );
    // Gone holders go first, even without max_hold.
    let mut gone = view(
        2,
        vec![holder("a", Some("ta"), "7"), holder("b", Some("tb"), "8")],
        vec![],
    );
    gone.holders[1].gone = Some("its Node was deleted".into());
    assert_eq!(
        after(&gone, p, s(500)),
        Decision::Reclaim {
            holder: "b".into(),
            why: ReclaimWhy::Gone("its Node was deleted".into()),
            take_over: true
        }
    );
    // Holders above max: free the slot, do not take it over.
    let shrunk = view(
        1,
        vec![holder("a", Some("ta"), "7"), holder("b", Some("tb"), "8")],
        vec![],
    );
    assert!(matches!(
        after(&shrunk, p, s(100)),
        Decision::Reclaim {
            take_over: false,
            ..
        }
    ));
}

#[test]
fn a_holder_that_beats_is_never_reclaimed_whatever_its_clock_says() {
    // The beat is a store revision; no time written by the holder is read. A holder that
    // beats every 30 s stays, one that stops is reclaimed max_hold after its last beat.
    let p = policy(Some(100));
    let t0 = Instant::now();
    let mut o = Observations::default();
    let mut v = view(1, vec![holder("a", Some("ta"), "1")], vec![]);
    for i in 0..20u64 {
        v.holders[0].beat = Beat::Revision(format!("{}", i + 1));
        let now = t0 + s(30 * i);
        o.update(&v, now);
        assert!(
            matches!(decide(&v, &ME, &o, &p, now), Decision::Wait { .. }),
            "beat {i}"
        );
    }
    let last = t0 + s(30 * 19);
    o.update(&v, last + s(99));
    assert_eq!(
        decide(&v, &ME, &o, &p, last + s(99)),
        Decision::Wait {
            until: Some(last + s(100)),
            behind: 0
        }
    );
    o.update(&v, last + s(100));
    assert!(matches!(
        decide(&v, &ME, &o, &p, last + s(100)),
        Decision::Reclaim { .. }
    ));
}

#[test]
fn dead_waiters_are_those_silent_for_a_multiple_of_the_timeout() {
    let v = view(
        1,
        vec![],
        vec![
            waiter("w1", 1, Beat::Revision("3".into()), false),
            waiter("w2", 2, Beat::Ttl, false),
            waiter("m-me", 3, Beat::Revision("4".into()), true),
        ],
    );
    let t0 = Instant::now();
    let mut o = Observations::default();
    o.update(&v, t0);
    let p = policy(None);
    assert!(dead_waiters(&v, &o, &p, 2, t0 + s(59)).is_empty());
    let dead: Vec<&str> = dead_waiters(&v, &o, &p, 2, t0 + s(60))
        .iter()
        .map(|w| w.key.as_str())
        .collect();
    assert_eq!(dead, vec!["w1"]);
}

#[test]
fn a_holder_kept_by_ttl_is_never_reclaimed_for_silence_even_with_max_hold_zero() {
    // Found by the property test (props.rs): silence 0 >= max_hold 0 reclaimed a live holder.
    let v = view(1, vec![holder("m-a", Some("t-a"), "ttl")], vec![]);
    assert_eq!(
        after(&v, policy(Some(0)), s(60)),
        Decision::Wait {
            until: None,
            behind: 0
        }
    );
}
