//! Maintenance windows in a trial (`--windows`): every node gets windows of its own, a few
//! seconds long with gaps of a few seconds, from shortly after its start until well past the
//! trial's time-out, so that windows open and close throughout the rollout (and close while a
//! node waits for its slot, drains or is about to reboot). A node whose clock is off
//! (`--skew-clock`) gets its windows on its own clock: they open during the trial as it sees
//! time. The checker judges every reboot call by the node's own windows and its own clock.

use super::Rng;
use jiff::{SignedDuration, Timestamp};
use std::time::Duration;

/// How long after the node starts its first window opens at the earliest.
const FIRST: Duration = Duration::from_secs(2);
/// Window lengths and the gaps between them, whole seconds (`HH:MM:SS` starts).
const LENGTH_S: (u64, u64) = (2, 6);
const GAP_S: (u64, u64) = (1, 6);
/// Windows planned past the trial's time-out.
const PAST_TIMEOUT: Duration = Duration::from_secs(30);

/// One node's windows: open on `[start, end)` by the node's clock, which is `offset` off the
/// lab's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub offset: SignedDuration,
    pub open: Vec<(Timestamp, Timestamp)>,
}

/// Windows for a node whose clock is `offset` off, from `now` (the lab's clock) until the
/// trial's time-out has long passed.
pub fn plan(rng: &mut Rng, now: Timestamp, offset: SignedDuration, timeout: Duration) -> Plan {
    let node_now = now + offset;
    let end = node_now + SignedDuration::try_from(timeout + PAST_TIMEOUT).unwrap_or_default();
    let first = node_now + SignedDuration::try_from(FIRST + rng.ms(0, 3000)).unwrap_or_default();
    // Whole seconds: the configuration's start is HH:MM:SS.
    let mut at = Timestamp::from_second(first.as_second() + 1).unwrap_or(first);
    let mut open = Vec::new();
    while at < end {
        let length = LENGTH_S.0 + rng.below(LENGTH_S.1 - LENGTH_S.0 + 1);
        let gap = GAP_S.0 + rng.below(GAP_S.1 - GAP_S.0 + 1);
        let close = at + SignedDuration::from_secs(length as i64);
        open.push((at, close));
        at = close + SignedDuration::from_secs(gap as i64);
    }
    Plan { offset, open }
}

/// The plan as the node's `[[window]]` tables (every day, UTC).
pub fn toml(plan: &Plan) -> String {
    let mut out = String::new();
    for (from, to) in &plan.open {
        let start = from.to_zoned(jiff::tz::TimeZone::UTC).time();
        let length = to.as_second() - from.as_second();
        out.push_str(&format!(
            "\n[[window]]\ndays = [\"Mon\", \"Tue\", \"Wed\", \"Thu\", \"Fri\", \"Sat\", \"Sun\"]\nstart = \"{:02}:{:02}:{:02}\"\nlength = \"{length}s\"\ntime_zone = \"UTC\"\n",
            start.hour(),
            start.minute(),
            start.second()
        ));
    }
    out
}

/// The windows in the trial's time (since `started`, the lab's clock).
pub fn spans(plan: &Plan, started: Timestamp) -> Vec<(Duration, Duration)> {
    let since = |t: Timestamp| {
        let lab = t - plan.offset;
        Duration::try_from(lab.duration_since(started)).unwrap_or_default()
    };
    plan.open
        .iter()
        .map(|(f, t)| (since(*f), since(*t)))
        .collect()
}

/// What the windows did, as the nodes' logs say (`windows` in the stats).
pub(super) fn observe(
    nodes: &[std::sync::Arc<super::trial::ChaosNode>],
    shared: &super::trial::Shared,
) {
    for n in nodes {
        let log = std::fs::read_to_string(&n.log_path).unwrap_or_default();
        let count = |what: &str| log.matches(what).count() as u32;
        let left = count("while waiting for a slot; leaving the queue");
        let backed = count("the maintenance window closed before the reboot; backing out");
        let waited = count("outside the maintenance window; next opens");
        shared.stats(|s| {
            *s.windows.entry("left the queue".into()).or_default() += left;
            *s.windows.entry("backed out".into()).or_default() += backed;
            *s.windows.entry("waited for one".into()).or_default() += waited;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_start_on_whole_seconds_on_the_nodes_clock_and_cover_the_trial() {
        let now: Timestamp = "2026-11-27T23:59:50.250Z".parse().unwrap();
        let offset = SignedDuration::from_hours(3);
        let p = plan(&mut Rng::new(5), now, offset, Duration::from_secs(60));
        assert!(p.open.len() > 5);
        for (f, t) in &p.open {
            assert_eq!(f.subsec_nanosecond(), 0);
            assert!(t > f);
        }
        assert!(p.open[0].0 >= now + offset + SignedDuration::from_secs(2));
        assert!(p.open.last().unwrap().1 >= now + offset + SignedDuration::from_secs(90));
        let text = toml(&p);
        let first = p.open[0].0.to_zoned(jiff::tz::TimeZone::UTC).time();
        assert!(text.contains(&format!(
            "start = \"{:02}:{:02}:{:02}\"",
            first.hour(),
            first.minute(),
            first.second()
        )));
        // In the lab's time: the first opens 2-5 s after `now`.
        let s = spans(&p, now);
        assert!(
            s[0].0 >= Duration::from_secs(2) && s[0].0 <= Duration::from_secs(6),
            "{s:?}"
        );
    }
}
