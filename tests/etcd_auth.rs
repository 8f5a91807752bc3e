//! The etcd users and roles of docs/etcd-security.md against real etcd 3.4 and 3.5: the
//! document's own command blocks, run as written (`sh`, `etcdctl`, `curl`), turn authentication
//! on and make the `rebootd-node` role and one user per node; real rebootd processes, each logging
//! in as its own user, reboot in turn through the semaphore (queueing behind each other); the
//! role refuses what the document says it refuses, and still allows what it says a stolen node
//! user can do; and what rebootd says when a role lacks read on the range it watches. No sleeps:
//! every wait is a watch of etcd, a logind call, a state file or the end of a call.

mod common;

use std::path::Path;
use std::time::Duration;

use common::etcd::etcd_versions as versions;
use common::in_process::machine as me;
use common::*;
use rebootd::clients::etcd_v2::{Action, Get, KeysClient, Settings};
use rebootd::config;
use rebootd::http::TlsFiles;
use rebootd::lock::document::{holder_record_key, semaphore_key};
use rebootd::lock::etcd_v2::tree;
use rebootd::lock::etcd_v3::{EtcdSemaphore, Timeouts};
use rebootd::lock::{LockError, Semaphore};
use rebootd::state::Phase;
use rebootd_lab::etcd::{EtcdOptions, EtcdServer};
use rebootd_lab::fleet::{FleetLock, FleetOptions};

const NEED: &str = "UPDATE_STATUS_UPDATED_NEED_REBOOT";
const P: &str = "coreos.com/updateengine/rebootlock";

/// The shell block of docs/etcd-security.md that follows the line
/// `<!-- tests/etcd_auth.rs runs this block: NAME -->`.
fn doc_block(name: &str) -> String {
    let doc = include_str!("../docs/etcd-security.md");
    let marker = format!("<!-- tests/etcd_auth.rs runs this block: {name} -->\n```sh\n");
    let start = doc
        .find(&marker)
        .unwrap_or_else(|| panic!("docs/etcd-security.md has no block {name}"))
        + marker.len();
    let len = doc[start..].find("```").expect("the block ends");
    doc[start..start + len].to_owned()
}

fn password(dir: &Path, file: &str) -> String {
    std::fs::read_to_string(dir.join(file))
        .unwrap_or_else(|e| panic!("{file}: {e}"))
        .trim()
        .to_owned()
}

/// `etcdctl ARGS` as `user`: (success, stdout and stderr).
fn ctl_as(etcd: &EtcdServer, user: &str, pw: &str, args: &[&str]) -> (bool, String) {
    let out = etcd.etcdctl_as(user, pw).args(args).output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

fn refused(what: &str, (ok, text): (bool, String)) {
    assert!(!ok, "{what}: allowed\n{text}");
    assert!(text.contains("permission denied"), "{what}: {text}");
}

fn allowed(what: &str, (ok, text): (bool, String)) {
    assert!(ok, "{what}: refused\n{text}");
}

fn root_get(etcd: &EtcdServer, key: &str) -> String {
    etcd.etcdctl_run(&["get", "--print-value-only", key])
        .unwrap()
        .trim()
        .to_owned()
}

/// Three real rebootd processes, each its own etcd user made by the document's v3 block, share
/// one slot: every node reboots once, never two at once, two of them queueing (leases, the
/// watch of the group's range) while one holds it, and no node is ever refused anything.
/// Then, as node-1's user: what the role refuses, and what a stolen node user can still do.
#[tokio::test]
async fn per_node_users_under_the_documented_v3_role_reboot_in_turn() {
    for v in versions() {
        let fleet = ready_fleet(FleetOptions {
            nodes: 3,
            max: 1,
            lock: FleetLock::Etcd(v),
            reboot_time: Duration::from_millis(300),
            etcd_users: Some(doc_block("v3")),
            ..FleetOptions::default()
        })
        .await;
        fleet.trigger_all("100.0").await.unwrap();
        fleet.wait_rolled(Duration::from_secs(120)).await.unwrap();
        assert_eq!(fleet.max_holders_seen(), 1, "{v}: {:?}", fleet.events());
        for n in &fleet.nodes {
            let n = n.lock().await;
            assert_eq!(n.logind.reboot_calls().len(), 1, "{v}: {}", n.name);
            assert!(
                !n.log().contains("permission denied"),
                "{v}: {} was refused something:\n{}",
                n.name,
                n.log()
            );
        }

        let etcd = fleet.etcd.as_ref().unwrap();
        let pw = password(fleet.dir(), "node-1.etcd-password");
        let node = |args: &[&str]| ctl_as(etcd, "node-1", &pw, args);
        let doc = format!("{P}/semaphore");
        let pause = format!("{P}/rebootd/control/paused");

        // Refused: anything outside the group's keys, the pause, another group, users and roles.
        etcd.etcdctl_run(&["put", "some/other/key", "x"]).unwrap();
        refused("delete another key", node(&["del", "some/other/key"]));
        refused("write another key", node(&["put", "some/other/key", "y"]));
        refused("read another key", node(&["get", "some/other/key"]));
        assert_eq!(root_get(etcd, "some/other/key"), "x", "{v}");
        refused("put the pause", node(&["put", &pause, "{}"]));
        refused(
            "another group's document",
            node(&["put", &semaphore_key("other"), "{}"]),
        );
        refused(
            "add a user",
            node(&["user", "add", "intruder", "--new-user-password=x"]),
        );
        refused(
            "widen the role",
            node(&[
                "role",
                "grant-permission",
                "rebootd-node",
                "readwrite",
                "--prefix",
                "",
            ]),
        );
        {
            let n1 = fleet.nodes[0].lock().await;
            let (code, _, err) = rebootctl(&n1, &["pause", "--group", "--reason", "x"]).await;
            assert_ne!(code, 0, "{v}: a node user paused the group");
            assert!(err.contains("permission denied"), "{v}: {err}");
            let (code, out, err) = rebootctl(&n1, &["status"]).await;
            assert_eq!(code, 0, "{v}: status as a node user: {err}");
            assert!(out.contains("1 of 1 slots free"), "{v}: {out}");
            // The fleet view, as a node user: each node's record, written under the role.
            let (code, out, err) = rebootctl(&n1, &["fleet", "--json"]).await;
            assert_eq!(code, 0, "{v}: fleet as a node user: {err}");
            let view: serde_json::Value = serde_json::from_str(&out).unwrap();
            let rebooted = view["nodes"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|n| n["record"] == "ok" && n["last_reboot"].is_string())
                .count();
            assert_eq!(rebooted, 3, "{v}: {view:#}");
        }

        // Still allowed, the residual risk the document states: the document itself (every
        // node writes it), and every holder record of the group.
        let other_id = fleet.nodes[1].lock().await.machine_id.clone();
        let forged = format!(r#"{{"semaphore":2,"max":3,"holders":["{other_id}"]}}"#);
        allowed("rewrite the document", node(&["put", &doc, &forged]));
        assert_eq!(root_get(etcd, &doc), forged, "{v}");
        let record = holder_record_key("default", &other_id);
        allowed(
            "forge another holder's record",
            node(&["put", &record, "{}"]),
        );
        allowed("delete another holder's record", node(&["del", &record]));
        let fleet_record = rebootd::lock::etcd_v3::members::key("default", &other_id);
        allowed(
            "forge another node's fleet record",
            node(&["put", &fleet_record, "{}"]),
        );
    }
}

fn timeouts() -> Timeouts {
    Timeouts {
        connect: Duration::from_secs(2),
        request: Duration::from_secs(3),
        backoff_min: Duration::from_millis(50),
        backoff_max: Duration::from_millis(500),
        queue_ttl: Duration::from_secs(10),
    }
}

/// A role with read and write on each of rebootd's keys but not read on the range between
/// them lets a node take a free slot, but etcd refuses the watch a waiter needs: the wait ends
/// at once with an error saying which range needs read, not in retries as if etcd were down.
#[tokio::test]
async fn a_role_without_read_on_the_whole_range_is_told_so() {
    for v in versions() {
        let mut etcd = EtcdServer::start_with(v, EtcdOptions::default())
            .await
            .unwrap();
        etcd.enable_auth("rootpw").unwrap();
        let pause = format!("{P}/rebootd/control/paused");
        for args in [
            vec!["role", "add", "keys-only"],
            vec!["role", "grant-permission", "keys-only", "read", &pause],
            vec![
                "role",
                "grant-permission",
                "keys-only",
                "readwrite",
                "coreos.com/updateengine/rebootlock/semaphore",
            ],
            vec![
                "role",
                "grant-permission",
                "keys-only",
                "readwrite",
                "--prefix",
                "coreos.com/updateengine/rebootlock/rebootd/holders/",
            ],
            vec![
                "role",
                "grant-permission",
                "keys-only",
                "readwrite",
                "--prefix",
                "coreos.com/updateengine/rebootlock/rebootd/waiters/",
            ],
            vec![
                "user",
                "add",
                "node-a",
                "--interactive=false",
                "--new-user-password",
                "pa",
            ],
            vec!["user", "grant-role", "node-a", "keys-only"],
        ] {
            etcd.etcdctl_run(&args).unwrap();
        }
        let dir = tempfile::tempdir().unwrap();
        let connect = |user: &str, pw: &str| {
            let file = dir.path().join(format!("{user}.password"));
            std::fs::write(&file, pw).unwrap();
            let settings = config::Etcd {
                username: Some(user.into()),
                password_file: Some(file),
                ..etcd.lock_settings(config::EtcdApi::V3)
            };
            async move {
                EtcdSemaphore::connect_with(&settings, "default", None, timeouts())
                    .await
                    .unwrap()
            }
        };
        let node = connect("node-a", "pa").await;
        let holder = connect("root", "rootpw").await;
        // A free slot: taken and given back without a watch.
        node.acquire(&me("a")).await.expect("take a free slot");
        node.release(&me("a")).await.unwrap();

        holder.acquire(&me("h")).await.unwrap();
        let waited = tokio::time::timeout(WAIT, node.acquire(&me("a"))).await;
        let err = waited
            .expect("the wait ends instead of retrying")
            .expect_err("refused");
        eprintln!("{v}: {err}");
        assert!(matches!(err, LockError::Backend { .. }), "{v}: {err}");
        let text = err.to_string();
        assert!(text.contains("permission denied watching"), "{v}: {text}");
        assert!(
            text.contains(&pause) && text.contains("rebootlock/semaphore"),
            "{v}: {text}"
        );
    }
}

/// `[lock.etcd] api = "v2"` nodes, each its own v2 user made by the document's v2 block: the
/// first holds the slot, the second queues (an in-order key under its own user) and takes it
/// once the first has rebooted. v2 authentication is v2's own: v3's does not close the v2 keys,
/// and v2's leaves them open to requests without a user until `guest` is revoked (as the block
/// does). What the v2 role refuses and still allows.
#[tokio::test]
async fn per_node_v2_users_under_the_documented_v2_role() {
    for v in versions() {
        // Authentication on in v2 with `guest` as etcd leaves it: open to anyone.
        let mut open = EtcdServer::start_with(v, EtcdOptions::v2()).await.unwrap();
        let root = r#"{"user":"root","password":"r"}"#;
        assert!(open
            .curl_v2("PUT", "/v2/auth/users/root", Some(root))
            .is_ok());
        assert!(open.curl_v2("PUT", "/v2/auth/enable", Some("")).is_ok());
        open.v2_auth_turned_on("r");
        let (code, body) = open
            .curl_v2_as(None, "PUT", "/v2/keys/anyone", Some("value=x"))
            .unwrap();
        assert_eq!(code, 201, "{v}: guest is open until revoked: {body}");
        drop(open);

        let mut etcd = EtcdServer::start_with(v, EtcdOptions::v2()).await.unwrap();
        // v3 authentication on: the v2 keys stay open to anyone.
        etcd.enable_auth("rootpw").unwrap();
        let doc = format!("/{P}/semaphore");
        let (code, body) = etcd
            .curl_v2_as(None, "PUT", &format!("/v2/keys{doc}"), Some("value=x"))
            .unwrap();
        assert_eq!(code, 201, "{v}: v3 auth does not close v2: {body}");
        let (code, _) = etcd
            .curl_v2_as(None, "DELETE", &format!("/v2/keys{doc}"), None)
            .unwrap();
        assert_eq!(code, 200, "{v}");

        let dir = tempfile::tempdir().unwrap();
        etcd.shell(&doc_block("v2"), dir.path()).unwrap();
        etcd.v2_auth_turned_on(&password(dir.path(), "v2-root.password"));
        let (code, _) = etcd
            .curl_v2_as(None, "GET", &format!("/v2/keys{doc}"), None)
            .unwrap();
        assert_eq!(code, 401, "{v}: guest revoked");

        let config = |name: &str| {
            format!(
                "[lock]\nbackend = \"etcd\"\n\n[lock.etcd]\napi = \"v2\"\nendpoints = [{:?}]\n\
                 username = {name:?}\npassword_file = {:?}\n",
                etcd.endpoint(),
                dir.path().join(format!("{name}.etcd-password"))
            )
        };
        let mut n1 = node("node-1", &config("node-1")).await;
        let mut n2 = node("node-2", &config("node-2")).await;
        n1.wait_ready(WAIT).await.unwrap();
        n2.wait_ready(WAIT).await.unwrap();
        let mut calls1 = n1.logind.subscribe();
        let mut calls2 = n2.logind.subscribe();
        n1.update_engine.set_status(NEED, "1").await.unwrap();
        next_reboot(&n1, &mut calls1, WAIT).await;

        // node-2 queues, under its own user: its in-order key appears in the queue (watched as
        // root from etcd's index before node-2 is told to reboot).
        let root = KeysClient::new(&Settings {
            endpoints: vec![etcd.endpoint()],
            tls: TlsFiles {
                table: "test",
                ..TlsFiles::default()
            },
            basic_auth: Some(("root".into(), password(dir.path(), "v2-root.password"))),
            ..Settings::default()
        })
        .unwrap();
        let mut from = root.get(&doc, Get::default()).await.unwrap().etcd_index + 1;
        n2.update_engine.set_status(NEED, "1").await.unwrap();
        let queue = tree::Keys::new("default").queue;
        let queued = tokio::time::timeout(WAIT, async {
            loop {
                let Some(r) = root.watch(&queue, true, from).await.unwrap() else {
                    continue;
                };
                from = r.node.modified_index + 1;
                if r.action == Action::Create
                    && r.node
                        .value
                        .as_deref()
                        .unwrap_or("")
                        .contains(&n2.machine_id)
                {
                    return;
                }
            }
        })
        .await;
        assert!(queued.is_ok(), "{v}: node-2 queued no entry");
        n2.wait_state("wait for the slot", WAIT, |s| {
            s.phase == Phase::AcquiringSlot
        })
        .await
        .unwrap();

        n1.reboot().await.unwrap();
        next_reboot(&n2, &mut calls2, WAIT).await;
        n2.reboot().await.unwrap();
        for n in [&n1, &n2] {
            n.wait_state("complete its reboot", WAIT, |s| {
                s.phase == Phase::Idle && s.last_reboot.is_some() && !s.slot_held
            })
            .await
            .unwrap();
            assert!(
                !n.log().contains("etcd error 110"),
                "{v}: {} was refused something:\n{}",
                n.name,
                n.log()
            );
        }

        // As node-1's v2 user: refused outside the role, allowed on the document.
        let pw = password(dir.path(), "node-1.etcd-password");
        let as_node = |method: &str, key: &str, body: Option<&str>| {
            etcd.curl_v2_as(
                Some(("node-1", &pw)),
                method,
                &format!("/v2/keys{key}"),
                body,
            )
            .unwrap()
        };
        etcd.curl_v2("PUT", "/v2/keys/some/other/key", Some("value=x"))
            .unwrap();
        for (method, key) in [
            ("DELETE", "/some/other/key".to_owned()),
            ("PUT", "/some/other/key".to_owned()),
            ("PUT", format!("/{P}/rebootd/control/paused")),
            ("PUT", format!("/{}", semaphore_key("other"))),
        ] {
            let (code, body) = as_node(method, &key, Some("value=y"));
            assert_eq!(code, 401, "{v}: {method} {key} as node-1: {body}");
        }
        let forged = r#"{"semaphore":5,"max":5,"holders":null}"#;
        let (code, body) = as_node("PUT", &doc, Some(&format!("value={forged}")));
        assert_eq!(code, 200, "{v}: a node user rewrites the document: {body}");
        // v2 users are not v3's: node-1 has no v3 user here.
        let (ok, text) = ctl_as(&etcd, "node-1", &pw, &["get", &doc]);
        assert!(!ok && text.contains("authentication failed"), "{v}: {text}");
    }
}
