//! Fleet rollout: N in-process nodes, each the real `rebootd::runtime::Runtime` (agent, state
//! file, triggers, semaphore opened from its own config: etcd, or Leases in the API stand-in)
//! with an in-process `Rebooter` that tells the harness. A simulated reboot aborts the node's
//! runtime task (as a power cut would), waits a fixed reboot time, writes a new boot id and
//! starts a new `Runtime` with a new connection. Triggered by the `rebootctl reboot` request
//! file in each node's state dir.
//!
//! An outside watcher (an etcd watch on the semaphore key, or the stand-in's own change feed
//! for the Leases) timestamps every acquisition and release. The
//! rollout time is from writing the request files to the last release; the ideal is
//! `ceil(N / max) x reboot_time` (cycle = the simulated reboot time alone, so every overhead of
//! rebootd and the lock counts against it).

use super::peers;
use super::usage;
use super::util::{self, ms, stats};
use crate::count_proxy::{self, CountProxy, Counts};
use crate::etcd::{EtcdOptions, EtcdServer};
use crate::kube_api::{Kind, KubeApi, KubeApiHandle, Options as KubeOptions};
use crate::v2_watcher::V2DocWatcher;
use futures_util::StreamExt;
use rebootd::config::Config;
use rebootd::inhibitor::{Inhibitor, Inhibitors};
use rebootd::lock::document::{semaphore_key, SemaphoreDoc};
use rebootd::lock::{
    Acquired, Fence, GroupPause, Identity, LockError, Pauses, Reported, Semaphore,
};
use rebootd::reboot::{RebootError, Rebooter};
use rebootd::runtime::{HostSeams, Runtime};
use rebootd::state::Phase;
use rebootd::state::StateStore;
use rebootd::users::{Session, Sessions};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

#[derive(Debug, clap::Args)]
pub struct Args {
    #[arg(long, default_value_t = 100)]
    nodes: usize,
    #[arg(long, default_value_t = 3)]
    max: u64,
    /// Simulated reboot time: the node is down this long.
    #[arg(long, default_value = "2s", value_parser = rebootd::config::parse_duration)]
    reboot_time: Duration,
    /// The semaphore: `etcd` (locksmith's document in etcd v3), `etcd-v2` (locksmith's own v2
    /// document, etcd 3.4/3.5 with `--enable-v2`) or `lease` (Lease objects in the API
    /// stand-in).
    #[arg(long, default_value = "etcd")]
    backend: String,
    /// etcd version: 3.4 or 3.5.
    #[arg(long, default_value = "3.4")]
    etcd: String,
    /// With `--backend etcd-v2`: after the rebootd nodes, a rolling reboot of this many real
    /// locksmithd nodes on the same etcd (locksmith's default group, same max, same simulated
    /// reboot time), timed by the same outside watch.
    #[arg(long, default_value_t = 0)]
    locksmithd: usize,
    /// How long the rollout may take before the bench gives up (and prints how far it got);
    /// default 3 x the ideal + 120 s.
    #[arg(long, value_parser = rebootd::config::parse_duration)]
    budget: Option<Duration>,
}

/// locksmith's v2 document of the default group.
const V2_KEY: &str = "/coreos.com/updateengine/rebootlock/semaphore";

/// The Lease namespace and semaphore name (rebootd's defaults).
const LEASE_NAMESPACE: &str = "rebootd";

/// Where the semaphore lives.
enum Backend {
    Etcd {
        server: Box<EtcdServer>,
        client: Box<etcd_client::Client>,
    },
    EtcdV2 {
        server: Box<EtcdServer>,
        /// Kept for the run: the outside watcher.
        watcher: Option<V2DocWatcher>,
    },
    Lease {
        api: KubeApiHandle,
        kubeconfig: PathBuf,
    },
}

/// Requests counted at the server.
enum Counters {
    Etcd(util::EtcdCounters),
    Api(usize),
}

impl Counters {
    /// The requests counted since `before`.
    fn requests_since(&self, before: &Counters) -> f64 {
        match (self, before) {
            (Counters::Etcd(x), Counters::Etcd(b)) => x.minus(b).requests(),
            (Counters::Api(x), Counters::Api(b)) => (x - b) as f64,
            _ => 0.0,
        }
    }
}

impl Backend {
    async fn start(a: &Args, dir: &Path) -> Result<Backend, String> {
        match a.backend.as_str() {
            "etcd" => {
                let v = util::parse_etcd(&a.etcd)?;
                let server = EtcdServer::start(v).await.map_err(|e| e.to_string())?;
                println!(
                    "{} ({}) at {}; {} in-process nodes, max {}, reboot time {:?}",
                    v,
                    server.binaries().version,
                    server.endpoint(),
                    a.nodes,
                    a.max,
                    a.reboot_time
                );
                let mut client = etcd_client::Client::connect([server.endpoint()], None)
                    .await
                    .map_err(|e| e.to_string())?;
                let doc = SemaphoreDoc {
                    semaphore: a.max as i64,
                    max: a.max,
                    holders: Vec::new(),
                };
                client
                    .put(semaphore_key("default"), doc.to_json(), None)
                    .await
                    .map_err(|e| e.to_string())?;
                Ok(Backend::Etcd {
                    server: Box::new(server),
                    client: Box::new(client),
                })
            }
            "etcd-v2" => {
                let v = util::parse_etcd(&a.etcd)?;
                let server = EtcdServer::start_with(v, EtcdOptions::v2())
                    .await
                    .map_err(|e| e.to_string())?;
                println!(
                    "{} ({}) v2 API at {}; {} in-process nodes, max {}, reboot time {:?}",
                    v,
                    server.binaries().version,
                    server.endpoint(),
                    a.nodes,
                    a.max,
                    a.reboot_time
                );
                let b = Backend::EtcdV2 {
                    server: Box::new(server),
                    watcher: None,
                };
                b.set_max(a, dir).await?;
                Ok(b)
            }
            "lease" | "kubernetes" => {
                let api = KubeApi::start(KubeOptions::default())
                    .await
                    .map_err(|e| e.to_string())?;
                let kubeconfig = dir.join("kubeconfig");
                api.write_kubeconfig(&kubeconfig)
                    .map_err(|e| e.to_string())?;
                println!(
                    "Leases in the API stand-in at {}; {} in-process nodes, max {}, reboot time {:?}",
                    api.base_url(),
                    a.nodes,
                    a.max,
                    a.reboot_time
                );
                let b = Backend::Lease { api, kubeconfig };
                b.set_max(a, dir).await?;
                Ok(b)
            }
            other => Err(format!(
                "--backend {other}: expected etcd, etcd-v2 or lease"
            )),
        }
    }

    /// Set max as `rebootctl set-max` does, through the backend itself.
    async fn set_max(&self, a: &Args, dir: &Path) -> Result<(), String> {
        let path = dir.join("set-max.toml");
        std::fs::write(&path, self.lock_config()).map_err(|e| e.to_string())?;
        let config = Config::load(&[path]).map_err(|e| e.to_string())?;
        let admin = rebootd::lock::open::open_admin(&config)
            .await
            .map_err(|e| e.to_string())?;
        admin.set_max(a.max, true).await.map_err(|e| e.to_string())
    }

    /// The `[lock]` part of a config that talks to the store directly (set-max).
    fn lock_config(&self) -> String {
        self.lock_config_via(None)
    }

    /// The `[lock]` part of every node's config: the store, or `via` (the counting proxy's
    /// URL; for Leases, a kubeconfig naming it).
    fn lock_config_via(&self, via: Option<(&str, &Path)>) -> String {
        match self {
            Backend::Etcd { server, .. } => format!(
                "[lock]\nbackend = \"etcd\"\n\n[lock.etcd]\nendpoints = [{:?}]\n",
                via.map(|v| v.0.to_string()).unwrap_or_else(|| server.endpoint())
            ),
            Backend::EtcdV2 { server, .. } => format!(
                "[lock]\nbackend = \"etcd\"\n\n[lock.etcd]\napi = \"v2\"\nendpoints = [{:?}]\n",
                via.map(|v| v.0.to_string()).unwrap_or_else(|| server.endpoint())
            ),
            Backend::Lease { kubeconfig, .. } => format!(
                "[lock]\nbackend = \"kubernetes\"\n\n[lock.kubernetes]\nnamespace = {LEASE_NAMESPACE:?}\nkubeconfig = {:?}\n",
                via.map(|v| v.1).unwrap_or(kubeconfig)
            ),
        }
    }

    /// The store's URL (where the counting proxy forwards).
    fn url(&self) -> String {
        match self {
            Backend::Etcd { server, .. } | Backend::EtcdV2 { server, .. } => server.endpoint(),
            Backend::Lease { api, .. } => api.base_url(),
        }
    }

    /// A counting proxy in front of the store, and a kubeconfig that names it (Leases).
    async fn proxy(&self, dir: &Path) -> Result<(CountProxy, PathBuf), String> {
        let url = self.url();
        let addr = url
            .trim_start_matches("http://")
            .parse()
            .map_err(|e| format!("{url}: {e}"))?;
        let marker = matches!(self, Backend::EtcdV2 { .. }).then_some(count_proxy::ETCD_V2);
        let proxy = CountProxy::start(addr, marker)
            .await
            .map_err(|e| e.to_string())?;
        let path = dir.join("kubeconfig-proxy");
        if let Backend::Lease { api, .. } = self {
            let text = api
                .kubeconfig("lab")
                .map_err(|e| e.to_string())?
                .replace(&api.base_url(), &proxy.url());
            std::fs::write(&path, text).map_err(|e| e.to_string())?;
        }
        Ok((proxy, path))
    }

    /// What is counted beside requests: watch events, etcd's CPU time.
    async fn extra(&self) -> Extra {
        match self {
            Backend::Etcd { server, .. } | Backend::EtcdV2 { server, .. } => Extra {
                etcd: usage::etcd_sent(&server.endpoint())
                    .await
                    .unwrap_or_default(),
                etcd_cpu: server.pid().map(usage::process_cpu).unwrap_or_default(),
                ..Extra::default()
            },
            Backend::Lease { .. } => Extra {
                api_events: crate::kube_api::watch_events_sent(),
                ..Extra::default()
            },
        }
    }

    async fn counters(&self) -> Result<Counters, String> {
        match self {
            Backend::Etcd { server, .. } | Backend::EtcdV2 { server, .. } => Ok(Counters::Etcd(
                util::etcd_counters(&server.endpoint()).await?,
            )),
            Backend::Lease { api, .. } => {
                Ok(Counters::Api(api.cluster().requests().count(|_| true)))
            }
        }
    }

    fn probe(&self) -> Probe {
        match self {
            Backend::Etcd { server, .. } | Backend::EtcdV2 { server, .. } => {
                Probe::Etcd(server.endpoint())
            }
            Backend::Lease { api, .. } => Probe::Api(api.cluster().clone()),
        }
    }

    /// The holders (as named in the semaphore: machine id or node name) after every change,
    /// timestamped when seen.
    async fn watch(&mut self) -> Result<mpsc::UnboundedReceiver<(Instant, Vec<String>)>, String> {
        let (tx, rx) = mpsc::unbounded_channel();
        match self {
            Backend::Etcd { client, .. } => {
                let mut stream = client
                    .watch(semaphore_key("default"), None)
                    .await
                    .map_err(|e| e.to_string())?;
                tokio::spawn(async move {
                    while let Some(Ok(resp)) = stream.next().await {
                        let now = Instant::now();
                        for e in resp.events() {
                            let Some(kv) = e.kv() else { continue };
                            if let Ok(doc) = SemaphoreDoc::parse(kv.value()) {
                                if tx.send((now, doc.holders)).is_err() {
                                    return;
                                }
                            }
                        }
                    }
                });
            }
            Backend::EtcdV2 { server, watcher } => {
                let (feed, mut versions) = mpsc::unbounded_channel();
                *watcher =
                    Some(V2DocWatcher::start_feeding(&server.endpoint(), V2_KEY, feed).await?);
                tokio::spawn(async move {
                    while let Some(v) = versions.recv().await {
                        if tx.send((v.seen, v.holders().unwrap_or_default())).is_err() {
                            return;
                        }
                    }
                });
            }
            Backend::Lease { api, .. } => {
                let cluster = api.cluster().clone();
                tokio::spawn(async move {
                    let mut last: Option<Vec<String>> = None;
                    loop {
                        let seen = cluster
                            .wait_for(Duration::from_secs(3600), |s| {
                                let mut holders: Vec<String> = s
                                    .stored(Kind::Lease, Some(LEASE_NAMESPACE))
                                    .filter_map(|l| {
                                        l.pointer("/spec/holderIdentity")
                                            .and_then(serde_json::Value::as_str)
                                            .filter(|h| !h.is_empty())
                                            .map(str::to_string)
                                    })
                                    .collect();
                                holders.sort();
                                (last.as_ref() != Some(&holders)).then_some(holders)
                            })
                            .await;
                        let Ok(holders) = seen else { return };
                        last = Some(holders.clone());
                        if tx.send((Instant::now(), holders)).is_err() {
                            return;
                        }
                    }
                });
            }
        }
        Ok(rx)
    }
}

/// Counted beside the requests, at one time.
#[derive(Debug, Clone, Copy, Default)]
struct Extra {
    etcd: usage::EtcdSent,
    etcd_cpu: Duration,
    api_events: u64,
}

/// The bytes, watch events and CPU time of the rollout per node per reboot, one line.
fn describe_extra(
    backend: &Backend,
    proxy: &Counts,
    extra: (&Extra, &Extra),
    own_cpu: Duration,
    per: f64,
) -> String {
    let (after, before) = extra;
    let events = match backend {
        Backend::Etcd { .. } => after.etcd.minus(&before.etcd).events,
        Backend::EtcdV2 { .. } => proxy.watch_events as f64,
        Backend::Lease { .. } => (after.api_events - before.api_events) as f64,
    };
    let etcd_cpu = after.etcd_cpu.saturating_sub(before.etcd_cpu);
    format!(
        "bytes from the store per node per reboot: {:.0} (to it {:.0}; counting proxy, nodes only); watch events per node per reboot: {:.2}; CPU per node per reboot: this process {:.2} ms (nodes and harness{}), etcd {:.2} ms",
        proxy.received as f64 / per,
        proxy.sent as f64 / per,
        events / per,
        own_cpu.as_secs_f64() * 1000.0 / per,
        if matches!(backend, Backend::Lease { .. }) { ", the stand-in" } else { "" },
        etcd_cpu.as_secs_f64() * 1000.0 / per,
    )
}

/// What counts the store's requests, for the sampler.
enum Probe {
    Etcd(String),
    Api(crate::kube_api::Cluster),
}

impl Probe {
    async fn count(&self) -> f64 {
        match self {
            Probe::Etcd(ep) => util::etcd_counters(ep)
                .await
                .map(|c| c.requests())
                .unwrap_or(0.0),
            Probe::Api(c) => c.requests().count(|_| true) as f64,
        }
    }
}

/// The in-process reboot: tell the harness, which "powers the node off".
struct BenchRebooter {
    node: usize,
    tx: mpsc::UnboundedSender<(usize, Instant)>,
}

#[async_trait::async_trait]
impl Rebooter for BenchRebooter {
    async fn reboot(&self, _: rebootd::reboot_method::Kind) -> Result<(), RebootError> {
        let _ = self.tx.send((self.node, Instant::now()));
        Ok(())
    }

    async fn manager(&self) -> Result<rebootd::systemd::Manager, RebootError> {
        Err(RebootError::Unsupported {
            what: "systemd's manager",
        })
    }
}

/// The simulated hosts have no logind: nothing holds a reboot off.
#[async_trait::async_trait]
impl Inhibitors for BenchRebooter {
    async fn blockers(&self) -> Result<Vec<Inhibitor>, RebootError> {
        Err(RebootError::Unsupported { what: "inhibitors" })
    }

    async fn blockers_changed(&self, _: &[Inhibitor]) -> Result<Vec<Inhibitor>, RebootError> {
        Err(RebootError::Unsupported { what: "inhibitors" })
    }
}

/// The simulated hosts have no one logged in to warn.
#[async_trait::async_trait]
impl Sessions for BenchRebooter {
    async fn sessions(&self) -> Result<Vec<Session>, RebootError> {
        Err(RebootError::Unsupported { what: "sessions" })
    }

    async fn announce(&self, _: jiff::Timestamp) -> Result<(), RebootError> {
        Err(RebootError::Unsupported { what: "sessions" })
    }

    async fn withdraw(&self) -> Result<(), RebootError> {
        Err(RebootError::Unsupported { what: "sessions" })
    }
}

struct SimNode {
    dir: PathBuf,
    machine_id: String,
}

impl SimNode {
    fn config_path(&self) -> PathBuf {
        self.dir.join("config.toml")
    }
    fn store(&self) -> StateStore {
        StateStore::new(self.dir.join("state"))
    }
}

/// The rebootd calls on the lock, counted over all nodes (what the store requests are spent on).
#[derive(Debug, Default)]
struct Calls {
    acquire: AtomicU64,
    fence: AtomicU64,
    heartbeat: AtomicU64,
    release: AtomicU64,
    report_phase: AtomicU64,
}

impl Calls {
    fn snapshot(&self) -> Calls {
        let f = |c: &AtomicU64| AtomicU64::new(c.load(Ordering::Relaxed));
        Calls {
            acquire: f(&self.acquire),
            fence: f(&self.fence),
            heartbeat: f(&self.heartbeat),
            release: f(&self.release),
            report_phase: f(&self.report_phase),
        }
    }

    fn minus(&self, b: &Calls) -> Calls {
        let f = |x: &AtomicU64, y: &AtomicU64| {
            AtomicU64::new(x.load(Ordering::Relaxed) - y.load(Ordering::Relaxed))
        };
        Calls {
            acquire: f(&self.acquire, &b.acquire),
            fence: f(&self.fence, &b.fence),
            heartbeat: f(&self.heartbeat, &b.heartbeat),
            release: f(&self.release, &b.release),
            report_phase: f(&self.report_phase, &b.report_phase),
        }
    }

    fn describe(&self, per: f64) -> String {
        let f = |c: &AtomicU64| c.load(Ordering::Relaxed) as f64 / per;
        format!(
            "acquire={:.2} report_phase={:.2} fence={:.2} heartbeat={:.2} release={:.2}",
            f(&self.acquire),
            f(&self.report_phase),
            f(&self.fence),
            f(&self.heartbeat),
            f(&self.release)
        )
    }
}

/// A node's semaphore, counting its calls into [`Calls`].
struct Counted {
    inner: Box<dyn Semaphore>,
    calls: Arc<Calls>,
}

#[async_trait::async_trait]
impl Semaphore for Counted {
    fn backend(&self) -> rebootd::lock::Backend {
        self.inner.backend()
    }
    async fn acquire(&self, me: &Identity) -> Result<(), LockError> {
        self.calls.acquire.fetch_add(1, Ordering::Relaxed);
        self.inner.acquire(me).await
    }
    async fn acquire_unless_paused(
        &self,
        me: &Identity,
        first: Phase,
    ) -> Result<Acquired, LockError> {
        self.calls.acquire.fetch_add(1, Ordering::Relaxed);
        self.inner.acquire_unless_paused(me, first).await
    }
    async fn fence(&self, me: &Identity) -> Result<Fence, LockError> {
        self.calls.fence.fetch_add(1, Ordering::Relaxed);
        self.inner.fence(me).await
    }
    fn heartbeat_every(&self) -> Option<Duration> {
        self.inner.heartbeat_every()
    }
    async fn heartbeat(&self, me: &Identity) -> Result<Fence, LockError> {
        self.calls.heartbeat.fetch_add(1, Ordering::Relaxed);
        self.inner.heartbeat(me).await
    }
    async fn release(&self, me: &Identity) -> Result<(), LockError> {
        self.calls.release.fetch_add(1, Ordering::Relaxed);
        self.inner.release(me).await
    }
    async fn report_phase(&self, me: &Identity, phase: Phase) -> Result<Reported, LockError> {
        self.calls.report_phase.fetch_add(1, Ordering::Relaxed);
        self.inner.report_phase(me, phase).await
    }
    // The fleet records go to the store as the daemon's do (their requests are counted there).
    fn fleet(&self) -> Option<&dyn rebootd::fleet::FleetStore> {
        self.inner.fleet()
    }
}

// The pause is read and followed before every wait for a slot, as the daemon does.
#[async_trait::async_trait]
impl Pauses for Counted {
    async fn group_pause(&self) -> Result<Option<GroupPause>, LockError> {
        self.inner.group_pause().await
    }
    async fn group_pause_changed(
        &self,
        known: Option<&GroupPause>,
    ) -> Result<Option<GroupPause>, LockError> {
        self.inner.group_pause_changed(known).await
    }
}

/// Start one boot of node `i`: new boot id, config, new semaphore connection, new Runtime.
async fn boot(
    node: &SimNode,
    i: usize,
    tx: mpsc::UnboundedSender<(usize, Instant)>,
    calls: Arc<Calls>,
) -> Result<JoinHandle<()>, String> {
    std::fs::write(node.dir.join("boot_id"), format!("{}\n", util::random_id()))
        .map_err(|e| e.to_string())?;
    let config = Config::load(&[node.config_path()]).map_err(|e| e.to_string())?;
    let me = rebootd::runtime::identity(&config, &node.store()).map_err(|e| e.to_string())?;
    let sem = rebootd::runtime::open_semaphore(&config)
        .await
        .map_err(|e| e.to_string())?;
    let sem: Box<dyn Semaphore> = Box::new(Counted { inner: sem, calls });
    let rt = Runtime::new(config, node.store(), sem, None, me)
        .with_host(HostSeams::new(BenchRebooter { node: i, tx }));
    Ok(tokio::spawn(async move {
        if let Err(e) = rt.run(std::future::pending()).await {
            eprintln!("node {i}: runtime ended: {e}");
        }
    }))
}

#[derive(Debug, Default, Clone)]
struct Times {
    acquired: Option<Instant>,
    reboot_called: Option<Instant>,
    booted: Option<Instant>,
    released: Option<Instant>,
}

pub async fn run(a: Args) -> Result<(), String> {
    let root = tempfile::Builder::new()
        .prefix("rebootd-bench-rollout-")
        .tempdir()
        .map_err(|e| e.to_string())?;
    let mut backend = Backend::start(&a, root.path()).await?;
    // The nodes talk to the store through a counting proxy (bytes, v2 watch events).
    let (proxy, proxy_kubeconfig) = backend.proxy(root.path()).await?;
    let proxy_url = proxy.url();
    let mut nodes = Vec::new();
    for i in 0..a.nodes {
        let dir = root.path().join(format!("node-{i}"));
        std::fs::create_dir_all(dir.join("state")).map_err(|e| e.to_string())?;
        let machine_id = util::random_id();
        std::fs::write(dir.join("machine-id"), format!("{machine_id}\n"))
            .map_err(|e| e.to_string())?;
        let config = format!(
            "[identity]\nnode_name = \"node-{i}\"\nmachine_id_file = {mid:?}\nboot_id_file = {bid:?}\n\n\
             [triggers]\nupdate_engine = false\n\n\
             [reboot]\nretry_interval = \"1s\"\ncoordinator_file = \"\"\n\n{lock}",
            mid = dir.join("machine-id"),
            bid = dir.join("boot_id"),
            lock = backend.lock_config_via(Some((&proxy_url, &proxy_kubeconfig))),
        );
        std::fs::write(dir.join("config.toml"), config).map_err(|e| e.to_string())?;
        nodes.push(SimNode { dir, machine_id });
    }
    let nodes = Arc::new(nodes);
    // Holders are machine ids (etcd) or node names (Leases).
    let by_id: HashMap<String, usize> = nodes
        .iter()
        .enumerate()
        .flat_map(|(i, n)| [(n.machine_id.clone(), i), (format!("node-{i}"), i)])
        .collect();

    check_inotify(a.nodes)?;
    let (tx, mut reboots) = mpsc::unbounded_channel::<(usize, Instant)>();
    let tasks: Arc<Mutex<Vec<Option<JoinHandle<()>>>>> =
        Arc::new(Mutex::new((0..a.nodes).map(|_| None).collect()));
    let calls = Arc::new(Calls::default());
    for i in 0..a.nodes {
        let h = boot(&nodes[i], i, tx.clone(), calls.clone()).await?;
        tasks.lock().unwrap()[i] = Some(h);
    }
    // Every node has written its first state (idle) and its triggers listen.
    let deadline = Instant::now() + Duration::from_secs(60);
    for n in nodes.iter() {
        while n.store().load().ok().flatten().is_none() {
            if Instant::now() > deadline {
                return Err("nodes did not start within 60 s".into());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    tokio::time::sleep(Duration::from_millis(500)).await;

    // The outside watcher.
    let times: Arc<Mutex<Vec<Times>>> = Arc::new(Mutex::new(vec![Times::default(); a.nodes]));
    let (done_tx, mut done_rx) = mpsc::unbounded_channel::<()>();
    let mut changes = backend.watch().await?;
    let (t2, max_seen) = (times.clone(), Arc::new(Mutex::new(0usize)));
    let max_seen2 = max_seen.clone();
    let handoff_gaps: Arc<Mutex<Vec<f64>>> = Arc::new(Mutex::new(Vec::new()));
    let gaps2 = handoff_gaps.clone();
    let n_nodes = a.nodes;
    let watcher = tokio::spawn(async move {
        let mut holding: Vec<usize> = Vec::new();
        let mut last_release: Option<Instant> = None;
        let mut released = 0;
        while let Some((now, holders)) = changes.recv().await {
            {
                let now_holding: Vec<usize> = holders
                    .iter()
                    .filter_map(|h| by_id.get(h).copied())
                    .collect();
                let mut t = t2.lock().unwrap();
                for &i in &now_holding {
                    if !holding.contains(&i) && t[i].acquired.is_none() {
                        t[i].acquired = Some(now);
                        if let Some(r) = last_release {
                            gaps2.lock().unwrap().push(ms(now - r));
                        }
                    }
                }
                for &i in &holding {
                    if !now_holding.contains(&i) && t[i].released.is_none() {
                        t[i].released = Some(now);
                        last_release = Some(now);
                        released += 1;
                    }
                }
                let mut m = max_seen2.lock().unwrap();
                *m = (*m).max(holders.len());
                holding = now_holding;
            }
            if released >= n_nodes {
                let _ = done_tx.send(());
            }
        }
    });

    // The simulated reboots.
    let (nodes2, tasks2, times3, reboot_time, calls2) = (
        nodes.clone(),
        tasks.clone(),
        times.clone(),
        a.reboot_time,
        calls.clone(),
    );
    let rebooter = tokio::spawn(async move {
        while let Some((i, at)) = reboots.recv().await {
            times3.lock().unwrap()[i].reboot_called = Some(at);
            if let Some(h) = tasks2.lock().unwrap()[i].take() {
                h.abort();
            }
            let (nodes, tasks, times, tx, calls) = (
                nodes2.clone(),
                tasks2.clone(),
                times3.clone(),
                tx.clone(),
                calls2.clone(),
            );
            tokio::spawn(async move {
                tokio::time::sleep(reboot_time).await;
                times.lock().unwrap()[i].booted = Some(Instant::now());
                match boot(&nodes[i], i, tx, calls).await {
                    Ok(h) => tasks.lock().unwrap()[i] = Some(h),
                    Err(e) => eprintln!("node {i}: boot failed: {e}"),
                }
            });
        }
    });

    let before = backend.counters().await?;
    let (proxy_before, extra_before, cpu_before) =
        (proxy.counts(), backend.extra().await, usage::own_cpu());
    let calls_before = calls.snapshot();
    // The store's request rate, each second: the peak is what the fleet puts on it.
    let (peak_tx, peak_rx) = tokio::sync::watch::channel((0.0f64, 0.0f64));
    let sampler = {
        let probe = backend.probe();
        tokio::spawn(async move {
            let start = Instant::now();
            let mut last = probe.count().await;
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            tick.tick().await;
            loop {
                tick.tick().await;
                let now = probe.count().await;
                let rate = now - last;
                last = now;
                peak_tx.send_if_modified(|p| {
                    (rate > p.0)
                        .then(|| *p = (rate, start.elapsed().as_secs_f64()))
                        .is_some()
                });
            }
        })
    };
    let t0 = Instant::now();
    for n in nodes.iter() {
        rebootd::state::write_atomic(&n.store().request_path(), b"{\"by\":\"bench\"}")
            .map_err(|e| e.to_string())?;
    }
    let waves = a.nodes.div_ceil(a.max as usize) as u32;
    let budget = a
        .budget
        .unwrap_or(a.reboot_time * waves * 3 + Duration::from_secs(120));
    if tokio::time::timeout(budget, done_rx.recv()).await.is_err() {
        let released = times
            .lock()
            .unwrap()
            .iter()
            .filter(|t| t.released.is_some())
            .count();
        let requests = backend.counters().await?.requests_since(&before);
        let (peak, peak_at) = *peak_rx.borrow();
        println!(
            "not done within {budget:?}: {released} of {} nodes rebooted and released; {requests:.0} store requests so far ({:.2} per released reboot); peak {peak:.0}/s (at t = {peak_at:.0} s)",
            a.nodes,
            requests / released.max(1) as f64
        );
        return Err(format!("rollout not done within {budget:?}"));
    }
    let after = backend.counters().await?;
    let (proxy_during, extra_after, cpu_during) = (
        proxy.counts().minus(&proxy_before),
        backend.extra().await,
        usage::own_cpu().saturating_sub(cpu_before),
    );
    sampler.abort();
    let (peak, peak_at) = *peak_rx.borrow();
    let calls_during = calls.snapshot().minus(&calls_before);
    let times = times.lock().unwrap().clone();
    let end = times.iter().filter_map(|t| t.released).max().unwrap_or(t0);
    let total = end - t0;
    watcher.abort();
    rebooter.abort();
    for h in tasks.lock().unwrap().iter_mut().filter_map(Option::take) {
        h.abort();
    }

    let ideal = a.reboot_time * waves;
    let per = |f: fn(&Times) -> Option<(Instant, Instant)>| -> Vec<f64> {
        times
            .iter()
            .filter_map(f)
            .map(|(a, b)| if b >= a { ms(b - a) } else { -ms(a - b) })
            .collect()
    };
    let hold = stats(&per(|t| Some((t.acquired?, t.released?))));
    let to_reboot = stats(&per(|t| Some((t.acquired?, t.reboot_called?))));
    let after_boot = stats(&per(|t| Some((t.booted?, t.released?))));
    let first_acq = stats(&per(|t| Some((t.acquired?, t.acquired?))));
    let _ = first_acq;
    let cycle_measured = hold.median / 1000.0;
    println!(
        "rollout: {} nodes, max {}, reboot time {:?}: total {:.2}s",
        a.nodes,
        a.max,
        a.reboot_time,
        total.as_secs_f64()
    );
    println!(
        "ideal ceil({}/{}) x reboot_time = {} x {:.2}s = {:.2}s; ratio {:.4} (goal <= 1.05: {})",
        a.nodes,
        a.max,
        waves,
        a.reboot_time.as_secs_f64(),
        ideal.as_secs_f64(),
        total.as_secs_f64() / ideal.as_secs_f64(),
        if total.as_secs_f64() / ideal.as_secs_f64() <= 1.05 {
            "met"
        } else {
            "MISSED"
        }
    );
    println!(
        "measured cycle (median slot hold, acquire -> release): {:.3}s; ratio to ceil(N/max) x that: {:.4}",
        cycle_measured,
        total.as_secs_f64() / (waves as f64 * cycle_measured)
    );
    println!("slot hold per node:                     {hold}");
    println!("acquire -> Rebooter::reboot called:     {to_reboot}");
    println!("booted (new Runtime started) -> release: {after_boot}");
    println!(
        "release -> next acquisition (watcher):  {}",
        stats(&handoff_gaps.lock().unwrap())
    );
    println!(
        "most holders at once (outside watcher): {} (max {})",
        max_seen.lock().unwrap(),
        a.max
    );
    println!(
        "store requests per second, sampled each second: peak {peak:.0} (at t = {peak_at:.0} s), mean {:.1} over the rollout",
        after.requests_since(&before) / total.as_secs_f64()
    );
    println!(
        "rebootd lock calls per node per reboot: {}",
        calls_during.describe(a.nodes as f64)
    );
    match (after, before) {
        (Counters::Etcd(after), Counters::Etcd(before)) => {
            let d = after.minus(&before);
            println!(
                "etcd requests per node per reboot: {:.2} [{}] (total {:.0}, outside watcher's stream included)",
                d.requests() / a.nodes as f64,
                d.describe(a.nodes as f64),
                d.requests()
            );
        }
        (Counters::Api(after), Counters::Api(before)) => {
            let d = after - before;
            let kinds = match &backend {
                Backend::Lease { api, .. } => {
                    let all = api.cluster().requests().all();
                    api_kinds(
                        &all[before.min(all.len())..after.min(all.len())],
                        a.nodes as f64,
                    )
                }
                _ => String::new(),
            };
            println!(
                "API requests per node per reboot: {:.2} [{kinds}] (total {d}; watches counted once, when opened)",
                d as f64 / a.nodes as f64
            );
        }
        _ => {}
    }
    println!(
        "{}",
        describe_extra(
            &backend,
            &proxy_during,
            (&extra_after, &extra_before),
            cpu_during,
            a.nodes as f64
        )
    );
    if a.locksmithd > 0 {
        let Backend::EtcdV2 { server, .. } = &backend else {
            return Err("--locksmithd needs --backend etcd-v2".into());
        };
        let gaps = peers::handoffs(&peers::changes(
            &backend_history(&backend).unwrap_or_default(),
        ));
        locksmithd_rollout(server, &proxy, &a, total, &gaps).await?;
    }
    drop(root);
    Ok(())
}

/// API requests by kind: method, and for Leases whether on one object or the collection (list,
/// watch), per `per`.
pub(super) fn api_kinds(records: &[crate::kube_api::RequestRecord], per: f64) -> String {
    let mut by: std::collections::BTreeMap<String, usize> = Default::default();
    for r in records {
        let watch = r
            .query
            .split('&')
            .any(|kv| kv == "watch=true" || kv == "watch=1");
        let parts: Vec<&str> = r.path.trim_end_matches('/').split('/').collect();
        let what = match parts.iter().rposition(|p| *p == "leases") {
            Some(i) if i + 1 < parts.len() => "lease",
            Some(_) => "leases",
            None => "other",
        };
        let kind = if watch {
            format!("WATCH {what}")
        } else {
            format!("{} {what}", r.method)
        };
        *by.entry(kind).or_default() += 1;
    }
    by.iter()
        .map(|(k, n)| format!("{k}={:.2}", *n as f64 / per))
        .collect::<Vec<_>>()
        .join(" ")
}

fn backend_history(b: &Backend) -> Option<Vec<crate::v2_watcher::DocVersion>> {
    match b {
        Backend::EtcdV2 {
            watcher: Some(w), ..
        } => Some(w.history()),
        _ => None,
    }
}

/// The same rolling reboot by real locksmithd nodes, on the same etcd.
async fn locksmithd_rollout(
    etcd: &EtcdServer,
    proxy: &CountProxy,
    a: &Args,
    rebootd_total: Duration,
    rebootd_gaps: &[f64],
) -> Result<(), String> {
    let before = util::etcd_counters(&etcd.endpoint()).await?;
    let (proxy_before, cpu_before) = (proxy.counts(), etcd.pid().map(usage::process_cpu));
    let run = peers::run_locksmithd(
        &proxy.url(),
        a.locksmithd,
        a.max,
        a.reboot_time,
        peers::Mode::Rolling,
        Duration::from_secs(3600),
    )
    .await?;
    let after = util::etcd_counters(&etcd.endpoint()).await?;
    let p = proxy.counts().minus(&proxy_before);
    let etcd_cpu = etcd
        .pid()
        .map(usage::process_cpu)
        .zip(cpu_before)
        .map(|(a, b)| a.saturating_sub(b))
        .unwrap_or_default();
    let d = after.minus(&before);
    let gaps = peers::handoffs(&peers::changes(&run.history));
    println!(
        "locksmithd rollout: {} real nodes, max {}, reboot time {:?}: total {:.2}s ({} reboots, most holders {})",
        a.locksmithd,
        a.max,
        a.reboot_time,
        run.total.as_secs_f64(),
        run.reboots,
        run.most_holders
    );
    println!(
        "locksmithd release -> next acquisition (watcher): {}",
        stats(&gaps)
    );
    println!(
        "locksmithd etcd requests per node per reboot: {:.2} [{}]",
        d.requests() / a.locksmithd as f64,
        d.describe(a.locksmithd as f64)
    );
    if a.locksmithd == a.nodes {
        println!(
            "rebootd / locksmithd: total {:.4}; hand-off median {:.4}",
            rebootd_total.as_secs_f64() / run.total.as_secs_f64(),
            stats(rebootd_gaps).median / stats(&gaps).median
        );
    }
    let per = a.locksmithd as f64;
    println!(
        "locksmithd bytes from the store per node per reboot: {:.0} (to it {:.0}; counting proxy, locksmithctl's set-max included); watch events {:.2}; etcd CPU per node per reboot {:.2} ms",
        p.received as f64 / per,
        p.sent as f64 / per,
        p.watch_events as f64 / per,
        etcd_cpu.as_secs_f64() * 1000.0 / per
    );
    println!("locksmithd RSS at the end (kB): {:?}", run.rss_kb);
    Ok(())
}

/// Every in-process node watches its trigger files and its control directory with inotify
/// instances of its own (about 2.3 per node, measured with 20 nodes): more nodes than the user's
/// `fs.inotify.max_user_instances` allows (128 on Debian) leave nodes that never see their
/// request, and everything else of the user's on the machine short of inotify. Refused here,
/// saying what to raise.
fn check_inotify(nodes: usize) -> Result<(), String> {
    const PATH: &str = "/proc/sys/fs/inotify/max_user_instances";
    let Ok(text) = std::fs::read_to_string(PATH) else {
        return Ok(());
    };
    let Ok(limit) = text.trim().parse::<usize>() else {
        return Ok(());
    };
    let needed = nodes * 3 + 64;
    if limit < needed {
        return Err(format!(
            "{nodes} nodes need about {needed} inotify instances and {PATH} is {limit}: \
             raise it first (sysctl -w fs.inotify.max_user_instances={})",
            needed.next_power_of_two()
        ));
    }
    Ok(())
}
