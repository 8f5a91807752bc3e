//! What `rebootctl status` shows: the local agent's state (from the state file, so it works with
//! the daemon stopped), the maintenance windows, and the semaphore as the backend reports it.

use crate::config::Config;
use crate::lock::SemaphoreStatus;
use crate::state::{Phase, State, StateStore};
use jiff::Timestamp;
use serde::Serialize;
use std::fmt::Write;

/// Everything `rebootctl status` reports. Its JSON form is a stable interface: fields are only
/// ever added.
#[derive(Debug, Clone, Serialize)]
pub struct Status {
    pub phase: Phase,
    pub since: Option<Timestamp>,
    pub reason: Option<String>,
    pub waiting_for: Option<String>,
    pub last_error: Option<String>,
    pub retry_at: Option<Timestamp>,
    /// The current boot id (None when the file cannot be read).
    pub boot_id: Option<String>,
    pub slot_held: bool,
    pub reboot_requested: bool,
    pub failed_attempts: u32,
    pub last_reboot: Option<Timestamp>,
    pub windows: String,
    pub window_open: bool,
    pub next_window: Option<Timestamp>,
    pub state_file: String,
    /// False when there is no state file yet (the daemon never ran here).
    pub state_present: bool,
    pub semaphore: Option<SemaphoreStatus>,
    pub semaphore_error: Option<String>,
}

/// Gather the local part of the status.
pub fn local(
    config: &Config,
    store: &StateStore,
    state: Option<&State>,
    boot_id: Option<String>,
    now: Timestamp,
) -> Status {
    let windows = &config.windows;
    Status {
        phase: state.map_or(Phase::Idle, |s| s.phase),
        since: state.map(|s| s.since),
        reason: state.and_then(|s| s.reason.clone()),
        waiting_for: state.and_then(|s| s.waiting_for.clone()),
        last_error: state.and_then(|s| s.last_error.clone()),
        retry_at: state.and_then(|s| s.retry_at),
        boot_id,
        slot_held: state.is_some_and(|s| s.slot_held),
        reboot_requested: store.request_path().exists(),
        failed_attempts: state.map_or(0, |s| s.failed_attempts),
        last_reboot: state.and_then(|s| s.last_reboot),
        windows: windows.describe(),
        window_open: windows.is_open(now),
        next_window: windows.next_open(now),
        state_file: store.path().display().to_string(),
        state_present: state.is_some(),
        semaphore: None,
        semaphore_error: None,
    }
}

/// "4m", "2h13m", "3d": a short age for people.
pub fn age(from: Timestamp, now: Timestamp) -> String {
    let secs = now.duration_since(from).as_secs().max(0) as u64;
    match secs {
        0..=59 => format!("{secs}s"),
        60..=3599 => format!("{}m", secs / 60),
        3600..=86399 => format!("{}h{}m", secs / 3600, (secs % 3600) / 60),
        _ => format!("{}d{}h", secs / 86400, (secs % 86400) / 3600),
    }
}

/// The human-readable form.
pub fn render(s: &Status, now: Timestamp) -> String {
    let mut out = String::new();
    let since = s
        .since
        .map(|t| format!(" for {}", age(t, now)))
        .unwrap_or_default();
    let _ = writeln!(out, "phase:        {}{since}", s.phase);
    if !s.state_present {
        let _ = writeln!(
            out,
            "              (no state file at {}: the daemon has not run here)",
            s.state_file
        );
    }
    if let Some(r) = &s.reason {
        let _ = writeln!(out, "reason:       {r}");
    }
    if s.reboot_requested {
        let _ = writeln!(out, "request:      `rebootctl reboot` pending");
    }
    if let Some(w) = &s.waiting_for {
        let _ = writeln!(out, "waiting for:  {w}");
    }
    if let Some(e) = &s.last_error {
        let _ = writeln!(out, "last error:   {e}");
    }
    if let Some(t) = s.retry_at {
        let _ = writeln!(out, "retry at:     {t}");
    }
    let window = if s.window_open {
        "open now".to_string()
    } else {
        s.next_window
            .map_or("never opens".into(), |t| format!("next opens {t}"))
    };
    let _ = writeln!(out, "windows:      {} ({window})", s.windows);
    let _ = writeln!(
        out,
        "boot id:      {}",
        s.boot_id.as_deref().unwrap_or("(unreadable)")
    );
    if let Some(t) = s.last_reboot {
        let _ = writeln!(out, "last reboot:  {t} ({} ago)", age(t, now));
    }
    let _ = writeln!(
        out,
        "slot held:    {}",
        if s.slot_held { "yes" } else { "no" }
    );
    if let Some(sem) = &s.semaphore {
        let _ = writeln!(
            out,
            "semaphore:    {} group {:?}: {} of {} slots free",
            sem.backend, sem.group, sem.free, sem.max
        );
        for h in &sem.holders {
            let node = h.node.as_deref().unwrap_or("?");
            let phase = h.phase.as_deref().unwrap_or("?");
            let held = h.since.map(|t| age(t, now)).unwrap_or_else(|| "?".into());
            let _ = writeln!(
                out,
                "  holder {:<34} node {node:<16} {phase:<20} {held}",
                h.id
            );
        }
    }
    if let Some(e) = &s.semaphore_error {
        let _ = writeln!(out, "semaphore:    unavailable: {e}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_read_well() {
        let t0 = Timestamp::from_second(0).unwrap();
        let at = |s| Timestamp::from_second(s).unwrap();
        assert_eq!(age(t0, at(42)), "42s");
        assert_eq!(age(t0, at(4 * 60 + 5)), "4m");
        assert_eq!(age(t0, at(2 * 3600 + 13 * 60)), "2h13m");
        assert_eq!(age(t0, at(3 * 86400 + 3600)), "3d1h");
        assert_eq!(age(at(10), t0), "0s");
    }
}
