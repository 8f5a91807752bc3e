//! Opening the configured lock backend: the agent's side ([`open`]) and `rebootctl`'s
//! ([`open_admin`]). Remote backends connect on first use and again after a failed connection,
//! so an unreachable cluster at start is a retried error the status shows, not a daemon that
//! exits and restarts in a loop.

use std::time::Duration;

use super::etcd::EtcdStore;
use super::fleetlock::{FleetLock, Options as FleetLockOptions};
use super::kube_lease::KubeLeaseSemaphore;
use super::none::NoLock;
use super::{Admin, LockError, Semaphore};
use crate::config::{self, Config, EtcdApi, LockBackend};

/// The agent's side of the configured backend.
pub async fn open(config: &Config) -> Result<Box<dyn Semaphore>, LockError> {
    let group = &config.identity.group;
    match &config.lock.backend {
        LockBackend::None => Ok(Box::new(NoLock {
            group: group.clone(),
        })),
        LockBackend::Etcd(settings) => Ok(etcd(settings, config)),
        LockBackend::Kubernetes(settings) => Ok(Box::new(
            kubernetes(settings, config.lock.max_hold)
                .await?
                .with_max_per_zone(config.lock.limits.max_per_zone)
                .with_max_percent(config.lock.limits.max_percent),
        )),
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
        LockBackend::Etcd(settings) => Ok(etcd(settings, config)),
        LockBackend::Kubernetes(settings) => Ok(Box::new(
            kubernetes(settings, config.lock.max_hold)
                .await?
                .with_max_per_zone(config.lock.limits.max_per_zone)
                .with_max_percent(config.lock.limits.max_percent),
        )),
        LockBackend::FleetLock(settings) => Err(fleetlock_has_no_admin(&settings.url)),
    }
}

/// With `[lock.etcd] api = "v3"`: a warning when etcd's v2 store also holds locksmith's
/// semaphore for this group (two semaphores). `None` otherwise.
pub async fn split_warning(config: &Config) -> Option<String> {
    match &config.lock.backend {
        LockBackend::Etcd(settings) if settings.api == EtcdApi::V3 => {
            crate::migrate::split_warning(settings, &config.identity.group).await
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

fn etcd(settings: &config::Etcd, config: &Config) -> Box<EtcdStore> {
    Box::new(
        EtcdStore::new(settings, &config.identity.group, config.lock.max_hold)
            .with_max_per_zone(config.lock.limits.max_per_zone)
            .with_max_percent(config.lock.limits.max_percent),
    )
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
