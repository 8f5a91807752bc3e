//! The semaphore's store as a trial sets it up and reads it: each node's configuration (its
//! store reached directly, or through the cut-off proxy; `max_hold` and the timeouts it must
//! outlast), and the locksmith document written and read in etcd v3 or v2.

use super::members::node_order;
use super::{Backend, ChaosOptions};
use crate::etcd::{EtcdOptions, EtcdServer};
use crate::etcd_cluster::EtcdCluster;
use rebootd::lock::document::{semaphore_key, SemaphoreDoc};
use std::path::Path;
use std::time::Duration;

/// A trial's etcd.
pub(super) enum Etcd {
    Single(Box<EtcdServer>),
    Cluster(EtcdCluster),
}

/// Start the trial's etcd when the semaphore is in etcd: one server, or a cluster of
/// `opts.etcd_members` (the v2 API on for the v2 store).
pub(super) async fn start_etcd(opts: &ChaosOptions) -> Result<Option<Etcd>, String> {
    let v2 = opts.backend == Backend::EtcdV2;
    if !opts.backend.uses_etcd() {
        return Ok(None);
    }
    if opts.etcd_members > 1 {
        let c = EtcdCluster::start(opts.etcd, opts.etcd_members, v2)
            .await
            .map_err(|e| format!("etcd cluster: {e}"))?;
        return Ok(Some(Etcd::Cluster(c)));
    }
    let options = EtcdOptions {
        enable_v2: v2,
        ..EtcdOptions::default()
    };
    let e = EtcdServer::start_with(opts.etcd, options)
        .await
        .map_err(|e| format!("etcd: {e}"))?;
    Ok(Some(Etcd::Single(Box::new(e))))
}

/// The endpoints node `i` lists: the single etcd's, or every member in the node's own order.
pub(super) fn node_endpoints(
    single: Option<&str>,
    members: &[String],
    i: usize,
) -> Option<Vec<String>> {
    let single = single?;
    if members.is_empty() {
        return Some(vec![single.to_owned()]);
    }
    Some(
        node_order(members.len(), i)
            .into_iter()
            .map(|m| members[m].clone())
            .collect(),
    )
}

/// A node's configuration fragment: the store at the `etcd` endpoints (or Leases when `None`), reached
/// through the proxy at `via` when it is the node cut off (for Leases: `lease_kubeconfig`, which
/// names the proxy; the node's drain still uses `kubeconfig`).
pub(super) fn node_config(
    opts: &ChaosOptions,
    etcd: Option<&[String]>,
    via: Option<&str>,
    kubeconfig: &Path,
    lease_kubeconfig: &Path,
    fleetlock: Option<(&str, &str)>,
) -> String {
    let max_hold = opts
        .max_hold
        .map(|m| format!("max_hold = \"{}ms\"\n", m.as_millis()))
        .unwrap_or_default();
    let lock_config = match (etcd, fleetlock) {
        // The node's name as its id at the server, so the watcher reads names.
        (_, Some((url, id))) => {
            format!(
                "[lock]\nbackend = \"fleetlock\"\n\n[lock.fleetlock]\nurl = {url:?}\nid = {id:?}\n"
            )
        }
        (Some(eps), None) => {
            let eps: Vec<&str> = match via {
                Some(v) => vec![v],
                None => eps.iter().map(String::as_str).collect(),
            };
            let api = if opts.backend == Backend::EtcdV2 {
                "api = \"v2\"\n"
            } else {
                ""
            };
            format!(
                "[lock]\nbackend = \"etcd\"\n{max_hold}\n[lock.etcd]\n{api}endpoints = {eps:?}\n"
            )
        }
        (None, None) => {
            let kc = if via.is_some() {
                lease_kubeconfig
            } else {
                kubeconfig
            };
            format!(
                "[lock]\nbackend = \"kubernetes\"\n{max_hold}\n[lock.kubernetes]\nnamespace = \"kube-system\"\nname = \"rebootd\"\nkubeconfig = {kc:?}\n"
            )
        }
    };
    // Users' warning time counts in max_hold; the fake logind has no users anyway.
    let users_warning = if opts.max_hold.is_some() {
        "users_warning = \"0s\"\n"
    } else {
        ""
    };
    // The boot time is how long a simulated reboot keeps the node down; it counts in max_hold.
    format!(
        "[identity]\ngroup = \"default\"\n\n{lock_config}\n[kubernetes]\nkubeconfig = {kubeconfig:?}\ndrain_timeout = \"{}ms\"\nready_timeout = \"{}ms\"\n\n[reboot]\ntimeout = \"{}ms\"\nboot_time = \"{}ms\"\n{users_warning}",
        opts.drain_timeout.as_millis(),
        opts.ready_timeout.as_millis(),
        opts.reboot_timeout.as_millis(),
        opts.reboot_time.as_millis()
    )
}

/// A client of etcd's v2 keys API at `endpoint` (plain http).
pub(super) fn v2_client(endpoint: &str) -> Result<rebootd::clients::etcd_v2::KeysClient, String> {
    use rebootd::clients::etcd_v2::{KeysClient, Settings, Timeouts};
    KeysClient::new(&Settings {
        endpoints: vec![endpoint.to_owned()],
        tls: rebootd::http::TlsFiles {
            table: "chaos",
            ..rebootd::http::TlsFiles::default()
        },
        basic_auth: None,
        timeouts: Timeouts::default(),
    })
    .map_err(|e| e.to_string())
}

/// Write the semaphore document (v3, or v2's key).
pub(super) async fn put_doc(
    endpoint: &str,
    backend: Backend,
    doc: &SemaphoreDoc,
) -> Result<(), String> {
    if backend == Backend::EtcdV2 {
        v2_client(endpoint)?
            .put(
                &format!("/{}", semaphore_key("default")),
                &doc.to_json(),
                rebootd::clients::etcd_v2::Put::default(),
            )
            .await
            .map_err(|e| format!("etcd v2 put: {e}"))?;
        return Ok(());
    }
    let mut client = etcd_client::Client::connect([endpoint], None)
        .await
        .map_err(|e| format!("etcd client: {e}"))?;
    client
        .put(semaphore_key("default"), doc.to_json(), None)
        .await
        .map_err(|e| format!("etcd put: {e}"))?;
    Ok(())
}

pub(super) async fn read_doc(endpoint: &str, backend: Backend) -> Result<SemaphoreDoc, String> {
    let mut last = String::new();
    for _ in 0..20 {
        if backend == Backend::EtcdV2 {
            let attempt = async {
                // A linearizable read (through the raft leader).
                let r = v2_client(endpoint)?
                    .get(
                        &format!("/{}", semaphore_key("default")),
                        rebootd::clients::etcd_v2::Get {
                            quorum: true,
                            ..rebootd::clients::etcd_v2::Get::default()
                        },
                    )
                    .await
                    .map_err(|e| e.to_string())?;
                let v = r.node.value.ok_or("no semaphore value")?;
                SemaphoreDoc::parse(v.as_bytes()).map_err(|e| e.to_string())
            };
            match tokio::time::timeout(Duration::from_secs(3), attempt).await {
                Ok(Ok(d)) => return Ok(d),
                Ok(Err(e)) => last = e,
                Err(_) => last = "timed out".into(),
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
            continue;
        }
        let attempt = async {
            let mut c = etcd_client::Client::connect([endpoint], None)
                .await
                .map_err(|e| e.to_string())?;
            // etcd's default read is linearizable.
            let r = c
                .get(semaphore_key("default"), None)
                .await
                .map_err(|e| e.to_string())?;
            let kv = r.kvs().first().ok_or("no semaphore key")?;
            SemaphoreDoc::parse(kv.value()).map_err(|e| e.to_string())
        };
        match tokio::time::timeout(Duration::from_secs(3), attempt).await {
            Ok(Ok(d)) => return Ok(d),
            Ok(Err(e)) => last = e,
            Err(_) => last = "timed out".into(),
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Err(last)
}

/// airlock's semaphore key for the group `default`.
pub(super) const AIRLOCK_KEY: &str = "com.coreos.airlock/groups/default/v1/semaphore";

/// airlock's semaphore (`{"total_slots": N, "holders": [...]}`) as a locksmith document would
/// say it; `None` when it is not one.
pub(super) fn airlock_doc(value: &[u8]) -> Option<SemaphoreDoc> {
    #[derive(serde::Deserialize)]
    struct Sem {
        total_slots: u64,
        holders: Vec<String>,
    }
    let s: Sem = serde_json::from_slice(value).ok()?;
    Some(SemaphoreDoc {
        semaphore: s.total_slots as i64 - s.holders.len() as i64,
        max: s.total_slots,
        holders: s.holders,
    })
}

/// airlock's semaphore as etcd holds it at `endpoint` (before its first lock airlock may not
/// have written it: an empty one of `max` slots).
pub(super) async fn read_airlock(endpoint: &str, max: u64) -> Result<SemaphoreDoc, String> {
    let mut c = etcd_client::Client::connect([endpoint], None)
        .await
        .map_err(|e| format!("etcd: {e}"))?;
    let r = c
        .get(AIRLOCK_KEY, None)
        .await
        .map_err(|e| format!("etcd get: {e}"))?;
    match r.kvs().first() {
        None => Ok(SemaphoreDoc {
            semaphore: max as i64,
            max,
            holders: Vec::new(),
        }),
        Some(kv) => airlock_doc(kv.value())
            .ok_or_else(|| format!("airlock's semaphore does not parse: {:?}", kv.value_str())),
    }
}
