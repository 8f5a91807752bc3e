//! The invariants of a chaos trial, as pure functions of what the trial observed
//! ([`Observed`]): the trial fills it from its outside watchers, the simulated reboots and the
//! reads it makes at the end; the tests below fill it with synthetic histories that break each
//! invariant, to show that [`violations`] reports every one.

use super::two_docs::{self, DocSeen, DocsEnd};
use rebootd::lock::document::SemaphoreDoc;
use rebootd::state::{Phase, State};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// Sets seen by an outside watcher (holders of the semaphore, cordoned Nodes), in order, with
/// the time since the trial started.
pub type Timeline = Vec<(Duration, BTreeSet<String>)>;

/// How many instants a violation message lists at most.
const LIST_MAX: usize = 5;

/// One simulated reboot (the moment the machine went down).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Down {
    pub at: Duration,
    pub node: String,
    /// Whether the node held a slot then, when it could be read at that instant (Leases,
    /// in-process); `None`: decide from the holders' timeline.
    pub held: Option<bool>,
    /// Workload pods still bound to the node when it went down (`namespace/name`).
    pub pods_left: Vec<String>,
}

/// A time a node was cut off from the store (its traffic to it through the lab's proxy).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CutOff {
    pub node: String,
    pub from: Duration,
    /// When the proxy forwarded again.
    pub to: Duration,
}

/// A slot taken over: `from` left the holders and `by` came in, in one change the outside
/// watcher saw (a release and a take are two changes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reclaim {
    pub at: Duration,
    pub from: String,
    pub by: String,
}

/// How far the outside watchers may lag the store (and the proxy's records the watchers).
const WATCH_LAG: Duration = Duration::from_secs(2);

/// The semaphore as read at the end of the trial.
#[derive(Debug, Clone, PartialEq)]
pub enum SemaphoreEnd {
    Etcd(SemaphoreDoc),
    /// Leases with a holder, as `lease=holder`.
    Leases(Vec<String>),
    Unreadable(String),
}

/// Everything the invariants are checked on.
#[derive(Debug, Clone)]
pub struct Observed {
    pub max: u64,
    pub nodes: Vec<String>,
    /// Every holder set the outside watcher saw.
    pub holders: Timeline,
    /// Every set of cordoned Nodes the outside watcher saw.
    pub cordoned: Timeline,
    pub downs: Vec<Down>,
    /// Each node's state file at the end (`Ok(None)`: there is none).
    pub ends: BTreeMap<String, Result<Option<State>, String>>,
    /// The rollout had not completed within this trial timeout.
    pub timed_out: Option<Duration>,
    /// Nodes unschedulable at the end.
    pub left_cordoned: Vec<String>,
    pub semaphore_end: SemaphoreEnd,
    /// ReplicaSets not back at their desired ready replicas at the end (described).
    pub workload_unsettled: Vec<String>,
    /// Pods deleted directly over the API rather than evicted (described requests).
    pub pod_deletes: Vec<String>,
    /// What went wrong in the lab itself.
    pub harness: Vec<String>,
    /// rebootd's `lock.max_hold` in the trial.
    pub max_hold: Option<Duration>,
    /// When nodes were cut off from the store.
    pub cut_offs: Vec<CutOff>,
    /// At a time-out: what each node's rebootd process was doing (see
    /// `trial::process_report`), to tell a hung rebootd from one that was not running.
    pub processes: BTreeMap<String, String>,
    /// Every reboot call logind accepted, by node (several may lead to one reboot).
    pub calls: Vec<(String, Duration)>,
    /// When each simulated reboot ended (the node's next boot started), by node.
    pub ups: Vec<(String, Duration)>,
    /// The document's `max` at each revision the outside watcher saw (etcd), recorded just
    /// before that revision's holder set.
    pub maxes: Vec<(Duration, u64)>,
    /// What the operator did (`--operators`); `None`: no operator in the trial.
    pub ops: Option<Operations>,
    /// The semaphore's document and rebootd's holder records as the outside watchers saw them
    /// change, with the store's revision (etcd v3) or index (v2), which orders them (etcd).
    pub store: Vec<StoreEvent>,
    /// Each node's maintenance windows (`--windows`), open on `[from, to)`, in the trial's
    /// time: its configured windows on its own clock, placed by that clock's offset.
    pub windows: BTreeMap<String, Vec<(Duration, Duration)>>,
    /// Every run of the nodes' flapping gate (`--gates`), with its time-out; `None`: no gate.
    pub gate_runs: Option<(Vec<GateRun>, Duration)>,
    /// Every query of the nodes' Prometheus alert gate (`--gates`), as gate runs (exit 0: no
    /// firing alert), with its time-out; `None`: no alert gate.
    pub alert_runs: Option<(Vec<GateRun>, Duration)>,
    /// With `rebootctl migrate` mid-rollout (`--migrate`): the v2 and the v3 document as their
    /// watchers saw them, and as read at the end ([`super::two_docs`]).
    pub docs: Option<(Vec<DocSeen>, DocsEnd)>,
    /// The nodes' zones and `max_per_zone` (`--zones`); `None`: no zones.
    pub zoning: Option<super::zones::Zoning>,
}

/// One run of a node's gate command: when it started, the answer it read, and when it ended
/// with which exit status (`None`: it never ended, killed at its time-out).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GateRun {
    pub node: String,
    pub start: Duration,
    pub answer: String,
    pub end: Option<(Duration, i32)>,
}

/// How much longer than its time-out a gate run may take and still count (the script's own
/// clock readings and the process's exit, under load).
pub const GATE_SLACK: Duration = Duration::from_millis(500);

/// The reboots that passed a gate saying wait: for the first call of each shutdown, the node's
/// decision is its last gate run that started after its previous boot and before the call. It
/// must have ended before the call, with exit 0 (`go`), within the gate's time-out (a run past
/// it is killed and says wait). None at all is a reboot that never asked its gate.
pub fn gate_violations(o: &Observed) -> Vec<String> {
    let mut v = Vec::new();
    if let Some((runs, timeout)) = &o.gate_runs {
        v.extend(passed_wait(o, runs, *timeout, ("a gate", "gate")));
    }
    if let Some((runs, timeout)) = &o.alert_runs {
        v.extend(passed_wait(
            o,
            runs,
            *timeout,
            ("the alert gate", "alert gate"),
        ));
    }
    v
}

/// [`gate_violations`] for one gate's runs (`what`: how the messages name it).
fn passed_wait(
    o: &Observed,
    runs: &[GateRun],
    timeout: Duration,
    (a, what): (&str, &str),
) -> Vec<String> {
    let timeout = &timeout;
    let mut v = Vec::new();
    let secs = |d: Duration| format!("{:.2}s", d.as_secs_f64());
    for (n, call, down) in first_calls(o) {
        let prev_up = o
            .ups
            .iter()
            .filter(|(m, t)| *m == n && *t <= down)
            .map(|(_, t)| *t)
            .max()
            .unwrap_or_default();
        let last = runs
            .iter()
            .filter(|r| r.node == n && r.start > prev_up && r.start <= call)
            .max_by_key(|r| r.start);
        let Some(r) = last else {
            v.push(format!(
                "{n} asked logind to reboot at {} without asking its {what}",
                secs(call)
            ));
            continue;
        };
        let why = match r.end {
            None => Some("it never ended (killed at its time-out: wait)".to_string()),
            Some((end, _)) if end > call => {
                Some(format!("it ended at {}, after the call", secs(end)))
            }
            Some((_, code)) if code != 0 => Some(format!("it said wait (exit {code})")),
            Some((end, _)) if end - r.start > *timeout + GATE_SLACK => Some(format!(
                "it ran {:.2}s, past its time-out of {timeout:?} (wait)",
                (end - r.start).as_secs_f64()
            )),
            Some(_) => None,
        };
        if let Some(why) = why {
            v.push(format!(
                "{n} asked logind to reboot at {} past {a} that said wait: its last {what} run, at {} (answer {}), {why}",
                secs(call),
                secs(r.start),
                r.answer
            ));
        }
    }
    v
}

/// How long after its window closed a node's reboot call may still reach logind: rebootd
/// checks the window in the step before the call (then proves its slot, lists the inhibitors
/// and records a Kubernetes event), and the lab sees the call when logind has it.
pub const WINDOW_LATE: Duration = Duration::from_secs(1);

/// The reboots whose call came outside the node's windows, as `(node, call, how)`: the first
/// call of each shutdown (calls re-made while it is pending join it), judged by the node's own
/// windows: before one opened (allowing 50 ms for the clocks' readings), or more than
/// [`WINDOW_LATE`] after one closed.
pub fn outside_windows(o: &Observed) -> Vec<(String, Duration, String)> {
    let early = Duration::from_millis(50);
    let mut out = Vec::new();
    for (n, call, _) in first_calls(o) {
        let Some(w) = o.windows.get(&n) else {
            continue;
        };
        if w.iter()
            .any(|(f, t)| *f <= call + early && call < *t + WINDOW_LATE)
        {
            continue;
        }
        let last = w.iter().filter(|(_, t)| *t <= call).map(|(_, t)| *t).max();
        let next = w.iter().filter(|(f, _)| *f > call).map(|(f, _)| *f).min();
        let how = format!(
            "its last window closed {}, the next opens {}",
            last.map_or("never".into(), |t| format!("at {:.2}s", t.as_secs_f64())),
            next.map_or("never".into(), |t| format!("at {:.2}s", t.as_secs_f64()))
        );
        out.push((n, call, how));
    }
    out
}

/// A change of the store, as an outside watcher saw it (see [`Observed::store`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreEvent {
    pub at: Duration,
    /// etcd's revision (v3) or index (v2) of the change.
    pub rev: i64,
    pub change: StoreChange,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreChange {
    /// The document, with its holders.
    Holders(BTreeSet<String>),
    /// A node's holder record written (`put`) or deleted.
    Record { node: String, put: bool },
}

/// A span of time an operator's command was in force, on a node (or run from it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Span {
    pub node: String,
    pub from: Duration,
    pub to: Duration,
}

/// What the operator actor did, as the invariants need it (see `operator.rs`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Operations {
    /// `rebootctl pause` of `node`: from the moment its state file said paused (rebootctl
    /// waits for that) until `rebootctl resume` was run.
    pub pauses: Vec<Span>,
    /// `rebootctl pause --group`: from the moment the command returned (its write landed)
    /// until `rebootctl resume --group` was run.
    pub group_pauses: Vec<Span>,
    /// `rebootctl unlock <node's id>`: from when it was run until it returned.
    pub unlocks: Vec<Span>,
    /// Cancelled cycles found with something left behind once the node was idle again
    /// (described): its Node cordoned, or its slot held.
    pub cancel_leftovers: Vec<String>,
}

/// Idle again after a reboot, slot released, not cordoned.
pub fn done(s: &State) -> bool {
    s.phase == Phase::Idle && s.last_reboot.is_some() && !s.slot_held && !s.cordoned_by_us
}

/// The largest set in a timeline.
pub fn peak(t: &Timeline) -> usize {
    t.iter().map(|(_, s)| s.len()).max().unwrap_or(0)
}

/// Whether the watcher's history shows `name` holding a slot at `at`: in the last holder set
/// seen at or before `at`, or (the watcher may lag the store a little) in one seen within 2 s
/// after it.
pub fn held_at(history: &Timeline, name: &str, at: Duration) -> bool {
    let before = history.iter().rev().find(|(t, _)| *t <= at);
    if before.is_some_and(|(_, h)| h.contains(name)) {
        return true;
    }
    history
        .iter()
        .filter(|(t, _)| *t > at && *t <= at + Duration::from_secs(2))
        .any(|(_, h)| h.contains(name))
}

/// The slots taken over in a holders' timeline (see [`Reclaim`]).
pub fn reclaims(history: &Timeline) -> Vec<Reclaim> {
    let mut out = Vec::new();
    let empty = BTreeSet::new();
    let mut prev = &empty;
    for (at, now) in history {
        let gone: Vec<&String> = prev.difference(now).collect();
        let came: Vec<&String> = now.difference(prev).collect();
        for (from, by) in gone.iter().zip(came.iter()) {
            out.push(Reclaim {
                at: *at,
                from: (*from).clone(),
                by: (*by).clone(),
            });
        }
        prev = now;
    }
    out
}

/// Whether reclaiming `r` is what `max_hold` allows: its holder had stopped, that is it was cut
/// off from the store from at least `max_hold / 2` before the reclaim until it (allowing for
/// the watcher's lag). A live holder beats every `max_hold / 8`, and a reclaimer waits for
/// `max_hold` of silence by its own clock, so a reclaim of a holder cut off for less is one of a
/// holder that was alive. Two cuts less than a beat apart count as one: in between, the holder
/// had no beat due (and its connections to make again).
pub fn reclaim_allowed(o: &Observed, r: &Reclaim) -> bool {
    let Some(max_hold) = o.max_hold else {
        return false;
    };
    cut_spans(&o.cut_offs, &r.from, max_hold / 8)
        .iter()
        .any(|(from, to)| *from + max_hold / 2 <= r.at && r.at <= *to + WATCH_LAG)
}

/// The cuts of `node`, in order, those less than `gap` apart merged.
fn cut_spans(cuts: &[CutOff], node: &str, gap: Duration) -> Vec<(Duration, Duration)> {
    let mut spans: Vec<(Duration, Duration)> = cuts
        .iter()
        .filter(|c| c.node == node)
        .map(|c| (c.from, c.to))
        .collect();
    spans.sort();
    let mut merged: Vec<(Duration, Duration)> = Vec::new();
    for (from, to) in spans {
        match merged.last_mut() {
            Some(last) if from <= last.1 + gap => last.1 = last.1.max(to),
            _ => merged.push((from, to)),
        }
    }
    merged
}

/// The cordoned Nodes that count at each instant: all of them but the ones whose slot was
/// reclaimed, as `max_hold` allows, from a holder that had stopped (cut off from the store), from
/// the reclaim until that node holds a slot again. Such a node cannot uncordon before it hears
/// from the store (it is cut off), and it must not go on to reboot (its fence fails): it is no
/// longer in flight. Every other cordoned Node counts.
pub fn cordoned_in_flight(o: &Observed) -> Timeline {
    let mut parked: Vec<(String, Duration, Duration)> = reclaims(&o.holders)
        .into_iter()
        .filter(|r| reclaim_allowed(o, r))
        .map(|r| {
            let until = o
                .holders
                .iter()
                .find(|(t, h)| *t > r.at && h.contains(&r.from))
                .map_or(Duration::MAX, |(t, _)| *t);
            (r.from, r.at, until)
        })
        .collect();
    // A node whose slot the operator unlocked is out of flight the same way, from the unlock
    // until it holds a slot again: its cordon stays until it finds out, and its fence fails.
    for u in o.ops.iter().flat_map(|ops| &ops.unlocks) {
        if let Some((_, back)) = unlocked_until(o, u) {
            parked.push((u.node.clone(), u.from, back));
        }
    }
    o.cordoned
        .iter()
        .map(|(at, set)| {
            let counted = set
                .iter()
                .filter(|n| {
                    !parked
                        .iter()
                        .any(|(p, from, until)| p == *n && *from <= *at && *at < *until)
                })
                .cloned()
                .collect();
            (*at, counted)
        })
        .collect()
}

/// The `max` in force at `at`: with an operator (who may run `rebootctl set-max`), the
/// document's as the watcher last saw it at or before `at`; else the trial's.
pub fn max_at(o: &Observed, at: Duration) -> u64 {
    if o.ops.is_none() {
        return o.max;
    }
    o.maxes
        .iter()
        .rev()
        .find(|(t, _)| *t <= at)
        .map_or(o.max, |(_, m)| *m)
}

/// The largest `max` in force at any moment within the watchers' lag before `at`: what a set of
/// cordons or of nodes down seen at `at` is judged by (it may be seen up to that late).
pub fn max_around(o: &Observed, at: Duration) -> u64 {
    let from = at.saturating_sub(WATCH_LAG);
    let mut m = max_at(o, from);
    if o.ops.is_some() {
        for (t, v) in &o.maxes {
            if *t > from && *t <= at {
                m = m.max(*v);
            }
        }
    }
    m
}

/// For each `rebootctl unlock` of a node that held a slot: the store revision of the document
/// without it, the first seen from the unlock's start on, and the revision at which it was
/// among the holders again (`i64::MAX`: never). `None` when no such document was seen.
pub fn unlocked_revisions(o: &Observed, u: &Span) -> Option<(i64, i64)> {
    let holders = |e: &StoreEvent| match &e.change {
        StoreChange::Holders(h) => Some(h.contains(&u.node)),
        StoreChange::Record { .. } => None,
    };
    let gone = o
        .store
        .iter()
        .find(|e| e.at >= u.from && holders(e) == Some(false))?;
    let back = o
        .store
        .iter()
        .filter(|e| e.rev > gone.rev && holders(e) == Some(true))
        .map(|e| e.rev)
        .min()
        .unwrap_or(i64::MAX);
    Some((gone.rev, back))
}

/// The holder records a node wrote after `rebootctl unlock` took its slot, before it held a
/// slot again, as `(node, revision of the unlock, revision of the write)`: in the store's own
/// order, a phase report (which proves the slot held: rebootd then sends no other proof before
/// its logind call) or a heartbeat that landed on a slot that was gone.
pub fn record_after_unlock(o: &Observed) -> Vec<(String, i64, i64)> {
    let Some(ops) = &o.ops else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for u in &ops.unlocks {
        let Some((gone, back)) = unlocked_revisions(o, u) else {
            continue;
        };
        for e in &o.store {
            if let StoreChange::Record { node, put: true } = &e.change {
                if *node == u.node && e.rev > gone && e.rev < back {
                    out.push((node.clone(), gone, e.rev));
                }
            }
        }
    }
    out
}

/// The reboots of nodes whose slot the operator unlocked while the reboot was on its way, as
/// `(node, down)`: the node went down after the unlock began, without a slot taken again and
/// without a boot in between. rebootd proves its slot before the logind call, but a proof and
/// the call cannot be one step: an unlock that lands between them (or after logind accepted)
/// gives away a slot in use, and the node goes down without it beside the node that took the
/// slot. These reboots are not counted as down without a slot nor among the nodes down at once
/// (the trials count them, `unlock of a reboot on its way`). A node that proved its slot after
/// the unlock is caught by [`record_after_unlock`] (a report, which writes its record) or would
/// need a read that says it holds a slot it does not (etcd's reads are linearizable).
pub fn unlocked_on_its_way(o: &Observed) -> Vec<(String, Duration)> {
    let Some(ops) = &o.ops else {
        return Vec::new();
    };
    let calls = first_calls(o);
    let mut out = Vec::new();
    for u in &ops.unlocks {
        let Some((_, back)) = unlocked_until(o, u) else {
            continue;
        };
        for d in &o.downs {
            if d.node != u.node || d.at < u.from {
                continue;
            }
            let booted_between = o
                .ups
                .iter()
                .any(|(m, t)| *m == d.node && *t > u.from && *t < d.at);
            // Its call came before the unlock returned: the reboot was on its way, whatever
            // the node did meanwhile (a restart that found the slot gone backs out, and may
            // take a slot again and give it back before logind's shutdown comes).
            let called_before = calls
                .iter()
                .any(|(n, c, down)| *n == d.node && *down == d.at && *c < u.to);
            if !booted_between && (back > d.at || called_before) {
                out.push((d.node.clone(), d.at));
            }
        }
    }
    out
}

/// The nodes down (from a simulated reboot until the next boot started) at each reboot, but
/// the reboots [`unlocked_on_its_way`].
pub fn down_at_once(o: &Observed) -> Timeline {
    let exempt = unlocked_on_its_way(o);
    let up_after = |node: &str, at: Duration| {
        o.ups
            .iter()
            .filter(|(n, t)| n == node && *t >= at)
            .map(|(_, t)| *t)
            .min()
            .unwrap_or(Duration::MAX)
    };
    let mut downs: Vec<&Down> = o
        .downs
        .iter()
        .filter(|d| !exempt.iter().any(|(n, at)| *n == d.node && *at == d.at))
        .collect();
    downs.sort_by_key(|d| d.at);
    downs
        .iter()
        .map(|d| {
            let set = downs
                .iter()
                .filter(|e| e.at <= d.at && up_after(&e.node, e.at) > d.at)
                .map(|e| e.node.clone())
                .collect();
            (d.at, set)
        })
        .collect()
}

/// For each simulated reboot, the reboot call that led to it: the node's first call after its
/// previous reboot ended (calls re-made while a shutdown is pending join it), as
/// `(node, call, down)`; the moment it went down when no call was recorded.
pub fn first_calls(o: &Observed) -> Vec<(String, Duration, Duration)> {
    o.downs
        .iter()
        .map(|d| {
            let prev_up = o
                .ups
                .iter()
                .filter(|(n, t)| *n == d.node && *t <= d.at)
                .map(|(_, t)| *t)
                .max()
                .unwrap_or_default();
            let call = o
                .calls
                .iter()
                .filter(|(n, t)| *n == d.node && *t > prev_up && *t <= d.at)
                .map(|(_, t)| *t)
                .min()
                .unwrap_or(d.at);
            (d.node.clone(), call, d.at)
        })
        .collect()
}

/// Each time a node came into the holders (it was not in the set seen before), as `(at, node)`.
pub fn takes(history: &Timeline) -> Vec<(Duration, String)> {
    let empty = BTreeSet::new();
    let mut prev = &empty;
    let mut out = Vec::new();
    for (at, now) in history {
        for n in now.difference(prev) {
            out.push((*at, n.clone()));
        }
        prev = now;
    }
    out
}

/// After `rebootctl unlock` of `u.node`: the first holder set seen from `u.from` on without it
/// (the unlock, or an earlier release), and the first set after that with it again (a new slot;
/// `Duration::MAX`: none). `None` when no set without it was seen.
pub fn unlocked_until(o: &Observed, u: &Span) -> Option<(Duration, Duration)> {
    let (gone, _) = o
        .holders
        .iter()
        .find(|(t, h)| *t >= u.from && !h.contains(&u.node))?;
    let back = o
        .holders
        .iter()
        .find(|(t, h)| *t > *gone && h.contains(&u.node))
        .map_or(Duration::MAX, |(t, _)| *t);
    Some((*gone, back))
}

/// What the operator's commands must not have led to (see RELIABILITY.md, "Operators").
fn operator_violations(o: &Observed, ops: &Operations, v: &mut Vec<String>) {
    let calls = first_calls(o);
    let takes = takes(&o.holders);
    let secs = |d: Duration| format!("{:.2}s", d.as_secs_f64());
    for p in &ops.pauses {
        for (n, call, _) in &calls {
            if *n == p.node && p.from < *call && *call < p.to {
                v.push(format!(
                    "{n} asked logind to reboot at {} while paused ({} to {})",
                    secs(*call),
                    secs(p.from),
                    secs(p.to)
                ));
            }
        }
        for (at, n) in &takes {
            if *n == p.node && p.from + WATCH_LAG < *at && *at < p.to {
                v.push(format!(
                    "{n} took a slot at {} while paused ({} to {})",
                    secs(*at),
                    secs(p.from),
                    secs(p.to)
                ));
            }
        }
    }
    for g in &ops.group_pauses {
        for (at, n) in &takes {
            if g.from + WATCH_LAG < *at && *at < g.to {
                v.push(format!(
                    "{n} took a slot at {} while the group was paused ({} to {})",
                    secs(*at),
                    secs(g.from),
                    secs(g.to)
                ));
            }
        }
    }
    for (n, gone, rev) in record_after_unlock(o) {
        v.push(format!(
            "{n} wrote its holder record at revision {rev} after rebootctl unlock took its slot (revision {gone}), without a new slot: a proof of a slot it did not hold"
        ));
    }
    v.extend(ops.cancel_leftovers.iter().cloned());
}

/// The instants of a timeline with more members than `max_at` allows then, listed.
fn over_by(t: &Timeline, max_at: impl Fn(Duration) -> u64) -> String {
    let over: Vec<String> = t
        .iter()
        .filter(|(at, s)| s.len() as u64 > max_at(*at))
        .map(|(at, s)| format!("{:.2}s {:?}", at.as_secs_f64(), s))
        .collect();
    let more = over.len().saturating_sub(LIST_MAX);
    let mut text = over
        .into_iter()
        .take(LIST_MAX)
        .collect::<Vec<_>>()
        .join(", ");
    if more > 0 {
        text.push_str(&format!(" and {more} more"));
    }
    text
}

fn describe(name: &str, s: &State) -> String {
    format!(
        "{name}: {} (slot {}, cordoned by us {}, last error {:?}, waiting for {:?})",
        s.phase, s.slot_held, s.cordoned_by_us, s.last_error, s.waiting_for
    )
}

/// Every invariant that does not hold, in words (empty: the trial passed).
pub fn violations(o: &Observed) -> Vec<String> {
    let mut v = super::zones::violations(o);
    // Liveness.
    if let Some(limit) = o.timed_out {
        let stuck: Vec<String> = o
            .nodes
            .iter()
            .filter_map(|n| match o.ends.get(n) {
                Some(Ok(Some(s))) if done(s) => None,
                Some(Ok(Some(s))) => Some(match o.processes.get(n) {
                    Some(p) => format!("{} [{p}]", describe(n, s)),
                    None => describe(n, s),
                }),
                Some(Err(e)) => Some(format!("{n}: state file: {e}")),
                _ => Some(format!("{n}: no state file")),
            })
            .collect();
        v.push(format!(
            "rollout not complete after {limit:?}: {}",
            stuck.join("; ")
        ));
    }
    // Safety, from the outside watchers.
    // The max in force (with an operator's set-max, it changes): the document's at each
    // revision for its holders; within the watchers' lag for cordons and nodes down.
    let worst = |t: &Timeline, max: &dyn Fn(Duration) -> u64| {
        t.iter()
            .filter(|(at, s)| s.len() as u64 > max(*at))
            .map(|(at, s)| (s.len(), max(*at)))
            .max()
    };
    let held_max = |at: Duration| max_at(o, at);
    let around = |at: Duration| max_around(o, at);
    if let Some((n, max)) = worst(&o.holders, &held_max) {
        v.push(format!(
            "{n} holders at once (max {max}): {}",
            over_by(&o.holders, held_max)
        ));
    }
    let in_flight = cordoned_in_flight(o);
    if let Some((n, max)) = worst(&in_flight, &around) {
        v.push(format!(
            "{n} nodes cordoned at once (max {max}): {}",
            over_by(&in_flight, around)
        ));
    }
    let down = down_at_once(o);
    if let Some((n, max)) = worst(&down, &around) {
        v.push(format!(
            "{n} nodes down at once (max {max}): {}",
            over_by(&down, around)
        ));
    }
    if let Some(ops) = &o.ops {
        operator_violations(o, ops, &mut v);
    }
    v.extend(gate_violations(o));
    if let Some((seen, end)) = &o.docs {
        v.extend(two_docs::violations(seen, end));
    }
    for (n, call, how) in outside_windows(o) {
        v.push(format!(
            "{n} asked logind to reboot at {:.2}s outside its maintenance windows ({how})",
            call.as_secs_f64()
        ));
    }
    // A slot is taken over only from a holder that stopped, and only with max_hold.
    for r in reclaims(&o.holders) {
        if reclaim_allowed(o, &r) {
            continue;
        }
        let why = match o.max_hold {
            None => "without lock.max_hold".to_string(),
            Some(m) => format!(
                "while {} was live (not cut off from the store for max_hold/2 = {:?} before)",
                r.from,
                m / 2
            ),
        };
        v.push(format!(
            "{}'s slot was taken over by {} at {:.2}s {why}",
            r.from,
            r.by,
            r.at.as_secs_f64()
        ));
    }
    // Every node rebooted exactly once, and says so (a node whose reboot was on its way when
    // the operator unlocked its slot may count it as one outside its control).
    let on_its_way = unlocked_on_its_way(o);
    for n in &o.nodes {
        let r = o.downs.iter().filter(|d| &d.node == n).count();
        if r != 1 {
            v.push(format!("{n} rebooted {r} times (expected once)"));
        }
        match o.ends.get(n) {
            Some(Ok(Some(s))) if o.timed_out.is_none() => {
                // Or whose slot the operator unlocked between its call and its reboot (the
                // reboot then lands in a cycle of its own: "outside rebootd's control").
                let unlocked = on_its_way.iter().any(|(m, _)| m == n)
                    || o.ops.iter().flat_map(|ops| &ops.unlocks).any(|u| {
                        u.node == *n
                            && first_calls(o)
                                .iter()
                                .any(|(m, c, d)| m == n && *c < u.to && u.from < *d)
                    });
                if s.reboots != 1 && !(unlocked && s.reboots == 0) {
                    v.push(format!(
                        "{n}: state counts {} coordinated reboots (expected 1)",
                        s.reboots
                    ));
                }
                if !done(s) {
                    v.push(format!(
                        "{n}: ended in {} (slot {}, cordoned {})",
                        s.phase, s.slot_held, s.cordoned_by_us
                    ));
                }
            }
            Some(Err(e)) if o.timed_out.is_none() => v.push(format!("{n}: state file: {e}")),
            _ => {}
        }
    }
    // A node goes down only while it holds a slot, and drained (but a reboot on its way when
    // the operator unlocked its slot: rebootd backs out of its drain after a restart that finds
    // the slot gone, while logind's shutdown is still pending).
    for d in &o.downs {
        let unlocked = on_its_way.iter().any(|(n, at)| *n == d.node && *at == d.at);
        let held = d.held.unwrap_or_else(|| held_at(&o.holders, &d.node, d.at)) || unlocked;
        if !held {
            v.push(format!(
                "{} went down at {:.2}s without holding a slot",
                d.node,
                d.at.as_secs_f64()
            ));
        }
        if !d.pods_left.is_empty() && !unlocked {
            v.push(format!(
                "{} went down at {:.2}s with {} pods still on it (drain incomplete): {}",
                d.node,
                d.at.as_secs_f64(),
                d.pods_left.len(),
                d.pods_left.join(", ")
            ));
        }
    }
    // Nothing left behind.
    for n in &o.left_cordoned {
        v.push(format!("{n} left cordoned"));
    }
    match &o.semaphore_end {
        SemaphoreEnd::Etcd(doc) => {
            let max = o
                .maxes
                .last()
                .filter(|_| o.ops.is_some())
                .map_or(o.max, |m| m.1);
            if !doc.holders.is_empty() || doc.semaphore != max as i64 {
                v.push(format!("semaphore at the end: {}", doc.to_json()));
            }
        }
        SemaphoreEnd::Leases(held) => {
            if !held.is_empty() {
                v.push(format!("slots held at the end: {}", held.join(", ")));
            }
        }
        SemaphoreEnd::Unreadable(e) => v.push(format!("cannot read the semaphore at the end: {e}")),
    }
    // The workload came back, and was only ever evicted.
    for w in &o.workload_unsettled {
        v.push(format!("workload not back at the end: {w}"));
    }
    for d in &o.pod_deletes {
        v.push(format!("pod deleted directly, not evicted: {d}"));
    }
    v.extend(o.harness.iter().map(|p| format!("harness: {p}")));
    v
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    fn set(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    fn s(secs: f64) -> Duration {
        Duration::from_secs_f64(secs)
    }

    fn done_state() -> State {
        let mut st = State::new("boot-2", jiff::Timestamp::now());
        st.last_reboot = Some(jiff::Timestamp::now());
        st.reboots = 1;
        st
    }

    /// A clean trial of 3 nodes with max 2: a, b together, then c.
    pub(in crate::chaos) fn clean() -> Observed {
        let nodes: Vec<String> = ["a", "b", "c"].iter().map(|n| n.to_string()).collect();
        let down = |at: f64, node: &str| Down {
            at: s(at),
            node: node.to_string(),
            held: None,
            pods_left: Vec::new(),
        };
        Observed {
            max: 2,
            holders: vec![
                (s(1.0), set(&["a"])),
                (s(1.1), set(&["a", "b"])),
                (s(3.0), set(&["b"])),
                (s(3.1), set(&["b", "c"])),
                (s(3.5), set(&["c"])),
                (s(5.0), set(&[])),
            ],
            cordoned: vec![
                (s(1.2), set(&["a"])),
                (s(1.3), set(&["a", "b"])),
                (s(2.9), set(&["b"])),
                (s(3.2), set(&["b", "c"])),
                (s(3.4), set(&["c"])),
                (s(4.9), set(&[])),
            ],
            downs: vec![down(2.0, "a"), down(2.1, "b"), down(4.0, "c")],
            ends: nodes
                .iter()
                .map(|n| (n.clone(), Ok(Some(done_state()))))
                .collect(),
            nodes,
            timed_out: None,
            left_cordoned: Vec::new(),
            semaphore_end: SemaphoreEnd::Etcd(SemaphoreDoc {
                semaphore: 2,
                max: 2,
                holders: Vec::new(),
            }),
            workload_unsettled: Vec::new(),
            pod_deletes: Vec::new(),
            harness: Vec::new(),
            max_hold: None,
            cut_offs: Vec::new(),
            processes: BTreeMap::new(),
            calls: vec![
                ("a".into(), s(1.9)),
                ("b".into(), s(2.0)),
                ("c".into(), s(3.9)),
            ],
            ups: vec![
                ("a".into(), s(2.3)),
                ("b".into(), s(2.4)),
                ("c".into(), s(4.3)),
            ],
            maxes: Vec::new(),
            ops: None,
            store: Vec::new(),
            windows: BTreeMap::new(),
            gate_runs: None,
            alert_runs: None,
            docs: None,
            zoning: None,
        }
    }

    /// [`clean`] with node c a locksmithd node: no state file, its reboot seen only through
    /// its holder in the document and its call to logind.
    fn mixed() -> Observed {
        let mut o = clean();
        let ls = "locksmith-1";
        let rename = |t: &mut Timeline| {
            for (_, set) in t.iter_mut() {
                if set.remove("c") {
                    set.insert(ls.into());
                }
            }
        };
        rename(&mut o.holders);
        o.cordoned.retain(|(_, c)| !c.contains("c"));
        o.ends.remove("c");
        for n in o
            .nodes
            .iter_mut()
            .chain(o.downs.iter_mut().map(|d| &mut d.node))
        {
            if n == "c" {
                *n = ls.into();
            }
        }
        for (n, _) in o.calls.iter_mut().chain(o.ups.iter_mut()) {
            if n == "c" {
                *n = ls.into();
            }
        }
        o
    }

    #[test]
    fn a_mixed_fleet_that_keeps_max_passes() {
        assert_eq!(violations(&mixed()), Vec::<String>::new());
    }

    #[test]
    fn a_locksmithd_node_down_beside_max_rebootd_nodes_is_reported() {
        let mut o = mixed();
        // locksmith-1 takes a slot and goes down while a and b are still down: the document
        // shows three holders, and three nodes are down at once across both kinds.
        o.holders
            .insert(2, (s(2.15), set(&["a", "b", "locksmith-1"])));
        o.downs.push(Down {
            at: s(2.2),
            node: "locksmith-1".into(),
            held: None,
            pods_left: Vec::new(),
        });
        o.downs
            .retain(|d| d.node != "locksmith-1" || d.at == s(2.2));
        o.calls.push(("locksmith-1".into(), s(2.16)));
        o.ups.retain(|(n, _)| n != "locksmith-1");
        o.ups.push(("locksmith-1".into(), s(2.5)));
        let v = violations(&o);
        assert!(
            v.iter()
                .any(|m| m.contains("3 nodes down at once (max 2): 2.20s")),
            "{v:#?}"
        );
        assert!(v.iter().any(|m| m.contains("3 holders at once")), "{v:#?}");
    }

    #[test]
    fn a_locksmithd_node_that_never_rebooted_is_reported() {
        let mut o = mixed();
        o.downs.retain(|d| d.node != "locksmith-1");
        reports(&o, "locksmith-1 rebooted 0 times");
    }

    #[test]
    fn a_migration_with_a_take_in_v3_while_v2_is_open_is_reported() {
        use super::two_docs::{Api, DocSeen, DocsEnd};
        let mut o = clean();
        let doc = |at: f64, api: Api, h: &[&str]| DocSeen {
            at: s(at),
            api,
            holders: Some(set(h)),
        };
        o.docs = Some((
            vec![
                doc(1.0, Api::V2, &["a"]),
                doc(1.5, Api::V3, &["a"]),
                doc(3.0, Api::V3, &["a", "b"]),
            ],
            DocsEnd {
                v2_open: true,
                v3_exists: true,
            },
        ));
        let v = violations(&o);
        assert!(v.iter().any(|m| m.contains("took a slot in v3")), "{v:#?}");
        assert!(
            v.iter()
                .any(|m| m.contains("two live semaphores at the end")),
            "{v:#?}"
        );
    }

    /// `o` breaks exactly one invariant, reported with `words`.
    fn reports(o: &Observed, words: &str) {
        let v = violations(o);
        assert_eq!(v.len(), 1, "{v:#?}");
        assert!(v[0].contains(words), "{:?} should say {words:?}", v[0]);
    }

    #[test]
    fn a_clean_history_passes() {
        assert_eq!(violations(&clean()), Vec::<String>::new());
    }

    #[test]
    fn three_holders_with_max_two_are_reported() {
        let mut o = clean();
        o.holders.insert(2, (s(1.5), set(&["a", "b", "c"])));
        reports(&o, "3 holders at once (max 2): 1.50s {\"a\", \"b\", \"c\"}");
    }

    #[test]
    fn three_cordoned_with_max_two_are_reported() {
        let mut o = clean();
        o.cordoned.insert(2, (s(1.4), set(&["a", "b", "c"])));
        reports(&o, "3 nodes cordoned at once (max 2): 1.40s");
    }

    #[test]
    fn a_node_rebooted_twice_is_reported() {
        let mut o = clean();
        o.downs.push(Down {
            at: s(3.3),
            node: "b".into(),
            held: None,
            pods_left: Vec::new(),
        });
        reports(&o, "b rebooted 2 times (expected once)");
    }

    #[test]
    fn a_node_never_rebooted_is_reported() {
        let mut o = clean();
        o.downs.retain(|d| d.node != "c");
        reports(&o, "c rebooted 0 times");
    }

    #[test]
    fn a_state_file_counting_two_reboots_is_reported() {
        let mut o = clean();
        let mut st = done_state();
        st.reboots = 2;
        o.ends.insert("a".into(), Ok(Some(st)));
        reports(&o, "a: state counts 2 coordinated reboots");
    }

    #[test]
    fn a_node_left_cordoned_is_reported() {
        let mut o = clean();
        o.left_cordoned.push("c".into());
        reports(&o, "c left cordoned");
    }

    #[test]
    fn a_slot_left_held_is_reported_for_both_backends() {
        let mut o = clean();
        o.semaphore_end = SemaphoreEnd::Etcd(SemaphoreDoc {
            semaphore: 1,
            max: 2,
            holders: vec!["c".into()],
        });
        reports(&o, "semaphore at the end:");
        o.semaphore_end = SemaphoreEnd::Leases(vec!["rebootd-0=c".into()]);
        reports(&o, "slots held at the end: rebootd-0=c");
        o.semaphore_end = SemaphoreEnd::Unreadable("timed out".into());
        reports(&o, "cannot read the semaphore at the end: timed out");
    }

    #[test]
    fn a_node_ending_with_its_slot_is_reported() {
        let mut o = clean();
        let mut st = done_state();
        st.slot_held = true;
        o.ends.insert("b".into(), Ok(Some(st)));
        reports(&o, "b: ended in idle (slot true, cordoned false)");
    }

    #[test]
    fn a_reboot_without_a_slot_is_reported() {
        let mut o = clean();
        // c went down at 4.0 s; drop it from the holder sets around then.
        o.holders.retain(|(_, h)| !h.contains("c"));
        reports(&o, "c went down at 4.00s without holding a slot");
        // Read in-process (Leases), the instant's answer wins over the timeline.
        let mut o = clean();
        o.downs[0].held = Some(false);
        reports(&o, "a went down at 2.00s without holding a slot");
    }

    #[test]
    fn a_reboot_with_pods_left_is_reported() {
        let mut o = clean();
        o.downs[1].pods_left = vec!["shop/db-x".into()];
        reports(&o, "b went down at 2.10s with 1 pods still on it");
    }

    #[test]
    fn a_stalled_rollout_is_reported_once_with_the_stuck_nodes() {
        let mut o = clean();
        let mut st = done_state();
        st.phase = Phase::Rebooting;
        st.slot_held = true;
        st.reboots = 0;
        o.ends.insert("c".into(), Ok(Some(st)));
        o.downs.retain(|d| d.node != "c");
        o.timed_out = Some(Duration::from_secs(150));
        let v = violations(&o);
        assert_eq!(v.len(), 2, "{v:#?}");
        assert!(v[0].starts_with("rollout not complete after 150s: c: rebooting (slot true"));
        o.processes
            .insert("c".into(), "rebootd pid 7 running".into());
        let v = violations(&o);
        assert!(
            v[0].contains("c: rebooting (slot true") && v[0].contains("[rebootd pid 7 running]")
        );
        assert!(v[1].contains("c rebooted 0 times"));
    }

    #[test]
    fn workload_and_harness_problems_are_reported() {
        let mut o = clean();
        o.workload_unsettled.push("shop/web: 9 of 10 ready".into());
        reports(&o, "workload not back at the end: shop/web: 9 of 10 ready");
        let mut o = clean();
        o.pod_deletes
            .push("DELETE /api/v1/namespaces/shop/pods/web-1".into());
        reports(&o, "pod deleted directly, not evicted");
        let mut o = clean();
        o.harness.push("etcd restart: boom".into());
        reports(&o, "harness: etcd restart: boom");
    }

    /// `clean()` with max_hold 20 s, where c, cut off from the store from 0.5 s to 30 s while
    /// holding and cordoned, has its slot taken over by b at 21 s; b then cordons beside a and
    /// c. c gets its slot back at 32 s (after uncordoning at 31 s), and reboots.
    fn reclaimed() -> Observed {
        let mut o = clean();
        o.max_hold = Some(s(20.0));
        o.cut_offs = vec![CutOff {
            node: "c".into(),
            from: s(0.5),
            to: s(30.0),
        }];
        o.holders = vec![
            (s(0.2), set(&["c"])),
            (s(1.0), set(&["a", "c"])),
            (s(21.0), set(&["a", "b"])),
            (s(25.0), set(&["b"])),
            (s(28.0), set(&[])),
            (s(32.0), set(&["c"])),
            (s(35.0), set(&[])),
        ];
        o.cordoned = vec![
            (s(0.3), set(&["c"])),
            (s(1.2), set(&["a", "c"])),
            (s(21.5), set(&["a", "b", "c"])),
            (s(24.9), set(&["b", "c"])),
            (s(27.9), set(&["c"])),
            (s(31.0), set(&[])),
            (s(32.5), set(&["c"])),
            (s(34.9), set(&[])),
        ];
        o.downs = vec![
            Down {
                at: s(22.0),
                node: "a".into(),
                held: None,
                pods_left: Vec::new(),
            },
            Down {
                at: s(23.0),
                node: "b".into(),
                held: None,
                pods_left: Vec::new(),
            },
            Down {
                at: s(33.0),
                node: "c".into(),
                held: None,
                pods_left: Vec::new(),
            },
        ];
        o.calls = vec![
            ("a".into(), s(21.9)),
            ("b".into(), s(22.9)),
            ("c".into(), s(32.9)),
        ];
        o.ups = vec![
            ("a".into(), s(22.3)),
            ("b".into(), s(23.3)),
            ("c".into(), s(33.3)),
        ];
        o
    }

    #[test]
    fn a_reclaim_of_a_holder_cut_off_for_max_hold_passes_and_its_cordon_does_not_count() {
        let o = reclaimed();
        assert_eq!(
            reclaims(&o.holders),
            vec![Reclaim {
                at: s(21.0),
                from: "c".into(),
                by: "b".into()
            }]
        );
        assert_eq!(violations(&o), Vec::<String>::new());
        assert_eq!(peak(&cordoned_in_flight(&o)), 2);
    }

    #[test]
    fn a_reclaim_of_a_live_holder_is_reported() {
        // Cut off only 5 s before the reclaim: it was beating until then.
        let mut o = reclaimed();
        o.cut_offs[0].from = s(16.0);
        let v = violations(&o);
        assert!(
            v.iter()
                .any(|v| v.starts_with("c's slot was taken over by b at 21.00s while c was live")),
            "{v:#?}"
        );
        // And its cordon then counts: three live nodes in flight.
        assert!(
            v.iter()
                .any(|v| v.starts_with("3 nodes cordoned at once (max 2): 21.50s")),
            "{v:#?}"
        );
        // Never cut off at all, or no max_hold.
        let mut o = reclaimed();
        o.cut_offs.clear();
        assert!(violations(&o)
            .iter()
            .any(|v| v.contains("while c was live")));
        let mut o = reclaimed();
        o.max_hold = None;
        assert!(violations(&o)
            .iter()
            .any(|v| v.contains("taken over by b at 21.00s without lock.max_hold")));
    }

    #[test]
    fn two_cuts_less_than_a_beat_apart_count_as_one() {
        // Cut from 0.5 s to 15 s, then again from 16 s: the reclaim at 21 s is of a node that
        // had one second to reach the store, less than a beat (2.5 s).
        let mut o = reclaimed();
        o.cut_offs = vec![
            CutOff {
                node: "c".into(),
                from: s(0.5),
                to: s(15.0),
            },
            CutOff {
                node: "c".into(),
                from: s(16.0),
                to: s(30.0),
            },
        ];
        assert_eq!(violations(&o), Vec::<String>::new());
        // Four seconds between them: it had a beat due and the store to take it.
        o.cut_offs[0].to = s(12.0);
        assert!(violations(&o)
            .iter()
            .any(|v| v.contains("c's slot was taken over by b at 21.00s while c was live")));
    }

    #[test]
    fn a_third_live_node_cordoned_beside_a_reclaimed_one_is_reported() {
        let mut o = reclaimed();
        o.cordoned.insert(3, (s(22.5), set(&["a", "b", "c", "d"])));
        reports(
            &o,
            "3 nodes cordoned at once (max 2): 22.50s {\"a\", \"b\", \"d\"}",
        );
        // A reclaimed node that holds a slot again counts again.
        let mut o = reclaimed();
        o.cordoned.insert(6, (s(32.2), set(&["a", "b", "c"])));
        reports(&o, "3 nodes cordoned at once (max 2): 32.20s");
    }

    #[test]
    fn a_reclaimed_node_going_down_without_its_slot_is_reported() {
        let mut o = reclaimed();
        o.downs.push(Down {
            at: s(26.0),
            node: "c".into(),
            held: None,
            pods_left: Vec::new(),
        });
        let v = violations(&o);
        assert!(
            v.iter()
                .any(|v| v == "c went down at 26.00s without holding a slot"),
            "{v:#?}"
        );
    }

    #[test]
    fn held_at_reads_the_watchers_history() {
        let h = vec![
            (s(1.0), set(&["a"])),
            (s(2.0), set(&["a", "b"])),
            (s(10.0), set(&["b"])),
        ];
        assert!(held_at(&h, "a", s(5.0)));
        assert!(held_at(&h, "b", s(2.0)));
        // Seen a little later: the watcher lags the store.
        assert!(held_at(&h, "b", s(1.5)));
        assert!(!held_at(&h, "a", s(11.0)));
        assert!(!held_at(&h, "c", s(5.0)));
    }

    fn span(node: &str, from: f64, to: f64) -> Span {
        Span {
            node: node.into(),
            from: s(from),
            to: s(to),
        }
    }

    /// `clean()` with an operator who did nothing.
    fn operated() -> Observed {
        let mut o = clean();
        o.ops = Some(Operations::default());
        o.maxes = o.holders.iter().map(|(t, _)| (*t, 2)).collect();
        o
    }

    #[test]
    fn an_operator_who_did_nothing_passes() {
        assert_eq!(violations(&operated()), Vec::<String>::new());
    }

    #[test]
    fn three_nodes_down_at_once_with_max_two_are_reported() {
        let mut o = clean();
        // c goes down while a and b are still down (their boots end later).
        o.ups = vec![
            ("a".into(), s(4.5)),
            ("b".into(), s(4.6)),
            ("c".into(), s(4.3)),
        ];
        reports(&o, "3 nodes down at once (max 2): 4.00s");
    }

    #[test]
    fn a_paused_node_taking_a_slot_or_calling_logind_is_reported() {
        // c paused from 0.5 s to 3.0 s: it takes its slot at 3.1 s, after the resume: fine.
        let mut o = operated();
        o.ops.as_mut().unwrap().pauses.push(span("c", 0.5, 3.05));
        assert_eq!(violations(&o), Vec::<String>::new());
        // Paused until 3.5 s: the take at 3.1 s is more than the watcher's lag after 0.5 s.
        o.ops.as_mut().unwrap().pauses[0].to = s(3.5);
        reports(&o, "c took a slot at 3.10s while paused (0.50s to 3.50s)");
        // Paused from 2.0 s: within the lag of the take, but its reboot call at 3.9 s is not.
        let mut o = operated();
        o.ops.as_mut().unwrap().pauses.push(span("c", 2.0, 3.95));
        reports(
            &o,
            "c asked logind to reboot at 3.90s while paused (2.00s to 3.95s)",
        );
    }

    #[test]
    fn a_slot_taken_while_the_group_is_paused_is_reported() {
        // Paused from 0.5 s: b's take at 1.1 s is within the watcher's lag (it may have
        // landed before), c's at 3.1 s is not.
        let mut o = operated();
        o.ops
            .as_mut()
            .unwrap()
            .group_pauses
            .push(span("a", 0.5, 3.5));
        reports(
            &o,
            "c took a slot at 3.10s while the group was paused (0.50s to 3.50s)",
        );
        // Resumed at 3.05 s: fine.
        o.ops.as_mut().unwrap().group_pauses[0].to = s(3.05);
        assert_eq!(violations(&o), Vec::<String>::new());
    }

    #[test]
    fn a_record_written_after_an_unlock_without_a_new_slot_is_reported() {
        // The store: c takes (rev 10), writes its record (11), the operator's unlock (12), c
        // writes its record again (13: a report that "proves" the slot), a takes (14).
        let ev = |at: f64, rev: i64, change: StoreChange| StoreEvent {
            at: s(at),
            rev,
            change,
        };
        let rec = |n: &str| StoreChange::Record {
            node: n.into(),
            put: true,
        };
        let mut o = operated();
        o.store = vec![
            ev(3.1, 10, StoreChange::Holders(set(&["b", "c"]))),
            ev(3.15, 11, rec("c")),
            ev(3.35, 12, StoreChange::Holders(set(&["b"]))),
            ev(3.36, 13, rec("c")),
            ev(3.37, 14, StoreChange::Holders(set(&["a", "b"]))),
        ];
        o.ops.as_mut().unwrap().unlocks.push(span("c", 3.3, 3.4));
        reports(&o, "c wrote its holder record at revision 13 after rebootctl unlock took its slot (revision 12), without a new slot");
        // Its record written before the unlock only: fine.
        o.store.remove(3);
        assert_eq!(violations(&o), Vec::<String>::new());
        // Written again after a new take: fine.
        o.store
            .push(ev(3.5, 15, StoreChange::Holders(set(&["a", "c"]))));
        o.store.push(ev(3.6, 16, rec("c")));
        assert_eq!(violations(&o), Vec::<String>::new());
    }

    #[test]
    fn the_max_in_force_is_the_documents_and_a_cordon_of_an_unlocked_node_does_not_count() {
        // set-max 3 at 1.0 s: three holders are fine, not four.
        let mut o = operated();
        o.max = 2;
        o.maxes = vec![(s(1.0), 3), (s(4.0), 2)];
        o.holders.insert(2, (s(1.5), set(&["a", "b", "c"])));
        assert_eq!(violations(&o), Vec::<String>::new());
        // Down to 1 at 1.4 s (as the document said then): three are too many.
        o.maxes = vec![(s(1.0), 3), (s(1.4), 1), (s(1.6), 2)];
        reports(&o, "3 holders at once (max 1): 1.50s");
        // Nodes cordoned are judged by the largest max within the lag.
        let mut o = operated();
        o.maxes = vec![(s(0.0), 2), (s(3.6), 1), (s(10.0), 2)];
        o.cordoned.insert(5, (s(3.7), set(&["b", "c"])));
        assert_eq!(violations(&o), Vec::<String>::new());
        o.cordoned.push((s(5.8), set(&["b", "c"])));
        reports(&o, "2 nodes cordoned at once (max 1): 5.80s");
        // An unlocked node's cordon does not count until it holds a slot again.
        let mut o = operated();
        o.cordoned.insert(3, (s(3.15), set(&["a", "b", "c"])));
        reports(&o, "3 nodes cordoned at once (max 2)");
        o.ops.as_mut().unwrap().unlocks.push(span("a", 2.5, 2.6));
        assert_eq!(violations(&o), Vec::<String>::new());
    }

    #[test]
    fn a_cancel_leaving_a_cordon_is_reported() {
        let mut o = operated();
        o.ops.as_mut().unwrap().cancel_leftovers.push(
            "b: cancelled at 1.00s (was draining), idle again, but its Node is still cordoned"
                .into(),
        );
        reports(&o, "its Node is still cordoned");
    }

    #[test]
    fn an_unlock_of_a_reboot_on_its_way_is_not_a_reboot_without_a_slot() {
        // c called logind at 3.9 s; the operator unlocked its slot from 3.8 s to 3.95 s and a
        // took it at 3.96 s: c goes down at 4.0 s without its slot, beside a and b.
        let mut o = operated();
        o.holders.insert(5, (s(3.93), set(&[])));
        o.holders.insert(6, (s(3.96), set(&["a"])));
        o.holders.insert(7, (s(3.97), set(&["a", "b"])));
        o.ups = vec![
            ("a".into(), s(4.5)),
            ("b".into(), s(4.6)),
            ("c".into(), s(4.3)),
        ];
        o.calls.push(("a".into(), s(3.98)));
        o.calls.push(("b".into(), s(3.99)));
        o.downs.push(Down {
            at: s(4.01),
            node: "a".into(),
            held: None,
            pods_left: Vec::new(),
        });
        o.downs.push(Down {
            at: s(4.02),
            node: "b".into(),
            held: None,
            pods_left: Vec::new(),
        });
        o.downs.retain(|d| d.at > s(3.0));
        o.nodes = vec!["c".into(), "a".into(), "b".into()];
        let unlock = span("c", 3.8, 3.95);
        o.ops.as_mut().unwrap().unlocks.push(unlock);
        assert_eq!(unlocked_on_its_way(&o), vec![("c".to_string(), s(4.0))]);
        assert_eq!(violations(&o), Vec::<String>::new());
        // Without the unlock, c's reboot is one without a slot, and one too many down.
        o.ops.as_mut().unwrap().unlocks.clear();
        let v = violations(&o);
        assert!(
            v.iter()
                .any(|v| v.contains("c went down at 4.00s without holding a slot")),
            "{v:?}"
        );
        assert!(
            v.iter()
                .any(|v| v.contains("3 nodes down at once (max 2): 4.02s")),
            "{v:?}"
        );
    }

    #[test]
    fn a_reboot_outside_the_nodes_windows_is_reported() {
        let mut o = clean();
        // a called at 1.9 s, b at 2.0 s, c at 3.9 s.
        o.windows.insert("a".into(), vec![(s(1.0), s(3.0))]);
        o.windows
            .insert("b".into(), vec![(s(0.5), s(0.9)), (s(5.0), s(8.0))]);
        o.windows
            .insert("c".into(), vec![(s(1.0), s(2.0)), (s(3.95), s(6.0))]);
        // b: closed at 0.9 s, more than a second before its call.
        reports(&o, "b asked logind to reboot at 2.00s outside its maintenance windows (its last window closed at 0.90s, the next opens at 5.00s)");
        // Within the allowance after a close: fine; c's call 50 ms before its window opened
        // too (the clocks' readings).
        o.windows.insert("b".into(), vec![(s(0.5), s(1.2))]);
        assert_eq!(violations(&o), Vec::<String>::new());
        o.windows.insert("c".into(), vec![(s(3.96), s(6.0))]);
        reports(&o, "c asked logind to reboot at 3.90s outside its maintenance windows (its last window closed never, the next opens at 3.96s)");
    }

    #[test]
    fn a_reboot_past_a_gate_that_said_wait_is_reported() {
        let run = |node: &str, start: f64, answer: &str, end: Option<(f64, i32)>| GateRun {
            node: node.into(),
            start: s(start),
            answer: answer.into(),
            end: end.map(|(t, c)| (s(t), c)),
        };
        // a called at 1.9 s, b at 2.0 s, c at 3.9 s; each asked its gate just before.
        let mut o = clean();
        let good = vec![
            run("a", 0.5, "wait", Some((0.51, 1))),
            run("a", 1.8, "go", Some((1.81, 0))),
            run("b", 1.9, "go", Some((1.91, 0))),
            run("c", 3.0, "hang", None),
            run("c", 3.8, "go", Some((3.81, 0))),
        ];
        o.gate_runs = Some((good.clone(), s(1.0)));
        assert_eq!(violations(&o), Vec::<String>::new());
        // c's last run said wait.
        let mut runs = good.clone();
        runs[4] = run("c", 3.8, "wait", Some((3.81, 1)));
        o.gate_runs = Some((runs, s(1.0)));
        reports(&o, "c asked logind to reboot at 3.90s past a gate that said wait: its last gate run, at 3.80s (answer wait), it said wait (exit 1)");
        // c's last run hung, and was killed (or went past its time-out and was taken as go).
        let mut runs = good.clone();
        runs.remove(4);
        o.gate_runs = Some((runs.clone(), s(1.0)));
        reports(&o, "(answer hang), it never ended");
        runs[3] = run("c", 2.0, "hang", Some((3.6, 0)));
        o.gate_runs = Some((runs, s(1.0)));
        reports(&o, "it ran 1.60s, past its time-out of 1s (wait)");
        // b never asked.
        let mut runs = good;
        runs.remove(2);
        o.gate_runs = Some((runs, s(1.0)));
        reports(
            &o,
            "b asked logind to reboot at 2.00s without asking its gate",
        );
    }

    #[test]
    fn a_reboot_while_the_prometheus_alert_fired_is_reported() {
        let run = |node: &str, start: f64, answer: &str, end: Option<(f64, i32)>| GateRun {
            node: node.into(),
            start: s(start),
            answer: answer.into(),
            end: end.map(|(t, c)| (s(t), c)),
        };
        let mut o = clean();
        let good = vec![
            run("a", 1.0, "firing", Some((1.01, 1))),
            run("a", 1.8, "none", Some((1.82, 0))),
            run("b", 1.9, "none", Some((1.91, 0))),
            run("c", 3.8, "none", Some((3.85, 0))),
        ];
        o.alert_runs = Some((good.clone(), s(2.0)));
        assert_eq!(violations(&o), Vec::<String>::new());
        // b's last query found the alert firing.
        let mut runs = good.clone();
        runs[2] = run("b", 1.9, "firing", Some((1.91, 1)));
        o.alert_runs = Some((runs, s(2.0)));
        reports(&o, "b asked logind to reboot at 2.00s past the alert gate that said wait: its last alert gate run, at 1.90s (answer firing), it said wait (exit 1)");
        // c's last query got no answer (rebootd gave up at its time-out).
        let mut runs = good;
        runs[3] = run("c", 3.8, "no answer", None);
        o.alert_runs = Some((runs, s(2.0)));
        reports(&o, "(answer no answer), it never ended");
        // Both gates are checked: a command gate that said go does not excuse the alert.
        o.gate_runs = Some((vec![run("c", 3.7, "go", Some((3.71, 0)))], s(1.0)));
        let v = violations(&o);
        assert!(v.iter().any(|m| m.contains("alert gate")), "{v:#?}");
    }
}
