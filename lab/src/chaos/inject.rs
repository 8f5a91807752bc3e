//! The checker's end-to-end self-test (hidden `--inject-violation`): mid-trial, the lab itself,
//! not rebootd, breaks an invariant for a moment, and the trial must fail saying so.
//!
//! - `holder`: once the outside watcher has seen a holder, the lab tops the semaphore up to
//!   `max + 1` holders with made-up ones (etcd v3 or v2: a compare-and-swap on the locksmith
//!   document,
//!   kept consistent as a forced shrink is, which rebootd reads as full; Leases: unlabelled
//!   Leases with a holder, which rebootd does not count as slots but the watcher sees), then
//!   takes them out again.
//! - `takeover`: once the outside watcher has seen a holder, the lab puts a made-up holder in
//!   its place (etcd: in the document; Leases: as the slot Lease's holder), as a reclaim of a
//!   live holder would, then frees that slot again. The trial has no node cut off, so the
//!   checker must report a slot taken over from a live holder.
//! - `cordon`: once rebootd has cordoned a node (at best `max` of them), the lab cordons more
//!   Nodes, those that already rebooted first, up to `max + 1`, then uncordons them.

use super::trial::{ChaosNode, Shared};
use super::Backend;
use crate::kube_api::{Cluster, Kind, LeaseBuilder};
use etcd_client::{Compare, CompareOp, Txn, TxnOp};
use rebootd::lock::document::{semaphore_key, SemaphoreDoc};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long the lab keeps the violation in place: long enough for every watcher to see it.
const HOLD: Duration = Duration::from_millis(500);
/// How long `cordon` waits for rebootd to have `max` nodes cordoned before it goes ahead with
/// fewer.
const WAIT_FOR_MAX: Duration = Duration::from_secs(5);
/// The made-up holders' names (`chaos-injected-1`, ...).
const FAKE: &str = "chaos-injected";

/// Which invariant the lab breaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Violation {
    /// More than `max` holders of the semaphore.
    Holder,
    /// More than `max` Nodes cordoned.
    Cordon,
    /// A live holder's slot taken over.
    Takeover,
}

impl std::str::FromStr for Violation {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "holder" => Ok(Violation::Holder),
            "cordon" => Ok(Violation::Cordon),
            "takeover" => Ok(Violation::Takeover),
            other => Err(format!(
                "violation {other:?}: expected holder, cordon or takeover"
            )),
        }
    }
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Violation::Holder => "holder",
            Violation::Cordon => "cordon",
            Violation::Takeover => "takeover",
        })
    }
}

/// Commit `v` once, mid-rollout, and undo it (also when the rollout ends meanwhile).
pub(super) async fn run(
    v: Violation,
    max: u64,
    nodes: Vec<Arc<ChaosNode>>,
    etcd: Option<(String, Backend)>,
    cluster: Cluster,
    shared: Arc<Shared>,
) {
    let result = match v {
        Violation::Holder => holder(max, etcd, &cluster, &shared).await,
        Violation::Cordon => cordon(max, &nodes, &cluster, &shared).await,
        Violation::Takeover => takeover(etcd, &cluster, &shared).await,
    };
    if let Err(e) = result {
        shared.problem(format!("inject {v}: {e}"));
    }
}

/// Wait (while the rollout runs) until `f` holds.
async fn until(shared: &Shared, mut f: impl FnMut() -> bool) -> bool {
    while !shared.stopped() {
        if f() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

async fn holder(
    max: u64,
    etcd: Option<(String, Backend)>,
    cluster: &Cluster,
    shared: &Shared,
) -> Result<(), String> {
    let seen = until(shared, || {
        shared.holders().iter().any(|(_, h)| !h.is_empty())
    })
    .await;
    if !seen {
        return Err("the rollout ended before any holder was seen".into());
    }
    match etcd {
        Some((ep, backend)) => {
            let v2 = backend == Backend::EtcdV2;
            let added = edit(&ep, v2, |doc| {
                let k = (max + 1).saturating_sub(doc.holders.len() as u64);
                for i in 1..=k {
                    doc.holders.push(format!("{FAKE}-{i}"));
                }
                doc.semaphore -= k as i64;
                k
            })
            .await?;
            shared.stats(|s| {
                s.injected.push(format!(
                    "{added} made-up holders in the etcd document at {:.2}s",
                    shared.started.elapsed().as_secs_f64()
                ))
            });
            tokio::time::sleep(HOLD).await;
            edit(&ep, v2, |doc| {
                let before = doc.holders.len();
                doc.holders.retain(|h| !h.starts_with(FAKE));
                let removed = (before - doc.holders.len()) as i64;
                doc.semaphore += removed;
                removed
            })
            .await?;
        }
        None => {
            let held = cluster
                .list(Kind::Lease, Some("kube-system"))
                .iter()
                .filter(|l| {
                    l["spec"]["holderIdentity"]
                        .as_str()
                        .is_some_and(|h| !h.is_empty())
                })
                .count() as u64;
            let k = (max + 1).saturating_sub(held).max(1);
            let names: Vec<String> = (1..=k).map(|i| format!("{FAKE}-{i}")).collect();
            for n in &names {
                cluster
                    .add(&LeaseBuilder::new("kube-system", n).holder(n))
                    .map_err(|e| format!("create Lease {n}: {e}"))?;
            }
            shared.stats(|s| {
                s.injected.push(format!(
                    "{k} made-up held Leases at {:.2}s",
                    shared.started.elapsed().as_secs_f64()
                ))
            });
            tokio::time::sleep(HOLD).await;
            for n in &names {
                cluster.remove(Kind::Lease, "kube-system", n);
            }
        }
    }
    Ok(())
}

async fn takeover(
    etcd: Option<(String, Backend)>,
    cluster: &Cluster,
    shared: &Shared,
) -> Result<(), String> {
    let seen = until(shared, || {
        shared.holders().last().is_some_and(|(_, h)| !h.is_empty())
    })
    .await;
    if !seen {
        return Err("the rollout ended before any holder was seen".into());
    }
    let fake = format!("{FAKE}-1");
    let at = || shared.started.elapsed().as_secs_f64();
    match etcd {
        Some((ep, backend)) => {
            let v2 = backend == Backend::EtcdV2;
            let taken = edit(&ep, v2, |doc| {
                doc.holders
                    .first_mut()
                    .map(|h| std::mem::replace(h, fake.clone()))
            })
            .await?
            .ok_or("no holder in the document to take over")?;
            shared.stats(|s| {
                s.injected.push(format!(
                    "took over the slot of {taken} with {fake} at {:.2}s",
                    at()
                ))
            });
            tokio::time::sleep(HOLD).await;
            edit(&ep, v2, |doc| {
                let before = doc.holders.len();
                doc.holders.retain(|h| !h.starts_with(FAKE));
                doc.semaphore += (before - doc.holders.len()) as i64;
            })
            .await?;
        }
        None => {
            let held = cluster
                .list(Kind::Lease, Some("kube-system"))
                .into_iter()
                .find_map(|l| {
                    let h = l["spec"]["holderIdentity"].as_str().unwrap_or("");
                    (!h.is_empty()).then(|| {
                        (
                            l["metadata"]["name"].as_str().unwrap_or("").to_string(),
                            h.to_string(),
                        )
                    })
                })
                .ok_or("no held Lease to take over")?;
            let (lease, holder) = held;
            cluster
                .update(Kind::Lease, "kube-system", &lease, |l| {
                    l["spec"]["holderIdentity"] = fake.clone().into();
                })
                .map_err(|e| format!("take over Lease {lease}: {e}"))?;
            shared.stats(|s| {
                s.injected.push(format!(
                    "took over Lease {lease} of {holder} with {fake} at {:.2}s",
                    at()
                ))
            });
            tokio::time::sleep(HOLD).await;
            cluster
                .update(Kind::Lease, "kube-system", &lease, |l| {
                    if l["spec"]["holderIdentity"].as_str() == Some(fake.as_str()) {
                        l["spec"]["holderIdentity"] = serde_json::Value::Null;
                    }
                })
                .map_err(|e| format!("free Lease {lease}: {e}"))?;
        }
    }
    Ok(())
}

/// Read-modify-write the locksmith document in v3 or in v2.
async fn edit<T>(
    endpoint: &str,
    v2: bool,
    f: impl FnMut(&mut SemaphoreDoc) -> T,
) -> Result<T, String> {
    if v2 {
        edit_doc_v2(endpoint, f).await
    } else {
        edit_doc(endpoint, f).await
    }
}

/// Read-modify-write the v2 document with a compare-and-swap on its modified index, retrying
/// across etcd stops and freezes for up to 30 s.
async fn edit_doc_v2<T>(
    endpoint: &str,
    mut f: impl FnMut(&mut SemaphoreDoc) -> T,
) -> Result<T, String> {
    use rebootd::clients::etcd_v2::{Get, KeysClient, Settings, Timeouts};
    let key = format!("/{}", semaphore_key("default"));
    let client = KeysClient::new(&Settings {
        endpoints: vec![endpoint.to_owned()],
        tls: rebootd::http::TlsFiles {
            table: "chaos inject",
            ..rebootd::http::TlsFiles::default()
        },
        basic_auth: None,
        timeouts: Timeouts::default(),
    })
    .map_err(|e| e.to_string())?;
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut last = String::new();
    while Instant::now() < deadline {
        let attempt = async {
            let r = client
                .get(&key, Get::default())
                .await
                .map_err(|e| e.to_string())?;
            let value = r.node.value.ok_or("no semaphore value")?;
            let mut doc = SemaphoreDoc::parse(value.as_bytes()).map_err(|e| e.to_string())?;
            let out = f(&mut doc);
            match client
                .compare_and_swap(&key, &doc.to_json(), r.node.modified_index, None)
                .await
            {
                Ok(_) => Ok(Some(out)),
                Err(e) if e.is_compare_failed() => Ok(None),
                Err(e) => Err(e.to_string()),
            }
        };
        match tokio::time::timeout(Duration::from_secs(3), attempt).await {
            Ok(Ok(Some(out))) => return Ok(out),
            Ok(Ok(None)) => last = "lost a race".into(),
            Ok(Err(e)) => last = e,
            Err(_) => last = "timed out".into(),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(format!("etcd v2 document: {last}"))
}

/// Read-modify-write the locksmith document with a compare-and-swap on its revision, retrying
/// across etcd stops and freezes (the chaos may be doing either) for up to 30 s.
async fn edit_doc<T>(
    endpoint: &str,
    mut f: impl FnMut(&mut SemaphoreDoc) -> T,
) -> Result<T, String> {
    let key = semaphore_key("default");
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut last = String::new();
    while Instant::now() < deadline {
        let attempt = async {
            let mut c = etcd_client::Client::connect([endpoint], None)
                .await
                .map_err(|e| e.to_string())?;
            let r = c.get(key.clone(), None).await.map_err(|e| e.to_string())?;
            let kv = r.kvs().first().ok_or("no semaphore key")?;
            let rev = kv.mod_revision();
            let mut doc = SemaphoreDoc::parse(kv.value()).map_err(|e| e.to_string())?;
            let out = f(&mut doc);
            let txn = Txn::new()
                .when([Compare::mod_revision(key.clone(), CompareOp::Equal, rev)])
                .and_then([TxnOp::put(key.clone(), doc.to_json(), None)]);
            let done = c.txn(txn).await.map_err(|e| e.to_string())?.succeeded();
            Ok::<_, String>(done.then_some(out))
        };
        match tokio::time::timeout(Duration::from_secs(3), attempt).await {
            Ok(Ok(Some(out))) => return Ok(out),
            Ok(Ok(None)) => last = "lost a race".into(),
            Ok(Err(e)) => last = e,
            Err(_) => last = "timed out".into(),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(format!("etcd document: {last}"))
}

async fn cordon(
    max: u64,
    nodes: &[Arc<ChaosNode>],
    cluster: &Cluster,
    shared: &Shared,
) -> Result<(), String> {
    let cordoned = || -> Vec<String> {
        cluster
            .list(Kind::Node, None)
            .iter()
            .filter(|n| n["spec"]["unschedulable"].as_bool().unwrap_or(false))
            .filter_map(|n| n["metadata"]["name"].as_str().map(String::from))
            .collect()
    };
    if !until(shared, || !cordoned().is_empty()).await {
        return Err("the rollout ended before any node was cordoned".into());
    }
    let give_up = Instant::now() + WAIT_FOR_MAX;
    until(shared, || {
        cordoned().len() as u64 >= max || Instant::now() > give_up
    })
    .await;
    let now = cordoned();
    let k = (max + 1).saturating_sub(now.len() as u64).max(1) as usize;
    // Nodes that already rebooted first: their rebootd will not cordon them again.
    let mut free: Vec<&Arc<ChaosNode>> = nodes.iter().filter(|n| !now.contains(&n.name)).collect();
    free.sort_by_key(|n| {
        !n.store
            .load()
            .ok()
            .flatten()
            .is_some_and(|s| super::check::done(&s))
    });
    let chosen: Vec<String> = free.iter().take(k).map(|n| n.name.clone()).collect();
    for n in &chosen {
        cluster
            .update(Kind::Node, "", n, |o| {
                o["spec"]["unschedulable"] = true.into();
            })
            .map_err(|e| format!("cordon {n}: {e}"))?;
    }
    shared.stats(|s| {
        s.injected.push(format!(
            "cordoned {} at {:.2}s",
            chosen.join(", "),
            shared.started.elapsed().as_secs_f64()
        ))
    });
    tokio::time::sleep(HOLD).await;
    for n in &chosen {
        cluster
            .update(Kind::Node, "", n, |o| {
                o["spec"]["unschedulable"] = false.into();
            })
            .map_err(|e| format!("uncordon {n}: {e}"))?;
    }
    Ok(())
}
