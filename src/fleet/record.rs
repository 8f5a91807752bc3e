//! A node's fleet record: the one small value each node keeps in the lock store so that
//! `rebootctl fleet` can say why it waits (window, gate, inhibitor, pause, queue) and when it
//! last rebooted. Derived from the agent's state alone; a claim by that node, shown and never
//! decided on. Pure: no I/O.

use crate::metrics::{waiting, Waiting};
use crate::state::{Pause, State};
use jiff::Timestamp;
use serde::{Deserialize, Serialize};

/// The largest record value read (bytes): anything longer is unreadable, not parsed.
pub const MAX_RECORD: usize = 2048;
/// The most characters of the words a record carries about the wait.
pub const MAX_DETAIL: usize = 240;

/// What a node shows the fleet about itself. JSON in the store; fields are only ever added.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeRecord {
    /// The node name.
    pub node: String,
    /// Its holder id (the machine id).
    pub id: String,
    /// Its phase when the record was written (a holder's later phases are on its holder record).
    pub phase: String,
    /// Since when it is in that phase (its own clock; shown, never compared).
    pub since: Timestamp,
    /// Why it waits: a `rebootd_waiting` reason (`window`, `gate`, `slot`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting: Option<String>,
    /// The agent's words for the wait (the gate and its reason, the inhibitors, when the window
    /// opens), bounded to [`MAX_DETAIL`]; none for a queue wait (the queue says where it is).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// Set while an operator paused this node (`rebootctl pause`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused: Option<Pause>,
    /// When an operator cancelled its last pending reboot (`rebootctl cancel`); gone with the
    /// next need.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cancelled: Option<Timestamp>,
    /// When its last coordinated reboot happened.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_reboot: Option<Timestamp>,
}

/// Why a record as read cannot be shown: its value (bounded, escaped) and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Unreadable {
    pub value: String,
    pub reason: String,
}

impl NodeRecord {
    /// The record of a node in `state` at `now`, or `None` when there is nothing new to show:
    /// while it holds a slot (its holder record says its phase then), while it waits for one in
    /// the queue (its queue entry says that, and since when), and while it works on a need
    /// without waiting for anything (the moment between the need and the window check: the
    /// record moves at the next wait). `cancelled`: when its last need was cancelled, if it has
    /// none since.
    pub fn of(
        node: &str,
        id: &str,
        state: &State,
        now: Timestamp,
        cancelled: Option<Timestamp>,
    ) -> Option<NodeRecord> {
        if state.slot_held {
            return None;
        }
        let why = waiting(state, now);
        if why == Some(Waiting::Slot) || (why.is_none() && state.reason.is_some()) {
            return None;
        }
        let detail = match why {
            None => None,
            Some(_) => state
                .waiting_for
                .as_deref()
                .map(|w| crate::text::clean_to(w, MAX_DETAIL)),
        };
        Some(NodeRecord {
            node: node.to_owned(),
            id: id.to_owned(),
            phase: state.phase.as_str().to_owned(),
            since: state.since,
            waiting: why.map(|w| w.label().to_owned()),
            detail,
            paused: state.paused.clone(),
            cancelled: if state.reason.is_some() {
                None
            } else {
                cancelled
            },
            last_reboot: state.last_reboot,
        })
    }

    /// Parse a value as read from the store: bounded, JSON, else [`Unreadable`].
    pub fn parse(bytes: &[u8]) -> Result<NodeRecord, Unreadable> {
        let unreadable = |reason: String| Unreadable {
            value: crate::text::clean_to(&String::from_utf8_lossy(bytes), 160),
            reason,
        };
        if bytes.len() > MAX_RECORD {
            return Err(unreadable(format!(
                "{} bytes, more than {MAX_RECORD}",
                bytes.len()
            )));
        }
        serde_json::from_slice(bytes).map_err(|e| unreadable(format!("not a node record: {e}")))
    }

    pub fn to_json(&self) -> String {
        // Strings and timestamps always serialize.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Every text in it bounded and escaped ([`crate::text::clean`]).
    pub fn cleaned(mut self) -> NodeRecord {
        use crate::text::clean;
        self.node = clean(&self.node);
        self.id = clean(&self.id);
        self.phase = clean(&self.phase);
        self.waiting = self.waiting.as_deref().map(clean);
        self.detail = self.detail.as_deref().map(clean);
        if let Some(p) = self.paused.as_mut() {
            p.reason = p.reason.as_deref().map(clean);
        }
        self
    }
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

    fn after(events: Vec<Event>) -> State {
        let policy = Policy {
            drain: true,
            reboot_timeout: Duration::from_secs(600),
            retry_interval: Duration::from_secs(60),
            gate_interval: Duration::from_secs(30),
            settle: None,
        };
        let mut s = State::new("b", t(0));
        let need = Need::new(TriggerSource::Rebootctl, "x");
        for e in std::iter::once(Event::RebootNeeded { need }).chain(events) {
            s = step(&s, e, t(10), &policy).state;
        }
        s
    }

    #[test]
    fn a_record_says_why_the_node_waits_and_nothing_while_it_holds() {
        let closed = after(vec![Event::WindowClosed {
            next_open: Some(t(3600)),
        }]);
        let r = NodeRecord::of("n", "m", &closed, t(10), None).unwrap();
        assert_eq!(r.waiting.as_deref(), Some("window"));
        assert!(r.detail.unwrap().contains("window"), "the agent's words");
        let gated = after(vec![Event::Gated {
            gate: "alerts".into(),
            why: "NodeDown firing".into(),
            hold: false,
        }]);
        let r = NodeRecord::of("n", "m", &gated, t(10), None).unwrap();
        assert_eq!(r.waiting.as_deref(), Some("gate"));
        assert!(r.detail.unwrap().contains("NodeDown firing"));
        let r = NodeRecord::of("n", "m", &gated, t(10), Some(t(1))).unwrap();
        assert_eq!(r.cancelled, None, "a need since the cancel");
        let queued = after(vec![Event::WindowOpen]);
        assert_eq!(
            NodeRecord::of("n", "m", &queued, t(10), None),
            None,
            "in the queue: its entry says so"
        );
        let held = after(vec![Event::WindowOpen, Event::SlotAcquired]);
        assert_eq!(NodeRecord::of("n", "m", &held, t(10), None), None);
        let needed = after(vec![]);
        assert_eq!(needed.phase, crate::state::Phase::RebootNeeded);
        assert_eq!(
            NodeRecord::of("n", "m", &needed, t(10), None),
            None,
            "at work"
        );
        let idle = State::new("b", t(0));
        let r = NodeRecord::of("n", "m", &idle, t(10), Some(t(5))).unwrap();
        assert_eq!((r.waiting, r.cancelled), (None, Some(t(5))));
    }

    #[test]
    fn what_does_not_parse_or_is_too_long_is_unreadable_and_quoted_safely() {
        let r = NodeRecord::of("n", "m", &State::new("b", t(0)), t(1), None).unwrap();
        assert_eq!(NodeRecord::parse(r.to_json().as_bytes()), Ok(r));
        let bad = NodeRecord::parse(b"\x1b[2Jnot json").unwrap_err();
        assert!(bad.value.starts_with("\\u{1b}[2J"), "{bad:?}");
        let long = vec![b' '; MAX_RECORD + 1];
        assert!(NodeRecord::parse(&long)
            .unwrap_err()
            .reason
            .contains("bytes"));
    }
}
