//! Operator requests (`rebootctl pause`, `resume`, `cancel`). A pause or a cancel backs out of
//! a reboot under way only while logind has not been asked: an accepted (or possibly accepted)
//! call cannot be taken back.

use super::{back_out, enter};
use crate::state::{Pause, Phase, State};
use jiff::Timestamp;

/// The node is paused: the need is kept, no slot is taken and no reboot started until resume;
/// a reboot under way before logind is asked is backed out of.
pub(super) fn paused(s: &mut State, reason: Option<String>, now: Timestamp) -> String {
    let said = reason
        .as_deref()
        .map_or(String::new(), |r| format!(" ({r})"));
    s.paused = Some(Pause {
        since: s.paused.as_ref().map_or(now, |p| p.since),
        reason,
    });
    if before_logind(s) && holds_or_may_hold(s) {
        s.reboot = None;
        s.retry_at = None;
        s.gate = None;
        back_out(s, now);
        format!("paused{said}: backing out of this reboot (undoing rebootd's cordon, giving the slot back); the need is kept for after resume")
    } else {
        format!("paused{said}: no slot is taken and no reboot started until `rebootctl resume`")
    }
}

/// The node is resumed: a need on record goes on.
pub(super) fn resumed(s: &mut State) -> String {
    let why = match s.paused.take() {
        Some(p) => format!("resumed (paused since {})", p.since),
        None => "resume: not paused (no change)".into(),
    };
    if matches!(s.phase, Phase::RebootNeeded | Phase::WaitingForWindow) {
        s.waiting_for = None;
    }
    why
}

/// The pending reboot is cancelled: the need goes, and what was done for it is undone, unless
/// logind was asked already.
pub(super) fn cancelled(s: &mut State, now: Timestamp) -> String {
    match s.phase {
        Phase::Idle => "cancel: no reboot pending (no change)".into(),
        // Backing out of an attempt, or a new need noted during the post-boot steps: the need
        // goes, the steps under way finish (then idle).
        Phase::WaitingForHealthy | Phase::Uncordoning | Phase::Releasing if s.reason.is_some() => {
            drop_need(s);
            format!(
                "reboot cancelled by the operator; phase {} finishes, then idle",
                s.phase
            )
        }
        Phase::WaitingForHealthy | Phase::Uncordoning | Phase::Releasing => format!(
            "cancel: the reboot already happened; the post-boot steps go on (phase {})",
            s.phase
        ),
        _ if !before_logind(s) => "cancel refused: logind was already asked to reboot".into(),
        Phase::RebootNeeded | Phase::WaitingForWindow => {
            drop_need(s);
            enter(s, Phase::Idle, now);
            "reboot cancelled by the operator".into()
        }
        Phase::AcquiringSlot | Phase::Draining | Phase::Rebooting => {
            drop_need(s);
            back_out(s, now);
            "reboot cancelled by the operator: undoing rebootd's cordon, giving the slot back"
                .into()
        }
    }
}

/// A paused node that needs a reboot and has no back-off running waits for `rebootctl resume`:
/// say so, whatever the event was.
pub(super) fn show_pause(s: &mut State) {
    if s.paused.is_some()
        && s.retry_at.is_none()
        && matches!(s.phase, Phase::RebootNeeded | Phase::WaitingForWindow)
    {
        s.waiting_for = Some("`rebootctl resume` (paused)".into());
    }
}

/// Whether logind has not been asked yet in this cycle (an accepted or possibly accepted call
/// cannot be taken back, also when a restart put it aside to ask again: [`State::logind_asked`]).
fn before_logind(s: &State) -> bool {
    !s.logind_asked()
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
