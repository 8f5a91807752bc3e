//! The etcd lease of a v3 waiter's queue entry, minded for the length of one `acquire`
//! ([`super::waiting`]).

use std::time::Duration;

use etcd_client::Client;

/// The lease of my queue entry; revoked (from a spawned task, best effort) when dropped, so an
/// `acquire` that returns or is cancelled leaves no entry behind. If the process dies instead,
/// the lease expires. Forgotten without a revoke once my entry went with the take.
pub(super) struct LeaseGuard {
    pub(super) client: Client,
    pub(super) request: Duration,
    /// The lease and its granted time to live.
    pub(super) lease: Option<(i64, Duration)>,
}

impl LeaseGuard {
    /// Stop minding the lease without revoking it (it holds no key): it expires by its TTL.
    pub(super) fn forget(&mut self) {
        if let Some((id, ttl)) = self.lease.take() {
            tracing::debug!(lease = id, ?ttl, "queue lease holds no key; left to expire");
        }
    }

    pub(super) fn revoke(&mut self) {
        let Some((id, _)) = self.lease.take() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let mut lease = self.client.lease_client();
        let request = self.request;
        runtime.spawn(async move {
            match tokio::time::timeout(request, lease.revoke(id)).await {
                Ok(Ok(_)) => tracing::debug!(lease = id, "queue lease revoked"),
                Ok(Err(e)) => {
                    tracing::debug!(lease = id, error = %e, "queue lease not revoked; it expires")
                }
                Err(_) => {
                    tracing::debug!(lease = id, "queue lease not revoked in time; it expires")
                }
            }
        });
    }
}

impl Drop for LeaseGuard {
    fn drop(&mut self) {
        self.revoke();
    }
}
