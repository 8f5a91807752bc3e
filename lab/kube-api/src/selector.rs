//! Label selectors (query syntax and `LabelSelector` objects) and field selectors, with the
//! field labels the real server supports for each kind.

use serde_json::{Map, Value};

use crate::error::ApiError;
use crate::kind::Kind;
use crate::meta;

#[derive(Debug, Clone, PartialEq)]
enum Req {
    Eq(String, String),
    NotEq(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

/// A parsed label selector; the empty selector matches everything.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LabelSelector {
    reqs: Vec<Req>,
    /// A `LabelSelector` object that is null matches nothing.
    nothing: bool,
}

impl LabelSelector {
    /// Parse the query syntax: `a=b,c!=d,e in (x,y),f notin (z),g,!h`.
    pub fn parse(s: &str) -> Result<Self, ApiError> {
        let mut reqs = Vec::new();
        for term in split_top_level(s) {
            let t = term.trim();
            if t.is_empty() {
                continue;
            }
            reqs.push(parse_term(t)?);
        }
        Ok(LabelSelector {
            reqs,
            nothing: false,
        })
    }

    /// Build from a `LabelSelector` object (`matchLabels`, `matchExpressions`). `None` (a null
    /// selector) matches nothing; `{}` matches everything.
    pub fn from_object(v: Option<&Value>) -> Result<Self, ApiError> {
        let Some(v) = v.filter(|v| !v.is_null()) else {
            return Ok(LabelSelector {
                reqs: Vec::new(),
                nothing: true,
            });
        };
        let mut reqs = Vec::new();
        if let Some(ml) = v.get("matchLabels").and_then(Value::as_object) {
            for (k, val) in ml {
                reqs.push(Req::Eq(k.clone(), val.as_str().unwrap_or("").to_string()));
            }
        }
        if let Some(me) = v.get("matchExpressions").and_then(Value::as_array) {
            for e in me {
                let key = e
                    .get("key")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string();
                let values: Vec<String> = e
                    .get("values")
                    .and_then(Value::as_array)
                    .map(|a| {
                        a.iter()
                            .filter_map(Value::as_str)
                            .map(str::to_string)
                            .collect()
                    })
                    .unwrap_or_default();
                let op = e.get("operator").and_then(Value::as_str).unwrap_or("");
                reqs.push(match op {
                    "In" => Req::In(key, values),
                    "NotIn" => Req::NotIn(key, values),
                    "Exists" => Req::Exists(key),
                    "DoesNotExist" => Req::NotExists(key),
                    other => {
                        return Err(ApiError::bad_request(format!(
                            "{other:?} is not a valid label selector operator"
                        )))
                    }
                });
            }
        }
        Ok(LabelSelector {
            reqs,
            nothing: false,
        })
    }

    /// Whether the labels satisfy every requirement.
    pub fn matches(&self, labels: &Map<String, Value>) -> bool {
        if self.nothing {
            return false;
        }
        let get = |k: &str| labels.get(k).and_then(Value::as_str);
        self.reqs.iter().all(|r| match r {
            Req::Eq(k, v) => get(k) == Some(v.as_str()),
            Req::NotEq(k, v) => get(k) != Some(v.as_str()),
            Req::In(k, vs) => get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
            Req::NotIn(k, vs) => !get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
            Req::Exists(k) => get(k).is_some(),
            Req::NotExists(k) => get(k).is_none(),
        })
    }

    /// Whether the object's labels satisfy the selector.
    pub fn matches_object(&self, obj: &Value) -> bool {
        self.matches(&meta::labels(obj))
    }
}

/// Split on commas that are not inside parentheses.
fn split_top_level(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut depth = 0i32;
    let mut start = 0;
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

fn parse_set(key: &str, rest: &str) -> Result<Vec<String>, ApiError> {
    let rest = rest.trim();
    let inner = rest
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'))
        .ok_or_else(|| {
            ApiError::bad_request(format!(
                "unable to parse requirement: set for {key:?} needs parentheses"
            ))
        })?;
    Ok(inner
        .split(',')
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
        .collect())
}

fn valid_key(k: &str) -> bool {
    !k.is_empty()
        && k.len() <= 317
        && k.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'))
}

fn parse_term(t: &str) -> Result<Req, ApiError> {
    let bad = || ApiError::bad_request(format!("unable to parse requirement: {t:?}"));
    if let Some(k) = t.strip_prefix('!') {
        let k = k.trim();
        return if valid_key(k) {
            Ok(Req::NotExists(k.to_string()))
        } else {
            Err(bad())
        };
    }
    if let Some((k, v)) = t.split_once("!=") {
        let k = k.trim();
        return if valid_key(k) {
            Ok(Req::NotEq(k.to_string(), v.trim().to_string()))
        } else {
            Err(bad())
        };
    }
    if let Some((k, v)) = t.split_once("==").or_else(|| t.split_once('=')) {
        let k = k.trim();
        return if valid_key(k) {
            Ok(Req::Eq(k.to_string(), v.trim().to_string()))
        } else {
            Err(bad())
        };
    }
    let mut words = t.splitn(2, char::is_whitespace);
    let key = words.next().unwrap_or("").trim();
    let rest = words.next().unwrap_or("").trim();
    if !valid_key(key) {
        return Err(bad());
    }
    if rest.is_empty() {
        return Ok(Req::Exists(key.to_string()));
    }
    if let Some(r) = rest.strip_prefix("notin") {
        return Ok(Req::NotIn(key.to_string(), parse_set(key, r)?));
    }
    if let Some(r) = rest.strip_prefix("in") {
        return Ok(Req::In(key.to_string(), parse_set(key, r)?));
    }
    Err(bad())
}

/// A parsed field selector: `a=b,c!=d` over the field labels a kind supports.
#[derive(Debug, Clone, Default)]
pub struct FieldSelector {
    reqs: Vec<(String, bool, String)>,
}

/// The field labels the real server accepts per kind (beyond metadata.name/namespace).
fn supported_fields(kind: Kind) -> &'static [&'static str] {
    match kind {
        Kind::Pod => &[
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "spec.hostNetwork",
            "status.phase",
            "status.podIP",
            "status.nominatedNodeName",
        ],
        Kind::Node => &["spec.unschedulable"],
        Kind::Namespace => &["status.phase"],
        Kind::Event | Kind::EventV1 => &[
            "involvedObject.kind",
            "involvedObject.namespace",
            "involvedObject.name",
            "involvedObject.uid",
            "involvedObject.apiVersion",
            "involvedObject.resourceVersion",
            "involvedObject.fieldPath",
            "reason",
            "reportingComponent",
            "source",
            "type",
        ],
        Kind::ReplicaSet => &["status.replicas"],
        _ => &[],
    }
}

impl FieldSelector {
    /// Parse and check the field labels against what `kind` supports (400 otherwise, as the
    /// real server answers).
    pub fn parse(s: &str, kind: Kind) -> Result<Self, ApiError> {
        let mut reqs = Vec::new();
        for term in s.split(',') {
            let t = term.trim();
            if t.is_empty() {
                continue;
            }
            let (k, neg, v) = if let Some((k, v)) = t.split_once("!=") {
                (k, true, v)
            } else if let Some((k, v)) = t.split_once("==").or_else(|| t.split_once('=')) {
                (k, false, v)
            } else {
                return Err(ApiError::bad_request(format!(
                    "invalid selector: '{s}'; can't understand '{t}'"
                )));
            };
            let k = k.trim();
            let ok = k == "metadata.name"
                || (k == "metadata.namespace" && kind.namespaced())
                || supported_fields(kind).contains(&k);
            if !ok {
                return Err(ApiError::bad_request(format!(
                    "field label not supported: {k}"
                )));
            }
            reqs.push((k.to_string(), neg, v.trim().to_string()));
        }
        Ok(FieldSelector { reqs })
    }

    /// Whether the object (in storage form: events as core v1) satisfies every requirement.
    pub fn matches(&self, obj: &Value) -> bool {
        self.reqs.iter().all(|(k, neg, v)| {
            let actual = field_value(obj, k);
            (actual == *v) != *neg
        })
    }
}

/// The string value of a field label; missing fields read as "" and booleans as
/// "true"/"false", as the real server's field sets do.
fn field_value(obj: &Value, path: &str) -> String {
    if path == "source" {
        return obj
            .pointer("/source/component")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
    }
    let pointer = format!("/{}", path.replace('.', "/"));
    match obj.pointer(&pointer) {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Bool(b)) => b.to_string(),
        Some(Value::Number(n)) => n.to_string(),
        _ => {
            if path == "spec.unschedulable" || path == "spec.hostNetwork" {
                "false".to_string()
            } else {
                String::new()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn labels(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap_or_default()
    }

    #[test]
    fn label_syntax() -> Result<(), ApiError> {
        let l = labels(json!({"app": "web", "tier": "fe"}));
        assert!(LabelSelector::parse("app=web")?.matches(&l));
        assert!(LabelSelector::parse("app==web,tier")?.matches(&l));
        assert!(!LabelSelector::parse("app!=web")?.matches(&l));
        assert!(LabelSelector::parse("app in (db, web)")?.matches(&l));
        assert!(!LabelSelector::parse("app notin (db,web)")?.matches(&l));
        assert!(LabelSelector::parse("app notin (db),!gone")?.matches(&l));
        assert!(!LabelSelector::parse("!app")?.matches(&l));
        assert!(LabelSelector::parse("")?.matches(&l));
        assert!(LabelSelector::parse("a b c").is_err());
        Ok(())
    }

    #[test]
    fn label_objects() -> Result<(), ApiError> {
        let l = labels(json!({"app": "web"}));
        assert!(!LabelSelector::from_object(None)?.matches(&l));
        assert!(LabelSelector::from_object(Some(&json!({})))?.matches(&l));
        let s = json!({"matchLabels": {"app": "web"},
            "matchExpressions": [{"key": "tier", "operator": "DoesNotExist"}]});
        assert!(LabelSelector::from_object(Some(&s))?.matches(&l));
        Ok(())
    }

    #[test]
    fn fields() -> Result<(), ApiError> {
        let pod = json!({"metadata": {"name": "p"}, "spec": {"nodeName": "n1"},
            "status": {"phase": "Running"}});
        assert!(FieldSelector::parse("spec.nodeName=n1", Kind::Pod)?.matches(&pod));
        assert!(
            FieldSelector::parse("spec.nodeName=n1,status.phase!=Succeeded", Kind::Pod)?
                .matches(&pod)
        );
        assert!(!FieldSelector::parse("metadata.name==q", Kind::Pod)?.matches(&pod));
        assert!(FieldSelector::parse("spec.foo=1", Kind::Pod).is_err());
        let node = json!({"metadata": {"name": "n"}, "spec": {}});
        assert!(FieldSelector::parse("spec.unschedulable=false", Kind::Node)?.matches(&node));
        Ok(())
    }
}
