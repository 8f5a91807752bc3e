//! Importing a semaphore into v3 (`rebootctl migrate` from the v2 store): create locksmith's
//! document and rebootd's holder records in one transaction, only if the document is absent;
//! and undo exactly that import if the v2 side changed before it could be closed.

use etcd_client::{Compare, CompareOp, Txn, TxnOp, TxnOpResponse};

use super::super::document::{HolderRecord, SemaphoreDoc};
use super::super::LockError;
use super::EtcdSemaphore;

/// What an import found and did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Import {
    /// The document was absent: written, with the records, at this revision.
    Created { revision: i64 },
    /// The document is there already with this content (an earlier import): nothing written.
    Same,
    /// Another document is there: nothing written.
    Different { doc: SemaphoreDoc },
}

impl EtcdSemaphore {
    /// Write `doc` and `records` (holder id, record) if the document key is absent.
    #[tracing::instrument(skip(self, records), fields(key = %self.keys.doc))]
    pub async fn import(
        &self,
        doc: &SemaphoreDoc,
        records: &[(String, HolderRecord)],
    ) -> Result<Import, LockError> {
        let mut puts = vec![TxnOp::put(self.keys.doc.clone(), doc.to_json(), None)];
        for (id, record) in records {
            puts.push(TxnOp::put(self.record_key(id), record.to_json(), None));
        }
        let txn = Txn::new()
            .when([Compare::mod_revision(
                self.keys.doc.clone(),
                CompareOp::Equal,
                0,
            )])
            .and_then(puts)
            .or_else([TxnOp::get(self.keys.doc.clone(), None)]);
        let resp = self.txn(txn).await?;
        if resp.succeeded() {
            return Ok(Import::Created {
                revision: resp.header().map(|h| h.revision()).unwrap_or_default(),
            });
        }
        let existing = resp.op_responses().into_iter().find_map(|op| match op {
            TxnOpResponse::Get(g) => g.kvs().first().map(|kv| kv.value().to_vec()),
            _ => None,
        });
        let Some(value) = existing else {
            // Deleted meanwhile: the caller tries again.
            return Ok(Import::Different {
                doc: SemaphoreDoc::default(),
            });
        };
        let found = self.parse_doc(&value)?;
        if found == *doc {
            Ok(Import::Same)
        } else {
            Ok(Import::Different { doc: found })
        }
    }

    /// locksmith's document in v3, if it exists.
    pub async fn read_doc(&self) -> Result<Option<SemaphoreDoc>, LockError> {
        let resp = self
            .txn(Txn::new().and_then([TxnOp::get(self.keys.doc.clone(), None)]))
            .await?;
        let value = resp.op_responses().into_iter().find_map(|op| match op {
            TxnOpResponse::Get(g) => g.kvs().first().map(|kv| kv.value().to_vec()),
            _ => None,
        });
        value.map(|v| self.parse_doc(&v)).transpose()
    }

    /// Delete what [`EtcdSemaphore::import`] created at `revision`, if nothing changed the
    /// document since. Returns whether it did.
    #[tracing::instrument(skip(self, ids), fields(key = %self.keys.doc))]
    pub async fn undo_import(&self, revision: i64, ids: &[String]) -> Result<bool, LockError> {
        let mut deletes = vec![TxnOp::delete(self.keys.doc.clone(), None)];
        for id in ids {
            deletes.push(TxnOp::delete(self.record_key(id), None));
        }
        let txn = Txn::new()
            .when([Compare::mod_revision(
                self.keys.doc.clone(),
                CompareOp::Equal,
                revision,
            )])
            .and_then(deletes);
        Ok(self.txn(txn).await?.succeeded())
    }
}
