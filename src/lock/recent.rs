//! A read of the semaphore kept for a moment: the one a phase report made serves the first
//! attempt of the release that follows soon after (after the boot, at once), so that release
//! needs no read of its own. A stale read only costs a retry, since every write compares what
//! it read; an old one would mostly be stale, so it serves at most [`RECENT`] after it was
//! made, and once.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How old a kept read may be to serve.
pub const RECENT: Duration = Duration::from_secs(1);

/// A read of type `S`, and when it was made.
#[derive(Debug)]
pub struct Recent<S>(Mutex<Option<(S, Instant)>>);

impl<S> Default for Recent<S> {
    fn default() -> Self {
        Recent(Mutex::new(None))
    }
}

impl<S> Recent<S> {
    fn slot(&self) -> std::sync::MutexGuard<'_, Option<(S, Instant)>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Keep `read`, made just now.
    pub fn set(&self, read: S) {
        *self.slot() = Some((read, Instant::now()));
    }

    pub fn forget(&self) {
        *self.slot() = None;
    }

    /// The read kept, if it is recent; it is not kept any more.
    pub fn take(&self) -> Option<S> {
        let (read, at) = self.slot().take()?;
        (at.elapsed() < RECENT).then_some(read)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_serves_once_and_only_while_recent() {
        let r = Recent::default();
        assert_eq!(r.take(), None::<u32>);
        r.set(7);
        assert_eq!(r.take(), Some(7));
        assert_eq!(r.take(), None, "once");
        r.set(8);
        *r.slot() = Some((8, Instant::now() - RECENT));
        assert_eq!(r.take(), None, "too old");
        r.set(9);
        r.forget();
        assert_eq!(r.take(), None);
    }
}
