//! What holds a reboot back before logind is asked: blocking pods and the gates (`[gates]`).
//! Before the slot they delay taking one; after it they back out, except a Node gate, which
//! holds the slot while it waits.

use super::{add, back_out, Event, Policy};
use crate::state::{GateWait, Phase, State};
use jiff::Timestamp;

/// Whether an event shows the gates went (or were not asked, so what they said is stale): the
/// checks after them ran, the window decided first, or the host rebooted.
pub(super) fn clears_gate(event: &Event, s: &State) -> bool {
    match event {
        Event::WindowOpen
        | Event::WindowClosed { .. }
        | Event::Blocked { .. }
        | Event::Cordoned { .. }
        | Event::ReadyToReboot(_)
        | Event::Healthy => true,
        Event::Started { boot_id, .. } => *boot_id != s.boot_id,
        _ => false,
    }
}

/// Blocking pods run: no slot is taken, and one taken is given back, until `retry_interval`
/// has passed.
pub(super) fn blocked(s: &mut State, pods: &[String], now: Timestamp, policy: &Policy) -> String {
    let list = pods.join(", ");
    s.not_before = Some(add(now, policy.retry_interval));
    let why = match s.phase {
        // As for a gate: a reboot asked before a restart may still be pending (finding 15).
        Phase::Rebooting if s.slot_held && s.logind_asked() => {
            s.not_before = None;
            s.retry_at = Some(add(now, policy.retry_interval));
            format!(
                "blocking pods run ({list}); a reboot asked before rebootd restarted may still be pending, so the slot and the cordon are kept"
            )
        }
        Phase::AcquiringSlot | Phase::Draining | Phase::Rebooting => {
            back_out(s, now);
            format!("blocking pods run ({list}); backing out")
        }
        _ => format!("blocking pods run ({list}); not taking a slot"),
    };
    s.waiting_for = Some(format!("blocking pods to finish: {list}"));
    why
}

/// A gate says wait; it is asked again after `gate_interval`.
///
/// A gate that closes after the slot was taken backs out like blocking pods: before the cordon
/// the slot is released at once so another node can go; after the drain rebootd uncordons what
/// it cordoned and releases, since an alert the drain itself fired would otherwise hold the
/// node drained for good. A Node gate (`hold`) is asked only with the slot held and keeps it,
/// as FLUO counts a node in its before-reboot checks as rebooting.
pub(super) fn gated(
    s: &mut State,
    gate: String,
    reason: String,
    hold: bool,
    now: Timestamp,
    policy: &Policy,
) -> String {
    let next_check = add(now, policy.gate_interval);
    let since = match &s.gate {
        Some(g) if g.name == gate => g.since,
        _ => now,
    };
    let why = match s.phase {
        // A check after the boot: the slot stays held, so the rollout waits here.
        Phase::WaitingForHealthy => {
            s.retry_at = Some(next_check);
            format!(
                "after the boot, gate {gate:?} says wait ({reason}); holding the slot, asking again at {next_check}"
            )
        }
        // A reboot asked before a restart in this boot may still be pending in logind: backing
        // out would give the slot back while the host can still go down (finding 15).
        Phase::Rebooting if s.slot_held && s.logind_asked() => {
            s.retry_at = Some(next_check);
            format!(
                "gate {gate:?} says wait ({reason}); a reboot asked before rebootd restarted may still be pending, so the slot and the cordon are kept; asking again at {next_check}"
            )
        }
        Phase::Draining | Phase::Rebooting if hold && s.slot_held => {
            s.reboot = None;
            s.retry_at = Some(next_check);
            format!(
                "gate {gate:?} says wait ({reason}); holding the slot, asking again at {next_check}"
            )
        }
        Phase::AcquiringSlot | Phase::Draining | Phase::Rebooting => {
            s.not_before = Some(next_check);
            back_out(s, now);
            format!(
                "gate {gate:?} says wait ({reason}); backing out and releasing the slot, asking again at {next_check}"
            )
        }
        _ => {
            s.not_before = Some(next_check);
            format!(
                "gate {gate:?} says wait ({reason}); not taking a slot, asking again at {next_check}"
            )
        }
    };
    let wait = GateWait {
        name: gate,
        why: reason,
        since,
        next_check,
    };
    s.waiting_for = Some(wait.describe());
    s.gate = Some(wait);
    why
}
