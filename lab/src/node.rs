//! One lab node: a real `rebootd` process on its own private `dbus-daemon`, with a fake
//! update_engine and a fake logind, its own machine id, boot id file, configuration and state
//! directory. "Rebooting" the node kills the process and starts it again with a new boot id.

use crate::dbus::{LabError, PrivateBus};
use crate::fake_logind::{FakeLogind, FakeLogindOptions};
use crate::fake_update_engine::FakeUpdateEngine;
use futures_util::StreamExt;
use inotify::{Inotify, WatchMask};
use rebootd::state::{State, StateStore};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;
use tokio::process::{Child, Command};

/// How a node is set up.
#[derive(Debug, Clone)]
pub struct NodeOptions {
    pub name: String,
    /// TOML appended as a second configuration fragment (after the lab's own).
    pub config: String,
    pub logind: FakeLogindOptions,
    /// Start rebootd right away.
    pub start_daemon: bool,
    /// Environment variables rebootd gets on every start (e.g. libfaketime's, for a node whose
    /// clock is off).
    pub env: Vec<(String, String)>,
}

impl NodeOptions {
    pub fn new(name: &str) -> NodeOptions {
        NodeOptions {
            name: name.to_string(),
            config: String::new(),
            logind: FakeLogindOptions::default(),
            start_daemon: true,
            env: Vec::new(),
        }
    }

    pub fn config(mut self, toml: &str) -> NodeOptions {
        self.config = toml.to_string();
        self
    }
}

/// A running lab node.
pub struct Node {
    pub name: String,
    pub machine_id: String,
    dir: tempfile::TempDir,
    rebootd: PathBuf,
    pub update_engine: FakeUpdateEngine,
    pub logind: FakeLogind,
    child: Option<Child>,
    /// What rebootd gets besides [`Node::command`]'s environment.
    env: Vec<(String, String)>,
    boots: u32,
    /// What rebootd sent to the node's NOTIFY_SOCKET.
    notify: tokio::sync::watch::Receiver<Notified>,
    _notify_task: AbortOnDrop,
    // Last: dropped after the fakes that are connected to it.
    pub bus: PrivateBus,
}

/// Aborts the task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// What a service told systemd on its notify socket.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Notified {
    /// `READY=1` messages (one per start).
    pub ready: u32,
    /// The last `STATUS=`.
    pub status: String,
    /// `WATCHDOG=1` messages.
    pub watchdog: u32,
}

/// Listen on a datagram socket as systemd's notify socket does.
fn listen_notify(
    path: &Path,
) -> Result<(tokio::sync::watch::Receiver<Notified>, AbortOnDrop), LabError> {
    let socket = tokio::net::UnixDatagram::bind(path).map_err(|e| io("notify socket", e))?;
    let (tx, rx) = tokio::sync::watch::channel(Notified::default());
    let task = tokio::spawn(async move {
        let mut buf = vec![0u8; 4096];
        while let Ok(n) = socket.recv(&mut buf).await {
            let text = String::from_utf8_lossy(&buf[..n]).into_owned();
            tx.send_modify(|n| {
                for line in text.lines() {
                    if line == "READY=1" {
                        n.ready += 1;
                    } else if line == "WATCHDOG=1" {
                        n.watchdog += 1;
                    } else if let Some(s) = line.strip_prefix("STATUS=") {
                        n.status = s.to_string();
                    }
                }
            });
        }
    });
    Ok((rx, AbortOnDrop(task)))
}

fn random_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/uuid")
        .map(|s| s.trim().replace('-', ""))
        .unwrap_or_else(|_| format!("{:032x}", std::process::id()))
}

fn io(context: &str, e: std::io::Error) -> LabError {
    LabError::io(context, e)
}

impl Node {
    /// Set up the node's files, bus and fakes, and (by default) start rebootd.
    pub async fn start(rebootd: &Path, opts: NodeOptions) -> Result<Node, LabError> {
        let dir = tempfile::Builder::new()
            .prefix(&format!("rebootd-lab-{}-", opts.name))
            .tempdir()
            .map_err(|e| io("temp dir", e))?;
        let machine_id = random_id();
        std::fs::write(dir.path().join("machine-id"), format!("{machine_id}\n"))
            .map_err(|e| io("machine-id", e))?;
        std::fs::write(dir.path().join("boot_id"), format!("{}\n", random_id()))
            .map_err(|e| io("boot_id", e))?;
        std::fs::create_dir_all(dir.path().join("state")).map_err(|e| io("state dir", e))?;
        // A lab "reboot" restarts rebootd: the node is down well under the boot time said
        // (which counts in lock.max_hold); a trial that keeps nodes down longer says so.
        let lab_config = format!(
            "[identity]\nnode_name = {name:?}\nmachine_id_file = {mid:?}\nboot_id_file = {bid:?}\n\n\
             [reboot]\nretry_interval = \"1s\"\ncoordinator_file = {cf:?}\nboot_time = \"1s\"\n",
            name = opts.name,
            mid = dir.path().join("machine-id"),
            bid = dir.path().join("boot_id"),
            cf = dir.path().join("update-engine").join("coordinator.conf"),
        );
        std::fs::write(dir.path().join("00-lab.toml"), lab_config).map_err(|e| io("config", e))?;
        std::fs::write(dir.path().join("50-node.toml"), &opts.config)
            .map_err(|e| io("config", e))?;
        let bus = PrivateBus::start().await?;
        let update_engine = FakeUpdateEngine::start(bus.address()).await?;
        let logind = FakeLogind::start(bus.address(), opts.logind.clone()).await?;
        let (notify, notify_task) = listen_notify(&dir.path().join("notify.sock"))?;
        let mut node = Node {
            name: opts.name,
            machine_id,
            dir,
            rebootd: rebootd.to_path_buf(),
            update_engine,
            logind,
            child: None,
            env: opts.env,
            boots: 0,
            notify,
            _notify_task: notify_task,
            bus,
        };
        if opts.start_daemon {
            node.start_daemon()?;
        }
        Ok(node)
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    pub fn state_dir(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    pub fn store(&self) -> StateStore {
        StateStore::new(self.state_dir())
    }

    pub fn config_files(&self) -> Vec<PathBuf> {
        vec![
            self.dir.path().join("00-lab.toml"),
            self.dir.path().join("50-node.toml"),
        ]
    }

    /// This node's Flatcar coordinator file (`[reboot] coordinator_file`).
    pub fn coordinator_path(&self) -> PathBuf {
        self.dir
            .path()
            .join("update-engine")
            .join("coordinator.conf")
    }

    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("rebootd.log")
    }

    /// Everything rebootd logged on this node, over all its boots.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    pub fn boot_id(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("boot_id"))
            .map(|s| s.trim().to_string())
            .unwrap_or_default()
    }

    /// How many times rebootd was started on this node.
    pub fn boots(&self) -> u32 {
        self.boots
    }

    /// The environment a command needs to act as this node's rebootd/rebootctl.
    pub fn command(&self, program: &Path) -> Command {
        let mut cmd = Command::new(program);
        for f in self.config_files() {
            cmd.arg("--config").arg(f);
        }
        cmd.env("DBUS_SYSTEM_BUS_ADDRESS", self.bus.address())
            .env("STATE_DIRECTORY", self.state_dir())
            .env("NOTIFY_SOCKET", self.dir.path().join("notify.sock"))
            .env_remove("JOURNAL_STREAM")
            .env_remove("WATCHDOG_USEC");
        cmd
    }

    /// Start rebootd (one boot of the node).
    pub fn start_daemon(&mut self) -> Result<(), LabError> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .map_err(|e| io("log", e))?;
        let mut cmd = self.command(&self.rebootd);
        cmd.env(
            "RUST_LOG",
            std::env::var("REBOOTD_LAB_LOG").unwrap_or_else(|_| "info,rebootd=debug".into()),
        )
        .envs(self.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .kill_on_drop(true);
        let child = cmd.spawn().map_err(|e| io("spawn rebootd", e))?;
        self.child = Some(child);
        self.boots += 1;
        Ok(())
    }

    /// Kill rebootd at once (as a crash or a power cut would).
    pub async fn kill_daemon(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill().await;
        }
    }

    /// Stop rebootd with SIGTERM and wait for it; returns its exit code.
    pub async fn stop_daemon(&mut self) -> Option<i32> {
        let mut child = self.child.take()?;
        if let Some(pid) = child.id() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
        match tokio::time::timeout(Duration::from_secs(10), child.wait()).await {
            Ok(Ok(status)) => status.code(),
            _ => {
                let _ = child.kill().await;
                None
            }
        }
    }

    /// The process id of the running rebootd.
    pub fn daemon_pid(&self) -> Option<u32> {
        self.child.as_ref().and_then(|c| c.id())
    }

    /// Whether rebootd exited by itself; its exit code if so.
    pub fn daemon_exit(&mut self) -> Option<Option<i32>> {
        let child = self.child.as_mut()?;
        child.try_wait().ok().flatten().map(|s| s.code())
    }

    /// A reboot: the process dies, the boot id changes, update_engine comes back idle (the
    /// update is applied), and rebootd starts again.
    pub async fn reboot(&mut self) -> Result<(), LabError> {
        self.kill_daemon().await;
        std::fs::write(
            self.dir.path().join("boot_id"),
            format!("{}\n", random_id()),
        )
        .map_err(|e| io("boot_id", e))?;
        self.update_engine
            .set_status("UPDATE_STATUS_IDLE", "")
            .await?;
        self.start_daemon()
    }

    /// Restart rebootd in the same boot (a crash and a restart by systemd).
    pub async fn restart_daemon(&mut self) -> Result<(), LabError> {
        self.kill_daemon().await;
        self.start_daemon()
    }

    /// Wait until the current boot's rebootd reported `READY=1` (its triggers listen).
    pub async fn wait_ready(&self, timeout: Duration) -> Result<(), LabError> {
        let mut rx = self.notify.clone();
        let boots = self.boots;
        let reached = tokio::time::timeout(timeout, async {
            rx.wait_for(|n| n.ready >= boots).await.is_ok()
        })
        .await;
        match reached {
            Ok(true) => Ok(()),
            _ => Err(LabError::Timeout {
                after: timeout,
                what: format!(
                    "node {}: READY=1 from boot {boots}\n--- rebootd log ---\n{}",
                    self.name,
                    self.log()
                ),
            }),
        }
    }

    /// The last `STATUS=` line rebootd sent to systemd.
    pub fn notify_status(&self) -> String {
        self.notify.borrow().status.clone()
    }

    /// Follow what rebootd sends to systemd.
    pub fn notified(&self) -> tokio::sync::watch::Receiver<Notified> {
        self.notify.clone()
    }

    /// The state file as it is now (None when absent or unreadable).
    pub fn state(&self) -> Option<State> {
        self.store().load().ok().flatten()
    }

    /// Wait until the state file satisfies `pred`, watching it with inotify. Fails with the
    /// last state and the log when `timeout` passes first.
    pub async fn wait_state(
        &self,
        what: &str,
        timeout: Duration,
        pred: impl Fn(&State) -> bool,
    ) -> Result<State, LabError> {
        let inotify = Inotify::init().map_err(|e| io("inotify", e))?;
        inotify
            .watches()
            .add(
                self.state_dir(),
                WatchMask::MOVED_TO | WatchMask::CLOSE_WRITE,
            )
            .map_err(|e| io("inotify watch", e))?;
        let mut events = inotify
            .into_event_stream(vec![0u8; 4096])
            .map_err(|e| io("inotify stream", e))?;
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Some(s) = self.state() {
                if pred(&s) {
                    return Ok(s);
                }
            }
            match tokio::time::timeout_at(deadline, events.next()).await {
                Ok(Some(_)) => continue,
                Ok(None) | Err(_) => {
                    return Err(LabError::Timeout {
                        after: timeout,
                        what: format!(
                            "node {}: {what}; last state {:?}\n--- rebootd log ---\n{}",
                            self.name,
                            self.state(),
                            self.log()
                        ),
                    })
                }
            }
        }
    }
}
