//! The one acquire loop every store runs: read a view, let the arbiter decide, commit the
//! decision by compare-and-swap on what was read, or queue up and wait by watch; retry what is
//! transient with back-off. A store plugs in by implementing [`Waiting`].
//!
//! After a lost race (a compare-and-swap that found the store changed) the loop does not try
//! again on the same view: it waits for the change that beat it, which the watch brings.

use crate::lock::Backend;
use std::time::{Duration, Instant};

use async_trait::async_trait;

use super::arbiter::{self, Decision, Policy};
use super::contact::Contact;
use super::lost_race::Spread;
use super::retry;
use super::view::{HolderView, Observations, View};
use super::{Acquired, GroupPause, Identity, LockError};
use crate::backoff::Backoff;

/// How many live waiters ahead (and at least `max`) make a waiter far back in a long queue:
/// no change can let it act, and a store's waiter may take a change into its view without
/// asking the arbiter ([`far_back`]).
pub const FAR_BACK: usize = 16;

/// Whether a waiter (not a holder, not paused, still queued) is far back: at least
/// [`FAR_BACK`] queue entries ahead of it, and of the `entries_ahead`, all but `uncertain` are
/// live waiters (`uncertain`: entries that may be holders' left-overs, or that the arbiter did
/// not count at its last decision), at least `max` of them and at least one. Then no change can
/// let it act: the arbiter takes a slot only with fewer waiters ahead than free slots, and
/// reclaims only at the head. Counting is a comparison per entry where asking the arbiter
/// builds the whole view, which at every change of a long queue was most of a waiter's work.
pub fn far_back(max: u64, entries_ahead: usize, uncertain: usize) -> bool {
    let max = usize::try_from(max).unwrap_or(usize::MAX).max(1);
    entries_ahead >= FAR_BACK && entries_ahead.saturating_sub(uncertain) >= max
}

/// How many places ahead of a waiter its *marker* is, when it is far enough back for one: a
/// store that can watch one waiter's entry has a waiter with `ahead` live waiters ahead of it,
/// at least `max` plus `beyond_max`, watch the entry this many places ahead (`max` plus half
/// of [`FAR_BACK`]) in place of the whole semaphore, and read again when it changes. While it
/// is there the waiter cannot act: whatever lets it act lets the marker act first, being ahead
/// of it, and only the head reclaims; when it takes a slot, at least `FAR_BACK / 2` waiters
/// stand between it and me. `beyond_max` is the store's: what a marker costs it against the
/// changes it saves.
pub fn marker_distance(max: u64, ahead: usize, beyond_max: usize) -> Option<usize> {
    let max = usize::try_from(max).unwrap_or(usize::MAX);
    (ahead >= max.saturating_add(beyond_max)).then(|| max.saturating_add(FAR_BACK / 2))
}

/// When a waiter's queue entry, kept alive by a time to live `ttl` and last kept alive at
/// `kept`, is due for its next beat: a third of the TTL later near the front, two thirds while
/// [`far_back`]. Near the front a beat may fail once and the entry still lives; far back a
/// beat costs half the requests of the longest part of a long wait, and the TTL (so the time
/// a dead waiter's entry holds the queue up) is the same. A waiter that moves up is due at
/// once when more than a third has passed.
pub fn beat_due(kept: Instant, ttl: Duration, far_back: bool) -> Instant {
    let thirds = if far_back { 2 } else { 1 };
    kept + (ttl * thirds / 3).max(Duration::from_millis(300))
}

/// How many entries ahead [`far_back`] needs: a store may count no further.
pub fn far_back_at(max: u64, uncertain: usize) -> usize {
    usize::try_from(max)
        .unwrap_or(usize::MAX)
        .max(1)
        .saturating_add(uncertain)
        .max(FAR_BACK)
}

/// Sleep until `at`; never, when there is none (a `select!` arm with nothing due).
pub async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(tokio::time::Instant::from_std(at)).await,
        None => std::future::pending().await,
    }
}

/// How a wait ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wake {
    /// The view changed, or the time asked for passed: decide again.
    Changed,
    /// The view can no longer be kept up to date (watch history compacted, watch lost): read
    /// again, at once.
    Reread,
}

/// One `acquire` in progress on one store: what the loop needs a store adapter to do. Dropped
/// (the `acquire` future cancelled), it must leave nothing that outlives its time to live.
#[async_trait]
pub trait Waiting: Send {
    /// Read the semaphore afresh: at the start, after an error, after [`Wake::Reread`].
    async fn read(&mut self) -> Result<(), LockError>;
    /// The semaphore as last read or watched. A document or object that does not parse is
    /// [`LockError::Corrupt`] and is never written over.
    fn view(&self) -> Result<View, LockError>;
    /// Take the `rank`-th free slot, by compare-and-swap on what was read, leaving the queue in
    /// the same write where the store allows. `Ok(false)`: lost a race.
    async fn take(&mut self, rank: usize) -> Result<bool, LockError>;
    /// Write my record on the slot of `holder` (mine without a token, or my node's).
    async fn adopt(&mut self, holder: &str) -> Result<bool, LockError>;
    /// Take over the slot of `holder` (or only free it when not `take_over`).
    async fn reclaim(&mut self, holder: &str, take_over: bool) -> Result<bool, LockError>;
    /// Be in the queue: put my entry if it is not there, keep it alive if it is.
    async fn enqueue(&mut self) -> Result<(), LockError>;
    /// Wait until the view changes or `until` passes (keeping my entry alive meanwhile). `head`:
    /// I am first in the queue, so the holders' liveness matters (a store may watch more).
    async fn wait(&mut self, until: Option<Instant>, head: bool) -> Result<Wake, LockError>;
    /// Told, right before [`Waiting::wait`], how many live waiters the arbiter counted ahead of
    /// me (`None`: the wait follows something other than a decision to wait: a lost race, a
    /// duplicate holder). A store may use it to pass over changes that cannot let me act; the
    /// default does nothing.
    fn placed(&mut self, _behind: Option<usize>) {}
    /// I hold a slot: leave the queue and delete the entries of waiters that went away (`dead`,
    /// their keys); best effort, errors are logged.
    async fn leave(&mut self, dead: Vec<String>);
    /// The group's pause, where the store reads and watches it with the semaphore (so that
    /// [`acquire_unless_paused`] needs no request of its own for it); `None` elsewhere. A change
    /// of it must end a [`Waiting::wait`].
    fn paused(&self) -> Option<GroupPause> {
        None
    }
    /// When the store last answered this waiter, and how often it went quiet for longer than
    /// the entry's time to live ([`Contact`]): silence counts only over time in touch.
    fn contact(&self) -> &Contact;
}

/// What the loop needs to know besides the store.
#[derive(Debug, Clone)]
pub struct Settings {
    pub backend: Backend,
    /// What log lines call the store when it is in trouble (`etcd`, `Kubernetes API`).
    pub label: &'static str,
    /// What log lines say the semaphore is (a key, a Lease name).
    pub target: String,
    pub policy: Policy,
    /// First pause after a transient error, doubled up to `backoff_max`.
    pub backoff_min: Duration,
    pub backoff_max: Duration,
}

impl Settings {
    /// An etcd store's (v3 or v2) on the document at `doc`: its queue entries live by their
    /// lease or TTL (`queue_ttl`), so no silence judges one dead before it expires.
    pub fn etcd(
        doc: &str,
        max_hold: Option<Duration>,
        queue_ttl: Duration,
        backoff: (Duration, Duration),
    ) -> Settings {
        Settings {
            backend: Backend::Etcd,
            label: "etcd",
            target: doc.to_owned(),
            policy: Policy {
                max_hold,
                waiter_timeout: queue_ttl,
                max_per_zone: None,
            },
            backoff_min: backoff.0,
            backoff_max: backoff.1,
        }
    }
}

/// What a waiter last said it waits for: free slots, holders, waiters ahead, its zone full.
type Logged = (i64, Vec<String>, usize, bool);

/// How one [`round`] ended.
enum RoundEnd {
    Held,
    Paused(GroupPause),
    /// The view must be read again.
    Reread,
}

/// Take a slot for `me` through `w`, waiting as long as it takes. Transient errors are retried
/// with back-off; anything else is returned.
pub async fn acquire(
    w: &mut impl Waiting,
    me: &Identity,
    settings: &Settings,
) -> Result<(), LockError> {
    // Not following the pause, it never ends paused.
    run(w, me, settings, false).await.map(|_| ())
}

/// As [`acquire`], but a pause of the group ([`Waiting::paused`]) read or watched before the
/// slot is held ends the wait: the caller drops `w`, which takes my queue entry with it.
pub async fn acquire_unless_paused(
    w: &mut impl Waiting,
    me: &Identity,
    settings: &Settings,
) -> Result<Acquired, LockError> {
    run(w, me, settings, true).await
}

async fn run(
    w: &mut impl Waiting,
    me: &Identity,
    settings: &Settings,
    follow_pause: bool,
) -> Result<Acquired, LockError> {
    let mut backoff = Backoff::new(settings.backoff_min, settings.backoff_max);
    let mut kept = Kept::default();
    let started = Instant::now();
    loop {
        let session = Instant::now();
        let failed = match round(w, me, settings, &mut kept, follow_pause).await {
            Ok(RoundEnd::Paused(pause)) => return Ok(Acquired::Paused(pause)),
            Ok(RoundEnd::Held) => {
                let dead = arbiter::dead_waiters(
                    &w.view().unwrap_or_else(|_| empty_view()),
                    &kept.observations,
                    &settings.policy,
                    2,
                    Instant::now(),
                )
                .into_iter()
                .map(|d| d.key.clone())
                .collect();
                w.leave(dead).await;
                tracing::debug!(target = %settings.target, id = %me.id, waited = ?started.elapsed(), "holding a slot");
                return Ok(Acquired::Held);
            }
            Ok(RoundEnd::Reread) => {
                backoff.reset();
                continue;
            }
            Err(e) => e,
        };
        if !retry::is_transient(&failed) {
            return Err(failed);
        }
        if session.elapsed() > backoff.max() {
            backoff.reset();
        }
        let pause = backoff.next_delay();
        tracing::warn!(backend = %settings.backend, target = %settings.target, error = %failed, retry_in = ?pause, "{} trouble while waiting for a slot; retrying", settings.label);
        // Say again what we wait for once the store answers.
        kept.logged = None;
        tokio::time::sleep(pause).await;
    }
}

fn empty_view() -> View {
    View {
        max: 0,
        holders: Vec::new(),
        waiters: Vec::new(),
        node_is_identity: false,
        my_zone: None,
        unlisted_ahead: 0,
    }
}

/// What one `acquire` keeps from round to round.
#[derive(Default)]
struct Kept {
    observations: Observations,
    /// What was last logged as waited for.
    logged: Option<Logged>,
    /// A holder under my id with another token was reported.
    reported_duplicate: bool,
    /// The pause after lost takes.
    spread: Spread,
}

/// Read, then decide and act until holding, paused (when `follow_pause`), or the view must be
/// read again.
async fn round(
    w: &mut impl Waiting,
    me: &Identity,
    settings: &Settings,
    kept: &mut Kept,
    follow_pause: bool,
) -> Result<RoundEnd, LockError> {
    let Kept {
        observations,
        logged,
        reported_duplicate,
        spread,
    } = kept;
    w.read().await?;
    let who = me.as_me();
    loop {
        if let Some(pause) = w.paused().filter(|_| follow_pause) {
            tracing::debug!(target = %settings.target, id = %me.id, "the group is paused ({}): not waiting for a slot", pause.describe());
            return Ok(RoundEnd::Paused(pause));
        }
        let view = w.view()?;
        let now = Instant::now();
        if observations.in_touch(w.contact()) {
            tracing::info!(target = %settings.target, id = %me.id, "{} did not answer for longer than a queue entry lives: every holder's silence is counted afresh from now", settings.label);
        }
        observations.update(&view, now);
        let decision = arbiter::decide(&view, &who, observations, &settings.policy, now);
        let (until, head, behind) = match decision {
            Decision::Held => return Ok(RoundEnd::Held),
            Decision::Adopt { holder } => {
                tracing::warn!(target = %settings.target, id = %me.id, node = %me.node, %holder, "a slot is held under this machine's id (or node name) without this host's token; taking it over as this host's");
                if w.adopt(&holder).await? {
                    return Ok(RoundEnd::Held);
                }
                (None, false, None)
            }
            // Lost a race before: not before the pause that spreads the losers out.
            Decision::Take { .. } if spread.held_until(now).is_some() => {
                (spread.held_until(now), false, None)
            }
            Decision::Take { rank } => {
                if w.take(rank).await? {
                    tracing::info!(
                        target = %settings.target,
                        id = %me.id,
                        node = %me.node,
                        max = view.max,
                        holders = view.holders.len() + 1,
                        waiters_ahead = rank,
                        "took a slot"
                    );
                    return Ok(RoundEnd::Held);
                }
                spread.lost(Instant::now());
                (None, false, None)
            }
            Decision::Reclaim { .. } if !w.contact().fresh(Instant::now()) => {
                tracing::debug!(target = %settings.target, id = %me.id, "a reclaim is due, but {} has not answered lately: reading again first", settings.label);
                return Ok(RoundEnd::Reread);
            }
            Decision::Reclaim {
                holder,
                why,
                take_over,
            } => {
                log_reclaim(settings, me, &view, &holder, &why.to_string(), take_over);
                if w.reclaim(&holder, take_over).await? && take_over {
                    tracing::warn!(target = %settings.target, %holder, by = %me.id, "reclaimed the slot");
                    return Ok(RoundEnd::Held);
                }
                (None, true, None)
            }
            Decision::Duplicate { holder, token } => {
                if !*reported_duplicate {
                    tracing::error!(
                        target = %settings.target,
                        id = %me.id,
                        node = %me.node,
                        %holder,
                        their_token = %token,
                        our_token = %me.token,
                        "ANOTHER HOST HOLDS A SLOT UNDER THIS MACHINE ID (its holder token differs): two hosts share one machine id; this host waits until that slot is given back. Give each host its own /etc/machine-id"
                    );
                    *reported_duplicate = true;
                }
                (None, false, None)
            }
            Decision::Wait { until, behind } => (until, behind == 0, Some(behind)),
        };
        w.enqueue().await?;
        // Said once in the queue, so that the position logged is one others see.
        if let Some(behind) = behind {
            let zone_full = arbiter::zone_full(&view, &who, observations, &settings.policy, now);
            log_waiting(settings, me, &view, (behind, zone_full), until, logged);
        }
        w.placed(behind);
        // After a lost race too: the watch brings the change that beat us.
        if w.wait(until, head).await? == Wake::Reread {
            return Ok(RoundEnd::Reread);
        }
    }
}

fn log_reclaim(
    settings: &Settings,
    me: &Identity,
    view: &View,
    holder: &str,
    why: &str,
    take_over: bool,
) {
    let h: Option<&HolderView> = view.holders.iter().find(|h| h.id == holder);
    tracing::warn!(
        target = %settings.target,
        holder = %holder,
        node = h.and_then(|h| h.node.as_deref()),
        phase = h.and_then(|h| h.phase.as_deref()),
        by = %me.id,
        take_over,
        "RECLAIMING the slot of a holder: {why}; that node is assumed dead"
    );
}

/// Say what this waiter waits for, when that changed.
fn log_waiting(
    settings: &Settings,
    me: &Identity,
    view: &View,
    (behind, zone_full): (usize, bool),
    until: Option<Instant>,
    logged: &mut Option<Logged>,
) {
    let ids: Vec<String> = view.holders.iter().map(|h| h.id.clone()).collect();
    let state = (view.free(), ids, behind, zone_full);
    if logged.as_ref() == Some(&state) {
        return;
    }
    // What the store says of each holder, bounded: any node may write it.
    let nodes: Vec<(String, Option<String>)> = view
        .holders
        .iter()
        .map(|h| {
            let who = crate::text::clean(h.node.as_deref().unwrap_or(&h.id));
            (who, h.phase.as_deref().map(crate::text::clean))
        })
        .collect();
    tracing::info!(
        target = %settings.target,
        id = %me.id,
        free = view.free(),
        max = view.max,
        holders = ?state.1.iter().map(|id| crate::text::clean(id)).collect::<Vec<_>>(),
        nodes = ?nodes,
        waiters_ahead = behind,
        position = behind + 1,
        reclaim_check_in = ?until.map(|u| u.saturating_duration_since(Instant::now())),
        zone_full,
        "waiting for a free slot: position {} in the queue{}",
        behind + 1,
        if zone_full {
            ", and this node's zone holds lock.max_per_zone"
        } else {
            ""
        }
    );
    *logged = Some(state);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_marker_from_max_and_beyond_max_ahead_is_max_and_half_far_back_away() {
        assert_eq!(marker_distance(10, 10 + 63, 64), None);
        assert_eq!(marker_distance(10, 10 + 64, 64), Some(10 + FAR_BACK / 2));
        assert_eq!(
            marker_distance(3, 3 + FAR_BACK, FAR_BACK),
            Some(3 + FAR_BACK / 2)
        );
        assert_eq!(marker_distance(u64::MAX, usize::MAX, 1), Some(usize::MAX));
    }
}
