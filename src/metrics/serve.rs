//! The metrics listener: a minimal HTTP/1.1 responder for `GET /metrics`, hardened against
//! clients that misbehave, since it runs in the daemon that reboots the host: a request head
//! must arrive within [`Limits::read_timeout`] and the answer be taken within
//! [`Limits::write_timeout`]; at most [`Limits::max_connections`] are served at once (one more
//! is told `503` and closed at once); a failing `accept` (out of file descriptors) is retried
//! with a capped back-off instead of a busy loop, logged when it starts and when it ends.

use super::Metrics;
use jiff::Timestamp;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
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
                        answer(conn, peer, &metrics, &limits).await;
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

/// Read the request head: until the blank line, `HEAD_MAX` bytes, or the end of the stream.
async fn read_head(conn: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < HEAD_MAX {
        let n = conn.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
    }
    Ok(head)
}

async fn answer(mut conn: TcpStream, peer: SocketAddr, metrics: &Metrics, limits: &Limits) {
    let head = match tokio::time::timeout(limits.read_timeout, read_head(&mut conn)).await {
        Ok(Ok(h)) => h,
        Ok(Err(e)) => {
            debug!(%peer, error = %e, "metrics: read failed");
            return;
        }
        Err(_) => {
            debug!(%peer, timeout = ?limits.read_timeout, "metrics: no request in time; closed");
            return;
        }
    };
    let request = String::from_utf8_lossy(&head);
    let path = request.split_whitespace().nth(1).unwrap_or("/");
    let (status, body) = if path == "/metrics" || path.starts_with("/metrics?") {
        ("200 OK", metrics.render(Timestamp::now()))
    } else {
        ("404 Not Found", "see /metrics\n".to_string())
    };
    let response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    match tokio::time::timeout(limits.write_timeout, conn.write_all(response.as_bytes())).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => debug!(%peer, error = %e, "metrics: write failed"),
        Err(_) => debug!(%peer, "metrics: the client did not take the answer in time; closed"),
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
}
