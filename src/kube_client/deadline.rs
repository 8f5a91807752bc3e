//! A time limit on every Kubernetes API request that is not a watch.
//!
//! kube-client's connector has no read time-out by default, and one would cut watches, which
//! stay open for minutes with nothing to say. So a request the server never answered waited for
//! ever (RELIABILITY.md, finding 8: a node stuck in `releasing` on its Node PATCH).
//! [`DeadlineLayer`] bounds each request but watches, from sending it to the end of its answer's
//! body, by one limit. When the limit passes, the request fails with [`NoAnswer`], which callers
//! see as `kube::Error::Service` and count as a transport error, like a connection reset:
//! retried wherever the call is retried.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::body::{Body, Frame, SizeHint};
use hyper::{Method, Request, Response, Uri};
use tokio::time::{Instant, Sleep};
use tower::{BoxError, Layer, Service};

/// A request that got no (complete) answer within the limit.
#[derive(Debug, Clone, thiserror::Error)]
#[error(
    "no answer from the Kubernetes API server within {}: {method} {path}",
    humantime::format_duration(*limit)
)]
pub struct NoAnswer {
    /// The limit that passed.
    pub limit: Duration,
    /// The request's method and path (the query left out).
    pub method: Method,
    pub path: String,
}

/// Whether `uri` asks for a watch, by the API server's rules: a `watch` query parameter whose
/// (first) value is anything but `0` or `false` (any case), or the old `/watch/` paths
/// (`/api/v1/watch/...`, `/apis/<group>/<version>/watch/...`).
pub fn is_watch(uri: &Uri) -> bool {
    let by_query = uri.query().is_some_and(|q| {
        q.split('&')
            .map(|kv| kv.split_once('=').unwrap_or((kv, "")))
            .find(|(k, _)| *k == "watch")
            .is_some_and(|(_, v)| v != "0" && !v.eq_ignore_ascii_case("false"))
    });
    let mut segments = uri.path().split('/').skip(1);
    let by_path = match segments.next() {
        Some("api") => segments.nth(1) == Some("watch"),
        Some("apis") => segments.nth(2) == Some("watch"),
        _ => false,
    };
    by_query || by_path
}

/// Adds [`Deadline`] to a client's service stack.
#[derive(Debug, Clone, Copy)]
pub struct DeadlineLayer {
    limit: Duration,
}

impl DeadlineLayer {
    /// Every request but watches gets `limit`.
    pub fn new(limit: Duration) -> DeadlineLayer {
        DeadlineLayer { limit }
    }
}

impl<S> Layer<S> for DeadlineLayer {
    type Service = Deadline<S>;

    fn layer(&self, inner: S) -> Deadline<S> {
        Deadline {
            inner,
            limit: self.limit,
        }
    }
}

/// The service of [`DeadlineLayer`].
#[derive(Debug, Clone)]
pub struct Deadline<S> {
    inner: S,
    limit: Duration,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = Result<T, BoxError>> + Send>>;

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for Deadline<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
{
    type Response = Response<DeadlineBody<ResBody>>;
    type Error = BoxError;
    type Future = BoxFuture<Self::Response>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        if is_watch(req.uri()) {
            let answer = self.inner.call(req);
            return Box::pin(async move {
                let res = answer.await.map_err(Into::into)?;
                Ok(res.map(|inner| DeadlineBody {
                    inner,
                    deadline: None,
                }))
            });
        }
        let what = NoAnswer {
            limit: self.limit,
            method: req.method().clone(),
            path: req.uri().path().to_string(),
        };
        let at = Instant::now() + self.limit;
        let answer = self.inner.call(req);
        Box::pin(async move {
            match tokio::time::timeout_at(at, answer).await {
                Ok(res) => {
                    let res = res.map_err(Into::into)?;
                    Ok(res.map(|inner| DeadlineBody {
                        inner,
                        deadline: Some(Box::new(Pending {
                            sleep: Box::pin(tokio::time::sleep_until(at)),
                            what,
                        })),
                    }))
                }
                Err(_) => Err(gave_up(what)),
            }
        })
    }
}

fn gave_up(what: NoAnswer) -> BoxError {
    tracing::warn!(method = %what.method, path = %what.path, limit = ?what.limit, "{what}; the request is given up");
    Box::new(what)
}

struct Pending {
    sleep: Pin<Box<Sleep>>,
    what: NoAnswer,
}

/// An answer's body, cut off (with [`NoAnswer`]) when its request's limit passes.
pub struct DeadlineBody<B> {
    inner: B,
    /// `None` for a watch.
    deadline: Option<Box<Pending>>,
}

impl<B> Body for DeadlineBody<B>
where
    B: Body + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = B::Data;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, BoxError>>> {
        let this = self.get_mut();
        if let Poll::Ready(frame) = Pin::new(&mut this.inner).poll_frame(cx) {
            return Poll::Ready(frame.map(|f| f.map_err(Into::into)));
        }
        if let Some(p) = &mut this.deadline {
            if p.sleep.as_mut().poll(cx).is_ready() {
                let what = p.what.clone();
                this.deadline = None;
                return Poll::Ready(Some(Err(gave_up(what))));
            }
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{BodyExt, Empty, StreamBody};
    use tower::util::BoxService;

    fn uri(s: &str) -> Uri {
        s.parse().unwrap()
    }

    #[test]
    fn watches_are_told_apart_by_query_and_path() {
        for w in [
            "/api/v1/nodes?fieldSelector=metadata.name%3Dnode-1&watch=true&timeoutSeconds=290",
            "/api/v1/pods?watch=1",
            "/api/v1/pods?watch=True&resourceVersion=5",
            "/api/v1/pods?watch",
            "/api/v1/pods?watch=yes",
            "/api/v1/watch/nodes/node-1",
            "/api/v1/watch/namespaces/default/pods",
            "/apis/coordination.k8s.io/v1/watch/namespaces/kube-system/leases",
            "http://10.0.0.1:6443/api/v1/nodes?watch=true",
        ] {
            assert!(is_watch(&uri(w)), "{w} is a watch");
        }
        for n in [
            "/api/v1/nodes/node-1",
            "/api/v1/nodes?fieldSelector=metadata.name%3Dnode-1",
            "/api/v1/pods?watch=false",
            "/api/v1/pods?watch=FALSE",
            "/api/v1/pods?watch=0",
            "/api/v1/pods?watch=false&watch=true",
            "/api/v1/pods?allowWatchBookmarks=true",
            "/api/v1/pods?xwatch=true",
            "/api/v1/nodes/watch",
            "/api/v1/namespaces/watch/pods",
            "/apis/coordination.k8s.io/v1/namespaces/watch/leases/x",
            "/apis/policy/v1/namespaces/default/poddisruptionbudgets",
            "/version",
            "/",
        ] {
            assert!(!is_watch(&uri(n)), "{n} is not a watch");
        }
    }

    #[test]
    fn the_error_names_the_limit_and_the_request() {
        let e = NoAnswer {
            limit: Duration::from_secs(10),
            method: Method::PATCH,
            path: "/api/v1/nodes/node-1".into(),
        };
        assert_eq!(
            e.to_string(),
            "no answer from the Kubernetes API server within 10s: PATCH /api/v1/nodes/node-1"
        );
    }

    type Bytes = bytes::Bytes;

    type NeverEnds = StreamBody<futures_util::stream::Pending<Result<Frame<Bytes>, BoxError>>>;

    /// A server that answers after `after` with a body that never ends.
    fn slow(after: Duration) -> BoxService<Request<()>, Response<NeverEnds>, BoxError> {
        BoxService::new(tower::service_fn(move |_req: Request<()>| async move {
            tokio::time::sleep(after).await;
            Ok::<_, BoxError>(Response::new(StreamBody::new(
                futures_util::stream::pending(),
            )))
        }))
    }

    async fn call<S>(svc: &mut S, path: &str) -> Result<S::Response, BoxError>
    where
        S: Service<Request<()>, Error = BoxError>,
    {
        std::future::poll_fn(|cx| svc.poll_ready(cx)).await?;
        svc.call(Request::patch(path).body(()).unwrap()).await
    }

    #[tokio::test]
    async fn a_request_without_an_answer_fails_at_the_limit() {
        let mut svc =
            DeadlineLayer::new(Duration::from_millis(50)).layer(slow(Duration::from_secs(60)));
        let started = std::time::Instant::now();
        let Err(e) = call(&mut svc, "/api/v1/nodes/node-1?fieldManager=rebootd").await else {
            panic!("answered");
        };
        assert!(started.elapsed() < Duration::from_secs(5));
        let e = e.downcast::<NoAnswer>().expect("a NoAnswer");
        assert_eq!(e.path, "/api/v1/nodes/node-1");
        assert_eq!(e.method, Method::PATCH);
    }

    #[tokio::test]
    async fn a_body_that_does_not_end_fails_at_the_limit() {
        let mut svc = DeadlineLayer::new(Duration::from_millis(100)).layer(slow(Duration::ZERO));
        let res = call(&mut svc, "/api/v1/pods")
            .await
            .expect("headers in time");
        let e = res.into_body().collect().await.expect_err("cut off");
        assert!(e.is::<NoAnswer>(), "{e}");
    }

    #[tokio::test]
    async fn a_watch_is_not_limited() {
        let mut svc =
            DeadlineLayer::new(Duration::from_millis(20)).layer(slow(Duration::from_millis(150)));
        let res = call(&mut svc, "/api/v1/pods?watch=true")
            .await
            .expect("a watch waits");
        let body = res.into_body().collect();
        assert!(
            tokio::time::timeout(Duration::from_millis(150), body)
                .await
                .is_err(),
            "the watch's body stays open"
        );
    }

    #[tokio::test]
    async fn an_answer_in_time_passes_through() {
        let svc = tower::service_fn(|_req: Request<()>| async {
            Ok::<_, BoxError>(Response::new(Empty::<Bytes>::new()))
        });
        let mut svc = DeadlineLayer::new(Duration::from_secs(5)).layer(svc);
        let res = call(&mut svc, "/api/v1/nodes/node-1")
            .await
            .expect("answered");
        assert!(res.into_body().collect().await.is_ok());
    }
}
