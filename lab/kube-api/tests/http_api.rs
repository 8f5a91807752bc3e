//! The API over raw HTTP: discovery, Status bodies, optimistic concurrency, patches,
//! selectors, pagination, eviction, graceful deletion, watches and injected faults.

mod common;

use std::time::{Duration, Instant};

use common::{fast, names, start};
use rebootd_lab_kube::{
    FaultRule, Kind, LeaseBuilder, NodeBuilder, PdbBuilder, PodBuilder, ReplicaSetBuilder,
};
use serde_json::{json, Value};

const LEASES: &str = "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases";
const AGGREGATED: &str = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";

#[tokio::test]
async fn discovery() {
    let lab = start(fast()).await;
    let h = lab.http();
    let v = h.get("/version").await.json();
    assert_eq!(v["major"], "1");
    assert_eq!(v["minor"], "32");
    let api = h.get("/api").await.json();
    assert_eq!(api["versions"], json!(["v1"]));
    let v1 = h.get("/api/v1").await.json();
    let eviction = v1["resources"]
        .as_array()
        .and_then(|r| r.iter().find(|r| r["name"] == "pods/eviction"))
        .cloned()
        .expect("pods/eviction is listed");
    assert_eq!(eviction["group"], "policy");
    assert_eq!(eviction["kind"], "Eviction");
    let groups = h.get("/apis").await.json();
    let gnames: Vec<&str> = groups["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .filter_map(|g| g["name"].as_str())
        .collect();
    for g in ["apps", "policy", "coordination.k8s.io", "events.k8s.io"] {
        assert!(gnames.contains(&g), "{g} missing from {gnames:?}");
    }
    let coord = h.get("/apis/coordination.k8s.io/v1").await.json();
    assert_eq!(coord["resources"][0]["name"], "leases");
    assert_eq!(h.get("/apis/nope/v1").await.status, 404);
    // Aggregated discovery only: 406, so clients fall back; with a fallback listed: legacy.
    let only = h
        .request("GET", "/api", &[("Accept", AGGREGATED)], None)
        .await;
    assert_eq!(only.status, 406);
    let both = format!("{AGGREGATED},application/json");
    let fallback = h.request("GET", "/apis", &[("Accept", &both)], None).await;
    assert_eq!(fallback.status, 200);
    assert_eq!(fallback.header("content-type"), Some("application/json"));
    assert_eq!(fallback.json()["kind"], "APIGroupList");
}

#[tokio::test]
async fn status_bodies_and_conflicts() {
    let lab = start(fast()).await;
    let h = lab.http();
    let nf = h.get(&format!("{LEASES}/missing")).await;
    assert_eq!(nf.status, 404);
    assert_eq!(
        nf.json(),
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": "leases.coordination.k8s.io \"missing\" not found", "reason": "NotFound",
            "details": {"name": "missing", "group": "coordination.k8s.io", "kind": "leases"},
            "code": 404})
    );
    let lease = json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "l"}, "spec": {"holderIdentity": ""}});
    let created = h.send_json("POST", LEASES, &lease).await;
    assert_eq!(created.status, 201);
    let created = created.json();
    assert_eq!(created["metadata"]["namespace"], "kube-system");
    let rv0 = created["metadata"]["resourceVersion"]
        .as_str()
        .expect("rv")
        .to_string();

    let dup = h.send_json("POST", LEASES, &lease).await;
    assert_eq!(dup.status, 409);
    assert_eq!(dup.json()["reason"], "AlreadyExists");

    let mut a = created.clone();
    a["spec"]["holderIdentity"] = json!("a");
    let ok = h.send_json("PUT", &format!("{LEASES}/l"), &a).await;
    assert_eq!(ok.status, 200);
    let rv1 = ok.json()["metadata"]["resourceVersion"]
        .as_str()
        .expect("rv")
        .to_string();
    assert_ne!(rv0, rv1);
    let mut b = created.clone();
    b["spec"]["holderIdentity"] = json!("b");
    let stale = h.send_json("PUT", &format!("{LEASES}/l"), &b).await;
    assert_eq!(stale.status, 409);
    let s = stale.json();
    assert_eq!(s["reason"], "Conflict");
    assert_eq!(s["details"]["kind"], "leases");
    // A merge patch carrying a stale resourceVersion is a conflict too.
    let p = h
        .patch(
            &format!("{LEASES}/l"),
            "application/merge-patch+json",
            &json!({"metadata": {"resourceVersion": rv0}, "spec": {"holderIdentity": "c"}}),
        )
        .await;
    assert_eq!(p.status, 409);

    let mut wrong = created.clone();
    wrong["metadata"]["name"] = json!("other");
    assert_eq!(
        h.send_json("PUT", &format!("{LEASES}/l"), &wrong)
            .await
            .status,
        400
    );
    let bad = json!({"metadata": {"name": "Bad_Name"}});
    let r = h.send_json("POST", LEASES, &bad).await;
    assert_eq!(r.status, 422);
    assert_eq!(r.json()["reason"], "Invalid");
    assert_eq!(h.request("PUT", LEASES, &[], None).await.status, 405);
    let unknown = h.get("/api/v1/namespaces/default/secrets").await;
    assert_eq!(unknown.status, 404);
    assert_eq!(
        unknown.json()["message"],
        "the server could not find the requested resource"
    );

    // Delete: a Status for leases, then NotFound.
    let d = h.request("DELETE", &format!("{LEASES}/l"), &[], None).await;
    assert_eq!(d.status, 200);
    assert_eq!(d.json()["status"], "Success");
    assert_eq!(
        h.request("DELETE", &format!("{LEASES}/l"), &[], None)
            .await
            .status,
        404
    );
}

#[tokio::test]
async fn patches() {
    let lab = start(fast()).await;
    let c = lab.api.cluster();
    c.add(&NodeBuilder::new("n1")).expect("node");
    let h = lab.http();
    let path = "/api/v1/nodes/n1";
    let r = h
        .patch(
            path,
            "application/strategic-merge-patch+json",
            &json!({"spec": {"unschedulable": true}}),
        )
        .await;
    assert_eq!(r.status, 200);
    assert_eq!(c.node("n1").expect("node")["spec"]["unschedulable"], true);
    h.patch(
        path,
        "application/strategic-merge-patch+json",
        &json!({"spec": {"unschedulable": null}}),
    )
    .await;
    assert!(c.node("n1").expect("node")["spec"]
        .get("unschedulable")
        .is_none());
    let r = h
        .patch(
            path,
            "application/merge-patch+json",
            &json!({"metadata": {"annotations": {"rebootd.io/phase": "draining"}}}),
        )
        .await;
    assert_eq!(
        r.json()["metadata"]["annotations"]["rebootd.io/phase"],
        "draining"
    );
    let r = h
        .patch(
            path,
            "application/json-patch+json",
            &json!([{"op": "replace", "path": "/metadata/annotations/rebootd.io~1phase", "value": "rebooting"},
                    {"op": "add", "path": "/metadata/labels/rack", "value": "r1"}]),
        )
        .await;
    assert_eq!(r.status, 200);
    let n = c.node("n1").expect("node");
    assert_eq!(
        n["metadata"]["annotations"]["rebootd.io/phase"],
        "rebooting"
    );
    assert_eq!(n["metadata"]["labels"]["rack"], "r1");
    // A failed JSON patch test changes nothing.
    let r = h
        .patch(
            path,
            "application/json-patch+json",
            &json!([{"op": "test", "path": "/metadata/labels/rack", "value": "r2"},
                    {"op": "remove", "path": "/metadata/labels/rack"}]),
        )
        .await;
    assert_eq!(r.status, 422);
    assert_eq!(
        c.node("n1").expect("node")["metadata"]["labels"]["rack"],
        "r1"
    );
    let r = h.patch(path, "text/plain", &json!({})).await;
    assert_eq!(r.status, 415);
    // The main resource ignores status; /status takes only status.
    h.patch(
        path,
        "application/merge-patch+json",
        &json!({"status": {"nodeInfo": {"bootID": "x"}}}),
    )
    .await;
    assert_ne!(
        c.node("n1").expect("node")["status"]["nodeInfo"]["bootID"],
        "x"
    );
    let r = h
        .patch(
            &format!("{path}/status"),
            "application/strategic-merge-patch+json",
            &json!({"status": {"nodeInfo": {"bootID": "x"}}, "spec": {"unschedulable": true}}),
        )
        .await;
    assert_eq!(r.status, 200);
    let n = c.node("n1").expect("node");
    assert_eq!(n["status"]["nodeInfo"]["bootID"], "x");
    assert!(n["spec"].get("unschedulable").is_none());
}

#[tokio::test]
async fn selectors_and_pages() {
    let lab = start(fast()).await;
    let c = lab.api.cluster();
    c.add(&NodeBuilder::new("n1")).expect("node");
    c.add(&NodeBuilder::new("n2")).expect("node");
    for (i, (node, app)) in [("n1", "web"), ("n1", "db"), ("n2", "web"), ("n2", "cache")]
        .iter()
        .enumerate()
    {
        c.add(
            &PodBuilder::new("default", &format!("p{i}"))
                .on_node(node)
                .label("app", app),
        )
        .expect("pod");
    }
    c.add(
        &PodBuilder::new("default", "done")
            .on_node("n1")
            .phase("Succeeded"),
    )
    .expect("pod");
    let h = lab.http();
    let q = |s: &str| format!("/api/v1/pods?{s}");
    let list = |r: common::Resp| names(&r.json());
    assert_eq!(
        list(h.get(&q("fieldSelector=spec.nodeName%3Dn1")).await),
        ["done", "p0", "p1"]
    );
    assert_eq!(
        list(
            h.get(&q(
                "fieldSelector=spec.nodeName%3Dn1,status.phase!%3DSucceeded"
            ))
            .await
        ),
        ["p0", "p1"]
    );
    assert_eq!(
        list(h.get(&q("labelSelector=app%3Dweb")).await),
        ["p0", "p2"]
    );
    assert_eq!(
        list(h.get(&q("labelSelector=app!%3Dweb")).await),
        ["done", "p1", "p3"]
    );
    assert_eq!(
        list(h.get(&q("labelSelector=app%20in%20(db,cache)")).await),
        ["p1", "p3"]
    );
    assert_eq!(
        list(h.get(&q("labelSelector=app%20notin%20(web)")).await),
        ["done", "p1", "p3"]
    );
    assert_eq!(
        list(h.get(&q("labelSelector=app")).await),
        ["p0", "p1", "p2", "p3"]
    );
    assert_eq!(list(h.get(&q("labelSelector=!app")).await), ["done"]);
    assert_eq!(
        list(h.get(&q("fieldSelector=metadata.name%3Dp2")).await),
        ["p2"]
    );
    assert_eq!(
        list(
            h.get("/api/v1/namespaces/default/pods?fieldSelector=metadata.namespace%3Ddefault")
                .await
        )
        .len(),
        5
    );
    let bad = h.get(&q("fieldSelector=spec.bogus%3Dx")).await;
    assert_eq!(bad.status, 400);
    assert_eq!(
        bad.json()["message"],
        "field label not supported: spec.bogus"
    );

    // Pages of two, chained by continue tokens.
    let mut seen = Vec::new();
    let mut cont = String::new();
    loop {
        let r = h.get(&q(&format!("limit=2&continue={cont}"))).await.json();
        seen.extend(names(&r));
        match r["metadata"]["continue"].as_str() {
            Some(c) => cont = c.replace('/', "%2F"),
            None => break,
        }
    }
    assert_eq!(seen, ["done", "p0", "p1", "p2", "p3"]);
    let page = h.get(&q("limit=2")).await.json();
    assert_eq!(page["kind"], "PodList");
    assert_eq!(page["metadata"]["remainingItemCount"], 3);
    assert!(
        page["items"][0].get("kind").is_none(),
        "list items carry no kind"
    );
}

#[tokio::test]
async fn eviction_honours_budgets() {
    let lab = start(fast()).await;
    let c = lab.api.cluster();
    c.add(&NodeBuilder::new("a")).expect("node");
    c.add(&NodeBuilder::new("b").unschedulable(true))
        .expect("node");
    let (_, pods) = c
        .add_replicaset(&ReplicaSetBuilder::new("default", "web"), &["a", "a"])
        .expect("rs");
    c.add(
        &PdbBuilder::new("default", "web")
            .selector("app", "web")
            .max_unavailable(1),
    )
    .expect("pdb");
    let pdb = c
        .get(Kind::PodDisruptionBudget, "default", "web")
        .expect("pdb");
    assert_eq!(
        (
            &pdb["status"]["currentHealthy"],
            &pdb["status"]["desiredHealthy"],
            &pdb["status"]["disruptionsAllowed"],
            &pdb["status"]["expectedPods"]
        ),
        (&json!(2), &json!(1), &json!(1), &json!(2))
    );
    let h = lab.http();
    let name = |p: &Value| p["metadata"]["name"].as_str().expect("name").to_string();
    let h = &h;
    let evict = |n: String| {
        let body = json!({"apiVersion": "policy/v1", "kind": "Eviction",
            "metadata": {"name": n, "namespace": "default"}});
        let path = format!("/api/v1/namespaces/default/pods/{n}/eviction");
        async move { h.send_json("POST", &path, &body).await }
    };
    // Cordon a, as a drain does.
    c.update(Kind::Node, "", "a", |n| {
        n["spec"]["unschedulable"] = json!(true)
    })
    .expect("cordon");
    let first = evict(name(&pods[0])).await;
    assert_eq!(first.status, 201);
    assert_eq!(first.json()["status"], "Success");
    // The evicted pod terminates; its replacement has nowhere to go (b is cordoned), so the
    // budget is spent.
    let second = evict(name(&pods[1])).await;
    assert_eq!(second.status, 429);
    assert_eq!(second.header("retry-after"), None);
    let s = second.json();
    assert_eq!(s["reason"], "TooManyRequests");
    assert_eq!(
        s["message"],
        "Cannot evict pod as it would violate the pod's disruption budget."
    );
    assert_eq!(s["details"]["causes"][0]["reason"], "DisruptionBudget");
    assert_eq!(
        s["details"]["causes"][0]["message"],
        "The disruption budget web needs 1 healthy pods and has 1 currently"
    );
    assert_eq!(evict("missing".into()).await.status, 404);
    // Uncordon b: the replacement lands there, becomes Ready, and the eviction goes through.
    c.update(Kind::Node, "", "b", |n| {
        n["spec"]["unschedulable"] = Value::Null;
    })
    .expect("uncordon");
    c.wait_for(Duration::from_secs(10), |s| {
        s.get(Kind::PodDisruptionBudget, "default", "web")
            .filter(|p| p["status"]["disruptionsAllowed"] == 1)
    })
    .await
    .expect("budget allows one again");
    assert_eq!(evict(name(&pods[1])).await.status, 201);
}

#[tokio::test]
async fn graceful_deletion_and_replacement() {
    let lab = start(fast()).await;
    let c = lab.api.cluster();
    c.add(&NodeBuilder::new("a")).expect("node");
    c.add(&NodeBuilder::new("b")).expect("node");
    let (_, pods) = c
        .add_replicaset(
            &ReplicaSetBuilder::new("default", "web").grace_period(10),
            &["a"],
        )
        .expect("rs");
    let old = &pods[0];
    let (old_name, old_uid) = (
        old["metadata"]["name"].as_str().expect("name").to_string(),
        old["metadata"]["uid"].as_str().expect("uid").to_string(),
    );
    c.update(Kind::Node, "", "a", |n| {
        n["spec"]["unschedulable"] = json!(true)
    })
    .expect("cordon");
    let h = lab.http();
    let started = Instant::now();
    let d = h
        .request(
            "DELETE",
            &format!("/api/v1/namespaces/default/pods/{old_name}"),
            &[],
            None,
        )
        .await;
    assert_eq!(d.status, 200);
    let d = d.json();
    assert!(d["metadata"]["deletionTimestamp"].is_string(), "{d}");
    assert_eq!(d["metadata"]["deletionGracePeriodSeconds"], 10);
    // 10 s of grace at time scale 0.1: gone after about 1 s, not before.
    c.wait_for(Duration::from_secs(10), |s| {
        s.get(Kind::Pod, "default", &old_name)
            .is_none()
            .then_some(())
    })
    .await
    .expect("the pod goes");
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(900), "went after {took:?}");
    // Its replacement: new name and uid, on b, Ready after the delay.
    let new = c
        .wait_for(Duration::from_secs(10), |s| {
            s.list(Kind::Pod, Some("default")).into_iter().find(|p| {
                p["status"]["phase"] == "Running" && p["metadata"]["name"] != old_name.as_str()
            })
        })
        .await
        .expect("a replacement runs");
    assert_ne!(new["metadata"]["uid"], old_uid.as_str());
    assert_eq!(new["spec"]["nodeName"], "b");
    assert!(new["metadata"]["name"]
        .as_str()
        .is_some_and(|n| n.starts_with("web-")));

    // Node b goes NotReady: the pod loses readiness; Ready again after the node is.
    c.set_node_ready("b", false).expect("not ready");
    let is_ready = |p: &Value| {
        p["status"]["conditions"]
            .as_array()
            .and_then(|cs| cs.iter().find(|c| c["type"] == "Ready"))
            .is_some_and(|c| c["status"] == "True")
    };
    let new_name = new["metadata"]["name"].as_str().expect("name").to_string();
    assert!(!is_ready(&c.pod("default", &new_name).expect("pod")));
    c.set_node_ready("b", true).expect("ready");
    c.wait_for(Duration::from_secs(10), |s| {
        s.get(Kind::Pod, "default", &new_name)
            .filter(|p| is_ready(p))
    })
    .await
    .expect("Ready again");
}

#[tokio::test]
async fn watches() {
    let lab = start(fast()).await;
    let c = lab.api.cluster();
    c.add(&NodeBuilder::new("a")).expect("node");
    c.add(&LeaseBuilder::new("kube-system", "old"))
        .expect("lease");
    let h = lab.http();
    let rv = c.resource_version();
    let t = Duration::from_secs(5);

    // From a resourceVersion: only what happens after, with bookmarks.
    let mut w = h
        .watch(&format!(
            "{LEASES}?watch=true&resourceVersion={rv}&allowWatchBookmarks=true"
        ))
        .await;
    let mut nodes = h.watch("/api/v1/nodes?watch=1&resourceVersion=0").await;
    let first = nodes.next(t).await.expect("initial node");
    assert_eq!(first["type"], "ADDED");
    assert_eq!(first["object"]["metadata"]["name"], "a");

    let l = c
        .add(&LeaseBuilder::new("kube-system", "l"))
        .expect("lease");
    c.update(Kind::Lease, "kube-system", "l", |l| {
        l["spec"]["holderIdentity"] = json!("a")
    })
    .expect("update");
    c.delete(Kind::Lease, "kube-system", "l").expect("delete");
    let mut types = Vec::new();
    for _ in 0..3 {
        let e = w.next_change(t).await.expect("event");
        assert_eq!(e["object"]["metadata"]["name"], "l");
        assert_eq!(e["object"]["kind"], "Lease");
        types.push(e["type"].as_str().expect("type").to_string());
    }
    assert_eq!(types, ["ADDED", "MODIFIED", "DELETED"]);
    let bm = loop {
        let e = w.next(t).await.expect("a bookmark");
        if e["type"] == "BOOKMARK" {
            break e;
        }
    };
    let bm_rv: u64 = bm["object"]["metadata"]["resourceVersion"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .expect("bookmark rv");
    let created_rv: u64 = l["metadata"]["resourceVersion"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .expect("rv");
    assert!(bm_rv > created_rv);

    // Node changes reach the node watch.
    c.set_node_ready("a", false).expect("not ready");
    let e = nodes.next_change(t).await.expect("node event");
    assert_eq!(e["type"], "MODIFIED");

    // A selector watch: leaving the selection is DELETED, entering it ADDED.
    c.add(
        &PodBuilder::new("default", "p")
            .on_node("a")
            .label("app", "web"),
    )
    .expect("pod");
    let mut sel = h
        .watch(
            "/api/v1/namespaces/default/pods?watch=true&labelSelector=app%3Dweb&resourceVersion=0",
        )
        .await;
    assert_eq!(sel.next_change(t).await.expect("added")["type"], "ADDED");
    c.update(Kind::Pod, "default", "p", |p| {
        p["metadata"]["labels"]["app"] = json!("db")
    })
    .expect("relabel");
    assert_eq!(sel.next_change(t).await.expect("left")["type"], "DELETED");
    c.update(Kind::Pod, "default", "p", |p| {
        p["metadata"]["labels"]["app"] = json!("web")
    })
    .expect("relabel");
    assert_eq!(sel.next_change(t).await.expect("entered")["type"], "ADDED");

    // sendInitialEvents: the state, then a bookmark marking its end.
    let mut init = h
        .watch(&format!(
            "{LEASES}?watch=true&sendInitialEvents=true&allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan"
        ))
        .await;
    let e = init.next(t).await.expect("initial");
    assert_eq!(
        (e["type"].as_str(), e["object"]["metadata"]["name"].as_str()),
        (Some("ADDED"), Some("old"))
    );
    let e = init.next(t).await.expect("end bookmark");
    assert_eq!(e["type"], "BOOKMARK");
    assert_eq!(
        e["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"],
        "true"
    );

    // timeoutSeconds ends the stream.
    let started = Instant::now();
    let rv = c.resource_version();
    let mut short = h
        .watch(&format!(
            "{LEASES}?watch=true&timeoutSeconds=1&resourceVersion={rv}"
        ))
        .await;
    assert!(short.next(Duration::from_secs(10)).await.is_none());
    let took = started.elapsed();
    assert!(
        took >= Duration::from_secs(1) && took < Duration::from_secs(5),
        "{took:?}"
    );
}

#[tokio::test]
async fn injected_faults() {
    let lab = start(fast()).await;
    let c = lab.api.cluster();
    c.add(&LeaseBuilder::new("kube-system", "l"))
        .expect("lease");
    let h = lab.http();
    let path = format!("{LEASES}/l");
    c.faults()
        .inject(FaultRule::status("/leases/l", 500, 2).method("GET"));
    assert_eq!(h.get(&path).await.status, 500);
    let second = h.get(&path).await;
    assert_eq!(second.status, 500);
    assert_eq!(second.json()["reason"], "InternalError");
    assert_eq!(h.get(&path).await.status, 200);

    c.faults().inject(FaultRule::status("/leases/", 429, 1));
    let r = h.get(&path).await;
    assert_eq!(r.status, 429);
    assert_eq!(r.header("retry-after"), Some("1"));

    c.faults()
        .inject(FaultRule::status("/leases/", 409, 1).method("PUT"));
    let lease = c.lease("kube-system", "l").expect("lease");
    assert_eq!(h.send_json("PUT", &path, &lease).await.status, 409);
    assert_eq!(c.faults().pending(), 0);

    c.faults()
        .inject(FaultRule::hang("/leases/l", Duration::from_millis(700), 1));
    let started = Instant::now();
    assert_eq!(h.get(&path).await.status, 200);
    assert!(started.elapsed() >= Duration::from_millis(700));
    let n500 = c.requests().count(|r| r.status == 500);
    assert_eq!(n500, 2);
    assert!(c
        .requests()
        .all()
        .iter()
        .all(|r| r.user.as_deref() == Some("test")));
}

#[tokio::test]
async fn dry_run_and_cascade() {
    let lab = start(fast()).await;
    let c = lab.api.cluster();
    c.add(&NodeBuilder::new("a")).expect("node");
    let h = lab.http();
    let lease = json!({"metadata": {"name": "dry"}});
    let r = h
        .send_json("POST", &format!("{LEASES}?dryRun=All"), &lease)
        .await;
    assert_eq!(r.status, 201);
    assert!(c.lease("kube-system", "dry").is_none());
    let rs = ReplicaSetBuilder::new("default", "web").replicas(2);
    c.add(&rs).expect("rs");
    c.wait_for(Duration::from_secs(10), |s| {
        (s.list(Kind::Pod, Some("default")).len() == 2).then_some(())
    })
    .await
    .expect("two pods");
    let r = h
        .request(
            "DELETE",
            "/apis/apps/v1/namespaces/default/replicasets/web",
            &[],
            None,
        )
        .await;
    assert_eq!(r.status, 200);
    c.wait_for(Duration::from_secs(10), |s| {
        s.list(Kind::Pod, Some("default")).is_empty().then_some(())
    })
    .await
    .expect("owned pods go with their ReplicaSet");
}
