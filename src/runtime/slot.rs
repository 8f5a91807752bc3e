//! The slot, as the executor deals with it: waiting for one (unless the group is paused, and no
//! longer than the window is open), waiting for the group's resume, the proof right before an
//! action that it is still held, and giving it back.

use super::Runtime;
use crate::agent::Event;
use crate::lock::{self, Fence};
use crate::metrics::ErrorKind;
use crate::state::Phase;
use jiff::Timestamp;
use std::time::Duration;
use tracing::{debug, error, info};

use super::executor::sleep_until;

/// How old a proof of the slot (the take, or a phase report that wrote) may be to serve as the
/// fence before the cordon or the logind call (see [`Runtime::fence`]). A fence is a proof of
/// the moment it was made; the steps between the proof and the action (the checks before the
/// reboot, recording the cordon) are quick unless a gate is slow, and then the fence is sent.
const REPORT_PROOF_FRESH: Duration = Duration::from_secs(1);

impl Runtime {
    /// Wait for `rebootctl resume --group`, or for the window to close meanwhile.
    pub(super) async fn wait_for_group_resume(&self, known: &lock::GroupPause) -> Event {
        let group = &self.config.identity.group;
        info!(%group, "group {group} paused ({}): waiting for `rebootctl resume --group`", known.describe());
        let changed = async {
            let changed = self.semaphore.group_pause_changed(Some(known)).await;
            if changed.is_ok() {
                self.metrics.lock_answered();
            }
            match changed {
                Ok(None) => Event::GroupResumed,
                Ok(Some(pause)) => Event::GroupPaused { pause },
                Err(e) => {
                    self.metrics.error(ErrorKind::Lock);
                    Event::Transient {
                        error: format!("cannot follow the group's pause: {e}"),
                    }
                }
            }
        };
        tokio::select! {
            event = changed => event,
            event = self.window_closes() => event,
        }
    }

    /// Wait for a slot unless the group is paused (`rebootctl pause --group`): a pause seen
    /// before or during the wait ends it (the queue entry goes, see `lock::acquire::Waiting`)
    /// and the node waits for the resume instead; holders are not asked.
    pub(super) async fn acquire_unless_paused(&self) -> Event {
        let (backend, group) = (self.semaphore.backend(), &self.config.identity.group);
        info!(%backend, %group, "waiting for a reboot slot ({backend} semaphore, group {group})");
        // The take writes the phase that follows it, and proves the slot held as a report
        // that wrote would: the fence right after it need not be sent.
        let first = crate::agent::after_slot(&self.policy);
        match self.semaphore.acquire_unless_paused(&self.me, first).await {
            Ok(lock::Acquired::Held) => {
                *self.reported_held.lock().unwrap_or_else(|p| p.into_inner()) =
                    Some((first, std::time::Instant::now()));
                Event::SlotAcquired
            }
            Ok(lock::Acquired::Paused(pause)) => {
                info!("the group was paused ({}) before or while waiting for a slot; leaving the queue", pause.describe());
                Event::GroupPaused { pause }
            }
            Err(e) => Event::Transient {
                error: e.to_string(),
            },
        }
    }

    /// Wait for a slot, but no longer than the maintenance window is open: when it closes
    /// first, the wait is dropped (leaving the queue behind nothing, see
    /// `lock::acquire::Waiting`) and the agent waits for the next opening.
    pub(super) async fn acquire_within_window(&self) -> Event {
        let windows = &self.config.windows;
        let Some(closes) = windows.close_of_current(Timestamp::now()) else {
            return self.acquire_unless_paused().await;
        };
        tokio::select! {
            event = self.acquire_unless_paused() => event,
            _ = sleep_until(closes) => {
                let next_open = windows.next_open(Timestamp::now());
                let next = next_open.map_or("never".to_string(), |t| t.to_string());
                info!(%closes, "the maintenance window closed at {closes} while waiting for a slot; leaving the queue (next opens {next})");
                Event::WindowClosed { next_open }
            }
        }
    }

    pub(super) async fn release_slot(&self) -> Event {
        match self.semaphore.release(&self.me).await {
            Ok(()) => {
                self.metrics.lock_answered();
                Event::Released
            }
            Err(e) => {
                self.metrics.error(ErrorKind::Lock);
                Event::Transient {
                    error: e.to_string(),
                }
            }
        }
    }

    /// Prove right before `what` that this node still holds its slot: `None` when it does, else
    /// the event that backs out ([`Event::SlotLost`]) or retries (the store could not tell).
    ///
    /// Where `lock.max_hold` reclaims silent holders, the proof is a write of the holder's
    /// record (a heartbeat), not a read. A read proves the slot held now; a waiter that judged
    /// this node stopped (say, after it was cut off from the store) may still take it over a
    /// moment later, while the reboot asked for is on its way. A write lands either before that
    /// takeover, which then fails (every store's reclaim compares the record it judged silent),
    /// or after it, and then says the slot is lost. And it gives every waiter a fresh
    /// `max_hold` to count before it may judge this node stopped again.
    ///
    /// The report of the phase `phase` may be that proof already: a write guarded as the
    /// heartbeat is ([`lock::Reported::Held`]), made less than [`REPORT_PROOF_FRESH`] ago (and
    /// less than a beat ago). Then nothing is sent again: before the logind call the proof is the
    /// report of `rebooting`, a step earlier, unless the checks before the reboot took longer.
    pub(super) async fn fence(&self, what: &str, phase: Phase) -> Option<Event> {
        let reported = self
            .reported_held
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some((in_phase, at)) = reported {
            let fresh = self
                .semaphore
                .heartbeat_every()
                .map_or(REPORT_PROOF_FRESH, |every| every.min(REPORT_PROOF_FRESH));
            if in_phase == phase && at.elapsed() < fresh {
                debug!(
                    before = what,
                    "the report of phase {phase} proves the slot held"
                );
                return None;
            }
        }
        let proof = if self.semaphore.heartbeat_every().is_some() {
            self.semaphore.heartbeat(&self.me).await
        } else {
            self.semaphore.fence(&self.me).await
        };
        if proof.is_ok() {
            self.metrics.lock_answered();
        }
        match proof {
            Ok(Fence::Held) => {
                debug!(before = what, "the store proves the slot held");
                None
            }
            Ok(Fence::Lost { why }) => {
                error!(before = what, %why, "this node no longer holds its slot; backing out");
                self.metrics.slot_lost();
                Some(Event::SlotLost { why })
            }
            Err(e) => {
                self.metrics.error(ErrorKind::Lock);
                Some(Event::Transient {
                    error: format!("cannot prove the slot is still held before {what}: {e}"),
                })
            }
        }
    }
}
