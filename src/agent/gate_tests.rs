//! The gates (`[gates]`) in the state machine: wait before the slot, back out after it.

use super::*;
use crate::need::TriggerSource;

fn t(secs: i64) -> Timestamp {
    Timestamp::from_second(secs).unwrap()
}

fn policy(drain: bool) -> Policy {
    Policy {
        drain,
        reboot_timeout: Duration::from_secs(600),
        retry_interval: Duration::from_secs(60),
        gate_interval: Duration::from_secs(30),
        settle: None,
    }
}

/// Step through `events`, the n-th at second `at + n`.
fn run(s: &State, p: &Policy, at: i64, events: Vec<Event>) -> State {
    let mut s = s.clone();
    for (i, e) in events.into_iter().enumerate() {
        s = step(&s, e, t(at + i as i64), p).state;
    }
    s
}

fn gated(gate: &str, why: &str) -> Event {
    Event::Gated {
        gate: gate.into(),
        why: why.into(),
        hold: false,
    }
}

fn needed() -> Event {
    Event::RebootNeeded {
        need: Need::new(TriggerSource::SentinelFile, "x"),
    }
}

#[test]
fn a_closed_gate_before_the_slot_waits_and_asks_again_at_the_interval() {
    let p = policy(false);
    let s = run(
        &State::new("b", t(0)),
        &p,
        0,
        vec![needed(), gated("alerts", "1 firing alert(s)")],
    );
    assert_eq!(s.phase, Phase::RebootNeeded);
    assert!(!s.slot_held);
    let g = s.gate.clone().unwrap();
    assert_eq!(
        (g.name.as_str(), g.since, g.next_check),
        ("alerts", t(1), t(31))
    );
    assert_eq!(next_action(&s, &p), Action::Sleep { until: t(31) });
    let waiting = s.waiting_for.clone().unwrap();
    assert!(
        waiting.contains("gate \"alerts\"") && waiting.contains("1 firing"),
        "{waiting}"
    );
    // Asked again: still closed, the same gate keeps its `since`; another gate starts anew.
    let s = run(&s, &p, 31, vec![Event::RetryDue]);
    assert_eq!(next_action(&s, &p), Action::CheckWindow);
    let again = run(&s, &p, 32, vec![gated("alerts", "2 firing alert(s)")]);
    let g = again.gate.clone().unwrap();
    assert_eq!((g.since, g.why.as_str()), (t(1), "2 firing alert(s)"));
    let other = run(&s, &p, 32, vec![gated("backup", "exit status 1")]);
    assert_eq!(other.gate.unwrap().since, t(32));
    // A restart in the same boot keeps it; the gates going clears it.
    let same = run(
        &again,
        &p,
        40,
        vec![Event::Started {
            boot_id: "b".into(),
            soft_reboots: None,
        }],
    );
    assert!(same.gate.is_some());
    let s = run(&again, &p, 62, vec![Event::RetryDue, Event::WindowOpen]);
    assert_eq!(s.phase, Phase::AcquiringSlot);
    assert_eq!(s.gate, None);
}

#[test]
fn a_gate_closing_before_the_cordon_releases_the_slot_at_once() {
    let p = policy(true);
    let s = run(
        &State::new("b", t(0)),
        &p,
        0,
        vec![needed(), Event::WindowOpen, Event::SlotAcquired],
    );
    assert_eq!(next_action(&s, &p), Action::RecordCordon);
    let s = run(&s, &p, 10, vec![gated("alerts", "NodeDown")]);
    assert_eq!(s.phase, Phase::Releasing);
    assert_eq!(next_action(&s, &p), Action::ReleaseSlot, "not delayed");
    let s = run(&s, &p, 11, vec![Event::Released]);
    assert_eq!(s.phase, Phase::RebootNeeded);
    assert!(!s.slot_held && !s.cordon_recorded);
    assert_eq!(
        s.reason.as_ref().map(|r| r.detail.as_str()),
        Some("x"),
        "still needed"
    );
    assert!(s.waiting_for.as_deref().unwrap().contains("alerts"));
    assert_eq!(next_action(&s, &p), Action::Sleep { until: t(40) });
    assert_eq!(s.last_error, None, "a closed gate is no error");
}

#[test]
fn a_gate_closing_before_the_logind_call_uncordons_what_rebootd_cordoned_and_releases() {
    let p = policy(true);
    let drained = |by_us| {
        run(
            &State::new("b", t(0)),
            &p,
            0,
            vec![
                needed(),
                Event::WindowOpen,
                Event::SlotAcquired,
                Event::Cordoned { by_us },
                Event::Drained,
            ],
        )
    };
    let s = drained(true);
    assert_eq!(next_action(&s, &p), Action::PrepareReboot);
    let s = run(&s, &p, 10, vec![gated("backup", "exit status 1")]);
    assert_eq!(s.phase, Phase::Uncordoning);
    assert_eq!(s.reboot, None);
    let s = run(&s, &p, 11, vec![Event::Uncordoned, Event::Released]);
    assert_eq!(s.phase, Phase::RebootNeeded);
    assert!(!s.slot_held && !s.cordoned_by_us);
    assert_eq!(s.gate.as_ref().unwrap().name, "backup");
    assert!(matches!(next_action(&s, &p), Action::Sleep { .. }));
    // Cordoned by someone else: left so; released.
    let s = run(
        &drained(false),
        &p,
        10,
        vec![gated("backup", "exit status 1")],
    );
    assert_eq!(s.phase, Phase::Releasing);
    // Without a drain the same holds right before logind is asked.
    let p = policy(false);
    let s = run(
        &State::new("b", t(0)),
        &p,
        0,
        vec![needed(), Event::WindowOpen, Event::SlotAcquired],
    );
    assert_eq!(next_action(&s, &p), Action::PrepareReboot);
    let s = run(&s, &p, 5, vec![gated("backup", "exit status 1")]);
    assert_eq!(s.phase, Phase::Releasing);
}

#[test]
fn the_gate_is_forgotten_once_the_checks_after_it_run_or_the_host_rebooted() {
    let p = policy(true);
    let s = run(
        &State::new("b", t(0)),
        &p,
        0,
        vec![needed(), gated("alerts", "x")],
    );
    for e in [
        Event::Blocked {
            pods: vec!["db/0".into()],
        },
        Event::WindowClosed { next_open: None },
        Event::Started {
            boot_id: "b2".into(),
            soft_reboots: None,
        },
    ] {
        let after = run(&s, &p, 5, vec![e.clone()]);
        assert_eq!(after.gate, None, "{e:?}");
    }
}

#[test]
fn a_node_gate_holds_the_slot_and_asks_again_in_place() {
    let p = policy(true);
    let s = run(
        &State::new("b", t(0)),
        &p,
        0,
        vec![needed(), Event::WindowOpen, Event::SlotAcquired],
    );
    let hold = |why: &str| Event::Gated {
        gate: "fluo".into(),
        why: why.into(),
        hold: true,
    };
    // Before the cordon: the slot is kept, the same action comes again after the interval.
    let s = run(&s, &p, 10, vec![hold("annotations a.io/x to be \"true\"")]);
    assert_eq!(s.phase, Phase::Draining);
    assert!(s.slot_held && !s.cordon_recorded);
    assert_eq!(next_action(&s, &p), Action::Sleep { until: t(40) });
    assert!(s.waiting_for.as_deref().unwrap().contains("fluo"));
    assert_eq!(s.last_error, None);
    let s = run(&s, &p, 40, vec![Event::RetryDue]);
    assert_eq!(next_action(&s, &p), Action::RecordCordon);
    assert_eq!(s.gate.as_ref().unwrap().since, t(10), "still shown");
    // Right before logind, likewise.
    let s = run(
        &s,
        &p,
        41,
        vec![Event::Cordoned { by_us: true }, Event::Drained],
    );
    assert_eq!(s.gate, None, "went before the cordon");
    let s = run(&s, &p, 50, vec![hold("x")]);
    assert_eq!(s.phase, Phase::Rebooting);
    assert!(s.slot_held && s.cordoned_by_us);
    let s = run(&s, &p, 80, vec![Event::RetryDue]);
    assert_eq!(next_action(&s, &p), Action::PrepareReboot);
}

/// After the boot, in `waiting_for_healthy`.
fn back(p: &Policy) -> State {
    let s = run(
        &State::new("b1", t(0)),
        p,
        0,
        vec![
            needed(),
            Event::WindowOpen,
            Event::SlotAcquired,
            Event::Cordoned { by_us: true },
            Event::Drained,
            Event::ReadyToReboot(RebootPlan::default()),
            Event::RebootAccepted,
            Event::Started {
                boot_id: "b2".into(),
                soft_reboots: None,
            },
        ],
    );
    assert_eq!(s.phase, Phase::WaitingForHealthy);
    s
}

#[test]
fn a_check_after_the_boot_holds_the_slot_and_the_cordon_until_it_goes() {
    let p = policy(true);
    let s = run(&back(&p), &p, 100, vec![gated("csi", "pods not Ready")]);
    assert_eq!(s.phase, Phase::WaitingForHealthy);
    assert!(s.slot_held && s.cordoned_by_us);
    assert_eq!(next_action(&s, &p), Action::Sleep { until: t(130) });
    assert!(s.waiting_for.as_deref().unwrap().contains("csi"));
    let s = run(&s, &p, 130, vec![Event::RetryDue]);
    assert_eq!(next_action(&s, &p), Action::WaitHealthy);
    let s = run(&s, &p, 131, vec![Event::Healthy]);
    assert_eq!(s.phase, Phase::Uncordoning);
    assert_eq!(s.gate, None);
}

#[test]
fn the_settle_time_holds_the_slot_after_the_uncordon_then_releases() {
    let p = Policy {
        settle: Some(Duration::from_secs(300)),
        ..policy(true)
    };
    let s = run(&back(&p), &p, 100, vec![Event::Healthy, Event::Uncordoned]);
    assert_eq!(s.phase, Phase::Releasing);
    assert_eq!(s.settle_until, Some(t(400)));
    assert_eq!(next_action(&s, &p), Action::Sleep { until: t(400) });
    assert!(s.waiting_for.as_deref().unwrap().contains("settle"));
    // A restart in the same boot keeps waiting it out.
    let s = run(
        &s,
        &p,
        200,
        vec![Event::Started {
            boot_id: "b2".into(),
            soft_reboots: None,
        }],
    );
    assert_eq!(next_action(&s, &p), Action::Sleep { until: t(400) });
    let s = run(&s, &p, 400, vec![Event::RetryDue]);
    assert_eq!(next_action(&s, &p), Action::ReleaseSlot);
    let s = run(&s, &p, 401, vec![Event::Released]);
    assert_eq!(s.phase, Phase::Idle);
    // Backing out before a reboot releases at once, without settling.
    let s = run(
        &State::new("b", t(0)),
        &p,
        0,
        vec![needed(), Event::WindowOpen, Event::SlotAcquired],
    );
    let s = run(&s, &p, 5, vec![gated("alerts", "x")]);
    assert_eq!(next_action(&s, &p), Action::ReleaseSlot);
}
