//! Starting and stopping the stand-in: [`KubeApi::start`] binds, seeds the default
//! namespaces, spawns the timer task and the HTTP/1.1 accept loop, and returns a
//! [`KubeApiHandle`]; every request goes through fault injection, the handlers and the log.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use serde_json::json;
use tokio::net::TcpListener;
use tokio::task::{JoinHandle, JoinSet};

use crate::admission::Admission;
use crate::cluster::Cluster;
use crate::error::{ApiError, Error};
use crate::faults::{FaultAction, Faults, RequestLog, RequestRecord};
use crate::handlers::{self, Ctx, Req};
use crate::http::{self, Body, Query};
use crate::kind::Kind;
use crate::kubeconfig;
use crate::store::{SimConfig, Store};
use crate::timers;

const MAX_BODY: usize = 8 << 20;

/// How to run the stand-in.
#[derive(Debug, Clone)]
pub struct Options {
    /// Where to listen; port 0 picks a free one. Default `127.0.0.1:0`.
    pub listen: SocketAddr,
    /// Real time = simulated time x `time_scale` (grace periods, pod readiness). Default 1.0;
    /// 0 makes them immediate.
    pub time_scale: f64,
    /// Simulated time from a pod landing on a Ready node to the pod being Ready. Default 2 s.
    pub pod_ready_delay: Duration,
    /// How often a watch that allows bookmarks gets one. Default 5 s (real servers: ~1 min).
    pub bookmark_interval: Duration,
    /// Validating admission for every write (see [`Admission`]). Default none.
    pub admission: Option<Admission>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            time_scale: 1.0,
            pod_ready_delay: Duration::from_secs(2),
            bookmark_interval: Duration::from_secs(5),
            admission: None,
        }
    }
}

/// The stand-in.
pub struct KubeApi;

impl KubeApi {
    /// Bind and start serving. Must be called within a Tokio runtime.
    pub async fn start(opts: Options) -> Result<KubeApiHandle, Error> {
        let listener = TcpListener::bind(opts.listen)
            .await
            .map_err(|source| Error::Bind {
                addr: opts.listen,
                source,
            })?;
        let addr = listener.local_addr()?;
        let (store, timer_rx) = Store::new(SimConfig {
            time_scale: opts.time_scale,
            pod_ready_delay: opts.pod_ready_delay,
        });
        for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
            let mut obj = json!({"metadata": {"name": ns}});
            crate::strategy::defaults(Kind::Namespace, &mut obj);
            store.write(|st| st.create(Kind::Namespace, obj, false))?;
        }
        let faults = Faults::default();
        let log = RequestLog::default();
        let app = App {
            ctx: Ctx {
                store: store.clone(),
                addr,
                bookmark_interval: opts.bookmark_interval,
                admission: opts.admission.clone(),
            },
            faults: faults.clone(),
            log: log.clone(),
        };
        let timer_task = tokio::spawn(timers::run(store.downgrade(), timer_rx));
        let accept_task = tokio::spawn(accept_loop(listener, app));
        tracing::info!(%addr, "kube API stand-in listening");
        Ok(KubeApiHandle {
            addr,
            cluster: Cluster::new(store, faults, log),
            tasks: vec![accept_task, timer_task],
        })
    }
}

/// A running stand-in; dropping it stops the server.
pub struct KubeApiHandle {
    addr: SocketAddr,
    cluster: Cluster,
    tasks: Vec<JoinHandle<()>>,
}

impl KubeApiHandle {
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:<port>`
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The in-process API: objects, node readiness, faults, request log.
    pub fn cluster(&self) -> &Cluster {
        &self.cluster
    }

    /// A kubeconfig (YAML) for user `user`: its bearer token is the user name, which the
    /// request log records. User names are limited to `[A-Za-z0-9._:@-]`.
    pub fn kubeconfig(&self, user: &str) -> Result<String, Error> {
        let ok = !user.is_empty()
            && user
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '@' | '-'));
        if !ok {
            return Err(Error::Usage(format!(
                "unusable kubeconfig user name {user:?}"
            )));
        }
        Ok(kubeconfig::render(&self.base_url(), user, "default"))
    }

    /// Write a kubeconfig for user `lab` to `path`.
    pub fn write_kubeconfig(&self, path: &Path) -> Result<(), Error> {
        self.write_kubeconfig_for(path, "lab")
    }

    /// Write a kubeconfig for `user` to `path`.
    pub fn write_kubeconfig_for(&self, path: &Path, user: &str) -> Result<(), Error> {
        kubeconfig::write(path, &self.kubeconfig(user)?)
    }

    /// Stop serving (open connections and watches are cut).
    pub async fn shutdown(mut self) {
        for t in self.tasks.drain(..) {
            t.abort();
            let _ = t.await;
        }
    }
}

impl Drop for KubeApiHandle {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

#[derive(Clone)]
struct App {
    ctx: Ctx,
    faults: Faults,
    log: RequestLog,
}

async fn accept_loop(listener: TcpListener, app: App) {
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            r = listener.accept() => match r {
                Ok((stream, _)) => {
                    let app = app.clone();
                    conns.spawn(async move {
                        let svc = service_fn(move |req| {
                            let app = app.clone();
                            async move { Ok::<_, Infallible>(app.handle(req).await) }
                        });
                        if let Err(e) = http1::Builder::new()
                            .serve_connection(TokioIo::new(stream), svc)
                            .await
                        {
                            tracing::debug!("connection ended: {e}");
                        }
                    });
                }
                Err(e) => {
                    tracing::warn!("accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
}

fn header(req: &Request<Incoming>, name: hyper::header::HeaderName) -> String {
    req.headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string()
}

impl App {
    async fn handle(&self, req: Request<Incoming>) -> Response<Body> {
        let method = req.method().clone();
        let path = req.uri().path().to_string();
        let query_str = req.uri().query().unwrap_or("").to_string();
        let accept = header(&req, ACCEPT);
        let content_type = header(&req, CONTENT_TYPE);
        let user = header(&req, AUTHORIZATION)
            .strip_prefix("Bearer ")
            .map(str::to_string);
        let body: Result<Bytes, ApiError> = Limited::new(req.into_body(), MAX_BODY)
            .collect()
            .await
            .map(|c| c.to_bytes())
            .map_err(|e| ApiError::new(413, "RequestEntityTooLarge", e.to_string()));
        let result = match body {
            Err(e) => Err(e),
            Ok(body) => {
                let r = Req {
                    method: method.clone(),
                    path: path.clone(),
                    query: Query::parse(&query_str),
                    accept,
                    content_type,
                    body,
                    user: user.clone(),
                };
                match self
                    .faults
                    .take(method.as_str(), &path, &query_str, &r.body)
                {
                    Some(FaultAction::Status(code)) => Err(ApiError::injected(code)),
                    Some(FaultAction::Hang(d)) => {
                        tokio::time::sleep(d).await;
                        handlers::dispatch(&self.ctx, &r)
                    }
                    None => handlers::dispatch(&self.ctx, &r),
                }
            }
        };
        let (resp, reason) = match result {
            Ok(resp) => (resp, None),
            Err(e) => (http::error(&e), Some(e.reason.clone())),
        };
        let status = resp.status().as_u16();
        tracing::debug!(%method, %path, query = %query_str, status, "request");
        self.log.push(RequestRecord {
            at: SystemTime::now(),
            method: method.to_string(),
            path,
            query: query_str,
            status,
            reason,
            user,
        });
        resp
    }
}
