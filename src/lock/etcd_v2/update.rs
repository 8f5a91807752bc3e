//! Compare-and-swap updates of locksmith's document on v2: a write compared with the index
//! read (or a create where there was none), the loop of the calls other than `acquire`, whose
//! retry after a lost write reads the document alone, and the orphan records' deletes after it.

use super::super::document::SemaphoreDoc;
use super::super::retry::{cas_loop, Cas};
use super::super::LockError;
use super::tree::{DocState, Snapshot};
use super::{lock_error, EtcdV2Semaphore, BACKEND};
use crate::clients::etcd_v2::Get;

/// What the next attempt of [`EtcdV2Semaphore::update_doc`] writes on.
enum Basis {
    /// Nothing yet: read the group.
    Unread,
    /// The group as just read: write on it.
    Read(Snapshot),
    /// A read whose write lost: read the document again, and only it. The records read before
    /// still name the orphans to delete, each delete guarded by the record's index as read, so
    /// a record written since is left alone.
    Lost(Snapshot),
}

impl EtcdV2Semaphore {
    /// Write `doc` over what `snap` read: compare-and-swap on its index, or create it.
    /// `Ok(false)`: someone else wrote first.
    pub(super) async fn write_doc(
        &self,
        snap: &Snapshot,
        doc: &SemaphoreDoc,
    ) -> Result<bool, LockError> {
        Ok(self.write_doc_at(snap, doc).await?.is_some())
    }

    /// [`Self::write_doc`], saying the index the document got.
    pub(super) async fn write_doc_at(
        &self,
        snap: &Snapshot,
        doc: &SemaphoreDoc,
    ) -> Result<Option<u64>, LockError> {
        let value = doc.to_json();
        let written = match &snap.doc {
            DocState::Absent => self.client.create(&self.keys.doc, &value, None).await,
            DocState::Doc { index, .. } => {
                self.client
                    .compare_and_swap(&self.keys.doc, &value, *index, None)
                    .await
            }
            DocState::Moved { .. } => return Err(self.moved()),
            DocState::Corrupt { .. } => return self.document(snap).map(|_| None),
        };
        match written {
            Ok(r) => Ok(Some(r.node.modified_index)),
            Err(e) if e.is_compare_failed() || e.is_node_exists() || e.is_key_not_found() => {
                Ok(None)
            }
            Err(e) => Err(lock_error(e)),
        }
    }

    /// Delete the records of holders no longer in `doc` (each by its index; best effort).
    pub(super) async fn delete_orphans(&self, snap: &Snapshot, doc: &SemaphoreDoc) {
        for (key, index) in snap.orphan_records(&self.keys, doc) {
            if let Err(e) = self.client.delete(&key, Some(index)).await {
                if !(e.is_compare_failed() || e.is_key_not_found()) {
                    tracing::debug!(%key, error = %e, "orphan holder record not deleted");
                }
            }
        }
    }

    /// Read locksmith's document again into `snap`, and nothing else (a lost write's retry:
    /// the document alone decides it, where the group's directory grows with the queue).
    async fn reread_doc(&self, snap: &mut Snapshot) -> Result<(), LockError> {
        let get = Get {
            recursive: false,
            sorted: false,
            quorum: false,
        };
        let (node, index) = self.get_or_absent(&self.keys.doc, get).await?;
        snap.reread_doc(&self.keys, node.as_ref(), index);
        Ok(())
    }

    /// One attempt of a compare-and-swap update of the document (`f` returns the new
    /// document, or `None` when nothing is to change); orphan records are deleted after it.
    async fn try_update_doc(
        &self,
        basis: &mut Basis,
        f: &mut (dyn FnMut(&SemaphoreDoc) -> Result<Option<SemaphoreDoc>, LockError> + Send),
    ) -> Result<Cas<()>, LockError> {
        let snap = match std::mem::replace(basis, Basis::Unread) {
            Basis::Read(s) => s,
            Basis::Lost(mut s) => {
                self.reread_doc(&mut s).await?;
                s
            }
            Basis::Unread => self.read(false).await?,
        };
        let doc = self.document(&snap)?;
        let Some(new) = f(&doc)? else {
            self.delete_orphans(&snap, &doc).await;
            return Ok(Cas::Done(()));
        };
        if !self.write_doc(&snap, &new).await? {
            *basis = Basis::Lost(snap);
            return Ok(Cas::Conflict);
        }
        self.delete_orphans(&snap, &new).await;
        Ok(Cas::Done(()))
    }

    /// The compare-and-swap loop of the document, its first attempt on `first` (a read just
    /// made) when given: the write compares the index read, so a stale one only costs a retry.
    pub(super) async fn update_doc(
        &self,
        what: &str,
        first: Option<Snapshot>,
        mut f: impl FnMut(&SemaphoreDoc) -> Result<Option<SemaphoreDoc>, LockError> + Send,
    ) -> Result<(), LockError> {
        let mut basis = first.map_or(Basis::Unread, Basis::Read);
        cas_loop!(
            BACKEND,
            what,
            &self.keys.doc,
            self.try_update_doc(&mut basis, &mut f).await
        )
    }

    /// Give the slot of `id` back (and delete orphan records), first on `first`.
    pub(super) async fn unlock_from(
        &self,
        id: &str,
        first: Option<Snapshot>,
    ) -> Result<(), LockError> {
        self.update_doc("unlock", first, |doc| {
            let mut new = doc.clone();
            Ok(new.unlock(id).then_some(new))
        })
        .await?;
        tracing::info!(key = %self.keys.doc, %id, "released");
        Ok(())
    }
}
