//! The faults of `--cut-off` and `--skew-clock`: one node cut off from the store for a while
//! (its store traffic goes through a [`CutProxy`]), and one node whose clock is hours off
//! (libfaketime preloaded into its rebootd).

use super::check::CutOff;
use super::trial::{ChaosNode, Shared};
use super::Rng;
use crate::cut_proxy::{CutMode, CutProxy};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One cut of a trial, as the seed decides it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CutPlan {
    /// Cut once the node holds its slot (in its drain, its reboot or after it), else at a
    /// random moment.
    pub while_holding: bool,
    /// Then after this pause.
    pub after: Duration,
    pub mode: CutMode,
    /// Longer than `max_hold`, so that a waiter may reclaim the slot.
    pub long: bool,
    pub length: Duration,
}

/// The cuts of the trial with `seed`: once or twice, more often while the node holds its slot,
/// for 0.3-6 s, or, with `max_hold`, in most cuts for `max_hold` + 2-8 s.
pub fn plan(seed: u64, max_hold: Option<Duration>) -> Vec<CutPlan> {
    let mut rng = Rng::fork(seed, 8);
    let cuts = 1 + rng.below(2);
    (0..cuts)
        .map(|_| {
            let while_holding = rng.chance(65);
            let after = if while_holding {
                rng.ms(0, 1500)
            } else {
                rng.ms(200, 5000)
            };
            let mode = if rng.chance(50) {
                CutMode::Blackhole
            } else {
                CutMode::Reset
            };
            let long = max_hold.is_some() && rng.chance(60);
            let length = match max_hold {
                Some(m) if long => m + rng.ms(2000, 8000),
                _ => rng.ms(300, 6000),
            };
            CutPlan {
                while_holding,
                after,
                mode,
                long,
                length,
            }
        })
        .collect()
}

/// Cut `n` off from the store as [`plan`] says. Each cut is recorded; the cut in progress ends
/// when the chaos stops.
pub(super) async fn cut_offs(
    seed: u64,
    n: Arc<ChaosNode>,
    proxy: Arc<CutProxy>,
    max_hold: Option<Duration>,
    shared: Arc<Shared>,
) {
    for cut in plan(seed, max_hold) {
        if cut.while_holding {
            let give_up = Instant::now() + Duration::from_secs(20);
            while !shared.stopped() && Instant::now() < give_up {
                if n.store.load().ok().flatten().is_some_and(|s| s.slot_held) {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        tokio::time::sleep(cut.after).await;
        if shared.stopped() {
            break;
        }
        proxy.cut(cut.mode);
        let from = shared.started.elapsed();
        shared.stats(|s| {
            s.cut_offs += 1;
            s.long_cut_offs += cut.long as u32;
        });
        let until = Instant::now() + cut.length;
        while !shared.stopped() && Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        proxy.restore();
        shared.record_cut_off(CutOff {
            node: n.name.clone(),
            from,
            to: shared.started.elapsed(),
        });
    }
}

/// The clock offsets a skewed node may get (libfaketime's relative `FAKETIME`).
pub(super) const SKEWS: &[&str] = &["+3h", "-5h", "+11h", "-9h", "+26h"];

/// The offset of a `FAKETIME` value of [`SKEWS`].
pub(super) fn skew_of(faketime: &str) -> jiff::SignedDuration {
    let hours: i64 = faketime
        .trim_end_matches('h')
        .trim_start_matches('+')
        .parse()
        .unwrap_or(0);
    jiff::SignedDuration::from_hours(hours)
}

/// libfaketime's multi-threaded library (Debian's `faketime` package).
pub(super) fn libfaketime() -> Option<PathBuf> {
    [
        "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1",
        "/usr/lib/aarch64-linux-gnu/faketime/libfaketimeMT.so.1",
        "/usr/lib/faketime/libfaketimeMT.so.1",
        "/usr/local/lib/faketime/libfaketimeMT.so.1",
    ]
    .iter()
    .map(PathBuf::from)
    .find(|p| p.exists())
}

/// The environment that puts rebootd's wall clock `faketime` off: only the real-time clock,
/// not the monotonic one its timers (and the lock's silence measurements) run on.
pub(super) fn skew_env(lib: &std::path::Path, faketime: &str) -> Vec<(String, String)> {
    vec![
        ("LD_PRELOAD".into(), lib.display().to_string()),
        ("FAKETIME".into(), faketime.into()),
        ("FAKETIME_DONT_FAKE_MONOTONIC".into(), "1".into()),
        ("FAKETIME_DONT_RESET".into(), "1".into()),
    ]
}

/// Whether a wall-clock time `written` by the skewed node shows its offset against `now`
/// (the lab's clock): within 30 minutes of `now + skew` (a trial lasts minutes).
pub(super) fn shows_skew(
    written: jiff::Timestamp,
    now: jiff::Timestamp,
    skew: jiff::SignedDuration,
) -> bool {
    let off = written.duration_since(now) - skew;
    off.abs() < jiff::SignedDuration::from_mins(30)
}

/// What the node cut off did at its fences, as its log says (`fenced` in the stats).
pub(super) fn count_fenced(n: &ChaosNode, shared: &Shared) {
    let log = std::fs::read_to_string(&n.log_path).unwrap_or_default();
    let fenced = log
        .matches("this node no longer holds its slot; backing out")
        .count() as u32;
    shared.stats(|s| s.fenced = fenced);
}

/// The skewed node's own records show its clock `by` off (else libfaketime did not take: a
/// problem of the harness).
pub(super) fn check_skew(n: &ChaosNode, by: &str, shared: &Shared) {
    match n.store.load() {
        Ok(Some(st)) if shows_skew(st.since, jiff::Timestamp::now(), skew_of(by)) => {}
        Ok(Some(st)) => shared.problem(format!(
            "{}: its clock should be {by} off, but its state says since {}",
            n.name, st.since
        )),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skews_parse_and_a_skewed_time_is_told_from_a_true_one() {
        assert_eq!(skew_of("+3h"), jiff::SignedDuration::from_hours(3));
        assert_eq!(skew_of("-5h"), jiff::SignedDuration::from_hours(-5));
        let now = jiff::Timestamp::now();
        let three = jiff::SignedDuration::from_hours(3);
        assert!(shows_skew(now + three, now, three));
        assert!(!shows_skew(now, now, three));
        let minus = skew_of("-9h");
        assert!(shows_skew(
            now - jiff::SignedDuration::from_hours(9),
            now,
            minus
        ));
    }
}
