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

    /// The pause to make now with ±10 % jitter, so a fleet that failed together does not retry
    /// in lockstep; the next one is twice the unjittered pause (up to `max`).
    pub fn next_jittered(&mut self) -> Duration {
        use std::hash::{BuildHasher, Hasher};
        let r = std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish();
        self.next_delay()
            .mul_f64(0.9 + (r % 2001) as f64 / 10_000.0)
    }

    /// The longest pause.
    pub fn max(&self) -> Duration {
        self.max
    }
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
}
