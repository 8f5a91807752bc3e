//! Flatcar's update coordinator file, `/run/update-engine/coordinator.conf` by default
//! (`[reboot] coordinator_file`): who coordinates reboots on this host, with which strategy, and
//! in what state, for Flatcar's login banner and tools. locksmithd writes it
//! (`pkg/coordinatorconf`); rebootd takes its place and writes the same keys.
//!
//! Protocol, as locksmithd's: the file is `KEY=value` lines a shell can source. rebootd holds an
//! exclusive `flock` on it for as long as it runs, so a second coordinator (a locksmithd that was
//! not masked) sees the file taken. An update writes a new file beside it, locks that, renames it
//! over the old one and only then lets go of the old lock: at no moment is the path unlocked.
//! The file is never deleted. It is world-readable (0644) whatever the service's umask.
//!
//! Writing it is best effort: a failure is logged with the path and never stops the daemon.

use crate::config::LockBackend;
use crate::state::{Phase, State};
use std::fs::{File, OpenOptions, Permissions, TryLockError};
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use tracing::{debug, warn};

/// Where Flatcar looks for the coordinator file (locksmith's `UpdateCoordinatorConfPath`).
pub const DEFAULT_PATH: &str = "/run/update-engine/coordinator.conf";

/// The `NAME=` rebootd writes.
pub const NAME: &str = "rebootd";

/// Readable by every user (a login banner, `cat` by an operator), as locksmithd's.
const FILE_MODE: u32 = 0o644;

/// Mode of the directory when rebootd has to make it (locksmithd's `MkdirAll(.., 0755)`).
const DIR_MODE: u32 = 0o755;

/// The `STATE=` values, locksmithd's vocabulary (`coordinatorconf.CoordinatorState*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CoordinatorState {
    /// The daemon is starting (configuration loaded, state not read yet).
    Starting,
    /// Running but intentionally not rebooting (this node is paused).
    Disabled,
    /// Normal operation: no reboot pending.
    Running,
    /// A reboot will happen once its conditions are met (window, slot, drain, inhibitors).
    RebootPlanned,
    /// logind has been asked to reboot.
    Rebooting,
}

impl CoordinatorState {
    pub fn as_str(self) -> &'static str {
        match self {
            CoordinatorState::Starting => "starting",
            CoordinatorState::Disabled => "disabled",
            CoordinatorState::Running => "running",
            CoordinatorState::RebootPlanned => "reboot-planned",
            CoordinatorState::Rebooting => "rebooting",
        }
    }
}

/// The `STRATEGY=` for a lock backend: locksmith's words where locksmith has the same strategy
/// (`reboot`: no lock; `etcd-lock`), so scripts written for locksmithd keep working.
pub fn strategy(backend: &LockBackend) -> &'static str {
    match backend {
        LockBackend::None => "reboot",
        LockBackend::Etcd(_) => "etcd-lock",
        LockBackend::Kubernetes(_) => "kubernetes-lease",
        LockBackend::FleetLock(_) => "fleet-lock",
    }
}

/// The coordinator state a node's state shows as.
pub fn state_of(s: &State) -> CoordinatorState {
    let called = s.reboot.as_ref().is_some_and(|r| r.called);
    if s.paused.is_some() && !called {
        return CoordinatorState::Disabled;
    }
    match s.phase {
        Phase::Idle | Phase::WaitingForHealthy | Phase::Uncordoning | Phase::Releasing => {
            CoordinatorState::Running
        }
        Phase::RebootNeeded | Phase::WaitingForWindow | Phase::AcquiringSlot | Phase::Draining => {
            CoordinatorState::RebootPlanned
        }
        Phase::Rebooting => match &s.reboot {
            Some(r) if r.called => CoordinatorState::Rebooting,
            _ => CoordinatorState::RebootPlanned,
        },
    }
}

/// The file's text: `NAME`, `STRATEGY`, `STATE` as locksmithd writes them, and rebootd's own
/// `PHASE` (once the state is known), one `KEY=value` per line.
pub fn render(strategy: &str, state: CoordinatorState, phase: Option<Phase>) -> String {
    let mut text = format!(
        "NAME={NAME}\nSTRATEGY={strategy}\nSTATE={}\n",
        state.as_str()
    );
    if let Some(phase) = phase {
        text.push_str(&format!("PHASE={phase}\n"));
    }
    text
}

#[derive(Debug, thiserror::Error)]
pub enum CoordinatorError {
    #[error("cannot {action} {path}: {source}")]
    Io {
        action: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "another update coordinator holds the lock on {path} ({by}); rebootd does not write it. \
         Two coordinators would both reboot this host: mask the other one (systemctl mask --now locksmithd)"
    )]
    Held { path: PathBuf, by: String },
}

fn io(action: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> CoordinatorError {
    let path = path.to_path_buf();
    move |source| CoordinatorError::Io {
        action,
        path,
        source,
    }
}

/// What is held while the daemon runs: the locked file and the text last written to it.
#[derive(Debug)]
struct Held {
    file: File,
    written: String,
}

/// The coordinator file of this host, locked for as long as this value lives.
#[derive(Debug)]
pub struct CoordinatorFile {
    path: PathBuf,
    strategy: &'static str,
    held: Mutex<Held>,
}

impl CoordinatorFile {
    /// Make the directory if needed, open and lock the file, and write `STATE=starting`.
    pub fn open(path: &Path, strategy: &'static str) -> Result<CoordinatorFile, CoordinatorError> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            if !dir.is_dir() {
                std::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(DIR_MODE)
                    .create(dir)
                    .map_err(io("create the directory", dir))?;
                // The mode above is filtered by the umask (0077 in the unit).
                std::fs::set_permissions(dir, Permissions::from_mode(DIR_MODE))
                    .map_err(io("set the mode of", dir))?;
            }
        }
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(io("open", path))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                let mut text = String::new();
                let _ = file.read_to_string(&mut text);
                let by = text
                    .lines()
                    .find_map(|l| l.strip_prefix("NAME="))
                    .map_or("it names no coordinator".to_string(), |n| {
                        format!("NAME={n}")
                    });
                return Err(CoordinatorError::Held {
                    path: path.to_path_buf(),
                    by,
                });
            }
            Err(TryLockError::Error(e)) => return Err(io("lock", path)(e)),
        }
        let coordinator = CoordinatorFile {
            path: path.to_path_buf(),
            strategy,
            held: Mutex::new(Held {
                file,
                written: String::new(),
            }),
        };
        coordinator.write(&render(strategy, CoordinatorState::Starting, None))?;
        Ok(coordinator)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Show this node state in the file (nothing is written when the text is unchanged). A
    /// failure is logged with the path; the daemon carries on.
    pub fn update(&self, s: &State) {
        let text = render(self.strategy, state_of(s), Some(s.phase));
        if let Err(e) = self.write(&text) {
            let path = self.path.display().to_string();
            warn!(%path, error = %e, "cannot update the coordinator file {path}: {e}");
        }
    }

    /// Replace the file with `text`, keeping the path locked throughout.
    fn write(&self, text: &str) -> Result<(), CoordinatorError> {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        if held.written == text {
            return Ok(());
        }
        let name = self
            .path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let tmp = self
            .path
            .with_file_name(format!(".{name}.{}.tmp", std::process::id()));
        let result: Result<File, CoordinatorError> = (|| {
            // A leftover of an earlier process with the same pid (a container) is stale.
            let _ = std::fs::remove_file(&tmp);
            let mut new = OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&tmp)
                .map_err(io("create", &tmp))?;
            new.set_permissions(Permissions::from_mode(FILE_MODE))
                .map_err(io("set the mode of", &tmp))?;
            new.write_all(text.as_bytes()).map_err(io("write", &tmp))?;
            new.try_lock().map_err(|e| match e {
                TryLockError::Error(e) => io("lock", &tmp)(e),
                TryLockError::WouldBlock => io("lock", &tmp)(std::io::ErrorKind::WouldBlock.into()),
            })?;
            std::fs::rename(&tmp, &self.path)
                .map_err(io("rename a new version over", &self.path))?;
            Ok(new)
        })();
        match result {
            Ok(new) => {
                // Dropping the old handle lets go of its lock: the new file is locked already.
                held.file = new;
                held.written = text.to_string();
                let path = self.path.display().to_string();
                debug!(%path, "coordinator file {path}: {}", text.replace('\n', " "));
                Ok(())
            }
            Err(e) => {
                let _ = std::fs::remove_file(&tmp);
                Err(e)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::RebootRequest;
    use jiff::Timestamp;

    fn state(phase: Phase) -> State {
        let mut s = State::new("b", Timestamp::UNIX_EPOCH);
        s.phase = phase;
        s
    }

    fn keys(text: &str) -> Vec<(&str, &str)> {
        text.lines().map(|l| l.split_once('=').unwrap()).collect()
    }

    #[test]
    fn the_file_is_locksmiths_keys_then_the_phase() {
        let text = render(
            "etcd-lock",
            CoordinatorState::RebootPlanned,
            Some(Phase::AcquiringSlot),
        );
        assert_eq!(
            text,
            "NAME=rebootd\nSTRATEGY=etcd-lock\nSTATE=reboot-planned\nPHASE=acquiring_slot\n"
        );
        // Shell-sourceable: KEY=value, no spaces or quotes anywhere.
        for (k, v) in keys(&text) {
            assert!(k.chars().all(|c| c.is_ascii_uppercase()), "{k}");
            assert!(
                v.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_".contains(c)),
                "{v}"
            );
        }
        assert_eq!(
            render("reboot", CoordinatorState::Starting, None),
            "NAME=rebootd\nSTRATEGY=reboot\nSTATE=starting\n"
        );
    }

    #[test]
    fn strategies_use_locksmiths_words_where_it_has_them() {
        assert_eq!(strategy(&LockBackend::None), "reboot");
        let etcd = crate::config::Etcd {
            api: crate::config::EtcdApi::V2,
            endpoints: vec![],
            ca_file: None,
            cert_file: None,
            key_file: None,
            username: None,
            password_file: None,
        };
        assert_eq!(strategy(&LockBackend::Etcd(etcd)), "etcd-lock");
    }

    #[test]
    fn the_state_follows_the_phase() {
        use CoordinatorState::*;
        for (phase, want) in [
            (Phase::Idle, Running),
            (Phase::RebootNeeded, RebootPlanned),
            (Phase::WaitingForWindow, RebootPlanned),
            (Phase::AcquiringSlot, RebootPlanned),
            (Phase::Draining, RebootPlanned),
            (Phase::Rebooting, RebootPlanned),
            (Phase::WaitingForHealthy, Running),
            (Phase::Uncordoning, Running),
            (Phase::Releasing, Running),
        ] {
            assert_eq!(state_of(&state(phase)), want, "{phase}");
        }
        let mut s = state(Phase::Rebooting);
        s.reboot = Some(RebootRequest {
            requested_at: Timestamp::UNIX_EPOCH,
            boot_id: "b".into(),
            called: false,
            kind: Default::default(),
            soft_reboots: None,
        });
        assert_eq!(state_of(&s), RebootPlanned, "logind not asked yet");
        s.reboot.as_mut().unwrap().called = true;
        assert_eq!(state_of(&s), Rebooting);
        // Paused (rebootctl pause): "disabled", unless logind was asked already.
        let pause = crate::state::Pause {
            since: Timestamp::UNIX_EPOCH,
            reason: None,
        };
        s.paused = Some(pause.clone());
        assert_eq!(state_of(&s), Rebooting);
        let mut idle = state(Phase::Idle);
        idle.paused = Some(pause);
        assert_eq!(state_of(&idle), Disabled);
    }

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn open_makes_the_directory_writes_starting_and_keeps_the_path_locked_across_updates() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("update-engine/coordinator.conf");
        let c = CoordinatorFile::open(&path, "etcd-lock").unwrap();
        assert_eq!(mode(path.parent().unwrap()), DIR_MODE);
        assert_eq!(mode(&path), FILE_MODE);
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(keys(&text)[2], ("STATE", "starting"));
        let locked = |path: &Path| {
            let f = File::open(path).unwrap();
            matches!(f.try_lock(), Err(TryLockError::WouldBlock))
        };
        assert!(locked(&path));
        c.update(&state(Phase::WaitingForWindow));
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(keys(&text)[2], ("STATE", "reboot-planned"));
        assert_eq!(keys(&text)[3], ("PHASE", "waiting_for_window"));
        assert_eq!(mode(&path), FILE_MODE);
        assert!(locked(&path), "the new file is locked too");
        // No temporary file left beside it.
        let names: Vec<_> = std::fs::read_dir(path.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["coordinator.conf"]);
        drop(c);
        // A process another test forks holds a copy of the descriptor until its exec closes
        // it (close-on-exec): the lock goes within that moment, not necessarily at once.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while locked(&path) && std::time::Instant::now() < deadline {
            std::thread::yield_now();
        }
        assert!(!locked(&path), "the lock goes with the daemon");
        assert!(path.exists(), "the file stays");
    }

    #[test]
    fn a_file_locked_by_another_coordinator_is_left_alone_and_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("coordinator.conf");
        std::fs::write(&path, "NAME=locksmithd\nSTRATEGY=etcd-lock\nSTATE=running").unwrap();
        let other = File::open(&path).unwrap();
        other.try_lock().unwrap();
        let e = CoordinatorFile::open(&path, "etcd-lock").unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("NAME=locksmithd"), "{msg}");
        assert!(msg.contains(&path.display().to_string()), "{msg}");
        assert!(std::fs::read_to_string(&path)
            .unwrap()
            .contains("locksmithd"));
        drop(other);
        CoordinatorFile::open(&path, "etcd-lock").unwrap();
    }
}
