//! systemd service notification: `READY=1` once started, `STATUS=` with the phase, and
//! `WATCHDOG=1` from the agent loop itself when `WATCHDOG_USEC` is set. Does nothing when not
//! started by systemd (no `NOTIFY_SOCKET`).
//!
//! The watchdog is fed by the loop, not by a task of its own: a separate task would go on
//! pinging while the loop hangs. The loop feeds it each time it comes round, and while it
//! performs an action that waits for something with no bound in time (a trigger, a window, a
//! slot, a drain, the reboot, the node's health) as long as it is polled. A call that should
//! answer at once (logind's reboot, releasing the slot, reading or patching the Node) is not
//! fed: one that hangs longer than `WatchdogSec=` gets the daemon killed and restarted by
//! systemd, and the state file makes the restart resume where it was.

use sd_notify::NotifyState;
use std::future::Future;
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

/// Whether an action may legitimately wait without a bound in time (the watchdog is fed
/// meanwhile) or is a call that must answer within `WatchdogSec=` (it is not).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Duty {
    Wait,
    Call,
}

/// The service watchdog (`WatchdogSec=`), fed by the agent loop. Without `WATCHDOG_USEC` every
/// method does nothing.
#[derive(Debug)]
pub struct Watchdog {
    period: Option<Duration>,
}

impl Watchdog {
    /// The watchdog systemd asked for, pinged at half its interval (at least every 100 ms).
    pub fn from_env() -> Watchdog {
        Watchdog {
            period: sd_notify::watchdog_enabled().map(|i| (i / 2).max(Duration::from_millis(100))),
        }
    }

    /// How often it is fed, if systemd set a watchdog.
    pub fn period(&self) -> Option<Duration> {
        self.period
    }

    /// Tell systemd the loop is alive.
    pub fn feed(&self) {
        if self.period.is_some() {
            send(&[NotifyState::Watchdog]);
        }
    }

    /// Run `work` to completion. For a [`Duty::Wait`] the watchdog is fed every period while
    /// `work` is pending (the loop is polled, so it is alive); for a [`Duty::Call`] it is not,
    /// so a call that never answers lets the watchdog fire.
    pub async fn run<F: Future>(&self, duty: Duty, work: F) -> F::Output {
        let period = match (duty, self.period) {
            (Duty::Wait, Some(p)) => p,
            _ => return work.await,
        };
        tokio::pin!(work);
        let mut ticker = tokio::time::interval(period);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                out = &mut work => return out,
                _ = ticker.tick() => self.feed(),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// WATCHDOG=1 datagrams received on `socket` so far.
    fn pings(socket: &std::os::unix::net::UnixDatagram) -> usize {
        let mut buf = [0u8; 256];
        let mut n = 0;
        while let Ok(len) = socket.recv(&mut buf) {
            n += usize::from(buf[..len].trim_ascii() == b"WATCHDOG=1");
        }
        n
    }

    #[tokio::test]
    async fn a_wait_is_fed_and_a_call_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify.sock");
        let socket = std::os::unix::net::UnixDatagram::bind(&path).unwrap();
        socket.set_nonblocking(true).unwrap();
        // The only test in this binary that sets NOTIFY_SOCKET.
        std::env::set_var("NOTIFY_SOCKET", &path);
        let watchdog = Watchdog {
            period: Some(Duration::from_millis(20)),
        };
        let work = || tokio::time::sleep(Duration::from_millis(200));
        watchdog.run(Duty::Call, work()).await;
        assert_eq!(pings(&socket), 0, "a call that takes long is not fed");
        watchdog.run(Duty::Wait, work()).await;
        assert!(pings(&socket) >= 3, "a wait is fed while it is polled");
        watchdog.feed();
        assert_eq!(pings(&socket), 1);
        std::env::remove_var("NOTIFY_SOCKET");
    }
}
