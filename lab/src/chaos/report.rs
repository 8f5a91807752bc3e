//! What a trial leaves for a person to read: the logs of a failing trial, and what each
//! node's rebootd process was doing when a trial timed out.

use super::check::Timeline;
use super::trial::{lock, ChaosNode, Shared};
use super::ChaosOptions;
use std::path::PathBuf;
use std::sync::Arc;

/// Copy each node's rebootd log and state file, and the watchers' timelines, for a failing
/// trial.
pub(super) fn keep_logs(
    opts: &ChaosOptions,
    seed: u64,
    nodes: &[Arc<ChaosNode>],
    etcd_logs: Vec<(String, PathBuf)>,
    shared: &Shared,
) -> Option<PathBuf> {
    let base = opts.keep_logs.as_ref()?;
    let out = base.join(format!("rebootd-chaos-{}-seed-{seed}", opts.backend));
    std::fs::create_dir_all(&out).ok()?;
    for n in nodes {
        let _ = std::fs::copy(&n.log_path, out.join(format!("{}.log", n.name)));
        let _ = std::fs::copy(n.store.path(), out.join(format!("{}.state.json", n.name)));
    }
    let text = |t: Timeline| -> String {
        t.iter()
            .map(|(at, h)| format!("{:.3}s {:?}\n", at.as_secs_f64(), h))
            .collect()
    };
    let _ = std::fs::write(out.join("holders.txt"), text(shared.holders()));
    let _ = std::fs::write(out.join("cordoned.txt"), text(shared.cordoned()));
    let cuts: String = lock(&shared.cut_offs)
        .iter()
        .map(|c| {
            format!(
                "{} cut off {:.3}s - {:.3}s\n",
                c.node,
                c.from.as_secs_f64(),
                c.to.as_secs_f64()
            )
        })
        .collect();
    let _ = std::fs::write(out.join("cut-offs.txt"), cuts);
    for (member, log) in etcd_logs {
        let _ = std::fs::copy(log, out.join(format!("etcd-{member}.log")));
    }
    Some(out)
}

/// What node `n`'s rebootd process is doing, for a trial that timed out: whether the lab holds
/// the node (a kill, restart or reboot of it in progress), or the process's state and each of
/// its threads' state and kernel wait channel.
pub(super) fn process_report(n: &ChaosNode) -> String {
    let Ok(mut node) = n.node.try_lock() else {
        return "the lab holds this node: a kill, restart or reboot of it is in progress".into();
    };
    if let Some(code) = node.daemon_exit() {
        return format!("rebootd exited with {code:?}");
    }
    let Some(pid) = node.daemon_pid() else {
        return "no rebootd process".into();
    };
    let threads: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|tasks| {
            tasks
                .flatten()
                .map(|t| {
                    let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
                    let state = stat
                        .rsplit_once(')')
                        .and_then(|(_, r)| r.trim_start().chars().next())
                        .unwrap_or('?');
                    let wchan = std::fs::read_to_string(t.path().join("wchan")).unwrap_or_default();
                    format!("{state}:{}", if wchan.is_empty() { "-" } else { &wchan })
                })
                .collect()
        })
        .unwrap_or_default();
    format!("rebootd pid {pid} running, threads {}", threads.join(" "))
}
