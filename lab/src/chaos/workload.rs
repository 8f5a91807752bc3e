//! The workload on a trial's nodes, in the API stand-in: ReplicaSet pods that every drain must
//! evict, one ReplicaSet of them under a PodDisruptionBudget across the nodes, and the reads
//! that check it afterwards (every ReplicaSet back at its desired ready replicas, no pod
//! deleted except through an eviction, no pod left on a node that went down).

use crate::kube_api::{Cluster, Kind, PdbBuilder, ReplicaSetBuilder};
use std::time::Duration;

/// Where the workload lives.
pub(super) const NAMESPACE: &str = "shop";
/// Simulated time runs ten times faster than real time, so that grace periods and readiness
/// delays of realistic-looking values keep a trial short.
pub(super) const TIME_SCALE: f64 = 0.1;
/// Simulated: from a pod landing on a Ready node to it being Ready (100 ms real).
pub(super) const POD_READY_DELAY: Duration = Duration::from_secs(1);
/// `web`: two pods per node, no budget; terminationGracePeriodSeconds (simulated; 200 ms real).
const WEB_GRACE: i64 = 2;
/// `db`: one pod per node under a budget of `maxUnavailable: 1`; grace (simulated; 300 ms real).
const DB_GRACE: i64 = 3;

/// Put the workload on `nodes`: `web` (2 pods per node) and `db` (1 pod per node) with a
/// PodDisruptionBudget `maxUnavailable: 1`, so two nodes draining at once take turns on `db`.
/// The budget is left out when `nodes <= max`: with every node cordoned at once, a `db`
/// replacement has nowhere to run and no drain could finish, whatever rebootd does.
pub(super) fn add(cluster: &Cluster, nodes: &[String], max: u64) -> Result<(), String> {
    let names: Vec<&str> = nodes.iter().map(String::as_str).collect();
    let web: Vec<&str> = names.iter().flat_map(|n| [*n, *n]).collect();
    cluster
        .add_replicaset(
            &ReplicaSetBuilder::new(NAMESPACE, "web").grace_period(WEB_GRACE),
            &web,
        )
        .map_err(|e| format!("add ReplicaSet web: {e}"))?;
    cluster
        .add_replicaset(
            &ReplicaSetBuilder::new(NAMESPACE, "db").grace_period(DB_GRACE),
            &names,
        )
        .map_err(|e| format!("add ReplicaSet db: {e}"))?;
    if nodes.len() as u64 > max {
        cluster
            .add(
                &PdbBuilder::new(NAMESPACE, "db")
                    .selector("app", "db")
                    .max_unavailable(1),
            )
            .map_err(|e| format!("add PodDisruptionBudget db: {e}"))?;
    }
    Ok(())
}

/// The workload pods bound to `node` (terminating ones included), as `namespace/name`.
pub(super) fn pods_on(cluster: &Cluster, node: &str) -> Vec<String> {
    cluster
        .pods_on_node(node)
        .iter()
        .filter(|p| p["metadata"]["namespace"] == NAMESPACE)
        .map(|p| {
            format!(
                "{NAMESPACE}/{}",
                p["metadata"]["name"].as_str().unwrap_or("?")
            )
        })
        .collect()
}

/// Wait up to `timeout` for every ReplicaSet to have its desired replicas, all Ready; what is
/// still short then, described (empty: settled).
pub(super) async fn settle(cluster: &Cluster, timeout: Duration) -> Vec<String> {
    let short = |rs: &serde_json::Value| -> Option<String> {
        let want = rs["spec"]["replicas"].as_i64().unwrap_or(1);
        let have = rs["status"]["replicas"].as_i64().unwrap_or(0);
        let ready = rs["status"]["readyReplicas"].as_i64().unwrap_or(0);
        (have != want || ready != want).then(|| {
            format!(
                "ReplicaSet {NAMESPACE}/{}: {ready} of {want} ready ({have} pods)",
                rs["metadata"]["name"].as_str().unwrap_or("?")
            )
        })
    };
    let settled = cluster
        .wait_for(timeout, |s| {
            s.list(Kind::ReplicaSet, Some(NAMESPACE))
                .iter()
                .all(|rs| short(rs).is_none())
                .then_some(())
        })
        .await;
    match settled {
        Ok(()) => Vec::new(),
        Err(_) => cluster
            .list(Kind::ReplicaSet, Some(NAMESPACE))
            .iter()
            .filter_map(short)
            .collect(),
    }
}

/// Pods deleted over the API (rather than evicted): rebootd must only evict.
pub(super) fn pod_deletes(cluster: &Cluster) -> Vec<String> {
    cluster
        .requests()
        .all()
        .iter()
        .filter(|r| r.method == "DELETE" && r.path.contains("/pods"))
        .map(|r| format!("{} {} -> {}", r.method, r.path, r.status))
        .collect()
}

/// Evictions granted, and evictions answered 429 (a budget refusing, or an injected fault).
pub(super) fn eviction_counts(cluster: &Cluster) -> (u32, u32) {
    let log = cluster.requests();
    let evictions = |f: &dyn Fn(u16) -> bool| {
        log.count(|r| r.method == "POST" && r.path.ends_with("/eviction") && f(r.status)) as u32
    };
    (
        evictions(&|s| (200..300).contains(&s)),
        evictions(&|s| s == 429),
    )
}
