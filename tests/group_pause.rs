//! `rebootctl pause --group` / `resume --group`: a pause kept in the lock store, so every node
//! of the group stops taking slots. Real rebootd processes on private buses, against real etcd
//! (v3 and v2) and the Lease store on the Kubernetes API stand-in; a FleetLock server has no
//! such call and rebootctl says so.

mod common;

use common::*;
use rebootd::state::Phase;
use rebootd_lab::etcd::{EtcdOptions, EtcdServer, EtcdVersion};
use rebootd_lab::fleet::{FleetLock, FleetOptions};
use rebootd_lab::node::Node;
use serde_json::Value;

const NEED: &str = "UPDATE_STATUS_UPDATED_NEED_REBOOT";

/// The group is paused before the node needs a reboot: it waits for the resume (shown in its
/// state, `status` and `--json`), takes no slot, and reboots once the group is resumed.
async fn paused_group_holds_the_node_until_resumed(node: &Node) {
    let mut reboots = node.logind.subscribe();
    node.wait_ready(WAIT).await.unwrap();
    let (code, out, err) =
        rebootctl(node, &["pause", "--group", "--reason", "kernel freeze"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("paused"), "{out}");
    let st = status_json(node).await;
    assert_eq!(st["group_paused"]["reason"], "kernel freeze", "{st}");
    let (_, text, _) = rebootctl(node, &["status"]).await;
    assert!(text.contains("group paused"), "{text}");

    node.update_engine.set_status(NEED, "10.0").await.unwrap();
    let s = node
        .wait_state("waiting on the paused group", WAIT, |s| {
            s.phase == Phase::AcquiringSlot && s.group_paused.is_some()
        })
        .await
        .unwrap();
    assert!(
        s.waiting_for.as_deref().unwrap().contains("resume --group"),
        "{s:?}"
    );
    assert!(!s.slot_held);
    let holders = &status_json(node).await["semaphore"]["holders"];
    assert_eq!(holders, &serde_json::json!([]), "no slot is taken");
    assert!(node.logind.reboot_calls().is_empty());

    let (code, out, err) = rebootctl(node, &["resume", "--group"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("resumed"), "{out}");
    next_reboot(node, &mut reboots, WAIT).await;
    let st = status_json(node).await;
    assert_eq!(st["group_paused"], Value::Null, "{st}");
    assert!(
        node.log().contains("the group was resumed"),
        "{}",
        node.log()
    );
}

/// A node already in the queue when the group is paused leaves it and waits for the resume;
/// the holder is not disturbed.
async fn a_waiter_leaves_the_queue_when_the_group_is_paused(node: &Node, other: &Node) {
    let (code, _, err) = rebootctl(other, &["lock"]).await;
    assert_eq!(code, 0, "{err}");
    node.wait_ready(WAIT).await.unwrap();
    node.update_engine.set_status(NEED, "11.0").await.unwrap();
    log_line(node, &["waiting for a reboot slot"], WAIT).await;
    let (code, _, err) = rebootctl(other, &["pause", "--group"]).await;
    assert_eq!(code, 0, "{err}");
    node.wait_state("the pause seen in the slot wait", WAIT, |s| {
        s.phase == Phase::AcquiringSlot && s.group_paused.is_some()
    })
    .await
    .unwrap();
    log_line(node, &["while waiting for a slot; leaving the queue"], WAIT).await;
    let mut reboots = node.logind.subscribe();
    let (code, _, err) = rebootctl(other, &["unlock"]).await;
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = rebootctl(other, &["resume", "--group"]).await;
    assert_eq!(code, 0, "{err}");
    next_reboot(node, &mut reboots, WAIT).await;
}

async fn etcd_nodes(api: &str, prefix: &str) -> (EtcdServer, Node, Node) {
    let v = *EtcdVersion::available()
        .iter()
        .find(|v| v.has_v2_api())
        .expect("an etcd with the v2 API is installed");
    let etcd = EtcdServer::start_with(v, EtcdOptions::v2())
        .await
        .expect("start etcd");
    let config = format!("{}api = {api:?}\n", etcd_config(&etcd));
    let a = node(&format!("{prefix}-a"), &config).await;
    let b = stopped_node(&format!("{prefix}-b"), &config).await;
    (etcd, a, b)
}

#[tokio::test]
async fn etcd_v3_a_paused_group_takes_no_slot_until_resumed() {
    let (_etcd, a, _b) = etcd_nodes("v3", "gp3").await;
    paused_group_holds_the_node_until_resumed(&a).await;
}

#[tokio::test]
async fn etcd_v3_a_waiter_leaves_the_queue_when_the_group_is_paused() {
    let (_etcd, a, b) = etcd_nodes("v3", "gq3").await;
    a_waiter_leaves_the_queue_when_the_group_is_paused(&a, &b).await;
}

/// On v2 the pause is a key of rebootd's beside locksmith's document, which stays as it was.
#[tokio::test]
async fn etcd_v2_a_paused_group_takes_no_slot_until_resumed() {
    let (etcd, a, b) = etcd_nodes("v2", "gp2").await;
    let (code, _, err) = rebootctl(&b, &["pause", "--group"]).await;
    assert_eq!(code, 0, "{err}");
    let get = |path: &str| etcd.curl_v2("GET", path, None).unwrap();
    let (_, doc) = get("/v2/keys/coreos.com/updateengine/rebootlock/semaphore");
    assert!(
        !doc.contains("paused"),
        "locksmith's document untouched: {doc}"
    );
    let (code, key) = get("/v2/keys/coreos.com/updateengine/rebootlock/rebootd/control/paused");
    assert_eq!(code, 200, "{key}");
    assert!(key.contains("since"), "{key}");
    let (code, _, err) = rebootctl(&b, &["resume", "--group"]).await;
    assert_eq!(code, 0, "{err}");
    paused_group_holds_the_node_until_resumed(&a).await;
}

#[tokio::test]
async fn etcd_v2_a_waiter_leaves_the_queue_when_the_group_is_paused() {
    let (_etcd, a, b) = etcd_nodes("v2", "gq2").await;
    a_waiter_leaves_the_queue_when_the_group_is_paused(&a, &b).await;
}

/// On the Lease store, with the Node annotations shown while the node waits on the pause.
#[tokio::test]
async fn leases_a_paused_group_takes_no_slot_until_resumed_and_the_node_says_so() {
    let fleet = ready_fleet(FleetOptions {
        nodes: 1,
        max: 1,
        lock: FleetLock::Kubernetes,
        drain: true,
        ..FleetOptions::default()
    })
    .await;
    let cluster = kube_cluster(&fleet);
    let node = fleet.nodes[0].lock().await;
    let check = async {
        let shown = [
            ("rebootd.io/group-paused", "true"),
            ("rebootd.io/group-paused-reason", "kernel freeze"),
        ];
        node_annotations(&cluster, "node-1", &shown, &[]).await;
        node_annotations(&cluster, "node-1", &[], &["rebootd.io/group-paused"]).await;
    };
    tokio::join!(paused_group_holds_the_node_until_resumed(&node), check);
}

#[tokio::test]
async fn a_fleetlock_server_cannot_pause_a_group() {
    let config =
        "[lock]\nbackend = \"fleetlock\"\n[lock.fleetlock]\nurl = \"http://127.0.0.1:9\"\n";
    let node = stopped_node("gp-fleetlock", config).await;
    for args in [&["pause", "--group"][..], &["resume", "--group"][..]] {
        let (code, _, err) = rebootctl(&node, args).await;
        assert_eq!(code, 1, "{args:?}: {err}");
        assert!(err.contains("not supported by a FleetLock server"), "{err}");
    }
}
