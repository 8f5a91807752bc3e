//! A TCP proxy that counts what passes through it: bytes each way, connections, and (for an
//! HTTP/1.1 upstream such as etcd's v2 keys API) the events of streaming watches. The benches put
//! it between the nodes and their store, so that what the store sends the nodes is counted
//! exactly, whatever the client library.
//!
//! Watch events are counted by what the answer carries: on a connection whose latest request
//! line asks for a watch (`wait=true`, etcd v2), every occurrence of the event marker
//! (`"action":"`, which each v2 event object has once) in the answer is one event. HTTP/1.1
//! answers come in the order of the requests and rebootd's clients do not pipeline, so the
//! latest request line says what the bytes coming back answer.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// What the proxy has counted so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Bytes from the clients to the store.
    pub sent: u64,
    /// Bytes from the store to the clients.
    pub received: u64,
    /// Connections accepted.
    pub connections: u64,
    /// Watch events in answers to watch requests (etcd v2 only; 0 otherwise).
    pub watch_events: u64,
}

impl Counts {
    pub fn minus(&self, b: &Counts) -> Counts {
        Counts {
            sent: self.sent - b.sent,
            received: self.received - b.received,
            connections: self.connections - b.connections,
            watch_events: self.watch_events - b.watch_events,
        }
    }
}

#[derive(Debug, Default)]
struct Shared {
    sent: AtomicU64,
    received: AtomicU64,
    connections: AtomicU64,
    watch_events: AtomicU64,
}

/// A running counting proxy; dropping it stops accepting (open connections run on).
pub struct CountProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for CountProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Which requests are watches, and what marks one event in their answers.
#[derive(Debug, Clone, Copy)]
pub struct WatchMarker {
    /// In the request line (method, target, version).
    pub request: &'static [u8],
    /// Once per event in the answer.
    pub event: &'static [u8],
}

/// etcd's v2 keys API: `wait=true` watches, one `"action":"` per event.
pub const ETCD_V2: WatchMarker = WatchMarker {
    request: b"wait=true",
    event: b"\"action\":\"",
};

impl CountProxy {
    /// Listen on 127.0.0.1 (a free port) and forward to `upstream`, counting watch events by
    /// `marker` when given.
    pub async fn start(
        upstream: SocketAddr,
        marker: Option<WatchMarker>,
    ) -> std::io::Result<CountProxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared::default());
        let s = shared.clone();
        let task = tokio::spawn(async move {
            loop {
                match listener.accept().await {
                    Ok((client, _)) => {
                        s.connections.fetch_add(1, Ordering::Relaxed);
                        tokio::spawn(connection(client, upstream, s.clone(), marker));
                    }
                    Err(_) => tokio::time::sleep(std::time::Duration::from_millis(20)).await,
                }
            }
        });
        Ok(CountProxy { addr, shared, task })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn counts(&self) -> Counts {
        let f = |c: &AtomicU64| c.load(Ordering::Relaxed);
        Counts {
            sent: f(&self.shared.sent),
            received: f(&self.shared.received),
            connections: f(&self.shared.connections),
            watch_events: f(&self.shared.watch_events),
        }
    }
}

/// Whether the latest request on a connection is a watch.
#[derive(Debug, Default)]
struct LineState {
    /// The bytes of the current request line so far (capped), `None` once it ended.
    line: Option<Vec<u8>>,
    /// The byte before the current one was `\n` (a new line may be a request line).
    at_line_start: bool,
}

async fn connection(
    client: TcpStream,
    upstream: SocketAddr,
    shared: Arc<Shared>,
    marker: Option<WatchMarker>,
) {
    let Ok(server) = TcpStream::connect(upstream).await else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (mut cr, mut cw) = client.into_split();
    let (mut sr, mut sw) = server.into_split();
    let watching = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (w1, s1) = (watching.clone(), shared.clone());
    let up = async move {
        let mut buf = vec![0u8; 16 * 1024];
        let mut st = LineState {
            line: Some(Vec::new()),
            at_line_start: true,
        };
        while let Ok(n) = cr.read(&mut buf).await {
            if n == 0 {
                break;
            }
            s1.sent.fetch_add(n as u64, Ordering::Relaxed);
            if let Some(m) = marker {
                scan_requests(&buf[..n], &mut st, m, &w1);
            }
            if sw.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
        let _ = sw.shutdown().await;
    };
    let down = async move {
        let mut buf = vec![0u8; 16 * 1024];
        let mut tail: Vec<u8> = Vec::new();
        while let Ok(n) = sr.read(&mut buf).await {
            if n == 0 {
                break;
            }
            shared.received.fetch_add(n as u64, Ordering::Relaxed);
            if let Some(m) = marker {
                if watching.load(Ordering::Relaxed) {
                    let found = count_marker(&mut tail, &buf[..n], m.event);
                    shared.watch_events.fetch_add(found, Ordering::Relaxed);
                } else {
                    tail.clear();
                }
            }
            if cw.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
        let _ = cw.shutdown().await;
    };
    tokio::join!(up, down);
}

/// Follow request lines: a line that starts after a `\n` and begins with an HTTP method is a
/// request line; when it ends, whether it holds `m.request` decides `watching`.
fn scan_requests(
    bytes: &[u8],
    st: &mut LineState,
    m: WatchMarker,
    watching: &std::sync::atomic::AtomicBool,
) {
    for &b in bytes {
        if st.at_line_start {
            st.line = Some(Vec::new());
        }
        st.at_line_start = b == b'\n';
        let Some(line) = st.line.as_mut() else {
            continue;
        };
        if b == b'\n' || b == b'\r' {
            if is_request_line(line) {
                let w = line.windows(m.request.len()).any(|x| x == m.request);
                watching.store(w, Ordering::Relaxed);
            }
            st.line = None;
        } else if line.len() < 4096 {
            line.push(b);
        }
    }
}

fn is_request_line(line: &[u8]) -> bool {
    const METHODS: [&[u8]; 6] = [b"GET ", b"PUT ", b"POST ", b"DELETE ", b"HEAD ", b"PATCH "];
    line.ends_with(b" HTTP/1.1") && METHODS.iter().any(|m| line.starts_with(m))
}

/// Occurrences of `pat` in `tail` + `bytes` that end in `bytes`; `tail` keeps the last
/// `pat.len() - 1` bytes for the next call.
fn count_marker(tail: &mut Vec<u8>, bytes: &[u8], pat: &[u8]) -> u64 {
    tail.extend_from_slice(bytes);
    let found = tail.windows(pat.len()).filter(|w| *w == pat).count() as u64;
    let keep = pat.len().saturating_sub(1).min(tail.len());
    tail.drain(..tail.len() - keep);
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;

    #[test]
    fn markers_split_across_reads_are_counted_once() {
        let mut tail = Vec::new();
        let pat = ETCD_V2.event;
        assert_eq!(count_marker(&mut tail, b"{\"acti", pat), 0);
        assert_eq!(
            count_marker(&mut tail, b"on\":\"set\"}{\"action\":\"get\"}", pat),
            2
        );
        assert_eq!(count_marker(&mut tail, b"\"action\":", pat), 0);
        assert_eq!(count_marker(&mut tail, b"\"x", pat), 1);
    }

    #[test]
    fn the_latest_request_line_says_whether_answers_are_watch_events() {
        let w = AtomicBool::new(false);
        let mut st = LineState {
            line: Some(Vec::new()),
            at_line_start: true,
        };
        let watch = b"GET /v2/keys/a?wait=true&stream=true HTTP/1.1\r\nHost: x\r\n\r\n";
        scan_requests(&watch[..10], &mut st, ETCD_V2, &w);
        scan_requests(&watch[10..], &mut st, ETCD_V2, &w);
        assert!(w.load(Ordering::Relaxed));
        // A body line that mentions the marker is not a request line.
        scan_requests(
            b"PUT /v2/keys/a HTTP/1.1\r\nContent-Length: 9\r\n\r\nwait=true",
            &mut st,
            ETCD_V2,
            &w,
        );
        assert!(!w.load(Ordering::Relaxed));
    }
}
