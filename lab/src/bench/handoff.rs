//! Slot hand-off latency: with `max = 1` and a chain of clients (each its own connection), the
//! holder releases and the next waiter's `acquire` returns. Measured in-process through the
//! library's `Semaphore` trait, from the moment `release()` is called to the moment the
//! waiter's `acquire()` returns (and, separately, from `release()` returning).

use super::peers;
use super::util::{self, ms, stats, Stats};
use crate::airlock::Airlock;
use crate::etcd::{EtcdOptions, EtcdServer, EtcdVersion};
use crate::kube_api::{KubeApi, NodeBuilder, Options as KubeOptions};
use crate::v2_watcher::V2DocWatcher;
use rebootd::lock::etcd_v2::EtcdV2Semaphore;
use rebootd::lock::etcd_v3::EtcdSemaphore;
use rebootd::lock::fleetlock::{FleetLock, Options as FleetLockOptions};
use rebootd::lock::kube_lease::KubeLeaseSemaphore;
use rebootd::lock::{Admin, Identity, Semaphore};
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Backend: etcd-3.4, etcd-3.5 (v3), etcd-v2 (locksmith's v2 document, etcd 3.4 with
    /// `--enable-v2`), airlock (the FleetLock backend through the real airlock, then rebootd's
    /// own etcd v3 store on the same etcd) or lease (Kubernetes Leases on the API stand-in).
    #[arg(long, default_value = "etcd-3.4")]
    backend: String,
    /// Hand-offs to measure.
    #[arg(long, default_value_t = 200)]
    count: usize,
    /// Clients in the chain (one holds, the others wait).
    #[arg(long, default_value_t = 3)]
    clients: usize,
    /// Pause before each release, so every waiter is back in its watch.
    #[arg(long, default_value = "50ms", value_parser = rebootd::config::parse_duration)]
    settle: Duration,
    /// With `--backend etcd-v2`: also, on the same etcd, a chain of this many real locksmithd
    /// nodes (max 1) handing the slot on (release by one locksmithd -> the next one holds).
    #[arg(long, default_value_t = 0)]
    locksmithd: usize,
    /// Hand-offs to measure between the locksmithd nodes.
    #[arg(long, default_value_t = 6)]
    locksmithd_count: usize,
}

pub async fn run(a: Args) -> Result<(), String> {
    if a.clients < 2 {
        return Err("--clients must be 2 or more".into());
    }
    let ids: Vec<Identity> = (0..a.clients)
        .map(|i| Identity {
            id: util::random_id(),
            node: format!("bench-{i}"),
            boot_id: util::random_id(),
            token: util::random_id(),
            zone: None,
        })
        .collect();
    let sems: Vec<Arc<dyn Semaphore>>;
    let admin: Option<Box<dyn Admin>>;
    // Keep the servers alive for the run.
    let mut _etcd = None;
    let mut _kube = None;
    let mut _dir = None;
    let mut _airlock = None;
    let metrics_endpoint;
    let mut v2_watch = None;
    match a.backend.as_str() {
        "etcd-v2" => {
            let etcd = EtcdServer::start_with(EtcdVersion::V34, EtcdOptions::v2())
                .await
                .map_err(|e| e.to_string())?;
            println!(
                "etcd v2 API ({}) at {}",
                etcd.binaries().version,
                etcd.endpoint()
            );
            let settings = &etcd.lock_settings(rebootd::config::EtcdApi::V2);
            let (chain, v2_admin) = connections(a.clients, || async {
                EtcdV2Semaphore::connect(settings, GROUP, None)
                    .await
                    .map_err(|e| e.to_string())
            })
            .await?;
            sems = chain;
            // Every connection is to the same group, so the same document key.
            v2_watch = Some(v2_admin.key().to_string());
            admin = Some(Box::new(v2_admin));
            metrics_endpoint = Some(etcd.endpoint());
            _etcd = Some(etcd);
        }
        b @ ("etcd-3.4" | "etcd-3.5") => {
            let v = util::parse_etcd(&b[5..])?;
            let etcd = EtcdServer::start(v).await.map_err(|e| e.to_string())?;
            println!("{} ({}) at {}", v, etcd.binaries().version, etcd.endpoint());
            let (chain, v3_admin) = etcd_v3_connections(&etcd, a.clients).await?;
            sems = chain;
            admin = Some(Box::new(v3_admin));
            metrics_endpoint = Some(etcd.endpoint());
            _etcd = Some(etcd);
        }
        "airlock" => {
            // rebootd's FleetLock backend through the real airlock (its semaphore in etcd v3),
            // then, on the same etcd, rebootd's own etcd store (below).
            let etcd = EtcdServer::start(EtcdVersion::V34)
                .await
                .map_err(|e| e.to_string())?;
            let airlock = Airlock::start(&etcd, &[("default", 1)])
                .await
                .map_err(|e| e.to_string())?;
            println!(
                "airlock (real) at {} on etcd {} at {}",
                airlock.url(),
                etcd.binaries().version,
                etcd.endpoint()
            );
            let mut chain: Vec<Arc<dyn Semaphore>> = Vec::new();
            for _ in 0..a.clients {
                let s = FleetLock::new(&airlock.url(), "default", FleetLockOptions::default())
                    .map_err(|e| e.to_string())?;
                chain.push(Arc::new(s));
            }
            sems = chain;
            admin = None;
            metrics_endpoint = Some(etcd.endpoint());
            _airlock = Some(airlock);
            _etcd = Some(etcd);
        }
        "lease" => {
            let api = KubeApi::start(KubeOptions::default())
                .await
                .map_err(|e| e.to_string())?;
            for id in &ids {
                api.cluster()
                    .add(&NodeBuilder::new(&id.node))
                    .map_err(|e| e.to_string())?;
            }
            let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
            let kc = dir.path().join("kubeconfig");
            api.write_kubeconfig(&kc).map_err(|e| e.to_string())?;
            println!("Kubernetes API stand-in at {}", api.base_url());
            let settings = rebootd::config::KubeLease {
                namespace: "kube-system".into(),
                name: "bench".into(),
                kubeconfig: None,
                zone_label: rebootd::config::DEFAULT_ZONE_LABEL.into(),
                node_selector: None,
            };
            let (chain, lease_admin) = connections(a.clients, || async {
                let client = rebootd::kube_client::connect(Some(&kc))
                    .await
                    .map_err(|e| e.to_string())?;
                Ok(KubeLeaseSemaphore::new(client, &settings, None))
            })
            .await?;
            sems = chain;
            admin = Some(Box::new(lease_admin));
            metrics_endpoint = None;
            _kube = Some(api);
            _dir = Some(dir);
        }
        other => {
            return Err(format!(
                "--backend {other}: expected etcd-3.4, etcd-3.5, etcd-v2, airlock or lease"
            ))
        }
    }
    if let Some(admin) = &admin {
        admin.set_max(1, true).await.map_err(|e| e.to_string())?;
    }
    let watcher = match (&v2_watch, &metrics_endpoint) {
        (Some(key), Some(ep)) => Some(V2DocWatcher::start(ep, key).await?),
        _ => None,
    };

    let (from_call, from_return, release_call, wall, before, after) =
        chain(&sems, &ids, &a, metrics_endpoint.as_deref()).await?;
    let handoff = stats(&from_call);
    println!(
        "backend {} clients {} settle {:?}: {} hand-offs in {:.1}s",
        a.backend,
        a.clients,
        a.settle,
        a.count,
        wall.as_secs_f64()
    );
    println!("hand-off (release() called -> next acquire() returned): {handoff}");
    println!(
        "hand-off (release() returned -> next acquire() returned): {}",
        stats(&from_return)
    );
    println!(
        "release() call itself:                                    {}",
        stats(&release_call)
    );
    if let (Some(b), Some(x)) = (before, after) {
        let d = x.minus(&b);
        println!(
            "etcd requests per hand-off (all {} clients): {:.2} [{}]",
            a.clients,
            d.requests() / a.count as f64,
            d.describe(a.count as f64)
        );
    }
    if let Some(w) = &watcher {
        let gaps = peers::handoffs(&peers::changes(&w.history()));
        println!(
            "hand-off as an outside v2 watch sees it (release seen -> next holder seen): {}",
            stats(&gaps)
        );
    }
    if let Some(api) = &_kube {
        let n = api.cluster().requests().count(|_| true);
        println!("API stand-in requests in total (set-up included): {n}");
    }
    println!(
        "goal < 100 ms: median {} p99 {}",
        if handoff.median < 100.0 {
            "met"
        } else {
            "MISSED"
        },
        if handoff.p99 < 100.0 { "met" } else { "MISSED" }
    );
    if let (Some(_), Some(etcd)) = (&_airlock, &_etcd) {
        own_etcd_store(etcd, &ids, &a, handoff).await?;
    }
    if a.locksmithd > 0 {
        let Some(etcd) = &_etcd else {
            return Err("--locksmithd needs --backend etcd-v2".into());
        };
        locksmithd_chain(etcd, &a, handoff).await?;
    }
    Ok(())
}

/// The etcd group every client of the bench contends in.
const GROUP: &str = "bench-handoff";

/// The chain's `clients` stores and, made last, one more for the admin calls: each its own
/// connection, made by `connect`.
async fn connections<S, F, Fut>(
    clients: usize,
    connect: F,
) -> Result<(Vec<Arc<dyn Semaphore>>, S), String>
where
    S: Semaphore + 'static,
    F: Fn() -> Fut,
    Fut: Future<Output = Result<S, String>>,
{
    let mut sems: Vec<Arc<dyn Semaphore>> = Vec::new();
    for _ in 0..clients {
        sems.push(Arc::new(connect().await?));
    }
    Ok((sems, connect().await?))
}

/// [`connections`] to rebootd's own etcd v3 store on `etcd` (group [`GROUP`]).
async fn etcd_v3_connections(
    etcd: &EtcdServer,
    clients: usize,
) -> Result<(Vec<Arc<dyn Semaphore>>, EtcdSemaphore), String> {
    let settings = etcd.lock_settings(rebootd::config::EtcdApi::V3);
    connections(clients, || async {
        EtcdSemaphore::connect(&settings, GROUP, None)
            .await
            .map_err(|e| e.to_string())
    })
    .await
}

/// What a chain measured: hand-offs from `release()` called and from it returning (ms), the
/// `release()` calls (ms), the wall time, and etcd's counters before and after.
type Chain = (
    Vec<f64>,
    Vec<f64>,
    Vec<f64>,
    Duration,
    Option<util::EtcdCounters>,
    Option<util::EtcdCounters>,
);

/// One holder, the others waiting in `acquire()`; `a.count` times: settle, the holder releases,
/// the first waiter whose `acquire()` returns holds next, the old holder queues again.
async fn chain(
    sems: &[Arc<dyn Semaphore>],
    ids: &[Identity],
    a: &Args,
    metrics_endpoint: Option<&str>,
) -> Result<Chain, String> {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(usize, Instant)>();
    let waiter = |i: usize| {
        let (s, me, tx) = (sems[i].clone(), ids[i].clone(), tx.clone());
        tokio::spawn(async move {
            match s.acquire(&me).await {
                Ok(()) => {
                    let _ = tx.send((i, Instant::now()));
                }
                Err(e) => eprintln!("client {i}: acquire failed: {e}"),
            }
        })
    };
    sems[0].acquire(&ids[0]).await.map_err(|e| e.to_string())?;
    let mut holder = 0;
    for i in 1..a.clients {
        waiter(i);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = match metrics_endpoint {
        Some(e) => Some(util::etcd_counters(e).await?),
        None => None,
    };
    let (mut from_call, mut from_return, mut release_call) = (Vec::new(), Vec::new(), Vec::new());
    let started = Instant::now();
    for _ in 0..a.count {
        tokio::time::sleep(a.settle).await;
        let t0 = Instant::now();
        sems[holder]
            .release(&ids[holder])
            .await
            .map_err(|e| e.to_string())?;
        let t1 = Instant::now();
        let (next, t2) = tokio::time::timeout(Duration::from_secs(10), rx.recv())
            .await
            .map_err(|_| "no waiter took the slot within 10 s".to_string())?
            .ok_or("waiters gone")?;
        from_call.push(ms(t2 - t0));
        // Signed: the waiter may hold the slot before release() has returned to the holder.
        from_return.push(if t2 >= t1 { ms(t2 - t1) } else { -ms(t1 - t2) });
        release_call.push(ms(t1 - t0));
        waiter(holder);
        holder = next;
    }
    let wall = started.elapsed();
    let after = match metrics_endpoint {
        Some(e) => Some(util::etcd_counters(e).await?),
        None => None,
    };
    Ok((from_call, from_return, release_call, wall, before, after))
}

/// After the chain through airlock: the same chain on rebootd's own etcd v3 store, same etcd.
async fn own_etcd_store(
    etcd: &EtcdServer,
    ids: &[Identity],
    a: &Args,
    through_airlock: Stats,
) -> Result<(), String> {
    let (sems, admin) = etcd_v3_connections(etcd, a.clients).await?;
    admin.set_max(1, true).await.map_err(|e| e.to_string())?;
    let (from_call, _, _, wall, before, after) =
        chain(&sems, ids, a, Some(&etcd.endpoint())).await?;
    let own = stats(&from_call);
    println!(
        "same etcd, rebootd's own etcd v3 store: {} hand-offs in {:.1}s",
        a.count,
        wall.as_secs_f64()
    );
    println!("hand-off (release() called -> next acquire() returned): {own}");
    if let (Some(b), Some(x)) = (before, after) {
        let d = x.minus(&b);
        println!(
            "etcd requests per hand-off: {:.2} [{}]",
            d.requests() / a.count as f64,
            d.describe(a.count as f64)
        );
    }
    println!(
        "FleetLock through airlock / own etcd store: median {:.1}, p99 {:.1}",
        through_airlock.median / own.median,
        through_airlock.p99 / own.p99
    );
    Ok(())
}

/// The same measure for real locksmithd nodes, on the same etcd (locksmith's default group).
async fn locksmithd_chain(etcd: &EtcdServer, a: &Args, rebootd: Stats) -> Result<(), String> {
    println!(
        "locksmithd: {} real nodes, max 1, a chain of {} hand-offs (each node that rebooted \
         needs a reboot again once another holds)",
        a.locksmithd, a.locksmithd_count
    );
    let before = util::etcd_counters(&etcd.endpoint()).await?;
    let run = peers::run_locksmithd(
        &etcd.endpoint(),
        a.locksmithd,
        1,
        Duration::ZERO,
        peers::Mode::Chain {
            handoffs: a.locksmithd_count,
        },
        Duration::from_secs(60 * (10 + a.locksmithd_count as u64)),
    )
    .await?;
    let after = util::etcd_counters(&etcd.endpoint()).await?;
    let gaps = peers::handoffs(&peers::changes(&run.history));
    let ls = stats(&gaps);
    println!("locksmithd hand-off (release seen -> next holder seen, outside v2 watch): {ls}");
    let d = after.minus(&before);
    println!(
        "etcd requests during the locksmithd chain: {:.0} [{}] ({} reboots, most holders {})",
        d.requests(),
        d.describe(1.0),
        run.reboots,
        run.most_holders
    );
    println!(
        "rebootd (v2) / locksmithd hand-off: median {:.4}, p99 {:.4}",
        rebootd.median / ls.median,
        rebootd.p99 / ls.p99
    );
    Ok(())
}
