//! Table tests of the arbiter's zone rule (`max_per_zone`), on the table tests' helpers.

use super::tests::{at_once, holder, policy, view, waiter};
use super::*;

/// `max_per_zone`: my zone's holders and the waiters ahead of me that will fill it keep me
/// waiting; waiters of a full zone are passed over; an unknown zone counts in every zone.
#[test]
fn zones_cap_holders_and_pass_over_full_zones() {
    let zoned = |id: &str, zone: Option<&str>| HolderView {
        zone: zone.map(Into::into),
        ..holder(id, Some("t"), "3")
    };
    let queued = |key: &str, order: i64, zone: Option<&str>| WaiterView {
        zone: zone.map(Into::into),
        ..waiter(key, order, Beat::Ttl, false)
    };
    let me_in = |zone: Option<&str>, v: View| View {
        my_zone: zone.map(Into::into),
        ..v
    };
    let mine = |order: i64| waiter("m-me", order, Beat::Ttl, true);
    let cap = |n: u64| Policy {
        max_per_zone: Some(n),
        ..policy(None)
    };
    let wait = |behind| Decision::Wait {
        until: None,
        behind,
    };
    let rows: Vec<(&str, View, Policy, Decision)> = vec![
        (
            "my zone holds its cap: wait, whatever the free slots",
            me_in(
                Some("a"),
                view(5, vec![zoned("m-a", Some("a"))], vec![mine(1)]),
            ),
            cap(1),
            wait(0),
        ),
        (
            "another zone's holder: take",
            me_in(
                Some("a"),
                view(5, vec![zoned("m-b", Some("b"))], vec![mine(1)]),
            ),
            cap(1),
            Decision::Take { rank: 0 },
        ),
        (
            "a waiter ahead in a full zone is passed over",
            me_in(
                Some("b"),
                view(
                    2,
                    vec![zoned("m-a", Some("a"))],
                    vec![queued("w-a", 1, Some("a")), mine(2)],
                ),
            ),
            cap(1),
            Decision::Take { rank: 0 },
        ),
        (
            "a waiter ahead that will fill my zone's last room keeps me waiting",
            me_in(
                Some("a"),
                view(3, vec![], vec![queued("w-a", 1, Some("a")), mine(2)]),
            ),
            cap(1),
            wait(1),
        ),
        (
            "room for both: the second of a zone takes the second free slot",
            me_in(
                Some("a"),
                view(3, vec![], vec![queued("w-a", 1, Some("a")), mine(2)]),
            ),
            cap(2),
            Decision::Take { rank: 1 },
        ),
        (
            "a holder of unknown zone (locksmith, older rebootd) counts in mine",
            me_in(Some("a"), view(5, vec![zoned("m-x", None)], vec![mine(1)])),
            cap(1),
            wait(0),
        ),
        (
            "my zone unknown: I share one with every holder",
            me_in(None, view(5, vec![zoned("m-b", Some("b"))], vec![mine(1)])),
            cap(1),
            wait(0),
        ),
        (
            "no cap: zones do not matter",
            me_in(
                Some("a"),
                view(5, vec![zoned("m-a", Some("a"))], vec![mine(1)]),
            ),
            policy(None),
            Decision::Take { rank: 0 },
        ),
    ];
    for (what, v, p, want) in rows {
        assert_eq!(at_once(&v, p), want, "{what}");
    }
}

/// The head takes a gone holder's slot over only when its zone has room once that holder is
/// out: a gone holder of my zone, yes; another zone's while mine is full, no (a waiter of a
/// zone with room, behind me, does it).
#[test]
fn a_reclaim_into_a_full_zone_is_left_to_a_waiter_it_fits() {
    let gone = |id: &str, zone: &str| HolderView {
        zone: Some(zone.into()),
        gone: Some("its Node is gone".into()),
        ..holder(id, Some("t"), "3")
    };
    let live = |id: &str, zone: &str| HolderView {
        zone: Some(zone.into()),
        ..holder(id, Some("t"), "3")
    };
    let p = Policy {
        max_per_zone: Some(1),
        ..policy(None)
    };
    let mine = waiter("m-me", 2, Beat::Ttl, true);
    let v = View {
        my_zone: Some("a".into()),
        ..view(
            2,
            vec![live("m-a", "a"), gone("m-b", "b")],
            vec![mine.clone()],
        )
    };
    assert_eq!(
        at_once(&v, p),
        Decision::Wait {
            until: None,
            behind: 0
        }
    );
    let v = View {
        my_zone: Some("a".into()),
        ..view(2, vec![gone("m-a", "a"), live("m-b", "b")], vec![mine])
    };
    assert!(matches!(
        at_once(&v, p),
        Decision::Reclaim {
            take_over: true,
            ..
        }
    ));
    let behind_me = WaiterView {
        zone: Some("c".into()),
        ..waiter("w-c", 3, Beat::Ttl, true)
    };
    let ahead = WaiterView {
        zone: Some("a".into()),
        ..waiter("m-me", 2, Beat::Ttl, false)
    };
    let v = View {
        my_zone: Some("c".into()),
        ..view(
            2,
            vec![live("m-a", "a"), gone("m-b", "b")],
            vec![ahead, behind_me],
        )
    };
    let as_c = Me {
        id: "w-c",
        node: "node-c",
        token: "t-c",
    };
    let t0 = Instant::now();
    let mut o = Observations::default();
    o.update(&v, t0);
    assert!(matches!(
        decide(&v, &as_c, &o, &p, t0),
        Decision::Reclaim {
            take_over: true,
            ..
        }
    ));
}

/// A dead holder in my full zone is taken over although the group has free slots: they cannot
/// serve my zone, and it would hold my zone up until it came back.
#[test]
fn a_dead_holder_of_my_full_zone_is_reclaimed_beside_free_slots() {
    let v = View {
        my_zone: Some("a".into()),
        ..view(
            3,
            vec![HolderView {
                zone: Some("a".into()),
                gone: Some("its Node is gone".into()),
                ..holder("m-a", Some("t"), "3")
            }],
            vec![waiter("m-me", 1, Beat::Ttl, true)],
        )
    };
    let p = Policy {
        max_per_zone: Some(1),
        ..policy(None)
    };
    assert_eq!(
        at_once(&v, p),
        Decision::Reclaim {
            holder: "m-a".into(),
            why: ReclaimWhy::Gone("its Node is gone".into()),
            take_over: true,
        }
    );
}
