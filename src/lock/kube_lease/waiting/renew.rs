//! Keeping my waiter Lease alive: when it is due (a third of its TTL, two thirds while far
//! back), and the renewal itself.

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::LeaseSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;

use super::super::calls::CallError;
use super::LeaseWaiting;
use crate::lock::acquire;
use crate::lock::LockError;

impl LeaseWaiting<'_> {
    /// When our waiter Lease is due for renewal ([`acquire::beat_due`]: a third of its TTL
    /// after its last renewal, written by this host's clock, or two thirds while far back).
    pub(super) fn renew_at(&self) -> Option<Instant> {
        let lease = &self.snap.as_ref()?.waiters.get(&self.my_waiter)?.lease;
        let spec = lease.spec.as_ref()?;
        let renewed = spec.renew_time.as_ref().or(spec.acquire_time.as_ref())?.0;
        let since = jiff::Timestamp::now().duration_since(renewed);
        let now = Instant::now();
        let kept = now
            .checked_sub(Duration::try_from(since).unwrap_or_default())
            .unwrap_or(now);
        let ttl = Duration::from_secs(u64::try_from(self.store.waiter_ttl_secs()).unwrap_or(1));
        Some(acquire::beat_due(kept, ttl, self.marker.is_some()))
    }

    /// Renew our waiter Lease. `false` = it changed or is gone (read again).
    pub(super) async fn renew(&mut self) -> Result<bool, LockError> {
        let Some(w) = self.snap()?.waiters.get(&self.my_waiter) else {
            return Ok(false);
        };
        let mut lease = w.lease.clone();
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        spec.renew_time = Some(MicroTime(jiff::Timestamp::now()));
        spec.lease_duration_seconds = Some(self.store.waiter_ttl_secs());
        let pp = kube::api::PostParams::default();
        let replace = self.store.leases.replace(&self.my_waiter, &pp, &lease);
        match self.store.call("renewing the waiter Lease", replace).await {
            Ok(l) => {
                self.contact.answered(Instant::now());
                if let Some(snap) = self.snap.as_mut() {
                    self.store.put_lease(snap, l);
                }
                Ok(true)
            }
            Err(CallError {
                code: Some(409 | 404),
                ..
            }) => {
                tracing::debug!(lease = %self.my_waiter, "the waiter Lease changed or is gone; reading again");
                Ok(false)
            }
            Err(e) => Err(e.error),
        }
    }
}
