//! Lock backend `fleetlock` against the lab's FleetLock server (a real counting semaphore per
//! group, answering as airlock or poseidon/fleetlock do) and against the real airlock (built
//! from ../shared/peers by scripts/setup.sh, on a real etcd 3.5), plus `curl` speaking the wire
//! protocol to both and getting the same answers. The scenarios that do not need the lab
//! server's fault injection or counters run on both servers. Synchronisation is by the server's
//! state, captured log events and task completion, each awaited with a timeout; never by
//! sleeping.

use rebootd::state::Phase;
use std::sync::{Arc, Mutex, Once};
use std::time::Duration;

use rebootd::lock::fleetlock::{FleetLock, Options};
use rebootd::lock::{LockError, Semaphore};
use rebootd_lab::airlock::Airlock;
use rebootd_lab::etcd::{EtcdServer, EtcdVersion};
use rebootd_lab::fleetlock::{BusyAnswer, FleetLockServer};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::Layer;

mod common;
use common::in_process::{machine as me, within};
use common::logs::event_line;

// ---------------------------------------------------------------------------------------------
// harness

fn fast() -> Options {
    Options {
        backoff_min: Duration::from_millis(10),
        backoff_max: Duration::from_millis(50),
        connect_timeout: Duration::from_secs(2),
        request_timeout: Duration::from_secs(5),
        release_attempts: 3,
        ..Options::default()
    }
}

fn client(url: &str) -> FleetLock {
    FleetLock::new(url, "default", fast()).expect("client")
}

/// Log events of rebootd, as `LEVEL message=... field=value ...` lines, sent to every
/// receiver from [`capture`]. One global subscriber: per-test scoped subscribers miss events
/// when another test thread registers the same call site at the same time.
struct Capture;

static SINKS: Mutex<Vec<UnboundedSender<String>>> = Mutex::new(Vec::new());

impl<S: tracing::Subscriber> Layer<S> for Capture {
    fn on_event(
        &self,
        event: &tracing::Event<'_>,
        _ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        let Some(line) = event_line(event) else {
            return;
        };
        SINKS
            .lock()
            .unwrap()
            .retain(|tx| tx.send(line.clone()).is_ok());
    }
}

/// Every rebootd log line from now on (of all tests: filter by URL).
fn capture() -> UnboundedReceiver<String> {
    static INIT: Once = Once::new();
    INIT.call_once(|| {
        tracing::subscriber::set_global_default(tracing_subscriber::registry().with(Capture))
            .expect("install the capturing subscriber");
    });
    let (tx, rx) = unbounded_channel();
    SINKS.lock().unwrap().push(tx);
    rx
}

/// The next captured line containing all of `needles`.
async fn next_log(rx: &mut UnboundedReceiver<String>, needles: &[&str]) -> String {
    within(&format!("log line with {needles:?}"), async {
        loop {
            let line = rx.recv().await.expect("log channel open");
            if needles.iter().all(|n| line.contains(n)) {
                return line;
            }
        }
    })
    .await
}

/// A FleetLock server: the lab's, or the real airlock on a real etcd.
enum Server {
    Lab(FleetLockServer),
    Airlock {
        airlock: Airlock,
        etcd: Box<EtcdServer>,
    },
}

impl Server {
    async fn lab(max: u64) -> Server {
        Server::Lab(FleetLockServer::start(max).await.unwrap())
    }

    /// airlock with group `default` of `max` slots (or only the groups given).
    async fn airlock(groups: &[(&str, u64)]) -> Server {
        let etcd = EtcdServer::start(EtcdVersion::V35)
            .await
            .expect("etcd 3.5 for airlock");
        let airlock = Airlock::start(&etcd, groups)
            .await
            .expect("the real airlock (scripts/setup.sh builds it)");
        Server::Airlock {
            airlock,
            etcd: Box::new(etcd),
        }
    }

    fn url(&self) -> String {
        match self {
            Server::Lab(s) => s.url(),
            Server::Airlock { airlock, .. } => airlock.url(),
        }
    }

    fn holders(&self) -> Vec<String> {
        match self {
            Server::Lab(s) => s.holders(),
            Server::Airlock { etcd, .. } => Airlock::holders(etcd, "default").unwrap(),
        }
    }

    fn lab_server(&self) -> Option<&FleetLockServer> {
        match self {
            Server::Lab(s) => Some(s),
            Server::Airlock { .. } => None,
        }
    }
}

/// Run `scenario` on the lab server and on the real airlock, each with `max` slots in group
/// `default`.
macro_rules! both_servers {
    ($($name:ident: $max:expr),* $(,)?) => {
        mod lab_server {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    super::$name(super::Server::lab($max).await).await
                }
            )*
        }
        mod real_airlock {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    super::$name(super::Server::airlock(&[("default", $max)]).await).await
                }
            )*
        }
    };
}

both_servers!(
    acquire_release_and_what_the_protocol_cannot_do: 1,
    acquire_twice_is_granted_once: 1,
    five_acquirers_share_two_slots: 2,
    acquire_waits_for_a_slot_and_logs_the_answer_once: 1,
    curl_speaks_the_wire_protocol: 1,
);

// ---------------------------------------------------------------------------------------------
// scenarios

async fn acquire_release_and_what_the_protocol_cannot_do(server: Server) {
    let s = client(&server.url());
    assert_eq!(s.backend(), rebootd::lock::Backend::FleetLock);

    within("acquire", s.acquire(&me("a"))).await.unwrap();
    assert_eq!(server.holders(), vec!["a".to_string()]);

    within("release", s.release(&me("a"))).await.unwrap();
    assert!(server.holders().is_empty());
    // Releasing again (not holding) is success: steady-state of a non-holder is 200.
    within("release again", s.release(&me("a"))).await.unwrap();
    if let Some(lab) = server.lab_server() {
        let st = lab.state();
        assert_eq!(
            (st.grants, st.steady_state_requests, st.bad_requests),
            (1, 2, 0)
        );
    }

    s.report_phase(&me("a"), Phase::Draining).await.unwrap();
    assert_eq!(s.heartbeat_every(), None, "the server keeps its holders");
    // rebootctl's calls: the server owns the semaphore, and rebootctl says so.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.toml");
    std::fs::write(
        &path,
        format!(
            "[lock]\nbackend = \"fleetlock\"\n[lock.fleetlock]\nurl = \"{}\"\n",
            server.url()
        ),
    )
    .unwrap();
    let config = rebootd::config::Config::load(&[path]).unwrap();
    match rebootd::lock::open::open_admin(&config).await {
        Err(LockError::Refused(m)) => {
            assert!(
                m.contains(&server.url()) && m.contains("owns the semaphore"),
                "{m}"
            )
        }
        Err(e) => panic!("open_admin: {e}"),
        Ok(_) => panic!("open_admin: a FleetLock server has no admin side"),
    }
    // Neither of those talked to the server.
    if let Some(lab) = server.lab_server() {
        assert_eq!(lab.requests(), 3);
    }
}

async fn acquire_twice_is_granted_once(server: Server) {
    let s = client(&server.url());
    within("acquire", s.acquire(&me("a"))).await.unwrap();
    within("acquire again", s.acquire(&me("a"))).await.unwrap();
    assert_eq!(server.holders(), vec!["a".to_string()]);
    if let Some(lab) = server.lab_server() {
        let st = lab.state();
        assert_eq!((st.pre_reboot_requests, st.grants, st.denials), (2, 1, 0));
    }
}

async fn five_acquirers_share_two_slots(server: Server) {
    let server = Arc::new(server);
    let url = server.url();
    // Every "taken" answer a client got, from its log lines (the first is logged as the answer,
    // the next ones as retries): works for a server whose counters the test cannot read.
    let denials = denial_counter(&url);
    let peak = peak_watch(&server).await;
    let granted = Arc::new(tokio::sync::watch::channel(0usize).0);
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..5 {
        // One client each, as five nodes would have. airlock answers a compare-and-swap of
        // its etcd document that lost to another request's (or ran out of its transaction
        // timeout on a busy machine) with a 500 `failed_lock`; a release retries those more
        // often here than `fast()` does, as the daemon would retry it later (the give-up
        // itself is tested in `server_errors_are_retried`).
        let s = FleetLock::new(
            &url,
            "default",
            Options {
                release_attempts: 20,
                ..fast()
            },
        )
        .expect("client");
        let (mut denied, granted) = (denials.clone(), granted.clone());
        tasks.spawn(async move {
            let id = format!("node-{i}");
            s.acquire(&me(&id)).await?;
            let at = *denied.borrow_and_update();
            let mut all = granted.subscribe();
            granted.send_modify(|n| *n += 1);
            // Hold the slot until someone else was turned away (so the slots really are
            // contended), or everyone has had one.
            within("contention or completion", async {
                while *denied.borrow_and_update() <= at && *all.borrow_and_update() < 5 {
                    tokio::select! {
                        _ = denied.changed() => {}
                        _ = all.changed() => {}
                    }
                }
            })
            .await;
            s.release(&me(&id)).await?;
            Ok::<_, LockError>(id)
        });
    }
    let mut done = Vec::new();
    within("all five acquirers", async {
        while let Some(r) = tasks.join_next().await {
            done.push(r.expect("task").expect("acquire and release"));
        }
    })
    .await;
    done.sort();
    assert_eq!(done.len(), 5, "{done:?}");
    assert_eq!(peak(), 2, "never more than 2 holders, and 2 at once");
    assert!(*denials.borrow() > 0, "the slots were never contended");
    assert!(server.holders().is_empty());
    if let Some(lab) = server.lab_server() {
        let st = lab.state();
        assert_eq!(st.grants, 5);
        assert_eq!(st.bad_requests, 0);
    }
}

/// Counts the "taken" answers clients of `url` got, from rebootd's log lines.
fn denial_counter(url: &str) -> tokio::sync::watch::Receiver<u64> {
    let mut logs = capture();
    let (tx, rx) = tokio::sync::watch::channel(0u64);
    let url = url.to_string();
    tokio::spawn(async move {
        while let Some(line) = logs.recv().await {
            if line.contains(&url)
                && (line.contains("waiting for a free slot") || line.contains("no slot yet"))
            {
                tx.send_modify(|n| *n += 1);
            }
        }
    });
    rx
}

/// The most holders the server ever had at once (lab: its own count; airlock: every version of
/// its semaphore in etcd, watched from outside).
async fn peak_watch(server: &Server) -> Box<dyn Fn() -> usize + Send + Sync> {
    match server {
        Server::Lab(lab) => {
            let state = lab.state_handle();
            Box::new(move || state().peak("default"))
        }
        Server::Airlock { etcd, .. } => {
            let mut client = etcd_client::Client::connect([etcd.endpoint()], None)
                .await
                .unwrap();
            let mut stream = client
                .watch("com.coreos.airlock/groups/default/v1/semaphore", None)
                .await
                .unwrap();
            let peak = Arc::new(std::sync::atomic::AtomicUsize::new(0));
            let p = peak.clone();
            tokio::spawn(async move {
                use futures_util::StreamExt;
                let _keep = client;
                while let Some(Ok(resp)) = stream.next().await {
                    for e in resp.events() {
                        #[derive(serde::Deserialize)]
                        struct Sem {
                            holders: Vec<String>,
                        }
                        if let Some(sem) = e
                            .kv()
                            .and_then(|kv| serde_json::from_slice::<Sem>(kv.value()).ok())
                        {
                            p.fetch_max(sem.holders.len(), std::sync::atomic::Ordering::SeqCst);
                        }
                    }
                }
            });
            Box::new(move || peak.load(std::sync::atomic::Ordering::SeqCst))
        }
    }
}

/// A full server: `acquire` waits, logs the server's answer once (not on every retry), and
/// takes the slot as soon as it is free. airlock's "taken" answer (both servers); poseidon's
/// with the lab server below.
async fn acquire_waits_for_a_slot_and_logs_the_answer_once(server: Server) {
    waits_and_logs_once(&server, "failed_lock").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn acquire_waits_for_a_slot_poseidon_answer() {
    let server = FleetLockServer::start(1).await.unwrap();
    server.set_busy_answer(BusyAnswer::Poseidon);
    waits_and_logs_once(&Server::Lab(server), "locked").await
}

async fn waits_and_logs_once(server: &Server, kind: &str) {
    let url = server.url();
    let other = client(&url);
    within("other acquire", other.acquire(&me("other")))
        .await
        .unwrap();
    let mut denials = denial_counter(&url);
    let mut logs = capture();
    let s = client(&url);
    let waiter = tokio::spawn(async move { s.acquire(&me("me")).await });
    let line = next_log(&mut logs, &[&url, "waiting for a free slot"]).await;
    assert!(line.contains(kind), "{line}");
    within("five refusals", denials.wait_for(|n| *n >= 5))
        .await
        .unwrap();
    assert!(!waiter.is_finished(), "acquired a taken slot");

    within("other release", other.release(&me("other")))
        .await
        .unwrap();
    within("waiter", waiter).await.unwrap().unwrap();
    assert_eq!(server.holders(), vec!["me".to_string()]);
    let mut waiting_lines = 0;
    let mut took = false;
    while let Ok(line) = logs.try_recv() {
        if !line.contains(&url) {
            continue;
        }
        waiting_lines += usize::from(line.contains("waiting for a free slot"));
        took |= line.contains("took a slot");
    }
    assert_eq!(waiting_lines, 0, "the unchanged answer was logged again");
    assert!(took, "no log of taking the slot");
}

#[tokio::test]
async fn server_errors_are_retried() {
    let server = FleetLockServer::start(1).await.unwrap();
    let s = client(&server.url());

    server.fail_next(3);
    within("acquire through 500s", s.acquire(&me("a")))
        .await
        .unwrap();
    let st = server.state();
    assert_eq!((st.injected_failures, st.pre_reboot_requests), (3, 4));
    assert_eq!(st.holders("default"), vec!["a".to_string()]);

    server.fail_next(2);
    within("release through 500s", s.release(&me("a")))
        .await
        .unwrap();
    assert!(server.holders().is_empty());

    // A server that keeps failing: release gives up after release_attempts, naming the
    // endpoint, the status and the server's kind.
    within("acquire", s.acquire(&me("a"))).await.unwrap();
    server.fail_next(100);
    let before = server.state().steady_state_requests;
    let e = within("release against a failing server", s.release(&me("a")))
        .await
        .unwrap_err();
    let text = e.to_string();
    assert!(matches!(e, LockError::Backend { .. }), "{e:?}");
    assert!(
        text.contains(&format!("{}/v1/steady-state", server.url()))
            && text.contains("HTTP 500")
            && text.contains("internal_error"),
        "{text}"
    );
    assert_eq!(server.state().steady_state_requests - before, 3);
    assert_eq!(server.holders(), vec!["a".to_string()]);
}

#[tokio::test]
async fn unreachable_server() {
    let addr = common::free_loopback_addr();
    let url = format!("http://{addr}");
    let s = client(&url);

    match within("release", s.release(&me("a"))).await {
        Err(LockError::Unreachable {
            backend,
            target,
            reason,
        }) => {
            assert_eq!(backend, rebootd::lock::Backend::FleetLock);
            assert_eq!(target, format!("{url}/v1/steady-state"));
            assert!(
                reason.to_lowercase().contains("refused"),
                "reason: {reason}"
            );
        }
        other => panic!("release: {other:?}"),
    }

    // acquire keeps asking (and says so) until the server appears.
    let mut logs = capture();
    let waiter = {
        let s = s.clone();
        tokio::spawn(async move { s.acquire(&me("a")).await })
    };
    let line = next_log(&mut logs, &[&url, "waiting for the FleetLock server"]).await;
    assert!(line.contains("unreachable"), "{line}");
    assert!(!waiter.is_finished());
    let server = FleetLockServer::start_on(addr, 1).await.unwrap();
    within("acquire once the server is up", waiter)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(server.holders(), vec!["a".to_string()]);
}

/// A 4xx other than "taken" is a permanent refusal naming URL, status, kind and value.
#[tokio::test]
async fn refusals_name_url_status_kind_and_value() {
    let server = FleetLockServer::start(1).await.unwrap();
    server.only_groups(&["workers"]);
    let s = client(&server.url());
    let e = within("acquire in an unknown group", s.acquire(&me("a")))
        .await
        .unwrap_err();
    let LockError::Refused(m) = &e else {
        panic!("{e:?}")
    };
    for part in [
        format!("{}/v1/pre-reboot", server.url()),
        "HTTP 400".into(),
        "unknown_group".into(),
        "unknown group \\\"default\\\"".into(),
    ] {
        assert!(m.contains(&part), "{part:?} missing in: {m}");
    }
    assert_eq!(
        server.state().pre_reboot_requests,
        1,
        "a refusal is not retried"
    );

    // Wrong base URL: 404 without a JSON body.
    let wrong = client(&format!("{}/nope", server.url()));
    match within("release at a wrong URL", wrong.release(&me("a"))).await {
        Err(LockError::Refused(m)) => {
            assert!(
                m.contains("/nope/v1/steady-state") && m.contains("HTTP 404"),
                "{m}"
            )
        }
        other => panic!("{other:?}"),
    }

    // Settings the protocol cannot use are refused before any request.
    for (url, group) in [("http://h", "under_score"), ("unix:/run/x", "default")] {
        assert!(matches!(
            FleetLock::new(url, group, fast()),
            Err(LockError::Refused(_))
        ));
    }
}

/// `curl` speaks the wire protocol and gets airlock's answers, from the lab server and from the
/// real airlock alike: the stand-in is checked against airlock, and rebootd's client against
/// both.
async fn curl_speaks_the_wire_protocol(server: Server) {
    let Ok(curl) = which("curl") else {
        // scripts/setup.sh installs curl: in CI a missing curl is a broken set-up, not a pass.
        assert!(std::env::var_os("CI").is_none(), "curl is not installed");
        eprintln!("curl not installed; skipping");
        return;
    };
    let url = server.url();
    let request = |method: &'static str, path: &'static str, body: &'static str, header: bool| {
        let mut cmd = tokio::process::Command::new(&curl);
        cmd.args([
            "-sS",
            "--max-time",
            "10",
            "-w",
            "\n%{http_code}",
            "-X",
            method,
        ]);
        if header {
            cmd.args(["-H", "fleet-lock-protocol: true"]);
        }
        cmd.args(["-H", "content-type: application/json"]);
        if !body.is_empty() {
            cmd.args(["--data-binary", body]);
        }
        cmd.arg(format!("{url}{path}"));
        async move {
            let out = within("curl", cmd.output()).await.expect("run curl");
            assert!(out.status.success(), "curl: {out:?}");
            let text = String::from_utf8(out.stdout).unwrap();
            let (body, code) = text.rsplit_once('\n').unwrap();
            (code.parse::<u16>().unwrap(), body.trim().to_string())
        }
    };
    let post = |path, body, header| request("POST", path, body, header);
    let a = r#"{"client_params": {"id": "curl-a", "group": "default"}}"#;
    let b = r#"{"client_params": {"id": "curl-b", "group": "default"}}"#;

    assert_eq!(post("/v1/pre-reboot", a, true).await, (200, String::new()));
    assert_eq!(server.holders(), vec!["curl-a".to_string()]);
    // Recursive: the holder asking again is granted.
    assert_eq!(post("/v1/pre-reboot", a, true).await.0, 200);

    let (code, body) = post("/v1/pre-reboot", b, true).await;
    assert_eq!(code, 500);
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["kind"], "failed_lock");
    assert_eq!(v["value"], "all 1 semaphore slots currently locked");

    let (code, body) = post("/v1/pre-reboot", b, false).await;
    assert_eq!(code, 400);
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["kind"], "invalid_client_identity");
    assert!(v["value"].as_str().unwrap().contains("fleet-lock-protocol"));

    assert_eq!(
        v["value"],
        "failed to validate client identity: wrong 'fleet-lock-protocol' header"
    );

    let (code, body) = post("/v1/pre-reboot", "{not json", true).await;
    assert_eq!(code, 400);
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["kind"], "invalid_client_identity");

    // What airlock answers, measured: empty id and group, a GET (no body), a PUT (any method
    // works), a path it does not serve.
    for (body, value) in [
        (
            r#"{"client_params": {"id": "", "group": "default"}}"#,
            "failed to validate client identity: empty client ID",
        ),
        (
            r#"{"client_params": {"id": "x"}}"#,
            "failed to validate client identity: empty client group",
        ),
    ] {
        let (code, answer) = post("/v1/pre-reboot", body, true).await;
        assert_eq!(code, 400, "{body}: {answer}");
        let v: serde_json::Value = serde_json::from_str(&answer).unwrap();
        assert_eq!(
            (v["kind"].as_str(), v["value"].as_str()),
            (Some("invalid_client_identity"), Some(value))
        );
    }
    let (code, answer) = request("GET", "/v1/pre-reboot", "", true).await;
    assert_eq!(code, 400, "{answer}");
    let v: serde_json::Value = serde_json::from_str(&answer).unwrap();
    assert_eq!(v["value"], "failed to validate client identity: EOF");
    assert_eq!(request("PUT", "/v1/steady-state", b, true).await.0, 200);
    assert_eq!(
        post("/nope/v1/pre-reboot", a, true).await,
        (404, "404 page not found".to_string())
    );

    // Unlock of a non-holder is success; unlock of the holder frees the slot.
    assert_eq!(post("/v1/steady-state", b, true).await.0, 200);
    assert_eq!(post("/v1/steady-state", a, true).await.0, 200);
    assert!(server.holders().is_empty());
    assert_eq!(post("/v1/pre-reboot", b, true).await.0, 200);

    // rebootd's client and curl see the same semaphore.
    let s = client(&url);
    within("release curl-b", s.release(&me("curl-b")))
        .await
        .unwrap();
    within("acquire", s.acquire(&me("rebootd"))).await.unwrap();
    assert_eq!(post("/v1/pre-reboot", a, true).await.0, 500);
    assert_eq!(server.holders(), vec!["rebootd".to_string()]);
}

fn which(name: &str) -> Result<std::path::PathBuf, ()> {
    let path = std::env::var_os("PATH").ok_or(())?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .ok_or(())
}

/// The real airlock refuses a group it does not serve: a permanent refusal naming the URL, the
/// status, airlock's kind and value, not retried.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn real_airlock_refuses_an_unknown_group() {
    let server = Server::airlock(&[("workers", 1)]).await;
    let s = client(&server.url());
    let e = within(
        "acquire in a group airlock does not serve",
        s.acquire(&me("a")),
    )
    .await
    .unwrap_err();
    let LockError::Refused(m) = &e else {
        panic!("{e:?}")
    };
    for part in [
        format!("{}/v1/pre-reboot", server.url()),
        "HTTP 400".into(),
        "unknown_group".into(),
        "unknown group \\\"default\\\"".into(),
    ] {
        assert!(m.contains(&part), "{part:?} missing in: {m}");
    }
    let wrong = client(&format!("{}/nope", server.url()));
    match within("release at a wrong URL", wrong.release(&me("a"))).await {
        Err(LockError::Refused(m)) => assert!(m.contains("HTTP 404"), "{m}"),
        other => panic!("{other:?}"),
    }
}

/// airlock without its etcd answers 500 `failed_sem_init`: rebootd keeps asking (and says so),
/// and takes the slot once etcd is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn real_airlock_without_its_etcd_is_retried() {
    let Server::Airlock { airlock, mut etcd } = Server::airlock(&[("default", 1)]).await else {
        unreachable!()
    };
    let url = airlock.url();
    etcd.stop().await.unwrap();
    let mut logs = capture();
    let s = client(&url);
    let waiter = tokio::spawn(async move { s.acquire(&me("a")).await });
    let line = next_log(&mut logs, &[&url, "waiting for the FleetLock server"]).await;
    assert!(line.contains("failed_sem_init"), "{line}");
    assert!(!waiter.is_finished());
    etcd.restart().await.unwrap();
    within("acquire once etcd is back", waiter)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(Airlock::holders(&etcd, "default").unwrap(), ["a"]);
}
