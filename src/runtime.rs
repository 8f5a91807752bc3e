//! The agent's runtime: performs the action the state asks for, turns its outcome into an event,
//! steps the pure state machine and writes the new state before the next action.

use crate::agent::{self, Action, Event, Policy};
use crate::config::{Config, DrainFailure};
use crate::control;
use crate::drain::{Drainer, KubeDrainer};
use crate::gate::Stage;
use crate::lock::{self, Fence, LockError, Reported, Semaphore};
use crate::metrics::Metrics;
use crate::notify::{self, Duty, Watchdog};
use crate::reboot::{Logind, RebootError, Rebooter};
use crate::state::{Phase, State, StateError, StateStore};
use crate::trigger::{self, Need, TriggerSource};
use jiff::Timestamp;
use std::path::Path;
use std::time::Duration;
use tokio::sync::mpsc;
use tracing::{debug, error, info, info_span, warn, Instrument};

/// Longest single sleep while waiting for a window: the wall clock is looked at again after it,
/// so a clock step (NTP, suspend) delays a window opening by at most this much.
const WINDOW_RECHECK: Duration = Duration::from_secs(300);

/// How long start-up waits for the triggers to listen before it reports ready anyway.
const TRIGGERS_READY: Duration = Duration::from_secs(10);

/// How old a phase report's proof of the slot may be to serve as the fence before the cordon or
/// the logind call (see [`Runtime::fence`]). A fence is a proof of the moment it was made; the
/// steps between the report and the action (the checks before the reboot, recording the
/// cordon) are quick unless a gate is slow, and then the fence is sent as before.
const REPORT_PROOF_FRESH: Duration = Duration::from_secs(1);

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error(transparent)]
    State(#[from] StateError),
    #[error("cannot read {what} from {path}: {reason}")]
    Identity {
        what: &'static str,
        path: String,
        reason: String,
    },
    #[error("lock backend: {0}")]
    Lock(#[from] LockError),
    #[error("kubernetes: {0}")]
    Kubernetes(String),
    #[error("metrics: {0}")]
    Metrics(String),
    #[error("webhook: {0}")]
    Webhook(String),
    #[error("gates: {0}")]
    Gates(String),
}

/// Read a one-line id file (machine id, boot id), trimmed and checked non-empty.
pub fn read_id(what: &'static str, path: &Path) -> Result<String, RuntimeError> {
    let err = |reason: String| RuntimeError::Identity {
        what,
        path: path.display().to_string(),
        reason,
    };
    let text = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
    let id = text.trim().to_string();
    if id.is_empty() {
        return Err(err("the file is empty".into()));
    }
    Ok(id)
}

/// This node's holder id in the semaphore: the machine id (locksmith's holder id) for the
/// stores rebootd keeps; for a FleetLock server, the configured id or else Zincati's
/// app-specific id, so a node keeps its slot when it moves from Zincati and poseidon/fleetlock
/// can map it to its Node.
pub fn holder_id(config: &Config) -> Result<String, RuntimeError> {
    let path = &config.identity.machine_id_file;
    let machine_id = read_id("the machine id", path)?;
    match &config.lock.backend {
        crate::config::LockBackend::FleetLock(f) => match &f.id {
            Some(id) => Ok(id.clone()),
            None => crate::app_id::zincati_node_id(&machine_id).map_err(|reason| {
                RuntimeError::Identity {
                    what: "the machine id",
                    path: path.display().to_string(),
                    reason: format!(
                        "{reason}; set [lock.fleetlock] id to send another id to the FleetLock server"
                    ),
                }
            }),
        },
        _ => Ok(machine_id),
    }
}

/// This node's identity in the semaphore, from the configured files and the holder token in
/// the state directory (made there if it is not yet).
pub fn identity(config: &Config, store: &StateStore) -> Result<lock::Identity, RuntimeError> {
    Ok(lock::Identity {
        id: holder_id(config)?,
        node: config.identity.node_name.clone(),
        boot_id: read_id("the boot id", &config.identity.boot_id_file)?,
        token: store.holder_token()?,
    })
}

/// Open the configured lock backend (remote ones connect on first use).
pub async fn open_semaphore(config: &Config) -> Result<Box<dyn Semaphore>, LockError> {
    lock::open::open(config).await
}

/// The node drainer, when `[kubernetes]` is configured.
/// Its health gate also requires the Node to report `boot_id`: right after a fast reboot the
/// Node may still show the Ready posted before it.
pub async fn open_drainer(
    config: &Config,
    boot_id: &str,
    metrics: &Metrics,
) -> Result<Option<Box<dyn Drainer>>, RuntimeError> {
    let Some(settings) = &config.kubernetes else {
        return Ok(None);
    };
    let client = crate::kube_client::connect(settings.kubeconfig.as_deref())
        .await
        .map_err(|e| RuntimeError::Kubernetes(e.to_string()))?;
    let drainer = KubeDrainer::new(client, &config.identity.node_name, settings)
        .map_err(|e| RuntimeError::Kubernetes(e.to_string()))?
        .with_boot_id(boot_id)
        .with_metrics(metrics.clone());
    Ok(Some(Box::new(drainer)))
}

/// The gates before a reboot and the checks after the boot (`[gates]`), their HTTP clients
/// built (and a Kubernetes client for the Node and pods gates).
pub async fn open_gates(config: &Config) -> Result<crate::gate::GateSets, RuntimeError> {
    use crate::gate::Gates;
    let (before, after) = (&config.gates.before_reboot, &config.gates.after_boot);
    let client = match &config.kubernetes {
        Some(k) if Gates::needs_kube(before) || Gates::needs_kube(after) => Some(
            crate::kube_client::connect(k.kubeconfig.as_deref())
                .await
                .map_err(|e| RuntimeError::Kubernetes(e.to_string()))?,
        ),
        _ => None,
    };
    let kube = client
        .as_ref()
        .map(|c| (c, config.identity.node_name.as_str()));
    let err = |e: crate::http::SetupError| RuntimeError::Gates(e.to_string());
    Ok(crate::gate::GateSets {
        before_reboot: Gates::from_config(before, kube).map_err(err)?,
        after_boot: Gates::from_config(after, kube).map_err(err)?,
    })
}

/// Flatcar's coordinator file, locked and saying `STATE=starting`, when configured; a failure is
/// logged with the path and rebootd runs without it.
pub fn open_coordinator(config: &Config) -> Option<crate::coordinator::CoordinatorFile> {
    use crate::coordinator::{strategy, CoordinatorError, CoordinatorFile};
    let path = config.reboot.coordinator_file.as_deref()?;
    match CoordinatorFile::open(path, strategy(&config.lock.backend)) {
        Ok(file) => Some(file),
        Err(e @ CoordinatorError::Held { .. }) => {
            error!("{e}");
            None
        }
        Err(e) => {
            let path = path.display().to_string();
            warn!(%path, "Flatcar's coordinator file {path} is not written: {e}");
            None
        }
    }
}

/// The policy the state machine follows, from the configuration.
pub fn policy(config: &Config) -> Policy {
    Policy {
        drain: config.kubernetes.is_some(),
        reboot_timeout: config.reboot.timeout,
        retry_interval: config.reboot.retry_interval,
        gate_interval: config.gates.interval,
        settle: config.gates.settle,
    }
}

/// One running agent.
pub struct Runtime {
    config: Config,
    store: StateStore,
    semaphore: Box<dyn Semaphore>,
    rebooter: Box<dyn Rebooter>,
    drainer: Option<Box<dyn Drainer>>,
    me: lock::Identity,
    policy: Policy,
    metrics: Metrics,
    webhook: Option<crate::notify_webhook::Webhook>,
    gates: crate::gate::Gates,
    after_boot: crate::gate::Gates,
    watchdog: Watchdog,
    coordinator: Option<crate::coordinator::CoordinatorFile>,
    /// The last phase report proved the slot held ([`lock::Reported::Held`]), in this phase, at
    /// this time: a fence in that phase soon after, with only quick steps between, is that
    /// report ([`REPORT_PROOF_FRESH`]).
    reported_held: std::sync::Mutex<Option<(Phase, std::time::Instant)>>,
}

/// The one-line status systemd shows: the phase and what it waits for.
fn status_line(s: &State) -> String {
    match &s.waiting_for {
        Some(w) => format!("{}: waiting for {w}", s.phase),
        None => s.phase.to_string(),
    }
}

/// Whether an action waits for something with no bound in time (the watchdog is fed meanwhile)
/// or calls something that must answer within `WatchdogSec=` (it is not).
fn duty(action: &Action) -> Duty {
    match action {
        Action::WaitForTrigger
        | Action::Sleep { .. }
        | Action::WaitForWindow
        | Action::AcquireSlot
        | Action::WaitForGroupResume { .. }
        | Action::Drain
        | Action::AwaitReboot { .. }
        | Action::AwaitInhibitors { .. }
        | Action::WarnUsers { .. }
        | Action::WaitHealthy
        | Action::WaitForResume => Duty::Wait,
        Action::CheckWindow
        | Action::PrepareReboot
        | Action::RecordCordon
        | Action::CallReboot
        | Action::Uncordon
        | Action::ReleaseSlot => Duty::Call,
    }
}

/// Whether an operator request may end this action early: waits whose future may be dropped
/// (an interrupted slot wait leaves nothing behind, see `lock::acquire::Waiting`; a drain is one
/// future). Not the calls, and not the post-boot health wait, whose timeout would start again.
fn interruptible(action: &Action) -> bool {
    matches!(
        action,
        Action::WaitForTrigger
            | Action::Sleep { .. }
            | Action::WaitForWindow
            | Action::AcquireSlot
            | Action::WaitForGroupResume { .. }
            | Action::Drain
            | Action::AwaitInhibitors { .. }
            | Action::WarnUsers { .. }
            | Action::AwaitReboot { .. }
            | Action::WaitForResume
    )
}

fn sleep_until(t: Timestamp) -> tokio::time::Sleep {
    let d = t.duration_since(Timestamp::now());
    let d = Duration::try_from(d).unwrap_or(Duration::ZERO);
    tokio::time::sleep(d)
}

impl Runtime {
    /// Build a runtime with the logind rebooter.
    pub fn new(
        config: Config,
        store: StateStore,
        semaphore: Box<dyn Semaphore>,
        drainer: Option<Box<dyn Drainer>>,
        me: lock::Identity,
    ) -> Runtime {
        let rebooter = Box::new(Logind::new(
            config.reboot.inhibitors == crate::config::Inhibitors::Respect,
        ));
        let policy = policy(&config);
        Runtime {
            config,
            store,
            semaphore,
            rebooter,
            drainer,
            me,
            policy,
            metrics: Metrics::default(),
            webhook: None,
            gates: crate::gate::Gates::default(),
            after_boot: crate::gate::Gates::default(),
            watchdog: Watchdog::from_env(),
            coordinator: None,
            reported_held: std::sync::Mutex::default(),
        }
    }

    /// Ask these gates before taking a slot, before the cordon and before calling logind, and
    /// these checks after the boot before the uncordon and the release.
    pub fn with_gates(mut self, gates: crate::gate::GateSets) -> Runtime {
        self.gates = gates.before_reboot;
        self.after_boot = gates.after_boot;
        self
    }

    /// Send notifications of state changes to this webhook (`[webhook]`).
    pub fn with_webhook(mut self, webhook: crate::notify_webhook::Webhook) -> Runtime {
        self.webhook = Some(webhook);
        self
    }

    /// Show the phase in Flatcar's coordinator file (`[reboot] coordinator_file`).
    pub fn with_coordinator(mut self, file: crate::coordinator::CoordinatorFile) -> Runtime {
        self.coordinator = Some(file);
        self
    }

    /// Reboot through this instead of logind (the lab's in-process nodes).
    pub fn with_rebooter(mut self, rebooter: Box<dyn Rebooter>) -> Runtime {
        self.rebooter = rebooter;
        self
    }

    /// Publish metrics to this collector (served by the caller).
    pub fn with_metrics(mut self, metrics: Metrics) -> Runtime {
        self.metrics = metrics;
        self
    }

    /// Record a Kubernetes Event on the node, if draining is configured; failures are logged.
    async fn event(&self, reason: &str, message: &str, warning: bool) {
        if let Some(d) = &self.drainer {
            if let Err(e) = d.event(reason, message, warning).await {
                warn!(reason, error = %e, "cannot record a Kubernetes event");
            }
        }
    }

    /// Running pods that block a reboot (none without a drainer).
    async fn blockers(&self) -> Result<Vec<String>, String> {
        match &self.drainer {
            Some(d) => d.blocking_pods().await.map_err(|e| e.to_string()),
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

    /// Run until `shutdown` resolves. Returns an error only for what the agent cannot carry on
    /// from (the state file cannot be read or written).
    pub async fn run(
        self,
        shutdown: impl std::future::Future<Output = ()>,
    ) -> Result<(), RuntimeError> {
        // Every log line carries who this is (journald shows them as NODE=, GROUP=, HOLDER=).
        let span = info_span!(
            "agent",
            node = %self.me.node,
            group = %self.config.identity.group,
            holder = %self.me.id
        );
        self.run_inner(shutdown).instrument(span).await
    }

    async fn run_inner(
        self,
        shutdown: impl std::future::Future<Output = ()>,
    ) -> Result<(), RuntimeError> {
        // When the slot's record was last made fresh, across actions (see `heartbeat`).
        let last_beat = std::sync::Mutex::new(None);
        let mut state = self.load_and_beat(&last_beat).await?;
        let (tx, mut needs) = mpsc::channel(16);
        let triggers = trigger::spawn_all(&self.config.triggers, &self.store.request_path(), tx);
        let listening = futures_util::future::join_all(triggers.ready);
        if tokio::time::timeout(TRIGGERS_READY, listening)
            .await
            .is_err()
        {
            warn!("not every trigger listens after {TRIGGERS_READY:?}; starting anyway");
        }
        state = self
            .apply(
                state,
                Event::Started {
                    boot_id: self.me.boot_id.clone(),
                },
            )
            .await?;
        notify::ready(&status_line(&state));
        let watchdog = &self.watchdog;
        let mut inbox = control::Inbox::open(&self.store);
        tokio::pin!(shutdown);
        let mut last_noted: Option<String> = None;
        let result = 'run: loop {
            // The loop came round: it is alive. While an action waits the watchdog is fed from
            // here too; a call that hangs is not fed, so systemd restarts the daemon.
            watchdog.feed();
            // Operator requests first (pause, resume, cancel): they change what comes next.
            if let Some((path, envelope)) = inbox.next() {
                let request = envelope.request.name();
                let event = envelope.request.event();
                // Said even when nothing changes (a cancel that comes too late).
                let why = agent::step(&state, event.clone(), Timestamp::now(), &self.policy).why;
                let requested_at = envelope.requested_at;
                info!(request, %requested_at, "operator request {request} (made {requested_at}): {why}");
                let before = state.phase;
                match self.apply(state.clone(), event).await {
                    Ok(next) => state = next,
                    Err(e) => break Err(e),
                }
                // Backing out of this reboot (pause, cancel): a Node gate's before-reboot
                // label and annotations go, as they would right before the logind call.
                if before != state.phase
                    && matches!(state.phase, Phase::Uncordoning | Phase::Releasing)
                {
                    if let Err(e) = self.gates.used().await {
                        warn!(error = %e, "cannot remove the Node gates' label: {e}");
                    }
                }
                inbox.done(&path);
                continue;
            }
            // A beat that came due during actions shorter than a beat is made here, between two
            // actions, and awaited (its own time limits bound it).
            self.beat_if_due(state.slot_held, &last_beat).await;
            let action = agent::next_action(&state, &self.policy);
            let span = info_span!("action", phase = %state.phase, action = ?action);
            // The action works on the state as it was decided on; a trigger noted meanwhile
            // changes the state under it (the need), never what the action does.
            let decided = state.clone();
            // The action and the heartbeat beside it live in this block only: both are dropped
            // before the event is applied. A beat cut short there is harmless; a beat kept but
            // no longer polled is not: it may hold what the next store call needs (the etcd
            // stores connect on first use, under a lock), and the step that makes that call
            // would wait on it for ever (RELIABILITY.md, finding 8).
            let event = {
                let perform = self.perform(&action, &decided).instrument(span);
                tokio::pin!(perform);
                let heartbeat = self.heartbeat(state.slot_held, &last_beat);
                tokio::pin!(heartbeat);
                loop {
                    tokio::select! {
                        event = watchdog.run(duty(&action), &mut perform) => break Some(event),
                        never = &mut heartbeat => match never {},
                        // A wait gives way to an operator request (the loop applies it, then
                        // decides again); a call finishes first.
                        _ = inbox.arrived(), if interruptible(&action) => break None,
                        // A trigger is seen in every phase: idle, it starts a cycle; otherwise it is
                        // noted and this cycle's reboot covers it (the action goes on undisturbed).
                        Some(need) = needs.recv() => {
                            let before = state.phase;
                            match self.note(state.clone(), need, &mut last_noted).await {
                                Ok(next) => state = next,
                                Err(e) => break 'run Err(e),
                            }
                            if state.phase != before {
                                break None;
                            }
                        }
                        _ = &mut shutdown => break 'run Ok(()),
                    }
                }
            };
            let Some(event) = event else { continue };
            match self.apply(state.clone(), event).await {
                Ok(next) => state = next,
                Err(e) => break Err(e),
            }
        };
        notify::stopping();
        info!(phase = %state.phase, "stopping in phase {}", state.phase);
        for t in triggers.tasks {
            t.abort();
        }
        result
    }

    /// The state on record (idle when there is none), and a holder's first act: a beat. The
    /// host was down, or rebootd stopped, since the last one, and every waiter's count of
    /// `lock.max_hold` ran meanwhile; nothing that can take long (the triggers' start, the Node's
    /// annotations, the wait for Ready, the checks after the boot) comes before it.
    async fn load_and_beat(
        &self,
        last_beat: &std::sync::Mutex<Option<std::time::Instant>>,
    ) -> Result<State, RuntimeError> {
        let state = match self.store.load()? {
            Some(state) => state,
            None => {
                let state = State::new(&self.me.boot_id, Timestamp::now());
                let path = self.store.path().display().to_string();
                info!(%path, "no state file yet at {path}; starting idle");
                self.store.save(&state)?;
                state
            }
        };
        if state.slot_held && self.semaphore.heartbeat_every().is_some() {
            info!("holding a slot: showing the lock store this node is alive first");
            self.beat(last_beat).await;
        }
        Ok(state)
    }

    /// Step, log, persist, publish.
    async fn apply(&self, state: State, event: Event) -> Result<State, RuntimeError> {
        debug!(?event, "event");
        // A report's proof outlives only the quick steps between it and the action it serves
        // (the checks before the reboot passed, the cordon recorded); any other event (a gate
        // closed, an inhibitor, an operator's request, an error) ends it.
        if !matches!(event, Event::ReadyToReboot | Event::Cordoned { .. }) {
            *self.reported_held.lock().unwrap_or_else(|p| p.into_inner()) = None;
        }
        let failed = matches!(event, Event::Transient { .. });
        let step = agent::step(&state, event, Timestamp::now(), &self.policy);
        if let Some(refused) = step.refused {
            warn!(event = refused.event, phase = %refused.phase, "{refused}; the state is left as it is");
            return Ok(state);
        }
        // What came from outside (errors, gate answers, inhibitors) is bounded and escaped
        // before it reaches the journal, the state file or anything that reads them.
        let next = step.state.cleaned();
        let why = crate::text::clean(&step.why);
        if next.phase != state.phase {
            // The message says it all ("idle → reboot_needed: why"); the fields are for filtering.
            info!(from = %state.phase, to = %next.phase, %why, "{} → {}: {why}", state.phase, next.phase);
        } else if next != state {
            info!(phase = %next.phase, %why, "still {}: {why}", next.phase);
        }
        if next != state {
            self.store.save(&next)?;
            if let Some(w) = &self.webhook {
                for n in crate::notify_webhook::notices(&state, &next) {
                    let group = &self.config.identity.group;
                    w.send(crate::notify_webhook::body(&n, &self.me.node, group, &next));
                }
            }
            if next.phase != state.phase {
                if let Some(d) = &self.drainer {
                    if let Err(e) = d
                        .annotate(next.phase.as_str(), next.since, next.reason.is_some())
                        .await
                    {
                        warn!(error = %e, "cannot annotate the node");
                    }
                }
            }
            if next.paused != state.paused {
                if let Some(d) = &self.drainer {
                    let reason = next
                        .paused
                        .as_ref()
                        .map(|p| p.reason.as_deref().unwrap_or(""));
                    if let Err(e) = d.annotate_paused(reason).await {
                        warn!(error = %e, "cannot annotate the node: {e}");
                    }
                }
            }
            if next.group_paused != state.group_paused {
                if let Some(d) = &self.drainer {
                    let reason = next
                        .group_paused
                        .as_ref()
                        .map(|p| p.reason.as_deref().unwrap_or(""));
                    if let Err(e) = d.annotate_group_paused(reason).await {
                        warn!(error = %e, "cannot annotate the node: {e}");
                    }
                }
            }
            if self.worth_reporting(&state, &next, failed) {
                let proof = match self
                    .semaphore
                    .report_phase(&self.me, next.phase.as_str())
                    .await
                {
                    Ok(Reported::Held) => Some((next.phase, std::time::Instant::now())),
                    Ok(Reported::Unproven) => None,
                    Err(e) => {
                        warn!(error = %e, "cannot record the phase in the lock backend");
                        None
                    }
                };
                *self.reported_held.lock().unwrap_or_else(|p| p.into_inner()) = proof;
            }
        }
        // The reboot announced to logged-in users was called off (pause, cancel, backing out).
        if state.users_warned.is_some()
            && next.users_warned.is_none()
            && !state.reboot.as_ref().is_some_and(|r| r.called)
        {
            if let Err(e) = self.rebooter.withdraw().await {
                warn!(error = %e, "cannot withdraw the reboot announced to logged-in users: {e}");
            }
        }
        notify::status(&status_line(&next));
        if let Some(c) = &self.coordinator {
            c.update(&next);
        }
        self.metrics.observe(&next, Timestamp::now());
        Ok(next)
    }

    /// Whether the step from `before` to `after` by `event` is written to the holder's record:
    /// each new phase while the slot is held, except `releasing` when the release follows at
    /// once (it deletes the record; no settle time). A release that failed (or the labels and
    /// taint it takes off the node first) writes it then, so `rebootctl status` shows what the
    /// holder is stuck at.
    fn worth_reporting(&self, before: &State, after: &State, failed: bool) -> bool {
        if !after.slot_held {
            return false;
        }
        if after.phase != Phase::Releasing {
            return after.phase != before.phase;
        }
        match before.phase {
            Phase::Releasing => failed,
            _ => !matches!(agent::next_action(after, &self.policy), Action::ReleaseSlot),
        }
    }

    /// Apply a trigger's word. Idle, it starts a cycle; in a cycle it is noted and covered by
    /// that cycle's reboot (after the boot, by the next cycle). A `rebootctl reboot` request is
    /// consumed once its need is on record, so it never outlives the cycle that served it.
    async fn note(
        &self,
        state: State,
        need: Need,
        last_noted: &mut Option<String>,
    ) -> Result<State, RuntimeError> {
        let said = need.to_string();
        let (phase, source) = (state.phase, need.source);
        let next = self.apply(state, Event::RebootNeeded { need }).await?;
        if phase != Phase::Idle {
            // A sentinel command says so at every run: once in the log is enough.
            if last_noted.as_deref() != Some(said.as_str()) {
                info!(trigger = %source, %phase, "reboot needed ({said}) during phase {phase}: noted; this cycle's reboot covers it");
            } else {
                debug!(trigger = %source, %phase, "reboot needed ({said}): noted again");
            }
        }
        *last_noted = Some(said);
        if source == TriggerSource::Rebootctl {
            let path = self.store.request_path();
            match std::fs::remove_file(&path) {
                Ok(()) => {
                    info!(path = %path.display(), "the reboot request is on record in phase {}; removed {}", next.phase, path.display())
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    warn!(path = %path.display(), error = %e, "cannot remove the consumed reboot request {}: {e}", path.display())
                }
            }
        }
        Ok(next)
    }

    /// Resolves when the maintenance window open now closes, with the event saying so (never
    /// when windows are always open).
    async fn window_closes(&self) -> Event {
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

    /// Wait for a slot unless the group is paused (`rebootctl pause --group`): a pause seen
    /// before or during the wait ends it (the queue entry goes, see `lock::acquire::Waiting`)
    /// and the node waits for the resume instead; holders are not asked.
    async fn acquire_unless_paused(&self) -> Event {
        let (backend, group) = (self.semaphore.backend(), &self.config.identity.group);
        info!(backend, %group, "waiting for a reboot slot ({backend} semaphore, group {group})");
        match self.semaphore.acquire_unless_paused(&self.me).await {
            Ok(lock::Acquired::Held) => Event::SlotAcquired,
            Ok(lock::Acquired::Paused(pause)) => {
                info!("the group was paused ({}) before or while waiting for a slot; leaving the queue", pause.describe());
                Event::GroupPaused { pause }
            }
            Err(e) => Event::Transient {
                error: e.to_string(),
            },
        }
    }

    /// Wait for a slot, but no longer than the maintenance window is open: when it closes
    /// first, the wait is dropped (leaving the queue behind nothing, see
    /// `lock::acquire::Waiting`) and the agent waits for the next opening.
    async fn acquire_within_window(&self) -> Event {
        let windows = &self.config.windows;
        let Some(closes) = windows.close_of_current(Timestamp::now()) else {
            return self.acquire_unless_paused().await;
        };
        tokio::select! {
            event = self.acquire_unless_paused() => event,
            _ = sleep_until(closes) => {
                let next_open = windows.next_open(Timestamp::now());
                let next = next_open.map_or("never".to_string(), |t| t.to_string());
                info!(%closes, "the maintenance window closed at {closes} while waiting for a slot; leaving the queue (next opens {next})");
                Event::WindowClosed { next_open }
            }
        }
    }

    /// Right before the first logind call of a reboot: when people are logged in, announce the
    /// reboot to them through logind and give them `reboot.users_warning` (None: go on).
    async fn warn_users(&self, state: &State) -> Option<Event> {
        let warning = self.config.reboot.users_warning;
        if warning.is_zero() || state.users_warned.is_some() {
            return None;
        }
        let sessions = match self.rebooter.sessions().await {
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
        match self.rebooter.announce(until).await {
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

    /// Perform one action and report what came of it.
    async fn perform(&self, action: &Action, state: &State) -> Event {
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
                    Ok(()) => Event::ReadyToReboot,
                    Err(error) => Event::Transient { error },
                },
            },
            Action::WaitForWindow => loop {
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
            },
            Action::AcquireSlot => {
                let event = self.acquire_within_window().await;
                if matches!(event, Event::Transient { .. }) {
                    self.metrics.error("lock");
                }
                event
            }
            Action::WaitForGroupResume { known } => {
                let group = &self.config.identity.group;
                info!(%group, "group {group} paused ({}): waiting for `rebootctl resume --group`", known.describe());
                let changed = async {
                    match self.semaphore.group_pause_changed(Some(known)).await {
                        Ok(None) => Event::GroupResumed,
                        Ok(Some(pause)) => Event::GroupPaused { pause },
                        Err(e) => {
                            self.metrics.error("lock");
                            Event::Transient {
                                error: format!("cannot follow the group's pause: {e}"),
                            }
                        }
                    }
                };
                tokio::select! {
                    event = changed => event,
                    event = self.window_closes() => event,
                }
            }
            Action::ReleaseSlot => {
                if let Some(d) = &self.drainer {
                    if let Err(e) = d.unmark().await {
                        self.metrics.error("kubernetes");
                        return Event::Transient {
                            error: format!("cannot take the reboot labels and taint off: {e}"),
                        };
                    }
                }
                self.release_slot().await
            }
            Action::CallReboot => match self.warn_users(state).await {
                Some(warned) => warned,
                None => self.call_reboot(state.phase).await,
            },
            Action::WarnUsers { until } => {
                sleep_until(*until).await;
                Event::UsersWarningOver
            }
            Action::AwaitInhibitors { known } => {
                match self.rebooter.blockers_changed(known).await {
                    Ok(by) => Event::Inhibited { by },
                    Err(e) => Event::Transient {
                        error: format!("cannot follow logind's inhibitors: {e}"),
                    },
                }
            }
            Action::RecordCordon => match &self.drainer {
                // Time may have passed waiting for the slot: look at the blockers again before
                // touching the node.
                Some(d) => match self.obstacle(Stage::WithSlot).await {
                    Some(obstacle) => obstacle,
                    None => match d.is_unschedulable().await {
                        Ok(already) => Event::Cordoned { by_us: !already },
                        Err(e) => Event::Transient {
                            error: format!("cannot read the node: {e}"),
                        },
                    },
                },
                None => Event::Cordoned { by_us: false },
            },
            Action::Drain => match &self.drainer {
                Some(d) => {
                    // The cordon comes first in a drain: prove the slot is still ours.
                    if let Some(lost) = self.fence("cordoning", state.phase).await {
                        return lost;
                    }
                    self.event(
                        "DrainStarted",
                        "rebootd is draining the node for a reboot",
                        false,
                    )
                    .await;
                    match d.drain().await {
                        Ok(()) => Event::Drained,
                        Err(e) => {
                            let reboot_anyway = self
                                .config
                                .kubernetes
                                .as_ref()
                                .is_some_and(|k| k.on_drain_failure == DrainFailure::Reboot);
                            let msg = format!("drain failed: {e}");
                            error!(error = %e, reboot_anyway, "drain failed");
                            self.event("DrainFailed", &msg, true).await;
                            Event::DrainFailed {
                                error: e.to_string(),
                                reboot_anyway,
                            }
                        }
                    }
                }
                None => Event::Drained,
            },
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

            Action::Uncordon => match &self.drainer {
                Some(d) => match d.uncordon().await {
                    Ok(()) => {
                        self.event(
                            "Uncordoned",
                            "rebootd made the node schedulable again",
                            false,
                        )
                        .await;
                        Event::Uncordoned
                    }
                    Err(e) => {
                        self.metrics.error("kubernetes");
                        Event::Transient {
                            error: format!("cannot uncordon: {e}"),
                        }
                    }
                },
                None => Event::Uncordoned,
            },
        }
    }

    /// The node reports Ready in this boot (no drainer: at once).
    async fn wait_ready(&self) -> Event {
        match (&self.drainer, &self.config.kubernetes) {
            (Some(d), Some(k)) => {
                info!(timeout = ?k.ready_timeout, "waiting for the node to be Ready (at most {:?})", k.ready_timeout);
                match d.wait_ready(k.ready_timeout).await {
                    Ok(()) => Event::Healthy,
                    Err(e) => {
                        let msg = format!(
                            "node not Ready after the reboot ({e}); rebootd keeps its slot, so the rollout stops here"
                        );
                        error!("{msg}");
                        self.event("NotReadyAfterReboot", &msg, true).await;
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
                Err(error) => Event::Transient { error },
            },
        }
    }

    async fn release_slot(&self) -> Event {
        match self.semaphore.release(&self.me).await {
            Ok(()) => Event::Released,
            Err(e) => {
                self.metrics.error("lock");
                Event::Transient {
                    error: e.to_string(),
                }
            }
        }
    }

    /// Prove right before `what` that this node still holds its slot: `None` when it does, else
    /// the event that backs out ([`Event::SlotLost`]) or retries (the store could not tell).
    ///
    /// Where `lock.max_hold` reclaims silent holders, the proof is a write of the holder's
    /// record (a heartbeat), not a read. A read proves the slot held now; a waiter that judged
    /// this node stopped (say, after it was cut off from the store) may still take it over a
    /// moment later, while the reboot asked for is on its way. A write lands either before that
    /// takeover, which then fails (every store's reclaim compares the record it judged silent),
    /// or after it, and then says the slot is lost. And it gives every waiter a fresh
    /// `max_hold` to count before it may judge this node stopped again.
    ///
    /// The report of the phase `phase` may be that proof already: a write guarded as the
    /// heartbeat is ([`lock::Reported::Held`]), made less than [`REPORT_PROOF_FRESH`] ago (and
    /// less than a beat ago). Then nothing is sent again: before the logind call the proof is the
    /// report of `rebooting`, a step earlier, unless the checks before the reboot took longer.
    async fn fence(&self, what: &str, phase: Phase) -> Option<Event> {
        let reported = self
            .reported_held
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some((in_phase, at)) = reported {
            let fresh = self
                .semaphore
                .heartbeat_every()
                .map_or(REPORT_PROOF_FRESH, |every| every.min(REPORT_PROOF_FRESH));
            if in_phase == phase && at.elapsed() < fresh {
                debug!(
                    before = what,
                    "the report of phase {phase} proves the slot held"
                );
                return None;
            }
        }
        let proof = if self.semaphore.heartbeat_every().is_some() {
            self.semaphore.heartbeat(&self.me).await
        } else {
            self.semaphore.fence(&self.me).await
        };
        match proof {
            Ok(Fence::Held) => None,
            Ok(Fence::Lost { why }) => {
                error!(before = what, %why, "this node no longer holds its slot; backing out");
                self.metrics.slot_lost();
                Some(Event::SlotLost { why })
            }
            Err(e) => {
                self.metrics.error("lock");
                Some(Event::Transient {
                    error: format!("cannot prove the slot is still held before {what}: {e}"),
                })
            }
        }
    }

    /// Keep the slot's record fresh while holding it, so `lock.max_hold` never takes this node
    /// for dead. Runs beside the current action; never ends. Each action runs its own copy, whose
    /// timer starts with it: while every action is shorter than a beat (a check after the boot
    /// asked again every `gates.interval`, retries every `reboot.retry_interval`) it never
    /// fires, and [`Self::beat_if_due`] makes the beat between actions. `last` is when the record
    /// was last made fresh.
    async fn heartbeat(
        &self,
        held: bool,
        last: &std::sync::Mutex<Option<std::time::Instant>>,
    ) -> std::convert::Infallible {
        let Some(every) = self.semaphore.heartbeat_every().filter(|_| held) else {
            return std::future::pending().await;
        };
        loop {
            tokio::time::sleep(every).await;
            self.beat(last).await;
        }
    }

    /// Between two actions: make the beat when one is due (none was made for a beat's time).
    async fn beat_if_due(&self, held: bool, last: &std::sync::Mutex<Option<std::time::Instant>>) {
        let now = std::time::Instant::now();
        let Some(every) = self.semaphore.heartbeat_every().filter(|_| held) else {
            *last.lock().unwrap_or_else(|p| p.into_inner()) = None;
            return;
        };
        let since = *last.lock().unwrap_or_else(|p| p.into_inner());
        match since {
            // Just took the slot: taking it wrote the record.
            None => *last.lock().unwrap_or_else(|p| p.into_inner()) = Some(now),
            Some(at) if now.duration_since(at) >= every => self.beat(last).await,
            Some(_) => {}
        }
    }

    async fn beat(&self, last: &std::sync::Mutex<Option<std::time::Instant>>) {
        match self.semaphore.heartbeat(&self.me).await {
            Ok(Fence::Held) => debug!("heartbeat"),
            Ok(Fence::Lost { why }) => {
                warn!(%why, "heartbeat: this node no longer holds its slot (the next fence backs out)")
            }
            Err(e) => {
                self.metrics.error("lock");
                warn!(error = %e, "heartbeat failed; trying again at the next one")
            }
        }
        // Tried, whatever came of it: the next try a beat from now.
        *last.lock().unwrap_or_else(|p| p.into_inner()) = Some(std::time::Instant::now());
    }

    async fn call_reboot(&self, phase: Phase) -> Event {
        if let Some(lost) = self.fence("the reboot", phase).await {
            return lost;
        }
        // logind lets root through root's own block inhibitors: look at every one first.
        match self.rebooter.blockers().await {
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
            "Rebooting",
            "rebootd is asking logind to reboot the node",
            false,
        )
        .await;
        match self.rebooter.reboot().await {
            Ok(()) => Event::RebootAccepted,
            Err(e @ RebootError::Blocked { .. }) => {
                // Taken between the check and the call: wait for it like any other.
                if let Ok(by) = self.rebooter.blockers().await {
                    if !by.is_empty() {
                        return Event::Inhibited { by };
                    }
                }
                warn!(error = %e, "the reboot is blocked; will ask again");
                Event::RebootRefused {
                    error: e.to_string(),
                }
            }
            Err(e) => {
                error!(error = %e, "the reboot request failed; will ask again");
                self.metrics.error("logind");
                Event::RebootRefused {
                    error: e.to_string(),
                }
            }
        }
    }
}
