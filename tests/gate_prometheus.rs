//! Gates against a real Prometheus and Alertmanager (Debian's packages): an alert rule on a
//! gauge the test sets fires and resolves; the alerts gate waits while it fires, goes when an
//! Alertmanager silence covers it or it resolves; the query gate likewise. A Prometheus over
//! https with its CA file and a token file. Against the lab's canned HTTP server: the bearer
//! token sent, and answers that are not the Prometheus API's (or too long) are a wait. Also the
//! command gate.

use std::time::{Duration, Instant};

use hyper::Method;
use rebootd::gate::command::CommandGate;
use rebootd::gate::prometheus::{Access, AlertsGate, Matcher, QueryGate};
use rebootd::gate::{check_all, Gate, Verdict};
use rebootd_lab::http_stub::HttpStub;
use rebootd_lab::prometheus::{alertmanager, prometheus, prometheus_tls, request, Exporter};
use serde_json::json;

mod common;

const RULES: &str = "groups:
  - name: lab
    rules:
      - alert: LabGateHigh
        expr: lab_gate_value > 0
        labels:
          severity: critical
      - alert: Watchdog
        expr: vector(1)
        labels:
          severity: none
";

/// How long Prometheus may take to scrape and evaluate (1 s each) on a loaded machine.
const SETTLE: Duration = Duration::from_secs(60);

/// Ask the gate until it says what `want` accepts (Prometheus is an outside process: its state
/// can only be asked for), or fail with the last answer.
async fn until(gate: &Gate, what: &str, want: impl Fn(&Verdict) -> bool) -> Verdict {
    let deadline = Instant::now() + SETTLE;
    loop {
        let v = gate.check().await;
        if want(&v) {
            return v;
        }
        assert!(Instant::now() < deadline, "{what}: still {v:?}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

fn waits_for(v: &Verdict, words: &str) -> bool {
    matches!(v, Verdict::Wait(w) if w.contains(words))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alerts_gate_waits_while_an_alert_fires_unless_silenced() {
    let exporter = Exporter::start().await.unwrap();
    let prom = prometheus(exporter.addr(), RULES).await.unwrap();
    let am = alertmanager().await.unwrap();
    let t = Duration::from_secs(5);
    let critical = vec![Matcher::parse("severity=\"critical\"").unwrap()];
    let gate = Gate::Alerts(Box::new(
        AlertsGate::new("test", &Access::url(&prom.url), None, critical.clone(), t).unwrap(),
    ));
    let silenced_ok = Gate::Alerts(Box::new(
        AlertsGate::new(
            "test",
            &Access::url(&prom.url),
            Some(&am.url),
            critical.clone(),
            t,
        )
        .unwrap(),
    ));
    let any = Gate::Alerts(Box::new(
        AlertsGate::new("test", &Access::url(&prom.url), None, Vec::new(), t).unwrap(),
    ));
    let query = Gate::Query(Box::new(
        QueryGate::new("test", &Access::url(&prom.url), "lab_gate_value > 0", t).unwrap(),
    ));

    // Rules evaluated (Watchdog fires), the gauge is 0: only Watchdog fires, and it does not
    // match the selector.
    until(&any, "Watchdog to fire", |v| waits_for(v, "Watchdog")).await;
    assert_eq!(gate.check().await, Verdict::Go);
    assert_eq!(query.check().await, Verdict::Go, "the gauge is 0");

    exporter.set(1.0);
    let v = until(&gate, "LabGateHigh to fire", |v| {
        waits_for(v, "LabGateHigh")
    })
    .await;
    assert!(waits_for(&v, "1 firing alert(s)"), "{v:?}");
    until(&query, "the query to see the gauge", |v| {
        waits_for(v, "returns 1 series")
    })
    .await;
    assert!(
        waits_for(&silenced_ok.check().await, "LabGateHigh"),
        "no silence yet"
    );

    // An operator silences it in Alertmanager: the gate that knows Alertmanager goes.
    let client = rebootd::http::client(false, &Default::default(), t).unwrap();
    let now = jiff::Timestamp::now();
    let (status, created) = request(
        &client,
        Method::POST,
        &format!("{}/api/v2/silences", am.url),
        Some(&json!({
            "matchers": [{"name": "alertname", "value": "LabGate.*", "isRegex": true, "isEqual": true}],
            "startsAt": now.to_string(),
            "endsAt": (now + jiff::SignedDuration::from_hours(1)).to_string(),
            "createdBy": "rebootd tests",
            "comment": "let reboots through",
        })),
    )
    .await
    .unwrap();
    assert_eq!(status, 200, "{created}");
    until(&silenced_ok, "the silence to count", |v| *v == Verdict::Go).await;
    assert!(
        waits_for(&gate.check().await, "LabGateHigh"),
        "without Alertmanager it still waits"
    );

    // The silence expires: waiting again.
    let id = created["silenceID"].as_str().unwrap();
    let (status, _) = request(
        &client,
        Method::DELETE,
        &format!("{}/api/v2/silence/{id}", am.url),
        None,
    )
    .await
    .unwrap();
    assert_eq!(status, 200);
    until(&silenced_ok, "the expired silence to stop counting", |v| {
        waits_for(v, "LabGateHigh")
    })
    .await;

    // It resolves: every gate goes.
    exporter.set(0.0);
    until(&gate, "LabGateHigh to resolve", |v| *v == Verdict::Go).await;
    until(&query, "the query to return nothing", |v| *v == Verdict::Go).await;
    assert_eq!(silenced_ok.check().await, Verdict::Go);
}

/// A Prometheus that is not there, or an unreachable Alertmanager, is a wait (fail closed), and
/// check_all says the first gate that waits.
#[tokio::test]
async fn gates_fail_closed_and_the_first_wait_is_said() {
    let t = Duration::from_secs(2);
    let nowhere = format!("http://{}", common::free_loopback_addr());
    let down = Gate::Query(Box::new(
        QueryGate::new("test", &Access::url(&nowhere), "up", t).unwrap(),
    ));
    assert!(waits_for(&down.check().await, "Prometheus to answer"));
    let ok = Gate::Command(CommandGate {
        argv: vec!["true".into()],
        timeout: t,
    });
    let no = Gate::Command(CommandGate {
        argv: vec![
            "sh".into(),
            "-c".into(),
            "echo maintenance >&2; exit 1".into(),
        ],
        timeout: t,
    });
    assert_eq!(check_all(std::slice::from_ref(&ok)).await, Verdict::Go);
    let v = check_all(&[ok, no, down]).await;
    assert!(waits_for(&v, "maintenance"), "{v:?}");
}

/// A Prometheus serving https with a certificate of a private CA: the gate reaches it with
/// `ca_file` (and a `bearer_token_file`, which Prometheus ignores), and without `ca_file` it
/// cannot (the system roots do not know the CA): a wait that says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prometheus_over_https_is_reached_with_its_ca_file() {
    let exporter = Exporter::start().await.unwrap();
    let prom = prometheus_tls(exporter.addr(), RULES).await.unwrap();
    assert!(prom.url.starts_with("https://"), "{}", prom.url);
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "s3cret\n").unwrap();
    let t = Duration::from_secs(5);
    let access = Access {
        url: prom.url.clone(),
        ca_file: prom.ca_file.clone(),
        bearer_token_file: Some(token),
    };
    let one = Gate::Query(Box::new(
        QueryGate::new("test", &access, "vector(1)", t).unwrap(),
    ));
    let v = one.check().await;
    assert!(waits_for(&v, "returns 1 series"), "{v:?}");
    let none = Gate::Query(Box::new(
        QueryGate::new("test", &access, "vector(1) > 2", t).unwrap(),
    ));
    assert_eq!(none.check().await, Verdict::Go);
    let alerts = Gate::Alerts(Box::new(
        AlertsGate::new("test", &access, None, Vec::new(), t).unwrap(),
    ));
    until(&alerts, "Watchdog to fire", |v| waits_for(v, "Watchdog")).await;

    let untrusted = Gate::Query(Box::new(
        QueryGate::new("test", &Access::url(&prom.url), "vector(1) > 2", t).unwrap(),
    ));
    let v = untrusted.check().await;
    assert!(waits_for(&v, "Prometheus to answer"), "{v:?}");
    assert!(waits_for(&v, "certificate"), "{v:?}");
}

/// The token file's content (without its newline) goes as `Authorization: Bearer`, read again
/// for each request (a rotated token is picked up); a token file that cannot be read is refused
/// when the gate is built, naming the key and the file, and a wait once it is gone.
#[tokio::test]
async fn the_bearer_token_file_is_sent_as_authorization_bearer() {
    let stub = HttpStub::start().await.unwrap();
    stub.answer(200, r#"{"status":"success","data":{"alerts":[]}}"#);
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "s3cret\n").unwrap();
    let t = Duration::from_secs(5);
    let access = Access {
        url: stub.url(),
        ca_file: None,
        bearer_token_file: Some(token.clone()),
    };
    let gate = AlertsGate::new("gates.before_reboot[1]", &access, None, Vec::new(), t).unwrap();
    assert_eq!(gate.check().await, Verdict::Go);
    std::fs::write(&token, "rotated").unwrap();
    assert_eq!(gate.check().await, Verdict::Go);
    let seen = stub.seen();
    let auth: Vec<Option<&str>> = seen.iter().map(|s| s.header("authorization")).collect();
    assert_eq!(
        auth,
        [Some("Bearer s3cret"), Some("Bearer rotated")],
        "{seen:?}"
    );
    assert_eq!(seen[0].path, "/api/v1/alerts");

    std::fs::remove_file(&token).unwrap();
    let v = gate.check().await;
    assert!(
        waits_for(&v, "gates.before_reboot[1].bearer_token_file") && waits_for(&v, "token"),
        "{v:?}"
    );
    let e = AlertsGate::new("gates.before_reboot[1]", &access, None, Vec::new(), t).unwrap_err();
    assert!(
        e.0.contains("gates.before_reboot[1].bearer_token_file")
            && e.0.contains(&token.display().to_string()),
        "{e}"
    );
    std::fs::write(&token, "\n").unwrap();
    let e = QueryGate::new("gates.after_boot[2]", &access, "up", t).unwrap_err();
    assert!(
        e.0.contains("gates.after_boot[2].bearer_token_file") && e.0.contains("empty"),
        "{e}"
    );
}

/// A gate answer that is not understood means wait, with the reason: a status other than
/// `success`, no status, `data` or `data.alerts` of another type, an alert without labels or
/// state, a query result that is not an array, and a body over the cap (even a valid one).
#[tokio::test]
async fn answers_that_are_not_understood_are_a_wait_that_says_why() {
    let stub = HttpStub::start().await.unwrap();
    let t = Duration::from_secs(5);
    let access = Access::url(&stub.url());
    let alerts = AlertsGate::new("test", &access, None, Vec::new(), t).unwrap();
    let query = QueryGate::new("test", &access, "up == 0", t).unwrap();
    let no_alerts = r#"{"status":"success","data":{"alerts":[]}}"#;
    stub.answer(200, no_alerts);
    assert_eq!(alerts.check().await, Verdict::Go, "the good answer");
    for (body, why) in [
        (
            r#"{"status":"error","errorType":"bad_data","error":"boom","data":{"alerts":[]}}"#,
            "status \"error\": bad_data: boom",
        ),
        (
            r#"{"status":"warming","data":{"alerts":[]}}"#,
            "status \"warming\"",
        ),
        (r#"{"data":{"alerts":[]}}"#, "no `status`"),
        (r#"{"status":"success"}"#, "`data` is not an object"),
        (
            r#"{"status":"success","data":[]}"#,
            "`data` is not an object",
        ),
        (
            r#"{"status":"success","data":{}}"#,
            "`data.alerts` is not an array",
        ),
        (
            r#"{"status":"success","data":{"alerts":{}}}"#,
            "`data.alerts` is not an array",
        ),
        (
            r#"{"status":"success","data":{"alerts":[{"foo":1}]}}"#,
            "without labels or state",
        ),
        ("[]", "no `status`"),
    ] {
        stub.answer(200, body);
        let v = alerts.check().await;
        assert!(
            waits_for(&v, "in a way rebootd understands") && waits_for(&v, why),
            "{body}: {v:?}"
        );
    }
    for (body, why) in [
        (
            r#"{"status":"success","data":{"resultType":"vector","result":{}}}"#,
            "not an array",
        ),
        (
            r#"{"status":"success","data":{"result":[]}}"#,
            "no `data.resultType`",
        ),
        (
            r#"{"status":"error","errorType":"timeout","error":"slow","data":{"resultType":"vector","result":[]}}"#,
            "timeout: slow",
        ),
    ] {
        stub.answer(200, body);
        let v = query.check().await;
        assert!(
            waits_for(&v, "in a way rebootd understands") && waits_for(&v, why),
            "{body}: {v:?}"
        );
    }
    stub.answer(
        200,
        r#"{"status":"success","data":{"resultType":"vector","result":[]}}"#,
    );
    assert_eq!(query.check().await, Verdict::Go, "the good answer");

    // A valid "no alerts" padded past the cap: not read to the end, so not believed.
    let mut long = no_alerts.as_bytes().to_vec();
    long.resize(rebootd::gate::prometheus::BODY_MAX + 1, b' ');
    stub.answer(200, long);
    let v = alerts.check().await;
    assert!(waits_for(&v, "longer than 16 MiB"), "{v:?}");
}
