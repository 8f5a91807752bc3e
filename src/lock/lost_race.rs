//! A waiter's write that lost a race (a compare-and-swap that failed, a replace answered 409).
//! The write that won is on its way on the waiter's watch, after the events from before it; on
//! those the view still shows what the lost write was made on, so a decision would be the same
//! and lose again. Until the change of the key it lost on comes, changes are taken into the
//! view without deciding; should it not come within a time limit, the waiter reads again.
//!
//! When it comes, every waiter that lost decides on the same view, and all but one lose again:
//! k contenders for free slots would cost about k²/2 writes. So after each lost race the next try
//! waits a random pause below a bound that doubles ([`Spread`]), and they spread out. A waiter
//! that never lost (a quiet hand-off) tries at once. Pure: no I/O.

use std::time::{Duration, Instant};

use crate::backoff::Backoff;

/// The first bound of the pause after a lost race: about one write's round trip.
pub const SPREAD_MIN: Duration = Duration::from_millis(5);
/// Its largest bound.
pub const SPREAD_MAX: Duration = Duration::from_secs(1);

/// When a write that lost races may be tried again: not before a pause drawn below a bound that
/// doubles with each loss ([`Backoff::next_full_jitter`]).
#[derive(Debug)]
pub struct Spread {
    backoff: Backoff,
    not_before: Option<Instant>,
}

impl Default for Spread {
    fn default() -> Self {
        Spread {
            backoff: Backoff::new(SPREAD_MIN, SPREAD_MAX),
            not_before: None,
        }
    }
}

impl Spread {
    /// A write lost at `now`: the pause before the next try, which is then due.
    pub fn lost(&mut self, now: Instant) -> Duration {
        let pause = self.backoff.next_full_jitter();
        self.not_before = Some(now + pause);
        pause
    }

    /// Until when a try is held back at `now`, if it is.
    pub fn held_until(&self, now: Instant) -> Option<Instant> {
        self.not_before.filter(|at| *at > now)
    }
}

/// The key a write lost on, and until when its change is awaited.
#[derive(Debug, Default)]
pub struct LostRace(Option<(Instant, String)>);

impl LostRace {
    /// A write to `key` lost; its winner is awaited for `wait`.
    pub fn lost(&mut self, key: &str, wait: Duration) {
        self.0 = Some((Instant::now() + wait, key.to_owned()));
    }

    /// A fresh read: nothing is awaited.
    pub fn clear(&mut self) {
        self.0 = None;
    }

    /// When to give up waiting for the winner and read again, if one is awaited.
    pub fn deadline(&self) -> Option<Instant> {
        self.0.as_ref().map(|(by, _)| *by)
    }

    /// Whether a change of `key` may decide: nothing is awaited, or it is the awaited key (or a
    /// directory above it). Then nothing is awaited any more.
    pub fn decides(&mut self, key: &str) -> bool {
        match &self.0 {
            Some((_, lost)) if lost != key && !lost.starts_with(&format!("{key}/")) => false,
            _ => {
                self.0 = None;
                true
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_key_lost_on_decides_until_it_comes() {
        let mut r = LostRace::default();
        assert!(r.decides("/a/doc"), "nothing awaited");
        assert_eq!(r.deadline(), None);
        r.lost("/a/doc", Duration::from_secs(3));
        assert!(r.deadline().is_some());
        assert!(!r.decides("/a/queue/1"), "an earlier event");
        assert!(!r.decides("/a/do"), "not a prefix by name");
        assert!(r.decides("/a/doc"));
        assert!(r.decides("/a/queue/2"), "the winner came: all decide again");
        r.lost("/a/rebootd/holders/h", Duration::from_secs(3));
        assert!(r.decides("/a/rebootd"), "its directory changed");
        r.lost("slot-0", Duration::from_secs(3));
        r.clear();
        assert_eq!(r.deadline(), None);
        assert!(r.decides("slot-1"));
    }

    #[test]
    fn a_try_after_a_lost_race_waits_below_a_doubling_bound() {
        let mut s = Spread::default();
        let now = Instant::now();
        assert_eq!(s.held_until(now), None, "never lost: at once");
        let mut bounds = Vec::new();
        for _ in 0..12 {
            let pause = s.lost(now);
            assert_eq!(
                s.held_until(now),
                (pause > Duration::ZERO).then_some(now + pause)
            );
            assert_eq!(s.held_until(now + pause), None, "due once the pause passed");
            bounds.push(pause);
        }
        assert!(bounds[0] <= SPREAD_MIN);
        assert!(bounds[1] <= SPREAD_MIN * 2);
        assert!(bounds.iter().all(|p| *p <= SPREAD_MAX));
    }
}
