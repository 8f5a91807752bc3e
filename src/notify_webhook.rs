//! Webhook notifications (`[webhook]`): a JSON POST when a drain starts, when the node is about
//! to reboot, when it is back in a new boot, when it is healthy again, and when something fails.
//!
//! What to send is read off two consecutive states ([`notices`], pure): the runtime hands it every
//! state change. The body ([`body`]) has the shape Slack and Microsoft Teams incoming webhooks
//! accept (`text`, plus Slack `attachments[].fields`) and the same facts as top-level fields for
//! anything else (`event`, `node`, `group`, `phase`, `boot_id`, `reason`, `error`, `at`).
//!
//! Sending never blocks the agent: [`Webhook::send`] queues the body (bounded; a full queue drops
//! it, logged) and one task POSTs them in order over the binary's one HTTP client
//! ([`crate::http`]), each within `timeout`. A failure is logged at warn and dropped: a
//! notification is never retried and never delays a reboot.
//!
//! The URL is a secret (whoever has a Slack or Teams webhook URL can post to the channel): it
//! is shown only as scheme and host ([`crate::http::redact`]), in logs and in errors alike,
//! and `url_file` keeps it out of the configuration, in a file only root may read.

use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{HeaderValue, CONTENT_TYPE, USER_AGENT};
use hyper::{Method, Request, Uri};
use serde_json::{json, Value};
use tokio::sync::mpsc;

use crate::http::{self, error_chain, HttpClient, SetupError, TlsFiles};
use crate::state::{Phase, State};

/// Bodies waiting to be sent; more are dropped (a receiver that is down must not grow memory).
const QUEUE: usize = 64;
/// The longest [`Webhook::flush`] waits before a reboot.
pub const FLUSH_MAX: Duration = Duration::from_secs(2);
/// Largest answer read: its content does not matter (Slack says `ok`), it is read only so the
/// connection can be used again; a receiver must not make rebootd hold more.
pub const BODY_MAX: usize = 64 * 1024;

/// What the sending task is given.
enum Job {
    Send(Value),
    /// Answer when everything queued before has been sent or given up on.
    Flush(tokio::sync::oneshot::Sender<()>),
}

/// Something worth telling people about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Notice {
    DrainStarted,
    Rebooting,
    /// Up again in a new boot, after a coordinated reboot.
    Back,
    /// Healthy after the boot (Ready, checks passed): the slot is about to be released.
    Healthy,
    /// Something went wrong (the state's last error).
    Failed(String),
}

impl Notice {
    /// The `event` field.
    pub fn event(&self) -> &'static str {
        match self {
            Notice::DrainStarted => "drain_started",
            Notice::Rebooting => "rebooting",
            Notice::Back => "back",
            Notice::Healthy => "healthy",
            Notice::Failed(_) => "failed",
        }
    }
}

/// What happened between `old` and `new`, in order.
pub fn notices(old: &State, new: &State) -> Vec<Notice> {
    let mut out = Vec::new();
    if new.reboots > old.reboots {
        out.push(Notice::Back);
    }
    if old.phase == Phase::WaitingForHealthy
        && matches!(new.phase, Phase::Uncordoning | Phase::Releasing)
    {
        out.push(Notice::Healthy);
    }
    if new.phase == Phase::Draining && old.phase != Phase::Draining {
        out.push(Notice::DrainStarted);
    }
    if new.phase == Phase::Rebooting && old.phase != Phase::Rebooting {
        out.push(Notice::Rebooting);
    }
    if let Some(e) = new
        .last_error
        .as_ref()
        .filter(|e| old.last_error.as_ref() != Some(*e))
    {
        out.push(Notice::Failed(e.clone()));
    }
    out
}

/// The JSON body for `notice` about `node` in `group`, in state `state`.
pub fn body(notice: &Notice, node: &str, group: &str, state: &State) -> Value {
    let what = match notice {
        Notice::DrainStarted => "is draining before its reboot".to_string(),
        Notice::Rebooting => "is rebooting".to_string(),
        Notice::Back => format!("is back (boot {})", state.boot_id),
        Notice::Healthy => "is healthy after its reboot".to_string(),
        Notice::Failed(e) => format!("has a problem: {e}"),
    };
    let text = format!("rebootd: {node} (group {group}) {what}");
    let error = match notice {
        Notice::Failed(e) => Some(e.as_str()),
        _ => None,
    };
    let mut fields = vec![
        json!({"title": "node", "value": node, "short": true}),
        json!({"title": "group", "value": group, "short": true}),
        json!({"title": "phase", "value": state.phase.as_str(), "short": true}),
    ];
    if let Some(r) = &state.reason {
        fields.push(json!({"title": "reason", "value": r, "short": false}));
    }
    if let Some(e) = error {
        fields.push(json!({"title": "error", "value": e, "short": false}));
    }
    json!({
        "text": text,
        "attachments": [{
            "color": if error.is_some() { "danger" } else { "good" },
            "fields": fields,
        }],
        "event": notice.event(),
        "node": node,
        "group": group,
        "phase": state.phase.as_str(),
        "boot_id": state.boot_id,
        "reason": state.reason,
        "error": error,
        "at": jiff::Timestamp::now().to_string(),
    })
}

/// Where the URL is configured.
#[derive(Clone, PartialEq, Eq)]
pub enum WebhookUrl {
    /// `webhook.url`.
    Inline(String),
    /// `webhook.url_file`: a file holding the URL, mode 0600 or stricter, read at start.
    File(PathBuf),
}

impl std::fmt::Debug for WebhookUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WebhookUrl::Inline(u) => f.debug_tuple("Inline").field(&http::redact(u)).finish(),
            WebhookUrl::File(p) => f.debug_tuple("File").field(p).finish(),
        }
    }
}

/// Where and how to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebhookSettings {
    pub url: WebhookUrl,
    pub ca_file: Option<std::path::PathBuf>,
    /// Per request, connecting included.
    pub timeout: Duration,
}

/// The URL in a `url_file`: refused when group or others may read the file (the URL is the
/// secret), when it cannot be read, or when it is empty. Errors name the key and the file,
/// never the content.
pub fn read_url_file(path: &Path) -> Result<String, SetupError> {
    use std::os::unix::fs::PermissionsExt;
    let shown = path.display();
    let meta = std::fs::metadata(path)
        .map_err(|e| SetupError(format!("cannot read webhook.url_file {shown}: {e}")))?;
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(SetupError(format!(
            "webhook.url_file {shown} has mode {mode:04o}: it holds a secret, make it 0600 \
             (chmod 600 {shown})"
        )));
    }
    let text = std::fs::read_to_string(path)
        .map_err(|e| SetupError(format!("cannot read webhook.url_file {shown}: {e}")))?;
    let url = text.trim();
    if url.is_empty() {
        return Err(SetupError(format!("webhook.url_file {shown} is empty")));
    }
    Ok(url.to_string())
}

impl WebhookUrl {
    /// The URL and the key it came from.
    fn resolve(&self) -> Result<(String, &'static str), SetupError> {
        match self {
            WebhookUrl::Inline(u) => Ok((u.clone(), "webhook.url")),
            WebhookUrl::File(p) => Ok((read_url_file(p)?, "webhook.url_file")),
        }
    }
}

/// A running sender (see the module documentation).
#[derive(Debug, Clone)]
pub struct Webhook {
    tx: mpsc::Sender<Job>,
}

impl Webhook {
    /// Checks the settings, builds the client and starts the sending task.
    pub fn start(settings: &WebhookSettings) -> Result<Webhook, SetupError> {
        let (url, key) = settings.url.resolve()?;
        let shown = http::redact(&url);
        let uri: Uri = url
            .parse()
            .map_err(|e| SetupError(format!("{key} {shown}: {e}")))?;
        let https = match uri.scheme_str() {
            Some("https") => true,
            Some("http") => false,
            _ => {
                return Err(SetupError(format!(
                    "{key} {shown}: not an http:// or https:// URL"
                )))
            }
        };
        let tls = TlsFiles {
            table: "webhook",
            ca_file: settings.ca_file.clone(),
            client_cert: None,
        };
        let client = http::client(https, &tls, settings.timeout)?;
        let (tx, rx) = mpsc::channel(QUEUE);
        tokio::spawn(deliver(client, uri, settings.timeout, rx));
        Ok(Webhook { tx })
    }

    /// Queue `body` for sending; never waits.
    pub fn send(&self, body: Value) {
        if let Err(e) = self.tx.try_send(Job::Send(body)) {
            tracing::warn!(
                "webhook notification dropped ({}): the receiver is behind or gone",
                match e {
                    mpsc::error::TrySendError::Full(_) => "queue full",
                    mpsc::error::TrySendError::Closed(_) => "sender stopped",
                }
            );
        }
    }
}

impl Webhook {
    /// Give what is queued up to [`FLUSH_MAX`] to go out (before the logind call: once logind
    /// accepts, the host may go down at any moment). Never longer, whatever the receiver does.
    pub async fn flush(&self) {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let flushed = async {
            self.tx.send(Job::Flush(tx)).await.ok()?;
            rx.await.ok()
        };
        if tokio::time::timeout(FLUSH_MAX, flushed).await.is_err() {
            tracing::warn!(
                "webhook notifications still queued after {}s; rebooting without waiting for them",
                FLUSH_MAX.as_secs()
            );
        }
    }
}

async fn deliver(client: HttpClient, uri: Uri, timeout: Duration, mut rx: mpsc::Receiver<Job>) {
    while let Some(job) = rx.recv().await {
        let body = match job {
            Job::Send(b) => b,
            Job::Flush(done) => {
                let _ = done.send(());
                continue;
            }
        };
        let event = body["event"].as_str().unwrap_or("").to_string();
        let url = http::redact(&uri.to_string());
        match tokio::time::timeout(timeout, post(&client, &uri, &body)).await {
            Ok(Ok(())) => tracing::debug!(event, url, "webhook notification sent"),
            Ok(Err(e)) => tracing::warn!(
                event,
                url,
                "webhook notification failed: {}",
                scrub(&e.to_string(), &uri)
            ),
            Err(_) => tracing::warn!(
                event,
                url,
                "webhook notification failed: no answer within {}",
                humantime::format_duration(timeout)
            ),
        }
    }
}

/// Why a notification was not delivered. Its text may quote the URL: shown through [`scrub`].
#[derive(Debug, thiserror::Error)]
enum PostError {
    #[error("{0}")]
    Encode(serde_json::Error),
    #[error("{0}")]
    Request(hyper::http::Error),
    /// The client's error with its causes ([`error_chain`]).
    #[error("{0}")]
    Send(String),
    #[error("HTTP {0}")]
    Status(hyper::StatusCode),
    #[error("HTTP {status}: {error}")]
    Body {
        status: hyper::StatusCode,
        error: http::BodyError,
    },
}

async fn post(client: &HttpClient, uri: &Uri, body: &Value) -> Result<(), PostError> {
    let bytes = serde_json::to_vec(body).map_err(PostError::Encode)?;
    let req = Request::builder()
        .method(Method::POST)
        .uri(uri.clone())
        .header(CONTENT_TYPE, HeaderValue::from_static("application/json"))
        .header(USER_AGENT, HeaderValue::from_static("rebootd"))
        .body(Full::new(Bytes::from(bytes)))
        .map_err(PostError::Request)?;
    let resp = client
        .request(req)
        .await
        .map_err(|e| PostError::Send(error_chain(&e)))?;
    let status = resp.status();
    // Read the answer so the connection can be reused; its content does not matter.
    let read = http::read_body(resp.into_body(), BODY_MAX).await;
    if !status.is_success() {
        return Err(PostError::Status(status));
    }
    read.map(|_| ())
        .map_err(|error| PostError::Body { status, error })
}

/// `text` with the URL's path and query taken out, should an error quote them: they are the
/// secret.
fn scrub(text: &str, uri: &Uri) -> String {
    let mut text = text.replace(&uri.to_string(), &http::redact(&uri.to_string()));
    if let Some(pq) = uri
        .path_and_query()
        .map(|pq| pq.as_str())
        .filter(|pq| pq.len() > 1)
    {
        text = text.replace(pq, "/…");
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(phase: Phase) -> State {
        let mut s = State::new("boot-1", jiff::Timestamp::UNIX_EPOCH);
        s.phase = phase;
        s
    }

    #[test]
    fn the_url_is_never_shown_whole() {
        let secret = "https://hooks.slack.com/services/T0/B0/s3cret";
        let settings = WebhookSettings {
            url: WebhookUrl::Inline(secret.into()),
            ca_file: None,
            timeout: Duration::from_secs(1),
        };
        let debug = format!("{settings:?}");
        assert!(!debug.contains("s3cret"), "{debug}");
        assert!(debug.contains("https://hooks.slack.com"), "{debug}");
        let uri: Uri = secret.parse().unwrap();
        let e = scrub(
            &format!("error sending {secret}: /services/T0/B0/s3cret"),
            &uri,
        );
        assert!(!e.contains("s3cret"), "{e}");
        let bad = WebhookSettings {
            url: WebhookUrl::Inline("ftp://files.example/s3cret".into()),
            ..settings
        };
        let e = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(async { Webhook::start(&bad).unwrap_err() });
        assert!(
            e.0.contains("ftp://files.example") && !e.0.contains("s3cret"),
            "{e}"
        );
    }

    #[test]
    fn a_url_file_must_be_private_and_is_exclusive_with_url() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("hook");
        std::fs::write(&file, "https://hooks.slack.com/services/s3cret\n").unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o640)).unwrap();
        let e = read_url_file(&file).unwrap_err();
        assert!(
            e.0.contains("webhook.url_file") && e.0.contains("0640") && !e.0.contains("s3cret"),
            "{e}"
        );
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(
            read_url_file(&file).unwrap(),
            "https://hooks.slack.com/services/s3cret"
        );
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o400)).unwrap();
        assert!(read_url_file(&file).is_ok(), "stricter is fine");
        std::fs::write(&file, "\n").unwrap();
        assert!(read_url_file(&file).unwrap_err().0.contains("empty"));
        let missing = dir.path().join("missing");
        let e = read_url_file(&missing).unwrap_err();
        assert!(e.0.contains(&missing.display().to_string()), "{e}");
    }

    #[test]
    fn a_cycle_notifies_drain_reboot_back_healthy() {
        let seq = [
            Phase::AcquiringSlot,
            Phase::Draining,
            Phase::Rebooting,
            Phase::WaitingForHealthy,
            Phase::Uncordoning,
            Phase::Releasing,
            Phase::Idle,
        ];
        let mut got = Vec::new();
        for w in seq.windows(2) {
            let old = state(w[0]);
            let mut new = state(w[1]);
            if w[1] == Phase::WaitingForHealthy {
                new.reboots = 1;
            }
            got.extend(notices(&old, &new));
        }
        assert_eq!(
            got,
            [
                Notice::DrainStarted,
                Notice::Rebooting,
                Notice::Back,
                Notice::Healthy
            ]
        );
    }

    #[test]
    fn a_new_error_is_a_failure_once() {
        let old = state(Phase::Draining);
        let mut new = state(Phase::Uncordoning);
        new.last_error = Some("drain did not finish in time".into());
        assert_eq!(
            notices(&old, &new),
            [Notice::Failed("drain did not finish in time".into())]
        );
        assert!(
            notices(&new, &new.clone()).is_empty(),
            "the same error again"
        );
        // Healthy is only after the post-boot wait, not an unplanned passage.
        assert!(notices(&state(Phase::Uncordoning), &state(Phase::Releasing)).is_empty());
    }

    #[test]
    fn the_body_is_slack_and_teams_shaped_with_the_facts_as_fields() {
        let mut s = state(Phase::Draining);
        s.reason = Some(crate::need::Need::new(
            crate::need::TriggerSource::UpdateEngine,
            "UPDATE_STATUS_UPDATED_NEED_REBOOT",
        ));
        let b = body(&Notice::DrainStarted, "node-1", "web", &s);
        assert_eq!(
            b["text"],
            "rebootd: node-1 (group web) is draining before its reboot"
        );
        assert_eq!(b["event"], "drain_started");
        assert_eq!(b["node"], "node-1");
        assert_eq!(b["phase"], "draining");
        assert!(b["error"].is_null());
        let fields = b["attachments"][0]["fields"].as_array().unwrap();
        assert!(fields.iter().any(|f| f["title"] == "reason"));
        let f = body(&Notice::Failed("boom".into()), "node-1", "web", &s);
        assert_eq!(f["error"], "boom");
        assert_eq!(f["attachments"][0]["color"], "danger");
    }
}
