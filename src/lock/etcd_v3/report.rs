//! Phase reports on etcd v3: a holder writes its phase into its own record, guarded by that
//! record's **own** mod revision, not by the document's.
//!
//! Only its holder writes a record, and every change that takes an id out of the document
//! (`unlock`, a reclaim, a take that clears orphans) deletes that id's record in the same
//! transaction. So "my record is at the revision I last saw" implies "I still hold my slot", and
//! a report does not lose races to other holders taking and giving back slots. The store keeps
//! the revision and content of the record this process last wrote ([`Written`]): a report is
//! then one transaction, whose else branch reads the semaphore when the record moved (a
//! heartbeat of mine, a release, an operator), for one more attempt on that read.
//!
//! Without a record (a slot adopted from locksmith or moved by `rebootctl migrate`) nothing
//! deletes it with the slot, so the write is guarded by the document's revision.
//!
//! A report also keeps the semaphore as it read it (the one-transaction report reads it in the
//! same transaction, after its write), for the release that follows it soon after: the release's
//! first attempt then needs no read of its own ([`crate::lock::recent`]).

use etcd_client::{Compare, CompareOp, Txn, TxnOp};

use super::snapshot::{RecordEntry, Snapshot};
use super::{EtcdSemaphore, BACKEND};
use crate::lock::document::HolderRecord;
use crate::lock::recent::Recent;
use crate::lock::retry::{cas_loop, Cas};
use crate::lock::{Fence, Identity, LockError, Reported};

/// The record this process last wrote, with the mod revision it got, and the semaphore as the
/// last report read it (with that record in it), for the release right after.
#[derive(Debug, Default)]
pub(super) struct Written {
    record: std::sync::Mutex<Option<(i64, HolderRecord)>>,
    read: Recent<Snapshot>,
}

impl Written {
    fn record(&self) -> std::sync::MutexGuard<'_, Option<(i64, HolderRecord)>> {
        self.record.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn get(&self) -> Option<(i64, HolderRecord)> {
        self.record().clone()
    }

    pub(super) fn set(&self, revision: i64, record: HolderRecord) {
        *self.record() = Some((revision, record));
        self.read.forget();
    }

    /// [`Self::set`], with the semaphore read by the same report (my record, at `key`, as
    /// written).
    fn set_read(&self, key: String, revision: i64, record: HolderRecord, mut snap: Snapshot) {
        let entry = RecordEntry {
            record: Some(record.clone()),
            mod_revision: revision,
        };
        snap.records.insert(key, entry);
        *self.record() = Some((revision, record));
        self.read.set(snap);
    }

    /// Keep `snap` (the read of a new connection) for the first attempt of the report or the
    /// release right after, as a report's own read is.
    pub(super) fn keep_read(&self, snap: Snapshot) {
        self.read.set(snap);
    }

    pub(super) fn forget(&self) {
        *self.record() = None;
        self.read.forget();
    }

    /// The semaphore the last report read, if that is recent; once.
    pub(super) fn recent(&self) -> Option<Snapshot> {
        self.read.take()
    }
}

impl EtcdSemaphore {
    /// A report that wrote is a proof ([`Reported::Held`]): my record as I last wrote it, or
    /// the document as read with me holding my slot under my token, was still there when the
    /// write landed, and the write moved my record's revision as a heartbeat does.
    pub(super) async fn report(&self, me: &Identity, phase: &str) -> Result<Reported, LockError> {
        let key = self.record_key(&me.id);
        let mut first: Option<Snapshot>;
        if let Some((revision, last)) = self.written.get().filter(|(_, r)| r.node == me.node) {
            if last.says(me, phase) {
                return Ok(Reported::Unproven);
            }
            let record = HolderRecord::after(Some(&last), me, Some(Some(phase)));
            let txn = Txn::new()
                .when(vec![Compare::mod_revision(
                    key.clone(),
                    CompareOp::Equal,
                    revision,
                )])
                .and_then(
                    std::iter::once(TxnOp::put(key.clone(), record.to_json(), None))
                        .chain(self.read_ops(false, false))
                        .collect::<Vec<_>>(),
                )
                .or_else(self.read_ops(false, false));
            let resp = self.txn(txn).await?;
            let read = self.snapshot_of(&resp, 2)?;
            if resp.succeeded() {
                let at = resp.header().map(|h| h.revision()).unwrap_or_default();
                self.written.set_read(key, at, record, read);
                return Ok(Reported::Held);
            }
            self.written.forget();
            first = Some(read);
        } else {
            // A new process: the semaphore as its connection read it a moment ago, if that
            // says I hold my slot (the write then proves it, or finds it moved). Anything
            // else is decided on a fresh read.
            first = self.written.recent().filter(|s| self.holds_on(s, me));
        }
        cas_loop!(
            BACKEND,
            "report phase",
            &key,
            self.try_report(first.take(), me, phase).await
        )
    }

    /// One attempt on a read (`snap`, or a fresh one).
    async fn try_report(
        &self,
        snap: Option<Snapshot>,
        me: &Identity,
        phase: &str,
    ) -> Result<Cas<Reported>, LockError> {
        let snap = match snap {
            Some(s) => s,
            None => self.read(false).await?,
        };
        if !snap.doc.holds(&me.id) {
            tracing::debug!(id = %me.id, phase, "not holding a slot; phase not recorded");
            return Ok(Cas::Done(Reported::Unproven));
        }
        // Held under my id, but by another host (another token): its record is not mine to
        // write (the heartbeat leaves it alone too).
        if let Fence::Lost { why } = snap.fence(&self.keys, &me.as_me()) {
            tracing::warn!(id = %me.id, phase, %why, "phase not recorded: {why}");
            return Ok(Cas::Done(Reported::Unproven));
        }
        let key = self.record_key(&me.id);
        let entry = snap.records.get(&key);
        let previous = entry.and_then(|e| e.record.as_ref());
        if let (Some(e), Some(p)) = (entry, previous) {
            if p.says(me, phase) {
                self.written.set(e.mod_revision, p.clone());
                return Ok(Cas::Done(Reported::Unproven));
            }
        }
        let record = HolderRecord::after(previous, me, Some(Some(phase)));
        let put = vec![TxnOp::put(key.clone(), record.to_json(), None)];
        let written = if entry.is_some() {
            let guard = self.record_unchanged(&snap, &me.id);
            self.commit_when(vec![guard], put).await?
        } else {
            self.commit_at(&snap, Vec::new(), put).await?
        };
        Ok(match written {
            Some(at) => {
                self.written.set_read(key, at, record, snap);
                Cas::Done(Reported::Held)
            }
            None => Cas::Conflict,
        })
    }
}
