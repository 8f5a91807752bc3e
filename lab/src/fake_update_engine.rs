//! The lab's stand-in for Flatcar/CoreOS update_engine: [`FakeUpdateEngine`] owns
//! `com.coreos.update1` on a bus, serves `com.coreos.update1.Manager` at `/com/coreos/update1`
//! (`GetStatus`, `AttemptUpdate`, `ResetStatus`, signal `StatusUpdate(xdssx)`), and lets a test
//! set the status, emit the signal, and make the service go away and come back.

use std::sync::{Arc, Mutex};

use zbus::object_server::SignalEmitter;

use crate::dbus::LabError;

/// Well-known bus name.
pub const BUS_NAME: &str = "com.coreos.update1";
/// Object path.
pub const OBJECT_PATH: &str = "/com/coreos/update1";
/// Interface name.
pub const INTERFACE: &str = "com.coreos.update1.Manager";
/// The operation update_engine reports when nothing is going on.
pub const UPDATE_STATUS_IDLE: &str = "UPDATE_STATUS_IDLE";
/// The operation update_engine reports when an update is installed and waits for a reboot.
pub const UPDATE_STATUS_UPDATED_NEED_REBOOT: &str = "UPDATE_STATUS_UPDATED_NEED_REBOOT";

/// What `GetStatus` returns and `StatusUpdate` carries.
#[derive(Debug, Clone, PartialEq)]
pub struct UpdateStatus {
    pub last_checked_time: i64,
    pub progress: f64,
    pub current_operation: String,
    pub new_version: String,
    pub new_size: i64,
}

impl Default for UpdateStatus {
    fn default() -> Self {
        UpdateStatus {
            last_checked_time: 0,
            progress: 0.0,
            current_operation: UPDATE_STATUS_IDLE.to_owned(),
            new_version: "0.0.0".to_owned(),
            new_size: 0,
        }
    }
}

#[derive(Debug, Default)]
struct Shared {
    status: Mutex<UpdateStatus>,
    attempt_update_calls: Mutex<usize>,
}

impl Shared {
    fn status(&self) -> UpdateStatus {
        self.status.lock().expect("status lock").clone()
    }
}

struct Manager {
    shared: Arc<Shared>,
}

#[zbus::interface(name = "com.coreos.update1.Manager")]
impl Manager {
    #[zbus(out_args(
        "last_checked_time",
        "progress",
        "current_operation",
        "new_version",
        "new_size"
    ))]
    async fn get_status(&self) -> (i64, f64, String, String, i64) {
        let s = self.shared.status();
        (
            s.last_checked_time,
            s.progress,
            s.current_operation,
            s.new_version,
            s.new_size,
        )
    }

    /// Real update_engine starts a check; the fake only counts the call.
    async fn attempt_update(&self) {
        *self
            .shared
            .attempt_update_calls
            .lock()
            .expect("attempt_update lock") += 1;
    }

    async fn reset_status(
        &self,
        #[zbus(signal_emitter)] emitter: SignalEmitter<'_>,
    ) -> zbus::fdo::Result<()> {
        let status = {
            let mut s = self.shared.status.lock().expect("status lock");
            s.current_operation = UPDATE_STATUS_IDLE.to_owned();
            s.progress = 0.0;
            s.clone()
        };
        emit(&emitter, &status).await?;
        Ok(())
    }

    #[zbus(signal)]
    async fn status_update(
        emitter: &SignalEmitter<'_>,
        last_checked_time: i64,
        progress: f64,
        current_operation: &str,
        new_version: &str,
        new_size: i64,
    ) -> zbus::Result<()>;
}

async fn emit(emitter: &SignalEmitter<'_>, s: &UpdateStatus) -> zbus::Result<()> {
    Manager::status_update(
        emitter,
        s.last_checked_time,
        s.progress,
        &s.current_operation,
        &s.new_version,
        s.new_size,
    )
    .await
}

/// A running fake update_engine. Dropping it closes its connection too (the name goes away);
/// [`FakeUpdateEngine::stop`] does the same and waits until it is done.
#[derive(Debug)]
pub struct FakeUpdateEngine {
    conn: zbus::Connection,
    shared: Arc<Shared>,
}

impl FakeUpdateEngine {
    /// Connects to `bus_address`, serves the object and owns `com.coreos.update1`
    /// (fails if another connection owns it). The status starts as `UPDATE_STATUS_IDLE`.
    pub async fn start(bus_address: &str) -> Result<Self, LabError> {
        let shared = Arc::new(Shared::default());
        let conn = zbus::connection::Builder::address(bus_address)?
            .serve_at(
                OBJECT_PATH,
                Manager {
                    shared: shared.clone(),
                },
            )?
            .name(BUS_NAME)?
            .build()
            .await?;
        Ok(FakeUpdateEngine { conn, shared })
    }

    /// Stores the status `GetStatus` returns (operation and version; progress 1.0 for
    /// `UPDATE_STATUS_UPDATED_NEED_REBOOT`, else 0.0) and emits `StatusUpdate` with it.
    pub async fn set_status(&self, operation: &str, new_version: &str) -> Result<(), LabError> {
        let status = {
            let mut s = self.shared.status.lock().expect("status lock");
            s.current_operation = operation.to_owned();
            s.new_version = new_version.to_owned();
            s.progress = if operation == UPDATE_STATUS_UPDATED_NEED_REBOOT {
                1.0
            } else {
                0.0
            };
            s.clone()
        };
        let emitter = SignalEmitter::new(&self.conn, OBJECT_PATH)?;
        emit(&emitter, &status).await?;
        Ok(())
    }

    /// The status `GetStatus` currently returns.
    pub fn status(&self) -> UpdateStatus {
        self.shared.status()
    }

    /// How many times `AttemptUpdate` was called.
    pub fn attempt_update_calls(&self) -> usize {
        *self
            .shared
            .attempt_update_calls
            .lock()
            .expect("attempt_update lock")
    }

    /// The connection's unique name on the bus (changes with every `start`).
    pub fn unique_name(&self) -> Option<String> {
        self.conn.unique_name().map(|n| n.to_string())
    }

    /// Releases `com.coreos.update1` and closes the connection: clients see the name lose its
    /// owner. A new [`FakeUpdateEngine::start`] brings it back (with a fresh status).
    pub async fn stop(self) {
        if let Err(e) = self.conn.release_name(BUS_NAME).await {
            tracing::debug!("fake update_engine: releasing {BUS_NAME}: {e}");
        }
        if let Err(e) = self.conn.close().await {
            tracing::debug!("fake update_engine: closing the connection: {e}");
        }
    }
}

/// The system bus address: `DBUS_SYSTEM_BUS_ADDRESS`, else the standard socket.
fn system_bus_address() -> String {
    std::env::var("DBUS_SYSTEM_BUS_ADDRESS")
        .unwrap_or_else(|_| "unix:path=/run/dbus/system_bus_socket".to_string())
}

/// `rebootd-lab update-engine --status-file PATH`: serve the fake on the system bus (as a
/// service in a lab container), taking its status from `PATH`: a line `OPERATION NEW_VERSION`,
/// read at start and whenever the file is written or replaced (inotify on its directory).
pub async fn serve_status_file(path: &std::path::Path) -> Result<(), LabError> {
    use futures_util::StreamExt;
    let dir = path
        .parent()
        .ok_or_else(|| LabError::DaemonStart(format!("{} has no directory", path.display())))?;
    std::fs::create_dir_all(dir)
        .map_err(|e| LabError::io(format!("creating {}", dir.display()), e))?;
    let inotify = inotify::Inotify::init().map_err(|e| LabError::io("inotify", e))?;
    inotify
        .watches()
        .add(
            dir,
            inotify::WatchMask::CLOSE_WRITE | inotify::WatchMask::MOVED_TO,
        )
        .map_err(|e| LabError::io(format!("watching {}", dir.display()), e))?;
    let mut events = inotify
        .into_event_stream(vec![0u8; 4096])
        .map_err(|e| LabError::io("inotify stream", e))?;
    let fake = FakeUpdateEngine::start(&system_bus_address()).await?;
    tracing::info!(status_file = %path.display(), "update_engine stand-in owns {BUS_NAME}");
    let mut last = None;
    loop {
        if let Ok(text) = std::fs::read_to_string(path) {
            let mut words = text.split_whitespace();
            if let Some(operation) = words.next() {
                let version = words.next().unwrap_or("0.0.0").to_string();
                let now = Some((operation.to_string(), version.clone()));
                if now != last {
                    tracing::info!(operation, %version, "StatusUpdate");
                    fake.set_status(operation, &version).await?;
                    last = now;
                }
            }
        }
        if events.next().await.is_none() {
            return Err(LabError::DaemonStart("the inotify stream ended".into()));
        }
    }
}
