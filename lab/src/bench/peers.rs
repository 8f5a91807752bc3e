//! Real locksmithd nodes driven by the benchmarks, on locksmith's v2 semaphore (the default
//! group) of a lab etcd: each node is the lab's [`LocksmithNode`] (its own mount namespace,
//! private bus, fake update_engine and logind). A reboot is locksmithd's call to logind's
//! `Reboot`: the harness waits the simulated reboot time, then restarts locksmithd with
//! update_engine idle (locksmithd gives its slot back about 5 s after it starts).
//!
//! Acquisitions and releases are timed by an outside long-poll watch of the document
//! ([`V2DocWatcher`]), the same way for rebootd's v2 nodes, so the figures compare.

use crate::locksmith::{LocksmithEtcd, LocksmithNode, Locksmithctl};
use crate::v2_watcher::{DocVersion, V2DocWatcher};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// locksmith's document key of the default group.
pub const LOCKSMITH_KEY: &str = "/coreos.com/updateengine/rebootlock/semaphore";

const NEED_REBOOT: &str = "UPDATE_STATUS_UPDATED_NEED_REBOOT";

/// One acquisition or release seen by the watcher.
#[derive(Debug, Clone, PartialEq)]
pub enum Change {
    Acquired(String, Instant),
    Released(String, Instant),
}

/// The acquisitions and releases in a watcher's history, in order.
pub fn changes(history: &[DocVersion]) -> Vec<Change> {
    let mut out = Vec::new();
    let mut before: Vec<String> = Vec::new();
    for v in history {
        let now = v.holders().unwrap_or_default();
        for h in &before {
            if !now.contains(h) {
                out.push(Change::Released(h.clone(), v.seen));
            }
        }
        for h in &now {
            if !before.contains(h) {
                out.push(Change::Acquired(h.clone(), v.seen));
            }
        }
        before = now;
    }
    out
}

/// Hand-off times (ms): each acquisition that follows a release not yet handed on, from that
/// release (oldest first). Acquisitions of slots that were free before are not hand-offs.
pub fn handoffs(changes: &[Change]) -> Vec<f64> {
    let mut pending: VecDeque<Instant> = VecDeque::new();
    let mut out = Vec::new();
    for c in changes {
        match c {
            Change::Released(_, at) => pending.push_back(*at),
            Change::Acquired(_, at) => {
                if let Some(r) = pending.pop_front() {
                    out.push(super::util::ms(at.saturating_duration_since(r)));
                }
            }
        }
    }
    out
}

/// What a run of locksmithd nodes showed.
pub struct PeerRun {
    pub history: Vec<DocVersion>,
    /// Triggered (t = 0) -> last release seen.
    pub total: Duration,
    pub reboots: usize,
    pub most_holders: usize,
    /// Resident set of each locksmithd at the end (kB), as `/proc/PID/status` says.
    pub rss_kb: Vec<u64>,
}

/// How the nodes are driven.
#[derive(Debug, Clone, Copy)]
pub enum Mode {
    /// Every node needs one reboot at t = 0; done when each has held and released.
    Rolling,
    /// max 1, a chain: a node that rebooted needs a reboot again as soon as another node holds
    /// the slot, until `handoffs` hand-offs were seen.
    Chain { handoffs: usize },
}

/// Run `n` real locksmithd nodes on the default group of the v2 etcd at `endpoint` with `max`.
pub async fn run_locksmithd(
    endpoint: &str,
    n: usize,
    max: u64,
    reboot_time: Duration,
    mode: Mode,
    timeout: Duration,
) -> Result<PeerRun, String> {
    let ctl = Locksmithctl::new(LocksmithEtcd::new(endpoint, "")).map_err(|e| e.to_string())?;
    let out = ctl
        .run(&["set-max", &max.to_string()])
        .await
        .map_err(|e| e.to_string())?;
    if !out.success {
        return Err(format!(
            "locksmithctl set-max: {}{}",
            out.stdout, out.stderr
        ));
    }
    let watcher = Arc::new(V2DocWatcher::start(endpoint, LOCKSMITH_KEY).await?);
    let mut nodes = Vec::new();
    for i in 0..n {
        let node =
            LocksmithNode::start(&format!("locksmith-{i}"), LocksmithEtcd::new(endpoint, ""))
                .await
                .map_err(|e| e.to_string())?;
        nodes.push(Arc::new(tokio::sync::Mutex::new(node)));
    }
    let reboots = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    let wanted = match mode {
        Mode::Rolling => n,
        Mode::Chain { handoffs } => handoffs + 1,
    };
    let mut ids = Vec::new();
    for node in &nodes {
        let (mut calls, id) = {
            let n = node.lock().await;
            (n.logind.subscribe(), n.machine_id.clone())
        };
        ids.push(id.clone());
        let (node, reboots, watcher) = (node.clone(), reboots.clone(), watcher.clone());
        tasks.push(tokio::spawn(async move {
            let mut version = 1;
            while calls.recv().await.is_ok() {
                let done = reboots.fetch_add(1, Ordering::SeqCst) + 1;
                tokio::time::sleep(reboot_time).await;
                let mut n = node.lock().await;
                if let Err(e) = n.reboot().await {
                    eprintln!("{}: restart locksmithd: {e}", n.name);
                    return;
                }
                if matches!(mode, Mode::Chain { .. }) && done < wanted {
                    // Rejoin once another node holds (before: it would take its own slot back).
                    let other = |v: &DocVersion| {
                        v.holders()
                            .is_some_and(|h| !h.is_empty() && !h.contains(&id))
                    };
                    if watcher
                        .wait_for("another holder", Duration::from_secs(3600), other)
                        .await
                        .is_err()
                    {
                        return;
                    }
                    version += 1;
                    let _ = n.trigger(&format!("2.0.{version}")).await;
                }
            }
        }));
    }
    let t0 = Instant::now();
    for node in &nodes {
        node.lock()
            .await
            .update_engine
            .set_status(NEED_REBOOT, "2.0.1")
            .await
            .map_err(|e| e.to_string())?;
        if matches!(mode, Mode::Chain { .. }) {
            // The first node takes the free slot; the others queue behind it.
            let first = ids[0].clone();
            watcher
                .wait_for("the first holder", timeout, |v| {
                    v.holders().is_some_and(|h| h.contains(&first))
                })
                .await?;
        }
    }
    let finished = |history: &[DocVersion]| -> bool {
        let c = changes(history);
        match mode {
            Mode::Rolling => ids.iter().all(|id| {
                c.iter()
                    .any(|x| matches!(x, Change::Released(h, _) if h == id))
            }),
            Mode::Chain { handoffs: k } => handoffs(&c).len() >= k,
        }
    };
    let result = watcher
        .wait_for("the end of the run", timeout, |_| {
            finished(&watcher.history())
        })
        .await;
    for t in &tasks {
        t.abort();
    }
    let mut rss_kb = Vec::new();
    for node in &nodes {
        if let Some(pid) = node.lock().await.pid() {
            if let Some(kb) = super::idle::rss_kb(pid) {
                rss_kb.push(kb);
            }
        }
    }
    if let Err(e) = result {
        let n = nodes[0].lock().await;
        return Err(format!("{e}\nlocksmithd log of {}:\n{}", n.name, n.log()));
    }
    let history = watcher.history();
    let c = changes(&history);
    let last = c
        .iter()
        .filter_map(|x| match x {
            Change::Released(_, at) => Some(*at),
            _ => None,
        })
        .max()
        .unwrap_or(t0);
    Ok(PeerRun {
        total: last.saturating_duration_since(t0),
        reboots: reboots.load(Ordering::SeqCst),
        most_holders: watcher.max_holders_seen(),
        history,
        rss_kb,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(holders: &[&str], at: Instant) -> DocVersion {
        let doc = rebootd::lock::document::SemaphoreDoc {
            semaphore: 1 - holders.len() as i64,
            max: 1,
            holders: holders.iter().map(|h| h.to_string()).collect(),
        };
        DocVersion {
            index: 1,
            value: Some(doc.to_json()),
            seen: at,
        }
    }

    #[test]
    fn handoffs_pair_each_acquisition_with_the_oldest_open_release() {
        let t = Instant::now();
        let ms = Duration::from_millis;
        let history = [
            v(&[], t),
            v(&["a"], t + ms(10)),
            v(&[], t + ms(100)),
            v(&["b"], t + ms(130)),
            v(&[], t + ms(200)),
            v(&["a"], t + ms(1200)),
        ];
        let c = changes(&history);
        assert_eq!(c.len(), 5);
        assert_eq!(handoffs(&c), [30.0, 1000.0]);
    }
}
