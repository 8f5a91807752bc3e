//! What an action is to the loop: a wait with no bound in time or a call that must answer
//! within the watchdog's time, and whether an operator's request may end it early.

use crate::agent::Action;
use crate::notify::Duty;

/// Whether an action waits for something with no bound in time (the watchdog is fed meanwhile)
/// or calls something that must answer within `WatchdogSec=` (it is not).
pub(super) fn duty(action: &Action) -> Duty {
    match action {
        Action::WaitForTrigger
        | Action::Sleep { .. }
        | Action::WaitForWindow
        | Action::AcquireSlot
        | Action::WaitForGroupResume { .. }
        | Action::Drain
        | Action::AwaitReboot { .. }
        | Action::AwaitInhibitors { .. }
        | Action::WarnUsers { .. }
        | Action::WaitHealthy
        | Action::WaitForResume => Duty::Wait,
        Action::CheckWindow
        | Action::PrepareReboot
        | Action::RecordCordon
        | Action::CallReboot
        | Action::Uncordon
        | Action::ReleaseSlot => Duty::Call,
    }
}

/// Whether an operator request may end this action early: waits whose future may be dropped
/// (an interrupted slot wait leaves nothing behind, see `lock::acquire::Waiting`; a drain is one
/// future). Not the calls, and not the post-boot health wait, whose timeout would start again.
pub(super) fn interruptible(action: &Action) -> bool {
    duty(action) == Duty::Wait && !matches!(action, Action::WaitHealthy)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_waits_other_than_the_health_wait_may_be_ended_early() {
        assert!(interruptible(&Action::AcquireSlot));
        assert!(interruptible(&Action::Drain));
        assert!(interruptible(&Action::WaitForResume));
        assert_eq!(duty(&Action::WaitHealthy), Duty::Wait);
        assert!(
            !interruptible(&Action::WaitHealthy),
            "its timeout would start again"
        );
        assert_eq!(duty(&Action::CallReboot), Duty::Call);
        assert!(!interruptible(&Action::CallReboot));
        assert!(!interruptible(&Action::ReleaseSlot));
    }
}
