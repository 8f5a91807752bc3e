//! A canned HTTP server for the lab: a real HTTP/1.1 server on loopback that answers every
//! request with the status and body it was last told, and records each request's method, path
//! and headers, so a test sees what a client sends (an `Authorization` header) and how it takes
//! an answer it should not trust (an error status, a body of the wrong shape, a huge body).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};

/// One request the stub got.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    /// Path and query.
    pub path: String,
    /// Header names in lower case, with their values.
    pub headers: Vec<(String, String)>,
}

impl Seen {
    /// The value of header `name` (lower case), if sent.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

#[derive(Clone)]
struct Shared {
    seen: Arc<Mutex<Vec<Seen>>>,
    answer: Arc<Mutex<(u16, Bytes)>>,
}

/// A running stub; dropping it stops it.
pub struct HttpStub {
    addr: SocketAddr,
    shared: Shared,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for HttpStub {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl HttpStub {
    /// Listen on a free loopback port; answers `200 {}` until told otherwise.
    pub async fn start() -> std::io::Result<HttpStub> {
        let shared = Shared {
            seen: Arc::default(),
            answer: Arc::new(Mutex::new((200, Bytes::from_static(b"{}")))),
        };
        let s = shared.clone();
        let (addr, task) = crate::serve::loopback(move |req| {
            let answer = handle(&s, req);
            async move { answer }
        })
        .await?;
        Ok(HttpStub { addr, shared, task })
    }

    /// `http://127.0.0.1:<port>`
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// From now on, answer `status` with `body`.
    pub fn answer(&self, status: u16, body: impl Into<Bytes>) {
        *self.shared.answer.lock().unwrap_or_else(|p| p.into_inner()) = (status, body.into());
    }

    /// Every request so far, in order.
    pub fn seen(&self) -> Vec<Seen> {
        self.shared
            .seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

fn handle(s: &Shared, req: Request<Incoming>) -> Response<Full<Bytes>> {
    let seen = Seen {
        method: req.method().to_string(),
        path: req
            .uri()
            .path_and_query()
            .map(|p| p.to_string())
            .unwrap_or_default(),
        headers: req
            .headers()
            .iter()
            .map(|(n, v)| {
                (
                    n.as_str().to_string(),
                    String::from_utf8_lossy(v.as_bytes()).into_owned(),
                )
            })
            .collect(),
    };
    s.seen.lock().unwrap_or_else(|p| p.into_inner()).push(seen);
    let (status, body) = s.answer.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let mut r = Response::new(Full::new(body));
    *r.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    r
}
