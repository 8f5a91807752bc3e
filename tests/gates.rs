//! Gates before a reboot (`[gates]`) end to end: real rebootd processes on their private buses
//! with the lab's fake logind; a real Prometheus whose alert rule fires and resolves on a gauge
//! the test sets; command gates; and a real etcd semaphore shared by two nodes, to show that a
//! gate closing after the slot was taken gives the slot to the other node. Also what rebootd
//! puts on its Node while it reboots (labels, taint, load-balancer exclusion).

#[path = "common/admission.rs"]
mod admission;
mod common;

use common::*;
use rebootd::gate::prometheus::{Access, AlertsGate, Matcher};
use rebootd::gate::Verdict;
use rebootd::state::{Phase, State};
use rebootd_lab::fleet::{Fleet, FleetEvent, FleetLock, FleetOptions};
use rebootd_lab::kube_api::{DaemonSetBuilder, Kind, ReplicaSetBuilder};
use rebootd_lab::node::Node;
use rebootd_lab::prometheus::{prometheus, Exporter};
use serde_json::Value;
use std::path::Path;
use std::time::{Duration, Instant};

const NEED: &str = "UPDATE_STATUS_UPDATED_NEED_REBOOT";

const RULES: &str = "groups:
  - name: lab
    rules:
      - alert: LabGateHigh
        expr: lab_gate_value > 0
        labels:
          severity: critical
";

/// How long Prometheus may take to scrape and evaluate (1 s each) on a loaded machine.
const SETTLE: Duration = Duration::from_secs(60);

async fn idle(node: &Node) {
    node.wait_ready(WAIT).await.unwrap();
    assert_eq!(node.state().unwrap().phase, Phase::Idle);
}

fn gate_named(s: &State, name: &str) -> bool {
    s.gate.as_ref().is_some_and(|g| g.name == name)
}

/// The node, once idle, needs a reboot into `version`: its state once the gate named `gate`
/// holds that reboot.
async fn held_by_gate(node: &Node, version: &str, gate: &str) -> State {
    idle(node).await;
    node.update_engine.set_status(NEED, version).await.unwrap();
    node.wait_state(&format!("gate {gate:?} to hold the reboot"), WAIT, |s| {
        gate_named(s, gate)
    })
    .await
    .unwrap()
}

/// node-2 needs a reboot into `version` while node-1 waits at a gate (`held`, its state then):
/// await node-1's gate asked again (with `holding`, node-1 still holding the slot) and node-2
/// waiting for the slot, which it does not hold.
async fn next_waits_while_the_gate_is_asked_again(
    fleet: &Fleet,
    version: &str,
    held: &State,
    holding: bool,
) {
    need_reboot(fleet, 1, version).await;
    let first = held.gate.as_ref().unwrap().next_check;
    fleet
        .wait_state(0, "node-1 to ask again", WAIT, |s| {
            s.gate.as_ref().is_some_and(|g| g.next_check > first) && (s.slot_held || !holding)
        })
        .await
        .unwrap();
    let s2 = fleet
        .wait_state(1, "node-2 to wait for the slot", WAIT, |s| {
            s.phase == Phase::AcquiringSlot
        })
        .await
        .unwrap();
    assert!(!s2.slot_held);
}

/// While a critical alert fires, the node waits before taking a slot, asking again every
/// `interval`, and says so in its log and in `rebootctl status`; when the alert resolves, the
/// reboot follows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_firing_alert_holds_the_reboot_until_it_resolves() {
    let exporter = Exporter::start().await.unwrap();
    let prom = prometheus(exporter.addr(), RULES).await.unwrap();
    exporter.set(1.0);
    // Wait (outside rebootd) for the rule to fire, so the node sees it from its first check.
    let critical = vec![Matcher::parse("severity=\"critical\"").unwrap()];
    let probe = AlertsGate::new(
        "test",
        &Access::url(&prom.url),
        None,
        critical,
        Duration::from_secs(5),
    )
    .unwrap();
    let deadline = Instant::now() + SETTLE;
    while probe.check().await == Verdict::Go {
        assert!(Instant::now() < deadline, "LabGateHigh never fired");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }

    let config = format!(
        "[gates]\ninterval = \"1s\"\n\n[[gates.before_reboot]]\nname = \"no-critical-alerts\"\n\
         prometheus_url = {:?}\nalerts = ['severity=\"critical\"']\ntimeout = \"5s\"\n",
        prom.url
    );
    let node = node("g1", &config).await;
    let mut reboots = node.logind.subscribe();
    let s = held_by_gate(&node, "1.0", "no-critical-alerts").await;
    assert_eq!(s.phase, Phase::RebootNeeded);
    assert!(!s.slot_held);
    let g = s.gate.clone().unwrap();
    assert!(g.why.contains("LabGateHigh"), "{g:?}");
    assert!(
        s.waiting_for
            .as_deref()
            .unwrap()
            .contains("no-critical-alerts"),
        "{s:?}"
    );
    log_line(
        &node,
        &["waiting for gate", "no-critical-alerts", "LabGateHigh"],
        WAIT,
    )
    .await;

    // Asked again at the interval, still closed, still the same gate since the same time.
    let again = node
        .wait_state("the gate to be asked again", WAIT, |s| {
            s.gate.as_ref().is_some_and(|x| x.next_check > g.next_check)
        })
        .await
        .unwrap();
    assert_eq!(again.gate.as_ref().unwrap().since, g.since);

    let (code, out, err) = rebootctl(&node, &["status"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("gate:"), "{out}");
    assert!(out.contains("\"no-critical-alerts\" says wait"), "{out}");
    let (_, json, _) = rebootctl(&node, &["status", "--json"]).await;
    let st: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(st["gate"]["name"], "no-critical-alerts", "{json}");
    assert!(
        st["gate"]["why"].as_str().unwrap().contains("LabGateHigh"),
        "{json}"
    );
    assert!(node.logind.reboot_calls().is_empty());

    exporter.set(0.0);
    let resolved = Instant::now();
    next_reboot(&node, &mut reboots, SETTLE).await;
    eprintln!(
        "rebooted {:?} after the gauge went to 0",
        resolved.elapsed()
    );
    let s = node.state().unwrap();
    assert_eq!(s.gate, None);
    assert_eq!(node.logind.reboot_calls().len(), 1);
}

/// A command gate: while it exits non-zero the node waits and shows the first line it wrote to
/// stderr; once it exits 0 the reboot goes. The command runs with the daemon's environment.
#[tokio::test]
async fn a_command_gate_holds_the_reboot_until_it_exits_zero() {
    let config = "[gates]\ninterval = \"1s\"\n\n[[gates.before_reboot]]\nname = \"backup\"\n\
         command = [\"sh\", \"-c\", \"if [ -e \\\"$STATE_DIRECTORY/hold\\\" ]; then echo backup running >&2; exit 3; fi\"]\n";
    let node = node("g2", config).await;
    let hold = node.state_dir().join("hold");
    std::fs::write(&hold, "").unwrap();
    let mut reboots = node.logind.subscribe();
    let s = held_by_gate(&node, "2.0", "backup").await;
    let why = &s.gate.as_ref().unwrap().why;
    assert!(
        why.contains("exit status 3") && why.contains("backup running"),
        "{why}"
    );
    assert!(node.logind.reboot_calls().is_empty());
    std::fs::remove_file(&hold).unwrap();
    next_reboot(&node, &mut reboots, WAIT).await;
}

/// Two nodes, one slot in a real etcd. node-1's gate goes while it holds no slot and says wait
/// once it holds one (as an alert its own reboot would fire): it releases the slot right away,
/// and node-2, queued behind it, reboots meanwhile. When the gate opens, node-1 reboots too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gate_closing_after_the_slot_was_taken_gives_the_slot_to_the_next_node() {
    let script = "if [ -e \"$STATE_DIRECTORY/hold\" ] && grep -q '\"slot_held\": *true' \"$STATE_DIRECTORY/state.json\"; then echo closed after the slot >&2; exit 1; fi";
    let config = format!(
        "[gates]\ninterval = \"1s\"\n\n[[gates.before_reboot]]\nname = \"late\"\ncommand = [\"sh\", \"-c\", {script:?}]\n"
    );
    let fleet = ready_fleet(FleetOptions {
        nodes: 2,
        max: 1,
        config,
        ..FleetOptions::default()
    })
    .await;
    let hold = fleet.nodes[0].lock().await.state_dir().join("hold");
    std::fs::write(&hold, "").unwrap();
    let mut events = fleet.subscribe();

    need_reboot(&fleet, 0, "3.0").await;
    // node-1 took the slot, its gate closed, it gave the slot back.
    fleet
        .wait_state(0, "node-1 to back out on its gate", WAIT, |s| {
            gate_named(s, "late") && s.phase == Phase::RebootNeeded && !s.slot_held
        })
        .await
        .unwrap();
    {
        let n = fleet.nodes[0].lock().await;
        log_line(
            &n,
            &[
                "gate \"late\" says wait",
                "backing out and releasing the slot",
            ],
            WAIT,
        )
        .await;
    }
    need_reboot(&fleet, 1, "3.0").await;
    let first = loop {
        match tokio::time::timeout(WAIT, events.recv()).await {
            Ok(Ok(FleetEvent::RebootRequested { node, .. })) => break node,
            Ok(Ok(_)) => continue,
            other => panic!("no reboot while node-1's gate held: {other:?}"),
        }
    };
    assert_eq!(first, "node-2", "the slot went to the next node");
    fleet
        .wait_rolled_nodes(&[1], WAIT)
        .await
        .expect("node-2 completes its reboot");
    assert!(fleet.nodes[0].lock().await.logind.reboot_calls().is_empty());

    std::fs::remove_file(&hold).unwrap();
    fleet
        .wait_rolled_nodes(&[0], WAIT)
        .await
        .expect("node-1 reboots once its gate opens");
    assert_eq!(fleet.max_holders_seen(), 1);
}

const CHECK: &str = "rebootd.io/check-backup";
const LABEL: &str = "rebootd.io/before-reboot";

/// FLUO's before-reboot contract with Lease slots (max 1), per-node identities and the
/// admission policy enforced: the node holding the slot labels its Node, removing a stale
/// annotation first, and waits with the slot held (not cordoned) until a checker sets the
/// annotation; the other node meanwhile waits for the slot and is not labelled. Once set, the
/// node reboots and its label and annotation are gone; then the other node's turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_gate_holds_the_slot_until_a_checker_annotates_the_node() {
    let (hook, denied) = admission::enforcing();
    let fleet = ready_fleet(FleetOptions {
        node_identities: true,
        kube_admission: Some(hook),
        config: format!(
            "[gates]\ninterval = \"1s\"\n\n[[gates.before_reboot]]\nname = \"checks\"\nnode_annotations = [{CHECK:?}]\n"
        ),
        ..drain_opts(2, 1, FleetLock::Kubernetes)
    })
    .await;
    let cluster = kube_cluster(&fleet);
    let annotate = |node: &str| {
        cluster
            .update(Kind::Node, "", node, |n| {
                n["metadata"]["annotations"][CHECK] = "true".into();
            })
            .unwrap();
    };
    let node_obj = |node: &str| cluster.get(Kind::Node, "", node).unwrap();
    // Left from an earlier cycle: must not count.
    annotate("node-1");
    need_reboot(&fleet, 0, "4.0").await;
    let s = fleet
        .wait_state(0, "node-1 to wait for its checks", WAIT, |s| {
            gate_named(s, "checks") && s.slot_held
        })
        .await
        .unwrap();
    assert_eq!(s.phase, Phase::Draining, "{s:?}");
    let n = node_obj("node-1");
    assert_eq!(n["metadata"]["labels"][LABEL], "true", "{n}");
    assert!(n["metadata"]["annotations"][CHECK].is_null(), "stale: {n}");
    assert_ne!(n["spec"]["unschedulable"], true, "not cordoned yet: {n}");

    next_waits_while_the_gate_is_asked_again(&fleet, "4.0", &s, true).await;
    assert!(node_obj("node-2")["metadata"]["labels"][LABEL].is_null());

    // The checker says go.
    annotate("node-1");
    fleet
        .wait_rolled_nodes(&[0], Duration::from_secs(60))
        .await
        .expect("node-1 reboots once annotated");
    let n = node_obj("node-1");
    assert!(n["metadata"]["labels"][LABEL].is_null(), "{n}");
    assert!(n["metadata"]["annotations"][CHECK].is_null(), "{n}");

    fleet
        .wait_state(1, "node-2 to wait for its checks", WAIT, |s| {
            gate_named(s, "checks") && s.slot_held
        })
        .await
        .unwrap();
    annotate("node-2");
    fleet
        .wait_rolled_nodes(&[1], Duration::from_secs(60))
        .await
        .expect("node-2 reboots once annotated");
    let denied = admission::refused(&denied);
    assert!(denied.is_empty(), "the policy denied rebootd: {denied:?}");
}

/// The admission policy's `managedAnnotations`: a node identity may remove a listed annotation
/// from its own Node (a Node gate's used checks), never set one, and nothing unlisted.
#[test]
fn the_policy_lets_a_node_remove_only_the_listed_gate_annotations() {
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/kubernetes/admission-policy.yaml"),
    )
    .unwrap();
    let default = admission::Policy::from_yaml(&text);
    let listed = admission::Policy::from_yaml(&text.replacen(
        "name: managedAnnotations\n      expression: \"[]\"",
        "name: managedAnnotations\n      expression: \"['example.com/backup-done']\"",
        1,
    ));
    let node = |annotations: Value| {
        serde_json::json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": "worker-1", "annotations": annotations, "labels": {}},
            "spec": {},
        })
    };
    let with =
        node(serde_json::json!({"example.com/backup-done": "true", "rebootd.io/phase": "x"}));
    let without = node(serde_json::json!({"rebootd.io/phase": "x"}));
    let nodes = ("", "v1", "nodes");
    let user = "rebootd:node:worker-1";
    let remove = admission::request(user, "UPDATE", nodes, "", Some(&with), Some(&without));
    let set = admission::request(user, "UPDATE", nodes, "", Some(&without), Some(&with));
    let denies = |p: &admission::Policy, req: &Value| {
        p.admit(req)
            .expect_err("admitted")
            .contains("rebootd.io/ annotations")
    };
    assert!(denies(&default, &remove), "unlisted: removal denied");
    assert_eq!(listed.admit(&remove), Ok(true), "listed: removal allowed");
    assert!(denies(&listed, &set), "listed: setting it is still denied");
}

/// Checks after the boot hold the slot: a DaemonSet's pod on the rebooted node not Ready keeps
/// the node cordoned and the slot held (the other node waits), the log and the state say which
/// gate; once Ready the node is uncordoned, then the settle time holds the slot before the other
/// node gets it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checks_after_the_boot_and_the_settle_time_hold_the_slot() {
    let fleet = ready_fleet(FleetOptions {
        config: "[gates]\ninterval = \"1s\"\nsettle = \"2s\"\n\n[[gates.after_boot]]\nname = \"csi\"\npods_ready = \"app=csi\"\n".into(),
        ..drain_opts(2, 1, FleetLock::Kubernetes)
    })
    .await;
    let cluster = kube_cluster(&fleet);
    cluster
        .add(&DaemonSetBuilder::new("kube-system", "csi"))
        .unwrap();
    let csi_pod = |node: &str| {
        cluster
            .pods_on_node(node)
            .into_iter()
            .find(|p| p["metadata"]["labels"]["app"] == "csi")
    };
    let ready = |p: &Value| {
        p["status"]["conditions"].as_array().is_some_and(|cs| {
            cs.iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        })
    };
    cluster
        .wait_for(WAIT, |snap| {
            ["node-1", "node-2"]
                .iter()
                .all(|n| {
                    snap.pods_on_node(n)
                        .iter()
                        .any(|p| p["metadata"]["labels"]["app"] == "csi" && ready(p))
                })
                .then_some(())
        })
        .await
        .expect("the csi pods run and are Ready");
    // From now on a pod is Ready only when the test says so.
    cluster.set_pod_ready_delay(Duration::from_secs(3600));
    need_reboot(&fleet, 0, "5.0").await;
    let s = fleet
        .wait_state(0, "node-1 to wait for its pods after the boot", WAIT, |s| {
            s.phase == Phase::WaitingForHealthy && gate_named(s, "csi")
        })
        .await
        .unwrap();
    assert!(s.slot_held && s.cordoned_by_us, "{s:?}");
    assert!(
        s.gate.as_ref().unwrap().why.contains("kube-system/csi-"),
        "{s:?}"
    );
    assert_eq!(
        cluster.node("node-1").unwrap()["spec"]["unschedulable"],
        true
    );
    next_waits_while_the_gate_is_asked_again(&fleet, "5.0", &s, false).await;

    // The pod is Ready: uncordon, then the settle time with the slot held.
    cluster.set_pod_ready_delay(Duration::from_millis(200));
    let pod = csi_pod("node-1").expect("csi pod on node-1");
    assert!(!ready(&pod), "not Ready after the boot: {pod}");
    let (ns, name) = (
        pod["metadata"]["namespace"].as_str().unwrap().to_string(),
        pod["metadata"]["name"].as_str().unwrap().to_string(),
    );
    cluster
        .update(Kind::Pod, &ns, &name, |p| {
            for c in p["status"]["conditions"].as_array_mut().unwrap() {
                if c["type"] == "Ready" {
                    c["status"] = "True".into();
                }
            }
        })
        .unwrap();
    let s = fleet
        .wait_state(0, "node-1 to settle, uncordoned", WAIT, |s| {
            s.settle_until.is_some() && s.phase == Phase::Releasing
        })
        .await
        .unwrap();
    assert!(s.slot_held);
    assert!(
        s.waiting_for.as_deref().unwrap().contains("settle"),
        "{s:?}"
    );
    assert_ne!(
        cluster.node("node-1").unwrap()["spec"]["unschedulable"],
        true
    );
    let settle_until = s.settle_until.unwrap();
    let s2 = fleet
        .wait_state(1, "node-2 to get the slot", WAIT, |s| s.slot_held)
        .await
        .unwrap();
    assert!(
        s2.since >= settle_until,
        "node-2 took the slot at {} before node-1's settle time ended at {settle_until}",
        s2.since
    );
    fleet
        .wait_rolled(Duration::from_secs(60))
        .await
        .expect("both nodes roll");
}

/// A holder waiting for a check after its boot keeps its slot for as long as the check says
/// wait, also with `lock.max_hold`: it keeps beating while it asks again every
/// `gates.interval`, which here is shorter than a beat (`max_hold / 8`). Found by the chaos
/// trials' review: the beat's timer started again with every action, so a holder whose every
/// action (ask, wait `interval`, ask again) was shorter than a beat never beat, and the waiter
/// behind it reclaimed the slot of a live node after `max_hold`, two nodes in flight with max 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_waiting_for_a_check_after_the_boot_keeps_beating_and_its_slot_with_max_hold() {
    // A beat every 1.25 s; the check is asked every second (the shortest interval allowed).
    let max_hold = Duration::from_secs(10);
    let config = "[reboot]\ntimeout = \"2s\"\nusers_warning = \"0s\"\n\n[gates]\ninterval = \"1s\"\n\n[[gates.after_boot]]\nname = \"after\"\ncommand = [\"sh\", \"-c\", \"! test -e \\\"$STATE_DIRECTORY/hold\\\"\"]\n";
    let fleet = ready_fleet(FleetOptions {
        nodes: 2,
        max: 1,
        config: config.into(),
        lock_config: format!("max_hold = \"{}s\"\n", max_hold.as_secs()),
        ..FleetOptions::default()
    })
    .await;
    let hold = fleet.nodes[0].lock().await.state_dir().join("hold");
    std::fs::write(&hold, "").unwrap();
    let mut events = fleet.subscribe();
    for (i, version) in [(0, "3.0"), (1, "3.0")] {
        if i == 1 {
            // node-1 rebooted and waits for its check, holding the slot.
            fleet
                .wait_state(
                    0,
                    "node-1 to wait for its check after the boot",
                    WAIT,
                    |s| gate_named(s, "after") && s.slot_held && s.last_reboot.is_some(),
                )
                .await
                .unwrap();
        }
        need_reboot(&fleet, i, version).await;
    }
    // node-2 waits behind it: for two and a half times max_hold, nobody takes node-1's slot.
    let quiet = max_hold * 5 / 2;
    let taken = tokio::time::timeout(quiet, async {
        loop {
            match events.recv().await {
                Ok(FleetEvent::RebootRequested { node, .. }) if node == "node-2" => return,
                Ok(_) => continue,
                Err(e) => panic!("fleet events: {e}"),
            }
        }
    })
    .await;
    let n1 = fleet.nodes[0].lock().await.state().unwrap();
    assert!(
        taken.is_err() && n1.slot_held,
        "node-2 rebooted while node-1 waited for its check holding the slot (node-1: {n1:?})\n{}",
        fleet.nodes[1].lock().await.log()
    );
    assert!(
        !fleet.nodes[1].lock().await.log().contains("RECLAIMING"),
        "node-2 reclaimed the slot of a live holder"
    );
    // The check says go: node-1 gives its slot back, node-2 reboots.
    std::fs::remove_file(&hold).unwrap();
    fleet
        .wait_rolled_nodes(&[0, 1], WAIT)
        .await
        .expect("both nodes complete their reboot");
    assert_eq!(fleet.max_holders_seen(), 1);
}

/// While rebooting, rebootd labels and taints its Node and takes it out of external load
/// balancers, waiting before the first eviction; afterwards it takes off exactly what it added
/// (an operator's label with the same key and another taint stay), with per-node identities and
/// the admission policy enforced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reboot_labels_taint_and_load_balancer_exclusion_come_and_go_with_the_reboot() {
    use rebootd::drain::marks::{ADDED, EXCLUDE_LB, TAINT_KEY};
    let (hook, denied) = admission::enforcing();
    let wait = Duration::from_secs(2);
    let fleet = ready_fleet(FleetOptions {
        node_identities: true,
        kube_admission: Some(hook),
        kubernetes_config: format!(
            "drain_timeout = \"60s\"\nready_timeout = \"30s\"\nreboot_taint = \"PreferNoSchedule\"\n\
             exclude_from_load_balancers = \"{}\"\n\
             reboot_labels = {{ \"rebootd.io/rebooting\" = \"true\", \"rebootd.io/maintenance\" = \"true\" }}\n",
            humantime::format_duration(wait)
        ),
        ..drain_opts(1, 1, FleetLock::Kubernetes)
    })
    .await;
    let cluster = kube_cluster(&fleet);
    // An operator's label with one of the keys, and a taint of its own.
    cluster
        .update(Kind::Node, "", "node-1", |n| {
            n["metadata"]["labels"]["rebootd.io/maintenance"] = "operator".into();
            n["spec"]["taints"] =
                serde_json::json!([{"key": "dedicated", "value": "db", "effect": "NoSchedule"}]);
        })
        .unwrap();
    cluster
        .add_replicaset(
            &ReplicaSetBuilder::new("shop", "web")
                .replicas(1)
                .grace_period(1),
            &["node-1"],
        )
        .unwrap();
    need_reboot(&fleet, 0, "6.0").await;
    let marked = cluster
        .wait_for(WAIT, |snap| {
            snap.get(Kind::Node, "", "node-1")
                .filter(|n| n["metadata"]["labels"][EXCLUDE_LB] == "true")
        })
        .await
        .expect("node-1 excluded from load balancers");
    let seen = std::time::SystemTime::now();
    let labels = &marked["metadata"]["labels"];
    assert_eq!(labels["rebootd.io/rebooting"], "true", "{marked}");
    assert_eq!(labels["rebootd.io/maintenance"], "operator", "{marked}");
    let taints = marked["spec"]["taints"].as_array().unwrap();
    assert!(
        taints
            .iter()
            .any(|t| t["key"] == TAINT_KEY && t["effect"] == "PreferNoSchedule"),
        "{marked}"
    );
    assert!(
        marked["metadata"]["annotations"][ADDED].is_string(),
        "{marked}"
    );

    fleet
        .wait_rolled_nodes(&[0], Duration::from_secs(60))
        .await
        .expect("node-1 rolls");
    let first_eviction = cluster
        .requests()
        .all()
        .into_iter()
        .filter(|r| r.method == "POST" && r.path.ends_with("/eviction"))
        .map(|r| r.at)
        .min()
        .expect("an eviction");
    let waited = first_eviction.duration_since(seen).unwrap_or_default();
    eprintln!("first eviction {waited:?} after the exclusion label was seen (wait {wait:?})");
    assert!(
        waited >= wait - Duration::from_millis(500),
        "evicted {waited:?} after the load-balancer exclusion; configured wait {wait:?}"
    );
    let n = cluster.node("node-1").unwrap();
    let labels = &n["metadata"]["labels"];
    assert!(labels["rebootd.io/rebooting"].is_null(), "{n}");
    assert!(labels[EXCLUDE_LB].is_null(), "{n}");
    assert_eq!(labels["rebootd.io/maintenance"], "operator", "{n}");
    assert_eq!(
        n["spec"]["taints"],
        serde_json::json!([{"key": "dedicated", "value": "db", "effect": "NoSchedule"}]),
        "{n}"
    );
    assert!(n["metadata"]["annotations"][ADDED].is_null(), "{n}");
    let denied = admission::refused(&denied);
    assert!(denied.is_empty(), "the policy denied rebootd: {denied:?}");
}
