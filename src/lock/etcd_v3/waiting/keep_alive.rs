//! A v3 waiter's lease: granted for its queue entry, kept alive on one stream (sparser far
//! back, [`acquire::beat_due`]), forgotten when etcd says it expired.

use std::time::{Duration, Instant};

use etcd_client::{LeaseKeepAliveStream, LeaseKeeper};

use super::super::super::acquire;
use super::super::super::LockError;
use super::V3Waiting;

/// The lease keep-alive stream, opened at the first keep-alive after a read.
pub(super) struct KeepAlive {
    pub(super) keeper: LeaseKeeper,
    pub(super) stream: LeaseKeepAliveStream,
}

impl V3Waiting<'_> {
    /// When my lease needs its next keep-alive ([`acquire::beat_due`]: sparser far back).
    pub(super) fn keep_alive_due(&self) -> Option<Instant> {
        let (_, ttl) = self.lease.lease?;
        Some(acquire::beat_due(self.kept_alive_at?, ttl, self.far_back()))
    }

    /// Grant the lease of my queue entry.
    pub(super) async fn grant(&mut self) -> Result<i64, LockError> {
        let ttl = i64::try_from(self.store.timeouts.queue_ttl.as_millis().div_ceil(1000))
            .unwrap_or(i64::MAX)
            .max(1);
        let mut lease = self.store.client.lease_client();
        let resp = self
            .store
            .request("granting a lease: ", lease.grant(ttl, None))
            .await?;
        let granted = Duration::from_secs(u64::try_from(resp.ttl()).unwrap_or(1).max(1));
        self.lease.lease = Some((resp.id(), granted));
        self.keep_alive = None;
        self.kept_alive_at = Some(Instant::now());
        Ok(resp.id())
    }

    /// Send a keep-alive for my lease, opening the keep-alive stream the first time. `false`
    /// when the lease is gone.
    pub(super) async fn send_keep_alive(&mut self) -> Result<bool, LockError> {
        let Some((id, _)) = self.lease.lease else {
            return Ok(false);
        };
        if let Some(k) = self.keep_alive.as_mut() {
            return match k.keeper.keep_alive().await {
                Ok(()) => Ok(true),
                Err(e) => Err(self.store.unreachable(format!("lease keep-alive: {e}"))),
            };
        }
        let mut lease = self.store.client.lease_client();
        match tokio::time::timeout(self.store.timeouts.request, lease.keep_alive(id)).await {
            Err(_) => Err(self.store.unreachable(format!(
                "lease keep-alive: no answer within {:?}",
                self.store.timeouts.request
            ))),
            Ok(Ok((keeper, stream))) => {
                self.keep_alive = Some(KeepAlive { keeper, stream });
                Ok(true)
            }
            // What the client says when the server answers with a TTL of 0: lease not found.
            Ok(Err(etcd_client::Error::LeaseKeepAliveError(_))) => Ok(false),
            Ok(Err(e)) => Err(self.store.classify(e)),
        }
    }

    /// My lease expired: its entry went with it. Forget both; the next decision queues again.
    pub(super) fn lease_lost(&mut self) {
        tracing::warn!(key = %self.queue_key, lease = ?self.lease.lease.map(|(id, _)| id), "the lease of my queue entry expired; queueing again");
        self.lease.lease = None;
        self.keep_alive = None;
        self.kept_alive_at = None;
    }
}

/// The next answer on the keep-alive stream, if one is open.
pub(super) async fn keep_alive_response(
    keep_alive: &mut Option<KeepAlive>,
) -> Result<Option<etcd_client::LeaseKeepAliveResponse>, etcd_client::Error> {
    match keep_alive {
        Some(k) => k.stream.message().await,
        None => std::future::pending().await,
    }
}
