//! Prometheus metrics on an optional local address (`[metrics] listen`): what the agent is
//! doing, what it waited for, and what went wrong. The values live here; each scrape encodes
//! them with `prometheus-client` as the Prometheus text format (0.0.4), served by `serve.rs`.

mod serve;
mod waiting;
pub use serve::{serve, serve_with, Limits};
pub use waiting::{waiting, Waiting};

use crate::state::{Phase, State};
use jiff::Timestamp;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{prometheus_text, DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// The `Content-Type` of [`Metrics::render`]'s text.
pub const CONTENT_TYPE: &str = prometheus_text::CONTENT_TYPE;

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
    /// When the current phase was entered, as the state says (it survives restarts).
    entered: Option<Timestamp>,
    /// Why the node waits, if it needs a reboot and waits.
    waiting: Option<Waiting>,
    /// When logind was last asked for the reboot under way, as the state said.
    reboot_requested: Option<Timestamp>,
    /// From the logind call to the new boot, for the last reboot seen by this process.
    last_reboot_duration: Option<f64>,
    /// Drains that failed.
    drain_failures: u64,
    /// Lock store calls that failed since the last one that got an answer.
    lock_errors_in_a_row: u64,
    /// When the slot held was taken, as the state says.
    slot_since: Option<Timestamp>,
    /// The longest a hold takes by the settings, in seconds.
    expected_hold: f64,
    /// This node's name and group, for `rebootd_info` (dashboards join on it).
    identity: Option<(String, String)>,
}

/// A label value from the configuration, kept to the characters node and group names use.
fn label_value(s: &str) -> String {
    s.chars()
        .take(253)
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | ':') {
                c
            } else {
                '_'
            }
        })
        .collect()
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
            if s.last_reboot != v.last_reboot {
                if let (Some(done), Some(asked)) = (s.last_reboot, v.reboot_requested) {
                    if done >= asked {
                        v.last_reboot_duration = Some(done.duration_since(asked).as_secs_f64());
                        v.reboot_requested = None;
                    }
                }
            }
            if let Some(r) = &s.reboot {
                v.reboot_requested = Some(r.requested_at);
            }
            v.entered = Some(s.since);
            v.slot_since = s.slot_since;
            v.waiting = waiting(s, now);
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
        self.with(|v| {
            *v.errors.entry(what).or_default() += 1;
            if what == ErrorKind::Lock {
                v.lock_errors_in_a_row += 1;
            }
        });
    }

    /// The lock store answered a call (whatever it said): it is reachable.
    pub fn lock_answered(&self) {
        self.with(|v| v.lock_errors_in_a_row = 0);
    }

    /// The longest a slot is held by the settings (`runtime::expected_hold`).
    pub fn expect_hold(&self, d: std::time::Duration) {
        self.with(|v| v.expected_hold = d.as_secs_f64());
    }

    /// Name this node and its group in `rebootd_info`.
    pub fn identify(&self, node: &str, group: &str) {
        self.with(|v| v.identity = Some((label_value(node), label_value(group))));
    }

    /// Count a drain that failed.
    pub fn drain_failed(&self) {
        self.with(|v| v.drain_failures += 1);
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

    /// The exposition text (Prometheus text format 0.0.4, [`CONTENT_TYPE`]).
    pub fn render(&self, now: Timestamp) -> String {
        let snapshot = self.with(|v| Snapshot::of(v, now));
        let mut registry = Registry::default();
        registry.register_collector(Box::new(snapshot));
        let mut out = String::new();
        // Writing to a String cannot fail; an encoder error would leave what was written.
        if let Err(e) = prometheus_text::encode(&mut out, &registry) {
            tracing::debug!(error = %e, "metrics: encoding stopped early");
        }
        out
    }
}

/// The values at one scrape, with the waits under way counted up to its time.
#[derive(Debug)]
struct Snapshot {
    phase: Option<Phase>,
    reboot_needed: bool,
    slot_held: bool,
    paused: bool,
    group_paused: bool,
    waited: [(&'static str, f64); 4],
    evictions_blocked: u64,
    slots_lost: u64,
    reboots: u64,
    last_reboot: f64,
    errors: [(ErrorKind, u64); 3],
    accept_errors: u64,
    entered: f64,
    waiting: Option<Waiting>,
    last_reboot_duration: f64,
    drain_failures: u64,
    lock_errors_in_a_row: u64,
    slot_since: f64,
    expected_hold: f64,
    identity: Option<(String, String)>,
}

/// Unix time in seconds, 0 for none (as `rebootd_last_reboot_timestamp_seconds`).
fn unix(t: Option<Timestamp>) -> f64 {
    t.map_or(0.0, |t| t.as_millisecond() as f64 / 1000.0)
}

impl Snapshot {
    fn of(v: &Values, now: Timestamp) -> Snapshot {
        let waited = ["window", "slot", "drain", "healthy"].map(|what| {
            let mut secs = v.waited.get(what).copied().unwrap_or(0.0);
            if let (Some(p), Some(since)) = (v.phase, v.phase_since) {
                if waits_for(p) == Some(what) {
                    secs += now.duration_since(since).as_secs_f64().max(0.0);
                }
            }
            (what, secs)
        });
        Snapshot {
            phase: v.phase,
            reboot_needed: v.reboot_needed,
            slot_held: v.slot_held,
            paused: v.paused,
            group_paused: v.group_paused,
            waited,
            evictions_blocked: v.evictions_blocked,
            slots_lost: v.slots_lost,
            reboots: v.reboots,
            last_reboot: unix(v.last_reboot),
            errors: ErrorKind::ALL.map(|k| (k, v.errors.get(&k).copied().unwrap_or(0))),
            accept_errors: v.accept_errors,
            entered: unix(v.entered),
            waiting: v.waiting,
            last_reboot_duration: v.last_reboot_duration.unwrap_or(0.0),
            drain_failures: v.drain_failures,
            lock_errors_in_a_row: v.lock_errors_in_a_row,
            slot_since: unix(v.slot_since),
            expected_hold: v.expected_hold,
            identity: v.identity.clone(),
        }
    }
}

/// A gauge of 0 or 1.
fn flag(b: bool) -> ConstGauge {
    ConstGauge::new(i64::from(b))
}

/// One metric without labels. A counter's name is given without `_total`: the encoder adds it.
fn single(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    metric: impl EncodeMetric,
) -> Result<(), std::fmt::Error> {
    metric.encode(encoder.encode_descriptor(name, help, None, metric.metric_type())?)
}

/// One metric with a label, a sample per `(value, metric)`.
fn family<M: EncodeMetric>(
    encoder: &mut DescriptorEncoder<'_>,
    (name, help, label): (&str, &str, &str),
    samples: impl IntoIterator<Item = (&'static str, M)>,
) -> Result<(), std::fmt::Error> {
    let mut samples = samples.into_iter().peekable();
    let Some((_, first)) = samples.peek() else {
        return Ok(());
    };
    let mut family = encoder.encode_descriptor(name, help, None, first.metric_type())?;
    for (value, metric) in samples {
        metric.encode(family.encode_family(&[(label, value)])?)?;
    }
    Ok(())
}

impl Collector for Snapshot {
    fn encode(&self, mut e: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        self.encode_state(&mut e)?;
        self.encode_progress(&mut e)
    }
}

impl Snapshot {
    /// The agent's state and counters.
    fn encode_state(&self, e: &mut DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        single(
            e,
            "rebootd_reboot_needed",
            "Whether this host needs a reboot.",
            flag(self.reboot_needed),
        )?;
        family(
            e,
            (
                "rebootd_phase",
                "The agent's current phase (1 for the current one).",
                "phase",
            ),
            PHASES.map(|p| (p.as_str(), flag(self.phase == Some(p)))),
        )?;
        single(
            e,
            "rebootd_slot_held",
            "Whether this node holds a slot of the semaphore.",
            flag(self.slot_held),
        )?;
        single(
            e,
            "rebootd_paused",
            "Whether an operator paused this node (rebootctl pause): it takes no slot.",
            flag(self.paused),
        )?;
        single(e, "rebootd_group_paused", "Whether this node waits for a slot of a group an operator paused (rebootctl pause --group).", flag(self.group_paused))?;
        family(
            e,
            (
                "rebootd_wait_seconds",
                "Time spent waiting, by what for (the current wait included).",
                "what",
            ),
            self.waited
                .map(|(what, secs)| (what, ConstCounter::new(secs))),
        )?;
        single(
            e,
            "rebootd_evictions_blocked",
            "Evictions refused by a PodDisruptionBudget.",
            ConstCounter::new(self.evictions_blocked),
        )?;
        single(e, "rebootd_slot_lost", "Times this node found, right before cordoning or rebooting, that it no longer held its slot, and backed out.", ConstCounter::new(self.slots_lost))?;
        single(
            e,
            "rebootd_reboots",
            "Coordinated reboots completed on this host.",
            ConstCounter::new(self.reboots),
        )?;
        single(
            e,
            "rebootd_last_reboot_timestamp_seconds",
            "When the last coordinated reboot was seen to complete.",
            ConstGauge::new(self.last_reboot),
        )?;
        family(
            e,
            (
                "rebootd_errors",
                "Errors talking to outside services, by service.",
                "service",
            ),
            self.errors.map(|(k, n)| (k.label(), ConstCounter::new(n))),
        )?;
        single(
            e,
            "rebootd_metrics_accept_errors",
            "Connections the metrics listener failed to accept (e.g. out of file descriptors).",
            ConstCounter::new(self.accept_errors),
        )
    }

    /// What a fleet's dashboard and alerts follow: time in phase, why a node waits, reboot
    /// durations, drain failures, the lock store's reachability.
    fn encode_progress(&self, e: &mut DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        if let Some((node, group)) = &self.identity {
            let info = ConstGauge::new(1i64);
            let mut family = e.encode_descriptor(
                "rebootd_info",
                "This agent: its node, group and rebootd version (always 1; join on instance).",
                None,
                info.metric_type(),
            )?;
            let labels: &[(&str, &str)] = &[
                ("node", node),
                ("group", group),
                ("version", env!("CARGO_PKG_VERSION")),
            ];
            info.encode(family.encode_family(&labels)?)?;
        }
        single(
            e,
            "rebootd_phase_since_timestamp_seconds",
            "When the current phase was entered (Unix time; kept across restarts and reboots).",
            ConstGauge::new(self.entered),
        )?;
        family(
            e,
            (
                "rebootd_waiting",
                "Why this node, which needs a reboot, waits (1 for the reason now; all 0 when it needs none or is at work on it).",
                "reason",
            ),
            Waiting::ALL.map(|w| (w.label(), flag(self.waiting == Some(w)))),
        )?;
        single(
            e,
            "rebootd_reboot_blocked",
            "Whether a gate, a block inhibitor or blocking pods hold back the reboot this node needs.",
            flag(self.waiting.is_some_and(Waiting::blocks)),
        )?;
        single(
            e,
            "rebootd_slot_held_since_timestamp_seconds",
            "When this node took the slot it holds (Unix time; 0 when it holds none).",
            ConstGauge::new(self.slot_since),
        )?;
        single(
            e,
            "rebootd_slot_expected_seconds",
            "The longest a slot is held when every step takes as long as the settings allow (drain, users' warning, reboot, boot, Ready, settle).",
            ConstGauge::new(self.expected_hold),
        )?;
        single(
            e,
            "rebootd_last_reboot_duration_seconds",
            "From the logind call to the new boot, for the last reboot this process saw complete (0 until then).",
            ConstGauge::new(self.last_reboot_duration),
        )?;
        single(
            e,
            "rebootd_drain_failures",
            "Drains that failed (timed out, refused, or the API failed).",
            ConstCounter::new(self.drain_failures),
        )?;
        single(
            e,
            "rebootd_lock_errors_in_a_row",
            "Calls to the lock store that failed since the last one it answered (0: reachable).",
            ConstGauge::new(self.lock_errors_in_a_row as i64),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: i64) -> Timestamp {
        Timestamp::from_second(s).unwrap()
    }

    /// The value of one series, e.g. `value(text, "rebootd_reboots_total")`.
    fn value(text: &str, series: &str) -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
            .unwrap_or_else(|| panic!("no {series} in {text}"))
            .parse()
            .unwrap()
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
        assert_eq!(
            value(&text, "rebootd_wait_seconds_total{what=\"window\"}"),
            60.0
        );
        assert_eq!(
            value(&text, "rebootd_wait_seconds_total{what=\"slot\"}"),
            5.0
        );
        assert!(text.contains("rebootd_errors_total{service=\"lock\"} 1"));
    }

    /// Names, HELP and TYPE lines as dashboards and alerts know them (counters end in
    /// `_total` on every line, as in the 0.0.4 format).
    #[test]
    fn the_exposition_keeps_its_names_help_and_types() {
        let m = Metrics::default();
        m.error(ErrorKind::Kubernetes);
        assert_eq!(m.render(t(0)), GOLDEN);
    }

    #[test]
    fn the_last_reboot_is_a_unix_time_in_seconds() {
        let m = Metrics::default();
        let mut s = State::new("b", t(0));
        s.last_reboot = Some(Timestamp::from_millisecond(1_764_259_200_250).unwrap());
        m.observe(&s, t(0));
        let text = m.render(t(0));
        assert_eq!(
            value(&text, "rebootd_last_reboot_timestamp_seconds"),
            1_764_259_200.25
        );
    }

    /// The fleet's view of one node: time in phase (from the state), why it waits, whether
    /// that blocks, the reboot's duration across the restart it causes, drain failures and the
    /// lock store's reachability.
    #[test]
    fn progress_waits_durations_and_reachability() {
        use crate::state::RebootRequest;
        let m = Metrics::default();
        let mut s = State::new("b", t(0));
        s.reason = Some(crate::need::Need::new(
            crate::need::TriggerSource::Rebootctl,
            "x",
        ));
        s.phase = Phase::AcquiringSlot;
        s.since = t(40);
        m.observe(&s, t(50));
        let text = m.render(t(50));
        assert_eq!(value(&text, "rebootd_phase_since_timestamp_seconds"), 40.0);
        assert_eq!(value(&text, "rebootd_waiting{reason=\"slot\"}"), 1.0);
        assert_eq!(value(&text, "rebootd_waiting{reason=\"gate\"}"), 0.0);
        assert_eq!(value(&text, "rebootd_reboot_blocked"), 0.0);
        s.gate = Some(crate::state::GateWait {
            name: "alerts".into(),
            why: "firing".into(),
            since: t(50),
            next_check: t(80),
        });
        m.observe(&s, t(55));
        let text = m.render(t(55));
        assert_eq!(value(&text, "rebootd_waiting{reason=\"gate\"}"), 1.0);
        assert_eq!(value(&text, "rebootd_waiting{reason=\"slot\"}"), 0.0);
        assert_eq!(value(&text, "rebootd_reboot_blocked"), 1.0);

        // A new process after the reboot: the state loaded says when logind was asked, the
        // next says the boot was seen.
        let after = Metrics::default();
        let mut loaded = s.clone();
        loaded.gate = None;
        loaded.phase = Phase::Rebooting;
        loaded.last_reboot = Some(t(10));
        loaded.reboot = Some(RebootRequest {
            requested_at: t(100),
            boot_id: "b".into(),
            called: true,
            kind: Default::default(),
            soft_reboots: None,
        });
        after.observe(&loaded, t(200));
        assert_eq!(
            value(
                &after.render(t(200)),
                "rebootd_last_reboot_duration_seconds"
            ),
            0.0,
            "the previous reboot's time is not this one's end"
        );
        let mut back = loaded.clone();
        back.reboot = None;
        back.phase = Phase::WaitingForHealthy;
        back.last_reboot = Some(t(190));
        after.observe(&back, t(200));
        let text = after.render(t(200));
        assert_eq!(value(&text, "rebootd_last_reboot_duration_seconds"), 90.0);
        assert_eq!(
            value(&text, "rebootd_waiting{reason=\"gate\"}"),
            0.0,
            "{text}"
        );

        let mut holding = back.clone();
        holding.slot_held = true;
        holding.slot_since = Some(t(90));
        after.observe(&holding, t(200));
        after.expect_hold(std::time::Duration::from_secs(2700));
        let text = after.render(t(200));
        assert_eq!(
            value(&text, "rebootd_slot_held_since_timestamp_seconds"),
            90.0
        );
        assert_eq!(value(&text, "rebootd_slot_expected_seconds"), 2700.0);

        after.identify("worker-1", "db \"zone\"");
        let text = after.render(t(200));
        assert!(
            text.contains(&format!(
                "rebootd_info{{node=\"worker-1\",group=\"db__zone_\",version=\"{}\"}} 1",
                env!("CARGO_PKG_VERSION")
            )),
            "{text}"
        );

        after.drain_failed();
        after.error(ErrorKind::Lock);
        after.error(ErrorKind::Lock);
        after.error(ErrorKind::Kubernetes);
        let text = after.render(t(200));
        assert_eq!(value(&text, "rebootd_drain_failures_total"), 1.0);
        assert_eq!(value(&text, "rebootd_lock_errors_in_a_row"), 2.0);
        after.lock_answered();
        assert_eq!(
            value(&after.render(t(200)), "rebootd_lock_errors_in_a_row"),
            0.0
        );
    }

    const GOLDEN: &str = r#"# HELP rebootd_reboot_needed Whether this host needs a reboot.
# TYPE rebootd_reboot_needed gauge
rebootd_reboot_needed 0
# HELP rebootd_phase The agent's current phase (1 for the current one).
# TYPE rebootd_phase gauge
rebootd_phase{phase="idle"} 0
rebootd_phase{phase="reboot_needed"} 0
rebootd_phase{phase="waiting_for_window"} 0
rebootd_phase{phase="acquiring_slot"} 0
rebootd_phase{phase="draining"} 0
rebootd_phase{phase="rebooting"} 0
rebootd_phase{phase="waiting_for_healthy"} 0
rebootd_phase{phase="uncordoning"} 0
rebootd_phase{phase="releasing"} 0
# HELP rebootd_slot_held Whether this node holds a slot of the semaphore.
# TYPE rebootd_slot_held gauge
rebootd_slot_held 0
# HELP rebootd_paused Whether an operator paused this node (rebootctl pause): it takes no slot.
# TYPE rebootd_paused gauge
rebootd_paused 0
# HELP rebootd_group_paused Whether this node waits for a slot of a group an operator paused (rebootctl pause --group).
# TYPE rebootd_group_paused gauge
rebootd_group_paused 0
# HELP rebootd_wait_seconds_total Time spent waiting, by what for (the current wait included).
# TYPE rebootd_wait_seconds_total counter
rebootd_wait_seconds_total{what="window"} 0.0
rebootd_wait_seconds_total{what="slot"} 0.0
rebootd_wait_seconds_total{what="drain"} 0.0
rebootd_wait_seconds_total{what="healthy"} 0.0
# HELP rebootd_evictions_blocked_total Evictions refused by a PodDisruptionBudget.
# TYPE rebootd_evictions_blocked_total counter
rebootd_evictions_blocked_total 0
# HELP rebootd_slot_lost_total Times this node found, right before cordoning or rebooting, that it no longer held its slot, and backed out.
# TYPE rebootd_slot_lost_total counter
rebootd_slot_lost_total 0
# HELP rebootd_reboots_total Coordinated reboots completed on this host.
# TYPE rebootd_reboots_total counter
rebootd_reboots_total 0
# HELP rebootd_last_reboot_timestamp_seconds When the last coordinated reboot was seen to complete.
# TYPE rebootd_last_reboot_timestamp_seconds gauge
rebootd_last_reboot_timestamp_seconds 0.0
# HELP rebootd_errors_total Errors talking to outside services, by service.
# TYPE rebootd_errors_total counter
rebootd_errors_total{service="lock"} 0
rebootd_errors_total{service="kubernetes"} 1
rebootd_errors_total{service="logind"} 0
# HELP rebootd_metrics_accept_errors_total Connections the metrics listener failed to accept (e.g. out of file descriptors).
# TYPE rebootd_metrics_accept_errors_total counter
rebootd_metrics_accept_errors_total 0
# HELP rebootd_phase_since_timestamp_seconds When the current phase was entered (Unix time; kept across restarts and reboots).
# TYPE rebootd_phase_since_timestamp_seconds gauge
rebootd_phase_since_timestamp_seconds 0.0
# HELP rebootd_waiting Why this node, which needs a reboot, waits (1 for the reason now; all 0 when it needs none or is at work on it).
# TYPE rebootd_waiting gauge
rebootd_waiting{reason="paused"} 0
rebootd_waiting{reason="group_paused"} 0
rebootd_waiting{reason="gate"} 0
rebootd_waiting{reason="inhibitor"} 0
rebootd_waiting{reason="users"} 0
rebootd_waiting{reason="blocking_pods"} 0
rebootd_waiting{reason="window"} 0
rebootd_waiting{reason="retry"} 0
rebootd_waiting{reason="slot"} 0
# HELP rebootd_reboot_blocked Whether a gate, a block inhibitor or blocking pods hold back the reboot this node needs.
# TYPE rebootd_reboot_blocked gauge
rebootd_reboot_blocked 0
# HELP rebootd_slot_held_since_timestamp_seconds When this node took the slot it holds (Unix time; 0 when it holds none).
# TYPE rebootd_slot_held_since_timestamp_seconds gauge
rebootd_slot_held_since_timestamp_seconds 0.0
# HELP rebootd_slot_expected_seconds The longest a slot is held when every step takes as long as the settings allow (drain, users' warning, reboot, boot, Ready, settle).
# TYPE rebootd_slot_expected_seconds gauge
rebootd_slot_expected_seconds 0.0
# HELP rebootd_last_reboot_duration_seconds From the logind call to the new boot, for the last reboot this process saw complete (0 until then).
# TYPE rebootd_last_reboot_duration_seconds gauge
rebootd_last_reboot_duration_seconds 0.0
# HELP rebootd_drain_failures_total Drains that failed (timed out, refused, or the API failed).
# TYPE rebootd_drain_failures_total counter
rebootd_drain_failures_total 0
# HELP rebootd_lock_errors_in_a_row Calls to the lock store that failed since the last one it answered (0: reachable).
# TYPE rebootd_lock_errors_in_a_row gauge
rebootd_lock_errors_in_a_row 0
"#;
}
