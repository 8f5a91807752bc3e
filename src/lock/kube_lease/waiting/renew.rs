//! Keeping my waiter Lease alive: when it is due (a third of its TTL, two thirds while far
//! back), and the renewal itself.

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::LeaseSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;

use super::super::calls::CallError;
use super::super::marker;
use super::LeaseWaiting;
use crate::lock::LockError;

impl LeaseWaiting<'_> {
    /// When our waiter Lease is due for renewal: a third of its TTL after its last renewal
    /// (written by this host), or two thirds while far back ([`marker::FAR_RENEWAL_THIRDS`]).
    pub(super) fn renew_at(&self) -> Option<Instant> {
        let lease = &self.snap.as_ref()?.waiters.get(&self.my_waiter)?.lease;
        let spec = lease.spec.as_ref()?;
        let renewed = spec.renew_time.as_ref().or(spec.acquire_time.as_ref())?.0;
        let thirds = if self.marker.is_some() {
            marker::FAR_RENEWAL_THIRDS
        } else {
            1
        };
        let every =
            jiff::SignedDuration::from_secs(i64::from(self.store.waiter_ttl_secs())) * thirds / 3;
        let due = renewed
            .saturating_add(every)
            .unwrap_or(jiff::Timestamp::MAX);
        let ahead = due.duration_since(jiff::Timestamp::now());
        Some(Instant::now() + Duration::try_from(ahead).unwrap_or_default())
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
