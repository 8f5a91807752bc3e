//! The one back-off of the daemon: a capped exponential pause between tries, used by the lock's
//! acquire loop, FleetLock, evictions and the update_engine trigger.

use std::time::Duration;

/// Capped exponential back-off: `min`, doubled each time up to `max`.
#[derive(Debug, Clone)]
pub struct Backoff {
    min: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    pub fn new(min: Duration, max: Duration) -> Backoff {
        Backoff {
            min,
            max: max.max(min),
            next: min,
        }
    }

    /// The pause to make now; the next one is twice as long (up to `max`).
    pub fn next_delay(&mut self) -> Duration {
        let d = self.next;
        self.next = self.next.saturating_mul(2).min(self.max);
        d
    }

    /// Start again from `min` (after a success, or a session that ran for a while).
    pub fn reset(&mut self) {
        self.next = self.min;
    }

    /// A pause drawn evenly from zero to the pause due now ("full jitter"), so that many that
    /// lost one race try again spread over the bound rather than together; the next bound is
    /// twice this one (up to `max`).
    pub fn next_full_jitter(&mut self) -> Duration {
        self.next_delay().mul_f64(unit_random())
    }

    /// The pause to make now with ±10 % jitter, so a fleet that failed together does not retry
    /// in lockstep; the next one is twice the unjittered pause (up to `max`).
    pub fn next_jittered(&mut self) -> Duration {
        self.next_delay().mul_f64(0.9 + 0.2 * unit_random())
    }

    /// The longest pause.
    pub fn max(&self) -> Duration {
        self.max
    }
}

/// A number from 0 to 1, from the standard library's randomly keyed hasher (no more is needed
/// to spread retries).
fn unit_random() -> f64 {
    use std::hash::{BuildHasher, Hasher};
    let r = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    (r % 10_001) as f64 / 10_000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_cap_and_resets() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_millis(350));
        let got: Vec<u128> = (0..4).map(|_| b.next_delay().as_millis()).collect();
        assert_eq!(got, vec![100, 200, 350, 350]);
        b.reset();
        assert_eq!(b.next_delay(), Duration::from_millis(100));
    }

    #[test]
    fn jitter_stays_within_ten_percent() {
        let mut b = Backoff::new(Duration::from_millis(1000), Duration::from_millis(1000));
        for _ in 0..50 {
            let d = b.next_jittered();
            assert!((900..=1100).contains(&d.as_millis()), "{d:?}");
        }
    }

    #[test]
    fn full_jitter_spreads_below_a_doubling_bound() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_millis(400));
        let draws: Vec<Duration> = (0..40).map(|_| b.next_full_jitter()).collect();
        assert!(draws[0] <= Duration::from_millis(100));
        assert!(draws[1] <= Duration::from_millis(200));
        assert!(draws.iter().all(|d| *d <= Duration::from_millis(400)));
        let low = draws
            .iter()
            .filter(|d| **d < Duration::from_millis(200))
            .count();
        assert!(low > 0 && low < draws.len(), "not spread: {draws:?}");
    }
}
