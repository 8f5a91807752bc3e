//! `rebootd-lab chaos`: chaos trials over a lab fleet.
//!
//! Each trial starts a small fleet (default 5 real rebootd processes, max 2 at once) that drains
//! its Nodes in the Kubernetes API stand-in and takes slots in etcd (locksmith document) or in
//! Lease objects, triggers an update on every node, and while the rollout runs, from a seeded
//! generator: kills rebootd at random moments and right after a chosen phase is written to the
//! state file (inotify on the state directory), kills it between a reboot request and the
//! simulated reboot, delays the simulated reboot, stops or freezes (SIGSTOP) etcd, and makes the
//! API stand-in answer 500, 429 or 409 or hang. Then it checks the invariants (see
//! [`TrialReport::violations`] and RELIABILITY.md).
//!
//! This module runs its own fleet loop (from [`Node`], [`EtcdServer`] and the API stand-in)
//! rather than [`crate::fleet::Fleet`], because it needs the reboot to be delayed and rebootd to
//! be killed while a reboot is pending.

mod rng;

pub use rng::Rng;

use crate::etcd::{EtcdServer, EtcdVersion};
use crate::kube_api::{
    FaultRule, Kind, KubeApi, KubeApiHandle, NodeBuilder, Options as KubeOptions,
};
use crate::node::{Node, NodeOptions};
use clap::Parser;
use futures_util::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node as KubeNode;
use kube::api::{Api, WatchEvent, WatchParams};
use rebootd::lock::document::{semaphore_key, SemaphoreDoc};
use rebootd::state::{Phase, State, StateStore};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Where the semaphore lives in a trial (the Nodes are drained in the API stand-in either way).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Etcd,
    Kubernetes,
}

impl std::str::FromStr for Backend {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "etcd" => Ok(Backend::Etcd),
            "kubernetes" | "kube" => Ok(Backend::Kubernetes),
            other => Err(format!("backend {other:?}: expected etcd or kubernetes")),
        }
    }
}

impl std::fmt::Display for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Backend::Etcd => "etcd",
            Backend::Kubernetes => "kubernetes",
        })
    }
}

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
    /// How long a simulated reboot keeps a node down.
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
}

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
            trial_timeout: Duration::from_secs(150),
            keep_logs: Some(std::env::temp_dir()),
            duration: None,
        }
    }
}

/// What the chaos did in one trial.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    /// rebootd killed (SIGKILL) at a random moment and restarted.
    pub kills: u32,
    /// rebootd killed right after the state file said this phase.
    pub phase_kills: BTreeMap<String, u32>,
    /// rebootd killed after asking logind to reboot, before the reboot happened.
    pub pending_reboot_kills: u32,
    /// Simulated reboots that were delayed after the request.
    pub delayed_reboots: u32,
    pub etcd_stops: u32,
    pub etcd_pauses: u32,
    /// API stand-in faults injected, by answer (`500`, `429`, `409`, `hang`).
    pub api_faults: BTreeMap<String, u32>,
    /// Reboot calls logind accepted (several may lead to one reboot).
    pub reboot_calls: u32,
}

impl Stats {
    fn add(&mut self, o: &Stats) {
        self.kills += o.kills;
        for (k, v) in &o.phase_kills {
            *self.phase_kills.entry(k.clone()).or_default() += v;
        }
        self.pending_reboot_kills += o.pending_reboot_kills;
        self.delayed_reboots += o.delayed_reboots;
        self.etcd_stops += o.etcd_stops;
        self.etcd_pauses += o.etcd_pauses;
        for (k, v) in &o.api_faults {
            *self.api_faults.entry(k.clone()).or_default() += v;
        }
        self.reboot_calls += o.reboot_calls;
    }
}

impl std::fmt::Display for Stats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let phase: u32 = self.phase_kills.values().sum();
        let api: u32 = self.api_faults.values().sum();
        write!(
            f,
            "kills {} (at a phase {}, reboot pending {}), delayed reboots {}, etcd stops {} pauses {}, api faults {}, reboot calls {}",
            self.kills,
            phase,
            self.pending_reboot_kills,
            self.delayed_reboots,
            self.etcd_stops,
            self.etcd_pauses,
            api,
            self.reboot_calls
        )
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
}

impl TrialReport {
    pub fn ok(&self) -> bool {
        self.violations.is_empty()
    }
}

/// The outcome of a run of trials.
#[derive(Debug, Clone, Default)]
pub struct RunReport {
    pub trials: Vec<TrialReport>,
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

/// Run `opts.trials` trials one after the other; `progress` sees each report as it comes.
pub async fn run(opts: &ChaosOptions, mut progress: impl FnMut(&TrialReport)) -> RunReport {
    let mut report = RunReport::default();
    let started = Instant::now();
    for k in 0..opts.trials {
        if opts.duration.is_some_and(|d| started.elapsed() >= d) {
            break;
        }
        let t = trial(opts, opts.seed.wrapping_add(k as u64)).await;
        progress(&t);
        report.trials.push(t);
    }
    report
}

/// The command line that replays a trial.
pub fn replay_command(opts: &ChaosOptions, seed: u64) -> String {
    format!(
        "rebootd-lab chaos --trials 1 --seed {seed} --nodes {} --max {} --backend {} --reboot-time {}ms --reboot-timeout {}ms --actions {}",
        opts.nodes,
        opts.max,
        opts.backend,
        opts.reboot_time.as_millis(),
        opts.reboot_timeout.as_millis(),
        opts.actions
    )
}

#[derive(Debug, Parser)]
#[command(
    name = "rebootd-lab chaos",
    about = "Chaos trials: a small fleet rolls out an update while rebootd, etcd and the API are disrupted; invariants are checked after each trial"
)]
struct Cli {
    #[arg(long, default_value_t = 10)]
    trials: usize,
    /// Trial k runs with seed S+k; a failing trial prints its own seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    #[arg(long, default_value_t = 5)]
    nodes: usize,
    #[arg(long, default_value_t = 2)]
    max: u64,
    /// etcd (locksmith document) or kubernetes (Leases); Nodes are drained either way.
    #[arg(long, default_value = "etcd")]
    backend: Backend,
    /// etcd version: 3.4 or 3.5.
    #[arg(long, default_value = "3.4")]
    etcd: String,
    #[arg(long, default_value = "300ms", value_parser = rebootd::config::parse_duration)]
    reboot_time: Duration,
    /// rebootd's reboot.timeout in the trial (rebootd's own default is 10m).
    #[arg(long, default_value = "15s", value_parser = rebootd::config::parse_duration)]
    reboot_timeout: Duration,
    /// Disruptive actions per trial at most.
    #[arg(long, default_value_t = 10)]
    actions: usize,
    #[arg(long, default_value = "150s", value_parser = rebootd::config::parse_duration)]
    trial_timeout: Duration,
    /// Where to copy the logs of failing trials (default: the temporary directory).
    #[arg(long)]
    keep_logs: Option<PathBuf>,
    /// Start no new trial after this long (e.g. 25m): a time-boxed long run.
    #[arg(long, value_parser = rebootd::config::parse_duration)]
    duration: Option<Duration>,
    /// The rebootd binary (default: $REBOOTD_BIN, else beside this program).
    #[arg(long)]
    rebootd: Option<PathBuf>,
}

/// Parse the arguments after `chaos` and run.
pub async fn cli(args: Vec<String>) -> Result<(), String> {
    let cli = Cli::try_parse_from(std::iter::once("chaos".to_string()).chain(args))
        .map_err(|e| e.to_string())?;
    let etcd = match cli.etcd.as_str() {
        "3.4" => EtcdVersion::V34,
        "3.5" => EtcdVersion::V35,
        other => return Err(format!("--etcd {other}: expected 3.4 or 3.5")),
    };
    let rebootd = cli
        .rebootd
        .or_else(|| std::env::var_os("REBOOTD_BIN").map(PathBuf::from))
        .or_else(|| {
            std::env::current_exe()
                .ok()
                .and_then(|p| p.parent().map(|d| d.join("rebootd")))
        })
        .unwrap_or_else(|| PathBuf::from("rebootd"));
    if !rebootd.exists() {
        return Err(format!(
            "no rebootd binary at {} (build with `cargo build --workspace`, or pass --rebootd)",
            rebootd.display()
        ));
    }
    let opts = ChaosOptions {
        trials: cli.trials,
        seed: cli.seed,
        nodes: cli.nodes,
        max: cli.max,
        backend: cli.backend,
        etcd,
        reboot_time: cli.reboot_time,
        reboot_timeout: cli.reboot_timeout,
        actions: cli.actions,
        trial_timeout: cli.trial_timeout,
        keep_logs: Some(cli.keep_logs.unwrap_or_else(std::env::temp_dir)),
        duration: cli.duration,
        ..ChaosOptions::new(rebootd)
    };
    println!(
        "chaos: {} trials from seed {}, {} nodes, max {}, backend {}, reboot time {:?}, reboot.timeout {:?}, up to {} actions each",
        opts.trials,
        opts.seed,
        opts.nodes,
        opts.max,
        opts.backend,
        opts.reboot_time,
        opts.reboot_timeout,
        opts.actions
    );
    let started = Instant::now();
    let mut done = 0usize;
    let report = run(&opts, |t| {
        done += 1;
        if t.ok() {
            println!(
                "trial {done}/{} seed {}: ok in {:.1}s (max holders {}, max cordoned {}; {})",
                opts.trials,
                t.seed,
                t.duration.as_secs_f64(),
                t.max_holders_seen,
                t.max_cordoned_seen,
                t.stats
            );
        } else {
            println!(
                "trial {done}/{} seed {}: FAILED in {:.1}s ({})",
                opts.trials,
                t.seed,
                t.duration.as_secs_f64(),
                t.stats
            );
            for v in &t.violations {
                println!("  - {v}");
            }
            if let Some(l) = &t.logs {
                println!("  logs: {}", l.display());
            }
            println!("  replay: {}", replay_command(&opts, t.seed));
        }
    })
    .await;
    let failures = report.failures();
    let stats = report.stats();
    println!(
        "chaos: kills after phase write: {:?}; API faults: {:?}",
        stats.phase_kills, stats.api_faults
    );
    println!(
        "chaos: {} trials in {:.0}s, {} failed; total: {}",
        report.trials.len(),
        started.elapsed().as_secs_f64(),
        failures.len(),
        report.stats()
    );
    if failures.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{} of {} trials failed; seeds: {}",
            failures.len(),
            report.trials.len(),
            failures
                .iter()
                .map(|t| t.seed.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ))
    }
}

/// One lab node as the chaos sees it.
struct ChaosNode {
    name: String,
    node: tokio::sync::Mutex<Node>,
    store: StateStore,
    machine_id: String,
    log_path: PathBuf,
    /// Between the simulated reboot's kill and the next boot's start.
    down: AtomicBool,
    /// Kill rebootd right after the state file says this phase.
    armed: Mutex<Option<Phase>>,
    /// Simulated reboots that happened.
    reboots: AtomicU32,
}

/// What the trial's tasks record.
struct Shared {
    started: Instant,
    stats: Mutex<Stats>,
    /// Every holder set the outside watcher saw, in order.
    holders: Mutex<Vec<(Duration, BTreeSet<String>)>>,
    max_holders: AtomicUsize,
    max_cordoned: AtomicUsize,
    /// (when, node) of each simulated reboot, and whether the node held a slot then (kube: read
    /// in-process at that instant; etcd: decided afterwards from the watcher's history).
    downs: Mutex<Vec<(Duration, String, Option<bool>)>>,
    problems: Mutex<Vec<String>>,
    stop: AtomicBool,
}

impl Shared {
    fn stats(&self, f: impl FnOnce(&mut Stats)) {
        if let Ok(mut s) = self.stats.lock() {
            f(&mut s);
        }
    }

    fn problem(&self, p: String) {
        if let Ok(mut v) = self.problems.lock() {
            v.push(p);
        }
    }

    fn record_holders(&self, holders: BTreeSet<String>) {
        self.max_holders.fetch_max(holders.len(), Ordering::SeqCst);
        if let Ok(mut h) = self.holders.lock() {
            h.push((self.started.elapsed(), holders));
        }
    }
}

/// Aborts the tasks when dropped.
struct Tasks(Vec<tokio::task::JoinHandle<()>>);

impl Drop for Tasks {
    fn drop(&mut self) {
        for t in &self.0 {
            t.abort();
        }
    }
}

/// Run one trial with `seed`.
pub async fn trial(opts: &ChaosOptions, seed: u64) -> TrialReport {
    let started = Instant::now();
    let shared = Arc::new(Shared {
        started,
        stats: Mutex::new(Stats::default()),
        holders: Mutex::new(Vec::new()),
        max_holders: AtomicUsize::new(0),
        max_cordoned: AtomicUsize::new(0),
        downs: Mutex::new(Vec::new()),
        problems: Mutex::new(Vec::new()),
        stop: AtomicBool::new(false),
    });
    let mut logs = None;
    let violations = match run_trial(opts, seed, &shared, &mut logs).await {
        Ok(v) => v,
        Err(e) => vec![format!("harness: {e}")],
    };
    let stats = shared.stats.lock().map(|s| s.clone()).unwrap_or_default();
    TrialReport {
        seed,
        backend: opts.backend,
        violations,
        duration: started.elapsed(),
        stats,
        max_holders_seen: shared.max_holders.load(Ordering::SeqCst),
        max_cordoned_seen: shared.max_cordoned.load(Ordering::SeqCst),
        logs,
    }
}

/// The phases after whose write the chaos may kill rebootd.
const PHASES: &[Phase] = &[
    Phase::RebootNeeded,
    Phase::AcquiringSlot,
    Phase::Draining,
    Phase::Rebooting,
    Phase::WaitingForHealthy,
    Phase::Uncordoning,
    Phase::Releasing,
    Phase::Idle,
];

/// Paths the API faults aim at: what rebootd asks for one object at a time. The outside
/// watchers' requests (collection watches, made before the chaos starts) never match.
const FAULT_PATHS: &[&str] = &["/leases/", "/nodes/", "/events", "/pods"];

async fn run_trial(
    opts: &ChaosOptions,
    seed: u64,
    shared: &Arc<Shared>,
    logs: &mut Option<PathBuf>,
) -> Result<Vec<String>, String> {
    let mut rng = Rng::fork(seed, 0);
    let dir = tempfile::Builder::new()
        .prefix("rebootd-chaos-")
        .tempdir()
        .map_err(|e| format!("temp dir: {e}"))?;
    let names: Vec<String> = (1..=opts.nodes).map(|i| format!("node-{i}")).collect();
    // The API stand-in: one Node per lab node (drained by rebootd; the Lease backend too).
    let kube = KubeApi::start(KubeOptions {
        pod_ready_delay: Duration::from_millis(100),
        ..KubeOptions::default()
    })
    .await
    .map_err(|e| format!("kube API stand-in: {e}"))?;
    for name in &names {
        kube.cluster()
            .add(&NodeBuilder::new(name))
            .map_err(|e| format!("add node {name}: {e}"))?;
    }
    let kubeconfig = dir.path().join("kubeconfig");
    kube.write_kubeconfig(&kubeconfig)
        .map_err(|e| format!("kubeconfig: {e}"))?;
    let etcd = match opts.backend {
        Backend::Etcd => {
            let etcd = EtcdServer::start(opts.etcd)
                .await
                .map_err(|e| format!("etcd: {e}"))?;
            let doc = SemaphoreDoc {
                semaphore: opts.max as i64,
                max: opts.max,
                holders: Vec::new(),
            };
            let mut client = etcd_client::Client::connect([etcd.endpoint()], None)
                .await
                .map_err(|e| format!("etcd client: {e}"))?;
            client
                .put(semaphore_key("default"), doc.to_json(), None)
                .await
                .map_err(|e| format!("etcd put: {e}"))?;
            Some(etcd)
        }
        Backend::Kubernetes => None,
    };
    let lock_config = match &etcd {
        Some(e) => format!(
            "[lock]\nbackend = \"etcd\"\n\n[lock.etcd]\nendpoints = [{:?}]\n",
            e.endpoint()
        ),
        None => format!(
            "[lock]\nbackend = \"kubernetes\"\n\n[lock.kubernetes]\nnamespace = \"kube-system\"\nname = \"rebootd\"\nkubeconfig = {kubeconfig:?}\n"
        ),
    };
    let config = format!(
        "[identity]\ngroup = \"default\"\n\n{lock_config}\n[kubernetes]\nkubeconfig = {kubeconfig:?}\ndrain_timeout = \"60s\"\nready_timeout = \"60s\"\n\n[reboot]\ntimeout = \"{}ms\"\n",
        opts.reboot_timeout.as_millis()
    );
    let etcd_endpoint = etcd.as_ref().map(|e| e.endpoint());
    let etcd = Arc::new(tokio::sync::Mutex::new(etcd));

    // The outside watchers, started (and their requests made) before anything else happens.
    let mut tasks = Tasks(Vec::new());
    let client = rebootd::kube_client::connect(Some(&kubeconfig))
        .await
        .map_err(|e| format!("kube client: {e}"))?;
    tasks
        .0
        .push(tokio::spawn(watch_cordons(client.clone(), shared.clone())));

    let mut nodes = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let mut node_opts = NodeOptions::new(name).config(&config);
        let set_max = opts.backend == Backend::Kubernetes && i == 0;
        node_opts.start_daemon = !set_max;
        let mut node = Node::start(&opts.rebootd, node_opts)
            .await
            .map_err(|e| format!("start {name}: {e}"))?;
        if set_max {
            let rebootctl = opts.rebootd.with_file_name("rebootctl");
            let out = node
                .command(&rebootctl)
                .args(["set-max", &opts.max.to_string(), "--force"])
                .output()
                .await
                .map_err(|e| format!("rebootctl set-max: {e}"))?;
            if !out.status.success() {
                return Err(format!(
                    "rebootctl set-max: {}",
                    String::from_utf8_lossy(&out.stderr)
                ));
            }
            node.start_daemon()
                .map_err(|e| format!("start rebootd: {e}"))?;
        }
        post_boot_id(&kube, name, &node.boot_id());
        let calls = node.logind.subscribe();
        let cn = Arc::new(ChaosNode {
            name: name.clone(),
            store: node.store(),
            machine_id: node.machine_id.clone(),
            log_path: node.log_path(),
            node: tokio::sync::Mutex::new(node),
            down: AtomicBool::new(false),
            armed: Mutex::new(None),
            reboots: AtomicU32::new(0),
        });
        tasks.0.push(tokio::spawn(simulated_reboots(
            cn.clone(),
            calls,
            shared.clone(),
            Rng::fork(seed, 100 + i as u64),
            kube.cluster().clone(),
            opts.reboot_time,
            opts.ready_delay,
            opts.backend == Backend::Kubernetes,
        )));
        tasks
            .0
            .push(tokio::spawn(phase_killer(cn.clone(), shared.clone())));
        nodes.push(cn);
    }
    let ids: Vec<(String, String)> = nodes
        .iter()
        .map(|n| (n.machine_id.clone(), n.name.clone()))
        .collect();
    match &etcd_endpoint {
        Some(ep) => tasks
            .0
            .push(tokio::spawn(watch_etcd(ep.clone(), ids, shared.clone()))),
        None => tasks
            .0
            .push(tokio::spawn(watch_leases(client.clone(), shared.clone()))),
    }
    for n in &nodes {
        let node = n.node.lock().await;
        node.wait_ready(Duration::from_secs(30))
            .await
            .map_err(|e| format!("{e}"))?;
    }
    // Give the watchers a moment to have their streams open before faults are injected.
    tokio::time::sleep(Duration::from_millis(200)).await;

    // The rollout, and the chaos meanwhile.
    for n in &nodes {
        n.node
            .lock()
            .await
            .update_engine
            .set_status("UPDATE_STATUS_UPDATED_NEED_REBOOT", "9999.0.0")
            .await
            .map_err(|e| format!("update_engine: {e}"))?;
    }
    let chaos = tokio::spawn(chaos_loop(
        Rng::fork(rng.next_u64(), 1),
        opts.actions,
        nodes.clone(),
        etcd.clone(),
        kube.cluster().clone(),
        shared.clone(),
    ));
    let deadline = Instant::now() + opts.trial_timeout;
    let mut stuck = None;
    loop {
        let states: Vec<Option<State>> = nodes
            .iter()
            .map(|n| n.store.load().ok().flatten())
            .collect();
        if states.iter().all(|s| s.as_ref().is_some_and(done)) {
            break;
        }
        if Instant::now() > deadline {
            stuck = Some(
                nodes
                    .iter()
                    .zip(&states)
                    .filter(|(_, s)| !s.as_ref().is_some_and(done))
                    .map(|(n, s)| match s {
                        Some(s) => format!(
                            "{}: {} (slot {}, cordoned by us {}, last error {:?}, waiting for {:?})",
                            n.name, s.phase, s.slot_held, s.cordoned_by_us, s.last_error, s.waiting_for
                        ),
                        None => format!("{}: no state file", n.name),
                    })
                    .collect::<Vec<_>>()
                    .join("; "),
            );
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Heal: stop the chaos (it undoes what it is doing), clear the faults, etcd up.
    shared.stop.store(true, Ordering::SeqCst);
    let _ = chaos.await;
    kube.cluster().faults().clear();
    {
        let mut e = etcd.lock().await;
        if let Some(e) = e.as_mut() {
            if !e.is_running() {
                e.restart()
                    .await
                    .map_err(|e| format!("etcd restart: {e}"))?;
            }
        }
    }
    // A late second reboot would show here.
    tokio::time::sleep(Duration::from_millis(1500)).await;

    let mut v = Vec::new();
    if let Some(s) = &stuck {
        v.push(format!(
            "rollout not complete after {:?}: {s}",
            opts.trial_timeout
        ));
    }
    let max_holders = shared.max_holders.load(Ordering::SeqCst);
    if max_holders as u64 > opts.max {
        let history = shared.holders.lock().map(|h| h.clone()).unwrap_or_default();
        let over: Vec<String> = history
            .iter()
            .filter(|(_, h)| h.len() as u64 > opts.max)
            .map(|(at, h)| format!("{:.2}s {:?}", at.as_secs_f64(), h))
            .collect();
        v.push(format!(
            "{max_holders} holders at once (max {}): {}",
            opts.max,
            over.join(", ")
        ));
    }
    let max_cordoned = shared.max_cordoned.load(Ordering::SeqCst);
    if max_cordoned as u64 > opts.max {
        v.push(format!(
            "{max_cordoned} nodes cordoned at once (max {})",
            opts.max
        ));
    }
    for n in &nodes {
        let r = n.reboots.load(Ordering::SeqCst);
        if r != 1 {
            v.push(format!("{} rebooted {r} times (expected once)", n.name));
        }
        match n.store.load() {
            Ok(Some(s)) if stuck.is_none() => {
                if s.reboots != 1 {
                    v.push(format!(
                        "{}: state counts {} coordinated reboots (expected 1)",
                        n.name, s.reboots
                    ));
                }
                if !done(&s) {
                    v.push(format!(
                        "{}: ended in {} (slot {}, cordoned {})",
                        n.name, s.phase, s.slot_held, s.cordoned_by_us
                    ));
                }
            }
            Ok(_) => {}
            Err(e) => v.push(format!("{}: state file: {e}", n.name)),
        }
    }
    // Every simulated reboot happened while the node held a slot.
    let downs = shared.downs.lock().map(|d| d.clone()).unwrap_or_default();
    let history = shared.holders.lock().map(|h| h.clone()).unwrap_or_default();
    for (at, name, held) in downs {
        let held = held.unwrap_or_else(|| held_at(&history, &name, at));
        if !held {
            v.push(format!(
                "{name} went down at {:.2}s without holding a slot",
                at.as_secs_f64()
            ));
        }
    }
    // The end: nobody cordoned, no slot held.
    for name in &names {
        if kube
            .cluster()
            .node(name)
            .and_then(|n| n["spec"]["unschedulable"].as_bool())
            .unwrap_or(false)
        {
            v.push(format!("{name} left cordoned"));
        }
    }
    match &etcd_endpoint {
        Some(ep) => match read_doc(ep).await {
            Ok(doc) => {
                if !doc.holders.is_empty() || doc.semaphore != opts.max as i64 {
                    v.push(format!("semaphore at the end: {}", doc.to_json()));
                }
            }
            Err(e) => v.push(format!("cannot read the semaphore at the end: {e}")),
        },
        None => {
            let held: Vec<String> = kube
                .cluster()
                .list(Kind::Lease, Some("kube-system"))
                .iter()
                .filter_map(|l| {
                    let h = l["spec"]["holderIdentity"].as_str().unwrap_or("");
                    (!h.is_empty())
                        .then(|| format!("{}={h}", l["metadata"]["name"].as_str().unwrap_or("?")))
                })
                .collect();
            if !held.is_empty() {
                v.push(format!("slots held at the end: {}", held.join(", ")));
            }
        }
    }
    if let Ok(p) = shared.problems.lock() {
        v.extend(p.iter().map(|p| format!("harness: {p}")));
    }
    if !v.is_empty() {
        if let Some(base) = &opts.keep_logs {
            let out = base.join(format!("rebootd-chaos-{}-seed-{seed}", opts.backend));
            if std::fs::create_dir_all(&out).is_ok() {
                for n in &nodes {
                    let _ = std::fs::copy(&n.log_path, out.join(format!("{}.log", n.name)));
                    let _ =
                        std::fs::copy(n.store.path(), out.join(format!("{}.state.json", n.name)));
                }
                let history = shared.holders.lock().map(|h| h.clone()).unwrap_or_default();
                let text: String = history
                    .iter()
                    .map(|(at, h)| format!("{:.3}s {:?}\n", at.as_secs_f64(), h))
                    .collect();
                let _ = std::fs::write(out.join("holders.txt"), text);
                *logs = Some(out);
            }
        }
    }
    // Stop everything before the directories go.
    shared.stop.store(true, Ordering::SeqCst);
    drop(tasks);
    for n in &nodes {
        n.node.lock().await.kill_daemon().await;
    }
    if let Some(mut e) = etcd.lock().await.take() {
        let _ = e.stop().await;
    }
    kube.shutdown().await;
    Ok(v)
}

/// Idle again after a reboot, slot released, not cordoned.
fn done(s: &State) -> bool {
    s.phase == Phase::Idle && s.last_reboot.is_some() && !s.slot_held && !s.cordoned_by_us
}

/// Whether the watcher's history shows `name` holding a slot at `at`: in the last holder set
/// seen at or before `at`, or (the watcher may lag the store a little) in one seen within 2 s
/// after it.
fn held_at(history: &[(Duration, BTreeSet<String>)], name: &str, at: Duration) -> bool {
    let before = history.iter().rev().find(|(t, _)| *t <= at);
    if before.is_some_and(|(_, h)| h.contains(name)) {
        return true;
    }
    history
        .iter()
        .filter(|(t, _)| *t > at && *t <= at + Duration::from_secs(2))
        .any(|(_, h)| h.contains(name))
}

async fn read_doc(endpoint: &str) -> Result<SemaphoreDoc, String> {
    let mut last = String::new();
    for _ in 0..20 {
        let attempt = async {
            let mut c = etcd_client::Client::connect([endpoint], None)
                .await
                .map_err(|e| e.to_string())?;
            let r = c
                .get(semaphore_key("default"), None)
                .await
                .map_err(|e| e.to_string())?;
            let kv = r.kvs().first().ok_or("no semaphore key")?;
            SemaphoreDoc::parse(kv.value()).map_err(|e| e.to_string())
        };
        match tokio::time::timeout(Duration::from_secs(3), attempt).await {
            Ok(Ok(d)) => return Ok(d),
            Ok(Err(e)) => last = e,
            Err(_) => last = "timed out".into(),
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Err(last)
}

/// What the kubelet posts after boot: the boot id in `status.nodeInfo.bootID`.
fn post_boot_id(kube: &KubeApiHandle, node: &str, boot_id: &str) {
    let _ = kube.cluster().update(Kind::Node, "", node, |n| {
        n["status"]["nodeInfo"]["bootID"] = boot_id.into();
    });
}

/// The simulated reboot of one node: on a reboot call, maybe wait (rebootd keeps running, and
/// may be killed and restarted meanwhile, as systemd would), then go down (calls made before
/// that are the same pending shutdown), stay down `reboot_time`, come back with a new boot id;
/// the kubelet reports Ready `ready_delay` later.
#[allow(clippy::too_many_arguments)]
async fn simulated_reboots(
    n: Arc<ChaosNode>,
    mut calls: tokio::sync::broadcast::Receiver<crate::fake_logind::RebootCall>,
    shared: Arc<Shared>,
    mut rng: Rng,
    cluster: crate::kube_api::Cluster,
    reboot_time: Duration,
    ready_delay: Duration,
    leases: bool,
) {
    use tokio::sync::broadcast::error::{RecvError, TryRecvError};
    loop {
        match calls.recv().await {
            Ok(_) => {}
            Err(RecvError::Lagged(_)) => {}
            Err(RecvError::Closed) => return,
        }
        shared.stats(|s| s.reboot_calls += 1);
        if rng.chance(40) {
            let delay = rng.ms(50, 1500);
            shared.stats(|s| s.delayed_reboots += 1);
            if rng.chance(50) {
                let first = delay / 2;
                tokio::time::sleep(first).await;
                let mut node = n.node.lock().await;
                node.kill_daemon().await;
                shared.stats(|s| s.pending_reboot_kills += 1);
                tokio::time::sleep(rng.ms(0, 200)).await;
                if let Err(e) = node.start_daemon() {
                    shared.problem(format!("{}: restart rebootd: {e}", n.name));
                }
                drop(node);
                tokio::time::sleep(delay - first).await;
            } else {
                tokio::time::sleep(delay).await;
            }
        }
        {
            let mut node = n.node.lock().await;
            node.kill_daemon().await;
            n.down.store(true, Ordering::SeqCst);
            n.reboots.fetch_add(1, Ordering::SeqCst);
            let held = leases.then(|| {
                cluster
                    .list(Kind::Lease, Some("kube-system"))
                    .iter()
                    .any(|l| l["spec"]["holderIdentity"].as_str() == Some(n.name.as_str()))
            });
            if let Ok(mut d) = shared.downs.lock() {
                d.push((shared.started.elapsed(), n.name.clone(), held));
            }
        }
        // Calls made before the machine went down belong to this shutdown.
        loop {
            match calls.try_recv() {
                Ok(_) => shared.stats(|s| s.reboot_calls += 1),
                Err(TryRecvError::Lagged(_)) => {}
                Err(_) => break,
            }
        }
        let _ = cluster.set_node_ready(&n.name, false);
        tokio::time::sleep(reboot_time).await;
        let boot = {
            let mut node = n.node.lock().await;
            if let Err(e) = node.reboot().await {
                shared.problem(format!("{}: boot: {e}", n.name));
            }
            n.down.store(false, Ordering::SeqCst);
            node.boot_id()
        };
        let (c, name) = (cluster.clone(), n.name.clone());
        tokio::spawn(async move {
            tokio::time::sleep(ready_delay).await;
            let _ = c.update(Kind::Node, "", &name, |o| {
                o["status"]["nodeInfo"]["bootID"] = boot.as_str().into();
            });
            let _ = c.set_node_ready(&name, true);
        });
    }
}

/// Kill rebootd right after its state file says the armed phase (inotify on the state dir).
async fn phase_killer(n: Arc<ChaosNode>, shared: Arc<Shared>) {
    use inotify::{Inotify, WatchMask};
    // Other jobs on the machine may use up the per-user inotify instances for a moment.
    let mut inotify = Inotify::init();
    for _ in 0..40 {
        if inotify.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
        inotify = Inotify::init();
    }
    let inotify = match inotify {
        Ok(i) => i,
        Err(e) => {
            shared.problem(format!("{}: inotify: {e}", n.name));
            return;
        }
    };
    if inotify
        .watches()
        .add(n.store.dir(), WatchMask::MOVED_TO | WatchMask::CLOSE_WRITE)
        .is_err()
    {
        shared.problem(format!("{}: inotify watch", n.name));
        return;
    }
    let Ok(mut events) = inotify.into_event_stream(vec![0u8; 4096]) else {
        return;
    };
    while events.next().await.is_some() {
        let Some(phase) = *n.armed.lock().unwrap_or_else(|p| p.into_inner()) else {
            continue;
        };
        let Some(state) = n.store.load().ok().flatten() else {
            continue;
        };
        if state.phase != phase || n.down.load(Ordering::SeqCst) {
            continue;
        }
        let mut node = n.node.lock().await;
        if n.down.load(Ordering::SeqCst) {
            continue;
        }
        node.kill_daemon().await;
        *n.armed.lock().unwrap_or_else(|p| p.into_inner()) = None;
        shared.stats(|s| *s.phase_kills.entry(phase.to_string()).or_default() += 1);
        if let Err(e) = node.start_daemon() {
            shared.problem(format!("{}: restart rebootd: {e}", n.name));
        }
    }
}

/// The chaos: up to `actions` disruptions at random moments until the rollout is done.
async fn chaos_loop(
    mut rng: Rng,
    actions: usize,
    nodes: Vec<Arc<ChaosNode>>,
    etcd: Arc<tokio::sync::Mutex<Option<EtcdServer>>>,
    cluster: crate::kube_api::Cluster,
    shared: Arc<Shared>,
) {
    let has_etcd = etcd.lock().await.is_some();
    let mut taken = 0;
    while !shared.stop.load(Ordering::SeqCst) && taken < actions {
        tokio::time::sleep(rng.ms(100, 1200)).await;
        if shared.stop.load(Ordering::SeqCst) {
            break;
        }
        taken += 1;
        let n = rng.pick(&nodes).clone();
        match rng.below(10) {
            // Kill rebootd now; systemd restarts it a little later.
            0..=2 => {
                let mut node = n.node.lock().await;
                if n.down.load(Ordering::SeqCst) {
                    continue;
                }
                node.kill_daemon().await;
                shared.stats(|s| s.kills += 1);
                tokio::time::sleep(rng.ms(0, 300)).await;
                if let Err(e) = node.start_daemon() {
                    shared.problem(format!("{}: restart rebootd: {e}", n.name));
                }
            }
            // Kill it right after it writes a phase (armed until it happens), on a node that
            // has not completed its reboot yet (else the phase may never come).
            3..=4 => {
                let phase = *rng.pick(PHASES);
                let pending: Vec<_> = nodes
                    .iter()
                    .filter(|n| !n.store.load().ok().flatten().is_some_and(|s| done(&s)))
                    .cloned()
                    .collect();
                let n = if pending.is_empty() {
                    n
                } else {
                    rng.pick(&pending).clone()
                };
                *n.armed.lock().unwrap_or_else(|p| p.into_inner()) = Some(phase);
            }
            5 if has_etcd => {
                let mut e = etcd.lock().await;
                if let Some(e) = e.as_mut() {
                    let _ = e.stop().await;
                    shared.stats(|s| s.etcd_stops += 1);
                    tokio::time::sleep(rng.ms(200, 2500)).await;
                    if let Err(err) = e.restart().await {
                        shared.problem(format!("etcd restart: {err}"));
                    }
                }
            }
            6 if has_etcd => {
                let mut e = etcd.lock().await;
                if let Some(e) = e.as_mut() {
                    if e.pause().is_ok() {
                        shared.stats(|s| s.etcd_pauses += 1);
                        tokio::time::sleep(rng.ms(200, 3000)).await;
                        if let Err(err) = e.resume() {
                            shared.problem(format!("etcd resume: {err}"));
                        }
                    }
                }
            }
            7 => {
                let path = rng.pick(FAULT_PATHS);
                let d = rng.ms(200, 3000);
                let times = 1 + rng.below(2) as usize;
                cluster.faults().inject(FaultRule::hang(path, d, times));
                shared.stats(|s| *s.api_faults.entry("hang".into()).or_default() += 1);
            }
            _ => {
                let path = rng.pick(FAULT_PATHS);
                let code = *rng.pick(&[500u16, 429, 409]);
                let times = 1 + rng.below(4) as usize;
                cluster
                    .faults()
                    .inject(FaultRule::status(path, code, times));
                shared.stats(|s| *s.api_faults.entry(code.to_string()).or_default() += 1);
            }
        }
    }
}

/// The outside watcher of the etcd semaphore: every revision of the document, across etcd
/// restarts (resuming from the last revision seen).
async fn watch_etcd(endpoint: String, ids: Vec<(String, String)>, shared: Arc<Shared>) {
    let key = semaphore_key("default");
    let mut next_rev: i64 = 0;
    while !shared.stop.load(Ordering::SeqCst) {
        let opts = etcd_client::ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(1))
            .with_timeout(Duration::from_secs(2));
        let Ok(Ok(mut client)) = tokio::time::timeout(
            Duration::from_secs(3),
            etcd_client::Client::connect([endpoint.as_str()], Some(opts)),
        )
        .await
        else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let wopts =
            (next_rev > 0).then(|| etcd_client::WatchOptions::new().with_start_revision(next_rev));
        let Ok(Ok(mut stream)) =
            tokio::time::timeout(Duration::from_secs(3), client.watch(key.clone(), wopts)).await
        else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        while let Some(Ok(resp)) = stream.next().await {
            if resp.compact_revision() > 0 {
                shared.problem(format!(
                    "etcd watch compacted at {}; history incomplete",
                    resp.compact_revision()
                ));
            }
            for e in resp.events() {
                let Some(kv) = e.kv() else { continue };
                next_rev = next_rev.max(kv.mod_revision() + 1);
                let holders = match SemaphoreDoc::parse(kv.value()) {
                    Ok(doc) => doc
                        .holders
                        .iter()
                        .map(|h| {
                            ids.iter()
                                .find(|(id, _)| id == h)
                                .map_or(h.clone(), |(_, n)| n.clone())
                        })
                        .collect(),
                    Err(err) => {
                        shared.problem(format!("semaphore document does not parse: {err}"));
                        BTreeSet::new()
                    }
                };
                shared.record_holders(holders);
            }
        }
    }
}

/// The outside watcher of the Lease semaphore (a kube-rs watch, over HTTP).
async fn watch_leases(client: kube::Client, shared: Arc<Shared>) {
    let api: Api<Lease> = Api::namespaced(client, "kube-system");
    let mut holders: BTreeMap<String, String> = BTreeMap::new();
    let mut rv = "0".to_string();
    while !shared.stop.load(Ordering::SeqCst) {
        let Ok(stream) = api.watch(&WatchParams::default(), &rv).await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let mut stream = stream.boxed();
        while let Some(Ok(e)) = stream.next().await {
            let (lease, gone) = match e {
                WatchEvent::Added(l) | WatchEvent::Modified(l) => (l, false),
                WatchEvent::Deleted(l) => (l, true),
                WatchEvent::Bookmark(b) => {
                    rv = b.metadata.resource_version;
                    continue;
                }
                WatchEvent::Error(_) => break,
            };
            if let Some(v) = &lease.metadata.resource_version {
                rv = v.clone();
            }
            let name = lease.metadata.name.clone().unwrap_or_default();
            match lease
                .spec
                .and_then(|s| s.holder_identity)
                .filter(|h| !h.is_empty() && !gone)
            {
                Some(h) => holders.insert(name, h),
                None => holders.remove(&name),
            };
            shared.record_holders(holders.values().cloned().collect());
        }
    }
}

/// The outside watcher of cordons: the most Nodes unschedulable at once.
async fn watch_cordons(client: kube::Client, shared: Arc<Shared>) {
    let api: Api<KubeNode> = Api::all(client);
    let mut cordoned = BTreeSet::new();
    let mut rv = "0".to_string();
    while !shared.stop.load(Ordering::SeqCst) {
        let Ok(stream) = api.watch(&WatchParams::default(), &rv).await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let mut stream = stream.boxed();
        while let Some(Ok(e)) = stream.next().await {
            let (node, gone) = match e {
                WatchEvent::Added(n) | WatchEvent::Modified(n) => (n, false),
                WatchEvent::Deleted(n) => (n, true),
                WatchEvent::Bookmark(b) => {
                    rv = b.metadata.resource_version;
                    continue;
                }
                WatchEvent::Error(_) => break,
            };
            if let Some(v) = &node.metadata.resource_version {
                rv = v.clone();
            }
            let name = node.metadata.name.clone().unwrap_or_default();
            let unschedulable = node
                .spec
                .as_ref()
                .and_then(|s| s.unschedulable)
                .unwrap_or(false);
            if unschedulable && !gone {
                cordoned.insert(name);
            } else {
                cordoned.remove(&name);
            }
            shared
                .max_cordoned
                .fetch_max(cordoned.len(), Ordering::SeqCst);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::held_at;
    use std::collections::BTreeSet;
    use std::time::Duration;

    fn set(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn held_at_reads_the_watchers_history() {
        let s = Duration::from_secs;
        let h = vec![
            (s(1), set(&["a"])),
            (s(2), set(&["a", "b"])),
            (s(10), set(&["b"])),
        ];
        assert!(held_at(&h, "a", s(5)));
        assert!(held_at(&h, "b", s(2)));
        // Seen a little later: the watcher lags the store.
        assert!(held_at(&h, "b", Duration::from_millis(1500)));
        assert!(!held_at(&h, "a", s(11)));
        assert!(!held_at(&h, "c", s(5)));
    }
}
