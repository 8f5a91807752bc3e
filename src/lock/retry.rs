//! Retrying, written once for every store: which errors are worth another try, the capped
//! exponential back-off between tries, and the compare-and-swap loop of the calls other than
//! `acquire` (read, build, commit on what was read; a lost race reads again).

use std::time::Duration;

use super::LockError;

/// Whether retrying later may succeed: the store did not answer, or answered "not now"
/// (overloaded, leader changed). Everything else (a refusal, permission denied, a document that
/// does not parse) is permanent and returned at once.
pub fn is_transient(e: &LockError) -> bool {
    matches!(e, LockError::Unreachable { .. })
}

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

    /// The longest pause.
    pub fn max(&self) -> Duration {
        self.max
    }
}

/// What one attempt of a compare-and-swap update came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cas<T> {
    /// Done (written, or nothing to write).
    Done(T),
    /// Someone else wrote first: read again and retry.
    Conflict,
}

/// Compare-and-swap attempts before an update (other than `acquire`) gives up.
pub const MAX_CONFLICTS: usize = 64;

/// Run `attempt` (one read, one conditional write) until it is not a [`Cas::Conflict`], at most
/// [`MAX_CONFLICTS`] times; then a [`LockError::Backend`] saying `what` of `target` gave up.
pub async fn cas_loop<T>(
    backend: &'static str,
    what: &str,
    target: &str,
    mut attempt: impl AsyncFnMut() -> Result<Cas<T>, LockError>,
) -> Result<T, LockError> {
    for _ in 0..MAX_CONFLICTS {
        if let Cas::Done(t) = attempt().await? {
            return Ok(t);
        }
        tracing::debug!(what, target, "lost a race; reading again");
    }
    Err(LockError::Backend {
        backend,
        reason: format!("{what}: gave up after {MAX_CONFLICTS} conflicting updates of {target}"),
    })
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
    fn only_unreachable_is_transient() {
        let unreachable = LockError::Unreachable {
            backend: "etcd",
            target: "x".into(),
            reason: "down".into(),
        };
        assert!(is_transient(&unreachable));
        assert!(!is_transient(&LockError::Refused("no".into())));
        assert!(!is_transient(&LockError::Backend {
            backend: "etcd",
            reason: "permission denied".into()
        }));
    }

    #[tokio::test]
    async fn cas_loop_retries_conflicts_then_gives_up() {
        let mut n = 0;
        let r = cas_loop("etcd", "set-max", "k", async || {
            n += 1;
            Ok(if n < 3 { Cas::Conflict } else { Cas::Done(n) })
        })
        .await;
        assert_eq!(r.unwrap(), 3);
        let r: Result<(), _> = cas_loop("etcd", "set-max", "k", async || Ok(Cas::Conflict)).await;
        let e = r.unwrap_err().to_string();
        assert!(e.contains("set-max: gave up after 64"), "{e}");
    }
}
