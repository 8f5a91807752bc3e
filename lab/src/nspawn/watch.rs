//! The outside watcher of a fleet of hosts: every revision of locksmith's semaphore document in
//! etcd (a watch from the first revision), as the holders' machine ids, seen from outside the
//! hosts.

use futures_util::StreamExt;
use rebootd::lock::document::{semaphore_key, SemaphoreDoc};
use tokio::sync::watch;

use super::NspawnError;

/// Every holder list the document had, in order.
pub struct HolderWatch {
    rx: watch::Receiver<Vec<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl HolderWatch {
    /// Watch `group`'s semaphore at `endpoint` from revision 1 (nothing is missed).
    pub async fn start(endpoint: &str, group: &str) -> Result<HolderWatch, NspawnError> {
        let fail = |e: etcd_client::Error| NspawnError::Host {
            host: endpoint.to_string(),
            what: format!("etcd watch: {e}"),
        };
        let mut client = etcd_client::Client::connect([endpoint], None)
            .await
            .map_err(fail)?;
        let mut stream = client
            .watch(
                semaphore_key(group),
                Some(etcd_client::WatchOptions::new().with_start_revision(1)),
            )
            .await
            .map_err(fail)?;
        let (tx, rx) = watch::channel(Vec::new());
        let task = tokio::spawn(async move {
            let _keep = client;
            while let Some(Ok(resp)) = stream.next().await {
                for e in resp.events() {
                    let Some(kv) = e.kv() else { continue };
                    let holders = match SemaphoreDoc::parse(kv.value()) {
                        Ok(doc) => doc.holders.clone(),
                        Err(e) => vec![format!("<unparsable: {e}>")],
                    };
                    tx.send_modify(|h| h.push(holders));
                }
            }
        });
        Ok(HolderWatch { rx, task })
    }

    /// Every holder list seen so far.
    pub fn history(&self) -> Vec<Vec<String>> {
        self.rx.borrow().clone()
    }

    /// The most holders seen at once.
    pub fn max_holders(&self) -> usize {
        self.rx.borrow().iter().map(Vec::len).max().unwrap_or(0)
    }

    /// Follow the history as it grows.
    pub fn subscribe(&self) -> watch::Receiver<Vec<Vec<String>>> {
        self.rx.clone()
    }
}

impl Drop for HolderWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}
