//! Trigger: a file that appears (`/run/reboot-required`, or the request `rebootctl reboot`
//! writes). Watched with inotify on its directory, not polled; checked once at start.
//!
//! A file found at start that is older than the last reboot was met by it: a soft reboot keeps
//! `/run`, so Debian's `/run/reboot-required` is still there after one, and would otherwise
//! start a new cycle at once (and again after each soft reboot).

use super::{Need, Ready, TriggerSource};
use inotify::{Inotify, WatchMask};
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::sync::mpsc;
use tracing::{debug, info, warn};

/// Back-off before watching again after the directory could not be watched.
const REWATCH_DELAY: Duration = Duration::from_secs(10);

/// Watch for `path` to exist; send a [`Need`] each time it appears (and once at start if it is
/// there already and was modified after `met_before`, the last reboot).
pub async fn run(
    source: TriggerSource,
    path: PathBuf,
    tx: mpsc::Sender<Need>,
    ready: Ready,
    met_before: Option<std::time::SystemTime>,
) {
    let mut ready = Some(ready);
    let mut met_before = met_before;
    loop {
        match watch(source, &path, &tx, &mut ready, met_before.take()).await {
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

/// Whether the file at `path` was last modified before `met_before` (the last reboot), and so
/// says a need that reboot met.
fn met(source: TriggerSource, path: &Path, met_before: Option<std::time::SystemTime>) -> bool {
    let (Some(reboot), Ok(modified)) = (
        met_before,
        std::fs::metadata(path).and_then(|m| m.modified()),
    ) else {
        return false;
    };
    let older = modified < reboot;
    if older {
        info!(trigger = %source, path = %path.display(),
            "{} is older than the last reboot, which met it (a soft reboot keeps /run)", path.display());
    }
    older
}

async fn watch(
    source: TriggerSource,
    path: &Path,
    tx: &mpsc::Sender<Need>,
    ready: &mut Option<Ready>,
    met_before: Option<std::time::SystemTime>,
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
    if path.exists() && !met(source, path, met_before) && tx.send(need(source, path)).await.is_err()
    {
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, SystemTime};

    #[test]
    fn a_file_older_than_the_last_reboot_was_met_by_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("reboot-required");
        std::fs::write(&path, "").unwrap();
        let src = TriggerSource::SentinelFile;
        let hour = Duration::from_secs(3600);
        assert!(met(src, &path, Some(SystemTime::now() + hour)));
        assert!(!met(src, &path, Some(SystemTime::now() - hour)));
        assert!(!met(src, &path, None), "no reboot seen: a need");
        assert!(!met(src, &dir.path().join("gone"), Some(SystemTime::now())));
    }
}
