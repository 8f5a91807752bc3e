//! Fault injection for chaos tests: the next N requests whose path contains a string (and,
//! optionally, with a given method and a body containing a string) fail with a status or hang
//! for a while; plus the request log tests read to count what the server answered.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

/// What a matching request gets.
#[derive(Debug, Clone, PartialEq)]
pub enum FaultAction {
    /// Answer with this HTTP code and a matching `Status` body (429 and 503 carry
    /// `Retry-After: 1`).
    Status(u16),
    /// Wait this long, then handle the request normally.
    Hang(Duration),
}

/// One fault rule.
#[derive(Debug, Clone, PartialEq)]
pub struct FaultRule {
    /// Only requests with this method (`GET`, `POST`, ...); `None` = any.
    pub method: Option<String>,
    /// Requests whose path contains this string.
    pub path_contains: String,
    /// Only requests whose body contains this string (e.g. one phase of a PATCH); `None` = any.
    pub body_contains: Option<String>,
    /// Only requests whose query string, as sent (percent-encoded), contains this string (e.g.
    /// one watch's field selector); `None` = any.
    pub query_contains: Option<String>,
    /// How many matching requests it applies to.
    pub times: usize,
    pub action: FaultAction,
}

impl FaultRule {
    /// The next `times` requests whose path contains `path_contains` get `code`.
    pub fn status(path_contains: &str, code: u16, times: usize) -> Self {
        FaultRule {
            method: None,
            path_contains: path_contains.to_string(),
            body_contains: None,
            query_contains: None,
            times,
            action: FaultAction::Status(code),
        }
    }

    /// The next `times` requests whose path contains `path_contains` wait `d` first.
    pub fn hang(path_contains: &str, d: Duration, times: usize) -> Self {
        FaultRule {
            method: None,
            path_contains: path_contains.to_string(),
            body_contains: None,
            query_contains: None,
            times,
            action: FaultAction::Hang(d),
        }
    }

    /// Restrict to one method.
    pub fn method(mut self, method: &str) -> Self {
        self.method = Some(method.to_ascii_uppercase());
        self
    }

    /// Restrict to requests whose body contains `text`.
    pub fn body_contains(mut self, text: &str) -> Self {
        self.body_contains = Some(text.to_string());
        self
    }

    /// Restrict to requests whose query string (percent-encoded, as sent) contains `text`.
    pub fn query_contains(mut self, text: &str) -> Self {
        self.query_contains = Some(text.to_string());
        self
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The fault rules in force (cheap to clone, shared).
#[derive(Debug, Clone, Default)]
pub struct Faults {
    rules: Arc<Mutex<Vec<FaultRule>>>,
}

impl Faults {
    /// Add a rule; rules are tried in the order they were added.
    pub fn inject(&self, rule: FaultRule) {
        lock(&self.rules).push(rule);
    }

    /// Drop every rule.
    pub fn clear(&self) {
        lock(&self.rules).clear();
    }

    /// How many faulted requests are still to come, over all rules.
    pub fn pending(&self) -> usize {
        lock(&self.rules).iter().map(|r| r.times).sum()
    }

    /// The action for this request, using up one count of the first matching rule.
    pub(crate) fn take(
        &self,
        method: &str,
        path: &str,
        query: &str,
        body: &[u8],
    ) -> Option<FaultAction> {
        let mut rules = lock(&self.rules);
        let i = rules.iter().position(|r| {
            r.times > 0
                && r.method.as_deref().is_none_or(|m| m == method)
                && path.contains(&r.path_contains)
                && r.query_contains
                    .as_deref()
                    .is_none_or(|t| query.contains(t))
                && r.body_contains
                    .as_deref()
                    .is_none_or(|t| body.windows(t.len().max(1)).any(|w| w == t.as_bytes()))
        })?;
        rules[i].times -= 1;
        let action = rules[i].action.clone();
        if rules[i].times == 0 {
            rules.remove(i);
        }
        Some(action)
    }
}

/// One answered request.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestRecord {
    pub at: SystemTime,
    pub method: String,
    pub path: String,
    pub query: String,
    /// The HTTP code answered (for a watch, 200 when the stream started).
    pub status: u16,
    /// The `reason` of a `Status` error body, if the answer was one.
    pub reason: Option<String>,
    /// The bearer token the client sent (the kubeconfig's user), if any.
    pub user: Option<String>,
}

const LOG_CAP: usize = 100_000;

/// The request log (bounded; the oldest records go first).
#[derive(Debug, Clone, Default)]
pub struct RequestLog {
    records: Arc<Mutex<VecDeque<RequestRecord>>>,
    /// Every request answered, kept or not (the log keeps the latest [`LOG_CAP`]).
    total: Arc<std::sync::atomic::AtomicU64>,
}

impl RequestLog {
    pub(crate) fn push(&self, r: RequestRecord) {
        self.total
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut v = lock(&self.records);
        if v.len() >= LOG_CAP {
            v.pop_front();
        }
        v.push_back(r);
    }

    /// A copy of every record kept.
    pub fn all(&self) -> Vec<RequestRecord> {
        lock(&self.records).iter().cloned().collect()
    }

    /// Every request answered since the start, also those the log no longer keeps.
    pub fn total(&self) -> u64 {
        self.total.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// How many records satisfy `f`.
    pub fn count(&self, f: impl Fn(&RequestRecord) -> bool) -> usize {
        lock(&self.records).iter().filter(|r| f(r)).count()
    }

    /// Forget every record.
    pub fn clear(&self) {
        lock(&self.records).clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_count_down() {
        let f = Faults::default();
        f.inject(FaultRule::status("/leases/", 500, 2).method("put"));
        assert_eq!(
            f.take(
                "GET",
                "/apis/coordination.k8s.io/v1/namespaces/a/leases/x",
                "",
                b""
            ),
            None
        );
        let p = "/apis/coordination.k8s.io/v1/namespaces/a/leases/x";
        assert_eq!(f.take("PUT", p, "", b""), Some(FaultAction::Status(500)));
        assert_eq!(f.pending(), 1);
        assert_eq!(f.take("PUT", p, "", b""), Some(FaultAction::Status(500)));
        assert_eq!(f.take("PUT", p, "", b""), None);
    }

    #[test]
    fn a_rule_can_ask_for_a_body() {
        let f = Faults::default();
        let d = Duration::from_secs(1);
        f.inject(FaultRule::hang("/nodes/n", d, 1).body_contains("\"releasing\""));
        let p = "/api/v1/nodes/n";
        let uncordoning = br#"{"metadata":{"annotations":{"rebootd.io/phase":"uncordoning"}}}"#;
        let releasing = br#"{"metadata":{"annotations":{"rebootd.io/phase":"releasing"}}}"#;
        assert_eq!(f.take("PATCH", p, "", uncordoning), None);
        assert_eq!(f.take("PATCH", p, "", b""), None);
        assert_eq!(
            f.take("PATCH", p, "", releasing),
            Some(FaultAction::Hang(d))
        );
        assert_eq!(f.pending(), 0);
    }

    #[test]
    fn a_rule_can_match_one_query() {
        let f = Faults::default();
        f.inject(FaultRule::status("/leases", 410, 1).query_contains("metadata.name%3Dw-a"));
        let p = "/apis/coordination.k8s.io/v1/namespaces/a/leases";
        assert_eq!(f.take("GET", p, "watch=true&labelSelector=x", b""), None);
        assert_eq!(
            f.take(
                "GET",
                p,
                "watch=true&fieldSelector=metadata.name%3Dw-a",
                b""
            ),
            Some(FaultAction::Status(410))
        );
        assert_eq!(f.pending(), 0);
    }
}
