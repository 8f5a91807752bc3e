//! rebootd beside the real locksmith (flatcar/locksmith, built from ../shared/peers by
//! scripts/setup.sh): real `rebootd` processes with `[lock.etcd] api = "v2"`, the real
//! `locksmithctl` against the same etcd's v2 keys API, and real `locksmithd` nodes, each in its
//! own mount namespace on a private bus with the lab's fake update_engine and fake logind. Also
//! the move to v3 (`rebootctl migrate`) with nodes waiting, what it refuses, and the warning when
//! a v3 node finds locksmith's v2 semaphore. No sleeps: every wait is a watch of etcd, a logind
//! call, a state file or a log line.

mod common;

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{log_line, next_reboot, rebootctl, REBOOTD, WAIT};
use futures_util::StreamExt;
use rebootd::lock::document::{holder_record_key, semaphore_key, SemaphoreDoc};
use rebootd::lock::etcd_v2::tree;
use rebootd::state::Phase;
use rebootd_lab::etcd::{EtcdOptions, EtcdServer, EtcdVersion};
use rebootd_lab::locksmith::{LocksmithEtcd, LocksmithNode, Locksmithctl};
use rebootd_lab::node::{Node, NodeOptions};
use rebootd_lab::v2_watcher::{self, V2DocWatcher};

/// locksmithd retries with back-off 10 s, 20 s, ... and releases 5 s after it starts: waits
/// involving it are long.
const LOCKSMITH_WAIT: Duration = Duration::from_secs(120);
const NEED_REBOOT: &str = "UPDATE_STATUS_UPDATED_NEED_REBOOT";

async fn etcd(v: EtcdVersion) -> Option<EtcdServer> {
    common::etcd::start_etcd(v, EtcdOptions::v2()).await
}

/// A rebootd node's configuration for the etcd at `endpoint`, `api` v2 or v3.
fn config(endpoint: &str, api: &str, group: &str) -> String {
    format!(
        "[identity]\ngroup = {group:?}\n\n[lock]\nbackend = \"etcd\"\n\n[lock.etcd]\napi = {api:?}\nendpoints = [{endpoint:?}]\n"
    )
}

async fn rebootd_node(name: &str, config: &str, start: bool) -> Node {
    let mut opts = NodeOptions::new(name).config(config);
    opts.start_daemon = start;
    Node::start(Path::new(REBOOTD), opts)
        .await
        .expect("start lab node")
}

fn ctl(etcd: &EtcdServer, group: &str) -> Locksmithctl {
    let g = if group == "default" { "" } else { group };
    Locksmithctl::new(LocksmithEtcd::new(&etcd.endpoint(), g)).expect("locksmithctl")
}

fn v2_key(group: &str) -> String {
    format!("/{}", semaphore_key(group))
}

/// A completed reboot: idle again after a reboot, slot given back.
fn done(s: &rebootd::state::State) -> bool {
    s.phase == Phase::Idle && s.last_reboot.is_some() && !s.slot_held
}

/// The lab's locksmithd node does what locksmithd does on a host: on update_engine's "reboot
/// needed" it takes a slot in the v2 semaphore (creating the document), calls logind's
/// `Reboot(false)`, and after its restart releases its slot.
#[tokio::test]
async fn a_lab_locksmithd_node_takes_the_v2_slot_reboots_and_releases_it() {
    let Some(etcd) = etcd(EtcdVersion::V35).await else {
        return;
    };
    let ep = LocksmithEtcd::new(&etcd.endpoint(), "");
    let ctl = Locksmithctl::new(ep.clone()).expect("locksmithctl");
    let mut node = LocksmithNode::start("locksmith-1", ep)
        .await
        .expect("start locksmithd");
    let mut calls = node.logind.subscribe();
    // locksmithctl creates the document if absent (max 1).
    assert_eq!(ctl.status().await.unwrap().max, 1);
    let watcher = V2DocWatcher::start(&etcd.endpoint(), &v2_key("default"))
        .await
        .unwrap();

    node.trigger("1.2.3").await.unwrap();
    let call = tokio::time::timeout(LOCKSMITH_WAIT, calls.recv())
        .await
        .unwrap_or_else(|_| panic!("no reboot call; locksmithd log:\n{}", node.log()))
        .unwrap();
    assert_eq!(call.method, "Reboot");
    let held = ctl.status().await.unwrap();
    assert_eq!(
        held.holders,
        [node.machine_id.clone()],
        "the holder is its machine id"
    );
    assert_eq!(held.available, 0);

    node.reboot().await.unwrap();
    watcher
        .wait_for("no holders", LOCKSMITH_WAIT, |v| {
            v.holders().is_some_and(|h| h.is_empty())
        })
        .await
        .unwrap_or_else(|e| panic!("{e}\nlocksmithd log:\n{}", node.log()));
    assert_eq!(watcher.max_holders_seen(), 1);
    assert_eq!(node.boots(), 2);
}

/// `locksmithctl lock` -> a rebootd node waits (one long poll, no requests while nothing
/// changes); `locksmithctl unlock` -> it takes the slot, after the unlock in etcd's order; while
/// it holds, `locksmithctl lock` is refused and `locksmithctl status` lists it; back from its
/// reboot it gives the slot back.
#[tokio::test]
async fn rebootd_waits_behind_a_locksmith_holder_and_takes_the_slot_when_it_is_unlocked() {
    let Some(etcd) = etcd(EtcdVersion::V35).await else {
        return;
    };
    let ctl = ctl(&etcd, "default");
    assert!(ctl.run(&["lock", "locksmith-node"]).await.unwrap().success);
    let watcher = V2DocWatcher::start(&etcd.endpoint(), &v2_key("default"))
        .await
        .unwrap();
    let mut node = rebootd_node("rb-1", &config(&etcd.endpoint(), "v2", "default"), true).await;
    let mut calls = node.logind.subscribe();
    node.wait_ready(WAIT).await.unwrap();
    node.update_engine
        .set_status(NEED_REBOOT, "1.2.3")
        .await
        .unwrap();
    node.wait_state("wait for a slot", WAIT, |s| s.phase == Phase::AcquiringSlot)
        .await
        .unwrap();
    let queue = tree::Keys::new("default").queue;
    let entries = v2_watcher::wait_dir_len(&etcd.endpoint(), &queue, 1, WAIT)
        .await
        .unwrap();
    assert!(entries[0].contains(&node.machine_id), "{entries:?}");

    // Nothing changes for 3 s of etcd's own time: a poller would ask; the waiter's long poll
    // is pending. (The clock costs 2 requests; allow the waiter one, the long poll following
    // the one its own queue entry ended.)
    let before = etcd.v2_requests().unwrap();
    v2_watcher::etcd_clock(&etcd.endpoint(), Duration::from_secs(3))
        .await
        .unwrap();
    let quiet = etcd.v2_requests().unwrap().saturating_sub(before);
    assert!(
        quiet <= 3,
        "{quiet} v2 requests (2 of them the clock's) while nothing changed"
    );
    assert!(node.logind.reboot_calls().is_empty());

    assert!(
        ctl.run(&["unlock", "locksmith-node"])
            .await
            .unwrap()
            .success
    );
    next_reboot(&node, &mut calls, WAIT).await;
    let history: Vec<Vec<String>> = watcher
        .history()
        .iter()
        .filter_map(|v| v.holders())
        .collect();
    let freed = history.iter().position(|h| h.is_empty()).expect("freed");
    let taken = history
        .iter()
        .position(|h| h == std::slice::from_ref(&node.machine_id))
        .expect("taken");
    assert!(freed < taken, "{history:?}");

    // While rebootd holds the slot (across its reboot).
    let refused = ctl.run(&["lock", "other-machine"]).await.unwrap();
    assert!(!refused.success, "{refused:?}");
    assert!(refused.stderr.contains("semaphore is at 0"), "{refused:?}");
    let status = ctl.status().await.unwrap();
    assert_eq!(status.holders, [node.machine_id.clone()]);
    let (code, out, err) = rebootctl(&node, &["status"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("held") && out.contains("by rb-1"), "{out}");

    node.reboot().await.unwrap();
    node.wait_state("complete its reboot", WAIT, done)
        .await
        .unwrap();
    assert!(ctl.status().await.unwrap().holders.is_empty());
    assert_eq!(watcher.max_holders_seen(), 1);
}

/// `rebootctl status|unlock|set-max|lock` on v2 and `locksmithctl` agree in both directions, in
/// a named group (the default group is another semaphore, untouched).
#[tokio::test]
async fn rebootctl_and_locksmithctl_agree_in_a_named_group() {
    let Some(etcd) = etcd(EtcdVersion::V34).await else {
        return;
    };
    let group = "workers";
    let node = rebootd_node("rb-ctl", &config(&etcd.endpoint(), "v2", group), false).await;
    let ctl = ctl(&etcd, group);
    let json = |out: &str| -> serde_json::Value { serde_json::from_str(out).unwrap() };

    // locksmith -> rebootd
    let out = ctl.run(&["set-max", "3"]).await.unwrap();
    assert!(out.success, "{out:?}");
    assert!(ctl.run(&["lock", "locksmith-a"]).await.unwrap().success);
    let (code, out, err) = rebootctl(&node, &["status", "--json"]).await;
    assert_eq!(code, 0, "{err}");
    let s = json(&out);
    assert_eq!(s["semaphore"]["max"], 3, "{out}");
    assert_eq!(s["semaphore"]["free"], 2, "{out}");
    assert_eq!(s["semaphore"]["group"], group, "{out}");
    assert_eq!(s["semaphore"]["holders"][0]["id"], "locksmith-a", "{out}");

    // rebootctl unlock of a locksmith holder
    let (code, _, err) = rebootctl(&node, &["unlock", "locksmith-a"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(ctl.status().await.unwrap().holders.is_empty());

    // rebootd -> locksmith
    let (code, _, err) = rebootctl(&node, &["set-max", "2"]).await;
    assert_eq!(code, 0, "{err}");
    let c = ctl.status().await.unwrap();
    assert_eq!((c.max, c.available), (2, 2));
    let (code, _, err) = rebootctl(&node, &["lock"]).await;
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        ctl.status().await.unwrap().holders,
        vec![node.machine_id.clone()]
    );
    assert!(ctl.run(&["lock", "locksmith-b"]).await.unwrap().success);
    let (code, _, err) = rebootctl(&node, &["set-max", "1"]).await;
    assert_eq!(code, 1, "below the holders without --force: {err}");
    assert!(err.contains("--force"), "{err}");
    let (code, _, err) = rebootctl(&node, &["unlock"]).await;
    assert_eq!(code, 0, "{err}");
    assert_eq!(ctl.status().await.unwrap().holders, ["locksmith-b"]);

    // The default group: its own document, untouched by all this.
    let d = self::ctl(&etcd, "default").status().await.unwrap();
    assert_eq!((d.max, d.holders.len()), (1, 0));
}

/// What happened in a mixed fleet, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Seen {
    Reboot(String),
    Back(String),
}

/// A mixed fleet on one v2 semaphore with max 1: 2 real locksmithd and 2 rebootd nodes, all
/// needing a reboot. Each reboots once, and the semaphore never has two holders: never two
/// nodes between taking the slot and coming back.
#[tokio::test]
async fn a_mixed_fleet_of_locksmithd_and_rebootd_nodes_never_exceeds_max() {
    let Some(etcd) = etcd(EtcdVersion::V34).await else {
        return;
    };
    let ctl = ctl(&etcd, "default");
    let out = ctl.run(&["set-max", "1"]).await.unwrap();
    assert!(out.success, "{out:?}");
    let watcher = V2DocWatcher::start(&etcd.endpoint(), &v2_key("default"))
        .await
        .unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    let mut names = Vec::new();

    let ep = LocksmithEtcd::new(&etcd.endpoint(), "");
    let mut locksmiths = Vec::new();
    for i in 1..=2 {
        let node = LocksmithNode::start(&format!("locksmith-{i}"), ep.clone())
            .await
            .expect("start locksmithd");
        names.push((node.machine_id.clone(), node.name.clone()));
        let mut calls = node.logind.subscribe();
        let node = Arc::new(tokio::sync::Mutex::new(node));
        let (n, seen) = (node.clone(), seen.clone());
        tasks.push(tokio::spawn(async move {
            while calls.recv().await.is_ok() {
                let mut node = n.lock().await;
                seen.lock().unwrap().push(Seen::Reboot(node.name.clone()));
                node.reboot().await.expect("restart locksmithd");
            }
        }));
        locksmiths.push(node);
    }
    let mut rebootds = Vec::new();
    for i in 1..=2 {
        let node = rebootd_node(
            &format!("rebootd-{i}"),
            &config(&etcd.endpoint(), "v2", "default"),
            true,
        )
        .await;
        node.wait_ready(WAIT).await.unwrap();
        names.push((node.machine_id.clone(), node.name.clone()));
        let mut calls = node.logind.subscribe();
        let node = Arc::new(tokio::sync::Mutex::new(node));
        let (n, seen) = (node.clone(), seen.clone());
        tasks.push(tokio::spawn(async move {
            while calls.recv().await.is_ok() {
                let mut node = n.lock().await;
                seen.lock().unwrap().push(Seen::Reboot(node.name.clone()));
                node.reboot().await.expect("reboot rebootd node");
                seen.lock().unwrap().push(Seen::Back(node.name.clone()));
            }
        }));
        rebootds.push(node);
    }

    // locksmith-1 first (it takes the free slot at once), then everyone.
    locksmiths[0].lock().await.trigger("2.0.0").await.unwrap();
    watcher
        .wait_for("a holder", LOCKSMITH_WAIT, |v| {
            v.holders().is_some_and(|h| !h.is_empty())
        })
        .await
        .unwrap();
    locksmiths[1].lock().await.trigger("2.0.0").await.unwrap();
    for n in &rebootds {
        n.lock()
            .await
            .update_engine
            .set_status(NEED_REBOOT, "2.0.0")
            .await
            .unwrap();
    }

    // Every rebootd node completes; every locksmithd node rebooted and gave its slot back.
    for n in &rebootds {
        let (store, name) = {
            let n = n.lock().await;
            (n.store(), n.name.clone())
        };
        wait_store(&store, &name, LOCKSMITH_WAIT).await;
    }
    for n in &locksmiths {
        let (id, name) = {
            let n = n.lock().await;
            (n.machine_id.clone(), n.name.clone())
        };
        watcher
            .wait_for(
                &format!("{name} to have held and released"),
                LOCKSMITH_WAIT,
                |_| {
                    let h: Vec<Vec<String>> = watcher_history_holders(&watcher);
                    let held = h.iter().position(|v| v.contains(&id));
                    held.is_some_and(|i| h[i..].iter().any(|v| !v.contains(&id)))
                },
            )
            .await
            .unwrap_or_else(|e| {
                let logs: Vec<String> = locksmiths
                    .iter()
                    .map(|n| n.try_lock().map(|n| n.log()).unwrap_or_default())
                    .collect();
                panic!("{e}\nlocksmithd logs:\n{}", logs.join("\n---\n"))
            });
    }
    for t in &tasks {
        t.abort();
    }

    let named = |holders: &[String]| -> Vec<String> {
        holders
            .iter()
            .map(|h| {
                names
                    .iter()
                    .find(|(id, _)| id == h)
                    .map_or(h.clone(), |(_, n)| n.clone())
            })
            .collect()
    };
    let history: Vec<Vec<String>> = watcher_history_holders(&watcher)
        .iter()
        .map(|h| named(h))
        .collect();
    eprintln!("holders over time: {history:?}");
    eprintln!("reboots: {:?}", seen.lock().unwrap());
    assert!(watcher.broken().is_none(), "{:?}", watcher.broken());
    assert_eq!(watcher.max_holders_seen(), 1, "{history:?}");
    // Each of the four held the slot at some point, and each rebooted exactly once.
    for (_, name) in &names {
        assert!(
            history.iter().any(|h| h == std::slice::from_ref(name)),
            "{name} never held the slot: {history:?}"
        );
        let reboots = seen
            .lock()
            .unwrap()
            .iter()
            .filter(|s| **s == Seen::Reboot(name.clone()))
            .count();
        assert_eq!(reboots, 1, "{name}: {:?}", seen.lock().unwrap());
    }
}

fn watcher_history_holders(w: &V2DocWatcher) -> Vec<Vec<String>> {
    w.history().iter().filter_map(|v| v.holders()).collect()
}

async fn wait_store(store: &rebootd::state::StateStore, name: &str, within: Duration) {
    let inotify = inotify::Inotify::init().expect("inotify");
    inotify
        .watches()
        .add(
            store.dir(),
            inotify::WatchMask::MOVED_TO | inotify::WatchMask::CLOSE_WRITE,
        )
        .expect("watch the state dir");
    let mut events = inotify.into_event_stream(vec![0u8; 4096]).expect("stream");
    let reached = tokio::time::timeout(within, async {
        loop {
            if store.load().ok().flatten().is_some_and(|s| done(&s)) {
                return;
            }
            events.next().await;
        }
    })
    .await;
    assert!(
        reached.is_ok(),
        "{name} did not complete its reboot within {within:?}: {:?}",
        store.load()
    );
}

/// The move to v3 with nodes waiting: one rebootd node holds the slot (rebooting), two wait in
/// the v2 queue. `rebootctl migrate` moves max and the holder to v3 and leaves a v2 document in
/// which locksmith can take no slot; the nodes, still configured for v2, follow to v3 by
/// themselves, one at a time.
#[tokio::test]
async fn migrate_moves_the_semaphore_to_v3_and_v2_nodes_follow() {
    let Some(etcd) = etcd(EtcdVersion::V35).await else {
        return;
    };
    let cfg = config(&etcd.endpoint(), "v2", "default");
    let mut nodes = Vec::new();
    for i in 1..=3 {
        let node = rebootd_node(&format!("mv-{i}"), &cfg, true).await;
        node.wait_ready(WAIT).await.unwrap();
        nodes.push(node);
    }
    let mut calls: Vec<_> = nodes.iter().map(|n| n.logind.subscribe()).collect();
    nodes[0]
        .update_engine
        .set_status(NEED_REBOOT, "3.0.0")
        .await
        .unwrap();
    next_reboot(&nodes[0], &mut calls[0], WAIT).await;
    for n in &nodes[1..] {
        n.update_engine
            .set_status(NEED_REBOOT, "3.0.0")
            .await
            .unwrap();
    }
    let queue = tree::Keys::new("default").queue;
    v2_watcher::wait_dir_len(&etcd.endpoint(), &queue, 2, WAIT)
        .await
        .unwrap();

    // v3: every version of the document from now on.
    let v3_holders = v3_watch(&etcd).await;
    let (code, out, err) = rebootctl(&nodes[0], &["migrate"]).await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("moved max 1"), "{out}");

    // v2: the moved marker; locksmith can take no slot, not even after set-max.
    let ctl = ctl(&etcd, "default");
    let status = ctl.status().await.unwrap();
    assert_eq!(status.holders, [tree::MOVED_HOLDER]);
    assert!(status.available < 0, "{status:?}");
    assert!(ctl.run(&["set-max", "5"]).await.unwrap().success);
    let refused = ctl.run(&["lock", "locksmith-late"]).await.unwrap();
    assert!(!refused.success, "{refused:?}");
    // v3: max and the holder, with its record.
    let doc = etcd
        .etcdctl_run(&["get", "--print-value-only", &semaphore_key("default")])
        .unwrap();
    let doc = SemaphoreDoc::parse(doc.trim().as_bytes()).unwrap();
    assert_eq!(doc.max, 1);
    assert_eq!(doc.holders, [nodes[0].machine_id.clone()]);
    let record = etcd
        .etcdctl_run(&[
            "get",
            "--print-value-only",
            &holder_record_key("default", &nodes[0].machine_id),
        ])
        .unwrap();
    assert!(record.contains("\"token\""), "{record}");

    // The holder comes back and gives its slot back in v3; the waiters follow, one at a time.
    nodes[0].reboot().await.unwrap();
    nodes[0]
        .wait_state("complete its reboot", WAIT, done)
        .await
        .unwrap();
    let mut remaining = vec![1usize, 2];
    while let Some(&a) = remaining.first() {
        let which = match remaining.get(1).copied() {
            Some(b) => {
                let (lo, hi) = calls.split_at_mut(b);
                let next = async {
                    tokio::select! {
                        r = lo[a].recv() => { r.unwrap(); a }
                        r = hi[0].recv() => { r.unwrap(); b }
                    }
                };
                tokio::time::timeout(WAIT, next).await.unwrap_or_else(|_| {
                    panic!(
                        "no waiter rebooted:\n{}\n{}",
                        nodes[a].log(),
                        nodes[b].log()
                    )
                })
            }
            None => {
                next_reboot(&nodes[a], &mut calls[a], WAIT).await;
                a
            }
        };
        nodes[which].reboot().await.unwrap();
        nodes[which]
            .wait_state("complete its reboot", WAIT, done)
            .await
            .unwrap();
        remaining.retain(|&x| x != which);
    }
    for n in &nodes {
        assert!(n.state().is_some_and(|s| done(&s)), "{}", n.log());
    }
    for n in &nodes[1..] {
        log_line(n, &["moved to etcd v3", "following it there"], WAIT).await;
    }
    // The last release lands before the watch brings it: wait for the document it wrote.
    let mut v3_holders = v3_holders;
    let last_empty = v3_holders.wait_for(|seen| seen.last().is_some_and(Vec::is_empty));
    let ended = tokio::time::timeout(WAIT, last_empty).await.is_ok();
    let seen = v3_holders.borrow().clone();
    assert!(ended, "the last version has holders: {seen:?}");
    assert!(seen.iter().all(|h| h.len() <= 1), "{seen:?}");
    assert!(is_moved(&etcd));
}

fn is_moved(etcd: &EtcdServer) -> bool {
    let (_, body) = etcd
        .curl_v2("GET", &format!("/v2/keys{}", v2_key("default")), None)
        .unwrap();
    body.contains(tree::MOVED_HOLDER)
}

/// Record the holders of every version of the v3 document, in the order the watch brings them.
async fn v3_watch(etcd: &EtcdServer) -> tokio::sync::watch::Receiver<Vec<Vec<String>>> {
    let mut client = etcd_client::Client::connect([etcd.endpoint()], None)
        .await
        .unwrap();
    let mut stream = client.watch(semaphore_key("default"), None).await.unwrap();
    let (tx, rx) = tokio::sync::watch::channel(Vec::new());
    tokio::spawn(async move {
        let _keep = client;
        while let Some(Ok(resp)) = stream.next().await {
            for e in resp.events() {
                let holders = e
                    .kv()
                    .and_then(|kv| SemaphoreDoc::parse(kv.value()).ok())
                    .map_or_else(Vec::new, |d| d.holders);
                tx.send_modify(|seen| seen.push(holders));
            }
        }
    });
    rx
}

/// `rebootctl migrate` refuses what is not safe, says why, and changes nothing: a holder that
/// locksmithd holds, and a v3 semaphore that differs from the v2 one.
#[tokio::test]
async fn migrate_refuses_a_locksmith_holder_and_a_different_v3_semaphore() {
    let Some(etcd) = etcd(EtcdVersion::V34).await else {
        return;
    };
    let node = rebootd_node(
        "mv-refuse",
        &config(&etcd.endpoint(), "v2", "default"),
        false,
    )
    .await;
    let ctl = ctl(&etcd, "default");
    assert!(
        ctl.run(&["lock", "locksmith-holder"])
            .await
            .unwrap()
            .success
    );
    let (code, _, err) = rebootctl(&node, &["migrate"]).await;
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("locksmith-holder") && err.contains("no rebootd record"),
        "{err}"
    );
    assert_eq!(ctl.status().await.unwrap().holders, ["locksmith-holder"]);
    let v3 = etcd
        .etcdctl_run(&["get", "--print-value-only", &semaphore_key("default")])
        .unwrap();
    assert_eq!(v3.trim(), "", "nothing written to v3");

    assert!(
        ctl.run(&["unlock", "locksmith-holder"])
            .await
            .unwrap()
            .success
    );
    etcd.etcdctl_run(&[
        "put",
        &semaphore_key("default"),
        r#"{"semaphore":5,"max":5,"holders":[]}"#,
    ])
    .unwrap();
    let (code, _, err) = rebootctl(&node, &["migrate"]).await;
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("holds another semaphore already"), "{err}");
    assert!(!is_moved(&etcd));
}

/// A node with api = "v3" beside locksmith's v2 semaphore says so loudly, at start and in
/// `rebootctl status`; once the v2 one is moved, it does not.
#[tokio::test]
async fn a_v3_node_warns_of_locksmiths_v2_semaphore() {
    let Some(etcd) = etcd(EtcdVersion::V35).await else {
        return;
    };
    let ctl = ctl(&etcd, "default");
    assert!(ctl.run(&["lock", "locksmith-x"]).await.unwrap().success);
    let node = rebootd_node("v3-node", &config(&etcd.endpoint(), "v3", "default"), true).await;
    node.wait_ready(WAIT).await.unwrap();
    let line = log_line(&node, &["TWO SEMAPHORES"], WAIT).await;
    assert!(
        line.contains("locksmith-x") && line.contains("rebootctl migrate"),
        "{line}"
    );
    let (code, out, err) = rebootctl(&node, &["status"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("WARNING") && out.contains("TWO SEMAPHORES"),
        "{out}"
    );
    let (_, json, _) = rebootctl(&node, &["status", "--json"]).await;
    let json: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(json["warnings"].as_array().map(Vec::len), Some(1), "{json}");

    // Moved (by a v2 node's rebootctl): no warning any more.
    assert!(ctl.run(&["unlock", "locksmith-x"]).await.unwrap().success);
    let v2 = rebootd_node("v2-node", &config(&etcd.endpoint(), "v2", "default"), false).await;
    let (code, out, err) = rebootctl(&v2, &["migrate"]).await;
    assert_eq!(code, 0, "{out}{err}");
    let (_, json, _) = rebootctl(&node, &["status", "--json"]).await;
    let json: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(json["warnings"], serde_json::json!([]), "{json}");
}
