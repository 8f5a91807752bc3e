//! What a stolen node credential can try against the Lease semaphore, end to end: the attacker's
//! writes go through the API stand-in with `deploy/kubernetes/admission-policy.yaml` enforced
//! (so the attacker writes exactly what the policy lets a node identity write), then real rebootd
//! processes (the victims) go on. No victim drains or reboots while a real holder is down, and
//! nothing the attacker wrote reaches an operator's terminal unescaped. The table in
//! `deploy/kubernetes/README.md` names these tests.

#[path = "common/admission.rs"]
mod admission;
mod common;

use std::time::Duration;

use common::*;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, PostParams};
use rebootd_lab::fleet::{Fleet, FleetEvent, FleetLock, FleetOptions};
use rebootd_lab::kube_api::Kind;
use serde_json::json;

/// How long the real holder stays down: the window in which a forgery would let a victim in.
const DOWN: Duration = Duration::from_secs(4);

/// Two nodes, each its own identity, one slot, the policy enforced, reboots lasting [`DOWN`].
async fn fleet_of_two() -> Fleet {
    let (hook, _) = admission::enforcing();
    ready_fleet(FleetOptions {
        node_identities: true,
        kube_admission: Some(hook),
        reboot_time: DOWN,
        ..drain_opts(2, 1, FleetLock::Kubernetes)
    })
    .await
}

/// The attacker: node `node-x`'s rebootd credential, stolen.
async fn attacker(fleet: &Fleet) -> Api<Lease> {
    let api = fleet.kube.as_ref().expect("the fleet's API stand-in");
    Api::namespaced(admission::client_as(api, "node-x").await, "rebootd")
}

/// Create `lease` as the attacker; the policy must let it through (else the attack is moot).
async fn attacker_creates(leases: &Api<Lease>, lease: serde_json::Value) {
    let lease: Lease = serde_json::from_value(lease).unwrap();
    leases
        .create(&PostParams::default(), &lease)
        .await
        .expect("the admission policy lets a node identity write this");
}

/// Wait for the fleet event `pred`.
async fn event_seen(fleet: &Fleet, what: &str, pred: impl Fn(&FleetEvent) -> bool) {
    let mut rx = fleet.subscribe();
    if fleet.events().iter().any(&pred) {
        return;
    }
    tokio::time::timeout(WAIT, async {
        while let Ok(e) = rx.recv().await {
            if pred(&e) {
                return;
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no {what} within {WAIT:?}: {:?}", fleet.events()));
}

/// Every pair of nodes down at once (reboot asked .. booted again), from the fleet's events.
fn down_together(events: &[FleetEvent]) -> Vec<(String, String)> {
    let mut down: Vec<String> = Vec::new();
    let mut overlaps = Vec::new();
    for e in events {
        match e {
            FleetEvent::RebootRequested { node, .. } => {
                overlaps.extend(down.iter().map(|d| (d.clone(), node.clone())));
                down.push(node.clone());
            }
            FleetEvent::Booted { node, .. } => down.retain(|d| d != node),
            FleetEvent::Holders { .. } => {}
        }
    }
    overlaps
}

/// Node x holds a slot Lease past `max` (the policy lets a node create a slot it holds itself)
/// and writes the waiting victim's machine id on it, without a token, and an escape sequence
/// as its phase. Before ownership came from `holderIdentity`, the victim adopted that slot and
/// drained and rebooted while the real holder was still down. Now the victim waits, `status`
/// shows the slot as foreign and its phase escaped, and the victim reboots only after the real
/// holder is back (and the forged slot, counted as held, is removed by an administrator).
#[tokio::test]
async fn a_forged_slot_with_the_victims_machine_id_is_never_adopted() {
    let fleet = fleet_of_two().await;
    let leases = attacker(&fleet).await;
    let victim_id = fleet.nodes[1].lock().await.machine_id.clone();

    need_reboot(&fleet, 0, "2").await;
    event_seen(
        &fleet,
        "node-1 going down",
        |e| matches!(e, FleetEvent::RebootRequested { node, .. } if node == "node-1"),
    )
    .await;
    attacker_creates(
        &leases,
        json!({
            "metadata": {
                "name": "rebootd-7", "namespace": "rebootd",
                "labels": {"rebootd.io/semaphore": "rebootd", "rebootd.io/role": "slot",
                           "rebootd.io/slot": "7"},
                "annotations": {"rebootd.io/machine-id": victim_id,
                                "rebootd.io/phase": "\u{1b}[2J\u{1b}]0;owned\u{7}rebooting"},
            },
            "spec": {"holderIdentity": "node-x", "leaseTransitions": 1},
        }),
    )
    .await;
    need_reboot(&fleet, 1, "2").await;
    {
        let victim = fleet.nodes[1].lock().await;
        log_line(&victim, &["waiting for a free slot", "node-x"], WAIT).await;
        let (code, out, err) = rebootctl(&victim, &["status"]).await;
        assert_eq!(code, 0, "{err}");
        assert!(!out.contains('\u{1b}'), "a raw escape sequence:\n{out:?}");
        assert!(out.contains("\\u{1b}[2J"), "{out}");
        assert!(
            out.contains("foreign") && out.contains("past max 1"),
            "{out}"
        );
        let json = status_json(&victim).await;
        let holders = json["semaphore"]["holders"].as_array().unwrap();
        assert!(
            holders
                .iter()
                .any(|h| h["node"] == "node-x" && h["foreign"].is_string()),
            "{json}"
        );
    }
    fleet
        .wait_rolled_nodes(&[0], Duration::from_secs(60))
        .await
        .unwrap();
    // The forged slot counts as held (fail closed): the administrator removes it.
    kube_cluster(&fleet)
        .delete(Kind::Lease, "rebootd", "rebootd-7")
        .unwrap();
    fleet
        .wait_rolled_nodes(&[1], Duration::from_secs(60))
        .await
        .unwrap();
    let events = fleet.events();
    assert_eq!(down_together(&events), Vec::<(String, String)>::new());
    let victim = fleet.nodes[1].lock().await;
    assert!(
        !victim.log().contains("taking it over as this host's"),
        "the victim adopted a slot"
    );
}

/// Node x creates `rebootd-paused` as the control Lease of a semaphore of that name (which the
/// policy lets any node create, with max 1), with a pause and an escape sequence in it. By name
/// alone that read as the group's pause: `status` showed the attacker's text as a pause and
/// `rebootctl resume --group` would have deleted nothing of the attacker's. Now it is no pause:
/// the fleet rolls, and `status` says the group is not paused.
#[tokio::test]
async fn a_forged_pause_lease_pauses_nothing_and_shows_nothing() {
    let fleet = fleet_of_two().await;
    let leases = attacker(&fleet).await;
    let pause = json!({"since": "2026-11-27T00:00:00Z",
                       "reason": "\u{1b}]0;owned\u{7}security freeze", "by": "admin"});
    attacker_creates(
        &leases,
        json!({
            "metadata": {
                "name": "rebootd-paused", "namespace": "rebootd",
                "labels": {"rebootd.io/semaphore": "rebootd-paused", "rebootd.io/role": "control"},
                "annotations": {"rebootd.io/max": "1", "rebootd.io/paused": pause.to_string()},
            },
            "spec": {},
        }),
    )
    .await;
    {
        let node = fleet.nodes[0].lock().await;
        let json = status_json(&node).await;
        assert!(json["group_paused"].is_null(), "{json}");
        let (code, out, err) = rebootctl(&node, &["status"]).await;
        assert_eq!(code, 0, "{err}");
        assert!(
            !out.contains("security freeze") && !out.contains('\u{1b}'),
            "{out}"
        );
    }
    fleet.trigger_all("2").await.unwrap();
    fleet.wait_rolled(Duration::from_secs(60)).await.unwrap();
    assert_eq!(
        down_together(&fleet.events()),
        Vec::<(String, String)>::new()
    );
}

/// The slot count is the administrator's: a node may create the control Lease only with max 1,
/// so it cannot make the group read as broken (no max) before the administrator writes one.
#[tokio::test]
async fn a_node_cannot_create_a_control_lease_without_a_max() {
    let (api, _) = admission::enforcing_api().await;
    let leases: Api<Lease> = Api::namespaced(admission::client_as(&api, "node-x").await, "rebootd");
    let control = |annotations: serde_json::Value| -> Lease {
        serde_json::from_value(json!({
            "metadata": {"name": "rebootd", "namespace": "rebootd",
                         "labels": {"rebootd.io/semaphore": "rebootd", "rebootd.io/role": "control"},
                         "annotations": annotations},
            "spec": {},
        }))
        .unwrap()
    };
    let err = leases
        .create(&PostParams::default(), &control(json!({})))
        .await
        .expect_err("a control Lease without a max");
    assert_eq!(rebootd::kube_client::status_code(&err), Some(422), "{err}");
    leases
        .create(
            &PostParams::default(),
            &control(json!({"rebootd.io/max": "1"})),
        )
        .await
        .expect("a control Lease with max 1, as the first rebootd writes it");
}

/// Every test the threat table in `deploy/kubernetes/README.md` names exists, so the table
/// cannot point at nothing.
#[test]
fn the_threat_table_names_tests_that_exist() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(root.join("deploy/kubernetes/README.md")).unwrap();
    let table: Vec<&str> = readme
        .lines()
        .skip_while(|l| !l.starts_with("## What a stolen node credential"))
        .take_while(|l| !l.starts_with("### "))
        .filter(|l| l.starts_with("| "))
        .collect();
    assert!(table.len() > 10, "the table is gone");
    let mut named = 0;
    for cell in table
        .iter()
        .filter_map(|l| l.trim_end_matches('|').rsplit('|').next())
    {
        for reference in cell.split('`').skip(1).step_by(2) {
            let parts: Vec<&str> = reference.split("::").collect();
            let (file, name) = match parts.as_slice() {
                [f @ ("kube_admission" | "kube_attacks"), n] => (format!("tests/{f}.rs"), *n),
                ["arbiter", "tests", n] => ("src/lock/arbiter/tests.rs".to_owned(), *n),
                ["arbiter", m, "tests", n] => (format!("src/lock/arbiter/{m}.rs"), *n),
                // A scenario run on every store: its file, the store's module, its name.
                [f @ ("lock_conformance" | "lock_zones"), _, n] => (format!("tests/{f}.rs"), *n),
                ["kube_lease", "snapshot", "tests", n] => {
                    ("src/lock/kube_lease/snapshot.rs".to_owned(), *n)
                }
                ["text", "tests"] => ("src/text.rs".to_owned(), "mod tests"),
                [n] if !n.contains(' ')
                    && n.chars().all(|c| c.is_ascii_lowercase() || c == '_') =>
                {
                    // A bare name continues the file named before it in the cell.
                    let file = cell
                        .split('`')
                        .skip(1)
                        .step_by(2)
                        .filter_map(|r| r.split_once("::").map(|(f, _)| f))
                        .next()
                        .unwrap_or("kube_admission");
                    (format!("tests/{file}.rs"), *n)
                }
                _ => panic!("unknown reference `{reference}` in the threat table"),
            };
            let text = std::fs::read_to_string(root.join(&file)).unwrap();
            let needle = if name == "mod tests" {
                name.to_owned()
            } else {
                format!("fn {name}(")
            };
            assert!(
                text.contains(&needle),
                "the threat table names {name} in {file}: no such test"
            );
            named += 1;
        }
    }
    assert!(named >= 12, "only {named} tests named");
}
