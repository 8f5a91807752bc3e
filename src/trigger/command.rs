//! Trigger: a command run at an interval; exit status 0 means a reboot is needed (as kured's
//! sentinel command).

use super::{Need, Ready, TriggerSource};
use std::time::Duration;
use tokio::sync::mpsc;
use tracing::{debug, warn};

/// Run `cmd` every `interval`; send a [`Need`] each time it exits 0.
pub async fn run(cmd: Vec<String>, interval: Duration, tx: mpsc::Sender<Need>, ready: Ready) {
    // The command is run from the first tick on; nothing to subscribe to.
    let _ = ready.send(());
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        // A command that hangs must not stop later checks: give it one interval at most.
        let child = tokio::process::Command::new(&cmd[0])
            .args(&cmd[1..])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .kill_on_drop(true)
            .status();
        match tokio::time::timeout(interval, child).await {
            Ok(Ok(status)) if status.success() => {
                let need = Need::new(TriggerSource::SentinelCommand, format!("{cmd:?} exited 0"));
                if tx.send(need).await.is_err() {
                    return;
                }
            }
            Ok(Ok(status)) => debug!(command = ?cmd, %status, "sentinel command: no reboot needed"),
            Ok(Err(e)) => warn!(command = ?cmd, error = %e, "cannot run the sentinel command"),
            Err(_) => {
                warn!(command = ?cmd, timeout = ?interval, "sentinel command timed out; killed")
            }
        }
    }
}
