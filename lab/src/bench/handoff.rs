//! Slot hand-off latency: with `max = 1` and a chain of clients (each its own connection), the
//! holder releases and the next waiter's `acquire` returns. Measured in-process through the
//! library's `Semaphore` trait, from the moment `release()` is called to the moment the
//! waiter's `acquire()` returns (and, separately, from `release()` returning).

use super::util::{self, ms, stats};
use crate::etcd::EtcdServer;
use crate::kube_api::{KubeApi, NodeBuilder, Options as KubeOptions};
use rebootd::lock::etcd::EtcdSemaphore;
use rebootd::lock::kube_lease::KubeLeaseSemaphore;
use rebootd::lock::{Admin, Identity, Semaphore};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Backend: etcd-3.4, etcd-3.5 or lease (Kubernetes Leases on the API stand-in).
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
        })
        .collect();
    let mut sems: Vec<Arc<dyn Semaphore>> = Vec::new();
    let admin: Box<dyn Admin>;
    // Keep the servers alive for the run.
    let mut _etcd = None;
    let mut _kube = None;
    let mut _dir = None;
    let metrics_endpoint;
    match a.backend.as_str() {
        b @ ("etcd-3.4" | "etcd-3.5") => {
            let v = util::parse_etcd(&b[5..])?;
            let etcd = EtcdServer::start(v).await.map_err(|e| e.to_string())?;
            println!("{} ({}) at {}", v, etcd.binaries().version, etcd.endpoint());
            let settings = rebootd::config::Etcd {
                api: rebootd::config::EtcdApi::V3,
                endpoints: vec![etcd.endpoint()],
                ca_file: None,
                cert_file: None,
                key_file: None,
                username: None,
                password_file: None,
            };
            for _ in 0..a.clients {
                let s = EtcdSemaphore::connect(&settings, "bench-handoff", None)
                    .await
                    .map_err(|e| e.to_string())?;
                sems.push(Arc::new(s));
            }
            admin = Box::new(
                EtcdSemaphore::connect(&settings, "bench-handoff", None)
                    .await
                    .map_err(|e| e.to_string())?,
            );
            metrics_endpoint = Some(etcd.endpoint());
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
            };
            for _ in 0..a.clients {
                let client = rebootd::kube_client::connect(Some(&kc))
                    .await
                    .map_err(|e| e.to_string())?;
                sems.push(Arc::new(KubeLeaseSemaphore::new(client, &settings, None)));
            }
            let client = rebootd::kube_client::connect(Some(&kc))
                .await
                .map_err(|e| e.to_string())?;
            admin = Box::new(KubeLeaseSemaphore::new(client, &settings, None));
            metrics_endpoint = None;
            _kube = Some(api);
            _dir = Some(dir);
        }
        other => {
            return Err(format!(
                "--backend {other}: expected etcd-3.4, etcd-3.5 or lease"
            ))
        }
    }
    admin.set_max(1, true).await.map_err(|e| e.to_string())?;

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
    let before = match &metrics_endpoint {
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
    let after = match &metrics_endpoint {
        Some(e) => Some(util::etcd_counters(e).await?),
        None => None,
    };
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
    Ok(())
}
