//! The fleet view on the v3 store: one record per node at `…/rebootd/agents/<id>` (the holder
//! id escaped as in the other keys). The prefix sorts before the group's pause, so it is outside
//! the range the waiters watch: a record written costs no waiter an event. A record is written
//! by a transaction guarded by its mod revision (what this node's last write left, or absent):
//! when the guard fails the same transaction reads the key, and a value that does not parse is
//! refused, never written over. The fleet is read in one transaction (the semaphore's reads
//! and the records) and followed by one watch from the records to the document.

use async_trait::async_trait;
use etcd_client::{Compare, CompareOp, Txn, TxnOp, TxnOpResponse, WatchOptions};

use super::super::document::{holder_records_prefix, query_escape};
use super::super::{Identity, LockError};
use super::{EtcdSemaphore, BACKEND};
use crate::fleet::{FleetRead, FleetStore, NodeRecord, RecordRead};

/// The prefix of `group`'s node records (v3 form, no leading `/`).
pub fn prefix(group: &str) -> String {
    let records = holder_records_prefix(group);
    let base = records.strip_suffix("holders/").unwrap_or(&records);
    format!("{base}agents/")
}

/// The key of node `id`'s record in `group`.
pub fn key(group: &str, id: &str) -> String {
    format!("{}{}", prefix(group), query_escape(id))
}

impl EtcdSemaphore {
    /// One guarded write of `record` at `key`: `Ok(Ok(revision))` written; `Ok(Err(Some(kv)))`
    /// the guard failed and this is what is there; `Ok(Err(None))` it failed and nothing is.
    async fn put_record_if(
        &self,
        key: &str,
        record: &NodeRecord,
        revision: i64,
    ) -> Result<Result<i64, Option<(Vec<u8>, i64)>>, LockError> {
        let txn = Txn::new()
            .when(vec![Compare::mod_revision(
                key.to_owned(),
                CompareOp::Equal,
                revision,
            )])
            .and_then(vec![TxnOp::put(key.to_owned(), record.to_json(), None)])
            .or_else(vec![TxnOp::get(key.to_owned(), None)]);
        let resp = self.txn(txn).await?;
        if resp.succeeded() {
            return Ok(Ok(resp.header().map_or(0, |h| h.revision())));
        }
        let found = resp.op_responses().into_iter().find_map(|op| match op {
            TxnOpResponse::Get(g) => g
                .kvs()
                .first()
                .map(|kv| (kv.value().to_vec(), kv.mod_revision())),
            _ => None,
        });
        Ok(Err(found))
    }
}

#[async_trait]
impl FleetStore for EtcdSemaphore {
    #[tracing::instrument(level = "debug", skip_all)]
    async fn publish(
        &self,
        me: &Identity,
        record: &NodeRecord,
        at: Option<&str>,
    ) -> Result<String, LockError> {
        let key = key(&self.keys.group, &me.id);
        let mut revision = at.and_then(|a| a.parse::<i64>().ok()).unwrap_or(0);
        // The guard fails at most once for a reason of its own (another write since): then the
        // value read decides, and the second guard is on what was read.
        for _ in 0..3 {
            match self.put_record_if(&key, record, revision).await? {
                Ok(rev) => return Ok(rev.to_string()),
                Err(None) => revision = 0,
                Err(Some((value, rev))) => {
                    if let Err(u) = NodeRecord::parse(&value) {
                        return Err(LockError::Refused(format!(
                            "the fleet record at {key} does not parse ({}); not writing over it: {}",
                            u.reason, u.value
                        )));
                    }
                    revision = rev;
                }
            }
        }
        Err(self.unreachable(format!("the fleet record at {key} kept changing")))
    }

    #[tracing::instrument(level = "debug", skip_all)]
    async fn read_fleet(&self) -> Result<FleetRead, LockError> {
        let prefix = prefix(&self.keys.group);
        let gets = self.read_ops(true, true);
        let expected = gets.len();
        let resp = self.txn(Txn::new().and_then(gets)).await?;
        let snap = self.snapshot_of(&resp, expected)?;
        let mut records = Vec::new();
        for op in resp.op_responses() {
            let TxnOpResponse::Get(get) = op else {
                continue;
            };
            for kv in get.kvs() {
                if let Some(name) = kv.key().strip_prefix(prefix.as_bytes()) {
                    records.push(RecordRead {
                        name: String::from_utf8_lossy(name).into_owned(),
                        record: NodeRecord::parse(kv.value()),
                    });
                }
            }
        }
        let mut view = snap.view(&self.keys, None);
        view.max = self.effective_max(&snap);
        Ok(FleetRead {
            backend: BACKEND,
            group: self.keys.group.clone(),
            view,
            records,
            pause: snap.pause.clone(),
            share: self.share(&snap),
            at: snap.revision.to_string(),
        })
    }

    /// One transaction: the record, the document (so the holders) unchanged since `read`, and
    /// no queue entry of that id.
    async fn forget_record(&self, name: &str, read: &FleetRead) -> Result<bool, LockError> {
        let at = read.at.parse::<i64>().unwrap_or(0);
        let key = format!("{}{name}", prefix(&self.keys.group));
        let queue_key = format!("{}{name}", self.keys.queue);
        let compares = vec![
            Compare::mod_revision(key.clone(), CompareOp::Less, at + 1),
            Compare::mod_revision(self.keys.doc.clone(), CompareOp::Less, at + 1),
            Compare::create_revision(queue_key, CompareOp::Equal, 0),
        ];
        let done = self
            .commit_when(compares, vec![TxnOp::delete(key.clone(), None)])
            .await?
            .is_some();
        if done {
            tracing::info!(%key, "forgot a node's fleet record");
        }
        Ok(done)
    }

    async fn fleet_changed(&self, read: &FleetRead) -> Result<(), LockError> {
        let first = prefix(&self.keys.group);
        let mut end = self.keys.doc.clone().into_bytes();
        end.push(0);
        let from = read.at.parse::<i64>().unwrap_or(0) + 1;
        let options = WatchOptions::new()
            .with_range(end)
            .with_start_revision(from);
        let mut watch = self.client.watch_client();
        let mut stream = self
            .request(
                "watching the fleet: ",
                watch.watch(first.clone(), Some(options)),
            )
            .await?;
        loop {
            match stream.message().await {
                Ok(Some(resp)) if resp.compact_revision() > 0 => return Ok(()),
                Ok(Some(resp)) if resp.canceled() => {
                    return Err(self.watch_cancelled(&first, &self.keys.doc, resp.cancel_reason()))
                }
                Ok(Some(resp)) if !resp.events().is_empty() => return Ok(()),
                Ok(Some(_)) => {}
                Ok(None) => return Err(self.unreachable("the fleet's watch stream ended".into())),
                Err(e) => return Err(self.classify(e)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_sort_before_the_range_the_waiters_watch() {
        for group in ["default", "workers"] {
            let p = prefix(group);
            assert!(p < super::super::super::pause::etcd_key(group), "{p}");
            assert!(p.starts_with(&holder_records_prefix(group).replace("holders/", "")));
        }
        assert_eq!(
            key("default", "a b"),
            "coreos.com/updateengine/rebootlock/rebootd/agents/a+b"
        );
    }
}
