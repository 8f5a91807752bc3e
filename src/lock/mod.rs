//! Lock backends: a fleet-wide counting semaphore of reboot slots.
//!
//! A node takes a slot before it reboots and gives it back only once it is up and healthy again,
//! so at most `max` nodes of a group are down at once. Every backend implements [`Semaphore`];
//! the agent never knows which one it talks to.

pub mod document;
pub mod etcd;
pub mod fleetlock;
pub mod kube_lease;
pub mod none;
pub mod open;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

/// Who this node is, as the semaphore records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// Holder id in the semaphore: the machine id, as locksmith uses.
    pub id: String,
    /// Kubernetes node name (or host name).
    pub node: String,
    /// Boot id at the time of the call.
    pub boot_id: String,
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
}

/// What `rebootctl status` shows about the semaphore.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SemaphoreStatus {
    pub backend: String,
    pub group: String,
    pub max: u64,
    /// Free slots; negative when someone lowered `max` below the number of holders.
    pub free: i64,
    pub holders: Vec<Holder>,
}

/// Errors of every lock backend. Each names what it was talking to.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error("cannot reach {backend} at {target}: {reason}")]
    Unreachable {
        backend: &'static str,
        target: String,
        reason: String,
    },
    #[error(
        "semaphore document at {key} does not parse ({reason}); refusing to touch it: {value}"
    )]
    Corrupt {
        key: String,
        value: String,
        reason: String,
    },
    #[error("set-max {requested} refused: {holders} holders hold slots now (use --force)")]
    MaxBelowHolders { requested: u64, holders: usize },
    #[error("{0}")]
    Refused(String),
    #[error("{backend} error: {reason}")]
    Backend {
        backend: &'static str,
        reason: String,
    },
}

impl LockError {
    /// Whether retrying later may succeed (network, conflicts) as opposed to a permanent refusal.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            LockError::Unreachable { .. } | LockError::Backend { .. }
        )
    }
}

/// A counting semaphore of reboot slots.
#[async_trait]
pub trait Semaphore: Send + Sync {
    /// Short backend name: `none`, `etcd`, `kubernetes`, `fleetlock`.
    fn backend(&self) -> &'static str;

    /// Take a slot for `me`, waiting (by watch, not polling) until one is free. Holding a slot
    /// already is success at once, so a crash between taking a slot and recording it is harmless.
    async fn acquire(&self, me: &Identity) -> Result<(), LockError>;

    /// Give back the slot held by `id`. Not holding one is success (idempotent).
    async fn release(&self, id: &str) -> Result<(), LockError>;

    /// Whether `id` holds a slot now.
    async fn holds(&self, id: &str) -> Result<bool, LockError>;

    /// Record the phase of a holder, for `rebootctl status` and stale-holder detection.
    async fn report_phase(&self, me: &Identity, phase: &str) -> Result<(), LockError>;

    /// The semaphore as it stands.
    async fn status(&self) -> Result<SemaphoreStatus, LockError>;

    /// Change the number of slots. Refuses fewer slots than holders unless `force`.
    async fn set_max(&self, max: u64, force: bool) -> Result<(), LockError>;
}
