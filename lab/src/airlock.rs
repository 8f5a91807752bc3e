//! The real airlock (coreos/airlock, built by `../shared/peers/build.sh`): a FleetLock server
//! keeping its semaphore in etcd v3 under `com.coreos.airlock/groups/<group>/v1/semaphore`
//! (`{"total_slots": N, "holders": [...]}`). [`Airlock::start`] runs it on a free loopback port
//! against a lab etcd; [`Airlock::holders`] reads its semaphore back from etcd.

use crate::etcd::EtcdServer;
use std::process::Stdio;
use std::time::Duration;
use tokio::process::{Child, Command};

/// How long airlock may take to listen.
const START_TIMEOUT: Duration = Duration::from_secs(20);

#[derive(Debug, thiserror::Error)]
pub enum AirlockError {
    #[error("airlock: {0}")]
    Missing(String),
    #[error("{0}: {1}")]
    Io(String, std::io::Error),
    #[error("airlock did not listen within {START_TIMEOUT:?}; its log: {0}")]
    Start(String),
    #[error("reading airlock's semaphore: {0}")]
    Read(String),
}

/// A running airlock.
pub struct Airlock {
    child: Child,
    port: u16,
    dir: tempfile::TempDir,
}

/// Run airlock with the configuration in `dir`, its log appended there.
fn spawn(bin: &std::path::Path, dir: &std::path::Path) -> Result<Child, AirlockError> {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("airlock.log"))
        .map_err(|e| AirlockError::Io("airlock log".into(), e))?;
    Command::new(bin)
        .arg("serve")
        .arg("-c")
        .arg(dir.join("config.toml"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| AirlockError::Io(format!("spawn {}", bin.display()), e))
}

fn free_port() -> Result<u16, AirlockError> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| AirlockError::Io("free port".into(), e))
}

impl Airlock {
    /// Start airlock on `etcd` with the given groups and their slots (the first group is its
    /// default group).
    pub async fn start(etcd: &EtcdServer, groups: &[(&str, u64)]) -> Result<Airlock, AirlockError> {
        let bin = crate::locksmith::peer_binary("airlock")
            .map_err(|e| AirlockError::Missing(e.to_string()))?;
        let dir = tempfile::Builder::new()
            .prefix("rebootd-lab-airlock-")
            .tempdir()
            .map_err(|e| AirlockError::Io("temp dir".into(), e))?;
        let port = free_port()?;
        let (default, slots) = groups.first().copied().unwrap_or(("default", 1));
        let mut config = format!(
            "[status]\nenabled = false\n\n[service]\naddress = \"127.0.0.1\"\nport = {port}\ntls = false\n\n\
             [etcd3]\nendpoints = [ \"{}\" ]\n\n[lock]\ndefault_group_name = \"{default}\"\ndefault_slots = {slots}\n",
            etcd.endpoint()
        );
        for (name, slots) in groups.iter().skip(1) {
            config.push_str(&format!(
                "\n[[lock.groups]]\nname = \"{name}\"\nslots = {slots}\n"
            ));
        }
        let config_path = dir.path().join("config.toml");
        std::fs::write(&config_path, config)
            .map_err(|e| AirlockError::Io("airlock config".into(), e))?;
        let child = spawn(&bin, dir.path())?;
        let airlock = Airlock { child, port, dir };
        airlock.listening().await?;
        Ok(airlock)
    }

    /// airlock logs before it listens and offers no readiness signal: connect until it
    /// accepts, bounded.
    async fn listening(&self) -> Result<(), AirlockError> {
        let deadline = tokio::time::Instant::now() + START_TIMEOUT;
        loop {
            if tokio::net::TcpStream::connect(("127.0.0.1", self.port))
                .await
                .is_ok()
            {
                return Ok(());
            }
            if tokio::time::Instant::now() > deadline {
                return Err(AirlockError::Start(self.log()));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Kill airlock (SIGKILL) and wait for it.
    pub async fn kill(&mut self) {
        let _ = self.child.kill().await;
    }

    /// Start airlock again, with the same configuration and port, once it is listening.
    pub async fn restart(&mut self) -> Result<(), AirlockError> {
        let _ = self.child.kill().await;
        let bin = crate::locksmith::peer_binary("airlock")
            .map_err(|e| AirlockError::Missing(e.to_string()))?;
        self.child = spawn(&bin, self.dir.path())?;
        self.listening().await
    }

    /// The base URL to give FleetLock clients.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// What airlock logged.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("airlock.log")).unwrap_or_default()
    }

    /// The holders of a group as airlock stored them in `etcd` (empty before its first lock).
    pub fn holders(etcd: &EtcdServer, group: &str) -> Result<Vec<String>, AirlockError> {
        let key = format!("com.coreos.airlock/groups/{group}/v1/semaphore");
        let out = etcd
            .etcdctl()
            .args(["get", "--print-value-only", &key])
            .output()
            .map_err(|e| AirlockError::Io("etcdctl".into(), e))?;
        if !out.status.success() {
            return Err(AirlockError::Read(
                String::from_utf8_lossy(&out.stderr).into(),
            ));
        }
        let text = String::from_utf8_lossy(&out.stdout);
        if text.trim().is_empty() {
            return Ok(Vec::new());
        }
        #[derive(serde::Deserialize)]
        struct Sem {
            holders: Vec<String>,
        }
        serde_json::from_str::<Sem>(text.trim())
            .map(|s| s.holders)
            .map_err(|e| AirlockError::Read(format!("{e}: {text}")))
    }

    /// Stop airlock.
    pub async fn stop(mut self) {
        let _ = self.child.kill().await;
    }
}
