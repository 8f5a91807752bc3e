//! Prometheus metrics on an optional local address (`[metrics] listen`): what the agent is
//! doing, what it waited for, and what went wrong. Served as the text exposition format by a
//! minimal HTTP/1.1 responder (`serve.rs`), since the only client is a scraper.

mod serve;
pub use serve::{serve, serve_with, Limits};

use crate::state::{Phase, State};
use jiff::Timestamp;
use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::{Arc, Mutex};

const PHASES: [Phase; 9] = [
    Phase::Idle,
    Phase::RebootNeeded,
    Phase::WaitingForWindow,
    Phase::AcquiringSlot,
    Phase::Draining,
    Phase::Rebooting,
    Phase::WaitingForHealthy,
    Phase::Uncordoning,
    Phase::Releasing,
];

/// What an error was talking to: the `service` label of `rebootd_errors_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum ErrorKind {
    /// The lock store (etcd, Kubernetes Leases, a FleetLock server).
    Lock,
    /// The Kubernetes API (drain, cordon, the Node's annotations).
    Kubernetes,
    /// systemd-logind (the reboot call).
    Logind,
}

impl ErrorKind {
    /// Every kind, in the order they are rendered.
    pub const ALL: [ErrorKind; 3] = [ErrorKind::Lock, ErrorKind::Kubernetes, ErrorKind::Logind];

    /// The label value.
    pub fn label(self) -> &'static str {
        match self {
            ErrorKind::Lock => "lock",
            ErrorKind::Kubernetes => "kubernetes",
            ErrorKind::Logind => "logind",
        }
    }
}

/// The values behind the metrics.
#[derive(Debug, Default)]
struct Values {
    phase: Option<Phase>,
    phase_since: Option<Timestamp>,
    reboot_needed: bool,
    slot_held: bool,
    paused: bool,
    group_paused: bool,
    /// Seconds spent in finished waits, by what was waited for.
    waited: BTreeMap<&'static str, f64>,
    evictions_blocked: u64,
    /// Slots found lost by a fence (before a cordon or a reboot) and backed out of.
    slots_lost: u64,
    reboots: u64,
    last_reboot: Option<Timestamp>,
    errors: BTreeMap<ErrorKind, u64>,
    /// Failed `accept`s of the metrics listener itself (e.g. out of file descriptors).
    accept_errors: u64,
}

/// Shared, cheap to clone; updated by the runtime.
#[derive(Debug, Clone, Default)]
pub struct Metrics(Arc<Mutex<Values>>);

/// What a waiting phase waits for, as the `what` label.
fn waits_for(phase: Phase) -> Option<&'static str> {
    match phase {
        Phase::WaitingForWindow => Some("window"),
        Phase::AcquiringSlot => Some("slot"),
        Phase::Draining => Some("drain"),
        Phase::WaitingForHealthy => Some("healthy"),
        _ => None,
    }
}

impl Metrics {
    fn with<R>(&self, f: impl FnOnce(&mut Values) -> R) -> R {
        // A poisoned lock only means a panic elsewhere while updating numbers: keep serving.
        let mut v = self.0.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut v)
    }

    /// Follow the agent's state.
    pub fn observe(&self, s: &State, now: Timestamp) {
        self.with(|v| {
            if v.phase != Some(s.phase) {
                if let (Some(old), Some(since)) = (v.phase, v.phase_since) {
                    if let Some(what) = waits_for(old) {
                        let secs = now.duration_since(since).as_secs_f64().max(0.0);
                        *v.waited.entry(what).or_default() += secs;
                    }
                }
                v.phase = Some(s.phase);
                v.phase_since = Some(now);
            }
            v.reboot_needed = s.reason.is_some();
            v.slot_held = s.slot_held;
            v.paused = s.paused.is_some();
            v.group_paused = s.group_paused.is_some();
            v.reboots = s.reboots;
            v.last_reboot = s.last_reboot;
        });
    }

    /// Count an error talking to something outside.
    pub fn error(&self, what: ErrorKind) {
        self.with(|v| *v.errors.entry(what).or_default() += 1);
    }

    /// Count a failed `accept` of the metrics listener.
    pub fn accept_error(&self) {
        self.with(|v| v.accept_errors += 1);
    }

    /// Count a slot found lost by a fence.
    pub fn slot_lost(&self) {
        self.with(|v| v.slots_lost += 1);
    }

    /// Count evictions a PodDisruptionBudget refused.
    pub fn evictions_blocked(&self, n: u64) {
        self.with(|v| v.evictions_blocked += n);
    }

    /// The exposition text.
    pub fn render(&self, now: Timestamp) -> String {
        self.with(|v| {
            let mut out = String::new();
            let flag = |b: bool| if b { 1 } else { 0 };
            let _ = writeln!(out, "# HELP rebootd_reboot_needed Whether this host needs a reboot.\n# TYPE rebootd_reboot_needed gauge\nrebootd_reboot_needed {}", flag(v.reboot_needed));
            let _ = writeln!(out, "# HELP rebootd_phase The agent's current phase (1 for the current one).\n# TYPE rebootd_phase gauge");
            for p in PHASES {
                let _ = writeln!(out, "rebootd_phase{{phase=\"{p}\"}} {}", flag(v.phase == Some(p)));
            }
            let _ = writeln!(out, "# HELP rebootd_slot_held Whether this node holds a slot of the semaphore.\n# TYPE rebootd_slot_held gauge\nrebootd_slot_held {}", flag(v.slot_held));
            let _ = writeln!(out, "# HELP rebootd_paused Whether an operator paused this node (rebootctl pause): it takes no slot.\n# TYPE rebootd_paused gauge\nrebootd_paused {}", flag(v.paused));
            let _ = writeln!(out, "# HELP rebootd_group_paused Whether this node waits for a slot of a group an operator paused (rebootctl pause --group).\n# TYPE rebootd_group_paused gauge\nrebootd_group_paused {}", flag(v.group_paused));
            let _ = writeln!(out, "# HELP rebootd_wait_seconds_total Time spent waiting, by what for (the current wait included).\n# TYPE rebootd_wait_seconds_total counter");
            for what in ["window", "slot", "drain", "healthy"] {
                let mut secs = v.waited.get(what).copied().unwrap_or(0.0);
                if let (Some(p), Some(since)) = (v.phase, v.phase_since) {
                    if waits_for(p) == Some(what) {
                        secs += now.duration_since(since).as_secs_f64().max(0.0);
                    }
                }
                let _ = writeln!(out, "rebootd_wait_seconds_total{{what=\"{what}\"}} {secs:.3}");
            }
            let _ = writeln!(out, "# HELP rebootd_evictions_blocked_total Evictions refused by a PodDisruptionBudget.\n# TYPE rebootd_evictions_blocked_total counter\nrebootd_evictions_blocked_total {}", v.evictions_blocked);
            let _ = writeln!(out, "# HELP rebootd_slot_lost_total Times this node found, right before cordoning or rebooting, that it no longer held its slot, and backed out.\n# TYPE rebootd_slot_lost_total counter\nrebootd_slot_lost_total {}", v.slots_lost);
            let _ = writeln!(out, "# HELP rebootd_reboots_total Coordinated reboots completed on this host.\n# TYPE rebootd_reboots_total counter\nrebootd_reboots_total {}", v.reboots);
            let last = v.last_reboot.map_or(0.0, |t| t.as_millisecond() as f64 / 1000.0);
            let _ = writeln!(out, "# HELP rebootd_last_reboot_timestamp_seconds When the last coordinated reboot was seen to complete.\n# TYPE rebootd_last_reboot_timestamp_seconds gauge\nrebootd_last_reboot_timestamp_seconds {last:.3}");
            let _ = writeln!(out, "# HELP rebootd_errors_total Errors talking to outside services, by service.\n# TYPE rebootd_errors_total counter");
            for what in ErrorKind::ALL {
                let _ = writeln!(out, "rebootd_errors_total{{service=\"{}\"}} {}", what.label(), v.errors.get(&what).copied().unwrap_or(0));
            }
            let _ = writeln!(out, "# HELP rebootd_metrics_accept_errors_total Connections the metrics listener failed to accept (e.g. out of file descriptors).\n# TYPE rebootd_metrics_accept_errors_total counter\nrebootd_metrics_accept_errors_total {}", v.accept_errors);
            out
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: i64) -> Timestamp {
        Timestamp::from_second(s).unwrap()
    }

    #[test]
    fn phases_waits_and_counters_render() {
        let m = Metrics::default();
        let mut s = State::new("b", t(0));
        m.observe(&s, t(0));
        let text = m.render(t(0));
        assert!(text.contains("rebootd_phase{phase=\"idle\"} 1"), "{text}");
        assert!(text.contains("rebootd_reboot_needed 0"));
        assert!(text.contains("rebootd_paused 0"), "{text}");
        s.paused = Some(crate::state::Pause {
            since: t(0),
            reason: None,
        });
        m.observe(&s, t(0));
        assert!(m.render(t(0)).contains("rebootd_paused 1"));
        s.paused = None;
        assert!(text.contains("rebootd_group_paused 0"), "{text}");
        s.group_paused = Some(crate::lock::GroupPause {
            since: t(0),
            reason: None,
            by: None,
        });
        m.observe(&s, t(0));
        assert!(m.render(t(0)).contains("rebootd_group_paused 1"));
        s.group_paused = None;
        s.phase = Phase::WaitingForWindow;
        s.reason = Some(crate::need::Need::new(
            crate::need::TriggerSource::Rebootctl,
            "x",
        ));
        m.observe(&s, t(10));
        s.phase = Phase::AcquiringSlot;
        m.observe(&s, t(70));
        s.slot_held = true;
        s.phase = Phase::Rebooting;
        m.observe(&s, t(75));
        m.error(ErrorKind::Lock);
        m.slot_lost();
        let text = m.render(t(80));
        assert!(text.contains("rebootd_slot_lost_total 1"), "{text}");
        assert!(
            text.contains("rebootd_phase{phase=\"rebooting\"} 1"),
            "{text}"
        );
        assert!(text.contains("rebootd_phase{phase=\"idle\"} 0"));
        assert!(text.contains("rebootd_reboot_needed 1"));
        assert!(text.contains("rebootd_slot_held 1"));
        assert!(
            text.contains("rebootd_wait_seconds_total{what=\"window\"} 60.000"),
            "{text}"
        );
        assert!(
            text.contains("rebootd_wait_seconds_total{what=\"slot\"} 5.000"),
            "{text}"
        );
        assert!(text.contains("rebootd_errors_total{service=\"lock\"} 1"));
    }
}
