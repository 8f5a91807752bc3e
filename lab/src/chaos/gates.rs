//! A gate that flaps (`--gates`): every node has one `[[gates.before_reboot]]` command gate, the
//! lab's script, which answers what one fleet-wide file says: `go` (exit 0), `wait` (exit 1)
//! or `hang` (it sleeps 30 s, far past the gate's 1 s time-out, then would exit 0). The lab
//! flips that answer every 0.2–1.5 s while the rollout runs (`go` at the end). Every run of the
//! script appends its start (with the answer it read) and its end (with its exit status) to a
//! log, so the checker knows every answer each node got and when (see
//! [`super::check::gate_violations`]).

use super::check::GateRun;
use super::trial::Shared;
use super::Rng;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// The gate's time-out in the nodes' configuration, and how often a gate that says wait is
/// asked again.
pub const TIMEOUT: Duration = Duration::from_secs(1);
pub const INTERVAL: Duration = Duration::from_secs(1);

const SCRIPT: &str = r#"#!/bin/sh
# The chaos lab's gate: answers what the file "answer" beside it says; logs every run.
d=$(dirname "$0")
n="$1"
a=$(cat "$d/answer" 2>/dev/null || echo wait)
echo "$(date +%s.%N) $n $$ start $a" >> "$d/runs.log"
case "$a" in
go) echo "$(date +%s.%N) $n $$ end 0" >> "$d/runs.log"; exit 0 ;;
hang) sleep 30; echo "$(date +%s.%N) $n $$ end 0" >> "$d/runs.log"; exit 0 ;;
*) echo "$(date +%s.%N) $n $$ end 1" >> "$d/runs.log"; echo "the lab's gate says wait" >&2; exit 1 ;;
esac
"#;

/// Write the gate's script (answer `go`) in `dir`; returns the script's path.
pub fn setup(dir: &Path) -> Result<PathBuf, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("gate dir: {e}"))?;
    let script = dir.join("gate.sh");
    std::fs::write(&script, SCRIPT).map_err(|e| format!("gate script: {e}"))?;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755))
        .map_err(|e| format!("gate script: {e}"))?;
    set(dir, "go")?;
    Ok(script)
}

/// A node's configuration fragment for the gate.
pub fn toml(script: &Path, node: &str) -> String {
    format!(
        "\n[gates]\ninterval = \"{}s\"\n\n[[gates.before_reboot]]\nname = \"lab gate\"\ncommand = [{:?}, {node:?}]\ntimeout = \"{}ms\"\n",
        INTERVAL.as_secs(),
        script.display().to_string(),
        TIMEOUT.as_millis()
    )
}

fn set(dir: &Path, answer: &str) -> Result<(), String> {
    let tmp = dir.join("answer.tmp");
    std::fs::write(&tmp, answer).map_err(|e| format!("gate answer: {e}"))?;
    std::fs::rename(&tmp, dir.join("answer")).map_err(|e| format!("gate answer: {e}"))
}

/// Flip the answer until the chaos stops (`go` 55 %, `wait` 30 %, `hang` 15 %), then `go`.
pub(super) async fn flap(mut rng: Rng, dir: PathBuf, shared: Arc<Shared>) {
    while !shared.stopped() {
        tokio::time::sleep(rng.ms(200, 1500)).await;
        let answer = match rng.below(20) {
            0..=10 => "go",
            11..=16 => "wait",
            _ => "hang",
        };
        if let Err(e) = set(&dir, answer) {
            shared.problem(e);
        }
        shared.stats(|s| *s.gates.entry(format!("set {answer}")).or_default() += 1);
    }
    if let Err(e) = set(&dir, "go") {
        shared.problem(e);
    }
}

/// Every run of the gate the log shows, in the trial's time (the log's wall clock since
/// `started`).
pub fn runs(dir: &Path, started: jiff::Timestamp) -> Vec<GateRun> {
    let log = std::fs::read_to_string(dir.join("runs.log")).unwrap_or_default();
    let at = |t: &str| -> Option<Duration> {
        let secs: f64 = t.parse().ok()?;
        let wall = jiff::Timestamp::from_nanosecond((secs * 1e9) as i128).ok()?;
        Duration::try_from(wall.duration_since(started)).ok()
    };
    let mut out: Vec<(String, GateRun)> = Vec::new();
    for line in log.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 5 {
            continue;
        }
        let (Some(t), node, pid) = (at(f[0]), f[1], f[2]) else {
            continue;
        };
        match f[3] {
            "start" => out.push((
                pid.to_string(),
                GateRun {
                    node: node.to_string(),
                    start: t,
                    answer: f[4].to_string(),
                    end: None,
                },
            )),
            "end" => {
                let code = f[4].parse().unwrap_or(-1);
                if let Some((_, r)) = out
                    .iter_mut()
                    .rev()
                    .find(|(p, r)| p == pid && r.node == node && r.end.is_none())
                {
                    r.end = Some((t, code));
                }
            }
            _ => {}
        }
    }
    out.into_iter().map(|(_, r)| r).collect()
}

/// The gate's runs at the end of a trial (with its time-out), counted in the stats with what
/// the nodes' logs say (`said wait`).
pub(super) fn observe(
    dir: &Path,
    nodes: &[Arc<super::trial::ChaosNode>],
    shared: &Shared,
) -> (Vec<GateRun>, Duration) {
    let runs = runs(dir, shared.started_wall);
    for n in nodes {
        let log = std::fs::read_to_string(&n.log_path).unwrap_or_default();
        let said_wait = log.matches("waiting for gate").count() as u32;
        shared.stats(|s| *s.gates.entry("said wait".into()).or_default() += said_wait);
    }
    let hung = runs.iter().filter(|r| r.end.is_none()).count() as u32;
    shared.stats(|s| {
        *s.gates.entry("runs".into()).or_default() += runs.len() as u32;
        *s.gates.entry("runs killed".into()).or_default() += hung;
    });
    (runs, TIMEOUT)
}
