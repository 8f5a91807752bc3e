//! Real Prometheus and Alertmanager for the lab (Debian's `prometheus` and
//! `prometheus-alertmanager`), on free loopback ports with temporary data directories, and an
//! [`Exporter`] whose one gauge a test sets, so alert rules on it fire and resolve on command.

use std::convert::Infallible;
use std::net::{SocketAddr, TcpListener};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::process::{Child, Command};

/// Why a lab service could not be run.
#[derive(Debug, thiserror::Error)]
pub enum PromLabError {
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Other(String),
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> PromLabError {
    let what = what.into();
    move |source| PromLabError::Io { what, source }
}

fn free_port() -> Result<u16, PromLabError> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(io("bind a free loopback port"))?;
    Ok(l.local_addr().map_err(io("local address"))?.port())
}

/// Serves `/metrics`: `lab_gate_value <v>` with the value last [`Exporter::set`].
pub struct Exporter {
    addr: SocketAddr,
    value: Arc<Mutex<f64>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Exporter {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Exporter {
    pub async fn start() -> Result<Exporter, PromLabError> {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
            .await
            .map_err(io("bind the exporter"))?;
        let addr = listener.local_addr().map_err(io("exporter address"))?;
        let value = Arc::new(Mutex::new(0.0));
        let v = value.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let v = v.clone();
                tokio::spawn(async move {
                    let svc = service_fn(move |_req: Request<hyper::body::Incoming>| {
                        let x = *v.lock().unwrap_or_else(|p| p.into_inner());
                        let text = format!("# TYPE lab_gate_value gauge\nlab_gate_value {x}\n");
                        async move { Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(text)))) }
                    });
                    let _ = http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        Ok(Exporter { addr, value, task })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn set(&self, x: f64) {
        *self.value.lock().unwrap_or_else(|p| p.into_inner()) = x;
    }
}

/// A running server process (killed on drop) and its URL.
pub struct Service {
    pub url: String,
    /// The CA of its certificate when it serves `https://` ([`prometheus_tls`]).
    pub ca_file: Option<std::path::PathBuf>,
    child: Child,
    _dir: tempfile::TempDir,
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

/// `ca_file`: it serves `https://` with a certificate of this CA.
async fn spawn(
    binary: &str,
    args: Vec<String>,
    dir: tempfile::TempDir,
    port: u16,
    ca_file: Option<std::path::PathBuf>,
) -> Result<Service, PromLabError> {
    let log = std::fs::File::create(dir.path().join("log")).map_err(io("log file"))?;
    let log2 = log.try_clone().map_err(io("log file"))?;
    let child = Command::new(binary)
        .args(&args)
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log2)
        .kill_on_drop(true)
        .spawn()
        .map_err(io(format!("start {binary}")))?;
    let scheme = if ca_file.is_some() { "https" } else { "http" };
    let url = format!("{scheme}://127.0.0.1:{port}");
    let tls = rebootd::http::TlsFiles {
        table: "lab",
        ca_file: ca_file.clone(),
        client_cert: None,
    };
    let svc = Service {
        url: url.clone(),
        ca_file,
        child,
        _dir: dir,
    };
    // Ready when /-/ready answers 200: an outside process, so asked until it does (bounded).
    let client = rebootd::http::client(tls.ca_file.is_some(), &tls, Duration::from_secs(2))
        .map_err(|e| PromLabError::Other(e.to_string()))?;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(r) = request(&client, Method::GET, &format!("{url}/-/ready"), None).await {
            if r.0 == 200 {
                return Ok(svc);
            }
        }
        if Instant::now() > deadline {
            let log = std::fs::read_to_string(svc._dir.path().join("log")).unwrap_or_default();
            return Err(PromLabError::Other(format!(
                "{binary} not ready within 30 s:\n{log}"
            )));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One HTTP request: (status, JSON body or Null).
pub async fn request(
    client: &rebootd::http::HttpClient,
    method: Method,
    url: &str,
    body: Option<&Value>,
) -> Result<(u16, Value), String> {
    let bytes = body.map(|b| b.to_string()).unwrap_or_default();
    let req = Request::builder()
        .method(method)
        .uri(url)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(bytes)))
        .map_err(|e| e.to_string())?;
    let resp = client.request(req).await.map_err(|e| e.to_string())?;
    let status = resp.status().as_u16();
    let b = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    Ok((status, serde_json::from_slice(&b).unwrap_or(Value::Null)))
}

/// Prometheus scraping `target` every second and evaluating `rules` (a rule file's YAML) every
/// second.
pub async fn prometheus(target: SocketAddr, rules: &str) -> Result<Service, PromLabError> {
    start_prometheus(target, rules, false).await
}

/// [`prometheus`] serving `https://` only, with a certificate for 127.0.0.1 from a throw-away
/// CA ([`Service::ca_file`]), made with the `openssl` command.
pub async fn prometheus_tls(target: SocketAddr, rules: &str) -> Result<Service, PromLabError> {
    start_prometheus(target, rules, true).await
}

async fn start_prometheus(
    target: SocketAddr,
    rules: &str,
    tls: bool,
) -> Result<Service, PromLabError> {
    let dir = tempfile::tempdir().map_err(io("temp dir"))?;
    let port = free_port()?;
    let d = dir.path();
    std::fs::write(d.join("rules.yml"), rules).map_err(io("rules.yml"))?;
    std::fs::write(
        d.join("prometheus.yml"),
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files: [{:?}]\n\
             scrape_configs:\n  - job_name: lab\n    static_configs:\n      - targets: [\"{target}\"]\n",
            d.join("rules.yml")
        ),
    )
    .map_err(io("prometheus.yml"))?;
    let mut args = vec![
        format!("--config.file={}", d.join("prometheus.yml").display()),
        format!("--storage.tsdb.path={}", d.join("data").display()),
        format!("--web.listen-address=127.0.0.1:{port}"),
    ];
    let mut ca_file = None;
    if tls {
        let files =
            crate::etcd::make_tls(d).map_err(|e| PromLabError::Other(format!("TLS files: {e}")))?;
        std::fs::write(
            d.join("web.yml"),
            format!(
                "tls_server_config:\n  cert_file: {:?}\n  key_file: {:?}\n",
                files.server_cert, files.server_key
            ),
        )
        .map_err(io("web.yml"))?;
        args.push(format!("--web.config.file={}", d.join("web.yml").display()));
        ca_file = Some(files.ca);
    }
    spawn("prometheus", args, dir, port, ca_file).await
}

/// Alertmanager alone (no cluster), with a receiver that sends nothing.
pub async fn alertmanager() -> Result<Service, PromLabError> {
    let dir = tempfile::tempdir().map_err(io("temp dir"))?;
    let port = free_port()?;
    let d = dir.path();
    std::fs::write(
        d.join("alertmanager.yml"),
        "route:\n  receiver: none\nreceivers:\n  - name: none\n",
    )
    .map_err(io("alertmanager.yml"))?;
    let args = vec![
        format!("--config.file={}", d.join("alertmanager.yml").display()),
        format!("--storage.path={}", d.join("data").display()),
        format!("--web.listen-address=127.0.0.1:{port}"),
        "--cluster.listen-address=".to_string(),
    ];
    spawn("prometheus-alertmanager", args, dir, port, None).await
}
