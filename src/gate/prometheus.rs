//! Prometheus gates, over the binary's one HTTP client ([`crate::http`]):
//!
//! - [`QueryGate`]: `GET {url}/api/v1/query?query=Q`; go when the result is empty (e.g.
//!   `kube_deployment_status_replicas_unavailable > 0`);
//! - [`AlertsGate`]: `GET {url}/api/v1/alerts`; go when no *firing* alert matches the selector
//!   (Prometheus label matchers: `severity="critical"`, `alertname!~"Watchdog|Info.*"`; all must
//!   match; regexes are anchored as in PromQL). With `alertmanager_url`, alerts covered by an
//!   active silence (`GET {am}/api/v2/silences`, state `active`) do not count, so an operator can
//!   silence an alert to let reboots through, as they would to quiet its notifications.
//!
//! Answers are read strictly: a `status` other than `success`, a `data` (or `data.alerts`, or a
//! query's `result`) of another type, or a body over [`BODY_MAX`] is a wait that says why, never
//! "no alerts". [`Access`] carries the CA file and the bearer token file.

use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{HeaderValue, ACCEPT, AUTHORIZATION, USER_AGENT};
use hyper::{Method, Request, Uri};
use serde_json::Value;

use super::Verdict;
use crate::http::{self, error_chain, HttpClient, SetupError, TlsFiles};

/// What a Prometheus gate could not set up, read or understand; the texts are the ones the gate
/// shows (in its wait, or in the configuration error).
#[derive(Debug, thiserror::Error)]
pub enum PrometheusError {
    #[error("{text:?}: not a label matcher (name=\"value\")")]
    NotAMatcher { text: String },
    #[error("{text:?}: not a label matcher (=, !=, =~, !~)")]
    NoOperator { text: String },
    #[error("{text:?}: {name:?} is not a label name")]
    LabelName { text: String, name: String },
    #[error("{name}: bad regex {value:?}: {error}")]
    Regex {
        name: String,
        value: String,
        error: regex::Error,
    },
    #[error("cannot read {key} {path}: {error}")]
    TokenRead {
        key: String,
        path: String,
        error: std::io::Error,
    },
    #[error("{key} {path} is not UTF-8")]
    TokenNotUtf8 { key: String, path: String },
    #[error("{key} {path} is empty")]
    TokenEmpty { key: String, path: String },
    #[error("{key} {path}: the token holds characters a header cannot")]
    TokenHeader { key: String, path: String },
    #[error("{url}: {error}")]
    Url {
        url: String,
        error: hyper::http::uri::InvalidUri,
    },
    #[error("{0}")]
    Request(hyper::http::Error),
    /// The HTTP client's error with its causes ([`error_chain`]).
    #[error("{0}")]
    Send(String),
    #[error("HTTP {status}: {error}")]
    Body {
        status: hyper::StatusCode,
        error: http::BodyError,
    },
    /// A status other than 2xx, and the start of the answer.
    #[error("HTTP {status}: {text}")]
    Status {
        status: hyper::StatusCode,
        text: String,
    },
    #[error("not JSON: {0}")]
    NotJson(serde_json::Error),
    /// An error of a call to `url`.
    #[error("{url}: {error}")]
    At {
        url: String,
        error: Box<PrometheusError>,
    },
    #[error("{url}: no answer within {after:?}")]
    Timeout { url: String, after: Duration },
    #[error("it answered status \"error\": {kind}: {error}")]
    ErrorStatus { kind: String, error: String },
    #[error("it answered status {0:?}, not \"success\"")]
    OtherStatus(String),
    #[error("its answer has no `status` (not the Prometheus API?)")]
    NoStatus,
    #[error("its answer's `data` is not an object")]
    DataNotObject,
    #[error("its answer has no `data.resultType`")]
    NoResultType,
    #[error("its {0} result is not an array")]
    ResultNotArray(String),
    #[error("result type {0:?} with no result it understands")]
    ResultType(String),
    #[error("its answer's `data.alerts` is not an array")]
    AlertsNotArray,
    #[error("an alert without labels or state: {0}")]
    BadAlert(String),
    #[error("a silence without matchers")]
    SilenceWithoutMatchers,
}

/// One label matcher.
#[derive(Debug, Clone)]
pub struct Matcher {
    pub name: String,
    pub op: MatchOp,
    pub value: String,
    regex: Option<regex::Regex>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MatchOp {
    Eq,
    Ne,
    Re,
    NotRe,
}

impl Matcher {
    /// `name="value"`, `name!="value"`, `name=~"re"`, `name!~"re"` (quotes optional).
    pub fn parse(s: &str) -> Result<Matcher, PrometheusError> {
        let s = s.trim();
        let pos = s
            .find(['=', '!'])
            .ok_or_else(|| PrometheusError::NotAMatcher {
                text: s.to_string(),
            })?;
        let name = s[..pos].trim();
        let rest = &s[pos..];
        let (op, value) = if let Some(v) = rest.strip_prefix("=~") {
            (MatchOp::Re, v)
        } else if let Some(v) = rest.strip_prefix("!~") {
            (MatchOp::NotRe, v)
        } else if let Some(v) = rest.strip_prefix("!=") {
            (MatchOp::Ne, v)
        } else if let Some(v) = rest.strip_prefix('=') {
            (MatchOp::Eq, v)
        } else {
            return Err(PrometheusError::NoOperator {
                text: s.to_string(),
            });
        };
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(PrometheusError::LabelName {
                text: s.to_string(),
                name: name.to_string(),
            });
        }
        let value = value.trim();
        let value = value
            .strip_prefix('"')
            .and_then(|v| v.strip_suffix('"'))
            .unwrap_or(value)
            .to_string();
        Matcher::new(name, op, &value)
    }

    pub fn new(name: &str, op: MatchOp, value: &str) -> Result<Matcher, PrometheusError> {
        let regex = match op {
            MatchOp::Re | MatchOp::NotRe => Some(
                regex::Regex::new(&format!("^(?:{value})$")).map_err(|error| {
                    PrometheusError::Regex {
                        name: name.to_string(),
                        value: value.to_string(),
                        error,
                    }
                })?,
            ),
            _ => None,
        };
        Ok(Matcher {
            name: name.to_string(),
            op,
            value: value.to_string(),
            regex,
        })
    }

    /// Whether the label set `labels` (a JSON object) matches; a missing label is "".
    pub fn matches(&self, labels: &Value) -> bool {
        let v = labels[&self.name].as_str().unwrap_or("");
        match (self.op, &self.regex) {
            (MatchOp::Eq, _) => v == self.value,
            (MatchOp::Ne, _) => v != self.value,
            (MatchOp::Re, Some(r)) => r.is_match(v),
            (MatchOp::NotRe, Some(r)) => !r.is_match(v),
            _ => false,
        }
    }
}

/// Largest Prometheus or Alertmanager answer read: `/api/v1/alerts` of a big Prometheus (a
/// thousand alerts with their labels and annotations) is a few MiB; more is not an answer
/// rebootd can act on, and a gate must not let a server fill its memory.
pub const BODY_MAX: usize = 16 * 1024 * 1024;

/// Where a Prometheus is and how rebootd reaches it: the CA(s) to trust for `https://`, and a
/// file holding a bearer token sent as `Authorization: Bearer` (read again for each request, so
/// a rotated token is picked up). Both are used for the gate's Alertmanager too.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Access {
    pub url: String,
    pub ca_file: Option<PathBuf>,
    pub bearer_token_file: Option<PathBuf>,
}

impl Access {
    /// A URL with no CA file and no token.
    pub fn url(url: &str) -> Access {
        Access {
            url: url.to_string(),
            ca_file: None,
            bearer_token_file: None,
        }
    }
}

/// The bearer token in `file`: its content without the final newline; an error names `key`,
/// the file and why (unreadable, empty, not usable in a header).
pub fn read_token(key: &str, file: &Path) -> Result<HeaderValue, PrometheusError> {
    let (key, path) = (key.to_string(), file.display().to_string());
    let raw = match std::fs::read(file) {
        Ok(raw) => raw,
        Err(error) => return Err(PrometheusError::TokenRead { key, path, error }),
    };
    let Ok(text) = String::from_utf8(raw) else {
        return Err(PrometheusError::TokenNotUtf8 { key, path });
    };
    let token = text.trim_end_matches(['\n', '\r']);
    if token.is_empty() {
        return Err(PrometheusError::TokenEmpty { key, path });
    }
    let Ok(mut value) = HeaderValue::from_str(&format!("Bearer {token}")) else {
        return Err(PrometheusError::TokenHeader { key, path });
    };
    value.set_sensitive(true);
    Ok(value)
}

/// A Prometheus (or Alertmanager) HTTP API endpoint.
#[derive(Debug, Clone)]
struct Api {
    base: String,
    client: HttpClient,
    timeout: Duration,
    /// `(key, file)` of the bearer token, if one is sent.
    token: Option<(String, PathBuf)>,
}

impl Api {
    /// `at` is the gate's key (`gates.before_reboot[1]`), `url_key` the URL's key in it; the
    /// CA file and the token file are read now, so a wrong one stops rebootd at start.
    fn new(
        at: &str,
        url_key: &str,
        url: &str,
        access: &Access,
        timeout: Duration,
    ) -> Result<Api, SetupError> {
        let base = url.trim_end_matches('/').to_string();
        let https = if base.starts_with("https://") {
            true
        } else if base.starts_with("http://") {
            false
        } else {
            return Err(SetupError(format!(
                "{at}.{url_key}: {url:?} is not an http(s):// URL"
            )));
        };
        let tls = TlsFiles {
            table: "gate",
            ca_file: access.ca_file.clone(),
            client_cert: None,
        };
        let client =
            http::client(https, &tls, timeout).map_err(|e| SetupError(format!("{at}: {e}")))?;
        let token = match &access.bearer_token_file {
            Some(file) => {
                let key = format!("{at}.bearer_token_file");
                read_token(&key, file).map_err(|e| SetupError(e.to_string()))?;
                Some((key, file.clone()))
            }
            None => None,
        };
        Ok(Api {
            base,
            client,
            timeout,
            token,
        })
    }

    async fn get(&self, path_and_query: &str) -> Result<Value, PrometheusError> {
        let url = format!("{}{path_and_query}", self.base);
        let uri: Uri = url.parse().map_err(|error| PrometheusError::Url {
            url: url.clone(),
            error,
        })?;
        let mut req = Request::builder()
            .method(Method::GET)
            .uri(uri)
            .header(ACCEPT, HeaderValue::from_static("application/json"))
            .header(USER_AGENT, HeaderValue::from_static("rebootd"));
        if let Some((key, file)) = &self.token {
            req = req.header(AUTHORIZATION, read_token(key, file)?);
        }
        let req = req
            .body(Full::new(Bytes::new()))
            .map_err(PrometheusError::Request)?;
        let call = async {
            let resp = self
                .client
                .request(req)
                .await
                .map_err(|e| PrometheusError::Send(error_chain(&e)))?;
            let status = resp.status();
            let body = http::read_body(resp.into_body(), BODY_MAX)
                .await
                .map_err(|error| PrometheusError::Body { status, error })?;
            if !status.is_success() {
                return Err(PrometheusError::Status {
                    status,
                    text: String::from_utf8_lossy(&body).chars().take(200).collect(),
                });
            }
            serde_json::from_slice(&body).map_err(PrometheusError::NotJson)
        };
        match tokio::time::timeout(self.timeout, call).await {
            Ok(r) => r.map_err(|error| PrometheusError::At {
                url: url.clone(),
                error: Box::new(error),
            }),
            Err(_) => Err(PrometheusError::Timeout {
                url,
                after: self.timeout,
            }),
        }
    }
}

/// The `data` of a Prometheus API answer (`{"status": "success", "data": {...}}`); anything
/// else is an answer the gate does not understand, and says why.
fn success_data(v: &Value) -> Result<&serde_json::Map<String, Value>, PrometheusError> {
    match v.get("status").and_then(Value::as_str) {
        Some("success") => {}
        Some("error") => {
            return Err(PrometheusError::ErrorStatus {
                kind: v["errorType"].as_str().unwrap_or("?").to_string(),
                error: v["error"].as_str().unwrap_or("?").to_string(),
            })
        }
        Some(other) => return Err(PrometheusError::OtherStatus(other.to_string())),
        None => return Err(PrometheusError::NoStatus),
    }
    v.get("data")
        .and_then(Value::as_object)
        .ok_or(PrometheusError::DataNotObject)
}

/// What a query returned.
#[derive(Debug, Clone, PartialEq, Eq)]
enum QueryResult {
    /// An empty vector or matrix.
    Nothing,
    /// This many series.
    Series(usize),
    /// A scalar or a string: never "nothing".
    Value(String),
}

/// A `/api/v1/query` answer read strictly.
fn query_result(v: &Value) -> Result<QueryResult, PrometheusError> {
    let data = success_data(v)?;
    let kind = data
        .get("resultType")
        .and_then(Value::as_str)
        .ok_or(PrometheusError::NoResultType)?;
    match (kind, data.get("result")) {
        ("vector" | "matrix", Some(Value::Array(r))) if r.is_empty() => Ok(QueryResult::Nothing),
        ("vector" | "matrix", Some(Value::Array(r))) => Ok(QueryResult::Series(r.len())),
        ("vector" | "matrix", _) => Err(PrometheusError::ResultNotArray(kind.to_string())),
        ("scalar" | "string", Some(_)) => Ok(QueryResult::Value(kind.to_string())),
        _ => Err(PrometheusError::ResultType(kind.to_string())),
    }
}

/// The alerts of a `/api/v1/alerts` answer read strictly: each an object with `labels` (an
/// object) and `state` (a string), or the whole answer is not understood.
fn alerts(v: &Value) -> Result<&Vec<Value>, PrometheusError> {
    let list = success_data(v)?
        .get("alerts")
        .and_then(Value::as_array)
        .ok_or(PrometheusError::AlertsNotArray)?;
    if let Some(bad) = list
        .iter()
        .find(|a| !a["labels"].is_object() || !a["state"].is_string())
    {
        let text: String = bad.to_string().chars().take(200).collect();
        return Err(PrometheusError::BadAlert(text));
    }
    Ok(list)
}

/// Percent-encode a query parameter value.
fn encode(s: &str) -> String {
    url::form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

/// Go when a PromQL query returns nothing.
#[derive(Debug, Clone)]
pub struct QueryGate {
    api: Api,
    pub query: String,
}

impl QueryGate {
    /// `at`: the gate's key, for errors (`gates.before_reboot[1]`).
    pub fn new(
        at: &str,
        prometheus: &Access,
        query: &str,
        timeout: Duration,
    ) -> Result<Self, SetupError> {
        Ok(QueryGate {
            api: Api::new(at, "prometheus_url", &prometheus.url, prometheus, timeout)?,
            query: query.to_string(),
        })
    }

    pub async fn check(&self) -> Verdict {
        let v = match self
            .api
            .get(&format!("/api/v1/query?query={}", encode(&self.query)))
            .await
        {
            Ok(v) => v,
            Err(e) => return Verdict::Wait(format!("Prometheus to answer ({e})")),
        };
        match query_result(&v) {
            Ok(QueryResult::Nothing) => Verdict::Go,
            Ok(QueryResult::Series(n)) => Verdict::Wait(format!(
                "the Prometheus query {:?} to return nothing (it returns {n} series)",
                self.query
            )),
            Ok(QueryResult::Value(t)) => Verdict::Wait(format!(
                "the Prometheus query {:?} to return an empty vector (it returns a {t})",
                self.query
            )),
            Err(why) => Verdict::Wait(format!(
                "Prometheus to answer the query {:?} in a way rebootd understands ({why})",
                self.query
            )),
        }
    }
}

/// Go when no firing alert matches the selector (silenced ones aside).
#[derive(Debug, Clone)]
pub struct AlertsGate {
    prometheus: Api,
    alertmanager: Option<Api>,
    pub selector: Vec<Matcher>,
}

impl AlertsGate {
    /// `at`: the gate's key, for errors (`gates.before_reboot[1]`). The Alertmanager is
    /// reached with the Prometheus's CA file and token.
    pub fn new(
        at: &str,
        prometheus: &Access,
        alertmanager_url: Option<&str>,
        selector: Vec<Matcher>,
        timeout: Duration,
    ) -> Result<Self, SetupError> {
        Ok(AlertsGate {
            prometheus: Api::new(at, "prometheus_url", &prometheus.url, prometheus, timeout)?,
            alertmanager: alertmanager_url
                .map(|u| Api::new(at, "alertmanager_url", u, prometheus, timeout))
                .transpose()?,
            selector,
        })
    }

    pub async fn check(&self) -> Verdict {
        let answer = match self.prometheus.get("/api/v1/alerts").await {
            Ok(v) => v,
            Err(e) => return Verdict::Wait(format!("Prometheus to answer ({e})")),
        };
        let alerts = match alerts(&answer) {
            Ok(a) => a,
            Err(why) => {
                return Verdict::Wait(format!(
                    "Prometheus to list its alerts in a way rebootd understands ({why})"
                ))
            }
        };
        let mut firing: Vec<&Value> = alerts
            .iter()
            .filter(|a| a["state"] == "firing")
            .filter(|a| self.selector.iter().all(|m| m.matches(&a["labels"])))
            .collect();
        if firing.is_empty() {
            return Verdict::Go;
        }
        if let Some(am) = &self.alertmanager {
            let silences = match am.get("/api/v2/silences").await {
                Ok(Value::Array(s)) => s,
                Ok(_) => {
                    return Verdict::Wait(
                        "Alertmanager to list its silences (its answer is not an array)".into(),
                    )
                }
                Err(e) => return Verdict::Wait(format!("Alertmanager to answer ({e})")),
            };
            let active: Vec<Vec<Matcher>> = silences
                .iter()
                .filter(|s| s["status"]["state"] == "active")
                .filter_map(|s| silence_matchers(s).ok())
                .collect();
            firing.retain(|a| {
                !active
                    .iter()
                    .any(|ms| ms.iter().all(|m| m.matches(&a["labels"])))
            });
        }
        if firing.is_empty() {
            return Verdict::Go;
        }
        let mut names: Vec<String> = firing
            .iter()
            .map(|a| a["labels"]["alertname"].as_str().unwrap_or("?").to_string())
            .collect();
        names.sort();
        names.dedup();
        Verdict::Wait(format!(
            "{} firing alert(s) to resolve or be silenced: {}",
            firing.len(),
            names.join(", ")
        ))
    }
}

/// An Alertmanager v2 silence's matchers (`name`, `value`, `isRegex`, `isEqual`).
fn silence_matchers(s: &Value) -> Result<Vec<Matcher>, PrometheusError> {
    s["matchers"]
        .as_array()
        .ok_or(PrometheusError::SilenceWithoutMatchers)?
        .iter()
        .map(|m| {
            let regex = m["isRegex"].as_bool().unwrap_or(false);
            let equal = m["isEqual"].as_bool().unwrap_or(true);
            let op = match (regex, equal) {
                (false, true) => MatchOp::Eq,
                (false, false) => MatchOp::Ne,
                (true, true) => MatchOp::Re,
                (true, false) => MatchOp::NotRe,
            };
            Matcher::new(
                m["name"].as_str().unwrap_or(""),
                op,
                m["value"].as_str().unwrap_or(""),
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn matchers_parse_and_match_as_promql() {
        let l = json!({"alertname": "NodeDown", "severity": "critical"});
        for (m, want) in [
            ("severity=\"critical\"", true),
            ("severity!=\"critical\"", false),
            ("alertname=~\"Node.*\"", true),
            ("alertname=~\"Node\"", false), // anchored
            ("alertname!~\"Watchdog|Info.*\"", true),
            ("team=\"\"", true), // a missing label is ""
            ("severity=critical", true),
        ] {
            assert_eq!(Matcher::parse(m).unwrap().matches(&l), want, "{m}");
        }
        for bad in ["severity", "=\"x\"", "sev erity=\"x\"", "a=~\"(\""] {
            assert!(Matcher::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn silence_matchers_follow_alertmanager() {
        let s = json!({"matchers": [
            {"name": "alertname", "value": "Node.*", "isRegex": true, "isEqual": true},
            {"name": "env", "value": "dev", "isRegex": false, "isEqual": false},
        ]});
        let ms = silence_matchers(&s).unwrap();
        let covered = json!({"alertname": "NodeDown", "env": "prod"});
        let not = json!({"alertname": "NodeDown", "env": "dev"});
        assert!(ms.iter().all(|m| m.matches(&covered)));
        assert!(!ms.iter().all(|m| m.matches(&not)));
    }
}
