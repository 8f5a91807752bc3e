//! Bad input never loses data: a corrupted or truncated state file, a semaphore document with a
//! wrong type or more holders than slots, a kubeconfig that does not parse, an etcd endpoint that
//! speaks something else. Each gets a clear error, and what rebootd found is left as it was.
//! Also the regression cases of the fuzz targets (`fuzz/`).

use rebootd::lock::document::{semaphore_key, SemaphoreDoc};
use rebootd::state::{Phase, State};
use rebootd_lab::etcd::{EtcdServer, EtcdVersion};
use rebootd_lab::node::{Node, NodeOptions};
use std::path::Path;
use std::time::Duration;

const REBOOTD: &str = env!("CARGO_BIN_EXE_rebootd");
const REBOOTCTL: &str = env!("CARGO_BIN_EXE_rebootctl");
const WAIT: Duration = Duration::from_secs(30);
const NEED: &str = "UPDATE_STATUS_UPDATED_NEED_REBOOT";

async fn node(name: &str, config: &str, start: bool) -> Node {
    Node::start(
        Path::new(REBOOTD),
        NodeOptions {
            start_daemon: start,
            ..NodeOptions::new(name).config(config)
        },
    )
    .await
    .expect("start lab node")
}

/// Wait for rebootd to exit by itself; its exit code.
async fn exit_code(node: &mut Node) -> Option<i32> {
    tokio::time::timeout(WAIT, async {
        loop {
            if let Some(code) = node.daemon_exit() {
                return code;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("rebootd did not exit\n{}", node.log()))
}

async fn rebootctl(node: &Node, args: &[&str]) -> (Option<i32>, String) {
    let out = tokio::time::timeout(WAIT, node.command(Path::new(REBOOTCTL)).args(args).output())
        .await
        .expect("rebootctl finishes")
        .expect("run rebootctl");
    (
        out.status.code(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// A state file that does not parse, whatever the way: rebootd exits 1 naming the file and
/// leaves it byte for byte as it was (to be looked at), every time it is started.
#[tokio::test]
async fn corrupt_or_truncated_state_files_are_refused_and_kept() {
    let mut node = node("bad-state", "", false).await;
    let mut valid = State::new("0123456789abcdef0123456789abcdef", jiff::Timestamp::now());
    valid.phase = Phase::Rebooting;
    valid.slot_held = true;
    let valid = serde_json::to_vec_pretty(&valid).unwrap();
    let mut wrong_version = serde_json::from_slice::<serde_json::Value>(&valid).unwrap();
    wrong_version["version"] = 99.into();
    let mut wrong_type = serde_json::from_slice::<serde_json::Value>(&valid).unwrap();
    wrong_type["slot_held"] = "yes".into();
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("truncated in the middle", valid[..valid.len() / 2].to_vec()),
        ("truncated by one byte", valid[..valid.len() - 1].to_vec()),
        ("empty", Vec::new()),
        ("zeros (a lost block)", vec![0u8; 512]),
        ("not UTF-8", vec![0xff, 0xfe, b'{', 0x80]),
        ("an unknown phase", {
            let mut v = serde_json::from_slice::<serde_json::Value>(&valid).unwrap();
            v["phase"] = "exploding".into();
            serde_json::to_vec(&v).unwrap()
        }),
        ("a wrong type", serde_json::to_vec(&wrong_type).unwrap()),
        (
            "another layout version",
            serde_json::to_vec(&wrong_version).unwrap(),
        ),
        ("a JSON list", b"[1, 2, 3]".to_vec()),
    ];
    let path = node.store().path();
    for (what, bytes) in cases {
        std::fs::write(&path, &bytes).unwrap();
        node.start_daemon().unwrap();
        let code = exit_code(&mut node).await;
        let log = node.log();
        assert_eq!(code, Some(1), "{what}: exit code\n{log}");
        assert_eq!(
            std::fs::read(&path).unwrap(),
            bytes,
            "{what}: the state file was changed"
        );
        let last = log
            .lines()
            .rev()
            .find(|l| l.contains("state file"))
            .unwrap_or("");
        assert!(
            last.contains(&path.display().to_string()) && last.contains("does not parse"),
            "{what}: the error must name the file and say it does not parse: {last:?}\n{log}"
        );
        // rebootctl reads it too: it says so, and does not touch it either.
        let (_, out) = rebootctl(&node, &["status"]).await;
        assert!(
            out.contains(&path.display().to_string()),
            "{what}: rebootctl status: {out}"
        );
        assert_eq!(
            std::fs::read(&path).unwrap(),
            bytes,
            "{what}: rebootctl changed it"
        );
    }
    // And once moved aside, rebootd starts afresh. (Not `wait_ready`: it counts READY=1 per
    // start, and the refused starts sent none.)
    std::fs::remove_file(&path).unwrap();
    node.start_daemon().unwrap();
    node.wait_state("a fresh state file", WAIT, |s| s.phase == Phase::Idle)
        .await
        .unwrap();
    assert!(node.daemon_exit().is_none(), "{}", node.log());
}

fn etcd_config(endpoint: &str, group: &str) -> String {
    format!(
        "[identity]\ngroup = {group:?}\n\n[lock]\nbackend = \"etcd\"\n\n[lock.etcd]\nendpoints = [{endpoint:?}]\n"
    )
}

fn etcd_get(etcd: &EtcdServer, key: &str) -> String {
    etcd.etcdctl_run(&["get", "--print-value-only", key])
        .unwrap()
        .trim_end()
        .to_string()
}

/// Semaphore documents rebootd must not act on: it reports the refusal (state, rebootctl
/// status), does not reboot, and never writes over the value.
#[tokio::test]
async fn bad_semaphore_documents_are_refused_and_left_unchanged() {
    let etcd = EtcdServer::start(EtcdVersion::V34).await.expect("etcd");
    let cases = [
        (
            "holders-string",
            r#"{"semaphore":1,"max":1,"holders":"abc"}"#,
        ),
        ("max-string", r#"{"semaphore":1,"max":"1","holders":[]}"#),
        ("holder-number", r#"{"semaphore":0,"max":1,"holders":[7]}"#),
        ("a-list", r#"[{"semaphore":1,"max":1,"holders":[]}]"#),
        (
            "more-holders-than-max",
            r#"{"semaphore":0,"max":1,"holders":["aaaa","bbbb"]}"#,
        ),
        (
            "more-holders-than-max-2",
            r#"{"semaphore":1,"max":2,"holders":["aaaa","bbbb","cccc"]}"#,
        ),
    ];
    let mut nodes = Vec::new();
    for (group, doc) in cases {
        let key = semaphore_key(group);
        etcd.etcdctl_run(&["put", &key, doc]).unwrap();
        let n = node(group, &etcd_config(&etcd.endpoint(), group), true).await;
        n.wait_ready(WAIT).await.unwrap();
        n.update_engine.set_status(NEED, "1").await.unwrap();
        nodes.push((group, doc, key, n));
    }
    for (group, _, key, n) in &nodes {
        let s = n
            .wait_state("the refusal to show in the state", WAIT, |s| {
                s.last_error
                    .as_deref()
                    .is_some_and(|e| e.contains("does not parse"))
            })
            .await
            .unwrap();
        assert_eq!(s.phase, Phase::AcquiringSlot, "{group}");
        assert!(!s.slot_held, "{group}");
        let err = s.last_error.unwrap();
        assert!(err.contains(key.as_str()), "{group}: names the key: {err}");
        let (_, out) = rebootctl(n, &["status"]).await;
        assert!(out.contains("does not parse"), "{group}: status: {out}");
    }
    // Some time later: still untouched, still no reboot, still running.
    tokio::time::sleep(Duration::from_secs(2)).await;
    for (group, doc, key, n) in &mut nodes {
        assert_eq!(etcd_get(&etcd, key), *doc, "{group}: written over");
        assert!(n.logind.reboot_calls().is_empty(), "{group}: rebooted");
        assert!(n.daemon_exit().is_none(), "{group}: rebootd exited");
    }
}

/// A forced shrink (`rebootctl set-max --force` below the holders, or locksmith's): more holders
/// than max with a negative count is consistent. Nobody new gets a slot until enough are
/// released, and rebootd does not "repair" the document.
#[tokio::test]
async fn a_forced_shrink_is_waited_out_not_written_over() {
    let etcd = EtcdServer::start(EtcdVersion::V34).await.expect("etcd");
    let key = semaphore_key("shrunk");
    let doc = r#"{"semaphore":-1,"max":1,"holders":["aaaa","bbbb"]}"#;
    etcd.etcdctl_run(&["put", &key, doc]).unwrap();
    assert!(SemaphoreDoc::parse(doc.as_bytes()).is_ok());
    let n = node("shrunk", &etcd_config(&etcd.endpoint(), "shrunk"), true).await;
    n.wait_ready(WAIT).await.unwrap();
    n.update_engine.set_status(NEED, "1").await.unwrap();
    n.wait_state("waiting for a slot", WAIT, |s| {
        s.phase == Phase::AcquiringSlot
    })
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(etcd_get(&etcd, &key), doc);
    assert!(n.logind.reboot_calls().is_empty());
    let s = n.state().unwrap();
    assert!(!s.slot_held, "{s:?}");
    // Releasing both old holders frees the one slot: then it is taken.
    etcd.etcdctl_run(&["put", &key, r#"{"semaphore":1,"max":1,"holders":[]}"#])
        .unwrap();
    n.wait_state("the slot", WAIT, |s| s.slot_held)
        .await
        .unwrap();
}

/// `[kubernetes]` with a kubeconfig that does not parse: rebootd refuses to start, with an
/// error that names the file, and writes no state.
#[tokio::test]
async fn a_kubeconfig_that_does_not_parse_stops_rebootd_with_its_name() {
    let dir = tempfile::tempdir().unwrap();
    let cases: [(&str, &[u8]); 3] = [
        ("garbage.yaml", b"clusters: [ {{{ not yaml"),
        (
            "empty-cluster.yaml",
            b"apiVersion: v1\nkind: Config\nclusters: 7\n",
        ),
        ("binary.yaml", &[0xff, 0x00, 0xfe, 0x01]),
    ];
    for (name, bytes) in cases {
        let path = dir.path().join(name);
        std::fs::write(&path, bytes).unwrap();
        let config = format!("[kubernetes]\nkubeconfig = {path:?}\n");
        let mut n = node("bad-kubeconfig", &config, true).await;
        let code = exit_code(&mut n).await;
        let log = n.log();
        assert_ne!(code, Some(0), "{name}: {log}");
        assert!(code.is_some(), "{name}: killed? {log}");
        let named = log.lines().any(|l| {
            l.starts_with("rebootd: ") && l.contains(&format!("kubeconfig {}", path.display()))
        });
        assert!(named, "{name}: the error names the file:\n{log}");
        assert_eq!(std::fs::read(&path).unwrap(), bytes, "{name}: changed");
        assert!(n.state().is_none(), "{name}: a state was written");
    }
}

/// A TCP listener that answers every connection with an HTTP/1.1 page and closes it.
async fn http_garbage_server() -> (String, tokio::task::JoinHandle<()>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let task = tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 1024];
                let _ = tokio::time::timeout(Duration::from_millis(200), s.read(&mut buf)).await;
                let _ = s
                    .write_all(
                        b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: 21\r\n\r\n<html>hello</html>\r\n",
                    )
                    .await;
            });
        }
    });
    (format!("http://{addr}"), task)
}

/// An etcd endpoint that is not etcd: rebootd keeps running, says what is wrong (state and
/// rebootctl status name the endpoint), takes no slot, reboots nothing; rebootctl does not hang.
#[tokio::test]
async fn an_etcd_endpoint_that_speaks_something_else_is_a_clear_error() {
    let (garbage, _server) = http_garbage_server().await;
    let kube = rebootd_lab::kube_api::KubeApi::start(rebootd_lab::kube_api::Options::default())
        .await
        .unwrap();
    let kube_endpoint = kube.base_url();
    for (what, endpoint) in [("HTTP garbage", garbage), ("the kube API", kube_endpoint)] {
        let n = node("not-etcd", &etcd_config(&endpoint, "default"), true).await;
        n.wait_ready(WAIT).await.unwrap();
        n.update_engine.set_status(NEED, "1").await.unwrap();
        let s = n
            .wait_state("the error to show in the state", WAIT, |s| {
                s.last_error.is_some()
            })
            .await
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        let err = s.last_error.clone().unwrap();
        assert!(
            err.contains(&endpoint),
            "{what}: the error says where: {err}"
        );
        assert!(!s.slot_held, "{what}: {s:?}");
        assert_eq!(s.phase, Phase::AcquiringSlot, "{what}: {s:?}");
        let (code, out) = rebootctl(&n, &["status"]).await;
        assert!(
            out.contains(&endpoint),
            "{what}: rebootctl status ({code:?}): {out}"
        );
        eprintln!("{what}: state says: {err}\nrebootctl status says: {out}");
        assert!(n.logind.reboot_calls().is_empty(), "{what}");
        let mut n = n;
        assert!(
            n.daemon_exit().is_none(),
            "{what}: rebootd exited\n{}",
            n.log()
        );
    }
    // Nothing was written to the API server that was taken for etcd.
    let writes = kube.cluster().requests().count(|r| r.method != "GET");
    assert_eq!(writes, 0, "{:?}", kube.cluster().requests().all());
}

// Regression cases from the fuzz targets (fuzz/): inputs that must parse or be refused without
// a panic, and round-trip when accepted.
#[test]
fn fuzz_regressions_semaphore_document() {
    let cases: &[&[u8]] = &[
        b"",
        b"{}",
        b"null",
        br#"{"semaphore":-9223372036854775808,"max":0,"holders":[]}"#,
        br#"{"semaphore":9223372036854775807,"max":18446744073709551615,"holders":[]}"#,
        br#"{"semaphore":-1,"max":18446744073709551615,"holders":[]}"#,
        br#"{"semaphore":1e3,"max":1,"holders":[]}"#,
        br#"{"semaphore":0,"max":1,"holders":["\u0000"]}"#,
        br#"{"semaphore":0,"max":1,"holders":["\ud800"]}"#,
        br#"{"semaphore":0,"max":1,"holders":["<>&\u2028\u2029"]}"#,
        br#"{"semaphore":1,"max":1,"holders":null,"holders":[]}"#,
    ];
    for bytes in cases {
        if let Ok(doc) = SemaphoreDoc::parse(bytes) {
            let json = doc.to_json();
            assert_eq!(
                SemaphoreDoc::parse(json.as_bytes()).as_ref(),
                Ok(&doc),
                "{json}"
            );
        }
    }
}

#[test]
fn fuzz_regressions_state_file() {
    let cases: &[&[u8]] = &[
        b"",
        b"{\"version\":1}",
        b"{\"version\":4294967296}",
        b"{\"version\":1,\"phase\":\"idle\",\"since\":\"9999-12-31T23:59:59Z\",\"boot_id\":\"\"}",
        b"{\"version\":1,\"phase\":\"idle\",\"since\":\"-009999-01-01T00:00:00Z\",\"boot_id\":\"\",\"reboots\":18446744073709551615}",
    ];
    for bytes in cases {
        if let Ok(s) = rebootd::state::parse(bytes) {
            let again = rebootd::state::parse(&serde_json::to_vec_pretty(&s).unwrap()).unwrap();
            assert_eq!(s, again);
        }
    }
}

#[test]
fn fuzz_regressions_config() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("50-fuzz.toml");
    let cases: &[&[u8]] = &[
        b"",
        b"\xff",
        b"[[window]]\nlength = \"99999999999999999999h\"\n",
        b"[[window]]\nstart = \"25:00\"\n",
        b"[[window]]\ntime_zone = \"\"\n",
        b"[lock]\nmax_hold = \"0s\"\n",
        b"[triggers]\nsentinel_interval = \"0s\"\n",
        b"[identity]\ngroup = \"\"\n",
    ];
    for bytes in cases {
        std::fs::write(&path, bytes).unwrap();
        if let Err(e) = rebootd::config::Config::load(std::slice::from_ref(&path)) {
            assert!(e.to_string().contains("50-fuzz.toml"), "{e}");
        }
    }
}

/// Secret files group or others may read (etcd password file, kubeconfig, its token file, a
/// gate's bearer token file) and passwords or tokens sent over plain http:// are warned about by
/// `rebootd --check-config`, each naming the key and the file (exit 0: warnings, not errors),
/// and logged when rebootd starts. Private files over https:// get no warning.
#[tokio::test]
async fn loose_secret_files_and_clear_text_credentials_are_warned_about() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let file = |name: &str, text: &str, mode: u32| {
        let p = d.join(name);
        std::fs::write(&p, text).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
        p.display().to_string()
    };
    let password = file("etcd-password", "s3cret\n", 0o644);
    let token = file("prom-token", "t0ken\n", 0o640);
    let kube_token = file("kube-token", "k8s-t0ken\n", 0o644);
    let kubeconfig = file(
        "kubeconfig",
        &format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: c\nclusters:\n- name: k\n  cluster:\n    \
             server: http://127.0.0.1:1\ncontexts:\n- name: c\n  context:\n    cluster: k\n    \
             user: u\nusers:\n- name: u\n  user:\n    tokenFile: {kube_token}\n"
        ),
        0o644,
    );
    let config = format!(
        "[identity]\nmachine_id_file = \"/etc/machine-id\"\n\
         [lock]\nbackend = \"etcd\"\n[lock.etcd]\nendpoints = [\"http://127.0.0.1:2379\"]\n\
         username = \"u\"\npassword_file = {password:?}\n\
         [kubernetes]\nkubeconfig = {kubeconfig:?}\n\
         [[gates.before_reboot]]\nprometheus_url = \"http://127.0.0.1:9\"\nquery = \"up\"\n\
         bearer_token_file = {token:?}\n"
    );
    let path = file("c.toml", &config, 0o644);
    let out = std::process::Command::new(REBOOTD)
        .args(["--check-config", "--config", &path])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    let warnings: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("rebootd: warning: "))
        .collect();
    for needles in [
        vec!["lock.etcd.password_file", &password, "0644"],
        vec!["kubernetes.kubeconfig", &kubeconfig, "0644"],
        vec!["kubernetes.kubeconfig", "token file", &kube_token],
        vec!["gates.before_reboot[1].bearer_token_file", &token, "0640"],
        vec!["lock.etcd.username", "in clear", "http://127.0.0.1:2379"],
        vec![
            "gates.before_reboot[1].bearer_token_file",
            "in clear",
            "http://127.0.0.1:9",
        ],
        vec![
            "kubernetes.kubeconfig",
            "token is sent in clear",
            "http://127.0.0.1:1",
        ],
    ] {
        assert!(
            warnings
                .iter()
                .any(|w| needles.iter().all(|n| w.contains(n))),
            "{needles:?} in:\n{err}"
        );
    }
    assert_eq!(warnings.len(), 7, "{err}");
    assert!(!err.contains("s3cret") && !err.contains("t0ken"), "{err}");

    // Private files, https://: nothing to say.
    for p in [&password, &token, &kube_token, &kubeconfig] {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    let quiet = file(
        "quiet.toml",
        &format!(
            "[identity]\nmachine_id_file = \"/etc/machine-id\"\n\
             [[gates.before_reboot]]\nprometheus_url = \"https://127.0.0.1:9\"\nquery = \"up\"\n\
             bearer_token_file = {token:?}\n"
        ),
        0o644,
    );
    let out = std::process::Command::new(REBOOTD)
        .args(["--check-config", "--config", &quiet])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(!err.contains("warning"), "{err}");

    // At start, in the log.
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o644)).unwrap();
    let gate = format!(
        "[[gates.before_reboot]]\nprometheus_url = \"http://127.0.0.1:9\"\nquery = \"up\"\n\
         bearer_token_file = {token:?}\n"
    );
    let node = node("secret-warnings", &gate, true).await;
    let deadline = std::time::Instant::now() + WAIT;
    let want = |log: &str| {
        log.lines()
            .any(|l| l.contains("WARN") && l.contains("bearer_token_file") && l.contains(&token))
            && log
                .lines()
                .any(|l| l.contains("WARN") && l.contains("in clear"))
    };
    while !want(&node.log()) {
        assert!(std::time::Instant::now() < deadline, "{}", node.log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
