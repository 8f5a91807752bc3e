//! The lab's stand-in for systemd-logind: [`FakeLogind`] owns `org.freedesktop.login1` on a bus
//! and serves `org.freedesktop.login1.Manager` at `/org/freedesktop/login1` with
//! `RebootWithFlags` (optional), `Reboot`, `Inhibit` (real fd passing) and `ListInhibitors`,
//! `ListSessions` with session objects and `ScheduleShutdown` / `CancelScheduledShutdown`
//! (recorded, never carried out; see `sessions`), and emits `PropertiesChanged` for `BlockInhibited` whenever an inhibitor is taken or
//! released, as logind does.
//! It never reboots anything: accepted reboot calls are recorded and broadcast to subscribers,
//! which is how the lab's node harness "reboots" a node.
//!
//! Block inhibitors follow logind's rule (systemd's `verify_shutdown_creds`, checked against
//! systemd 252 in `tests/nspawn.rs`): a caller is let through the block inhibitors of its own
//! uid. Another uid's block inhibitor makes root's `RebootWithFlags` with
//! `SD_LOGIND_ROOT_CHECK_INHIBITORS` fail with `org.freedesktop.DBus.Error.AccessDenied`
//! ([`ROOT_BLOCKED_MESSAGE`]); without the flag, and with the legacy `Reboot`, root goes
//! through (it may override inhibitors). There is no polkit here: a caller other than root is
//! refused when another uid's block inhibitor is held, and let through otherwise.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::AsyncReadExt as _;
use tokio::sync::{broadcast, watch};
use zbus::message::{Header, Message};
use zbus::names::ErrorName;
use zbus::zvariant::OwnedObjectPath;

use crate::dbus::LabError;

mod sessions;
pub use sessions::{FakeSession, Schedule};

/// Well-known bus name.
pub const BUS_NAME: &str = "org.freedesktop.login1";
/// Object path.
pub const OBJECT_PATH: &str = "/org/freedesktop/login1";
/// Interface name.
pub const INTERFACE: &str = "org.freedesktop.login1.Manager";

/// `RebootWithFlags` flag: root also respects block inhibitors.
pub const SD_LOGIND_ROOT_CHECK_INHIBITORS: u64 = 1 << 0;
/// `RebootWithFlags` flag: reboot via kexec (accepted, recorded, otherwise ignored).
pub const SD_LOGIND_REBOOT_VIA_KEXEC: u64 = 1 << 1;
/// `RebootWithFlags` flag: soft reboot (accepted, recorded, otherwise ignored).
pub const SD_LOGIND_SOFT_REBOOT: u64 = 1 << 2;
/// `RebootWithFlags` flag: soft reboot if a new root is set up (accepted, recorded).
pub const SD_LOGIND_SOFT_REBOOT_IF_NEXTROOT_SET_UP: u64 = 1 << 3;
/// Every flag the fake accepts; any other bit fails with `org.freedesktop.DBus.Error.InvalidArgs`.
pub const KNOWN_FLAGS: u64 = SD_LOGIND_ROOT_CHECK_INHIBITORS
    | SD_LOGIND_REBOOT_VIA_KEXEC
    | SD_LOGIND_SOFT_REBOOT
    | SD_LOGIND_SOFT_REBOOT_IF_NEXTROOT_SET_UP;

/// D-Bus error name of a reboot refused because of a block inhibitor (logind's, for callers
/// other than root).
pub const ERROR_BLOCKED: &str = "org.freedesktop.login1.BlockedByInhibitorLock";
/// D-Bus error name root gets when another uid's block inhibitor refuses its reboot.
pub const ERROR_ACCESS_DENIED: &str = "org.freedesktop.DBus.Error.AccessDenied";
/// logind's message with [`ERROR_ACCESS_DENIED`] for root (systemd 252, seen in a container).
pub const ROOT_BLOCKED_MESSAGE: &str = "Access denied to root due to active block inhibitor";
/// D-Bus error name of a call with bad arguments.
pub const ERROR_INVALID_ARGS: &str = "org.freedesktop.DBus.Error.InvalidArgs";

/// Values `Inhibit` accepts in `what` (colon-separated).
const KNOWN_WHAT: &[&str] = &[
    "shutdown",
    "sleep",
    "idle",
    "handle-power-key",
    "handle-suspend-key",
    "handle-hibernate-key",
    "handle-lid-switch",
    "handle-reboot-key",
];

/// How the fake starts. (Not `Copy`, so options can grow.)
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeLogindOptions {
    /// Serve `RebootWithFlags` (systemd >= 248). When false the method does not exist at all,
    /// so callers get `org.freedesktop.DBus.Error.UnknownMethod` and must fall back to `Reboot`.
    pub reboot_with_flags: bool,
    /// Accept a reboot call, then leave the bus without answering it, as logind does when the
    /// host goes down before its answer is out: the caller gets the bus's `NoReply`. The call
    /// is recorded (and announced) like any accepted one.
    pub lose_reboot_answers: bool,
}

impl Default for FakeLogindOptions {
    fn default() -> Self {
        FakeLogindOptions {
            reboot_with_flags: true,
            lose_reboot_answers: false,
        }
    }
}

/// One accepted reboot call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RebootCall {
    /// `"RebootWithFlags"` or `"Reboot"`.
    pub method: String,
    /// The flags of `RebootWithFlags`; 0 for `Reboot`.
    pub flags: u64,
}

/// One inhibitor, as `ListInhibitors` shows it (plus the fake's own id).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inhibitor {
    /// The fake's identifier; not visible on the bus.
    pub id: u64,
    pub what: String,
    pub who: String,
    pub why: String,
    /// `"block"` or `"delay"`.
    pub mode: String,
    pub uid: u32,
    pub pid: u32,
}

impl Inhibitor {
    fn blocks_shutdown(&self) -> bool {
        self.mode == "block" && self.what.split(':').any(|w| w == "shutdown")
    }
}

/// Errors the fake answers method calls with.
#[derive(Debug)]
enum LogindError {
    Blocked(String),
    AccessDenied(String),
    InvalidArgs(String),
    Failed(String),
}

impl zbus::DBusError for LogindError {
    fn create_reply(&self, call: &Header<'_>) -> zbus::Result<Message> {
        Message::error(call, self.name())?.build(&(self.description().unwrap_or_default(),))
    }

    fn name(&self) -> ErrorName<'_> {
        ErrorName::from_static_str_unchecked(match self {
            LogindError::Blocked(_) => ERROR_BLOCKED,
            LogindError::AccessDenied(_) => ERROR_ACCESS_DENIED,
            LogindError::InvalidArgs(_) => ERROR_INVALID_ARGS,
            LogindError::Failed(_) => "org.freedesktop.DBus.Error.Failed",
        })
    }

    fn description(&self) -> Option<&str> {
        match self {
            LogindError::Blocked(m)
            | LogindError::AccessDenied(m)
            | LogindError::InvalidArgs(m)
            | LogindError::Failed(m) => Some(m),
        }
    }
}

impl From<zbus::Error> for LogindError {
    fn from(e: zbus::Error) -> Self {
        LogindError::Failed(e.to_string())
    }
}

impl From<zbus::fdo::Error> for LogindError {
    fn from(e: zbus::fdo::Error) -> Self {
        LogindError::Failed(e.to_string())
    }
}

type ListedInhibitor = (String, String, String, String, u32, u32);

#[derive(Debug)]
struct Shared {
    inhibitors: watch::Sender<Vec<Inhibitor>>,
    next_id: AtomicU64,
    calls: Mutex<Vec<RebootCall>>,
    refused: AtomicUsize,
    reboots: broadcast::Sender<RebootCall>,
    shutdown: watch::Sender<bool>,
    sessions: sessions::Sessions,
    lose_reboot_answers: bool,
}

impl Shared {
    fn new(lose_reboot_answers: bool) -> Self {
        Shared {
            lose_reboot_answers,
            inhibitors: watch::Sender::new(Vec::new()),
            next_id: AtomicU64::new(1),
            calls: Mutex::new(Vec::new()),
            refused: AtomicUsize::new(0),
            reboots: broadcast::channel(64).0,
            shutdown: watch::Sender::new(false),
            sessions: sessions::Sessions::new(),
        }
    }

    fn add_inhibitor(
        &self,
        what: &str,
        who: &str,
        why: &str,
        mode: &str,
        uid: u32,
        pid: u32,
    ) -> u64 {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let inhibitor = Inhibitor {
            id,
            what: what.to_owned(),
            who: who.to_owned(),
            why: why.to_owned(),
            mode: mode.to_owned(),
            uid,
            pid,
        };
        tracing::debug!(?inhibitor, "fake logind: inhibitor taken");
        self.inhibitors.send_modify(|v| v.push(inhibitor));
        id
    }

    fn remove_inhibitor(&self, id: u64) {
        self.inhibitors.send_if_modified(|v| {
            let before = v.len();
            v.retain(|i| i.id != id);
            let removed = v.len() != before;
            if removed {
                tracing::debug!(id, "fake logind: inhibitor released");
            }
            removed
        });
    }

    fn record(&self, call: RebootCall) {
        tracing::info!(method = %call.method, flags = call.flags, "fake logind: reboot accepted");
        self.calls.lock().expect("calls lock").push(call.clone());
        // No subscriber is fine: the call is still recorded.
        let _ = self.reboots.send(call);
    }

    /// logind's check (`verify_shutdown_creds`): the block inhibitors on shutdown of other uids
    /// than the caller's count; root overrides them unless it asked with
    /// `SD_LOGIND_ROOT_CHECK_INHIBITORS`.
    fn check_inhibitors(&self, caller: u32, flags: u64) -> Result<(), LogindError> {
        let blocker = self
            .inhibitors
            .borrow()
            .iter()
            .find(|i| i.blocks_shutdown() && i.uid != caller)
            .cloned();
        let Some(i) = blocker else { return Ok(()) };
        if caller == 0 && flags & SD_LOGIND_ROOT_CHECK_INHIBITORS == 0 {
            return Ok(());
        }
        self.refused.fetch_add(1, Ordering::Relaxed);
        tracing::info!(who = %i.who, uid = i.uid, caller, "fake logind: reboot refused by an inhibitor");
        if caller == 0 {
            return Err(LogindError::AccessDenied(ROOT_BLOCKED_MESSAGE.to_owned()));
        }
        Err(LogindError::Blocked(format!(
            "Operation inhibited by \"{}\" (PID {}, UID {}), reason is \"{}\".",
            i.who, i.pid, i.uid, i.why
        )))
    }

    fn reboot_with_flags(&self, caller: u32, flags: u64) -> Result<(), LogindError> {
        if flags & !KNOWN_FLAGS != 0 {
            return Err(LogindError::InvalidArgs(format!(
                "Invalid flags parameter: {flags:#x}"
            )));
        }
        self.check_inhibitors(caller, flags)?;
        self.record(RebootCall {
            method: "RebootWithFlags".to_owned(),
            flags,
        });
        Ok(())
    }

    fn reboot(&self, caller: u32, _interactive: bool) -> Result<(), LogindError> {
        self.check_inhibitors(caller, 0)?;
        self.record(RebootCall {
            method: "Reboot".to_owned(),
            flags: 0,
        });
        Ok(())
    }

    /// The answer to an accepted reboot call: at once, or (`lose_reboot_answers`) never, the
    /// connection closed instead.
    async fn answer(&self, conn: &zbus::Connection) -> Result<(), LogindError> {
        if !self.lose_reboot_answers {
            return Ok(());
        }
        let conn = conn.clone();
        tokio::spawn(async move {
            let _ = conn.close().await;
        });
        std::future::pending().await
    }

    fn list(&self) -> Vec<ListedInhibitor> {
        self.inhibitors
            .borrow()
            .iter()
            .map(|i| {
                (
                    i.what.clone(),
                    i.who.clone(),
                    i.why.clone(),
                    i.mode.clone(),
                    i.uid,
                    i.pid,
                )
            })
            .collect()
    }

    /// The uid of a call's sender, as the bus daemon knows it.
    async fn caller_uid(conn: &zbus::Connection, header: &Header<'_>) -> Result<u32, LogindError> {
        let Some(sender) = header.sender() else {
            return Ok(u32::MAX);
        };
        let dbus = zbus::fdo::DBusProxy::new(conn).await?;
        let name = zbus::names::BusName::Unique(sender.to_owned());
        Ok(dbus.get_connection_unix_user(name).await?)
    }

    #[allow(clippy::too_many_arguments)]
    async fn inhibit(
        self: &Arc<Self>,
        conn: &zbus::Connection,
        header: &Header<'_>,
        what: &str,
        who: &str,
        why: &str,
        mode: &str,
    ) -> Result<zbus::zvariant::OwnedFd, LogindError> {
        if mode != "block" && mode != "delay" {
            return Err(LogindError::InvalidArgs(format!(
                "Invalid mode specification {mode}"
            )));
        }
        let whats: Vec<&str> = what.split(':').filter(|w| !w.is_empty()).collect();
        if whats.is_empty() || whats.iter().any(|w| !KNOWN_WHAT.contains(w)) {
            return Err(LogindError::InvalidArgs(format!(
                "Invalid what specification {what}"
            )));
        }
        if mode == "delay" && whats.iter().any(|w| *w != "shutdown" && *w != "sleep") {
            return Err(LogindError::InvalidArgs(
                "Delay inhibitors only supported for shutdown and sleep".to_owned(),
            ));
        }
        let (uid, pid) = match header.sender() {
            Some(sender) => {
                let dbus = zbus::fdo::DBusProxy::new(conn).await?;
                let name = zbus::names::BusName::Unique(sender.to_owned());
                let uid = dbus.get_connection_unix_user(name.clone()).await?;
                let pid = dbus.get_connection_unix_process_id(name).await?;
                (uid, pid)
            }
            None => (u32::MAX, 0),
        };

        let (read_end, write_end) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
            .map_err(|e| LogindError::Failed(format!("pipe: {e}")))?;
        let mut reader = tokio::net::unix::pipe::Receiver::from_owned_fd(read_end)
            .map_err(|e| LogindError::Failed(format!("watching the inhibitor pipe: {e}")))?;
        let id = self.add_inhibitor(what, who, why, mode, uid, pid);

        // The inhibitor lasts until every copy of the write end is closed: ours goes with the
        // reply, the bus daemon's after forwarding it, and the caller's when it lets go.
        let shared = Arc::clone(self);
        let mut shutdown = self.shutdown.subscribe();
        tokio::spawn(async move {
            let mut buf = [0u8; 64];
            loop {
                tokio::select! {
                    r = reader.read(&mut buf) => match r {
                        Ok(0) | Err(_) => break,
                        Ok(_) => continue,
                    },
                    _ = shutdown.wait_for(|stop| *stop) => return,
                }
            }
            shared.remove_inhibitor(id);
        });
        Ok(write_end.into())
    }
}

/// `org.freedesktop.login1.Manager` with `RebootWithFlags` (systemd >= 248).
struct Manager {
    shared: Arc<Shared>,
}

#[zbus::interface(name = "org.freedesktop.login1.Manager")]
impl Manager {
    async fn reboot_with_flags(
        &self,
        #[zbus(connection)] conn: &zbus::Connection,
        #[zbus(header)] header: Header<'_>,
        flags: u64,
    ) -> Result<(), LogindError> {
        let caller = Shared::caller_uid(conn, &header).await?;
        self.shared.reboot_with_flags(caller, flags)?;
        self.shared.answer(conn).await
    }

    async fn reboot(
        &self,
        #[zbus(connection)] conn: &zbus::Connection,
        #[zbus(header)] header: Header<'_>,
        interactive: bool,
    ) -> Result<(), LogindError> {
        let caller = Shared::caller_uid(conn, &header).await?;
        self.shared.reboot(caller, interactive)?;
        self.shared.answer(conn).await
    }

    async fn inhibit(
        &self,
        #[zbus(connection)] conn: &zbus::Connection,
        #[zbus(header)] header: Header<'_>,
        what: &str,
        who: &str,
        why: &str,
        mode: &str,
    ) -> Result<zbus::zvariant::OwnedFd, LogindError> {
        self.shared
            .inhibit(conn, &header, what, who, why, mode)
            .await
    }

    async fn list_inhibitors(&self) -> Vec<ListedInhibitor> {
        self.shared.list()
    }

    async fn list_sessions(&self) -> Vec<(String, u32, String, String, OwnedObjectPath)> {
        self.shared.sessions.listed()
    }

    async fn schedule_shutdown(&self, kind: &str, usec: u64) -> Result<(), LogindError> {
        self.shared
            .sessions
            .schedule(kind, usec)
            .map_err(LogindError::InvalidArgs)
    }

    async fn cancel_scheduled_shutdown(&self) -> bool {
        self.shared.sessions.cancel()
    }
}

/// `org.freedesktop.login1.Manager` of an older systemd: no `RebootWithFlags`.
struct LegacyManager {
    shared: Arc<Shared>,
}

#[zbus::interface(name = "org.freedesktop.login1.Manager")]
impl LegacyManager {
    async fn reboot(
        &self,
        #[zbus(connection)] conn: &zbus::Connection,
        #[zbus(header)] header: Header<'_>,
        interactive: bool,
    ) -> Result<(), LogindError> {
        let caller = Shared::caller_uid(conn, &header).await?;
        self.shared.reboot(caller, interactive)
    }

    async fn inhibit(
        &self,
        #[zbus(connection)] conn: &zbus::Connection,
        #[zbus(header)] header: Header<'_>,
        what: &str,
        who: &str,
        why: &str,
        mode: &str,
    ) -> Result<zbus::zvariant::OwnedFd, LogindError> {
        self.shared
            .inhibit(conn, &header, what, who, why, mode)
            .await
    }

    async fn list_inhibitors(&self) -> Vec<ListedInhibitor> {
        self.shared.list()
    }
}

/// What logind's `BlockInhibited` property says: the union of what block inhibitors inhibit.
fn block_inhibited(list: &[Inhibitor]) -> String {
    let mut whats: Vec<&str> = Vec::new();
    for i in list.iter().filter(|i| i.mode == "block") {
        for w in i.what.split(':') {
            if !whats.contains(&w) {
                whats.push(w);
            }
        }
    }
    whats.join(":")
}

/// `PropertiesChanged` for `BlockInhibited` at every change of the inhibitors, as logind sends
/// at every inhibitor taken or released (systemd 252: whether the value changed or not).
async fn emit_changes(conn: zbus::Connection, shared: Arc<Shared>) {
    let mut rx = shared.inhibitors.subscribe();
    let mut stop = shared.shutdown.subscribe();
    loop {
        tokio::select! {
            changed = rx.changed() => if changed.is_err() { return },
            _ = stop.wait_for(|s| *s) => return,
        }
        let value = block_inhibited(&rx.borrow_and_update());
        let changed: std::collections::HashMap<&str, zbus::zvariant::Value<'_>> =
            [("BlockInhibited", zbus::zvariant::Value::from(value))].into();
        let invalidated: Vec<&str> = Vec::new();
        if let Err(e) = conn
            .emit_signal(
                None::<&str>,
                OBJECT_PATH,
                "org.freedesktop.DBus.Properties",
                "PropertiesChanged",
                &(INTERFACE, changed, invalidated),
            )
            .await
        {
            tracing::debug!("fake logind: emitting PropertiesChanged: {e}");
        }
    }
}

/// A block inhibitor held by the test itself; released when dropped.
#[derive(Debug)]
#[must_use = "the inhibitor is released as soon as the guard is dropped"]
pub struct InhibitorGuard {
    shared: Arc<Shared>,
    id: u64,
}

impl InhibitorGuard {
    /// Releases the inhibitor now.
    pub fn release(self) {}
}

impl Drop for InhibitorGuard {
    fn drop(&mut self) {
        self.shared.remove_inhibitor(self.id);
    }
}

/// A running fake logind.
#[derive(Debug)]
pub struct FakeLogind {
    conn: zbus::Connection,
    shared: Arc<Shared>,
}

impl FakeLogind {
    /// Connects to `bus_address`, serves the manager object and owns `org.freedesktop.login1`.
    pub async fn start(bus_address: &str, opts: FakeLogindOptions) -> Result<Self, LabError> {
        let shared = Arc::new(Shared::new(opts.lose_reboot_answers));
        let builder = zbus::connection::Builder::address(bus_address)?;
        let builder = if opts.reboot_with_flags {
            builder.serve_at(
                OBJECT_PATH,
                Manager {
                    shared: shared.clone(),
                },
            )?
        } else {
            builder.serve_at(
                OBJECT_PATH,
                LegacyManager {
                    shared: shared.clone(),
                },
            )?
        };
        let conn = builder.name(BUS_NAME)?.build().await?;
        tokio::spawn(emit_changes(conn.clone(), shared.clone()));
        Ok(FakeLogind { conn, shared })
    }

    /// Takes a `shutdown` block inhibitor as this process (uid and pid of the test), held until
    /// the guard is dropped or released. It shows in `ListInhibitors` and makes
    /// `RebootWithFlags(1)` fail with `BlockedByInhibitorLock`.
    pub fn hold_block_inhibitor(&self, who: &str, why: &str) -> InhibitorGuard {
        self.hold_block_inhibitor_as(rustix::process::getuid().as_raw(), who, why)
    }

    /// Takes a `shutdown` block inhibitor as if user `uid` held it (pid: this process's).
    pub fn hold_block_inhibitor_as(&self, uid: u32, who: &str, why: &str) -> InhibitorGuard {
        let pid = rustix::process::getpid().as_raw_nonzero().get() as u32;
        let id = self
            .shared
            .add_inhibitor("shutdown", who, why, "block", uid, pid);
        InhibitorGuard {
            shared: self.shared.clone(),
            id,
        }
    }

    /// A logged-in session: listed by `ListSessions`, with its `Session` object.
    pub async fn add_session(&self, session: FakeSession) -> Result<(), LabError> {
        let object = sessions::SessionObject {
            session: session.clone(),
        };
        self.conn.object_server().at(session.path(), object).await?;
        self.shared
            .sessions
            .list
            .lock()
            .expect("sessions lock")
            .push(session);
        Ok(())
    }

    /// The scheduled shutdowns asked and cancelled, notified at every change.
    pub fn schedule(&self) -> watch::Receiver<Schedule> {
        self.shared.sessions.schedule.subscribe()
    }

    /// Every accepted reboot call from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<RebootCall> {
        self.shared.reboots.subscribe()
    }

    /// All accepted reboot calls so far, oldest first.
    pub fn reboot_calls(&self) -> Vec<RebootCall> {
        self.shared.calls.lock().expect("calls lock").clone()
    }

    /// How many `RebootWithFlags` calls were refused because of a block inhibitor
    /// (calls refused for bad flags are not counted).
    pub fn refused_calls(&self) -> usize {
        self.shared.refused.load(Ordering::Relaxed)
    }

    /// The inhibitors held now (the test's and those taken with `Inhibit`).
    pub fn inhibitors(&self) -> Vec<Inhibitor> {
        self.shared.inhibitors.borrow().clone()
    }

    /// Notified whenever an inhibitor is taken or released.
    pub fn watch_inhibitors(&self) -> watch::Receiver<Vec<Inhibitor>> {
        self.shared.inhibitors.subscribe()
    }

    /// Releases `org.freedesktop.login1` and closes the connection.
    pub async fn stop(self) {
        if let Err(e) = self.conn.release_name(BUS_NAME).await {
            tracing::debug!("fake logind: releasing {BUS_NAME}: {e}");
        }
        if let Err(e) = self.conn.clone().close().await {
            tracing::debug!("fake logind: closing the connection: {e}");
        }
    }
}

impl Drop for FakeLogind {
    fn drop(&mut self) {
        // Stop the tasks watching `Inhibit` fds; they hold the shared state.
        self.shared.shutdown.send_replace(true);
    }
}
