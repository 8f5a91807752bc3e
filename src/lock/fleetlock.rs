//! Lock backend `fleetlock`: a client of Zincati's FleetLock protocol, as served by airlock and
//! poseidon/fleetlock, so rebootd nodes can share a reboot semaphore with Fedora CoreOS nodes.
//!
//! The protocol has two calls, each a `POST` with the header `fleet-lock-protocol: true` and the
//! body `{"client_params": {"id": "<id>", "group": "<group>"}}`:
//! - `{base}/v1/pre-reboot` takes a slot (recursively: a holder asking again is granted);
//! - `{base}/v1/steady-state` gives it back (not holding one is success).
//!
//! 200 means done; any other status carries (usually) a JSON error `{"kind": ..., "value": ...}`.
//! "All slots are taken" is not a distinct status: airlock answers 500 with kind `failed_lock`,
//! poseidon/fleetlock answers 423 with kind `locked`; this client also takes 409 as "taken".
//!
//! What follows from the protocol:
//! - There is no wait or watch: [`Semaphore::acquire`] asks again with capped exponential
//!   backoff ([`Options::backoff_min`] doubling up to [`Options::backoff_max`], ±10 % jitter),
//!   logging the server's answer each time it changes. Transient trouble (connection refused,
//!   time-outs, 5xx, 408, 429) is retried the same way; any other answer (4xx, 3xx) is a
//!   permanent [`LockError::Refused`] naming the URL, the status, the kind and the value.
//! - The server owns the semaphore's view: there is no call to read holders or the number of
//!   slots, nor to change them. So this backend implements only the agent's
//!   [`Semaphore`], not [`super::Admin`] (`rebootctl` says what it cannot do here);
//!   [`Semaphore::report_phase`] does nothing, and there is no heartbeat. [`Semaphore::fence`]
//!   asks `pre-reboot` once: the server grants it again to a holder.
//! - The holder id sent is [`Identity::id`]: `[lock.fleetlock] id`, else Zincati's id (the machine
//!   id made app-specific, `runtime::holder_id`); the group is `identity.group`,
//!   which the protocol restricts to `^[a-zA-Z0-9.-]+$`.

use crate::lock::Backend;
use crate::state::Phase;
use std::path::PathBuf;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{HeaderValue, ACCEPT, CONTENT_TYPE, USER_AGENT};
use hyper::{Method, Request, StatusCode, Uri};

use super::{Fence, GroupPause, Identity, LockError, Pauses, Reported, Semaphore};
use crate::backoff::Backoff;
use crate::http::{self, error_chain, HttpClient};

const BACKEND: Backend = Backend::FleetLock;
/// Why a request got no answer: a transport failure, a body that could not be read, or time.
#[derive(Debug, thiserror::Error)]
enum NoAnswer {
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
enum Call {
    PreReboot,
    SteadyState,
}

/// A FleetLock server's answer other than a transport failure.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Answer {
    status: StatusCode,
    /// `kind` of the JSON error body, if it has one.
    kind: Option<String>,
    /// `value` of the JSON error body, or the body text when it is not such a document.
    value: String,
}

impl Answer {
    fn from_body(status: StatusCode, body: &[u8]) -> Self {
        #[derive(serde::Deserialize)]
        struct ErrorBody {
            kind: Option<String>,
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
    fn is_taken(&self) -> bool {
        matches!(self.status, StatusCode::CONFLICT | StatusCode::LOCKED)
            || matches!(self.kind.as_deref(), Some("failed_lock" | "locked"))
    }

    /// Worth asking again: the server is in trouble or asks to slow down.
    fn is_transient(&self) -> bool {
        self.status.is_server_error()
            || matches!(
                self.status,
                StatusCode::REQUEST_TIMEOUT | StatusCode::TOO_MANY_REQUESTS
            )
    }

    fn kind(&self) -> &str {
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

/// What one round of `acquire` saw, to log only changes.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Seen {
    Taken(Option<String>, String),
    Trouble(String),
}

/// A FleetLock client for one server and one group.
#[derive(Clone)]
pub struct FleetLock {
    client: HttpClient,
    base: String,
    group: String,
    pre_reboot: (Uri, String),
    steady_state: (Uri, String),
    options: Options,
}

impl std::fmt::Debug for FleetLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FleetLock")
            .field("url", &self.base)
            .field("group", &self.group)
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl FleetLock {
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
        Ok(FleetLock {
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

    pub fn group(&self) -> &str {
        &self.group
    }

    fn endpoint(&self, call: Call) -> &(Uri, String) {
        match call {
            Call::PreReboot => &self.pre_reboot,
            Call::SteadyState => &self.steady_state,
        }
    }

    /// One request. `Err`: no answer came.
    async fn post(&self, call: Call, id: &str) -> Result<Answer, NoAnswer> {
        let (uri, _) = self.endpoint(call);
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

    /// The pause between tries: `backoff_min` doubling up to `backoff_max`, ±10 % jitter so a
    /// fleet does not ask in lockstep.
    fn backoff(&self) -> Backoff {
        Backoff::new(self.options.backoff_min, self.options.backoff_max)
    }

    fn unreachable(&self, call: Call, reason: NoAnswer) -> LockError {
        LockError::Unreachable {
            backend: BACKEND,
            target: self.endpoint(call).1.clone(),
            reason: reason.to_string(),
        }
    }

    fn refused(&self, call: Call, id: &str, answer: &Answer) -> LockError {
        LockError::Refused(format!(
            "FleetLock server refused {} for id {id} in group {}: POST {} answered HTTP {} \
             (kind {}, value {:?})",
            match call {
                Call::PreReboot => "a slot",
                Call::SteadyState => "the release",
            },
            self.group,
            self.endpoint(call).1,
            answer.status.as_u16(),
            answer.kind(),
            answer.value,
        ))
    }

    fn server_error(&self, call: Call, answer: &Answer) -> LockError {
        LockError::Backend {
            backend: BACKEND,
            reason: format!(
                "POST {} answered HTTP {} (kind {}, value {:?})",
                self.endpoint(call).1,
                answer.status.as_u16(),
                answer.kind(),
                answer.value
            ),
        }
    }
}

/// The server owns its semaphore and the protocol has no pause: never paused.
#[async_trait]
impl Pauses for FleetLock {
    async fn group_pause(&self) -> Result<Option<GroupPause>, LockError> {
        Ok(None)
    }

    async fn group_pause_changed(
        &self,
        _known: Option<&GroupPause>,
    ) -> Result<Option<GroupPause>, LockError> {
        std::future::pending().await
    }
}

#[async_trait]
impl Semaphore for FleetLock {
    fn backend(&self) -> Backend {
        BACKEND
    }

    /// `pre-reboot` until granted. "Slots taken" and transient trouble are retried with
    /// backoff for ever (the caller may drop the future); other refusals are errors.
    #[tracing::instrument(skip(self, me), fields(url = %self.pre_reboot.1, group = %self.group, id = %me.id))]
    async fn acquire(&self, me: &Identity) -> Result<(), LockError> {
        let mut backoff = self.backoff();
        let mut last: Option<Seen> = None;
        let mut attempts: u64 = 0;
        loop {
            attempts += 1;
            let seen = match self.post(Call::PreReboot, &me.id).await {
                Ok(a) if a.status.is_success() => {
                    tracing::info!(
                        url = %self.pre_reboot.1,
                        group = %self.group,
                        id = %me.id,
                        attempts,
                        "took a slot from the FleetLock server"
                    );
                    return Ok(());
                }
                Ok(a) if a.is_taken() => Seen::Taken(a.kind.clone(), a.value.clone()),
                Ok(a) if a.is_transient() => Seen::Trouble(a.to_string()),
                Ok(a) => {
                    let e = self.refused(Call::PreReboot, &me.id, &a);
                    tracing::error!(error = %e, "the FleetLock server refused the request");
                    return Err(e);
                }
                Err(reason) => Seen::Trouble(format!("unreachable: {reason}")),
            };
            let delay = backoff.next_jittered();
            if last.as_ref() != Some(&seen) {
                match &seen {
                    Seen::Taken(kind, value) => tracing::info!(
                        url = %self.pre_reboot.1,
                        group = %self.group,
                        id = %me.id,
                        kind = kind.as_deref().unwrap_or("-"),
                        value = %value,
                        retry_in = ?delay,
                        "waiting for a free slot: the FleetLock server has none; asking again with backoff"
                    ),
                    Seen::Trouble(what) => tracing::warn!(
                        url = %self.pre_reboot.1,
                        group = %self.group,
                        id = %me.id,
                        error = %what,
                        retry_in = ?delay,
                        "waiting for the FleetLock server: no usable answer; asking again with backoff"
                    ),
                }
                last = Some(seen);
            } else {
                tracing::debug!(url = %self.pre_reboot.1, attempts, retry_in = ?delay, answer = ?last, "no slot yet");
            }
            tokio::time::sleep(delay).await;
        }
    }

    /// `steady-state`; transient errors are retried [`Options::release_attempts`] times.
    #[tracing::instrument(skip(self, me), fields(url = %self.steady_state.1, group = %self.group, id = %me.id))]
    async fn release(&self, me: &Identity) -> Result<(), LockError> {
        let id = me.id.as_str();
        let attempts = self.options.release_attempts.max(1);
        let mut backoff = self.backoff();
        let mut attempt = 1;
        loop {
            let err = match self.post(Call::SteadyState, id).await {
                Ok(a) if a.status.is_success() => {
                    tracing::info!(
                        url = %self.steady_state.1,
                        group = %self.group,
                        %id,
                        "released the slot (if held) at the FleetLock server"
                    );
                    return Ok(());
                }
                // A "taken" answer to an unlock is a server in trouble (airlock: 500
                // failed_lock when its etcd fails).
                Ok(a) if a.is_transient() || a.is_taken() => {
                    self.server_error(Call::SteadyState, &a)
                }
                Ok(a) => return Err(self.refused(Call::SteadyState, id, &a)),
                Err(reason) => self.unreachable(Call::SteadyState, reason),
            };
            if attempt >= attempts {
                tracing::warn!(error = %err, attempts, "giving up releasing the slot for now");
                return Err(err);
            }
            let delay = backoff.next_jittered();
            tracing::warn!(error = %err, attempt, retry_in = ?delay, "releasing the slot failed; retrying");
            tokio::time::sleep(delay).await;
            attempt += 1;
        }
    }

    async fn report_phase(&self, me: &Identity, phase: Phase) -> Result<Reported, LockError> {
        tracing::debug!(id = %me.id, %phase, "fleetlock keeps no phases; not recorded");
        Ok(Reported::Unproven)
    }

    /// One `pre-reboot`: the protocol grants it again to a holder, so a grant proves the slot
    /// is (still, or again) this node's, and "all slots taken" that it is not.
    #[tracing::instrument(skip(self, me), fields(url = %self.pre_reboot.1, group = %self.group, id = %me.id))]
    async fn fence(&self, me: &Identity) -> Result<Fence, LockError> {
        match self.post(Call::PreReboot, &me.id).await {
            Ok(a) if a.status.is_success() => Ok(Fence::Held),
            Ok(a) if a.is_taken() => Ok(Fence::Lost {
                why: format!(
                    "the FleetLock server at {} no longer grants {} a slot ({a})",
                    self.base, me.id
                ),
            }),
            Ok(a) if a.is_transient() => Err(self.server_error(Call::PreReboot, &a)),
            Ok(a) => Err(self.refused(Call::PreReboot, &me.id, &a)),
            Err(reason) => Err(self.unreachable(Call::PreReboot, reason)),
        }
    }

    /// The server keeps its holders for as long as it likes: nothing to keep fresh.
    fn heartbeat_every(&self) -> Option<Duration> {
        None
    }

    async fn heartbeat(&self, me: &Identity) -> Result<Fence, LockError> {
        self.fence(me).await
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
        assert!(FleetLock::new("http://127.0.0.1:1", "default", o()).is_ok());
        let f = FleetLock::new("http://h:1/base/", "default", o()).unwrap();
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
            let e = FleetLock::new(url, group, o()).unwrap_err();
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
        let e = FleetLock::new("https://h", "default", with_ca(missing.clone())).unwrap_err();
        assert!(
            e.to_string().contains(&missing.display().to_string()),
            "{e}"
        );

        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").unwrap();
        let e = FleetLock::new("https://h", "default", with_ca(empty)).unwrap_err();
        assert!(e.to_string().contains("holds no certificate"), "{e}");

        let e = FleetLock::new("http://h", "default", with_ca(missing)).unwrap_err();
        assert!(e.to_string().contains("plain http://"), "{e}");

        // System roots: present on most hosts; without them the error says what to set.
        match FleetLock::new("https://h", "default", Options::default()) {
            Ok(f) => assert_eq!(f.url(), "https://h"),
            Err(e) => assert!(e.to_string().contains("ca_file"), "{e}"),
        }
    }
}
