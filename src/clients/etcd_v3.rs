//! Connecting to etcd v3: the client options from `[lock.etcd]` (endpoints, TLS files,
//! user and password file), what `--check-config` checks, and how the client's errors are sorted
//! into the lock core's transient ([`LockError::Unreachable`]) and permanent ones, including
//! telling an endpoint that does not speak etcd's gRPC apart.

use crate::lock::Backend;
use std::time::Duration;

use etcd_client::{Certificate, ConnectOptions, Identity as TlsIdentity, TlsOptions};
use tokio::time::Instant;

use crate::config;
use crate::lock::LockError;

/// The backend name in errors and logs.
pub(crate) const BACKEND: Backend = Backend::Etcd;

/// Time limits of the etcd backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// Connecting to an endpoint.
    pub connect: Duration,
    /// One request (read, transaction, opening a watch).
    pub request: Duration,
    /// First pause after a transient error inside `acquire`; doubled each time, up to
    /// `backoff_max`.
    pub backoff_min: Duration,
    pub backoff_max: Duration,
    /// Time to live of a waiter's queue entry (its etcd lease, kept alive every third of it
    /// while `acquire` runs, two thirds far back in a long queue): the longest a waiter that died without a word holds up the queue.
    /// Whole seconds, rounded up; etcd may raise a very short one to its minimum.
    pub queue_ttl: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            connect: Duration::from_secs(5),
            request: Duration::from_secs(10),
            backoff_min: Duration::from_millis(100),
            backoff_max: Duration::from_secs(10),
            // Longer than backoff_max, so a waiter retrying an unreachable cluster keeps its place.
            queue_ttl: Duration::from_secs(30),
        }
    }
}

/// What an endpoint that is not an etcd gRPC server is told it is, and asked.
pub(crate) const NOT_GRPC: &str =
    "the endpoint answered but does not speak etcd's gRPC (HTTP/2) protocol";
pub(crate) const NOT_GRPC_HINT: &str = "is this an etcd client URL (usually port 2379)?";

/// Sort etcd client errors: connection trouble and "try again" answers are
/// [`LockError::Unreachable`]; the rest (permission denied, bad request...) is
/// [`LockError::Backend`]. The reason carries the causes tonic hides behind "transport error".
pub(crate) fn classify(target: &str, e: etcd_client::Error) -> LockError {
    use etcd_client::Error as E;
    use std::error::Error as _;
    let unreachable = |reason: String| LockError::Unreachable {
        backend: BACKEND,
        target: target.to_owned(),
        reason,
    };
    match e {
        E::TransportError(ref t) => unreachable(with_causes(&e.to_string(), Some(t))),
        E::IoError(_) | E::WatchError(_) | E::EndpointError(_) => unreachable(e.to_string()),
        E::GRpcStatus(ref status) => {
            let message = with_causes(status.message(), status.source());
            classify_grpc(target, i32::from(status.code()), &message)
        }
        other => LockError::Backend {
            backend: BACKEND,
            reason: format!("{target}: {other}"),
        },
    }
}

/// `message`, then each cause in `source`'s chain that it does not say already; when they show
/// that the endpoint answered with something else than HTTP/2 (an HTTP/1 server's status line
/// read as an HTTP/2 frame header is a frame "with invalid size"), say so first.
fn with_causes(message: &str, source: Option<&(dyn std::error::Error + 'static)>) -> String {
    let mut text = message.to_owned();
    let mut cause = source;
    while let Some(c) = cause {
        let t = c.to_string();
        if !t.is_empty() && !text.contains(&t) {
            text.push_str(": ");
            text.push_str(&t);
        }
        cause = c.source();
    }
    if text.contains("frame with invalid size") {
        format!("{NOT_GRPC}: {text}; {NOT_GRPC_HINT}")
    } else {
        text
    }
}

/// When a connection to etcd failed (not a time-out), ask each plain `http://` endpoint, in
/// HTTP/1 over a bare TCP connection, for `GET /version`: etcd serves that on its client port
/// (`{"etcdserver":...}`); another HTTP server answers something else. If one does, say so.
/// Anything else leaves `e` as it is.
pub(crate) async fn explain_wrong_protocol(
    e: LockError,
    endpoints: &[String],
    wait: Duration,
) -> LockError {
    let LockError::Unreachable {
        backend,
        target,
        reason,
    } = e
    else {
        return e;
    };
    if reason.starts_with(NOT_GRPC) || reason.contains("no answer within") {
        return LockError::Unreachable {
            backend,
            target,
            reason,
        };
    }
    for endpoint in endpoints {
        if let Some(line) = not_etcd_version(endpoint, wait).await {
            let which = if endpoints.len() > 1 {
                format!("{endpoint} ")
            } else {
                String::new()
            };
            return LockError::Unreachable {
                backend,
                target,
                reason: format!(
                    "{NOT_GRPC}: {which}answers HTTP/1 `GET /version` with `{line}` and no etcd \
                     version ({reason}); {NOT_GRPC_HINT}"
                ),
            };
        }
    }
    LockError::Unreachable {
        backend,
        target,
        reason,
    }
}

/// The status line of a plain `http://` endpoint's HTTP/1 answer to `GET /version` when it
/// answers within `wait` and the answer is not etcd's version document.
async fn not_etcd_version(endpoint: &str, wait: Duration) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    const MAX: usize = 8192;
    let url = url::Url::parse(endpoint).ok()?;
    if url.scheme() != "http" {
        return None;
    }
    let host = url.host_str()?;
    let port = url.port_or_known_default()?;
    let request = format!("GET /version HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    let deadline = Instant::now() + wait;
    let addr = host.trim_start_matches('[').trim_end_matches(']');
    let connect = tokio::net::TcpStream::connect((addr, port));
    let mut conn = tokio::time::timeout_at(deadline, connect)
        .await
        .ok()?
        .ok()?;
    tokio::time::timeout_at(deadline, conn.write_all(request.as_bytes()))
        .await
        .ok()?
        .ok()?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 1024];
    // Until the server closes, the answer is complete, or `wait` is over.
    while buf.len() < MAX && !http1_answer_complete(&buf) {
        match tokio::time::timeout_at(deadline, conn.read(&mut chunk)).await {
            Ok(Ok(n)) if n > 0 => buf.extend_from_slice(&chunk[..n]),
            _ => break,
        }
    }
    if !buf.starts_with(b"HTTP/") || buf.windows(10).any(|w| w == b"etcdserver") {
        return None;
    }
    let line = buf
        .split(|&b| b == b'\r' || b == b'\n')
        .next()
        .unwrap_or_default();
    Some(
        String::from_utf8_lossy(line)
            .chars()
            .filter(|c| !c.is_control())
            .take(80)
            .collect(),
    )
}

/// Whether `buf` holds an HTTP/1 answer's head and, when it has a `Content-Length`, its body.
fn http1_answer_complete(buf: &[u8]) -> bool {
    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
        return false;
    };
    let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
    let length = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse::<usize>().ok());
    length.is_some_and(|n| buf.len() >= end + 4 + n)
}

/// gRPC codes 1 cancelled, 2 unknown, 4 deadline exceeded, 8 resource exhausted, 10 aborted,
/// 13 internal and 14 unavailable (etcd's "leader changed", "request timed out") are worth a
/// retry; the others (permission denied, invalid argument...) are not.
fn classify_grpc(target: &str, code: i32, message: &str) -> LockError {
    match code {
        1 | 2 | 4 | 8 | 10 | 13 | 14 => LockError::Unreachable {
            backend: BACKEND,
            target: target.to_owned(),
            reason: message.to_owned(),
        },
        _ => LockError::Backend {
            backend: BACKEND,
            reason: format!("{target}: {message}"),
        },
    }
}

fn read_setting(path: &std::path::Path, key: &str) -> Result<Vec<u8>, LockError> {
    std::fs::read(path)
        .map_err(|e| LockError::Refused(format!("cannot read {key} {}: {e}", path.display())))
}

/// What connecting would refuse before sending anything: the endpoints (URLs with `http://`
/// or `https://` and a host), the TLS rules, the TLS files read and parsed, the password file.
/// For `rebootd --check-config`.
pub fn check_settings(settings: &config::Etcd) -> Result<(), LockError> {
    connect_options(settings, Timeouts::default())?;
    for e in &settings.endpoints {
        let parsed = url::Url::parse(e).map_err(|err| {
            LockError::Refused(format!("lock.etcd.endpoints: {e:?} is not a URL: {err}"))
        })?;
        if !matches!(parsed.scheme(), "http" | "https")
            || parsed.host_str().is_none_or(str::is_empty)
        {
            return Err(LockError::Refused(format!(
                "lock.etcd.endpoints: {e:?} is not an http:// or https:// URL with a host"
            )));
        }
    }
    if settings.ca_file.is_some() || settings.cert_file.is_some() {
        let tls = crate::http::TlsFiles {
            table: "lock.etcd",
            ca_file: settings.ca_file.clone(),
            client_cert: settings.cert_file.clone().zip(settings.key_file.clone()),
        };
        crate::http::client(true, &tls, Duration::from_secs(1))
            .map_err(|e| LockError::Refused(e.to_string()))?;
    }
    Ok(())
}

pub(crate) fn connect_options(
    settings: &config::Etcd,
    timeouts: Timeouts,
) -> Result<ConnectOptions, LockError> {
    if settings.endpoints.is_empty() {
        return Err(LockError::Refused("lock.etcd.endpoints is empty".into()));
    }
    let mut options = ConnectOptions::new()
        .with_connect_timeout(timeouts.connect)
        // Pings on open streams (the watch) notice a dead or frozen member. etcd refuses pings
        // more often than every 5 s.
        .with_keep_alive(Duration::from_secs(10), Duration::from_secs(5))
        .with_require_leader(true);

    let tls_wanted = settings.ca_file.is_some() || settings.cert_file.is_some();
    let plain = settings.endpoints.iter().find(|e| e.starts_with("http://"));
    let https = settings
        .endpoints
        .iter()
        .find(|e| e.starts_with("https://"));
    if tls_wanted {
        if let Some(e) = plain {
            return Err(LockError::Refused(format!(
                "lock.etcd: TLS files are set but endpoint {e} is plain http://; use https://"
            )));
        }
        let mut tls = TlsOptions::new();
        match &settings.ca_file {
            Some(ca) => {
                tls = tls.ca_certificate(Certificate::from_pem(read_setting(
                    ca,
                    "lock.etcd.ca_file",
                )?))
            }
            None => {
                return Err(LockError::Refused(
                    "lock.etcd.cert_file is set but lock.etcd.ca_file is not (system roots are \
                     not used)"
                        .into(),
                ))
            }
        }
        match (&settings.cert_file, &settings.key_file) {
            (Some(cert), Some(key)) => {
                tls = tls.identity(TlsIdentity::from_pem(
                    read_setting(cert, "lock.etcd.cert_file")?,
                    read_setting(key, "lock.etcd.key_file")?,
                ))
            }
            (None, None) => {}
            _ => {
                return Err(LockError::Refused(
                    "lock.etcd.cert_file and lock.etcd.key_file must be set together".into(),
                ))
            }
        }
        options = options.with_tls(tls);
    } else if let Some(e) = https {
        return Err(LockError::Refused(format!(
            "endpoint {e} is https:// but lock.etcd.ca_file is not set (system roots are not used)"
        )));
    }

    match (&settings.username, &settings.password_file) {
        (Some(user), Some(file)) => {
            let raw = read_setting(file, "lock.etcd.password_file")?;
            let password = String::from_utf8(raw).map_err(|_| {
                LockError::Refused(format!(
                    "lock.etcd.password_file {} is not UTF-8",
                    file.display()
                ))
            })?;
            let password = password.trim_end_matches(['\n', '\r']);
            if password.is_empty() {
                return Err(LockError::Refused(format!(
                    "lock.etcd.password_file {} is empty",
                    file.display()
                )));
            }
            options = options
                .with_user(user.clone(), password)
                .with_auto_token_refresh(true);
        }
        (None, None) => {}
        _ => {
            return Err(LockError::Refused(
                "lock.etcd.username and lock.etcd.password_file must be set together".into(),
            ))
        }
    }
    Ok(options)
}
#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn settings(endpoints: &[&str]) -> config::Etcd {
        config::Etcd {
            api: config::EtcdApi::V3,
            endpoints: endpoints.iter().map(|s| s.to_string()).collect(),
            ca_file: None,
            cert_file: None,
            key_file: None,
            username: None,
            password_file: None,
        }
    }

    fn refused(r: Result<ConnectOptions, LockError>) -> String {
        match r {
            Err(LockError::Refused(m)) => m,
            Err(e) => panic!("expected Refused, got {e}"),
            Ok(_) => panic!("expected Refused, got options"),
        }
    }

    #[test]
    fn password_file_errors_name_the_file() {
        let mut s = settings(&["http://127.0.0.1:2379"]);
        s.username = Some("rebootd".into());
        s.password_file = Some(PathBuf::from("/nonexistent/etcd-password"));
        let m = refused(connect_options(&s, Timeouts::default()));
        assert!(m.contains("/nonexistent/etcd-password"), "{m}");
        assert!(m.contains("lock.etcd.password_file"), "{m}");

        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("pw");
        std::fs::write(&empty, "\n").unwrap();
        s.password_file = Some(empty.clone());
        let m = refused(connect_options(&s, Timeouts::default()));
        assert!(
            m.contains(&empty.display().to_string()) && m.contains("empty"),
            "{m}"
        );

        std::fs::write(&empty, "secret\n").unwrap();
        assert!(connect_options(&s, Timeouts::default()).is_ok());
    }

    #[test]
    fn tls_settings_are_checked() {
        let mut s = settings(&["https://10.0.0.5:2379"]);
        assert!(refused(connect_options(&s, Timeouts::default())).contains("ca_file"));
        s.ca_file = Some(PathBuf::from("/nonexistent/ca.pem"));
        let m = refused(connect_options(&s, Timeouts::default()));
        assert!(m.contains("/nonexistent/ca.pem"), "{m}");

        let mut s = settings(&["http://10.0.0.5:2379"]);
        s.ca_file = Some(PathBuf::from("/nonexistent/ca.pem"));
        assert!(refused(connect_options(&s, Timeouts::default())).contains("plain http"));

        assert!(refused(connect_options(&settings(&[]), Timeouts::default())).contains("empty"));
    }

    /// A one-shot HTTP/1 server answering `answer` and keeping the connection open.
    async fn http1_server(answer: String) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            let mut buf = [0u8; 1024];
            let _ = s.read(&mut buf).await;
            s.write_all(answer.as_bytes()).await.unwrap();
            tokio::time::sleep(Duration::from_secs(30)).await;
        });
        format!("http://{addr}")
    }

    #[tokio::test]
    async fn http1_servers_other_than_etcd_are_told_apart() {
        let wait = Duration::from_secs(5);
        let started = Instant::now();
        let body = r#"{"etcdserver":"3.5.17","etcdcluster":"3.5.0"}"#;
        let etcd = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        let endpoint = http1_server(etcd).await;
        assert_eq!(not_etcd_version(&endpoint, wait).await, None);
        let other =
            http1_server("HTTP/1.1 404 Not Found\r\nContent-Length: 9\r\n\r\nnot found".into())
                .await;
        assert_eq!(
            not_etcd_version(&other, wait).await.as_deref(),
            Some("HTTP/1.1 404 Not Found")
        );
        // Complete answers are not waited on until the server closes.
        assert!(started.elapsed() < wait, "{:?}", started.elapsed());
        assert_eq!(not_etcd_version("https://127.0.0.1:1", wait).await, None);

        assert!(!http1_answer_complete(
            b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nab"
        ));
        assert!(http1_answer_complete(
            b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nab"
        ));
        assert!(!http1_answer_complete(b"HTTP/1.1 200 OK\r\n"));
    }

    #[test]
    fn http2_framing_errors_name_the_likely_cause() {
        let m = with_causes(
            "h2 protocol error: connection error detected: frame with invalid size",
            None,
        );
        assert!(m.starts_with(NOT_GRPC) && m.ends_with(NOT_GRPC_HINT), "{m}");
        assert_eq!(with_causes("transport error", None), "transport error");
    }

    #[test]
    fn grpc_codes_are_sorted() {
        let e = classify_grpc("x:1", 14, "etcdserver: leader changed");
        assert!(matches!(e, LockError::Unreachable { .. }), "{e}");
        let e = classify_grpc("x:1", 7, "etcdserver: permission denied");
        assert!(matches!(e, LockError::Backend { .. }), "{e}");
        assert!(e.to_string().contains("permission denied"));
    }
}
