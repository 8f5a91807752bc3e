//! Kubernetes end to end: several real rebootd processes drain their own Nodes through the lab's
//! API stand-in (real HTTP, kube-rs), take slots in etcd or in Lease objects, reboot, wait for
//! Ready and uncordon. Outside watchers (kube-rs watches) check the fleet-wide invariants.

mod common;

use common::*;
use futures_util::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node as KubeNode;
use kube::api::{Api, WatchEvent, WatchParams};
use rebootd::state::Phase;
use rebootd_lab::etcd::EtcdVersion;
use rebootd_lab::fleet::{Fleet, FleetEvent, FleetLock};
use rebootd_lab::kube_api::{FaultRule, Kind};
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

const NEED: &str = "UPDATE_STATUS_UPDATED_NEED_REBOOT";

async fn client(fleet: &Fleet) -> kube::Client {
    rebootd::kube_client::connect(fleet.kubeconfig.as_deref())
        .await
        .unwrap()
}

/// Watch every change of `api`'s objects (a watch sees each change, none coalesced) and record
/// the most objects for which `counts` held at once.
fn watch_max<K>(api: Api<K>, counts: impl Fn(&K) -> bool + Send + 'static) -> Arc<AtomicUsize>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    let max = Arc::new(AtomicUsize::new(0));
    let seen = max.clone();
    tokio::spawn(async move {
        let mut counted = BTreeSet::new();
        let mut stream = api
            .watch(&WatchParams::default(), "0")
            .await
            .unwrap()
            .boxed();
        while let Some(Ok(e)) = stream.next().await {
            let (object, gone) = match e {
                WatchEvent::Added(o) | WatchEvent::Modified(o) => (o, false),
                WatchEvent::Deleted(o) => (o, true),
                _ => continue,
            };
            let name = object.meta().name.clone().unwrap_or_default();
            if !gone && counts(&object) {
                counted.insert(name);
            } else {
                counted.remove(&name);
            }
            seen.fetch_max(counted.len(), Ordering::SeqCst);
        }
    });
    max
}

/// The most Nodes unschedulable at once, not counting `ignore` (nodes an operator cordoned).
fn watch_cordons(client: kube::Client, ignore: BTreeSet<String>) -> Arc<AtomicUsize> {
    watch_max(Api::<KubeNode>::all(client), move |node| {
        let name = node.metadata.name.clone().unwrap_or_default();
        let unschedulable = node
            .spec
            .as_ref()
            .and_then(|s| s.unschedulable)
            .unwrap_or(false);
        unschedulable && !ignore.contains(&name)
    })
}

/// The most holders of the semaphore's Leases at once.
fn watch_lease_holders(client: kube::Client) -> Arc<AtomicUsize> {
    watch_max(Api::<Lease>::namespaced(client, "kube-system"), |lease| {
        lease
            .spec
            .as_ref()
            .and_then(|s| s.holder_identity.as_deref())
            .is_some_and(|h| !h.is_empty())
    })
}

fn unschedulable(fleet: &Fleet, node: &str) -> bool {
    fleet
        .kube
        .as_ref()
        .unwrap()
        .cluster()
        .node(node)
        .and_then(|n| n["spec"]["unschedulable"].as_bool())
        .unwrap_or(false)
}

fn event_reasons(fleet: &Fleet, node: &str) -> Vec<String> {
    fleet
        .kube
        .as_ref()
        .unwrap()
        .cluster()
        .list(Kind::Event, None)
        .iter()
        .filter(|e| e["involvedObject"]["name"] == node)
        .filter_map(|e| e["reason"].as_str().map(String::from))
        .collect()
}

/// RELIABILITY.md finding 8: the Node annotation PATCH made on the step to `releasing` gets no
/// answer (the stand-in holds it for 120 s). rebootd gives it up after its request limit (10 s),
/// says so, and goes on: it releases its slot and ends its cycle long before the hang would end.
#[tokio::test]
async fn a_node_patch_without_an_answer_is_given_up_and_the_cycle_ends() {
    let fleet = ready_fleet(drain_opts(1, 1, FleetLock::Etcd(EtcdVersion::V34))).await;
    let cluster = kube_cluster(&fleet);
    cluster.faults().inject(
        FaultRule::hang("/api/v1/nodes/node-1", Duration::from_secs(120), 1)
            .method("PATCH")
            .body_contains("\"releasing\""),
    );
    need_reboot(&fleet, 0, "1").await;
    // Well under the 120 s hang; the cycle takes the 10 s limit plus a few seconds.
    let rolled = fleet.wait_rolled(Duration::from_secs(60)).await;
    if let Err(e) = rolled {
        let node = tokio::time::timeout(WAIT, fleet.nodes[0].lock()).await;
        let log = node.map(|n| n.log()).unwrap_or_default();
        panic!("{e}\n--- rebootd log ---\n{log}");
    }
    assert_eq!(
        cluster.faults().pending(),
        0,
        "the releasing PATCH was held"
    );
    let node = fleet.nodes[0].lock().await;
    log_line(
        &node,
        &["no answer from the Kubernetes API server within 10s: PATCH /api/v1/nodes/node-1"],
        WAIT,
    )
    .await;
    // The annotations of the later steps got through.
    node_annotations(&cluster, "node-1", &[("rebootd.io/phase", "idle")], &[]).await;
    let st = status_json(&node).await;
    assert_eq!(
        st["semaphore"]["holders"].as_array().map(Vec::len),
        Some(0),
        "{st}"
    );
    assert!(!unschedulable(&fleet, "node-1"));
}

/// The mod revision of `key` in the fleet's etcd (`None`: no such key).
async fn revision(etcd: &mut etcd_client::Client, key: &str) -> Option<i64> {
    let got = etcd.get(key, None).await.expect("etcd get");
    got.kvs().first().map(|kv| kv.mod_revision())
}

/// After the boot, a holder's first act is a beat: its record in the lock store gets a new
/// revision before anything that can take long. Here the first Kubernetes call after the boot,
/// the Node annotation of the step to `waiting_for_healthy`, gets no answer (rebootd gives it up
/// after its 10 s limit), and the wait for Ready comes after it; with `max_hold`, every waiter
/// has been counting since the beat before the reboot, the host's whole time down.
#[tokio::test]
async fn after_the_boot_a_holder_beats_before_anything_that_can_take_long() {
    let mut opts = drain_opts(1, 1, FleetLock::Etcd(EtcdVersion::V34));
    // A beat every 7.5 min: within the test, none comes by the timer.
    opts.lock_config = "max_hold = \"1h\"\n".into();
    // Down long enough to read the record as the reboot left it.
    opts.reboot_time = Duration::from_secs(2);
    let fleet = ready_fleet(opts).await;
    let cluster = kube_cluster(&fleet);
    cluster.faults().inject(
        FaultRule::hang("/api/v1/nodes/node-1", Duration::from_secs(120), 1)
            .method("PATCH")
            .body_contains("\"waiting_for_healthy\""),
    );
    let (log, key) = {
        let node = fleet.nodes[0].lock().await;
        let key = rebootd::lock::document::holder_record_key("default", &node.machine_id);
        (node.log_path(), key)
    };
    let endpoint = fleet.etcd.as_ref().unwrap().endpoint();
    let mut etcd = etcd_client::Client::connect([endpoint], None)
        .await
        .unwrap();
    let mut events = fleet.subscribe();
    need_reboot(&fleet, 0, "1").await;
    tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            match events.recv().await {
                Ok(FleetEvent::RebootRequested { node, .. }) if node == "node-1" => return,
                Ok(_) => continue,
                Err(e) => panic!("fleet events: {e}"),
            }
        }
    })
    .await
    .expect("node-1 asks for its reboot");
    let before = revision(&mut etcd, &key).await.expect("node-1's record");
    // Logged right before the step's annotation, the call that hangs.
    log_line_at("node-1", &log, &["rebooting → waiting_for_healthy"], WAIT).await;
    let after = revision(&mut etcd, &key).await.expect("node-1's record");
    assert!(
        after > before,
        "node-1's record unchanged (mod revision {before}) when it went on after the boot"
    );
    fleet
        .wait_rolled(Duration::from_secs(60))
        .await
        .expect("node-1 completes its reboot");
    assert_eq!(cluster.faults().pending(), 0, "the annotation was held");
}

#[tokio::test]
async fn a_node_with_replicaset_pods_under_a_pdb_drains_reboots_and_comes_back() {
    let fleet = ready_fleet(drain_opts(3, 1, FleetLock::Etcd(EtcdVersion::V34))).await;
    let cluster = kube_cluster(&fleet);
    web_under_budget(&cluster, ["node-1", "node-1", "node-2"]);
    let node = fleet.nodes[0].lock().await;
    let mut reboots = node.logind.subscribe();
    node.update_engine.set_status(NEED, "1").await.unwrap();
    next_reboot(&node, &mut reboots, Duration::from_secs(60)).await;
    // At the reboot: node-1 is cordoned and empty of the ReplicaSet's pods, and the
    // replacements run elsewhere.
    assert!(unschedulable(&fleet, "node-1"));
    let left: Vec<_> = cluster
        .pods_on_node("node-1")
        .into_iter()
        .filter(|p| p["metadata"]["labels"]["app"] == "web")
        .collect();
    assert!(left.is_empty(), "{left:?}");
    let web = cluster
        .list(Kind::Pod, Some("shop"))
        .into_iter()
        .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
        .count();
    assert_eq!(web, 3, "replacements exist");
    let blocked = cluster
        .requests()
        .count(|r| r.path.ends_with("/eviction") && r.status == 429);
    assert!(blocked >= 1, "the PDB blocked at least one eviction");
    drop(node);
    fleet
        .wait_rolled_nodes(&[0], Duration::from_secs(60))
        .await
        .unwrap();
    assert!(!unschedulable(&fleet, "node-1"), "uncordoned after boot");
    cluster
        .wait_for(WAIT, |snap| {
            snap.get(Kind::Node, "", "node-1")
                .filter(|n| n["metadata"]["annotations"]["rebootd.io/phase"] == "idle")
        })
        .await
        .expect("the node's phase annotation returns to idle");
    let reasons = event_reasons(&fleet, "node-1");
    for r in ["DrainStarted", "Rebooting", "Uncordoned"] {
        assert!(reasons.iter().any(|x| x == r), "{r} in {reasons:?}");
    }
}

#[tokio::test]
async fn with_max_one_never_two_nodes_are_cordoned_and_an_operators_cordon_stays() {
    let fleet = ready_fleet(drain_opts(3, 1, FleetLock::Kubernetes)).await;
    let cluster = kube_cluster(&fleet);
    cluster
        .update(Kind::Node, "", "node-3", |n| {
            n["spec"]["unschedulable"] = true.into();
        })
        .unwrap();
    let c = client(&fleet).await;
    let cordons = watch_cordons(c.clone(), BTreeSet::from(["node-3".to_string()]));
    let holders = watch_lease_holders(c);
    fleet.trigger_all("2").await.unwrap();
    fleet.wait_rolled(Duration::from_secs(90)).await.unwrap();
    assert_eq!(
        cordons.load(Ordering::SeqCst),
        1,
        "one node cordoned at a time"
    );
    assert_eq!(holders.load(Ordering::SeqCst), 1);
    assert!(
        unschedulable(&fleet, "node-3"),
        "the operator's cordon stays"
    );
    assert!(!unschedulable(&fleet, "node-1"));
    assert!(!unschedulable(&fleet, "node-2"));
}

#[tokio::test]
async fn a_drain_blocked_past_its_timeout_aborts_uncordons_and_frees_the_slot() {
    let mut opts = drain_opts(2, 1, FleetLock::Kubernetes);
    opts.kubernetes_config = "drain_timeout = \"3s\"\non_drain_failure = \"abort\"\n".into();
    opts.config = "[reboot]\nretry_interval = \"1h\"\n".into();
    let fleet = ready_fleet(opts).await;
    let cluster = kube_cluster(&fleet);
    unevictable_db(&cluster, ["node-1", "node-2"]);
    let node = fleet.nodes[0].lock().await;
    node.update_engine.set_status(NEED, "1").await.unwrap();
    let s = node
        .wait_state("the drain to fail and be backed out of", WAIT, |s| {
            s.phase == Phase::RebootNeeded
                && !s.slot_held
                && s.last_error
                    .as_deref()
                    .is_some_and(|e| e.contains("drain failed"))
        })
        .await
        .unwrap();
    assert!(!s.cordoned_by_us);
    assert!(!unschedulable(&fleet, "node-1"), "uncordoned");
    assert!(node.logind.reboot_calls().is_empty());
    let (_, out, _) = rebootctl(&node, &["status", "--json"]).await;
    let st: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        st["semaphore"]["holders"].as_array().unwrap().len(),
        0,
        "{st}"
    );
    assert!(event_reasons(&fleet, "node-1")
        .iter()
        .any(|r| r == "DrainFailed"));
}

#[tokio::test]
async fn a_node_that_does_not_come_back_ready_keeps_the_slot_and_the_next_waits() {
    let mut opts = drain_opts(2, 1, FleetLock::Etcd(EtcdVersion::V34));
    opts.kubernetes_config = "ready_timeout = \"2s\"\n".into();
    let fleet = ready_fleet(opts).await;
    fleet.comes_back_ready[0].store(false, Ordering::SeqCst);
    need_reboot(&fleet, 0, "1").await;
    fleet
        .wait_state(0, "hold a slot", WAIT, |s| s.slot_held)
        .await
        .unwrap();
    need_reboot(&fleet, 1, "1").await;
    // node-1 reboots and stays NotReady: it keeps the slot, loudly.
    let s = fleet
        .wait_state(0, "be not Ready after boot", Duration::from_secs(60), |s| {
            s.phase == Phase::WaitingForHealthy
                && s.last_error
                    .as_deref()
                    .is_some_and(|e| e.contains("rollout stops"))
        })
        .await
        .unwrap();
    assert!(s.slot_held);
    assert!(event_reasons(&fleet, "node-1")
        .iter()
        .any(|r| r == "NotReadyAfterReboot"));
    {
        let n2 = fleet.nodes[1].lock().await;
        assert_eq!(n2.state().unwrap().phase, Phase::AcquiringSlot);
        assert!(n2.logind.reboot_calls().is_empty(), "the next node waits");
    }
    // The operator fixes node-1: its kubelet reports the new boot and Ready, node-1
    // releases, and node-2 goes next.
    let boot = fleet.nodes[0].lock().await.boot_id();
    let cluster = fleet.kube.as_ref().unwrap().cluster();
    cluster
        .update(Kind::Node, "", "node-1", |n| {
            n["status"]["nodeInfo"]["bootID"] = boot.clone().into();
        })
        .unwrap();
    cluster.set_node_ready("node-1", true).unwrap();
    fleet.wait_rolled(Duration::from_secs(60)).await.unwrap();
}

#[tokio::test]
async fn the_slot_of_a_holder_whose_node_was_deleted_is_reclaimed() {
    let mut opts = drain_opts(2, 1, FleetLock::Kubernetes);
    opts.drain = false;
    let fleet = ready_fleet(opts).await;
    let mut n1 = fleet.nodes[0].lock().await;
    let _guard = n1.logind.hold_block_inhibitor("stuck", "never lets go");
    n1.update_engine.set_status(NEED, "1").await.unwrap();
    n1.wait_state("node-1 holds", WAIT, |s| s.slot_held)
        .await
        .unwrap();
    n1.kill_daemon().await;
    drop(n1);
    let n2 = fleet.nodes[1].lock().await;
    let mut reboots = n2.logind.subscribe();
    n2.update_engine.set_status(NEED, "1").await.unwrap();
    n2.wait_state("node-2 waits", WAIT, |s| s.phase == Phase::AcquiringSlot)
        .await
        .unwrap();
    assert!(n2.logind.reboot_calls().is_empty());
    // node-1 is removed from the cluster for good.
    fleet
        .kube
        .as_ref()
        .unwrap()
        .cluster()
        .delete(Kind::Node, "", "node-1")
        .unwrap();
    next_reboot(&n2, &mut reboots, WAIT).await;
}

#[tokio::test]
async fn lease_backend_with_max_two_over_five_nodes_never_exceeds_two() {
    let mut opts = drain_opts(5, 2, FleetLock::Kubernetes);
    opts.drain = false;
    let fleet = ready_fleet(opts).await;
    let holders = watch_lease_holders(client(&fleet).await);
    fleet.trigger_all("3").await.unwrap();
    fleet.wait_rolled(Duration::from_secs(90)).await.unwrap();
    assert_eq!(
        holders.load(Ordering::SeqCst),
        2,
        "never more, and the slots were used"
    );
    for n in &fleet.nodes {
        assert_eq!(n.lock().await.logind.reboot_calls().len(), 1);
    }
}

#[tokio::test]
async fn a_running_blocking_pod_keeps_the_node_from_taking_a_slot() {
    use rebootd_lab::kube_api::PodBuilder;
    let mut opts = drain_opts(1, 1, FleetLock::Kubernetes);
    opts.kubernetes_config = "blocking_pods = \"app=db-primary\"\n".into();
    let fleet = ready_fleet(opts).await;
    let cluster = kube_cluster(&fleet);
    cluster
        .add(
            &PodBuilder::new("db", "primary-0")
                .on_node("node-1")
                .label("app", "db-primary"),
        )
        .unwrap();
    let node = fleet.nodes[0].lock().await;
    let mut reboots = node.logind.subscribe();
    node.update_engine.set_status(NEED, "1").await.unwrap();
    let s = node
        .wait_state("the blocker to be reported", WAIT, |s| {
            s.waiting_for
                .as_deref()
                .is_some_and(|w| w.contains("db/primary-0"))
        })
        .await
        .unwrap();
    assert!(!s.slot_held, "no slot is taken while a blocking pod runs");
    assert!(!unschedulable(&fleet, "node-1"));
    let (_, out, _) = rebootctl(&node, &["status"]).await;
    assert!(
        out.contains("blocking pods to finish: db/primary-0"),
        "{out}"
    );
    assert!(node.logind.reboot_calls().is_empty());
    // The database moves away: the reboot goes ahead.
    cluster.remove(Kind::Pod, "db", "primary-0");
    next_reboot(&node, &mut reboots, WAIT).await;
}
