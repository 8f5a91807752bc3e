//! Idle cost of one real `rebootd` process: the etcd backend and drain (`[kubernetes]`, the API
//! stand-in) configured, no reboot needed. After start-up (READY=1 plus a settle time) it reads
//! RSS (`VmRSS` in /proc/PID/status), CPU time (utime + stime in /proc/PID/stat) and counts the
//! requests that reach etcd (its /metrics counters) and the API stand-in (its request log) over
//! the idle period.

use super::util;
use crate::etcd::{EtcdOptions, EtcdServer};
use crate::kube_api::{KubeApi, NodeBuilder, Options as KubeOptions};
use crate::locksmith::{LocksmithEtcd, LocksmithNode};
use crate::node::{Node, NodeOptions};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// How long to stay idle after start-up.
    #[arg(long, default_value = "10m", value_parser = rebootd::config::parse_duration)]
    duration: Duration,
    /// After READY=1: time allowed for start-up to finish before counting.
    #[arg(long, default_value = "5s", value_parser = rebootd::config::parse_duration)]
    settle: Duration,
    /// How often to sample RSS and CPU.
    #[arg(long, default_value = "30s", value_parser = rebootd::config::parse_duration)]
    sample: Duration,
    /// etcd version: 3.4 or 3.5.
    #[arg(long, default_value = "3.4")]
    etcd: String,
    /// The rebootd binary (default: beside this one).
    #[arg(long)]
    rebootd: Option<PathBuf>,
    /// RUST_LOG of the rebootd process.
    #[arg(long, default_value = "info")]
    log: String,
    /// Also run a real locksmithd, idle, on the same etcd (started with the v2 API) and compare
    /// its RSS with rebootd's (goal: rebootd at most 0.75 x locksmithd's).
    #[arg(long)]
    locksmithd: bool,
}

fn rebootd_binary(given: Option<PathBuf>) -> PathBuf {
    given
        .or_else(|| {
            std::env::current_exe()
                .ok()
                .and_then(|p| p.parent().map(|d| d.join("rebootd")))
        })
        .unwrap_or_else(|| PathBuf::from("rebootd"))
}

/// The pid of the rebootd process whose command line names `dir` (the node's config files).
fn find_pid(dir: &Path) -> Option<u32> {
    let needle = dir.to_string_lossy().into_owned();
    for e in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(cmd) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let cmd = String::from_utf8_lossy(&cmd);
        let argv0 = cmd.split('\0').next().unwrap_or("");
        if argv0.ends_with("/rebootd") && cmd.contains(&needle) {
            return Some(pid);
        }
    }
    None
}

#[derive(Debug, Clone, Copy)]
struct Sample {
    rss_kb: u64,
    hwm_kb: u64,
    /// utime + stime, in clock ticks (USER_HZ = 100 on Linux).
    cpu_ticks: u64,
    threads: u64,
}

fn sample(pid: u32) -> Result<Sample, String> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .map_err(|e| format!("/proc/{pid}/status: {e}"))?;
    let field = |name: &str| -> u64 {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map_err(|e| format!("/proc/{pid}/stat: {e}"))?;
    // Fields after the command name (which is in parentheses and may hold spaces).
    let rest: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, r)| r.split_whitespace().collect())
        .unwrap_or_default();
    // rest[0] is field 3 (state): utime is field 14, stime 15.
    let num = |i: usize| rest.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    Ok(Sample {
        rss_kb: field("VmRSS:"),
        hwm_kb: field("VmHWM:"),
        cpu_ticks: num(11) + num(12),
        threads: field("Threads:"),
    })
}

/// The resident set of process `pid` (kB), if it is alive.
pub fn rss_kb(pid: u32) -> Option<u64> {
    sample(pid).ok().map(|s| s.rss_kb).filter(|&kb| kb > 0)
}

pub async fn run(a: Args) -> Result<(), String> {
    let rebootd = rebootd_binary(a.rebootd.clone());
    if !rebootd.exists() {
        return Err(format!("no rebootd binary at {}", rebootd.display()));
    }
    // The lab node passes this on as RUST_LOG.
    std::env::set_var("REBOOTD_LAB_LOG", &a.log);
    let v = util::parse_etcd(&a.etcd)?;
    let options = if a.locksmithd {
        EtcdOptions::v2()
    } else {
        EtcdOptions::default()
    };
    let etcd = EtcdServer::start_with(v, options)
        .await
        .map_err(|e| e.to_string())?;
    let api = KubeApi::start(KubeOptions::default())
        .await
        .map_err(|e| e.to_string())?;
    let name = "idle-1";
    api.cluster()
        .add(&NodeBuilder::new(name))
        .map_err(|e| e.to_string())?;
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let kc = dir.path().join("kubeconfig");
    api.write_kubeconfig(&kc).map_err(|e| e.to_string())?;
    println!(
        "{} ({}) at {}; API stand-in at {}; rebootd {} (RUST_LOG={})",
        v,
        etcd.binaries().version,
        etcd.endpoint(),
        api.base_url(),
        rebootd.display(),
        a.log
    );
    let config = format!(
        "[lock]\nbackend = \"etcd\"\n\n[lock.etcd]\nendpoints = [{ep:?}]\n\n\
         [kubernetes]\nkubeconfig = {kc:?}\n",
        ep = etcd.endpoint()
    );
    let locksmith = match a.locksmithd {
        true => {
            let n =
                LocksmithNode::start("idle-locksmithd", LocksmithEtcd::new(&etcd.endpoint(), ""))
                    .await
                    .map_err(|e| e.to_string())?;
            println!("locksmithd (real, idle) pid {:?} on the same etcd", n.pid());
            Some(n)
        }
        false => None,
    };
    let e0 = util::etcd_counters(&etcd.endpoint()).await?;
    let node = Node::start(&rebootd, NodeOptions::new(name).config(&config))
        .await
        .map_err(|e| e.to_string())?;
    let started = Instant::now();
    node.wait_ready(Duration::from_secs(30))
        .await
        .map_err(|e| e.to_string())?;
    let ready_after = started.elapsed();
    tokio::time::sleep(a.settle).await;
    let pid = find_pid(node.dir()).ok_or("cannot find the rebootd process")?;
    let e1 = util::etcd_counters(&etcd.endpoint()).await?;
    let startup_api = api.cluster().requests().all();
    let s1 = sample(pid)?;
    println!(
        "start-up: READY=1 after {:.0} ms; pid {pid}; after settle: RSS {} kB (peak {} kB), CPU {} ticks, {} threads",
        ready_after.as_secs_f64() * 1000.0,
        s1.rss_kb,
        s1.hwm_kb,
        s1.cpu_ticks,
        s1.threads
    );
    println!(
        "start-up requests: etcd {:.0} [{}]; API stand-in {}",
        e1.minus(&e0).requests(),
        e1.minus(&e0).describe(1.0),
        describe_api(&startup_api)
    );
    let t1 = Instant::now();
    let mut max_rss = s1.rss_kb;
    while t1.elapsed() < a.duration {
        let left = a.duration.saturating_sub(t1.elapsed());
        tokio::time::sleep(left.min(a.sample)).await;
        let s = sample(pid)?;
        max_rss = max_rss.max(s.rss_kb);
        println!(
            "  t+{:>5.0}s RSS {} kB, CPU {} ticks",
            t1.elapsed().as_secs_f64(),
            s.rss_kb,
            s.cpu_ticks
        );
    }
    let idle = t1.elapsed();
    let s2 = sample(pid)?;
    let e2 = util::etcd_counters(&etcd.endpoint()).await?;
    let all = api.cluster().requests().all();
    let idle_api: Vec<_> = all.iter().skip(startup_api.len()).cloned().collect();
    let cpu_ms = (s2.cpu_ticks - s1.cpu_ticks) as f64 * 10.0;
    let pid_rebootd = pid;
    if let Some(n) = &locksmith {
        let pid = n.pid().ok_or("locksmithd is not running")?;
        let ls = sample(pid)?;
        println!(
            "locksmithd (same run, idle {:.0}s): RSS {} kB ({:.2} MB), VmHWM {} kB, {} threads, CPU {} ticks since start",
            idle.as_secs_f64(),
            ls.rss_kb,
            ls.rss_kb as f64 / 1024.0,
            ls.hwm_kb,
            ls.threads,
            ls.cpu_ticks
        );
        for (who, pid) in [("rebootd", pid_rebootd), ("locksmithd", pid)] {
            println!("  {who}: {}", rss_split(pid));
        }
        let ratio = s2.rss_kb as f64 / ls.rss_kb as f64;
        println!(
            "rebootd RSS / locksmithd RSS: {ratio:.3} (goal <= 0.75: {})",
            if ratio <= 0.75 { "met" } else { "MISSED" }
        );
    }
    println!("idle {:.0}s:", idle.as_secs_f64());
    println!(
        "  RSS end {} kB ({:.2} MB), highest sampled {} kB, VmHWM {} kB; goal <= 12 MB: {}",
        s2.rss_kb,
        s2.rss_kb as f64 / 1024.0,
        max_rss,
        s2.hwm_kb,
        if s2.rss_kb as f64 / 1024.0 <= 12.0 {
            "met"
        } else {
            "MISSED"
        }
    );
    println!(
        "  CPU time while idle: {:.0} ms ({:.4}% of one core); total since start {} ms",
        cpu_ms,
        cpu_ms / (idle.as_secs_f64() * 1000.0) * 100.0,
        s2.cpu_ticks * 10
    );
    let de = e2.minus(&e1);
    println!(
        "  etcd requests while idle: {:.0} [{}]",
        de.requests(),
        de.describe(1.0)
    );
    println!(
        "  API stand-in requests while idle: {}",
        describe_api(&idle_api)
    );
    let non_watch = idle_api.iter().filter(|r| !is_watch(r)).count();
    println!(
        "  goal: zero requests after start-up apart from watches: {}",
        if non_watch == 0 && de.started.keys().all(|k| k == "Watch") {
            "met"
        } else {
            "MISSED"
        }
    );
    drop(node);
    Ok(())
}

/// `RssAnon`, `RssFile` and `RssShmem` of `pid` (allocated memory vs mapped files, mostly the
/// binary's own code pages).
fn rss_split(pid: u32) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .filter(|l| {
            l.starts_with("RssAnon") || l.starts_with("RssFile") || l.starts_with("RssShmem")
        })
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect::<Vec<_>>()
        .join(", ")
}

fn is_watch(r: &crate::kube_api::RequestRecord) -> bool {
    r.query
        .split('&')
        .any(|kv| kv == "watch=true" || kv == "watch=1")
}

fn describe_api(records: &[crate::kube_api::RequestRecord]) -> String {
    let mut by: BTreeMap<String, usize> = BTreeMap::new();
    for r in records {
        let kind = if is_watch(r) { " (watch)" } else { "" };
        *by.entry(format!("{} {}{}", r.method, r.path, kind))
            .or_default() += 1;
    }
    if by.is_empty() {
        return "0".into();
    }
    let list: Vec<String> = by.iter().map(|(k, n)| format!("{n}x {k}")).collect();
    format!("{} [{}]", records.len(), list.join("; "))
}
