//! The reboot: logged-in users warned and given their time, block inhibitors waited out, the
//! request put on record before logind is asked, then accepted, refused, or lost in time.

use super::{add, Policy, RebootPlan};
use crate::inhibitor::{self, Inhibitor};
use crate::state::{Phase, RebootRequest, State};
use crate::users::{Session, Warning};
use jiff::Timestamp;

/// People are logged in, as seen right before logind would be asked: the request waits until
/// the time announced to them is over (the checks run again after).
pub(super) fn users_warned(s: &mut State, sessions: Vec<Session>, until: Timestamp) -> String {
    match (s.phase, &s.reboot) {
        (Phase::Rebooting, None)
        | (Phase::Rebooting, Some(RebootRequest { called: false, .. })) => {
            s.reboot = None;
            let who = crate::users::describe(&sessions);
            s.waiting_for = Some(format!(
                "the time announced to logged-in users ({who}) to pass at {until}"
            ));
            s.users_warned = Some(Warning {
                until,
                sessions,
                over: false,
            });
            format!(
                "logged in: {who}; logind announces the reboot for {until}; holding the slot until then"
            )
        }
        _ => "a users' warning outside the rebooting phase (no change)".into(),
    }
}

/// The time given to logged-in users is over.
pub(super) fn users_warning_over(s: &mut State) -> String {
    if let Some(w) = s.users_warned.as_mut() {
        w.over = true;
    }
    s.waiting_for = None;
    "the time announced to logged-in users passed".into()
}

/// Everything allows the reboot: the request goes on record before logind is asked, with its
/// kind and systemd's soft reboot count (the proof of a soft reboot after it).
pub(super) fn ready(s: &mut State, plan: RebootPlan, now: Timestamp) -> String {
    s.reboot = Some(RebootRequest {
        requested_at: now,
        boot_id: s.boot_id.clone(),
        called: false,
        kind: plan.kind,
        soft_reboots: plan.soft_reboots,
    });
    if plan.why.is_empty() {
        format!("asking logind to {}", plan.kind)
    } else {
        format!("asking logind to {} ({})", plan.kind, plan.why)
    }
}

/// logind accepted: wait for the host to go down until `reboot_timeout` has passed.
pub(super) fn accepted(s: &mut State, policy: &Policy) -> String {
    if let Some(r) = s.reboot.as_mut() {
        r.called = true;
    }
    let deadline = s
        .reboot
        .as_ref()
        .map(|r| add(r.requested_at, policy.reboot_timeout));
    s.waiting_for = deadline.map(|d| format!("the host to go down (until {d})"));
    "logind accepted the reboot".into()
}

/// The call got no answer: logind may have accepted it, and the host may be going down now.
/// It is taken as accepted (the request stays on record, so a reboot that follows is known as
/// this one and `cancel` is refused); the host is given until `reboot_timeout` to go down, then
/// logind is asked again.
pub(super) fn unanswered(s: &mut State, error: &str, policy: &Policy) -> String {
    accepted(s, policy);
    let why = format!("logind did not answer the reboot call ({error}); it may have accepted it");
    s.last_error = Some(why.clone());
    match &s.waiting_for {
        Some(w) => format!("{why}: waiting for {w} as if it had, then asking again"),
        None => why,
    }
}

/// logind refused: the request goes, and is made again after `retry_interval`.
pub(super) fn refused(s: &mut State, error: &str, now: Timestamp, policy: &Policy) -> String {
    s.reboot = None;
    s.retry_at = Some(add(now, policy.retry_interval));
    s.waiting_for = Some(format!("retry after the reboot was refused: {error}"));
    let why = format!("reboot refused: {error}");
    s.last_error = Some(why.clone());
    why
}

/// The block inhibitors held right before the reboot. logind is not asked: it is called once
/// none blocks, after the window and the blockers are checked again (time may have passed).
pub(super) fn inhibited(s: &mut State, by: Vec<Inhibitor>) -> String {
    if s.phase != Phase::Rebooting {
        return "inhibitors seen outside the rebooting phase (no change)".into();
    }
    s.reboot = None;
    let why = if by.is_empty() {
        let was = inhibitor::describe(&s.inhibited_by);
        s.waiting_for = None;
        if was.is_empty() {
            "no block inhibitor held".into()
        } else {
            format!("block inhibitors released ({was}); asking logind again")
        }
    } else {
        let list = inhibitor::describe(&by);
        s.waiting_for = Some(format!("block inhibitors to be released: {list}"));
        format!(
            "block inhibitors on shutdown held: {list}; not asking logind until they are released"
        )
    };
    s.inhibited_by = by;
    why
}

/// An accepted reboot did not happen within `reboot_timeout`: the request goes, to be made
/// again.
pub(super) fn timed_out(s: &mut State, policy: &Policy) -> String {
    s.failed_attempts += 1;
    let at = s
        .reboot
        .as_ref()
        .map_or("?".to_string(), |r| r.requested_at.to_string());
    s.reboot = None;
    let why = format!(
        "the reboot requested at {at} did not happen within {}; asking again (failed attempts: {})",
        humantime::format_duration(policy.reboot_timeout),
        s.failed_attempts
    );
    s.last_error = Some(why.clone());
    why
}
