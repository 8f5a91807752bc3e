//! Why a node that needs a reboot is not rebooting now, as one reason out of a fixed set: the
//! `reason` label of `rebootd_waiting` and what `rebootd_reboot_blocked` sums up. Derived from
//! the state alone, so it needs nothing the agent does not already record.

use crate::state::{Phase, State};
use jiff::Timestamp;

/// What a node that needs a reboot waits for, in the order the checks below look.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Waiting {
    /// An operator paused this node (`rebootctl pause`).
    Paused,
    /// An operator paused the group (`rebootctl pause --group`).
    GroupPaused,
    /// A gate (`[gates]`) said wait.
    Gate,
    /// A block inhibitor on shutdown holds the reboot off.
    Inhibitor,
    /// The time announced to logged-in users has not passed.
    Users,
    /// Pods matching `blocking_pods` run on the node.
    BlockingPods,
    /// The maintenance window is closed.
    Window,
    /// A back-off after an error or a refusal.
    Retry,
    /// Behind other nodes for a slot of the semaphore.
    Slot,
}

impl Waiting {
    /// Every reason, in the order they are rendered.
    pub const ALL: [Waiting; 9] = [
        Waiting::Paused,
        Waiting::GroupPaused,
        Waiting::Gate,
        Waiting::Inhibitor,
        Waiting::Users,
        Waiting::BlockingPods,
        Waiting::Window,
        Waiting::Retry,
        Waiting::Slot,
    ];

    /// The label value.
    pub fn label(self) -> &'static str {
        match self {
            Waiting::Paused => "paused",
            Waiting::GroupPaused => "group_paused",
            Waiting::Gate => "gate",
            Waiting::Inhibitor => "inhibitor",
            Waiting::Users => "users",
            Waiting::BlockingPods => "blocking_pods",
            Waiting::Window => "window",
            Waiting::Retry => "retry",
            Waiting::Slot => "slot",
        }
    }

    /// Whether this holds back a reboot the rollout would otherwise make now (kured's
    /// `reboot_blocked`): a gate, an inhibitor or blocking pods, not a queue, window or pause.
    pub fn blocks(self) -> bool {
        matches!(
            self,
            Waiting::Gate | Waiting::Inhibitor | Waiting::BlockingPods
        )
    }
}

/// The prefix of `waiting_for` that `agent::gates::blocked` writes.
const BLOCKING_PODS: &str = "blocking pods";

/// Why `s` waits at `now`; `None` when no reboot is needed, or the node is at work on one
/// (draining, asking logind, back after the boot, backing out).
pub fn waiting(s: &State, now: Timestamp) -> Option<Waiting> {
    s.reason.as_ref()?;
    if matches!(
        s.phase,
        Phase::Idle | Phase::WaitingForHealthy | Phase::Uncordoning | Phase::Releasing
    ) {
        return None;
    }
    let later = |t: Option<Timestamp>| t.is_some_and(|t| t > now);
    let reason = if s.paused.is_some() {
        Waiting::Paused
    } else if s.group_paused.is_some() {
        Waiting::GroupPaused
    } else if s.gate.is_some() {
        Waiting::Gate
    } else if !s.inhibited_by.is_empty() {
        Waiting::Inhibitor
    } else if s.users_warned.as_ref().is_some_and(|w| !w.over) {
        Waiting::Users
    } else if s
        .waiting_for
        .as_deref()
        .is_some_and(|w| w.starts_with(BLOCKING_PODS))
    {
        Waiting::BlockingPods
    } else if s.phase == Phase::WaitingForWindow {
        Waiting::Window
    } else if later(s.retry_at) || later(s.not_before) {
        Waiting::Retry
    } else if s.phase == Phase::AcquiringSlot {
        Waiting::Slot
    } else {
        return None;
    };
    Some(reason)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::{step, Event, Policy};
    use crate::need::{Need, TriggerSource};
    use std::time::Duration;

    fn t(s: i64) -> Timestamp {
        Timestamp::from_second(s).unwrap()
    }

    fn policy() -> Policy {
        Policy {
            drain: true,
            reboot_timeout: Duration::from_secs(600),
            retry_interval: Duration::from_secs(60),
            gate_interval: Duration::from_secs(30),
            settle: None,
        }
    }

    /// A state that needs a reboot, stepped through `events` by the real agent.
    fn after(events: Vec<Event>) -> State {
        let mut s = State::new("b", t(0));
        let need = Need::new(TriggerSource::Rebootctl, "x");
        for e in std::iter::once(Event::RebootNeeded { need }).chain(events) {
            s = step(&s, e, t(10), &policy()).state;
        }
        s
    }

    #[test]
    fn each_reason_as_the_agent_records_it() {
        assert_eq!(waiting(&State::new("b", t(0)), t(10)), None, "idle");
        let closed = after(vec![Event::WindowClosed {
            next_open: Some(t(3600)),
        }]);
        assert_eq!(waiting(&closed, t(10)), Some(Waiting::Window));
        let queued = after(vec![Event::WindowOpen]);
        assert_eq!(queued.phase, Phase::AcquiringSlot);
        assert_eq!(waiting(&queued, t(10)), Some(Waiting::Slot));
        let gated = after(vec![Event::Gated {
            gate: "alerts".into(),
            why: "firing".into(),
            hold: false,
        }]);
        assert_eq!(waiting(&gated, t(10)), Some(Waiting::Gate));
        // The agent's own words for blocking pods: a change there must change this too.
        let blocked = after(vec![Event::Blocked {
            pods: vec!["db/pg-0".into()],
        }]);
        assert_eq!(waiting(&blocked, t(10)), Some(Waiting::BlockingPods));
        let failed = after(vec![
            Event::WindowOpen,
            Event::Transient {
                error: "etcd down".into(),
            },
        ]);
        assert_eq!(waiting(&failed, t(10)), Some(Waiting::Retry));
        assert_eq!(
            waiting(&failed, t(100_000)),
            Some(Waiting::Slot),
            "the back-off is over"
        );
        let mut paused = queued.clone();
        paused.paused = Some(crate::state::Pause {
            since: t(0),
            reason: None,
        });
        assert_eq!(waiting(&paused, t(10)), Some(Waiting::Paused));
        let held = after(vec![Event::WindowOpen, Event::SlotAcquired]);
        assert!(held.slot_held);
        assert_eq!(waiting(&held, t(10)), None, "at work: draining");
    }

    #[test]
    fn only_gates_inhibitors_and_pods_block() {
        let blocking: Vec<_> = Waiting::ALL.into_iter().filter(|w| w.blocks()).collect();
        assert_eq!(
            blocking,
            [Waiting::Gate, Waiting::Inhibitor, Waiting::BlockingPods]
        );
    }
}
