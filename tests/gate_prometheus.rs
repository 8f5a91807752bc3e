//! Gates against a real Prometheus and Alertmanager (Debian's packages): an alert rule on a
//! gauge the test sets fires and resolves; the alerts gate waits while it fires, goes when an
//! Alertmanager silence covers it or it resolves; the query gate likewise. Also the command gate.

use std::time::{Duration, Instant};

use hyper::Method;
use rebootd::gate::command::CommandGate;
use rebootd::gate::prometheus::{AlertsGate, Matcher, QueryGate};
use rebootd::gate::{check_all, Gate, Verdict};
use rebootd_lab::prometheus::{alertmanager, prometheus, request, Exporter};
use serde_json::json;

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
        AlertsGate::new(&prom.url, None, critical.clone(), t).unwrap(),
    ));
    let silenced_ok = Gate::Alerts(Box::new(
        AlertsGate::new(&prom.url, Some(&am.url), critical.clone(), t).unwrap(),
    ));
    let any = Gate::Alerts(Box::new(
        AlertsGate::new(&prom.url, None, Vec::new(), t).unwrap(),
    ));
    let query = Gate::Query(Box::new(
        QueryGate::new(&prom.url, "lab_gate_value > 0", t).unwrap(),
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
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let nowhere = format!("http://127.0.0.1:{port}");
    let down = Gate::Query(Box::new(QueryGate::new(&nowhere, "up", t).unwrap()));
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
