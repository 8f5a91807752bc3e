//! The invariant of `rebootctl migrate` mid-rollout (`--migrate`): never two live semaphores.
//!
//! During a migration the group's semaphore exists twice: locksmith's document in etcd's v2 keys
//! API and the same document in v3. `rebootctl migrate` copies the v2 document to v3 (only if
//! the v3 key is absent), then closes the v2 one by compare-and-swap (holder
//! [`MOVED_HOLDER`], free slots far below zero); if v2 changed in between, it deletes its v3
//! copy and starts again. So at most one of the two ever lets a node take a slot. The checker
//! sees both through outside watchers ([`DocSeen`], in the order they saw the changes; v2's
//! indexes and v3's revisions are separate sequences, so the two are ordered by the time the
//! watchers saw them, within their lag) and the two documents read at the end:
//!
//! - **no take in v3 while v2 is open**: a holder that comes into the v3 document after its
//!   creation, while the v2 document is still open (not closed within the watchers' lag after);
//! - **the copy is the v2 document it closed**: the holders of the v3 document as created last
//!   before v2 was closed are the holders of the last open v2 document (a v2 change between the
//!   copy and the close that the copy missed is a slot lost in v3);
//! - **v2 stays closed**: once closed, the v2 document never opens again (and is never removed);
//! - **one semaphore at the end**: not the v2 document open beside a v3 one.

use std::collections::BTreeSet;
use std::time::Duration;

/// The holder `rebootctl migrate` leaves in the closed v2 document (docs/migrating-from-locksmith.md).
pub const MOVED_HOLDER: &str = "moved-to-etcd-v3-by-rebootctl-migrate";

/// How far the two outside watchers may lag each other.
const LAG: Duration = Duration::from_secs(2);

/// Which of the two documents.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    V2,
    V3,
}

/// One version of one document as its watcher saw it: its holders (by node name), `None` when
/// the key was removed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DocSeen {
    pub at: Duration,
    pub api: Api,
    pub holders: Option<BTreeSet<String>>,
}

impl DocSeen {
    fn closed(&self) -> bool {
        self.holders
            .as_ref()
            .is_some_and(|h| h.contains(MOVED_HOLDER))
    }

    fn open_v2(&self) -> bool {
        self.api == Api::V2 && self.holders.is_some() && !self.closed()
    }
}

/// The two documents read at the end of the trial.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DocsEnd {
    /// The v2 document is there and not closed.
    pub v2_open: bool,
    pub v3_exists: bool,
}

/// The holders that count at each change: the open v2 document's and the v3 document's, as one
/// set (a node in both, as right after the copy, counts once).
pub fn union(seen: &[DocSeen]) -> Vec<(Duration, BTreeSet<String>)> {
    let mut v2: Option<BTreeSet<String>> = None;
    let mut v3: Option<BTreeSet<String>> = None;
    seen.iter()
        .map(|d| {
            match d.api {
                Api::V2 => v2 = d.holders.clone().filter(|_| !d.closed()),
                Api::V3 => v3 = d.holders.clone(),
            }
            let all = v2.iter().chain(v3.iter()).flatten().cloned().collect();
            (d.at, all)
        })
        .collect()
}

/// When the v2 document was first seen closed (`None`: never).
fn closed_at(seen: &[DocSeen]) -> Option<Duration> {
    seen.iter()
        .find(|d| d.api == Api::V2 && d.closed())
        .map(|d| d.at)
}

/// Every way the two documents broke "never two live semaphores", in words.
pub fn violations(seen: &[DocSeen], end: &DocsEnd) -> Vec<String> {
    let mut v = Vec::new();
    let closed = closed_at(seen);
    // No take in v3 while v2 is open.
    let mut v3: Option<BTreeSet<String>> = None;
    for d in seen.iter().filter(|d| d.api == Api::V3) {
        if let (Some(before), Some(now)) = (&v3, &d.holders) {
            let new: Vec<&String> = now.difference(before).collect();
            let v2_open_then = closed.is_none_or(|c| c > d.at + LAG);
            if !new.is_empty() && v2_open_then {
                v.push(format!(
                    "two live semaphores: {new:?} took a slot in v3 at {:.2}s while the v2 \
                     document was open (closed: {})",
                    d.at.as_secs_f64(),
                    closed.map_or("never".into(), |c| format!("{:.2}s", c.as_secs_f64()))
                ));
            }
        }
        v3 = d.holders.clone();
    }
    // The copy is the v2 document it closed.
    if let Some(c) = closed {
        let last_v2 = seen
            .iter()
            .rfind(|d| d.at <= c && d.open_v2())
            .and_then(|d| d.holders.clone());
        // The v3 document as created last (first version, or one after a removal).
        let mut copy = None;
        let mut exists = false;
        for d in seen.iter().filter(|d| d.api == Api::V3 && d.at <= c + LAG) {
            if d.holders.is_some() && !exists {
                copy = d.holders.clone();
            }
            exists = d.holders.is_some();
        }
        match (last_v2, copy) {
            (Some(a), Some(b)) if a != b => v.push(format!(
                "two live semaphores: v2 was closed at {:.2}s with holders {a:?}, but its copy \
                 in v3 holds {b:?}",
                c.as_secs_f64()
            )),
            (Some(a), None) => v.push(format!(
                "v2 was closed at {:.2}s (holders {a:?}) with no v3 document created",
                c.as_secs_f64()
            )),
            _ => {}
        }
        // v2 stays closed.
        for d in seen.iter().filter(|d| d.api == Api::V2 && d.at > c) {
            if !d.closed() {
                v.push(format!(
                    "two live semaphores: the v2 document, closed at {:.2}s, was {} at {:.2}s",
                    c.as_secs_f64(),
                    match &d.holders {
                        Some(h) => format!("open again (holders {h:?})"),
                        None => "removed".into(),
                    },
                    d.at.as_secs_f64()
                ));
            }
        }
    }
    if end.v2_open && end.v3_exists {
        v.push("two live semaphores at the end: the v2 document open beside a v3 one".into());
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(secs: f64) -> Duration {
        Duration::from_secs_f64(secs)
    }

    fn doc(at: f64, api: Api, holders: Option<&[&str]>) -> DocSeen {
        DocSeen {
            at: s(at),
            api,
            holders: holders.map(|h| h.iter().map(|x| x.to_string()).collect()),
        }
    }

    /// A migration as it should go: v2 with a holder, its copy in v3, v2 closed, the holder
    /// gives its slot back in v3 and another node takes one there.
    fn migrated() -> Vec<DocSeen> {
        vec![
            doc(1.0, Api::V2, Some(&["a"])),
            doc(2.0, Api::V2, Some(&["a", "b"])),
            doc(3.0, Api::V3, Some(&["a", "b"])),
            doc(3.1, Api::V2, Some(&[MOVED_HOLDER])),
            doc(4.0, Api::V3, Some(&["b"])),
            doc(5.0, Api::V3, Some(&["b", "c"])),
        ]
    }

    const END: DocsEnd = DocsEnd {
        v2_open: false,
        v3_exists: true,
    };

    #[test]
    fn a_clean_migration_passes_and_counts_each_holder_once() {
        assert_eq!(violations(&migrated(), &END), Vec::<String>::new());
        let u = union(&migrated());
        assert_eq!(u.iter().map(|(_, h)| h.len()).max(), Some(2));
        assert!(!u[3].1.contains(MOVED_HOLDER));
    }

    #[test]
    fn a_copy_undone_after_a_v2_change_and_made_again_passes() {
        let seen = vec![
            doc(1.0, Api::V2, Some(&["a"])),
            doc(2.0, Api::V3, Some(&["a"])),
            doc(2.1, Api::V2, Some(&["a", "b"])),
            doc(2.2, Api::V3, None),
            doc(3.0, Api::V3, Some(&["a", "b"])),
            doc(3.1, Api::V2, Some(&[MOVED_HOLDER])),
        ];
        assert_eq!(violations(&seen, &END), Vec::<String>::new());
    }

    #[test]
    fn a_take_in_v3_while_v2_is_open_fails() {
        let mut seen = migrated();
        // The close comes 5 s later than the take in v3 at 4.0 (rather than before it).
        seen[3].at = s(9.5);
        seen.sort_by_key(|d| d.at);
        let v = violations(&seen, &END);
        assert!(v.iter().any(|m| m.contains("took a slot in v3")), "{v:?}");
    }

    #[test]
    fn a_copy_that_missed_a_v2_take_fails() {
        let mut seen = migrated();
        seen[2] = doc(3.0, Api::V3, Some(&["a"]));
        let v = violations(&seen, &END);
        assert!(v.iter().any(|m| m.contains("its copy")), "{v:?}");
    }

    #[test]
    fn v2_opened_again_after_the_close_fails() {
        let mut seen = migrated();
        seen.push(doc(6.0, Api::V2, Some(&["d"])));
        let v = violations(&seen, &END);
        assert!(v.iter().any(|m| m.contains("open again")), "{v:?}");
    }

    #[test]
    fn both_documents_live_at_the_end_fails() {
        let seen = vec![
            doc(1.0, Api::V2, Some(&["a"])),
            doc(2.0, Api::V3, Some(&["a"])),
        ];
        let end = DocsEnd {
            v2_open: true,
            v3_exists: true,
        };
        let v = violations(&seen, &end);
        assert!(v.iter().any(|m| m.contains("at the end")), "{v:?}");
    }
}
