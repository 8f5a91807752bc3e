//! The compare-and-swap loop of the calls other than `acquire` on v3: `f` builds the
//! transaction's operations from a read, the commit compares the document's mod revision. For
//! a release, an unlock and `set-max`, a write that lost brings the document back in the same
//! transaction (its else branch) and the retry writes on it: no read of its own, and not the
//! holder records, which grow with `max`. The records of the first read still name the orphans
//! to delete, but those of holders that left the document meanwhile (each one's release
//! deletes its own); the commit is guarded by the document as brought back.

use etcd_client::{Compare, CompareOp, Txn, TxnOp};

use super::super::retry::{cas_loop, Cas};
use super::super::LockError;
use super::snapshot::Snapshot;
use super::{EtcdSemaphore, BACKEND};

impl EtcdSemaphore {
    /// One attempt: `f` builds the operations from `basis` (a read, or none yet: read the
    /// document and the records), `None` = nothing to do. With `doc_alone`, a lost write leaves
    /// the first read with the document it lost to in `basis`.
    async fn try_update<F>(
        &self,
        basis: &mut Option<Snapshot>,
        doc_alone: bool,
        f: &mut F,
    ) -> Result<Cas<()>, LockError>
    where
        F: FnMut(&Snapshot) -> Result<Option<Vec<TxnOp>>, LockError> + Send,
    {
        let snap = match basis.take() {
            Some(s) => s,
            None => self.read(false).await?,
        };
        let Some(ops) = f(&snap)? else {
            return Ok(Cas::Done(()));
        };
        if !doc_alone {
            return Ok(match self.commit(&snap, Vec::new(), ops).await? {
                true => Cas::Done(()),
                false => Cas::Conflict,
            });
        }
        let unchanged =
            Compare::mod_revision(self.keys.doc.clone(), CompareOp::Equal, snap.doc_revision);
        let txn = Txn::new()
            .when(vec![unchanged])
            .and_then(ops)
            .or_else(vec![TxnOp::get(self.keys.doc.clone(), None)]);
        let resp = self.txn(txn).await?;
        if resp.succeeded() {
            return Ok(Cas::Done(()));
        }
        tracing::debug!(key = %self.keys.doc, revision = snap.doc_revision, "lost a race");
        let now = self.snapshot_of(&resp, 1)?;
        let mut snap = snap;
        snap.reread_doc(&self.keys, now);
        *basis = Some(snap);
        Ok(Cas::Conflict)
    }

    /// The compare-and-swap loop (`doc_alone`: see the module).
    pub(super) async fn update<F>(&self, what: &str, doc_alone: bool, f: F) -> Result<(), LockError>
    where
        F: FnMut(&Snapshot) -> Result<Option<Vec<TxnOp>>, LockError> + Send,
    {
        self.update_from(what, None, doc_alone, f).await
    }

    /// [`EtcdSemaphore::update`], its first attempt on `first` (a read just made) when given:
    /// the commit compares the document's mod revision, so a stale one only costs a retry.
    async fn update_from<F>(
        &self,
        what: &str,
        first: Option<Snapshot>,
        doc_alone: bool,
        mut f: F,
    ) -> Result<(), LockError>
    where
        F: FnMut(&Snapshot) -> Result<Option<Vec<TxnOp>>, LockError> + Send,
    {
        let mut basis = first;
        cas_loop!(
            BACKEND,
            what,
            &self.keys.doc,
            self.try_update(&mut basis, doc_alone, &mut f).await
        )
    }

    /// Give the slot of `id` back (and delete orphan records), first on `first`.
    pub(super) async fn unlock_from(
        &self,
        id: &str,
        first: Option<Snapshot>,
    ) -> Result<(), LockError> {
        self.update_from("release", first, true, |snap| {
            let mut doc = snap.doc.clone();
            let held = doc.unlock(id);
            let mut ops = Vec::new();
            if held {
                ops.push(self.put_doc(&doc));
            }
            ops.extend(self.stale_record_deletes(snap, &doc));
            Ok((!ops.is_empty()).then_some(ops))
        })
        .await?;
        tracing::info!(key = %self.keys.doc, %id, "released");
        Ok(())
    }
}
