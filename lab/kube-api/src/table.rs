//! Server-side printing: the `Table` kubectl asks for on `kubectl get` without `-o`, with the
//! usual columns for Nodes, Pods and Leases and NAME/AGE for the rest.

use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};

use crate::kind::Kind;
use crate::meta;

/// Whether the Accept header asks for a Table first.
pub fn wanted(accept: &str) -> bool {
    accept
        .split(',')
        .next()
        .is_some_and(|first| first.contains("as=Table"))
}

fn col(name: &str, format: &str, priority: u8) -> Value {
    json!({"name": name, "type": "string", "format": format, "description": "", "priority": priority})
}

/// Parse the API's `Time` (`2024-01-02T03:04:05Z`) to seconds since the epoch.
fn parse_time(s: &str) -> Option<i64> {
    let b = s.as_bytes();
    if b.len() < 20 {
        return None;
    }
    let n = |r: std::ops::Range<usize>| s.get(r).and_then(|x| x.parse::<i64>().ok());
    let (y, mo, d) = (n(0..4)?, n(5..7)?, n(8..10)?);
    let (h, mi, se) = (n(11..13)?, n(14..16)?, n(17..19)?);
    // days_from_civil (Howard Hinnant)
    let y = if mo <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = (mo + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(days * 86_400 + h * 3600 + mi * 60 + se)
}

/// kubectl's short human duration.
fn age(obj: &Value) -> String {
    let Some(t) = parse_time(meta::meta_str(obj, "creationTimestamp")) else {
        return "<unknown>".into();
    };
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(t);
    let s = (now - t).max(0);
    match s {
        s if s < 120 => format!("{s}s"),
        s if s < 3600 * 3 => format!("{}m", s / 60),
        s if s < 86_400 * 2 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    }
}

fn node_cells(n: &Value) -> Vec<Value> {
    let mut status = if meta::is_ready(n) {
        "Ready".to_string()
    } else if meta::condition(n, "Ready").is_some() {
        "NotReady".to_string()
    } else {
        "Unknown".to_string()
    };
    if n.pointer("/spec/unschedulable").and_then(Value::as_bool) == Some(true) {
        status.push_str(",SchedulingDisabled");
    }
    let version = n
        .pointer("/status/nodeInfo/kubeletVersion")
        .cloned()
        .unwrap_or(json!(""));
    vec![
        json!(meta::name(n)),
        json!(status),
        json!("<none>"),
        json!(age(n)),
        version,
    ]
}

fn pod_cells(p: &Value) -> Vec<Value> {
    let statuses = p
        .pointer("/status/containerStatuses")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let total = p
        .pointer("/spec/containers")
        .and_then(Value::as_array)
        .map(Vec::len)
        .unwrap_or(0);
    let ready = statuses
        .iter()
        .filter(|s| s.get("ready").and_then(Value::as_bool) == Some(true))
        .count();
    let restarts: i64 = statuses
        .iter()
        .filter_map(|s| s.get("restartCount").and_then(Value::as_i64))
        .sum();
    let status = if meta::is_deleting(p) {
        "Terminating"
    } else {
        match meta::phase(p) {
            "" => "Unknown",
            s => s,
        }
    };
    let ip = p
        .pointer("/status/podIP")
        .cloned()
        .unwrap_or(json!("<none>"));
    let node = match meta::node_name(p) {
        "" => "<none>",
        n => n,
    };
    vec![
        json!(meta::name(p)),
        json!(format!("{ready}/{total}")),
        json!(status),
        json!(restarts),
        json!(age(p)),
        ip,
        json!(node),
    ]
}

fn lease_cells(l: &Value) -> Vec<Value> {
    let holder = l
        .pointer("/spec/holderIdentity")
        .cloned()
        .unwrap_or(json!(""));
    vec![json!(meta::name(l)), holder, json!(age(l))]
}

fn int(v: Option<&Value>) -> Value {
    v.cloned().unwrap_or(json!(0))
}

fn pdb_cells(p: &Value) -> Vec<Value> {
    let or_na = |v: Option<&Value>| v.cloned().unwrap_or(json!("N/A"));
    vec![
        json!(meta::name(p)),
        or_na(p.pointer("/spec/minAvailable")),
        or_na(p.pointer("/spec/maxUnavailable")),
        int(p.pointer("/status/disruptionsAllowed")),
        json!(age(p)),
    ]
}

fn rs_cells(r: &Value) -> Vec<Value> {
    vec![
        json!(meta::name(r)),
        int(r.pointer("/spec/replicas")),
        int(r.pointer("/status/replicas")),
        int(r.pointer("/status/readyReplicas")),
        json!(age(r)),
    ]
}

fn ds_cells(d: &Value) -> Vec<Value> {
    vec![
        json!(meta::name(d)),
        int(d.pointer("/status/desiredNumberScheduled")),
        int(d.pointer("/status/currentNumberScheduled")),
        int(d.pointer("/status/numberReady")),
        json!(age(d)),
    ]
}

fn event_cells(e: &Value) -> Vec<Value> {
    let s = |p: &str| e.pointer(p).and_then(Value::as_str).unwrap_or("");
    let object = format!(
        "{}/{}",
        s("/involvedObject/kind").to_ascii_lowercase(),
        s("/involvedObject/name")
    );
    vec![
        json!(age(e)),
        json!(s("/type")),
        json!(s("/reason")),
        json!(object),
        json!(s("/message")),
    ]
}

type Cells = fn(&Value) -> Vec<Value>;

/// A `Table` of `objects`.
pub fn render(kind: Kind, objects: &[Value], metadata: Option<Value>) -> Value {
    let (columns, cells): (Vec<Value>, Cells) = match kind {
        Kind::Node => (
            vec![
                col("Name", "name", 0),
                col("Status", "", 0),
                col("Roles", "", 0),
                col("Age", "", 0),
                col("Version", "", 0),
            ],
            node_cells,
        ),
        Kind::Pod => (
            vec![
                col("Name", "name", 0),
                col("Ready", "", 0),
                col("Status", "", 0),
                col("Restarts", "", 0),
                col("Age", "", 0),
                col("IP", "", 1),
                col("Node", "", 1),
            ],
            pod_cells,
        ),
        Kind::Lease => (
            vec![
                col("Name", "name", 0),
                col("Holder", "", 0),
                col("Age", "", 0),
            ],
            lease_cells,
        ),
        Kind::PodDisruptionBudget => (
            vec![
                col("Name", "name", 0),
                col("Min Available", "", 0),
                col("Max Unavailable", "", 0),
                col("Allowed Disruptions", "", 0),
                col("Age", "", 0),
            ],
            pdb_cells,
        ),
        Kind::ReplicaSet => (
            vec![
                col("Name", "name", 0),
                col("Desired", "", 0),
                col("Current", "", 0),
                col("Ready", "", 0),
                col("Age", "", 0),
            ],
            rs_cells,
        ),
        Kind::DaemonSet => (
            vec![
                col("Name", "name", 0),
                col("Desired", "", 0),
                col("Current", "", 0),
                col("Ready", "", 0),
                col("Age", "", 0),
            ],
            ds_cells,
        ),
        Kind::Event => (
            vec![
                col("Last Seen", "", 0),
                col("Type", "", 0),
                col("Reason", "", 0),
                col("Object", "", 0),
                col("Message", "", 0),
            ],
            event_cells,
        ),
        _ => (vec![col("Name", "name", 0), col("Age", "", 0)], |o| {
            vec![json!(meta::name(o)), json!(age(o))]
        }),
    };
    let rows: Vec<Value> = objects
        .iter()
        .map(|o| {
            let mut obj = o.clone();
            obj["kind"] = json!(kind.kind_name());
            obj["apiVersion"] = json!(kind.api_version());
            json!({"cells": cells(o), "object": obj})
        })
        .collect();
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": metadata.unwrap_or(json!({})),
        "columnDefinitions": columns,
        "rows": rows,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_parse() {
        assert_eq!(parse_time("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(parse_time("2023-11-14T22:13:20Z"), Some(1_700_000_000));
        assert_eq!(parse_time("x"), None);
    }

    #[test]
    fn table_accept() {
        assert!(wanted(
            "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"
        ));
        assert!(!wanted("application/json"));
    }
}
