//! A Prometheus alert that flaps (`--gates`): beside the command gate of [`super::gates`], every
//! node has a Prometheus alerts gate (`prometheus_url`, `alerts = ['alertname="LabChaosGate"']`)
//! on the real Prometheus (Debian's, [`crate::prometheus`]), which scrapes the lab's gauge every
//! second and evaluates the rule `lab_gate_value > 0` every second. The lab flips the gauge every
//! 0.5–4 s (1 on 40 % of the flips, 0 at the end), so the alert fires and resolves throughout the
//! rollout.
//!
//! The nodes reach Prometheus through the lab's logging proxy, one path prefix per node
//! (`http://PROXY/node-3` + `/api/v1/alerts`): for every query it records when it came, what
//! Prometheus answered (`firing` when the alert is among the firing alerts, `none` else) and when
//! the answer went back. So the checker knows every answer each node got and when, as it does
//! for the command gate, and checks the same rule (see [`super::check::gate_violations`]): the
//! node's last alert query before its reboot call said no firing alert, within the time-out.

use super::check::GateRun;
use super::trial::{lock, Shared};
use super::Rng;
use crate::prometheus::{prometheus, Exporter, Service};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The alert gate's time-out in the nodes' configuration.
pub const TIMEOUT: Duration = Duration::from_secs(2);

/// The alert.
const ALERT: &str = "LabChaosGate";

const RULES: &str = "groups:
  - name: chaos
    rules:
      - alert: LabChaosGate
        expr: lab_gate_value > 0
";

/// The real Prometheus, its gauge and the logging proxy in front of it.
pub(super) struct AlertGate {
    exporter: Exporter,
    _prometheus: Service,
    proxy: SocketAddr,
    runs: Arc<Mutex<Vec<GateRun>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for AlertGate {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl AlertGate {
    /// Start the gauge (0), Prometheus and the proxy; `started` is the trial's time zero.
    pub async fn start(started: Instant) -> Result<AlertGate, String> {
        let exporter = Exporter::start()
            .await
            .map_err(|e| format!("alert gate exporter: {e}"))?;
        let prom = prometheus(exporter.addr(), RULES)
            .await
            .map_err(|e| format!("prometheus: {e}"))?;
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
            .await
            .map_err(|e| format!("alert gate proxy: {e}"))?;
        let proxy = listener
            .local_addr()
            .map_err(|e| format!("alert gate proxy: {e}"))?;
        let runs = Arc::new(Mutex::new(Vec::new()));
        let client = rebootd::http::client(false, &Default::default(), Duration::from_secs(2))
            .map_err(|e| format!("alert gate proxy client: {e}"))?;
        let (r, upstream) = (runs.clone(), prom.url.clone());
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (r, upstream, client) = (r.clone(), upstream.clone(), client.clone());
                tokio::spawn(async move {
                    let svc = service_fn(move |req: Request<hyper::body::Incoming>| {
                        let (r, upstream, client) = (r.clone(), upstream.clone(), client.clone());
                        async move {
                            Ok::<_, Infallible>(forward(req, &upstream, &client, &r, started).await)
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        Ok(AlertGate {
            exporter,
            _prometheus: prom,
            proxy,
            runs,
            task,
        })
    }

    /// A node's configuration fragment: one more gate before the reboot (after the `[gates]`
    /// table of [`super::gates::toml`]).
    pub fn toml(&self, node: &str) -> String {
        format!(
            "\n[[gates.before_reboot]]\nname = \"lab alert\"\nprometheus_url = \"http://{}/{node}\"\nalerts = ['alertname=\"{ALERT}\"']\ntimeout = \"{}ms\"\n",
            self.proxy,
            TIMEOUT.as_millis()
        )
    }

    /// Every alert query the proxy saw, as gate runs (exit 0: no firing alert, 1: firing, 2:
    /// Prometheus did not answer).
    pub fn runs(&self) -> Vec<GateRun> {
        lock(&self.runs).clone()
    }

    /// [`AlertGate::runs`] at the end of a trial (with the time-out), counted in the stats.
    pub fn observe(&self, shared: &Shared) -> (Vec<GateRun>, Duration) {
        let runs = self.runs();
        let firing = runs.iter().filter(|r| r.answer == "firing").count() as u32;
        shared.stats(|s| {
            *s.gates.entry("alert queries".into()).or_default() += runs.len() as u32;
            *s.gates.entry("alert said firing".into()).or_default() += firing;
        });
        (runs, TIMEOUT)
    }

    /// Flip the gauge until the chaos stops (1 on 40 % of the flips), then 0.
    pub async fn flap(&self, mut rng: Rng, shared: Arc<Shared>) {
        while !shared.stopped() {
            tokio::time::sleep(rng.ms(500, 4000)).await;
            let firing = rng.chance(40);
            self.exporter.set(if firing { 1.0 } else { 0.0 });
            let key = if firing {
                "alert set firing"
            } else {
                "alert set resolved"
            };
            shared.stats(|s| *s.gates.entry(key.into()).or_default() += 1);
        }
        self.exporter.set(0.0);
    }
}

/// Forward a node's `GET /NODE/api/v1/alerts` to Prometheus and log it.
async fn forward(
    req: Request<hyper::body::Incoming>,
    upstream: &str,
    client: &rebootd::http::HttpClient,
    runs: &Mutex<Vec<GateRun>>,
    started: Instant,
) -> Response<Full<Bytes>> {
    // Logged at once, ended when the answer goes back: a query the node gave up on (its
    // time-out) stays without an end, as a run killed at its time-out (wait).
    let index = {
        let mut r = lock(runs);
        r.push(GateRun {
            node: String::new(),
            start: started.elapsed(),
            answer: "no answer".into(),
            end: None,
        });
        r.len() - 1
    };
    let path = req.uri().path().to_owned();
    let (node, rest) = path
        .trim_start_matches('/')
        .split_once('/')
        .unwrap_or(("?", ""));
    if let Some(r) = lock(runs).get_mut(index) {
        r.node = node.to_owned();
    }
    let url = format!("{upstream}/{rest}");
    let answer = async {
        let r = Request::get(url.as_str())
            .body(Full::new(Bytes::new()))
            .map_err(|e| e.to_string())?;
        let resp = client.request(r).await.map_err(|e| e.to_string())?;
        let status = resp.status();
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        Ok::<_, String>((status, body))
    };
    let (status, body, code, said) = match tokio::time::timeout(TIMEOUT * 2, answer).await {
        Ok(Ok((status, body))) if status.is_success() => {
            let firing = firing(&body);
            let (code, said) = if firing { (1, "firing") } else { (0, "none") };
            (status, body, code, said)
        }
        Ok(Ok((status, body))) => (status, body, 2, "error"),
        _ => (
            hyper::StatusCode::BAD_GATEWAY,
            Bytes::from_static(b"prometheus did not answer"),
            2,
            "error",
        ),
    };
    let mut resp = Response::new(Full::new(body));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    if let Some(r) = lock(runs).get_mut(index) {
        r.answer = said.to_owned();
        r.end = Some((started.elapsed(), code));
    }
    resp
}

/// Whether a `/api/v1/alerts` answer lists the lab's alert as firing.
fn firing(body: &[u8]) -> bool {
    let v: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
    v["data"]["alerts"].as_array().is_some_and(|a| {
        a.iter()
            .any(|x| x["labels"]["alertname"] == ALERT && x["state"] == "firing")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_labs_firing_alert_counts() {
        let body = |name: &str, state: &str| {
            format!(
                r#"{{"status":"success","data":{{"alerts":[{{"labels":{{"alertname":"{name}"}},"state":"{state}"}}]}}}}"#
            )
        };
        assert!(firing(body(ALERT, "firing").as_bytes()));
        assert!(!firing(body(ALERT, "pending").as_bytes()));
        assert!(!firing(body("Other", "firing").as_bytes()));
        assert!(!firing(
            b"{\"status\":\"success\",\"data\":{\"alerts\":[]}}"
        ));
    }
}
