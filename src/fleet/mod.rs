//! The fleet view (`rebootctl fleet`): every node of a group as the lock store alone shows it —
//! holders with their phase, waiters in queue order, why each node waits, its last reboot,
//! paused and cancelled nodes — read with the same credentials as `rebootctl status`.
//!
//! # Layout
//!
//! - [`record`]: a node's fleet record, one small JSON value per node in the store, derived
//!   from its state; [`publish`]: the runtime's observer that writes it only when what it
//!   shows changes (never while the node holds a slot: its holder record says its phase then).
//! - [`view`]: the pure join of the semaphore's view (holders, queue), the records and the
//!   group's pause into [`view::FleetView`], the stable `--json`; [`render`]: its text.
//! - [`FleetStore`]: what a store does for it (each store's `members.rs`); [`cli`]: the command.
//!
//! Records are claims by nodes: the view shows them, nothing decides on them. A record that
//! does not parse is shown as unreadable, and its node never writes over it.

pub mod cli;
pub mod forget;
pub mod publish;
pub mod record;
pub mod render;
pub mod view;

use crate::lock::view::View;
use crate::lock::{Backend, GroupPause, Identity, LockError};
use async_trait::async_trait;
pub use record::{NodeRecord, Unreadable};

/// One fleet record as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordRead {
    /// What the store names it by, the join key with the semaphore's view: on etcd the holder
    /// id as escaped in the key; on Leases the node (`holderIdentity`, bound to the writer by
    /// the admission policy).
    pub name: String,
    pub record: Result<NodeRecord, Unreadable>,
}

/// The fleet as one read of the store showed it.
#[derive(Debug, Clone)]
pub struct FleetRead {
    pub backend: Backend,
    pub group: String,
    /// Holders and the waiter queue, as the lock core reads them (`mine` is never set).
    pub view: View,
    pub records: Vec<RecordRead>,
    pub pause: Option<GroupPause>,
    /// With `lock.max = "N%"`: the share `view.max` is.
    pub share: Option<crate::lock::arbiter::share::Share>,
    /// Where the read was in the store's history (revision, index, resourceVersion): a watch
    /// for the next change starts after it.
    pub at: String,
}

/// What a store keeps for the fleet view: each node's record, and one read and one watch of
/// the whole group.
#[async_trait]
pub trait FleetStore: Send + Sync {
    /// Write `me`'s record, guarded by `at` (where this node's last write left it; `None`: it
    /// does not know, or wrote none). A record there that does not parse is never written over:
    /// [`LockError::Refused`]. Returns where this write left it.
    async fn publish(
        &self,
        me: &Identity,
        record: &NodeRecord,
        at: Option<&str>,
    ) -> Result<String, LockError>;

    /// The whole group: semaphore, queue, records, pause.
    async fn read_fleet(&self) -> Result<FleetRead, LockError>;

    /// Return at the first change of the group's keys after `read` (a store event, not a poll).
    async fn fleet_changed(&self, read: &FleetRead) -> Result<(), LockError>;

    /// Delete the record named `name` ([`RecordRead::name`]) if the group is as `read` showed
    /// it: the record unchanged, and its node neither holding a slot nor waiting for one since
    /// ([`forget::resolve`] checked `read`). `Ok(false)`: something changed; read again.
    async fn forget_record(&self, name: &str, read: &FleetRead) -> Result<bool, LockError> {
        let _ = (name, read);
        Err(LockError::Refused(
            "this store's node records are not forgotten by rebootctl (on Leases, delete the \
             node's member Lease)"
                .into(),
        ))
    }
}

/// Why a backend keeps no fleet view.
pub fn unsupported(backend: &str) -> String {
    format!(
        "lock backend {backend}: the store keeps no fleet view (no node records, no queue to \
         read); `rebootctl fleet` needs etcd (v3 or v2) or Leases"
    )
}
