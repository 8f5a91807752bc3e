//! Retrying, written once for every store: which errors are worth another try (the pause
//! between tries is [`crate::backoff::Backoff`]), and the compare-and-swap loop of the calls other than
//! `acquire` ([`cas_loop!`]: read, build, commit on what was read; a lost race reads again after
//! a pause that spreads the losers out ([`crate::lock::lost_race::Spread`]), up to
//! [`MAX_CONFLICTS`] times).

use std::time::{Duration, Instant};

use super::lost_race::Spread;
use super::LockError;
use crate::lock::Backend;

/// Whether retrying later may succeed: the store did not answer, or answered "not now"
/// (overloaded, leader changed). Everything else (a refusal, permission denied, a document that
/// does not parse) is permanent and returned at once.
pub fn is_transient(e: &LockError) -> bool {
    matches!(e, LockError::Unreachable { .. })
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

/// The count of one compare-and-swap loop's lost races: [`cas_loop!`] tells it each loss; after
/// [`MAX_CONFLICTS`] losses the update gives up with a [`LockError::Backend`] naming what it did
/// and on which key.
#[derive(Debug)]
pub struct Conflicts<'a, D: std::fmt::Display> {
    backend: Backend,
    what: &'a str,
    target: D,
    lost: usize,
    spread: Spread,
}

impl<'a, D: std::fmt::Display> Conflicts<'a, D> {
    pub fn new(backend: Backend, what: &'a str, target: D) -> Self {
        Conflicts {
            backend,
            what,
            target,
            lost: 0,
            spread: Spread::default(),
        }
    }

    /// One more lost race: `Ok` with the pause before reading again and retrying, or the error
    /// that ends the update.
    pub fn lost(&mut self) -> Result<Duration, LockError> {
        self.lost += 1;
        if self.lost < MAX_CONFLICTS {
            let pause = self.spread.lost(Instant::now());
            tracing::debug!(what = self.what, target = %self.target, lost = self.lost, ?pause, "lost a race; reading again after a pause");
            return Ok(pause);
        }
        Err(LockError::Backend {
            backend: self.backend,
            reason: format!(
                "{}: gave up after {MAX_CONFLICTS} conflicting updates of {}",
                self.what, self.target
            ),
        })
    }
}

/// The compare-and-swap loop of every store, written once: runs `$attempt` (one read, a
/// decision on it and a write conditional on what was read, an expression giving
/// `Result<Cas<T>, LockError>`) until it is done, an error, or it has lost [`MAX_CONFLICTS`]
/// races, counted by [`Conflicts`], pausing after each as it says; it evaluates to
/// `Result<T, LockError>`. A macro rather than a function taking an async closure: such a
/// closure borrows the store and the caller's decision closure, and its future is then not
/// `Send` inside `async_trait` methods.
macro_rules! cas_loop {
    ($backend:expr, $what:expr, $target:expr, $attempt:expr) => {{
        let mut conflicts = $crate::lock::retry::Conflicts::new($backend, $what, $target);
        loop {
            match $attempt {
                Ok($crate::lock::retry::Cas::Done(t)) => break Ok(t),
                Ok($crate::lock::retry::Cas::Conflict) => match conflicts.lost() {
                    Ok(pause) => ::tokio::time::sleep(pause).await,
                    Err(e) => break Err(e),
                },
                Err(e) => break Err(e),
            }
        }
    }};
}
pub(crate) use cas_loop;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lock::lost_race::{SPREAD_MAX, SPREAD_MIN};

    #[test]
    fn only_unreachable_is_transient() {
        let unreachable = LockError::Unreachable {
            backend: Backend::Etcd,
            target: "x".into(),
            reason: "down".into(),
        };
        assert!(is_transient(&unreachable));
        assert!(!is_transient(&LockError::Refused("no".into())));
        assert!(!is_transient(&LockError::Backend {
            backend: Backend::Etcd,
            reason: "permission denied".into()
        }));
    }

    #[test]
    fn conflicts_allow_retries_then_give_up_naming_what_and_where() {
        let mut c = Conflicts::new(Backend::Etcd, "set-max", "k");
        for _ in 1..MAX_CONFLICTS {
            c.lost().unwrap();
        }
        let e = c.lost().unwrap_err().to_string();
        assert!(
            e.contains("set-max: gave up after 64 conflicting updates of k"),
            "{e}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_loop_retries_lost_races_stops_at_an_error_and_gives_up_at_the_cap() {
        let mut tries = 0;
        let done: Result<u32, LockError> = cas_loop!(Backend::Etcd, "report phase", "k", {
            tries += 1;
            Ok(if tries < 3 {
                Cas::Conflict
            } else {
                Cas::Done(7)
            })
        });
        assert_eq!((done.unwrap(), tries), (7, 3));

        tries = 0;
        let failed: Result<(), LockError> = cas_loop!(Backend::Etcd, "release", "k", {
            tries += 1;
            if tries < 2 {
                Ok(Cas::Conflict)
            } else {
                Err(LockError::Refused("no".into()))
            }
        });
        assert!(matches!(failed, Err(LockError::Refused(_))) && tries == 2);

        tries = 0;
        let lost: Result<(), LockError> = cas_loop!(Backend::Etcd, "set-max", "k", {
            tries += 1;
            Ok(Cas::Conflict)
        });
        assert_eq!(tries, MAX_CONFLICTS);
        assert!(lost.unwrap_err().to_string().contains("gave up after 64"));
    }

    #[test]
    fn each_lost_race_pauses_below_a_doubling_bound() {
        let mut c = Conflicts::new(Backend::Etcd, "release", "k");
        let pauses: Vec<Duration> = (0..10).map(|_| c.lost().unwrap()).collect();
        assert!(pauses[0] <= SPREAD_MIN);
        assert!(pauses[2] <= SPREAD_MIN * 4);
        assert!(pauses.iter().all(|p| *p <= SPREAD_MAX));
        assert!(pauses.iter().any(|p| *p > SPREAD_MIN), "{pauses:?}");
    }
}
