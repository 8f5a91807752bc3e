//! Opening the configured lock backend: the agent's side ([`open`]) and `rebootctl`'s
//! ([`open_admin`]). Remote backends connect on first use and again after a failed connection,
//! so an unreachable cluster at start is a retried error the status shows, not a daemon that
//! exits and restarts in a loop.

use crate::lock::Backend;
use crate::state::Phase;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::OnceCell;

use super::etcd_v2::follow::FollowV3;
use super::etcd_v3::EtcdSemaphore;
use super::fleetlock::{FleetLock, Options as FleetLockOptions};
use super::kube_lease::KubeLeaseSemaphore;
use super::none::NoLock;
use super::{
    Acquired, Admin, Fence, GroupPause, Identity, LockError, Reported, Semaphore, SemaphoreStatus,
};
use crate::config::{self, Config, EtcdApi, LockBackend};

/// The agent's side of the configured backend.
pub async fn open(config: &Config) -> Result<Box<dyn Semaphore>, LockError> {
    let group = &config.identity.group;
    match &config.lock.backend {
        LockBackend::None => Ok(Box::new(NoLock {
            group: group.clone(),
        })),
        LockBackend::Etcd(settings) => Ok(etcd(settings, config).semaphore()),
        LockBackend::Kubernetes(settings) => {
            Ok(Box::new(kubernetes(settings, config.lock.max_hold).await?))
        }
        LockBackend::FleetLock(settings) => Ok(Box::new(fleetlock(settings, group)?)),
    }
}

/// What `rebootctl` needs of the configured backend (status, unlock, set-max). A FleetLock
/// server owns its semaphore: refused, saying so.
pub async fn open_admin(config: &Config) -> Result<Box<dyn Admin>, LockError> {
    match &config.lock.backend {
        LockBackend::None => Ok(Box::new(NoLock {
            group: config.identity.group.clone(),
        })),
        LockBackend::Etcd(settings) => Ok(etcd(settings, config).admin()),
        LockBackend::Kubernetes(settings) => {
            Ok(Box::new(kubernetes(settings, config.lock.max_hold).await?))
        }
        LockBackend::FleetLock(settings) => Err(fleetlock_has_no_admin(&settings.url)),
    }
}

/// With `[lock.etcd] api = "v3"`: a warning when etcd's v2 store also holds locksmith's
/// semaphore for this group (two semaphores). `None` otherwise.
pub async fn split_warning(config: &Config) -> Option<String> {
    match &config.lock.backend {
        LockBackend::Etcd(settings) if settings.api == EtcdApi::V3 => {
            super::etcd_v2::migrate::split_warning(settings, &config.identity.group).await
        }
        _ => None,
    }
}

/// Why `rebootctl` cannot read or change a FleetLock server's semaphore.
pub fn fleetlock_has_no_admin(url: &str) -> LockError {
    LockError::Refused(format!(
        "lock backend fleetlock: the FleetLock server at {url} owns the semaphore, and the \
         protocol has no call to read its holders, release another node's slot or change the \
         number of slots; do that in the server's own configuration or tools"
    ))
}

/// The etcd store of `settings.api`: v3, or v2 following to v3 once migrated.
enum EtcdStore {
    V3(Box<LazyEtcd>),
    V2(Box<FollowV3>),
}

fn etcd(settings: &config::Etcd, config: &Config) -> EtcdStore {
    let group = &config.identity.group;
    match settings.api {
        EtcdApi::V3 => EtcdStore::V3(Box::new(LazyEtcd {
            settings: settings.clone(),
            group: group.clone(),
            max_hold: config.lock.max_hold,
            inner: OnceCell::new(),
        })),
        EtcdApi::V2 => EtcdStore::V2(Box::new(FollowV3::new(
            settings,
            group,
            config.lock.max_hold,
        ))),
    }
}

impl EtcdStore {
    fn semaphore(self) -> Box<dyn Semaphore> {
        match self {
            EtcdStore::V3(s) => s,
            EtcdStore::V2(s) => s,
        }
    }

    fn admin(self) -> Box<dyn Admin> {
        match self {
            EtcdStore::V3(s) => s,
            EtcdStore::V2(s) => s,
        }
    }
}

async fn kubernetes(
    settings: &config::KubeLease,
    max_hold: Option<Duration>,
) -> Result<KubeLeaseSemaphore, LockError> {
    // Reads the kubeconfig only; nothing is contacted before the first call.
    let client = crate::kube_client::connect(settings.kubeconfig.as_deref())
        .await
        .map_err(|e| LockError::Refused(format!("lock backend kubernetes: {e}")))?;
    Ok(KubeLeaseSemaphore::new(client, settings, max_hold))
}

fn fleetlock(settings: &config::FleetLock, group: &str) -> Result<FleetLock, LockError> {
    let options = FleetLockOptions {
        ca_file: settings.ca_file.clone(),
        ..FleetLockOptions::default()
    };
    FleetLock::new(&settings.url, group, options)
}

/// An etcd semaphore that connects when first needed.
struct LazyEtcd {
    settings: config::Etcd,
    group: String,
    max_hold: Option<Duration>,
    inner: OnceCell<EtcdSemaphore>,
}

impl LazyEtcd {
    async fn get(&self) -> Result<&EtcdSemaphore, LockError> {
        self.inner
            .get_or_try_init(|| EtcdSemaphore::connect(&self.settings, &self.group, self.max_hold))
            .await
    }
}

#[async_trait]
impl Semaphore for LazyEtcd {
    fn backend(&self) -> Backend {
        Backend::Etcd
    }

    async fn acquire(&self, me: &Identity) -> Result<(), LockError> {
        self.get().await?.acquire(me).await
    }

    async fn acquire_unless_paused(&self, me: &Identity) -> Result<Acquired, LockError> {
        self.get().await?.acquire_unless_paused(me).await
    }

    async fn fence(&self, me: &Identity) -> Result<Fence, LockError> {
        Semaphore::fence(self.get().await?, me).await
    }

    fn heartbeat_every(&self) -> Option<Duration> {
        super::heartbeat_every(self.max_hold)
    }

    async fn heartbeat(&self, me: &Identity) -> Result<Fence, LockError> {
        self.get().await?.heartbeat(me).await
    }

    async fn release(&self, me: &Identity) -> Result<(), LockError> {
        self.get().await?.release(me).await
    }

    async fn report_phase(&self, me: &Identity, phase: Phase) -> Result<Reported, LockError> {
        self.get().await?.report_phase(me, phase).await
    }

    async fn group_pause(&self) -> Result<Option<GroupPause>, LockError> {
        Semaphore::group_pause(self.get().await?).await
    }

    async fn group_pause_changed(
        &self,
        known: Option<&GroupPause>,
    ) -> Result<Option<GroupPause>, LockError> {
        self.get().await?.group_pause_changed(known).await
    }
}

#[async_trait]
impl Admin for LazyEtcd {
    async fn status(&self) -> Result<SemaphoreStatus, LockError> {
        self.get().await?.status().await
    }

    async fn unlock(&self, id: &str) -> Result<(), LockError> {
        self.get().await?.unlock(id).await
    }

    async fn set_max(&self, max: u64, force: bool) -> Result<(), LockError> {
        self.get().await?.set_max(max, force).await
    }

    async fn group_pause(&self) -> Result<Option<GroupPause>, LockError> {
        Admin::group_pause(self.get().await?).await
    }

    async fn pause_group(&self, pause: &GroupPause) -> Result<(), LockError> {
        self.get().await?.pause_group(pause).await
    }

    async fn resume_group(&self) -> Result<(), LockError> {
        self.get().await?.resume_group().await
    }
}
