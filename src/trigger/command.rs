//! Trigger: a command run at an interval; exit status 0 means a reboot is needed (as kured's
//! sentinel command).

use super::{Need, Ready, TriggerSource};
use std::time::Duration;
use tokio::sync::mpsc;
use tracing::{debug, info, warn};

/// Run `cmd` every `interval`; send a [`Need`] each time it exits 0.
pub async fn run(cmd: Vec<String>, interval: Duration, tx: mpsc::Sender<Need>, ready: Ready) {
    // The command is run from the first tick on; nothing to subscribe to.
    let _ = ready.send(());
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        // A command that hangs must not stop later checks: give it one interval at most.
        let ran = crate::child::run(&cmd, interval).await;
        if let Ok(out) = &ran {
            log_stderr(out);
        }
        match ran {
            Ok(out) if out.status.success() => {
                let need = Need::new(TriggerSource::SentinelCommand, format!("{cmd:?} exited 0"));
                if tx.send(need).await.is_err() {
                    return;
                }
            }
            Ok(out) => debug!(
                command = ?cmd, status = %out.status, stderr = %out.first_stderr_line(),
                "sentinel command: no reboot needed"
            ),
            Err(e) => warn!(command = ?cmd, error = %e, "sentinel command: {e}"),
        }
    }
}

/// The most lines of a sentinel command's stderr logged after one run.
const STDERR_LINES: usize = 50;

/// What the command wrote on stderr, a line each in the journal (bounded and escaped), as it
/// reached the journal when the command shared rebootd's stderr.
fn log_stderr(out: &crate::child::Output) {
    let text = String::from_utf8_lossy(&out.stderr);
    for line in text.lines().take(STDERR_LINES) {
        // The line alone: the command is in the configuration and in `rebootctl status`.
        info!("sentinel command: {}", crate::text::clean(line));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::child::testing::{ended, with_grandchild};

    #[tokio::test]
    async fn a_command_that_runs_past_its_interval_is_killed_with_what_it_started() {
        let dir = tempfile::tempdir().unwrap();
        // The command writes its grandchild's pid into a FIFO: reading it waits for the write.
        let fifo = dir.path().join("pid");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(made.success());
        let (tx, mut rx) = mpsc::channel(1);
        let (ready, _) = tokio::sync::oneshot::channel();
        let interval = Duration::from_secs(2);
        let cmd = with_grandchild("exec sleep 300", &fifo);
        let trigger = tokio::spawn(run(cmd, interval, tx, ready));
        let read = fifo.clone();
        let pid = tokio::task::spawn_blocking(move || std::fs::read_to_string(read))
            .await
            .unwrap()
            .unwrap();
        let pid: i32 = pid.trim().parse().unwrap();
        // Killed at the end of its interval, the grandchild too.
        assert!(
            ended(pid, Duration::from_secs(20)).await,
            "the grandchild lives"
        );
        assert!(
            rx.try_recv().is_err(),
            "a killed command said a reboot is needed"
        );
        trigger.abort();
    }
}
