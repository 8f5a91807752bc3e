//! Performing the action the state asks for and turning its outcome into an event: the waits
//! (trigger, window, slot, inhibitors, Ready), the calls (cordon, drain, reboot, uncordon,
//! release) and the proof before each that the slot is still held.

use super::Runtime;
use crate::agent::{Action, Event};
use crate::config::DrainFailure;
use crate::drain::{DrainError, EventReason};
use crate::gate::Stage;

use crate::metrics::ErrorKind;
use crate::notify::Duty;
use crate::reboot::RebootError;
use crate::state::{Phase, State};
use jiff::Timestamp;
use std::time::Duration;
use tracing::{debug, error, info, warn};

/// Longest single sleep while waiting for a window: the wall clock is looked at again after it,
/// so a clock step (NTP, suspend) delays a window opening by at most this much.
const WINDOW_RECHECK: Duration = Duration::from_secs(300);

pub(super) fn sleep_until(t: Timestamp) -> tokio::time::Sleep {
    let d = t.duration_since(Timestamp::now());
    let d = Duration::try_from(d).unwrap_or(Duration::ZERO);
    tokio::time::sleep(d)
}

impl Runtime {
    /// Perform one action and report what came of it.
    pub(super) async fn perform(&self, action: &Action, state: &State) -> Event {
        match action {
            // The loop takes the triggers' word, in every phase (see `note`).
            Action::WaitForTrigger => {
                info!("idle: waiting for a trigger");
                std::future::pending().await
            }
            Action::WaitForResume => {
                info!("paused: waiting for `rebootctl resume`");
                std::future::pending().await
            }
            Action::Sleep { until } => {
                info!(until = %until, "backing off until {until}");
                sleep_until(*until).await;
                Event::RetryDue
            }
            Action::CheckWindow => self
                .obstacle(Stage::BeforeSlot)
                .await
                .unwrap_or(Event::WindowOpen),
            Action::PrepareReboot => match self.obstacle(Stage::WithSlot).await {
                Some(obstacle) => obstacle,
                // The Node gates' checks are used: their label and annotations go.
                None => match self.gates.used().await {
                    Ok(()) => Event::ReadyToReboot(self.plan_reboot().await),
                    Err(error) => Event::Transient {
                        error: error.to_string(),
                    },
                },
            },
            Action::WaitForWindow => self.wait_for_window().await,
            Action::AcquireSlot => {
                let event = self.acquire_within_window().await;
                match event {
                    Event::Transient { .. } => self.metrics.error(ErrorKind::Lock),
                    // The store answered (a window that closed meanwhile says nothing of it).
                    Event::SlotAcquired | Event::GroupPaused { .. } => self.metrics.lock_answered(),
                    _ => {}
                }
                event
            }
            Action::WaitForGroupResume { known } => self.wait_for_group_resume(known).await,
            Action::ReleaseSlot => self.unmark_and_release(state).await,
            Action::CallReboot => match self.warn_users(state).await {
                Some(warned) => warned,
                None => {
                    let kind = state.reboot.as_ref().map(|r| r.kind).unwrap_or_default();
                    self.call_reboot(state.phase, kind).await
                }
            },
            Action::WarnUsers { until } => {
                sleep_until(*until).await;
                Event::UsersWarningOver
            }
            Action::AwaitInhibitors { known } => match self.host.blockers_changed(known).await {
                Ok(by) => Event::Inhibited { by },
                Err(e) => Event::Transient {
                    error: format!("cannot follow logind's inhibitors: {e}"),
                },
            },
            Action::RecordCordon => self.record_cordon().await,
            Action::Drain => self.drain_node(state.phase).await,
            Action::AwaitReboot { deadline } => {
                info!(deadline = %deadline, "waiting for the host to go down (until {deadline})");
                sleep_until(*deadline).await;
                error!(deadline = %deadline, "the reboot did not happen by {deadline}");
                Event::RebootTimedOut
            }
            Action::WaitHealthy => match self.wait_ready().await {
                Event::Healthy => self.after_boot_checks().await,
                other => other,
            },
            Action::Uncordon => self.uncordon_node().await,
        }
    }

    /// Wait for the maintenance window to open, then look for what else stands in the way.
    async fn wait_for_window(&self) -> Event {
        loop {
            let now = Timestamp::now();
            let windows = &self.config.windows;
            if windows.is_open(now) {
                return self
                    .obstacle(Stage::BeforeSlot)
                    .await
                    .unwrap_or(Event::WindowOpen);
            }
            match windows.next_open(now) {
                Some(at) => {
                    let windows = windows.describe();
                    info!(opens = %at, %windows, "waiting for the maintenance window: it opens at {at} ({windows})");
                    let cap = jiff::SignedDuration::try_from(WINDOW_RECHECK)
                        .ok()
                        .and_then(|d| now.checked_add(d).ok())
                        .unwrap_or(at);
                    sleep_until(at.min(cap)).await;
                }
                None => {
                    let windows = windows.describe();
                    error!(%windows, "no maintenance window can ever open ({windows}); not rebooting");
                    std::future::pending::<()>().await;
                }
            }
        }
    }

    /// Take rebootd's labels and taint off the node, and the autoscaler's annotation it added
    /// (`courtesy`), then give the slot back.
    async fn unmark_and_release(&self, state: &State) -> Event {
        if let Some(n) = &self.node {
            if let Err(e) = n.unmark().await {
                self.metrics.error(ErrorKind::Kubernetes);
                return Event::Transient {
                    error: format!("cannot take the reboot labels and taint off: {e}"),
                };
            }
            if state.scale_down_disabled {
                if let Err(e) = n.enable_scale_down().await {
                    self.metrics.error(ErrorKind::Kubernetes);
                    return Event::Transient {
                        error: format!(
                            "cannot take the autoscaler's scale-down-disabled annotation off: {e}"
                        ),
                    };
                }
            }
        }
        self.release_slot().await
    }

    /// Whether the node was schedulable before rebootd cordons it, once nothing stands in the
    /// way any more.
    async fn record_cordon(&self) -> Event {
        match &self.node {
            // Time may have passed waiting for the slot: look at the blockers again before
            // touching the node.
            Some(n) => match self.obstacle(Stage::WithSlot).await {
                Some(obstacle) => obstacle,
                None => match n.is_unschedulable().await {
                    Ok(already) => Event::Cordoned { by_us: !already },
                    Err(e) => Event::Transient {
                        error: format!("cannot read the node: {e}"),
                    },
                },
            },
            None => Event::Cordoned { by_us: false },
        }
    }

    /// Drain the node, the slot proved held first; a failure says whether to reboot anyway.
    async fn drain_node(&self, phase: Phase) -> Event {
        let Some(n) = &self.node else {
            return Event::Drained;
        };
        // The cordon comes first in a drain: prove the slot is still ours.
        if let Some(lost) = self.fence("cordoning", phase).await {
            return lost;
        }
        self.event(
            EventReason::DrainStarted,
            "rebootd is draining the node for a reboot",
        )
        .await;
        match n.drain().await {
            Ok(()) => Event::Drained,
            Err(e) => {
                let reboot_anyway = self
                    .config
                    .kubernetes
                    .as_ref()
                    .is_some_and(|k| k.on_drain_failure == DrainFailure::Reboot);
                let msg = format!("drain failed: {e}");
                error!(error = %e, reboot_anyway, "drain failed");
                self.metrics.drain_failed();
                self.event(EventReason::DrainFailed, &msg).await;
                Event::DrainFailed {
                    error: e.to_string(),
                    reboot_anyway,
                }
            }
        }
    }

    /// Make the node schedulable again.
    async fn uncordon_node(&self) -> Event {
        match &self.node {
            Some(n) => match n.uncordon().await {
                Ok(()) => {
                    self.event(
                        EventReason::Uncordoned,
                        "rebootd made the node schedulable again",
                    )
                    .await;
                    Event::Uncordoned
                }
                Err(e) => {
                    self.metrics.error(ErrorKind::Kubernetes);
                    Event::Transient {
                        error: format!("cannot uncordon: {e}"),
                    }
                }
            },
            None => Event::Uncordoned,
        }
    }

    /// Record a Kubernetes Event on the node, if draining is configured; failures are logged.
    async fn event(&self, reason: EventReason, message: &str) {
        if let Some(n) = &self.node {
            if let Err(e) = n.event(reason, message).await {
                warn!(%reason, error = %e, "cannot record a Kubernetes event");
            }
        }
    }

    /// Running pods that block a reboot (none without a Kubernetes node).
    async fn blockers(&self) -> Result<Vec<String>, DrainError> {
        match &self.node {
            Some(n) => n.blocking_pods().await,
            None => Ok(Vec::new()),
        }
    }

    /// What stands in the way of a reboot now, if anything: a closed window, a gate that says
    /// wait, blocking pods, or an error reading them.
    async fn obstacle(&self, stage: Stage) -> Option<Event> {
        let now = Timestamp::now();
        let windows = &self.config.windows;
        if !windows.is_open(now) {
            return Some(Event::WindowClosed {
                next_open: windows.next_open(now),
            });
        }
        if !self.gates.is_empty() {
            // Each check is bounded by its timeout, however many there are: the watchdog is fed
            // meanwhile.
            let closed = self.watchdog.run(Duty::Wait, self.gates.check(stage)).await;
            if let Some(c) = closed {
                let every = humantime::format_duration(self.policy.gate_interval);
                info!(gate = %c.name, why = %c.why, hold = c.hold, "waiting for gate {:?}: {}; asking again in {every}", c.name, c.why);
                return Some(Event::Gated {
                    gate: c.name,
                    why: c.why,
                    hold: c.hold,
                });
            }
            debug!("every gate says go");
        }
        match self.blockers().await {
            Ok(pods) if pods.is_empty() => None,
            Ok(pods) => {
                info!(pods = ?pods, "blocking pods run on this node: {}", pods.join(", "));
                Some(Event::Blocked { pods })
            }
            Err(error) => Some(Event::Transient {
                error: format!("cannot list blocking pods: {error}"),
            }),
        }
    }

    /// Resolves when the maintenance window open now closes, with the event saying so (never
    /// when windows are always open).
    pub(super) async fn window_closes(&self) -> Event {
        let windows = &self.config.windows;
        let Some(closes) = windows.close_of_current(Timestamp::now()) else {
            return std::future::pending().await;
        };
        sleep_until(closes).await;
        let next_open = windows.next_open(Timestamp::now());
        let next = next_open.map_or("never".to_string(), |t| t.to_string());
        info!(%closes, "the maintenance window closed at {closes}; leaving the queue (next opens {next})");
        Event::WindowClosed { next_open }
    }

    /// Right before the first logind call of a reboot: when people are logged in, announce the
    /// reboot to them through logind and give them `reboot.users_warning` (None: go on).
    async fn warn_users(&self, state: &State) -> Option<Event> {
        let warning = self.config.reboot.users_warning;
        if warning.is_zero() || state.users_warned.is_some() {
            return None;
        }
        let sessions = match self.host.sessions().await {
            Ok(s) if s.is_empty() => return None,
            Ok(s) => s,
            Err(e) => {
                warn!(error = %e, "cannot list logind's sessions, so no one is warned: {e}");
                return None;
            }
        };
        let until = jiff::SignedDuration::try_from(warning)
            .ok()
            .and_then(|d| Timestamp::now().checked_add(d).ok())
            .unwrap_or(Timestamp::MAX);
        let who = crate::users::describe(&sessions);
        match self.host.announce(until).await {
            Ok(()) => {
                info!(%until, who, "logged in: {who}; logind announces the reboot for {until}")
            }
            // The time is given all the same; only logind's wall messages are missing.
            Err(e) => {
                warn!(error = %e, who, "logged in: {who}; logind could not announce the reboot ({e}); waiting until {until} all the same")
            }
        }
        Some(Event::UsersWarned { sessions, until })
    }

    /// The node reports Ready in this boot (no Kubernetes node: at once).
    async fn wait_ready(&self) -> Event {
        match (&self.node, &self.config.kubernetes) {
            (Some(n), Some(k)) => {
                info!(timeout = ?k.ready_timeout, "waiting for the node to be Ready (at most {:?})", k.ready_timeout);
                match n.wait_ready(k.ready_timeout).await {
                    Ok(()) => Event::Healthy,
                    Err(e) => {
                        let msg = format!(
                            "node not Ready after the reboot ({e}); rebootd keeps its slot, so the rollout stops here"
                        );
                        error!("{msg}");
                        self.event(EventReason::NotReadyAfterReboot, &msg).await;
                        Event::NotHealthy {
                            error: e.to_string(),
                        }
                    }
                }
            }
            _ => Event::Healthy,
        }
    }

    /// The checks after the boot (`[[gates.after_boot]]`): all go = healthy (and the Node
    /// gates' label and annotations go); one waits = the slot is held and they are asked again.
    async fn after_boot_checks(&self) -> Event {
        if self.after_boot.is_empty() {
            return Event::Healthy;
        }
        let closed = self
            .watchdog
            .run(Duty::Wait, self.after_boot.check(Stage::WithSlot))
            .await;
        match closed {
            Some(c) => {
                let every = humantime::format_duration(self.policy.gate_interval);
                info!(gate = %c.name, why = %c.why, "after the boot, waiting for gate {:?}: {}; holding the slot, asking again in {every}", c.name, c.why);
                Event::Gated {
                    gate: c.name,
                    why: c.why,
                    hold: true,
                }
            }
            None => match self.after_boot.used().await {
                Ok(()) => Event::Healthy,
                Err(error) => Event::Transient {
                    error: error.to_string(),
                },
            },
        }
    }

    /// The kind of reboot to ask for (`[reboot] method`, for `auto` from what the host
    /// shows) and systemd's soft reboot count before it.
    async fn plan_reboot(&self) -> crate::agent::RebootPlan {
        use crate::reboot_method::{choose, probe, systemd_major, HostFacts, Method, Platform};
        let manager = self.host.manager().await;
        let systemd = manager.as_ref().and_then(|m| systemd_major(&m.version));
        let method = self.config.reboot.method;
        let facts = match method {
            Method::Auto => probe::read(
                &probe::Paths {
                    root: std::path::Path::new("/"),
                },
                systemd,
            ),
            _ => HostFacts {
                systemd,
                kexec_loaded: None,
                platform: Platform::Unknown("not looked at".into()),
            },
        };
        let choice = choose(method, self.config.reboot.allow_kexec, &facts);
        info!(kind = %choice.kind, why = %choice.why, "the reboot will be a {}", choice.kind);
        crate::agent::RebootPlan {
            kind: choice.kind,
            why: choice.why,
            soft_reboots: manager.and_then(|m| m.soft_reboots),
        }
    }

    async fn call_reboot(&self, phase: Phase, kind: crate::reboot_method::Kind) -> Event {
        if let Some(lost) = self.fence("the reboot", phase).await {
            return lost;
        }
        // logind lets root through root's own block inhibitors: look at every one first.
        match self.host.blockers().await {
            Ok(by) if !by.is_empty() => return Event::Inhibited { by },
            Ok(_) => {}
            Err(e) => {
                warn!(error = %e, "cannot list logind's inhibitors; asking logind, which checks other users' block inhibitors itself")
            }
        }
        // Before the call: once logind accepts, the host may go down at any moment.
        if let Some(w) = &self.webhook {
            w.flush().await;
        }
        self.event(
            EventReason::Rebooting,
            "rebootd is asking logind to reboot the node",
        )
        .await;
        // The window once more, last: the steps above may have taken a while (a store, a
        // webhook receiver or the API slow to answer), and the window checked in the step
        // before may have closed meanwhile. Closed: back out as that check would have.
        let now = Timestamp::now();
        if !self.config.windows.is_open(now) {
            return Event::WindowClosed {
                next_open: self.config.windows.next_open(now),
            };
        }
        match self.host.reboot(kind).await {
            Ok(()) => Event::RebootAccepted,
            Err(e @ RebootError::Blocked { .. }) => {
                // Taken between the check and the call: wait for it like any other.
                if let Ok(by) = self.host.blockers().await {
                    if !by.is_empty() {
                        return Event::Inhibited { by };
                    }
                }
                warn!(error = %e, "the reboot is blocked; will ask again");
                Event::RebootRefused {
                    error: e.to_string(),
                }
            }
            Err(e @ RebootError::Unanswered(_)) => {
                error!(error = %e, "logind did not answer the reboot call; it may have accepted it");
                self.metrics.error(ErrorKind::Logind);
                Event::RebootUnanswered {
                    error: e.to_string(),
                }
            }
            Err(e) => {
                error!(error = %e, "the reboot request failed; will ask again");
                self.metrics.error(ErrorKind::Logind);
                Event::RebootRefused {
                    error: e.to_string(),
                }
            }
        }
    }
}
