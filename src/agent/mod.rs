//! The agent's state machine, pure: `step(state, event) -> state` and `next_action(state)`.
//!
//! No I/O happens here. The runtime (`runtime/`) performs the action the state asks for, turns
//! its outcome into an [`Event`], steps, and persists the new state before the next action, so
//! every side effect is guarded by a state written before it.
//!
//! [`step`] refuses an event that does not belong to the phase ([`admit`]) and hands any other
//! to the handler of its stage, one module each: `start` (the process starting, triggers),
//! `window`, `gates` (blocking pods and `[gates]`), `slot`, `drain`, `reboot`, `after_boot`
//! (health, uncordon, settle, release), `operator` (pause, resume, cancel) and `retry`
//! (back-offs). Each handler changes the state and returns why.

use crate::inhibitor::Inhibitor;
use crate::lock::GroupPause;
use crate::need::Need;
pub use crate::reboot_method::Plan as RebootPlan;
use crate::state::{Phase, State};
use jiff::Timestamp;
use std::time::Duration;

mod after_boot;
mod drain;
mod gates;
mod operator;
mod reboot;
mod retry;
mod slot;
pub(crate) use slot::after_slot;
mod start;
mod window;

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
    /// The process started, in the boot with this id; `soft_reboots` is systemd's
    /// `SoftRebootsCount` when it could be read (the proof of a soft reboot, which keeps the
    /// boot id).
    Started {
        boot_id: String,
        soft_reboots: Option<u64>,
    },
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
    /// Everything allows the reboot now: the request, of this kind, is about to be made.
    ReadyToReboot(RebootPlan),
    /// logind accepted the reboot request.
    RebootAccepted,
    /// logind refused (inhibitor, error).
    RebootRefused { error: String },
    /// The reboot call got no answer (the bus or the connection failed after it was sent):
    /// logind may have accepted it.
    RebootUnanswered { error: String },
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
            Event::ReadyToReboot(_) => "ready_to_reboot",
            Event::RebootAccepted => "reboot_accepted",
            Event::RebootRefused { .. } => "reboot_refused",
            Event::RebootUnanswered { .. } => "reboot_unanswered",
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
        | Event::ReadyToReboot(_)
        | Event::RebootRefused { .. }
        | Event::Inhibited { .. } => (p == Rebooting, "rebooting"),
        Event::UsersWarningOver => (
            p == Rebooting && s.users_warned.is_some(),
            "rebooting, with logged-in users warned",
        ),
        Event::RebootAccepted | Event::RebootUnanswered { .. } => (
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

/// `t + d`, the end of time when that does not fit.
fn add(t: Timestamp, d: Duration) -> Timestamp {
    jiff::SignedDuration::try_from(d)
        .ok()
        .and_then(|d| t.checked_add(d).ok())
        .unwrap_or(Timestamp::MAX)
}

/// Move to `phase` (a phase entered anew starts its own clock, inhibitors, warning and group
/// pause); what the node waited for is said again by the handler.
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

/// Undo what was done for a reboot that will not happen now: uncordon, then release.
fn back_out(s: &mut State, now: Timestamp) {
    let phase = if s.cordoned_by_us {
        Phase::Uncordoning
    } else {
        Phase::Releasing
    };
    enter(s, phase, now);
}

/// Apply an event to a state: an event that does not belong to the phase is refused and
/// changes nothing; any other goes to the handler of its stage.
pub fn step(old: &State, event: Event, now: Timestamp, policy: &Policy) -> Step {
    if let Err(refused) = admit(old, &event) {
        return Step {
            state: old.clone(),
            why: refused.to_string(),
            refused: Some(refused),
        };
    }
    let mut s = old.clone();
    if gates::clears_gate(&event, &s) {
        s.gate = None;
    }
    let why = handle(&mut s, event, now, policy);
    operator::show_pause(&mut s);
    Step {
        state: s,
        why,
        refused: None,
    }
}

/// Hand an admitted event to its stage's handler, which changes the state and says why.
fn handle(s: &mut State, event: Event, now: Timestamp, policy: &Policy) -> String {
    match event {
        Event::Started {
            boot_id,
            soft_reboots,
        } => start::started(s, boot_id, soft_reboots, now),
        Event::RebootNeeded { need } => start::reboot_needed(s, need, now),
        Event::WindowOpen => window::open(s, now),
        Event::WindowClosed { next_open } => window::closed(s, next_open, now),
        Event::SlotAcquired => slot::acquired(s, now, policy),
        Event::SlotLost { why } => slot::lost(s, &why, now),
        Event::GroupPaused { pause } => slot::group_paused(s, pause),
        Event::GroupResumed => slot::group_resumed(s),
        Event::Transient { error } => retry::transient(s, error, now, policy),
        Event::RetryDue => retry::retry_due(s),
        Event::Blocked { pods } => gates::blocked(s, &pods, now, policy),
        Event::Gated { gate, why, hold } => gates::gated(s, gate, why, hold, now, policy),
        Event::Cordoned { by_us } => drain::cordoned(s, by_us),
        Event::Drained => drain::drained(s, now),
        Event::DrainFailed {
            error,
            reboot_anyway,
        } => drain::failed(s, &error, reboot_anyway, now, policy),
        Event::UsersWarned { sessions, until } => reboot::users_warned(s, sessions, until),
        Event::UsersWarningOver => reboot::users_warning_over(s),
        Event::ReadyToReboot(plan) => reboot::ready(s, plan, now),
        Event::RebootAccepted => reboot::accepted(s, policy),
        Event::RebootUnanswered { error } => reboot::unanswered(s, &error, policy),
        Event::RebootRefused { error } => reboot::refused(s, &error, now, policy),
        Event::Inhibited { by } => reboot::inhibited(s, by),
        Event::RebootTimedOut => reboot::timed_out(s, policy),
        Event::Healthy => after_boot::healthy(s, now, policy),
        Event::NotHealthy { error } => after_boot::not_healthy(s, &error),
        Event::Uncordoned => after_boot::uncordoned(s, now),
        Event::Released => after_boot::released(s, now),
        Event::Paused { reason } => operator::paused(s, reason, now),
        Event::Resumed => operator::resumed(s),
        Event::Cancelled => operator::cancelled(s, now),
    }
}

#[cfg(test)]
mod gate_tests;

#[cfg(test)]
mod tests;
