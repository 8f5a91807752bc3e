//! Store-level simulation: what N nodes cost the store, counted at the store, with no harness
//! in the figures. Each simulated node runs its backend's real `lock::Semaphore`, opened from
//! the same `[lock]` config a node has, against the real etcd (v3 or v2) or the Lease stand-in:
//! `acquire_unless_paused` (the take writes `rebooting`), the `rebooting` report (which the take
//! made), a power cut (the connection dropped), the simulated reboot time, a new boot id and a
//! new connection, the `waiting_for_healthy` report, `release`. That is the lock calls of a
//! rollout node without drain, gates or health checks (`rollout.rs` runs the real `Runtime`).
//! What is not here: the Runtime's state file, triggers, D-Bus, the agent's steps, a drain.
//!
//! Counted per node per reboot: store requests (etcd's own metrics, or the stand-in's request
//! count), bytes each way through a counting TCP proxy in front of the store (`--direct`: no
//! proxy, bytes from etcd's gRPC metric only), watch events (etcd v3: its events metric; v2:
//! the proxy, one per event object in a watch's answer; Leases: the stand-in), and the CPU time
//! of the nodes' own threads (a Tokio runtime of their own, apart from the stand-in, the proxy
//! and the harness; etcd is another process, its CPU time is shown apart).

use super::usage::{self, NodeRuntime};
use super::util::{self, ms, stats};
use crate::count_proxy::{self, CountProxy, Counts};
use crate::etcd::{EtcdOptions, EtcdServer};
use crate::kube_api::{KubeApi, KubeApiHandle, Options as KubeOptions};
use rebootd::config::Config;
use rebootd::lock::{Acquired, Identity, Semaphore};
use rebootd::state::Phase;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Debug, clap::Args)]
pub struct Args {
    #[arg(long, default_value_t = 100)]
    nodes: usize,
    #[arg(long, default_value_t = 10)]
    max: u64,
    /// Simulated reboot time: the node is cut off this long.
    #[arg(long, default_value = "2s", value_parser = rebootd::config::parse_duration)]
    reboot_time: Duration,
    /// `etcd` (v3), `etcd-v2` or `lease` (the API stand-in).
    #[arg(long, default_value = "etcd")]
    backend: String,
    /// etcd version: 3.4 or 3.5.
    #[arg(long, default_value = "3.5")]
    etcd: String,
    /// No counting proxy (a proxy holds two sockets per node connection): bytes from etcd's
    /// gRPC metric only (v3), none on v2 and Leases.
    #[arg(long)]
    direct: bool,
    /// Worker threads of the nodes' runtime.
    #[arg(long, default_value_t = 2)]
    workers: usize,
    /// Give up after this long (and print how far it got); default 3 x the ideal + 120 s.
    #[arg(long, value_parser = rebootd::config::parse_duration)]
    budget: Option<Duration>,
    /// Start the nodes evenly over this long (node i at i x arrivals / nodes), as a fleet's
    /// updates reach its nodes over time; default 0: all at once (a start burst).
    #[arg(long, default_value = "0s", value_parser = rebootd::config::parse_duration)]
    arrivals: Duration,
}

enum Store {
    Etcd(Box<EtcdServer>),
    Lease(KubeApiHandle),
}

/// What is counted, read at once.
#[derive(Debug, Clone, Default)]
struct Reading {
    requests: f64,
    /// etcd's counters by method (etcd only).
    by_method: Option<util::EtcdCounters>,
    proxy: Counts,
    /// etcd v3 watch events and gRPC bytes sent (etcd only).
    etcd: usage::EtcdSent,
    /// Watch events the stand-in sent (Leases only).
    api_events: u64,
    node_cpu: Duration,
    own_cpu: Duration,
    at: Option<std::time::SystemTime>,
    store_cpu: Duration,
}

struct Sim {
    store: Store,
    proxy: Option<CountProxy>,
    v2: bool,
}

impl Sim {
    async fn start(a: &Args, dir: &Path) -> Result<(Sim, String), String> {
        let (store, v2) = match a.backend.as_str() {
            "etcd" | "etcd-v2" => {
                let v = util::parse_etcd(&a.etcd)?;
                let v2 = a.backend == "etcd-v2";
                let opts = if v2 {
                    EtcdOptions::v2()
                } else {
                    EtcdOptions::default()
                };
                let server = EtcdServer::start_with(v, opts)
                    .await
                    .map_err(|e| e.to_string())?;
                println!(
                    "etcd {} ({}) at {}",
                    v,
                    server.binaries().version,
                    server.endpoint()
                );
                (Store::Etcd(Box::new(server)), v2)
            }
            "lease" | "kubernetes" => {
                let api = KubeApi::start(KubeOptions::default())
                    .await
                    .map_err(|e| e.to_string())?;
                println!("Leases in the API stand-in at {}", api.base_url());
                (Store::Lease(api), false)
            }
            other => {
                return Err(format!(
                    "--backend {other}: expected etcd, etcd-v2 or lease"
                ))
            }
        };
        let upstream = match &store {
            Store::Etcd(s) => s.endpoint(),
            Store::Lease(api) => api.base_url(),
        };
        let proxy = if a.direct {
            None
        } else {
            let addr = upstream
                .trim_start_matches("http://")
                .parse()
                .map_err(|e| format!("{upstream}: {e}"))?;
            let marker = v2.then_some(count_proxy::ETCD_V2);
            Some(
                CountProxy::start(addr, marker)
                    .await
                    .map_err(|e| e.to_string())?,
            )
        };
        let sim = Sim { store, proxy, v2 };
        // set-max talks to the store directly: not counted in bytes.
        let admin_cfg = load(
            dir,
            "admin.toml",
            &sim.lock_config(dir, "admin", &upstream)?,
        )?;
        let admin = rebootd::lock::open::open_admin(&admin_cfg)
            .await
            .map_err(|e| e.to_string())?;
        admin
            .set_max(a.max, true)
            .await
            .map_err(|e| e.to_string())?;
        let via = sim.proxy.as_ref().map(CountProxy::url).unwrap_or(upstream);
        let nodes = sim.lock_config(dir, "nodes", &via)?;
        Ok((sim, nodes))
    }

    /// A config whose store is at `url` (`who`: a name for its kubeconfig).
    fn lock_config(&self, dir: &Path, who: &str, url: &str) -> Result<String, String> {
        let lock = match &self.store {
            Store::Etcd(_) => format!(
                "[lock]\nbackend = \"etcd\"\n\n[lock.etcd]\n{}endpoints = [{url:?}]\n",
                if self.v2 { "api = \"v2\"\n" } else { "" }
            ),
            Store::Lease(api) => {
                let path = dir.join(format!("kubeconfig-{who}"));
                let text = api
                    .kubeconfig("lab")
                    .map_err(|e| e.to_string())?
                    .replace(&api.base_url(), url);
                std::fs::write(&path, text).map_err(|e| e.to_string())?;
                format!(
                    "[lock]\nbackend = \"kubernetes\"\n\n[lock.kubernetes]\nnamespace = \"rebootd\"\nkubeconfig = {path:?}\n"
                )
            }
        };
        Ok(format!(
            "[identity]\nnode_name = \"sim\"\n\n[triggers]\nupdate_engine = false\n\n\
             [reboot]\ncoordinator_file = \"\"\n\n{lock}"
        ))
    }

    async fn read(&self, nodes: &NodeRuntime) -> Result<Reading, String> {
        let mut r = Reading {
            proxy: self
                .proxy
                .as_ref()
                .map(CountProxy::counts)
                .unwrap_or_default(),
            node_cpu: nodes.cpu(),
            own_cpu: usage::own_cpu(),
            at: Some(std::time::SystemTime::now()),
            ..Reading::default()
        };
        match &self.store {
            Store::Etcd(s) => {
                let c = util::etcd_counters(&s.endpoint()).await?;
                r.requests = c.requests();
                r.by_method = Some(c);
                r.etcd = usage::etcd_sent(&s.endpoint()).await?;
                r.store_cpu = s.pid().map(usage::process_cpu).unwrap_or_default();
            }
            Store::Lease(api) => {
                r.requests = api.cluster().requests().total() as f64;
                r.api_events = crate::kube_api::watch_events_sent();
            }
        }
        Ok(r)
    }
}

fn load(dir: &Path, name: &str, text: &str) -> Result<Config, String> {
    let path = dir.join(name);
    std::fs::write(&path, text).map_err(|e| e.to_string())?;
    Config::load(&[path]).map_err(|e| e.to_string())
}

/// When a node's calls returned.
#[derive(Debug, Default, Clone, Copy)]
struct Times {
    acquired: Option<Instant>,
    released: Option<Instant>,
}

/// One node's reboot, as its lock sees it.
async fn node(i: usize, config: Arc<Config>, reboot: Duration) -> Result<Times, String> {
    let mut me = Identity {
        id: util::random_id(),
        node: format!("node-{i}"),
        boot_id: util::random_id(),
        token: util::random_id(),
        zone: None,
    };
    let mut t = Times::default();
    let sem = open(&config).await?;
    loop {
        match sem.acquire_unless_paused(&me, Phase::Rebooting).await {
            Ok(Acquired::Held) => break,
            Ok(Acquired::Paused(_)) => return Err(format!("node {i}: the group is paused")),
            Err(e) => {
                eprintln!("node {i}: acquire: {e}; again in 1 s");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
    t.acquired = Some(Instant::now());
    // The take wrote `rebooting`: the runtime's report of it sends nothing.
    let _ = sem.report_phase(&me, Phase::Rebooting).await;
    drop(sem);
    tokio::time::sleep(reboot).await;
    me.boot_id = util::random_id();
    let sem = open(&config).await?;
    if let Err(e) = sem.report_phase(&me, Phase::WaitingForHealthy).await {
        eprintln!("node {i}: report: {e}");
    }
    while let Err(e) = sem.release(&me).await {
        eprintln!("node {i}: release: {e}; again in 1 s");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    t.released = Some(Instant::now());
    Ok(t)
}

async fn open(config: &Config) -> Result<Box<dyn Semaphore>, String> {
    rebootd::lock::open::open(config)
        .await
        .map_err(|e| e.to_string())
}

pub async fn run(a: Args) -> Result<(), String> {
    let root = tempfile::Builder::new()
        .prefix("rebootd-bench-store-sim-")
        .tempdir()
        .map_err(|e| e.to_string())?;
    let (sim, node_config) = Sim::start(&a, root.path()).await?;
    let config = Arc::new(load(root.path(), "node.toml", &node_config)?);
    let nodes = NodeRuntime::new(a.workers).map_err(|e| e.to_string())?;
    println!(
        "store-level simulation: {} nodes{}, max {}, reboot time {:?}, {}; nodes' runtime {} thread(s)",
        a.nodes,
        if a.arrivals.is_zero() {
            String::new()
        } else {
            format!(" arriving over {:?}", a.arrivals)
        },
        a.max,
        a.reboot_time,
        if a.direct { "no proxy" } else { "through a counting proxy" },
        a.workers
    );
    let times: Arc<Mutex<Vec<Times>>> = Arc::new(Mutex::new(vec![Times::default(); a.nodes]));
    let (done_tx, mut done_rx) = tokio::sync::mpsc::unbounded_channel::<()>();
    let before = sim.read(&nodes).await?;
    let t0 = Instant::now();
    for i in 0..a.nodes {
        let (config, times, done) = (config.clone(), times.clone(), done_tx.clone());
        let reboot = a.reboot_time;
        let start = t0 + a.arrivals.mul_f64(i as f64 / a.nodes as f64);
        nodes.handle().spawn(async move {
            tokio::time::sleep_until(start.into()).await;
            match node(i, config, reboot).await {
                Ok(t) => times.lock().unwrap_or_else(|p| p.into_inner())[i] = t,
                Err(e) => eprintln!("node {i}: {e}"),
            }
            let _ = done.send(());
        });
    }
    drop(done_tx);
    let waves = a.nodes.div_ceil(a.max as usize) as u32;
    // The last node arrives at about `arrivals` and still reboots once.
    let ideal = (a.reboot_time * waves).max(a.arrivals + a.reboot_time);
    let budget = a.budget.unwrap_or(ideal * 3 + Duration::from_secs(120));
    let mut ended = 0;
    let finished = tokio::time::timeout(budget, async {
        while done_rx.recv().await.is_some() {
            ended += 1;
        }
    })
    .await
    .is_ok();
    let total = t0.elapsed();
    let after = sim.read(&nodes).await?;
    let times = times.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let released = times.iter().filter(|t| t.released.is_some()).count();
    if !finished {
        println!(
            "not done within {budget:?}: {released} of {} nodes released",
            a.nodes
        );
    }
    report(&a, &sim, &before, &after, &times, total, ideal, released);
    drop(nodes);
    if finished && released == a.nodes {
        Ok(())
    } else {
        Err(format!("{released} of {} nodes released", a.nodes))
    }
}

#[allow(clippy::too_many_arguments)]
fn report(
    a: &Args,
    sim: &Sim,
    before: &Reading,
    after: &Reading,
    times: &[Times],
    total: Duration,
    ideal: Duration,
    released: usize,
) {
    let per = released.max(1) as f64;
    let p = after.proxy.minus(&before.proxy);
    let e = after.etcd.minus(&before.etcd);
    let events = match &sim.store {
        Store::Etcd(_) if sim.v2 => p.watch_events as f64,
        Store::Etcd(_) => e.events,
        Store::Lease(_) => (after.api_events - before.api_events) as f64,
    };
    println!(
        "total {:.2}s; ideal max(ceil({}/{}) x {:.2}s, arrivals + one reboot) = {:.2}s; ratio {:.4}",
        total.as_secs_f64(),
        a.nodes,
        a.max,
        a.reboot_time.as_secs_f64(),
        ideal.as_secs_f64(),
        total.as_secs_f64() / ideal.as_secs_f64()
    );
    // Hand-off: each release -> the first acquisition after it.
    let mut acq: Vec<Instant> = times.iter().filter_map(|t| t.acquired).collect();
    acq.sort();
    let mut gaps = Vec::new();
    let mut rel: Vec<Instant> = times.iter().filter_map(|t| t.released).collect();
    rel.sort();
    for r in rel {
        let i = acq.partition_point(|x| *x < r);
        if let Some(next) = acq.get(i) {
            gaps.push(ms(*next - r));
        }
    }
    println!(
        "release returned -> next acquire returned: {}",
        stats(&gaps)
    );
    println!("per node per reboot ({released} reboots):");
    let kinds = match (&after.by_method, &before.by_method, &sim.store, before.at) {
        (Some(x), Some(b), _, _) => x.minus(b).describe(per),
        (_, _, Store::Lease(api), Some(since)) => {
            let all: Vec<_> = api
                .cluster()
                .requests()
                .all()
                .into_iter()
                .filter(|r| r.at >= since)
                .collect();
            super::rollout::api_kinds(&all, per)
        }
        _ => String::new(),
    };
    println!(
        "  store requests:           {:.2} [{kinds}]",
        (after.requests - before.requests) / per
    );
    if sim.proxy.is_some() {
        println!(
            "  bytes from the store:     {:.0} (to the store {:.0}; {:.2} connections) [counting proxy]",
            p.received as f64 / per,
            p.sent as f64 / per,
            p.connections as f64 / per
        );
    }
    if matches!(sim.store, Store::Etcd(_)) && !sim.v2 {
        println!(
            "  gRPC bytes etcd sent:     {:.0} [etcd_network_client_grpc_sent_bytes_total]",
            e.grpc_bytes / per
        );
    }
    println!("  watch events delivered:   {:.2}", events / per);
    let node_cpu = after.node_cpu.saturating_sub(before.node_cpu);
    println!(
        "  nodes' CPU time:          {:.2} ms (the nodes' runtime threads; whole run {:.2} s)",
        node_cpu.as_secs_f64() * 1000.0 / per,
        node_cpu.as_secs_f64()
    );
    let own = after.own_cpu.saturating_sub(before.own_cpu);
    let store = after.store_cpu.saturating_sub(before.store_cpu);
    println!(
        "whole run: this process {:.2} s CPU ({}), etcd {:.2} s CPU",
        own.as_secs_f64(),
        match sim.store {
            Store::Lease(_) => "nodes, stand-in, proxy",
            Store::Etcd(_) => "nodes, proxy",
        },
        store.as_secs_f64()
    );
    if let Store::Etcd(server) = &sim.store {
        if let Some(peak) = server.pid().and_then(usage::peak_rss) {
            println!(
                "etcd's peak memory: {:.0} MB (VmHWM)",
                peak as f64 / 1_048_576.0
            );
        }
    }
}
