//! The maintenance window: open, the node goes for a slot; closed, it waits for the next one,
//! or backs out of a reboot under way.

use super::{back_out, enter};
use crate::state::{Phase, State};
use jiff::Timestamp;

/// A window is open: a node that needs a reboot goes for a slot, unless it is paused.
pub(super) fn open(s: &mut State, now: Timestamp) -> String {
    match s.phase {
        _ if s.paused.is_some() => "window open, but paused: no slot is taken".into(),
        Phase::RebootNeeded | Phase::WaitingForWindow => {
            enter(s, Phase::AcquiringSlot, now);
            "maintenance window open".into()
        }
        _ => "window open (no change)".into(),
    }
}

/// No window is open: wait for the next one, backing out of what was done for this reboot.
pub(super) fn closed(s: &mut State, next_open: Option<Timestamp>, now: Timestamp) -> String {
    let when = next_open.map_or("never".to_string(), |t| t.to_string());
    match s.phase {
        Phase::RebootNeeded | Phase::WaitingForWindow => {
            enter(s, Phase::WaitingForWindow, now);
            s.waiting_for = Some(format!("maintenance window opening at {when}"));
            format!("outside the maintenance window; next opens {when}")
        }
        // A reboot asked before a restart in this boot may still be pending in logind: backing
        // out would give the slot back (and undo the cordon) while the host can still go down.
        // Keep both and ask again when the next window opens.
        Phase::Rebooting if s.logind_asked() => {
            s.retry_at = Some(next_open.unwrap_or(now));
            s.waiting_for = Some(format!(
                "maintenance window opening at {when} (a reboot asked before rebootd restarted may still be pending: the slot and the cordon are kept)"
            ));
            format!(
                "the maintenance window closed before the reboot was asked again; a reboot asked before the restart may still be pending, so the slot and the cordon are kept (next opens {when})"
            )
        }
        Phase::AcquiringSlot | Phase::Draining | Phase::Rebooting => {
            back_out(s, now);
            format!(
                "the maintenance window closed before the reboot; backing out (next opens {when})"
            )
        }
        _ => "window closed (no change)".into(),
    }
}
