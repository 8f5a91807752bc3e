//! The group's pause on the v3 store: one key beside locksmith's document (see
//! [`crate::lock::pause`]), read, put, deleted, and watched from the revision read (the read of
//! `group_pause` right before, when it saw the pause waited on: see
//! [`crate::lock::pause::LastRead`]).

use etcd_client::{EventType, WatchOptions};

use async_trait::async_trait;

use super::super::pause::{GroupPause, LastRead, PauseRecord};
use super::super::LockError;
use super::EtcdSemaphore;

impl EtcdSemaphore {
    /// The key of this group's pause.
    pub fn pause_key(&self) -> String {
        self.keys.pause.clone()
    }

    #[tracing::instrument(skip(self, p), fields(key = %self.pause_key()))]
    pub(super) async fn put_pause(&self, p: &GroupPause) -> Result<(), LockError> {
        let mut kv = self.client.kv_client();
        let put = kv.put(self.pause_key(), p.to_json(), None);
        self.request("pausing the group: ", put).await?;
        tracing::info!(key = %self.pause_key(), group = %self.keys.group, "group paused");
        Ok(())
    }

    #[tracing::instrument(skip(self), fields(key = %self.pause_key()))]
    pub(super) async fn delete_pause(&self) -> Result<(), LockError> {
        let mut kv = self.client.kv_client();
        let delete = kv.delete(self.pause_key(), None);
        self.request("resuming the group: ", delete).await?;
        tracing::info!(key = %self.pause_key(), group = %self.keys.group, "group resumed");
        Ok(())
    }
}

#[async_trait]
impl PauseRecord for EtcdSemaphore {
    type At = i64;

    fn last_read(&self) -> &LastRead<i64> {
        &self.last_pause
    }

    async fn read_pause(&self) -> Result<(Option<GroupPause>, i64), LockError> {
        let mut kv = self.client.kv_client();
        let key = self.pause_key();
        let r = self
            .request("reading the group's pause: ", kv.get(key, None))
            .await?;
        let revision = r.header().map_or(0, |h| h.revision());
        let pause = r
            .kvs()
            .first()
            .map(|kv| GroupPause::parse(&String::from_utf8_lossy(kv.value())));
        Ok((pause, revision))
    }

    /// A watch of the key from the revision after `revision`; compacted or cancelled (unless
    /// refused): read again.
    async fn watch_pause(
        &self,
        revision: i64,
        known: Option<&GroupPause>,
    ) -> Result<Option<Option<GroupPause>>, LockError> {
        let options = WatchOptions::new().with_start_revision(revision + 1);
        let mut watch = self.client.watch_client();
        let mut stream = self
            .request(
                "watching the group's pause: ",
                watch.watch(self.pause_key(), Some(options)),
            )
            .await?;
        loop {
            match stream.message().await {
                Ok(Some(resp)) if resp.compact_revision() > 0 => return Ok(None),
                Ok(Some(resp)) if resp.canceled() => {
                    let key = self.pause_key();
                    return match self.watch_cancelled(&key, &key, resp.cancel_reason()) {
                        e @ LockError::Backend { .. } => Err(e),
                        _ => Ok(None),
                    };
                }
                Ok(Some(resp)) => {
                    for e in resp.events() {
                        let pause = match (e.event_type(), e.kv()) {
                            (EventType::Put, Some(kv)) => {
                                Some(GroupPause::parse(&String::from_utf8_lossy(kv.value())))
                            }
                            _ => None,
                        };
                        if pause.as_ref() != known {
                            return Ok(Some(pause));
                        }
                    }
                }
                Ok(None) => return Err(self.unreachable("the pause's watch stream ended".into())),
                Err(e) => return Err(self.classify(e)),
            }
        }
    }
}
