//! The drain side of the Kubernetes integration (`rebootd::drain`, `rebootd::kube_client`)
//! against the lab's API stand-in over real HTTP with the kube-rs client.

use std::path::PathBuf;
use std::sync::Once;
use std::time::{Duration, Instant};

use rebootd::config::{DrainFailure, EmptyDirPods, Kubernetes, UnmanagedPods};
use rebootd::drain::{DrainError, Drainer, EventReason, KubeDrainer, NodeStatus};
use rebootd::kube_client;
use rebootd::state::Phase;
use rebootd_lab::kube_api::{
    DaemonSetBuilder, FaultRule, Kind, KubeApi, KubeApiHandle, NodeBuilder, Options, PdbBuilder,
    PodBuilder, ReplicaSetBuilder,
};
use serde_json::Value;

static TRACING: Once = Once::new();

fn init_tracing() {
    TRACING.call_once(|| {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_default_env()
                    .unwrap_or_else(|_| "rebootd=info".into()),
            )
            .with_test_writer()
            .try_init();
    });
}

struct Lab {
    api: KubeApiHandle,
    _dir: tempfile::TempDir,
    kubeconfig: PathBuf,
    client: kube::Client,
}

/// A stand-in with nodes `nodes` (Ready), a hundredth of real time (a 30 s grace period is
/// 0.3 s) and pods Ready 0.3 s after they land, and a no-retry client for it.
async fn lab(nodes: &[&str]) -> Lab {
    lab_with(
        nodes,
        Options {
            time_scale: 0.01,
            pod_ready_delay: Duration::from_secs(30),
            bookmark_interval: Duration::from_millis(500),
            ..Options::default()
        },
    )
    .await
}

/// A stand-in with these options and nodes `nodes` (Ready), and a no-retry client for it.
async fn lab_with(nodes: &[&str], options: Options) -> Lab {
    init_tracing();
    let api = KubeApi::start(options).await.expect("start the stand-in");
    for n in nodes {
        api.cluster().add(&NodeBuilder::new(n)).expect("add node");
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let kubeconfig = dir.path().join("kubeconfig");
    api.write_kubeconfig(&kubeconfig).expect("kubeconfig");
    let client = kube_client::connect(Some(&kubeconfig))
        .await
        .expect("connect");
    Lab {
        api,
        _dir: dir,
        kubeconfig,
        client,
    }
}

fn settings() -> Kubernetes {
    Kubernetes {
        kubeconfig: None,
        drain_timeout: Duration::from_secs(30),
        on_drain_failure: DrainFailure::Abort,
        pod_grace_period: None,
        skip_pods: None,
        blocking_pods: None,
        ready_timeout: Duration::from_secs(60),
        emptydir_pods: EmptyDirPods::Refuse,
        unmanaged_pods: UnmanagedPods::Refuse,
        force_delete_after: None,
        marks: Default::default(),
    }
}

fn drainer(lab: &Lab, node: &str, s: &Kubernetes) -> KubeDrainer {
    KubeDrainer::new(lab.client.clone(), node, s).expect("drainer")
}

fn s<'a>(v: &'a Value, ptr: &str) -> &'a str {
    v.pointer(ptr).and_then(Value::as_str).unwrap_or("")
}

fn uid(v: &Value) -> String {
    s(v, "/metadata/uid").to_string()
}

fn name(v: &Value) -> String {
    s(v, "/metadata/name").to_string()
}

fn label(v: &Value, k: &str) -> String {
    v.pointer("/metadata/labels")
        .and_then(|l| l.get(k))
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string()
}

fn is_ready(pod: &Value) -> bool {
    pod.pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| s(c, "/type") == "Ready" && s(c, "/status") == "True")
        })
}

fn events_on(lab: &Lab, node: &str, reason: &str) -> Vec<Value> {
    lab.api
        .cluster()
        .list(Kind::Event, None)
        .into_iter()
        .filter(|e| {
            s(e, "/involvedObject/kind") == "Node"
                && s(e, "/involvedObject/name") == node
                && s(e, "/reason") == reason
        })
        .collect()
}

fn evictions_of(lab: &Lab, pod: &str) -> usize {
    let suffix = format!("/pods/{pod}/eviction");
    lab.api
        .cluster()
        .requests()
        .count(|r| r.method == "POST" && r.path.ends_with(&suffix))
}

/// A node with ReplicaSet pods under a PodDisruptionBudget (maxUnavailable 1), a DaemonSet pod,
/// a mirror pod, a Succeeded pod, a pod matching skip_pods and a bare pod: the drain cordons,
/// evicts the ReplicaSet pods (the budget refuses some first: 429 in the request log, logged,
/// an EvictionBlocked Event), waits until they are gone by uid while the replacements land on
/// the other node, evicts the bare pod, and leaves the rest alone. The pods' own grace period
/// (an hour) would outlast the drain timeout: `pod_grace_period` reaches the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_evicts_under_a_budget_and_leaves_the_exempt_pods() {
    let lab = lab(&["a", "b"]).await;
    let c = lab.api.cluster();
    let (_, web) = c
        .add_replicaset(
            &ReplicaSetBuilder::new("default", "web").grace_period(3600),
            &["a", "a", "a"],
        )
        .expect("replicaset");
    c.add(
        &PdbBuilder::new("default", "web")
            .selector("app", "web")
            .max_unavailable(1),
    )
    .expect("pdb");
    c.add(&DaemonSetBuilder::new("kube-system", "node-agent"))
        .expect("daemonset");
    c.add(
        &PodBuilder::new("kube-system", "etcd-a")
            .on_node("a")
            .mirror(),
    )
    .expect("mirror pod");
    c.add(
        &PodBuilder::new("default", "job-1")
            .on_node("a")
            .phase("Succeeded"),
    )
    .expect("finished pod");
    c.add(
        &PodBuilder::new("default", "keep")
            .on_node("a")
            .label("rebootd.io/skip", "true"),
    )
    .expect("skipped pod");
    c.add(
        &PodBuilder::new("default", "bare")
            .on_node("a")
            .grace_period(1),
    )
    .expect("bare pod");
    let ds_pod = c
        .wait_for(Duration::from_secs(5), |s| {
            s.pods_on_node("a")
                .into_iter()
                .find(|p| label(p, "app") == "node-agent")
        })
        .await
        .expect("the DaemonSet controller places its pod on a");
    let untouched: Vec<(String, String)> = c
        .pods_on_node("a")
        .iter()
        .filter(|p| label(p, "app") != "web" && name(p) != "bare")
        .map(|p| (name(p), uid(p)))
        .collect();
    assert_eq!(
        untouched.len(),
        4,
        "ds, mirror, finished, skipped: {untouched:?}"
    );
    assert!(untouched.contains(&(name(&ds_pod), uid(&ds_pod))));

    let d = drainer(
        &lab,
        "a",
        &Kubernetes {
            pod_grace_period: Some(Duration::from_secs(2)),
            skip_pods: Some("rebootd.io/skip in (true,yes)".into()),
            drain_timeout: Duration::from_secs(25),
            // "bare" has no controller.
            unmanaged_pods: UnmanagedPods::Evict,
            ..settings()
        },
    );
    assert!(!d.is_unschedulable().await.expect("read node"));
    let started = Instant::now();
    d.drain().await.expect("drain");
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "the grace period override must reach the server (took {:?})",
        started.elapsed()
    );

    assert!(d.is_unschedulable().await.expect("read node"), "cordoned");
    let on_a = c.pods_on_node("a");
    for p in &web {
        assert!(
            c.read(|s| s.list(Kind::Pod, Some("default")))
                .iter()
                .all(|q| uid(q) != uid(p)),
            "{} is gone",
            name(p)
        );
        assert!(evictions_of(&lab, &name(p)) >= 1);
    }
    assert!(
        on_a.iter()
            .all(|p| label(p, "app") != "web" && name(p) != "bare"),
        "left on a: {:?}",
        on_a.iter().map(name).collect::<Vec<_>>()
    );
    let mut left: Vec<(String, String)> = on_a.iter().map(|p| (name(p), uid(p))).collect();
    left.sort();
    let mut expected = untouched.clone();
    expected.sort();
    assert_eq!(left, expected, "the exempt pods are untouched");
    for (n, _) in &untouched {
        assert_eq!(evictions_of(&lab, n), 0, "{n} was not evicted");
        let p = c
            .pods_on_node("a")
            .into_iter()
            .find(|p| &name(p) == n)
            .expect("still there");
        assert!(
            p.pointer("/metadata/deletionTimestamp").is_none(),
            "{n} not terminating"
        );
    }
    assert_eq!(evictions_of(&lab, "bare"), 1);

    // The replacements land on b and become Ready.
    c.wait_for(Duration::from_secs(10), |s| {
        let web_on_b = s
            .pods_on_node("b")
            .into_iter()
            .filter(|p| label(p, "app") == "web" && is_ready(p))
            .count();
        (web_on_b == 3).then_some(())
    })
    .await
    .expect("three Ready web pods on b");

    // The budget refused at least one eviction, and that was reported.
    let refused = c.requests().count(|r| {
        r.method == "POST"
            && r.path.ends_with("/eviction")
            && r.status == 429
            && r.reason.as_deref() == Some("TooManyRequests")
    });
    assert!(refused >= 1, "the PDB refused at least one eviction");
    let blocked = events_on(&lab, "a", "EvictionBlocked");
    assert!(!blocked.is_empty(), "an EvictionBlocked event");
    for e in &blocked {
        assert_eq!(s(e, "/type"), "Warning");
        assert_eq!(s(e, "/source/component"), "rebootd");
        assert!(
            s(e, "/message").contains("PodDisruptionBudget default/web"),
            "{}",
            s(e, "/message")
        );
    }
    // Once per change, not once per refusal.
    assert!(blocked.len() <= web.len(), "{} events", blocked.len());

    // Draining again is a no-op (already cordoned, nothing left to evict).
    let posts = c.requests().count(|r| r.path.ends_with("/eviction"));
    d.drain().await.expect("second drain");
    assert_eq!(c.requests().count(|r| r.path.ends_with("/eviction")), posts);
}

/// A budget that never allows a disruption (minAvailable = replicas): the drain stops at
/// drain_timeout with Timeout naming the pod left, after 429s; the node stays cordoned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_blocked_by_a_budget_times_out_listing_the_pod() {
    let lab = lab(&["a", "b"]).await;
    let c = lab.api.cluster();
    let (_, pods) = c
        .add_replicaset(&ReplicaSetBuilder::new("default", "db"), &["a", "b"])
        .expect("replicaset");
    c.add(
        &PdbBuilder::new("default", "db")
            .selector("app", "db")
            .min_available(2),
    )
    .expect("pdb");
    let on_a = pods
        .iter()
        .find(|p| s(p, "/spec/nodeName") == "a")
        .expect("pod on a");

    let metrics = rebootd::metrics::Metrics::default();
    let d = drainer(
        &lab,
        "a",
        &Kubernetes {
            drain_timeout: Duration::from_secs(3),
            ..settings()
        },
    )
    .with_metrics(metrics.clone());
    let started = Instant::now();
    let err = d.drain().await.expect_err("the budget never allows");
    let took = started.elapsed();
    match &err {
        DrainError::Timeout { left } => {
            assert_eq!(left, &vec![format!("default/{}", name(on_a))]);
        }
        other => panic!("expected Timeout, got {other:?}"),
    }
    assert!(err.to_string().contains(&name(on_a)), "{err}");
    assert!(
        took >= Duration::from_secs(3) && took < Duration::from_secs(6),
        "stopped at the deadline: {took:?}"
    );
    // Retried with backoff (1 s, 2 s, ...), not hammered and not given up on.
    let refused = evictions_of(&lab, &name(on_a));
    assert!((2..=5).contains(&refused), "{refused} eviction attempts");
    assert_eq!(
        c.requests()
            .count(|r| r.path.ends_with("/eviction") && r.status == 429),
        refused
    );
    // The pod is still there and the node still cordoned: the caller decides what next.
    assert!(c.pod("default", &name(on_a)).is_some());
    assert!(d.is_unschedulable().await.expect("read node"));
    assert_eq!(events_on(&lab, "a", "EvictionBlocked").len(), 1);
    // Each refusal is counted in the metric.
    let text = metrics.render(jiff::Timestamp::now());
    assert!(
        text.contains(&format!("rebootd_evictions_blocked_total {refused}\n")),
        "{refused} refusals: {text}"
    );
}

/// is_unschedulable before and after; uncordon is idempotent; an operator's cordon is seen.
#[tokio::test]
async fn cordon_state_and_uncordon() {
    let lab = lab(&["a"]).await;
    let c = lab.api.cluster();
    c.add(&NodeBuilder::new("ops").unschedulable(true))
        .expect("node");
    let d = drainer(&lab, "a", &settings());
    assert!(!d.is_unschedulable().await.expect("read"));
    d.drain().await.expect("drain of an empty node");
    assert!(d.is_unschedulable().await.expect("read"));
    assert_eq!(
        c.node("a").expect("node").pointer("/spec/unschedulable"),
        Some(&Value::Bool(true))
    );
    d.uncordon().await.expect("uncordon");
    assert!(!d.is_unschedulable().await.expect("read"));
    d.uncordon().await.expect("uncordon again");
    assert!(!d.is_unschedulable().await.expect("read"));

    let ops = drainer(&lab, "ops", &settings());
    assert!(ops.is_unschedulable().await.expect("read"));

    let missing = drainer(&lab, "nope", &settings());
    let err = missing.is_unschedulable().await.expect_err("no such node");
    assert_eq!(err.status(), Some(404), "{err}");
    assert!(err.to_string().contains("get node nope"), "{err}");
}

/// blocking_pods: a running match on this node blocks; a Succeeded match, a match on another
/// node and a non-match do not; no selector = nothing blocks.
#[tokio::test]
async fn blocking_pods_finds_running_matches_on_this_node() {
    let lab = lab(&["a", "b"]).await;
    let c = lab.api.cluster();
    c.add(
        &PodBuilder::new("batch", "backup-1")
            .on_node("a")
            .label("app", "backup"),
    )
    .expect("pod");
    c.add(
        &PodBuilder::new("batch", "backup-0")
            .on_node("a")
            .label("app", "backup")
            .phase("Succeeded"),
    )
    .expect("pod");
    c.add(
        &PodBuilder::new("batch", "backup-b")
            .on_node("b")
            .label("app", "backup"),
    )
    .expect("pod");
    c.add(
        &PodBuilder::new("batch", "web")
            .on_node("a")
            .label("app", "web"),
    )
    .expect("pod");

    let none = drainer(&lab, "a", &settings());
    assert_eq!(
        none.blocking_pods().await.expect("list"),
        Vec::<String>::new()
    );

    for sel in ["app=backup", "app in (backup, restore)", "app,app!=web"] {
        let d = drainer(
            &lab,
            "a",
            &Kubernetes {
                blocking_pods: Some(sel.into()),
                ..settings()
            },
        );
        assert_eq!(
            d.blocking_pods().await.expect("list"),
            vec!["batch/backup-1".to_string()],
            "{sel}"
        );
    }
    let d = drainer(
        &lab,
        "a",
        &Kubernetes {
            blocking_pods: Some("app=restore".into()),
            ..settings()
        },
    );
    assert!(d.blocking_pods().await.expect("list").is_empty());

    let bad = KubeDrainer::new(
        lab.client.clone(),
        "a",
        &Kubernetes {
            skip_pods: Some("  ".into()),
            ..settings()
        },
    )
    .expect_err("an empty selector would match every pod");
    assert!(bad.to_string().contains("skip_pods"), "{bad}");
}

/// wait_ready returns once the node turns Ready (after the call started, seen by the watch),
/// and times out naming the condition when it stays NotReady.
#[tokio::test]
async fn wait_ready_watches_the_node() {
    let lab = lab(&["a"]).await;
    let c = lab.api.cluster();
    c.set_node_ready("a", false).expect("not ready");
    let d = drainer(&lab, "a", &settings());

    let wait = d.wait_ready(Duration::from_secs(20));
    tokio::pin!(wait);
    assert!(
        tokio::time::timeout(Duration::from_millis(500), &mut wait)
            .await
            .is_err(),
        "not Ready yet: still waiting"
    );
    c.set_node_ready("a", true).expect("ready");
    tokio::time::timeout(Duration::from_secs(5), wait)
        .await
        .expect("returns soon after the node is Ready")
        .expect("Ready");
    // A watch, not a poll: one list and one watch request (and maybe a resumed watch).
    let reads = c
        .requests()
        .count(|r| r.method == "GET" && r.path.starts_with("/api/v1/nodes"));
    assert!(reads <= 3, "{reads} GETs on nodes");

    c.set_node_ready("a", false).expect("not ready");
    let started = Instant::now();
    let err = d
        .wait_ready(Duration::from_millis(800))
        .await
        .expect_err("stays NotReady");
    assert!(started.elapsed() >= Duration::from_millis(800));
    match &err {
        DrainError::NotReady { node, last, .. } => {
            assert_eq!(node, "a");
            assert!(last.contains("Ready=Unknown"), "{last}");
        }
        other => panic!("expected NotReady, got {other:?}"),
    }
}

/// Annotations and Events land on the Node, as kubectl would show them.
#[tokio::test]
async fn annotations_and_events_are_visible() {
    let lab = lab(&["a"]).await;
    let c = lab.api.cluster();
    c.update(Kind::Node, "", "a", |n| {
        n["metadata"]["annotations"]["example.com/keep"] = "yes".into();
    })
    .expect("annotate");
    let d = drainer(&lab, "a", &settings());
    let since: jiff::Timestamp = "2025-03-01T02:03:04.5Z".parse().expect("timestamp");
    d.annotate(Phase::Draining, since, true)
        .await
        .expect("annotate");
    let node = c.node("a").expect("node");
    let ann = &node["metadata"]["annotations"];
    assert_eq!(ann["rebootd.io/phase"], "draining");
    assert_eq!(ann["rebootd.io/reboot-needed"], "true");
    assert_eq!(ann["example.com/keep"], "yes", "other annotations are kept");
    let since_text = ann["rebootd.io/since"].as_str().expect("since");
    assert_eq!(since_text, "2025-03-01T02:03:04Z");
    d.annotate(Phase::Idle, jiff::Timestamp::now(), false)
        .await
        .expect("annotate");
    let node = c.node("a").expect("node");
    assert_eq!(node["metadata"]["annotations"]["rebootd.io/phase"], "idle");
    assert_eq!(
        node["metadata"]["annotations"]["rebootd.io/reboot-needed"],
        "false"
    );

    d.event(EventReason::Rebooting, "rebooting for update 1.2.3")
        .await
        .expect("event");
    d.event(EventReason::NotReadyAfterReboot, "node not Ready after 15m")
        .await
        .expect("event");
    d.event(EventReason::Rebooting, "second one")
        .await
        .expect("a second event with the same reason");
    let rebooting = events_on(&lab, "a", "Rebooting");
    assert_eq!(rebooting.len(), 2);
    let e = &rebooting[0];
    assert_eq!(s(e, "/metadata/namespace"), "default");
    assert_eq!(s(e, "/type"), "Normal");
    assert_eq!(s(e, "/source/component"), "rebootd");
    assert_eq!(s(e, "/source/host"), "a");
    assert_eq!(s(e, "/involvedObject/apiVersion"), "v1");
    assert_eq!(
        s(e, "/involvedObject/uid"),
        "a",
        "as the kubelet: uid = node name"
    );
    assert!(s(e, "/metadata/name").starts_with("a."));
    assert!(!s(e, "/firstTimestamp").is_empty());
    let warn = events_on(&lab, "a", "NotReadyAfterReboot");
    assert_eq!(warn.len(), 1);
    assert_eq!(s(&warn[0], "/type"), "Warning");
    assert_eq!(s(&warn[0], "/message"), "node not Ready after 15m");
}

/// The client never retries by itself: a 429 answered once to a GET surfaces as an error after
/// exactly one request; kube-rs's default client (the control) would have retried it.
#[tokio::test]
async fn client_does_not_retry() {
    let lab = lab(&["a"]).await;
    let c = lab.api.cluster();
    let d = drainer(&lab, "a", &settings());
    let gets = |c: &rebootd_lab::kube_api::Cluster| {
        c.requests()
            .count(|r| r.method == "GET" && r.path == "/api/v1/nodes/a")
    };

    c.faults()
        .inject(FaultRule::status("/api/v1/nodes/a", 429, 1).method("GET"));
    let err = d.is_unschedulable().await.expect_err("the 429 surfaces");
    assert_eq!(err.status(), Some(429), "{err}");
    assert_eq!(gets(c), 1, "sent once");
    assert_eq!(c.faults().pending(), 0);
    assert!(!d.is_unschedulable().await.expect("then it works"));
    assert_eq!(gets(c), 2);

    // 503 too.
    c.faults()
        .inject(FaultRule::status("/api/v1/nodes/a", 503, 1).method("GET"));
    let err = d.is_unschedulable().await.expect_err("the 503 surfaces");
    assert_eq!(err.status(), Some(503), "{err}");
    assert_eq!(gets(c), 3);

    // The control: kube-rs's default stack retries the same fault and hides it.
    let config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(&lab.kubeconfig).expect("read"),
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .expect("config");
    assert!(config.default_retry, "kube-rs retries by default");
    let retrying = kube::Client::try_from(config).expect("client");
    c.faults()
        .inject(FaultRule::status("/api/v1/nodes/a", 429, 1).method("GET"));
    let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(retrying);
    nodes.get("a").await.expect("retried behind our back");
    assert_eq!(gets(c), 5, "the default client sent it twice");
}

/// A kubeconfig that cannot be read or parsed is named in the error.
#[tokio::test]
async fn connect_names_a_bad_kubeconfig() {
    let dir = tempfile::tempdir().expect("dir");
    let missing = dir.path().join("missing.yaml");
    let Err(err) = kube_client::connect(Some(&missing)).await else {
        panic!("a missing kubeconfig must fail");
    };
    assert!(err.to_string().contains("missing.yaml"), "{err}");

    let garbage = dir.path().join("garbage.yaml");
    std::fs::write(&garbage, "clusters: [ {{{ not yaml").expect("write");
    let Err(err) = kube_client::connect(Some(&garbage)).await else {
        panic!("a garbage kubeconfig must fail");
    };
    let text = err.to_string();
    assert!(text.contains("garbage.yaml"), "{text}");
    assert!(text.contains("parse"), "says why: {text}");
}

/// Transient eviction failures (500, and a 409 while the pod with that uid is still there) are
/// retried; an answer retrying cannot cure (403) fails the drain naming the call.
#[tokio::test]
async fn eviction_failures_retried_or_reported() {
    let lab = lab(&["a"]).await;
    let c = lab.api.cluster();
    c.add(&PodBuilder::new("default", "x").on_node("a").grace_period(1))
        .expect("pod");
    c.faults()
        .inject(FaultRule::status("/pods/x/eviction", 500, 1).method("POST"));
    c.faults()
        .inject(FaultRule::status("/pods/x/eviction", 409, 1).method("POST"));
    let d = drainer(
        &lab,
        "a",
        &Kubernetes {
            unmanaged_pods: UnmanagedPods::Evict,
            ..settings()
        },
    );
    d.drain().await.expect("drain");
    assert_eq!(evictions_of(&lab, "x"), 3, "500, 409, then accepted");
    assert!(c.pod("default", "x").is_none());
    assert!(
        events_on(&lab, "a", "EvictionBlocked").is_empty(),
        "no budget involved"
    );

    c.add(&PodBuilder::new("default", "y").on_node("a"))
        .expect("pod");
    c.faults()
        .inject(FaultRule::status("/pods/y/eviction", 403, 1).method("POST"));
    let err = d.drain().await.expect_err("forbidden");
    assert_eq!(err.status(), Some(403), "{err}");
    assert!(err.to_string().contains("evict pod default/y"), "{err}");
    assert_eq!(evictions_of(&lab, "y"), 1);
}

/// With the boot id known, a Ready left over from before the reboot does not count: wait_ready
/// returns once the kubelet reports this boot.
#[tokio::test]
async fn wait_ready_with_boot_id_ignores_a_stale_ready() {
    let lab = lab(&[]).await;
    let c = lab.api.cluster();
    c.add(&NodeBuilder::new("a").boot_id("0b6f-old"))
        .expect("node");
    let d = drainer(&lab, "a", &settings()).with_boot_id("0B6F-NEW\n");

    let err = d
        .wait_ready(Duration::from_millis(500))
        .await
        .expect_err("Ready, but from the old boot");
    assert!(err.to_string().contains("0b6f-old"), "{err}");

    let wait = d.wait_ready(Duration::from_secs(20));
    tokio::pin!(wait);
    assert!(tokio::time::timeout(Duration::from_millis(300), &mut wait)
        .await
        .is_err());
    c.update(Kind::Node, "", "a", |n| {
        n["status"]["nodeInfo"]["bootID"] = "0b6f-new".into();
    })
    .expect("kubelet reports the new boot");
    tokio::time::timeout(Duration::from_secs(5), wait)
        .await
        .expect("returns soon")
        .expect("Ready in this boot");
}

/// Real time, replacements Ready 3.5 s after they land; ReplicaSet `db` with two pods on `a` and
/// one on `b` under a budget with maxUnavailable 1, so the second pod on `a` can only go once
/// the first one's replacement is Ready. Returns the lab and the two pods on `a`.
async fn budget_lab() -> (Lab, Vec<Value>) {
    let lab = lab_with(
        &["a", "b"],
        Options {
            time_scale: 1.0,
            pod_ready_delay: Duration::from_millis(3500),
            ..Options::default()
        },
    )
    .await;
    let c = lab.api.cluster();
    let (_, pods) = c
        .add_replicaset(
            &ReplicaSetBuilder::new("default", "db").grace_period(1),
            &["a", "a", "b"],
        )
        .expect("replicaset");
    c.add(
        &PdbBuilder::new("default", "db")
            .selector("app", "db")
            .max_unavailable(1),
    )
    .expect("pdb");
    let on_a = pods
        .into_iter()
        .filter(|p| s(p, "/spec/nodeName") == "a")
        .collect();
    (lab, on_a)
}

/// When each of the two pods' evictions was accepted (the first one, then the one the budget
/// held back), from the stand-in's request log.
fn accepted_evictions(lab: &Lab, pods: &[Value]) -> (std::time::SystemTime, std::time::SystemTime) {
    let mut at: Vec<std::time::SystemTime> = lab
        .api
        .cluster()
        .requests()
        .all()
        .into_iter()
        .filter(|r| {
            r.method == "POST"
                && r.status < 300
                && pods
                    .iter()
                    .any(|p| r.path.ends_with(&format!("/pods/{}/eviction", name(p))))
        })
        .map(|r| r.at)
        .collect();
    at.sort();
    assert_eq!(at.len(), 2, "one accepted eviction per pod: {at:?}");
    (at[0], at[1])
}

/// Drain `a` of a [`budget_lab`] (default settings); the time between the accepted evictions of
/// its two pods `on_a`, checked to be at least the 3.4 s the budget holds the second one back.
async fn drained_eviction_gap(lab: &Lab, on_a: &[Value]) -> Duration {
    let d = drainer(lab, "a", &settings());
    d.drain().await.expect("drain");
    let (first, second) = accepted_evictions(lab, on_a);
    let gap = second.duration_since(first).expect("ordered");
    assert!(
        gap >= Duration::from_millis(3400),
        "the budget was honoured: the second eviction came {gap:?} after the first"
    );
    gap
}

/// A pod held back by a budget is evicted as soon as the budget allows it (a watch on the
/// budget), not at the next tick of the retry timer: with the replacement Ready 3.5 s after the
/// first eviction, the timer alone (1 s, then 2 s, then 4 s) would evict it after 7 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_budget_blocked_eviction_goes_as_soon_as_the_budget_allows() {
    let (lab, on_a) = budget_lab().await;
    let gap = drained_eviction_gap(&lab, &on_a).await;
    assert!(
        gap < Duration::from_millis(5000),
        "the second eviction came {gap:?} after the first: not woken when the budget allowed it"
    );
    let watched = lab.api.cluster().requests().count(|r| {
        r.method == "GET" && r.path.contains("/poddisruptionbudgets") && r.query.contains("watch")
    });
    assert!(watched >= 1, "the budget was watched");
}

/// Without permission to watch budgets (403), the drain still completes, on the retry timer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_budget_that_cannot_be_watched_falls_back_to_the_timer() {
    let (lab, on_a) = budget_lab().await;
    lab.api
        .cluster()
        .faults()
        .inject(FaultRule::status("/poddisruptionbudgets", 403, 1000).method("GET"));
    drained_eviction_gap(&lab, &on_a).await;
    let forbidden = lab
        .api
        .cluster()
        .requests()
        .count(|r| r.path.contains("/poddisruptionbudgets") && r.status == 403);
    assert_eq!(
        forbidden, 2,
        "one refused list for the eviction order, one for the budget watch, then the timer \
         alone (no retry loop)"
    );
}

/// As `kubectl drain` without `--force` / `--delete-emptydir-data`: a pod no controller owns and
/// a pod with emptyDir data make the drain fail before anything is evicted, naming each pod and
/// the setting that allows it; with the settings, both are evicted.
#[tokio::test]
async fn unmanaged_and_emptydir_pods_refuse_the_drain_unless_allowed() {
    let lab = lab(&["a", "b"]).await;
    let c = lab.api.cluster();
    c.add_replicaset(
        &ReplicaSetBuilder::new("default", "web")
            .replicas(2)
            .labels(&[("app", "web")])
            .grace_period(1),
        &["a", "a"],
    )
    .expect("replicaset");
    let web: Vec<String> = c
        .pods_on_node("a")
        .iter()
        .map(|p| p["metadata"]["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(web.len(), 2);
    // One of the ReplicaSet's pods keeps scratch data in an emptyDir volume.
    let scratch = web[0].clone();
    c.update(Kind::Pod, "default", &scratch, |p| {
        p["spec"]["volumes"] = serde_json::json!([{"name": "scratch", "emptyDir": {}}]);
    })
    .expect("emptyDir volume");
    c.add(
        &PodBuilder::new("default", "bare")
            .on_node("a")
            .grace_period(1),
    )
    .expect("bare pod");

    let err = drainer(&lab, "a", &settings())
        .drain()
        .await
        .expect_err("refused");
    let DrainError::Refused { pods } = &err else {
        panic!("not a refusal: {err}");
    };
    assert_eq!(pods.len(), 2, "{pods:?}");
    assert!(pods[0].starts_with("default/bare (no controller") && pods[0].contains("force = true"));
    assert!(
        pods[1].starts_with(&format!("default/{scratch} (emptyDir data"))
            && pods[1].contains("delete_emptydir_data = true"),
        "{pods:?}"
    );
    let evictions = c.requests().count(|r| r.path.ends_with("/eviction"));
    assert_eq!(evictions, 0, "nothing evicted");
    for p in web.iter().map(String::as_str).chain(["bare"]) {
        assert!(c.pod("default", p).is_some(), "{p} still there");
    }

    // One allowed is not enough.
    let err = drainer(
        &lab,
        "a",
        &Kubernetes {
            emptydir_pods: EmptyDirPods::Evict,
            ..settings()
        },
    )
    .drain()
    .await
    .expect_err("bare still refused");
    assert!(err.to_string().contains("default/bare"), "{err}");
    assert!(!err.to_string().contains(&scratch), "{err}");

    drainer(
        &lab,
        "a",
        &Kubernetes {
            emptydir_pods: EmptyDirPods::Evict,
            unmanaged_pods: UnmanagedPods::Evict,
            ..settings()
        },
    )
    .drain()
    .await
    .expect("drain with both allowed");
    for p in web.iter().map(String::as_str).chain(["bare"]) {
        assert!(c.pod("default", p).is_none(), "{p} evicted");
        assert_eq!(evictions_of(&lab, p), 1, "{p}");
    }
}

/// A PodDisruptionBudget that never allows (its pods cannot be rescheduled anywhere): with
/// `force_delete_after`, the pod is deleted once that much time has passed since the drain began,
/// not before, logged and recorded as a Warning Event; without it the drain times out.
#[tokio::test]
async fn force_delete_after_deletes_past_a_budget_that_never_allows() {
    let lab = lab(&["a"]).await;
    let c = lab.api.cluster();
    c.add_replicaset(
        &ReplicaSetBuilder::new("db", "primary")
            .replicas(1)
            .labels(&[("app", "primary")])
            .grace_period(1),
        &["a"],
    )
    .expect("replicaset");
    c.add(
        &PdbBuilder::new("db", "primary")
            .selector("app", "primary")
            .min_available(1),
    )
    .expect("pdb");

    // Without it: the budget holds until the drain deadline.
    let err = drainer(
        &lab,
        "a",
        &Kubernetes {
            drain_timeout: Duration::from_secs(2),
            ..settings()
        },
    )
    .drain()
    .await
    .expect_err("the budget never allows");
    assert!(matches!(err, DrainError::Timeout { .. }), "{err}");
    let deletes = |c: &rebootd_lab::kube_api::Cluster| {
        c.requests()
            .count(|r| r.method == "DELETE" && r.path.contains("/namespaces/db/pods/"))
    };
    assert_eq!(deletes(c), 0);

    let after = Duration::from_millis(1500);
    let started = std::time::SystemTime::now();
    drainer(
        &lab,
        "a",
        &Kubernetes {
            drain_timeout: Duration::from_secs(20),
            force_delete_after: Some(after),
            pod_grace_period: Some(Duration::from_secs(1)),
            ..settings()
        },
    )
    .drain()
    .await
    .expect("drained past the budget");
    assert_eq!(deletes(c), 1, "one delete");
    let deleted_at = c
        .requests()
        .all()
        .into_iter()
        .find(|r| r.method == "DELETE" && r.path.contains("/namespaces/db/pods/"))
        .expect("the delete")
        .at;
    assert!(
        deleted_at.duration_since(started).unwrap_or_default() >= after,
        "deleted before force_delete_after"
    );
    assert!(
        c.requests()
            .count(|r| r.path.ends_with("/eviction") && r.status == 429)
            >= 1,
        "evicted first"
    );
    let events = events_on(&lab, "a", "DeletedPastBudget");
    assert_eq!(events.len(), 1, "{events:?}");
}
