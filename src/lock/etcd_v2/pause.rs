//! The group's pause on the v2 store: one key of rebootd's beside locksmith's document (never in
//! it, see [`crate::lock::pause`]), read, set, deleted, and watched from the index read (the read
//! of `group_pause` right before, or the read of a waiter that ended paused, when it saw the
//! pause waited on: see [`crate::lock::pause::LastRead`]). A waiter needs none of this: the key
//! is in the directory its read and watch follow (`acquire_unless_paused`).

use async_trait::async_trait;

use super::super::pause::{GroupPause, LastRead, PauseRecord};
use super::super::LockError;
use super::{lock_error, EtcdV2Semaphore};
use crate::clients::etcd_v2::{Action, Get, Put, V2Error};

impl EtcdV2Semaphore {
    /// The key of this group's pause.
    pub fn pause_key(&self) -> String {
        self.keys.pause.clone()
    }

    #[tracing::instrument(skip(self, p), fields(key = %self.pause_key()))]
    pub(super) async fn put_pause(&self, p: &GroupPause) -> Result<(), LockError> {
        self.client
            .put(&self.pause_key(), &p.to_json(), Put::default())
            .await
            .map_err(lock_error)?;
        tracing::info!(key = %self.pause_key(), "group paused");
        Ok(())
    }

    #[tracing::instrument(skip(self), fields(key = %self.pause_key()))]
    pub(super) async fn delete_pause(&self) -> Result<(), LockError> {
        match self.client.delete(&self.pause_key(), None).await {
            Ok(_) => {}
            Err(e) if e.is_key_not_found() => {}
            Err(e) => return Err(lock_error(e)),
        }
        tracing::info!(key = %self.pause_key(), "group resumed");
        Ok(())
    }
}

#[async_trait]
impl PauseRecord for EtcdV2Semaphore {
    type At = u64;

    fn last_read(&self) -> &LastRead<u64> {
        &self.last_pause
    }

    /// A quorum read of the key, and etcd's index then.
    async fn read_pause(&self) -> Result<(Option<GroupPause>, u64), LockError> {
        let get = Get {
            quorum: true,
            ..Get::default()
        };
        match self.client.get(&self.pause_key(), get).await {
            Ok(r) => Ok((
                r.node.value.as_deref().map(GroupPause::parse),
                r.etcd_index.max(r.node.modified_index),
            )),
            Err(e @ V2Error::Etcd { index, .. }) if e.is_key_not_found() => Ok((None, index)),
            Err(e) => Err(lock_error(e)),
        }
    }

    /// Long-poll watches of the key, one event each, from the index after `index`; an index
    /// cleared from etcd's history: read again.
    async fn watch_pause(
        &self,
        index: u64,
        known: Option<&GroupPause>,
    ) -> Result<Option<Option<GroupPause>>, LockError> {
        let mut from = index + 1;
        loop {
            match self.client.watch(&self.pause_key(), false, from).await {
                Ok(None) => continue,
                Ok(Some(r)) => {
                    from = r.node.modified_index + 1;
                    let pause = match r.action {
                        Action::Delete | Action::CompareAndDelete | Action::Expire => None,
                        _ => r.node.value.as_deref().map(GroupPause::parse),
                    };
                    if pause.as_ref() != known {
                        return Ok(Some(pause));
                    }
                }
                Err(e) if e.is_index_cleared() => return Ok(None),
                Err(e) => return Err(lock_error(e)),
            }
        }
    }
}
