//! What the runtime keeps about a held slot beside the agent's steps: since when it is held
//! (`State::slot_since`, for the metrics), and the cluster autoscaler's courtesy
//! (`drain::autoscaler`): the Node says `scale-down-disabled=true` while the slot is held, where
//! no such annotation was, and only what rebootd added is taken off: right before the release
//! (`executor`, which retries with the slot kept, as for the reboot's labels), or here, after a
//! slot that went without a release (lost), at each step until it is off.
//!
//! The add is on record before it is made (`State::scale_down_disabled`), so a crash right after
//! it, or the reboot, still takes it off. A definite refusal (the API server answered, e.g. an
//! admission policy without this rule) clears the record; an unknown outcome keeps it, and the
//! removal after the release, guarded by the value, is then harmless. Failures are logged and
//! the reboot goes on: this is a courtesy, not a condition.

use super::{Runtime, RuntimeError};
use crate::drain::autoscaler::SCALE_DOWN_DISABLED;
use crate::state::State;
use jiff::Timestamp;
use std::sync::atomic::Ordering;
use tracing::warn;

/// Keep `slot_since` in step with `slot_held`: set when the slot is taken, gone when it is not
/// held.
pub(super) fn note_slot_since(s: &mut State, now: Timestamp) {
    match (s.slot_held, s.slot_since) {
        (true, None) => s.slot_since = Some(now),
        (false, Some(_)) => s.slot_since = None,
        _ => {}
    }
}

impl Runtime {
    /// The autoscaler's annotation for the state `s`, already on record: added once per hold
    /// (per process); once the slot is gone, taken off if still there, and the record cleared.
    /// Returns the state as recorded.
    pub(super) async fn scale_down_courtesy(&self, mut s: State) -> Result<State, RuntimeError> {
        let Some(n) = &self.node else { return Ok(s) };
        if s.slot_held {
            if s.scale_down_disabled || self.scale_down_asked.swap(true, Ordering::Relaxed) {
                return Ok(s);
            }
            s.scale_down_disabled = true;
            self.store.save(&s)?;
            let keep = match n.disable_scale_down().await {
                Ok(added) => added,
                Err(e) => {
                    let answered = e.status().is_some();
                    warn!(error = %e, "cannot set {SCALE_DOWN_DISABLED} on the node: {e}");
                    // No answer: it may be on the Node; the record makes the release take it off.
                    !answered
                }
            };
            if !keep {
                s.scale_down_disabled = false;
                self.store.save(&s)?;
            }
            return Ok(s);
        }
        self.scale_down_asked.store(false, Ordering::Relaxed);
        if s.scale_down_disabled {
            match n.enable_scale_down().await {
                Ok(()) => {
                    s.scale_down_disabled = false;
                    self.store.save(&s)?;
                }
                Err(e) => {
                    warn!(error = %e, "cannot take {SCALE_DOWN_DISABLED} off the node (tried again at the next step): {e}")
                }
            }
        }
        Ok(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_since_follows_the_slot() {
        let t = |s| Timestamp::from_second(s).unwrap();
        let mut s = State::new("b", t(0));
        note_slot_since(&mut s, t(5));
        assert_eq!(s.slot_since, None);
        s.slot_held = true;
        note_slot_since(&mut s, t(10));
        note_slot_since(&mut s, t(20));
        assert_eq!(s.slot_since, Some(t(10)), "kept while held");
        s.slot_held = false;
        note_slot_since(&mut s, t(30));
        assert_eq!(s.slot_since, None);
    }
}
