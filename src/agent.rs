//! The agent's state machine, pure: `step(state, event) -> state` and `next_action(state)`.
//!
//! No I/O happens here. The runtime (`runtime/`) performs the action the state asks for, turns
//! its outcome into an [`Event`], steps, and persists the new state before the next action, so
//! every side effect is guarded by a state written before it.

use crate::inhibitor::{self, Inhibitor};
use crate::lock::GroupPause;
use crate::need::Need;
use crate::state::{GateWait, Pause, Phase, RebootRequest, State};
use jiff::Timestamp;
use std::time::Duration;

/// The parts of the configuration the state machine needs.
#[derive(Debug, Clone)]
pub struct Policy {
    /// Whether a Kubernetes drain happens before the reboot.
    pub drain: bool,
    /// How long an accepted reboot may take before it counts as lost.
    pub reboot_timeout: Duration,
    /// Back-off after a refusal or a backend error.
    pub retry_interval: Duration,
    /// A gate that said wait is asked again after this long (`gates.interval`).
    pub gate_interval: Duration,
    /// Hold the slot this long after the node is back before releasing it (`gates.settle`).
    pub settle: Option<Duration>,
}

/// What happened, as the runtime reports it.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// The process started, in the boot with this id.
    Started { boot_id: String },
    /// A trigger says the host needs a reboot.
    RebootNeeded { need: Need },
    /// A maintenance window is open now.
    WindowOpen,
    /// No window is open; the next one opens then (None: never).
    WindowClosed { next_open: Option<Timestamp> },
    /// This node holds a slot.
    SlotAcquired,
    /// A fence (right before cordoning or rebooting) found that this node no longer holds its
    /// slot (released by hand, reclaimed, or held by another host with the same machine id).
    SlotLost { why: String },
    /// Talking to the lock backend or the API server failed (retried after a back-off).
    Transient { error: String },
    /// Pods matching `blocking_pods` run on the node.
    Blocked { pods: Vec<String> },
    /// A gate (`[gates]`) says wait: its name and what it waits for; `hold`: the node keeps
    /// its slot meanwhile (a Node gate, whose checks run for the node about to reboot).
    Gated {
        gate: String,
        why: String,
        hold: bool,
    },
    /// The node is drained.
    Drained,
    /// The drain did not finish; `reboot_anyway` per `on_drain_failure`.
    DrainFailed { error: String, reboot_anyway: bool },
    /// The cordon was put on by rebootd (true) or was there before (false).
    Cordoned { by_us: bool },
    /// People are logged in: logind announced the reboot for `until` (see [`crate::users`]);
    /// the slot is held while they get the time to finish.
    UsersWarned {
        sessions: Vec<crate::users::Session>,
        until: Timestamp,
    },
    /// The time given to logged-in users is over.
    UsersWarningOver,
    /// Everything allows the reboot now: the request is about to be made.
    ReadyToReboot,
    /// logind accepted the reboot request.
    RebootAccepted,
    /// logind refused (inhibitor, error).
    RebootRefused { error: String },
    /// The block inhibitors on shutdown held right before the reboot (empty: none any more).
    Inhibited { by: Vec<Inhibitor> },
    /// An accepted reboot did not happen within the timeout.
    RebootTimedOut,
    /// The node is back and healthy after the reboot.
    Healthy,
    /// The node did not become healthy within `ready_timeout`.
    NotHealthy { error: String },
    /// The node is schedulable again.
    Uncordoned,
    /// The slot is given back.
    Released,
    /// A back-off ended.
    RetryDue,
    /// The operator paused this node (`rebootctl pause`).
    Paused { reason: Option<String> },
    /// The operator resumed this node (`rebootctl resume`).
    Resumed,
    /// The operator cancelled the pending reboot (`rebootctl cancel`).
    Cancelled,
    /// The lock store says the group is paused (`rebootctl pause --group`): no slot is taken.
    GroupPaused { pause: GroupPause },
    /// The group's pause is gone (`rebootctl resume --group`).
    GroupResumed,
}

impl Event {
    /// The event's name, for logs and refusals.
    pub fn name(&self) -> &'static str {
        match self {
            Event::Started { .. } => "started",
            Event::RebootNeeded { .. } => "reboot_needed",
            Event::WindowOpen => "window_open",
            Event::WindowClosed { .. } => "window_closed",
            Event::SlotAcquired => "slot_acquired",
            Event::SlotLost { .. } => "slot_lost",
            Event::Transient { .. } => "transient",
            Event::Blocked { .. } => "blocked",
            Event::Gated { .. } => "gated",
            Event::Drained => "drained",
            Event::DrainFailed { .. } => "drain_failed",
            Event::Cordoned { .. } => "cordoned",
            Event::UsersWarned { .. } => "users_warned",
            Event::UsersWarningOver => "users_warning_over",
            Event::ReadyToReboot => "ready_to_reboot",
            Event::RebootAccepted => "reboot_accepted",
            Event::RebootRefused { .. } => "reboot_refused",
            Event::Inhibited { .. } => "inhibited",
            Event::RebootTimedOut => "reboot_timed_out",
            Event::Healthy => "healthy",
            Event::NotHealthy { .. } => "not_healthy",
            Event::Uncordoned => "uncordoned",
            Event::Released => "released",
            Event::RetryDue => "retry_due",
            Event::Paused { .. } => "paused",
            Event::Resumed => "resumed",
            Event::Cancelled => "cancelled",
            Event::GroupPaused { .. } => "group_paused",
            Event::GroupResumed => "group_resumed",
        }
    }
}

/// An event the agent refuses because it does not belong to the phase the node is in: the
/// outcome of an action of another phase (stale, or a runtime bug). The state is left as it
/// is, and the runtime logs the refusal.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("refused event {event} in phase {phase}: it belongs to {belongs}")]
pub struct Refused {
    pub event: &'static str,
    pub phase: Phase,
    /// The phases (or condition) the event belongs to, in words.
    pub belongs: &'static str,
}

/// Whether `event` belongs to the phase `s` is in. Triggers, the start, back-off ends, errors
/// and operator requests belong to every phase; an action's outcome only to the phase whose
/// action produces it.
pub fn admit(s: &State, event: &Event) -> Result<(), Refused> {
    use Phase::*;
    let p = s.phase;
    let before_reboot = matches!(
        p,
        RebootNeeded | WaitingForWindow | AcquiringSlot | Draining | Rebooting
    );
    let (ok, belongs) = match event {
        Event::Started { .. }
        | Event::RebootNeeded { .. }
        | Event::Transient { .. }
        | Event::RetryDue
        | Event::Paused { .. }
        | Event::Resumed
        | Event::Cancelled => (true, "every phase"),
        Event::WindowOpen => (
            matches!(p, RebootNeeded | WaitingForWindow),
            "reboot_needed, waiting_for_window",
        ),
        Event::WindowClosed { .. } | Event::Blocked { .. } => (
            before_reboot,
            "reboot_needed .. rebooting (before the reboot)",
        ),
        Event::Gated { .. } => (
            before_reboot || p == WaitingForHealthy,
            "reboot_needed .. rebooting, waiting_for_healthy",
        ),
        Event::SlotAcquired | Event::GroupPaused { .. } | Event::GroupResumed => {
            (p == AcquiringSlot, "acquiring_slot")
        }
        Event::SlotLost { .. } => (matches!(p, Draining | Rebooting), "draining, rebooting"),
        Event::Cordoned { .. } | Event::Drained | Event::DrainFailed { .. } => {
            (p == Draining, "draining")
        }
        Event::UsersWarned { .. }
        | Event::ReadyToReboot
        | Event::RebootRefused { .. }
        | Event::Inhibited { .. } => (p == Rebooting, "rebooting"),
        Event::UsersWarningOver => (
            p == Rebooting && s.users_warned.is_some(),
            "rebooting, with logged-in users warned",
        ),
        Event::RebootAccepted => (
            p == Rebooting && s.reboot.is_some(),
            "rebooting, with the request on record",
        ),
        Event::RebootTimedOut => (
            p == Rebooting && s.reboot.as_ref().is_some_and(|r| r.called),
            "rebooting, with logind asked",
        ),
        Event::Healthy | Event::NotHealthy { .. } => {
            (p == WaitingForHealthy, "waiting_for_healthy")
        }
        Event::Uncordoned => (p == Uncordoning, "uncordoning"),
        Event::Released => (p == Releasing, "releasing"),
    };
    if ok {
        Ok(())
    } else {
        Err(Refused {
            event: event.name(),
            phase: p,
            belongs,
        })
    }
}

/// What the runtime must do next for a state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Wait for a trigger.
    WaitForTrigger,
    /// Do nothing until then, then report [`Event::RetryDue`].
    Sleep { until: Timestamp },
    /// See whether a window is open now.
    CheckWindow,
    /// Wait until a window opens.
    WaitForWindow,
    /// Take a slot (waiting for one), unless the group is paused.
    AcquireSlot,
    /// The group is paused: wait until its pause is no longer this one.
    WaitForGroupResume { known: GroupPause },
    /// Read whether the node is unschedulable already, before cordoning it.
    RecordCordon,
    /// Cordon and drain the node.
    Drain,
    /// Check once more that the reboot may happen now (window, blockers).
    PrepareReboot,
    /// Ask logind to reboot (after listing its block inhibitors, when they are respected).
    CallReboot,
    /// Wait until the block inhibitors held differ from these.
    AwaitInhibitors { known: Vec<Inhibitor> },
    /// Give logged-in users the time announced to them, until then.
    WarnUsers { until: Timestamp },
    /// Wait for the host to go down, until the deadline.
    AwaitReboot { deadline: Timestamp },
    /// Wait for the node to be healthy after boot.
    WaitHealthy,
    /// Make the node schedulable again.
    Uncordon,
    /// Give the slot back.
    ReleaseSlot,
    /// Paused with a reboot needed: wait for `rebootctl resume` (or another operator request).
    WaitForResume,
}

/// The result of a step: the new state and, when the phase changed, why.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    pub state: State,
    pub why: String,
    /// Set when the event did not belong to the phase: `state` is the old one.
    pub refused: Option<Refused>,
}

/// What the state asks for next.
pub fn next_action(s: &State, policy: &Policy) -> Action {
    if let Some(until) = s.retry_at {
        return Action::Sleep { until };
    }
    match s.phase {
        Phase::Idle => Action::WaitForTrigger,
        // A paused node starts nothing: no window check, no slot.
        Phase::RebootNeeded | Phase::WaitingForWindow if s.paused.is_some() => {
            Action::WaitForResume
        }
        Phase::RebootNeeded => match s.not_before {
            Some(until) => Action::Sleep { until },
            None => Action::CheckWindow,
        },
        Phase::WaitingForWindow => Action::WaitForWindow,
        Phase::AcquiringSlot => match &s.group_paused {
            Some(p) => Action::WaitForGroupResume { known: p.clone() },
            None => Action::AcquireSlot,
        },
        Phase::Draining if !s.cordon_recorded => Action::RecordCordon,
        Phase::Draining => Action::Drain,
        Phase::Rebooting if !s.inhibited_by.is_empty() => Action::AwaitInhibitors {
            known: s.inhibited_by.clone(),
        },
        Phase::Rebooting => match &s.reboot {
            None => match &s.users_warned {
                Some(w) if !w.over => Action::WarnUsers { until: w.until },
                _ => Action::PrepareReboot,
            },
            Some(r) if !r.called => Action::CallReboot,
            Some(r) => Action::AwaitReboot {
                deadline: add(r.requested_at, policy.reboot_timeout),
            },
        },
        Phase::WaitingForHealthy => Action::WaitHealthy,
        Phase::Uncordoning => Action::Uncordon,
        Phase::Releasing => match s.settle_until {
            Some(until) => Action::Sleep { until },
            None => Action::ReleaseSlot,
        },
    }
}

fn add(t: Timestamp, d: Duration) -> Timestamp {
    jiff::SignedDuration::try_from(d)
        .ok()
        .and_then(|d| t.checked_add(d).ok())
        .unwrap_or(Timestamp::MAX)
}

fn enter(s: &mut State, phase: Phase, now: Timestamp) {
    if s.phase != phase {
        s.phase = phase;
        s.since = now;
        s.inhibited_by.clear();
        // A warning belongs to one reboot: gone once the reboot happened or was called off.
        if phase != Phase::Rebooting {
            s.users_warned = None;
        }
        // The group's pause is looked at again at the next slot wait.
        s.group_paused = None;
    }
    s.waiting_for = None;
}

/// After the slot is taken: drain first when configured.
fn after_slot(policy: &Policy) -> Phase {
    if policy.drain {
        Phase::Draining
    } else {
        Phase::Rebooting
    }
}

/// Say so while the settle time holds the slot.
fn settling(s: &mut State) {
    if let Some(t) = s.settle_until {
        s.waiting_for = Some(format!("the settle time to end at {t} (holding the slot)"));
    }
}

/// Undo what was done for a reboot that will not happen now: uncordon, then release.
fn back_out(s: &mut State, now: Timestamp) {
    let phase = if s.cordoned_by_us {
        Phase::Uncordoning
    } else {
        Phase::Releasing
    };
    enter(s, phase, now);
}

/// Whether an event shows the gates went (or were not asked, so what they said is stale): the
/// checks after them ran, the window decided first, or the host rebooted.
fn clears_gate(event: &Event, s: &State) -> bool {
    match event {
        Event::WindowOpen
        | Event::WindowClosed { .. }
        | Event::Blocked { .. }
        | Event::Cordoned { .. }
        | Event::ReadyToReboot
        | Event::Healthy => true,
        Event::Started { boot_id } => *boot_id != s.boot_id,
        _ => false,
    }
}

/// Apply an event to a state.
pub fn step(old: &State, event: Event, now: Timestamp, policy: &Policy) -> Step {
    if let Err(refused) = admit(old, &event) {
        return Step {
            state: old.clone(),
            why: refused.to_string(),
            refused: Some(refused),
        };
    }
    let mut s = old.clone();
    let why: String;
    if clears_gate(&event, &s) {
        s.gate = None;
    }
    match event {
        Event::Started { boot_id } => {
            let rebooted = s.boot_id != boot_id;
            let previous = std::mem::replace(&mut s.boot_id, boot_id.clone());
            if !rebooted {
                match s.reboot.take() {
                    // The host is still up in the boot the reboot was asked in: it did not
                    // happen (or was never asked for, if the crash came first). Waiting out
                    // the timeout would hold the slot for nothing; check the window and the
                    // blockers again and ask again now (a second request joins a pending one).
                    Some(r) => {
                        s.failed_attempts += 1;
                        why = format!(
                            "restarted in the same boot {boot_id}; the reboot requested at {} had not happened; asking again (failed attempts: {})",
                            r.requested_at, s.failed_attempts
                        );
                        s.last_error = Some(why.clone());
                    }
                    None => why = format!("restarted in the same boot {boot_id}; resuming"),
                }
            } else {
                match s.phase {
                    Phase::Idle => why = format!("new boot {boot_id}"),
                    Phase::WaitingForHealthy | Phase::Uncordoning | Phase::Releasing => {
                        why = format!("new boot {boot_id} during post-boot checks; resuming");
                    }
                    _ => {
                        // Ours: a request is on record, or one was made in this rebooting
                        // episode and may still have been pending in logind when it was put
                        // aside (a restart in the same boot, a timeout) to be asked again.
                        let ours = s.phase == Phase::Rebooting
                            && (s.reboot.is_some() || s.failed_attempts > 0);
                        why = if ours {
                            format!("rebooted: boot id {previous} -> {boot_id}")
                        } else {
                            format!(
                                "the host rebooted outside rebootd's control in phase {} \
                                 (boot id {previous} -> {boot_id})",
                                s.phase
                            )
                        };
                        s.reason = None;
                        s.reboot = None;
                        s.retry_at = None;
                        s.failed_attempts = 0;
                        s.last_error = None;
                        s.last_reboot = Some(now);
                        if ours {
                            s.reboots += 1;
                        }
                        let post_boot = s.slot_held || s.cordoned_by_us || ours;
                        enter(
                            &mut s,
                            if post_boot {
                                Phase::WaitingForHealthy
                            } else {
                                Phase::Idle
                            },
                            now,
                        );
                    }
                }
            }
        }
        Event::RebootNeeded { need: reason } => {
            if s.reason.is_none() {
                s.reason = Some(reason.clone());
            }
            if s.phase == Phase::Idle {
                enter(&mut s, Phase::RebootNeeded, now);
                why = format!("reboot needed: {reason}");
            } else {
                why = format!("already in phase {}; noted: {reason}", s.phase);
            }
        }
        Event::WindowOpen => match s.phase {
            _ if s.paused.is_some() => why = "window open, but paused: no slot is taken".into(),
            Phase::RebootNeeded | Phase::WaitingForWindow => {
                enter(&mut s, Phase::AcquiringSlot, now);
                why = "maintenance window open".into();
            }
            _ => why = "window open (no change)".into(),
        },
        Event::WindowClosed { next_open } => {
            let when = next_open.map_or("never".to_string(), |t| t.to_string());
            match s.phase {
                Phase::RebootNeeded | Phase::WaitingForWindow => {
                    enter(&mut s, Phase::WaitingForWindow, now);
                    why = format!("outside the maintenance window; next opens {when}");
                    s.waiting_for = Some(format!("maintenance window opening at {when}"));
                }
                Phase::AcquiringSlot | Phase::Draining | Phase::Rebooting => {
                    back_out(&mut s, now);
                    why = format!(
                        "the maintenance window closed before the reboot; backing out (next opens {when})"
                    );
                }
                _ => why = "window closed (no change)".into(),
            }
        }
        Event::SlotAcquired => {
            s.slot_held = true;
            s.last_error = None;
            enter(&mut s, after_slot(policy), now);
            why = "slot acquired".into();
        }
        Event::SlotLost { why: lost } => {
            // Back out of what was done for this slot, then wait for a slot again: uncordon if
            // rebootd cordoned, and no release (there is nothing to give back).
            s.slot_held = false;
            s.reboot = None;
            s.last_error = Some(format!("slot lost: {lost}"));
            if s.cordoned_by_us {
                enter(&mut s, Phase::Uncordoning, now);
                why = format!(
                    "the slot was lost ({lost}); uncordoning, then waiting for a slot again"
                );
            } else {
                s.cordon_recorded = false;
                enter(&mut s, Phase::RebootNeeded, now);
                why = format!("the slot was lost ({lost}); waiting for a slot again");
            }
        }
        Event::Transient { error } => {
            s.retry_at = Some(add(now, policy.retry_interval));
            why = format!("{error}; retrying");
            s.waiting_for = Some(format!("retry after: {error}"));
            s.last_error = Some(error);
        }
        Event::Blocked { pods } => {
            let list = pods.join(", ");
            s.not_before = Some(add(now, policy.retry_interval));
            match s.phase {
                Phase::AcquiringSlot | Phase::Draining | Phase::Rebooting => {
                    back_out(&mut s, now);
                    why = format!("blocking pods run ({list}); backing out");
                }
                _ => why = format!("blocking pods run ({list}); not taking a slot"),
            }
            s.waiting_for = Some(format!("blocking pods to finish: {list}"));
        }
        Event::Gated {
            gate,
            why: reason,
            hold,
        } => {
            // A gate that closes after the slot was taken backs out like blocking pods: before
            // the cordon the slot is released at once so another node can go; after the drain
            // rebootd uncordons what it cordoned and releases, since an alert the drain itself
            // fired would otherwise hold the node drained for good. A Node gate (`hold`) is
            // asked only with the slot held and keeps it, as FLUO counts a node in its
            // before-reboot checks as rebooting.
            let next_check = add(now, policy.gate_interval);
            let since = match &s.gate {
                Some(g) if g.name == gate => g.since,
                _ => now,
            };
            match s.phase {
                // A check after the boot: the slot stays held, so the rollout waits here.
                Phase::WaitingForHealthy => {
                    s.retry_at = Some(next_check);
                    why = format!(
                        "after the boot, gate {gate:?} says wait ({reason}); holding the slot, asking again at {next_check}"
                    );
                }
                Phase::Draining | Phase::Rebooting if hold && s.slot_held => {
                    s.reboot = None;
                    s.retry_at = Some(next_check);
                    why = format!(
                        "gate {gate:?} says wait ({reason}); holding the slot, asking again at {next_check}"
                    );
                }
                Phase::AcquiringSlot | Phase::Draining | Phase::Rebooting => {
                    s.not_before = Some(next_check);
                    back_out(&mut s, now);
                    why = format!(
                        "gate {gate:?} says wait ({reason}); backing out and releasing the slot, asking again at {next_check}"
                    );
                }
                _ => {
                    s.not_before = Some(next_check);
                    why = format!(
                        "gate {gate:?} says wait ({reason}); not taking a slot, asking again at {next_check}"
                    )
                }
            }
            let wait = GateWait {
                name: gate,
                why: reason,
                since,
                next_check,
            };
            s.waiting_for = Some(wait.describe());
            s.gate = Some(wait);
        }
        Event::Cordoned { by_us } => {
            s.cordon_recorded = true;
            s.cordoned_by_us = by_us;
            why = if by_us {
                "node cordoned by rebootd".into()
            } else {
                "node was already unschedulable; rebootd will leave it so".into()
            };
        }
        Event::Drained => {
            enter(&mut s, Phase::Rebooting, now);
            why = "node drained".into();
        }
        Event::DrainFailed {
            error,
            reboot_anyway,
        } => {
            s.last_error = Some(format!("drain failed: {error}"));
            if reboot_anyway {
                enter(&mut s, Phase::Rebooting, now);
                why =
                    format!("drain failed ({error}); rebooting anyway (on_drain_failure = reboot)");
            } else {
                back_out(&mut s, now);
                s.not_before = Some(add(now, policy.retry_interval));
                why = format!("drain failed ({error}); backing out (on_drain_failure = abort)");
            }
        }
        // Asked right before logind would be: the request waits (the checks run again after).
        Event::UsersWarned { sessions, until } => match (s.phase, &s.reboot) {
            (Phase::Rebooting, None)
            | (Phase::Rebooting, Some(RebootRequest { called: false, .. })) => {
                s.reboot = None;
                let who = crate::users::describe(&sessions);
                why = format!(
                    "logged in: {who}; logind announces the reboot for {until}; holding the slot until then"
                );
                s.waiting_for = Some(format!(
                    "the time announced to logged-in users ({who}) to pass at {until}"
                ));
                s.users_warned = Some(crate::users::Warning {
                    until,
                    sessions,
                    over: false,
                });
            }
            _ => why = "a users' warning outside the rebooting phase (no change)".into(),
        },
        Event::UsersWarningOver => {
            if let Some(w) = s.users_warned.as_mut() {
                w.over = true;
            }
            s.waiting_for = None;
            why = "the time announced to logged-in users passed".into();
        }
        Event::ReadyToReboot => {
            s.reboot = Some(RebootRequest {
                requested_at: now,
                boot_id: s.boot_id.clone(),
                called: false,
            });
            why = "asking logind to reboot".into();
        }
        Event::RebootAccepted => {
            if let Some(r) = s.reboot.as_mut() {
                r.called = true;
            }
            let deadline = s
                .reboot
                .as_ref()
                .map(|r| add(r.requested_at, policy.reboot_timeout));
            s.waiting_for = deadline.map(|d| format!("the host to go down (until {d})"));
            why = "logind accepted the reboot".into();
        }
        Event::RebootRefused { error } => {
            s.reboot = None;
            s.retry_at = Some(add(now, policy.retry_interval));
            s.waiting_for = Some(format!("retry after the reboot was refused: {error}"));
            why = format!("reboot refused: {error}");
            s.last_error = Some(why.clone());
        }
        Event::Inhibited { by } => match s.phase {
            // Not asked: logind is called once none blocks, after the window and the blockers
            // are checked again (time may have passed).
            Phase::Rebooting => {
                s.reboot = None;
                if by.is_empty() {
                    let was = inhibitor::describe(&s.inhibited_by);
                    why = if was.is_empty() {
                        "no block inhibitor held".into()
                    } else {
                        format!("block inhibitors released ({was}); asking logind again")
                    };
                    s.waiting_for = None;
                } else {
                    let list = inhibitor::describe(&by);
                    why = format!("block inhibitors on shutdown held: {list}; not asking logind until they are released");
                    s.waiting_for = Some(format!("block inhibitors to be released: {list}"));
                }
                s.inhibited_by = by;
            }
            _ => why = "inhibitors seen outside the rebooting phase (no change)".into(),
        },
        Event::RebootTimedOut => {
            s.failed_attempts += 1;
            let at = s
                .reboot
                .as_ref()
                .map_or("?".to_string(), |r| r.requested_at.to_string());
            s.reboot = None;
            why = format!(
                "the reboot requested at {at} did not happen within {}; asking again (failed attempts: {})",
                humantime::format_duration(policy.reboot_timeout),
                s.failed_attempts
            );
            s.last_error = Some(why.clone());
        }
        Event::NotHealthy { error } => {
            why = format!(
                "the node is not healthy after the reboot ({error}); keeping the slot so the rollout stops here"
            );
            s.waiting_for = Some("the node to become Ready (holding the slot)".into());
            s.last_error = Some(why.clone());
        }
        Event::Healthy => {
            let next = if s.cordoned_by_us {
                Phase::Uncordoning
            } else {
                Phase::Releasing
            };
            enter(&mut s, next, now);
            why = "node healthy after boot".into();
            if let Some(d) = policy.settle.filter(|_| s.slot_held) {
                s.settle_until = Some(add(now, d));
                settling(&mut s);
            }
        }
        Event::Uncordoned => {
            s.cordoned_by_us = false;
            s.cordon_recorded = false;
            if s.slot_held {
                enter(&mut s, Phase::Releasing, now);
                settling(&mut s);
                why = "node uncordoned".into();
            } else {
                // Backing out of a lost slot: nothing to release.
                enter(&mut s, Phase::RebootNeeded, now);
                why = "node uncordoned; waiting for a slot again".into();
            }
        }
        Event::Released => {
            s.slot_held = false;
            s.settle_until = None;
            s.cordon_recorded = false;
            s.failed_attempts = 0;
            if s.not_before.is_none() {
                s.last_error = None;
            }
            if s.reason.is_some() {
                enter(&mut s, Phase::RebootNeeded, now);
                s.waiting_for = s.gate.as_ref().map(GateWait::describe);
                why = "slot released; a reboot is still needed".into();
            } else {
                enter(&mut s, Phase::Idle, now);
                why = "slot released; cycle complete".into();
            }
        }
        Event::RetryDue => {
            // One sleep served whichever was set; blockers and windows are checked again anyway.
            s.retry_at = None;
            s.not_before = None;
            s.settle_until = None;
            why = "retrying".into();
        }
        Event::Paused { reason } => {
            let said = reason
                .as_deref()
                .map_or(String::new(), |r| format!(" ({r})"));
            s.paused = Some(Pause {
                since: s.paused.as_ref().map_or(now, |p| p.since),
                reason,
            });
            if before_logind(&s) && holds_or_may_hold(&s) {
                s.reboot = None;
                s.retry_at = None;
                s.gate = None;
                back_out(&mut s, now);
                why = format!("paused{said}: backing out of this reboot (undoing rebootd's cordon, giving the slot back); the need is kept for after resume");
            } else {
                why = format!(
                    "paused{said}: no slot is taken and no reboot started until `rebootctl resume`"
                );
            }
        }
        Event::Resumed => {
            why = match s.paused.take() {
                Some(p) => format!("resumed (paused since {})", p.since),
                None => "resume: not paused (no change)".into(),
            };
            if matches!(s.phase, Phase::RebootNeeded | Phase::WaitingForWindow) {
                s.waiting_for = None;
            }
        }
        Event::GroupPaused { pause } => {
            let said = pause.describe();
            why = format!(
                "the group is paused ({said}): no slot is taken until `rebootctl resume --group`"
            );
            s.waiting_for = Some(format!(
                "`rebootctl resume --group` (the group is paused {said})"
            ));
            s.group_paused = Some(pause);
        }
        Event::GroupResumed => {
            s.group_paused = None;
            s.waiting_for = None;
            why = "the group was resumed: waiting for a slot".into();
        }
        Event::Cancelled => match s.phase {
            Phase::Idle => why = "cancel: no reboot pending (no change)".into(),
            // Backing out of an attempt, or a new need noted during the post-boot steps: the
            // need goes, the steps under way finish (then idle).
            Phase::WaitingForHealthy | Phase::Uncordoning | Phase::Releasing
                if s.reason.is_some() =>
            {
                drop_need(&mut s);
                why = format!(
                    "reboot cancelled by the operator; phase {} finishes, then idle",
                    s.phase
                );
            }
            Phase::WaitingForHealthy | Phase::Uncordoning | Phase::Releasing => {
                why = format!(
                    "cancel: the reboot already happened; the post-boot steps go on (phase {})",
                    s.phase
                )
            }
            _ if !before_logind(&s) => {
                why = "cancel refused: logind was already asked to reboot".into()
            }
            Phase::RebootNeeded | Phase::WaitingForWindow => {
                drop_need(&mut s);
                enter(&mut s, Phase::Idle, now);
                why = "reboot cancelled by the operator".into();
            }
            Phase::AcquiringSlot | Phase::Draining | Phase::Rebooting => {
                drop_need(&mut s);
                back_out(&mut s, now);
                why = "reboot cancelled by the operator: undoing rebootd's cordon, giving the slot back".into();
            }
        },
    }
    if s.paused.is_some()
        && s.retry_at.is_none()
        && matches!(s.phase, Phase::RebootNeeded | Phase::WaitingForWindow)
    {
        s.waiting_for = Some("`rebootctl resume` (paused)".into());
    }
    Step {
        state: s,
        why,
        refused: None,
    }
}

/// Whether logind has not been asked yet in this cycle (an accepted or possibly accepted call
/// cannot be taken back).
fn before_logind(s: &State) -> bool {
    !s.reboot.as_ref().is_some_and(|r| r.called)
}

/// Whether this node holds a slot or is taking one (an interrupted acquire may have taken it):
/// the phases a pause or a cancel backs out of.
fn holds_or_may_hold(s: &State) -> bool {
    matches!(
        s.phase,
        Phase::AcquiringSlot | Phase::Draining | Phase::Rebooting
    )
}

/// Forget the reboot this cycle was for (a cancel).
fn drop_need(s: &mut State) {
    s.reason = None;
    s.gate = None;
    s.reboot = None;
    s.retry_at = None;
    s.not_before = None;
    s.failed_attempts = 0;
}

#[cfg(test)]
mod gate_tests;

#[cfg(test)]
mod tests {
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
        let s = run(&s, vec![Event::ReadyToReboot]);
        assert_eq!(next_action(&s, &policy()), Action::CallReboot);
        let s = run(&s, vec![Event::RebootAccepted]);
        assert!(matches!(
            next_action(&s, &policy()),
            Action::AwaitReboot { .. }
        ));
        // The next boot.
        let s = run(
            &s,
            vec![Event::Started {
                boot_id: "boot2".into(),
            }],
        );
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
        let s = run(
            &State::new("boot1", t(0)),
            vec![
                needed(),
                Event::WindowOpen,
                Event::SlotAcquired,
                Event::ReadyToReboot,
            ],
        );
        // Crash after the marker was written, maybe before logind was called.
        let s = run(
            &s,
            vec![Event::Started {
                boot_id: "boot1".into(),
            }],
        );
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
        let s = run(&s, vec![Event::ReadyToReboot, Event::RebootAccepted]);
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
            vec![
                needed(),
                Event::WindowOpen,
                Event::SlotAcquired,
                Event::ReadyToReboot,
                Event::RebootAccepted,
                Event::Started {
                    boot_id: "boot1".into(),
                },
            ],
        );
        assert_eq!(s.reboot, None);
        assert_eq!(next_action(&s, &policy()), Action::PrepareReboot);
        let s = run(
            &s,
            vec![Event::Started {
                boot_id: "boot2".into(),
            }],
        );
        assert_eq!(s.phase, Phase::WaitingForHealthy);
        assert_eq!(s.reboots, 1, "counted as rebootd's reboot");
        assert_eq!(s.failed_attempts, 0);
        let s = run(&s, vec![Event::Healthy, Event::Released]);
        assert_eq!(s.phase, Phase::Idle);

        // Not after a cycle that ended without a reboot: failed attempts start again from 0.
        let s = run(
            &State::new("boot1", t(0)),
            vec![
                needed(),
                Event::WindowOpen,
                Event::SlotAcquired,
                Event::ReadyToReboot,
                Event::RebootAccepted,
                Event::RebootTimedOut,
            ],
        );
        assert_eq!(s.failed_attempts, 1);
    }

    #[test]
    fn refused_reboot_backs_off_then_retries() {
        let s = run(
            &State::new("b", t(0)),
            vec![
                needed(),
                Event::WindowOpen,
                Event::SlotAcquired,
                Event::ReadyToReboot,
                Event::RebootRefused {
                    error: "blocked by inhibitor of backup".into(),
                },
            ],
        );
        assert!(matches!(next_action(&s, &policy()), Action::Sleep { .. }));
        assert!(s.last_error.as_deref().unwrap().contains("backup"));
        let s = run(&s, vec![Event::RetryDue]);
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
        let s = run(
            &State::new("b", t(0)),
            vec![
                needed(),
                Event::WindowOpen,
                Event::SlotAcquired,
                Event::ReadyToReboot,
            ],
        );
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
        let s = run(
            &s,
            vec![Event::Started {
                boot_id: "b".into(),
            }],
        );
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
        let s = run(
            &s,
            vec![Event::Started {
                boot_id: "b2".into(),
            }],
        );
        assert_eq!(s.phase, Phase::WaitingForHealthy);
        // Without a slot, an unplanned reboot just clears the need.
        let s = run(
            &State::new("b1", t(0)),
            vec![
                needed(),
                Event::Started {
                    boot_id: "b2".into(),
                },
            ],
        );
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
        let failed = step(
            &cordoned,
            Event::DrainFailed {
                error: "pdb".into(),
                reboot_anyway: false,
            },
            t(3),
            &p,
        )
        .state;
        assert_eq!(failed.phase, Phase::Uncordoning);
        let was = step(&s, Event::Cordoned { by_us: false }, t(2), &p).state;
        let failed = step(
            &was,
            Event::DrainFailed {
                error: "pdb".into(),
                reboot_anyway: false,
            },
            t(3),
            &p,
        )
        .state;
        assert_eq!(failed.phase, Phase::Releasing);
        let anyway = step(
            &cordoned,
            Event::DrainFailed {
                error: "pdb".into(),
                reboot_anyway: true,
            },
            t(3),
            &p,
        )
        .state;
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
        s = step(&s, Event::ReadyToReboot, t(4), &p).state;
        assert_eq!(next_action(&s, &p), Action::CallReboot);
        let s = lost(&s);
        assert_eq!(s.reboot, None);
        assert_eq!(s.phase, Phase::RebootNeeded);
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
        let s = run(
            &again,
            vec![Event::Started {
                boot_id: "b".into(),
            }],
        );
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
                Event::ReadyToReboot,
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
                Event::ReadyToReboot,
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
            Action::CheckWindow | Action::WaitForWindow | Action::PrepareReboot => {
                match rng.pick(4) {
                    0 => Event::WindowClosed {
                        next_open: Some(t(99)),
                    },
                    1 => Event::Blocked {
                        pods: vec!["a/b".into()],
                    },
                    _ if matches!(action, Action::PrepareReboot) => Event::ReadyToReboot,
                    _ => Event::WindowOpen,
                }
            }
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
                0 => Event::DrainFailed {
                    error: "pdb".into(),
                    reboot_anyway: false,
                },
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
            let mut after: Option<bool> = None; // Some(called before the request)
            for i in 0..60 {
                if i == at {
                    after = Some(s.reboot.as_ref().is_some_and(|r| r.called));
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
        let ready = run(
            &State::new("b1", t(0)),
            vec![
                needed(),
                Event::WindowOpen,
                Event::SlotAcquired,
                Event::ReadyToReboot,
            ],
        );
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
        let restarted = run(
            &warned,
            vec![Event::Started {
                boot_id: "b1".into(),
            }],
        );
        assert_eq!(
            next_action(&restarted, &p),
            Action::WarnUsers { until: t(300) }
        );
        // The time passed: the checks again, then the call; the warning is kept (not again).
        let over = run(&warned, vec![Event::UsersWarningOver]);
        assert_eq!(next_action(&over, &p), Action::PrepareReboot);
        let asked = run(&over, vec![Event::ReadyToReboot]);
        assert_eq!(next_action(&asked, &p), Action::CallReboot);
        assert!(asked.users_warned.as_ref().is_some_and(|w| w.over));
        // Rebooted: the warning belonged to that reboot.
        let back = run(
            &run(&asked, vec![Event::RebootAccepted]),
            vec![Event::Started {
                boot_id: "b2".into(),
            }],
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
                Event::Started {
                    boot_id: "b".into(),
                },
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
}
