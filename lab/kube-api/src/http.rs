//! HTTP plumbing: the response body type (a whole buffer or a channel of chunks for watches),
//! JSON and `Status` responses, and query strings.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::Frame;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::header::{HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use hyper::{Response, StatusCode};
use serde_json::Value;
use tokio::sync::mpsc;

use crate::error::ApiError;

/// Every response body.
pub type Body = BoxBody<Bytes, Infallible>;

/// A body made of the chunks sent on a channel; it ends when the sender is dropped.
struct ChannelBody(mpsc::Receiver<Bytes>);

impl http_body::Body for ChannelBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.0.poll_recv(cx).map(|o| o.map(|b| Ok(Frame::data(b))))
    }
}

fn with_status(code: u16, body: Body, content_type: &'static str) -> Response<Body> {
    let mut r = Response::new(body);
    *r.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}

/// A JSON document.
pub fn json(code: u16, v: &Value) -> Response<Body> {
    let bytes = serde_json::to_vec(v).unwrap_or_default();
    with_status(
        code,
        Full::new(Bytes::from(bytes)).boxed(),
        "application/json",
    )
}

/// Plain text.
pub fn text(code: u16, s: &'static str) -> Response<Body> {
    with_status(
        code,
        Full::new(Bytes::from_static(s.as_bytes())).boxed(),
        "text/plain; charset=utf-8",
    )
}

/// A `Status` error, with `Retry-After` when the error carries one.
pub fn error(e: &ApiError) -> Response<Body> {
    let mut r = json(e.code, &e.to_status());
    if let Some(s) = e.retry_after {
        if let Ok(v) = HeaderValue::from_str(&s.to_string()) {
            r.headers_mut().insert(RETRY_AFTER, v);
        }
    }
    r
}

/// A chunked JSON stream fed by the returned sender.
pub fn stream() -> (mpsc::Sender<Bytes>, Response<Body>) {
    let (tx, rx) = mpsc::channel(256);
    (
        tx,
        with_status(200, ChannelBody(rx).boxed(), "application/json"),
    )
}

/// A decoded query string.
#[derive(Debug, Clone, Default)]
pub struct Query(Vec<(String, String)>);

impl Query {
    pub fn parse(q: &str) -> Self {
        Query(
            form_urlencoded::parse(q.as_bytes())
                .map(|(k, v)| (k.into_owned(), v.into_owned()))
                .collect(),
        )
    }

    pub fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// `true` or `1`.
    pub fn flag(&self, key: &str) -> bool {
        matches!(self.get(key), Some("true" | "1"))
    }
}
