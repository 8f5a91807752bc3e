//! Mixed fleets (`--mixed N`) and `rebootctl migrate` mid-rollout (`--migrate`).
//!
//! `--mixed N`: N of the trial's nodes run the real locksmithd (built from `../shared/peers`,
//! each in its own mount namespace on its own bus: [`crate::locksmith::LocksmithNode`]) on the
//! v2 semaphore the rebootd nodes (`api = "v2"`) use. A locksmithd reboot is its call to the
//! lab's fake logind: the lab takes the node down (locksmithd killed, update_engine idle),
//! keeps it down for the reboot time and boots it (locksmithd started again; it gives its slot
//! back about 5 s later). The chaos kills locksmithd at random moments too (and starts it
//! again), but not between its reboot call and the reboot: a real logind's shutdown is under
//! way then, and a locksmithd started again would give back the slot of a reboot in progress.
//! The outside watcher knows locksmithd's holders by machine id, so the usual invariants hold
//! across both kinds: never more than max holders, never more than max down, every node
//! rebooted once and only while holding a slot, nothing held at the end.
//!
//! `--migrate`: some rebootd nodes get their update only once every locksmithd node has rebooted
//! and given its slot back (the migration guide's order: no locksmithd holding); then, while
//! those are in their cycle (0-0.5 s after their update), the operator runs `rebootctl migrate` on a rebootd node until it
//! succeeds (refusals and failures with etcd down are counted), then switches half of the
//! rebootd nodes, at random, to `api = "v3"` and restarts them (the others follow to v3 on
//! `api = "v2"`). The checker watches the v2 and the v3 document ([`super::two_docs`]).

use super::check::{Down, SemaphoreEnd};
use super::trial::{ChaosNode, Shared};
use super::two_docs::{DocsEnd, MOVED_HOLDER};
use super::{ChaosOptions, Rng};
use crate::locksmith::{LocksmithEtcd, LocksmithNode};
use rebootd::lock::document::{semaphore_key, SemaphoreDoc};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinHandle;

/// A locksmithd node as the chaos sees it.
pub(super) struct LsNode {
    pub name: String,
    pub machine_id: String,
    pub log_path: PathBuf,
    pub node: tokio::sync::Mutex<LocksmithNode>,
    /// Between its reboot call and the next boot's start.
    rebooting: AtomicBool,
    /// Reboot calls taken into a simulated reboot (the kills wait for the next one).
    calls_handled: AtomicUsize,
    reboots: AtomicUsize,
}

/// The names of a trial's locksmithd nodes.
pub(super) fn names(count: usize) -> Vec<String> {
    (1..=count).map(|i| format!("locksmith-{i}")).collect()
}

/// Start `count` locksmithd nodes on the v2 semaphore at `endpoint`.
pub(super) async fn start(count: usize, endpoint: &str) -> Result<Vec<Arc<LsNode>>, String> {
    let mut out = Vec::new();
    for name in names(count) {
        let node = LocksmithNode::start(&name, LocksmithEtcd::new(endpoint, ""))
            .await
            .map_err(|e| format!("start {name} (locksmithd): {e}"))?;
        out.push(Arc::new(LsNode {
            machine_id: node.machine_id.clone(),
            log_path: node.log_path(),
            name,
            node: tokio::sync::Mutex::new(node),
            rebooting: AtomicBool::new(false),
            calls_handled: AtomicUsize::new(0),
            reboots: AtomicUsize::new(0),
        }));
    }
    Ok(out)
}

/// The simulated reboots of every locksmithd node, one task each.
pub(super) fn simulated_reboots(
    opts: &ChaosOptions,
    seed: u64,
    nodes: &[Arc<LsNode>],
    shared: &Arc<Shared>,
) -> Vec<JoinHandle<()>> {
    nodes
        .iter()
        .enumerate()
        .map(|(i, n)| {
            tokio::spawn(reboots(
                n.clone(),
                shared.clone(),
                Rng::fork(seed, 400 + i as u64),
                opts.reboot_time,
            ))
        })
        .collect()
}

/// What systemd does for locksmithd (`Restart=on-failure`, `RestartSec=10s` in its unit): one
/// that exits with a failure (it does when it cannot reach etcd at the start of its reboot
/// attempt: "Failed to set up lock") is started again 10 s later. One task per node.
pub(super) fn supervise(nodes: &[Arc<LsNode>], shared: &Arc<Shared>) -> Vec<JoinHandle<()>> {
    nodes
        .iter()
        .map(|n| {
            let (n, shared) = (n.clone(), shared.clone());
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(Duration::from_millis(200));
                loop {
                    tick.tick().await;
                    let failed =
                        matches!(n.node.lock().await.daemon_exit(), Some(c) if c != Some(0));
                    if !failed {
                        continue;
                    }
                    shared.stats(|s| {
                        *s.mixed
                            .entry("locksmithd failed, restarted (systemd)".into())
                            .or_default() += 1
                    });
                    tokio::time::sleep(RESTART_SEC).await;
                    let mut node = n.node.lock().await;
                    if node.daemon_exit().is_some() {
                        if let Err(e) = node.start_daemon() {
                            shared.problem(format!("{}: restart locksmithd: {e}", n.name));
                        }
                    }
                }
            })
        })
        .collect()
}

/// locksmithd's unit's `RestartSec`.
const RESTART_SEC: Duration = Duration::from_secs(10);

/// The chaos of a mixed fleet (locksmithd killed) and the migration (`--migrate`, with the
/// `late` rebootd nodes), as tasks that end once the chaos stops.
pub(super) fn chaos(
    opts: &ChaosOptions,
    seed: u64,
    nodes: &[Arc<ChaosNode>],
    late: &[Arc<ChaosNode>],
    locksmiths: &[Arc<LsNode>],
    shared: &Arc<Shared>,
) -> Vec<JoinHandle<()>> {
    let mut tasks = Vec::new();
    if !locksmiths.is_empty() {
        tasks.push(tokio::spawn(kills(
            Rng::fork(seed, 20),
            opts.actions,
            locksmiths.to_vec(),
            shared.clone(),
        )));
    }
    if opts.migrate {
        tasks.push(tokio::spawn(migrate(
            Rng::fork(seed, 21),
            opts.rebootd.with_file_name("rebootctl"),
            nodes.to_vec(),
            late.to_vec(),
            locksmiths.to_vec(),
            shared.clone(),
        )));
    }
    tasks
}

/// Whether a locksmithd node is through: rebooted, and not a holder in the last set the
/// outside watcher saw (it gives its slot back about 5 s after its boot).
pub(super) fn done(n: &LsNode, shared: &Shared) -> bool {
    n.reboots.load(Ordering::SeqCst) > 0
        && !n.rebooting.load(Ordering::SeqCst)
        && !shared
            .holders()
            .last()
            .is_some_and(|(_, h)| h.contains(&n.name))
}

/// Tell update_engine on every locksmithd node that a reboot is needed.
pub(super) async fn trigger(nodes: &[Arc<LsNode>]) -> Result<(), String> {
    for n in nodes {
        n.node
            .lock()
            .await
            .trigger("9999.0.0")
            .await
            .map_err(|e| format!("{}: update_engine: {e}", n.name))?;
    }
    Ok(())
}

/// The simulated reboots of a locksmithd node: on its reboot call, maybe a short delay (logind
/// stopping services), then down (locksmithd killed, update_engine idle) for `reboot_time`,
/// then locksmithd started again.
async fn reboots(n: Arc<LsNode>, shared: Arc<Shared>, mut rng: Rng, reboot_time: Duration) {
    use tokio::sync::broadcast::error::RecvError;
    let mut calls = n.node.lock().await.logind.subscribe();
    loop {
        match calls.recv().await {
            Ok(_) | Err(RecvError::Lagged(_)) => {}
            Err(RecvError::Closed) => return,
        }
        n.rebooting.store(true, Ordering::SeqCst);
        shared.record_call(&n.name);
        shared.stats(|s| s.reboot_calls += 1);
        if rng.chance(40) {
            shared.stats(|s| s.delayed_reboots += 1);
            tokio::time::sleep(rng.ms(50, 800)).await;
        }
        let mut node = n.node.lock().await;
        shared.record_down(Down {
            at: shared.elapsed(),
            node: n.name.clone(),
            held: None,
            pods_left: Vec::new(),
        });
        node.kill_daemon().await;
        while calls.try_recv().is_ok() {}
        if let Err(e) = node
            .update_engine
            .set_status("UPDATE_STATUS_IDLE", "")
            .await
        {
            shared.problem(format!("{}: update_engine: {e}", n.name));
        }
        tokio::time::sleep(reboot_time).await;
        while calls.try_recv().is_ok() {}
        n.calls_handled
            .store(node.logind.reboot_calls().len(), Ordering::SeqCst);
        if let Err(e) = node.start_daemon() {
            shared.problem(format!("{}: boot: {e}", n.name));
        }
        shared.record_up(&n.name);
        n.reboots.fetch_add(1, Ordering::SeqCst);
        n.rebooting.store(false, Ordering::SeqCst);
        shared.stats(|s| *s.mixed.entry("locksmithd reboots".into()).or_default() += 1);
    }
}

/// Kill locksmithd at random moments (up to `actions` times, 0.3-3 s apart) and start it
/// again 0-1 s later, but never between its reboot call and the reboot.
async fn kills(mut rng: Rng, actions: usize, nodes: Vec<Arc<LsNode>>, shared: Arc<Shared>) {
    for _ in 0..actions {
        tokio::time::sleep(rng.ms(300, 3000)).await;
        if shared.stopped() {
            return;
        }
        let n = rng.pick(&nodes).clone();
        let mut node = n.node.lock().await;
        let pending = node.logind.reboot_calls().len() > n.calls_handled.load(Ordering::SeqCst);
        if pending || n.rebooting.load(Ordering::SeqCst) {
            continue;
        }
        node.kill_daemon().await;
        shared.stats(|s| *s.mixed.entry("locksmithd kills".into()).or_default() += 1);
        tokio::time::sleep(rng.ms(0, 1000)).await;
        if let Err(e) = node.start_daemon() {
            shared.problem(format!("{}: restart locksmithd: {e}", n.name));
        }
    }
}

/// `--migrate`: once every locksmithd node is through, trigger the `late` rebootd nodes, wait
/// 0-0.5 s, and run `rebootctl migrate` on a random rebootd node until it succeeds (the rollout
/// is complete only then: [`Shared::migrated`]).
async fn migrate(
    mut rng: Rng,
    rebootctl: PathBuf,
    nodes: Vec<Arc<ChaosNode>>,
    late: Vec<Arc<ChaosNode>>,
    locksmiths: Vec<Arc<LsNode>>,
    shared: Arc<Shared>,
) {
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    while !locksmiths.iter().all(|l| done(l, &shared)) {
        if shared.stopped() {
            return;
        }
        tick.tick().await;
    }
    for n in &late {
        let node = n.node.lock().await;
        if let Err(e) = node
            .update_engine
            .set_status("UPDATE_STATUS_UPDATED_NEED_REBOOT", "9999.0.0")
            .await
        {
            shared.problem(format!("{}: update_engine: {e}", n.name));
        }
    }
    // Soon, so that it lands while they are in their cycle (one can take less than a second).
    tokio::time::sleep(rng.ms(0, 500)).await;
    while !shared.stopped() {
        let n = rng.pick(&nodes).clone();
        let cmd = n
            .node
            .lock()
            .await
            .command(&rebootctl)
            .arg("migrate")
            .output();
        let out = tokio::time::timeout(Duration::from_secs(30), cmd).await;
        match out {
            Ok(Ok(o)) if o.status.success() => {
                let busy = nodes
                    .iter()
                    .filter(|n| {
                        !n.store
                            .load()
                            .ok()
                            .flatten()
                            .is_some_and(|s| super::check::done(&s))
                    })
                    .count();
                let key = if busy > 0 {
                    "migrated mid-rollout"
                } else {
                    "migrated after the rollout"
                };
                shared.stats(|s| *s.mixed.entry(key.into()).or_default() += 1);
                shared.migrated.store(true, Ordering::SeqCst);
                switch_to_v3(&mut rng, &nodes, &shared).await;
                return;
            }
            Ok(Ok(o)) => {
                let text = String::from_utf8_lossy(&o.stderr);
                let key = if text.contains("locksmith") || text.contains("holder") {
                    "migrate refused (a holder without a record)"
                } else {
                    "migrate failed"
                };
                shared.stats(|s| *s.mixed.entry(key.into()).or_default() += 1);
            }
            _ => shared.stats(|s| *s.mixed.entry("migrate failed".into()).or_default() += 1),
        }
        tokio::time::sleep(rng.ms(300, 800)).await;
    }
}

/// After the migration, the guide's next step: node by node (half of them, at random, 0-1.5 s
/// apart, mid-rollout), `api = "v3"` in the configuration and rebootd restarted. A node the
/// lab has down (a simulated reboot) is left on `api = "v2"`, which follows to v3 by itself.
async fn switch_to_v3(rng: &mut Rng, nodes: &[Arc<ChaosNode>], shared: &Shared) {
    for n in nodes {
        if !rng.chance(50) {
            continue;
        }
        tokio::time::sleep(rng.ms(0, 1500)).await;
        if shared.stopped() {
            return;
        }
        let mut node = n.node.lock().await;
        if n.down.load(Ordering::SeqCst) {
            continue;
        }
        let Some(file) = node.config_files().pop() else {
            continue;
        };
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        let v3 = text.replace("api = \"v2\"", "api = \"v3\"");
        if v3 == text || std::fs::write(&file, v3).is_err() {
            shared.problem(format!(
                "{}: cannot switch {} to api = v3",
                n.name,
                file.display()
            ));
            continue;
        }
        node.kill_daemon().await;
        if let Err(e) = node.start_daemon() {
            shared.problem(format!("{}: restart rebootd on v3: {e}", n.name));
        }
        shared.stats(|s| *s.mixed.entry("switched to v3".into()).or_default() += 1);
    }
}

/// Copy the locksmithd nodes' logs, and with `--migrate` the two documents' histories, beside
/// the rest of a failed trial's logs.
pub(super) fn keep_logs(dir: Option<&std::path::Path>, nodes: &[Arc<LsNode>], shared: &Shared) {
    let Some(dir) = dir else { return };
    for n in nodes {
        let _ = std::fs::copy(&n.log_path, dir.join(format!("{}.log", n.name)));
    }
    let docs: String = super::trial::lock(&shared.docs)
        .iter()
        .map(|d| format!("{:.3}s {:?} {:?}\n", d.at.as_secs_f64(), d.api, d.holders))
        .collect();
    if !docs.is_empty() {
        let _ = std::fs::write(dir.join("documents.txt"), docs);
    }
}

/// The two documents at the end of a `--migrate` trial (linearizable reads), and the
/// semaphore the fleet ends on: the v3 document if there is one, else the v2 one.
pub(super) async fn read_docs(endpoint: &str) -> (DocsEnd, SemaphoreEnd) {
    let (v2_open, v2) = read_v2(endpoint).await;
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
            match r.kvs().first() {
                Some(kv) => SemaphoreDoc::parse(kv.value())
                    .map(Some)
                    .map_err(|e| e.to_string()),
                None => Ok(None),
            }
        };
        match tokio::time::timeout(Duration::from_secs(3), attempt).await {
            Ok(Ok(v3)) => {
                let end = DocsEnd {
                    v2_open,
                    v3_exists: v3.is_some(),
                };
                let doc = match (v3, v2) {
                    (Some(d), _) | (None, Ok(d)) => SemaphoreEnd::Etcd(d),
                    (None, Err(e)) => SemaphoreEnd::Unreadable(e),
                };
                return (end, doc);
            }
            Ok(Err(e)) => last = e,
            Err(_) => last = "timed out".into(),
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let end = DocsEnd {
        v2_open,
        v3_exists: false,
    };
    (end, SemaphoreEnd::Unreadable(format!("v3: {last}")))
}

/// The v2 document at the end: whether it is open (there, and not closed by `rebootctl
/// migrate`; unreadable counts as open), and the document if it is open and parses.
async fn read_v2(endpoint: &str) -> (bool, Result<SemaphoreDoc, String>) {
    let key = format!("/{}", semaphore_key("default"));
    let mut last = String::new();
    for _ in 0..20 {
        let attempt = async {
            let r = super::store::v2_client(endpoint)?
                .get(
                    &key,
                    rebootd::clients::etcd_v2::Get {
                        quorum: true,
                        ..rebootd::clients::etcd_v2::Get::default()
                    },
                )
                .await
                .map_err(|e| e.to_string())?;
            Ok::<_, String>(r.node.value.unwrap_or_default())
        };
        match tokio::time::timeout(Duration::from_secs(3), attempt).await {
            Ok(Ok(v)) if v.contains(MOVED_HOLDER) => {
                return (false, Err("the v2 document is closed".into()))
            }
            Ok(Ok(v)) => {
                return (
                    true,
                    SemaphoreDoc::parse(v.as_bytes()).map_err(|e| e.to_string()),
                )
            }
            Ok(Err(e)) => last = e,
            Err(_) => last = "timed out".into(),
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    (true, Err(format!("v2: {last}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The harness finding of seed 4310014: a locksmithd that cannot reach etcd when its reboot
    /// attempt starts exits ("Failed to set up lock"); the lab starts it again, as systemd does.
    #[tokio::test]
    async fn a_locksmithd_that_exits_with_a_failure_is_started_again() {
        let dead = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port");
        let nodes = start(1, &format!("http://{dead}"))
            .await
            .expect("locksmithd");
        let shared = Arc::new(Shared::new());
        let tasks = supervise(&nodes, &shared);
        trigger(&nodes).await.expect("trigger");
        let started_again = tokio::time::timeout(RESTART_SEC * 3, async {
            while nodes[0].node.lock().await.boots() < 2 {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
        .await;
        for t in tasks {
            t.abort();
        }
        let log = nodes[0].node.lock().await.log();
        nodes[0].node.lock().await.kill_daemon().await;
        assert!(started_again.is_ok(), "not started again:\n{log}");
        assert!(log.contains("Failed to set up lock"), "{log}");
        let stats = super::super::trial::lock(&shared.stats).clone();
        assert_eq!(
            stats.mixed.get("locksmithd failed, restarted (systemd)"),
            Some(&1),
            "{stats}"
        );
    }
}
