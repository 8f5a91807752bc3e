//! Errors: [`ApiError`], an API failure rendered as a `Status` body shaped like the real
//! server's, and [`Error`], what starting or running the stand-in can fail with.

use serde_json::{json, Value};

use crate::kind::Kind;

/// Starting or running the stand-in failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot bind {addr}: {source}")]
    Bind {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot write kubeconfig {path}: {source}")]
    Kubeconfig {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("cannot load objects from {path}: {message}")]
    Objects {
        path: std::path::PathBuf,
        message: String,
    },
    #[error("{0}")]
    Usage(String),
    #[error(transparent)]
    Api(#[from] ApiError),
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
}

/// An API failure: HTTP code, `reason`, message and optional `details`, as a `Status`.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{code} {reason}: {message}")]
pub struct ApiError {
    pub code: u16,
    pub reason: String,
    pub message: String,
    pub details: Option<Value>,
    /// Seconds for a `Retry-After` header, when the real server would send one.
    pub retry_after: Option<u64>,
}

fn details(kind: Kind, name: &str) -> Value {
    let d = kind.def();
    let mut v = json!({ "name": name, "kind": d.plural });
    if !d.group.is_empty() {
        v["group"] = json!(d.group);
    }
    v
}

impl ApiError {
    pub fn new(code: u16, reason: &str, message: impl Into<String>) -> Self {
        ApiError {
            code,
            reason: reason.to_string(),
            message: message.into(),
            details: None,
            retry_after: None,
        }
    }

    pub fn with_details(mut self, details: Value) -> Self {
        self.details = Some(details);
        self
    }

    /// `pods "x" not found`
    pub fn not_found(kind: Kind, name: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("{} \"{}\" not found", kind.qualified_plural(), name),
        )
        .with_details(details(kind, name))
    }

    /// 404 for a path the server does not serve.
    pub fn no_route() -> Self {
        Self::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        )
        .with_details(json!({}))
    }

    /// `pods "x" already exists`
    pub fn already_exists(kind: Kind, name: &str) -> Self {
        Self::new(
            409,
            "AlreadyExists",
            format!("{} \"{}\" already exists", kind.qualified_plural(), name),
        )
        .with_details(details(kind, name))
    }

    /// The optimistic-concurrency failure of a stale write.
    pub fn conflict(kind: Kind, name: &str) -> Self {
        Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{}\": the object has been modified; \
                 please apply your changes to the latest version and try again",
                kind.qualified_plural(),
                name
            ),
        )
        .with_details(details(kind, name))
    }

    /// A precondition (uid or resourceVersion in DeleteOptions) did not hold.
    pub fn precondition(kind: Kind, name: &str, what: &str) -> Self {
        Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{}\": {}",
                kind.qualified_plural(),
                name,
                what
            ),
        )
        .with_details(details(kind, name))
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    /// 422 with one cause, like a validation failure.
    pub fn invalid(kind: Kind, name: &str, field: &str, message: &str) -> Self {
        let mut d = details(kind, name);
        d["kind"] = json!(kind.kind_name());
        d["causes"] =
            json!([{ "reason": "FieldValueInvalid", "message": message, "field": field }]);
        Self::new(
            422,
            "Invalid",
            format!(
                "{} \"{}\" is invalid: {}: {}",
                kind.kind_name(),
                name,
                field,
                message
            ),
        )
        .with_details(d)
    }

    pub fn method_not_allowed() -> Self {
        Self::new(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
        )
        .with_details(json!({}))
    }

    pub fn unsupported_media_type(content_type: &str) -> Self {
        Self::new(
            415,
            "UnsupportedMediaType",
            format!("the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml, application/strategic-merge-patch+json (got {content_type:?})"),
        )
    }

    pub fn not_acceptable() -> Self {
        Self::new(
            406,
            "NotAcceptable",
            "only the following media types are accepted: application/json",
        )
    }

    /// 410 for a watch from a resourceVersion older than the kept history.
    pub fn gone(rv: u64) -> Self {
        Self::new(410, "Expired", format!("too old resource version: {rv}"))
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(500, "InternalError", message)
    }

    /// The eviction refusal of a PodDisruptionBudget, word for word as the real server says it.
    pub fn disruption_budget(pdb: &str, desired: i64, current: i64) -> Self {
        Self::new(
            429,
            "TooManyRequests",
            "Cannot evict pod as it would violate the pod's disruption budget.",
        )
        .with_details(json!({
            "causes": [{
                "reason": "DisruptionBudget",
                "message": format!(
                    "The disruption budget {pdb} needs {desired} healthy pods and has {current} currently"
                ),
            }]
        }))
    }

    /// The error an injected fault answers with, for a given HTTP code.
    pub fn injected(code: u16) -> Self {
        let (reason, message, retry) = match code {
            409 => ("Conflict", "injected conflict", None),
            410 => ("Expired", "injected expiry", None),
            429 => ("TooManyRequests", "injected: too many requests", Some(1)),
            500 => ("InternalError", "injected internal error", None),
            503 => (
                "ServiceUnavailable",
                "injected: service unavailable",
                Some(1),
            ),
            504 => ("Timeout", "injected timeout", None),
            _ => ("InternalError", "injected failure", None),
        };
        let mut e = Self::new(code, reason, message).with_details(json!({}));
        e.retry_after = retry;
        e
    }

    /// The `Status` object.
    pub fn to_status(&self) -> Value {
        let mut v = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let Some(d) = &self.details {
            v["details"] = d.clone();
        }
        v
    }
}

/// The `Status` a successful eviction or deletion answers with.
pub fn success_status(code: u16) -> Value {
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "code": code,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn not_found_shape() {
        let s = ApiError::not_found(Kind::Lease, "x").to_status();
        assert_eq!(s["reason"], "NotFound");
        assert_eq!(s["code"], 404);
        assert_eq!(s["message"], "leases.coordination.k8s.io \"x\" not found");
        assert_eq!(s["details"]["group"], "coordination.k8s.io");
        assert_eq!(s["details"]["kind"], "leases");
    }

    #[test]
    fn pdb_shape() {
        let s = ApiError::disruption_budget("web", 2, 2).to_status();
        assert_eq!(s["code"], 429);
        assert_eq!(s["reason"], "TooManyRequests");
        assert_eq!(s["details"]["causes"][0]["reason"], "DisruptionBudget");
    }
}
