//! `rebootctl fleet [--json] [--watch]`: the fleet view, read from the lock store with the
//! credentials of `rebootctl status`; `--watch` redraws at each change the store reports (a
//! watch, not a poll), at most [`REDRAW_EVERY`] apart. `rebootctl fleet forget <id|node>`
//! deletes a gone node's record ([`super::forget`]).

use super::view::FleetView;
use super::FleetStore;
use crate::config::{Config, LockBackend};
use crate::lock::LockError;
use std::time::Duration;

/// The shortest time between two redraws of `--watch` (a burst of changes is one redraw).
pub const REDRAW_EVERY: Duration = Duration::from_millis(250);
/// How long `--watch` waits before reading again after a failed read or watch.
const AFTER_ERROR: Duration = Duration::from_secs(2);

/// Why the command failed.
#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    /// The backend keeps no fleet view (FleetLock, none).
    #[error("{0}")]
    Unsupported(String),
    #[error(transparent)]
    Lock(#[from] LockError),
    #[error("cannot write the output: {0}")]
    Output(String),
    #[error(transparent)]
    Forget(#[from] super::forget::ForgetError),
}

/// The configured store's fleet side, or why there is none.
async fn open(config: &Config) -> Result<Box<dyn crate::lock::Admin>, FleetError> {
    if let LockBackend::FleetLock(s) = &config.lock.backend {
        return Err(FleetError::Unsupported(format!(
            "{} (the FleetLock server at {} owns the semaphore)",
            super::unsupported("fleetlock"),
            s.url
        )));
    }
    let admin = crate::lock::open::open_admin(config).await?;
    if admin.fleet().is_none() {
        return Err(FleetError::Unsupported(super::unsupported(
            config.lock.backend.name(),
        )));
    }
    Ok(admin)
}

/// `rebootctl fleet forget <who>`: delete that node's record; says which.
pub async fn forget(config: &Config, who: &str) -> Result<(), FleetError> {
    let admin = open(config).await?;
    let store = admin
        .fleet()
        .ok_or_else(|| FleetError::Unsupported(super::unsupported(config.lock.backend.name())))?;
    let name = super::forget::forget(store, who).await?;
    println!(
        "forgot the fleet record {} of group {}",
        crate::text::clean(&name),
        crate::text::clean(&config.identity.group)
    );
    Ok(())
}

/// Run the command: print the view once, or follow it until interrupted.
pub async fn run(config: &Config, json: bool, watch: bool) -> Result<(), FleetError> {
    let admin = open(config).await?;
    let store = admin
        .fleet()
        .ok_or_else(|| FleetError::Unsupported(super::unsupported(config.lock.backend.name())))?;
    if !watch {
        let read = store.read_fleet().await?;
        return print(&FleetView::of(&read, jiff::Timestamp::now()), json, false);
    }
    follow(store, json).await
}

/// Redraw at every change until Ctrl-C.
async fn follow(store: &dyn FleetStore, json: bool) -> Result<(), FleetError> {
    use std::io::IsTerminal;
    let clear = std::io::stdout().is_terminal() && !json;
    loop {
        let read = match store.read_fleet().await {
            Ok(r) => r,
            Err(e) => {
                eprintln!("rebootctl: {e}; reading again in {AFTER_ERROR:?}");
                tokio::select! {
                    _ = tokio::time::sleep(AFTER_ERROR) => continue,
                    _ = tokio::signal::ctrl_c() => return Ok(()),
                }
            }
        };
        print(&FleetView::of(&read, jiff::Timestamp::now()), json, clear)?;
        let drawn = tokio::time::Instant::now();
        tokio::select! {
            changed = store.fleet_changed(&read) => {
                if let Err(e) = changed {
                    eprintln!("rebootctl: {e}; reading again in {AFTER_ERROR:?}");
                    tokio::time::sleep(AFTER_ERROR).await;
                }
            }
            _ = tokio::signal::ctrl_c() => return Ok(()),
        }
        tokio::time::sleep_until(drawn + REDRAW_EVERY).await;
    }
}

fn print(view: &FleetView, json: bool, clear: bool) -> Result<(), FleetError> {
    use std::io::Write;
    let text = if json {
        // One document per line, so that `--watch --json` is a stream of them.
        let mut t = serde_json::to_string(view).map_err(|e| FleetError::Output(e.to_string()))?;
        t.push('\n');
        t
    } else {
        super::render::render(view)
    };
    let mut out = std::io::stdout().lock();
    if clear {
        let _ = write!(out, "\x1b[2J\x1b[H");
    }
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .map_err(|e| FleetError::Output(e.to_string()))
}
