//! The metrics listener: hyper's HTTP/1.1 server answering `/metrics`, hardened against
//! clients that misbehave, since it runs in the daemon that reboots the host: a request head
//! (at most 8 KiB) must arrive within [`Limits::read_timeout`] and the answer be taken within
//! [`Limits::write_timeout`]; at most [`Limits::max_connections`] are served at once (one more
//! is told `503` and closed at once); a failing `accept` (out of file descriptors) is retried
//! with a capped back-off instead of a busy loop, logged when it starts and when it ends.

use super::Metrics;
use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use jiff::Timestamp;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpStream;
use tokio::sync::Notify;
use tracing::{debug, info, warn};

/// How the listener protects itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Longest time from accepting a connection to the end of its request head.
    pub read_timeout: Duration,
    /// Longest time for the client to take the answer.
    pub write_timeout: Duration,
    /// Connections served at once.
    pub max_connections: usize,
    /// First pause after a failed `accept`; doubled up to `accept_backoff_max`.
    pub accept_backoff_min: Duration,
    pub accept_backoff_max: Duration,
}

impl Default for Limits {
    /// A scrape is one small request every few seconds from one or two Prometheus servers:
    /// 5 s to send it is generous, 8 at once leaves room for a few humans with curl.
    fn default() -> Self {
        Limits {
            read_timeout: Duration::from_secs(5),
            write_timeout: Duration::from_secs(5),
            max_connections: 8,
            accept_backoff_min: Duration::from_millis(10),
            accept_backoff_max: Duration::from_secs(1),
        }
    }
}

/// Largest request head read; a scraper's is a few hundred bytes.
const HEAD_MAX: usize = 8 * 1024;

/// What a client over the connection cap is told before its connection is closed.
const BUSY: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: 26\r\nRetry-After: 1\r\nConnection: close\r\n\r\ntoo many connections; retry\n";

/// Serve `metrics` on `addr` with the default [`Limits`] until the task is dropped.
pub async fn serve(
    addr: SocketAddr,
    metrics: Metrics,
) -> std::io::Result<tokio::task::JoinHandle<()>> {
    serve_with(addr, metrics, Limits::default()).await
}

/// The pause after `failures` accept errors in a row (1 = the first).
pub fn accept_backoff(limits: &Limits, failures: u32) -> Duration {
    let doubled = limits
        .accept_backoff_min
        .saturating_mul(1u32 << failures.saturating_sub(1).min(20));
    doubled.min(limits.accept_backoff_max)
}

/// Serve `metrics` on `addr` until the task is dropped. Binding errors are returned at once so
/// a wrong address stops start-up with a clear message.
pub async fn serve_with(
    addr: SocketAddr,
    metrics: Metrics,
    limits: Limits,
) -> std::io::Result<tokio::task::JoinHandle<()>> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    info!(%addr, ?limits, "serving metrics at /metrics");
    let permits = Arc::new(tokio::sync::Semaphore::new(limits.max_connections.max(1)));
    Ok(tokio::spawn(async move {
        let mut failures = 0u32;
        loop {
            let (conn, peer) = match listener.accept().await {
                Ok(c) => c,
                Err(e) => {
                    failures += 1;
                    metrics.accept_error();
                    let pause = accept_backoff(&limits, failures);
                    if failures == 1 {
                        warn!(error = %e, "metrics: accept failed; backing off until it works again");
                    } else {
                        debug!(error = %e, failures, ?pause, "metrics: accept failed again");
                    }
                    tokio::time::sleep(pause).await;
                    continue;
                }
            };
            if failures > 0 {
                info!(failures, "metrics: accepting connections again");
                failures = 0;
            }
            match permits.clone().try_acquire_owned() {
                Ok(permit) => {
                    let metrics = metrics.clone();
                    tokio::spawn(async move {
                        answer(conn, peer, metrics, &limits).await;
                        drop(permit);
                    });
                }
                Err(_) => {
                    // Over the cap: one non-blocking write, then close; no task, no waiting.
                    debug!(%peer, "metrics: too many connections; refused");
                    let _ = conn.try_write(BUSY);
                }
            }
        }
    }))
}

/// The answer to a request for `path`.
fn respond(path: &str, metrics: &Metrics) -> Response<Full<Bytes>> {
    let (status, body) = if path == "/metrics" {
        (StatusCode::OK, metrics.render(Timestamp::now()))
    } else {
        (StatusCode::NOT_FOUND, "see /metrics\n".to_string())
    };
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(super::CONTENT_TYPE));
    response
}

/// Serve one connection with hyper: one request (no keep-alive), its head within
/// `read_timeout` and at most `HEAD_MAX` bytes (hyper answers `431` past that), the answer taken
/// within `write_timeout` of being ready.
async fn answer(conn: TcpStream, peer: SocketAddr, metrics: Metrics, limits: &Limits) {
    let answered = Arc::new(Notify::new());
    let service = {
        let answered = answered.clone();
        service_fn(move |request: Request<Incoming>| {
            let response = respond(request.uri().path(), &metrics);
            answered.notify_one();
            std::future::ready(Ok::<_, Infallible>(response))
        })
    };
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.read_timeout)
        .max_header_size(HEAD_MAX)
        .keep_alive(false);
    let connection = builder.serve_connection(TokioIo::new(conn), service);
    tokio::pin!(connection);
    let served = tokio::select! {
        served = connection.as_mut() => served,
        () = answered.notified() => {
            match tokio::time::timeout(limits.write_timeout, connection.as_mut()).await {
                Ok(served) => served,
                Err(_) => {
                    debug!(%peer, "metrics: the client did not take the answer in time; closed");
                    return;
                }
            }
        }
    };
    match served {
        Ok(()) => {}
        Err(e) if e.is_timeout() => {
            debug!(%peer, timeout = ?limits.read_timeout, "metrics: no request in time; closed");
        }
        Err(e) => debug!(%peer, error = %e, "metrics: connection failed"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accept_backoff_doubles_up_to_the_cap() {
        let l = Limits::default();
        assert_eq!(accept_backoff(&l, 1), Duration::from_millis(10));
        assert_eq!(accept_backoff(&l, 2), Duration::from_millis(20));
        assert_eq!(accept_backoff(&l, 7), Duration::from_millis(640));
        assert_eq!(accept_backoff(&l, 8), Duration::from_secs(1));
        assert_eq!(accept_backoff(&l, 5000), Duration::from_secs(1));
    }

    /// A served listener with short read and write limits, and its address.
    async fn listener() -> SocketAddr {
        let addr = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let limits = Limits {
            read_timeout: Duration::from_millis(300),
            write_timeout: Duration::from_millis(300),
            ..Limits::default()
        };
        serve_with(addr, Metrics::default(), limits).await.unwrap();
        addr
    }

    /// Send `request` and read until the server closes.
    async fn exchange(addr: SocketAddr, request: &[u8]) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut conn = TcpStream::connect(addr).await.unwrap();
        conn.write_all(request).await.unwrap();
        let mut out = Vec::new();
        tokio::time::timeout(Duration::from_secs(10), conn.read_to_end(&mut out))
            .await
            .expect("the server closes after answering")
            .unwrap();
        String::from_utf8_lossy(&out).into_owned()
    }

    #[tokio::test]
    async fn metrics_are_served_with_their_content_type_and_other_paths_are_not_found() {
        let addr = listener().await;
        let ok = exchange(addr, b"GET /metrics?x=1 HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert!(ok.starts_with("HTTP/1.1 200 OK\r\n"), "{ok}");
        assert!(
            ok.to_ascii_lowercase()
                .contains("content-type: text/plain; version=0.0.4; charset=utf-8\r\n"),
            "{ok}"
        );
        assert!(ok.contains("\r\n\r\n# HELP rebootd_reboot_needed "), "{ok}");
        let missing = exchange(addr, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert!(missing.starts_with("HTTP/1.1 404"), "{missing}");
        assert!(missing.ends_with("see /metrics\n"), "{missing}");
    }

    #[tokio::test]
    async fn a_head_over_8_kib_is_refused() {
        let addr = listener().await;
        let mut request = b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Pad: ".to_vec();
        request.extend(std::iter::repeat_n(b'a', HEAD_MAX));
        request.extend_from_slice(b"\r\n\r\n");
        let answer = exchange(addr, &request).await;
        assert!(answer.starts_with("HTTP/1.1 431"), "{answer}");
    }

    #[tokio::test]
    async fn a_connection_without_a_request_is_closed_unanswered() {
        let addr = listener().await;
        let started = std::time::Instant::now();
        let answer = exchange(addr, b"GET /metr").await;
        assert_eq!(answer, "", "closed without an answer");
        assert!(started.elapsed() >= Duration::from_millis(300));
    }
}
