//! `deploy/kubernetes/admission-policy.yaml`, evaluated with a CEL implementation on
//! AdmissionRequests: what a node identity may and may not write (own vs other Node, cordon vs
//! taint, labels and annotations, own vs other Lease, the slot count, waiters, Events, pod
//! deletes), and — end to end — every write real rebootd processes send during a lab fleet run
//! with per-node identities, with the policy enforced by the API stand-in, so a policy that
//! would block rebootd fails here.

#[path = "common/admission.rs"]
mod admission;
mod common;

use admission::{request, Policy};
use serde_json::{json, Value};

const NODES: (&str, &str, &str) = ("", "v1", "nodes");
const LEASES: (&str, &str, &str) = ("coordination.k8s.io", "v1", "leases");
const PODS: (&str, &str, &str) = ("", "v1", "pods");
const EVENTS: (&str, &str, &str) = ("", "v1", "events");

fn me() -> &'static str {
    "rebootd:node:worker-1"
}

fn node(name: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {
            "name": name, "uid": format!("uid-{name}"), "resourceVersion": "7",
            "labels": {"kubernetes.io/hostname": name, "node-role.kubernetes.io/worker": ""},
            "annotations": {"node.alpha.kubernetes.io/ttl": "0", "rebootd.io/phase": "idle"},
        },
        "spec": {"podCIDR": "10.0.1.0/24", "providerID": format!("lab://{name}"),
                 "taints": [{"key": "dedicated", "value": "db", "effect": "NoSchedule"}]},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    })
}

fn with(mut v: Value, pointer: &str, value: Value) -> Value {
    let (parent, key) = pointer.rsplit_once('/').unwrap();
    let key = key.replace("~1", "/").replace("~0", "~");
    let key = key.as_str();
    let p = if parent.is_empty() {
        &mut v
    } else {
        v.pointer_mut(parent).unwrap()
    };
    if value.is_null() {
        p.as_object_mut().unwrap().remove(key);
    } else {
        p[key] = value;
    }
    v
}

fn update(user: &str, res: (&str, &str, &str), old: &Value, new: &Value) -> Value {
    request(user, "UPDATE", res, "", Some(old), Some(new))
}

/// An AdmissionRequest by `user` creating `new` (no sub-resource).
fn create(user: &str, res: (&str, &str, &str), new: &Value) -> Value {
    request(user, "CREATE", res, "", None, Some(new))
}

/// An AdmissionRequest by `user` deleting `old` (no sub-resource).
fn delete(user: &str, res: (&str, &str, &str), old: &Value) -> Value {
    request(user, "DELETE", res, "", Some(old), None)
}

#[track_caller]
fn allowed(p: &Policy, req: &Value) {
    match p.admit(req) {
        Ok(true) => {}
        Ok(false) => panic!("the policy does not look at this request: {req:#}"),
        Err(msg) => panic!("denied: {msg}\nrequest: {req:#}"),
    }
}

#[track_caller]
fn denied(p: &Policy, req: &Value, says: &str) {
    match p.admit(req) {
        Err(msg) => assert!(
            msg.contains(says),
            "denied, but the message {msg:?} lacks {says:?}"
        ),
        Ok(selected) => panic!("admitted (selected: {selected}): {req:#}"),
    }
}

#[test]
fn the_binding_denies_and_names_the_policy() {
    let p = Policy::load();
    assert_eq!(p.binding["spec"]["policyName"], "rebootd-node");
    assert_eq!(p.binding["spec"]["validationActions"], json!(["Deny"]));
}

#[test]
fn only_node_identities_are_looked_at() {
    let p = Policy::load();
    let n = node("worker-2");
    let all_spec = with(n.clone(), "/spec/taints", json!([]));
    for user in [
        "kubernetes-admin",
        "system:node:worker-2",
        "system:serviceaccount:kube-system:x",
    ] {
        assert_eq!(
            p.admit(&update(user, NODES, &n, &all_spec)),
            Ok(false),
            "{user}"
        );
    }
    // Both identity forms name their node.
    let cordoned = with(n.clone(), "/spec/unschedulable", json!(true));
    allowed(&p, &update("rebootd:node:worker-2", NODES, &n, &cordoned));
    allowed(
        &p,
        &update(
            "system:serviceaccount:rebootd:node-worker-2",
            NODES,
            &n,
            &cordoned,
        ),
    );
    denied(
        &p,
        &update(
            "system:serviceaccount:rebootd:node-worker-1",
            NODES,
            &n,
            &cordoned,
        ),
        "may change only Node worker-1",
    );
}

#[test]
fn a_node_cordons_and_annotates_only_its_own_node() {
    let p = Policy::load();
    let mine = node("worker-1");
    let other = node("worker-2");
    let cordon = |n: &Value| with(n.clone(), "/spec/unschedulable", json!(true));
    allowed(&p, &update(me(), NODES, &mine, &cordon(&mine)));
    allowed(&p, &update(me(), NODES, &cordon(&mine), &mine));
    denied(
        &p,
        &update(me(), NODES, &other, &cordon(&other)),
        "may change only Node worker-1",
    );
    let annotated = with(
        mine.clone(),
        "/metadata/annotations/rebootd.io~1phase",
        json!("draining"),
    );
    let annotated = with(
        annotated,
        "/metadata/annotations/rebootd.io~1reboot-needed",
        json!("true"),
    );
    allowed(&p, &update(me(), NODES, &mine, &annotated));
    // Not another node's annotations, not other annotations of its own.
    denied(
        &p,
        &update(
            me(),
            NODES,
            &other,
            &with(
                other.clone(),
                "/metadata/annotations/rebootd.io~1phase",
                json!("x"),
            ),
        ),
        "may change only Node worker-1",
    );
    for ttl in [json!("9"), Value::Null] {
        let changed = with(
            mine.clone(),
            "/metadata/annotations/node.alpha.kubernetes.io~1ttl",
            ttl,
        );
        denied(
            &p,
            &update(me(), NODES, &mine, &changed),
            "rebootd.io/ annotations",
        );
    }
    // No create or delete of Nodes.
    denied(
        &p,
        &delete(me(), NODES, &mine),
        "may change only Node worker-1",
    );
}

const SCALE_DOWN: &str =
    "/metadata/annotations/cluster-autoscaler.kubernetes.io~1scale-down-disabled";

/// The cluster autoscaler's annotation: a node adds `true` to its own Node where the annotation
/// is absent and removes it while it says `true`; another value, another Node, or a change of
/// someone else's value is denied.
#[test]
fn the_autoscaler_annotation_only_where_absent_only_true_only_its_own_node() {
    let p = Policy::load();
    let mine = node("worker-1");
    let other = node("worker-2");
    let set = |n: &Value, v: &str| with(n.clone(), SCALE_DOWN, json!(v));
    allowed(&p, &update(me(), NODES, &mine, &set(&mine, "true")));
    allowed(&p, &update(me(), NODES, &set(&mine, "true"), &mine));
    let says = "scale-down-disabled=true where it is absent";
    for v in ["false", "TRUE", ""] {
        denied(&p, &update(me(), NODES, &mine, &set(&mine, v)), says);
        // Someone else's value: neither changed to true nor removed.
        denied(
            &p,
            &update(me(), NODES, &set(&mine, v), &set(&mine, "true")),
            says,
        );
        denied(&p, &update(me(), NODES, &set(&mine, v), &mine), says);
    }
    // Not on another Node, neither added nor removed.
    for (old, new) in [
        (other.clone(), set(&other, "true")),
        (set(&other, "true"), other.clone()),
    ] {
        denied(
            &p,
            &update(me(), NODES, &old, &new),
            "may change only Node worker-1",
        );
    }
}

#[test]
fn cordon_yes_other_spec_and_taints_no() {
    let p = Policy::load();
    let mine = node("worker-1");
    let spec = |k: &str, v: Value| with(mine.clone(), &format!("/spec/{k}"), v);
    for (k, v) in [
        ("podCIDR", json!("10.9.0.0/24")),
        ("providerID", Value::Null),
    ] {
        denied(
            &p,
            &update(me(), NODES, &mine, &spec(k, v)),
            "spec.unschedulable",
        );
    }
    // rebootd's own taint, NoSchedule or PreferNoSchedule, added and removed.
    for effect in ["NoSchedule", "PreferNoSchedule"] {
        let tainted = spec(
            "taints",
            json!([{"key": "dedicated", "value": "db", "effect": "NoSchedule"},
                   {"key": "rebootd.io/rebooting", "value": "true", "effect": effect}]),
        );
        allowed(&p, &update(me(), NODES, &mine, &tainted));
        allowed(&p, &update(me(), NODES, &tainted, &mine));
    }
    // Never NoExecute (it evicts past PodDisruptionBudgets), never another taint.
    let no_execute = json!([{"key": "dedicated", "value": "db", "effect": "NoSchedule"},
                            {"key": "rebootd.io/rebooting", "effect": "NoExecute"}]);
    let foreign = json!([{"key": "dedicated", "value": "db", "effect": "NoSchedule"},
                         {"key": "example.com/evict", "effect": "NoExecute"}]);
    for (taints, says) in [
        (no_execute, "NoSchedule or PreferNoSchedule"),
        (foreign, "only the taint rebootd.io/rebooting"),
        (json!([]), "only the taint"),
    ] {
        denied(
            &p,
            &update(me(), NODES, &mine, &spec("taints", taints)),
            says,
        );
    }
    // Finalizers stay.
    denied(
        &p,
        &update(
            me(),
            NODES,
            &mine,
            &with(mine.clone(), "/metadata/finalizers", json!(["x/y"])),
        ),
        "finalizers",
    );
}

#[test]
fn labels_only_the_managed_ones() {
    let p = Policy::load();
    let mine = node("worker-1");
    let label = |k: &str, v: Value| {
        with(
            mine.clone(),
            &format!("/metadata/labels/{}", k.replace('/', "~1")),
            v,
        )
    };
    for key in [
        "rebootd.io/rebooting",
        "node.kubernetes.io/exclude-from-external-load-balancers",
    ] {
        let l = label(key, json!("true"));
        allowed(&p, &update(me(), NODES, &mine, &l));
        allowed(&p, &update(me(), NODES, &l, &mine));
    }
    for (key, value) in [
        ("node-role.kubernetes.io/control-plane", json!("")),
        ("kubernetes.io/hostname", json!("evil")),
        ("node-role.kubernetes.io/worker", Value::Null),
    ] {
        denied(
            &p,
            &update(me(), NODES, &mine, &label(key, value)),
            "labels rebootd manages",
        );
    }
}

// --- Leases ---------------------------------------------------------------------------------

fn lease(name: &str, role: &str) -> Value {
    let mut v = json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": name, "namespace": "rebootd", "resourceVersion": "5",
                     "labels": {"rebootd.io/semaphore": "rebootd", "rebootd.io/role": role}},
        "spec": {},
    });
    if role == "slot" {
        let i = name.rsplit('-').next().unwrap();
        v["metadata"]["labels"]["rebootd.io/slot"] = json!(i);
        v["spec"]["leaseTransitions"] = json!(3);
    }
    v
}

fn held(name: &str, by: &str, transitions: i64) -> Value {
    let mut v = lease(name, "slot");
    v["spec"] = json!({"holderIdentity": by, "acquireTime": "2026-01-01T00:00:00.000000Z",
                       "renewTime": "2026-01-01T00:00:00.000000Z", "leaseTransitions": transitions});
    v["metadata"]["annotations"] = json!({"rebootd.io/machine-id": format!("m-{by}"),
                                          "rebootd.io/since": "2026-01-01T00:00:00Z"});
    v
}

fn control(max: &str) -> Value {
    let mut v = lease("rebootd", "control");
    v["metadata"]["annotations"] = json!({"rebootd.io/max": max});
    v
}

#[test]
fn a_node_takes_keeps_and_releases_its_own_slot() {
    let p = Policy::load();
    let free = lease("rebootd-0", "slot");
    let mine = held("rebootd-0", "worker-1", 4);
    allowed(&p, &update(me(), LEASES, &free, &mine));
    allowed(
        &p,
        &update(
            me(),
            LEASES,
            &mine,
            &with(
                mine.clone(),
                "/metadata/annotations/rebootd.io~1phase",
                json!("rebooting"),
            ),
        ),
    );
    allowed(
        &p,
        &update(
            me(),
            LEASES,
            &mine,
            &with(mine.clone(), "/spec/holderIdentity", Value::Null),
        ),
    );
    allowed(&p, &create(me(), LEASES, &held("rebootd-1", "worker-1", 1)));
    allowed(&p, &delete(me(), LEASES, &held("rebootd-3", "worker-1", 1)));
    // A take must count in leaseTransitions.
    denied(
        &p,
        &update(me(), LEASES, &free, &held("rebootd-0", "worker-1", 3)),
        "leaseTransitions",
    );
}

#[test]
fn a_node_may_not_write_another_nodes_slot_except_to_take_it_over() {
    let p = Policy::load();
    let theirs = held("rebootd-0", "worker-2", 4);
    // Take-over (reclaim by the protocol): the taker becomes the holder, transitions + 1.
    allowed(
        &p,
        &update(me(), LEASES, &theirs, &held("rebootd-0", "worker-1", 5)),
    );
    for (what, new) in [
        (
            "free it",
            with(theirs.clone(), "/spec/holderIdentity", Value::Null),
        ),
        ("give it to a third node", held("rebootd-0", "worker-3", 5)),
        ("take it without counting", held("rebootd-0", "worker-1", 4)),
        (
            "rewrite its phase",
            with(
                theirs.clone(),
                "/metadata/annotations/rebootd.io~1phase",
                json!("x"),
            ),
        ),
    ] {
        let r = update(me(), LEASES, &theirs, &new);
        assert!(p.admit(&r).is_err(), "{what} was admitted");
    }
    denied(&p, &delete(me(), LEASES, &theirs), "held by worker-2");
    denied(
        &p,
        &create(me(), LEASES, &held("rebootd-1", "worker-2", 1)),
        "may take a slot for worker-1",
    );
    // Giving its own slot away.
    denied(
        &p,
        &update(
            me(),
            LEASES,
            &held("rebootd-0", "worker-1", 4),
            &held("rebootd-0", "worker-2", 5),
        ),
        "to worker-2",
    );
}

#[test]
fn the_slot_count_is_never_a_nodes() {
    let p = Policy::load();
    allowed(&p, &create(me(), LEASES, &control("1")));
    denied(&p, &create(me(), LEASES, &control("5")), "rebootd.io/max");
    // A control Lease without a max would make the group read as broken.
    let mut no_max = control("1");
    no_max["metadata"]["annotations"] = json!({});
    denied(&p, &create(me(), LEASES, &no_max), "rebootd.io/max 1");
    denied(
        &p,
        &update(me(), LEASES, &control("1"), &control("9")),
        "rebootd.io/max",
    );
    denied(
        &p,
        &update(me(), LEASES, &control("2"), &control("2")),
        "only create the control Lease",
    );
    denied(&p, &delete(me(), LEASES, &control("2")), "rebootd.io/max");
    // Not by the back door: the annotation on a slot, a slot relabelled, a control Lease in
    // disguise.
    let slot = held("rebootd-0", "worker-1", 4);
    for (pointer, value, says) in [
        (
            "/metadata/annotations/rebootd.io~1max",
            "9",
            "rebootd.io/max",
        ),
        (
            "/metadata/labels/rebootd.io~1role",
            "waiter",
            "semaphore Leases",
        ),
    ] {
        let changed = with(slot.clone(), pointer, json!(value));
        denied(&p, &update(me(), LEASES, &slot, &changed), says);
    }
    let mut disguised = control("9");
    disguised["metadata"]["labels"]["rebootd.io/role"] = json!("waiter");
    denied(&p, &create(me(), LEASES, &disguised), "semaphore Leases");
}

#[test]
fn leases_that_are_not_the_semaphores_are_out_of_reach() {
    let p = Policy::load();
    let leader = json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "kube-controller-manager", "namespace": "rebootd"},
        "spec": {"holderIdentity": "cp-1"},
    });
    denied(
        &p,
        &update(
            me(),
            LEASES,
            &leader,
            &with(leader.clone(), "/spec/holderIdentity", json!("worker-1")),
        ),
        "semaphore Leases",
    );
    denied(&p, &delete(me(), LEASES, &leader), "semaphore Leases");
}

fn waiter(node: &str) -> Value {
    let mut v = lease(&format!("rebootd-waiter-{node}"), "waiter");
    v["metadata"]["annotations"] = json!({"rebootd.io/waiter-node": node});
    v["spec"] = json!({"acquireTime": "2026-01-01T00:00:00.000000Z",
                       "renewTime": "2026-01-01T00:00:00.000000Z", "leaseDurationSeconds": 30});
    v
}

#[test]
fn a_node_queues_only_as_itself() {
    let p = Policy::load();
    let w = waiter("worker-1");
    allowed(&p, &create(me(), LEASES, &w));
    allowed(
        &p,
        &update(
            me(),
            LEASES,
            &w,
            &with(
                w.clone(),
                "/spec/renewTime",
                json!("2026-01-01T00:00:10.000000Z"),
            ),
        ),
    );
    allowed(&p, &delete(me(), LEASES, &w));
    // Dead waiters are deleted by the next taker.
    allowed(&p, &delete(me(), LEASES, &waiter("worker-2")));
    denied(
        &p,
        &create(me(), LEASES, &waiter("worker-2")),
        "own waiter Lease",
    );
    let theirs = waiter("worker-2");
    denied(
        &p,
        &update(
            me(),
            LEASES,
            &theirs,
            &with(
                theirs.clone(),
                "/spec/renewTime",
                json!("2027-01-01T00:00:00.000000Z"),
            ),
        ),
        "own waiter Lease",
    );
    // A waiter with a holder would be a slot in disguise.
    denied(
        &p,
        &create(
            me(),
            LEASES,
            &with(w.clone(), "/spec/holderIdentity", json!("worker-1")),
        ),
        "no holder",
    );
}

fn member(name_node: &str, says: &str) -> Value {
    let mut v = lease(&format!("rebootd-node-{name_node}"), "member");
    v["metadata"]["annotations"] = json!({"rebootd.io/member-node": says,
        "rebootd.io/node-record": "{\"node\":\"x\"}"});
    v
}

/// The fleet view's node Lease: a node writes the one named after it, saying itself, and
/// nothing else; another node's credential cannot write, take over, squat or delete it.
#[test]
fn a_node_writes_only_its_own_node_lease() {
    let p = Policy::load();
    let mine = member("worker-1", "worker-1");
    allowed(&p, &create(me(), LEASES, &mine));
    let newer = with(
        mine.clone(),
        "/metadata/annotations/rebootd.io~1node-record",
        json!("{}"),
    );
    allowed(&p, &update(me(), LEASES, &mine, &newer));
    allowed(&p, &delete(me(), LEASES, &mine));
    let says = "may write only its own node Lease rebootd-node-worker-1";
    let theirs = member("worker-2", "worker-2");
    denied(&p, &create(me(), LEASES, &theirs), says);
    let forged = with(
        theirs.clone(),
        "/metadata/annotations/rebootd.io~1node-record",
        json!("{\"waiting\":\"gate\"}"),
    );
    denied(&p, &update(me(), LEASES, &theirs, &forged), says);
    denied(&p, &delete(me(), LEASES, &theirs), says);
    // Squatting another node's name, or saying another node under its own name.
    denied(
        &p,
        &create(me(), LEASES, &member("worker-2", "worker-1")),
        says,
    );
    denied(
        &p,
        &create(me(), LEASES, &member("worker-1", "worker-2")),
        says,
    );
    // Taking over a node Lease another node created under my name (a squatter's) is refused
    // too: only what says my node may be changed.
    let squatted = member("worker-1", "worker-2");
    denied(&p, &update(me(), LEASES, &squatted, &mine), says);
    // A node Lease with a holder would be read as a held lock.
    denied(
        &p,
        &create(
            me(),
            LEASES,
            &with(mine.clone(), "/spec/holderIdentity", json!("worker-1")),
        ),
        says,
    );
}

#[test]
fn events_and_pod_deletes_only_about_its_own_node() {
    let p = Policy::load();
    let ev = |n: &str| {
        json!({"apiVersion": "v1", "kind": "Event",
               "metadata": {"name": format!("{n}.1"), "namespace": "default"},
               "involvedObject": {"kind": "Node", "name": n, "uid": n},
               "reason": "DrainStarted", "type": "Normal"})
    };
    allowed(&p, &create(me(), EVENTS, &ev("worker-1")));
    denied(&p, &create(me(), EVENTS, &ev("worker-2")), "its own Node");
    let pod = |n: &str| {
        json!({"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": "web-1", "namespace": "default"},
               "spec": {"nodeName": n}})
    };
    allowed(&p, &delete(me(), PODS, &pod("worker-1")));
    denied(
        &p,
        &delete(me(), PODS, &pod("worker-2")),
        "only pods on node worker-1",
    );
    // An eviction is not looked at: nothing in it says which node the pod is on.
    let eviction = json!({"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "web-1", "namespace": "default"}});
    assert_eq!(
        p.admit(&request(
            me(),
            "CREATE",
            PODS,
            "eviction",
            None,
            Some(&eviction)
        )),
        Ok(false)
    );
}

// --- End to end: what rebootd really sends, through the policy -------------------------------

use common::{drain_opts, kube_cluster, ready_fleet, web_under_budget};
use rebootd_lab::fleet::{FleetLock, FleetOptions};
use std::path::Path;
use std::time::Duration;

/// Three nodes, each its own identity, roll a reboot through the Lease semaphore (max 1) with
/// ReplicaSet pods under a PodDisruptionBudget, with the policy enforced on every write: every
/// request rebootd sends passes, and they cover what rebootd does (cordon, annotations,
/// uncordon, taking, releasing and queueing for slots, evictions, Events).
#[tokio::test]
async fn a_fleet_of_node_identities_rolls_a_reboot_through_the_policy() {
    let (hook, reviewed) = admission::enforcing();
    let fleet = ready_fleet(FleetOptions {
        node_identities: true,
        kube_admission: Some(hook),
        ..drain_opts(3, 1, FleetLock::Kubernetes)
    })
    .await;
    let cluster = kube_cluster(&fleet);
    web_under_budget(&cluster, ["node-1", "node-2", "node-3"]);
    fleet.trigger_all("2").await.unwrap();
    let rolled = fleet.wait_rolled(Duration::from_secs(120)).await;
    let denied = admission::refused(&reviewed);
    let reviewed = reviewed.lock().unwrap().clone();
    assert!(
        denied.is_empty(),
        "the policy denied rebootd:\n{}",
        denied.join("\n")
    );
    rolled.expect("the fleet rolled");

    // What the policy looked at: node identities only, each kind of write rebootd makes.
    let looked_at: Vec<&Value> = reviewed
        .iter()
        .filter(|(_, v)| *v == Ok(true))
        .map(|(r, _)| r)
        .collect();
    assert!(looked_at.iter().all(|r| r["userInfo"]["username"]
        .as_str()
        .unwrap()
        .starts_with("rebootd:node:")));
    let count = |f: &dyn Fn(&Value) -> bool| looked_at.iter().filter(|r| f(r)).count();
    let res = |r: &Value| r["resource"]["resource"].as_str().unwrap_or("").to_string();
    let op = |r: &Value| r["operation"].as_str().unwrap_or("").to_string();
    let cordons = count(&|r| {
        res(r) == "nodes"
            && r["object"]["spec"]["unschedulable"] == true
            && r["oldObject"]["spec"]["unschedulable"] != true
    });
    let uncordons = count(&|r| {
        res(r) == "nodes"
            && r["oldObject"]["spec"]["unschedulable"] == true
            && r["object"]["spec"]["unschedulable"] != true
    });
    let holder = |v: &Value| {
        v["spec"]["holderIdentity"]
            .as_str()
            .unwrap_or("")
            .to_string()
    };
    let takes = count(&|r| {
        res(r) == "leases" && !holder(&r["object"]).is_empty() && holder(&r["oldObject"]).is_empty()
    });
    let releases = count(&|r| {
        res(r) == "leases"
            && op(r) == "UPDATE"
            && holder(&r["object"]).is_empty()
            && !holder(&r["oldObject"]).is_empty()
    });
    let waiters = count(&|r| {
        res(r) == "leases"
            && op(r) == "CREATE"
            && r["object"]["metadata"]["labels"]["rebootd.io/role"] == "waiter"
    });
    let members = count(&|r| {
        res(r) == "leases" && r["object"]["metadata"]["labels"]["rebootd.io/role"] == "member"
    });
    let events = count(&|r| res(r) == "events");
    let evictions = reviewed
        .iter()
        .filter(|(r, _)| r["subResource"] == "eviction")
        .count();
    eprintln!(
        "reviewed {} writes: {cordons} cordons, {uncordons} uncordons, {takes} takes, \
         {releases} releases, {waiters} waiter Leases, {events} events, {evictions} evictions",
        reviewed.len()
    );
    assert!(
        cordons >= 3 && uncordons >= 3,
        "cordons {cordons}, uncordons {uncordons}"
    );
    assert!(
        takes >= 3 && releases >= 3,
        "takes {takes}, releases {releases}"
    );
    assert!(waiters >= 1, "with max 1, somebody queued");
    assert!(members >= 3, "each node wrote its fleet record: {members}");
    assert!(
        events >= 3 && evictions >= 3,
        "events {events}, evictions {evictions}"
    );
}

/// The stand-in enforces what the hook decides: a node identity's write to another node's Node
/// is refused with 422, as the API server refuses it.
#[tokio::test]
async fn the_stand_in_refuses_what_the_policy_denies() {
    let (api, _) = admission::enforcing_api().await;
    for n in ["worker-1", "worker-2"] {
        api.cluster()
            .add(&rebootd_lab::kube_api::NodeBuilder::new(n))
            .unwrap();
    }
    let client = admission::client_as(&api, "worker-1").await;
    let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(client);
    let cordon = kube::api::Patch::Strategic(json!({"spec": {"unschedulable": true}}));
    let pp = kube::api::PatchParams::default();
    nodes
        .patch("worker-1", &pp, &cordon)
        .await
        .expect("its own Node");
    let err = nodes
        .patch("worker-2", &pp, &cordon)
        .await
        .expect_err("another Node");
    assert_eq!(rebootd::kube_client::status_code(&err), Some(422), "{err}");
    assert!(
        err.to_string().contains("may change only Node worker-1"),
        "{err}"
    );
    assert_ne!(
        api.cluster().node("worker-2").unwrap()["spec"]["unschedulable"],
        true
    );
}

/// Every manifest in deploy/kubernetes goes through `kubectl apply --dry-run=client` (and the
/// whole kustomization through `kubectl apply -k`), against the API stand-in, which serves
/// discovery for the RBAC and admission groups as a 1.32 server does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_manifest_passes_kubectl_apply() {
    let api = rebootd_lab::kube_api::KubeApi::start(Default::default())
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kc = dir.path().join("kubeconfig");
    api.write_kubeconfig(&kc).unwrap();
    let deploy = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/kubernetes");
    let kubectl = |args: Vec<String>| {
        let out = std::process::Command::new("kubectl")
            .args(&args)
            .env("KUBECONFIG", &kc)
            .output()
            .expect("kubectl");
        let text = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "kubectl {args:?}: {text}");
        text
    };
    let mut files = 0;
    for entry in std::fs::read_dir(&deploy).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if !name.ends_with(".yaml") || name == "kustomization.yaml" {
            continue;
        }
        files += 1;
        let out = kubectl(vec![
            "apply".into(),
            "--dry-run=client".into(),
            "-f".into(),
            path.display().to_string(),
        ]);
        assert!(out.contains("(dry run)"), "{name}: {out}");
    }
    assert!(files >= 4, "manifests found: {files}");
    let out = kubectl(vec![
        "apply".into(),
        "-k".into(),
        deploy.display().to_string(),
    ]);
    for object in [
        "namespace/rebootd",
        "clusterrole.rbac.authorization.k8s.io/rebootd-node",
        "clusterrole.rbac.authorization.k8s.io/rebootd-node-pod-delete",
        "role.rbac.authorization.k8s.io/rebootd-lease",
        "role.rbac.authorization.k8s.io/rebootd-events",
        "validatingadmissionpolicy.admissionregistration.k8s.io/rebootd-node",
        "validatingadmissionpolicybinding.admissionregistration.k8s.io/rebootd-node",
    ] {
        assert!(
            out.contains(&format!("{object} created")),
            "{object}: {out}"
        );
    }
}

// --- The cluster autoscaler's courtesy ---------------------------------------------------------

const SCALE_DOWN_KEY: &str = "cluster-autoscaler.kubernetes.io/scale-down-disabled";

/// What `r` (an AdmissionRequest on a Node) did to the autoscaler's annotation: (before, after).
fn scale_down_change(r: &Value) -> Option<(Value, Value)> {
    if r["resource"]["resource"] != "nodes" {
        return None;
    }
    let old = r["oldObject"]["metadata"]["annotations"][SCALE_DOWN_KEY].clone();
    let new = r["object"]["metadata"]["annotations"][SCALE_DOWN_KEY].clone();
    (old != new).then_some((old, new))
}

/// Real rebootd processes, each its own node identity, roll a reboot through the Lease semaphore
/// with the admission policy enforced by the stand-in. node-1's Node has no autoscaler
/// annotation: rebootd adds `true` after taking its slot and before the cordon, keeps it through
/// the reboot (a new rebootd process after it), and takes it off right before it gives the slot
/// back. node-2 and
/// node-3 carry someone else's annotation ("false", and "true" as rebootd would set it): rebootd
/// never touches them.
#[tokio::test]
async fn the_autoscaler_annotation_is_on_while_holding_and_only_rebootds_is_taken_off() {
    let (hook, reviewed) = admission::enforcing();
    let fleet = ready_fleet(FleetOptions {
        node_identities: true,
        kube_admission: Some(hook),
        ..drain_opts(3, 1, FleetLock::Kubernetes)
    })
    .await;
    let cluster = kube_cluster(&fleet);
    for (node, theirs) in [("node-2", "false"), ("node-3", "true")] {
        cluster
            .update(rebootd_lab::kube_api::Kind::Node, "", node, |n| {
                n["metadata"]["annotations"][SCALE_DOWN_KEY] = json!(theirs);
            })
            .unwrap();
    }
    fleet.trigger_all("2").await.unwrap();
    fleet
        .wait_rolled(Duration::from_secs(120))
        .await
        .expect("the fleet rolled");
    let denied = admission::refused(&reviewed);
    let reviewed = reviewed.lock().unwrap().clone();
    assert!(
        denied.is_empty(),
        "the policy denied rebootd:\n{}",
        denied.join("\n")
    );

    let by = |r: &Value, node: &str| r["userInfo"]["username"] == format!("rebootd:node:{node}");
    let node1: Vec<&Value> = reviewed
        .iter()
        .map(|(r, _)| r)
        .filter(|r| by(r, "node-1"))
        .collect();
    let first = |what: &str, f: &dyn Fn(&Value) -> bool| {
        node1
            .iter()
            .position(|r| f(r))
            .unwrap_or_else(|| panic!("node-1 never did: {what}"))
    };
    let holder = |v: &Value| {
        v["spec"]["holderIdentity"]
            .as_str()
            .unwrap_or("")
            .to_string()
    };
    let take = first("take a slot", &|r| {
        r["resource"]["resource"] == "leases"
            && holder(&r["object"]) == "node-1"
            && holder(&r["oldObject"]) != "node-1"
    });
    let changes: Vec<(usize, (Value, Value))> = node1
        .iter()
        .enumerate()
        .filter_map(|(i, r)| scale_down_change(r).map(|c| (i, c)))
        .collect();
    assert_eq!(
        changes.iter().map(|(_, c)| c.clone()).collect::<Vec<_>>(),
        [(Value::Null, json!("true")), (json!("true"), Value::Null)],
        "node-1 adds the annotation once and takes it off once"
    );
    let (added, removed) = (changes[0].0, changes[1].0);
    let cordon = first("cordon", &|r| {
        r["resource"]["resource"] == "nodes"
            && r["object"]["spec"]["unschedulable"] == true
            && r["oldObject"]["spec"]["unschedulable"] != true
    });
    let rebooting = first("record the Rebooting event", &|r| {
        r["resource"]["resource"] == "events" && r["object"]["reason"] == "Rebooting"
    });
    let release = node1
        .iter()
        .rposition(|r| {
            r["resource"]["resource"] == "leases"
                && holder(&r["oldObject"]) == "node-1"
                && (r["operation"] == "DELETE" || holder(&r["object"]).is_empty())
        })
        .expect("node-1 released its slot");
    assert!(
        take < added && added < cordon && cordon < rebooting && rebooting < removed && removed < release,
        "order: take {take}, add {added}, cordon {cordon}, rebooting {rebooting}, removal {removed}, release {release}"
    );

    // Someone else's annotations: never written by rebootd, still there.
    for (node, theirs) in [("node-2", "false"), ("node-3", "true")] {
        assert!(
            !reviewed
                .iter()
                .any(|(r, _)| by(r, node) && scale_down_change(r).is_some()),
            "{node} touched someone else's annotation"
        );
        assert_eq!(
            cluster.node(node).unwrap()["metadata"]["annotations"][SCALE_DOWN_KEY],
            theirs,
            "{node}"
        );
    }
    assert!(cluster.node("node-1").unwrap()["metadata"]["annotations"]
        .get(SCALE_DOWN_KEY)
        .is_none());
}

/// A stolen node credential (rebootd's own client, as the stand-in's request log shows kubectl
/// sends no token over the lab's plain HTTP) against the stand-in enforcing the policy: it may
/// set the autoscaler's annotation to `true` on its own Node and take it off, but not set it on
/// another Node, not set another value, and not take off or change someone else's value.
#[tokio::test]
async fn a_stolen_credential_cannot_use_the_autoscaler_annotation_elsewhere() {
    let (api, _) = admission::enforcing_api().await;
    for n in ["worker-1", "worker-2"] {
        api.cluster()
            .add(&rebootd_lab::kube_api::NodeBuilder::new(n))
            .unwrap();
    }
    let client = admission::client_as(&api, "worker-1").await;
    let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(client);
    let annotate = |node: &'static str, value: Value| {
        let nodes = nodes.clone();
        async move {
            let patch = json!({"metadata": {"annotations": {SCALE_DOWN_KEY: value}}});
            nodes
                .patch(
                    node,
                    &kube::api::PatchParams::default(),
                    &kube::api::Patch::Merge(patch),
                )
                .await
                .map(|_| ())
        }
    };
    let refused = |r: Result<(), kube::Error>, says: &str| {
        let err = r.expect_err("refused");
        assert_eq!(rebootd::kube_client::status_code(&err), Some(422), "{err}");
        assert!(err.to_string().contains(says), "{err}");
    };
    let on =
        |n: &str| api.cluster().node(n).unwrap()["metadata"]["annotations"][SCALE_DOWN_KEY].clone();
    let says = "scale-down-disabled=true where it is absent";

    refused(
        annotate("worker-2", json!("true")).await,
        "may change only Node worker-1",
    );
    assert_eq!(on("worker-2"), Value::Null);
    refused(annotate("worker-1", json!("false")).await, says);
    annotate("worker-1", json!("true"))
        .await
        .expect("its own Node");
    assert_eq!(on("worker-1"), "true");
    annotate("worker-1", Value::Null)
        .await
        .expect("its own value");
    assert_eq!(on("worker-1"), Value::Null);

    // Someone else's: an administrator's "false" on worker-1, "true" on worker-2.
    for (n, v) in [("worker-1", "false"), ("worker-2", "true")] {
        api.cluster()
            .update(rebootd_lab::kube_api::Kind::Node, "", n, |o| {
                o["metadata"]["annotations"][SCALE_DOWN_KEY] = json!(v);
            })
            .unwrap();
    }
    refused(annotate("worker-1", Value::Null).await, says);
    refused(annotate("worker-1", json!("true")).await, says);
    refused(
        annotate("worker-2", Value::Null).await,
        "may change only Node worker-1",
    );
    assert_eq!(on("worker-1"), "false");
    assert_eq!(on("worker-2"), "true");
}
