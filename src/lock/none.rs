//! Lock backend `none`: every node may reboot as soon as its window allows.

use super::{Identity, LockError, Semaphore, SemaphoreStatus};
use async_trait::async_trait;

/// A semaphore with no limit and no shared state.
#[derive(Debug, Default)]
pub struct NoLock {
    pub group: String,
}

#[async_trait]
impl Semaphore for NoLock {
    fn backend(&self) -> &'static str {
        "none"
    }

    async fn acquire(&self, _me: &Identity) -> Result<(), LockError> {
        Ok(())
    }

    async fn release(&self, _id: &str) -> Result<(), LockError> {
        Ok(())
    }

    async fn holds(&self, _id: &str) -> Result<bool, LockError> {
        Ok(false)
    }

    async fn report_phase(&self, _me: &Identity, _phase: &str) -> Result<(), LockError> {
        Ok(())
    }

    async fn status(&self) -> Result<SemaphoreStatus, LockError> {
        Ok(SemaphoreStatus {
            backend: "none".into(),
            group: self.group.clone(),
            max: 0,
            free: 0,
            holders: Vec::new(),
        })
    }

    async fn set_max(&self, _max: u64, _force: bool) -> Result<(), LockError> {
        Err(LockError::Refused(
            "lock backend `none` has no slots to set".into(),
        ))
    }
}
