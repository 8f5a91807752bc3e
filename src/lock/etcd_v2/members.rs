//! The fleet view on the v2 store: one record per node at `…/rebootd/agents/<id>`, beside
//! rebootd's other keys in the group's directory (locksmith's document is never touched, and
//! locksmithd reads nothing else). A record is written with `prevIndex` (what this node's last
//! write left) or `prevExist=false`; when that fails the key is read, and a value that does not
//! parse is refused, never written over. Waiters see a record's write on the watch stream they
//! keep of the directory and ignore it (no key of theirs): an event, not a request. The fleet is
//! the one recursive read of the directory and, for `--watch`, one long poll from it.

use async_trait::async_trait;

use super::super::{Identity, LockError};
use super::{lock_error, EtcdV2Semaphore, BACKEND};
use crate::clients::etcd_v2::{Get, Put};
use crate::fleet::{FleetRead, FleetStore, NodeRecord, RecordRead};

impl EtcdV2Semaphore {
    /// The directory of the group's node records (ends with `/`).
    fn node_records(&self) -> String {
        format!(
            "/{}",
            super::super::etcd_v3::members::prefix(&self.keys.group)
        )
    }
}

#[async_trait]
impl FleetStore for EtcdV2Semaphore {
    #[tracing::instrument(level = "debug", skip_all)]
    async fn publish(
        &self,
        me: &Identity,
        record: &NodeRecord,
        at: Option<&str>,
    ) -> Result<String, LockError> {
        let key = format!(
            "{}{}",
            self.node_records(),
            super::super::document::query_escape(&me.id)
        );
        let mut guard = at.and_then(|a| a.parse::<u64>().ok());
        for _ in 0..3 {
            let opts = match guard {
                Some(i) => Put {
                    prev_index: Some(i),
                    ..Put::default()
                },
                None => Put {
                    prev_exist: Some(false),
                    ..Put::default()
                },
            };
            match self.client.put(&key, &record.to_json(), opts).await {
                Ok(r) => return Ok(r.node.modified_index.to_string()),
                Err(e) if e.is_compare_failed() || e.is_node_exists() || e.is_key_not_found() => {}
                Err(e) => return Err(lock_error(e)),
            }
            let get = Get::default();
            guard = match self.client.get(&key, get).await {
                Ok(r) => {
                    let value = r.node.value.unwrap_or_default();
                    if let Err(u) = NodeRecord::parse(value.as_bytes()) {
                        return Err(LockError::Refused(format!(
                            "the fleet record at {key} does not parse ({}); not writing over it: {}",
                            u.reason, u.value
                        )));
                    }
                    Some(r.node.modified_index)
                }
                Err(e) if e.is_key_not_found() => None,
                Err(e) => return Err(lock_error(e)),
            };
        }
        Err(LockError::Backend {
            backend: BACKEND,
            reason: format!("the fleet record at {key} kept changing"),
        })
    }

    #[tracing::instrument(level = "debug", skip_all)]
    async fn read_fleet(&self) -> Result<FleetRead, LockError> {
        let get = Get {
            recursive: true,
            sorted: true,
            quorum: false,
        };
        let (root, index) = self.get_or_absent(&self.keys.root, get).await?;
        let snap = super::tree::Snapshot::from_read(&self.keys, root.as_ref(), index);
        let doc = self.document(&snap)?;
        let prefix = self.node_records();
        let records = root
            .iter()
            .flat_map(|r| r.leaves())
            .filter_map(|n| {
                let name = n.key.strip_prefix(&prefix)?;
                Some(RecordRead {
                    name: name.to_owned(),
                    record: NodeRecord::parse(n.value.as_deref().unwrap_or_default().as_bytes()),
                })
            })
            .collect();
        let mut view = snap.view(&self.keys, &doc, None);
        view.max = self.effective_max(&snap, &doc);
        Ok(FleetRead {
            backend: BACKEND,
            group: self.keys.group.clone(),
            view,
            records,
            pause: snap.pause.clone(),
            share: self.share(&snap, &doc),
            at: index.to_string(),
        })
    }

    /// v2 has no transaction over two keys: the record is deleted by its index, after a read
    /// that shows its node neither holding nor waiting.
    async fn forget_record(&self, name: &str, _read: &FleetRead) -> Result<bool, LockError> {
        let snap = self.read(true).await?;
        let doc = self.document(&snap)?;
        if snap.busy(&doc, name) {
            return Ok(false);
        }
        let Some(entry) = snap.members.get(name) else {
            return Ok(true);
        };
        let key = format!("{}{name}", self.node_records());
        match self.client.delete(&key, Some(entry.modified)).await {
            Ok(_) => {
                tracing::info!(%key, "forgot a node's fleet record");
                Ok(true)
            }
            Err(e) if e.is_key_not_found() => Ok(true),
            Err(e) if e.is_compare_failed() => Ok(false),
            Err(e) => Err(lock_error(e)),
        }
    }

    async fn fleet_changed(&self, read: &FleetRead) -> Result<(), LockError> {
        let from = read.at.parse::<u64>().unwrap_or(0) + 1;
        loop {
            match self.client.watch(&self.keys.root, true, from).await {
                Ok(Some(_)) => return Ok(()),
                Ok(None) => {}
                // Older than etcd's history: something changed; read again.
                Err(e) if e.is_index_cleared() => return Ok(()),
                Err(e) => return Err(lock_error(e)),
            }
        }
    }
}
