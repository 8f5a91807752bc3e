//! The operator's levers on one node, end to end: `rebootctl pause`, `resume` and `cancel`
//! against real rebootd processes on private buses, sharing a real etcd semaphore.

mod common;

use common::*;
use rebootd::need::TriggerSource;
use rebootd::state::{Phase, State};
use rebootd_lab::etcd::EtcdVersion;
use rebootd_lab::fake_logind::RebootCall;
use rebootd_lab::fleet::{FleetLock, FleetOptions};
use rebootd_lab::kube_api::Kind;
use rebootd_lab::node::Node;
use serde_json::Value;
use tokio::sync::broadcast;

const NEED: &str = "UPDATE_STATUS_UPDATED_NEED_REBOOT";

/// The ids holding a slot, as `rebootctl status --json` shows them.
async fn holders(node: &Node) -> Vec<String> {
    let st = status_json(node).await;
    st["semaphore"]["holders"]
        .as_array()
        .unwrap_or_else(|| panic!("no semaphore in {st}"))
        .iter()
        .map(|h| h["id"].as_str().unwrap().to_string())
        .collect()
}

/// `rebootctl cancel`, which must be applied; the node's state once it is idle again.
async fn cancelled(node: &Node, what: &str) -> State {
    let (code, out, err) = rebootctl(node, &["cancel"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("cancel applied"), "{out}");
    node.wait_state(what, WAIT, |s| s.phase == Phase::Idle)
        .await
        .unwrap()
}

/// Await the next reboot call logind accepts and the node's state recording it.
async fn reboot_accepted(node: &Node, reboots: &mut broadcast::Receiver<RebootCall>) {
    next_reboot(node, reboots, WAIT).await;
    node.wait_state("the accepted reboot on record", WAIT, |s| {
        s.reboot.as_ref().is_some_and(|r| r.called)
    })
    .await
    .unwrap();
}

/// Wait until the agent has started waiting for `rebootctl resume` `n` times (this boot and
/// earlier ones), following the log with inotify.
async fn waits_for_resume(node: &Node, n: usize) {
    use futures_util::StreamExt;
    let needle = "paused: waiting for `rebootctl resume`";
    let count = || node.log().lines().filter(|l| l.contains(needle)).count();
    let inotify = inotify::Inotify::init().expect("inotify");
    inotify
        .watches()
        .add(node.log_path(), inotify::WatchMask::MODIFY)
        .expect("watch the log");
    let mut events = inotify.into_event_stream(vec![0u8; 1024]).expect("stream");
    let reached = tokio::time::timeout(WAIT, async {
        while count() < n {
            events.next().await;
        }
    })
    .await;
    assert!(
        reached.is_ok(),
        "node {}: fewer than {n} waits for resume within {WAIT:?}\n{}",
        node.name,
        node.log()
    );
}

/// A paused node keeps its need but takes no slot, across a restart and a reboot, and says so
/// in `status`, `--json` and the coordinator file; `resume` lets the reboot through.
#[tokio::test]
async fn a_paused_node_takes_no_slot_across_restarts_and_reboots_until_resumed() {
    let (_etcd, config) = etcd_lock().await;
    let mut node = node("pause1", &config).await;
    let mut reboots = node.logind.subscribe();
    node.wait_ready(WAIT).await.unwrap();

    let (code, out, err) = rebootctl(&node, &["pause", "--reason", "db migration"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("pause applied: now idle, paused"), "{out}");
    let s = node.state().unwrap();
    assert_eq!(
        s.paused.as_ref().unwrap().reason.as_deref(),
        Some("db migration")
    );

    node.update_engine.set_status(NEED, "4.0").await.unwrap();
    waits_for_resume(&node, 1).await;
    let s = node.state().unwrap();
    assert_eq!(s.phase, Phase::RebootNeeded);
    assert!(
        s.waiting_for.as_deref().unwrap().contains("resume"),
        "{s:?}"
    );
    assert!(
        holders(&node).await.is_empty(),
        "a paused node takes no slot"
    );
    let st = status_json(&node).await;
    assert_eq!(st["paused"]["reason"], "db migration", "{st}");
    assert_eq!(st["requests"], serde_json::json!([]), "{st}");
    let (_, text, _) = rebootctl(&node, &["status"]).await;
    assert!(text.contains("paused:"), "{text}");
    assert!(text.contains("db migration"), "{text}");
    let coordinator = std::fs::read_to_string(node.coordinator_path()).unwrap();
    assert!(coordinator.contains("STATE=disabled"), "{coordinator}");

    // A restart in the same boot, then a reboot (outside rebootd's control): still paused.
    node.restart_daemon().await.unwrap();
    node.wait_ready(WAIT).await.unwrap();
    waits_for_resume(&node, 2).await;
    node.reboot().await.unwrap();
    node.wait_ready(WAIT).await.unwrap();
    assert!(node.state().unwrap().paused.is_some());
    node.update_engine.set_status(NEED, "4.1").await.unwrap();
    waits_for_resume(&node, 3).await;
    assert!(holders(&node).await.is_empty());
    assert!(node.logind.reboot_calls().is_empty());

    let (code, out, err) = rebootctl(&node, &["resume"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("resume applied"), "{out}");
    next_reboot(&node, &mut reboots, WAIT).await;
    assert_eq!(holders(&node).await, std::slice::from_ref(&node.machine_id));
    assert_eq!(node.state().unwrap().paused, None);
}

/// A request made while the daemon is stopped waits in the state directory, shows in `status`,
/// and is applied when the daemon starts, before it takes any slot.
#[tokio::test]
async fn a_pause_made_while_rebootd_is_stopped_is_applied_before_anything_else() {
    let (_etcd, config) = etcd_lock().await;
    let mut node = stopped_node("pause2", &config).await;
    let (code, out, err) = rebootctl(&node, &["pause"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("has not applied it"), "{out}");
    let st = status_json(&node).await;
    assert_eq!(st["requests"], serde_json::json!(["pause"]), "{st}");
    assert_eq!(st["paused"], Value::Null);
    // update_engine already says a reboot is needed when rebootd starts.
    node.update_engine.set_status(NEED, "5.0").await.unwrap();
    node.start_daemon().unwrap();
    waits_for_resume(&node, 1).await;
    assert!(holders(&node).await.is_empty());
    assert!(node.logind.reboot_calls().is_empty());
    let st = status_json(&node).await;
    assert_eq!(st["requests"], serde_json::json!([]), "{st}");
    assert!(st["paused"]["since"].is_string(), "{st}");
    assert!(
        !node.log().contains("waiting for a reboot slot"),
        "{}",
        node.log()
    );
}

/// `cancel` while waiting for a slot leaves the queue; while holding it (inhibitors keep logind
/// from being asked) gives it back; after logind accepted it is refused.
#[tokio::test]
async fn cancel_drops_a_reboot_not_yet_at_logind_and_gives_the_slot_back() {
    let (_etcd, config) = etcd_lock().await;
    let node = node("cancel1", &config).await;
    // Another machine holds the only slot (taken by hand, as an operator would).
    let other = slot_taken_by("cancel-other", &config).await;
    node.wait_ready(WAIT).await.unwrap();

    // 1. Waiting for the slot.
    node.update_engine.set_status(NEED, "6.0").await.unwrap();
    log_line(&node, &["waiting for a reboot slot"], WAIT).await;
    let s = cancelled(&node, "idle after the cancel").await;
    assert_eq!(s.reason, None);
    assert_eq!(
        holders(&node).await,
        std::slice::from_ref(&other.machine_id)
    );

    // 2. Holding the slot, a block inhibitor keeping logind from being asked.
    let (code, _, err) = rebootctl(&other, &["unlock"]).await;
    assert_eq!(code, 0, "{err}");
    let inhibitor = node
        .logind
        .hold_block_inhibitor("backup-job", "nightly dump");
    let (code, _, err) = rebootctl(&node, &["reboot"]).await;
    assert_eq!(code, 0, "{err}");
    node.wait_state("held, waiting for the inhibitor", WAIT, |s| {
        s.slot_held && !s.inhibited_by.is_empty()
    })
    .await
    .unwrap();
    assert_eq!(holders(&node).await, std::slice::from_ref(&node.machine_id));
    let s = cancelled(&node, "idle again").await;
    assert!(!s.slot_held);
    assert!(holders(&node).await.is_empty(), "the slot is given back");
    assert!(node.logind.reboot_calls().is_empty());
    assert!(node.log().contains("reboot cancelled by the operator"));

    // 3. logind accepted: too late.
    inhibitor.release();
    let mut reboots = node.logind.subscribe();
    let (code, _, err) = rebootctl(&node, &["reboot"]).await;
    assert_eq!(code, 0, "{err}");
    reboot_accepted(&node, &mut reboots).await;
    let (code, _, err) = rebootctl(&node, &["cancel"]).await;
    assert_eq!(code, 1, "too late is a failure: {err}");
    assert!(err.contains("logind was already asked"), "{err}");
    log_line(&node, &["cancel refused: logind was already asked"], WAIT).await;
    let s = node.state().unwrap();
    assert_eq!(s.phase, Phase::Rebooting);
    assert!(s.slot_held);
}

/// Whether the stand-in's Node is cordoned.
fn cordoned(cluster: &rebootd_lab::kube_api::Cluster, node: &str) -> bool {
    cluster
        .node(node)
        .and_then(|n| n["spec"]["unschedulable"].as_bool())
        .unwrap_or(false)
}

/// A pause shows as Node annotations. `cancel` in the middle of a drain a PodDisruptionBudget
/// holds up: rebootd stops evicting, uncordons the Node it cordoned (and leaves alone one an
/// operator had cordoned), gives the slot back and never calls logind.
#[tokio::test]
async fn cancel_during_a_drain_undoes_only_rebootds_cordon() {
    let version = *EtcdVersion::available().first().expect("an etcd");
    let fleet = ready_fleet(FleetOptions {
        nodes: 2,
        max: 1,
        lock: FleetLock::Etcd(version),
        drain: true,
        kubernetes_config: "drain_timeout = \"10m\"\n".into(),
        ..FleetOptions::default()
    })
    .await;
    let cluster = kube_cluster(&fleet);
    // Every pod of `db` is protected: no eviction is ever allowed.
    unevictable_db(&cluster, ["node-1", "node-2"]);
    // An operator cordoned node-2 for reasons of their own.
    cluster
        .update(Kind::Node, "", "node-2", |n| {
            n["spec"]["unschedulable"] = true.into();
        })
        .unwrap();

    // A pause shows on the Node, and goes with the resume.
    const PAUSED: [&str; 2] = ["rebootd.io/paused", "rebootd.io/paused-reason"];
    {
        let node = fleet.nodes[0].lock().await;
        let (code, _, err) = rebootctl(&node, &["pause", "--reason", "kernel freeze"]).await;
        assert_eq!(code, 0, "{err}");
        let shown = [(PAUSED[0], "true"), (PAUSED[1], "kernel freeze")];
        node_annotations(&cluster, "node-1", &shown, &[]).await;
        let (code, _, err) = rebootctl(&node, &["resume"]).await;
        assert_eq!(code, 0, "{err}");
        node_annotations(&cluster, "node-1", &[], &PAUSED).await;
    }

    for (i, name, by_us) in [(0, "node-1", true), (1, "node-2", false)] {
        let node = fleet.nodes[i].lock().await;
        node.update_engine.set_status(NEED, "7.0").await.unwrap();
        node.wait_state("draining", WAIT, |s| {
            s.phase == Phase::Draining && s.cordon_recorded
        })
        .await
        .unwrap();
        assert_eq!(node.state().unwrap().cordoned_by_us, by_us, "{name}");
        // The drain is under way: the Node is cordoned and an eviction was refused.
        cluster
            .wait_for(WAIT, |snap| {
                let refused = snap.list(Kind::Event, None).into_iter().any(|e| {
                    e["involvedObject"]["name"] == name && e["reason"] == "EvictionBlocked"
                });
                refused.then_some(())
            })
            .await
            .unwrap_or_else(|_| panic!("{name}: no refused eviction\n{}", node.log()));
        assert!(cordoned(&cluster, name));
        assert_eq!(holders(&node).await, std::slice::from_ref(&node.machine_id));

        let s = cancelled(&node, "idle after the cancel").await;
        assert!(!s.slot_held && !s.cordoned_by_us, "{s:?}");
        assert_eq!(
            cordoned(&cluster, name),
            !by_us,
            "{name}: only rebootd's own cordon is undone"
        );
        assert!(holders(&node).await.is_empty(), "{name}: the slot is back");
        assert!(node.logind.reboot_calls().is_empty());
        assert_eq!(cluster.pods_on_node(name).len(), 1, "the pod stays");
    }
}

/// `cancel` while a Node gate (FLUO's before-reboot checks) holds the slot: the slot goes back
/// and the Node's before-reboot label goes too, so no checker goes on preparing for a reboot
/// that will not come.
#[tokio::test]
async fn cancel_while_a_node_gate_waits_removes_its_label_and_frees_the_slot() {
    const LABEL: &str = "rebootd.io/before-reboot";
    let fleet = ready_fleet(FleetOptions {
        nodes: 1,
        max: 1,
        lock: FleetLock::Kubernetes,
        drain: true,
        config: "[gates]\ninterval = \"1s\"\n\n[[gates.before_reboot]]\nname = \"checks\"\n\
                 node_annotations = [\"rebootd.io/check-backup\"]\n"
            .into(),
        ..FleetOptions::default()
    })
    .await;
    let cluster = kube_cluster(&fleet);
    let node = fleet.nodes[0].lock().await;
    node.update_engine.set_status(NEED, "8.0").await.unwrap();
    node.wait_state("the Node gate to hold the slot", WAIT, |s| {
        s.slot_held && s.gate.as_ref().is_some_and(|g| g.name == "checks")
    })
    .await
    .unwrap();
    let n = cluster.node("node-1").unwrap();
    assert_eq!(n["metadata"]["labels"][LABEL], "true", "{n}");

    let s = cancelled(&node, "idle after the cancel").await;
    assert!(!s.slot_held);
    let n = cluster.node("node-1").unwrap();
    assert!(n["metadata"]["labels"][LABEL].is_null(), "{n}");
    assert!(holders(&node).await.is_empty(), "the Lease is free");
    assert!(node.logind.reboot_calls().is_empty());
}

/// A `rebootctl reboot` made while the node waits for a slot (and an update_engine signal seen
/// then) is taken by the cycle under way: the request is consumed at once, the node reboots
/// exactly once, and after the boot it is idle, with no second cycle for the same request.
#[tokio::test]
async fn a_request_made_mid_cycle_is_consumed_by_that_cycle() {
    let (_etcd, config) = etcd_lock().await;
    let mut node = node("midcycle1", &config).await;
    let other = slot_taken_by("midcycle-other", &config).await;
    node.wait_ready(WAIT).await.unwrap();
    let first_boot = node.boot_id();

    node.update_engine.set_status(NEED, "9.0").await.unwrap();
    log_line(&node, &["waiting for a reboot slot"], WAIT).await;
    let (code, _, err) = rebootctl(&node, &["reboot"]).await;
    assert_eq!(code, 0, "{err}");
    log_line(
        &node,
        &[
            "reboot needed (rebootctl",
            "during phase acquiring_slot: noted",
        ],
        WAIT,
    )
    .await;
    log_line(&node, &["the reboot request is on record"], WAIT).await;
    assert!(
        !node.store().request_path().exists(),
        "the request is consumed by the cycle under way"
    );
    // A new trigger in this phase is seen and noted too, without a new cycle.
    node.update_engine.set_status(NEED, "9.1").await.unwrap();
    log_line(&node, &["9.1", "during phase acquiring_slot: noted"], WAIT).await;
    let s = node.state().unwrap();
    assert_eq!(s.phase, Phase::AcquiringSlot);
    let reason = s.reason.as_ref().unwrap();
    assert_eq!(reason.source, TriggerSource::UpdateEngine, "{s:?}");
    assert!(reason.detail.contains("9.0"), "{s:?}");
    let st = status_json(&node).await;
    assert_eq!(st["trigger"], "update_engine", "{st}");
    let shown = st["reason"].as_str().unwrap();
    assert!(
        shown.starts_with("update_engine: UPDATE_STATUS_UPDATED_NEED_REBOOT"),
        "{st}"
    );

    let mut reboots = node.logind.subscribe();
    let (code, _, err) = rebootctl(&other, &["unlock"]).await;
    assert_eq!(code, 0, "{err}");
    reboot_accepted(&node, &mut reboots).await;
    node.reboot().await.unwrap();
    node.wait_ready(WAIT).await.unwrap();
    let s = node
        .wait_state("idle in the new boot", WAIT, |s| {
            s.phase == Phase::Idle && s.boot_id != first_boot
        })
        .await
        .unwrap();
    assert_eq!(s.reason, None);
    assert!(!node.store().request_path().exists());
    // Something goes through the new boot's loop (a pause, applied and answered): no trigger
    // was waiting, so the node stays idle.
    let (code, out, err) = rebootctl(&node, &["pause"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("pause applied: now idle, paused"), "{out}");
    assert_eq!(node.state().unwrap().phase, Phase::Idle);
    assert_eq!(node.logind.reboot_calls().len(), 1, "exactly one reboot");
}

/// Finding 16: `unlock` of a holder whose reboot is on its way (its record says `rebooting`:
/// logind asked, or about to be) would put one node more than `max` down, so it is refused
/// without `--force`, naming the node, its phase and since when; the slot stays held. With
/// `--force` it goes through.
#[tokio::test]
async fn unlock_of_a_holder_whose_reboot_is_on_its_way_is_refused_without_force() {
    let (_etcd, config) = etcd_lock().await;
    unlock_refused_while_rebooting("unlock16", &config).await;
}

/// The same on etcd's v2 keys API (locksmith's document, rebootd's records beside it).
#[tokio::test]
async fn unlock_of_a_holder_whose_reboot_is_on_its_way_is_refused_without_force_on_v2() {
    let v = *EtcdVersion::available()
        .iter()
        .find(|v| v.has_v2_api())
        .expect("an etcd with the v2 API (3.4 or 3.5)");
    let etcd = rebootd_lab::etcd::EtcdServer::start_with(v, rebootd_lab::etcd::EtcdOptions::v2())
        .await
        .expect("etcd");
    let config = etcd_config(&etcd).replace("[lock.etcd]\n", "[lock.etcd]\napi = \"v2\"\n");
    assert!(config.contains("api = \"v2\""), "{config}");
    unlock_refused_while_rebooting("unlock16v2", &config).await;
}

async fn unlock_refused_while_rebooting(name: &str, config: &str) {
    let node = node(name, config).await;
    node.wait_ready(WAIT).await.unwrap();
    let mut reboots = node.logind.subscribe();
    let (code, _, err) = rebootctl(&node, &["reboot"]).await;
    assert_eq!(code, 0, "{err}");
    reboot_accepted(&node, &mut reboots).await;
    let st = status_json(&node).await;
    assert_eq!(st["semaphore"]["holders"][0]["phase"], "rebooting", "{st}");

    for args in [&["unlock"][..], &["unlock", node.machine_id.as_str()][..]] {
        let (code, out, err) = rebootctl(&node, args).await;
        assert_eq!(code, 1, "{args:?} must be refused: {out}{err}");
        for words in [name, "rebooting", "since", "--force"] {
            assert!(
                err.contains(words),
                "{args:?}: {err:?} should say {words:?}"
            );
        }
        assert_eq!(holders(&node).await, std::slice::from_ref(&node.machine_id));
    }

    let (code, out, err) = rebootctl(&node, &["unlock", "--force"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("released the slot"), "{out}");
    assert!(holders(&node).await.is_empty());
}
