//! The adapters the runtime acts through: this host's Kubernetes node ([`NodeSeams`]: its drain
//! and what it shows) and the host itself ([`HostSeams`]: the reboot, logind's inhibitors, the
//! logged-in users).
//!
//! An adapter that cannot do a thing answers with a typed "unsupported"
//! ([`DrainError::Unsupported`], [`RebootError::Unsupported`]). This is the one place that
//! answer is handled: for what a host or node may go without (blocking pods, what the Node
//! shows, inhibitors, sessions) it is logged at debug the first time for each thing, and the
//! call is taken as having nothing to do (no blocker, no session, nothing shown). The reboot,
//! the drain, the wait for Ready and the cordon are what their seams are for: there it stays
//! an error, as every other error does.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::drain::{DrainError, Drainer, EventReason, NodeStatus};
use crate::inhibitor::{Inhibitor, Inhibitors};
use crate::reboot::{Logind, RebootError, Rebooter};
use crate::state::Phase;
use crate::users::{Session, Sessions};
use tracing::debug;

/// An error that may say "this implementation cannot do that".
trait MaybeUnsupported {
    /// What is not supported, if that is what the error says.
    fn unsupported(&self) -> Option<&'static str>;
}

impl MaybeUnsupported for DrainError {
    fn unsupported(&self) -> Option<&'static str> {
        match self {
            DrainError::Unsupported { what } => Some(what),
            _ => None,
        }
    }
}

impl MaybeUnsupported for RebootError {
    fn unsupported(&self) -> Option<&'static str> {
        match self {
            RebootError::Unsupported { what } => Some(what),
            _ => None,
        }
    }
}

/// What was found unsupported so far (each is logged once).
#[derive(Default)]
struct Unsupported(Mutex<HashSet<&'static str>>);

impl Unsupported {
    /// `result`, with "unsupported" turned into nothing to do (`T::default()`).
    fn or_nothing<T: Default, E: MaybeUnsupported>(&self, result: Result<T, E>) -> Result<T, E> {
        match result {
            Err(e) => match e.unsupported() {
                Some(what) => {
                    let first = self
                        .0
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .insert(what);
                    if first {
                        debug!(what, "{what} is not supported here: nothing to do");
                    }
                    Ok(T::default())
                }
                None => Err(e),
            },
            ok => ok,
        }
    }
}

/// This host's Kubernetes node: the drain, and what the Node shows of the reboot.
pub struct NodeSeams {
    drain: Arc<dyn Drainer>,
    status: Arc<dyn NodeStatus>,
    unsupported: Unsupported,
}

impl NodeSeams {
    /// One implementation of both seams (e.g. [`crate::drain::KubeDrainer`]).
    pub fn new<T: Drainer + NodeStatus + 'static>(node: T) -> NodeSeams {
        let node = Arc::new(node);
        NodeSeams::from_parts(node.clone(), node)
    }

    /// The drain and the node's status from separate implementations.
    pub fn from_parts(drain: Arc<dyn Drainer>, status: Arc<dyn NodeStatus>) -> NodeSeams {
        NodeSeams {
            drain,
            status,
            unsupported: Unsupported::default(),
        }
    }

    pub(super) async fn is_unschedulable(&self) -> Result<bool, DrainError> {
        self.drain.is_unschedulable().await
    }

    pub(super) async fn blocking_pods(&self) -> Result<Vec<String>, DrainError> {
        self.unsupported
            .or_nothing(self.drain.blocking_pods().await)
    }

    pub(super) async fn drain(&self) -> Result<(), DrainError> {
        self.drain.drain().await
    }

    pub(super) async fn wait_ready(&self, timeout: Duration) -> Result<(), DrainError> {
        self.drain.wait_ready(timeout).await
    }

    pub(super) async fn uncordon(&self) -> Result<(), DrainError> {
        self.drain.uncordon().await
    }

    pub(super) async fn annotate(
        &self,
        phase: Phase,
        since: jiff::Timestamp,
        reboot_needed: bool,
    ) -> Result<(), DrainError> {
        self.unsupported
            .or_nothing(self.status.annotate(phase, since, reboot_needed).await)
    }

    pub(super) async fn annotate_paused(&self, paused: Option<&str>) -> Result<(), DrainError> {
        self.unsupported
            .or_nothing(self.status.annotate_paused(paused).await)
    }

    pub(super) async fn annotate_group_paused(
        &self,
        paused: Option<&str>,
    ) -> Result<(), DrainError> {
        self.unsupported
            .or_nothing(self.status.annotate_group_paused(paused).await)
    }

    pub(super) async fn event(&self, reason: EventReason, message: &str) -> Result<(), DrainError> {
        self.unsupported
            .or_nothing(self.status.event(reason, message).await)
    }

    pub(super) async fn unmark(&self) -> Result<(), DrainError> {
        self.unsupported.or_nothing(self.status.unmark().await)
    }

    /// Whether the autoscaler's annotation was added (not supported: not added).
    pub(super) async fn disable_scale_down(&self) -> Result<bool, DrainError> {
        self.unsupported
            .or_nothing(self.status.disable_scale_down().await)
    }

    pub(super) async fn enable_scale_down(&self) -> Result<(), DrainError> {
        self.unsupported
            .or_nothing(self.status.enable_scale_down().await)
    }
}

/// The host: its reboot, the inhibitors that hold it off, the people to warn.
pub struct HostSeams {
    reboot: Arc<dyn Rebooter>,
    inhibitors: Arc<dyn Inhibitors>,
    sessions: Arc<dyn Sessions>,
    unsupported: Unsupported,
}

impl HostSeams {
    /// One implementation of the three seams (e.g. [`Logind`]).
    pub fn new<T: Rebooter + Inhibitors + Sessions + 'static>(host: T) -> HostSeams {
        let host = Arc::new(host);
        HostSeams::from_parts(host.clone(), host.clone(), host)
    }

    /// The reboot, the inhibitors and the sessions from separate implementations.
    pub fn from_parts(
        reboot: Arc<dyn Rebooter>,
        inhibitors: Arc<dyn Inhibitors>,
        sessions: Arc<dyn Sessions>,
    ) -> HostSeams {
        HostSeams {
            reboot,
            inhibitors,
            sessions,
            unsupported: Unsupported::default(),
        }
    }

    /// Through systemd-logind on the system bus.
    pub fn logind(respect_inhibitors: bool) -> HostSeams {
        HostSeams::new(Logind::new(respect_inhibitors))
    }

    pub(super) async fn reboot(&self, kind: crate::reboot_method::Kind) -> Result<(), RebootError> {
        self.reboot.reboot(kind).await
    }

    /// The service manager's version and soft reboot count; `None` where there is none to ask
    /// (a stand-in host) or it does not answer.
    pub(super) async fn manager(&self) -> Option<crate::systemd::Manager> {
        match self.reboot.manager().await {
            Ok(m) => Some(m),
            Err(RebootError::Unsupported { .. }) => None,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read systemd's version and soft reboot count");
                None
            }
        }
    }

    pub(super) async fn blockers(&self) -> Result<Vec<Inhibitor>, RebootError> {
        self.unsupported
            .or_nothing(self.inhibitors.blockers().await)
    }

    pub(super) async fn blockers_changed(
        &self,
        known: &[Inhibitor],
    ) -> Result<Vec<Inhibitor>, RebootError> {
        self.unsupported
            .or_nothing(self.inhibitors.blockers_changed(known).await)
    }

    pub(super) async fn sessions(&self) -> Result<Vec<Session>, RebootError> {
        self.unsupported.or_nothing(self.sessions.sessions().await)
    }

    pub(super) async fn announce(&self, at: jiff::Timestamp) -> Result<(), RebootError> {
        self.unsupported
            .or_nothing(self.sessions.announce(at).await)
    }

    pub(super) async fn withdraw(&self) -> Result<(), RebootError> {
        self.unsupported.or_nothing(self.sessions.withdraw().await)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unsupported_is_nothing_to_do_and_other_errors_stay() {
        let told = Unsupported::default();
        let r: Result<Vec<String>, DrainError> = told.or_nothing(Err(DrainError::Unsupported {
            what: "Node Events",
        }));
        assert!(r.expect("nothing to do").is_empty());
        let again: Result<(), RebootError> =
            told.or_nothing(Err(RebootError::Unsupported { what: "sessions" }));
        assert!(again.is_ok());
        let bus: Result<(), RebootError> = told.or_nothing(Err(RebootError::Bus("gone".into())));
        assert!(matches!(bus, Err(RebootError::Bus(_))));
    }
}
