//! Lock backend `none`: every node may reboot as soon as its window allows.

use crate::lock::Backend;
use crate::state::Phase;
use std::time::Duration;

use super::{
    Admin, Fence, GroupPause, Identity, LockError, Pauses, Reported, Semaphore, SemaphoreStatus,
};
use async_trait::async_trait;

/// A semaphore with no limit and no shared state.
#[derive(Debug, Default)]
pub struct NoLock {
    pub group: String,
}

/// No shared store keeps a pause: never paused (`rebootctl pause --group` is refused).
#[async_trait]
impl Pauses for NoLock {
    async fn group_pause(&self) -> Result<Option<GroupPause>, LockError> {
        Ok(None)
    }

    async fn group_pause_changed(
        &self,
        _known: Option<&GroupPause>,
    ) -> Result<Option<GroupPause>, LockError> {
        std::future::pending().await
    }
}

#[async_trait]
impl Semaphore for NoLock {
    fn backend(&self) -> Backend {
        Backend::None
    }

    async fn acquire(&self, _me: &Identity) -> Result<(), LockError> {
        Ok(())
    }

    /// There is no slot to lose.
    async fn fence(&self, _me: &Identity) -> Result<Fence, LockError> {
        Ok(Fence::Held)
    }

    fn heartbeat_every(&self) -> Option<Duration> {
        None
    }

    async fn heartbeat(&self, _me: &Identity) -> Result<Fence, LockError> {
        Ok(Fence::Held)
    }

    async fn release(&self, _me: &Identity) -> Result<(), LockError> {
        Ok(())
    }

    async fn report_phase(&self, _me: &Identity, _phase: Phase) -> Result<Reported, LockError> {
        Ok(Reported::Unproven)
    }

    /// No shared store: no fleet view.
    fn fleet(&self) -> Option<&dyn crate::fleet::FleetStore> {
        None
    }
}

#[async_trait]
impl Admin for NoLock {
    async fn status(&self) -> Result<SemaphoreStatus, LockError> {
        Ok(SemaphoreStatus {
            backend: Backend::None,
            group: self.group.clone(),
            max: 0,
            free: 0,
            holders: Vec::new(),
            share: None,
        })
    }

    async fn unlock(&self, _id: &str) -> Result<(), LockError> {
        Ok(())
    }

    async fn set_max(&self, _max: u64, _force: bool) -> Result<(), LockError> {
        Err(LockError::Refused(
            "lock backend `none` has no slots to set".into(),
        ))
    }

    async fn pause_group(&self, _pause: &GroupPause) -> Result<(), LockError> {
        Err(LockError::Refused(
            "lock backend none: there is no shared store to keep a group's pause in; \
             pause each node (`rebootctl pause`)"
                .into(),
        ))
    }

    async fn resume_group(&self) -> Result<(), LockError> {
        Ok(())
    }

    /// No shared store: no fleet view.
    fn fleet(&self) -> Option<&dyn crate::fleet::FleetStore> {
        None
    }
}
