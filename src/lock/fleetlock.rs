//! Lock backend `fleetlock`: a FleetLock server (airlock, poseidon/fleetlock) keeps the
//! semaphore, so rebootd nodes can share one with Fedora CoreOS nodes. The protocol's client is
//! [`crate::clients::fleetlock`]; what follows from the protocol:
//! - There is no wait or watch: [`Semaphore::acquire`] asks again with capped exponential
//!   backoff ([`Options::backoff_min`] doubling up to [`Options::backoff_max`], ±10 % jitter),
//!   logging the server's answer each time it changes. Transient trouble (connection refused,
//!   time-outs, 5xx, 408, 429) is retried the same way; any other answer (4xx, 3xx) is a
//!   permanent [`LockError::Refused`] naming the URL, the status, the kind and the value.
//! - The server owns the semaphore's view: there is no call to read holders or the number of
//!   slots, nor to change them. So this backend implements only the agent's
//!   [`Semaphore`], not [`super::Admin`] (`rebootctl` says what it cannot do here);
//!   [`Semaphore::report_phase`] does nothing, and there is no heartbeat. [`Semaphore::fence`]
//!   asks `pre-reboot` once: the server grants it again to a holder.
//! - The holder id sent is [`Identity::id`]: `[lock.fleetlock] id`, else Zincati's id (the machine
//!   id made app-specific, `runtime::holder_id`); the group is `identity.group`.

use crate::lock::Backend;
use crate::state::Phase;
use std::time::Duration;

use async_trait::async_trait;

use super::{Fence, GroupPause, Identity, LockError, Pauses, Reported, Semaphore};
use crate::backoff::Backoff;
pub use crate::clients::fleetlock::Options;
use crate::clients::fleetlock::{Answer, Call, Client, NoAnswer};

const BACKEND: Backend = Backend::FleetLock;

/// What one round of `acquire` saw, to log only changes.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Seen {
    Taken(Option<String>, String),
    Trouble(String),
}

/// The lock backend over one FleetLock server and one group.
#[derive(Clone, Debug)]
pub struct FleetLock {
    client: Client,
}

impl FleetLock {
    /// The backend over the FleetLock server at `url` for `group` ([`Client::new`]: the URL's
    /// form, the group's and the TLS settings are checked; no request is made).
    pub fn new(url: &str, group: &str, options: Options) -> Result<Self, LockError> {
        Ok(FleetLock {
            client: Client::new(url, group, options)?,
        })
    }

    /// The base URL (without a trailing `/`).
    pub fn url(&self) -> &str {
        self.client.url()
    }

    pub fn group(&self) -> &str {
        self.client.group()
    }

    /// The pause between tries: `backoff_min` doubling up to `backoff_max`, ±10 % jitter so a
    /// fleet does not ask in lockstep.
    fn backoff(&self) -> Backoff {
        let o = self.client.options();
        Backoff::new(o.backoff_min, o.backoff_max)
    }

    fn unreachable(&self, call: Call, reason: NoAnswer) -> LockError {
        LockError::Unreachable {
            backend: BACKEND,
            target: self.client.endpoint(call).to_owned(),
            reason: reason.to_string(),
        }
    }

    fn refused(&self, call: Call, id: &str, answer: &Answer) -> LockError {
        LockError::Refused(format!(
            "FleetLock server refused {} for id {id} in group {}: POST {} answered HTTP {} \
             (kind {}, value {:?})",
            match call {
                Call::PreReboot => "a slot",
                Call::SteadyState => "the release",
            },
            self.client.group(),
            self.client.endpoint(call),
            answer.status.as_u16(),
            answer.kind(),
            answer.value,
        ))
    }

    fn server_error(&self, call: Call, answer: &Answer) -> LockError {
        LockError::Backend {
            backend: BACKEND,
            reason: format!(
                "POST {} answered HTTP {} (kind {}, value {:?})",
                self.client.endpoint(call),
                answer.status.as_u16(),
                answer.kind(),
                answer.value
            ),
        }
    }
}

/// The server owns its semaphore and the protocol has no pause: never paused.
#[async_trait]
impl Pauses for FleetLock {
    async fn group_pause(&self) -> Result<Option<GroupPause>, LockError> {
        Ok(None)
    }

    async fn group_pause_changed(
        &self,
        _known: Option<&GroupPause>,
    ) -> Result<Option<GroupPause>, LockError> {
        std::future::pending().await
    }
}

#[async_trait]
impl Semaphore for FleetLock {
    fn backend(&self) -> Backend {
        BACKEND
    }

    /// A FleetLock server keeps no record of the nodes beyond its own slots.
    fn fleet(&self) -> Option<&dyn crate::fleet::FleetStore> {
        None
    }

    /// `pre-reboot` until granted. "Slots taken" and transient trouble are retried with
    /// backoff for ever (the caller may drop the future); other refusals are errors.
    #[tracing::instrument(skip(self, me), fields(url = %self.client.endpoint(Call::PreReboot), group = %self.client.group(), id = %me.id))]
    async fn acquire(&self, me: &Identity) -> Result<(), LockError> {
        let mut backoff = self.backoff();
        let mut last: Option<Seen> = None;
        let mut attempts: u64 = 0;
        loop {
            attempts += 1;
            let seen = match self.client.post(Call::PreReboot, &me.id).await {
                Ok(a) if a.status.is_success() => {
                    tracing::info!(
                        url = %self.client.endpoint(Call::PreReboot),
                        group = %self.client.group(),
                        id = %me.id,
                        attempts,
                        "took a slot from the FleetLock server"
                    );
                    return Ok(());
                }
                Ok(a) if a.is_taken() => Seen::Taken(a.kind.clone(), a.value.clone()),
                Ok(a) if a.is_transient() => Seen::Trouble(a.to_string()),
                Ok(a) => {
                    let e = self.refused(Call::PreReboot, &me.id, &a);
                    tracing::error!(error = %e, "the FleetLock server refused the request");
                    return Err(e);
                }
                Err(reason) => Seen::Trouble(format!("unreachable: {reason}")),
            };
            let delay = backoff.next_jittered();
            if last.as_ref() != Some(&seen) {
                match &seen {
                    Seen::Taken(kind, value) => tracing::info!(
                        url = %self.client.endpoint(Call::PreReboot),
                        group = %self.client.group(),
                        id = %me.id,
                        kind = kind.as_deref().unwrap_or("-"),
                        value = %value,
                        retry_in = ?delay,
                        "waiting for a free slot: the FleetLock server has none; asking again with backoff"
                    ),
                    Seen::Trouble(what) => tracing::warn!(
                        url = %self.client.endpoint(Call::PreReboot),
                        group = %self.client.group(),
                        id = %me.id,
                        error = %what,
                        retry_in = ?delay,
                        "waiting for the FleetLock server: no usable answer; asking again with backoff"
                    ),
                }
                last = Some(seen);
            } else {
                tracing::debug!(url = %self.client.endpoint(Call::PreReboot), attempts, retry_in = ?delay, answer = ?last, "no slot yet");
            }
            tokio::time::sleep(delay).await;
        }
    }

    /// `steady-state`; transient errors are retried [`Options::release_attempts`] times.
    #[tracing::instrument(skip(self, me), fields(url = %self.client.endpoint(Call::SteadyState), group = %self.client.group(), id = %me.id))]
    async fn release(&self, me: &Identity) -> Result<(), LockError> {
        let id = me.id.as_str();
        let attempts = self.client.options().release_attempts.max(1);
        let mut backoff = self.backoff();
        let mut attempt = 1;
        loop {
            let err = match self.client.post(Call::SteadyState, id).await {
                Ok(a) if a.status.is_success() => {
                    tracing::info!(
                        url = %self.client.endpoint(Call::SteadyState),
                        group = %self.client.group(),
                        %id,
                        "released the slot (if held) at the FleetLock server"
                    );
                    return Ok(());
                }
                // A "taken" answer to an unlock is a server in trouble (airlock: 500
                // failed_lock when its etcd fails).
                Ok(a) if a.is_transient() || a.is_taken() => {
                    self.server_error(Call::SteadyState, &a)
                }
                Ok(a) => return Err(self.refused(Call::SteadyState, id, &a)),
                Err(reason) => self.unreachable(Call::SteadyState, reason),
            };
            if attempt >= attempts {
                tracing::warn!(error = %err, attempts, "giving up releasing the slot for now");
                return Err(err);
            }
            let delay = backoff.next_jittered();
            tracing::warn!(error = %err, attempt, retry_in = ?delay, "releasing the slot failed; retrying");
            tokio::time::sleep(delay).await;
            attempt += 1;
        }
    }

    async fn report_phase(&self, me: &Identity, phase: Phase) -> Result<Reported, LockError> {
        tracing::debug!(id = %me.id, %phase, "fleetlock keeps no phases; not recorded");
        Ok(Reported::Unproven)
    }

    /// One `pre-reboot`: the protocol grants it again to a holder, so a grant proves the slot
    /// is (still, or again) this node's, and "all slots taken" that it is not.
    #[tracing::instrument(skip(self, me), fields(url = %self.client.endpoint(Call::PreReboot), group = %self.client.group(), id = %me.id))]
    async fn fence(&self, me: &Identity) -> Result<Fence, LockError> {
        match self.client.post(Call::PreReboot, &me.id).await {
            Ok(a) if a.status.is_success() => Ok(Fence::Held),
            Ok(a) if a.is_taken() => Ok(Fence::Lost {
                why: format!(
                    "the FleetLock server at {} no longer grants {} a slot ({a})",
                    self.client.url(),
                    me.id
                ),
            }),
            Ok(a) if a.is_transient() => Err(self.server_error(Call::PreReboot, &a)),
            Ok(a) => Err(self.refused(Call::PreReboot, &me.id, &a)),
            Err(reason) => Err(self.unreachable(Call::PreReboot, reason)),
        }
    }

    /// The server keeps its holders for as long as it likes: nothing to keep fresh.
    fn heartbeat_every(&self) -> Option<Duration> {
        None
    }

    async fn heartbeat(&self, me: &Identity) -> Result<Fence, LockError> {
        self.fence(me).await
    }
}
