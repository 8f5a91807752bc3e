//! systemd service notification: `READY=1` once started, `STATUS=` with the phase, and
//! `WATCHDOG=1` at half the watchdog interval when `WATCHDOG_USEC` is set. Does nothing when
//! not started by systemd (no `NOTIFY_SOCKET`).

use sd_notify::NotifyState;
use std::time::Duration;
use tracing::debug;

fn send(states: &[NotifyState<'_>]) {
    if let Err(e) = sd_notify::notify(states) {
        debug!(error = %e, "sd_notify failed");
    }
}

/// Tell systemd start-up is complete.
pub fn ready(status: &str) {
    send(&[NotifyState::Ready, NotifyState::Status(status)]);
}

/// Update the one-line status `systemctl status` shows.
pub fn status(status: &str) {
    send(&[NotifyState::Status(status)]);
}

/// Tell systemd the service is stopping.
pub fn stopping() {
    send(&[NotifyState::Stopping]);
}

/// If the unit has a watchdog, ping it at half its interval for as long as the runtime runs.
pub fn spawn_watchdog() -> Option<tokio::task::JoinHandle<()>> {
    let interval = sd_notify::watchdog_enabled()?;
    let period = (interval / 2).max(Duration::from_millis(100));
    Some(tokio::spawn(async move {
        let mut ticker = tokio::time::interval(period);
        loop {
            ticker.tick().await;
            send(&[NotifyState::Watchdog]);
        }
    }))
}
