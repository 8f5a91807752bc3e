//! Rebooting the host through systemd-logind: `RebootWithFlags` (flag 1 makes root respect other
//! users' block inhibitors too), falling back to `Reboot(false)` on a logind that lacks it. A
//! refusal because of a block inhibitor names who holds it.
//!
//! logind lets a caller through the block inhibitors of its own uid, so for root the flag only
//! counts other users' inhibitors (see [`crate::inhibitor`]). With inhibitors respected, the
//! agent therefore asks [`Inhibitors::blockers`] first and waits with
//! [`Inhibitors::blockers_changed`] while any is held; the flag stays as the last word for one
//! taken between the check and the call.
//!
//! [`Logind`] implements the three logind seams: [`Rebooter`], [`Inhibitors`] and
//! [`Sessions`] (the warning to logged-in users, see [`crate::users`]).

use crate::inhibitor::{self, Inhibitor, Inhibitors};
use crate::reboot_method::Kind;
use crate::users::{self, Session, Sessions};
use async_trait::async_trait;
use futures_util::StreamExt;
use std::time::Duration;
use tracing::{debug, info, instrument, warn};

/// `SD_LOGIND_ROOT_CHECK_INHIBITORS`: root also honours block inhibitors.
pub const FLAG_ROOT_CHECK_INHIBITORS: u64 = 1;

const BLOCKED: &str = "org.freedesktop.login1.BlockedByInhibitorLock";
const ACCESS_DENIED: &str = "org.freedesktop.DBus.Error.AccessDenied";
const UNKNOWN_METHOD: &str = "org.freedesktop.DBus.Error.UnknownMethod";
/// What logind (systemd 248 and later, `verify_shutdown_creds`) says when root asked with
/// [`FLAG_ROOT_CHECK_INHIBITORS`] and another user holds a block inhibitor; the error is
/// `org.freedesktop.DBus.Error.AccessDenied` (seen with systemd 252).
pub const ROOT_BLOCKED_MESSAGE: &str = "Access denied to root due to active block inhibitor";

/// How long one `ListInhibitors` call may take: a wait that lists must not hang on a logind
/// that stopped answering while the watchdog is fed (the call's duty is to answer).
const LIST_TIMEOUT: Duration = Duration::from_secs(25);
/// While inhibitors block, the list is read again when logind signals a change of its
/// `BlockInhibited` property (it does at every inhibitor taken or released, whatever the value)
/// and, in case a signal was missed, at least this often.
pub const INHIBITOR_RECHECK: Duration = Duration::from_secs(300);

#[zbus::proxy(
    interface = "org.freedesktop.login1.Manager",
    default_service = "org.freedesktop.login1",
    default_path = "/org/freedesktop/login1"
)]
pub trait Login1Manager {
    fn reboot_with_flags(&self, flags: u64) -> zbus::Result<()>;
    fn reboot(&self, interactive: bool) -> zbus::Result<()>;
    /// (what, who, why, mode, uid, pid)
    fn list_inhibitors(&self) -> zbus::Result<Vec<(String, String, String, String, u32, u32)>>;
    /// (session id, uid, user name, seat id, object path)
    fn list_sessions(
        &self,
    ) -> zbus::Result<Vec<(String, u32, String, String, zbus::zvariant::OwnedObjectPath)>>;
    fn schedule_shutdown(&self, kind: &str, usec: u64) -> zbus::Result<()>;
    fn cancel_scheduled_shutdown(&self) -> zbus::Result<bool>;
}

#[zbus::proxy(
    interface = "org.freedesktop.login1.Session",
    default_service = "org.freedesktop.login1"
)]
pub trait Login1Session {
    #[zbus(property, name = "TTY")]
    fn tty(&self) -> zbus::Result<String>;
    #[zbus(property)]
    fn class(&self) -> zbus::Result<String>;
}

/// Why a logind call (a reboot, the inhibitors, the sessions) did not succeed.
#[derive(Debug, thiserror::Error)]
pub enum RebootError {
    #[error("blocked by inhibitor lock(s): {holders}")]
    Blocked { holders: String },
    #[error("logind refused the reboot: {0}")]
    Refused(String),
    #[error("cannot reach logind on the system bus: {0}")]
    Bus(String),
    /// The reboot call was sent but no answer came back (the connection or the bus failed):
    /// logind may have accepted it.
    #[error("no answer from logind to the reboot call: {0}")]
    Unanswered(String),
    /// This implementation cannot do `what` (e.g. a stand-in host without logind's sessions).
    #[error("{what} is not supported here")]
    Unsupported { what: &'static str },
}

/// The seam through which the agent reboots the host.
#[async_trait]
pub trait Rebooter: Send + Sync {
    /// Ask for a reboot of this kind. Ok means the request was accepted, not that the host
    /// went down.
    async fn reboot(&self, kind: Kind) -> Result<(), RebootError>;
    /// The service manager's version and soft reboot count, read before the call (the proof
    /// of a soft reboot) and to choose one (`reboot.method = "auto"`).
    async fn manager(&self) -> Result<crate::systemd::Manager, RebootError>;
}

/// Reboots, lists inhibitors and warns logged-in users through systemd-logind on the system bus.
pub struct Logind {
    respect_inhibitors: bool,
}

impl Logind {
    pub fn new(respect_inhibitors: bool) -> Logind {
        Logind { respect_inhibitors }
    }
}

fn error_name(e: &zbus::Error) -> Option<String> {
    match e {
        zbus::Error::MethodError(name, _, _) => Some(name.to_string()),
        zbus::Error::FDO(fdo) => match **fdo {
            zbus::fdo::Error::UnknownMethod(_) => Some(UNKNOWN_METHOD.to_string()),
            zbus::fdo::Error::AccessDenied(_) => Some(ACCESS_DENIED.to_string()),
            _ => None,
        },
        _ => None,
    }
}

/// Whether an error from a call sent to logind is logind's answer. The bus's own "no reply",
/// time-outs, a lost connection or a broken read are not: the call may have been carried out.
fn answered(e: &zbus::Error) -> bool {
    use zbus::DBusError;
    const NOT_ANSWERS: [&str; 4] = [
        "org.freedesktop.DBus.Error.NoReply",
        "org.freedesktop.DBus.Error.Timeout",
        "org.freedesktop.DBus.Error.TimedOut",
        "org.freedesktop.DBus.Error.Disconnected",
    ];
    match e {
        zbus::Error::MethodError(name, _, _) => !NOT_ANSWERS.contains(&name.as_str()),
        zbus::Error::FDO(fdo) => !NOT_ANSWERS.contains(&fdo.name().as_str()),
        _ => false,
    }
}

fn error_message(e: &zbus::Error) -> String {
    match e {
        zbus::Error::MethodError(_, msg, _) => msg.clone().unwrap_or_default(),
        zbus::Error::FDO(fdo) => match &**fdo {
            zbus::fdo::Error::AccessDenied(m) => m.clone(),
            other => other.to_string(),
        },
        other => other.to_string(),
    }
}

/// Whether logind refused because of a block inhibitor: `BlockedByInhibitorLock`, or the
/// `AccessDenied` with [`ROOT_BLOCKED_MESSAGE`] that root gets.
pub fn refused_by_inhibitor(name: &str, message: &str) -> bool {
    name == BLOCKED || (name == ACCESS_DENIED && message.contains("block inhibitor"))
}

/// The block inhibitors on shutdown, read with a bounded call.
async fn list_blockers(proxy: &Login1ManagerProxy<'_>) -> Result<Vec<Inhibitor>, RebootError> {
    bounded("ListInhibitors", proxy.list_inhibitors())
        .await
        .map(inhibitor::blocking)
}

/// A logind call other than the reboot itself, bounded by [`LIST_TIMEOUT`].
async fn bounded<T>(
    what: &str,
    call: impl std::future::Future<Output = zbus::Result<T>>,
) -> Result<T, RebootError> {
    match tokio::time::timeout(LIST_TIMEOUT, call).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(RebootError::Bus(format!("{what}: {e}"))),
        Err(_) => Err(RebootError::Bus(format!(
            "{what} did not answer within {LIST_TIMEOUT:?}"
        ))),
    }
}

async fn connect() -> Result<(zbus::Connection, Login1ManagerProxy<'static>), RebootError> {
    let conn = zbus::Connection::system()
        .await
        .map_err(|e| RebootError::Bus(e.to_string()))?;
    let proxy = Login1ManagerProxy::new(&conn)
        .await
        .map_err(|e| RebootError::Bus(e.to_string()))?;
    Ok((conn, proxy))
}

/// Describe the block inhibitors on shutdown, e.g. `backup (nightly dump; uid 0, pid 42)`.
async fn describe_blockers(proxy: &Login1ManagerProxy<'_>) -> String {
    match list_blockers(proxy).await {
        Ok(held) if held.is_empty() => "an inhibitor that is gone now".into(),
        Ok(held) => inhibitor::describe(&held),
        Err(e) => format!("unknown ({e})"),
    }
}

#[async_trait]
impl Rebooter for Logind {
    #[instrument(skip(self), fields(respect_inhibitors = self.respect_inhibitors))]
    async fn reboot(&self, kind: Kind) -> Result<(), RebootError> {
        let (_conn, proxy) = connect().await?;
        let flags = if self.respect_inhibitors {
            FLAG_ROOT_CHECK_INHIBITORS
        } else {
            0
        } | kind.flags();
        let result = match proxy.reboot_with_flags(flags).await {
            Err(e) if error_name(&e).as_deref() == Some(UNKNOWN_METHOD) => {
                warn!(%kind, "logind has no RebootWithFlags; falling back to a full Reboot(false)");
                proxy.reboot(false).await
            }
            other => other,
        };
        match result {
            Ok(()) => {
                info!(flags, %kind, "logind accepted the reboot ({kind})");
                Ok(())
            }
            Err(e)
                if error_name(&e)
                    .is_some_and(|name| refused_by_inhibitor(&name, &error_message(&e))) =>
            {
                Err(RebootError::Blocked {
                    holders: describe_blockers(&proxy).await,
                })
            }
            Err(e) if !answered(&e) => Err(RebootError::Unanswered(e.to_string())),
            Err(zbus::Error::MethodError(name, msg, _)) => Err(RebootError::Refused(format!(
                "{name}: {}",
                msg.unwrap_or_default()
            ))),
            Err(e) => Err(RebootError::Bus(e.to_string())),
        }
    }

    async fn manager(&self) -> Result<crate::systemd::Manager, RebootError> {
        crate::systemd::manager()
            .await
            .map_err(|e| RebootError::Bus(e.to_string()))
    }
}

#[async_trait]
impl Sessions for Logind {
    #[instrument(skip_all)]
    async fn sessions(&self) -> Result<Vec<Session>, RebootError> {
        let (conn, proxy) = connect().await?;
        let listed = bounded("ListSessions", proxy.list_sessions()).await?;
        let mut people = Vec::new();
        for (id, uid, user, seat, path) in listed {
            let session = Login1SessionProxy::builder(&conn)
                .path(path.clone())
                .map_err(|e| RebootError::Bus(format!("session {id} at {}: {e}", path.as_str())))?
                .build()
                .await
                .map_err(|e| RebootError::Bus(format!("session {id}: {e}")))?;
            // A session gone between the list and the read has no one to warn.
            let (Ok(tty), Ok(class)) = (session.tty().await, session.class().await) else {
                debug!(session = %id, "session gone before its properties were read");
                continue;
            };
            if users::counts(&class, &seat, &tty) {
                people.push(Session {
                    id,
                    user,
                    uid,
                    seat,
                    tty,
                });
            }
        }
        Ok(people)
    }

    #[instrument(skip(self))]
    async fn announce(&self, at: jiff::Timestamp) -> Result<(), RebootError> {
        let (_conn, proxy) = connect().await?;
        bounded(
            "ScheduleShutdown",
            proxy.schedule_shutdown(users::DRY_REBOOT, users::usec(at)),
        )
        .await
    }

    #[instrument(skip(self))]
    async fn withdraw(&self) -> Result<(), RebootError> {
        let (_conn, proxy) = connect().await?;
        let cancelled =
            bounded("CancelScheduledShutdown", proxy.cancel_scheduled_shutdown()).await?;
        debug!(
            cancelled,
            "withdrew the reboot announced to logged-in users"
        );
        Ok(())
    }
}

/// With `[reboot] inhibitors = "ignore"` none is looked at: nothing blocks.
#[async_trait]
impl Inhibitors for Logind {
    #[instrument(skip_all)]
    async fn blockers(&self) -> Result<Vec<Inhibitor>, RebootError> {
        if !self.respect_inhibitors {
            return Ok(Vec::new());
        }
        let (_conn, proxy) = connect().await?;
        list_blockers(&proxy).await
    }

    #[instrument(skip_all)]
    async fn blockers_changed(&self, known: &[Inhibitor]) -> Result<Vec<Inhibitor>, RebootError> {
        if !self.respect_inhibitors {
            return Ok(Vec::new());
        }
        let (conn, proxy) = connect().await?;
        // Subscribed before listing, so a release between the two is not missed.
        let rule = zbus::MatchRule::builder()
            .msg_type(zbus::message::Type::Signal)
            .sender("org.freedesktop.login1")
            .and_then(|b| b.path("/org/freedesktop/login1"))
            .and_then(|b| b.interface("org.freedesktop.DBus.Properties"))
            .and_then(|b| b.member("PropertiesChanged"))
            .and_then(|b| b.add_arg("org.freedesktop.login1.Manager"))
            .map_err(|e| RebootError::Bus(e.to_string()))?
            .build();
        let mut changes = zbus::MessageStream::for_match_rule(rule, &conn, Some(16))
            .await
            .map_err(|e| RebootError::Bus(format!("subscribing to logind's changes: {e}")))?;
        loop {
            let now = list_blockers(&proxy).await?;
            if now != known {
                return Ok(now);
            }
            tokio::select! {
                got = changes.next() => match got {
                    Some(_) => debug!("logind's inhibitors changed"),
                    None => return Err(RebootError::Bus("the system bus connection closed".into())),
                },
                _ = tokio::time::sleep(INHIBITOR_RECHECK) => {
                    debug!("no change signalled in {INHIBITOR_RECHECK:?}; listing again");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_for_an_inhibitor_is_told_from_other_refusals() {
        assert!(refused_by_inhibitor(ACCESS_DENIED, ROOT_BLOCKED_MESSAGE));
        assert!(refused_by_inhibitor(BLOCKED, "Operation inhibited by ..."));
        assert!(!refused_by_inhibitor(ACCESS_DENIED, "Access denied"));
        assert!(!refused_by_inhibitor(
            "org.freedesktop.login1.OperationInProgress",
            "block inhibitor"
        ));
    }
}
