//! A TCP proxy the lab can cut: a node's traffic to its store goes through it, and the lab cuts
//! that node off from the store for a while, then restores it, while every other client keeps
//! talking to the store directly.
//!
//! Two ways to cut ([`CutMode`]):
//! - `Blackhole`: open connections go silent (nothing is forwarded either way, nothing is
//!   closed) and new ones are accepted and then left silent, as a dead route or a partition does:
//!   the client's requests hang until its own time limits. On restore, those connections are
//!   closed.
//! - `Reset`: open connections are closed at once and new ones are closed as soon as accepted,
//!   as a store that is gone does.
//!
//! A proxy started with a classifier ([`CutProxy::start_classified`]) knows which source each
//! connection comes from (for an etcd member's peer port: which other member dialled it), and
//! can cut the connections of one source only ([`CutProxy::cut_from`]), so that one proxy per
//! member is enough to cut any member off from the others.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// How the proxy cuts its traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CutMode {
    /// Silence: nothing forwarded, nothing closed, until the cut ends.
    Blackhole,
    /// Closed: connections dropped at once, new ones closed as accepted.
    Reset,
}

impl std::fmt::Display for CutMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            CutMode::Blackhole => "blackhole",
            CutMode::Reset => "reset",
        })
    }
}

/// Which source a connection comes from, by the client's address (`None`: unknown).
pub type Classify = Arc<dyn Fn(SocketAddr) -> Option<usize> + Send + Sync>;

/// What is cut: every connection, or those of some sources.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Cuts {
    all: Option<CutMode>,
    from: BTreeMap<usize, CutMode>,
}

impl Cuts {
    /// The cut that applies to a connection from `source`.
    fn of(&self, source: Option<usize>) -> Option<CutMode> {
        self.all
            .or_else(|| source.and_then(|s| self.from.get(&s).copied()))
    }
}

/// A running proxy to one upstream address. Dropping it stops it and closes its connections.
pub struct CutProxy {
    addr: SocketAddr,
    cut: Arc<watch::Sender<Cuts>>,
    /// Connections accepted so far (forwarded or not).
    accepted: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for CutProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CutProxy({})", self.addr)
    }
}

impl Drop for CutProxy {
    fn drop(&mut self) {
        self.task.abort();
        // Ends every connection task (they wait on this too).
        self.cut.send_replace(Cuts {
            all: Some(CutMode::Reset),
            ..Cuts::default()
        });
    }
}

impl CutProxy {
    /// Listen on 127.0.0.1 (a free port) and forward to `upstream`.
    pub async fn start(upstream: SocketAddr) -> std::io::Result<CutProxy> {
        Self::start_with(upstream, None).await
    }

    /// [`CutProxy::start`], telling each connection's source with `classify` (called once per
    /// connection, as it is accepted).
    pub async fn start_classified(
        upstream: SocketAddr,
        classify: Classify,
    ) -> std::io::Result<CutProxy> {
        Self::start_with(upstream, Some(classify)).await
    }

    async fn start_with(
        upstream: SocketAddr,
        classify: Option<Classify>,
    ) -> std::io::Result<CutProxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let cut = Arc::new(watch::Sender::new(Cuts::default()));
        let accepted = Arc::new(AtomicU64::new(0));
        let (c, n) = (cut.clone(), accepted.clone());
        let task = tokio::spawn(async move {
            while let Ok((client, from)) = listener.accept().await {
                n.fetch_add(1, Ordering::Relaxed);
                let source = classify.as_ref().and_then(|f| f(from));
                tokio::spawn(connection(client, upstream, source, c.subscribe()));
            }
        });
        Ok(CutProxy {
            addr,
            cut,
            accepted,
            task,
        })
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Cut the traffic off, as `mode` says, until [`CutProxy::restore`].
    pub fn cut(&self, mode: CutMode) {
        self.cut.send_modify(|c| c.all = Some(mode));
    }

    /// Cut the connections from `source` (as the classifier tells it) off, as `mode` says, until
    /// [`CutProxy::restore`].
    pub fn cut_from(&self, source: usize, mode: CutMode) {
        self.cut.send_modify(|c| {
            c.from.insert(source, mode);
        });
    }

    /// Forward again, every source (connections left silent by a blackhole are closed).
    pub fn restore(&self) {
        self.cut.send_replace(Cuts::default());
    }

    /// Whether every connection is cut.
    pub fn is_cut(&self) -> bool {
        self.cut.borrow().all.is_some()
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> u64 {
        self.accepted.load(Ordering::Relaxed)
    }
}

/// One client connection: forwarded while there is no cut; silent or closed during one.
async fn connection(
    mut client: TcpStream,
    upstream: SocketAddr,
    source: Option<usize>,
    mut cut: watch::Receiver<Cuts>,
) {
    let now = cut.borrow_and_update().of(source);
    if let Some(mode) = now {
        hold_until_restored(mode, source, &mut cut).await;
        return;
    }
    let Ok(mut server) = TcpStream::connect(upstream).await else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let mode = tokio::select! {
        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => None,
        m = cut.wait_for(|c| c.of(source).is_some()) => Some(m.map(|m| m.of(source).unwrap_or(CutMode::Reset)).unwrap_or(CutMode::Reset)),
    };
    if let Some(mode) = mode {
        hold_until_restored(mode, source, &mut cut).await;
    }
    // Both ends are closed here, as they drop.
}

/// During a cut: a blackholed connection stays open and silent until the cut ends; a reset one
/// closes now.
async fn hold_until_restored(
    mode: CutMode,
    source: Option<usize>,
    cut: &mut watch::Receiver<Cuts>,
) {
    if mode == CutMode::Blackhole {
        let _ = cut.wait_for(|c| c.of(source).is_none()).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// An upstream that echoes what it reads.
    async fn echo() -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                tokio::spawn(async move {
                    let mut buf = [0u8; 64];
                    while let Ok(n) = s.read(&mut buf).await {
                        if n == 0 || s.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
        addr
    }

    async fn round_trip(s: &mut TcpStream) -> Option<Vec<u8>> {
        s.write_all(b"ping").await.ok()?;
        let mut buf = [0u8; 4];
        match tokio::time::timeout(Duration::from_millis(300), s.read_exact(&mut buf)).await {
            Ok(Ok(_)) => Some(buf.to_vec()),
            _ => None,
        }
    }

    #[tokio::test]
    async fn forwards_goes_silent_when_blackholed_and_closes_on_reset() {
        let proxy = CutProxy::start(echo().await).await.unwrap();
        let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
        assert_eq!(round_trip(&mut s).await.as_deref(), Some(&b"ping"[..]));

        // Blackhole: the open connection and a new one get no answer, and are not closed.
        proxy.cut(CutMode::Blackhole);
        assert_eq!(round_trip(&mut s).await, None);
        let mut fresh = TcpStream::connect(proxy.addr()).await.unwrap();
        assert_eq!(round_trip(&mut fresh).await, None);
        // Restored: the silenced connections are closed, new ones are forwarded.
        proxy.restore();
        let mut buf = [0u8; 8];
        let closed = tokio::time::timeout(Duration::from_secs(2), fresh.read(&mut buf)).await;
        assert!(matches!(closed, Ok(Ok(0)) | Ok(Err(_))), "{closed:?}");
        let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
        assert_eq!(round_trip(&mut s).await.as_deref(), Some(&b"ping"[..]));

        // Reset: the open connection is closed at once, a new one as soon as accepted.
        proxy.cut(CutMode::Reset);
        let closed = tokio::time::timeout(Duration::from_secs(2), s.read(&mut buf)).await;
        assert!(matches!(closed, Ok(Ok(0)) | Ok(Err(_))), "{closed:?}");
        let mut fresh = TcpStream::connect(proxy.addr()).await.unwrap();
        let closed = tokio::time::timeout(Duration::from_secs(2), fresh.read(&mut buf)).await;
        assert!(matches!(closed, Ok(Ok(0)) | Ok(Err(_))), "{closed:?}");
        proxy.restore();
        let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
        assert_eq!(round_trip(&mut s).await.as_deref(), Some(&b"ping"[..]));
        assert!(proxy.accepted() >= 5);
    }

    #[tokio::test]
    async fn cuts_only_the_source_it_is_told() {
        // Sources by the client's port (Linux gives connect() even ports: by the next bit).
        let classify: Classify = Arc::new(|a: SocketAddr| Some(usize::from(a.port() / 2 % 2)));
        let proxy = CutProxy::start_classified(echo().await, classify)
            .await
            .unwrap();
        let src = |s: &TcpStream| usize::from(s.local_addr().unwrap().port() / 2 % 2);
        let mut a = TcpStream::connect(proxy.addr()).await.unwrap();
        let mut b = TcpStream::connect(proxy.addr()).await.unwrap();
        for _ in 0..50 {
            if src(&a) != src(&b) {
                break;
            }
            b = TcpStream::connect(proxy.addr()).await.unwrap();
        }
        assert_ne!(src(&a), src(&b), "50 connections from one source");
        proxy.cut_from(src(&a), CutMode::Blackhole);
        assert_eq!(round_trip(&mut a).await, None);
        assert_eq!(round_trip(&mut b).await.as_deref(), Some(&b"ping"[..]));
        proxy.restore();
        let mut a = TcpStream::connect(proxy.addr()).await.unwrap();
        assert_eq!(round_trip(&mut a).await.as_deref(), Some(&b"ping"[..]));
    }
}
