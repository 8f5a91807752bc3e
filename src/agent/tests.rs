//! The state machine event by event: a whole cycle, restarts, windows, blockers, drains, lost
//! slots, reboots, pauses and cancels, the phase check, and random walks over all of them.

use super::*;
use crate::need::TriggerSource;

fn policy() -> Policy {
    Policy {
        gate_interval: Duration::from_secs(30),
        settle: None,
        drain: false,
        reboot_timeout: Duration::from_secs(600),
        retry_interval: Duration::from_secs(60),
    }
}

fn t(secs: i64) -> Timestamp {
    Timestamp::from_second(secs).unwrap()
}

fn needed() -> Event {
    Event::RebootNeeded {
        need: Need::new(TriggerSource::SentinelFile, "x"),
    }
}

/// The start of rebootd in boot `boot_id` (no soft reboot count).
fn started(boot_id: &str) -> Event {
    Event::Started {
        boot_id: boot_id.into(),
        soft_reboots: None,
    }
}

/// A drain that failed on a PodDisruptionBudget, with `drain_failure = "reboot"` or not.
fn drain_failed(reboot_anyway: bool) -> Event {
    Event::DrainFailed {
        error: "pdb".into(),
        reboot_anyway,
    }
}

/// The events up to logind's call (a need, the window, the slot, the request on record), then
/// `more`.
fn asked(more: Vec<Event>) -> Vec<Event> {
    let mut events = vec![
        needed(),
        Event::WindowOpen,
        Event::SlotAcquired,
        Event::ReadyToReboot(RebootPlan::default()),
    ];
    events.extend(more);
    events
}

fn run(s: &State, events: Vec<Event>) -> State {
    let mut s = s.clone();
    for (i, e) in events.into_iter().enumerate() {
        s = step(&s, e, t(i as i64), &policy()).state;
    }
    s
}

#[test]
fn full_cycle_without_drain() {
    let s = State::new("boot1", t(0));
    assert_eq!(next_action(&s, &policy()), Action::WaitForTrigger);
    let s = run(
        &s,
        vec![
            Event::RebootNeeded {
                need: Need::new(TriggerSource::UpdateEngine, "NEED_REBOOT"),
            },
            Event::WindowOpen,
            Event::SlotAcquired,
        ],
    );
    assert_eq!(s.phase, Phase::Rebooting);
    assert!(s.slot_held);
    assert_eq!(next_action(&s, &policy()), Action::PrepareReboot);
    let s = run(&s, vec![Event::ReadyToReboot(RebootPlan::default())]);
    assert_eq!(next_action(&s, &policy()), Action::CallReboot);
    let s = run(&s, vec![Event::RebootAccepted]);
    assert!(matches!(
        next_action(&s, &policy()),
        Action::AwaitReboot { .. }
    ));
    // The next boot.
    let s = run(&s, vec![started("boot2")]);
    assert_eq!(s.phase, Phase::WaitingForHealthy);
    assert_eq!(s.reason, None);
    assert_eq!(s.reboots, 1);
    let s = run(&s, vec![Event::Healthy]);
    assert_eq!(next_action(&s, &policy()), Action::ReleaseSlot);
    let s = run(&s, vec![Event::Released]);
    assert_eq!(s.phase, Phase::Idle);
    assert!(!s.slot_held);
    assert!(s.last_reboot.is_some());
}

#[test]
fn restart_in_same_boot_is_not_a_reboot_and_asks_again_at_once() {
    let s = run(&State::new("boot1", t(0)), asked(vec![]));
    // Crash after the marker was written, maybe before logind was called.
    let s = run(&s, vec![started("boot1")]);
    assert_eq!(s.phase, Phase::Rebooting);
    assert_eq!(s.last_reboot, None, "not counted as a reboot");
    assert_eq!(s.failed_attempts, 1);
    assert!(s
        .last_error
        .as_deref()
        .unwrap()
        .contains("had not happened"));
    // No wait for the timeout: window and blockers again, then ask again.
    assert_eq!(next_action(&s, &policy()), Action::PrepareReboot);
    // An accepted reboot that does not happen in the same process is bounded too.
    let s = run(
        &s,
        vec![
            Event::ReadyToReboot(RebootPlan::default()),
            Event::RebootAccepted,
        ],
    );
    assert!(matches!(
        next_action(&s, &policy()),
        Action::AwaitReboot { .. }
    ));
    let s = run(&s, vec![Event::RebootTimedOut]);
    assert_eq!(s.failed_attempts, 2);
    assert!(s.last_error.as_deref().unwrap().contains("did not happen"));
    assert_eq!(next_action(&s, &policy()), Action::PrepareReboot);
}

/// Found by chaos seed 10306: killed while logind's shutdown was pending, restarted in the
/// same boot (the request is put aside to be asked again), then the pending shutdown came
/// before the new request: that reboot is rebootd's, counted, not "outside its control".
#[test]
fn a_pending_reboot_that_lands_after_a_restart_is_ours() {
    let s = run(
        &State::new("boot1", t(0)),
        asked(vec![Event::RebootAccepted, started("boot1")]),
    );
    assert_eq!(s.reboot, None);
    assert_eq!(next_action(&s, &policy()), Action::PrepareReboot);
    let s = run(&s, vec![started("boot2")]);
    assert_eq!(s.phase, Phase::WaitingForHealthy);
    assert_eq!(s.reboots, 1, "counted as rebootd's reboot");
    assert_eq!(s.failed_attempts, 0);
    let s = run(&s, vec![Event::Healthy, Event::Released]);
    assert_eq!(s.phase, Phase::Idle);

    // Not after a cycle that ended without a reboot: failed attempts start again from 0.
    let s = run(
        &State::new("boot1", t(0)),
        asked(vec![Event::RebootAccepted, Event::RebootTimedOut]),
    );
    assert_eq!(s.failed_attempts, 1);
}

#[test]
fn refused_reboot_backs_off_then_retries() {
    let s = run(
        &State::new("b", t(0)),
        asked(vec![Event::RebootRefused {
            error: "blocked by inhibitor of backup".into(),
        }]),
    );
    assert!(matches!(next_action(&s, &policy()), Action::Sleep { .. }));
    assert!(s.last_error.as_deref().unwrap().contains("backup"));
    let s = run(&s, vec![Event::RetryDue]);
    assert_eq!(next_action(&s, &policy()), Action::PrepareReboot);
}

/// A reboot call with no answer (logind or the bus went away first) may have been accepted:
/// the request stays on record, the host is given the time-out, the boot that follows is
/// rebootd's, and it cannot be cancelled meanwhile.
#[test]
fn an_unanswered_reboot_call_is_taken_as_accepted() {
    let s = run(
        &State::new("boot1", t(0)),
        asked(vec![Event::RebootUnanswered {
            error: "NoReply".into(),
        }]),
    );
    assert!(s.reboot.as_ref().is_some_and(|r| r.called), "{s:?}");
    assert!(s.logind_asked());
    assert!(s
        .last_error
        .as_deref()
        .unwrap()
        .contains("may have accepted"));
    assert!(matches!(
        next_action(&s, &policy()),
        Action::AwaitReboot { .. }
    ));
    let rebooted = run(&s, vec![started("boot2")]);
    assert_eq!(rebooted.phase, Phase::WaitingForHealthy);
    assert_eq!(rebooted.reboots, 1, "counted as rebootd's reboot");
    // It did not happen: asked again after the time-out, as an accepted one would be.
    let s = run(&s, vec![Event::RebootTimedOut]);
    assert_eq!(s.failed_attempts, 1);
    assert_eq!(next_action(&s, &policy()), Action::PrepareReboot);
}

fn inhibitor(who: &str, uid: u32) -> Inhibitor {
    Inhibitor {
        what: "shutdown".into(),
        who: who.into(),
        why: "nightly dump".into(),
        mode: "block".into(),
        uid,
        pid: 42,
    }
}

#[test]
fn block_inhibitors_hold_the_call_until_released_then_everything_is_checked_again() {
    let s = run(&State::new("b", t(0)), asked(vec![]));
    assert_eq!(next_action(&s, &policy()), Action::CallReboot);
    let held = vec![inhibitor("backup", 0)];
    let s = run(&s, vec![Event::Inhibited { by: held.clone() }]);
    assert_eq!(s.phase, Phase::Rebooting);
    assert!(s.slot_held);
    assert_eq!(s.reboot, None, "logind was not asked");
    assert_eq!(
        next_action(&s, &policy()),
        Action::AwaitInhibitors {
            known: held.clone()
        }
    );
    let waiting = s.waiting_for.clone().unwrap();
    assert!(
        waiting.contains("backup (nightly dump; uid 0, pid 42)"),
        "{waiting}"
    );
    // A restart in the same boot keeps waiting for them.
    let s = run(&s, vec![started("b")]);
    assert_eq!(s.failed_attempts, 0);
    assert!(matches!(
        next_action(&s, &policy()),
        Action::AwaitInhibitors { .. }
    ));
    // Released: the window and the blockers are checked again before logind is asked.
    let s = run(&s, vec![Event::Inhibited { by: vec![] }]);
    assert!(s.inhibited_by.is_empty());
    assert_eq!(s.waiting_for, None);
    assert_eq!(next_action(&s, &policy()), Action::PrepareReboot);
    // Backing out (the window closed meanwhile) forgets them.
    let s = run(&s, vec![Event::Inhibited { by: held }]);
    let s = run(&s, vec![Event::WindowClosed { next_open: None }]);
    assert_eq!(s.phase, Phase::Releasing);
    assert!(s.inhibited_by.is_empty());
}

#[test]
fn closed_window_waits_then_opens() {
    let s = run(
        &State::new("b", t(0)),
        vec![
            needed(),
            Event::WindowClosed {
                next_open: Some(t(100)),
            },
        ],
    );
    assert_eq!(s.phase, Phase::WaitingForWindow);
    assert_eq!(next_action(&s, &policy()), Action::WaitForWindow);
    assert!(s.waiting_for.as_deref().unwrap().contains("window"));
    let s = run(&s, vec![Event::WindowOpen]);
    assert_eq!(s.phase, Phase::AcquiringSlot);
}

#[test]
fn window_closing_before_reboot_gives_slot_back_and_keeps_need() {
    let s = run(
        &State::new("b", t(0)),
        vec![
            needed(),
            Event::WindowOpen,
            Event::SlotAcquired,
            Event::WindowClosed { next_open: None },
        ],
    );
    assert_eq!(s.phase, Phase::Releasing);
    let s = run(&s, vec![Event::Released]);
    assert_eq!(s.phase, Phase::RebootNeeded);
    assert!(!s.slot_held);
}

#[test]
fn unplanned_reboot_with_slot_goes_through_post_boot_checks() {
    let s = run(
        &State::new("b1", t(0)),
        vec![needed(), Event::WindowOpen, Event::SlotAcquired],
    );
    let s = run(&s, vec![started("b2")]);
    assert_eq!(s.phase, Phase::WaitingForHealthy);
    // Without a slot, an unplanned reboot just clears the need.
    let s = run(&State::new("b1", t(0)), vec![needed(), started("b2")]);
    assert_eq!(s.phase, Phase::Idle);
    assert_eq!(s.reason, None);
}

#[test]
fn drain_path_and_abort_uncordons_only_if_we_cordoned() {
    let p = Policy {
        drain: true,
        ..policy()
    };
    let mut s = State::new("b", t(0));
    for e in [needed(), Event::WindowOpen, Event::SlotAcquired] {
        s = step(&s, e, t(1), &p).state;
    }
    assert_eq!(next_action(&s, &p), Action::RecordCordon);
    let cordoned = step(&s, Event::Cordoned { by_us: true }, t(2), &p).state;
    let failed = step(&cordoned, drain_failed(false), t(3), &p).state;
    assert_eq!(failed.phase, Phase::Uncordoning);
    let was = step(&s, Event::Cordoned { by_us: false }, t(2), &p).state;
    let failed = step(&was, drain_failed(false), t(3), &p).state;
    assert_eq!(failed.phase, Phase::Releasing);
    let anyway = step(&cordoned, drain_failed(true), t(3), &p).state;
    assert_eq!(anyway.phase, Phase::Rebooting);
}

#[test]
fn blocking_pods_before_the_slot_wait_and_right_before_the_reboot_back_out() {
    let s = run(
        &State::new("b", t(0)),
        vec![
            needed(),
            Event::Blocked {
                pods: vec!["db/primary-0".into()],
            },
        ],
    );
    assert_eq!(s.phase, Phase::RebootNeeded);
    assert!(!s.slot_held);
    assert!(matches!(next_action(&s, &policy()), Action::Sleep { .. }));
    assert!(s.waiting_for.as_deref().unwrap().contains("db/primary-0"));
    let mut s = run(
        &State::new("b", t(0)),
        vec![needed(), Event::WindowOpen, Event::SlotAcquired],
    );
    s.cordoned_by_us = true;
    let s = run(
        &s,
        vec![Event::Blocked {
            pods: vec!["db/primary-0".into()],
        }],
    );
    assert_eq!(s.phase, Phase::Uncordoning);
    // Backing out is not delayed by the back-off.
    assert_eq!(next_action(&s, &policy()), Action::Uncordon);
    let s = run(&s, vec![Event::Uncordoned, Event::Released]);
    assert_eq!(s.phase, Phase::RebootNeeded);
    assert!(matches!(next_action(&s, &policy()), Action::Sleep { .. }));
}

#[test]
fn not_healthy_after_boot_keeps_the_slot_and_keeps_waiting() {
    let mut s = State::new("b", t(0));
    s.phase = Phase::WaitingForHealthy;
    s.slot_held = true;
    let s = run(
        &s,
        vec![Event::NotHealthy {
            error: "NotReady after 15m".into(),
        }],
    );
    assert_eq!(s.phase, Phase::WaitingForHealthy);
    assert!(s.slot_held);
    assert_eq!(next_action(&s, &policy()), Action::WaitHealthy);
    assert!(s.last_error.as_deref().unwrap().contains("rollout stops"));
}

#[test]
fn lock_error_backs_off_in_place() {
    let s = run(
        &State::new("b", t(0)),
        vec![
            needed(),
            Event::WindowOpen,
            Event::Transient {
                error: "etcd unreachable".into(),
            },
        ],
    );
    assert_eq!(s.phase, Phase::AcquiringSlot);
    assert!(matches!(next_action(&s, &policy()), Action::Sleep { .. }));
    let s = run(&s, vec![Event::RetryDue]);
    assert_eq!(next_action(&s, &policy()), Action::AcquireSlot);
}

#[test]
fn a_lost_slot_backs_out_uncordoning_only_what_rebootd_cordoned() {
    let p = Policy {
        drain: true,
        ..policy()
    };
    let held = |by_us| {
        let mut s = State::new("b", t(0));
        for e in [
            needed(),
            Event::WindowOpen,
            Event::SlotAcquired,
            Event::Cordoned { by_us },
        ] {
            s = step(&s, e, t(1), &p).state;
        }
        s
    };
    let lost = |s: &State| {
        step(
            s,
            Event::SlotLost {
                why: "reclaimed".into(),
            },
            t(2),
            &p,
        )
        .state
    };
    // Cordoned by rebootd: uncordon, then back to waiting for a slot (no release).
    let s = lost(&held(true));
    assert_eq!(s.phase, Phase::Uncordoning);
    assert!(!s.slot_held);
    assert!(s.last_error.as_deref().unwrap().contains("reclaimed"));
    let s = step(&s, Event::Uncordoned, t(3), &p).state;
    assert_eq!(s.phase, Phase::RebootNeeded);
    assert_eq!(next_action(&s, &p), Action::CheckWindow);
    let s = step(&s, Event::WindowOpen, t(4), &p).state;
    assert_eq!(next_action(&s, &p), Action::AcquireSlot);
    // Cordoned by someone else: leave it, back to waiting for a slot at once.
    let s = lost(&held(false));
    assert_eq!(s.phase, Phase::RebootNeeded);
    assert!(!s.cordon_recorded && !s.slot_held);
    // Right before the logind call: the request on record is dropped.
    let mut s = held(false);
    s = step(&s, Event::Drained, t(3), &p).state;
    s = step(&s, Event::ReadyToReboot(RebootPlan::default()), t(4), &p).state;
    assert_eq!(next_action(&s, &p), Action::CallReboot);
    let s = lost(&s);
    assert_eq!(s.reboot, None);
    assert_eq!(s.phase, Phase::RebootNeeded);
}

/// Drained, logind asked, then rebootd restarted in the same boot: the request is put aside to
/// ask again, and may still be pending in logind.
fn restarted_with_a_reboot_pending() -> (Policy, State) {
    let p = Policy {
        drain: true,
        ..policy()
    };
    let mut s = State::new("boot1", t(0));
    for e in [
        needed(),
        Event::WindowOpen,
        Event::SlotAcquired,
        Event::Cordoned { by_us: true },
        Event::Drained,
        Event::ReadyToReboot(RebootPlan::default()),
        Event::RebootAccepted,
        started("boot1"),
    ] {
        s = step(&s, e, t(1), &p).state;
    }
    (p, s)
}

/// The host goes down while rebootd backs out of a reboot logind had accepted (restarted in the
/// same boot, it asked again, and the proof before the call found the slot gone: an operator's
/// `rebootctl unlock`, a reclaim). The boot meets the need the back-out kept: the back-out
/// finishes, then idle. Finding 13 (RELIABILITY.md; chaos `--operators`, seed 3360001): the
/// node finished the back-out, took a slot again and rebooted a second time.
#[test]
fn a_boot_during_a_back_out_meets_the_need_it_kept() {
    let (p, s) = restarted_with_a_reboot_pending();
    let lost = Event::SlotLost {
        why: "unlocked".into(),
    };
    let s = step(&s, lost, t(1), &p).state;
    assert_eq!(s.phase, Phase::Uncordoning);
    assert!(s.reason.is_some(), "the back-out keeps the need");
    // logind's shutdown, accepted before, happens now.
    let s = step(&s, started("boot2"), t(2), &p).state;
    assert_eq!(s.reason, None, "met by the boot");
    assert_eq!(s.last_reboot, Some(t(2)));
    let s = step(&s, Event::Uncordoned, t(3), &p).state;
    assert_eq!(s.phase, Phase::Idle);
    assert!(!s.cordoned_by_us && !s.slot_held);
}

/// Restarted in the same boot after logind accepted a reboot, rebootd puts the request aside
/// to ask again, but the first one may still be pending in logind: a cancel is refused and a
/// pause does not back out (neither would stop the host going down; both would undo the
/// cordon). Finding 14 (RELIABILITY.md; chaos `--operators`, seed 3350012): the cancel undid the
/// drain and gave the slot back, the node took a slot again and went down in the middle of that
/// drain.
#[test]
fn a_reboot_put_aside_by_a_restart_cannot_be_cancelled_or_paused() {
    let (p, s) = restarted_with_a_reboot_pending();
    assert_eq!(s.reboot, None, "put aside to ask again");
    assert!(s.logind_asked());
    let cancelled = step(&s, Event::Cancelled, t(2), &p);
    assert_eq!(cancelled.state.phase, Phase::Rebooting);
    assert!(cancelled.state.cordoned_by_us && cancelled.state.slot_held);
    let paused = step(
        &s,
        Event::Paused {
            reason: Some("x".into()),
        },
        t(2),
        &p,
    )
    .state;
    assert_eq!(paused.phase, Phase::Rebooting);
    assert!(paused.cordoned_by_us && paused.slot_held);
}

/// Restarted in the same boot after logind accepted a reboot, the window has closed: backing
/// out would give the slot back while the reboot asked before may still land. The slot and
/// the cordon are kept until the next window opens, then logind is asked again. Finding 15
/// (RELIABILITY.md; chaos `--windows`, seed 3370024): the node backed out, gave its slot back
/// and went down 0.7 s later without it.
#[test]
fn a_window_closing_after_a_restart_with_a_reboot_pending_keeps_the_slot() {
    let (p, s) = restarted_with_a_reboot_pending();
    let closed = Event::WindowClosed {
        next_open: Some(t(100)),
    };
    let s = step(&s, closed, t(1), &p).state;
    assert_eq!(s.phase, Phase::Rebooting);
    assert!(s.slot_held && s.cordoned_by_us, "{s:?}");
    assert_eq!(
        next_action(&s, &p),
        Action::Sleep { until: t(100) },
        "asks again when the window opens"
    );
    // The pending reboot lands: rebootd's own.
    let s = step(&s, started("boot2"), t(2), &p).state;
    assert_eq!(s.phase, Phase::WaitingForHealthy);
    assert_eq!(s.reboots, 1);
}

/// As for the window, a gate that says wait or blocking pods after such a restart keep the
/// slot and the cordon (chaos `--gates`, seeds 3410000, 3410017, 3410018: the node gave its
/// slot back and went down without it).
#[test]
fn a_gate_or_blocking_pods_after_a_restart_with_a_reboot_pending_keep_the_slot() {
    let (p, s) = restarted_with_a_reboot_pending();
    for e in [
        Event::Gated {
            gate: "g".into(),
            why: "wait".into(),
            hold: false,
        },
        Event::Blocked {
            pods: vec!["ns/p".into()],
        },
    ] {
        let after = step(&s, e.clone(), t(2), &p).state;
        assert_eq!(after.phase, Phase::Rebooting, "{e:?}");
        assert!(after.slot_held && after.cordoned_by_us, "{e:?}: {after:?}");
        assert!(
            matches!(next_action(&after, &p), Action::Sleep { .. }),
            "{e:?}"
        );
    }
}

#[test]
fn new_need_during_post_boot_leads_to_another_cycle() {
    let mut s = State::new("b", t(0));
    s.phase = Phase::Releasing;
    s.slot_held = true;
    let s = run(
        &s,
        vec![
            Event::RebootNeeded {
                need: Need::new(TriggerSource::Rebootctl, "again"),
            },
            Event::Released,
        ],
    );
    assert_eq!(s.phase, Phase::RebootNeeded);
}

fn run_with(p: &Policy, s: &State, events: Vec<Event>) -> State {
    let mut s = s.clone();
    for e in events {
        s = step(&s, e, t(1), p).state;
    }
    s
}

fn paused(reason: &str) -> Event {
    Event::Paused {
        reason: Some(reason.into()),
    }
}

#[test]
fn a_paused_node_keeps_its_need_and_takes_no_slot_until_resumed() {
    let s = run(&State::new("b", t(0)), vec![paused("db migration")]);
    assert_eq!(s.phase, Phase::Idle);
    let p = s.paused.clone().unwrap();
    assert_eq!(p.reason.as_deref(), Some("db migration"));
    assert_eq!(next_action(&s, &policy()), Action::WaitForTrigger);
    let s = run(&s, vec![needed()]);
    assert_eq!(s.phase, Phase::RebootNeeded);
    assert_eq!(next_action(&s, &policy()), Action::WaitForResume);
    assert!(
        s.waiting_for.as_deref().unwrap().contains("resume"),
        "{s:?}"
    );
    // Not even a window that opens moves it on.
    let s = run(&s, vec![Event::WindowOpen]);
    assert_eq!(s.phase, Phase::RebootNeeded);
    // A second pause keeps the first one's time; a restart or a reboot keeps the pause.
    let again = step(&s, paused("still"), t(50), &policy()).state;
    assert_eq!(again.paused.as_ref().unwrap().since, p.since);
    let s = run(&again, vec![started("b")]);
    assert!(s.paused.is_some());
    assert_eq!(next_action(&s, &policy()), Action::WaitForResume);
    let s = run(&s, vec![Event::Resumed]);
    assert_eq!(s.paused, None);
    assert_eq!(s.waiting_for, None);
    assert_eq!(next_action(&s, &policy()), Action::CheckWindow);
    let s = run(&s, vec![Event::WindowOpen]);
    assert_eq!(next_action(&s, &policy()), Action::AcquireSlot);
}

#[test]
fn pausing_a_reboot_under_way_backs_out_before_logind_and_not_after() {
    let p = Policy {
        drain: true,
        ..policy()
    };
    let need = || {
        run_with(
            &p,
            &State::new("b", t(0)),
            vec![needed(), Event::WindowOpen],
        )
    };
    // Waiting for a slot: leave (a slot an interrupted acquire may have taken is released).
    let s = run_with(&p, &need(), vec![paused("p")]);
    assert_eq!(s.phase, Phase::Releasing);
    let s = run_with(&p, &s, vec![Event::Released]);
    assert_eq!(s.phase, Phase::RebootNeeded);
    assert!(s.reason.is_some(), "the need is kept");
    assert_eq!(next_action(&s, &p), Action::WaitForResume);
    // Draining after rebootd's cordon: uncordon, release, wait.
    let s = run_with(
        &p,
        &need(),
        vec![
            Event::SlotAcquired,
            Event::Cordoned { by_us: true },
            paused("p"),
        ],
    );
    assert_eq!(s.phase, Phase::Uncordoning);
    let s = run_with(&p, &s, vec![Event::Uncordoned, Event::Released]);
    assert_eq!(s.phase, Phase::RebootNeeded);
    assert!(!s.slot_held && !s.cordoned_by_us);
    assert_eq!(next_action(&s, &p), Action::WaitForResume);
    // A back-off does not delay backing out.
    let s = run_with(
        &p,
        &need(),
        vec![
            Event::SlotAcquired,
            Event::Transient {
                error: "api".into(),
            },
            paused("p"),
        ],
    );
    assert_eq!(next_action(&s, &p), Action::ReleaseSlot);
    // logind accepted: too late, the pause is for the next cycle.
    let s = run_with(
        &p,
        &need(),
        vec![
            Event::SlotAcquired,
            Event::Cordoned { by_us: false },
            Event::Drained,
            Event::ReadyToReboot(RebootPlan::default()),
            Event::RebootAccepted,
            paused("p"),
        ],
    );
    assert_eq!(s.phase, Phase::Rebooting);
    assert!(s.reboot.as_ref().unwrap().called);
    assert!(s.paused.is_some());
    assert!(matches!(next_action(&s, &p), Action::AwaitReboot { .. }));
}

#[test]
fn cancel_drops_a_pending_reboot_undoing_only_rebootds_cordon() {
    let p = Policy {
        drain: true,
        ..policy()
    };
    let base = State::new("b", t(0));
    let need = vec![needed()];
    // Before the slot: idle again at once, the need forgotten.
    let s = run_with(&p, &base, need.clone());
    let s = run_with(&p, &s, vec![Event::Cancelled]);
    assert_eq!((s.phase, s.reason.clone()), (Phase::Idle, None));
    let s = run_with(
        &p,
        &base,
        vec![
            needed(),
            Event::WindowClosed { next_open: None },
            Event::Cancelled,
        ],
    );
    assert_eq!(s.phase, Phase::Idle);
    assert_eq!(s.waiting_for, None);
    // Waiting for a slot, with a back-off running: release at once, then idle.
    let s = run_with(
        &p,
        &base,
        vec![
            needed(),
            Event::WindowOpen,
            Event::Transient {
                error: "etcd".into(),
            },
            Event::Cancelled,
        ],
    );
    assert_eq!(s.phase, Phase::Releasing);
    assert_eq!(next_action(&s, &p), Action::ReleaseSlot);
    let s = run_with(&p, &s, vec![Event::Released]);
    assert_eq!((s.phase, s.reason.clone()), (Phase::Idle, None));
    // Draining: uncordon only when rebootd cordoned.
    let drained = |by_us| {
        run_with(
            &p,
            &base,
            vec![
                needed(),
                Event::WindowOpen,
                Event::SlotAcquired,
                Event::Cordoned { by_us },
                Event::Cancelled,
            ],
        )
    };
    let s = drained(true);
    assert_eq!(s.phase, Phase::Uncordoning);
    let s = run_with(&p, &s, vec![Event::Uncordoned, Event::Released]);
    assert_eq!((s.phase, s.slot_held), (Phase::Idle, false));
    assert_eq!(drained(false).phase, Phase::Releasing);
    // Right before the logind call (the request is on record, not made): dropped.
    let ready = run_with(
        &p,
        &base,
        vec![
            needed(),
            Event::WindowOpen,
            Event::SlotAcquired,
            Event::Cordoned { by_us: false },
            Event::Drained,
            Event::ReadyToReboot(RebootPlan::default()),
        ],
    );
    let s = run_with(&p, &ready, vec![Event::Cancelled]);
    assert_eq!((s.phase, s.reboot.clone()), (Phase::Releasing, None));
    // logind accepted: refused, nothing changes.
    let accepted = run_with(&p, &ready, vec![Event::RebootAccepted]);
    let step = step(&accepted, Event::Cancelled, t(9), &p);
    assert_eq!(step.state, accepted);
    assert!(step.why.contains("refused"), "{}", step.why);
    // Backing out already (blocking pods with the slot held): the need goes too, so the
    // release ends in idle, not in another attempt.
    let s = run_with(
        &p,
        &base,
        vec![
            needed(),
            Event::WindowOpen,
            Event::SlotAcquired,
            Event::Blocked {
                pods: vec!["db/primary-0".into()],
            },
            Event::Cancelled,
        ],
    );
    assert_eq!((s.phase, s.reason.clone()), (Phase::Releasing, None));
    let s = run_with(&p, &s, vec![Event::Released]);
    assert_eq!(s.phase, Phase::Idle);
    // Nothing pending, or after the reboot: no change.
    assert_eq!(run_with(&p, &base, vec![Event::Cancelled]), base);
    let mut post = base.clone();
    post.phase = Phase::WaitingForHealthy;
    post.slot_held = true;
    assert_eq!(run_with(&p, &post, vec![Event::Cancelled]), post);
}

/// A tiny deterministic generator (xorshift), so the walks below are reproducible.
struct Rng(u64);

impl Rng {
    fn pick(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

/// An outcome the runtime could report for `action` (None: a wait only a request ends).
fn outcome(action: &Action, rng: &mut Rng) -> Option<Event> {
    let e = match action {
        Action::WaitForTrigger => needed(),
        Action::Sleep { .. } => Event::RetryDue,
        Action::CheckWindow | Action::WaitForWindow | Action::PrepareReboot => match rng.pick(4) {
            0 => Event::WindowClosed {
                next_open: Some(t(99)),
            },
            1 => Event::Blocked {
                pods: vec!["a/b".into()],
            },
            _ if matches!(action, Action::PrepareReboot) => {
                Event::ReadyToReboot(RebootPlan::default())
            }
            _ => Event::WindowOpen,
        },
        Action::AcquireSlot => match rng.pick(4) {
            0 => Event::Transient {
                error: "etcd".into(),
            },
            1 => Event::GroupPaused {
                pause: GroupPause {
                    since: t(1),
                    reason: None,
                    by: None,
                },
            },
            _ => Event::SlotAcquired,
        },
        Action::WaitForGroupResume { .. } => Event::GroupResumed,
        Action::RecordCordon => Event::Cordoned {
            by_us: rng.pick(2) == 0,
        },
        Action::Drain => match rng.pick(3) {
            0 => drain_failed(false),
            _ => Event::Drained,
        },
        Action::CallReboot => match rng.pick(4) {
            0 => Event::RebootRefused { error: "no".into() },
            1 => Event::UsersWarned {
                sessions: Vec::new(),
                until: t(50),
            },
            _ => Event::RebootAccepted,
        },
        Action::WarnUsers { .. } => Event::UsersWarningOver,
        Action::AwaitInhibitors { .. } => Event::Inhibited { by: vec![] },
        Action::AwaitReboot { .. } => match rng.pick(2) {
            0 => Event::RebootTimedOut,
            _ => Event::Started {
                boot_id: format!("boot{}", rng.pick(1_000_000)),
                soft_reboots: None,
            },
        },
        Action::WaitHealthy => Event::Healthy,
        Action::Uncordon => Event::Uncordoned,
        Action::ReleaseSlot => Event::Released,
        Action::WaitForResume => return None,
    };
    Some(e)
}

/// Walks of the state machine driven as the runtime drives it, with a pause or a cancel
/// coming at a random step: once paused, no slot is taken, no cordon made and logind is not
/// asked, and the node ends up waiting for resume holding nothing; after a cancel before
/// logind the same holds until the node is idle with no need left.
#[test]
fn random_walks_never_take_a_slot_or_reboot_after_a_pause_or_a_cancel() {
    let p = Policy {
        drain: true,
        ..policy()
    };
    for seed in 1..2000u64 {
        let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let mut s = State::new("boot0", t(0));
        let at = rng.pick(12);
        let request = if rng.pick(2) == 0 {
            Event::Cancelled
        } else {
            paused("p")
        };
        let mut after: Option<bool> = None; // Some(logind asked before the request)
        for i in 0..60 {
            if i == at {
                after = Some(s.logind_asked());
                s = step(&s, request.clone(), t(i as i64), &p).state;
            }
            let action = next_action(&s, &p);
            if let Some(called) = after {
                let cancelled_and_done = request == Event::Cancelled && s.phase == Phase::Idle;
                if cancelled_and_done {
                    assert_eq!(s.reason, None, "seed {seed}");
                    assert!(!s.slot_held && !s.cordoned_by_us, "seed {seed}: {s:?}");
                    break;
                }
                if !called {
                    assert!(
                        !matches!(
                            action,
                            Action::AcquireSlot
                                | Action::RecordCordon
                                | Action::Drain
                                | Action::CallReboot
                        ),
                        "seed {seed} step {i}: {action:?} after {request:?} in {s:?}"
                    );
                }
            }
            let Some(event) = outcome(&action, &mut rng) else {
                assert!(s.paused.is_some(), "seed {seed}");
                assert!(!s.slot_held && !s.cordoned_by_us, "seed {seed}: {s:?}");
                assert!(s.reason.is_some(), "the need is kept: seed {seed}");
                break;
            };
            let next = step(&s, event, t(i as i64), &p);
            // What an action of the phase reports always belongs to it.
            assert_eq!(next.refused, None, "seed {seed} step {i}: {action:?}");
            s = next.state;
        }
    }
}

/// People logged in: the request waits out the announced time (slot held), the checks run
/// again after it, and it is asked once; a restart in the meantime keeps waiting; a cancel
/// drops the warning with the reboot.
#[test]
fn a_users_warning_holds_the_reboot_until_its_time() {
    let p = policy();
    let sessions = vec![crate::users::Session {
        id: "3".into(),
        user: "alice".into(),
        uid: 1000,
        seat: String::new(),
        tty: "tty1".into(),
    }];
    let ready = run(&State::new("b1", t(0)), asked(vec![]));
    assert_eq!(next_action(&ready, &p), Action::CallReboot);
    let warned = run(
        &ready,
        vec![Event::UsersWarned {
            sessions: sessions.clone(),
            until: t(300),
        }],
    );
    assert_eq!(warned.reboot, None, "not asked yet");
    assert!(warned.slot_held);
    assert_eq!(
        next_action(&warned, &p),
        Action::WarnUsers { until: t(300) }
    );
    assert!(warned
        .waiting_for
        .as_deref()
        .unwrap()
        .contains("alice on tty1"));
    // Restarted in the same boot: still waiting for the same time.
    let restarted = run(&warned, vec![started("b1")]);
    assert_eq!(
        next_action(&restarted, &p),
        Action::WarnUsers { until: t(300) }
    );
    // The time passed: the checks again, then the call; the warning is kept (not again).
    let over = run(&warned, vec![Event::UsersWarningOver]);
    assert_eq!(next_action(&over, &p), Action::PrepareReboot);
    let asked = run(&over, vec![Event::ReadyToReboot(RebootPlan::default())]);
    assert_eq!(next_action(&asked, &p), Action::CallReboot);
    assert!(asked.users_warned.as_ref().is_some_and(|w| w.over));
    // Rebooted: the warning belonged to that reboot.
    let back = run(
        &run(&asked, vec![Event::RebootAccepted]),
        vec![started("b2")],
    );
    assert_eq!(back.users_warned, None);
    // Cancelled during the warning: gone with the reboot.
    let cancelled = run_with(&p, &warned, vec![Event::Cancelled]);
    assert_eq!(cancelled.phase, Phase::Releasing);
    assert_eq!(cancelled.users_warned, None);
    // Outside the rebooting phase a warning changes nothing.
    let idle = State::new("b1", t(0));
    let step = step(
        &idle,
        Event::UsersWarned {
            sessions,
            until: t(5),
        },
        t(1),
        &p,
    );
    assert_eq!(step.state, idle);
}

/// An outcome that does not belong to the phase is refused, named, and changes nothing:
/// a release while idle, a slot while rebooting, a drain's end before the slot, a timeout
/// of a reboot logind was never asked for, health before the reboot.
#[test]
fn events_of_another_phase_are_refused_and_change_nothing() {
    let p = Policy {
        drain: true,
        ..policy()
    };
    let idle = State::new("b", t(0));
    let acquiring = run_with(&p, &idle, vec![needed(), Event::WindowOpen]);
    assert_eq!(acquiring.phase, Phase::AcquiringSlot);
    let mut rebooting = run_with(&p, &acquiring, vec![Event::SlotAcquired]);
    rebooting.phase = Phase::Rebooting;
    for (s, event, phase) in [
        (&idle, Event::Released, Phase::Idle),
        (&idle, Event::WindowOpen, Phase::Idle),
        (&rebooting, Event::SlotAcquired, Phase::Rebooting),
        (&acquiring, Event::Drained, Phase::AcquiringSlot),
        (&acquiring, Event::Healthy, Phase::AcquiringSlot),
        (&acquiring, Event::Uncordoned, Phase::AcquiringSlot),
        (&rebooting, Event::RebootTimedOut, Phase::Rebooting),
        (&rebooting, Event::RebootAccepted, Phase::Rebooting),
        (&rebooting, Event::UsersWarningOver, Phase::Rebooting),
    ] {
        let name = event.name();
        let out = step(s, event, t(9), &p);
        let refused = out
            .refused
            .unwrap_or_else(|| panic!("{name} in {phase} admitted"));
        assert_eq!((refused.event, refused.phase), (name, phase));
        assert_eq!(&out.state, s, "{name} in {phase} changed the state");
        assert!(
            out.why
                .contains(&format!("refused event {name} in phase {phase}")),
            "{}",
            out.why
        );
    }
    // Triggers, operator requests, errors and the start belong to every phase.
    for s in [&idle, &acquiring, &rebooting] {
        for event in [
            needed(),
            Event::Cancelled,
            Event::Resumed,
            Event::Transient { error: "x".into() },
            Event::RetryDue,
            started("b"),
        ] {
            assert_eq!(admit(s, &event), Ok(()), "{} in {}", event.name(), s.phase);
        }
    }
}

/// A group paused in the lock store: the waiter takes no slot and waits for the resume,
/// shown in what it waits for; the resume sends it back to the slot wait. A window closing
/// meanwhile backs out as for any slot wait, forgetting the pause (looked at again next time).
#[test]
fn a_paused_group_holds_the_slot_wait_until_resumed() {
    let p = policy();
    let pause = GroupPause {
        since: t(5),
        reason: Some("kernel freeze".into()),
        by: Some("ops-1".into()),
    };
    let acquiring = run(&State::new("b", t(0)), vec![needed(), Event::WindowOpen]);
    assert_eq!(next_action(&acquiring, &p), Action::AcquireSlot);
    let paused = run(
        &acquiring,
        vec![Event::GroupPaused {
            pause: pause.clone(),
        }],
    );
    assert_eq!(paused.phase, Phase::AcquiringSlot);
    assert_eq!(
        next_action(&paused, &p),
        Action::WaitForGroupResume {
            known: pause.clone()
        }
    );
    let waiting = paused.waiting_for.clone().unwrap();
    assert!(waiting.contains("resume --group"), "{waiting}");
    assert!(waiting.contains("kernel freeze"), "{waiting}");
    let resumed = run(&paused, vec![Event::GroupResumed]);
    assert_eq!(resumed.group_paused, None);
    assert_eq!(next_action(&resumed, &p), Action::AcquireSlot);
    let closed = run(&paused, vec![Event::WindowClosed { next_open: None }]);
    assert_eq!(closed.group_paused, None);
    assert_ne!(closed.phase, Phase::AcquiringSlot);
    // Only a slot wait hears of it.
    let idle = State::new("b", t(0));
    let out = step(&idle, Event::GroupPaused { pause }, t(1), &p);
    assert!(out.refused.is_some());
    assert_eq!(out.state, idle);
}

fn soft_plan(count: Option<u64>) -> Event {
    Event::ReadyToReboot(RebootPlan {
        kind: crate::reboot_method::Kind::Soft,
        why: "reboot.method = \"soft-reboot\"".into(),
        soft_reboots: count,
    })
}

#[test]
fn a_soft_reboot_is_proven_by_systemds_count_in_the_same_boot_id() {
    let s = run(
        &State::new("boot1", t(0)),
        vec![
            needed(),
            Event::WindowOpen,
            Event::SlotAcquired,
            soft_plan(Some(2)),
        ],
    );
    let r = s
        .reboot
        .clone()
        .expect("the request is on record before the call");
    assert_eq!(r.kind, crate::reboot_method::Kind::Soft);
    assert_eq!(r.soft_reboots, Some(2));
    let s = run(&s, vec![Event::RebootAccepted]);
    // Back after the soft reboot: the boot id kept, the count one up.
    let out = step(
        &s,
        Event::Started {
            boot_id: "boot1".into(),
            soft_reboots: Some(3),
        },
        t(100),
        &policy(),
    );
    assert_eq!(out.state.phase, Phase::WaitingForHealthy, "{}", out.why);
    assert!(out.why.contains("SoftRebootsCount 2 -> 3"), "{}", out.why);
    assert_eq!(out.state.reboots, 1);
    assert_eq!(out.state.failed_attempts, 0);
    assert!(
        out.state.slot_held,
        "released after the checks, as after any reboot"
    );
    let s = run(&out.state, vec![Event::Healthy, Event::Released]);
    assert_eq!(s.phase, Phase::Idle);
}

#[test]
fn the_same_count_or_none_in_the_same_boot_is_a_soft_reboot_that_did_not_happen() {
    for (before, after) in [(Some(2), Some(2)), (Some(2), None), (None, Some(5))] {
        let s = run(
            &State::new("boot1", t(0)),
            vec![
                needed(),
                Event::WindowOpen,
                Event::SlotAcquired,
                soft_plan(before),
                Event::RebootAccepted,
                Event::Started {
                    boot_id: "boot1".into(),
                    soft_reboots: after,
                },
            ],
        );
        assert_eq!(s.phase, Phase::Rebooting, "{before:?} -> {after:?}");
        assert_eq!(s.failed_attempts, 1);
        assert_eq!(s.reboots, 0);
    }
}

#[test]
fn a_state_file_from_before_reboot_methods_loads_as_a_full_reboot() {
    let old = r#"{"version":1,"phase":"rebooting","since":"2026-11-01T00:00:00Z",
        "boot_id":"b1","slot_held":true,
        "reboot":{"requested_at":"2026-11-01T00:00:00Z","boot_id":"b1","called":true}}"#;
    let s: State = serde_json::from_str(old).expect("an old state file loads");
    let r = s.reboot.expect("its request");
    assert_eq!(r.kind, crate::reboot_method::Kind::Full);
    assert_eq!(r.soft_reboots, None);
}
