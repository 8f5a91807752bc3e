//! One chaos trial: set up the fleet (API stand-in with the workload, etcd or Leases, the
//! nodes), start the outside watchers, roll out an update under the chaos, observe the end,
//! check ([`super::check`]) and tear everything down. Whatever happens (a failure, a harness
//! error, a [`Stop`]), the processes the trial started are in its [`Rig`] and the tear-down
//! ends them all before the trial returns.

use super::check::{
    self, CutOff, Down, Observed, Operations, SemaphoreEnd, StoreChange, StoreEvent, Timeline,
};
use super::members::{self, EtcdAt};
use super::two_docs::{self, Api, DocSeen};
use super::{
    alert_gate, cutoff, disrupt, gates, inject, mixed, operator, report, store, watch, windows,
    workload, zones, Backend, ChaosOptions, Rng, Stats, Stop, TrialReport,
};
use crate::cut_proxy::CutProxy;
use crate::etcd::EtcdServer;
use crate::etcd_cluster::EtcdCluster;
use crate::kube_api::{Cluster, Kind, KubeApi, KubeApiHandle, NodeBuilder, Options as KubeOptions};
use crate::node::{Node, NodeOptions};
use rebootd::lock::document::SemaphoreDoc;
use rebootd::state::{Phase, State, StateStore};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A late second reboot would show within this long after the chaos stops.
const SETTLE: Duration = Duration::from_millis(1500);
/// How long the workload may take to be back at its desired ready replicas after the rollout.
const WORKLOAD_SETTLE: Duration = Duration::from_secs(10);

/// One lab node as the chaos sees it.
pub(super) struct ChaosNode {
    pub name: String,
    pub node: tokio::sync::Mutex<Node>,
    pub store: StateStore,
    pub machine_id: String,
    pub log_path: PathBuf,
    /// Between the simulated reboot's kill and the next boot's start.
    pub down: AtomicBool,
    /// Kill rebootd right after the state file says this phase.
    pub armed: Mutex<Option<Phase>>,
}

/// What the trial's tasks record.
pub(super) struct Shared {
    pub started: Instant,
    /// The wall clock at `started` (to place the nodes' log lines in the trial's time).
    pub started_wall: jiff::Timestamp,
    pub stats: Mutex<Stats>,
    /// Every holder set the outside watcher saw, in order.
    pub holders: Mutex<Timeline>,
    /// Every set of cordoned Nodes the outside watcher saw, in order.
    pub cordoned: Mutex<Timeline>,
    /// Each simulated reboot.
    pub downs: Mutex<Vec<Down>>,
    /// Each time a node was cut off from the store.
    pub cut_offs: Mutex<Vec<CutOff>>,
    pub problems: Mutex<Vec<String>>,
    /// Reboot calls logind accepted, and the ends of simulated reboots, by node.
    pub calls: Mutex<Vec<(String, Duration)>>,
    pub ups: Mutex<Vec<(String, Duration)>>,
    /// The document's max at each revision the watcher saw (etcd).
    pub maxes: Mutex<Vec<(Duration, u64)>>,
    /// What the operator did (`--operators`).
    pub ops: Mutex<Operations>,
    /// The document's and the holder records' changes, with the store's revisions.
    pub store: Mutex<Vec<StoreEvent>>,
    /// With `--migrate`: the v2 and the v3 document as their watchers saw them; the holders'
    /// timeline is then their union.
    pub docs: Mutex<Vec<DocSeen>>,
    pub two_docs: AtomicBool,
    /// `rebootctl migrate` succeeded (`--migrate`: the rollout is not complete before).
    pub migrated: AtomicBool,
    /// The operator's actions taken so far (`--operators`: the rollout is not complete before
    /// [`operator::AT_LEAST`] of them).
    pub operated: AtomicUsize,
    /// The rollout is over (or the trial is being torn down): the chaos stops.
    pub stop: AtomicBool,
}

pub(super) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Shared {
    pub(super) fn new() -> Shared {
        Shared {
            started: Instant::now(),
            started_wall: jiff::Timestamp::now(),
            stats: Mutex::new(Stats::default()),
            holders: Mutex::new(Vec::new()),
            cordoned: Mutex::new(Vec::new()),
            downs: Mutex::new(Vec::new()),
            cut_offs: Mutex::new(Vec::new()),
            problems: Mutex::new(Vec::new()),
            calls: Mutex::new(Vec::new()),
            ups: Mutex::new(Vec::new()),
            maxes: Mutex::new(Vec::new()),
            ops: Mutex::new(Operations::default()),
            store: Mutex::new(Vec::new()),
            docs: Mutex::new(Vec::new()),
            two_docs: AtomicBool::new(false),
            migrated: AtomicBool::new(false),
            operated: AtomicUsize::new(0),
            stop: AtomicBool::new(false),
        }
    }

    pub fn stats(&self, f: impl FnOnce(&mut Stats)) {
        f(&mut lock(&self.stats));
    }

    pub fn problem(&self, p: String) {
        lock(&self.problems).push(p);
    }

    pub fn stopped(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    pub fn record_holders(&self, holders: BTreeSet<String>) {
        lock(&self.holders).push((self.started.elapsed(), holders));
    }

    /// A version of the semaphore document (`None`: removed) in `api`. With one document
    /// watched, its holders; with two (`--migrate`), the holders of both that count.
    pub fn record_doc(&self, api: Api, holders: Option<BTreeSet<String>>) {
        if !self.two_docs.load(Ordering::SeqCst) {
            match holders {
                Some(h) => self.record_holders(h),
                None => {
                    self.problem(format!("the semaphore document ({api:?}) was removed"));
                    self.record_holders(BTreeSet::new());
                }
            }
            return;
        }
        let mut docs = lock(&self.docs);
        docs.push(DocSeen {
            at: self.started.elapsed(),
            api,
            holders,
        });
        if let Some((_, all)) = two_docs::union(&docs).pop() {
            self.record_holders(all);
        }
    }

    pub fn record_cordoned(&self, cordoned: BTreeSet<String>) {
        lock(&self.cordoned).push((self.started.elapsed(), cordoned));
    }

    pub fn record_down(&self, d: Down) {
        lock(&self.downs).push(d);
    }

    pub fn record_call(&self, node: &str) {
        lock(&self.calls).push((node.to_owned(), self.started.elapsed()));
    }

    pub fn record_up(&self, node: &str) {
        lock(&self.ups).push((node.to_owned(), self.started.elapsed()));
    }

    pub fn record_max(&self, max: u64) {
        lock(&self.maxes).push((self.started.elapsed(), max));
    }

    pub fn record_store(&self, rev: i64, change: StoreChange) {
        lock(&self.store).push(StoreEvent {
            at: self.started.elapsed(),
            rev,
            change,
        });
    }

    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    pub fn record_cut_off(&self, c: CutOff) {
        lock(&self.cut_offs).push(c);
    }

    pub fn holders(&self) -> Timeline {
        lock(&self.holders).clone()
    }

    pub fn cordoned(&self) -> Timeline {
        lock(&self.cordoned).clone()
    }
}

/// Everything a trial started, so that it can be torn down whatever happens.
#[derive(Default)]
struct Rig {
    dir: Option<tempfile::TempDir>,
    kube: Option<KubeApiHandle>,
    etcd: Arc<tokio::sync::Mutex<Option<EtcdServer>>>,
    /// A multi-member etcd (`--etcd-members`), instead of `etcd`.
    cluster: Option<Arc<tokio::sync::Mutex<EtcdCluster>>>,
    /// The proxy a node's store traffic goes through (`--cut-off`).
    proxy: Option<Arc<CutProxy>>,
    /// The FleetLock server (`--backend fleetlock`).
    airlock: Option<Arc<tokio::sync::Mutex<crate::airlock::Airlock>>>,
    nodes: Vec<Arc<ChaosNode>>,
    /// The locksmithd nodes (`--mixed`).
    locksmiths: Vec<Arc<mixed::LsNode>>,
    /// Every task that holds a node or etcd.
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Rig {
    /// End every task and process of the trial, and wait until they are gone.
    async fn teardown(&mut self, shared: &Shared) {
        shared.stop.store(true, Ordering::SeqCst);
        for t in &self.tasks {
            t.abort();
        }
        for t in self.tasks.drain(..) {
            // A finished task's future is gone (and its output may have been taken).
            if !t.is_finished() {
                let _ = t.await;
            }
        }
        for n in &self.nodes {
            n.node.lock().await.kill_daemon().await;
        }
        for n in &self.locksmiths {
            n.node.lock().await.kill_daemon().await;
        }
        // The last references: dropping a Node kills and reaps its dbus-daemon.
        self.nodes.clear();
        self.locksmiths.clear();
        if let Some(mut e) = self.etcd.lock().await.take() {
            let _ = e.stop().await;
        }
        if let Some(c) = self.cluster.take() {
            let mut c = c.lock().await;
            for i in 0..c.size() {
                let _ = c.kill(i).await;
            }
        }
        self.proxy.take();
        if let Some(a) = self.airlock.take() {
            a.lock().await.kill().await;
        }
        if let Some(k) = self.kube.take() {
            k.shutdown().await;
        }
        self.dir.take();
    }
}

/// Why a trial did not get to its checks.
enum Cut {
    Harness(String),
    Stopped,
}

impl From<String> for Cut {
    fn from(e: String) -> Cut {
        Cut::Harness(e)
    }
}

/// `fut`, unless `stop` comes first.
async fn or_stop<T>(stop: &Stop, fut: impl std::future::Future<Output = T>) -> Result<T, Cut> {
    tokio::select! {
        t = fut => Ok(t),
        _ = stop.wait() => Err(Cut::Stopped),
    }
}

fn check_stop(stop: &Stop) -> Result<(), Cut> {
    if stop.is_set() {
        Err(Cut::Stopped)
    } else {
        Ok(())
    }
}

/// Run one trial with `seed`.
pub async fn trial(opts: &ChaosOptions, seed: u64, stop: &Stop) -> TrialReport {
    let shared = Arc::new(Shared::new());
    let mut rig = Rig::default();
    let outcome = run_trial(opts, seed, &shared, &mut rig, stop).await;
    let (violations, interrupted) = match outcome {
        Ok(observed) => (check::violations(&observed), false),
        Err(Cut::Harness(e)) => (vec![format!("harness: {e}")], false),
        Err(Cut::Stopped) => (Vec::new(), true),
    };
    let logs = if violations.is_empty() {
        None
    } else {
        {
            let etcd_logs = rig
                .cluster
                .as_ref()
                .and_then(|c| c.try_lock().ok())
                .map(|c| {
                    (0..c.size())
                        .map(|i| (c.name(i).to_string(), c.log_files()[i].clone()))
                        .collect()
                })
                .unwrap_or_default();
            let kept = report::keep_logs(opts, seed, &rig.nodes, etcd_logs, &shared);
            mixed::keep_logs(kept.as_deref(), &rig.locksmiths, &shared);
            kept
        }
    };
    rig.teardown(&shared).await;
    let stats = lock(&shared.stats).clone();
    TrialReport {
        seed,
        backend: opts.backend,
        violations,
        duration: shared.started.elapsed(),
        stats,
        max_holders_seen: check::peak(&shared.holders()),
        max_cordoned_seen: check::peak(&shared.cordoned()),
        logs,
        interrupted,
    }
}

/// The phases after whose write the chaos may kill rebootd.
pub(super) const PHASES: &[Phase] = &[
    Phase::RebootNeeded,
    Phase::AcquiringSlot,
    Phase::Draining,
    Phase::Rebooting,
    Phase::WaitingForHealthy,
    Phase::Uncordoning,
    Phase::Releasing,
    Phase::Idle,
];

async fn run_trial(
    opts: &ChaosOptions,
    seed: u64,
    shared: &Arc<Shared>,
    rig: &mut Rig,
    stop: &Stop,
) -> Result<Observed, Cut> {
    let mut rng = Rng::fork(seed, 0);
    let dir = tempfile::Builder::new()
        .prefix("rebootd-chaos-")
        .tempdir()
        .map_err(|e| format!("temp dir: {e}"))?;
    let kubeconfig = dir.path().join("kubeconfig");
    rig.dir = Some(dir);
    let names: Vec<String> = (1..=opts.nodes - opts.mixed)
        .map(|i| format!("node-{i}"))
        .collect();
    // The API stand-in: one Node per lab node, and the workload on them.
    let kube = KubeApi::start(KubeOptions {
        time_scale: workload::TIME_SCALE,
        pod_ready_delay: workload::POD_READY_DELAY,
        ..KubeOptions::default()
    })
    .await
    .map_err(|e| format!("kube API stand-in: {e}"))?;
    let cluster = kube.cluster().clone();
    rig.kube = Some(kube);
    for (i, name) in names.iter().enumerate() {
        let mut node = NodeBuilder::new(name);
        if opts.zones > 0 {
            node = node.label(
                rebootd::config::DEFAULT_ZONE_LABEL,
                &zones::zone_of(i, opts.zones),
            );
        }
        cluster
            .add(&node)
            .map_err(|e| format!("add node {name}: {e}"))?;
    }
    workload::add(&cluster, &names, opts.max)?;
    if let Some(k) = &rig.kube {
        k.write_kubeconfig(&kubeconfig)
            .map_err(|e| format!("kubeconfig: {e}"))?;
    }
    check_stop(stop)?;
    // Where the lab's readers reach etcd, and every member (none for a single etcd).
    let (etcd_at, members) = match store::start_etcd(opts).await? {
        Some(store::Etcd::Single(e)) => {
            let at = EtcdAt::single(e.endpoint());
            *rig.etcd.lock().await = Some(*e);
            (Some(at), Vec::new())
        }
        Some(store::Etcd::Cluster(c)) => {
            let found = (Some(EtcdAt::cluster(&c)), c.endpoints());
            rig.cluster = Some(Arc::new(tokio::sync::Mutex::new(c)));
            found
        }
        None => (None, Vec::new()),
    };
    let etcd_endpoint = etcd_at.as_ref().map(|a| a.healthy().1);
    // The FleetLock server, on the trial's etcd.
    if opts.backend == Backend::FleetLock {
        let etcd = rig.etcd.lock().await;
        let Some(e) = etcd.as_ref() else {
            return Err("fleetlock: no etcd for airlock".to_string().into());
        };
        let a = crate::airlock::Airlock::start(e, &[("default", opts.max)])
            .await
            .map_err(|e| format!("airlock: {e}"))?;
        rig.airlock = Some(Arc::new(tokio::sync::Mutex::new(a)));
    }
    let airlock_url = match &rig.airlock {
        Some(a) => Some(a.lock().await.url()),
        None => None,
    };
    if let Some(ep) = etcd_endpoint.as_ref().filter(|_| opts.backend.etcd()) {
        let doc = SemaphoreDoc {
            semaphore: opts.max as i64,
            max: opts.max,
            holders: Vec::new(),
        };
        store::put_doc(ep, opts.backend, &doc).await?;
    }
    // The new faults' choices come from a stream of their own, so that the other choices of a
    // seed stay what they were before these faults existed.
    let mut faults = Rng::fork(seed, 7);
    let cut_node = opts
        .cut_off
        .then(|| faults.below(opts.nodes as u64) as usize);
    let skew = if opts.skew_clock {
        let lib = cutoff::libfaketime().ok_or_else(|| {
            "--skew-clock: libfaketime is not installed (apt-get install faketime)".to_string()
        })?;
        let node = faults.below(opts.nodes as u64) as usize;
        let by = *faults.pick(cutoff::SKEWS);
        Some((node, by, cutoff::skew_env(&lib, by)))
    } else {
        None
    };
    if cut_node.is_some() {
        let upstream = match &etcd_endpoint {
            Some(ep) => ep.trim_start_matches("http://").to_string(),
            None => rig
                .kube
                .as_ref()
                .map(|k| k.addr().to_string())
                .unwrap_or_default(),
        };
        let upstream = upstream
            .parse()
            .map_err(|e| format!("proxy upstream {upstream:?}: {e}"))?;
        let proxy = CutProxy::start(upstream)
            .await
            .map_err(|e| format!("proxy: {e}"))?;
        rig.proxy = Some(Arc::new(proxy));
    }
    // The store as each node reaches it: through the proxy for the node that is cut off.
    let lease_kubeconfig = kubeconfig.with_file_name("kubeconfig-leases-via-proxy");
    if let (Some(p), None, Some(k)) = (&rig.proxy, &etcd_endpoint, &rig.kube) {
        let text = std::fs::read_to_string(&kubeconfig).map_err(|e| format!("kubeconfig: {e}"))?;
        let via = text.replace(&k.base_url(), &p.url());
        if via == text {
            return Err(format!("kubeconfig does not name {}", k.base_url()).into());
        }
        std::fs::write(&lease_kubeconfig, via).map_err(|e| format!("kubeconfig: {e}"))?;
    }
    // Each node's maintenance windows, on its own clock (`--windows`).
    let plans: Vec<Option<windows::Plan>> = (0..opts.nodes)
        .map(|i| {
            opts.windows.then(|| {
                let offset = match &skew {
                    Some((at, by, _)) if *at == i => cutoff::skew_of(by),
                    _ => jiff::SignedDuration::ZERO,
                };
                windows::plan(
                    &mut Rng::fork(seed, 300 + i as u64),
                    jiff::Timestamp::now(),
                    offset,
                    opts.trial_timeout,
                )
            })
        })
        .collect();
    // The flapping gate (`--gates`).
    let gate_dir = rig
        .dir
        .as_ref()
        .map(|d| d.path().join("gate"))
        .unwrap_or_default();
    let gate_script = if opts.gates {
        Some(gates::setup(&gate_dir)?)
    } else {
        None
    };
    // And the flapping Prometheus alert (`--gates`).
    let alert_gate = if opts.gates {
        let started = shared.started;
        Some(Arc::new(
            or_stop(stop, alert_gate::AlertGate::start(started)).await??,
        ))
    } else {
        None
    };
    let proxy_url = rig.proxy.as_ref().map(|p| p.url());
    let config_for = |i: usize| -> String {
        let via = proxy_url.as_deref().filter(|_| cut_node == Some(i));
        let endpoints = store::node_endpoints(etcd_endpoint.as_deref(), &members, i);
        let mut config = store::node_config(
            opts,
            endpoints.as_deref(),
            via,
            &kubeconfig,
            &lease_kubeconfig,
            airlock_url.as_deref().map(|u| (u, names[i].as_str())),
        );
        if let Some(p) = &plans[i] {
            config.push_str(&windows::toml(p));
        }
        if let Some(g) = &gate_script {
            config.push_str(&gates::toml(g, &names[i]));
        }
        if let Some(a) = &alert_gate {
            config.push_str(&a.toml(&names[i]));
        }
        zones::configure(opts, i, config)
    };

    // The outside watchers, started (and their requests made) before anything else happens.
    let client = rebootd::kube_client::connect(Some(&kubeconfig))
        .await
        .map_err(|e| format!("kube client: {e}"))?;
    rig.tasks
        .push(tokio::spawn(watch::cordons(client.clone(), shared.clone())));

    for (i, name) in names.iter().enumerate() {
        check_stop(stop)?;
        let mut node_opts = NodeOptions::new(name).config(&config_for(i));
        if let Some((at, by, env)) = &skew {
            if *at == i {
                node_opts.env = env.clone();
                shared.stats(|s| s.skewed.push(format!("{name} {by}")));
            }
        }
        let set_max = opts.backend == Backend::Kubernetes && i == 0;
        node_opts.start_daemon = !set_max;
        let node = Node::start(&opts.rebootd, node_opts)
            .await
            .map_err(|e| format!("start {name}: {e}"))?;
        let calls = node.logind.subscribe();
        let cn = Arc::new(ChaosNode {
            name: name.clone(),
            store: node.store(),
            machine_id: node.machine_id.clone(),
            log_path: node.log_path(),
            node: tokio::sync::Mutex::new(node),
            down: AtomicBool::new(false),
            armed: Mutex::new(None),
        });
        rig.nodes.push(cn.clone());
        let mut node = cn.node.lock().await;
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
                )
                .into());
            }
            node.start_daemon()
                .map_err(|e| format!("start rebootd: {e}"))?;
        }
        post_boot_id(&cluster, name, &node.boot_id());
        drop(node);
        rig.tasks.push(tokio::spawn(disrupt::simulated_reboots(
            cn.clone(),
            calls,
            shared.clone(),
            Rng::fork(seed, 100 + i as u64),
            cluster.clone(),
            opts.reboot_time,
            opts.ready_delay,
            opts.backend == Backend::Kubernetes,
        )));
        rig.tasks.push(tokio::spawn(disrupt::phase_killer(
            cn.clone(),
            shared.clone(),
        )));
    }
    // The locksmithd nodes (`--mixed`), on the same v2 document.
    if opts.mixed > 0 {
        let ep = etcd_endpoint.as_deref().unwrap_or_default();
        rig.locksmiths = or_stop(stop, mixed::start(opts.mixed, ep)).await??;
        rig.tasks.extend(mixed::simulated_reboots(
            opts,
            seed,
            &rig.locksmiths,
            shared,
        ));
        rig.tasks.extend(mixed::supervise(&rig.locksmiths, shared));
    }
    let ids: Vec<(String, String)> = rig
        .nodes
        .iter()
        .map(|n| (n.machine_id.clone(), n.name.clone()))
        .chain(
            rig.locksmiths
                .iter()
                .map(|n| (n.machine_id.clone(), n.name.clone())),
        )
        .collect();
    // With `rebootctl migrate`, the v3 document beside the v2 one.
    if let (Some(at), true) = (&etcd_at, opts.migrate) {
        shared.two_docs.store(true, Ordering::SeqCst);
        rig.tasks.push(tokio::spawn(watch::etcd(
            at.clone(),
            ids.clone(),
            shared.clone(),
        )));
    }
    // With an operator, rebootd's holder records too (an unlock is judged by them).
    if opts.operators {
        if let Some(at) = &etcd_at {
            rig.tasks.push(match opts.backend {
                Backend::EtcdV2 => tokio::spawn(watch::etcd_v2_records(
                    at.clone(),
                    ids.clone(),
                    shared.clone(),
                )),
                _ => tokio::spawn(watch::etcd_records(at.clone(), ids.clone(), shared.clone())),
            });
        }
    }
    rig.tasks.push(match (&etcd_at, opts.backend) {
        (Some(at), Backend::FleetLock) => tokio::spawn(watch::airlock(at.clone(), shared.clone())),
        (Some(at), Backend::EtcdV2) => {
            tokio::spawn(watch::etcd_v2(at.clone(), ids, shared.clone()))
        }
        (Some(at), _) => tokio::spawn(watch::etcd(at.clone(), ids, shared.clone())),
        (None, _) => tokio::spawn(watch::leases(client.clone(), shared.clone())),
    });
    for n in &rig.nodes {
        let node = n.node.lock().await;
        or_stop(stop, node.wait_ready(Duration::from_secs(30)))
            .await?
            .map_err(|e| format!("{e}"))?;
    }
    // Give the watchers a moment to have their streams open before faults are injected.
    or_stop(stop, tokio::time::sleep(Duration::from_millis(200))).await?;

    // The rollout, and the chaos meanwhile (with `--migrate`, the later half of the rebootd
    // nodes get their update once the locksmithd nodes are through: see `mixed::migrate`).
    let late = if opts.migrate { rig.nodes.len() / 2 } else { 0 };
    let (now, later) = rig.nodes.split_at(rig.nodes.len() - late);
    mixed::trigger(&rig.locksmiths).await?;
    for n in now {
        n.node
            .lock()
            .await
            .update_engine
            .set_status("UPDATE_STATUS_UPDATED_NEED_REBOOT", "9999.0.0")
            .await
            .map_err(|e| format!("update_engine: {e}"))?;
    }
    let mixed_chaos = mixed::chaos(opts, seed, &rig.nodes, later, &rig.locksmiths, shared);
    let chaos = tokio::spawn(disrupt::chaos_loop(
        Rng::fork(rng.next_u64(), 1),
        opts.actions,
        rig.nodes.clone(),
        rig.etcd.clone(),
        cluster.clone(),
        shared.clone(),
    ));
    // The members' faults, beside it, from a stream of their own.
    let member_chaos = rig.cluster.clone().map(|c| {
        tokio::spawn(members::chaos(
            Rng::fork(seed, 9),
            opts.actions,
            opts.member_faults.clone(),
            c,
            rig.nodes.clone(),
            shared.clone(),
        ))
    });
    let cutting = match (cut_node, &rig.proxy) {
        (Some(i), Some(p)) => Some(tokio::spawn(cutoff::cut_offs(
            seed,
            rig.nodes[i].clone(),
            p.clone(),
            opts.max_hold,
            shared.clone(),
        ))),
        _ => None,
    };
    let operating = opts.operators.then(|| {
        let ids: Vec<(String, String)> = rig
            .nodes
            .iter()
            .map(|n| (n.machine_id.clone(), n.name.clone()))
            .collect();
        tokio::spawn(operator::operator(
            Rng::fork(seed, 11),
            opts.actions,
            opts.rebootd.with_file_name("rebootctl"),
            rig.nodes.clone(),
            ids,
            cluster.clone(),
            shared.clone(),
        ))
    });
    // airlock killed and started again (its etcd is stopped and frozen by the chaos loop).
    let airlock_chaos = rig.airlock.clone().map(|a| {
        tokio::spawn(disrupt::airlock_kills(
            Rng::fork(seed, 13),
            opts.actions,
            a,
            shared.clone(),
        ))
    });
    let flapping = opts.gates.then(|| {
        let (dir, sh, alert) = (gate_dir.clone(), shared.clone(), alert_gate.clone());
        tokio::spawn(async move {
            let command = gates::flap(Rng::fork(seed, 12), dir, sh.clone());
            match alert {
                Some(a) => {
                    tokio::join!(command, a.flap(Rng::fork(seed, 14), sh));
                }
                None => command.await,
            }
        })
    });
    let injection = opts.inject.map(|v| {
        tokio::spawn(inject::run(
            v,
            opts.max,
            rig.nodes.clone(),
            etcd_endpoint.clone().map(|e| (e, opts.backend)),
            cluster.clone(),
            shared.clone(),
        ))
    });
    let deadline = Instant::now() + opts.trial_timeout;
    let mut timed_out = None;
    let mut processes = BTreeMap::new();
    loop {
        if stop.is_set() {
            // The tear-down ends the chaos and the injection with the rest.
            rig.tasks.push(chaos);
            rig.tasks.extend(member_chaos);
            rig.tasks.extend(injection);
            rig.tasks.extend(cutting);
            rig.tasks.extend(operating);
            rig.tasks.extend(flapping);
            rig.tasks.extend(airlock_chaos);
            rig.tasks.extend(mixed_chaos);
            return Err(Cut::Stopped);
        }
        let all_done = rig.nodes.iter().all(|n| {
            n.store
                .load()
                .ok()
                .flatten()
                .is_some_and(|s| check::done(&s))
        }) && rig.locksmiths.iter().all(|n| mixed::done(n, shared))
            && (!opts.migrate || shared.migrated.load(Ordering::SeqCst))
            && (!opts.operators
                || operator::acted_enough(shared, opts.actions)
                || operating.as_ref().is_some_and(|h| h.is_finished()));
        if all_done {
            break;
        }
        if Instant::now() > deadline {
            timed_out = Some(opts.trial_timeout);
            for n in &rig.nodes {
                processes.insert(n.name.clone(), report::process_report(n));
            }
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Heal: stop the chaos (it undoes what it is doing) and the injection (it undoes what it
    // did), clear the faults, etcd up.
    shared.stop.store(true, Ordering::SeqCst);
    let mut heal = vec![chaos];
    heal.extend(member_chaos);
    heal.extend(injection);
    heal.extend(cutting);
    heal.extend(operating);
    heal.extend(flapping);
    heal.extend(airlock_chaos);
    heal.extend(mixed_chaos);
    let healed = or_stop(stop, async {
        for h in heal.iter_mut() {
            let _ = h.await;
        }
    })
    .await;
    if healed.is_err() {
        rig.tasks.extend(heal);
        return Err(Cut::Stopped);
    }
    cluster.faults().clear();
    {
        let mut e = rig.etcd.lock().await;
        if let Some(e) = e.as_mut() {
            if !e.is_running() {
                e.restart()
                    .await
                    .map_err(|e| format!("etcd restart: {e}"))?;
            }
        }
    }
    if let Some(c) = &rig.cluster {
        c.lock()
            .await
            .heal()
            .await
            .map_err(|e| format!("etcd cluster heal: {e}"))?;
    }
    // A late second reboot would show here.
    or_stop(stop, tokio::time::sleep(SETTLE)).await?;
    let workload_unsettled = or_stop(stop, workload::settle(&cluster, WORKLOAD_SETTLE)).await?;

    let ends = rig
        .nodes
        .iter()
        .map(|n| {
            let s: Result<Option<State>, String> = n.store.load().map_err(|e| e.to_string());
            (n.name.clone(), s)
        })
        .collect();
    let left_cordoned = names
        .iter()
        .filter(|n| {
            cluster
                .node(n)
                .and_then(|n| n["spec"]["unschedulable"].as_bool())
                .unwrap_or(false)
        })
        .cloned()
        .collect();
    let docs = match (&etcd_at, opts.migrate) {
        (Some(at), true) => {
            let (end, doc) = or_stop(stop, mixed::read_docs(&at.healthy().1)).await?;
            Some((lock(&shared.docs).clone(), end, doc))
        }
        _ => None,
    };
    let semaphore_end = match &etcd_at {
        Some(_) if docs.is_some() => docs.as_ref().map(|d| d.2.clone()).expect("docs"),
        Some(at) if opts.backend == Backend::FleetLock => {
            match or_stop(stop, store::read_airlock(&at.healthy().1, opts.max)).await? {
                Ok(doc) => SemaphoreEnd::Etcd(doc),
                Err(e) => SemaphoreEnd::Unreadable(e),
            }
        }
        Some(at) => match or_stop(stop, store::read_doc(&at.healthy().1, opts.backend)).await? {
            Ok(doc) => SemaphoreEnd::Etcd(doc),
            Err(e) => SemaphoreEnd::Unreadable(e),
        },
        None => SemaphoreEnd::Leases(
            cluster
                .list(Kind::Lease, Some("kube-system"))
                .iter()
                .filter_map(|l| {
                    let h = l["spec"]["holderIdentity"].as_str().unwrap_or("");
                    (!h.is_empty())
                        .then(|| format!("{}={h}", l["metadata"]["name"].as_str().unwrap_or("?")))
                })
                .collect(),
        ),
    };
    let (evictions, refused) = workload::eviction_counts(&cluster);
    let reclaims = check::reclaims(&shared.holders()).len() as u32;
    shared.stats(|s| {
        s.evictions = evictions;
        s.evictions_refused = refused;
        s.reclaims = reclaims;
    });
    if let Some(i) = cut_node {
        cutoff::count_fenced(&rig.nodes[i], shared);
    }
    if let Some((i, by, _)) = &skew {
        cutoff::check_skew(&rig.nodes[*i], by, shared);
    }
    if opts.windows {
        windows::observe(&rig.nodes, shared);
    }
    let window_spans = names
        .iter()
        .zip(&plans)
        .filter_map(|(n, p)| {
            p.as_ref()
                .map(|p| (n.clone(), windows::spans(p, shared.started_wall)))
        })
        .collect();
    let gate_runs = opts
        .gates
        .then(|| gates::observe(&gate_dir, &rig.nodes, shared));
    let alert_runs = alert_gate.as_ref().map(|a| a.observe(shared));
    let zoning = zones::zoning(opts, &names);
    let observed = Observed {
        gate_runs,
        alert_runs,
        max: opts.max,
        store: lock(&shared.store).clone(),
        windows: window_spans,
        nodes: names
            .into_iter()
            .chain(rig.locksmiths.iter().map(|n| n.name.clone()))
            .collect(),
        docs: docs.map(|(seen, end, _)| (seen, end)),
        holders: shared.holders(),
        cordoned: shared.cordoned(),
        downs: lock(&shared.downs).clone(),
        ends,
        timed_out,
        left_cordoned,
        semaphore_end,
        workload_unsettled,
        pod_deletes: workload::pod_deletes(&cluster),
        harness: lock(&shared.problems).clone(),
        max_hold: opts.max_hold,
        cut_offs: lock(&shared.cut_offs).clone(),
        processes,
        calls: lock(&shared.calls).clone(),
        ups: lock(&shared.ups).clone(),
        maxes: lock(&shared.maxes).clone(),
        ops: opts.operators.then(|| lock(&shared.ops).clone()),
        zoning,
    };
    let on_its_way = check::unlocked_on_its_way(&observed).len() as u32;
    if on_its_way > 0 {
        shared.stats(|s| {
            *s.operator
                .entry("unlock of a reboot on its way".into())
                .or_default() += on_its_way
        });
    }
    Ok(observed)
}

/// What the kubelet posts after boot: the boot id in `status.nodeInfo.bootID`.
pub(super) fn post_boot_id(cluster: &Cluster, node: &str, boot_id: &str) {
    let _ = cluster.update(Kind::Node, "", node, |n| {
        n["status"]["nodeInfo"]["bootID"] = boot_id.into();
    });
}
