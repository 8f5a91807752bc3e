//! The locksmith semaphore document and rebootd's holder records beside it: key layout, strict
//! parsing, Go-compatible encoding and the pure lock/unlock/set-max operations. No I/O here.
//!
//! # Key layout
//!
//! | what                         | default group (`"default"` or `""`)               | group `g`                                                    |
//! |------------------------------|---------------------------------------------------|--------------------------------------------------------------|
//! | locksmith's document         | `coreos.com/updateengine/rebootlock/semaphore`    | `coreos.com/updateengine/rebootlock/groups/<g>/semaphore`    |
//! | rebootd's record of holder h | `coreos.com/updateengine/rebootlock/rebootd/holders/<h>` | `coreos.com/updateengine/rebootlock/groups/<g>/rebootd/holders/<h>` |
//! | rebootd's queue entry of waiter w | `coreos.com/updateengine/rebootlock/rebootd/waiters/<w>` | `coreos.com/updateengine/rebootlock/groups/<g>/rebootd/waiters/<w>` |
//!
//! `<g>` and `<h>` are escaped as Go's `url.QueryEscape` does (space becomes `+`), so neither can
//! contain a `/`. The document holds exactly what locksmith stores
//! (`{"semaphore":<free>,"max":<n>,"holders":[...]}`) and nothing else; rebootd's extra data about
//! a holder (node, boot id, phase, since) lives in one small JSON key per holder
//! ([`HolderRecord`]), so locksmith never sees it and concurrent phase reports of different
//! holders never touch the same key. A record is only ever written in a transaction that also
//! compares the document's mod revision and finds its holder in the document, so a record whose
//! holder is gone from the document (unlocked by `locksmithctl`) is an orphan that may be
//! deleted in any later transaction guarded by the document's mod revision.
//!
//! A rebootd waiting for a slot keeps a queue entry ([`WaiterRecord`]) attached to an etcd lease;
//! the entries' create revisions order the waiters (see `super::etcd_v3`). locksmith never reads them.
//! Sorted, the keys of one group run: holder records < queue entries < the document, with nothing
//! of locksmith's in between, so one watch of the range [`holder_records_prefix`] ..= document
//! sees all three.

use super::view::{Beat, HolderView};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// locksmith's key prefix.
pub const KEY_PREFIX: &str = "coreos.com/updateengine/rebootlock";

/// Whether `group` names locksmith's default semaphore.
pub fn is_default_group(group: &str) -> bool {
    group.is_empty() || group == "default"
}

/// Escape `s` exactly as Go's `url.QueryEscape`: ASCII letters, digits and `-_.~` stay, space
/// becomes `+`, every other byte becomes `%XX` (upper-case hex).
pub fn query_escape(s: &str) -> String {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let mut out = String::with_capacity(s.len());
    for &b in s.as_bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(char::from(b))
            }
            b' ' => out.push('+'),
            _ => {
                out.push('%');
                out.push(char::from(HEX[usize::from(b >> 4)]));
                out.push(char::from(HEX[usize::from(b & 0x0f)]));
            }
        }
    }
    out
}

/// The key of locksmith's semaphore document for `group`.
pub fn semaphore_key(group: &str) -> String {
    if is_default_group(group) {
        format!("{KEY_PREFIX}/semaphore")
    } else {
        format!("{KEY_PREFIX}/groups/{}/semaphore", query_escape(group))
    }
}

/// The prefix under which rebootd keeps one [`HolderRecord`] per holder of `group`.
pub fn holder_records_prefix(group: &str) -> String {
    if is_default_group(group) {
        format!("{KEY_PREFIX}/rebootd/holders/")
    } else {
        format!(
            "{KEY_PREFIX}/groups/{}/rebootd/holders/",
            query_escape(group)
        )
    }
}

/// The key of rebootd's record about holder `id` in `group`.
pub fn holder_record_key(group: &str, id: &str) -> String {
    format!("{}{}", holder_records_prefix(group), query_escape(id))
}

/// The prefix under which rebootd's waiters for a slot of `group` keep one [`WaiterRecord`] each.
pub fn waiter_queue_prefix(group: &str) -> String {
    if is_default_group(group) {
        format!("{KEY_PREFIX}/rebootd/waiters/")
    } else {
        format!(
            "{KEY_PREFIX}/groups/{}/rebootd/waiters/",
            query_escape(group)
        )
    }
}

/// The key of waiter `id`'s queue entry in `group`.
pub fn waiter_key(group: &str, id: &str) -> String {
    format!("{}{}", waiter_queue_prefix(group), query_escape(id))
}

/// Why a document was refused or an operation on it is not possible.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DocError {
    /// The bytes are not locksmith's document; the reason says what is wrong.
    #[error("{0}")]
    Corrupt(String),
    /// `lock` found no free slot.
    #[error("no free slot: {free} free of {max}, held by {holders:?}")]
    NoFreeSlot {
        free: i64,
        max: u64,
        holders: Vec<String>,
    },
}

/// locksmith's semaphore document, always consistent: `semaphore + holders.len() == max`.
///
/// `holders` is kept sorted, as locksmith keeps it (it looks holders up by binary search).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SemaphoreDoc {
    /// Free slots; negative when `max` was forced below the number of holders.
    pub semaphore: i64,
    pub max: u64,
    pub holders: Vec<String>,
}

impl Default for SemaphoreDoc {
    /// What locksmith creates when the key is absent: one slot, free.
    fn default() -> Self {
        SemaphoreDoc {
            semaphore: 1,
            max: 1,
            holders: Vec::new(),
        }
    }
}

impl SemaphoreDoc {
    /// Parse a stored value. Refuses, with the reason, anything but locksmith's exact document:
    /// not a JSON object, unknown or missing fields, non-integer or negative `max`, non-string,
    /// empty or duplicate holders, and `semaphore + holders != max` (locksmith keeps these
    /// consistent, so a mismatch means someone else wrote it). `holders: null` (what Go writes for
    /// an empty list) is accepted as empty. Unsorted holders are accepted and sorted.
    pub fn parse(bytes: &[u8]) -> Result<Self, DocError> {
        let corrupt = |s: String| DocError::Corrupt(s);
        let value: Value =
            serde_json::from_slice(bytes).map_err(|e| corrupt(format!("not JSON: {e}")))?;
        let Value::Object(map) = value else {
            return Err(corrupt(format!(
                "expected a JSON object, found {}",
                kind(&value)
            )));
        };
        if let Some(unknown) = map
            .keys()
            .find(|k| !matches!(k.as_str(), "semaphore" | "max" | "holders"))
        {
            return Err(corrupt(format!(
                "unknown field `{unknown}` (expected only semaphore, max, holders)"
            )));
        }
        let field = |name: &str| {
            map.get(name)
                .ok_or_else(|| corrupt(format!("missing field `{name}`")))
        };
        let semaphore = match field("semaphore")? {
            Value::Number(n) => n
                .as_i64()
                .ok_or_else(|| corrupt(format!("`semaphore` must be an integer, found {n}")))?,
            other => {
                return Err(corrupt(format!(
                    "`semaphore` must be an integer, found {}",
                    kind(other)
                )))
            }
        };
        let max = match field("max")? {
            Value::Number(n) => match (n.as_i64(), n.as_u64()) {
                (Some(i), _) if i < 0 => {
                    return Err(corrupt(format!("`max` must not be negative, found {i}")))
                }
                (Some(_), Some(u)) => u,
                _ => return Err(corrupt(format!("`max` must be an integer, found {n}"))),
            },
            other => {
                return Err(corrupt(format!(
                    "`max` must be an integer, found {}",
                    kind(other)
                )))
            }
        };
        let mut holders = match field("holders")? {
            Value::Null => Vec::new(),
            Value::Array(items) => {
                let mut holders = Vec::with_capacity(items.len());
                for (i, item) in items.iter().enumerate() {
                    match item {
                        Value::String(s) if s.is_empty() => {
                            return Err(corrupt(format!("holder #{i} is an empty string")))
                        }
                        Value::String(s) => holders.push(s.clone()),
                        other => {
                            return Err(corrupt(format!(
                                "holder #{i} must be a string, found {}",
                                kind(other)
                            )))
                        }
                    }
                }
                holders
            }
            other => {
                return Err(corrupt(format!(
                    "`holders` must be a list of strings or null, found {}",
                    kind(other)
                )))
            }
        };
        holders.sort();
        if let Some(w) = holders.windows(2).find(|w| w[0] == w[1]) {
            return Err(corrupt(format!("holder {:?} is listed twice", w[0])));
        }
        let count = i64::try_from(holders.len()).unwrap_or(i64::MAX);
        let consistent = i64::try_from(max)
            .ok()
            .and_then(|m| semaphore.checked_add(count).map(|s| s == m))
            .unwrap_or(false);
        if !consistent {
            return Err(corrupt(format!(
                "inconsistent: semaphore {semaphore} + {count} holders != max {max}"
            )));
        }
        Ok(SemaphoreDoc {
            semaphore,
            max,
            holders,
        })
    }

    /// Encode as Go's `json.Marshal` of locksmith's struct: fields in the order semaphore, max,
    /// holders, no spaces, Go's string escaping. An empty holder list is written as `[]` (Go
    /// reads `[]` and `null` alike).
    pub fn to_json(&self) -> String {
        let mut out = format!(
            "{{\"semaphore\":{},\"max\":{},\"holders\":[",
            self.semaphore, self.max
        );
        for (i, h) in self.holders.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            go_json_string(&mut out, h);
        }
        out.push_str("]}");
        out
    }

    /// Free slots (negative when `max` was forced below the holders).
    pub fn free(&self) -> i64 {
        self.semaphore
    }

    pub fn holds(&self, id: &str) -> bool {
        self.holders
            .binary_search_by(|h| h.as_str().cmp(id))
            .is_ok()
    }

    /// Take a slot for `id`. Returns `Ok(false)` when `id` holds one already (nothing changed),
    /// `Ok(true)` when it took one, [`DocError::NoFreeSlot`] when none is free.
    pub fn lock(&mut self, id: &str) -> Result<bool, DocError> {
        self.lock_within(id, self.max)
    }

    /// [`Self::lock`] with `max` slots in place of the document's (`lock.max = "N%"`, see
    /// [`super::arbiter::share`]): taking one past the document's `max` leaves `semaphore`
    /// negative, as a forced `set-max` below the holders does, so locksmith takes none then.
    pub fn lock_within(&mut self, id: &str, max: u64) -> Result<bool, DocError> {
        let held = u64::try_from(self.holders.len()).unwrap_or(u64::MAX);
        match self.holders.binary_search_by(|h| h.as_str().cmp(id)) {
            Ok(_) => Ok(false),
            Err(_) if held >= max => Err(DocError::NoFreeSlot {
                free: self.semaphore,
                max: self.max,
                holders: self.holders.clone(),
            }),
            Err(at) => {
                self.holders.insert(at, id.to_owned());
                self.semaphore -= 1;
                Ok(true)
            }
        }
    }

    /// Give back the slot of `id`. Returns whether `id` held one.
    pub fn unlock(&mut self, id: &str) -> bool {
        match self.holders.binary_search_by(|h| h.as_str().cmp(id)) {
            Ok(at) => {
                self.holders.remove(at);
                self.semaphore += 1;
                true
            }
            Err(_) => false,
        }
    }

    /// Set the number of slots, moving `semaphore` by the same delta as locksmith's `SetMax`
    /// (below the holders too: whether that is allowed is [`super::holding::may_set_max`]).
    pub fn set_max(&mut self, max: u64) -> Result<(), DocError> {
        let max_i = i64::try_from(max)
            .map_err(|_| DocError::Corrupt(format!("max {max} does not fit locksmith's int")))?;
        let count = i64::try_from(self.holders.len()).unwrap_or(i64::MAX);
        self.semaphore = max_i - count;
        self.max = max;
        Ok(())
    }
}

/// rebootd's data about one holder, stored as JSON at [`holder_record_key`]. locksmith never reads
/// it. Written when the slot is taken, at every phase change and at every heartbeat (each write
/// is a new revision of the key: that, not a time in it, is what shows the holder alive);
/// deleted on release.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HolderRecord {
    pub node: String,
    pub boot_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// When the phase last changed (the holder's clock; shown, never compared).
    pub since: jiff::Timestamp,
    /// When the slot was taken (the holder's clock; shown, never compared).
    pub acquired: jiff::Timestamp,
    /// The holder token of the host that took the slot (absent in records of rebootd before
    /// tokens): tells it from another host with the same machine id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    /// Set (to who claims it) by a waiter that judged this holder stopped and is taking its slot
    /// back (the etcd v2 store, see `etcd_v2::waiting`): the claim is a compare-and-swap on the
    /// record it judged silent, so a holder that wrote since makes it fail, and a holder that
    /// finds it here has lost its slot. The slot itself is given back by the next write of
    /// the document.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reclaimed_by: Option<String>,
    /// The zone its holder claims (`lock.zone`), for `lock.max_per_zone`; absent from records
    /// of rebootd before zones, or of a node without one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
}

impl HolderRecord {
    /// Whether this record already says `phase` for this very host (boot, node and token).
    pub fn says(&self, me: &super::Identity, phase: &str) -> bool {
        self.phase.as_deref() == Some(phase)
            && self.boot_id == me.boot_id
            && self.node == me.node
            && self.token.as_deref() == Some(me.token.as_str())
    }

    /// The record `me` writes after `previous` (its own, if any): `phase` when given
    /// (`Some(None)` clears it), else the previous phase; `since` moves when the phase or the
    /// boot changes; `acquired` is kept.
    pub fn after(
        previous: Option<&HolderRecord>,
        me: &super::Identity,
        phase: Option<Option<&str>>,
    ) -> HolderRecord {
        let now = jiff::Timestamp::now();
        let phase = match phase {
            Some(p) => p.map(str::to_owned),
            None => previous.and_then(|p| p.phase.clone()),
        };
        let since = match previous {
            Some(p) if p.phase == phase && p.boot_id == me.boot_id => p.since,
            _ => now,
        };
        HolderRecord {
            node: me.node.clone(),
            boot_id: me.boot_id.clone(),
            phase,
            since,
            acquired: previous.map_or(now, |p| p.acquired),
            token: Some(me.token.clone()),
            reclaimed_by: None,
            zone: me.zone.clone(),
        }
    }

    pub fn parse(bytes: &[u8]) -> Result<Self, serde_json::Error> {
        serde_json::from_slice(bytes)
    }

    /// What the lock core sees of holder `id` of locksmith's document, with its record if it
    /// has one that parses, and the record's store revision (`None`: no record, so it beats
    /// silently, as locksmith's holders do).
    pub fn view(id: &str, record: Option<&HolderRecord>, revision: Option<String>) -> HolderView {
        HolderView {
            id: id.to_owned(),
            node: record.map(|r| r.node.clone()),
            boot_id: record.map(|r| r.boot_id.clone()),
            phase: record.and_then(|r| r.phase.clone()),
            token: record.and_then(|r| r.token.clone()),
            beat: revision.map_or(Beat::Silent, Beat::Revision),
            gone: None,
            foreign: None,
            claimed_by: None,
            since: record.map(|r| r.since),
            zone: record.and_then(|r| zone_of(r.zone.as_deref())),
        }
    }

    pub fn to_json(&self) -> String {
        // A struct of strings and timestamps always serializes.
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// A rebootd waiting for a slot, stored as JSON at [`waiter_key`] under an etcd lease that the
/// waiter keeps alive. locksmith never reads it. Its place in the queue is the key's create
/// revision, not anything in the value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WaiterRecord {
    pub node: String,
    pub boot_id: String,
    /// The waiter's holder token (absent from older rebootd).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    /// When it started waiting (kept when a restarted rebootd takes its entry over).
    pub since: jiff::Timestamp,
    /// The zone it claims (`lock.zone`), as in [`HolderRecord::zone`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
}

/// A zone as a record claims it, for the lock core: one that is not a zone name (any node may
/// write anything) is unknown, which counts in every zone.
pub fn zone_of(claimed: Option<&str>) -> Option<String> {
    claimed
        .filter(|z| crate::config::is_zone(z))
        .map(str::to_owned)
}

impl WaiterRecord {
    pub fn parse(bytes: &[u8]) -> Result<Self, serde_json::Error> {
        serde_json::from_slice(bytes)
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

/// Append `s` as a JSON string the way Go's encoding/json writes it (HTML-safe escaping).
fn go_json_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '<' | '>' | '&' | '\u{2028}' | '\u{2029}' => {
                out.push_str(&format!("\\u{:04x}", u32::from(c)))
            }
            c if u32::from(c) < 0x20 => out.push_str(&format!("\\u{:04x}", u32::from(c))),
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    fn corrupt(s: &str) -> String {
        match SemaphoreDoc::parse(s.as_bytes()) {
            Err(DocError::Corrupt(r)) => r,
            other => panic!("expected Corrupt for {s}, got {other:?}"),
        }
    }

    #[test]
    fn keys_follow_locksmith() {
        assert_eq!(
            semaphore_key("default"),
            "coreos.com/updateengine/rebootlock/semaphore"
        );
        assert_eq!(semaphore_key(""), semaphore_key("default"));
        assert_eq!(
            semaphore_key("db workers/eu"),
            "coreos.com/updateengine/rebootlock/groups/db+workers%2Feu/semaphore"
        );
        assert_eq!(
            holder_record_key("default", "abc"),
            "coreos.com/updateengine/rebootlock/rebootd/holders/abc"
        );
        assert_eq!(
            holder_record_key("g1", "a b"),
            "coreos.com/updateengine/rebootlock/groups/g1/rebootd/holders/a+b"
        );
        // Records never live under the document's key nor under locksmith's old holders prefix.
        assert!(!holder_records_prefix("default").starts_with(&semaphore_key("default")));
        assert!(!holder_records_prefix("default").starts_with(&format!("{KEY_PREFIX}/holders")));
        assert_eq!(
            waiter_key("default", "abc"),
            "coreos.com/updateengine/rebootlock/rebootd/waiters/abc"
        );
        assert_eq!(
            waiter_key("db workers/eu", "a/b"),
            "coreos.com/updateengine/rebootlock/groups/db+workers%2Feu/rebootd/waiters/a%2Fb"
        );
    }

    #[test]
    fn one_key_range_holds_records_queue_and_document() {
        for group in ["default", "g1", "db workers/eu", "z"] {
            let (records, queue, doc) = (
                holder_records_prefix(group),
                waiter_queue_prefix(group),
                semaphore_key(group),
            );
            // The range [records, doc] holds the queue, and ends at the document.
            assert!(records < queue && queue < doc, "{group}");
            assert!(waiter_key(group, "~~~~") < doc, "{group}");
            assert!(holder_record_key(group, "~~~~") < queue, "{group}");
            // locksmith's own keys of that group and other groups are outside it.
            let dir = doc.strip_suffix("semaphore").unwrap();
            assert!(format!("{dir}holders") < records, "{group}");
            for other in ["default", "g0", "g1-x", "g1.x", "g2", "db workers", "zz"] {
                if other != group {
                    let k = semaphore_key(other);
                    assert!(
                        !(records.as_str() <= k.as_str() && k <= doc),
                        "{group} {other}"
                    );
                }
            }
        }
    }

    #[test]
    fn query_escape_matches_go() {
        // Values from Go: url.QueryEscape(...)
        assert_eq!(query_escape("a-b_c.d~e"), "a-b_c.d~e");
        assert_eq!(query_escape("a b"), "a+b");
        assert_eq!(query_escape("a+b"), "a%2Bb");
        assert_eq!(query_escape("x/y?z=1&w"), "x%2Fy%3Fz%3D1%26w");
        assert_eq!(query_escape("*!'()"), "%2A%21%27%28%29");
        assert_eq!(query_escape("é"), "%C3%A9");
    }

    #[test]
    fn parses_locksmith_documents() {
        let d = SemaphoreDoc::parse(br#"{"semaphore":1,"max":1,"holders":null}"#).unwrap();
        assert_eq!(d, SemaphoreDoc::default());
        let d = SemaphoreDoc::parse(br#"{"semaphore":0,"max":2,"holders":["b","a"]}"#).unwrap();
        assert_eq!(d.holders, vec!["a", "b"]);
        assert_eq!(d.free(), 0);
        // Spaces and field order do not matter to a JSON reader.
        let d = SemaphoreDoc::parse(br#" { "holders": [], "max": 3, "semaphore": 3 } "#).unwrap();
        assert_eq!(d.max, 3);
        // max forced below the holders: negative semaphore, still consistent.
        let d = SemaphoreDoc::parse(br#"{"semaphore":-1,"max":1,"holders":["a","b"]}"#).unwrap();
        assert_eq!(d.free(), -1);
    }

    #[test]
    fn refuses_anything_else_with_a_reason() {
        assert!(corrupt("not json").contains("not JSON"));
        assert!(corrupt("[]").contains("JSON object"));
        assert!(corrupt(r#"{"semaphore":"x"}"#).contains("`semaphore` must be an integer"));
        assert!(corrupt(r#"{"semaphore":1,"max":1}"#).contains("missing field `holders`"));
        assert!(corrupt(r#"{"max":1,"holders":[]}"#).contains("missing field `semaphore`"));
        assert!(corrupt(r#"{"semaphore":1.5,"max":1,"holders":[]}"#).contains("integer"));
        assert!(corrupt(r#"{"semaphore":-1,"max":-1,"holders":[]}"#).contains("negative"));
        assert!(corrupt(r#"{"semaphore":0,"max":1,"holders":[1]}"#).contains("must be a string"));
        assert!(corrupt(r#"{"semaphore":0,"max":1,"holders":[""]}"#).contains("empty"));
        assert!(corrupt(r#"{"semaphore":0,"max":2,"holders":["a","a"]}"#).contains("twice"));
        assert!(corrupt(r#"{"semaphore":0,"max":1,"holders":{}}"#).contains("list of strings"));
        assert!(corrupt(r#"{"semaphore":1,"max":1,"holders":["a"]}"#).contains("inconsistent"));
        assert!(
            corrupt(r#"{"semaphore":1,"max":1,"holders":[],"x":1}"#).contains("unknown field `x`")
        );
        assert!(corrupt(r#"{"Semaphore":1,"max":1,"holders":[]}"#).contains("unknown field"));
        assert!(
            corrupt(r#"{"semaphore":0,"max":18446744073709551615,"holders":[]}"#)
                .contains("integer")
        );
    }

    #[test]
    fn encodes_like_go() {
        let mut d = SemaphoreDoc::default();
        assert_eq!(d.to_json(), r#"{"semaphore":1,"max":1,"holders":[]}"#);
        d.lock("a").unwrap();
        assert_eq!(d.to_json(), r#"{"semaphore":0,"max":1,"holders":["a"]}"#);
        let odd = SemaphoreDoc {
            semaphore: 0,
            max: 1,
            holders: vec!["<a&\"\\\n\u{1}>".into()],
        };
        assert_eq!(
            odd.to_json(),
            r#"{"semaphore":0,"max":1,"holders":["\u003ca\u0026\"\\\n\u0001\u003e"]}"#
        );
        // What we write, we read back.
        assert_eq!(SemaphoreDoc::parse(odd.to_json().as_bytes()).unwrap(), odd);
    }

    #[test]
    fn lock_unlock_keep_sorted_and_counted() {
        let mut d = SemaphoreDoc::default();
        d.set_max(3).unwrap();
        assert_eq!(d.lock("c"), Ok(true));
        assert_eq!(d.lock("a"), Ok(true));
        assert_eq!(d.lock("a"), Ok(false), "holding already is a no-op");
        assert_eq!(d.holders, vec!["a", "c"]);
        assert_eq!(d.free(), 1);
        assert_eq!(d.lock("b"), Ok(true));
        assert_eq!(d.holders, vec!["a", "b", "c"]);
        assert!(matches!(
            d.lock("d"),
            Err(DocError::NoFreeSlot { free: 0, .. })
        ));
        assert!(d.unlock("b"));
        assert!(!d.unlock("b"));
        assert_eq!(d.holders, vec!["a", "c"]);
        assert_eq!(d.free(), 1);
        assert!(d.holds("a") && !d.holds("b"));
    }

    #[test]
    fn set_max_moves_free_by_the_delta() {
        let mut d = SemaphoreDoc::default();
        d.lock("a").unwrap();
        d.set_max(3).unwrap();
        assert_eq!((d.max, d.free()), (3, 2));
        d.lock("b").unwrap();
        d.set_max(0).unwrap();
        assert_eq!((d.max, d.free()), (0, -2));
        assert!(SemaphoreDoc::parse(d.to_json().as_bytes()).is_ok());
        assert!(matches!(d.lock("c"), Err(DocError::NoFreeSlot { .. })));
        assert!(d.unlock("a"));
        assert_eq!(d.free(), -1);
    }

    #[test]
    fn holder_record_round_trips() {
        let r = HolderRecord {
            node: "worker-1".into(),
            boot_id: "b1".into(),
            phase: Some("Draining".into()),
            since: jiff::Timestamp::from_second(1_700_000_000).unwrap(),
            acquired: jiff::Timestamp::from_second(1_699_999_000).unwrap(),
            token: Some("0123abcd".into()),
            reclaimed_by: None,
            zone: None,
        };
        assert_eq!(HolderRecord::parse(r.to_json().as_bytes()).unwrap(), r);
        assert!(HolderRecord::parse(b"{}").is_err());
    }
}
