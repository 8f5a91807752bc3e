//! Moving a group's semaphore from etcd v2 to v3 (`rebootctl migrate`), and the check that
//! warns when both stores hold one (`api = "v3"` beside a v2 locksmith document).
//!
//! # Migration
//!
//! 1. Read the v2 group (document and holder records) at one etcd index, with quorum.
//! 2. Refuse what is not safe to move, saying why: no v2 document, a document that does not
//!    parse, a holder without a rebootd record carrying a holder token (a locksmithd node in
//!    the middle of a reboot: locksmithd cannot follow to v3, so its slot would never be given
//!    back there), or a v3 document that differs from the v2 one (someone uses v3 already).
//! 3. Write the document and the records in v3, in one transaction, only if the v3 key is
//!    absent (a v3 document equal to the v2 one is an earlier, interrupted run: go on).
//! 4. Replace the v2 document, by compare-and-swap on the index read in 1, with the moved marker
//!    ([`tree::moved_document`]): locksmith can take no slot in it, and rebootd nodes on
//!    `api = "v2"` see it (their watch, or their next read) and follow to v3.
//! 5. If the v2 document changed since 1 (a v2 node took or gave back a slot meanwhile), undo
//!    the v3 write (only if nothing touched it since) and start again from 1.
//!
//! Waiters queued in v2 keep nothing: they queue again in v3 when they follow.

use crate::clients::etcd_v2::{Get, KeysClient, Timeouts};
use crate::config::{self, EtcdApi};
use crate::lock::document::{semaphore_key, HolderRecord, SemaphoreDoc};
use crate::lock::etcd_v2::tree::{self, DocState, Snapshot};
use crate::lock::etcd_v2::{lock_error, EtcdV2Semaphore};
use crate::lock::etcd_v3::{EtcdSemaphore, Import};
use crate::lock::Backend;
use crate::lock::LockError;

/// Attempts before the migration gives up on a v2 semaphore that keeps changing.
const ATTEMPTS: usize = 8;

/// What a migration did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Migrated {
    /// The v2 key, now the moved marker.
    pub from: String,
    /// The v3 key.
    pub to: String,
    pub doc: SemaphoreDoc,
    /// rebootd waiters that were queued in v2 (they queue again in v3).
    pub waiters: usize,
    /// The semaphore had been moved by an earlier run already.
    pub already: bool,
}

impl std::fmt::Display for Migrated {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.already {
            return write!(
                f,
                "already moved: {} (v2) is the moved marker; the semaphore is at {} (v3), max {}, holders {:?}",
                self.from, self.to, self.doc.max, self.doc.holders
            );
        }
        write!(
            f,
            "moved max {} and holders {:?} from {} (etcd v2) to {} (etcd v3); the v2 document now \
             takes no slot (holder {}); {} rebootd waiter(s) queued in v2 follow to v3 by \
             themselves. Set [lock.etcd] api = \"v3\" on every node.",
            self.doc.max,
            self.doc.holders,
            self.from,
            self.to,
            tree::MOVED_HOLDER,
            self.waiters
        )
    }
}

fn with_api(settings: &config::Etcd, api: EtcdApi) -> config::Etcd {
    config::Etcd {
        api,
        ..settings.clone()
    }
}

/// Move `group`'s semaphore from v2 to v3 on the cluster of `settings` (whatever its `api`).
#[tracing::instrument(skip(settings), fields(endpoints = ?settings.endpoints))]
pub async fn migrate(settings: &config::Etcd, group: &str) -> Result<Migrated, LockError> {
    let v2 = EtcdV2Semaphore::connect(&with_api(settings, EtcdApi::V2), group, None).await?;
    let v3 = EtcdSemaphore::connect(&with_api(settings, EtcdApi::V3), group, None).await?;
    for attempt in 1..=ATTEMPTS {
        let snap = v2.read(true).await?;
        let (doc, index) = match &snap.doc {
            DocState::Moved { .. } => {
                let doc = v3.read_doc().await?.ok_or_else(|| {
                    LockError::Refused(format!(
                        "{} (v2) is the moved marker but {} (v3) does not exist: the \
                         semaphore was moved and its v3 document deleted since; create it with \
                         `rebootctl set-max N` on a node with api = \"v3\"",
                        v2.key(),
                        v3.key()
                    ))
                })?;
                return Ok(Migrated {
                    from: v2.key().to_owned(),
                    to: v3.key().to_owned(),
                    doc,
                    waiters: 0,
                    already: true,
                });
            }
            DocState::Absent => {
                return Err(LockError::Refused(format!(
                    "there is no semaphore at {} in etcd v2 (group {group:?}): nothing to move; \
                     nodes can use api = \"v3\" directly",
                    v2.key()
                )))
            }
            DocState::Doc { doc, index } => (doc.clone(), *index),
            // The document's own error: it names the key, the value and why it does not parse.
            DocState::Corrupt { .. } => (v2.document(&snap)?, 0),
        };
        let records = movable_records(&v2, &snap, &doc)?;
        let created = match v3.import(&doc, &records).await? {
            Import::Created { revision } => Some(revision),
            Import::Same => None,
            Import::Different { doc: found } => {
                return Err(LockError::Refused(format!(
                    "{} (etcd v3) holds another semaphore already (max {}, holders {:?}) than \
                     {} (etcd v2: max {}, holders {:?}): nodes use both, which is two semaphores \
                     (twice max). Nothing was changed. Decide which one is right: if the v3 one \
                     is unused, delete it (etcdctl del {}) and migrate again",
                    v3.key(),
                    found.max,
                    found.holders,
                    v2.key(),
                    doc.max,
                    doc.holders,
                    v3.key()
                )))
            }
        };
        match v2
            .client
            .compare_and_swap(v2.key(), &tree::moved_document(), index, None)
            .await
        {
            Ok(_) => {
                let m = Migrated {
                    from: v2.key().to_owned(),
                    to: v3.key().to_owned(),
                    doc,
                    waiters: snap.queue.len(),
                    already: false,
                };
                tracing::warn!(%m, "semaphore moved to etcd v3");
                return Ok(m);
            }
            Err(e) if e.is_compare_failed() => {
                tracing::info!(
                    attempt,
                    "the v2 semaphore changed while moving it; starting again"
                );
                if let Some(revision) = created {
                    let ids: Vec<String> = records.iter().map(|(id, _)| id.clone()).collect();
                    if !v3.undo_import(revision, &ids).await? {
                        return Err(LockError::Refused(format!(
                            "both semaphores changed during the move: {} (v2) by a v2 client and \
                             {} (v3) by a v3 client. The v2 one was left as it is; compare them \
                             (locksmithctl status, rebootctl status on a v3 node) and remove the \
                             one nobody should use before migrating again",
                            v2.key(),
                            v3.key()
                        )));
                    }
                }
            }
            Err(e) => return Err(lock_error(e)),
        }
    }
    Err(LockError::Backend {
        backend: Backend::Etcd,
        reason: format!(
            "migrate: {} (etcd v2) changed {ATTEMPTS} times while it was being moved; try again \
             when the fleet is quieter",
            v2.key()
        ),
    })
}

/// The holder records to move: every holder must be a rebootd holder (a record with a holder
/// token), else the move is refused, naming them.
fn movable_records(
    v2: &EtcdV2Semaphore,
    snap: &Snapshot,
    doc: &SemaphoreDoc,
) -> Result<Vec<(String, HolderRecord)>, LockError> {
    let mut records = Vec::new();
    let mut foreign = Vec::new();
    for id in &doc.holders {
        match snap
            .record(&v2.keys, id)
            .and_then(|e| e.value.clone())
            .filter(|r| r.token.is_some())
        {
            Some(r) if r.reclaimed_by.is_some() => {
                return Err(LockError::Refused(format!(
                    "not moved: the slot of holder {id} in {} is being reclaimed by {} (it judged \
                     {id} stopped); migrate again once the waiter has taken it",
                    v2.key(),
                    r.reclaimed_by.as_deref().unwrap_or_default()
                )))
            }
            Some(r) => records.push((id.clone(), r)),
            None => foreign.push(id.clone()),
        }
    }
    if !foreign.is_empty() {
        return Err(LockError::Refused(format!(
            "not moved: holder(s) {foreign:?} of {} have no rebootd record, so a locksmithd node \
             (or a holder written by hand) holds them. locksmithd cannot follow the semaphore \
             to v3 and would never give that slot back there. Wait until they are released \
             (locksmithctl status), replace locksmithd by rebootd on those nodes, or unlock a \
             holder whose node is gone (rebootctl unlock ID); then migrate again",
            v2.key()
        )));
    }
    Ok(records)
}

/// With `api = "v3"`: whether etcd's v2 store also holds locksmith's semaphore for `group`
/// (two semaphores, so up to twice `max` nodes down at once). `None` when it does not, when the
/// cluster does not serve v2, or cannot be asked.
pub async fn split_warning(settings: &config::Etcd, group: &str) -> Option<String> {
    let timeouts = Timeouts {
        connect: std::time::Duration::from_secs(3),
        request: std::time::Duration::from_secs(5),
        ..Timeouts::default()
    };
    let client_settings = crate::lock::etcd_v2::client_settings(settings, timeouts).ok()?;
    let client = KeysClient::new(&client_settings).ok()?;
    let keys = tree::Keys::new(group);
    let doc = match client.get(&keys.doc, Get::default()).await {
        Ok(r) => r.node.value.unwrap_or_default(),
        Err(e) => {
            tracing::debug!(error = %e, "no v2 semaphore to compare with");
            return None;
        }
    };
    if tree::is_moved(&doc) {
        return None;
    }
    let what = SemaphoreDoc::parse(doc.as_bytes())
        .map(|d| format!("max {}, holders {:?}", d.max, d.holders))
        .unwrap_or_else(|e| format!("a document that does not parse: {e}"));
    Some(format!(
        "TWO SEMAPHORES: etcd's v2 store also holds locksmith's semaphore for group {group:?} at \
         {} ({what}), while this node uses the v3 one at {}. locksmithd nodes (and rebootd nodes \
         with api = \"v2\") take slots in the first, this node in the second: up to twice max \
         nodes can be down at once. Move the v2 one with `rebootctl migrate` on a node with \
         api = \"v2\" (docs/migrating-from-locksmith.md), or set api = \"v2\" here",
        keys.doc,
        semaphore_key(group)
    ))
}
