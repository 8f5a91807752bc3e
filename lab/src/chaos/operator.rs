//! The operator (`--operators`): beside the chaos, a person at the fleet runs `rebootctl` on the
//! nodes (the real binary, with the node's configuration and state directory): `pause` and
//! `resume` a node, `pause --group` and `resume --group`, `cancel` a node's cycle, `unlock` the
//! slot of a node that holds one, and `set-max` (without `--force`, so refused below the
//! holders). Every pause is resumed within the same action, so the rollout can complete; a
//! cycle cancelled before its reboot is started again the way the docs say a trigger does
//! (rebootd restarted: update_engine still says an update waits).
//!
//! What it did goes into [`Operations`] for the checker; the outcome of each cancel is judged
//! here, at the moment the node is idle again (see RELIABILITY.md, "Operators").

use super::check::Span;
use super::trial::{lock, ChaosNode, Shared};
use super::Rng;
use crate::kube_api::Cluster;
use futures_util::StreamExt;
use rebootd::state::{Phase, State, StateStore};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// How long a paused node or group stays paused at most.
const HOLD_MS: (u64, u64) = (300, 4000);
/// How long the operator gives a request (or the end of a cancelled cycle) to show.
const APPLY: Duration = Duration::from_secs(30);
/// How long the operator keeps trying `resume --group` (the store may be down a while).
const RESUME_TRIES: Duration = Duration::from_secs(60);

/// The rollout is not judged complete before the operator took this many actions (or all it
/// was given): a small fleet can finish within the first action (a pause held up to 4 s), and
/// an operator who never acted tests nothing.
pub(super) const AT_LEAST: usize = 3;

/// Whether the operator took [`AT_LEAST`] actions, or all `actions` it was given.
pub(super) fn acted_enough(shared: &Shared, actions: usize) -> bool {
    shared.operated.load(Ordering::SeqCst) >= actions.min(AT_LEAST)
}

/// The operator's actions: up to `actions`, each 0.2–1.5 s after the last.
pub(super) async fn operator(
    mut rng: Rng,
    actions: usize,
    rebootctl: PathBuf,
    nodes: Vec<Arc<ChaosNode>>,
    ids: Vec<(String, String)>,
    cluster: Cluster,
    shared: Arc<Shared>,
) {
    let op = Operator {
        rebootctl,
        nodes,
        ids,
        cluster,
        shared,
    };
    let mut taken = 0;
    while !op.shared.stopped() && taken < actions {
        tokio::time::sleep(rng.ms(200, 1500)).await;
        if op.shared.stopped() {
            break;
        }
        taken += 1;
        match rng.below(10) {
            0..=1 => op.pause(&mut rng).await,
            2 => op.pause_group(&mut rng).await,
            3..=4 => op.cancel(&mut rng).await,
            5..=6 => op.unlock(&mut rng).await,
            _ => op.set_max(&mut rng).await,
        }
        op.shared.operated.fetch_add(1, Ordering::SeqCst);
    }
}

struct Operator {
    rebootctl: PathBuf,
    nodes: Vec<Arc<ChaosNode>>,
    ids: Vec<(String, String)>,
    cluster: Cluster,
    shared: Arc<Shared>,
}

/// What a `rebootctl` run said.
struct Ran {
    ok: bool,
    out: String,
}

impl Operator {
    fn count(&self, what: &str) {
        self.shared
            .stats(|s| *s.operator.entry(what.to_string()).or_default() += 1);
    }

    /// `rebootctl ARGS` as node `n` (its configuration and state directory). Other jobs on the
    /// machine may use up the per-user inotify instances for a moment (rebootctl watches the
    /// request it hands over): such a run is made again, for up to 10 s.
    async fn run(&self, n: &ChaosNode, args: &[&str]) -> Ran {
        let mut ran = self.run_once(n, args).await;
        for _ in 0..40 {
            if ran.ok || !ran.out.contains("Too many open files") {
                break;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
            ran = self.run_once(n, args).await;
        }
        ran
    }

    async fn run_once(&self, n: &ChaosNode, args: &[&str]) -> Ran {
        let mut cmd = n.node.lock().await.command(&self.rebootctl);
        cmd.args(args).kill_on_drop(true);
        match tokio::time::timeout(APPLY, cmd.output()).await {
            Ok(Ok(o)) => Ran {
                ok: o.status.success(),
                out: format!(
                    "{}{}",
                    String::from_utf8_lossy(&o.stdout),
                    String::from_utf8_lossy(&o.stderr)
                ),
            },
            Ok(Err(e)) => Ran {
                ok: false,
                out: format!("rebootctl: {e}"),
            },
            Err(_) => Ran {
                ok: false,
                out: format!("rebootctl {args:?}: no answer within {APPLY:?}"),
            },
        }
    }

    /// A node that has not completed its cycle (else any node).
    fn pending(&self, rng: &mut Rng) -> Arc<ChaosNode> {
        let pending: Vec<_> = self
            .nodes
            .iter()
            .filter(|n| !state(&n.store).is_some_and(|s| super::check::done(&s)))
            .cloned()
            .collect();
        if pending.is_empty() {
            rng.pick(&self.nodes).clone()
        } else {
            rng.pick(&pending).clone()
        }
    }

    /// `pause` a node, hold, `resume` it. The pause is in force from the moment its state file
    /// says so (rebootctl waits for that, or the daemon applies it when it starts).
    async fn pause(&self, rng: &mut Rng) {
        let n = self.pending(rng);
        let ran = self.run(&n, &["pause", "--reason", "chaos operator"]).await;
        if !ran.ok {
            self.shared
                .problem(format!("{}: rebootctl pause: {}", n.name, ran.out.trim()));
            return;
        }
        let applied = wait_state(&n.store, APPLY, |s| s.paused.is_some()).await;
        let from = self.shared.elapsed();
        tokio::time::sleep(rng.ms(HOLD_MS.0, HOLD_MS.1)).await;
        let to = self.shared.elapsed();
        let ran = self.run(&n, &["resume"]).await;
        if !ran.ok {
            self.shared
                .problem(format!("{}: rebootctl resume: {}", n.name, ran.out.trim()));
        }
        if applied.is_some() {
            lock(&self.shared.ops).pauses.push(Span {
                node: n.name.clone(),
                from,
                to,
            });
            self.count("pause");
        } else {
            self.count("pause not seen applied");
        }
        if wait_state(&n.store, APPLY, |s| s.paused.is_none())
            .await
            .is_none()
        {
            self.shared
                .problem(format!("{}: still paused {APPLY:?} after resume", n.name));
        }
    }

    /// `pause --group`, hold, `resume --group` (tried again until it lands). A pause whose
    /// command failed may still have landed: it is resumed too, but not judged.
    async fn pause_group(&self, rng: &mut Rng) {
        let n = rng.pick(&self.nodes).clone();
        let ran = self
            .run(&n, &["pause", "--group", "--reason", "chaos operator"])
            .await;
        let from = self.shared.elapsed();
        tokio::time::sleep(rng.ms(HOLD_MS.0, HOLD_MS.1)).await;
        let to = self.shared.elapsed();
        let started = tokio::time::Instant::now();
        loop {
            let r = self.run(&n, &["resume", "--group"]).await;
            if r.ok {
                break;
            }
            if started.elapsed() > RESUME_TRIES {
                self.shared
                    .problem(format!("rebootctl resume --group: {}", r.out.trim()));
                break;
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        if ran.ok {
            lock(&self.shared.ops).group_pauses.push(Span {
                node: n.name.clone(),
                from,
                to,
            });
            self.count("group pause");
        } else {
            self.count("group pause failed");
        }
    }

    /// `cancel` a node's cycle. Once the request is applied and the node is idle again, its
    /// Node must not be cordoned and its state must hold no slot (judged between two reads of
    /// the state that show the same idle, so a new cycle cannot have cordoned in between). A
    /// cycle dropped before its reboot starts again by a restart of rebootd.
    async fn cancel(&self, rng: &mut Rng) {
        let n = self.pending(rng);
        let before = state(&n.store);
        let ran = self.run(&n, &["cancel"]).await;
        let at = self.shared.elapsed();
        if !ran.ok {
            // Refused: logind was asked already (or the command failed; the request, if
            // written, is applied when the daemon runs).
            self.count("cancel refused");
        }
        // The request applied (a daemon down applies it when it starts).
        let control = rebootd::control::dir(&n.store);
        if !wait_dir(&control, APPLY, dir_empty).await {
            self.shared
                .problem(format!("{}: cancel not applied within {APPLY:?}", n.name));
            return;
        }
        if !ran.ok {
            return;
        }
        let idle = |s: &State| s.phase == Phase::Idle && !s.slot_held && !s.cordoned_by_us;
        let Some(end) = wait_state(&n.store, APPLY, idle).await else {
            // A restart meanwhile started a new cycle: nothing to judge.
            self.count("cancel overtaken");
            return;
        };
        let cordoned = self
            .cluster
            .node(&n.name)
            .and_then(|v| v["spec"]["unschedulable"].as_bool())
            .unwrap_or(false);
        let again = state(&n.store);
        if again
            .as_ref()
            .is_some_and(|s| s.since == end.since && idle(s))
        {
            self.count("cancel");
            if cordoned {
                lock(&self.shared.ops).cancel_leftovers.push(format!(
                    "{}: cancelled at {:.2}s (was {}), idle again, but its Node is still cordoned",
                    n.name,
                    at.as_secs_f64(),
                    before.as_ref().map_or("?".into(), |s| s.phase.to_string())
                ));
            }
        } else {
            // A new cycle began between the two reads: nothing to judge.
            self.count("cancel overtaken");
        }
        // Not rebooted yet: the need was dropped; a restart reads update_engine again.
        if end.last_reboot.is_none() {
            let mut node = n.node.lock().await;
            if !n.down.load(Ordering::SeqCst) {
                node.kill_daemon().await;
                if let Err(e) = node.start_daemon() {
                    self.shared
                        .problem(format!("{}: restart rebootd: {e}", n.name));
                }
                self.count("cancel, then restarted");
            }
        }
    }

    /// `unlock` the slot of a node the watcher last saw holding one.
    async fn unlock(&self, rng: &mut Rng) {
        let holders: Vec<String> = self
            .shared
            .holders()
            .last()
            .map(|(_, h)| h.iter().cloned().collect())
            .unwrap_or_default();
        if holders.is_empty() {
            self.count("unlock: no holder");
            return;
        }
        let name = rng.pick(&holders).clone();
        let Some((id, _)) = self.ids.iter().find(|(_, n)| *n == name) else {
            return;
        };
        let n = rng.pick(&self.nodes).clone();
        let from = self.shared.elapsed();
        let ran = self.run(&n, &["unlock", id]).await;
        let to = self.shared.elapsed();
        if ran.ok {
            lock(&self.shared.ops).unlocks.push(Span {
                node: name,
                from,
                to,
            });
            self.count("unlock");
        } else if ran.out.contains("its reboot is on its way") {
            // Finding 16: refused without --force (the node goes down anyway).
            self.count("unlock refused: reboot on its way");
        } else {
            self.count("unlock failed");
        }
    }

    /// `set-max` to 1, 2 or 3 (refused below the holders: no `--force`).
    async fn set_max(&self, rng: &mut Rng) {
        let max = 1 + rng.below(3);
        let n = rng.pick(&self.nodes).clone();
        let ran = self.run(&n, &["set-max", &max.to_string()]).await;
        self.count(if ran.ok {
            "set-max"
        } else {
            "set-max refused or failed"
        });
    }
}

fn state(store: &StateStore) -> Option<State> {
    store.load().ok().flatten()
}

fn dir_empty(dir: &Path) -> bool {
    std::fs::read_dir(dir).map_or(true, |mut d| d.next().is_none())
}

/// Wait until the node's state file satisfies `pred` (inotify on its directory); `None` when
/// `timeout` passes first.
async fn wait_state(
    store: &StateStore,
    timeout: Duration,
    pred: impl Fn(&State) -> bool,
) -> Option<State> {
    let mut found = None;
    wait_dir(store.dir(), timeout, |_| {
        found = state(store).filter(|s| pred(s));
        found.is_some()
    })
    .await;
    found
}

/// Wait until `pred(dir)` holds, checked at once and at each change in `dir` (inotify).
async fn wait_dir(dir: &Path, timeout: Duration, mut pred: impl FnMut(&Path) -> bool) -> bool {
    use inotify::{Inotify, WatchMask};
    let _ = std::fs::create_dir_all(dir);
    // Other jobs on the machine may use up the per-user inotify instances for a moment.
    let mut inotify = Inotify::init();
    for _ in 0..40 {
        if inotify.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
        inotify = Inotify::init();
    }
    let Ok(inotify) = inotify else {
        return pred(dir);
    };
    let mask = WatchMask::MOVED_TO | WatchMask::CLOSE_WRITE | WatchMask::DELETE;
    if inotify.watches().add(dir, mask).is_err() {
        return pred(dir);
    }
    let Ok(mut events) = inotify.into_event_stream(vec![0u8; 4096]) else {
        return pred(dir);
    };
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if pred(dir) {
            return true;
        }
        match tokio::time::timeout_at(deadline, events.next()).await {
            Ok(Some(_)) => continue,
            _ => return pred(dir),
        }
    }
}
