//! The etcd store `[lock.etcd]` names, as one [`Semaphore`] and [`Admin`]: the v3 store
//! ([`super::etcd_v3`]), or the v2 store ([`super::etcd_v2`]) followed to v3 once `rebootctl
//! migrate` moved it. On v2 every call goes to the v2 store until one answers
//! [`LockError::Moved`] (seen by a read, or by the watch of a waiter), then to the v3 store on
//! the same endpoints, for good (until the process restarts, which finds the marker again at
//! its first call). Each store connects when first needed, and again after a failed connection,
//! so an unreachable cluster at start is a retried error, not a daemon that exits.

use crate::lock::Backend;
use crate::state::Phase;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::OnceCell;

use super::etcd_v2::EtcdV2Semaphore;
use super::etcd_v3::EtcdSemaphore;
use super::{
    Acquired, Admin, Fence, GroupPause, Identity, LockError, Pauses, Reported, Semaphore,
    SemaphoreStatus,
};
use crate::config::{self, EtcdApi};

/// `[lock.etcd]`: v3, or v2 following to v3 after a migration.
pub struct EtcdStore {
    settings: config::Etcd,
    group: String,
    max_hold: Option<Duration>,
    max_per_zone: Option<u64>,
    max_percent: Option<u8>,
    v2: OnceCell<EtcdV2Semaphore>,
    v3: OnceCell<EtcdSemaphore>,
    moved: AtomicBool,
}

impl EtcdStore {
    pub fn new(settings: &config::Etcd, group: &str, max_hold: Option<Duration>) -> Self {
        EtcdStore {
            settings: settings.clone(),
            group: group.to_owned(),
            max_hold,
            max_per_zone: None,
            max_percent: None,
            v2: OnceCell::new(),
            v3: OnceCell::new(),
            moved: AtomicBool::new(settings.api == EtcdApi::V3),
        }
    }

    /// With at most `max_per_zone` holders in one zone, on either store.
    pub fn with_max_per_zone(mut self, max_per_zone: Option<u64>) -> Self {
        self.max_per_zone = max_per_zone;
        self
    }

    /// With the slots `percent` of the known nodes (`lock.max = "N%"`), on either store.
    pub fn with_max_percent(mut self, percent: Option<u8>) -> Self {
        self.max_percent = percent;
        self
    }

    /// Whether calls go to the v3 store now (configured so, or followed there).
    pub fn moved(&self) -> bool {
        self.moved.load(Ordering::Relaxed)
    }

    async fn v2(&self) -> Result<&EtcdV2Semaphore, LockError> {
        self.v2
            .get_or_try_init(|| async {
                EtcdV2Semaphore::connect(&self.settings, &self.group, self.max_hold)
                    .await
                    .map(|s| {
                        s.with_max_per_zone(self.max_per_zone)
                            .with_max_percent(self.max_percent)
                    })
            })
            .await
    }

    async fn v3(&self) -> Result<&EtcdSemaphore, LockError> {
        self.v3
            .get_or_try_init(|| async {
                let settings = config::Etcd {
                    api: EtcdApi::V3,
                    ..self.settings.clone()
                };
                EtcdSemaphore::connect(&settings, &self.group, self.max_hold)
                    .await
                    .map(|s| {
                        s.with_max_per_zone(self.max_per_zone)
                            .with_max_percent(self.max_percent)
                    })
            })
            .await
    }

    fn note_moved(&self, from: &str) {
        tracing::warn!(%from, group = %self.group, "the semaphore was moved to etcd v3 (rebootctl migrate): following it there; set [lock.etcd] api = \"v3\" in this node's configuration");
        self.moved.store(true, Ordering::Relaxed);
    }
}

/// `$call` on the v2 store (as `$s`), or on the v3 store when configured or once the semaphore
/// moved (the same method names on both).
macro_rules! follow {
    ($self:ident, $s:ident => $call:expr) => {{
        if !$self.moved() {
            let $s = $self.v2().await?;
            match $call {
                Err(LockError::Moved { from }) => $self.note_moved(&from),
                other => return other,
            }
        }
        let $s = $self.v3().await?;
        $call
    }};
}

#[async_trait]
impl Semaphore for EtcdStore {
    fn backend(&self) -> Backend {
        Backend::Etcd
    }

    async fn acquire(&self, me: &Identity) -> Result<(), LockError> {
        follow!(self, s => s.acquire(me).await)
    }

    async fn acquire_unless_paused(
        &self,
        me: &Identity,
        first: Phase,
    ) -> Result<Acquired, LockError> {
        follow!(self, s => s.acquire_unless_paused(me, first).await)
    }

    async fn fence(&self, me: &Identity) -> Result<Fence, LockError> {
        follow!(self, s => Semaphore::fence(s, me).await)
    }

    fn heartbeat_every(&self) -> Option<Duration> {
        super::heartbeat_every(self.max_hold)
    }

    async fn heartbeat(&self, me: &Identity) -> Result<Fence, LockError> {
        follow!(self, s => s.heartbeat(me).await)
    }

    async fn release(&self, me: &Identity) -> Result<(), LockError> {
        follow!(self, s => s.release(me).await)
    }

    async fn report_phase(&self, me: &Identity, phase: Phase) -> Result<Reported, LockError> {
        follow!(self, s => s.report_phase(me, phase).await)
    }

    fn fleet(&self) -> Option<&dyn crate::fleet::FleetStore> {
        Some(self)
    }
}

/// The fleet's records live in the store the semaphore is in now, as the pause does.
#[async_trait]
impl crate::fleet::FleetStore for EtcdStore {
    async fn publish(
        &self,
        me: &Identity,
        record: &crate::fleet::NodeRecord,
        at: Option<&str>,
    ) -> Result<String, LockError> {
        if self.moved() {
            return self.v3().await?.publish(me, record, at).await;
        }
        self.v2().await?.publish(me, record, at).await
    }

    async fn read_fleet(&self) -> Result<crate::fleet::FleetRead, LockError> {
        follow!(self, s => s.read_fleet().await)
    }

    async fn fleet_changed(&self, read: &crate::fleet::FleetRead) -> Result<(), LockError> {
        follow!(self, s => s.fleet_changed(read).await)
    }

    async fn forget_record(
        &self,
        name: &str,
        read: &crate::fleet::FleetRead,
    ) -> Result<bool, LockError> {
        follow!(self, s => s.forget_record(name, read).await)
    }
}

/// The pause lives in the store the semaphore is in now (not moved by `migrate`).
#[async_trait]
impl Pauses for EtcdStore {
    async fn group_pause(&self) -> Result<Option<GroupPause>, LockError> {
        follow!(self, s => s.group_pause().await)
    }

    async fn group_pause_changed(
        &self,
        known: Option<&GroupPause>,
    ) -> Result<Option<GroupPause>, LockError> {
        follow!(self, s => s.group_pause_changed(known).await)
    }
}

#[async_trait]
impl Admin for EtcdStore {
    async fn status(&self) -> Result<SemaphoreStatus, LockError> {
        follow!(self, s => s.status().await)
    }

    async fn unlock(&self, id: &str) -> Result<(), LockError> {
        follow!(self, s => s.unlock(id).await)
    }

    async fn set_max(&self, max: u64, force: bool) -> Result<(), LockError> {
        follow!(self, s => s.set_max(max, force).await)
    }

    async fn pause_group(&self, pause: &GroupPause) -> Result<(), LockError> {
        if self.moved() {
            return self.v3().await?.pause_group(pause).await;
        }
        self.v2().await?.pause_group(pause).await
    }

    async fn resume_group(&self) -> Result<(), LockError> {
        if self.moved() {
            return self.v3().await?.resume_group().await;
        }
        self.v2().await?.resume_group().await
    }

    fn fleet(&self) -> Option<&dyn crate::fleet::FleetStore> {
        Some(self)
    }
}
