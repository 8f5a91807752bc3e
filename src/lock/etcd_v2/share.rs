//! `lock.max = "N%"` on the v2 store: the share of the group's known nodes
//! ([`crate::lock::arbiter::share`]) in a snapshot, in place of the document's `max`.

use super::tree::Snapshot;
use super::EtcdV2Semaphore;
use crate::lock::arbiter::share::{self, Share};
use crate::lock::document::SemaphoreDoc;

impl EtcdV2Semaphore {
    /// With the slots `percent` of the known nodes (`lock.max = "N%"`,
    /// [`share`]), counted in the group's directory that every read brings.
    pub fn with_max_percent(mut self, percent: Option<u8>) -> Self {
        self.max_percent = percent;
        self
    }

    /// The share of the known nodes in `snap` the slots are, with `lock.max = "N%"`.
    pub(super) fn share(&self, snap: &Snapshot, doc: &SemaphoreDoc) -> Option<Share> {
        self.max_percent.map(|percent| Share {
            percent,
            known: snap.known_nodes(doc),
            stored_max: doc.max,
        })
    }

    /// The number of slots this node goes by: the share, or the document's `max`.
    pub(super) fn effective_max(&self, snap: &Snapshot, doc: &SemaphoreDoc) -> u64 {
        share::effective_max(self.share(snap, doc).as_ref(), doc.max)
    }

    /// Log the count a waiter's read made, with `lock.max = "N%"`.
    pub(super) fn note_share(&self, snap: &Snapshot, doc: &SemaphoreDoc) {
        if let Some(share) = self.share(snap, doc) {
            tracing::info!(
                nodes = share.known,
                max = share.max(),
                percent = share.percent,
                "counted the nodes lock.max is a share of"
            );
        }
    }
}
