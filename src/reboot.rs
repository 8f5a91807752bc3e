//! Rebooting the host through systemd-logind: `RebootWithFlags` (flag 1 makes root respect block
//! inhibitors too), falling back to `Reboot(false)` on a logind that lacks it. A refusal because
//! of a block inhibitor names who holds it.

use async_trait::async_trait;
use tracing::{info, instrument, warn};

/// `SD_LOGIND_ROOT_CHECK_INHIBITORS`: root also honours block inhibitors.
pub const FLAG_ROOT_CHECK_INHIBITORS: u64 = 1;

const BLOCKED: &str = "org.freedesktop.login1.BlockedByInhibitorLock";
const UNKNOWN_METHOD: &str = "org.freedesktop.DBus.Error.UnknownMethod";

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
}

#[derive(Debug, thiserror::Error)]
pub enum RebootError {
    #[error("blocked by inhibitor lock(s): {holders}")]
    Blocked { holders: String },
    #[error("logind refused the reboot: {0}")]
    Refused(String),
    #[error("cannot reach logind on the system bus: {0}")]
    Bus(String),
}

/// The seam through which the agent reboots the host.
#[async_trait]
pub trait Rebooter: Send + Sync {
    /// Ask for a reboot. Ok means the request was accepted, not that the host went down.
    async fn reboot(&self) -> Result<(), RebootError>;
}

/// Reboots through systemd-logind on the system bus.
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
            _ => None,
        },
        _ => None,
    }
}

/// Describe the block inhibitors on shutdown, e.g. `backup (nightly dump, pid 42)`.
async fn blockers(proxy: &Login1ManagerProxy<'_>) -> String {
    match proxy.list_inhibitors().await {
        Ok(list) => {
            let held: Vec<String> = list
                .into_iter()
                .filter(|(what, _, _, mode, _, _)| {
                    mode == "block" && what.split(':').any(|w| w == "shutdown")
                })
                .map(|(_, who, why, _, uid, pid)| format!("{who} ({why}, uid {uid}, pid {pid})"))
                .collect();
            if held.is_empty() {
                "an inhibitor that is gone now".into()
            } else {
                held.join(", ")
            }
        }
        Err(e) => format!("unknown (ListInhibitors failed: {e})"),
    }
}

#[async_trait]
impl Rebooter for Logind {
    #[instrument(skip(self), fields(respect_inhibitors = self.respect_inhibitors))]
    async fn reboot(&self) -> Result<(), RebootError> {
        let conn = zbus::Connection::system()
            .await
            .map_err(|e| RebootError::Bus(e.to_string()))?;
        let proxy = Login1ManagerProxy::new(&conn)
            .await
            .map_err(|e| RebootError::Bus(e.to_string()))?;
        let flags = if self.respect_inhibitors {
            FLAG_ROOT_CHECK_INHIBITORS
        } else {
            0
        };
        let result = match proxy.reboot_with_flags(flags).await {
            Err(e) if error_name(&e).as_deref() == Some(UNKNOWN_METHOD) => {
                warn!("logind has no RebootWithFlags; falling back to Reboot(false)");
                proxy.reboot(false).await
            }
            other => other,
        };
        match result {
            Ok(()) => {
                info!(flags, "logind accepted the reboot");
                Ok(())
            }
            Err(e) if error_name(&e).as_deref() == Some(BLOCKED) => Err(RebootError::Blocked {
                holders: blockers(&proxy).await,
            }),
            Err(zbus::Error::MethodError(name, msg, _)) => Err(RebootError::Refused(format!(
                "{name}: {}",
                msg.unwrap_or_default()
            ))),
            Err(e) => Err(RebootError::Bus(e.to_string())),
        }
    }
}
