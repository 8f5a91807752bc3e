//! What follows each event: the pure step, its log line, and the observers of the new state.
//!
//! A change is written to the state file first, before any effect it guards; then, in this
//! order, its observers: the webhook's notices, the Node's annotations (phase, pause, group
//! pause) and the phase report to the lock backend. Their failures are logged and the agent
//! goes on. After every step: the autoscaler's courtesy for a held slot (`courtesy`); then,
//! changed or not: the withdrawal of a warning to logged-in users
//! that no longer holds, systemd's status line, Flatcar's coordinator file and the metrics;
//! last, the node's fleet record, written only when what it shows changed
//! ([`crate::fleet::publish`]).
//!
//! A step taken while an action is under way ([`Reach::Local`]: a need noted mid-action) calls
//! nothing outside the host: the action's future is alive but not polled then, and may hold
//! what a store call would wait on (the etcd stores connect on first use, under a lock), so a
//! call from that step could wait for ever (RELIABILITY.md, finding 20). Such a step changes only
//! the need on record; the observers that call out see it at the next step.

use super::{status_line, Runtime, RuntimeError};
use crate::agent::{self, Action, Event};
use crate::lock::Reported;
use crate::notify;
use crate::state::{Phase, State};
use jiff::Timestamp;
use tracing::{debug, info, warn};

/// How far the observers of a step reach.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Reach {
    /// Everything: the host, the store, the API server, logind.
    Everything,
    /// The state file, the log, the metrics, systemd's status line, the coordinator file and
    /// the webhook's queue; no call that can wait.
    Local,
}

impl Runtime {
    /// Step, log, persist, publish.
    pub(super) async fn apply(&self, state: State, event: Event) -> Result<State, RuntimeError> {
        self.apply_reaching(state, event, Reach::Everything).await
    }

    /// [`Runtime::apply`], with observers that reach as far as `reach` says.
    pub(super) async fn apply_reaching(
        &self,
        state: State,
        event: Event,
        reach: Reach,
    ) -> Result<State, RuntimeError> {
        debug!(?event, "event");
        // A proof (a report that wrote, or the take) outlives only the quick steps between it
        // and the action it serves (the slot taken, the checks before the reboot passed, the
        // cordon recorded); any other event (a gate closed, an inhibitor, an operator's
        // request, an error) ends it.
        if !matches!(
            event,
            Event::SlotAcquired | Event::ReadyToReboot(_) | Event::Cordoned { .. }
        ) {
            *self.reported_held.lock().unwrap_or_else(|p| p.into_inner()) = None;
        }
        let failed = matches!(event, Event::Transient { .. });
        let cancel = matches!(event, Event::Cancelled) && state.reason.is_some();
        let step = agent::step(&state, event, Timestamp::now(), &self.policy);
        if let Some(refused) = step.refused {
            warn!(event = refused.event, phase = %refused.phase, "{refused}; the state is left as it is");
            return Ok(state);
        }
        // What came from outside (errors, gate answers, inhibitors) is bounded and escaped
        // before it reaches the journal, the state file or anything that reads them.
        let mut next = step.state.cleaned();
        super::courtesy::note_slot_since(&mut next, Timestamp::now());
        let why = crate::text::clean(&step.why);
        if next.phase != state.phase {
            // The message says it all ("idle → reboot_needed: why"); the fields are for filtering.
            info!(from = %state.phase, to = %next.phase, %why, "{} → {}: {why}", state.phase, next.phase);
        } else if next != state {
            info!(phase = %next.phase, %why, "still {}: {why}", next.phase);
        }
        if next != state {
            // The metrics see a change by the time it is on record (a scrape that follows the
            // state file sees it too); they see every step again below.
            self.metrics.observe(&next, Timestamp::now());
            self.store.save(&next)?;
            match reach {
                Reach::Everything => self.on_change(&state, &next, failed).await,
                Reach::Local => self.send_notices(&state, &next),
            }
        }
        if reach == Reach::Local {
            self.on_step_locally(&next);
            return Ok(next);
        }
        let next = self.scale_down_courtesy(next).await?;
        self.on_step(&state, &next).await;
        if let Some(store) = self.semaphore.fleet() {
            let cancelled = cancel && next.reason.is_none();
            self.fleet.observe(store, &self.me, &next, cancelled).await;
        }
        Ok(next)
    }

    /// The observers of a change already on record, in order. `failed`: the event was an error.
    async fn on_change(&self, before: &State, after: &State, failed: bool) {
        self.send_notices(before, after);
        self.annotate_phase(before, after).await;
        self.annotate_paused(before, after).await;
        self.annotate_group_paused(before, after).await;
        self.report_phase(before, after, failed).await;
    }

    /// The observers of every step, changed or not, in order.
    async fn on_step(&self, before: &State, after: &State) {
        self.withdraw_users_warning(before, after).await;
        self.on_step_locally(after);
    }

    /// The observers of every step that stay on the host and cannot wait.
    fn on_step_locally(&self, after: &State) {
        notify::status(&status_line(after));
        if let Some(c) = &self.coordinator {
            c.update(after);
        }
        self.metrics.observe(after, Timestamp::now());
    }

    /// The webhook's notices of this change (`[webhook]`), queued.
    fn send_notices(&self, before: &State, after: &State) {
        if let Some(w) = &self.webhook {
            for n in crate::notify_webhook::notices(before, after) {
                let group = &self.config.identity.group;
                w.send(crate::notify_webhook::body(&n, &self.me.node, group, after));
            }
        }
    }

    /// A new phase on the Node's annotations.
    async fn annotate_phase(&self, before: &State, after: &State) {
        if after.phase != before.phase {
            if let Some(n) = &self.node {
                if let Err(e) = n
                    .annotate(after.phase, after.since, after.reason.is_some())
                    .await
                {
                    warn!(error = %e, "cannot annotate the node");
                }
            }
        }
    }

    /// An operator's pause of this node, or its end, on the Node's annotations.
    async fn annotate_paused(&self, before: &State, after: &State) {
        if after.paused != before.paused {
            if let Some(n) = &self.node {
                let reason = after
                    .paused
                    .as_ref()
                    .map(|p| p.reason.as_deref().unwrap_or(""));
                if let Err(e) = n.annotate_paused(reason).await {
                    warn!(error = %e, "cannot annotate the node: {e}");
                }
            }
        }
    }

    /// An operator's pause of the group, or its end, on the Node's annotations.
    async fn annotate_group_paused(&self, before: &State, after: &State) {
        if after.group_paused != before.group_paused {
            if let Some(n) = &self.node {
                let reason = after
                    .group_paused
                    .as_ref()
                    .map(|p| p.reason.as_deref().unwrap_or(""));
                if let Err(e) = n.annotate_group_paused(reason).await {
                    warn!(error = %e, "cannot annotate the node: {e}");
                }
            }
        }
    }

    /// The new phase in the holder's record, when worth it; a report the store guarded as a
    /// heartbeat is kept as the proof of the slot for the next fence. One that proves nothing
    /// (the take wrote the phase already, or nothing was written) leaves the proof there is.
    async fn report_phase(&self, before: &State, after: &State, failed: bool) {
        if self.worth_reporting(before, after, failed) {
            let reported = self.semaphore.report_phase(&self.me, after.phase).await;
            if reported.is_ok() {
                self.metrics.lock_answered();
            }
            match reported {
                Ok(Reported::Held) => {
                    *self.reported_held.lock().unwrap_or_else(|p| p.into_inner()) =
                        Some((after.phase, std::time::Instant::now()))
                }
                Ok(Reported::Unproven) => {}
                Err(e) => {
                    self.metrics.error(crate::metrics::ErrorKind::Lock);
                    warn!(error = %e, "cannot record the phase in the lock backend");
                }
            }
        }
    }

    /// The reboot announced to logged-in users was called off (pause, cancel, backing out).
    async fn withdraw_users_warning(&self, before: &State, after: &State) {
        if before.users_warned.is_some()
            && after.users_warned.is_none()
            && !before.reboot.as_ref().is_some_and(|r| r.called)
        {
            if let Err(e) = self.host.withdraw().await {
                warn!(error = %e, "cannot withdraw the reboot announced to logged-in users: {e}");
            }
        }
    }

    /// Whether the step from `before` to `after` by `event` is written to the holder's record:
    /// each new phase while the slot is held, except `releasing` when the release follows at
    /// once (it deletes the record; no settle time). A release that failed (or the labels and
    /// taint it takes off the node first) writes it then, so `rebootctl status` shows what the
    /// holder is stuck at.
    fn worth_reporting(&self, before: &State, after: &State, failed: bool) -> bool {
        if !after.slot_held {
            return false;
        }
        if after.phase != Phase::Releasing {
            return after.phase != before.phase;
        }
        match before.phase {
            Phase::Releasing => failed,
            _ => !matches!(agent::next_action(after, &self.policy), Action::ReleaseSlot),
        }
    }
}
