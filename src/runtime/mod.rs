//! The agent's runtime: performs the action the state asks for, turns its outcome into an event,
//! steps the pure state machine and writes the new state before the next action.
//!
//! The work is split by job: `wiring` builds the runtime from the configuration, `duty` says
//! what an action is to the loop (a wait or a call, interruptible or not), `seams` are the host
//! and node adapters it acts through, `executor` performs one action, `observers` take each
//! change of state to the state file and everything that shows it (in a fixed order), and
//! `heartbeat` keeps a held slot's record fresh. This file is the loop.

mod courtesy;
mod duty;
mod executor;
mod heartbeat;
mod observers;
mod seams;
mod slot;
mod wiring;

pub use seams::{HostSeams, NodeSeams};
pub use wiring::{
    check_host, check_reboot_method, holder_id, identity, open_coordinator, open_drainer,
    open_gates, open_semaphore, policy, read_id, resolve_logind_windows,
};

use crate::agent::{self, Event, Policy};
use crate::config::Config;
use crate::control;
use crate::lock::{self, LockError, Semaphore};
use crate::metrics::Metrics;
use crate::notify::{self, Watchdog};
use crate::state::{Phase, State, StateError, StateStore};
use crate::trigger::{self, Need, TriggerSource};
use duty::{duty, interruptible};
use jiff::Timestamp;
use observers::Reach;
use std::time::Duration;
use tokio::sync::mpsc;
use tracing::{debug, info, info_span, warn, Instrument};

/// How long start-up waits for the triggers to listen before it reports ready anyway.
const TRIGGERS_READY: Duration = Duration::from_secs(10);

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
    KubeClient(#[from] crate::kube_client::KubeClientError),
    #[error("kubernetes: {0}")]
    Drain(#[from] crate::drain::DrainError),
    #[error("metrics: {0}")]
    Metrics(String),
    #[error("webhook: {0}")]
    Webhook(String),
    #[error("gates: {0}")]
    Gates(#[from] crate::http::SetupError),
    /// `reboot.method = "soft-reboot"` on a systemd without soft reboots.
    #[error("reboot.method = \"soft-reboot\" needs systemd {needs} or later; this host runs systemd {version}")]
    SoftRebootUnsupported { needs: u32, version: String },
    #[error("systemd: {0}")]
    Systemd(#[from] crate::systemd::SystemdError),
    #[error("[[window]] source = \"logind\": {0}")]
    LogindWindow(String),
}

/// One running agent.
pub struct Runtime {
    config: Config,
    store: StateStore,
    semaphore: Box<dyn Semaphore>,
    host: HostSeams,
    /// This host's Kubernetes node, when `[kubernetes]` is configured.
    node: Option<NodeSeams>,
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
    /// report (`executor::REPORT_PROOF_FRESH`).
    reported_held: std::sync::Mutex<Option<(Phase, std::time::Instant)>>,
    /// The autoscaler's annotation was asked for in this hold (`courtesy`): once per hold.
    scale_down_asked: std::sync::atomic::AtomicBool,
    /// This node's fleet record, written when what it shows changes ([`crate::fleet`]).
    fleet: crate::fleet::publish::Publisher,
}

/// How the wait on an action ended.
enum Outcome {
    /// The action's outcome.
    Event(Event),
    /// A need that starts a cycle, to be applied now the idle wait is over.
    Need(Need),
    /// Decide again (an operator's request came, or a noted need changed the phase).
    Again,
}

/// The one-line status systemd shows: the phase and what it waits for.
fn status_line(s: &State) -> String {
    match &s.waiting_for {
        Some(w) => format!("{}: waiting for {w}", s.phase),
        None => s.phase.to_string(),
    }
}

impl Runtime {
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
        let triggers = trigger::spawn_all(
            &self.config.triggers,
            &self.store.request_path(),
            tx,
            last_reboot(&state),
        );
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
                    soft_reboots: self.host.manager().await.and_then(|m| m.soft_reboots),
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
                match self.request(state.clone(), envelope).await {
                    Ok(next) => state = next,
                    Err(e) => break Err(e),
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
            let outcome = {
                let perform = self.perform(&action, &decided).instrument(span);
                tokio::pin!(perform);
                let heartbeat = self.heartbeat(state.slot_held, &last_beat);
                tokio::pin!(heartbeat);
                loop {
                    tokio::select! {
                        event = watchdog.run(duty(&action), &mut perform) => break Outcome::Event(event),
                        never = &mut heartbeat => match never {},
                        // A wait gives way to an operator request (the loop applies it, then
                        // decides again); a call finishes first.
                        _ = inbox.arrived(), if interruptible(&action) => break Outcome::Again,
                        // A trigger is seen in every phase. Idle, it starts a cycle: the idle
                        // wait ends and the need is applied after it. Otherwise it is noted
                        // beside the action, which goes on undisturbed, and this cycle's reboot
                        // covers it; that step reaches nothing that could wait on what the
                        // action holds (`observers::Reach::Local`).
                        Some(need) = needs.recv() => {
                            if state.phase == Phase::Idle {
                                break Outcome::Need(need);
                            }
                            let before = state.phase;
                            match self.note(state.clone(), need, &mut last_noted, Reach::Local).await {
                                Ok(next) => state = next,
                                Err(e) => break 'run Err(e),
                            }
                            if state.phase != before {
                                break Outcome::Again;
                            }
                        }
                        _ = &mut shutdown => break 'run Ok(()),
                    }
                }
            };
            let next = match outcome {
                Outcome::Event(event) => self.apply(state.clone(), event).await,
                Outcome::Need(need) => {
                    self.note(state.clone(), need, &mut last_noted, Reach::Everything)
                        .await
                }
                Outcome::Again => continue,
            };
            match next {
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

    /// Apply an operator's request (pause, resume, cancel), said in the log even when it
    /// changes nothing (a cancel that comes too late). Backing out of this reboot, a Node gate's
    /// before-reboot label and annotations go, as they would right before the logind call.
    async fn request(
        &self,
        state: State,
        envelope: control::Envelope,
    ) -> Result<State, RuntimeError> {
        let request = envelope.request.name();
        let event = envelope.request.event();
        let why = agent::step(&state, event.clone(), Timestamp::now(), &self.policy).why;
        let requested_at = envelope.requested_at;
        info!(request, %requested_at, "operator request {request} (made {requested_at}): {why}");
        let before = state.phase;
        let state = self.apply(state, event).await?;
        if before != state.phase && matches!(state.phase, Phase::Uncordoning | Phase::Releasing) {
            if let Err(e) = self.gates.used().await {
                warn!(error = %e, "cannot remove the Node gates' label: {e}");
            }
        }
        Ok(state)
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
        // The metrics see the state as loaded (a reboot's request, before the step that sees
        // the new boot), so they can tell how long the reboot took.
        self.metrics.observe(&state, Timestamp::now());
        if state.slot_held && self.semaphore.heartbeat_every().is_some() {
            info!("holding a slot: showing the lock store this node is alive first");
            self.beat(last_beat).await;
        }
        Ok(state)
    }

    /// Apply a trigger's word. Idle, it starts a cycle; in a cycle it is noted and covered by
    /// that cycle's reboot (after the boot, by the next cycle). A `rebootctl reboot` request is
    /// consumed once its need is on record, so it never outlives the cycle that served it.
    async fn note(
        &self,
        state: State,
        need: Need,
        last_noted: &mut Option<String>,
        reach: Reach,
    ) -> Result<State, RuntimeError> {
        let said = need.to_string();
        let (phase, source) = (state.phase, need.source);
        let next = self
            .apply_reaching(state, Event::RebootNeeded { need }, reach)
            .await?;
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
}

/// The last reboot, for the sentinel file found at start: the one seen before, or a soft
/// reboot on record that this start may be the end of (the boot id stays, /run with it,
/// sentinel files included). Not only one logind accepted: a soft reboot stops rebootd, maybe
/// before it saved that. Should it not have happened, the need is still on record and asked
/// for again.
fn last_reboot(state: &State) -> Option<std::time::SystemTime> {
    state
        .reboot
        .as_ref()
        .filter(|r| r.kind.may_be_soft())
        .map(|r| r.requested_at)
        .max(state.last_reboot)
        .map(std::time::SystemTime::from)
}
