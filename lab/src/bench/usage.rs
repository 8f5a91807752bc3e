//! What a bench costs apart from requests: CPU time of processes and of the threads that run
//! the nodes, and etcd's own counts of watch events and bytes sent.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Clock ticks per second of `/proc/*/stat` (`getconf CLK_TCK`; 100 on Linux when unknown).
fn clock_ticks() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse::<f64>().ok())
        .filter(|t| *t > 0.0)
        .unwrap_or(100.0)
}

/// utime + stime of a `/proc/.../stat` file.
fn stat_cpu(path: &Path, ticks: f64) -> Option<Duration> {
    let text = std::fs::read_to_string(path).ok()?;
    // The command name may hold spaces and parentheses: the fields follow the last ')'.
    let rest = &text[text.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // Fields 14 and 15 of stat; `rest` starts at field 3.
    let utime: f64 = f.get(11)?.parse().ok()?;
    let stime: f64 = f.get(12)?.parse().ok()?;
    Some(Duration::from_secs_f64((utime + stime) / ticks))
}

/// CPU time (user + system) of process `pid` so far.
pub fn process_cpu(pid: u32) -> Duration {
    stat_cpu(Path::new(&format!("/proc/{pid}/stat")), clock_ticks()).unwrap_or_default()
}

/// The peak resident memory of process `pid` (`VmHWM`), in bytes.
pub fn peak_rss(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kb = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse::<u64>()
        .ok()?;
    Some(kb * 1024)
}

/// CPU time of this process so far.
pub fn own_cpu() -> Duration {
    process_cpu(std::process::id())
}

/// A Tokio runtime of its own for the simulated nodes, whose threads' CPU time is counted
/// apart from the rest of the process (the stand-in, the proxy, the harness). Its threads are
/// kept alive for the run, so no thread's time is lost when it ends.
pub struct NodeRuntime {
    rt: Option<tokio::runtime::Runtime>,
    tids: Arc<Mutex<Vec<String>>>,
}

impl NodeRuntime {
    pub fn new(workers: usize) -> std::io::Result<NodeRuntime> {
        let tids: Arc<Mutex<Vec<String>>> = Arc::default();
        let t = tids.clone();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(workers)
            .thread_name("sim-node")
            .thread_keep_alive(Duration::from_secs(24 * 3600))
            .on_thread_start(move || {
                // `/proc/thread-self` -> `PID/task/TID`.
                if let Ok(link) = std::fs::read_link("/proc/thread-self") {
                    if let Some(tid) = link.file_name().and_then(|s| s.to_str()) {
                        t.lock().unwrap_or_else(|p| p.into_inner()).push(tid.into());
                    }
                }
            })
            .enable_all()
            .build()?;
        Ok(NodeRuntime { rt: Some(rt), tids })
    }

    pub fn handle(&self) -> tokio::runtime::Handle {
        match &self.rt {
            Some(rt) => rt.handle().clone(),
            None => tokio::runtime::Handle::current(),
        }
    }

    /// CPU time of the runtime's threads so far.
    pub fn cpu(&self) -> Duration {
        let ticks = clock_ticks();
        let tids = self.tids.lock().unwrap_or_else(|p| p.into_inner()).clone();
        tids.iter()
            .filter_map(|tid| stat_cpu(Path::new(&format!("/proc/self/task/{tid}/stat")), ticks))
            .sum()
    }
}

impl Drop for NodeRuntime {
    fn drop(&mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

/// etcd's counts of what it sent: v3 watch events (`etcd_debugging_mvcc_events_total`) and
/// bytes of gRPC messages to clients (`etcd_network_client_grpc_sent_bytes_total`).
#[derive(Debug, Clone, Copy, Default)]
pub struct EtcdSent {
    pub events: f64,
    pub grpc_bytes: f64,
}

impl EtcdSent {
    pub fn minus(&self, b: &EtcdSent) -> EtcdSent {
        EtcdSent {
            events: self.events - b.events,
            grpc_bytes: self.grpc_bytes - b.grpc_bytes,
        }
    }

    pub fn parse(metrics: &str) -> EtcdSent {
        let mut s = EtcdSent::default();
        for line in metrics.lines() {
            let value = || -> f64 {
                line.rsplit(' ')
                    .next()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0.0)
            };
            if line.starts_with("etcd_debugging_mvcc_events_total ") {
                s.events += value();
            } else if line.starts_with("etcd_network_client_grpc_sent_bytes_total ") {
                s.grpc_bytes += value();
            }
        }
        s
    }
}

/// [`EtcdSent`] from etcd's `/metrics` (plain http client URL).
pub async fn etcd_sent(endpoint: &str) -> Result<EtcdSent, String> {
    Ok(EtcdSent::parse(&super::util::metrics_text(endpoint).await?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_etcd_sent_counts() {
        let text = "# HELP x\netcd_debugging_mvcc_events_total 12\n\
                    etcd_network_client_grpc_sent_bytes_total 3456\n\
                    etcd_debugging_mvcc_events_totalx 9\n";
        let s = EtcdSent::parse(text);
        assert_eq!((s.events, s.grpc_bytes), (12.0, 3456.0));
    }

    #[test]
    fn own_cpu_time_is_read() {
        let spin = std::time::Instant::now();
        let mut x = 0u64;
        while spin.elapsed() < Duration::from_millis(50) {
            x = x.wrapping_add(1);
        }
        assert!(x > 0);
        assert!(own_cpu() > Duration::ZERO);
    }
}
