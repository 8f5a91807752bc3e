//! PATCH bodies: JSON merge patch (RFC 7386), JSON patch (RFC 6902), and the part of strategic
//! merge patch that kubectl and controllers send (merge semantics plus keyed list merging for
//! the well-known lists and the `$patch`, `$setElementOrder`, `$deleteFromPrimitiveList` and
//! `$retainKeys` directives).

use serde_json::{Map, Value};

use crate::error::ApiError;

/// The patch flavours, from the request's Content-Type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchType {
    Json,
    Merge,
    Strategic,
    /// Server-side apply, approximated by a merge (no field ownership).
    Apply,
}

impl PatchType {
    pub fn from_content_type(ct: &str) -> Result<Self, ApiError> {
        let base = ct.split(';').next().unwrap_or("").trim();
        match base {
            "application/json-patch+json" => Ok(PatchType::Json),
            "application/merge-patch+json" => Ok(PatchType::Merge),
            "application/strategic-merge-patch+json" => Ok(PatchType::Strategic),
            "application/apply-patch+yaml" => Ok(PatchType::Apply),
            _ => Err(ApiError::unsupported_media_type(ct)),
        }
    }
}

/// Apply a patch to `target`, returning the patched document.
pub fn apply(ty: PatchType, target: &Value, patch: &Value) -> Result<Value, ApiError> {
    let mut out = target.clone();
    match ty {
        PatchType::Merge | PatchType::Apply => merge_patch(&mut out, patch),
        PatchType::Strategic => strategic_merge(&mut out, patch, "")?,
        PatchType::Json => json_patch(&mut out, patch)?,
    }
    Ok(out)
}

/// RFC 7386: objects merge recursively, null deletes, anything else replaces.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let Value::Object(t) = target else { return };
    for (k, v) in p {
        if v.is_null() {
            t.remove(k);
        } else {
            merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
        }
    }
}

/// The merge key of the lists strategic merge patch merges by key (a subset of the real
/// schema's `patchMergeKey`s: the lists on Pods, Nodes and metadata).
fn merge_key(field: &str) -> Option<&'static str> {
    match field {
        "conditions" => Some("type"),
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "volumes"
        | "env"
        | "volumeMounts"
        | "containerStatuses"
        | "initContainerStatuses" => Some("name"),
        "ownerReferences" => Some("uid"),
        "taints" => Some("key"),
        "addresses" => Some("type"),
        "ports" => Some("containerPort"),
        "tolerations" | "imagePullSecrets" => None,
        _ => None,
    }
}

/// Lists of scalars that strategic merge patch merges as sets.
fn is_set_list(field: &str) -> bool {
    matches!(field, "finalizers")
}

fn strategic_merge(target: &mut Value, patch: &Value, field: &str) -> Result<(), ApiError> {
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return Ok(());
    };
    if let Some(d) = p.get("$patch").and_then(Value::as_str) {
        match d {
            "replace" => {
                let mut p = p.clone();
                p.remove("$patch");
                *target = Value::Object(p);
                return Ok(());
            }
            "delete" => {
                *target = Value::Null;
                return Ok(());
            }
            "merge" => {}
            other => {
                return Err(ApiError::bad_request(format!(
                    "unknown patch directive {other:?} in {field:?}"
                )))
            }
        }
    }
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let Value::Object(t) = target else {
        return Ok(());
    };
    for (k, v) in p {
        if k == "$patch" || k == "$retainKeys" || k.starts_with("$setElementOrder/") {
            continue;
        }
        if let Some(list_field) = k.strip_prefix("$deleteFromPrimitiveList/") {
            if let (Some(Value::Array(cur)), Some(del)) = (t.get_mut(list_field), v.as_array()) {
                cur.retain(|x| !del.contains(x));
            }
            continue;
        }
        if v.is_null() {
            t.remove(k);
            continue;
        }
        match (t.get_mut(k), v) {
            (Some(Value::Array(cur)), Value::Array(items)) => {
                if let Some(key) = merge_key(k) {
                    merge_keyed_list(cur, items, key);
                } else if is_set_list(k) {
                    for i in items {
                        if !cur.contains(i) {
                            cur.push(i.clone());
                        }
                    }
                } else {
                    *cur = items.clone();
                }
            }
            (Some(cur), Value::Object(_)) => strategic_merge(cur, v, k)?,
            _ => {
                let mut fresh = Value::Null;
                strategic_merge(&mut fresh, v, k)?;
                if v.is_object() {
                    strip_directives(&mut fresh);
                }
                t.insert(k.clone(), fresh);
            }
        }
    }
    Ok(())
}

fn strip_directives(v: &mut Value) {
    if let Value::Object(m) = v {
        m.retain(|k, _| !k.starts_with('$'));
        for x in m.values_mut() {
            strip_directives(x);
        }
    }
}

fn merge_keyed_list(cur: &mut Vec<Value>, items: &[Value], key: &str) {
    for item in items {
        let id = item.get(key).cloned();
        let directive = item.get("$patch").and_then(Value::as_str);
        let pos = id
            .as_ref()
            .and_then(|id| cur.iter().position(|c| c.get(key) == Some(id)));
        match (pos, directive) {
            (Some(i), Some("delete")) => {
                cur.remove(i);
            }
            (None, Some("delete")) => {}
            (Some(i), _) => {
                let _ = strategic_merge(&mut cur[i], item, "");
                strip_directives(&mut cur[i]);
            }
            (None, _) => {
                let mut v = item.clone();
                strip_directives(&mut v);
                cur.push(v);
            }
        }
    }
}

/// RFC 6902 JSON patch.
pub fn json_patch(target: &mut Value, patch: &Value) -> Result<(), ApiError> {
    let ops = patch
        .as_array()
        .ok_or_else(|| ApiError::bad_request("a JSON patch must be an array of operations"))?;
    for op in ops {
        let kind = op.get("op").and_then(Value::as_str).unwrap_or("");
        let path = op
            .get("path")
            .and_then(Value::as_str)
            .ok_or_else(|| ApiError::bad_request("JSON patch operation without a path"))?;
        match kind {
            "add" => add(target, path, value_of(op)?.clone())?,
            "remove" => {
                remove(target, path)?;
            }
            "replace" => {
                remove(target, path)?;
                add(target, path, value_of(op)?.clone())?;
            }
            "move" => {
                let v = remove(target, from_of(op)?)?;
                add(target, path, v)?;
            }
            "copy" => {
                let v = target
                    .pointer(from_of(op)?)
                    .cloned()
                    .ok_or_else(|| missing(from_of(op).unwrap_or("")))?;
                add(target, path, v)?;
            }
            "test" => {
                if target.pointer(path) != Some(value_of(op)?) {
                    return Err(ApiError::new(
                        422,
                        "Invalid",
                        format!("the server rejected our request due to an error in our request: testing value {path} failed"),
                    ));
                }
            }
            other => {
                return Err(ApiError::bad_request(format!(
                    "unknown JSON patch operation {other:?}"
                )))
            }
        }
    }
    Ok(())
}

fn value_of(op: &Value) -> Result<&Value, ApiError> {
    op.get("value")
        .ok_or_else(|| ApiError::bad_request("JSON patch operation without a value"))
}

fn from_of(op: &Value) -> Result<&str, ApiError> {
    op.get("from")
        .and_then(Value::as_str)
        .ok_or_else(|| ApiError::bad_request("JSON patch operation without from"))
}

fn missing(path: &str) -> ApiError {
    ApiError::new(
        422,
        "Invalid",
        format!("the server rejected our request due to an error in our request: doc is missing path: {path:?}"),
    )
}

fn unescape(token: &str) -> String {
    token.replace("~1", "/").replace("~0", "~")
}

fn split_parent(path: &str) -> Result<(&str, String), ApiError> {
    let i = path
        .rfind('/')
        .ok_or_else(|| ApiError::bad_request(format!("invalid JSON pointer {path:?}")))?;
    Ok((&path[..i], unescape(&path[i + 1..])))
}

fn add(target: &mut Value, path: &str, v: Value) -> Result<(), ApiError> {
    if path.is_empty() {
        *target = v;
        return Ok(());
    }
    let (parent, last) = split_parent(path)?;
    let p = target.pointer_mut(parent).ok_or_else(|| missing(path))?;
    match p {
        Value::Object(m) => {
            m.insert(last, v);
            Ok(())
        }
        Value::Array(a) => {
            if last == "-" {
                a.push(v);
                return Ok(());
            }
            let i: usize = last.parse().map_err(|_| missing(path))?;
            if i > a.len() {
                return Err(missing(path));
            }
            a.insert(i, v);
            Ok(())
        }
        _ => Err(missing(path)),
    }
}

fn remove(target: &mut Value, path: &str) -> Result<Value, ApiError> {
    let (parent, last) = split_parent(path)?;
    let p = target.pointer_mut(parent).ok_or_else(|| missing(path))?;
    match p {
        Value::Object(m) => m.remove(&last).ok_or_else(|| missing(path)),
        Value::Array(a) => {
            let i: usize = last.parse().map_err(|_| missing(path))?;
            if i >= a.len() {
                return Err(missing(path));
            }
            Ok(a.remove(i))
        }
        _ => Err(missing(path)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn merge() -> Result<(), ApiError> {
        let node = json!({"spec": {"unschedulable": true, "podCIDR": "x"}});
        let out = apply(
            PatchType::Merge,
            &node,
            &json!({"spec": {"unschedulable": null}}),
        )?;
        assert_eq!(out, json!({"spec": {"podCIDR": "x"}}));
        Ok(())
    }

    #[test]
    fn strategic_cordon_and_conditions() -> Result<(), ApiError> {
        let node = json!({"spec": {}, "status": {"conditions": [
            {"type": "Ready", "status": "True"}, {"type": "DiskPressure", "status": "False"}]}});
        let out = apply(
            PatchType::Strategic,
            &node,
            &json!({"spec": {"unschedulable": true},
                "status": {"$setElementOrder/conditions": [{"type": "Ready"}],
                    "conditions": [{"type": "Ready", "status": "False"}]}}),
        )?;
        assert_eq!(out["spec"]["unschedulable"], true);
        assert_eq!(out["status"]["conditions"][0]["status"], "False");
        assert_eq!(out["status"]["conditions"][1]["type"], "DiskPressure");
        let out = apply(
            PatchType::Strategic,
            &out,
            &json!({"metadata": {"finalizers": ["a"]},
                "status": {"conditions": [{"type": "DiskPressure", "$patch": "delete"}]}}),
        )?;
        assert_eq!(
            out["status"]["conditions"].as_array().map(Vec::len),
            Some(1)
        );
        assert_eq!(out["metadata"]["finalizers"], json!(["a"]));
        Ok(())
    }

    #[test]
    fn json_patch_ops() -> Result<(), ApiError> {
        let doc = json!({"metadata": {"annotations": {"a/b": "1"}}, "l": [1, 2]});
        let out = apply(
            PatchType::Json,
            &doc,
            &json!([
                {"op": "test", "path": "/metadata/annotations/a~1b", "value": "1"},
                {"op": "replace", "path": "/metadata/annotations/a~1b", "value": "2"},
                {"op": "add", "path": "/l/-", "value": 3},
                {"op": "remove", "path": "/l/0"},
                {"op": "copy", "from": "/l", "path": "/m"},
            ]),
        )?;
        assert_eq!(out["metadata"]["annotations"]["a/b"], "2");
        assert_eq!(out["l"], json!([2, 3]));
        assert_eq!(out["m"], json!([2, 3]));
        assert!(apply(
            PatchType::Json,
            &doc,
            &json!([{"op": "test", "path": "/l/0", "value": 9}])
        )
        .is_err());
        assert!(apply(
            PatchType::Json,
            &doc,
            &json!([{"op": "remove", "path": "/x"}])
        )
        .is_err());
        Ok(())
    }
}
