//! Phase reports on Leases: a holder writes its phase into the annotations of its slot Lease,
//! guarded by that Lease's `resourceVersion` (every write of a slot Lease is).
//!
//! The store keeps the slot Lease as this process last wrote it ([`Written`]): a report is
//! then one `PUT` on that object, with no list first. Any other change of the slot (a release,
//! a reclaim, an operator's unlock, a heartbeat of mine) moves its `resourceVersion`, so a kept
//! object that is out of date is refused with 409 and the report lists the Leases and tries
//! again, as it always did.
//!
//! A report that listed keeps that list (with its own write in it) for the release that
//! follows soon after: the release's first attempt then needs no list of its own
//! ([`crate::lock::recent`]).

use std::collections::BTreeMap;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;

use super::objects::SlotHolder;
use super::snapshot::Snapshot;
use super::{
    KubeLeaseSemaphore, ANNOTATION_BOOT_ID, ANNOTATION_HOLDER_TOKEN, ANNOTATION_MACHINE_ID,
    ANNOTATION_PHASE, ANNOTATION_SINCE,
};
use crate::lock::recent::Recent;
use crate::lock::{Fence, Identity, LockError, Reported};

/// The slot Lease this process last wrote, and the Leases as the last report listed them (with
/// that write in), for the release right after.
#[derive(Debug, Default)]
pub(super) struct Written {
    lease: std::sync::Mutex<Option<Lease>>,
    read: Recent<Snapshot>,
}

impl Written {
    fn lease(&self) -> std::sync::MutexGuard<'_, Option<Lease>> {
        self.lease.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn get(&self) -> Option<Lease> {
        self.lease().clone()
    }

    pub(super) fn set(&self, lease: Lease) {
        *self.lease() = Some(lease);
        self.read.forget();
    }

    /// [`Self::set`], with the list the same report made (slot `index` replaced by `lease`).
    fn set_read(&self, index: u64, lease: Lease, mut snap: Snapshot) {
        if let Some(slot) = snap.slots.get_mut(&index) {
            slot.holder = SlotHolder::from_lease(&lease);
            slot.lease = lease.clone();
        }
        *self.lease() = Some(lease);
        self.read.set(snap);
    }

    pub(super) fn forget(&self) {
        *self.lease() = None;
        self.read.forget();
    }

    /// The Leases the last report listed, if that is recent; once.
    pub(super) fn recent(&self) -> Option<Snapshot> {
        self.read.take()
    }
}

/// `slot` (held by `h`, which is `me`) with `phase` recorded: `since` moves when the phase or
/// the boot changes; the renew time is now.
fn with_phase(slot: &Lease, h: &SlotHolder, me: &Identity, phase: &str) -> Lease {
    let now = jiff::Timestamp::now();
    let mut lease = slot.clone();
    let annotations = lease.metadata.annotations.get_or_insert_with(BTreeMap::new);
    if h.phase.as_deref() != Some(phase) || h.boot_id.as_deref() != Some(&me.boot_id) {
        annotations.insert(ANNOTATION_SINCE.to_owned(), now.to_string());
    }
    annotations.insert(ANNOTATION_PHASE.to_owned(), phase.to_owned());
    annotations.insert(ANNOTATION_BOOT_ID.to_owned(), me.boot_id.clone());
    annotations.insert(ANNOTATION_MACHINE_ID.to_owned(), me.id.clone());
    annotations.insert(ANNOTATION_HOLDER_TOKEN.to_owned(), me.token.clone());
    lease.spec.get_or_insert_with(LeaseSpec::default).renew_time = Some(MicroTime(now));
    lease
}

impl KubeLeaseSemaphore {
    /// A report that wrote is a proof ([`Reported::Held`]): my slot Lease, held under my token,
    /// was as last seen when the write landed, and the write moved its `resourceVersion` as a
    /// heartbeat does.
    pub(super) async fn report(&self, me: &Identity, phase: &str) -> Result<Reported, LockError> {
        if let Some(slot) = self.written.get() {
            let mine = SlotHolder::from_lease(&slot).filter(|h| {
                h.node == me.node
                    && h.machine_id.as_deref() == Some(me.id.as_str())
                    && h.token.as_deref() == Some(me.token.as_str())
            });
            if let Some(h) = mine {
                if h.phase.as_deref() == Some(phase) && h.boot_id.as_deref() == Some(&me.boot_id) {
                    return Ok(Reported::Unproven);
                }
                let lease = with_phase(&slot, &h, me, phase);
                if let Some(new) = self.replace_obj("recording the phase", &lease).await? {
                    self.written.set(new);
                    return Ok(Reported::Held);
                }
            }
            self.written.forget();
        }
        let proof = std::sync::Mutex::new(Reported::Unproven);
        self.update("report phase", |snap| {
            let proof = &proof;
            async move {
                let Some((slot, h, _)) = snap.mine(me) else {
                    tracing::debug!(id = %me.id, phase, "not holding a slot; phase not recorded");
                    return Ok(true);
                };
                // Held under my machine id or node name by another host (another token): its
                // slot is not mine to write (the heartbeat leaves it alone too).
                if let Fence::Lost { why } = self.fence_of(&snap, me) {
                    tracing::warn!(id = %me.id, phase, %why, "phase not recorded: {why}");
                    return Ok(true);
                }
                let lease = with_phase(&slot.lease, h, me, phase);
                let index = slot.index;
                Ok(
                    match self.replace_obj("recording the phase", &lease).await? {
                        Some(new) => {
                            self.written.set_read(index, new, snap.clone());
                            *proof.lock().unwrap_or_else(|p| p.into_inner()) = Reported::Held;
                            true
                        }
                        None => false,
                    },
                )
            }
        })
        .await?;
        Ok(proof.into_inner().unwrap_or_else(|p| p.into_inner()))
    }
}
