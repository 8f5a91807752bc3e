//! Harness shared by the integration tests: paths of the built binaries and helpers to await
//! what the lab's stand-ins see.
#![allow(dead_code)]

pub mod etcd;
pub mod in_process;
pub mod logs;
pub mod stores;

use rebootd_lab::etcd::{EtcdServer, EtcdVersion};
use rebootd_lab::fake_logind::RebootCall;
use rebootd_lab::fleet::{Fleet, FleetLock, FleetOptions};
use rebootd_lab::kube_api::{Cluster, Kind, PdbBuilder, ReplicaSetBuilder};
use rebootd_lab::node::{Node, NodeOptions};
use serde_json::Value;
use std::path::Path;
use std::time::Duration;
use tokio::sync::broadcast;

pub const REBOOTD: &str = env!("CARGO_BIN_EXE_rebootd");

/// The repository's root (this package's manifest directory).
pub fn repo() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The lab binary, built by cargo now (so it is the tree's) unless `REBOOTD_LAB_BIN` names one:
/// the container lab binds it into every host (the fake update_engine).
pub fn lab_binary() -> Result<std::path::PathBuf, String> {
    if let Some(p) = std::env::var_os("REBOOTD_LAB_BIN") {
        return Ok(std::path::PathBuf::from(p));
    }
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = std::process::Command::new(cargo)
        .args(["build", "-p", "rebootd-lab", "--bin", "rebootd-lab"])
        .current_dir(repo())
        .output()
        .map_err(|e| format!("cargo build -p rebootd-lab: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "cargo build -p rebootd-lab: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    // Beside this test's rebootd: the same target directory and profile.
    Ok(Path::new(REBOOTD).with_file_name("rebootd-lab"))
}
pub const REBOOTCTL: &str = env!("CARGO_BIN_EXE_rebootctl");

/// Upper bound for anything a test awaits; generous for a loaded 2-core CI machine.
pub const WAIT: Duration = Duration::from_secs(30);

/// A loopback address nobody listens on: a port bound, then given back at once. For a server to
/// listen on, or for a connection that is refused.
pub fn free_loopback_addr() -> std::net::SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free loopback port")
}

pub async fn node(name: &str, config: &str) -> Node {
    Node::start(Path::new(REBOOTD), NodeOptions::new(name).config(config))
        .await
        .expect("start lab node")
}

/// A lab fleet of `opts` started with this build's rebootd, every node ready.
pub async fn ready_fleet(opts: FleetOptions) -> Fleet {
    let fleet = Fleet::start(Path::new(REBOOTD), opts)
        .await
        .expect("start fleet");
    fleet.wait_ready(WAIT).await.unwrap();
    fleet
}

/// A fleet of `nodes` that drain their Kubernetes Nodes, `max` at a time, on the slots of
/// `lock`, each reboot taking 300 ms.
pub fn drain_opts(nodes: usize, max: u64, lock: FleetLock) -> FleetOptions {
    FleetOptions {
        nodes,
        max,
        lock,
        drain: true,
        reboot_time: Duration::from_millis(300),
        ..FleetOptions::default()
    }
}

/// Make update_engine on the fleet's node `i` (0-based) say that a reboot into `version` is
/// needed.
pub async fn need_reboot(fleet: &Fleet, i: usize, version: &str) {
    fleet.nodes[i]
        .lock()
        .await
        .update_engine
        .set_status("UPDATE_STATUS_UPDATED_NEED_REBOOT", version)
        .await
        .unwrap();
}

/// The Kubernetes API stand-in's cluster of a fleet that runs one (drain or Lease slots).
pub fn kube_cluster(fleet: &Fleet) -> Cluster {
    fleet.kube.as_ref().unwrap().cluster().clone()
}

/// In the stand-in: the ReplicaSet `db/pg`, one pod (`app=pg`) on each of `on`, under a
/// PodDisruptionBudget that wants both available, so that no eviction is ever allowed.
pub fn unevictable_db(cluster: &Cluster, on: [&str; 2]) {
    cluster
        .add_replicaset(
            &ReplicaSetBuilder::new("db", "pg")
                .replicas(2)
                .labels(&[("app", "pg")]),
            &on,
        )
        .unwrap();
    cluster
        .add(
            &PdbBuilder::new("db", "pg")
                .selector("app", "pg")
                .min_available(2),
        )
        .unwrap();
}

/// In the stand-in: the ReplicaSet `shop/web`, one pod (`app=web`, 1 s grace period) on each
/// of `on`, under a PodDisruptionBudget that wants two of the three available.
pub fn web_under_budget(cluster: &Cluster, on: [&str; 3]) {
    cluster
        .add_replicaset(
            &ReplicaSetBuilder::new("shop", "web")
                .replicas(3)
                .labels(&[("app", "web")])
                .grace_period(1),
            &on,
        )
        .unwrap();
    cluster
        .add(
            &PdbBuilder::new("shop", "web")
                .selector("app", "web")
                .min_available(2),
        )
        .unwrap();
}

/// A lab node (private bus, fake logind and update_engine) whose rebootd is not started:
/// `rebootctl` still works on it, its requests waiting in the state directory.
pub async fn stopped_node(name: &str, config: &str) -> Node {
    Node::start(
        Path::new(REBOOTD),
        NodeOptions {
            start_daemon: false,
            ..NodeOptions::new(name).config(config)
        },
    )
    .await
    .unwrap()
}

/// Another machine on the lock store of `config`, its rebootd not started, holding a slot taken
/// by hand (`rebootctl lock`), as an operator would.
pub async fn slot_taken_by(name: &str, config: &str) -> Node {
    let other = stopped_node(name, config).await;
    let (code, _, err) = rebootctl(&other, &["lock"]).await;
    assert_eq!(code, 0, "{err}");
    other
}

/// The `[lock]` configuration of a node using `etcd` through its default API (v3).
pub fn etcd_config(etcd: &EtcdServer) -> String {
    format!(
        "[lock]\nbackend = \"etcd\"\n\n[lock.etcd]\nendpoints = [{:?}]\n",
        etcd.endpoint()
    )
}

/// A real etcd (the first version installed) and the [`etcd_config`] of a node using it.
pub async fn etcd_lock() -> (EtcdServer, String) {
    let v = *EtcdVersion::available()
        .first()
        .expect("an etcd is installed (see tests/etcd_semaphore.rs)");
    let etcd = EtcdServer::start(v).await.expect("start etcd");
    let config = etcd_config(&etcd);
    (etcd, config)
}

/// `rebootctl status --json` of the node, which must succeed.
pub async fn status_json(node: &Node) -> Value {
    let (code, out, err) = rebootctl(node, &["status", "--json"]).await;
    assert_eq!(code, 0, "{err}");
    serde_json::from_str(&out).unwrap()
}

/// Wait (at most [`WAIT`]) until the stand-in's Node `node` has every annotation of `shown`,
/// with its value, and none of `gone`.
pub async fn node_annotations(
    cluster: &Cluster,
    node: &str,
    shown: &[(&str, &str)],
    gone: &[&str],
) {
    cluster
        .wait_for(WAIT, |snap| {
            let n = snap.get(Kind::Node, "", node)?;
            let a = &n["metadata"]["annotations"];
            let ok =
                shown.iter().all(|(k, v)| a[*k] == *v) && gone.iter().all(|k| a.get(k).is_none());
            ok.then_some(())
        })
        .await
        .unwrap_or_else(|_| panic!("{node}'s annotations: want {shown:?}, none of {gone:?}"));
}

/// Await the next reboot call logind accepts, or fail with the node's log.
pub async fn next_reboot(
    node: &Node,
    rx: &mut broadcast::Receiver<RebootCall>,
    within: Duration,
) -> RebootCall {
    match tokio::time::timeout(within, rx.recv()).await {
        Ok(Ok(call)) => call,
        other => panic!(
            "node {}: no reboot call within {within:?} ({other:?})\n--- rebootd log ---\n{}",
            node.name,
            node.log()
        ),
    }
}

/// Run rebootctl as the node's; returns (exit code, stdout, stderr).
pub async fn rebootctl(node: &Node, args: &[&str]) -> (i32, String, String) {
    let out = node
        .command(Path::new(REBOOTCTL))
        .args(args)
        .output()
        .await
        .expect("run rebootctl");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Wait until the node's log has a line containing every one of `needles` (inotify on the log
/// file, no polling); returns that line.
pub async fn log_line(node: &Node, needles: &[&str], within: Duration) -> String {
    log_line_at(&node.name, &node.log_path(), needles, within).await
}

/// [`log_line`] by the log's path (`name`: the node's, for the message), for a test that must
/// not hold the node meanwhile (the fleet reboots it).
pub async fn log_line_at(name: &str, path: &Path, needles: &[&str], within: Duration) -> String {
    use futures_util::StreamExt;
    let log = || std::fs::read_to_string(path).unwrap_or_default();
    let inotify = inotify::Inotify::init().expect("inotify");
    inotify
        .watches()
        .add(path, inotify::WatchMask::MODIFY)
        .expect("watch the log");
    let mut events = inotify.into_event_stream(vec![0u8; 1024]).expect("stream");
    let find = || {
        log()
            .lines()
            .find(|l| needles.iter().all(|n| l.contains(n)))
            .map(str::to_string)
    };
    let found = tokio::time::timeout(within, async {
        loop {
            if let Some(line) = find() {
                return line;
            }
            events.next().await;
        }
    })
    .await;
    found.unwrap_or_else(|_| {
        panic!(
            "node {name}: no log line with {needles:?} within {within:?}\n--- rebootd log ---\n{}",
            log()
        )
    })
}
