//! After the boot: the node healthy (or not yet), rebootd's cordon undone, the settle time
//! waited out with the slot held, and the slot given back.

use super::{add, enter, Policy};
use crate::state::{GateWait, Phase, State};
use jiff::Timestamp;

/// The node is healthy: uncordon what rebootd cordoned, then release, holding the slot for the
/// settle time first when one is set.
pub(super) fn healthy(s: &mut State, now: Timestamp, policy: &Policy) -> String {
    let next = if s.cordoned_by_us {
        Phase::Uncordoning
    } else {
        Phase::Releasing
    };
    enter(s, next, now);
    if let Some(d) = policy.settle.filter(|_| s.slot_held) {
        s.settle_until = Some(add(now, d));
        settling(s);
    }
    "node healthy after boot".into()
}

/// The node is not healthy in time: the slot is kept, so the rollout stops at this node.
pub(super) fn not_healthy(s: &mut State, error: &str) -> String {
    let why = format!(
        "the node is not healthy after the reboot ({error}); keeping the slot so the rollout stops here"
    );
    s.waiting_for = Some("the node to become Ready (holding the slot)".into());
    s.last_error = Some(why.clone());
    why
}

/// The node is schedulable again: release the slot, or, backing out of a lost slot (nothing to
/// release), wait for a slot again.
pub(super) fn uncordoned(s: &mut State, now: Timestamp) -> String {
    s.cordoned_by_us = false;
    s.cordon_recorded = false;
    if s.slot_held {
        enter(s, Phase::Releasing, now);
        settling(s);
        "node uncordoned".into()
    } else if s.reason.is_none() {
        // A back-out whose need went meanwhile (met by a boot).
        enter(s, Phase::Idle, now);
        "node uncordoned; cycle complete".into()
    } else {
        enter(s, Phase::RebootNeeded, now);
        "node uncordoned; waiting for a slot again".into()
    }
}

/// The slot is given back: the cycle is complete, or starts again for a need still on record.
pub(super) fn released(s: &mut State, now: Timestamp) -> String {
    s.slot_held = false;
    s.settle_until = None;
    s.cordon_recorded = false;
    s.failed_attempts = 0;
    if s.not_before.is_none() {
        s.last_error = None;
    }
    if s.reason.is_some() {
        enter(s, Phase::RebootNeeded, now);
        s.waiting_for = s.gate.as_ref().map(GateWait::describe);
        "slot released; a reboot is still needed".into()
    } else {
        enter(s, Phase::Idle, now);
        "slot released; cycle complete".into()
    }
}

/// Say so while the settle time holds the slot.
fn settling(s: &mut State) {
    if let Some(t) = s.settle_until {
        s.waiting_for = Some(format!("the settle time to end at {t} (holding the slot)"));
    }
}
