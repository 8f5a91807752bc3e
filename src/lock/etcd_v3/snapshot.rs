//! The v3 store's snapshot of one group: locksmith's document, rebootd's holder records and the
//! waiter queue as of one revision (read in one transaction, then kept up to date from watch
//! events), and what the lock core needs of it: the store-neutral [`View`], whether a holder
//! still holds its slot, and which records are orphans. Pure: no I/O.
//!
//! A holder is alive while its record gets new revisions (heartbeats, phase reports): its beat
//! is the record's mod revision, never the times written in it. A holder without a record
//! (locksmith's) is [`Beat::Silent`]; a waiter lives by its etcd lease ([`Beat::Ttl`]).

use std::collections::HashMap;

use super::super::arbiter::share;
use super::super::document::{
    self, query_escape, DocError, HolderRecord, SemaphoreDoc, WaiterRecord,
};
use super::super::view::{Beat, Me, Ticket, View, WaiterView};
use super::super::{holding, Fence, GroupPause, LockError};

/// Longest document value quoted in a [`LockError::Corrupt`].
const QUOTE_MAX: usize = 2000;

/// The keys of one group (see [`super::super::document`]): sorted, the group's pause < holder
/// records < queue entries < the document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Keys {
    pub group: String,
    /// locksmith's document.
    pub doc: String,
    /// rebootd's holder records (prefix).
    pub records: String,
    /// rebootd's waiter queue (prefix).
    pub queue: String,
    /// The group's pause ([`super::super::pause`]).
    pub pause: String,
    /// The group's fleet member records (prefix, [`super::members`]).
    pub members: String,
}

impl Keys {
    pub fn new(group: &str) -> Keys {
        Keys {
            group: group.to_owned(),
            doc: document::semaphore_key(group),
            records: document::holder_records_prefix(group),
            queue: document::waiter_queue_prefix(group),
            pause: super::super::pause::etcd_key(group),
            members: super::members::prefix(group),
        }
    }

    /// The key of holder `id`'s record.
    pub fn record(&self, id: &str) -> String {
        document::holder_record_key(&self.group, id)
    }

    /// The key of waiter `id`'s queue entry.
    pub fn waiter(&self, id: &str) -> String {
        document::waiter_key(&self.group, id)
    }

    /// `value`, found at the document key, as a [`LockError::Corrupt`] saying `reason`.
    pub fn corrupt(&self, value: &[u8], reason: String) -> LockError {
        let mut value = String::from_utf8_lossy(value).into_owned();
        if value.len() > QUOTE_MAX {
            let mut cut = QUOTE_MAX;
            while !value.is_char_boundary(cut) {
                cut -= 1;
            }
            value.truncate(cut);
            value.push('…');
        }
        LockError::Corrupt {
            key: self.doc.clone(),
            value,
            reason,
        }
    }

    /// Parse locksmith's document; one that does not parse is [`LockError::Corrupt`].
    pub fn parse_doc(&self, value: &[u8]) -> Result<SemaphoreDoc, LockError> {
        SemaphoreDoc::parse(value).map_err(|e| match e {
            DocError::Corrupt(reason) => self.corrupt(value, reason),
            e => self.corrupt(value, e.to_string()),
        })
    }
}

/// One key as read or watched (what the snapshot needs of etcd's `KeyValue`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kv {
    pub key: Vec<u8>,
    pub value: Vec<u8>,
    pub create_revision: i64,
    pub mod_revision: i64,
    pub lease: i64,
}

impl From<&etcd_client::KeyValue> for Kv {
    fn from(kv: &etcd_client::KeyValue) -> Kv {
        Kv {
            key: kv.key().to_vec(),
            value: kv.value().to_vec(),
            create_revision: kv.create_revision(),
            mod_revision: kv.mod_revision(),
            lease: kv.lease(),
        }
    }
}

/// One of rebootd's holder records as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordEntry {
    /// `None` when the value does not parse (it is then treated as absent).
    pub record: Option<HolderRecord>,
    pub mod_revision: i64,
}

/// One waiter's queue entry as read or watched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueEntry {
    /// The ticket: waiters are served in create-revision order.
    pub create_revision: i64,
    /// The lease it is attached to.
    pub lease: i64,
    /// `None` when the value does not parse (the entry still counts).
    pub record: Option<WaiterRecord>,
}

/// The document, the records and the queue as of one revision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// The store's revision at the read, then the revision of the last event applied.
    pub revision: i64,
    /// The document key's mod revision, what every write of it compares; 0 when absent (`doc`
    /// is then locksmith's default).
    pub doc_revision: i64,
    pub doc: SemaphoreDoc,
    /// By key.
    pub records: HashMap<String, RecordEntry>,
    /// By key; empty unless read with the queue.
    pub queue: HashMap<String, QueueEntry>,
    /// The group's pause; read (and watched) with the queue only.
    pub pause: Option<GroupPause>,
    /// The fleet member records by name (the id as escaped in the key): whether each parses.
    /// Read only to count the nodes (`lock.max = "N%"`); never watched.
    pub members: HashMap<String, bool>,
    /// Queue entries counted, not listed: a newcomer's read of a long queue (every one of
    /// them ahead of the entry it will put). The arbiter counts them as waiters ahead.
    pub unlisted: usize,
}

impl Snapshot {
    /// Nothing there, as of `revision`.
    pub fn empty(revision: i64) -> Snapshot {
        Snapshot {
            revision,
            doc_revision: 0,
            doc: SemaphoreDoc::default(),
            records: HashMap::new(),
            queue: HashMap::new(),
            pause: None,
            members: HashMap::new(),
            unlisted: 0,
        }
    }

    /// Put `kv` (one of the group's keys) in; a document that does not parse is
    /// [`LockError::Corrupt`].
    pub fn put(&mut self, keys: &Keys, kv: &Kv) -> Result<(), LockError> {
        let key = String::from_utf8_lossy(&kv.key);
        if kv.key == keys.doc.as_bytes() {
            self.doc = keys.parse_doc(&kv.value)?;
            self.doc_revision = kv.mod_revision;
        } else if kv.key == keys.pause.as_bytes() {
            self.pause = Some(GroupPause::parse(&String::from_utf8_lossy(&kv.value)));
        } else if key.starts_with(&keys.records) {
            let record = match HolderRecord::parse(&kv.value) {
                Ok(r) => Some(r),
                Err(e) => {
                    tracing::warn!(%key, error = %e, "ignoring a holder record that does not parse");
                    None
                }
            };
            let entry = RecordEntry {
                record,
                mod_revision: kv.mod_revision,
            };
            self.records.insert(key.into_owned(), entry);
        } else if let Some(name) = key.strip_prefix(&keys.members) {
            let readable = crate::fleet::NodeRecord::parse(&kv.value).is_ok();
            self.members.insert(name.to_owned(), readable);
        } else if key.starts_with(&keys.queue) {
            let entry = QueueEntry {
                create_revision: kv.create_revision,
                lease: kv.lease,
                record: WaiterRecord::parse(&kv.value).ok(),
            };
            self.queue.insert(key.into_owned(), entry);
        }
        Ok(())
    }

    /// Take the key `key` out (a delete event).
    pub fn delete(&mut self, keys: &Keys, key: &[u8]) {
        if key == keys.doc.as_bytes() {
            self.doc = SemaphoreDoc::default();
            self.doc_revision = 0;
        } else if key == keys.pause.as_bytes() {
            self.pause = None;
        } else {
            let key = String::from_utf8_lossy(key);
            self.records.remove(&*key);
            self.queue.remove(&*key);
        }
    }

    /// Apply one watch response's events (`true` = put). The revision moves to the last one.
    pub fn apply(&mut self, keys: &Keys, events: &[(bool, Kv)]) -> Result<(), LockError> {
        for (put, kv) in events {
            self.revision = self.revision.max(kv.mod_revision);
            if *put {
                self.put(keys, kv)?;
            } else {
                self.delete(keys, &kv.key);
            }
        }
        Ok(())
    }

    /// The record of holder `id`, if it has one that parses.
    pub fn record(&self, keys: &Keys, id: &str) -> Option<&HolderRecord> {
        self.records
            .get(&keys.record(id))
            .and_then(|e| e.record.as_ref())
    }

    /// The keys of records read whose holder is not in `after`: records of holders released in
    /// the same transaction and orphans left by `locksmithctl unlock`. Safe to delete in any
    /// transaction guarded by the document's revision: a record is only written while its
    /// holder is in the document.
    pub fn stale_records(&self, keys: &Keys, after: &SemaphoreDoc) -> Vec<String> {
        let live: Vec<String> = after.holders.iter().map(|h| keys.record(h)).collect();
        let mut stale: Vec<String> = self
            .records
            .keys()
            .filter(|k| !live.contains(k))
            .cloned()
            .collect();
        stale.sort();
        stale
    }

    /// The nodes a share of `max` is of ([`share::known_nodes`]): the readable member records
    /// read, the holders and the readable queue entries, each id as escaped in the keys.
    pub fn known_nodes(&self, keys: &Keys) -> u64 {
        let members = self.members.values().filter(|readable| **readable).count();
        let holders: Vec<String> = self.doc.holders.iter().map(|h| query_escape(h)).collect();
        let waiters = self
            .queue
            .iter()
            .filter(|(_, e)| e.record.is_some())
            .filter_map(|(key, _)| key.strip_prefix(&keys.queue));
        share::known_beside(
            u64::try_from(members).unwrap_or(u64::MAX),
            |id| self.members.get(id) == Some(&true),
            holders.iter().map(String::as_str).chain(waiters),
        )
    }

    /// Whether `me` holds its slot, by the lock core's rule ([`holding::fence`]).
    pub fn fence(&self, keys: &Keys, me: &Me<'_>) -> Fence {
        holding::fence(&self.view(keys, Some(me)), me, &keys.doc)
    }

    /// The arbiter's view, for `me` when given (its queue entry is the one at its key).
    pub fn view(&self, keys: &Keys, me: Option<&Me<'_>>) -> View {
        let holders = self
            .doc
            .holders
            .iter()
            .map(|id| {
                let entry = self.records.get(&keys.record(id));
                let record = entry.and_then(|e| e.record.as_ref());
                HolderRecord::view(id, record, entry.map(|e| e.mod_revision.to_string()))
            })
            .collect();
        // Queue keys are escaped ids: name the holders' and mine by their id.
        let mut ids: HashMap<String, &str> = self
            .doc
            .holders
            .iter()
            .map(|h| (keys.waiter(h), h.as_str()))
            .collect();
        let my_key = me.map(|m| keys.waiter(m.id));
        if let (Some(k), Some(m)) = (&my_key, me) {
            ids.insert(k.clone(), m.id);
        }
        let mut waiters: Vec<WaiterView> = self
            .queue
            .iter()
            .map(|(key, e)| WaiterView {
                key: key.clone(),
                ticket: Ticket {
                    order: (e.create_revision, 0),
                    name: key.clone(),
                },
                id: Some(ids.get(key).map_or_else(
                    || key.strip_prefix(&keys.queue).unwrap_or(key).to_owned(),
                    |id| (*id).to_owned(),
                )),
                node: e.record.as_ref().map(|r| r.node.clone()),
                beat: Beat::Ttl,
                mine: my_key.as_ref() == Some(key),
                zone: document::zone_of(e.record.as_ref().and_then(|r| r.zone.as_deref())),
                since: e.record.as_ref().map(|r| r.since),
            })
            .collect();
        waiters.sort_by(|a, b| a.ticket.cmp(&b.ticket));
        View {
            max: self.doc.max,
            holders,
            waiters,
            node_is_identity: false,
            my_zone: None,
            unlisted_ahead: self.unlisted,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys() -> Keys {
        Keys::new("default")
    }

    fn kv(key: &str, value: &str, create: i64, modified: i64, lease: i64) -> Kv {
        Kv {
            key: key.as_bytes().to_vec(),
            value: value.as_bytes().to_vec(),
            create_revision: create,
            mod_revision: modified,
            lease,
        }
    }

    fn record(token: Option<&str>) -> String {
        HolderRecord {
            node: "node-a".into(),
            boot_id: "b".into(),
            phase: Some("Rebooting".into()),
            since: jiff::Timestamp::UNIX_EPOCH,
            acquired: jiff::Timestamp::UNIX_EPOCH,
            token: token.map(Into::into),
            reclaimed_by: None,
            zone: None,
        }
        .to_json()
    }

    fn waiter() -> String {
        WaiterRecord {
            node: "node-w".into(),
            boot_id: "b".into(),
            token: Some("t".into()),
            since: jiff::Timestamp::UNIX_EPOCH,
            zone: None,
        }
        .to_json()
    }

    #[test]
    fn beats_are_record_revisions_and_the_queue_is_in_create_order() {
        let k = keys();
        let mut s = Snapshot::empty(10);
        let events = vec![
            (
                true,
                kv(
                    &k.doc,
                    r#"{"semaphore":0,"max":2,"holders":["a","ls"]}"#,
                    3,
                    11,
                    0,
                ),
            ),
            (true, kv(&k.record("a"), &record(Some("ta")), 4, 12, 0)),
            (true, kv(&k.waiter("late"), &waiter(), 14, 14, 7)),
            (true, kv(&k.waiter("me"), &waiter(), 13, 15, 8)),
            (true, kv(&k.waiter("a"), &waiter(), 5, 5, 9)),
        ];
        s.apply(&k, &events).unwrap();
        assert_eq!((s.revision, s.doc_revision), (15, 11));
        let me = Me {
            id: "me",
            node: "node-me",
            token: "tm",
        };
        let v = s.view(&k, Some(&me));
        assert_eq!(v.max, 2);
        let beats: Vec<(&str, &Beat)> = v.holders.iter().map(|h| (&*h.id, &h.beat)).collect();
        assert_eq!(
            beats,
            vec![("a", &Beat::Revision("12".into())), ("ls", &Beat::Silent)]
        );
        assert_eq!(v.holders[0].token.as_deref(), Some("ta"));
        let order: Vec<(Option<&str>, bool)> = v
            .waiters
            .iter()
            .map(|w| (w.id.as_deref(), w.mine))
            .collect();
        assert_eq!(
            order,
            vec![
                (Some("a"), false),
                (Some("me"), true),
                (Some("late"), false)
            ]
        );
        assert!(v.waiters.iter().all(|w| w.beat == Beat::Ttl));

        // A heartbeat is a new revision of the record; a release deletes it.
        s.apply(
            &k,
            &[(true, kv(&k.record("a"), &record(Some("ta")), 4, 20, 0))],
        )
        .unwrap();
        assert_eq!(
            s.view(&k, None).holders[0].beat,
            Beat::Revision("20".into())
        );
        s.apply(&k, &[(false, kv(&k.record("a"), "", 0, 21, 0))])
            .unwrap();
        assert_eq!(s.view(&k, None).holders[0].beat, Beat::Silent);
        assert_eq!(s.revision, 21);
    }

    /// `lock.max = "N%"` counts readable member records, holders (locksmith's too) and
    /// readable queue entries, each id once; a record that does not parse does not count.
    #[test]
    fn known_nodes_are_readable_records_holders_and_waiters() {
        let k = keys();
        let member = |id: &str| {
            format!(
                r#"{{"node":"n-{id}","id":"{id}","phase":"idle","since":"2026-11-28T00:00:00Z"}}"#
            )
        };
        let mut s = Snapshot::empty(1);
        let doc = r#"{"semaphore":-1,"max":1,"holders":["a","ls"]}"#;
        let mut events = vec![(true, kv(&k.doc, doc, 2, 2, 0))];
        for id in ["a", "m1", "m2"] {
            events.push((
                true,
                kv(&format!("{}{id}", k.members), &member(id), 3, 3, 0),
            ));
        }
        events.push((true, kv(&format!("{}junk", k.members), "not json", 3, 3, 0)));
        events.push((true, kv(&k.waiter("w"), &waiter(), 4, 4, 7)));
        events.push((true, kv(&k.waiter("m1"), &waiter(), 5, 5, 8)));
        events.push((true, kv(&k.waiter("bad"), "not json", 6, 6, 9)));
        s.apply(&k, &events).unwrap();
        assert_eq!(s.members.len(), 4);
        // a, m1, m2, ls, w.
        assert_eq!(s.known_nodes(&k), 5);
    }

    #[test]
    fn a_corrupt_document_is_an_error_naming_the_key() {
        let k = keys();
        let mut s = Snapshot::empty(1);
        let e = s
            .apply(&k, &[(true, kv(&k.doc, "not json", 2, 2, 0))])
            .unwrap_err();
        match e {
            LockError::Corrupt { key, value, .. } => {
                assert_eq!(key, k.doc);
                assert_eq!(value, "not json");
            }
            other => panic!("{other:?}"),
        }
        // Deleted: locksmith's default again.
        s.apply(&k, &[(false, kv(&k.doc, "", 0, 3, 0))]).unwrap();
        assert_eq!((s.doc.max, s.doc_revision), (1, 0));
    }

    #[test]
    fn fence_and_orphans() {
        let k = keys();
        let mut s = Snapshot::empty(1);
        s.put(
            &k,
            &kv(
                &k.doc,
                r#"{"semaphore":0,"max":1,"holders":["a"]}"#,
                2,
                2,
                0,
            ),
        )
        .unwrap();
        s.put(&k, &kv(&k.record("a"), &record(Some("ta")), 3, 3, 0))
            .unwrap();
        s.put(&k, &kv(&k.record("gone"), &record(None), 3, 3, 0))
            .unwrap();
        let me = |id, token| Me {
            id,
            node: "n",
            token,
        };
        assert_eq!(s.fence(&k, &me("a", "ta")), Fence::Held);
        assert!(
            matches!(s.fence(&k, &me("a", "other")), Fence::Lost { why } if why.contains("same machine id"))
        );
        assert!(matches!(s.fence(&k, &me("b", "tb")), Fence::Lost { .. }));
        assert_eq!(s.stale_records(&k, &s.doc), vec![k.record("gone")]);
        let mut after = s.doc.clone();
        after.unlock("a");
        assert_eq!(
            s.stale_records(&k, &after),
            vec![k.record("a"), k.record("gone")]
        );
    }
}
