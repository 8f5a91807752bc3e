//! A client of Zincati's FleetLock protocol, as served by airlock and poseidon/fleetlock: the
//! requests and how answers sort, apart from the lock's rules (those are in
//! [`crate::lock::fleetlock`]).
//!
//! The protocol has two calls, each a `POST` with the header `fleet-lock-protocol: true` and the
//! body `{"client_params": {"id": "<id>", "group": "<group>"}}`:
//! - `{base}/v1/pre-reboot` takes a slot (recursively: a holder asking again is granted);
//! - `{base}/v1/steady-state` gives it back (not holding one is success).
//!
//! 200 means done; any other status carries (usually) a JSON error `{"kind": ..., "value": ...}`.
//! "All slots are taken" is not a distinct status: airlock answers 500 with kind `failed_lock`,
//! poseidon/fleetlock answers 423 with kind `locked`; this client also takes 409 as "taken".
//! The group is restricted by the protocol to `^[a-zA-Z0-9.-]+$`.

use std::path::PathBuf;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{HeaderValue, ACCEPT, CONTENT_TYPE, USER_AGENT};
use hyper::{Method, Request, StatusCode, Uri};

use crate::http::{self, error_chain, HttpClient};
use crate::lock::LockError;

/// Why a request got no answer: a transport failure, a body that could not be read, or time.
#[derive(Debug, thiserror::Error)]
pub enum NoAnswer {
    #[error("cannot build the request: {0}")]
    Request(String),
    #[error("{0}")]
    Transport(String),
    #[error("reading the answer to HTTP {0}: {1}")]
    Body(hyper::StatusCode, http::BodyError),
    #[error("no answer within {0:?}")]
    Timeout(Duration),
}

/// The header every FleetLock request carries (with value `true`).
pub const PROTOCOL_HEADER: &str = "fleet-lock-protocol";
/// Path of the lock call, relative to the base URL.
pub const PRE_REBOOT: &str = "v1/pre-reboot";
/// Path of the unlock call, relative to the base URL.
pub const STEADY_STATE: &str = "v1/steady-state";
/// Largest answer body read.
const BODY_MAX: usize = 64 * 1024;
/// Longest answer text quoted in errors and logs.
const QUOTE_MAX: usize = 500;

/// Settings of the FleetLock client beyond the URL and the group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// PEM file of the CA(s) to trust for an `https://` URL instead of the system roots.
    pub ca_file: Option<PathBuf>,
    /// Opening a TCP connection.
    pub connect_timeout: Duration,
    /// One request, from sending it to the end of the answer.
    pub request_timeout: Duration,
    /// First pause between two `pre-reboot` requests (and after a failed `steady-state`);
    /// doubled each time up to `backoff_max`.
    pub backoff_min: Duration,
    pub backoff_max: Duration,
    /// `steady-state` requests [`Semaphore::release`] makes before giving up on transient
    /// errors (at least 1).
    pub release_attempts: u32,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            ca_file: None,
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(10),
            backoff_min: Duration::from_secs(1),
            backoff_max: Duration::from_secs(30),
            release_attempts: 4,
        }
    }
}

/// The two calls of the protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Call {
    PreReboot,
    SteadyState,
}

/// A FleetLock server's answer other than a transport failure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub status: StatusCode,
    /// `kind` of the JSON error body, if it has one.
    pub kind: Option<String>,
    /// `value` of the JSON error body, or the body text when it is not such a document.
    pub value: String,
}

impl Answer {
    fn from_body(status: StatusCode, body: &[u8]) -> Self {
        #[derive(serde::Deserialize)]
        struct ErrorBody {
            pub kind: Option<String>,
            value: Option<String>,
        }
        // airlock writes its JSON with Go's http.Error: text/plain and a trailing newline.
        let text = String::from_utf8_lossy(body);
        let text = text.trim();
        match serde_json::from_str::<ErrorBody>(text) {
            Ok(e) => Answer {
                status,
                kind: e.kind,
                value: e.value.unwrap_or_default(),
            },
            Err(_) => Answer {
                status,
                kind: None,
                value: quote(text),
            },
        }
    }

    /// "all slots taken" (airlock: 500 `failed_lock`; poseidon/fleetlock: 423 `locked`).
    pub fn is_taken(&self) -> bool {
        matches!(self.status, StatusCode::CONFLICT | StatusCode::LOCKED)
            || matches!(self.kind.as_deref(), Some("failed_lock" | "locked"))
    }

    /// Worth asking again: the server is in trouble or asks to slow down.
    pub fn is_transient(&self) -> bool {
        self.status.is_server_error()
            || matches!(
                self.status,
                StatusCode::REQUEST_TIMEOUT | StatusCode::TOO_MANY_REQUESTS
            )
    }

    pub fn kind(&self) -> &str {
        self.kind.as_deref().unwrap_or("-")
    }
}

impl std::fmt::Display for Answer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HTTP {}", self.status.as_u16())?;
        if let Some(kind) = &self.kind {
            write!(f, ", kind {kind}")?;
        }
        if !self.value.is_empty() {
            write!(f, ": {}", self.value)?;
        }
        Ok(())
    }
}

/// A FleetLock client for one server and one group.
#[derive(Clone)]
pub struct Client {
    client: HttpClient,
    base: String,
    group: String,
    pre_reboot: (Uri, String),
    steady_state: (Uri, String),
    options: Options,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("url", &self.base)
            .field("group", &self.group)
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl Client {
    /// A client of the FleetLock server at `url` (the base URL: `http://host:port` or
    /// `https://host/some/prefix`; the calls are `{url}/v1/pre-reboot` and
    /// `{url}/v1/steady-state`) for the semaphore of `group`. Makes no request: a server that
    /// is down shows at the first call. Errors ([`LockError::Refused`]) are for settings only:
    /// a URL that is not absolute `http(s)://`, a group the protocol does not allow, an
    /// unreadable `ca_file`, or no system roots for an `https://` URL.
    pub fn new(url: &str, group: &str, options: Options) -> Result<Self, LockError> {
        let refused = |what: String| LockError::Refused(format!("lock.fleetlock: {what}"));
        let parsed =
            url::Url::parse(url).map_err(|e| refused(format!("url {url:?} is not a URL: {e}")))?;
        let https = match parsed.scheme() {
            "http" => false,
            "https" => true,
            other => {
                return Err(refused(format!(
                    "url {url:?}: scheme {other}:// is not http:// or https://"
                )))
            }
        };
        if parsed.host_str().is_none_or(str::is_empty) {
            return Err(refused(format!("url {url:?} has no host")));
        }
        if !parsed.username().is_empty() || parsed.password().is_some() {
            return Err(refused(format!(
                "url {url:?}: user names and passwords in the URL are not supported"
            )));
        }
        if parsed.query().is_some() || parsed.fragment().is_some() {
            return Err(refused(format!(
                "url {url:?}: a base URL cannot have a query or a fragment"
            )));
        }
        if !valid_group(group) {
            return Err(LockError::Refused(format!(
                "identity.group {group:?}: the FleetLock protocol allows only letters, digits, \
                 '.' and '-' in a group name"
            )));
        }
        if !https {
            if let Some(ca) = &options.ca_file {
                return Err(refused(format!(
                    "ca_file {} is set but url {url:?} is plain http://; use https://",
                    ca.display()
                )));
            }
        }

        let base = parsed.as_str().trim_end_matches('/').to_owned();
        let endpoint = |path: &str| -> Result<(Uri, String), LockError> {
            let full = format!("{base}/{path}");
            let uri = full
                .parse::<Uri>()
                .map_err(|e| refused(format!("url {url:?}: {e}")))?;
            Ok((uri, full))
        };
        let pre_reboot = endpoint(PRE_REBOOT)?;
        let steady_state = endpoint(STEADY_STATE)?;

        let tls = http::TlsFiles {
            table: "lock.fleetlock",
            ca_file: options.ca_file.clone(),
            client_cert: None,
        };
        let client = http::client(https, &tls, options.connect_timeout)
            .map_err(|e| LockError::Refused(e.0))?;
        Ok(Client {
            client,
            base,
            group: group.to_owned(),
            pre_reboot,
            steady_state,
            options,
        })
    }

    /// The base URL (without a trailing `/`).
    pub fn url(&self) -> &str {
        &self.base
    }

    pub fn options(&self) -> &Options {
        &self.options
    }

    pub fn group(&self) -> &str {
        &self.group
    }

    /// The full URL of `call`.
    pub fn endpoint(&self, call: Call) -> &str {
        match call {
            Call::PreReboot => &self.pre_reboot.1,
            Call::SteadyState => &self.steady_state.1,
        }
    }

    /// One request. `Err`: no answer came.
    pub async fn post(&self, call: Call, id: &str) -> Result<Answer, NoAnswer> {
        let (uri, _) = match call {
            Call::PreReboot => &self.pre_reboot,
            Call::SteadyState => &self.steady_state,
        };
        let body = serde_json::json!({
            "client_params": { "id": id, "group": self.group }
        })
        .to_string();
        let request = Request::builder()
            .method(Method::POST)
            .uri(uri.clone())
            .header(PROTOCOL_HEADER, HeaderValue::from_static("true"))
            .header(CONTENT_TYPE, HeaderValue::from_static("application/json"))
            .header(ACCEPT, HeaderValue::from_static("application/json"))
            .header(
                USER_AGENT,
                HeaderValue::from_static(concat!("rebootd/", env!("CARGO_PKG_VERSION"))),
            )
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| NoAnswer::Request(e.to_string()))?;
        let exchange = async {
            let response = self
                .client
                .request(request)
                .await
                .map_err(|e| NoAnswer::Transport(error_chain(&e)))?;
            let status = response.status();
            let body = http::read_body(response.into_body(), BODY_MAX)
                .await
                .map_err(|e| NoAnswer::Body(status, e))?;
            Ok::<_, NoAnswer>(Answer::from_body(status, &body))
        };
        match tokio::time::timeout(self.options.request_timeout, exchange).await {
            Err(_) => Err(NoAnswer::Timeout(self.options.request_timeout)),
            Ok(r) => r,
        }
    }
}

/// The protocol's group names: `^[a-zA-Z0-9.-]+$`.
fn valid_group(group: &str) -> bool {
    !group.is_empty()
        && group
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-')
}

/// An answer's text for errors and logs: bounded and escaped ([`crate::text::clean_to`]).
fn quote(text: &str) -> String {
    crate::text::clean_to(text, QUOTE_MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_sorted() {
        let airlock = Answer::from_body(
            StatusCode::INTERNAL_SERVER_ERROR,
            b"{\"kind\":\"failed_lock\",\"value\":\"all 1 semaphore slots currently locked\"}\n",
        );
        assert!(airlock.is_taken());
        assert_eq!(airlock.value, "all 1 semaphore slots currently locked");
        let poseidon =
            Answer::from_body(StatusCode::LOCKED, b"{\"kind\":\"locked\",\"value\":\"x\"}");
        assert!(poseidon.is_taken());
        let bad = Answer::from_body(
            StatusCode::BAD_REQUEST,
            b"{\"kind\":\"unknown_group\",\"value\":\"unknown group \\\"x\\\"\"}",
        );
        assert!(!bad.is_taken() && !bad.is_transient());
        let plain = Answer::from_body(StatusCode::BAD_GATEWAY, b"<html>bad gateway</html>");
        assert!(plain.is_transient() && plain.kind.is_none());
        assert_eq!(plain.value, "<html>bad gateway</html>");
    }

    #[test]
    fn settings_are_checked() {
        let o = Options::default;
        assert!(Client::new("http://127.0.0.1:1", "default", o()).is_ok());
        let f = Client::new("http://h:1/base/", "default", o()).unwrap();
        assert_eq!(f.url(), "http://h:1/base");
        assert_eq!(f.pre_reboot.1, "http://h:1/base/v1/pre-reboot");
        for (url, group) in [
            ("ftp://h", "default"),
            ("not a url", "default"),
            ("http://u:p@h", "default"),
            ("http://h/?q=1", "default"),
            ("http://h", "bad_group"),
            ("http://h", ""),
        ] {
            let e = Client::new(url, group, o()).unwrap_err();
            assert!(matches!(e, LockError::Refused(_)), "{url} {group}: {e}");
        }
    }

    #[test]
    fn tls_settings_are_checked() {
        let dir = tempfile::tempdir().unwrap();
        let with_ca = |path: PathBuf| Options {
            ca_file: Some(path),
            ..Options::default()
        };
        let missing = dir.path().join("missing.pem");
        let e = Client::new("https://h", "default", with_ca(missing.clone())).unwrap_err();
        assert!(
            e.to_string().contains(&missing.display().to_string()),
            "{e}"
        );

        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").unwrap();
        let e = Client::new("https://h", "default", with_ca(empty)).unwrap_err();
        assert!(e.to_string().contains("holds no certificate"), "{e}");

        let e = Client::new("http://h", "default", with_ca(missing)).unwrap_err();
        assert!(e.to_string().contains("plain http://"), "{e}");

        // System roots: present on most hosts; without them the error says what to set.
        match Client::new("https://h", "default", Options::default()) {
            Ok(f) => assert_eq!(f.url(), "https://h"),
            Err(e) => assert!(e.to_string().contains("ca_file"), "{e}"),
        }
    }
}
