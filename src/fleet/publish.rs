//! The runtime's observer of the node's fleet record: after each step it derives the record
//! ([`NodeRecord::of`]) and writes it to the store only when it differs from the last one
//! written — a store request per change of what the view shows (reason, phase, pause, last
//! reboot), never one per loop. The last record written, and where the write left it, are kept
//! in the state directory, so a restarted daemon (every reboot) sends nothing when its record
//! is already there.

use super::{FleetStore, NodeRecord};
use crate::lock::Identity;
use jiff::Timestamp;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::sync::Mutex;

/// The file in the state directory that remembers the last record written.
pub const FILE: &str = "fleet-record.json";

/// The last record this node wrote, and where the write left it in the store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Published {
    pub record: NodeRecord,
    pub at: String,
}

/// The observer's memory.
#[derive(Debug)]
pub struct Publisher {
    path: PathBuf,
    last: Mutex<Option<Published>>,
    /// When the last need was cancelled, until the next need.
    cancelled: Mutex<Option<Timestamp>>,
}

impl Publisher {
    /// The publisher of a node whose state directory is `dir` (its memory read from there).
    pub fn new(dir: &std::path::Path) -> Publisher {
        let path = dir.join(FILE);
        let last: Option<Published> = std::fs::read(&path)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok());
        let cancelled = last.as_ref().and_then(|p| p.record.cancelled);
        Publisher {
            path,
            last: Mutex::new(last),
            cancelled: Mutex::new(cancelled),
        }
    }

    /// The record to write for `state` now, if it differs from the last one written.
    /// `cancelled`: this step was an operator's cancel that dropped the need.
    pub fn due(
        &self,
        me: &Identity,
        state: &crate::state::State,
        cancelled: bool,
    ) -> Option<NodeRecord> {
        let now = Timestamp::now();
        let mut c = self.cancelled.lock().unwrap_or_else(|p| p.into_inner());
        if cancelled {
            *c = Some(now);
        } else if state.reason.is_some() {
            *c = None;
        }
        let record = NodeRecord::of(&me.node, &me.id, state, now, *c)?;
        let last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        match last.as_ref() {
            Some(p) if p.record == record => None,
            _ => Some(record),
        }
    }

    /// Where the last write left the record, for the guard of the next one.
    pub fn at(&self) -> Option<String> {
        let last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        last.as_ref().map(|p| p.at.clone())
    }

    /// Note `record` written, leaving it at `at` (kept in the state directory; a file that
    /// cannot be written only costs a write after the next start).
    pub fn written(&self, record: NodeRecord, at: String) {
        let p = Published { record, at };
        if let Ok(json) = serde_json::to_vec(&p) {
            if let Err(e) = crate::state::write_atomic(&self.path, &json) {
                tracing::debug!(error = %e, "cannot keep the fleet record written");
            }
        }
        *self.last.lock().unwrap_or_else(|p| p.into_inner()) = Some(p);
    }

    /// Publish `state`'s record through `store` when it changed. Failures are logged; the next
    /// step tries again.
    pub async fn observe(
        &self,
        store: &dyn FleetStore,
        me: &Identity,
        state: &crate::state::State,
        cancelled: bool,
    ) {
        let Some(record) = self.due(me, state, cancelled) else {
            return;
        };
        let at = self.at();
        match store.publish(me, &record, at.as_deref()).await {
            Ok(at) => self.written(record, at),
            Err(e) => tracing::warn!(error = %e, "cannot write this node's fleet record: {e}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::State;

    fn me() -> Identity {
        Identity {
            id: "m".into(),
            node: "n".into(),
            boot_id: "b".into(),
            token: "t".into(),
            zone: None,
        }
    }

    #[test]
    fn due_only_when_what_it_shows_changes_and_remembered_across_restarts() {
        let dir = tempfile::tempdir().unwrap();
        let p = Publisher::new(dir.path());
        let s = State::new("b", Timestamp::now());
        let r = p.due(&me(), &s, false).expect("nothing written yet");
        p.written(r, "7".into());
        assert_eq!(p.due(&me(), &s, false), None, "unchanged");
        let again = Publisher::new(dir.path());
        assert_eq!(again.due(&me(), &s, false), None, "after a restart too");
        assert_eq!(again.at().as_deref(), Some("7"));
        let cancelled = again.due(&me(), &s, true).expect("a cancel shows");
        assert!(cancelled.cancelled.is_some());
        let mut held = s.clone();
        held.slot_held = true;
        assert_eq!(
            again.due(&me(), &held, false),
            None,
            "a holder's record says it"
        );
    }
}
