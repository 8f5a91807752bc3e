//! A pause of a whole group (`rebootctl pause --group`), kept in the lock store beside the
//! semaphore so every node of the group sees it: while it is set no node of the group takes a
//! slot (a waiter leaves the queue and waits for the resume), and holders finish their cycle.
//!
//! Where each store keeps it, and how a waiter follows it without a request of its own
//! (`Semaphore::acquire_unless_paused`):
//! - etcd v3 and v2: the key `…/rebootd/control/paused` beside locksmith's document (never in
//!   it: locksmith reads only its document). On v3 it sorts just before the holder records, so
//!   a waiter reads it in its one read and follows it in its one watch (from the pause to the
//!   document); on v2 it is in the group's directory, which a waiter reads and watches whole.
//! - Leases: the annotation `rebootd.io/paused` on a Lease of its own, `<name>-paused` (see
//!   `kube_lease::pause`), labelled as the semaphore's (role `pause`), so it comes with a
//!   waiter's one list and watch.
//! - A FleetLock server owns its semaphore and has no such call: refused by `rebootctl`.

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use super::LockError;

/// A group's pause as the store keeps it (JSON on etcd, the annotation's value on a Lease).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupPause {
    /// When `rebootctl pause --group` was run.
    pub since: Timestamp,
    /// What the operator said (`--reason`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Where it was run from (the host's node name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
}

impl GroupPause {
    /// Parse what a store holds. Something that does not parse still pauses the group (someone
    /// meant to): its text becomes the reason.
    /// Its text is bounded and escaped ([`crate::text::clean`]): it is shown to operators.
    pub fn parse(value: &str) -> GroupPause {
        match serde_json::from_str::<GroupPause>(value) {
            Ok(p) => GroupPause {
                since: p.since,
                reason: p.reason.as_deref().map(crate::text::clean),
                by: p.by.as_deref().map(crate::text::clean),
            },
            Err(_) => GroupPause {
                since: Timestamp::UNIX_EPOCH,
                reason: Some(format!(
                    "unreadable pause record: {}",
                    crate::text::clean(value)
                )),
                by: None,
            },
        }
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// In words, for status lines and logs.
    pub fn describe(&self) -> String {
        let mut s = format!("since {}", self.since);
        if let Some(by) = &self.by {
            s.push_str(&format!(" by {by}"));
        }
        if let Some(r) = &self.reason {
            s.push_str(&format!(": {r}"));
        }
        s
    }
}

/// The pause as a store's `group_pause` read it, with where that read was (etcd's revision or
/// index), kept a moment (see [`super::recent`]): a `pause_changed(known)` right after it
/// watches from there when the pause read is `known`, instead of reading it again. A watch from
/// the read's position sees every change after it; one that starts too far back (compacted, the
/// index cleared) reads again, as it always did.
pub(crate) type LastRead<At> = super::recent::Recent<(Option<GroupPause>, At)>;

/// Where `last`'s read was, when it saw `known` (None: read again). Forgets the read either way.
pub(crate) fn watch_from<At>(last: &LastRead<At>, known: Option<&GroupPause>) -> Option<At> {
    last.take()
        .filter(|(pause, _)| pause.as_ref() == known)
        .map(|(_, at)| at)
}

/// The group's pause as the agent follows it and `rebootctl status` shows it: a supertrait of
/// [`super::Semaphore`] and [`super::Admin`]. Every store that keeps a pause gets it from its
/// [`PauseRecord`]; one that keeps none (no lock, a FleetLock server) says so in its own impl.
#[async_trait::async_trait]
pub trait Pauses: Send + Sync {
    /// The group's pause as the store says now.
    async fn group_pause(&self) -> Result<Option<GroupPause>, LockError>;

    /// Wait (by watch) until the group's pause differs from `known`, and say what it is then.
    async fn group_pause_changed(
        &self,
        known: Option<&GroupPause>,
    ) -> Result<Option<GroupPause>, LockError>;
}

#[async_trait::async_trait]
impl<R: PauseRecord + Send> Pauses for R {
    async fn group_pause(&self) -> Result<Option<GroupPause>, LockError> {
        now(self, self.last_read()).await
    }

    async fn group_pause_changed(
        &self,
        known: Option<&GroupPause>,
    ) -> Result<Option<GroupPause>, LockError> {
        changed(self, self.last_read(), known).await
    }
}

/// A store's pause record, as the one wait for a change ([`changed`]) needs it.
#[async_trait::async_trait]
pub(crate) trait PauseRecord: Sync {
    /// Where a read was in the store's history (etcd's revision or index, a resourceVersion).
    type At: Send;
    /// The last read of the pause, kept for the wait that may follow it.
    fn last_read(&self) -> &LastRead<Self::At>;
    /// The pause now, and where that read was.
    async fn read_pause(&self) -> Result<(Option<GroupPause>, Self::At), LockError>;
    /// Watch from after `at` until the pause differs from `known`: `Some` of what it is then;
    /// `None` when the store's history no longer reaches `at` (compacted, cleared, gone) or the
    /// watch ended, and the pause is read again.
    async fn watch_pause(
        &self,
        at: Self::At,
        known: Option<&GroupPause>,
    ) -> Result<Option<Option<GroupPause>>, LockError>;
}

/// The pause now; the read is remembered in `last` for the wait that may follow.
pub(crate) async fn now<R: PauseRecord>(
    record: &R,
    last: &LastRead<R::At>,
) -> Result<Option<GroupPause>, LockError> {
    let (pause, at) = record.read_pause().await?;
    last.set((pause.clone(), at));
    Ok(pause)
}

/// Wait until the pause differs from `known`, written once for every store: read (unless
/// `last` saw `known`: then watch from there), return what differs, else watch from the read;
/// a watch whose start the store no longer has reads again.
pub(crate) async fn changed<R: PauseRecord>(
    record: &R,
    last: &LastRead<R::At>,
    known: Option<&GroupPause>,
) -> Result<Option<GroupPause>, LockError> {
    let mut from = watch_from(last, known);
    loop {
        let at = match from.take() {
            Some(at) => at,
            None => {
                let (now, at) = record.read_pause().await?;
                if now.as_ref() != known {
                    return Ok(now);
                }
                at
            }
        };
        if let Some(now) = record.watch_pause(at, known).await? {
            return Ok(now);
        }
    }
}

/// The etcd key (v3 form, no leading `/`) of `group`'s pause.
pub fn etcd_key(group: &str) -> String {
    let records = super::document::holder_records_prefix(group);
    let base = records.strip_suffix("holders/").unwrap_or(&records);
    format!("{base}control/paused")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_read_serves_one_wait_for_the_pause_it_saw() {
        let p = GroupPause::parse("freeze");
        let last = LastRead::default();
        assert_eq!(watch_from(&last, None), None::<i64>, "nothing read yet");
        last.set((None, 7));
        assert_eq!(watch_from(&last, None), Some(7));
        assert_eq!(watch_from(&last, None), None, "taken once");
        last.set((None, 8));
        assert_eq!(
            watch_from(&last, Some(&p)),
            None,
            "another pause: read again"
        );
        assert_eq!(watch_from(&last, None), None, "and forgotten");
        last.set((None, 9));
        last.set((Some(p.clone()), 10));
        assert_eq!(watch_from(&last, Some(&p)), Some(10), "the newest read");
    }

    #[test]
    fn the_key_is_beside_the_document_and_starts_the_watched_range() {
        for group in ["default", "workers"] {
            let key = etcd_key(group);
            let doc = super::super::document::semaphore_key(group);
            let records = super::super::document::holder_records_prefix(group);
            let queue = super::super::document::waiter_queue_prefix(group);
            assert!(key.ends_with("/rebootd/control/paused"), "{key}");
            // Waiters on v3 read and watch [pause, doc]: the pause, the records, the queue.
            assert!(
                key < records && records < queue && queue < doc,
                "{key} {records} {queue} {doc}"
            );
        }
        assert!(etcd_key("workers").contains("/groups/workers/"));
    }

    #[test]
    fn a_record_round_trips_and_junk_still_pauses() {
        let p = GroupPause {
            since: Timestamp::from_second(1_800_000_000).unwrap(),
            reason: Some("kernel freeze".into()),
            by: Some("worker-1".into()),
        };
        assert_eq!(GroupPause::parse(&p.to_json()), p);
        assert!(p.describe().contains("by worker-1: kernel freeze"));
        let junk = GroupPause::parse("yes");
        assert!(junk.reason.unwrap().contains("yes"));
    }
}
