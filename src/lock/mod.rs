//! Lock backends: a fleet-wide counting semaphore of reboot slots.
//!
//! A node takes a slot before it reboots and gives it back only once it is up and healthy again,
//! so at most `max` nodes of a group are down at once.
//!
//! # Layout
//!
//! - [`view`]: a store-neutral snapshot (max, holders, the waiter queue);
//!   [`arbiter`]: the one pure decision over it (held, take, reclaim, wait until);
//!   [`retry`]: back-off, the one compare-and-swap loop of every store (`cas_loop!`, counting
//!   lost races) and which errors are transient;
//!   [`acquire`]: the one acquire loop, over a store adapter's [`acquire::Waiting`].
//! - Store adapters: [`etcd`] (locksmith's document in etcd v3), [`etcd_v2`] (locksmith's
//!   own store, etcd's v2 keys API), [`kube_lease`] (Lease objects), [`fleetlock`] (a FleetLock server, agent side only), [`none`].
//! - Two traits: [`Semaphore`] is what the agent needs (acquire, fence, heartbeat, release,
//!   phase reports); [`Admin`] is what `rebootctl` needs (status, unlock, set-max). A store
//!   whose server owns the semaphore (FleetLock) implements only the first.
//! - [`open`]: the configured backend.

pub mod acquire;
pub mod arbiter;
pub mod contact;
pub mod document;
pub mod etcd;
pub mod etcd_v2;
pub mod etcd_v3;
pub mod fleetlock;
pub mod holding;
pub mod kube_lease;
pub mod lost_race;
pub mod none;
pub mod open;
pub mod pause;
#[cfg(test)]
mod race_tests;
pub mod recent;
pub mod retry;
pub mod view;

use crate::state::Phase;
use crate::text::clean;

use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

pub use pause::{GroupPause, Pauses};

/// Which store keeps the semaphore: what `lock.backend` names, errors and logs say, and
/// `rebootctl status --json` shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    None,
    /// etcd, on the v3 API or locksmith's v2 keys API.
    Etcd,
    /// Lease objects of the Kubernetes API.
    Kubernetes,
    /// A FleetLock server: it owns the semaphore, this node only asks.
    FleetLock,
}

impl Backend {
    pub fn as_str(self) -> &'static str {
        match self {
            Backend::None => "none",
            Backend::Etcd => "etcd",
            Backend::Kubernetes => "kubernetes",
            Backend::FleetLock => "fleetlock",
        }
    }
}

impl std::fmt::Display for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Who this node is, as the semaphore records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// Holder id in the semaphore: the machine id, as locksmith uses.
    pub id: String,
    /// Kubernetes node name (or host name).
    pub node: String,
    /// Boot id at the time of the call.
    pub boot_id: String,
    /// This host's holder token (kept in the state directory, see
    /// [`crate::state::StateStore::holder_token`]): written on the
    /// holder record, it tells this host from another one with the same machine id, and a
    /// restarted rebootd from a stranger.
    pub token: String,
    /// This node's zone where the configuration names it (`lock.zone`, etcd), written in its
    /// holder record and queue entry for `lock.max_per_zone`; on Leases the store reads it from
    /// the Node instead.
    pub zone: Option<String>,
}

impl Identity {
    /// Who is asking, as the lock core's rules take it.
    pub fn as_me(&self) -> view::Me<'_> {
        view::Me {
            id: &self.id,
            node: &self.node,
            token: &self.token,
        }
    }
}

/// One holder of a slot, with what the backend knows about it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Holder {
    pub id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// When the holder took the slot (or last reported a phase).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<jiff::Timestamp>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_id: Option<String>,
    /// Why this holder is not one rebootd would have written (a slot Lease past `max`, or
    /// without the slot role): it counts as held, and is nobody's to hold or adopt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub foreign: Option<String>,
}

/// What `rebootctl status` shows about the semaphore.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SemaphoreStatus {
    pub backend: Backend,
    pub group: String,
    pub max: u64,
    /// Free slots; negative when someone lowered `max` below the number of holders.
    pub free: i64,
    pub holders: Vec<Holder>,
    /// With `lock.max = "N%"`: the share `max` is (`max` is then the share, not the count the
    /// store keeps).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share: Option<arbiter::share::Share>,
}

/// Errors of every lock backend. Each names what it was talking to. What a store or server
/// said (reasons, values) is shown bounded and escaped ([`crate::text::clean`]).
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error("cannot reach {backend} at {target}: {}", clean(.reason))]
    Unreachable {
        backend: Backend,
        target: String,
        reason: String,
    },
    #[error(
        "semaphore document at {key} does not parse ({}); refusing to touch it: {}",
        clean(.reason),
        clean(.value)
    )]
    Corrupt {
        key: String,
        value: String,
        reason: String,
    },
    #[error("set-max {requested} refused: {holders} holders hold slots now (use --force)")]
    MaxBelowHolders { requested: u64, holders: usize },
    #[error("{}", clean(.0))]
    Refused(String),
    /// A waiter asked for its view before its first read: a bug, never the store's doing.
    #[error("{0} error: internal: the semaphore was not read yet")]
    NotRead(Backend),
    #[error("{backend} error: {}", clean(.reason))]
    Backend { backend: Backend, reason: String },
    /// The semaphore was moved to etcd v3 by `rebootctl migrate`: the v2 document at `from`
    /// only says so. A node configured for v2 follows to v3 (see `etcd_v2::follow`).
    #[error(
        "the semaphore at {from} was moved to etcd v3 by `rebootctl migrate`; set \
         [lock.etcd] api = \"v3\" (this node follows to v3 by itself meanwhile)"
    )]
    Moved { from: String },
}

/// Whether a holder still holds its slot, as the store says right now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fence {
    /// It holds its slot (and, where the store keeps records, its record is fresh again).
    Held,
    /// It does not: released by hand, reclaimed, or held by another host with the same id.
    Lost { why: String },
}

/// What a phase report proved about the slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reported {
    /// The report was a write that could land only while `me` held its slot, guarded as a
    /// heartbeat is: it proves the slot held as [`Semaphore::heartbeat`] does, so a fence
    /// right after it need not be sent.
    Held,
    /// Nothing was proved: nothing was written (the phase was on record already, the slot is
    /// not held), or the store records no phases.
    Unproven,
}

/// How [`Semaphore::acquire_unless_paused`] ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Acquired {
    /// `me` holds a slot.
    Held,
    /// The group is paused: no slot was taken and no queue entry is left.
    Paused(GroupPause),
}

/// The agent's side of a counting semaphore of reboot slots.
#[async_trait]
pub trait Semaphore: Pauses {
    /// Which store keeps the semaphore.
    fn backend(&self) -> Backend;

    /// Take a slot for `me`, waiting (by watch, not polling) until one is free. Holding a slot
    /// already is success at once, so a crash between taking a slot and recording it is harmless.
    async fn acquire(&self, me: &Identity) -> Result<(), LockError>;

    /// Prove that `me` (this host: id and token) still holds its slot, right before an action
    /// that needs it (cordon, reboot). An error means the store could not tell.
    async fn fence(&self, me: &Identity) -> Result<Fence, LockError>;

    /// How often a holder must call [`Semaphore::heartbeat`] so that it is not taken for dead
    /// (`lock.max_hold` reclaims holders that stopped); `None`: never.
    fn heartbeat_every(&self) -> Option<Duration>;

    /// Show the store that `me` is alive and holds its slot: its record gets a new revision.
    /// Says whether it still holds it, as [`Semaphore::fence`].
    async fn heartbeat(&self, me: &Identity) -> Result<Fence, LockError>;

    /// Give back the slot `me` holds. Not holding one is success (idempotent); a slot held
    /// under `me.id` by another host (another token) is left alone.
    async fn release(&self, me: &Identity) -> Result<(), LockError>;

    /// Record the phase of a holder, for `rebootctl status` (it counts as a heartbeat too).
    /// Not holding a slot is a no-op. Says whether the write proved the slot held.
    async fn report_phase(&self, me: &Identity, phase: Phase) -> Result<Reported, LockError>;

    /// Take a slot for `me` as [`Semaphore::acquire`] does, unless the group is paused
    /// (`rebootctl pause --group`) before or while waiting: then the wait ends, leaving the
    /// queue behind nothing, and says the pause. Here: the pause read first, then watched
    /// beside the acquire (a broken watch of the pause leaves the wait alone). The stores that
    /// read and watch the pause with their semaphore (etcd v3 and v2, Leases: all of rebootd's
    /// own) do it in the same requests.
    ///
    /// `first` is the phase the holder enters with its slot: a store that records phases
    /// writes it with the take, so the take is also the first phase report (that report then
    /// finds it on record and sends nothing).
    async fn acquire_unless_paused(
        &self,
        me: &Identity,
        first: Phase,
    ) -> Result<Acquired, LockError> {
        let _ = first;
        if let Some(pause) = self.group_pause().await? {
            return Ok(Acquired::Paused(pause));
        }
        let paused = async {
            match self.group_pause_changed(None).await {
                Ok(Some(pause)) => pause,
                // Resumed before it was paused: cannot be.
                Ok(None) => std::future::pending().await,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot follow the group's pause while waiting for a slot: {e}");
                    std::future::pending().await
                }
            }
        };
        tokio::select! {
            held = self.acquire(me) => held.map(|()| Acquired::Held),
            pause = paused => Ok(Acquired::Paused(pause)),
        }
    }

    /// Where this node keeps its fleet record ([`crate::fleet`]); `None`: the store keeps none.
    fn fleet(&self) -> Option<&dyn crate::fleet::FleetStore>;
}

/// What `rebootctl` does to a semaphore beside the agent's calls. Not every store has it: a
/// FleetLock server owns its semaphore.
#[async_trait]
pub trait Admin: Pauses {
    /// The semaphore as it stands.
    async fn status(&self) -> Result<SemaphoreStatus, LockError>;

    /// Give back the slot held by `id`, whoever holds it. Not held is success.
    async fn unlock(&self, id: &str) -> Result<(), LockError>;

    /// Change the number of slots. Refuses fewer slots than holders unless `force`.
    async fn set_max(&self, max: u64, force: bool) -> Result<(), LockError>;

    /// Pause the whole group: no node of it takes a slot until [`Admin::resume_group`].
    /// Pausing a paused group replaces its record.
    async fn pause_group(&self, pause: &GroupPause) -> Result<(), LockError>;

    /// Undo [`Admin::pause_group`]. Not paused is success.
    async fn resume_group(&self) -> Result<(), LockError>;

    /// The fleet view's records and reads ([`crate::fleet`]); `None`: the store keeps none.
    fn fleet(&self) -> Option<&dyn crate::fleet::FleetStore>;
}

/// How often a holder beats when holders silent for `max_hold` are reclaimed: an eighth of it,
/// so that a few lost beats (a short store outage) never make a live holder look dead.
pub fn heartbeat_every(max_hold: Option<Duration>) -> Option<Duration> {
    max_hold.map(|m| (m / 8).max(Duration::from_millis(100)))
}
