//! Shared helpers of the benchmarks: statistics, etcd's metrics, ids, the machine.

use crate::etcd::EtcdVersion;
use std::collections::BTreeMap;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Summary of a sample (milliseconds).
#[derive(Debug, Clone, Copy)]
pub struct Stats {
    pub n: usize,
    pub min: f64,
    pub median: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
    pub mean: f64,
}

/// Nearest-rank percentile of a sorted sample.
fn rank(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let r = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[r.clamp(1, sorted.len()) - 1]
}

pub fn stats(sample: &[f64]) -> Stats {
    let mut s = sample.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    let n = s.len();
    let mean = if n == 0 {
        f64::NAN
    } else {
        s.iter().sum::<f64>() / n as f64
    };
    Stats {
        n,
        min: s.first().copied().unwrap_or(f64::NAN),
        median: if n == 0 {
            f64::NAN
        } else if n % 2 == 1 {
            s[n / 2]
        } else {
            (s[n / 2 - 1] + s[n / 2]) / 2.0
        },
        p90: rank(&s, 90.0),
        p99: rank(&s, 99.0),
        max: s.last().copied().unwrap_or(f64::NAN),
        mean,
    }
}

impl std::fmt::Display for Stats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "n={} median={:.2} p90={:.2} p99={:.2} min={:.2} max={:.2} mean={:.2} (ms)",
            self.n, self.median, self.p90, self.p99, self.min, self.max, self.mean
        )
    }
}

pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// A random 32-hex-digit id (machine id, boot id).
pub fn random_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/uuid")
        .map(|s| s.trim().replace('-', ""))
        .unwrap_or_else(|_| format!("{:032x}", std::process::id()))
}

pub fn parse_etcd(v: &str) -> Result<EtcdVersion, String> {
    match v {
        "3.4" => Ok(EtcdVersion::V34),
        "3.5" => Ok(EtcdVersion::V35),
        other => Err(format!("etcd version {other}: expected 3.4 or 3.5")),
    }
}

/// `nproc`, the CPU model and the kernel, in one line.
pub fn machine() -> String {
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|s| s.trim().to_string())
        })
        .unwrap_or_default();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    format!(
        "{cpus} CPUs ({model}), Linux {}, loadavg {}",
        kernel.trim(),
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    )
}

/// etcd's request counters from its `/metrics` endpoint (plain http client URL): unary calls
/// by method (`grpc_server_started_total`), streams opened (`Watch` and others) and messages
/// received on streams (a watch create or cancel is one message).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EtcdCounters {
    /// `grpc_server_started_total` by `grpc_method`.
    pub started: BTreeMap<String, f64>,
    /// `grpc_server_msg_received_total` by `grpc_method`.
    pub received: BTreeMap<String, f64>,
    /// Requests to the v2 keys API: `v2 GET`, `v2 PUT`, ... (`etcd_http_received_total` by
    /// method: every request but watches) and `v2 watch` (long polls,
    /// `etcd_debugging_store_watch_requests_total`).
    pub v2: BTreeMap<String, f64>,
    /// What they did in etcd's v2 store (`etcd_debugging_store_reads_total` / `writes_total`
    /// by action: `getRecursive`, `compareAndSwap`, ...), not counted again as requests. The
    /// store's `get` is left out: etcd's own authentication check reads it once per request.
    pub v2_actions: BTreeMap<String, f64>,
}

impl EtcdCounters {
    pub fn minus(&self, before: &EtcdCounters) -> EtcdCounters {
        let sub = |a: &BTreeMap<String, f64>, b: &BTreeMap<String, f64>| {
            a.iter()
                .map(|(k, v)| (k.clone(), v - b.get(k).copied().unwrap_or(0.0)))
                .filter(|(_, v)| *v != 0.0)
                .collect()
        };
        EtcdCounters {
            started: sub(&self.started, &before.started),
            received: sub(&self.received, &before.received),
            v2: sub(&self.v2, &before.v2),
            v2_actions: sub(&self.v2_actions, &before.v2_actions),
        }
    }

    /// Requests: unary calls started plus messages received on streams (watch creates).
    pub fn requests(&self) -> f64 {
        let unary: f64 = self
            .started
            .iter()
            .filter(|(k, _)| !is_stream(k))
            .map(|(_, v)| v)
            .sum();
        let streamed: f64 = self
            .received
            .iter()
            .filter(|(k, _)| is_stream(k))
            .map(|(_, v)| v)
            .sum();
        let v2: f64 = self.v2.values().sum();
        // `+ 0.0`: the sum of no floats is -0.0, printed "-0".
        unary + streamed + v2 + 0.0
    }

    /// `Range=12 Txn=4 Watch(streams)=1 Watch(msgs)=2`.
    pub fn describe(&self, per: f64) -> String {
        let mut parts = Vec::new();
        for (k, v) in &self.started {
            if is_stream(k) {
                parts.push(format!("{k}(streams opened)={:.2}", v / per));
            } else {
                parts.push(format!("{k}={:.2}", v / per));
            }
        }
        for (k, v) in &self.received {
            if is_stream(k) {
                parts.push(format!("{k}(msgs: creates/cancels)={:.2}", v / per));
            }
        }
        for (k, v) in &self.v2 {
            parts.push(format!("{k}={:.2}", v / per));
        }
        if !self.v2_actions.is_empty() {
            let actions: Vec<String> = self
                .v2_actions
                .iter()
                .map(|(k, v)| format!("{k}={:.2}", v / per))
                .collect();
            parts.push(format!("(v2 store: {})", actions.join(" ")));
        }
        if parts.is_empty() {
            "none".into()
        } else {
            parts.join(" ")
        }
    }
}

/// A v2 counter of etcd's metrics: (`v2 METHOD` | `v2 watch` | store action, value).
fn v2_counter(line: &str) -> Option<(String, f64)> {
    let value = |rest: &str| -> f64 {
        rest.rsplit(' ')
            .next()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0)
    };
    let label = |rest: &str, name: &str| -> Option<String> {
        let v = rest.split(&format!("{name}=\"")).nth(1)?;
        Some(v.split('"').next()?.to_string())
    };
    if let Some(rest) = line.strip_prefix("etcd_http_received_total{") {
        return Some((format!("v2 {}", label(rest, "method")?), value(rest)));
    }
    if let Some(rest) = line.strip_prefix("etcd_debugging_store_watch_requests_total ") {
        return Some(("v2 watch".to_string(), value(rest)));
    }
    for prefix in [
        "etcd_debugging_store_reads_total{",
        "etcd_debugging_store_writes_total{",
    ] {
        if let Some(rest) = line.strip_prefix(prefix) {
            let action = label(rest, "action")?;
            return (action != "get").then(|| (action, value(rest)));
        }
    }
    None
}

fn is_stream(method: &str) -> bool {
    matches!(method, "Watch" | "LeaseKeepAlive" | "Snapshot")
}

/// etcd's `/metrics` text. `endpoint` is `http://127.0.0.1:PORT`.
pub async fn metrics_text(endpoint: &str) -> Result<String, String> {
    let addr = endpoint
        .strip_prefix("http://")
        .ok_or_else(|| format!("{endpoint}: only plain http endpoints are read"))?;
    let mut s = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| format!("metrics {addr}: {e}"))?;
    s.write_all(format!("GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
        .await
        .map_err(|e| format!("metrics {addr}: {e}"))?;
    let mut body = String::new();
    s.read_to_string(&mut body)
        .await
        .map_err(|e| format!("metrics {addr}: {e}"))?;
    Ok(body)
}

/// Fetch and parse etcd's metrics. `endpoint` is `http://127.0.0.1:PORT`.
pub async fn etcd_counters(endpoint: &str) -> Result<EtcdCounters, String> {
    let body = metrics_text(endpoint).await?;
    let mut c = EtcdCounters::default();
    for line in body.lines() {
        if let Some((name, value)) = v2_counter(line) {
            let map = if name.starts_with("v2 ") {
                &mut c.v2
            } else {
                &mut c.v2_actions
            };
            *map.entry(name).or_default() += value;
            continue;
        }
        let (map, rest) = if let Some(r) = line.strip_prefix("grpc_server_started_total{") {
            (&mut c.started, r)
        } else if let Some(r) = line.strip_prefix("grpc_server_msg_received_total{") {
            (&mut c.received, r)
        } else {
            continue;
        };
        let Some(m) = rest.split("grpc_method=\"").nth(1) else {
            continue;
        };
        let method = m.split('"').next().unwrap_or("").to_string();
        let value: f64 = rest
            .rsplit(' ')
            .next()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0);
        *map.entry(method).or_default() += value;
    }
    Ok(c)
}
