//! The chaos itself: the simulated reboots (delayed, and rebootd killed while one is pending),
//! the killer that strikes right after a chosen phase is written, and the loop that takes the
//! seeded disruptive actions (kills, etcd stops and freezes, API errors and hangs, evictions
//! included).

use super::check::Down;
use super::trial::{post_boot_id, ChaosNode, Shared, PHASES};
use super::{workload, Rng};
use crate::etcd::EtcdServer;
use crate::kube_api::{Cluster, FaultRule, Kind};
use futures_util::StreamExt;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// Paths the API faults aim at: what rebootd asks for one object at a time, and its evictions
/// (twice as likely: a rule on `/pods` is mostly used up by the drain's pod list). The outside
/// watchers' requests (collection watches, made before the chaos starts) never match.
const FAULT_PATHS: &[&str] = &[
    "/leases/",
    "/nodes/",
    "/events",
    "/pods",
    "/eviction",
    "/eviction",
];

/// The simulated reboot of one node: on a reboot call, maybe wait (rebootd keeps running, and
/// may be killed and restarted meanwhile, as systemd would), then go down (calls made before
/// that are the same pending shutdown), stay down `reboot_time`, come back with a new boot id;
/// the kubelet reports Ready `ready_delay` later.
#[allow(clippy::too_many_arguments)]
pub(super) async fn simulated_reboots(
    n: Arc<ChaosNode>,
    mut calls: tokio::sync::broadcast::Receiver<crate::fake_logind::RebootCall>,
    shared: Arc<Shared>,
    mut rng: Rng,
    cluster: Cluster,
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
        shared.record_call(&n.name);
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
            let held = leases.then(|| {
                cluster
                    .list(Kind::Lease, Some("kube-system"))
                    .iter()
                    .any(|l| l["spec"]["holderIdentity"].as_str() == Some(n.name.as_str()))
            });
            shared.record_down(Down {
                at: shared.started.elapsed(),
                node: n.name.clone(),
                held,
                pods_left: workload::pods_on(&cluster, &n.name),
            });
        }
        // Calls made before the machine went down belong to this shutdown.
        loop {
            match calls.try_recv() {
                Ok(_) => {
                    shared.record_call(&n.name);
                    shared.stats(|s| s.reboot_calls += 1)
                }
                Err(TryRecvError::Lagged(_)) => {}
                Err(_) => break,
            }
        }
        let _ = cluster.set_node_ready(&n.name, false);
        tokio::time::sleep(reboot_time).await;
        // So do calls that arrive while it is down: rebootd is dead then, and a call it sent
        // just before the kill can reach logind a moment later (found by seed 800379: counted
        // as a second reboot). A real logind would be gone with the machine.
        loop {
            match calls.try_recv() {
                Ok(_) => {
                    shared.record_call(&n.name);
                    shared.stats(|s| s.reboot_calls += 1)
                }
                Err(TryRecvError::Lagged(_)) => {}
                Err(_) => break,
            }
        }
        let boot = {
            let mut node = n.node.lock().await;
            if let Err(e) = node.reboot().await {
                shared.problem(format!("{}: boot: {e}", n.name));
            }
            n.down.store(false, Ordering::SeqCst);
            shared.record_up(&n.name);
            node.boot_id()
        };
        let (c, name) = (cluster.clone(), n.name.clone());
        tokio::spawn(async move {
            tokio::time::sleep(ready_delay).await;
            post_boot_id(&c, &name, &boot);
            let _ = c.set_node_ready(&name, true);
        });
    }
}

/// Kill rebootd right after its state file says the armed phase (inotify on the state dir).
pub(super) async fn phase_killer(n: Arc<ChaosNode>, shared: Arc<Shared>) {
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
pub(super) async fn chaos_loop(
    mut rng: Rng,
    actions: usize,
    nodes: Vec<Arc<ChaosNode>>,
    etcd: Arc<tokio::sync::Mutex<Option<EtcdServer>>>,
    cluster: Cluster,
    shared: Arc<Shared>,
) {
    let has_etcd = etcd.lock().await.is_some();
    let mut taken = 0;
    while !shared.stopped() && taken < actions {
        tokio::time::sleep(rng.ms(100, 1200)).await;
        if shared.stopped() {
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
                    .filter(|n| {
                        !n.store
                            .load()
                            .ok()
                            .flatten()
                            .is_some_and(|s| super::check::done(&s))
                    })
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
                shared.stats(|s| {
                    *s.api_faults.entry("hang".into()).or_default() += 1;
                    s.eviction_faults += (*path == "/eviction") as u32;
                });
            }
            _ => {
                let path = rng.pick(FAULT_PATHS);
                let code = *rng.pick(&[500u16, 429, 409]);
                let times = 1 + rng.below(4) as usize;
                cluster
                    .faults()
                    .inject(FaultRule::status(path, code, times));
                shared.stats(|s| {
                    *s.api_faults.entry(code.to_string()).or_default() += 1;
                    s.eviction_faults += (*path == "/eviction") as u32;
                });
            }
        }
    }
}

/// airlock (`--backend fleetlock`) killed (SIGKILL) up to `actions` times, 0.5–3 s apart, and
/// started again (same port and configuration) 0.2–2 s later. Nodes asking meanwhile get no
/// answer (their requests fail and are retried); a restart while the chaos stops still
/// happens, so the rollout can complete.
pub(super) async fn airlock_kills(
    mut rng: Rng,
    actions: usize,
    airlock: Arc<tokio::sync::Mutex<crate::airlock::Airlock>>,
    shared: Arc<Shared>,
) {
    for _ in 0..actions {
        tokio::time::sleep(rng.ms(500, 3000)).await;
        if shared.stopped() {
            break;
        }
        let mut a = airlock.lock().await;
        a.kill().await;
        shared.stats(|s| s.airlock_kills += 1);
        tokio::time::sleep(rng.ms(200, 2000)).await;
        // airlock exits at start when its etcd does not answer (the chaos may have stopped
        // it): start it again until it listens.
        let mut tries = 0;
        while let Err(e) = a.restart().await {
            tries += 1;
            if tries >= 6 {
                shared.problem(format!("airlock restart: {e}"));
                break;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}
