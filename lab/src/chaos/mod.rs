//! `rebootd-lab chaos`: chaos trials over a lab fleet.
//!
//! Each trial starts a small fleet (default 5 real rebootd processes, max 2 at once) whose nodes
//! carry ReplicaSet pods (one ReplicaSet under a PodDisruptionBudget with `maxUnavailable: 1`)
//! in the Kubernetes API stand-in, so every drain evicts pods. The slots live in etcd (locksmith
//! document) or in Lease objects. The lab triggers an update on every node and, while the
//! rollout runs, from a seeded generator: kills rebootd at random moments and right after a
//! chosen phase is written to the state file, kills it between a reboot request and the
//! simulated reboot, delays the simulated reboot, stops or freezes (SIGSTOP) etcd, and makes the
//! API stand-in answer 500, 429 or 409 or hang (evictions included). Then it checks the
//! invariants ([`check`], RELIABILITY.md).
//!
//! Modules: [`check`] the invariants as pure functions of what a trial observed; `trial` one
//! trial (set-up, rollout, observation, tear-down); `disrupt` the chaos itself; `watch` the
//! outside watchers; `workload` the pods; `inject` the violations the lab commits itself for
//! the checker's self-test; `cutoff` the node cut off from the store and the node whose clock
//! is off; `store` the nodes' configuration and the semaphore document in etcd v3 or v2; `cli`
//! the command line.
//!
//! This module runs its own fleet loop (from [`crate::node::Node`], [`crate::etcd::EtcdServer`]
//! and the API stand-in) rather than [`crate::fleet::Fleet`], because it needs the reboot to be
//! delayed and rebootd to be killed while a reboot is pending.

mod alert_gate;
pub mod check;
mod cli;
pub mod cutoff;
mod disrupt;
pub mod gates;
mod inject;
mod members;
mod mixed;
mod operator;
mod report;
mod rng;
mod stats;
mod store;
mod trial;
pub mod two_docs;
mod watch;
pub mod windows;
mod workload;
pub mod zones;

pub use cli::command;
pub use inject::Violation;
pub use members::MemberFault;
pub use rng::Rng;
pub use stats::Stats;
pub use trial::trial;

use crate::etcd::EtcdVersion;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Where the semaphore lives in a trial (the Nodes are drained in the API stand-in either way).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// locksmith's document in etcd v3 (rebootd's default `[lock.etcd] api = "v3"`).
    Etcd,
    /// locksmith's document in etcd's v2 keys API (`[lock.etcd] api = "v2"`), where locksmith
    /// itself keeps it.
    EtcdV2,
    Kubernetes,
    /// A FleetLock server, the real airlock, keeping its own semaphore in etcd v3.
    FleetLock,
}

impl Backend {
    /// Whether the semaphore is locksmith's document in etcd (v3 or v2).
    pub fn etcd(self) -> bool {
        matches!(self, Backend::Etcd | Backend::EtcdV2)
    }

    /// Whether the trial runs an etcd (stopped and frozen by the chaos): the locksmith
    /// document's, or airlock's.
    pub fn uses_etcd(self) -> bool {
        self.etcd() || self == Backend::FleetLock
    }
}

impl std::str::FromStr for Backend {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "etcd" | "etcd-v3" => Ok(Backend::Etcd),
            "etcd-v2" => Ok(Backend::EtcdV2),
            "kubernetes" | "kube" => Ok(Backend::Kubernetes),
            "fleetlock" | "airlock" => Ok(Backend::FleetLock),
            other => Err(format!(
                "backend {other:?}: expected etcd, etcd-v2, kubernetes or fleetlock"
            )),
        }
    }
}

impl std::fmt::Display for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Backend::Etcd => "etcd",
            Backend::EtcdV2 => "etcd-v2",
            Backend::Kubernetes => "kubernetes",
            Backend::FleetLock => "fleetlock",
        })
    }
}

/// The default `--trial-timeout`.
pub const DEFAULT_TRIAL_TIMEOUT: Duration = Duration::from_secs(150);

/// How chaos trials run.
#[derive(Debug, Clone)]
pub struct ChaosOptions {
    /// The rebootd binary (rebootctl is expected beside it).
    pub rebootd: PathBuf,
    pub trials: usize,
    /// Trial `k` runs with seed `seed + k`; `--trials 1 --seed <that>` replays it.
    pub seed: u64,
    pub nodes: usize,
    pub max: u64,
    pub backend: Backend,
    pub etcd: EtcdVersion,
    /// How long a simulated reboot keeps a node down; rebootd's `reboot.boot_time`.
    pub reboot_time: Duration,
    /// After the simulated reboot, until the Node is Ready again.
    pub ready_delay: Duration,
    /// rebootd's `reboot.timeout`: how long it waits for a reboot it may have asked for (it
    /// cannot tell after a crash) before asking again. rebootd's default is 10 min; a trial
    /// uses less so that a kill between writing the request and calling logind is recovered
    /// within the trial (see RELIABILITY.md).
    pub reboot_timeout: Duration,
    /// How many disruptive actions the chaos loop takes at most in one trial.
    pub actions: usize,
    /// A trial whose rollout has not completed by then fails (liveness).
    pub trial_timeout: Duration,
    /// Copy the nodes' logs of a failing trial under this directory.
    pub keep_logs: Option<PathBuf>,
    /// Start no new trial after this long (the run may end before `trials`).
    pub duration: Option<Duration>,
    /// Checker self-test: the lab itself breaks this invariant mid-trial, so the trial must
    /// fail.
    pub inject: Option<Violation>,
    /// rebootd's `lock.max_hold`: holders silent this long may be reclaimed. rebootd refuses a
    /// `max_hold` shorter than `drain_timeout + reboot_timeout + reboot_time + ready_timeout`
    /// (checked by [`ChaosOptions::check`]).
    pub max_hold: Option<Duration>,
    /// rebootd's `kubernetes.drain_timeout`.
    pub drain_timeout: Duration,
    /// rebootd's `kubernetes.ready_timeout`.
    pub ready_timeout: Duration,
    /// One node per trial reaches the store through a [`crate::cut_proxy::CutProxy`] that the
    /// chaos cuts (blackhole or reset) for a while, longer than `max_hold` in some trials.
    pub cut_off: bool,
    /// One node per trial runs with its clock hours off (libfaketime).
    pub skew_clock: bool,
    /// etcd members: 1 (a single etcd, stopped and frozen as a whole) or more (a cluster whose
    /// members the chaos disrupts one at a time with `member_faults`).
    pub etcd_members: usize,
    /// The faults of a multi-member etcd the chaos takes.
    pub member_faults: Vec<MemberFault>,
    /// An operator runs `rebootctl` beside the chaos (pause, resume, cancel, unlock,
    /// set-max; up to `actions` of them).
    pub operators: bool,
    /// Every node gets maintenance windows a few seconds long that open and close throughout
    /// the rollout (on its own clock, with `skew_clock`).
    pub windows: bool,
    /// Every node has a command gate before the reboot whose answer the lab flips (go, wait,
    /// hang past its time-out).
    pub gates: bool,
    /// How many of the `nodes` run the real locksmithd instead of rebootd, on the same v2
    /// semaphore (`--backend etcd-v2`); they are named `locksmith-1`, ...
    pub mixed: usize,
    /// Mid-rollout, once the locksmithd nodes are done, the operator runs `rebootctl migrate`
    /// (the semaphore moves to v3; the rebootd nodes, on `api = "v2"`, follow it).
    pub migrate: bool,
    /// `--zones K`: the nodes spread over K zones, rebootd with `lock.max_per_zone`
    /// ([`zones`]); 0: no zones.
    pub zones: usize,
    /// rebootd's `lock.max_per_zone` with `zones`.
    pub max_per_zone: u64,
}

/// The default `kubernetes.drain_timeout` and `ready_timeout` of a trial.
pub const DEFAULT_KUBE_TIMEOUT: Duration = Duration::from_secs(60);

impl ChaosOptions {
    pub fn new(rebootd: impl Into<PathBuf>) -> ChaosOptions {
        ChaosOptions {
            rebootd: rebootd.into(),
            trials: 1,
            seed: 1,
            nodes: 5,
            max: 2,
            backend: Backend::Etcd,
            etcd: EtcdVersion::V34,
            reboot_time: Duration::from_millis(300),
            ready_delay: Duration::from_millis(200),
            reboot_timeout: Duration::from_secs(15),
            actions: 10,
            trial_timeout: DEFAULT_TRIAL_TIMEOUT,
            keep_logs: Some(std::env::temp_dir()),
            duration: None,
            inject: None,
            max_hold: None,
            drain_timeout: DEFAULT_KUBE_TIMEOUT,
            ready_timeout: DEFAULT_KUBE_TIMEOUT,
            cut_off: false,
            skew_clock: false,
            etcd_members: 1,
            member_faults: MemberFault::ALL.to_vec(),
            operators: false,
            windows: false,
            gates: false,
            mixed: 0,
            migrate: false,
            zones: 0,
            max_per_zone: 1,
        }
    }

    /// rebootd's own rule, said before any trial starts: `max_hold` must outlast a live
    /// holder's drain, reboot, boot and wait for Ready.
    pub fn check(&self) -> Result<(), String> {
        if self.etcd_members > 1 && !self.backend.etcd() {
            return Err("--etcd-members: the semaphore is not in etcd (--backend)".into());
        }
        if self.etcd_members > 1 && self.cut_off {
            return Err("--cut-off is not supported with --etcd-members > 1 yet".into());
        }
        if self.backend == Backend::FleetLock && (self.cut_off || self.max_hold.is_some()) {
            return Err(
                "--backend fleetlock: no --cut-off or --max-hold (the server owns the semaphore)"
                    .into(),
            );
        }
        if self.gates && self.skew_clock {
            return Err(
                "--gates with --skew-clock: the gate's log is read on the lab's clock".into(),
            );
        }
        if self.operators && !self.backend.etcd() {
            return Err(
                "--operators: only with the semaphore in etcd (--backend etcd or etcd-v2)".into(),
            );
        }
        if (self.mixed > 0 || self.migrate) && self.backend != Backend::EtcdV2 {
            return Err(
                "--mixed, --migrate: locksmithd's semaphore is in etcd v2 (--backend etcd-v2)"
                    .into(),
            );
        }
        if (self.mixed > 0 || self.migrate)
            && (self.etcd_members > 1 || self.operators || self.cut_off || self.max_hold.is_some())
        {
            return Err(
                "--mixed, --migrate: not with --etcd-members, --operators, --cut-off or --max-hold yet".into(),
            );
        }
        if self.mixed >= self.nodes {
            return Err(format!(
                "--mixed {}: at least one of the {} nodes must run rebootd",
                self.mixed, self.nodes
            ));
        }
        if self.etcd_members == 0 || self.etcd_members.is_multiple_of(2) {
            return Err(format!(
                "--etcd-members {}: expected an odd number (1, 3, 5)",
                self.etcd_members
            ));
        }
        let Some(max_hold) = self.max_hold else {
            return Ok(());
        };
        let total =
            self.drain_timeout + self.reboot_timeout + self.reboot_time + self.ready_timeout;
        if max_hold < total {
            return Err(format!(
                "--max-hold {max_hold:?} is shorter than --drain-timeout {:?} + --reboot-timeout {:?} + --reboot-time {:?} + --ready-timeout {:?} = {total:?}: rebootd refuses such a lock.max_hold",
                self.drain_timeout, self.reboot_timeout, self.reboot_time, self.ready_timeout
            ));
        }
        Ok(())
    }
}

/// The outcome of one trial.
#[derive(Debug, Clone)]
pub struct TrialReport {
    pub seed: u64,
    pub backend: Backend,
    /// Every invariant that did not hold (empty = the trial passed).
    pub violations: Vec<String>,
    pub duration: Duration,
    pub stats: Stats,
    pub max_holders_seen: usize,
    pub max_cordoned_seen: usize,
    /// Where the nodes' logs were copied when the trial failed.
    pub logs: Option<PathBuf>,
    /// The run was stopped ([`Stop`]) during this trial: it was torn down, not checked.
    pub interrupted: bool,
}

impl TrialReport {
    pub fn ok(&self) -> bool {
        self.violations.is_empty()
    }
}

/// The outcome of a run of trials.
#[derive(Debug, Clone, Default)]
pub struct RunReport {
    /// The trials that ran to the end and were checked.
    pub trials: Vec<TrialReport>,
    /// The seed of the trial the run was stopped in (torn down, not checked).
    pub interrupted: Option<u64>,
    /// The run was stopped ([`Stop`]) before running all its trials.
    pub stopped: bool,
}

impl RunReport {
    pub fn failures(&self) -> Vec<&TrialReport> {
        self.trials.iter().filter(|t| !t.ok()).collect()
    }

    pub fn stats(&self) -> Stats {
        let mut s = Stats::default();
        for t in &self.trials {
            s.add(&t.stats);
        }
        s
    }
}

/// Asks a run to stop: the trial in progress stops at its next check (within about 100 ms of
/// its set-up steps or of the rollout), tears down its processes, and no new trial starts.
#[derive(Debug, Clone)]
pub struct Stop(Arc<tokio::sync::watch::Sender<bool>>);

impl Default for Stop {
    fn default() -> Self {
        Stop(Arc::new(tokio::sync::watch::Sender::new(false)))
    }
}

impl Stop {
    pub fn new() -> Stop {
        Stop::default()
    }

    pub fn set(&self) {
        self.0.send_replace(true);
    }

    pub fn is_set(&self) -> bool {
        *self.0.borrow()
    }

    /// Returns once [`Stop::set`] was called.
    pub async fn wait(&self) {
        let mut rx = self.0.subscribe();
        let _ = rx.wait_for(|v| *v).await;
    }
}

/// Run `opts.trials` trials one after the other; `progress` sees each report as it comes. When
/// `stop` is set, the trial in progress is torn down (not checked) and the run ends.
pub async fn run(
    opts: &ChaosOptions,
    stop: &Stop,
    mut progress: impl FnMut(&TrialReport),
) -> RunReport {
    let mut report = RunReport::default();
    let started = Instant::now();
    for k in 0..opts.trials {
        if stop.is_set() {
            report.stopped = true;
            break;
        }
        if opts.duration.is_some_and(|d| started.elapsed() >= d) {
            break;
        }
        let t = trial(opts, opts.seed.wrapping_add(k as u64), stop).await;
        if t.interrupted {
            report.interrupted = Some(t.seed);
            report.stopped = true;
            break;
        }
        progress(&t);
        report.trials.push(t);
    }
    report
}

/// The command line that replays a trial.
pub fn replay_command(opts: &ChaosOptions, seed: u64) -> String {
    let mut cmd = format!(
        "rebootd-lab chaos --trials 1 --seed {seed} --nodes {} --max {} --backend {} --reboot-time {}ms --reboot-timeout {}ms --actions {}",
        opts.nodes,
        opts.max,
        opts.backend,
        opts.reboot_time.as_millis(),
        opts.reboot_timeout.as_millis(),
        opts.actions
    );
    if let Some(m) = opts.max_hold {
        cmd.push_str(&format!(
            " --max-hold {}ms --drain-timeout {}ms --ready-timeout {}ms",
            m.as_millis(),
            opts.drain_timeout.as_millis(),
            opts.ready_timeout.as_millis()
        ));
    }
    if opts.cut_off {
        cmd.push_str(" --cut-off");
    }
    if opts.skew_clock {
        cmd.push_str(" --skew-clock");
    }
    if opts.etcd != EtcdVersion::V34 && opts.backend.uses_etcd() {
        cmd.push_str(&format!(" --etcd {}", opts.etcd.as_str()));
    }
    if opts.etcd_members > 1 {
        let faults: Vec<String> = opts.member_faults.iter().map(|f| f.to_string()).collect();
        cmd.push_str(&format!(
            " --etcd-members {} --faults {}",
            opts.etcd_members,
            faults.join(",")
        ));
    }
    if opts.operators {
        cmd.push_str(" --operators");
    }
    if opts.zones > 0 {
        cmd.push_str(&format!(
            " --zones {} --max-per-zone {}",
            opts.zones, opts.max_per_zone
        ));
    }
    if opts.windows {
        cmd.push_str(" --windows");
    }
    if opts.gates {
        cmd.push_str(" --gates");
    }
    if opts.mixed > 0 {
        cmd.push_str(&format!(" --mixed {}", opts.mixed));
    }
    if opts.migrate {
        cmd.push_str(" --migrate");
    }
    if opts.trial_timeout != DEFAULT_TRIAL_TIMEOUT {
        cmd.push_str(&format!(
            " --trial-timeout {}ms",
            opts.trial_timeout.as_millis()
        ));
    }
    if let Some(v) = opts.inject {
        cmd.push_str(&format!(" --inject-violation {v}"));
    }
    cmd
}
