//! The loop the lab's small HTTP servers share (the webhook receiver, the canned stub): a real
//! HTTP/1.1 server on a free loopback port, one task per connection, every request answered by
//! the given handler. Dropping the returned task's handle (`abort`) stops it.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::task::{JoinHandle, JoinSet};

/// Listen on a free loopback port and answer every request with `handle`.
pub async fn loopback<F, Fut>(handle: F) -> std::io::Result<(SocketAddr, JoinHandle<()>)>
where
    F: Fn(Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Response<Full<Bytes>>> + Send + 'static,
{
    let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
    let addr = listener.local_addr()?;
    let task = tokio::spawn(async move {
        let mut conns = JoinSet::new();
        loop {
            tokio::select! {
                Ok((stream, _)) = listener.accept() => {
                    let handle = handle.clone();
                    conns.spawn(async move {
                        let svc = service_fn(move |req| {
                            let answer = handle(req);
                            async move { Ok::<_, Infallible>(answer.await) }
                        });
                        let _ = http1::Builder::new()
                            .serve_connection(TokioIo::new(stream), svc)
                            .await;
                    });
                }
                Some(_) = conns.join_next(), if !conns.is_empty() => {}
            }
        }
    });
    Ok((addr, task))
}
