//! What rebootd reads from systemd over the system bus, beside logind's reboot: the service
//! manager's `Version` and `SoftRebootsCount` (org.freedesktop.systemd1.Manager), and logind's
//! `DesignatedMaintenanceTime` (systemd 257). Each read is bounded in time.
//!
//! A soft reboot keeps the kernel, so the boot id stays; the manager counts soft reboots since
//! the kernel booted in `SoftRebootsCount` (systemd 254), and that count, saved before the call
//! and compared after, is the proof that one happened (see `agent::start`).

use std::time::Duration;

/// How long one property read may take.
const READ_TIMEOUT: Duration = Duration::from_secs(25);

const SYSTEMD1: &str = "org.freedesktop.systemd1";
const SYSTEMD1_PATH: &str = "/org/freedesktop/systemd1";
const SYSTEMD1_MANAGER: &str = "org.freedesktop.systemd1.Manager";
const LOGIN1: &str = "org.freedesktop.login1";
const LOGIN1_PATH: &str = "/org/freedesktop/login1";
const LOGIN1_MANAGER: &str = "org.freedesktop.login1.Manager";

/// Why a property of systemd could not be read.
#[derive(Debug, thiserror::Error)]
pub enum SystemdError {
    #[error("cannot reach {service} on the system bus: {reason}")]
    Bus {
        service: &'static str,
        reason: String,
    },
    /// The property does not exist here (an older systemd).
    #[error("{interface} has no property {property} here{version}")]
    Missing {
        interface: &'static str,
        property: &'static str,
        /// `" (systemd VERSION)"` when the manager's version was read.
        version: String,
    },
    #[error("{property} of {interface} is not a {expected}")]
    Type {
        interface: &'static str,
        property: &'static str,
        expected: &'static str,
    },
}

/// The service manager, as read once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Manager {
    /// `Version`, e.g. `257.13-1~deb13u1`.
    pub version: String,
    /// `SoftRebootsCount`; `None` on systemd before 254, which has no such property.
    pub soft_reboots: Option<u64>,
}

async fn system_bus(service: &'static str) -> Result<zbus::Connection, SystemdError> {
    zbus::Connection::system()
        .await
        .map_err(|e| SystemdError::Bus {
            service,
            reason: e.to_string(),
        })
}

/// One property, or `None` when the object has no such property (UnknownProperty,
/// InvalidArgs: what systemd answers for a name it does not know).
async fn property(
    conn: &zbus::Connection,
    service: &'static str,
    path: &'static str,
    interface: &'static str,
    name: &'static str,
) -> Result<Option<zbus::zvariant::OwnedValue>, SystemdError> {
    let bus = |reason: String| SystemdError::Bus { service, reason };
    let props = zbus::fdo::PropertiesProxy::builder(conn)
        .destination(service)
        .and_then(|b| b.path(path))
        .map_err(|e| bus(e.to_string()))?
        .build()
        .await
        .map_err(|e| bus(e.to_string()))?;
    let iface = zbus::names::InterfaceName::try_from(interface).map_err(|e| bus(e.to_string()))?;
    match tokio::time::timeout(READ_TIMEOUT, props.get(iface, name)).await {
        Err(_) => Err(bus(format!("reading {name} took over {READ_TIMEOUT:?}"))),
        Ok(Ok(v)) => Ok(Some(v)),
        Ok(Err(
            zbus::fdo::Error::UnknownProperty(_)
            | zbus::fdo::Error::InvalidArgs(_)
            | zbus::fdo::Error::UnknownInterface(_),
        )) => Ok(None),
        Ok(Err(e)) => Err(bus(format!("reading {name}: {e}"))),
    }
}

/// The manager's `Version` and `SoftRebootsCount`.
pub async fn manager() -> Result<Manager, SystemdError> {
    let conn = system_bus(SYSTEMD1).await?;
    let get = |name| property(&conn, SYSTEMD1, SYSTEMD1_PATH, SYSTEMD1_MANAGER, name);
    let version = match get("Version").await? {
        Some(v) => String::try_from(v).map_err(|_| SystemdError::Type {
            interface: SYSTEMD1_MANAGER,
            property: "Version",
            expected: "string",
        })?,
        None => {
            return Err(SystemdError::Missing {
                interface: SYSTEMD1_MANAGER,
                property: "Version",
                version: String::new(),
            })
        }
    };
    let soft_reboots = match get("SoftRebootsCount").await? {
        None => None,
        Some(v) => Some(count(v).ok_or(SystemdError::Type {
            interface: SYSTEMD1_MANAGER,
            property: "SoftRebootsCount",
            expected: "number",
        })?),
    };
    Ok(Manager {
        version,
        soft_reboots,
    })
}

/// An unsigned count of any width (systemd 257 sends `u`).
fn count(v: zbus::zvariant::OwnedValue) -> Option<u64> {
    match &*v {
        zbus::zvariant::Value::U32(n) => Some(u64::from(*n)),
        zbus::zvariant::Value::U64(n) => Some(*n),
        zbus::zvariant::Value::U16(n) => Some(u64::from(*n)),
        _ => None,
    }
}

/// logind's `DesignatedMaintenanceTime` (systemd 257, `logind.conf`'s
/// `DesignatedMaintenanceTime=`): a calendar spec, empty when not set. An older logind has no
/// such property: [`SystemdError::Missing`], naming the manager's version when it reads.
pub async fn designated_maintenance_time() -> Result<String, SystemdError> {
    let conn = system_bus(LOGIN1).await?;
    let got = property(
        &conn,
        LOGIN1,
        LOGIN1_PATH,
        LOGIN1_MANAGER,
        "DesignatedMaintenanceTime",
    )
    .await?;
    match got {
        Some(v) => String::try_from(v).map_err(|_| SystemdError::Type {
            interface: LOGIN1_MANAGER,
            property: "DesignatedMaintenanceTime",
            expected: "string",
        }),
        None => Err(SystemdError::Missing {
            interface: LOGIN1_MANAGER,
            property: "DesignatedMaintenanceTime",
            version: match manager().await {
                Ok(m) => format!(" (systemd {}; it appeared in 257)", m.version),
                Err(_) => " (it appeared in systemd 257)".into(),
            },
        }),
    }
}
