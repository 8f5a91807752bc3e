//! Keeping the slot's record fresh while this node holds it, so `lock.max_hold` never takes it
//! for dead: a beat beside each action, and one between actions when it came due.

use super::Runtime;
use crate::lock::Fence;
use crate::metrics::ErrorKind;
use tracing::{debug, warn};

impl Runtime {
    /// Keep the slot's record fresh while holding it, so `lock.max_hold` never takes this node
    /// for dead. Runs beside the current action; never ends. Each action runs its own copy, whose
    /// timer starts with it: while every action is shorter than a beat (a check after the boot
    /// asked again every `gates.interval`, retries every `reboot.retry_interval`) it never
    /// fires, and [`Self::beat_if_due`] makes the beat between actions. `last` is when the record
    /// was last made fresh.
    pub(super) async fn heartbeat(
        &self,
        held: bool,
        last: &std::sync::Mutex<Option<std::time::Instant>>,
    ) -> std::convert::Infallible {
        let Some(every) = self.semaphore.heartbeat_every().filter(|_| held) else {
            return std::future::pending().await;
        };
        loop {
            tokio::time::sleep(every).await;
            self.beat(last).await;
        }
    }

    /// Between two actions: make the beat when one is due (none was made for a beat's time).
    pub(super) async fn beat_if_due(
        &self,
        held: bool,
        last: &std::sync::Mutex<Option<std::time::Instant>>,
    ) {
        let now = std::time::Instant::now();
        let Some(every) = self.semaphore.heartbeat_every().filter(|_| held) else {
            *last.lock().unwrap_or_else(|p| p.into_inner()) = None;
            return;
        };
        let since = *last.lock().unwrap_or_else(|p| p.into_inner());
        match since {
            // Just took the slot: taking it wrote the record.
            None => *last.lock().unwrap_or_else(|p| p.into_inner()) = Some(now),
            Some(at) if now.duration_since(at) >= every => self.beat(last).await,
            Some(_) => {}
        }
    }

    pub(super) async fn beat(&self, last: &std::sync::Mutex<Option<std::time::Instant>>) {
        let beat = self.semaphore.heartbeat(&self.me).await;
        if beat.is_ok() {
            self.metrics.lock_answered();
        }
        match beat {
            Ok(Fence::Held) => debug!("heartbeat"),
            Ok(Fence::Lost { why }) => {
                warn!(%why, "heartbeat: this node no longer holds its slot (the next fence backs out)")
            }
            Err(e) => {
                self.metrics.error(ErrorKind::Lock);
                warn!(error = %e, "heartbeat failed; trying again at the next one")
            }
        }
        // Tried, whatever came of it: the next try a beat from now.
        *last.lock().unwrap_or_else(|p| p.into_inner()) = Some(std::time::Instant::now());
    }
}
