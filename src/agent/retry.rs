//! Back-offs: an error from the lock backend or the API server, and the end of a wait.

use super::{add, Policy};
use crate::state::State;
use jiff::Timestamp;

/// A lock backend or API server error: stay in the phase, retry after `retry_interval`.
pub(super) fn transient(s: &mut State, error: String, now: Timestamp, policy: &Policy) -> String {
    s.retry_at = Some(add(now, policy.retry_interval));
    s.waiting_for = Some(format!("retry after: {error}"));
    let why = format!("{error}; retrying");
    s.last_error = Some(error);
    why
}

/// A back-off ended. One sleep served whichever was set; blockers and windows are checked
/// again anyway.
pub(super) fn retry_due(s: &mut State) -> String {
    s.retry_at = None;
    s.not_before = None;
    s.settle_until = None;
    "retrying".into()
}
