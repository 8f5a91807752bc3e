//! `deploy/monitoring/`: the Prometheus alerting rules pass the real `promtool check rules` and
//! their unit tests (`promtool test rules`); every metric the Grafana dashboard or a rule names
//! is one a running rebootd exports on `/metrics`; and a real Prometheus scraping a real rebootd
//! loads the rules, evaluates each without error, and answers every panel's query.
//!
//! promtool and Prometheus come from Debian's `prometheus` package (scripts/setup.sh). Missing,
//! the tests that need them skip, except in CI (`CI=true` or `CI=1`), where they fail.

mod common;

use common::etcd::in_ci;
use common::{free_loopback_addr, node, WAIT};
use hyper::Method;
use rebootd_lab::prometheus::{prometheus, request};
use serde_json::Value;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

fn monitoring() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/monitoring")
}

const RULES: &str = "rebootd.rules.yaml";
const RULE_TESTS: &str = "rebootd.rules.test.yaml";
const DASHBOARD: &str = "rebootd-dashboard.json";

/// Whether `tool` runs; when it does not: a panic in CI, else a note that the test skips.
fn installed(tool: &str) -> bool {
    let found = std::process::Command::new(tool)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        assert!(
            !in_ci(),
            "{tool} is not installed (Debian's prometheus package; scripts/setup.sh installs it)"
        );
        eprintln!("skipping: {tool} is not installed");
    }
    found
}

fn promtool(args: &[&str]) -> String {
    let out = std::process::Command::new("promtool")
        .args(args)
        .current_dir(monitoring())
        .output()
        .expect("run promtool");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "promtool {args:?}:\n{text}");
    text
}

#[test]
fn the_rules_pass_promtool_check_and_their_unit_tests() {
    if !installed("promtool") {
        return;
    }
    let out = promtool(&["check", "rules", RULES]);
    assert!(out.contains("SUCCESS: 6 rules found"), "{out}");
    let out = promtool(&["test", "rules", RULE_TESTS]);
    assert!(out.contains("SUCCESS"), "{out}");
    // Every alert has a unit test.
    let tests = std::fs::read_to_string(monitoring().join(RULE_TESTS)).unwrap();
    for alert in alerts() {
        assert!(
            tests.contains(&format!("alertname: {alert}")),
            "{alert} has no unit test"
        );
    }
}

/// The rules file, parsed.
fn rules() -> Vec<Value> {
    let text = std::fs::read_to_string(monitoring().join(RULES)).unwrap();
    let doc: Value = serde_norway::from_str(&text).unwrap();
    doc["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap().clone())
        .collect()
}

fn alerts() -> Vec<String> {
    rules()
        .iter()
        .map(|r| r["alert"].as_str().unwrap().to_string())
        .collect()
}

/// Every PromQL expression of the dashboard: each target's `expr` and each variable's query.
fn dashboard_queries() -> Vec<String> {
    fn walk(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::Object(o) => {
                for (k, x) in o {
                    match (k.as_str(), x) {
                        ("expr", Value::String(s)) | ("definition", Value::String(s)) => {
                            out.push(s.clone())
                        }
                        _ => walk(x, out),
                    }
                }
            }
            Value::Array(a) => a.iter().for_each(|x| walk(x, out)),
            _ => {}
        }
    }
    let text = std::fs::read_to_string(monitoring().join(DASHBOARD)).unwrap();
    let dash: Value = serde_json::from_str(&text).unwrap();
    let mut out = Vec::new();
    walk(&dash, &mut out);
    out
}

/// The `rebootd_` metric names in a PromQL expression.
fn names_in(expr: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = expr;
    while let Some(i) = rest.find("rebootd_") {
        let boundary = rest[..i]
            .chars()
            .next_back()
            .is_none_or(|c| !(c.is_ascii_alphanumeric() || c == '_'));
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        if boundary {
            out.insert(tail[..end].to_string());
        }
        rest = &tail[end..];
    }
    out
}

/// The metric names of an exposition: each sample's name (counters with `_total`).
fn exported(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| l.split(['{', ' ']).next())
        .map(str::to_string)
        .collect()
}

async fn scrape(addr: std::net::SocketAddr) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
    conn.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut out = String::new();
    conn.read_to_string(&mut out).await.unwrap();
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    // The body, after the head (the exposition is not chunked: Content-Length).
    match out.split_once("\r\n\r\n") {
        Some((_, body)) => body.to_string(),
        None => panic!("no end of head: {out}"),
    }
}

/// Every name the dashboard and the rules use, with where.
fn names_used() -> Vec<(String, String)> {
    let mut used = Vec::new();
    for q in dashboard_queries() {
        used.extend(
            names_in(&q)
                .into_iter()
                .map(|n| (n, format!("dashboard: {q}"))),
        );
    }
    for r in rules() {
        let expr = r["expr"].as_str().unwrap();
        let alert = r["alert"].as_str().unwrap();
        used.extend(
            names_in(expr)
                .into_iter()
                .map(|n| (n, format!("rule {alert}"))),
        );
    }
    used
}

#[test]
fn names_are_read_out_of_promql() {
    assert_eq!(
        names_in(
            "sum by (x) (rate(rebootd_a_total{j=~\"$job\"}[5m])) / rebootd_b and not_rebootd_c"
        ),
        ["rebootd_a_total", "rebootd_b"].map(String::from).into()
    );
    assert_eq!(
        exported("# HELP rebootd_a x\nrebootd_a{b=\"c\"} 1\nrebootd_d_total 0\n"),
        ["rebootd_a", "rebootd_d_total"].map(String::from).into()
    );
}

/// A real rebootd process serves every metric a panel or a rule names, and the dashboard covers
/// what it is for: fleet progress, holders, waiters by reason, reboot durations, drain failures.
#[tokio::test]
async fn every_metric_a_panel_or_rule_names_is_served_by_a_running_rebootd() {
    let addr = free_loopback_addr();
    let node = node("mon1", &format!("[metrics]\nlisten = \"{addr}\"\n")).await;
    node.wait_ready(WAIT).await.unwrap();
    let text = scrape(addr).await;
    let served = exported(&text);
    let used = names_used();
    let missing: Vec<String> = used
        .iter()
        .filter(|(n, _)| !served.contains(n))
        .map(|(n, at)| format!("{n} ({at})"))
        .collect();
    assert!(
        missing.is_empty(),
        "named but not served:\n{}\n--- served ---\n{text}",
        missing.join("\n")
    );
    let names: BTreeSet<&str> = used.iter().map(|(n, _)| n.as_str()).collect();
    for covered in [
        "rebootd_reboot_needed",
        "rebootd_reboots_total",
        "rebootd_slot_held",
        "rebootd_slot_held_since_timestamp_seconds",
        "rebootd_waiting",
        "rebootd_last_reboot_duration_seconds",
        "rebootd_drain_failures_total",
        "rebootd_lock_errors_in_a_row",
    ] {
        assert!(names.contains(covered), "nothing shows {covered}");
    }
    assert!(
        text.contains("rebootd_info{node=\"mon1\",group=\"default\""),
        "{text}"
    );
    // Every metric served has its row in docs/monitoring.md's reference.
    let docs =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/monitoring.md"))
            .unwrap();
    let undocumented: Vec<&String> = served
        .iter()
        .filter(|n| !docs.contains(&format!("| `{n}` |")))
        .collect();
    assert!(
        undocumented.is_empty(),
        "not in docs/monitoring.md's metrics reference: {undocumented:?}"
    );
}

/// A real rebootd that needs a reboot outside its window says so: the need, the reason it
/// waits, since when, and nothing blocked.
#[tokio::test]
async fn a_running_rebootd_says_why_it_waits() {
    let addr = free_loopback_addr();
    let config = format!(
        "[metrics]\nlisten = \"{addr}\"\n\n[[window]]\ndays = []\nstart = \"00:00\"\nlength = \"1h\"\n"
    );
    let node = node("mon3", &config).await;
    node.wait_ready(WAIT).await.unwrap();
    node.update_engine
        .set_status("UPDATE_STATUS_UPDATED_NEED_REBOOT", "2.0")
        .await
        .unwrap();
    let s = node
        .wait_state("waiting for the window", WAIT, |s| {
            s.phase == rebootd::state::Phase::WaitingForWindow
        })
        .await
        .unwrap();
    let text = scrape(addr).await;
    let value = |series: &str| -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
            .unwrap_or_else(|| panic!("no {series} in {text}"))
            .parse()
            .unwrap()
    };
    assert_eq!(value("rebootd_reboot_needed"), 1.0);
    assert_eq!(value("rebootd_waiting{reason=\"window\"}"), 1.0);
    assert_eq!(value("rebootd_waiting{reason=\"slot\"}"), 0.0);
    assert_eq!(value("rebootd_reboot_blocked"), 0.0);
    assert_eq!(
        value("rebootd_phase_since_timestamp_seconds"),
        s.since.as_millisecond() as f64 / 1000.0
    );
    assert_eq!(value("rebootd_slot_held_since_timestamp_seconds"), 0.0);
}

/// A PromQL query of the dashboard, as Grafana sends it for the job `lab`.
fn as_grafana_sends(q: &str) -> String {
    q.replace("$__rate_interval", "1m")
        .replace("$__range", "1h")
        .replace("$job", "lab")
}

/// Real Prometheus, scraping a real rebootd every second, loads the rules (it refuses to start
/// on a rule it cannot parse), evaluates every rule without error, and answers every query of
/// the dashboard (a many-to-many match or a bad expression is an error here, with real series).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_prometheus_loads_the_rules_and_answers_every_panel() {
    if !installed("prometheus") {
        return;
    }
    let addr = free_loopback_addr();
    let _node = node("mon2", &format!("[metrics]\nlisten = \"{addr}\"\n")).await;
    let rules = std::fs::read_to_string(monitoring().join(RULES)).unwrap();
    let prom = prometheus(addr, &rules)
        .await
        .expect("Prometheus starts with the rules");
    let client = rebootd::http::client(false, &Default::default(), Duration::from_secs(5)).unwrap();
    let query = |q: String| {
        let client = client.clone();
        let url = format!(
            "{}/api/v1/query?query={}",
            prom.url,
            url::form_urlencoded::byte_serialize(q.as_bytes()).collect::<String>()
        );
        async move { request(&client, Method::GET, &url, None).await.unwrap() }
    };
    // Prometheus is an outside process that says nothing when it scraped or evaluated: ask it,
    // bounded, until it did (as tests/gate_prometheus.rs does).
    let deadline = Instant::now() + WAIT;
    loop {
        let (_, scraped) = query("rebootd_info".into()).await;
        let (_, rules) = request(
            &client,
            Method::GET,
            &format!("{}/api/v1/rules", prom.url),
            None,
        )
        .await
        .unwrap();
        let health: Vec<(String, String)> = rules["data"]["groups"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
            .map(|r| {
                (
                    r["name"].as_str().unwrap_or("").to_string(),
                    r["health"].as_str().unwrap_or("").to_string(),
                )
            })
            .collect();
        let up = scraped["data"]["result"]
            .as_array()
            .is_some_and(|r| !r.is_empty());
        let evaluated =
            health.len() == alerts().len() && health.iter().all(|(_, h)| h != "unknown");
        if up && evaluated {
            let bad: Vec<_> = health.iter().filter(|(_, h)| h != "ok").collect();
            assert!(bad.is_empty(), "rules in error: {bad:?}\n{rules:#}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "Prometheus did not scrape rebootd and evaluate the rules in time: {health:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let mut answered = 0;
    for q in dashboard_queries() {
        let promql = as_grafana_sends(&q);
        // Grafana's label_values(metric, label) is not PromQL: ask for the metric.
        let promql = match promql.strip_prefix("label_values(") {
            Some(rest) => rest.split(',').next().unwrap().to_string(),
            None => promql,
        };
        let (status, body) = query(promql.clone()).await;
        assert_eq!(status, 200, "{promql}: {body}");
        assert_eq!(body["status"], "success", "{promql}: {body}");
        answered += 1;
    }
    assert!(answered >= 20, "dashboard queries: {answered}");
    // The fleet's headline numbers are there for this idle node.
    for (q, want) in [
        ("sum(rebootd_reboot_needed{job=~\"lab\"})", "0"),
        ("sum(rebootd_slot_held{job=~\"lab\"})", "0"),
        ("sum(rebootd_waiting{job=~\"lab\"})", "0"),
    ] {
        let (_, body) = query(q.into()).await;
        assert_eq!(body["data"]["result"][0]["value"][1], want, "{q}: {body}");
    }
}

/// The dashboard as Grafana imports it: unique panel ids, each panel placed on the 24-column
/// grid without overlap, on the dashboard's data source variable, with its queries; and its rows
/// cover what it is for.
#[test]
fn the_dashboard_is_laid_out_on_its_data_source() {
    let text = std::fs::read_to_string(monitoring().join(DASHBOARD)).unwrap();
    let dash: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(dash["uid"], "rebootd-fleet");
    let vars: Vec<&str> = dash["templating"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap())
        .collect();
    assert_eq!(vars, ["datasource", "job"]);
    let panels = dash["panels"].as_array().unwrap();
    let mut ids = BTreeSet::new();
    let mut cells = BTreeSet::new();
    let mut rows = Vec::new();
    for p in panels {
        let title = p["title"].as_str().unwrap();
        assert!(ids.insert(p["id"].as_u64().unwrap()), "{title}: id taken");
        let g = &p["gridPos"];
        let (x, y, w, h) = ["x", "y", "w", "h"].map(|k| g[k].as_u64().unwrap()).into();
        assert!(x + w <= 24 && w > 0 && h > 0, "{title}: {g}");
        for cx in x..x + w {
            for cy in y..y + h {
                assert!(cells.insert((cx, cy)), "{title} overlaps another panel");
            }
        }
        if p["type"] == "row" {
            rows.push(title);
            continue;
        }
        assert_eq!(p["datasource"]["uid"], "${datasource}", "{title}");
        let targets = p["targets"].as_array().unwrap();
        assert!(!targets.is_empty(), "{title}: no query");
        let refs: BTreeSet<&str> = targets
            .iter()
            .map(|t| t["refId"].as_str().unwrap())
            .collect();
        assert_eq!(refs.len(), targets.len(), "{title}: refIds");
        for t in targets {
            assert!(
                t["expr"].as_str().unwrap().contains("job=~\"$job\""),
                "{title}: not on the chosen job: {t}"
            );
        }
    }
    assert_eq!(
        rows,
        [
            "Fleet progress",
            "Holders",
            "Waiters",
            "Reboot durations",
            "Drain failures and errors"
        ]
    );
}
