//! `rebootctl fleet`: every node of a group as the lock store shows it, with real rebootd
//! processes on private buses against real etcd (v3 and v2, on 3.4 and 3.5) and the Lease store
//! on the Kubernetes API stand-in enforcing the shipped admission policy. One node holds a slot
//! taken by hand, one queues behind it, one waits for its window or is paused; `--watch --json`
//! follows the store until it shows what each node does and why, then the holder lets go and the
//! waiter reboots, and its record shows the reboot. A record that does not parse is shown as
//! unreadable, and its node does not write over it. A FleetLock server keeps no fleet view.

#[path = "common/admission.rs"]
mod admission;
mod common;

use common::etcd::{self as etcd, per_etcd_version, start_etcd};
use common::*;
use rebootd::state::Phase;
use rebootd_lab::etcd::{EtcdOptions, EtcdServer, EtcdVersion};
use rebootd_lab::kube_api::{Kind, KubeApiHandle};
use rebootd_lab::node::Node;
use serde_json::Value;
use tokio::io::AsyncBufReadExt;

const NEED: &str = "UPDATE_STATUS_UPDATED_NEED_REBOOT";
/// A window that never opens.
const CLOSED: &str = "[[window]]\ndays = []\nstart = \"00:00\"\nlength = \"1h\"\n";

/// `rebootctl fleet --watch --json` run as `node`'s, until a view satisfies `pred` (each line is
/// one view, drawn at a change the store reported); that view.
async fn watch_until(node: &Node, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
    let mut child = node
        .command(std::path::Path::new(REBOOTCTL))
        .args(["fleet", "--watch", "--json"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("run rebootctl fleet --watch");
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let mut last = Value::Null;
    let found = tokio::time::timeout(WAIT, async {
        while let Ok(Some(line)) = lines.next_line().await {
            last = serde_json::from_str(&line).expect("one JSON view per line");
            if pred(&last) {
                return Some(last.clone());
            }
        }
        None
    })
    .await;
    let _ = child.kill().await;
    match found {
        Ok(Some(v)) => v,
        _ => panic!("the fleet view never showed {what}; last: {last:#}"),
    }
}

/// The view's entry for the node named `name`.
fn entry<'a>(view: &'a Value, name: &str) -> &'a Value {
    view["nodes"]
        .as_array()
        .and_then(|ns| ns.iter().find(|n| n["node"] == name))
        .unwrap_or(&Value::Null)
}

/// What each store's test can do to the store beside rebootd.
trait Store {
    /// Put a value that is no node record where node `id`'s record is.
    fn corrupt(&self, id: &str, node: &str);
}

/// The scenario on `a` (running, queues), `b` (stopped, holds a slot taken by hand) and `c`
/// (running; waits for its window when `c_window`, else paused).
async fn scenario(store: &dyn Store, a: &mut Node, b: &Node, c: &Node, c_window: bool) {
    let (a_name, b_name, c_name) = (a.name.clone(), b.name.clone(), c.name.clone());
    a.wait_ready(WAIT).await.unwrap();
    c.wait_ready(WAIT).await.unwrap();
    let mut reboots = a.logind.subscribe();
    a.update_engine.set_status(NEED, "9.0").await.unwrap();
    if c_window {
        c.update_engine.set_status(NEED, "9.0").await.unwrap();
    } else {
        let (code, _, err) = rebootctl(c, &["pause", "--reason", "kernel freeze"]).await;
        assert_eq!(code, 0, "{err}");
    }
    let want = if c_window { "window" } else { "paused" };
    let view = watch_until(b, "a holder, a waiter and why the third waits", |v| {
        entry(v, &b_name)["role"] == "holder"
            && entry(v, &a_name)["role"] == "waiter"
            && entry(v, &a_name)["record"] == "ok"
            && (entry(v, &c_name)["waiting"] == want || entry(v, &c_name)["paused"].is_object())
    })
    .await;
    let (ea, ec) = (entry(&view, &a_name), entry(&view, &c_name));
    assert_eq!(
        view["nodes"][0]["node"],
        b_name.as_str(),
        "holders first: {view:#}"
    );
    assert_eq!(
        (ea["position"].as_u64(), ea["behind"].as_u64()),
        (Some(1), Some(0))
    );
    assert_eq!(ea["waiting"], "slot", "{view:#}");
    assert_eq!(ea["phase"], Phase::AcquiringSlot.as_str());
    // A waiter writes no record: since when it waits comes from its queue entry.
    assert!(ea["since"].is_string(), "{view:#}");
    assert_eq!(ec["role"], "member");
    if c_window {
        assert!(ec["detail"].as_str().unwrap().contains("window"), "{ec:#}");
    } else {
        assert_eq!(ec["paused"]["reason"], "kernel freeze", "{ec:#}");
    }
    assert_eq!(view["max"], 1);
    let (code, text, err) = rebootctl(b, &["fleet"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(text.contains("first in the queue for a slot"), "{text}");
    assert!(
        text.contains(if c_window {
            "waiting for the maintenance window"
        } else {
            "kernel freeze"
        }),
        "{text}"
    );

    if c_window {
        // c's pending reboot cancelled: shown until its next need.
        let (code, _, err) = rebootctl(c, &["cancel"]).await;
        assert_eq!(code, 0, "{err}");
        let view = watch_until(b, "c's cancel", |v| {
            entry(v, &c_name)["cancelled"].is_string()
        })
        .await;
        assert_eq!(entry(&view, &c_name)["waiting"], Value::Null, "{view:#}");
        let (_, text, _) = rebootctl(b, &["fleet"]).await;
        assert!(text.contains("reboot cancelled"), "{text}");
    }

    // c's record, made unreadable: shown so, and c does not write over it when it changes.
    let c_id = ec["id"].as_str().unwrap().to_owned();
    store.corrupt(&c_id, &c_name);
    // Named as the store names it: the holder id on etcd, the node on Leases.
    let unreadable = |v: &Value| {
        let e = entry(v, &c_id);
        if e.is_null() {
            entry(v, &c_name).clone()
        } else {
            e.clone()
        }
    };
    let view = watch_until(b, "the unreadable record", |v| {
        unreadable(v)["record"] == "unreadable"
    })
    .await;
    assert!(
        unreadable(&view)["unreadable"]["value"]
            .as_str()
            .unwrap()
            .contains("\\u{1b}"),
        "escaped: {view:#}"
    );
    // A change of what c shows: a pause, or the end of its pause.
    let change = if c_window { "pause" } else { "resume" };
    let (code, _, err) = rebootctl(c, &[change]).await;
    assert_eq!(code, 0, "{err}");
    log_line(c, &["does not parse", "not writing over it"], WAIT).await;
    let (code, text, _) = rebootctl(b, &["fleet"]).await;
    assert_eq!(code, 0);
    assert!(text.contains("record unreadable"), "{text}");

    // The holder lets go: a reboots, and its record says so once it gave its slot back.
    let (code, _, err) = rebootctl(b, &["unlock"]).await;
    assert_eq!(code, 0, "{err}");
    next_reboot(a, &mut reboots, WAIT).await;
    a.reboot().await.unwrap();
    let view = watch_until(b, "a's reboot on its record", |v| {
        let e = entry(v, &a_name);
        e["role"] == "member" && e["phase"] == "idle" && e["last_reboot"].is_string()
    })
    .await;
    assert!(view["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .all(|n| n["role"] != "holder"));
}

// --- etcd ------------------------------------------------------------------------------------

struct Etcd<'a> {
    etcd: &'a EtcdServer,
    v2: bool,
}

impl Store for Etcd<'_> {
    fn corrupt(&self, id: &str, _node: &str) {
        let key = rebootd::lock::etcd_v3::members::key("default", id);
        if self.v2 {
            let (code, body) = self
                .etcd
                .curl_v2(
                    "PUT",
                    &format!("/v2/keys/{key}"),
                    Some("value=\x1b[2Jbroken"),
                )
                .unwrap();
            assert!(code < 300, "{code} {body}");
        } else {
            self.etcd
                .etcdctl_run(&["put", &key, "\x1b[2Jbroken"])
                .unwrap();
        }
    }
}

async fn on_etcd(v: EtcdVersion, api: &str, prefix: &str) {
    let options = if api == "v2" {
        if !v.has_v2_api() {
            eprintln!("skipping: {v} has no v2 API");
            return;
        }
        EtcdOptions::v2()
    } else {
        EtcdOptions::default()
    };
    let Some(etcd) = start_etcd(v, options).await else {
        return;
    };
    let config = format!("{}api = {api:?}\n", etcd_config(&etcd));
    let mut a = node(&format!("{prefix}-a"), &config).await;
    let b = slot_taken_by(&format!("{prefix}-b"), &config).await;
    let c = node(&format!("{prefix}-c"), &format!("{config}{CLOSED}")).await;
    let store = Etcd {
        etcd: &etcd,
        v2: api == "v2",
    };
    scenario(&store, &mut a, &b, &c, true).await;
    if api == "v2" {
        // locksmith's document holds locksmith's fields only.
        let (_, doc) = etcd
            .curl_v2(
                "GET",
                "/v2/keys/coreos.com/updateengine/rebootlock/semaphore",
                None,
            )
            .unwrap();
        assert!(!doc.contains("agents") && !doc.contains("waiting"), "{doc}");
    }
}

async fn run<F, Fut>(v: EtcdVersion, scenario: F)
where
    F: FnOnce(EtcdVersion) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    scenario(v).await
}

async fn etcd_v3_fleet_view(v: EtcdVersion) {
    on_etcd(v, "v3", &format!("fv3{v:?}").to_lowercase()).await
}

async fn etcd_v2_fleet_view(v: EtcdVersion) {
    on_etcd(v, "v2", &format!("fv2{v:?}").to_lowercase()).await
}

per_etcd_version!(run: etcd_v3_fleet_view, etcd_v2_fleet_view);

// --- Leases ----------------------------------------------------------------------------------

struct Leases<'a> {
    api: &'a KubeApiHandle,
}

impl Store for Leases<'_> {
    fn corrupt(&self, _id: &str, node: &str) {
        self.api
            .cluster()
            .update(
                Kind::Lease,
                "rebootd",
                &format!("rebootd-node-{node}"),
                |o| {
                    o["metadata"]["annotations"]["rebootd.io/node-record"] =
                        Value::from("\x1b[2Jbroken");
                },
            )
            .unwrap();
    }
}

/// On the Lease store, each node its own identity, the stand-in enforcing the admission policy:
/// no write of the fleet view is refused, and the view is read with a node's credential.
#[tokio::test]
async fn leases_fleet_view_under_the_admission_policy() {
    let (api, reviewed) = admission::enforcing_api().await;
    let dir = tempfile::tempdir().unwrap();
    let config = |name: &str| {
        let kc = admission::kubeconfig_as(&api, dir.path(), name);
        format!(
            "[lock]\nbackend = \"kubernetes\"\n[lock.kubernetes]\nnamespace = \"rebootd\"\n\
             name = \"rebootd\"\nkubeconfig = {kc:?}\n"
        )
    };
    let mut a = node("fvl-a", &config("fvl-a")).await;
    let b = slot_taken_by("fvl-b", &config("fvl-b")).await;
    let c = node("fvl-c", &config("fvl-c")).await;
    scenario(&Leases { api: &api }, &mut a, &b, &c, false).await;
    let refused = admission::refused(&reviewed);
    assert!(refused.is_empty(), "refused: {refused:#?}");
    let reviewed = reviewed.lock().unwrap().clone();
    let members = reviewed
        .iter()
        .filter(|(r, _)| r["object"]["metadata"]["labels"]["rebootd.io/role"] == "member")
        .count();
    assert!(members >= 3, "the nodes wrote their records: {members}");
}

/// Another node's credential cannot write a node's record: the stand-in refuses it.
#[tokio::test]
async fn leases_another_nodes_credential_cannot_write_a_record() {
    use k8s_openapi::api::coordination::v1::Lease;
    let (api, _) = admission::enforcing_api().await;
    let client = admission::client_as(&api, "worker-1").await;
    let leases: kube::Api<Lease> = kube::Api::namespaced(client, "rebootd");
    let lease = |name: &str, says: &str| -> Lease {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "rebootd",
                "labels": {"rebootd.io/semaphore": "rebootd", "rebootd.io/role": "member"},
                "annotations": {"rebootd.io/member-node": says, "rebootd.io/node-record": "{}"}},
            "spec": {}
        }))
        .unwrap()
    };
    let pp = kube::api::PostParams::default();
    leases
        .create(&pp, &lease("rebootd-node-worker-1", "worker-1"))
        .await
        .expect("its own");
    for (name, says) in [
        ("rebootd-node-worker-2", "worker-2"),
        ("rebootd-node-worker-2", "worker-1"),
    ] {
        let err = leases
            .create(&pp, &lease(name, says))
            .await
            .expect_err("refused");
        assert_eq!(rebootd::kube_client::status_code(&err), Some(422), "{err}");
        assert!(
            err.to_string()
                .contains("may write only its own node Lease"),
            "{err}"
        );
    }
    assert_eq!(api.cluster().list(Kind::Lease, Some("rebootd")).len(), 1);
}

// --- No fleet view ---------------------------------------------------------------------------

#[tokio::test]
async fn a_fleetlock_server_or_no_lock_keeps_no_fleet_view() {
    let fleetlock =
        "[lock]\nbackend = \"fleetlock\"\n[lock.fleetlock]\nurl = \"http://127.0.0.1:9\"\n";
    for config in [fleetlock, ""] {
        let node = stopped_node("fv-none", config).await;
        let (code, _, err) = rebootctl(&node, &["fleet"]).await;
        assert_eq!(code, 1, "{config}: {err}");
        assert!(err.contains("the store keeps no fleet view"), "{err}");
    }
}

/// `--watch` asks the store nothing while nothing changes (a long poll, here on etcd v2, where
/// etcd counts every request), and draws again at the first change: the group's pause.
#[tokio::test]
async fn watch_waits_on_the_store_and_redraws_at_a_change() {
    let Some(v) = EtcdVersion::available()
        .into_iter()
        .find(|v| v.has_v2_api())
    else {
        assert!(!etcd::in_ci(), "CI has an etcd with the v2 API");
        return;
    };
    let etcd = EtcdServer::start_with(v, EtcdOptions::v2()).await.unwrap();
    let config = format!("{}api = \"v2\"\n", etcd_config(&etcd));
    let n = stopped_node("fvw", &config).await;
    let mut child = n
        .command(std::path::Path::new(REBOOTCTL))
        .args(["fleet", "--watch", "--json"])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let first = next_view(&mut lines).await;
    assert_eq!(first["group_paused"], Value::Null, "{first}");
    // Nothing changes for 3 s of etcd's own time (the clock costs 2 requests, outside the
    // group's directory).
    let before = etcd.v2_requests().unwrap();
    rebootd_lab::v2_watcher::etcd_clock(&etcd.endpoint(), std::time::Duration::from_secs(3))
        .await
        .unwrap();
    let quiet = etcd.v2_requests().unwrap().saturating_sub(before);
    assert!(quiet <= 2, "{quiet} v2 requests while nothing changed");
    let (code, _, err) = rebootctl(&n, &["pause", "--group", "--reason", "freeze"]).await;
    assert_eq!(code, 0, "{err}");
    let view = next_view(&mut lines).await;
    assert_eq!(view["group_paused"]["reason"], "freeze", "{view}");
}

/// The next view `--watch --json` draws, within [`WAIT`].
async fn next_view<R: tokio::io::AsyncBufRead + Unpin>(lines: &mut tokio::io::Lines<R>) -> Value {
    let line = tokio::time::timeout(WAIT, lines.next_line())
        .await
        .expect("a view in time")
        .unwrap()
        .expect("a line");
    serde_json::from_str(&line).unwrap()
}
