//! A webhook receiver for the lab: a real HTTP/1.1 server on loopback that records every POST
//! (path, content type, JSON body) and answers 200, or, when told, an error status or nothing at
//! all for a while (to show that a failing receiver never holds a reboot up).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::CONTENT_TYPE;
use hyper::{Request, Response, StatusCode};
use serde_json::Value;
use tokio::sync::watch;

/// One POST the receiver got.
#[derive(Debug, Clone)]
pub struct Delivery {
    pub path: String,
    pub content_type: String,
    /// The body as JSON (`Value::Null` when it was not JSON).
    pub body: Value,
}

/// How the receiver answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    Ok,
    Status(u16),
    /// Hold the request this long before answering 200.
    Hang(Duration),
}

#[derive(Clone)]
struct Shared {
    got: Arc<Mutex<Vec<Delivery>>>,
    count: watch::Sender<usize>,
    answer: Arc<Mutex<Answer>>,
}

/// A running receiver; dropping it stops it.
pub struct WebhookReceiver {
    addr: SocketAddr,
    shared: Shared,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for WebhookReceiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl WebhookReceiver {
    /// Listen on a free loopback port.
    pub async fn start() -> std::io::Result<WebhookReceiver> {
        let shared = Shared {
            got: Arc::default(),
            count: watch::channel(0).0,
            answer: Arc::new(Mutex::new(Answer::Ok)),
        };
        let s = shared.clone();
        let (addr, task) = crate::serve::loopback(move |req| {
            let s = s.clone();
            async move { handle(&s, req).await }
        })
        .await?;
        Ok(WebhookReceiver { addr, shared, task })
    }

    /// `http://127.0.0.1:<port>/hook`
    pub fn url(&self) -> String {
        format!("http://{}/hook", self.addr)
    }

    /// From now on, answer this way.
    pub fn answer(&self, a: Answer) {
        *self.shared.answer.lock().unwrap_or_else(|p| p.into_inner()) = a;
    }

    /// Everything received so far, in order.
    pub fn deliveries(&self) -> Vec<Delivery> {
        self.shared
            .got
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Wait until a delivery satisfies `f`, or `timeout` passes.
    pub async fn wait_for(
        &self,
        timeout: Duration,
        f: impl Fn(&Delivery) -> bool,
    ) -> Result<Delivery, Vec<Delivery>> {
        let mut rx = self.shared.count.subscribe();
        let wait = async {
            loop {
                if let Some(d) = self.deliveries().into_iter().find(|d| f(d)) {
                    return d;
                }
                if rx.changed().await.is_err() {
                    std::future::pending::<()>().await;
                }
            }
        };
        tokio::time::timeout(timeout, wait)
            .await
            .map_err(|_| self.deliveries())
    }
}

async fn handle(s: &Shared, req: Request<Incoming>) -> Response<Full<Bytes>> {
    let path = req.uri().path().to_string();
    let content_type = req
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let body = match Limited::new(req.into_body(), 1 << 20).collect().await {
        Ok(b) => serde_json::from_slice(&b.to_bytes()).unwrap_or(Value::Null),
        Err(_) => Value::Null,
    };
    let answer = *s.answer.lock().unwrap_or_else(|p| p.into_inner());
    {
        let mut got = s.got.lock().unwrap_or_else(|p| p.into_inner());
        got.push(Delivery {
            path,
            content_type,
            body,
        });
        s.count.send_replace(got.len());
    }
    let code = match answer {
        Answer::Ok => 200,
        Answer::Status(c) => c,
        Answer::Hang(d) => {
            tokio::time::sleep(d).await;
            200
        }
    };
    let mut r = Response::new(Full::new(Bytes::from_static(b"ok")));
    *r.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    r
}
