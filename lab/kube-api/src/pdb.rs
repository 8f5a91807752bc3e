//! PodDisruptionBudgets: the status the disruption controller computes (expected, desired and
//! current healthy pods, disruptions allowed) and the eviction subresource's decision.

use std::collections::BTreeMap;

use serde_json::{json, Value};

use crate::error::ApiError;
use crate::kind::Kind;
use crate::meta;
use crate::selector::LabelSelector;
use crate::store::{DeleteOptions, State};

/// A budget's numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    pub expected: i64,
    pub desired: i64,
    pub healthy: i64,
    pub allowed: i64,
}

/// `5` or `"50%"`.
enum IntOrPercent {
    Int(i64),
    Percent(i64),
}

fn int_or_percent(v: Option<&Value>) -> Option<IntOrPercent> {
    match v? {
        Value::Number(n) => n.as_i64().map(IntOrPercent::Int),
        Value::String(s) => match s.strip_suffix('%') {
            Some(p) => p.trim().parse().ok().map(IntOrPercent::Percent),
            None => s.trim().parse().ok().map(IntOrPercent::Int),
        },
        _ => None,
    }
}

fn percent_of(p: i64, total: i64) -> i64 {
    // Rounded up, as the disruption controller does.
    (p * total + 99) / 100
}

fn selector(pdb: &Value) -> LabelSelector {
    LabelSelector::from_object(pdb.pointer("/spec/selector"))
        .unwrap_or_else(|_| LabelSelector::from_object(None).unwrap_or_default())
}

/// The pods a budget selects (same namespace).
fn selected<'a>(st: &'a State, pdb: &Value) -> Vec<&'a Value> {
    let sel = selector(pdb);
    st.iter(Kind::Pod, Some(meta::namespace(pdb)))
        .filter(|p| sel.matches_object(p))
        .collect()
}

/// The sum of the scales of the controllers of `pods` (a ReplicaSet's replicas, a DaemonSet's
/// desired pods); pods without a known controller count as one each.
fn controller_scale(st: &State, pods: &[&Value]) -> i64 {
    let mut seen: BTreeMap<String, i64> = BTreeMap::new();
    let mut loose = 0;
    for p in pods {
        let Some(r) = meta::controller_ref(p) else {
            loose += 1;
            continue;
        };
        let uid = r
            .get("uid")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        if seen.contains_key(&uid) {
            continue;
        }
        let name = r.get("name").and_then(Value::as_str).unwrap_or("");
        let ns = meta::namespace(p);
        let scale = match r.get("kind").and_then(Value::as_str) {
            Some("ReplicaSet") => st
                .get(Kind::ReplicaSet, ns, name)
                .and_then(|rs| rs.pointer("/spec/replicas"))
                .and_then(Value::as_i64),
            Some("DaemonSet") => st
                .get(Kind::DaemonSet, ns, name)
                .and_then(|ds| ds.pointer("/status/desiredNumberScheduled"))
                .and_then(Value::as_i64),
            _ => None,
        };
        match scale {
            Some(s) => {
                seen.insert(uid, s);
            }
            None => loose += 1,
        }
    }
    seen.values().sum::<i64>() + loose
}

/// Compute a budget from the pods it selects now.
pub fn compute(st: &State, pdb: &Value) -> Budget {
    let pods = selected(st, pdb);
    let healthy = pods
        .iter()
        .filter(|p| !meta::is_deleting(p) && meta::is_ready(p))
        .count() as i64;
    let min = int_or_percent(pdb.pointer("/spec/minAvailable"));
    let max = int_or_percent(pdb.pointer("/spec/maxUnavailable"));
    let (expected, desired) = match (min, max) {
        (Some(IntOrPercent::Int(n)), _) => (pods.len() as i64, n),
        (Some(IntOrPercent::Percent(p)), _) => {
            let e = controller_scale(st, &pods);
            (e, percent_of(p, e))
        }
        (None, Some(m)) => {
            let e = controller_scale(st, &pods);
            let unavailable = match m {
                IntOrPercent::Int(n) => n,
                IntOrPercent::Percent(p) => percent_of(p, e),
            };
            (e, (e - unavailable).max(0))
        }
        (None, None) => (pods.len() as i64, 1),
    };
    let allowed = if expected <= 0 {
        0
    } else {
        (healthy - desired).max(0)
    };
    Budget {
        expected,
        desired,
        healthy,
        allowed,
    }
}

/// Recompute the status of every budget (the disruption controller).
pub fn update_statuses(st: &mut State) {
    let pdbs = st.list(Kind::PodDisruptionBudget, None);
    for pdb in pdbs {
        let b = compute(st, &pdb);
        let generation = pdb
            .pointer("/metadata/generation")
            .and_then(Value::as_i64)
            .unwrap_or(1);
        let _ = st.modify(
            Kind::PodDisruptionBudget,
            meta::namespace(&pdb),
            meta::name(&pdb),
            |o| {
                let s = meta::object_mut(o, "status");
                s.insert("observedGeneration".into(), json!(generation));
                s.insert("disruptionsAllowed".into(), json!(b.allowed));
                s.insert("currentHealthy".into(), json!(b.healthy));
                s.insert("desiredHealthy".into(), json!(b.desired));
                s.insert("expectedPods".into(), json!(b.expected));
                let (status, reason) = if b.allowed > 0 {
                    ("True", "SufficientPods")
                } else {
                    ("False", "InsufficientPods")
                };
                meta::set_meta_condition(o, "DisruptionAllowed", status, reason, "");
                if let Some(c) = o
                    .pointer_mut("/status/conditions/0")
                    .and_then(Value::as_object_mut)
                {
                    c.insert("observedGeneration".into(), json!(generation));
                }
            },
        );
    }
}

/// The eviction subresource: delete the pod unless that would break the one budget selecting
/// it (429 TooManyRequests, cause DisruptionBudget). Pods that are terminal, Pending or
/// already terminating are deleted without looking at budgets, as the real server does.
pub fn evict(st: &mut State, ns: &str, name: &str, opts: &DeleteOptions) -> Result<(), ApiError> {
    let pod = st
        .get(Kind::Pod, ns, name)
        .cloned()
        .ok_or_else(|| ApiError::not_found(Kind::Pod, name))?;
    let skip_budgets =
        meta::is_terminal(&pod) || meta::phase(&pod) == "Pending" || meta::is_deleting(&pod);
    if !skip_budgets {
        let pdbs: Vec<Value> = st
            .iter(Kind::PodDisruptionBudget, Some(ns))
            .filter(|b| selector(b).matches_object(&pod))
            .cloned()
            .collect();
        if pdbs.len() > 1 {
            return Err(ApiError::internal(
                "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.",
            ));
        }
        if let Some(pdb) = pdbs.first() {
            let b = compute(st, pdb);
            let policy = pdb
                .pointer("/spec/unhealthyPodEvictionPolicy")
                .and_then(Value::as_str)
                .unwrap_or("IfHealthyBudget");
            let unhealthy_ok = !meta::is_ready(&pod)
                && (policy == "AlwaysAllow" || (b.healthy >= b.desired && b.desired > 0));
            if !unhealthy_ok && b.allowed <= 0 {
                return Err(ApiError::disruption_budget(
                    meta::name(pdb),
                    b.desired,
                    b.healthy,
                ));
            }
        }
    }
    st.delete(Kind::Pod, ns, name, opts).map(|_| ())
}
