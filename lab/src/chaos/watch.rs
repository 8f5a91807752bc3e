//! The outside watchers: they see every change of the semaphore (an etcd watch on the
//! locksmith key in v3, a long-poll watch on it in v2, or a kube-rs watch on the Leases) and of the Nodes' cordons, over the same
//! APIs a user would, and record them in the trial's timelines. The chaos never touches them.

use super::check::StoreChange;
use super::members::EtcdAt;
use super::trial::Shared;
use super::two_docs::{Api as DocApi, MOVED_HOLDER};
use futures_util::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node as KubeNode;
use kube::api::{Api, WatchEvent, WatchParams};
use rebootd::lock::document::{holder_records_prefix, semaphore_key, SemaphoreDoc};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

/// The outside watcher of the etcd semaphore: every revision of the document, across etcd
/// restarts (resuming from the last revision seen). With a cluster it watches through a member
/// the lab is not disrupting, and moves to another (resuming) when the lab disrupts it.
pub(super) async fn etcd(at: EtcdAt, ids: Vec<(String, String)>, shared: Arc<Shared>) {
    etcd_key(at, ids, shared, Watched::Doc).await
}

/// The outside watcher of airlock's semaphore in etcd v3 (`--backend fleetlock`): every
/// revision, as for the locksmith document.
pub(super) async fn airlock(at: EtcdAt, shared: Arc<Shared>) {
    etcd_key(at, Vec::new(), shared, Watched::Airlock).await
}

/// What an etcd v3 watcher follows.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Watched {
    Doc,
    Records,
    Airlock,
}

/// The outside watcher of rebootd's holder records beside the document (etcd v3): every put
/// and delete, with its revision (see [`super::check::record_after_unlock`]).
pub(super) async fn etcd_records(at: EtcdAt, ids: Vec<(String, String)>, shared: Arc<Shared>) {
    etcd_key(at, ids, shared, Watched::Records).await
}

async fn etcd_key(at: EtcdAt, ids: Vec<(String, String)>, shared: Arc<Shared>, what: Watched) {
    let records = what == Watched::Records;
    let key = match what {
        Watched::Records => holder_records_prefix("default"),
        Watched::Doc => semaphore_key("default"),
        Watched::Airlock => super::store::AIRLOCK_KEY.to_string(),
    };
    let mut next_rev: i64 = 0;
    while !shared.stopped() {
        let (member, endpoint) = at.healthy();
        let opts = etcd_client::ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(1))
            .with_timeout(Duration::from_secs(2));
        let Ok(Ok(mut client)) = tokio::time::timeout(
            Duration::from_secs(3),
            etcd_client::Client::connect([endpoint.as_str()], Some(opts)),
        )
        .await
        else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let mut wopts = etcd_client::WatchOptions::new();
        if next_rev > 0 {
            wopts = wopts.with_start_revision(next_rev);
        }
        if records {
            wopts = wopts.with_prefix();
        }
        let wopts = Some(wopts);
        let Ok(Ok(mut stream)) =
            tokio::time::timeout(Duration::from_secs(3), client.watch(key.clone(), wopts)).await
        else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        loop {
            let resp = tokio::select! {
                r = stream.next() => r,
                _ = at.disrupted(member) => None,
            };
            let Some(Ok(resp)) = resp else { break };
            if resp.compact_revision() > 0 {
                shared.problem(format!(
                    "etcd watch compacted at {}; history incomplete",
                    resp.compact_revision()
                ));
            }
            for e in resp.events() {
                let Some(kv) = e.kv() else { continue };
                next_rev = next_rev.max(kv.mod_revision() + 1);
                if what == Watched::Doc && e.event_type() == etcd_client::EventType::Delete {
                    shared.record_doc(DocApi::V3, None);
                    continue;
                }
                if records {
                    let id = kv.key_str().unwrap_or("").trim_start_matches(key.as_str());
                    let put = e.event_type() == etcd_client::EventType::Put;
                    shared.record_store(
                        kv.mod_revision(),
                        StoreChange::Record {
                            node: name_of(id, &ids),
                            put,
                        },
                    );
                    continue;
                }
                let holders = if what == Watched::Airlock {
                    match super::store::airlock_doc(kv.value()) {
                        Some(doc) => {
                            shared.record_max(doc.max);
                            doc.holders.into_iter().collect()
                        }
                        None => {
                            shared.problem(format!(
                                "airlock's semaphore does not parse: {:?}",
                                kv.value_str()
                            ));
                            BTreeSet::new()
                        }
                    }
                } else {
                    holder_names(kv.value(), &ids, &shared)
                };
                shared.record_store(kv.mod_revision(), StoreChange::Holders(holders.clone()));
                if what == Watched::Doc {
                    shared.record_doc(DocApi::V3, Some(holders));
                } else {
                    shared.record_holders(holders);
                }
            }
        }
    }
}

/// A lab node's name for a holder id (its machine id), else the id.
fn name_of(id: &str, ids: &[(String, String)]) -> String {
    ids.iter()
        .find(|(m, _)| m == id)
        .map_or(id.to_owned(), |(_, n)| n.clone())
}

/// The holders of a document, by node name where the holder id is a lab node's machine id.
fn holder_names(value: &[u8], ids: &[(String, String)], shared: &Shared) -> BTreeSet<String> {
    match SemaphoreDoc::parse(value) {
        Ok(doc) => {
            shared.record_max(doc.max);
            doc.holders
                .iter()
                .map(|h| {
                    ids.iter()
                        .find(|(id, _)| id == h)
                        .map_or(h.clone(), |(_, n)| n.clone())
                })
                .collect()
        }
        // `rebootctl migrate`'s closed v2 document is inconsistent on purpose.
        Err(_) if closed_by_migrate(value) => BTreeSet::from([MOVED_HOLDER.to_owned()]),
        Err(err) => {
            shared.problem(format!("semaphore document does not parse: {err}"));
            BTreeSet::new()
        }
    }
}

/// The outside watcher of the v2 semaphore document: every version of the key, by long-poll
/// watches that resume at the index after the last event, across etcd stops and freezes (a
/// request that fails is made again). An index etcd no longer keeps (a cleared history) is a
/// gap: reported, then the key is read again. With a cluster it asks a member the lab is not
/// disrupting, and moves to another when the lab disrupts it; its reads are linearizable.
pub(super) async fn etcd_v2(at: EtcdAt, ids: Vec<(String, String)>, shared: Arc<Shared>) {
    let key = format!("/{}", semaphore_key("default"));
    // 0: read the key first.
    let mut next_index: u64 = 0;
    while !shared.stopped() {
        let (member, endpoint) = at.healthy();
        tokio::select! {
            _ = v2_watch_on(&endpoint, &key, &mut next_index, &ids, &shared) => {}
            _ = at.disrupted(member) => {}
        }
    }
}

/// Follow the v2 key on `endpoint` from `next_index` (0: read it first) until the chaos stops.
async fn v2_watch_on(
    endpoint: &str,
    key: &str,
    next_index: &mut u64,
    ids: &[(String, String)],
    shared: &Shared,
) {
    use rebootd::clients::etcd_v2::{Get, KeysClient, Settings, Timeouts};
    let settings = Settings {
        endpoints: vec![endpoint.to_owned()],
        tls: rebootd::http::TlsFiles {
            table: "chaos watcher",
            ..rebootd::http::TlsFiles::default()
        },
        basic_auth: None,
        timeouts: Timeouts {
            watch: Duration::from_secs(5),
            ..Timeouts::default()
        },
    };
    let client = match KeysClient::new(&settings) {
        Ok(c) => c,
        Err(e) => {
            shared.problem(format!("v2 watcher: {e}"));
            return;
        }
    };
    let quorum = Get {
        quorum: true,
        ..Get::default()
    };
    while !shared.stopped() {
        if *next_index == 0 {
            match client.get(key, quorum).await {
                Ok(r) => {
                    if let Some(v) = &r.node.value {
                        let holders = holder_names(v.as_bytes(), ids, shared);
                        shared.record_store(
                            r.node.modified_index as i64,
                            StoreChange::Holders(holders.clone()),
                        );
                        shared.record_doc(DocApi::V2, Some(holders));
                    }
                    *next_index = r.etcd_index + 1;
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
            continue;
        }
        match client.watch(key, false, *next_index).await {
            Ok(None) => {}
            Ok(Some(event)) => {
                *next_index = event.node.modified_index + 1;
                let holders = match (&event.node.value, event.action.removes()) {
                    (Some(v), false) => Some(holder_names(v.as_bytes(), ids, shared)),
                    _ => None,
                };
                shared.record_store(
                    event.node.modified_index as i64,
                    StoreChange::Holders(holders.clone().unwrap_or_default()),
                );
                shared.record_doc(DocApi::V2, holders);
            }
            Err(e) if e.is_index_cleared() => {
                shared.problem(format!(
                    "v2 watch from index {next_index}: {e}; history incomplete"
                ));
                *next_index = 0;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// Follow every object of `api` from outside rebootd with a kube-rs watch, resumed from the
/// last resourceVersion seen, keeping `name -> value` for the objects where `value_of` gives
/// one; after every event `seen` gets the map and whether that event changed it.
async fn follow<K>(
    api: Api<K>,
    shared: &Shared,
    value_of: impl Fn(&K) -> Option<String>,
    mut seen: impl FnMut(&BTreeMap<String, String>, bool),
) where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    let mut values: BTreeMap<String, String> = BTreeMap::new();
    let mut rv = "0".to_string();
    while !shared.stopped() {
        let Ok(stream) = api.watch(&WatchParams::default(), &rv).await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let mut stream = stream.boxed();
        while let Some(Ok(e)) = stream.next().await {
            let (obj, gone) = match e {
                WatchEvent::Added(o) | WatchEvent::Modified(o) => (o, false),
                WatchEvent::Deleted(o) => (o, true),
                WatchEvent::Bookmark(b) => {
                    rv = b.metadata.resource_version;
                    continue;
                }
                WatchEvent::Error(_) => break,
            };
            if let Some(v) = obj.meta().resource_version.as_ref() {
                rv = v.clone();
            }
            let name = obj.meta().name.clone().unwrap_or_default();
            let changed = match value_of(&obj).filter(|_| !gone) {
                Some(v) => values.insert(name, v.clone()).as_ref() != Some(&v),
                None => values.remove(&name).is_some(),
            };
            seen(&values, changed);
        }
    }
}

/// The outside watcher of the Lease semaphore: the holders after every Lease event.
pub(super) async fn leases(client: kube::Client, shared: Arc<Shared>) {
    let api: Api<Lease> = Api::namespaced(client, "kube-system");
    let holder = |l: &Lease| {
        l.spec
            .as_ref()
            .and_then(|s| s.holder_identity.clone())
            .filter(|h| !h.is_empty())
    };
    follow(api, &shared, holder, |holders, _| {
        shared.record_holders(holders.values().cloned().collect());
    })
    .await;
}

/// The outside watcher of cordons: the Nodes unschedulable, after every change.
pub(super) async fn cordons(client: kube::Client, shared: Arc<Shared>) {
    let api: Api<KubeNode> = Api::all(client);
    let cordoned = |n: &KubeNode| {
        n.spec
            .as_ref()
            .and_then(|s| s.unschedulable)
            .unwrap_or(false)
            .then(String::new)
    };
    follow(api, &shared, cordoned, |nodes, changed| {
        if changed {
            shared.record_cordoned(nodes.keys().cloned().collect());
        }
    })
    .await;
}

/// The outside watcher of rebootd's holder records in etcd v2: a recursive long-poll watch on
/// their directory, from the index etcd was at when it started, resumed at the index after
/// the last event (v2 indexes are one sequence for every key, so they order these writes
/// against the document's).
pub(super) async fn etcd_v2_records(at: EtcdAt, ids: Vec<(String, String)>, shared: Arc<Shared>) {
    use rebootd::clients::etcd_v2::{Get, KeysClient, Settings, Timeouts};
    let dir = format!("/{}", holder_records_prefix("default"));
    let dir = dir.trim_end_matches('/').to_owned();
    let doc = format!("/{}", semaphore_key("default"));
    let mut next_index: u64 = 0;
    while !shared.stopped() {
        let (member, endpoint) = at.healthy();
        let settings = Settings {
            endpoints: vec![endpoint.clone()],
            tls: rebootd::http::TlsFiles {
                table: "chaos watcher",
                ..rebootd::http::TlsFiles::default()
            },
            basic_auth: None,
            timeouts: Timeouts {
                watch: Duration::from_secs(5),
                ..Timeouts::default()
            },
        };
        let Ok(client) = KeysClient::new(&settings) else {
            return;
        };
        let follow = async {
            while !shared.stopped() {
                if next_index == 0 {
                    let quorum = Get {
                        quorum: true,
                        ..Get::default()
                    };
                    match client.get(&doc, quorum).await {
                        Ok(r) => next_index = r.etcd_index + 1,
                        Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
                    }
                    continue;
                }
                match client.watch(&dir, true, next_index).await {
                    Ok(None) => {}
                    Ok(Some(event)) => {
                        next_index = event.node.modified_index + 1;
                        let id = event
                            .node
                            .key
                            .rsplit('/')
                            .next()
                            .unwrap_or_default()
                            .to_owned();
                        shared.record_store(
                            event.node.modified_index as i64,
                            StoreChange::Record {
                                node: name_of(&id, &ids),
                                put: !event.action.removes(),
                            },
                        );
                    }
                    Err(e) if e.is_index_cleared() => {
                        shared.problem(format!(
                            "v2 records watch from index {next_index}: {e}; history incomplete"
                        ));
                        next_index = 0;
                    }
                    Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
                }
            }
        };
        tokio::select! {
            _ = follow => {}
            _ = at.disrupted(member) => {}
        }
    }
}

/// Whether a v2 document is the one `rebootctl migrate` closed: its only holder the marker.
fn closed_by_migrate(value: &[u8]) -> bool {
    serde_json::from_slice::<serde_json::Value>(value).is_ok_and(|v| {
        v["holders"]
            .as_array()
            .is_some_and(|h| h.len() == 1 && h[0].as_str() == Some(MOVED_HOLDER))
    })
}
