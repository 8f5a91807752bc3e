//! The real kubectl against the stand-in: get, cordon/uncordon, annotate, drain under a
//! PodDisruptionBudget, and a Lease replace race.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::{fast, names, start};
use rebootd_lab_kube::{
    DaemonSetBuilder, Kind, LeaseBuilder, NodeBuilder, PdbBuilder, PodBuilder, ReplicaSetBuilder,
};
use serde_json::Value;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_nodes_pods_leases() {
    let lab = start(fast()).await;
    let c = lab.api.cluster();
    c.add(&NodeBuilder::new("worker-1")).expect("node");
    c.add(&NodeBuilder::new("worker-2").ready(false))
        .expect("node");
    c.add(&PodBuilder::new("default", "p1").on_node("worker-1"))
        .expect("pod");
    c.add(&PodBuilder::new("kube-system", "p2").on_node("worker-2"))
        .expect("pod");
    c.add(&LeaseBuilder::new("kube-system", "rebootd-0").holder("worker-1"))
        .expect("lease");

    let nodes = lab.kubectl_json(&["get", "nodes"]).await;
    assert_eq!(names(&nodes), ["worker-1", "worker-2"]);
    let ready: Vec<Option<&str>> = nodes["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|n| {
            n["status"]["conditions"]
                .as_array()
                .and_then(|cs| cs.iter().find(|c| c["type"] == "Ready"))
                .and_then(|c| c["status"].as_str())
        })
        .collect();
    assert_eq!(ready, [Some("True"), Some("False")]);

    let pods = lab.kubectl_json(&["get", "pods", "-A"]).await;
    assert_eq!(names(&pods), ["p1", "p2"]);
    let on_1 = lab
        .kubectl_json(&[
            "get",
            "pods",
            "-A",
            "--field-selector",
            "spec.nodeName=worker-1",
        ])
        .await;
    assert_eq!(names(&on_1), ["p1"]);

    let leases = lab
        .kubectl_json(&["get", "leases", "-n", "kube-system"])
        .await;
    assert_eq!(names(&leases), ["rebootd-0"]);
    assert_eq!(leases["items"][0]["spec"]["holderIdentity"], "worker-1");
    assert_eq!(leases["items"][0]["kind"], "Lease");

    let one = lab
        .kubectl_json(&["get", "lease", "-n", "kube-system", "rebootd-0"])
        .await;
    assert_eq!(one["apiVersion"], "coordination.k8s.io/v1");
    assert!(one["metadata"]["resourceVersion"]
        .as_str()
        .is_some_and(|r| !r.is_empty()));

    // The printed table (server-side printing) has the node status column.
    let table = lab.kubectl_ok(&["get", "nodes"]).await;
    assert!(
        table.contains("worker-2") && table.contains("NotReady"),
        "{table}"
    );

    // A missing object is a NotFound from the server.
    let out = lab.kubectl(&["get", "node", "nope"]).await;
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("(NotFound)") && err.contains("nodes \"nope\" not found"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cordon_uncordon_annotate() {
    let lab = start(fast()).await;
    let c = lab.api.cluster();
    c.add(&NodeBuilder::new("worker-1")).expect("node");
    let unschedulable = |n: &Value| n["spec"]["unschedulable"].as_bool().unwrap_or(false);

    let out = lab.kubectl_ok(&["cordon", "worker-1"]).await;
    assert!(out.contains("cordoned"), "{out}");
    assert!(unschedulable(&c.node("worker-1").expect("node")));
    let table = lab.kubectl_ok(&["get", "node", "worker-1"]).await;
    assert!(table.contains("SchedulingDisabled"), "{table}");

    lab.kubectl_ok(&["uncordon", "worker-1"]).await;
    let n = c.node("worker-1").expect("node");
    assert!(!unschedulable(&n));
    assert!(
        n["spec"].get("unschedulable").is_none(),
        "uncordon removes the field: {n}"
    );

    lab.kubectl_ok(&["annotate", "node", "worker-1", "rebootd.io/phase=draining"])
        .await;
    let n = c.node("worker-1").expect("node");
    assert_eq!(n["metadata"]["annotations"]["rebootd.io/phase"], "draining");
    // Without --overwrite kubectl refuses to change it; with it, it does.
    let out = lab
        .kubectl(&["annotate", "node", "worker-1", "rebootd.io/phase=rebooting"])
        .await;
    assert!(!out.status.success());
    lab.kubectl_ok(&[
        "annotate",
        "--overwrite",
        "node",
        "worker-1",
        "rebootd.io/phase=rebooting",
    ])
    .await;
    let n = c.node("worker-1").expect("node");
    assert_eq!(
        n["metadata"]["annotations"]["rebootd.io/phase"],
        "rebooting"
    );
    lab.kubectl_ok(&["annotate", "node", "worker-1", "rebootd.io/phase-"])
        .await;
    let n = c.node("worker-1").expect("node");
    assert!(n["metadata"]["annotations"]
        .get("rebootd.io/phase")
        .is_none());
    // The cluster autoscaler's annotation as rebootd writes it: only with the resourceVersion
    // it read, so a change in between is a conflict (kubectl annotate --resource-version sends
    // it in the patch, as rebootd does), then taken off.
    let key = "cluster-autoscaler.kubernetes.io/scale-down-disabled";
    let rv = c.node("worker-1").expect("node")["metadata"]["resourceVersion"]
        .as_str()
        .expect("resourceVersion")
        .to_string();
    lab.kubectl_ok(&["annotate", "node", "worker-1", "rebootd.io/phase=idle"])
        .await;
    let out = lab
        .kubectl(&[
            "annotate",
            "node",
            "worker-1",
            &format!("--resource-version={rv}"),
            &format!("{key}=true"),
        ])
        .await;
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("Conflict") || err.contains("modified"),
        "{err}"
    );
    let rv = c.node("worker-1").expect("node")["metadata"]["resourceVersion"]
        .as_str()
        .expect("resourceVersion")
        .to_string();
    lab.kubectl_ok(&[
        "annotate",
        "node",
        "worker-1",
        &format!("--resource-version={rv}"),
        &format!("{key}=true"),
    ])
    .await;
    assert_eq!(
        c.node("worker-1").expect("node")["metadata"]["annotations"][key],
        "true"
    );
    lab.kubectl_ok(&["annotate", "node", "worker-1", &format!("{key}-")])
        .await;
    assert!(c.node("worker-1").expect("node")["metadata"]["annotations"]
        .get(key)
        .is_none());
    lab.kubectl_ok(&["label", "node", "worker-1", "rack=r1"])
        .await;
    let on_r1 = lab
        .kubectl_json(&["get", "nodes", "-l", "rack in (r1,r2)"])
        .await;
    assert_eq!(names(&on_r1), ["worker-1"]);
}

/// Drain a node whose ReplicaSet pods are under a PodDisruptionBudget: the budget refuses
/// one eviction until a replacement is Ready elsewhere, then the drain completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_waits_for_the_budget() {
    let lab = start(fast()).await;
    let c = lab.api.cluster();
    for n in ["a", "b", "c"] {
        c.add(&NodeBuilder::new(n)).expect("node");
    }
    c.add(&DaemonSetBuilder::new("kube-system", "agent"))
        .expect("ds");
    let (_, pods) = c
        .add_replicaset(&ReplicaSetBuilder::new("default", "web"), &["a", "a", "b"])
        .expect("rs");
    c.add(
        &PdbBuilder::new("default", "web")
            .selector("app", "web")
            .min_available(2),
    )
    .expect("pdb");
    // A pod with an emptyDir volume (needs --delete-emptydir-data), not under the budget.
    let (_, cache) = c
        .add_replicaset(&ReplicaSetBuilder::new("default", "cache"), &["a"])
        .expect("rs");
    let cache_name = cache[0]["metadata"]["name"].as_str().expect("name");
    c.update(Kind::Pod, "default", cache_name, |p| {
        p["spec"]["volumes"] = serde_json::json!([{"name": "scratch", "emptyDir": {}}]);
    })
    .expect("add a volume");
    // The DaemonSet controller put its pod on every node.
    let ds_pod_on_a = c
        .wait_for(Duration::from_secs(10), |s| {
            s.pods_on_node("a")
                .into_iter()
                .find(|p| p["metadata"]["ownerReferences"][0]["kind"] == "DaemonSet")
        })
        .await
        .expect("a DaemonSet pod on node a");
    let budget = c.budget("default", "web").expect("budget");
    assert_eq!(budget.allowed, 1, "{budget:?}");
    let on_a: BTreeSet<String> = c
        .pods_on_node("a")
        .iter()
        .filter(|p| p["metadata"]["ownerReferences"][0]["kind"] == "ReplicaSet")
        .map(|p| p["metadata"]["uid"].as_str().unwrap_or("").to_string())
        .collect();
    assert_eq!(on_a.len(), 3, "{pods:?}");

    let out = lab
        .kubectl(&[
            "drain",
            "a",
            "--ignore-daemonsets",
            "--delete-emptydir-data",
            "--timeout=90s",
        ])
        .await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "drain failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("node/a drained"), "{stdout}");

    // The budget refused at least one eviction, with the real server's words.
    let refused = c
        .requests()
        .count(|r| r.method == "POST" && r.path.ends_with("/eviction") && r.status == 429);
    assert!(refused >= 1, "no eviction was refused");
    assert!(
        stderr.contains("Cannot evict pod as it would violate the pod's disruption budget."),
        "{stderr}"
    );
    let evicted = c
        .requests()
        .count(|r| r.method == "POST" && r.path.ends_with("/eviction") && r.status == 201);
    assert_eq!(evicted, on_a.len(), "one successful eviction per pod");

    // Node a: cordoned, only the DaemonSet pod left; the evicted pods are gone by uid.
    let node = c.node("a").expect("node");
    assert_eq!(node["spec"]["unschedulable"], true);
    let left: Vec<Value> = c.pods_on_node("a");
    assert_eq!(left.len(), 1, "{left:?}");
    assert_eq!(left[0]["metadata"]["uid"], ds_pod_on_a["metadata"]["uid"]);
    let all_uids: BTreeSet<String> = c
        .list(Kind::Pod, None)
        .iter()
        .map(|p| p["metadata"]["uid"].as_str().unwrap_or("").to_string())
        .collect();
    assert!(on_a.is_disjoint(&all_uids));
    // The ReplicaSet is whole again, on the other nodes, and Ready.
    c.wait_for(Duration::from_secs(10), |s| {
        s.get(Kind::ReplicaSet, "default", "web")
            .filter(|rs| rs["status"]["readyReplicas"] == 3)
    })
    .await
    .expect("web back to 3 ready replicas");
    let web: Vec<Value> = c
        .list(Kind::Pod, Some("default"))
        .into_iter()
        .filter(|p| p["metadata"]["labels"]["app"] == "web")
        .collect();
    assert_eq!(web.len(), 3);
    assert!(web.iter().all(|p| p["spec"]["nodeName"] != "a"), "{web:?}");
}

/// With a budget that never allows a disruption, drain gives up at its timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_times_out_on_a_strict_budget() {
    let lab = start(fast()).await;
    let c = lab.api.cluster();
    for n in ["a", "b"] {
        c.add(&NodeBuilder::new(n)).expect("node");
    }
    c.add_replicaset(&ReplicaSetBuilder::new("default", "db"), &["a", "b"])
        .expect("rs");
    c.add(
        &PdbBuilder::new("default", "db")
            .selector("app", "db")
            .max_unavailable(0),
    )
    .expect("pdb");
    let out = lab
        .kubectl(&["drain", "a", "--ignore-daemonsets", "--timeout=6s"])
        .await;
    assert!(!out.status.success(), "drain must fail");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("disruption budget"), "{stderr}");
    assert_eq!(c.pods_on_node("a").len(), 1, "the pod stays");
    assert!(c.requests().count(|r| r.status == 429) >= 1);
}

/// Two `kubectl replace` of the same Lease as read: the second gets 409 Conflict.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_replace_race_conflicts() {
    let lab = start(fast()).await;
    let c = lab.api.cluster();
    c.add(&LeaseBuilder::new("kube-system", "rebootd-0"))
        .expect("lease");
    let read = lab
        .kubectl_json(&["get", "lease", "-n", "kube-system", "rebootd-0"])
        .await;
    let write = |holder: &str| {
        let mut l = read.clone();
        l["spec"]["holderIdentity"] = Value::from(holder);
        let p = lab.dir.path().join(format!("{holder}.json"));
        std::fs::write(&p, serde_json::to_vec(&l).expect("json")).expect("write");
        p
    };
    let (pa, pb) = (write("node-a"), write("node-b"));
    let first = lab
        .kubectl(&["replace", "-f", pa.to_str().expect("path")])
        .await;
    assert!(
        first.status.success(),
        "{}",
        String::from_utf8_lossy(&first.stderr)
    );
    let second = lab
        .kubectl(&["replace", "-f", pb.to_str().expect("path")])
        .await;
    assert!(!second.status.success(), "the stale replace must fail");
    let err = String::from_utf8_lossy(&second.stderr);
    assert!(
        err.contains("Conflict") && err.contains("the object has been modified"),
        "{err}"
    );
    let lease = c.lease("kube-system", "rebootd-0").expect("lease");
    assert_eq!(lease["spec"]["holderIdentity"], "node-a");
    assert_eq!(
        c.requests().count(|r| r.method == "PUT"
            && r.status == 409
            && r.reason.as_deref() == Some("Conflict")),
        1
    );
}

/// kubectl create/delete, events through both APIs, and watch output.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_delete_and_events() {
    let lab = start(fast()).await;
    let c = lab.api.cluster();
    c.add(&NodeBuilder::new("a")).expect("node");
    let ev = serde_json::json!({
        "apiVersion": "events.k8s.io/v1", "kind": "Event",
        "metadata": {"name": "drain-a", "namespace": "default"},
        "eventTime": "2025-01-01T00:00:00.000000Z", "reportingController": "rebootd",
        "reportingInstance": "a", "action": "Drain", "reason": "DrainStarted",
        "note": "draining node a", "type": "Normal",
        "regarding": {"apiVersion": "v1", "kind": "Node", "name": "a"}});
    let p = lab.dir.path().join("ev.json");
    std::fs::write(&p, serde_json::to_vec(&ev).expect("json")).expect("write");
    lab.kubectl_ok(&["create", "-f", p.to_str().expect("path")])
        .await;
    // The same event, through the core API.
    let core = lab
        .kubectl_json(&["get", "events", "--field-selector", "involvedObject.name=a"])
        .await;
    assert_eq!(core["items"][0]["message"], "draining node a");
    assert_eq!(core["items"][0]["involvedObject"]["kind"], "Node");

    let pod = serde_json::json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "solo", "namespace": "default"},
        "spec": {"containers": [{"name": "c", "image": "x"}], "terminationGracePeriodSeconds": 10}});
    let p = lab.dir.path().join("pod.json");
    std::fs::write(&p, serde_json::to_vec(&pod).expect("json")).expect("write");
    lab.kubectl_ok(&["create", "-f", p.to_str().expect("path")])
        .await;
    // Scheduled and Ready, then `kubectl delete` waits for it to go.
    c.wait_for(Duration::from_secs(10), |s| {
        s.get(Kind::Pod, "default", "solo")
            .filter(|p| p["status"]["phase"] == "Running")
    })
    .await
    .expect("pod running");
    let out = lab
        .kubectl_ok(&["delete", "pod", "solo", "--timeout=30s"])
        .await;
    assert!(out.contains("deleted"), "{out}");
    assert!(c.pod("default", "solo").is_none());
}
