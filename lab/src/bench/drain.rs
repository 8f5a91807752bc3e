//! Drain: one node with 110 ReplicaSet pods on the API stand-in, drained by rebootd's
//! `KubeDrainer` and by the real `kubectl drain`, alternating, each run on a fresh stand-in.
//!
//! The node `drain-1` carries 100 pods of 20 ReplicaSets without a budget (5 pods each, grace
//! periods 1..5 s by ReplicaSet), and 10 pods of 5 ReplicaSets under a PodDisruptionBudget with
//! `maxUnavailable: 1` (2 pods each on `drain-1`, a third replica on `spare-1`, grace period
//! 5 s): the second pod of each of those can only be evicted once the replacement of the first
//! is Ready. Two spare nodes take the replacements. Lower bound of any drain: the replacement
//! delay (pod_ready_delay) + the longest grace period.

use super::util::{ms, stats};
use crate::kube_api::{
    KubeApi, NodeBuilder, Options as KubeOptions, PdbBuilder, ReplicaSetBuilder,
};
use rebootd::drain::{Drainer, KubeDrainer};
use std::path::Path;
use std::time::{Duration, Instant};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Runs of each drainer (alternating).
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// The kubectl binary.
    #[arg(long, default_value = "kubectl")]
    kubectl: String,
    /// Replacement delay: from a pod landing on a Ready node to it being Ready.
    #[arg(long, default_value = "2s", value_parser = rebootd::config::parse_duration)]
    ready_delay: Duration,
}

const NODE: &str = "drain-1";
const LONGEST_GRACE: u64 = 5;

/// A fresh stand-in with the node, its 110 pods and the spares.
async fn setup(
    ready_delay: Duration,
    kubeconfig: &Path,
) -> Result<crate::kube_api::KubeApiHandle, String> {
    let api = KubeApi::start(KubeOptions {
        pod_ready_delay: ready_delay,
        ..KubeOptions::default()
    })
    .await
    .map_err(|e| e.to_string())?;
    let c = api.cluster();
    for n in [NODE, "spare-1", "spare-2"] {
        c.add(&NodeBuilder::new(n)).map_err(|e| e.to_string())?;
    }
    for i in 0..20 {
        let rs = ReplicaSetBuilder::new("default", &format!("web-{i}"))
            .grace_period(1 + (i % LONGEST_GRACE as i64));
        c.add_replicaset(&rs, &[NODE; 5])
            .map_err(|e| e.to_string())?;
    }
    for j in 0..5 {
        let name = format!("db-{j}");
        let rs = ReplicaSetBuilder::new("default", &name).grace_period(LONGEST_GRACE as i64);
        c.add_replicaset(&rs, &[NODE, NODE, "spare-1"])
            .map_err(|e| e.to_string())?;
        c.add(
            &PdbBuilder::new("default", &name)
                .selector("app", &name)
                .max_unavailable(1),
        )
        .map_err(|e| e.to_string())?;
    }
    let on_node = c.pods_on_node(NODE).len();
    if on_node != 110 {
        return Err(format!("{on_node} pods on {NODE}, expected 110"));
    }
    api.write_kubeconfig(kubeconfig)
        .map_err(|e| e.to_string())?;
    // Let the budgets' status settle (the controller computes disruptionsAllowed).
    tokio::time::sleep(Duration::from_millis(300)).await;
    Ok(api)
}

/// Wait until no pod of the ReplicaSets is left on the node (kubectl returns when its pods are
/// gone too; this only confirms it).
fn left_on_node(api: &crate::kube_api::KubeApiHandle) -> usize {
    api.cluster()
        .pods_on_node(NODE)
        .iter()
        .filter(|p| p["metadata"]["ownerReferences"][0]["kind"] == "ReplicaSet")
        .count()
}

async fn run_rebootd(ready_delay: Duration, dir: &Path) -> Result<(f64, usize), String> {
    let kc = dir.join("kubeconfig-rebootd");
    let api = setup(ready_delay, &kc).await?;
    let settings = rebootd::config::Kubernetes {
        kubeconfig: Some(kc.clone()),
        drain_timeout: Duration::from_secs(300),
        on_drain_failure: rebootd::config::DrainFailure::Abort,
        pod_grace_period: None,
        skip_pods: None,
        blocking_pods: None,
        ready_timeout: Duration::from_secs(60),
        // As kubectl drain below: --delete-emptydir-data, no --force.
        emptydir_pods: rebootd::config::EmptyDirPods::Evict,
        unmanaged_pods: rebootd::config::UnmanagedPods::Refuse,
        force_delete_after: None,
        marks: Default::default(),
    };
    let client = rebootd::kube_client::connect(Some(&kc))
        .await
        .map_err(|e| e.to_string())?;
    let drainer = KubeDrainer::new(client, NODE, &settings).map_err(|e| e.to_string())?;
    let n0 = api.cluster().requests().count(|_| true);
    let t0 = Instant::now();
    drainer.drain().await.map_err(|e| e.to_string())?;
    let took = ms(t0.elapsed());
    let reqs = api.cluster().requests().count(|_| true) - n0;
    let left = left_on_node(&api);
    if left != 0 {
        return Err(format!("rebootd's drain returned with {left} pods left"));
    }
    Ok((took, reqs))
}

async fn run_kubectl(
    ready_delay: Duration,
    dir: &Path,
    kubectl: &str,
) -> Result<(f64, usize), String> {
    let kc = dir.join("kubeconfig-kubectl");
    let api = setup(ready_delay, &kc).await?;
    let n0 = api.cluster().requests().count(|_| true);
    let t0 = Instant::now();
    let out = tokio::process::Command::new(kubectl)
        .arg("--kubeconfig")
        .arg(&kc)
        .args([
            "drain",
            NODE,
            "--ignore-daemonsets",
            "--delete-emptydir-data",
            "--timeout=300s",
        ])
        .output()
        .await
        .map_err(|e| format!("{kubectl}: {e}"))?;
    let took = ms(t0.elapsed());
    let reqs = api.cluster().requests().count(|_| true) - n0;
    if !out.status.success() {
        return Err(format!(
            "kubectl drain failed: {}",
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .rev()
                .take(5)
                .collect::<Vec<_>>()
                .join(" | ")
        ));
    }
    let left = left_on_node(&api);
    if left != 0 {
        return Err(format!("kubectl drain returned with {left} pods left"));
    }
    Ok((took, reqs))
}

pub async fn run(a: Args) -> Result<(), String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let version = std::process::Command::new(&a.kubectl)
        .args(["version", "--client"])
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .next()
                .unwrap_or("")
                .to_string()
        })
        .unwrap_or_else(|e| format!("unknown ({e})"));
    println!(
        "110 pods on {NODE} (100 without budget, grace 1..{LONGEST_GRACE}s; 10 under 5 PDBs maxUnavailable=1, grace {LONGEST_GRACE}s), replacement delay {:?}; kubectl: {version}",
        a.ready_delay
    );
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    for r in 0..a.runs {
        let (t, n) = run_rebootd(a.ready_delay, dir.path()).await?;
        println!(
            "  run {}: rebootd KubeDrainer {:>8.0} ms, {n} API requests",
            r + 1,
            t
        );
        ours.push(t);
        let (t, n) = run_kubectl(a.ready_delay, dir.path(), &a.kubectl).await?;
        println!(
            "  run {}: kubectl drain     {:>8.0} ms, {n} API requests",
            r + 1,
            t
        );
        theirs.push(t);
    }
    let (o, k) = (stats(&ours), stats(&theirs));
    let bound = ms(a.ready_delay) + (LONGEST_GRACE * 1000) as f64;
    println!("rebootd: {o}");
    println!("kubectl: {k}");
    println!(
        "median ratio rebootd/kubectl {:.3} (goal <= 1.0: {}); lower bound {:.0} ms; rebootd / bound {:.3} (goal <= 1.10: {})",
        o.median / k.median,
        if o.median / k.median <= 1.0 { "met" } else { "MISSED" },
        bound,
        o.median / bound,
        if o.median / bound <= 1.10 { "met" } else { "MISSED" }
    );
    Ok(())
}
