//! The v2 store's keys and its snapshot of them: one recursive read of the group's directory,
//! kept up to date from watch events, and turned into the arbiter's store-neutral [`View`]. Pure:
//! no I/O.
//!
//! # Keys (v2 keyspace; locksmith reads only the document)
//!
//! | what | default group | group `g` |
//! | --- | --- | --- |
//! | locksmith's document | `/coreos.com/updateengine/rebootlock/semaphore` | `/coreos.com/updateengine/rebootlock/groups/<g>/semaphore` |
//! | rebootd's record of holder h | `…/rebootlock/rebootd/holders/<h>` | `…/groups/<g>/rebootd/holders/<h>` |
//! | rebootd's waiter queue (in-order keys with a TTL) | `…/rebootlock/rebootd/waiters/<n>` | `…/groups/<g>/rebootd/waiters/<n>` |
//! | the group's pause ([`crate::lock::pause`]) | `…/rebootlock/rebootd/control/paused` | `…/groups/<g>/rebootd/control/paused` |
//!
//! The snapshot reads and watches the group's directory (`…/rebootlock`, or `…/groups/<g>`):
//! for the default group that directory also holds the named groups, whose keys are ignored.
//! The pause is in that directory too, so a waiter's one read and one watch bring it.
//!
//! # A semaphore moved to v3
//!
//! `rebootctl migrate` leaves in v2 a document no v2 client can take a slot in: the holder
//! [`MOVED_HOLDER`], `max` 0 and `semaphore` [`MOVED_FREE`] (locksmith refuses to lock while
//! `semaphore <= 0`, and its `set-max` and `unlock` move it by a few units only). rebootd
//! recognises it by that holder, whatever the numbers became, and follows to v3.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::super::arbiter::share;
use super::super::document::{self, HolderRecord, SemaphoreDoc};
use super::super::pause::{self, GroupPause};
use super::super::view::{Beat, HolderView, Me, Ticket, View, WaiterView};
use crate::clients::etcd_v2::{Node, Response};

/// The holder id the migration leaves in the v2 document; `locksmithctl status` shows it.
pub const MOVED_HOLDER: &str = "moved-to-etcd-v3-by-rebootctl-migrate";
/// The free slots the migration leaves in the v2 document: far below zero, so that neither
/// `locksmithctl set-max` nor `locksmithctl unlock` can bring it above.
pub const MOVED_FREE: i64 = -1_000_000;

/// The moved-to-v3 document, in locksmith's encoding.
pub fn moved_document() -> String {
    SemaphoreDoc {
        semaphore: MOVED_FREE,
        max: 0,
        holders: vec![MOVED_HOLDER.to_owned()],
    }
    .to_json()
}

/// Whether a document value is the moved-to-v3 marker (by its holder, whatever the numbers).
pub fn is_moved(value: &str) -> bool {
    #[derive(Deserialize)]
    struct Loose {
        #[serde(default)]
        holders: Option<Vec<serde_json::Value>>,
    }
    serde_json::from_str::<Loose>(value).is_ok_and(|l| {
        l.holders
            .unwrap_or_default()
            .iter()
            .any(|h| h.as_str() == Some(MOVED_HOLDER))
    })
}

/// The keys of one group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Keys {
    pub group: String,
    /// locksmith's document.
    pub doc: String,
    /// The directory read and watched.
    pub root: String,
    /// rebootd's holder records (ends with `/`).
    pub records: String,
    /// rebootd's waiter queue directory (no trailing `/`; in-order keys are POSTed to it).
    pub queue: String,
    /// The group's pause (under `root`).
    pub pause: String,
    /// The group's fleet member records (ends with `/`, under `root`).
    pub members: String,
    /// Keys under `root` that belong to other groups (the default group's directory holds them).
    skip: Option<String>,
}

impl Keys {
    pub fn new(group: &str) -> Keys {
        let abs = |k: String| format!("/{k}");
        let doc = abs(document::semaphore_key(group));
        let root = doc.strip_suffix("/semaphore").unwrap_or(&doc).to_owned();
        let queue = abs(document::waiter_queue_prefix(group))
            .trim_end_matches('/')
            .to_owned();
        Keys {
            group: group.to_owned(),
            records: abs(document::holder_records_prefix(group)),
            queue,
            pause: abs(pause::etcd_key(group)),
            members: abs(super::super::etcd_v3::members::prefix(group)),
            skip: document::is_default_group(group).then(|| format!("{root}/groups/")),
            doc,
            root,
        }
    }

    pub fn record(&self, id: &str) -> String {
        format!("{}{}", self.records, document::query_escape(id))
    }

    fn in_queue(&self, key: &str) -> bool {
        key.strip_prefix(&self.queue)
            .is_some_and(|rest| rest.starts_with('/'))
    }

    /// The name of the member record at `key` (the id as escaped), if it is one.
    pub fn member<'k>(&self, key: &'k str) -> Option<&'k str> {
        key.strip_prefix(&self.members)
            .filter(|name| !name.is_empty() && !name.contains('/'))
    }

    fn ours(&self, key: &str) -> bool {
        key.starts_with(&self.root) && self.skip.as_ref().is_none_or(|s| !key.starts_with(s))
    }
}

/// A waiter's queue entry value (v2's in-order keys are named by etcd, so the value says whose
/// it is).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueRecord {
    pub id: String,
    pub node: String,
    pub boot_id: String,
    pub token: String,
    /// When it started waiting (shown only).
    pub since: jiff::Timestamp,
    /// The zone it claims (`lock.zone`), for `lock.max_per_zone`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
}

impl QueueRecord {
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// locksmith's document as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DocState {
    /// No document: locksmith's default (one free slot) until someone creates it.
    Absent,
    Doc {
        doc: SemaphoreDoc,
        index: u64,
    },
    /// The semaphore was moved to v3 ([`is_moved`]).
    Moved {
        index: u64,
    },
    /// Not locksmith's document: never written over.
    Corrupt {
        value: String,
        reason: String,
        index: u64,
    },
}

impl DocState {
    fn parse(value: &str, index: u64) -> DocState {
        if is_moved(value) {
            return DocState::Moved { index };
        }
        match SemaphoreDoc::parse(value.as_bytes()) {
            Ok(doc) => DocState::Doc { doc, index },
            Err(e) => DocState::Corrupt {
                value: value.to_owned(),
                reason: e.to_string(),
                index,
            },
        }
    }
}

/// One of rebootd's keys as read: its value parsed (`None`: it does not parse) and its indexes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry<T> {
    pub value: Option<T>,
    pub created: u64,
    pub modified: u64,
}

/// The group's keys at etcd index `index`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// etcd's index of the read, then of the last event applied: watch from `index + 1`.
    pub index: u64,
    pub doc: DocState,
    /// By key.
    pub records: BTreeMap<String, Entry<HolderRecord>>,
    /// By key (in-order keys sort in creation order).
    pub queue: BTreeMap<String, Entry<QueueRecord>>,
    /// The group's pause, if set.
    pub pause: Option<GroupPause>,
    /// The fleet member records by name (the id as escaped in the key); the value is `Some`
    /// when it parses (what `lock.max = "N%"` counts, [`Snapshot::known_nodes`]).
    pub members: BTreeMap<String, Entry<()>>,
}

impl Snapshot {
    /// From a recursive read of `keys.root` (`None`: the directory does not exist) answered at
    /// etcd index `index`.
    pub fn from_read(keys: &Keys, root: Option<&Node>, index: u64) -> Snapshot {
        let mut s = Snapshot {
            index,
            doc: DocState::Absent,
            records: BTreeMap::new(),
            queue: BTreeMap::new(),
            pause: None,
            members: BTreeMap::new(),
        };
        if let Some(root) = root {
            for node in root.leaves() {
                s.put(keys, node);
            }
        }
        s
    }

    /// Take locksmith's document from a read of its key alone (`node`; `None`: not there)
    /// answered at etcd index `index`. Everything else stays as read before, but the records
    /// of holders that left the document meanwhile: each one's release deletes its own after
    /// its document write, so they are not orphans to this read.
    pub fn reread_doc(&mut self, keys: &Keys, node: Option<&Node>, index: u64) {
        let before = self.holders();
        self.index = self.index.max(index);
        self.doc = node.map_or(DocState::Absent, |n| {
            DocState::parse(n.value.as_deref().unwrap_or_default(), n.modified_index)
        });
        let now = self.holders();
        for gone in before.iter().filter(|h| !now.contains(h)) {
            self.records.remove(&keys.record(gone));
        }
    }

    /// The holders of the document as read (none when it is absent or unreadable).
    fn holders(&self) -> Vec<String> {
        match &self.doc {
            DocState::Doc { doc, .. } => doc.holders.clone(),
            _ => Vec::new(),
        }
    }

    /// Apply a watched change. Returns whether it touched this group's keys.
    pub fn apply(&mut self, keys: &Keys, event: &Response) -> bool {
        self.index = self.index.max(event.node.modified_index);
        let key = event.node.key.as_str();
        if !keys.ours(key) {
            return false;
        }
        if event.action.removes() {
            if event.node.dir {
                let dir = format!("{key}/");
                if keys.doc.starts_with(&dir) {
                    self.doc = DocState::Absent;
                }
                if keys.pause.starts_with(&dir) {
                    self.pause = None;
                }
                self.records.retain(|k, _| !k.starts_with(&dir));
                self.queue.retain(|k, _| !k.starts_with(&dir));
                if keys.members.starts_with(&dir) {
                    self.members.clear();
                }
            } else if key == keys.doc {
                self.doc = DocState::Absent;
            } else if key == keys.pause {
                self.pause = None;
            } else if let Some(name) = keys.member(key) {
                self.members.remove(name);
            } else {
                self.records.remove(key);
                self.queue.remove(key);
            }
            return true;
        }
        if event.node.dir {
            return false;
        }
        self.put(keys, &event.node)
    }

    fn put(&mut self, keys: &Keys, node: &Node) -> bool {
        let key = node.key.as_str();
        let value = node.value.as_deref().unwrap_or_default();
        if key == keys.doc {
            self.doc = DocState::parse(value, node.modified_index);
        } else if key == keys.pause {
            self.pause = Some(GroupPause::parse(value));
        } else if let Some(rest) = key.strip_prefix(&keys.records) {
            if rest.contains('/') {
                return false;
            }
            self.records.insert(
                key.to_owned(),
                Entry {
                    value: HolderRecord::parse(value.as_bytes()).ok(),
                    created: node.created_index,
                    modified: node.modified_index,
                },
            );
        } else if let Some(name) = keys.member(key) {
            let entry = Entry {
                value: crate::fleet::NodeRecord::parse(value.as_bytes())
                    .ok()
                    .map(|_| ()),
                created: node.created_index,
                modified: node.modified_index,
            };
            self.members.insert(name.to_owned(), entry);
        } else if keys.in_queue(key) {
            self.queue.insert(
                key.to_owned(),
                Entry {
                    value: serde_json::from_str(value).ok(),
                    created: node.created_index,
                    modified: node.modified_index,
                },
            );
        } else {
            return false;
        }
        true
    }

    /// locksmith's document (its default when absent), if it is one.
    pub fn document(&self) -> Option<SemaphoreDoc> {
        match &self.doc {
            DocState::Absent => Some(SemaphoreDoc::default()),
            DocState::Doc { doc, .. } => Some(doc.clone()),
            DocState::Moved { .. } | DocState::Corrupt { .. } => None,
        }
    }

    /// The record of holder `id`, if any.
    pub fn record(&self, keys: &Keys, id: &str) -> Option<&Entry<HolderRecord>> {
        self.records.get(&keys.record(id))
    }

    /// My queue entry (my id and my token), if any: its key and entry.
    pub fn my_entry(&self, id: &str, token: &str) -> Option<(&String, &Entry<QueueRecord>)> {
        self.queue.iter().find(|(_, e)| {
            e.value
                .as_ref()
                .is_some_and(|r| r.id == id && r.token == token)
        })
    }

    /// Records whose holder is not in `doc`: left by a holder unlocked by hand (or by a writer
    /// that died between its document write and its record delete). Deleted by their index.
    pub fn orphan_records(&self, keys: &Keys, doc: &SemaphoreDoc) -> Vec<(String, u64)> {
        self.records
            .iter()
            .filter(|(k, _)| {
                !doc.holders
                    .iter()
                    .any(|h| keys.record(h).as_str() == k.as_str())
            })
            .map(|(k, e)| (k.clone(), e.modified))
            .collect()
    }

    /// The nodes a share of `max` is of ([`share::known_nodes`]): the readable member records,
    /// the holders of `doc` and the readable queue entries, each id as escaped in the keys.
    pub fn known_nodes(&self, doc: &SemaphoreDoc) -> u64 {
        let members = self.members.values().filter(|e| e.value.is_some()).count();
        let others: Vec<String> = self
            .holder_and_waiter_ids(doc)
            .map(document::query_escape)
            .collect();
        share::known_beside(
            u64::try_from(members).unwrap_or(u64::MAX),
            |id| self.members.get(id).is_some_and(|e| e.value.is_some()),
            others.iter().map(String::as_str),
        )
    }

    /// The ids of `doc`'s holders and of the readable waiter entries, as written.
    fn holder_and_waiter_ids<'a>(
        &'a self,
        doc: &'a SemaphoreDoc,
    ) -> impl Iterator<Item = &'a str> + 'a {
        doc.holders.iter().map(String::as_str).chain(
            self.queue
                .values()
                .filter_map(|e| Some(e.value.as_ref()?.id.as_str())),
        )
    }

    /// Whether the node of the record named `name` holds a slot of `doc` or waits.
    pub fn busy(&self, doc: &SemaphoreDoc, name: &str) -> bool {
        self.holder_and_waiter_ids(doc)
            .any(|id| id == name || document::query_escape(id) == name)
    }

    /// The store-neutral view for the arbiter (the document must be locksmith's: the caller
    /// deals with moved and corrupt first).
    pub fn view(&self, keys: &Keys, doc: &SemaphoreDoc, me: Option<&Me<'_>>) -> View {
        let holders = doc
            .holders
            .iter()
            .map(|id| {
                let entry = self.record(keys, id);
                let record = entry.and_then(|e| e.value.as_ref());
                let claimed_by = record.and_then(|r| r.reclaimed_by.clone());
                HolderView {
                    // Claimed by a waiter that judged it stopped, which died (or lost a race)
                    // before it wrote the document: any waiter may finish the reclaim.
                    gone: claimed_by
                        .as_ref()
                        .map(|by| format!("its slot was claimed by {by}")),
                    claimed_by,
                    ..HolderRecord::view(id, record, entry.map(|e| e.modified.to_string()))
                }
            })
            .collect();
        let waiters = self
            .queue
            .iter()
            .map(|(key, e)| {
                let r = e.value.as_ref();
                WaiterView {
                    key: key.clone(),
                    ticket: Ticket {
                        order: (i64::try_from(e.created).unwrap_or(i64::MAX), 0),
                        name: key.clone(),
                    },
                    id: r.map(|r| r.id.clone()),
                    node: r.map(|r| r.node.clone()),
                    beat: Beat::Ttl,
                    mine: me.is_some_and(|m| r.is_some_and(|r| r.id == m.id && r.token == m.token)),
                    zone: super::super::document::zone_of(r.and_then(|r| r.zone.as_deref())),
                    since: r.map(|r| r.since),
                }
            })
            .collect();
        View {
            max: doc.max,
            holders,
            waiters,
            node_is_identity: false,
            my_zone: None,
            unlisted_ahead: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clients::etcd_v2::Action;

    fn node(key: &str, value: &str, created: u64, modified: u64) -> Node {
        Node {
            key: key.into(),
            value: Some(value.into()),
            dir: false,
            nodes: Vec::new(),
            created_index: created,
            modified_index: modified,
            ttl: None,
        }
    }

    fn event(action: Action, n: Node) -> Response {
        Response {
            action,
            etcd_index: n.modified_index,
            node: n,
            prev_node: None,
        }
    }

    fn record(token: &str) -> String {
        HolderRecord {
            node: "worker-1".into(),
            boot_id: "b".into(),
            phase: Some("rebooting".into()),
            since: jiff::Timestamp::UNIX_EPOCH,
            acquired: jiff::Timestamp::UNIX_EPOCH,
            token: Some(token.into()),
            reclaimed_by: None,
            zone: None,
        }
        .to_json()
    }

    fn waiter(id: &str, token: &str) -> String {
        QueueRecord {
            id: id.into(),
            node: format!("node-{id}"),
            boot_id: "b".into(),
            token: token.into(),
            since: jiff::Timestamp::UNIX_EPOCH,
            zone: None,
        }
        .to_json()
    }

    #[test]
    fn keys_follow_locksmiths_layout() {
        let k = Keys::new("default");
        assert_eq!(k.doc, "/coreos.com/updateengine/rebootlock/semaphore");
        assert_eq!(k.root, "/coreos.com/updateengine/rebootlock");
        assert_eq!(
            k.records,
            "/coreos.com/updateengine/rebootlock/rebootd/holders/"
        );
        assert_eq!(
            k.queue,
            "/coreos.com/updateengine/rebootlock/rebootd/waiters"
        );
        assert!(!k.ours("/coreos.com/updateengine/rebootlock/groups/a/semaphore"));
        assert_eq!(
            k.pause,
            "/coreos.com/updateengine/rebootlock/rebootd/control/paused"
        );
        assert!(
            k.ours(&k.pause),
            "the waiter's read and watch bring the pause"
        );
        let g = Keys::new("a b/c");
        assert_eq!(
            g.doc,
            "/coreos.com/updateengine/rebootlock/groups/a+b%2Fc/semaphore"
        );
        assert_eq!(g.root, "/coreos.com/updateengine/rebootlock/groups/a+b%2Fc");
        assert!(g.ours(&g.record("x")));
        assert!(g.ours(&g.pause));
        assert!(!g.ours("/coreos.com/updateengine/rebootlock/semaphore"));
        assert!(
            !k.ours(&g.pause),
            "another group's pause is not the default group's"
        );
    }

    #[test]
    fn the_pause_comes_with_the_read_and_the_events() {
        let k = Keys::new("default");
        let paused = GroupPause::parse(r#"{"since":"2026-11-26T00:00:00Z","reason":"freeze"}"#);
        let root = Node {
            key: k.root.clone(),
            value: None,
            dir: true,
            nodes: vec![node(&k.pause, &paused.to_json(), 4, 4)],
            created_index: 1,
            modified_index: 1,
            ttl: None,
        };
        let mut s = Snapshot::from_read(&k, Some(&root), 4);
        assert_eq!(s.pause, Some(paused.clone()));
        assert!(s.apply(&k, &event(Action::Delete, node(&k.pause, "", 4, 5))));
        assert_eq!(s.pause, None);
        assert!(s.apply(
            &k,
            &event(Action::Set, node(&k.pause, &paused.to_json(), 6, 6))
        ));
        assert_eq!(s.pause, Some(paused));
        // The control directory deleted by hand takes the pause with it.
        let mut dir = node(
            "/coreos.com/updateengine/rebootlock/rebootd/control",
            "",
            6,
            7,
        );
        dir.dir = true;
        assert!(s.apply(&k, &event(Action::Delete, dir)));
        assert_eq!(s.pause, None);
    }

    /// `lock.max = "N%"` counts readable member records, holders and readable queue entries,
    /// each id once, and follows the records' events.
    #[test]
    fn known_nodes_follow_the_records_read_and_watched() {
        let k = Keys::new("default");
        let member = |id: &str, i: u64| {
            let v = format!(
                r#"{{"node":"n-{id}","id":"{id}","phase":"idle","since":"2026-11-28T00:00:00Z"}}"#
            );
            node(&format!("{}{id}", k.members), &v, i, i)
        };
        let doc = r#"{"semaphore":-1,"max":1,"holders":["a","ls"]}"#;
        let mut nodes = vec![node(&k.doc, doc, 2, 2)];
        nodes.extend([member("a", 3), member("m1", 4), member("m2", 5)]);
        nodes.push(node(&format!("{}junk", k.members), "not json", 6, 6));
        nodes.push(node(&format!("{}/7", k.queue), &waiter("w", "t"), 7, 7));
        nodes.push(node(&format!("{}/8", k.queue), &waiter("m1", "t"), 8, 8));
        nodes.push(node(&format!("{}/9", k.queue), "not json", 9, 9));
        let root = Node {
            key: k.root.clone(),
            value: None,
            dir: true,
            nodes,
            created_index: 1,
            modified_index: 1,
            ttl: None,
        };
        let mut s = Snapshot::from_read(&k, Some(&root), 9);
        let doc = s.document().unwrap();
        // a, m1, m2, ls, w.
        assert_eq!(s.known_nodes(&doc), 5);
        assert!(s.busy(&doc, "a") && s.busy(&doc, "w") && !s.busy(&doc, "m2"));
        let m2 = format!("{}m2", k.members);
        assert!(s.apply(&k, &event(Action::Delete, node(&m2, "", 5, 10))));
        assert_eq!(s.known_nodes(&doc), 4);
        assert!(s.apply(&k, &event(Action::Set, member("m3", 11))));
        assert_eq!(s.known_nodes(&doc), 5);
    }

    #[test]
    fn a_read_and_events_build_the_view() {
        let k = Keys::new("default");
        let root = Node {
            key: k.root.clone(),
            value: None,
            dir: true,
            nodes: vec![
                node(
                    &k.doc,
                    r#"{"semaphore":0,"max":2,"holders":["aa","bb"]}"#,
                    3,
                    7,
                ),
                node(&k.record("aa"), &record("tok-a"), 8, 9),
                node(
                    &format!("{}/00000000000000000011", k.queue),
                    &waiter("cc", "tok-c"),
                    11,
                    11,
                ),
                node(
                    &format!("{}/00000000000000000012", k.queue),
                    &waiter("dd", "tok-d"),
                    12,
                    12,
                ),
                node(
                    "/coreos.com/updateengine/rebootlock/groups/x/semaphore",
                    "{}",
                    2,
                    2,
                ),
            ],
            created_index: 1,
            modified_index: 1,
            ttl: None,
        };
        let mut s = Snapshot::from_read(&k, Some(&root), 12);
        let doc = s.document().unwrap();
        let me = Me {
            id: "dd",
            node: "node-dd",
            token: "tok-d",
        };
        let v = s.view(&k, &doc, Some(&me));
        assert_eq!(v.max, 2);
        assert_eq!(v.holders[0].token.as_deref(), Some("tok-a"));
        assert_eq!(v.holders[0].beat, Beat::Revision("9".into()));
        assert_eq!(
            v.holders[1].beat,
            Beat::Silent,
            "locksmith's holder has no record"
        );
        assert_eq!(v.waiters.len(), 2);
        assert!(v.waiters[1].mine && !v.waiters[0].mine);
        assert!(v.waiters[0].ticket < v.waiters[1].ticket);

        // Another group's change is not ours; the queue head expiring is.
        let other = event(
            Action::Set,
            node(
                "/coreos.com/updateengine/rebootlock/groups/x/semaphore",
                "{}",
                2,
                13,
            ),
        );
        assert!(!s.apply(&k, &other));
        assert_eq!(s.index, 13);
        let mut gone = node(&format!("{}/00000000000000000011", k.queue), "", 11, 14);
        gone.value = None;
        assert!(s.apply(&k, &event(Action::Expire, gone)));
        assert_eq!(s.queue.len(), 1);
        // locksmith unlocks bb: the document changes; aa's record stays, bb never had one.
        let swapped = node(&k.doc, r#"{"semaphore":1,"max":2,"holders":["aa"]}"#, 3, 15);
        assert!(s.apply(&k, &event(Action::CompareAndSwap, swapped)));
        assert_eq!(s.document().unwrap().holders, ["aa"]);
        assert!(s.orphan_records(&k, &s.document().unwrap()).is_empty());
        let emptied = node(&k.doc, r#"{"semaphore":2,"max":2,"holders":[]}"#, 3, 16);
        s.apply(&k, &event(Action::CompareAndSwap, emptied));
        assert_eq!(
            s.orphan_records(&k, &s.document().unwrap()),
            [(k.record("aa"), 9)]
        );
        // The whole rebootd directory deleted by hand.
        let mut dir = node("/coreos.com/updateengine/rebootlock/rebootd", "", 1, 17);
        dir.dir = true;
        assert!(s.apply(&k, &event(Action::Delete, dir)));
        assert!(s.records.is_empty() && s.queue.is_empty());
        assert!(matches!(s.doc, DocState::Doc { .. }));
    }

    #[test]
    fn the_moved_marker_is_recognised_whatever_locksmith_did_to_it() {
        assert!(is_moved(&moved_document()));
        // locksmithctl set-max 5 and unlock of the marker: numbers move, the holder stays.
        assert!(is_moved(
            r#"{"semaphore":-999995,"max":5,"holders":["moved-to-etcd-v3-by-rebootctl-migrate"]}"#
        ));
        assert!(!is_moved(r#"{"semaphore":1,"max":1,"holders":null}"#));
        assert!(!is_moved("garbage"));
        let k = Keys::new("default");
        let s = Snapshot::from_read(&k, Some(&node(&k.doc, &moved_document(), 3, 20)), 20);
        assert_eq!(s.doc, DocState::Moved { index: 20 });
        assert_eq!(s.document(), None);
        let s = Snapshot::from_read(&k, Some(&node(&k.doc, "{\"max\":1}", 3, 21)), 21);
        assert!(matches!(s.doc, DocState::Corrupt { .. }));
        let s = Snapshot::from_read(&k, None, 22);
        assert_eq!(s.document(), Some(SemaphoreDoc::default()));
    }
}
