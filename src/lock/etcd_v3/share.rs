//! `lock.max = "N%"` on the v3 store: the share of the group's known nodes
//! ([`crate::lock::arbiter::share`]) in a snapshot, in place of the document's `max`.

use super::snapshot::Snapshot;
use super::EtcdSemaphore;
use crate::lock::arbiter::share::{self, Share};

impl EtcdSemaphore {
    /// With the slots `percent` of the known nodes (`lock.max = "N%"`, [`share`]): a waiter's
    /// read and `status` then read the group's fleet member records too, in the same
    /// transaction.
    pub fn with_max_percent(mut self, percent: Option<u8>) -> Self {
        self.max_percent = percent;
        self
    }

    /// The share of the known nodes in `snap` the slots are, with `lock.max = "N%"`.
    pub(super) fn share(&self, snap: &Snapshot) -> Option<Share> {
        self.max_percent.map(|percent| Share {
            percent,
            known: snap.known_nodes(&self.keys),
            stored_max: snap.doc.max,
        })
    }

    /// The number of slots this node goes by in `snap`: the share, or the document's `max`.
    pub(super) fn effective_max(&self, snap: &Snapshot) -> u64 {
        share::effective_max(self.share(snap).as_ref(), snap.doc.max)
    }

    /// Log the count a waiter's read made, with `lock.max = "N%"`.
    pub(super) fn note_share(&self, snap: &Snapshot) {
        if let Some(share) = self.share(snap) {
            tracing::info!(
                nodes = share.known,
                max = share.max(),
                percent = share.percent,
                "counted the nodes lock.max is a share of"
            );
        }
    }
}
