//! The drain: the cordon recorded (whose it is decides whether rebootd undoes it), then the
//! node drained, or a failed drain that reboots anyway or backs out per `on_drain_failure`.

use super::{add, back_out, enter, Policy};
use crate::state::{Phase, State};
use jiff::Timestamp;

/// The cordon is on: rebootd undoes only a cordon it put on.
pub(super) fn cordoned(s: &mut State, by_us: bool) -> String {
    s.cordon_recorded = true;
    s.cordoned_by_us = by_us;
    if by_us {
        "node cordoned by rebootd".into()
    } else {
        "node was already unschedulable; rebootd will leave it so".into()
    }
}

/// The node is drained: reboot next.
pub(super) fn drained(s: &mut State, now: Timestamp) -> String {
    enter(s, Phase::Rebooting, now);
    "node drained".into()
}

/// The drain did not finish: reboot anyway, or back out and try again after `retry_interval`.
pub(super) fn failed(
    s: &mut State,
    error: &str,
    reboot_anyway: bool,
    now: Timestamp,
    policy: &Policy,
) -> String {
    s.last_error = Some(format!("drain failed: {error}"));
    if reboot_anyway {
        enter(s, Phase::Rebooting, now);
        format!("drain failed ({error}); rebooting anyway (on_drain_failure = reboot)")
    } else {
        back_out(s, now);
        s.not_before = Some(add(now, policy.retry_interval));
        format!("drain failed ({error}); backing out (on_drain_failure = abort)")
    }
}
