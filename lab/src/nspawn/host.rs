//! One container host: an overlay over the cached image, booted by `systemd-nspawn` again after
//! every reboot, until it powers off or is dropped.
//!
//! nspawn is told to report to a notify socket of the lab's (`--notify-ready=yes`): it sends
//! `X_NSPAWN_LEADER_PID=` (the container's PID 1 as the host sees it) at each boot and `READY=1`
//! once that process runs the container's init in the container's root; from then on commands
//! reach the container with `nsenter -t PID -a`. A reboot inside (logind, `systemctl
//! reboot`) ends nspawn with status 133; the lab then boots the container again from the same
//! directory, so the machine id, the installed files, `/var/lib` and the persistent journal
//! stay, while `/run` is new.

use super::{io, run, NspawnError};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::watch;

/// How long one command inside a container may take.
const EXEC_TIMEOUT: Duration = Duration::from_secs(120);
/// nspawn's exit status when the container rebooted.
const EXIT_REBOOT: i32 = 133;
/// PATH for commands inside the container.
const PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Where a host is in its life, as the supervisor sees it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Boots {
    /// Boots started so far (1 during the first boot).
    pub count: u32,
    /// The container's PID 1 on the host while a boot runs.
    pub leader: Option<u32>,
    /// nspawn's process id while it runs.
    pub nspawn: Option<u32>,
    /// Set when the host stopped for good: how nspawn ended (0: powered off).
    pub ended: Option<String>,
}

/// A container host. Dropping it kills the container, unmounts its overlay and removes its
/// directory.
pub struct Host {
    pub name: String,
    pub machine_id: String,
    dir: tempfile::TempDir,
    binds: Vec<(PathBuf, String)>,
    boots: watch::Receiver<Boots>,
    boots_tx: Option<watch::Sender<Boots>>,
    supervisor: Option<tokio::task::JoinHandle<()>>,
    mounted: bool,
}

fn random_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/uuid")
        .map(|s| s.trim().replace('-', ""))
        .unwrap_or_else(|_| format!("{:032x}", std::process::id()))
}

impl Host {
    /// Mount an overlay over `image` for a host called `name` (also its host name, so rebootd's
    /// node name) and give it its own machine id. Nothing runs yet: install files, then
    /// [`Host::boot`].
    pub fn create(image: &Path, name: &str) -> Result<Host, NspawnError> {
        let dir = tempfile::Builder::new()
            .prefix(&format!("rebootd-lab-host-{name}-"))
            .tempdir()
            .map_err(io("creating the host directory"))?;
        for d in ["upper", "work", "root"] {
            std::fs::create_dir(dir.path().join(d)).map_err(io(format!("creating {d}")))?;
        }
        // The root of the container must not be writable by others (nspawn checks).
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))
            .map_err(io("chmod the host directory"))?;
        let options = format!(
            "lowerdir={},upperdir={},workdir={}",
            image.display(),
            dir.path().join("upper").display(),
            dir.path().join("work").display()
        );
        let (boots_tx, boots) = watch::channel(Boots::default());
        let mut host = Host {
            name: name.to_string(),
            machine_id: random_id(),
            dir,
            binds: Vec::new(),
            boots,
            boots_tx: Some(boots_tx),
            supervisor: None,
            mounted: false,
        };
        run(std::process::Command::new("mount")
            .args(["-t", "overlay", "overlay", "-o", &options])
            .arg(host.root()))?;
        host.mounted = true;
        host.write("/etc/machine-id", &format!("{}\n", host.machine_id), 0o444)?;
        // debootstrap copied this machine's host name; systemd sets the container's from here.
        host.write("/etc/hostname", &format!("{name}\n"), 0o644)?;
        // nspawn mounts the root itself; remounting it is useless here and has failed under
        // load on cgroup v1 hosts ("Failed at step CGROUP").
        host.symlink(
            "/dev/null",
            "/etc/systemd/system/systemd-remount-fs.service",
        )?;
        Ok(host)
    }

    /// The container's root directory as the host sees it (files outside `/run` and `/tmp`).
    pub fn root(&self) -> PathBuf {
        self.dir.path().join("root")
    }

    /// The host path of `path` inside the container.
    pub fn path(&self, path: &str) -> PathBuf {
        self.root().join(path.trim_start_matches('/'))
    }

    /// What nspawn printed (the container's console), over all boots.
    pub fn console(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("console.log")).unwrap_or_default()
    }

    /// Write a file inside the container (creating its directories).
    pub fn write(&self, path: &str, contents: &str, mode: u32) -> Result<(), NspawnError> {
        let target = self.path(path);
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent)
                .map_err(io(format!("creating {}", parent.display())))?;
        }
        std::fs::write(&target, contents).map_err(io(format!("writing {path}")))?;
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(mode))
            .map_err(io(format!("chmod {path}")))
    }

    /// Copy a host file into the container.
    pub fn copy(&self, from: &Path, path: &str, mode: u32) -> Result<(), NspawnError> {
        let target = self.path(path);
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent)
                .map_err(io(format!("creating {}", parent.display())))?;
        }
        std::fs::copy(from, &target)
            .map_err(io(format!("copying {} to {path}", from.display())))?;
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(mode))
            .map_err(io(format!("chmod {path}")))
    }

    /// A symbolic link inside the container.
    pub fn symlink(&self, target: &str, path: &str) -> Result<(), NspawnError> {
        let link = self.path(path);
        if let Some(parent) = link.parent() {
            std::fs::create_dir_all(parent)
                .map_err(io(format!("creating {}", parent.display())))?;
        }
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(target, &link).map_err(io(format!("linking {path}")))
    }

    /// Make a host file visible read-only at `path` in the container (from the next boot on).
    pub fn bind_ro(&mut self, from: &Path, path: &str) {
        self.binds.push((from.to_path_buf(), path.to_string()));
    }

    /// Boot the container, and boot it again after each reboot until it powers off.
    pub fn boot(&mut self) -> Result<(), NspawnError> {
        let tx = self.boots_tx.take().ok_or_else(|| NspawnError::Host {
            host: self.name.clone(),
            what: "booted twice".into(),
        })?;
        let socket_path = self.dir.path().join("notify.sock");
        let notify = tokio::net::UnixDatagram::bind(&socket_path).map_err(io("notify socket"))?;
        let mut args: Vec<String> = vec![
            "-D".into(),
            self.root().display().to_string(),
            "-b".into(),
            // No host systemd here to register with or to ask for a scope.
            "--register=no".into(),
            "--keep-unit".into(),
            "--console=passive".into(),
            format!("--machine={}", self.name),
            "--notify-ready=yes".into(),
        ];
        for (from, to) in &self.binds {
            args.push(format!("--bind-ro={}:{to}", from.display()));
        }
        let console = self.dir.path().join("console.log");
        let name = self.name.clone();
        self.supervisor = Some(tokio::spawn(async move {
            let ended = supervise(&args, &socket_path, &console, notify, &tx).await;
            tracing::debug!(host = %name, %ended, "host stopped");
            tx.send_modify(|b| {
                b.leader = None;
                b.nspawn = None;
                b.ended = Some(ended);
            });
        }));
        Ok(())
    }

    /// Follow the host's boots.
    pub fn boots(&self) -> watch::Receiver<Boots> {
        self.boots.clone()
    }

    /// Wait until boot number `n` runs and systemd in it has finished starting up
    /// (`systemctl is-system-running --wait`); returns what that said ("running", "degraded").
    pub async fn wait_boot(&self, n: u32, timeout: Duration) -> Result<String, NspawnError> {
        let mut rx = self.boots.clone();
        let started = tokio::time::timeout(
            timeout,
            rx.wait_for(|b| (b.count >= n && b.leader.is_some()) || b.ended.is_some()),
        )
        .await;
        let boots = match started {
            Ok(Ok(b)) => b.clone(),
            _ => return Err(self.timeout(timeout, &format!("boot {n}"))),
        };
        if let Some(ended) = boots.ended {
            return Err(self.failed(&format!("stopped before boot {n}: {ended}")));
        }
        let out = tokio::time::timeout(
            timeout,
            self.exec(&["systemctl", "is-system-running", "--wait"]),
        )
        .await
        .map_err(|_| self.timeout(timeout, &format!("systemd to finish boot {n}")))??;
        let state = String::from_utf8_lossy(&out.stdout).trim().to_string();
        if state.is_empty() {
            return Err(self.failed(&format!(
                "systemctl is-system-running: {}",
                String::from_utf8_lossy(&out.stderr)
            )));
        }
        Ok(state)
    }

    /// Wait until the host stopped for good (powered off); returns how nspawn ended.
    pub async fn wait_ended(&self, timeout: Duration) -> Result<String, NspawnError> {
        let mut rx = self.boots.clone();
        let ended = match tokio::time::timeout(timeout, rx.wait_for(|b| b.ended.is_some())).await {
            Ok(Ok(b)) => Ok(b.ended.clone().unwrap_or_default()),
            _ => Err(self.timeout(timeout, "the host to stop")),
        };
        ended
    }

    /// How many boots started so far.
    pub fn boot_count(&self) -> u32 {
        self.boots.borrow().count
    }

    fn leader(&self) -> Result<u32, NspawnError> {
        self.boots
            .borrow()
            .leader
            .ok_or_else(|| self.failed("not running"))
    }

    fn failed(&self, what: &str) -> NspawnError {
        NspawnError::Host {
            host: self.name.clone(),
            what: format!(
                "{what}\n--- console ---\n{}\n--- journal ---\n{}",
                super::tail(&self.console(), 40),
                self.journal_tail(60)
            ),
        }
    }

    /// The last lines of the host's persistent journal, read from outside (so also when the
    /// container hangs in a shutdown): for failure messages.
    fn journal_tail(&self, n: usize) -> String {
        self.journal(&["-n", &n.to_string()])
    }

    /// One unit's lines in the host's persistent journal, every boot, read from outside: for
    /// failure messages that need the boot before the one a test follows.
    pub fn unit_journal(&self, unit: &str) -> String {
        self.journal(&["-u", unit])
    }

    fn journal(&self, args: &[&str]) -> String {
        let dir = self.root().join("var/log/journal");
        let out = std::process::Command::new("journalctl")
            .arg("-D")
            .arg(&dir)
            .args(["--no-pager", "-o", "short-monotonic"])
            .args(args)
            .stdin(Stdio::null())
            .output();
        match out {
            Ok(o) => String::from_utf8_lossy(&o.stdout).into_owned(),
            Err(e) => format!("(journalctl -D {}: {e})", dir.display()),
        }
    }

    fn timeout(&self, after: Duration, what: &str) -> NspawnError {
        NspawnError::Timeout {
            after,
            what: format!(
                "host {}: {what}\n--- console ---\n{}\n--- journal ---\n{}",
                self.name,
                super::tail(&self.console(), 40),
                self.journal_tail(60)
            ),
        }
    }

    /// A command inside the running container, in all its namespaces, with a clean environment.
    pub fn command(&self, args: &[&str]) -> Result<Command, NspawnError> {
        let leader = self.leader()?;
        let mut cmd = Command::new("nsenter");
        cmd.args(["-t", &leader.to_string(), "-a", "--"])
            .args(args)
            .env_clear()
            .env("PATH", PATH)
            .env("LANG", "C.UTF-8")
            .env("SYSTEMD_PAGER", "")
            .env("SYSTEMD_COLORS", "0")
            .stdin(Stdio::null())
            .kill_on_drop(true);
        Ok(cmd)
    }

    /// Run a command inside; its output whatever its exit status.
    pub async fn exec(&self, args: &[&str]) -> Result<Output, NspawnError> {
        let mut cmd = self.command(args)?;
        let what = format!("{args:?} in {}", self.name);
        match tokio::time::timeout(EXEC_TIMEOUT, cmd.output()).await {
            Ok(out) => out.map_err(io(what)),
            Err(_) => Err(NspawnError::Timeout {
                after: EXEC_TIMEOUT,
                what,
            }),
        }
    }

    /// Run a command inside; its standard output, or an error naming it when it fails.
    pub async fn run(&self, args: &[&str]) -> Result<String, NspawnError> {
        let out = self.exec(args).await?;
        if !out.status.success() {
            return Err(NspawnError::Command {
                command: format!("{args:?} in {}", self.name),
                output: format!(
                    "{}\n{}{}",
                    out.status,
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                ),
            });
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Run a shell script inside (`sh -c`); its standard output.
    pub async fn sh(&self, script: &str) -> Result<String, NspawnError> {
        self.run(&["sh", "-c", script]).await
    }

    /// One property of a unit (`systemctl show -p NAME --value UNIT`).
    pub async fn unit_property(&self, unit: &str, name: &str) -> Result<String, NspawnError> {
        Ok(self
            .run(&["systemctl", "show", "-p", name, "--value", unit])
            .await?
            .trim()
            .to_string())
    }

    /// Follow a command's output line by line (e.g. `journalctl -f`); the process ends when
    /// the container goes down, or at its next write once the [`Lines`] is dropped.
    ///
    /// The follower is detached inside the container (`setsid -f`: nsenter's child forks it
    /// and exits, so the container's init adopts it). Left as nsenter's child it would hold up
    /// a reboot for good: systemd-shutdown SIGSTOPs every process before it signals them,
    /// nsenter (outside the container, waiting for its child) mirrors the stop, so it never
    /// reaps the child once that exits, and systemd-shutdown waits for the zombie. (Outside the
    /// container's PID namespace, `nsenter -F`, `journalctl -f` sees no new entries.)
    pub fn follow(&self, args: &[&str]) -> Result<Lines, NspawnError> {
        let mut detached = vec!["setsid", "-f"];
        detached.extend_from_slice(args);
        let mut cmd = self.command(&detached)?;
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(io(format!("{args:?} in {}", self.name)))?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| self.failed("no stdout"))?;
        Ok(Lines {
            _child: child,
            lines: BufReader::new(stdout).lines(),
            seen: Vec::new(),
        })
    }
}

/// Lines of a followed command.
pub struct Lines {
    _child: Child,
    lines: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
    /// Every line read so far.
    pub seen: Vec<String>,
}

impl Lines {
    /// Read until a line satisfies `pred` (that line) or the command ends (`None`: e.g. a
    /// soft reboot ended it with every other process); a timeout naming what was seen.
    pub async fn expect_or_end(
        &mut self,
        what: &str,
        timeout: Duration,
        pred: impl Fn(&str) -> bool,
    ) -> Result<Option<String>, NspawnError> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            match tokio::time::timeout_at(deadline, self.lines.next_line()).await {
                Ok(Ok(Some(line))) => {
                    self.seen.push(line.clone());
                    if pred(&line) {
                        return Ok(Some(line));
                    }
                }
                Ok(Ok(None)) | Ok(Err(_)) => return Ok(None),
                Err(_) => {
                    return Err(NspawnError::Timeout {
                        after: timeout,
                        what: format!("{what}; lines seen:\n{}", self.seen.join("\n")),
                    })
                }
            }
        }
    }

    /// Read until a line satisfies `pred`; that line, or a timeout naming what was seen.
    pub async fn expect(
        &mut self,
        what: &str,
        timeout: Duration,
        pred: impl Fn(&str) -> bool,
    ) -> Result<String, NspawnError> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            match tokio::time::timeout_at(deadline, self.lines.next_line()).await {
                Ok(Ok(Some(line))) => {
                    self.seen.push(line.clone());
                    if pred(&line) {
                        return Ok(line);
                    }
                }
                Ok(_) | Err(_) => {
                    return Err(NspawnError::Timeout {
                        after: timeout,
                        what: format!("{what}; lines seen:\n{}", self.seen.join("\n")),
                    })
                }
            }
        }
    }
}

/// Boot the container again after every reboot; returns how it ended for good.
async fn supervise(
    args: &[String],
    socket: &Path,
    console: &Path,
    notify: tokio::net::UnixDatagram,
    tx: &watch::Sender<Boots>,
) -> String {
    let mut buf = vec![0u8; 4096];
    loop {
        let log = match std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(console)
        {
            Ok(f) => f,
            Err(e) => return format!("cannot open {}: {e}", console.display()),
        };
        let err_log = match log.try_clone() {
            Ok(f) => f,
            Err(e) => return format!("cannot open {}: {e}", console.display()),
        };
        let spawned = Command::new("systemd-nspawn")
            .args(args)
            .env("NOTIFY_SOCKET", socket)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err_log)
            .kill_on_drop(true)
            .spawn();
        let mut child = match spawned {
            Ok(c) => c,
            Err(e) => return format!("cannot run systemd-nspawn: {e}"),
        };
        tx.send_modify(|b| b.nspawn = child.id());
        let mut pending: Option<u32> = None;
        let status = loop {
            tokio::select! {
                got = notify.recv(&mut buf) => {
                    let Ok(n) = got else { continue };
                    let text = String::from_utf8_lossy(&buf[..n]).into_owned();
                    for line in text.lines() {
                        if let Some(pid) = line.strip_prefix("X_NSPAWN_LEADER_PID=").and_then(|p| p.parse().ok()) {
                            pending = Some(pid);
                        } else if line == "READY=1" {
                            // Only now is the leader the container's init in its own root:
                            // nsenter into it earlier would run the host's programs.
                            if let Some(pid) = pending.take() {
                                tx.send_modify(|b| {
                                    b.count += 1;
                                    b.leader = Some(pid);
                                });
                            }
                        }
                    }
                }
                status = child.wait() => break status,
            }
        };
        tx.send_modify(|b| {
            b.leader = None;
            b.nspawn = None;
        });
        match status {
            Ok(s) if s.code() == Some(EXIT_REBOOT) => continue,
            Ok(s) => return s.to_string(),
            Err(e) => return format!("waiting for systemd-nspawn: {e}"),
        }
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        if let Some(task) = self.supervisor.take() {
            task.abort();
        }
        let boots = self.boots.borrow().clone();
        // The container's PID 1 first: its whole PID namespace goes with it.
        for pid in [boots.leader, boots.nspawn].into_iter().flatten() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        if self.mounted {
            // Lazy: a process of the container may still be on its way out.
            if let Err(e) = run(std::process::Command::new("umount")
                .arg("-l")
                .arg(self.root()))
            {
                tracing::warn!(host = %self.name, error = %e, "cannot unmount the overlay");
            }
        }
    }
}
