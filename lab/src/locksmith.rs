//! The real locksmith in the lab: `locksmithctl` against a lab etcd, and lab nodes running the
//! real `locksmithd` (flatcar/locksmith, built by `../shared/peers/build.sh`).
//!
//! A [`LocksmithNode`] is a `locksmithd` process on its own private `dbus-daemon` with the lab's
//! fake update_engine and fake logind, its own machine id, and its own mount namespace, because
//! locksmithd reads fixed paths: `/etc/machine-id`, the system bus socket
//! `/run/dbus/system_bus_socket` (its logind client, go-systemd on godbus v4, reads
//! `DBUS_SYSTEM_BUS_ADDRESS` as a bare socket path while its update_engine client reads it as a
//! D-Bus address, so no value of the variable serves both) and the file it flocks,
//! `/run/update-engine/coordinator.conf`. So each locksmithd runs under
//! `unshare -m --propagation private` with, in its namespace only: a tmpfs on `/run` (nothing of
//! the host's `/run` is visible or touched: no utmp, so no "reboot in 5 minutes" delay), the
//! node's bus socket bind-mounted at `/run/dbus/system_bus_socket`, an empty
//! `/run/update-engine`, and the node's machine-id file bind-mounted over `/etc/machine-id`.
//!
//! A locksmithd "reboot" is the fake logind's `Reboot(false)` call: [`LocksmithNode::reboot`]
//! kills the process, makes update_engine idle (the update is applied) and starts locksmithd
//! again, which releases its slot about 5 s after it starts (its first back-off step).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::process::{Child, Command};

use crate::dbus::{LabError, PrivateBus};
use crate::fake_logind::{FakeLogind, FakeLogindOptions};
use crate::fake_update_engine::FakeUpdateEngine;

/// Where the peers' build script puts its binaries unless `PEERS_BIN` says otherwise.
const DEFAULT_PEERS_BIN: &str = ".cache/rebootd-peers/bin";

/// The directory holding the real peers' binaries (`locksmithctl`, `locksmithd`, `airlock`,
/// `butane`): `$PEERS_BIN` if set, else `$HOME/.cache/rebootd-peers/bin`, as
/// `../shared/peers/build.sh` (run by `scripts/setup.sh`) does. If `binary` is not there yet and
/// the build script is found beside the repository, it is run once.
pub fn peer_binary(binary: &str) -> Result<PathBuf, LabError> {
    let dir = match std::env::var_os("PEERS_BIN") {
        Some(d) => PathBuf::from(d),
        None => {
            let home = std::env::var_os("HOME").unwrap_or_else(|| "/root".into());
            Path::new(&home).join(DEFAULT_PEERS_BIN)
        }
    };
    let path = dir.join(binary);
    if path.exists() {
        return Ok(path);
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/peers/build.sh");
    if script.exists() {
        let out = std::process::Command::new("bash")
            .arg(&script)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| LabError::io(format!("run {}", script.display()), e))?;
        if out.status.success() && path.exists() {
            return Ok(path);
        }
        return Err(LabError::DaemonStart(format!(
            "{} did not build {binary}: {}",
            script.display(),
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    Err(LabError::DaemonStart(format!(
        "the real peer {binary} is not in {} (run ../shared/peers/build.sh as scripts/setup.sh \
         does, or set PEERS_BIN)",
        dir.display()
    )))
}

/// How locksmith reaches etcd: its `--endpoint`, `--group` and the TLS / user flags.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LocksmithEtcd {
    pub endpoint: String,
    /// locksmith's group; empty = the default semaphore.
    pub group: String,
    pub ca_file: Option<PathBuf>,
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
    pub username: Option<String>,
    pub password: Option<String>,
}

impl LocksmithEtcd {
    pub fn new(endpoint: &str, group: &str) -> Self {
        LocksmithEtcd {
            endpoint: endpoint.into(),
            group: group.into(),
            ..LocksmithEtcd::default()
        }
    }

    /// The flags as `name=value` pairs (without the leading `--`).
    fn flags(&self) -> Vec<(&'static str, String)> {
        let mut flags = vec![("endpoint", self.endpoint.clone())];
        if !self.group.is_empty() {
            flags.push(("group", self.group.clone()));
        }
        let path = |p: &Option<PathBuf>| p.as_ref().map(|p| p.display().to_string());
        for (name, value) in [
            ("etcd-cafile", path(&self.ca_file)),
            ("etcd-certfile", path(&self.cert_file)),
            ("etcd-keyfile", path(&self.key_file)),
            ("etcd-username", self.username.clone()),
            ("etcd-password", self.password.clone()),
        ] {
            if let Some(v) = value {
                flags.push((name, v));
            }
        }
        flags
    }
}

/// What a `locksmithctl` run printed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CtlOutput {
    pub success: bool,
    pub stdout: String,
    pub stderr: String,
}

/// locksmithctl's `status`: available slots, max and holders.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CtlStatus {
    pub available: i64,
    pub max: i64,
    pub holders: Vec<String>,
}

impl CtlStatus {
    /// Parse `Available: N`, `Max: M`, then optionally a blank line, `MACHINE ID` and one holder
    /// a line.
    pub fn parse(text: &str) -> Option<CtlStatus> {
        let mut available = None;
        let mut max = None;
        let mut holders = Vec::new();
        let mut in_holders = false;
        for line in text.lines().map(str::trim) {
            if let Some(v) = line.strip_prefix("Available:") {
                available = v.trim().parse().ok();
            } else if let Some(v) = line.strip_prefix("Max:") {
                max = v.trim().parse().ok();
            } else if line == "MACHINE ID" {
                in_holders = true;
            } else if in_holders && !line.is_empty() {
                holders.push(line.to_owned());
            }
        }
        Some(CtlStatus {
            available: available?,
            max: max?,
            holders,
        })
    }
}

/// The real `locksmithctl` pointed at one etcd and group.
#[derive(Debug, Clone)]
pub struct Locksmithctl {
    binary: PathBuf,
    pub etcd: LocksmithEtcd,
}

impl Locksmithctl {
    pub fn new(etcd: LocksmithEtcd) -> Result<Self, LabError> {
        Ok(Locksmithctl {
            binary: peer_binary("locksmithctl")?,
            etcd,
        })
    }

    /// Run `locksmithctl --endpoint ... [--group ...] ARGS`.
    pub async fn run(&self, args: &[&str]) -> Result<CtlOutput, LabError> {
        let mut cmd = Command::new(&self.binary);
        for (name, value) in self.etcd.flags() {
            cmd.arg(format!("--{name}={value}"));
        }
        cmd.args(args).stdin(Stdio::null());
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("LOCKSMITH") {
                cmd.env_remove(k);
            }
        }
        let out = tokio::time::timeout(Duration::from_secs(60), cmd.output())
            .await
            .map_err(|_| LabError::Timeout {
                after: Duration::from_secs(60),
                what: format!("locksmithctl {}", args.join(" ")),
            })?
            .map_err(|e| LabError::io(format!("run {}", self.binary.display()), e))?;
        Ok(CtlOutput {
            success: out.status.success(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        })
    }

    /// `locksmithctl status`, parsed; an error carries its output.
    pub async fn status(&self) -> Result<CtlStatus, LabError> {
        let out = self.run(&["status"]).await?;
        match CtlStatus::parse(&out.stdout) {
            Some(s) if out.success => Ok(s),
            _ => Err(LabError::DaemonStart(format!(
                "locksmithctl status failed: {}{}",
                out.stdout, out.stderr
            ))),
        }
    }
}

/// What a locksmithd node runs in its namespace before `exec locksmithd` ($1 the bus socket, $2
/// the machine-id file, $3 locksmithd, $4 a directory to show as /run/update-engine, or empty).
const NAMESPACE_SETUP: &str = r#"set -e
mount -t tmpfs -o mode=0755 rebootd-lab-run /run
mkdir -p /run/dbus /run/update-engine
: > /run/dbus/system_bus_socket
mount --bind "$1" /run/dbus/system_bus_socket
mount --bind "$2" /etc/machine-id
if [ -n "$4" ]; then mount --bind "$4" /run/update-engine; fi
exec "$3"
"#;

/// A lab node running the real locksmithd.
pub struct LocksmithNode {
    pub name: String,
    pub machine_id: String,
    dir: tempfile::TempDir,
    binary: PathBuf,
    etcd: LocksmithEtcd,
    pub update_engine: FakeUpdateEngine,
    pub logind: FakeLogind,
    child: Option<Child>,
    boots: u32,
    /// Shown as `/run/update-engine` in locksmithd's namespace (a host's coordinator file shared
    /// with a rebootd); `None`: its own.
    update_engine_dir: Option<PathBuf>,
    // Last: dropped after the fakes connected to it.
    pub bus: PrivateBus,
}

impl LocksmithNode {
    /// As [`LocksmithNode::start`], with `dir` as locksmithd's `/run/update-engine`, where it
    /// writes and locks its coordinator file.
    pub async fn start_sharing_update_engine(
        name: &str,
        etcd: LocksmithEtcd,
        dir: &Path,
    ) -> Result<Self, LabError> {
        Self::start_inner(name, etcd, Some(dir.to_path_buf())).await
    }

    /// Set up the node (bus, fakes, machine id) and start locksmithd with
    /// `REBOOT_STRATEGY=etcd-lock` against `etcd`.
    pub async fn start(name: &str, etcd: LocksmithEtcd) -> Result<Self, LabError> {
        Self::start_inner(name, etcd, None).await
    }

    async fn start_inner(
        name: &str,
        etcd: LocksmithEtcd,
        update_engine_dir: Option<PathBuf>,
    ) -> Result<Self, LabError> {
        let binary = peer_binary("locksmithd")?;
        let dir = tempfile::Builder::new()
            .prefix(&format!("rebootd-lab-{name}-"))
            .tempdir()
            .map_err(|e| LabError::io("temp dir", e))?;
        let machine_id = random_id();
        std::fs::write(dir.path().join("machine-id"), format!("{machine_id}\n"))
            .map_err(|e| LabError::io("machine-id", e))?;
        let bus = PrivateBus::start().await?;
        let update_engine = FakeUpdateEngine::start(bus.address()).await?;
        let logind = FakeLogind::start(bus.address(), FakeLogindOptions::default()).await?;
        let mut node = LocksmithNode {
            name: name.into(),
            machine_id,
            dir,
            binary,
            etcd,
            update_engine,
            logind,
            child: None,
            boots: 0,
            update_engine_dir,
            bus,
        };
        node.start_daemon()?;
        Ok(node)
    }

    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("locksmithd.log")
    }

    /// Everything locksmithd logged on this node, over all its boots.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// How many times locksmithd was started.
    pub fn boots(&self) -> u32 {
        self.boots
    }

    /// Start locksmithd (one boot of the node) in its own mount namespace.
    pub fn start_daemon(&mut self) -> Result<(), LabError> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .map_err(|e| LabError::io("locksmithd log", e))?;
        let mut cmd = Command::new("unshare");
        cmd.args([
            "-m",
            "--propagation",
            "private",
            "sh",
            "-c",
            NAMESPACE_SETUP,
        ])
        .arg("locksmithd-node")
        .arg(self.bus.dir().join("bus"))
        .arg(self.dir.path().join("machine-id"))
        .arg(&self.binary)
        .arg(self.update_engine_dir.as_deref().unwrap_or(Path::new("")));
        for (k, _) in std::env::vars_os() {
            let k_text = k.to_string_lossy();
            if k_text.starts_with("LOCKSMITH") || k_text.starts_with("DBUS_") {
                cmd.env_remove(k);
            }
        }
        cmd.env("REBOOT_STRATEGY", "etcd-lock");
        for (name, value) in self.etcd.flags() {
            let var = format!("LOCKSMITHD_{}", name.to_uppercase().replace('-', "_"));
            cmd.env(var, value);
        }
        cmd.stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| LabError::io("log", e))?)
            .stderr(log)
            .kill_on_drop(true);
        let child = cmd
            .spawn()
            .map_err(|e| LabError::io("spawn unshare ... locksmithd", e))?;
        self.child = Some(child);
        self.boots += 1;
        Ok(())
    }

    /// The pid of the running locksmithd (`unshare` and `sh` exec it, so it keeps the pid).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().and_then(Child::id)
    }

    /// Kill locksmithd at once.
    pub async fn kill_daemon(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill().await;
        }
    }

    /// Whether locksmithd exited by itself; its exit code if so.
    pub fn daemon_exit(&mut self) -> Option<Option<i32>> {
        let child = self.child.as_mut()?;
        child.try_wait().ok().flatten().map(|s| s.code())
    }

    /// Make update_engine say a reboot is needed.
    pub async fn trigger(&self, version: &str) -> Result<(), LabError> {
        self.update_engine
            .set_status("UPDATE_STATUS_UPDATED_NEED_REBOOT", version)
            .await
    }

    /// A reboot: locksmithd dies, update_engine comes back idle, locksmithd starts again.
    pub async fn reboot(&mut self) -> Result<(), LabError> {
        self.kill_daemon().await;
        self.update_engine
            .set_status("UPDATE_STATUS_IDLE", "")
            .await?;
        self.start_daemon()
    }
}

fn random_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/uuid")
        .map(|s| s.trim().replace('-', ""))
        .unwrap_or_else(|_| format!("{:032x}", std::process::id()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_output_parses() {
        let s = CtlStatus::parse("Available: 0\nMax: 1\n\nMACHINE ID\nabc\ndef\n").unwrap();
        assert_eq!(s.available, 0);
        assert_eq!(s.max, 1);
        assert_eq!(s.holders, ["abc", "def"]);
        let s = CtlStatus::parse("Available: -2\nMax: 0\n").unwrap();
        assert_eq!((s.available, s.max, s.holders.len()), (-2, 0, 0));
        assert_eq!(CtlStatus::parse("Error setting value: x\n"), None);
    }
}
