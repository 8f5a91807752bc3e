//! The simulated control plane, run after every write until nothing changes: the ReplicaSet and
//! DaemonSet controllers, the scheduler, the kubelet (pod readiness follows node readiness, with
//! a delay), workload statuses and PodDisruptionBudget statuses; plus what the timers do when
//! they fire (a pod becomes Ready, a terminating pod goes away).

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use serde_json::{json, Value};

use crate::kind::Kind;
use crate::meta;
use crate::pdb;
use crate::selector::LabelSelector;
use crate::store::{DeleteOptions, State, Timer, TimerAction};
use crate::strategy::{self, KUBELET_IGNORE_ANNOTATION};

/// Whether a pod counts for its controller: not terminating and not finished.
fn active(p: &Value) -> bool {
    !meta::is_deleting(p) && !meta::is_terminal(p)
}

fn node_schedulable(n: &Value) -> bool {
    meta::is_ready(n)
        && !n
            .pointer("/spec/unschedulable")
            .and_then(Value::as_bool)
            .unwrap_or(false)
}

/// Whether `node` carries every label of the pod's `spec.nodeSelector`.
fn node_selected(pod_spec: Option<&Value>, node: &Value) -> bool {
    let Some(sel) = pod_spec
        .and_then(|s| s.get("nodeSelector"))
        .and_then(Value::as_object)
    else {
        return true;
    };
    sel.iter().all(|(k, v)| meta::label(node, k) == v.as_str())
}

/// A pod from a controller's template.
pub(crate) fn pod_from_template(owner: &Value, owner_kind: Kind, node: Option<&str>) -> Value {
    let tmpl = owner
        .pointer("/spec/template")
        .cloned()
        .unwrap_or(json!({}));
    let mut pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": tmpl.get("metadata").cloned().unwrap_or(json!({})),
        "spec": tmpl.get("spec").cloned().unwrap_or(json!({})),
    });
    let m = meta::metadata_mut(&mut pod);
    m.remove("name");
    m.insert(
        "generateName".into(),
        json!(format!("{}-", meta::name(owner))),
    );
    m.insert("namespace".into(), json!(meta::namespace(owner)));
    m.insert(
        "ownerReferences".into(),
        json!([meta::owner_reference(
            &owner_kind.api_version(),
            owner_kind.kind_name(),
            owner
        )]),
    );
    if let Some(n) = node {
        meta::object_mut(&mut pod, "spec").insert("nodeName".into(), json!(n));
    }
    strategy::api_create(Kind::Pod, &mut pod);
    pod
}

impl State {
    /// Run the controllers until they change nothing more (bounded).
    pub(crate) fn reconcile(&mut self) {
        for _ in 0..16 {
            let before = self.resource_version();
            self.replicaset_controller();
            self.daemonset_controller();
            self.scheduler();
            self.kubelet();
            self.workload_status();
            pdb::update_statuses(self);
            if self.resource_version() == before {
                break;
            }
        }
    }

    /// The active pods of every controller, by the controller's uid: one pass over the pods
    /// (per write, the controllers would otherwise scan every pod once per controller).
    fn active_pods_by_controller(&self) -> HashMap<&str, Vec<&Value>> {
        let mut by: HashMap<&str, Vec<&Value>> = HashMap::new();
        for p in self.iter(Kind::Pod, None).filter(|p| active(p)) {
            let owner = meta::controller_ref(p)
                .and_then(|r| r.get("uid"))
                .and_then(Value::as_str);
            if let Some(uid) = owner {
                by.entry(uid).or_default().push(p);
            }
        }
        by
    }

    fn replicaset_controller(&mut self) {
        // (ReplicaSet, replicas wanted, its active pods) where the two counts differ.
        let work: Vec<(Value, usize, Vec<Value>)> = {
            let by = self.active_pods_by_controller();
            self.list(Kind::ReplicaSet, None)
                .into_iter()
                .filter(|rs| !meta::is_deleting(rs))
                .filter_map(|rs| {
                    let want = rs
                        .pointer("/spec/replicas")
                        .and_then(Value::as_i64)
                        .unwrap_or(1)
                        .max(0) as usize;
                    let pods = by.get(meta::uid(&rs)).map_or(&[][..], Vec::as_slice);
                    (pods.len() != want).then(|| {
                        let pods = pods.iter().map(|p| (*p).clone()).collect();
                        (rs, want, pods)
                    })
                })
                .collect()
        };
        for (rs, want, mut pods) in work {
            let ns = meta::namespace(&rs);
            if pods.len() < want {
                for _ in pods.len()..want {
                    let pod = pod_from_template(&rs, Kind::ReplicaSet, None);
                    if let Err(e) = self.create(Kind::Pod, pod, false) {
                        tracing::warn!(rs = meta::name(&rs), "cannot create a pod: {e}");
                    }
                }
            } else if pods.len() > want {
                // Scale down: unscheduled, then not ready, then newest first.
                pods.sort_by_key(|p| {
                    (
                        !meta::node_name(p).is_empty(),
                        meta::is_ready(p),
                        std::cmp::Reverse(meta::meta_str(p, "creationTimestamp").to_string()),
                    )
                });
                for p in pods.iter().take(pods.len() - want) {
                    let _ = self.delete(Kind::Pod, ns, meta::name(p), &DeleteOptions::default());
                }
            }
        }
    }

    fn daemonset_controller(&mut self) {
        let nodes = self.list(Kind::Node, None);
        for ds in self.list(Kind::DaemonSet, None) {
            if meta::is_deleting(&ds) {
                continue;
            }
            let uid = meta::uid(&ds);
            let ns = meta::namespace(&ds);
            let spec = ds.pointer("/spec/template/spec");
            let pods: Vec<Value> = self
                .iter(Kind::Pod, Some(ns))
                .filter(|p| meta::controlled_by(p, uid))
                .cloned()
                .collect();
            for n in nodes.iter().filter(|n| node_selected(spec, n)) {
                let node = meta::name(n);
                let has = pods.iter().any(|p| active(p) && meta::node_name(p) == node);
                if !has {
                    let pod = pod_from_template(&ds, Kind::DaemonSet, Some(node));
                    if let Err(e) = self.create(Kind::Pod, pod, false) {
                        tracing::warn!(ds = meta::name(&ds), "cannot create a pod: {e}");
                    }
                }
            }
            for p in &pods {
                if self.get(Kind::Node, "", meta::node_name(p)).is_none() {
                    self.remove(Kind::Pod, ns, meta::name(p));
                }
            }
        }
    }

    fn scheduler(&mut self) {
        let pending: Vec<Value> = self
            .iter(Kind::Pod, None)
            .filter(|p| meta::node_name(p).is_empty() && active(p))
            .cloned()
            .collect();
        if pending.is_empty() {
            return;
        }
        let mut load: BTreeMap<String, usize> = BTreeMap::new();
        for p in self.iter(Kind::Pod, None).filter(|p| active(p)) {
            *load.entry(meta::node_name(p).to_string()).or_default() += 1;
        }
        let nodes = self.list(Kind::Node, None);
        for pod in pending {
            let spec = pod.get("spec");
            let best = nodes
                .iter()
                .filter(|n| node_schedulable(n) && node_selected(spec, n))
                .map(|n| meta::name(n).to_string())
                .min_by_key(|n| (load.get(n).copied().unwrap_or(0), n.clone()));
            let (ns, name) = (meta::namespace(&pod), meta::name(&pod));
            match best {
                Some(node) => {
                    *load.entry(node.clone()).or_default() += 1;
                    let _ = self.modify(Kind::Pod, ns, name, |p| {
                        meta::object_mut(p, "spec").insert("nodeName".into(), json!(node));
                        meta::set_condition(p, "PodScheduled", "True", "", "");
                    });
                }
                None => {
                    let _ = self.modify(Kind::Pod, ns, name, |p| {
                        meta::set_condition(
                            p,
                            "PodScheduled",
                            "False",
                            "Unschedulable",
                            "0/0 nodes are available: no Ready, schedulable node.",
                        );
                    });
                }
            }
        }
    }

    /// Pods on NotReady nodes lose readiness; pods on Ready nodes that are not Ready get a
    /// PodReady timer (once).
    fn kubelet(&mut self) {
        let pods: Vec<Value> = self
            .iter(Kind::Pod, None)
            .filter(|p| {
                !meta::node_name(p).is_empty()
                    && active(p)
                    && meta::annotation(p, KUBELET_IGNORE_ANNOTATION) != Some("ignore")
            })
            .cloned()
            .collect();
        for pod in pods {
            let node_ready = self
                .get(Kind::Node, "", meta::node_name(&pod))
                .is_some_and(meta::is_ready);
            let (ns, name, uid) = (meta::namespace(&pod), meta::name(&pod), meta::uid(&pod));
            if !node_ready {
                if meta::is_ready(&pod) {
                    let _ = self.modify(Kind::Pod, ns, name, set_not_ready);
                }
                continue;
            }
            if !meta::is_ready(&pod) && !self.ready_scheduled.contains(uid) {
                self.ready_scheduled.insert(uid.to_string());
                let delay = self.sim.scaled(self.sim.pod_ready_delay);
                self.timers.push(Timer {
                    at: Instant::now() + delay,
                    action: TimerAction::PodReady {
                        ns: ns.to_string(),
                        name: name.to_string(),
                        uid: uid.to_string(),
                    },
                });
            }
        }
    }

    fn workload_status(&mut self) {
        let statuses: Vec<(Value, Value)> = {
            let by = self.active_pods_by_controller();
            self.list(Kind::ReplicaSet, None)
                .into_iter()
                .map(|rs| {
                    let pods = by.get(meta::uid(&rs)).map_or(&[][..], Vec::as_slice);
                    let ready = pods.iter().filter(|p| meta::is_ready(p)).count();
                    let sel = LabelSelector::from_object(rs.pointer("/spec/selector")).ok();
                    let labeled = pods
                        .iter()
                        .filter(|p| sel.as_ref().is_some_and(|s| s.matches_object(p)))
                        .count();
                    let status = json!({
                        "replicas": pods.len(),
                        "fullyLabeledReplicas": labeled,
                        "readyReplicas": ready,
                        "availableReplicas": ready,
                        "observedGeneration": rs.pointer("/metadata/generation").cloned().unwrap_or(json!(1)),
                    });
                    (rs, status)
                })
                .collect()
        };
        for (rs, status) in statuses {
            let _ = self.modify(
                Kind::ReplicaSet,
                meta::namespace(&rs),
                meta::name(&rs),
                |o| {
                    o["status"] = status;
                },
            );
        }
        let nodes = self.list(Kind::Node, None);
        for ds in self.list(Kind::DaemonSet, None) {
            let uid = meta::uid(&ds);
            let spec = ds.pointer("/spec/template/spec");
            let desired = nodes.iter().filter(|n| node_selected(spec, n)).count();
            let pods: Vec<&Value> = self
                .iter(Kind::Pod, Some(meta::namespace(&ds)))
                .filter(|p| meta::controlled_by(p, uid) && active(p))
                .collect();
            let ready = pods.iter().filter(|p| meta::is_ready(p)).count();
            let status = json!({
                "desiredNumberScheduled": desired,
                "currentNumberScheduled": pods.len(),
                "updatedNumberScheduled": pods.len(),
                "numberMisscheduled": 0,
                "numberReady": ready,
                "numberAvailable": ready,
                "observedGeneration": ds.pointer("/metadata/generation").cloned().unwrap_or(json!(1)),
            });
            let _ = self.modify(
                Kind::DaemonSet,
                meta::namespace(&ds),
                meta::name(&ds),
                |o| {
                    o["status"] = status;
                },
            );
        }
    }

    /// A timer fired.
    pub(crate) fn fire(&mut self, action: &TimerAction) {
        match action {
            TimerAction::PodReady { ns, name, uid } => {
                self.ready_scheduled.remove(uid);
                let Some(pod) = self.get(Kind::Pod, ns, name) else {
                    return;
                };
                if meta::uid(pod) != uid || !active(pod) {
                    return;
                }
                let Some(node) = self.get(Kind::Node, "", meta::node_name(pod)).cloned() else {
                    return;
                };
                if !meta::is_ready(&node) {
                    return;
                }
                self.ip_counter += 1;
                let ip = format!(
                    "10.244.{}.{}",
                    (self.ip_counter / 250) % 250,
                    self.ip_counter % 250 + 2
                );
                let host_ip = node
                    .pointer("/status/addresses")
                    .and_then(Value::as_array)
                    .and_then(|a| {
                        a.iter()
                            .find(|x| x.get("type").and_then(Value::as_str) == Some("InternalIP"))
                    })
                    .and_then(|x| x.get("address"))
                    .cloned()
                    .unwrap_or(json!("127.0.0.1"));
                let _ = self.modify(Kind::Pod, ns, name, |p| set_running(p, &ip, host_ip));
            }
            TimerAction::Finalize {
                kind,
                ns,
                name,
                uid,
            } => {
                let matches = self
                    .get(*kind, ns, name)
                    .is_some_and(|o| meta::uid(o) == uid && meta::is_deleting(o));
                if matches {
                    self.remove(*kind, ns, name);
                }
            }
        }
    }
}

fn set_not_ready(p: &mut Value) {
    meta::set_condition(p, "Ready", "False", "NodeNotReady", "the node is not ready");
    meta::set_condition(p, "ContainersReady", "False", "NodeNotReady", "");
    if let Some(cs) = p
        .pointer_mut("/status/containerStatuses")
        .and_then(Value::as_array_mut)
    {
        for c in cs {
            c["ready"] = json!(false);
        }
    }
}

pub(crate) fn set_running(p: &mut Value, ip: &str, host_ip: Value) {
    let now = meta::now_rfc3339();
    let containers: Vec<Value> = p
        .pointer("/spec/containers")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let old_statuses = p
        .pointer("/status/containerStatuses")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let statuses: Vec<Value> = containers
        .iter()
        .map(|c| {
            let name = c.get("name").cloned().unwrap_or(json!(""));
            let restarts = old_statuses
                .iter()
                .find(|s| s.get("name") == Some(&name))
                .and_then(|s| s.get("restartCount"))
                .and_then(Value::as_i64)
                .map(|n| n + 1)
                .unwrap_or(0);
            json!({
                "name": name,
                "image": c.get("image").cloned().unwrap_or(json!("")),
                "imageID": "",
                "containerID": format!("containerd://{:016x}", meta::random_u64()),
                "ready": true,
                "started": true,
                "restartCount": restarts,
                "state": {"running": {"startedAt": now}},
            })
        })
        .collect();
    let st = meta::object_mut(p, "status");
    st.insert("phase".into(), json!("Running"));
    st.entry("startTime").or_insert(json!(now));
    if !ip.is_empty() {
        st.entry("podIP").or_insert(json!(ip));
        st.entry("podIPs").or_insert(json!([{ "ip": ip }]));
    }
    st.insert("hostIP".into(), host_ip);
    st.insert("containerStatuses".into(), json!(statuses));
    for c in ["PodScheduled", "Initialized", "ContainersReady", "Ready"] {
        meta::set_condition(p, c, "True", "", "");
    }
}
