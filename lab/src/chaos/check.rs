//! The invariants of a chaos trial, as pure functions of what the trial observed
//! ([`Observed`]): the trial fills it from its outside watchers, the simulated reboots and the
//! reads it makes at the end; the tests below fill it with synthetic histories that break each
//! invariant, to show that [`violations`] reports every one.

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
    let parked: Vec<(String, Duration, Duration)> = reclaims(&o.holders)
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

/// The instants of a timeline with more than `max` members, listed.
fn over(t: &Timeline, max: u64) -> String {
    let over: Vec<String> = t
        .iter()
        .filter(|(_, s)| s.len() as u64 > max)
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
    let mut v = Vec::new();
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
    let holders = peak(&o.holders);
    if holders as u64 > o.max {
        v.push(format!(
            "{holders} holders at once (max {}): {}",
            o.max,
            over(&o.holders, o.max)
        ));
    }
    let in_flight = cordoned_in_flight(o);
    let cordoned = peak(&in_flight);
    if cordoned as u64 > o.max {
        v.push(format!(
            "{cordoned} nodes cordoned at once (max {}): {}",
            o.max,
            over(&in_flight, o.max)
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
    // Every node rebooted exactly once, and says so.
    for n in &o.nodes {
        let r = o.downs.iter().filter(|d| &d.node == n).count();
        if r != 1 {
            v.push(format!("{n} rebooted {r} times (expected once)"));
        }
        match o.ends.get(n) {
            Some(Ok(Some(s))) if o.timed_out.is_none() => {
                if s.reboots != 1 {
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
    // A node goes down only while it holds a slot, and drained.
    for d in &o.downs {
        let held = d.held.unwrap_or_else(|| held_at(&o.holders, &d.node, d.at));
        if !held {
            v.push(format!(
                "{} went down at {:.2}s without holding a slot",
                d.node,
                d.at.as_secs_f64()
            ));
        }
        if !d.pods_left.is_empty() {
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
            if !doc.holders.is_empty() || doc.semaphore != o.max as i64 {
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
mod tests {
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
    fn clean() -> Observed {
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
        }
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
}
