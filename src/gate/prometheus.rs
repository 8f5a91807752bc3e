//! Prometheus gates, over the binary's one HTTP client ([`crate::http`]):
//!
//! - [`QueryGate`]: `GET {url}/api/v1/query?query=Q`; go when the result is empty (e.g.
//!   `kube_deployment_status_replicas_unavailable > 0`);
//! - [`AlertsGate`]: `GET {url}/api/v1/alerts`; go when no *firing* alert matches the selector
//!   (Prometheus label matchers: `severity="critical"`, `alertname!~"Watchdog|Info.*"`; all must
//!   match; regexes are anchored as in PromQL). With `alertmanager_url`, alerts covered by an
//!   active silence (`GET {am}/api/v2/silences`, state `active`) do not count, so an operator can
//!   silence an alert to let reboots through, as they would to quiet its notifications.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::header::{HeaderValue, ACCEPT, USER_AGENT};
use hyper::{Method, Request, Uri};
use serde_json::Value;

use super::Verdict;
use crate::http::{self, error_chain, HttpClient, SetupError, TlsFiles};

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
    pub fn parse(s: &str) -> Result<Matcher, String> {
        let s = s.trim();
        let pos = s
            .find(['=', '!'])
            .ok_or_else(|| format!("{s:?}: not a label matcher (name=\"value\")"))?;
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
            return Err(format!("{s:?}: not a label matcher (=, !=, =~, !~)"));
        };
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(format!("{s:?}: {name:?} is not a label name"));
        }
        let value = value.trim();
        let value = value
            .strip_prefix('"')
            .and_then(|v| v.strip_suffix('"'))
            .unwrap_or(value)
            .to_string();
        Matcher::new(name, op, &value)
    }

    pub fn new(name: &str, op: MatchOp, value: &str) -> Result<Matcher, String> {
        let regex = match op {
            MatchOp::Re | MatchOp::NotRe => Some(
                regex::Regex::new(&format!("^(?:{value})$"))
                    .map_err(|e| format!("{name}: bad regex {value:?}: {e}"))?,
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

/// A Prometheus (or Alertmanager) HTTP API endpoint.
#[derive(Debug, Clone)]
struct Api {
    base: String,
    client: HttpClient,
    timeout: Duration,
}

impl Api {
    fn new(table: &'static str, url: &str, timeout: Duration) -> Result<Api, SetupError> {
        let base = url.trim_end_matches('/').to_string();
        let https = if base.starts_with("https://") {
            true
        } else if base.starts_with("http://") {
            false
        } else {
            return Err(SetupError(format!(
                "{table}: {url:?} is not an http(s):// URL"
            )));
        };
        let tls = TlsFiles {
            table,
            ca_file: None,
            client_cert: None,
        };
        Ok(Api {
            base,
            client: http::client(https, &tls, timeout)?,
            timeout,
        })
    }

    async fn get(&self, path_and_query: &str) -> Result<Value, String> {
        let url = format!("{}{path_and_query}", self.base);
        let uri: Uri = url.parse().map_err(|e| format!("{url}: {e}"))?;
        let req = Request::builder()
            .method(Method::GET)
            .uri(uri)
            .header(ACCEPT, HeaderValue::from_static("application/json"))
            .header(USER_AGENT, HeaderValue::from_static("rebootd"))
            .body(Full::new(Bytes::new()))
            .map_err(|e| e.to_string())?;
        let call = async {
            let resp = self
                .client
                .request(req)
                .await
                .map_err(|e| error_chain(&e))?;
            let status = resp.status();
            let body = resp
                .into_body()
                .collect()
                .await
                .map_err(|e| e.to_string())?
                .to_bytes();
            if !status.is_success() {
                return Err(format!(
                    "HTTP {status}: {}",
                    String::from_utf8_lossy(&body)
                        .chars()
                        .take(200)
                        .collect::<String>()
                ));
            }
            serde_json::from_slice(&body).map_err(|e| format!("not JSON: {e}"))
        };
        match tokio::time::timeout(self.timeout, call).await {
            Ok(r) => r.map_err(|e| format!("{url}: {e}")),
            Err(_) => Err(format!("{url}: no answer within {:?}", self.timeout)),
        }
    }
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
    pub fn new(prometheus_url: &str, query: &str, timeout: Duration) -> Result<Self, SetupError> {
        Ok(QueryGate {
            api: Api::new("gate.prometheus_url", prometheus_url, timeout)?,
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
        match v["data"]["result"].as_array() {
            Some(r) if r.is_empty() => Verdict::Go,
            Some(r) => Verdict::Wait(format!(
                "the Prometheus query {:?} to return nothing (it returns {} series)",
                self.query,
                r.len()
            )),
            None => match v["data"]["resultType"].as_str() {
                // A scalar or string result is never "nothing".
                Some(t) => Verdict::Wait(format!(
                    "the Prometheus query {:?} to return an empty vector (it returns a {t})",
                    self.query
                )),
                None => Verdict::Wait(format!("Prometheus to answer the query ({v})")),
            },
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
    pub fn new(
        prometheus_url: &str,
        alertmanager_url: Option<&str>,
        selector: Vec<Matcher>,
        timeout: Duration,
    ) -> Result<Self, SetupError> {
        Ok(AlertsGate {
            prometheus: Api::new("gate.prometheus_url", prometheus_url, timeout)?,
            alertmanager: alertmanager_url
                .map(|u| Api::new("gate.alertmanager_url", u, timeout))
                .transpose()?,
            selector,
        })
    }

    pub async fn check(&self) -> Verdict {
        let alerts = match self.prometheus.get("/api/v1/alerts").await {
            Ok(v) => v["data"]["alerts"].as_array().cloned().unwrap_or_default(),
            Err(e) => return Verdict::Wait(format!("Prometheus to answer ({e})")),
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
                Ok(v) => v.as_array().cloned().unwrap_or_default(),
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
fn silence_matchers(s: &Value) -> Result<Vec<Matcher>, String> {
    s["matchers"]
        .as_array()
        .ok_or("a silence without matchers")?
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
