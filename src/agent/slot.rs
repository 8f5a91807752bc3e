//! The slot: taken (then the drain or the reboot), lost at a fence (back out, wait for one
//! again), or not handed out while the group is paused.

use super::{enter, Policy};
use crate::lock::GroupPause;
use crate::state::{Phase, State};
use jiff::Timestamp;

/// The slot is taken: drain first when configured, else reboot.
pub(super) fn acquired(s: &mut State, now: Timestamp, policy: &Policy) -> String {
    s.slot_held = true;
    s.last_error = None;
    enter(s, after_slot(policy), now);
    "slot acquired".into()
}

/// After the slot is taken: drain first when configured.
pub(crate) fn after_slot(policy: &Policy) -> Phase {
    if policy.drain {
        Phase::Draining
    } else {
        Phase::Rebooting
    }
}

/// A fence found the slot gone. Back out of what was done for this slot, then wait for a slot
/// again: uncordon if rebootd cordoned, and no release (there is nothing to give back).
pub(super) fn lost(s: &mut State, lost: &str, now: Timestamp) -> String {
    s.slot_held = false;
    s.reboot = None;
    s.last_error = Some(format!("slot lost: {lost}"));
    if s.cordoned_by_us {
        enter(s, Phase::Uncordoning, now);
        format!("the slot was lost ({lost}); uncordoning, then waiting for a slot again")
    } else {
        s.cordon_recorded = false;
        enter(s, Phase::RebootNeeded, now);
        format!("the slot was lost ({lost}); waiting for a slot again")
    }
}

/// The group is paused: no slot is taken until its pause changes.
pub(super) fn group_paused(s: &mut State, pause: GroupPause) -> String {
    let said = pause.describe();
    s.waiting_for = Some(format!(
        "`rebootctl resume --group` (the group is paused {said})"
    ));
    s.group_paused = Some(pause);
    format!("the group is paused ({said}): no slot is taken until `rebootctl resume --group`")
}

/// The group's pause is gone: wait for a slot again.
pub(super) fn group_resumed(s: &mut State) -> String {
    s.group_paused = None;
    s.waiting_for = None;
    "the group was resumed: waiting for a slot".into()
}
