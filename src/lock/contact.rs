//! Whether a waiter is in touch with its store: when the store last answered it, and how many
//! times it went without an answer for longer than its queue entry's time to live. A holder's
//! silence is judged by the waiter's own clock, so it only means something over time the waiter
//! itself could hear from the store: the lock core starts its counts afresh after such a break
//! and reclaims only on a view the store confirmed within that time (RELIABILITY.md, finding 9).

use std::time::{Duration, Instant};

/// A waiter's contact with its store. Stores note every answer: a read, a watch event, a
/// keep-alive or refresh of the queue entry, a write.
#[derive(Debug, Clone)]
pub struct Contact {
    /// The longest stretch without an answer that is not a break: the queue entry's time to
    /// live, which the waiter's own beats (a third of it, two thirds far back) stay within.
    within: Duration,
    last: Option<Instant>,
    breaks: u64,
}

impl Contact {
    pub fn new(within: Duration) -> Contact {
        Contact {
            within,
            last: None,
            breaks: 0,
        }
    }

    /// The store answered at `at`.
    pub fn answered(&mut self, at: Instant) {
        if self
            .last
            .is_some_and(|last| at.saturating_duration_since(last) > self.within)
        {
            self.breaks += 1;
        }
        if self.last.is_none_or(|last| at > last) {
            self.last = Some(at);
        }
    }

    /// How many breaks so far: a change means every silence counted before it is void.
    pub fn breaks(&self) -> u64 {
        self.breaks
    }

    /// Whether the store answered within the last `within` before `now`.
    pub fn fresh(&self, now: Instant) -> bool {
        self.last
            .is_some_and(|last| now.saturating_duration_since(last) <= self.within)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: Duration = Duration::from_secs(30);

    #[test]
    fn answers_within_the_ttl_keep_contact_and_a_longer_gap_is_a_break() {
        let t0 = Instant::now();
        let mut c = Contact::new(TTL);
        assert!(!c.fresh(t0), "nothing heard yet");
        c.answered(t0);
        c.answered(t0 + Duration::from_secs(10));
        c.answered(t0 + Duration::from_secs(40));
        assert_eq!(
            c.breaks(),
            0,
            "beats a third or two thirds of the TTL apart"
        );
        assert!(c.fresh(t0 + Duration::from_secs(70)));
        assert!(
            !c.fresh(t0 + Duration::from_secs(71)),
            "a TTL without an answer"
        );
        c.answered(t0 + Duration::from_secs(151));
        assert_eq!(c.breaks(), 1, "151 s with the store down");
        assert!(c.fresh(t0 + Duration::from_secs(151)));
    }

    #[test]
    fn an_answer_noted_late_never_moves_contact_back() {
        let t0 = Instant::now();
        let mut c = Contact::new(TTL);
        c.answered(t0 + Duration::from_secs(20));
        c.answered(t0);
        assert!(c.fresh(t0 + Duration::from_secs(50)));
        assert_eq!(c.breaks(), 0);
    }
}
