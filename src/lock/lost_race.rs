//! A waiter's write that lost a race (a compare-and-swap that failed, a replace answered 409).
//! The write that won is on its way on the waiter's watch, after the events from before it; on
//! those the view still shows what the lost write was made on, so a decision would be the same
//! and lose again. Until the change of the key it lost on comes, changes are taken into the
//! view without deciding; should it not come within a time limit, the waiter reads again.
//! Pure: no I/O.

use std::time::{Duration, Instant};

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
}
