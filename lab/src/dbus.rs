//! A private, throw-away system bus for the lab: [`PrivateBus`] runs a real `dbus-daemon` on a
//! unix socket in a temporary directory with an allow-everything policy, and [`LabError`] is the
//! error type shared by this module and the D-Bus fakes (`fake_update_engine`, `fake_logind`).

use std::fs::File;
use std::io::Write as _;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt as _, BufReader};

/// Where the daemon binary lives on Debian, Fedora, Flatcar and friends.
pub const DBUS_DAEMON: &str = "/usr/bin/dbus-daemon";

/// How long [`PrivateBus::start`] waits for the daemon to print its address.
const START_TIMEOUT: Duration = Duration::from_secs(10);

/// Errors of the lab's D-Bus pieces.
#[derive(Debug, thiserror::Error)]
pub enum LabError {
    /// A local I/O operation failed; `context` says which.
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    /// `dbus-daemon` could not be started or exited before it was ready.
    #[error("dbus-daemon did not start: {0}")]
    DaemonStart(String),
    /// Something the lab waits for did not happen in time.
    #[error("timed out after {after:?} waiting for {what}")]
    Timeout { after: Duration, what: String },
    /// A D-Bus operation failed.
    #[error("D-Bus: {0}")]
    Dbus(#[from] zbus::Error),
    /// A D-Bus standard interface call (RequestName, ...) failed.
    #[error("D-Bus: {0}")]
    Fdo(#[from] zbus::fdo::Error),
}

impl LabError {
    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        LabError::Io {
            context: context.into(),
            source,
        }
    }
}

/// A running `dbus-daemon` that behaves like a system bus (`<type>system</type>`, EXTERNAL auth)
/// but lets anyone own any name, call anything and eavesdrop. Killed when dropped.
#[derive(Debug)]
pub struct PrivateBus {
    child: Child,
    address: String,
    // Kept alive so the daemon never sees its stdout closed; dropped after the child is killed.
    _stdout: tokio::net::unix::pipe::Receiver,
    dir: tempfile::TempDir,
}

impl PrivateBus {
    /// Starts the daemon, waits until it has printed its address, and checks that a client can
    /// connect (no fixed sleeps: the daemon prints the address once it is listening).
    pub async fn start() -> Result<PrivateBus, LabError> {
        let dir = tempfile::Builder::new()
            .prefix("rebootd-lab-bus-")
            .tempdir()
            .map_err(|e| LabError::io("creating the bus directory", e))?;
        let socket = dir.path().join("bus");
        let config = dir.path().join("bus.conf");
        write_config(&config, &socket)?;
        let log_path = dir.path().join("dbus-daemon.log");
        let log = File::create(&log_path)
            .map_err(|e| LabError::io(format!("creating {}", log_path.display()), e))?;

        let mut child = Command::new(DBUS_DAEMON)
            .arg(format!("--config-file={}", config.display()))
            .arg("--print-address=1")
            .arg("--nofork")
            .arg("--nopidfile")
            .arg("--nosyslog")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log))
            .spawn()
            .map_err(|e| LabError::io(format!("spawning {DBUS_DAEMON}"), e))?;

        let stdout = child.stdout.take().map(OwnedFd::from);
        let ready = async {
            let stdout = stdout.ok_or_else(|| LabError::DaemonStart("no stdout pipe".into()))?;
            let pipe = tokio::net::unix::pipe::Receiver::from_owned_fd(stdout)
                .map_err(|e| LabError::io("watching dbus-daemon's stdout", e))?;
            let mut reader = BufReader::new(pipe);
            let mut line = String::new();
            let n = reader
                .read_line(&mut line)
                .await
                .map_err(|e| LabError::io("reading dbus-daemon's address", e))?;
            if n == 0 || !line.ends_with('\n') {
                return Err(LabError::DaemonStart(format!(
                    "it exited before printing its address; its log says: {}",
                    read_log(&log_path)
                )));
            }
            Ok((line.trim().to_owned(), reader.into_inner()))
        };
        let (address, stdout) = match tokio::time::timeout(START_TIMEOUT, ready).await {
            Ok(Ok(v)) => v,
            Ok(Err(e)) => {
                kill(&mut child);
                return Err(e);
            }
            Err(_) => {
                kill(&mut child);
                return Err(LabError::Timeout {
                    after: START_TIMEOUT,
                    what: format!("dbus-daemon's address (log: {})", read_log(&log_path)),
                });
            }
        };

        let bus = PrivateBus {
            child,
            address,
            _stdout: stdout,
            dir,
        };
        // Prove the bus works before handing it out; dropping `bus` on error kills the daemon.
        let conn = bus.connect().await?;
        conn.close().await?;
        Ok(bus)
    }

    /// The address the daemon printed, e.g. `unix:path=/tmp/rebootd-lab-bus-XXXX/bus,guid=...`.
    /// Usable as `DBUS_SYSTEM_BUS_ADDRESS` and with `busctl --address=` / `dbus-send --address=`.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// The temporary directory holding the socket, the config and the daemon's log.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// A new zbus connection to this bus.
    pub async fn connect(&self) -> Result<zbus::Connection, LabError> {
        Ok(zbus::connection::Builder::address(self.address.as_str())?
            .build()
            .await?)
    }
}

impl Drop for PrivateBus {
    fn drop(&mut self) {
        kill(&mut self.child);
    }
}

fn kill(child: &mut Child) {
    // SIGKILL then reap: the wait is immediate once the signal is delivered.
    let _ = child.kill();
    let _ = child.wait();
}

fn read_log(path: &Path) -> String {
    match std::fs::read_to_string(path) {
        Ok(s) if !s.trim().is_empty() => s.trim().to_owned(),
        Ok(_) => "(empty)".to_owned(),
        Err(e) => format!("(unreadable: {e})"),
    }
}

fn write_config(config: &Path, socket: &Path) -> Result<(), LabError> {
    let text = format!(
        r#"<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-BUS Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>system</type>
  <listen>unix:path={socket}</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow user="*"/>
    <allow own="*"/>
    <allow send_type="method_call"/>
    <allow send_type="signal"/>
    <allow send_type="method_return"/>
    <allow send_type="error"/>
    <allow send_destination="*" eavesdrop="true"/>
    <allow receive_sender="*"/>
    <allow eavesdrop="true"/>
  </policy>
</busconfig>
"#,
        socket = xml_escape(&socket.display().to_string()),
    );
    let mut f = File::create(config)
        .map_err(|e| LabError::io(format!("creating {}", config.display()), e))?;
    f.write_all(text.as_bytes())
        .map_err(|e| LabError::io(format!("writing {}", config.display()), e))
}

fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}
