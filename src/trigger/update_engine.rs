//! Trigger: update_engine on the D-Bus system bus. A reboot is needed when its status is
//! `UPDATE_STATUS_UPDATED_NEED_REBOOT`, seen in the `StatusUpdate` signal or in `GetStatus`
//! (called at start and whenever update_engine appears on the bus, since the signal may have
//! fired before rebootd listened). Reconnects when the bus or update_engine restarts.

use super::{Need, Ready, TriggerSource};
use crate::backoff::Backoff;
use futures_util::StreamExt;
use std::time::Duration;
use tokio::sync::mpsc;
use tracing::{debug, info, warn};

/// The status that means "updated, reboot to apply".
pub const NEED_REBOOT: &str = "UPDATE_STATUS_UPDATED_NEED_REBOOT";

/// The statuses update_engine is known to report, other than [`NEED_REBOOT`].
const KNOWN: [&str; 9] = [
    "UPDATE_STATUS_IDLE",
    "UPDATE_STATUS_CHECKING_FOR_UPDATE",
    "UPDATE_STATUS_UPDATE_AVAILABLE",
    "UPDATE_STATUS_DOWNLOADING",
    "UPDATE_STATUS_VERIFYING",
    "UPDATE_STATUS_FINALIZING",
    "UPDATE_STATUS_REPORTING_ERROR_EVENT",
    "UPDATE_STATUS_ATTEMPTING_ROLLBACK",
    "UPDATE_STATUS_DISABLED",
];

/// First pause before reconnecting to the bus: a restarting bus or update_engine is back soon.
const MIN_BACKOFF: Duration = Duration::from_millis(500);
/// Longest pause between reconnection attempts to the bus.
const MAX_BACKOFF: Duration = Duration::from_secs(30);

#[zbus::proxy(
    interface = "com.coreos.update1.Manager",
    default_service = "com.coreos.update1",
    default_path = "/com/coreos/update1"
)]
pub trait Manager {
    /// (last_checked_time, progress, current_operation, new_version, new_size)
    fn get_status(&self) -> zbus::Result<(i64, f64, String, String, i64)>;

    #[zbus(signal)]
    fn status_update(
        &self,
        last_checked_time: i64,
        progress: f64,
        current_operation: String,
        new_version: String,
        new_size: i64,
    ) -> zbus::Result<()>;
}

/// What a status string means to rebootd.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Meaning {
    NeedReboot,
    Other,
    Unknown,
}

/// Classify an update_engine `current_operation`.
pub fn classify(operation: &str) -> Meaning {
    if operation == NEED_REBOOT {
        Meaning::NeedReboot
    } else if KNOWN.contains(&operation) {
        Meaning::Other
    } else {
        Meaning::Unknown
    }
}

/// Follow update_engine for as long as the agent listens.
pub async fn run(tx: mpsc::Sender<Need>, ready: Ready) {
    let mut backoff = Backoff::new(MIN_BACKOFF, MAX_BACKOFF);
    let mut ready = Some(ready);
    loop {
        match follow(&tx, &mut ready).await {
            Ok(()) => return,
            Err(e) => {
                // Start-up does not wait for a bus that is not there.
                if let Some(r) = ready.take() {
                    let _ = r.send(());
                }
                let pause = backoff.next_delay();
                warn!(error = %e, retry_in = ?pause, "update_engine trigger: lost the system bus; reconnecting");
                tokio::time::sleep(pause).await;
            }
        }
    }
}

/// Send a [`Need`] for a status that asks for a reboot. Returns false when the agent is gone.
async fn report(tx: &mpsc::Sender<Need>, how: &str, operation: &str, version: &str) -> bool {
    match classify(operation) {
        Meaning::NeedReboot => {
            info!(
                status = operation,
                new_version = version,
                via = how,
                "update_engine: reboot needed"
            );
            let need = Need::new(
                TriggerSource::UpdateEngine,
                format!("{operation} (new version {version})"),
            );
            tx.send(need).await.is_ok()
        }
        Meaning::Other => {
            debug!(status = operation, via = how, "update_engine status");
            true
        }
        Meaning::Unknown => {
            warn!(
                status = operation,
                via = how,
                "update_engine reported an unknown status; ignored"
            );
            true
        }
    }
}

async fn get_status(proxy: &ManagerProxy<'_>, tx: &mpsc::Sender<Need>) -> bool {
    match proxy.get_status().await {
        Ok((_, _, operation, version, _)) => report(tx, "GetStatus", &operation, &version).await,
        Err(e) => {
            info!(error = %e, "update_engine is not answering GetStatus (not running yet?); waiting for it to appear on the bus");
            true
        }
    }
}

/// One connection's worth of following. Ok(()) = the agent is gone; Err = reconnect.
async fn follow(tx: &mpsc::Sender<Need>, ready: &mut Option<Ready>) -> zbus::Result<()> {
    let conn = zbus::Connection::system().await?;
    let proxy = ManagerProxy::new(&conn).await?;
    // Subscribe before asking, so a change in between is not missed.
    let mut updates = proxy.receive_status_update().await?;
    let mut owners = proxy.inner().receive_owner_changed().await?;
    info!("update_engine trigger: listening on the system bus");
    if !get_status(&proxy, tx).await {
        return Ok(());
    }
    if let Some(r) = ready.take() {
        let _ = r.send(());
    }
    loop {
        tokio::select! {
            update = updates.next() => {
                let Some(update) = update else { break };
                match update.args() {
                    Ok(a) => if !report(tx, "StatusUpdate", &a.current_operation, &a.new_version).await {
                        return Ok(());
                    },
                    Err(e) => warn!(error = %e, "update_engine sent a StatusUpdate rebootd cannot read; ignored"),
                }
            }
            owner = owners.next() => {
                let Some(owner) = owner else { break };
                if owner.is_some() {
                    info!("update_engine appeared on the bus; asking its status");
                    if !get_status(&proxy, tx).await {
                        return Ok(());
                    }
                } else {
                    info!("update_engine left the bus; waiting for it to come back");
                }
            }
            _ = tx.closed() => return Ok(()),
        }
    }
    Err(zbus::Error::Failure(
        "the system bus connection closed".into(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_statuses() {
        assert_eq!(classify(NEED_REBOOT), Meaning::NeedReboot);
        assert_eq!(classify("UPDATE_STATUS_IDLE"), Meaning::Other);
        assert_eq!(classify("UPDATE_STATUS_DOWNLOADING"), Meaning::Other);
        assert_eq!(classify("UPDATE_STATUS_WHATEVER"), Meaning::Unknown);
        assert_eq!(classify(""), Meaning::Unknown);
        assert_eq!(
            classify("update_status_updated_need_reboot"),
            Meaning::Unknown
        );
    }
}
