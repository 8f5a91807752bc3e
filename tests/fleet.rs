//! Fleet tests: several real rebootd processes sharing a real etcd (3.4 and 3.5) semaphore in
//! locksmith's format, with an outside watcher checking the invariants.

mod common;

use common::etcd::etcd_versions as versions;
use common::*;
use rebootd::lock::document::semaphore_key;
use rebootd::state::Phase;
use rebootd_lab::etcd::EtcdVersion;
use rebootd_lab::fleet::{Fleet, FleetEvent, FleetLock, FleetOptions};
use std::time::Duration;

const NEED: &str = "UPDATE_STATUS_UPDATED_NEED_REBOOT";
const KEY: &str = "coreos.com/updateengine/rebootlock/semaphore";

async fn fleet(version: EtcdVersion, nodes: usize, max: u64, group: &str) -> Fleet {
    ready_fleet(FleetOptions {
        nodes,
        max,
        lock: FleetLock::Etcd(version),
        reboot_time: Duration::from_millis(300),
        group: group.to_string(),
        ..FleetOptions::default()
    })
    .await
}

fn get(fleet: &Fleet, key: &str) -> String {
    fleet
        .etcd
        .as_ref()
        .unwrap()
        .etcdctl_run(&["get", "--print-value-only", key])
        .unwrap()
        .trim()
        .to_string()
}

fn put(fleet: &Fleet, key: &str, value: &str) {
    fleet
        .etcd
        .as_ref()
        .unwrap()
        .etcdctl_run(&["put", key, value])
        .unwrap();
}

/// Parse a value strictly as locksmith's document: exactly semaphore, max, holders.
fn locksmith_doc(text: &str) -> (i64, u64, Vec<String>) {
    let v: serde_json::Value = serde_json::from_str(text).unwrap();
    let obj = v.as_object().unwrap();
    let mut keys: Vec<_> = obj.keys().cloned().collect();
    keys.sort();
    assert_eq!(keys, ["holders", "max", "semaphore"], "{text}");
    let holders = match &obj["holders"] {
        serde_json::Value::Null => vec![],
        h => h
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_str().unwrap().to_string())
            .collect(),
    };
    (
        obj["semaphore"].as_i64().unwrap(),
        obj["max"].as_u64().unwrap(),
        holders,
    )
}

#[tokio::test]
async fn rolling_reboot_of_five_nodes_with_max_two_never_exceeds_two() {
    for v in versions() {
        let fleet = fleet(v, 5, 2, "default").await;
        fleet.trigger_all("100.0").await.unwrap();
        fleet.wait_rolled(Duration::from_secs(120)).await.unwrap();
        assert!(fleet.max_holders_seen() <= 2, "{v}: {:?}", fleet.events());
        assert_eq!(fleet.max_holders_seen(), 2, "{v}: the slots were used");
        for (i, n) in fleet.nodes.iter().enumerate() {
            let n = n.lock().await;
            assert_eq!(n.logind.reboot_calls().len(), 1, "{v}: node {i}");
            assert_eq!(
                n.boots(),
                2,
                "{v}: node {i} booted twice (before and after)"
            );
        }
        let requests = fleet
            .events()
            .iter()
            .filter(|e| matches!(e, FleetEvent::RebootRequested { .. }))
            .count();
        assert_eq!(requests, 5, "{v}");
        // What rebootd left in etcd is locksmith's document, all slots free.
        let (free, max, holders) = locksmith_doc(&get(&fleet, KEY));
        assert_eq!((free, max, holders.len()), (2, 2, 0), "{v}");
    }
}

#[tokio::test]
async fn a_holder_written_by_hand_in_locksmiths_format_is_respected() {
    for v in versions() {
        let fleet = fleet(v, 1, 1, "default").await;
        put(
            &fleet,
            KEY,
            r#"{"semaphore":0,"max":1,"holders":["0123456789abcdef0123456789abcdef"]}"#,
        );
        let node = fleet.nodes[0].lock().await;
        node.update_engine.set_status(NEED, "1").await.unwrap();
        node.wait_state("waiting for a slot", WAIT, |s| {
            s.phase == Phase::AcquiringSlot
        })
        .await
        .unwrap();
        let mut reboots = node.logind.subscribe();
        assert!(node.logind.reboot_calls().is_empty());
        // locksmithctl unlock, as Go writes an empty list.
        put(&fleet, KEY, r#"{"semaphore":1,"max":1,"holders":null}"#);
        next_reboot(&node, &mut reboots, WAIT).await;
        let (free, _, holders) = locksmith_doc(&get(&fleet, KEY));
        assert_eq!(free, 0, "{v}");
        assert_eq!(holders, std::slice::from_ref(&node.machine_id), "{v}");
    }
}

#[tokio::test]
async fn a_corrupt_document_is_refused_and_left_unchanged() {
    let v = versions()[0];
    let fleet = fleet(v, 1, 1, "default").await;
    put(&fleet, KEY, r#"{"semaphore":"x"}"#);
    let node = fleet.nodes[0].lock().await;
    node.update_engine.set_status(NEED, "1").await.unwrap();
    let s = node
        .wait_state("the refusal to show in the state", WAIT, |s| {
            s.last_error
                .as_deref()
                .is_some_and(|e| e.contains("does not parse"))
        })
        .await
        .unwrap();
    assert_eq!(s.phase, Phase::AcquiringSlot);
    assert!(s.last_error.unwrap().contains(KEY));
    assert_eq!(get(&fleet, KEY), r#"{"semaphore":"x"}"#);
    assert!(node.logind.reboot_calls().is_empty());
    let (code, out, _) = rebootctl(&node, &["status"]).await;
    assert_eq!(code, 0);
    assert!(out.contains("does not parse"), "{out}");
}

#[tokio::test]
async fn killing_rebootd_while_it_holds_the_slot_keeps_the_slot() {
    let v = versions()[0];
    let fleet = fleet(v, 1, 1, "default").await;
    let mut node = fleet.nodes[0].lock().await;
    let guard = node.logind.hold_block_inhibitor("db-backup", "dumping");
    node.update_engine.set_status(NEED, "1").await.unwrap();
    node.wait_state("the slot, then waiting for the inhibitor", WAIT, |s| {
        s.slot_held
            && s.waiting_for
                .as_deref()
                .is_some_and(|w| w.contains("db-backup"))
    })
    .await
    .unwrap();
    node.kill_daemon().await;
    let (_, _, holders) = locksmith_doc(&get(&fleet, KEY));
    assert_eq!(holders, std::slice::from_ref(&node.machine_id));
    node.start_daemon().unwrap();
    node.wait_ready(WAIT).await.unwrap();
    let (_, _, holders) = locksmith_doc(&get(&fleet, KEY));
    assert_eq!(
        holders,
        [node.machine_id.clone()],
        "kept across the restart"
    );
    let mut reboots = node.logind.subscribe();
    guard.release();
    next_reboot(&node, &mut reboots, WAIT).await;
    let first = node.boot_id();
    node.reboot().await.unwrap();
    node.wait_state("idle after the reboot", WAIT, |s| {
        s.phase == Phase::Idle && s.boot_id != first
    })
    .await
    .unwrap();
    let (free, _, holders) = locksmith_doc(&get(&fleet, KEY));
    assert_eq!((free, holders.len()), (1, 0), "released after boot");
}

#[tokio::test]
async fn nodes_waiting_for_a_slot_proceed_after_an_etcd_restart() {
    for v in versions() {
        let mut fleet = fleet(v, 3, 1, "default").await;
        let guard = fleet.nodes[0]
            .lock()
            .await
            .logind
            .hold_block_inhibitor("pinned", "keeps node-1 holding");
        need_reboot(&fleet, 0, "1").await;
        fleet.nodes[0]
            .lock()
            .await
            .wait_state("node-1 holds", WAIT, |s| s.slot_held)
            .await
            .unwrap();
        for n in &fleet.nodes[1..] {
            let n = n.lock().await;
            n.update_engine.set_status(NEED, "1").await.unwrap();
            n.wait_state("waiting for a slot", WAIT, |s| {
                s.phase == Phase::AcquiringSlot
            })
            .await
            .unwrap();
        }
        let etcd = fleet.etcd.as_mut().unwrap();
        etcd.stop().await.unwrap();
        etcd.restart().await.unwrap();
        drop(guard);
        fleet.wait_rolled(Duration::from_secs(120)).await.unwrap();
        assert!(fleet.max_holders_seen() <= 1, "{v}: {:?}", fleet.events());
    }
}

/// Wait (at most [`WAIT`]) until `done`, which reads what the node's log file or its state
/// directory say (neither can be awaited); fail with the node's log.
async fn until(node: &rebootd_lab::node::Node, what: &str, done: impl Fn() -> bool) {
    let deadline = std::time::Instant::now() + WAIT;
    while !done() {
        assert!(
            std::time::Instant::now() < deadline,
            "{what}\n{}",
            node.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A need noted while the node's slot wait is connecting to etcd reaches nothing that waits on
/// that connection (RELIABILITY.md, finding 20). Restarted while cut off from etcd, the node
/// waits for a slot, its wait holding the store's first connection; the triggers' needs
/// (update_engine's status at start, then `rebootctl reboot`) are noted beside it. Were that
/// step to write the node's fleet record, due again, it would wait on the connection held by a
/// wait it keeps from running: the request would never be taken, and nothing would move after
/// the cut.
#[tokio::test]
async fn a_need_noted_while_the_slot_wait_connects_does_not_stall_it() {
    use rebootd_lab::cut_proxy::{CutMode, CutProxy};
    let (etcd, _) = etcd_lock().await;
    let upstream = etcd
        .endpoint()
        .trim_start_matches("http://")
        .parse()
        .unwrap();
    let proxy = CutProxy::start(upstream).await.expect("proxy");
    let config = format!(
        "[lock]\nbackend = \"etcd\"\n\n[lock.etcd]\nendpoints = [{:?}]\n",
        proxy.url()
    );
    let mut node = node("f20", &config).await;
    node.wait_ready(WAIT).await.unwrap();
    let holder = r#"{"semaphore":0,"max":1,"holders":["0123456789abcdef0123456789abcdef"]}"#;
    etcd.etcdctl_run(&["put", KEY, holder]).unwrap();
    node.update_engine.set_status(NEED, "1").await.unwrap();
    node.wait_state("waiting for a slot", WAIT, |s| {
        s.phase == Phase::AcquiringSlot
    })
    .await
    .unwrap();
    node.kill_daemon().await;
    let waiting = "waiting for a reboot slot";
    let waited = node.log().matches(waiting).count();
    // As if the record's last write had failed: due again at the next step.
    let record = node.state_dir().join(rebootd::fleet::publish::FILE);
    std::fs::remove_file(&record).unwrap();
    proxy.cut(CutMode::Blackhole);
    node.start_daemon().unwrap();
    node.wait_ready(WAIT).await.unwrap();
    until(&node, "the slot wait after the restart", || {
        node.log().matches(waiting).count() > waited
    })
    .await;
    let (code, _, err) = rebootctl(&node, &["reboot"]).await;
    assert_eq!(code, 0, "{err}");
    let request = node.store().request_path();
    until(&node, "the request noted", || !request.exists()).await;
    proxy.restore();
    let mut reboots = node.logind.subscribe();
    etcd.etcdctl_run(&["put", KEY, r#"{"semaphore":1,"max":1,"holders":null}"#])
        .unwrap();
    next_reboot(&node, &mut reboots, WAIT).await;
}

#[tokio::test]
async fn rebootctl_shows_and_steers_the_etcd_semaphore() {
    let v = *versions().last().unwrap();
    let fleet = fleet(v, 2, 2, "blue team").await;
    let key = semaphore_key("blue team");
    assert!(key.contains("groups/blue+team/"), "{key}");
    // Both nodes take a slot and stay (an inhibitor blocks their reboot).
    let mut guards = Vec::new();
    for n in &fleet.nodes {
        let n = n.lock().await;
        guards.push(n.logind.hold_block_inhibitor("hold", "test"));
        n.update_engine.set_status(NEED, "1").await.unwrap();
        n.wait_state("holding", WAIT, |s| s.slot_held)
            .await
            .unwrap();
    }
    let node = fleet.nodes[0].lock().await;
    let (code, out, err) = rebootctl(&node, &["status", "--json"]).await;
    assert_eq!(code, 0, "{err}");
    let st: serde_json::Value = serde_json::from_str(&out).unwrap();
    let sem = &st["semaphore"];
    assert_eq!(sem["backend"], "etcd");
    assert_eq!(sem["group"], "blue team");
    assert_eq!(sem["max"], 2);
    assert_eq!(sem["free"], 0);
    let holders = sem["holders"].as_array().unwrap();
    assert_eq!(holders.len(), 2);
    assert!(holders
        .iter()
        .any(|h| h["id"] == node.machine_id.as_str() && h["node"] == "node-1"));
    assert!(
        holders.iter().all(|h| h["phase"] == "rebooting"),
        "{holders:?}"
    );
    let (_, text, _) = rebootctl(&node, &["status"]).await;
    assert!(text.contains("node-2"), "{text}");

    let (code, _, err) = rebootctl(&node, &["set-max", "1"]).await;
    assert_eq!(code, 1, "refused below the holders");
    assert!(err.contains("--force"), "{err}");
    assert_eq!(locksmith_doc(&get(&fleet, &key)).1, 2);
    let (code, _, err) = rebootctl(&node, &["set-max", "3"]).await;
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        locksmith_doc(&get(&fleet, &key)),
        (1, 3, {
            let mut h = vec![];
            for n in &fleet.nodes[1..] {
                h.push(n.lock().await.machine_id.clone());
            }
            h.push(node.machine_id.clone());
            h.sort();
            h
        })
    );
    // Both holders are in phase rebooting (their logind call held up by the inhibitor): an
    // unlock needs --force (finding 16: the record cannot tell whether logind was asked).
    let other = fleet.nodes[1].lock().await.machine_id.clone();
    let (code, _, err) = rebootctl(&node, &["unlock", &other]).await;
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("node-2") && err.contains("--force"), "{err}");
    let (code, _, err) = rebootctl(&node, &["unlock", "--force", &other]).await;
    assert_eq!(code, 0, "{err}");
    let (_, _, holders) = locksmith_doc(&get(&fleet, &key));
    assert_eq!(holders, std::slice::from_ref(&node.machine_id));
    let (code, _, err) = rebootctl(&node, &["unlock", "--force"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(locksmith_doc(&get(&fleet, &key)).2.is_empty());
    let (code, out, err) = rebootctl(&node, &["lock"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("holds a slot"));
    assert_eq!(
        locksmith_doc(&get(&fleet, &key)).2,
        std::slice::from_ref(&node.machine_id)
    );
}

/// A boot that outlasts `lock.max_hold` (the host down longer than `reboot.boot_time` said,
/// which rebootd cannot see: nothing beats while the host is down) lets the head of the queue
/// take the slot over once its own clock has seen `max_hold` of silence. What happens then is
/// bounded, as README says: exactly one host more than `max` is down, once; the late host, back,
/// learns that its slot is gone, does not reboot again, and its release gives nothing back; the
/// rollout finishes with the semaphore empty.
#[tokio::test]
async fn a_boot_longer_than_max_hold_lets_one_more_host_down_once_and_nothing_worse() {
    let version = versions()[0];
    let fleet = ready_fleet(FleetOptions {
        nodes: 2,
        max: 1,
        lock: FleetLock::Etcd(version),
        // Down 6 s, though the configuration says a boot takes no time: max_hold (2 s) passes
        // while the host is down.
        reboot_time: Duration::from_secs(6),
        lock_config: "max_hold = \"2s\"\n".into(),
        config: "[reboot]\ntimeout = \"1s\"\nboot_time = \"0s\"\nusers_warning = \"0s\"\n".into(),
        ..FleetOptions::default()
    })
    .await;
    need_reboot(&fleet, 0, "2").await;
    fleet
        .wait_state(0, "reboot", WAIT, |s| s.phase == Phase::Rebooting)
        .await
        .unwrap();
    need_reboot(&fleet, 1, "2").await;
    fleet.wait_rolled(Duration::from_secs(90)).await.unwrap();

    let events = fleet.events();
    let asked = |node: &str| {
        events
            .iter()
            .filter(|e| matches!(e, FleetEvent::RebootRequested { node: n, .. } if n == node))
            .count()
    };
    assert_eq!((asked("node-1"), asked("node-2")), (1, 1), "{events:?}");
    // node-2 went down while node-1 was still down: the one extra host, once.
    let mut down = Vec::new();
    let mut together = 0;
    for e in &events {
        match e {
            FleetEvent::RebootRequested { node, .. } => {
                together += down.len();
                down.push(node.clone());
            }
            FleetEvent::Booted { node, .. } => down.retain(|d| d != node),
            FleetEvent::Holders { .. } => {}
        }
    }
    assert_eq!(together, 1, "{events:?}");
    let (_, max, holders) = locksmith_doc(&get(&fleet, KEY));
    assert_eq!((max, holders), (1, Vec::<String>::new()));
}
