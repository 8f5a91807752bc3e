//! Opening the configured lock backend. Remote backends connect on first use and again after a
//! failed connection, so an unreachable cluster at start is a retried error the status shows,
//! not a daemon that exits and restarts in a loop.

use super::etcd::EtcdSemaphore;
use super::fleetlock::{FleetLock, Options as FleetLockOptions};
use super::kube_lease::KubeLeaseSemaphore;
use super::none::NoLock;
use super::{Identity, LockError, Semaphore, SemaphoreStatus};
use crate::config::{Backend, Config, KubeLease};
use async_trait::async_trait;
use tokio::sync::OnceCell;

/// The configured backend.
pub async fn open(config: &Config) -> Result<Box<dyn Semaphore>, LockError> {
    match config.lock.backend {
        Backend::None => Ok(Box::new(NoLock {
            group: config.identity.group.clone(),
        })),
        Backend::Etcd => Ok(Box::new(LazyEtcd {
            config: config.clone(),
            inner: OnceCell::new(),
        })),
        Backend::Kubernetes => {
            let settings = config.lock.kubernetes.clone().unwrap_or_else(|| KubeLease {
                namespace: crate::config::DEFAULT_LEASE_NAMESPACE.into(),
                name: "rebootd".into(),
                kubeconfig: config
                    .kubernetes
                    .as_ref()
                    .and_then(|k| k.kubeconfig.clone()),
            });
            // Reads the kubeconfig only; nothing is contacted before the first call.
            let client = crate::kube_client::connect(settings.kubeconfig.as_deref())
                .await
                .map_err(|e| LockError::Refused(format!("lock backend kubernetes: {e}")))?;
            Ok(Box::new(KubeLeaseSemaphore::new(
                client,
                &settings,
                config.lock.max_hold,
            )))
        }
        Backend::FleetLock => {
            let settings = config.lock.fleetlock.as_ref().ok_or_else(|| {
                LockError::Refused("lock.backend = \"fleetlock\" needs [lock.fleetlock] url".into())
            })?;
            let options = FleetLockOptions {
                ca_file: settings.ca_file.clone(),
                ..FleetLockOptions::default()
            };
            Ok(Box::new(FleetLock::new(
                &settings.url,
                &config.identity.group,
                options,
            )?))
        }
    }
}

/// An etcd semaphore that connects when first needed.
struct LazyEtcd {
    config: Config,
    inner: OnceCell<EtcdSemaphore>,
}

impl LazyEtcd {
    async fn get(&self) -> Result<&EtcdSemaphore, LockError> {
        self.inner
            .get_or_try_init(|| async {
                let settings = self.config.lock.etcd.as_ref().ok_or_else(|| {
                    LockError::Refused("lock.backend = \"etcd\" needs [lock.etcd]".into())
                })?;
                EtcdSemaphore::connect(
                    settings,
                    &self.config.identity.group,
                    self.config.lock.max_hold,
                )
                .await
            })
            .await
    }
}

#[async_trait]
impl Semaphore for LazyEtcd {
    fn backend(&self) -> &'static str {
        "etcd"
    }

    async fn acquire(&self, me: &Identity) -> Result<(), LockError> {
        self.get().await?.acquire(me).await
    }

    async fn release(&self, id: &str) -> Result<(), LockError> {
        self.get().await?.release(id).await
    }

    async fn holds(&self, id: &str) -> Result<bool, LockError> {
        self.get().await?.holds(id).await
    }

    async fn report_phase(&self, me: &Identity, phase: &str) -> Result<(), LockError> {
        self.get().await?.report_phase(me, phase).await
    }

    async fn status(&self) -> Result<SemaphoreStatus, LockError> {
        self.get().await?.status().await
    }

    async fn set_max(&self, max: u64, force: bool) -> Result<(), LockError> {
        self.get().await?.set_max(max, force).await
    }
}
