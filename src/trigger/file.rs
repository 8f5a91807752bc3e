//! Trigger: a file that appears (`/run/reboot-required`, or the request `rebootctl reboot`
//! writes). Watched with inotify on its directory, not polled; checked once at start.

use super::{Need, Ready, TriggerSource};
use inotify::{Inotify, WatchMask};
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::sync::mpsc;
use tracing::{debug, info, warn};

/// Back-off before watching again after the directory could not be watched.
const REWATCH_DELAY: Duration = Duration::from_secs(10);

/// Watch for `path` to exist; send a [`Need`] each time it appears (and once at start if it is
/// there already).
pub async fn run(source: TriggerSource, path: PathBuf, tx: mpsc::Sender<Need>, ready: Ready) {
    let mut ready = Some(ready);
    loop {
        match watch(source, &path, &tx, &mut ready).await {
            Ok(()) => return, // the agent is gone
            Err(e) => {
                warn!(trigger = %source, path = %path.display(), error = %e,
                    "cannot watch the sentinel file; trying again in {REWATCH_DELAY:?}");
                if let Some(r) = ready.take() {
                    let _ = r.send(());
                }
                tokio::time::sleep(REWATCH_DELAY).await;
            }
        }
    }
}

fn need(source: TriggerSource, path: &Path) -> Need {
    Need::new(source, format!("{} exists", path.display()))
}

async fn watch(
    source: TriggerSource,
    path: &Path,
    tx: &mpsc::Sender<Need>,
    ready: &mut Option<Ready>,
) -> std::io::Result<()> {
    use futures_util::StreamExt;
    let dir = path.parent().unwrap_or(Path::new("/"));
    let name = path.file_name().map(|n| n.to_os_string());
    let inotify = Inotify::init()?;
    // Watch before the first look, so a file created in between is not missed.
    inotify.watches().add(
        dir,
        WatchMask::CREATE | WatchMask::MOVED_TO | WatchMask::CLOSE_WRITE,
    )?;
    let mut events = inotify.into_event_stream(vec![0u8; 4096])?;
    info!(trigger = %source, path = %path.display(), "watching for the sentinel file");
    if path.exists() && tx.send(need(source, path)).await.is_err() {
        return Ok(());
    }
    if let Some(r) = ready.take() {
        let _ = r.send(());
    }
    while let Some(event) = events.next().await {
        let event = event?;
        if event.name.as_deref() == name.as_deref() && path.exists() {
            debug!(trigger = %source, path = %path.display(), "sentinel file appeared");
            if tx.send(need(source, path)).await.is_err() {
                return Ok(());
            }
        }
    }
    Err(std::io::Error::other("inotify stream ended"))
}
