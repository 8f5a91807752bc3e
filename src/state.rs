//! What survives a crash and a reboot: `state.json` in the state directory, written atomically
//! (write a temporary file, fsync it, rename it over the old one, fsync the directory).
//!
//! The agent writes the new state before the side effect it guards, so after a crash the file
//! always says what may have been done. A file that does not parse is never overwritten: rebootd
//! refuses to start and names the file, so an operator can look at it.

use jiff::Timestamp;
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::{Path, PathBuf};

/// Name of the state file inside the state directory.
pub const STATE_FILE: &str = "state.json";

/// Name of the file `rebootctl reboot` writes to ask for a coordinated reboot.
pub const REQUEST_FILE: &str = "reboot-request";

/// Name of the file holding this host's holder token (see [`StateStore::holder_token`]).
pub const TOKEN_FILE: &str = "holder-token";

/// Version of the state file layout; bumped on incompatible changes.
pub const STATE_VERSION: u32 = 1;

/// Where a node is in its reboot cycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    Idle,
    RebootNeeded,
    WaitingForWindow,
    AcquiringSlot,
    Draining,
    Rebooting,
    WaitingForHealthy,
    Uncordoning,
    Releasing,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Idle => "idle",
            Phase::RebootNeeded => "reboot_needed",
            Phase::WaitingForWindow => "waiting_for_window",
            Phase::AcquiringSlot => "acquiring_slot",
            Phase::Draining => "draining",
            Phase::Rebooting => "rebooting",
            Phase::WaitingForHealthy => "waiting_for_healthy",
            Phase::Uncordoning => "uncordoning",
            Phase::Releasing => "releasing",
        }
    }
}

impl std::fmt::Display for Phase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A reboot that logind was (about to be) asked for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RebootRequest {
    /// Written before the call to logind, so a crash right after it is not a lost reboot.
    pub requested_at: Timestamp,
    /// The boot the request was made in: a different boot id after restart = it happened.
    pub boot_id: String,
    /// Whether logind may have been called (accepted, or unknown after a crash).
    #[serde(default)]
    pub called: bool,
    /// The kind of reboot asked for (`[reboot] method`); a state file from before methods
    /// existed means a full reboot.
    #[serde(default)]
    pub kind: crate::reboot_method::Kind,
    /// systemd's `SoftRebootsCount` before the call: a higher count in the same boot id
    /// after a restart = a soft reboot happened.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub soft_reboots: Option<u64>,
}

/// The persisted state of the agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct State {
    pub version: u32,
    pub phase: Phase,
    /// When the current phase was entered.
    pub since: Timestamp,
    /// Why a reboot is needed (which trigger, what it said); None when none is. On disk the
    /// string `<trigger>: <what it saw>`, which older state files also hold.
    #[serde(default)]
    pub reason: Option<crate::need::Need>,
    /// The boot id when this state was written.
    pub boot_id: String,
    /// Whether this node holds a slot of the semaphore.
    #[serde(default)]
    pub slot_held: bool,
    /// Set from just before asking logind until the reboot is seen to have happened.
    #[serde(default)]
    pub reboot: Option<RebootRequest>,
    /// Reboot requests that did not lead to a reboot in this cycle.
    #[serde(default)]
    pub failed_attempts: u32,
    /// Do nothing before this instant (a back-off after a refusal or an error).
    #[serde(default)]
    pub retry_at: Option<Timestamp>,
    /// Do not start a new attempt (check the window) before this instant: set when an attempt
    /// was backed out of (blocking pods, a failed drain).
    #[serde(default)]
    pub not_before: Option<Timestamp>,
    /// The last thing that went wrong, for `rebootctl status`.
    #[serde(default)]
    pub last_error: Option<String>,
    /// What the agent waits for now, in words.
    #[serde(default)]
    pub waiting_for: Option<String>,
    /// Whether rebootd looked at the node before cordoning it in this cycle (written before the
    /// cordon, so a crash in between cannot mistake our cordon for an operator's).
    #[serde(default)]
    pub cordon_recorded: bool,
    /// Whether rebootd cordoned the node (and so may uncordon it).
    #[serde(default)]
    pub cordoned_by_us: bool,
    /// When the last coordinated reboot was seen to have happened.
    #[serde(default)]
    pub last_reboot: Option<Timestamp>,
    /// Coordinated reboots seen to have happened on this host.
    #[serde(default)]
    pub reboots: u64,
    /// The block inhibitors on shutdown that hold off the reboot now (phase rebooting, logind
    /// not asked yet).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub inhibited_by: Vec<crate::inhibitor::Inhibitor>,
    /// The gate (`[gates]`) that said wait at the last check; cleared once they all go.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gate: Option<GateWait>,
    /// Set by `rebootctl pause`, cleared by `rebootctl resume`: while set, no slot is taken and
    /// no reboot started (a need is kept for later).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused: Option<Pause>,
    /// The group's pause (`rebootctl pause --group`, kept in the lock store) this node saw while
    /// waiting for a slot: it takes none until the group is resumed. Gone with that phase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group_paused: Option<crate::lock::GroupPause>,
    /// Back after the reboot: the slot is held until then (`gates.settle`), then released.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub settle_until: Option<Timestamp>,
    /// The warning given to logged-in users before this reboot (see [`crate::users`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub users_warned: Option<crate::users::Warning>,
    /// When this node took the slot it holds. Kept by the runtime beside the agent's steps (for
    /// `rebootd_slot_held_since_timestamp_seconds`); absent in files written before it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slot_since: Option<Timestamp>,
    /// Whether rebootd may have put the cluster autoscaler's `scale-down-disabled` annotation on
    /// its Node for the slot it holds, so takes it off when it gives the slot back (see
    /// `drain::autoscaler`). Written before the annotation, cleared once it is off; kept by the
    /// runtime, absent (false) in files written before it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub scale_down_disabled: bool,
}

/// A gate that says wait: which, why, since when, and when it is asked again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GateWait {
    pub name: String,
    pub why: String,
    /// When this gate was first seen closed (kept while it stays closed).
    pub since: Timestamp,
    /// When the gates are asked again.
    pub next_check: Timestamp,
}

impl GateWait {
    /// In words, for `waiting_for`.
    pub fn describe(&self) -> String {
        format!("gate {:?}: {}", self.name, self.why)
    }
}

/// An operator's pause of this node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pause {
    /// When the daemon applied it.
    pub since: Timestamp,
    /// What the operator said (`rebootctl pause --reason`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl State {
    /// Whether logind was asked to reboot in this rebooting episode and may still act on it: a
    /// call on record, or one that a restart in the same boot (or a time-out) put aside to be
    /// asked again, which may still be pending in logind. Such a reboot cannot be taken back:
    /// `cancel` is refused and `pause` does not back out.
    pub fn logind_asked(&self) -> bool {
        self.reboot.as_ref().is_some_and(|r| r.called)
            || (self.phase == Phase::Rebooting && self.failed_attempts > 0)
    }

    /// A copy whose texts from outside (`waiting_for`, `last_error`, the gate's answer, the
    /// inhibitors) are bounded and escaped ([`crate::text::clean`]).
    pub fn cleaned(&self) -> State {
        use crate::text::clean;
        let mut s = self.clone();
        for t in [&mut s.waiting_for, &mut s.last_error]
            .into_iter()
            .flatten()
        {
            *t = clean(t);
        }
        if let Some(g) = s.gate.as_mut() {
            g.why = clean(&g.why);
        }
        for i in &mut s.inhibited_by {
            i.clean();
        }
        s
    }

    /// The state of a node that has never needed a reboot.
    pub fn new(boot_id: &str, now: Timestamp) -> State {
        State {
            version: STATE_VERSION,
            phase: Phase::Idle,
            since: now,
            reason: None,
            boot_id: boot_id.to_string(),
            slot_held: false,
            reboot: None,
            failed_attempts: 0,
            retry_at: None,
            not_before: None,
            last_error: None,
            waiting_for: None,
            cordon_recorded: false,
            cordoned_by_us: false,
            last_reboot: None,
            reboots: 0,
            inhibited_by: Vec::new(),
            gate: None,
            paused: None,
            group_paused: None,
            settle_until: None,
            users_warned: None,
            slot_since: None,
            scale_down_disabled: false,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("cannot read state file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("state file {path} does not parse ({reason}); it is left as it is — move it aside to start afresh. Content: {content}")]
    Corrupt {
        path: PathBuf,
        reason: ParseError,
        content: String,
    },
    #[error("cannot write state file {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// The state directory: `$STATE_DIRECTORY` (set by systemd) or `/var/lib/rebootd`.
pub fn state_dir() -> PathBuf {
    std::env::var_os("STATE_DIRECTORY")
        // systemd may pass several colon-separated directories; the first is ours.
        .and_then(|v| v.to_string_lossy().split(':').next().map(PathBuf::from))
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or_else(|| PathBuf::from("/var/lib/rebootd"))
}

/// Reads and writes the state file of one state directory.
#[derive(Debug, Clone)]
pub struct StateStore {
    dir: PathBuf,
}

impl StateStore {
    pub fn new(dir: impl Into<PathBuf>) -> StateStore {
        StateStore { dir: dir.into() }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn path(&self) -> PathBuf {
        self.dir.join(STATE_FILE)
    }

    pub fn request_path(&self) -> PathBuf {
        self.dir.join(REQUEST_FILE)
    }

    pub fn token_path(&self) -> PathBuf {
        self.dir.join(TOKEN_FILE)
    }

    /// This host's holder token: 32 random hex digits made once (by the daemon or `rebootctl
    /// lock`, whichever comes first) and kept in the state directory. It goes on the holder
    /// record with the machine id, so a restarted rebootd knows its own slot, and another host
    /// with the same machine id (a cloned image) is told apart and never admitted beside it.
    /// A file that is not such a token is an error naming it, and is left as it is.
    pub fn holder_token(&self) -> Result<String, StateError> {
        let path = self.token_path();
        match std::fs::read(&path) {
            Ok(bytes) => return parse_token(&path, &bytes),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => return Err(StateError::Read { path, source }),
        }
        let token = random_token().map_err(|source| StateError::Write {
            path: path.clone(),
            source,
        })?;
        // Made by whoever comes first: a second maker reads the first one's.
        let err = |source| StateError::Write {
            path: path.clone(),
            source,
        };
        std::fs::create_dir_all(&self.dir).map_err(err)?;
        let tmp = self
            .dir
            .join(format!(".{TOKEN_FILE}.{}.tmp", std::process::id()));
        let mut f = std::fs::File::create(&tmp).map_err(err)?;
        f.write_all(format!("{token}\n").as_bytes()).map_err(err)?;
        f.sync_all().map_err(err)?;
        drop(f);
        let linked = std::fs::hard_link(&tmp, &path);
        let _ = std::fs::remove_file(&tmp);
        match linked {
            Ok(()) => Ok(token),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                let bytes = std::fs::read(&path).map_err(|source| StateError::Read {
                    path: path.clone(),
                    source,
                })?;
                parse_token(&path, &bytes)
            }
            Err(source) => Err(StateError::Write { path, source }),
        }
    }

    /// The saved state, or None when there is none yet.
    pub fn load(&self) -> Result<Option<State>, StateError> {
        let path = self.path();
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(StateError::Read { path, source }),
        };
        parse(&bytes)
            .map(Some)
            .map_err(|reason| StateError::Corrupt {
                path,
                reason,
                content: String::from_utf8_lossy(&bytes).chars().take(400).collect(),
            })
    }

    /// Write the state atomically and durably.
    /// Texts that came from outside (errors, gate answers, inhibitors) are written bounded and
    /// escaped ([`State::cleaned`]).
    pub fn save(&self, state: &State) -> Result<(), StateError> {
        let bytes = serde_json::to_vec_pretty(&state.cleaned()).map_err(|e| StateError::Write {
            path: self.path(),
            source: std::io::Error::other(e),
        })?;
        write_atomic(&self.path(), &bytes)
    }
}

fn parse_token(path: &Path, bytes: &[u8]) -> Result<String, StateError> {
    let text = String::from_utf8_lossy(bytes);
    let token = text.trim();
    if token.len() >= 16 && token.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Ok(token.to_owned());
    }
    Err(StateError::Corrupt {
        path: path.to_path_buf(),
        reason: ParseError::Token,
        content: token.chars().take(100).collect(),
    })
}

/// 128 random bits as hex, from the kernel.
fn random_token() -> std::io::Result<String> {
    use std::io::Read;
    let mut bytes = [0u8; 16];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Why a state file's (or the token file's) content does not read: the reason of
/// [`StateError::Corrupt`].
#[derive(Debug, thiserror::Error)]
pub enum ParseError {
    #[error("{0}")]
    Json(serde_json::Error),
    #[error("layout version {0} is not the supported {STATE_VERSION}")]
    Version(u32),
    /// The holder token file does not hold a token.
    #[error("expected a holder token of at least 16 hex digits")]
    Token,
}

/// Parse a state file, refusing an unknown layout version.
pub fn parse(bytes: &[u8]) -> Result<State, ParseError> {
    let state: State = serde_json::from_slice(bytes).map_err(ParseError::Json)?;
    if state.version != STATE_VERSION {
        return Err(ParseError::Version(state.version));
    }
    Ok(state)
}

/// Write `bytes` to `path` so that a crash leaves either the old or the new content:
/// temporary file in the same directory, fsync, rename, fsync of the directory.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), StateError> {
    let err = |source| StateError::Write {
        path: path.to_path_buf(),
        source,
    };
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(err)?;
    let tmp = dir.join(format!(
        ".{}.tmp",
        path.file_name().and_then(|n| n.to_str()).unwrap_or("state")
    ));
    let mut f = std::fs::File::create(&tmp).map_err(err)?;
    f.write_all(bytes).map_err(err)?;
    f.sync_all().map_err(err)?;
    drop(f);
    std::fs::rename(&tmp, path).map_err(err)?;
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(err)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn save_then_load_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::new(dir.path());
        assert_eq!(store.load().unwrap(), None);
        let mut s = State::new("b1", Timestamp::UNIX_EPOCH);
        s.phase = Phase::Rebooting;
        s.reboot = Some(RebootRequest {
            requested_at: Timestamp::UNIX_EPOCH,
            boot_id: "b1".into(),
            called: false,
            kind: Default::default(),
            soft_reboots: None,
        });
        store.save(&s).unwrap();
        assert_eq!(store.load().unwrap(), Some(s));
        // No temporary file is left behind.
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, [STATE_FILE]);
    }

    #[test]
    fn corrupt_file_is_reported_and_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::new(dir.path());
        std::fs::write(store.path(), b"{\"phase\": \"idle\", trunc").unwrap();
        let err = store.load().unwrap_err().to_string();
        assert!(err.contains(&store.path().display().to_string()), "{err}");
        assert!(err.contains("trunc"), "{err}");
        assert_eq!(
            std::fs::read(store.path()).unwrap(),
            b"{\"phase\": \"idle\", trunc"
        );
    }

    #[test]
    fn the_holder_token_is_made_once_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::new(dir.path().join("sub"));
        let t = store.holder_token().unwrap();
        assert_eq!(t.len(), 32);
        assert_eq!(store.holder_token().unwrap(), t);
        assert_ne!(
            StateStore::new(dir.path().join("other"))
                .holder_token()
                .unwrap(),
            t
        );
        std::fs::write(store.token_path(), "not a token").unwrap();
        let e = store.holder_token().unwrap_err().to_string();
        assert!(
            e.contains("holder-token") && e.contains("not a token"),
            "{e}"
        );
        assert_eq!(
            std::fs::read_to_string(store.token_path()).unwrap(),
            "not a token"
        );
    }

    #[test]
    fn unknown_phase_and_version_are_refused() {
        let mut v = serde_json::to_value(State::new("b", Timestamp::UNIX_EPOCH)).unwrap();
        v["phase"] = "dancing".into();
        assert!(parse(v.to_string().as_bytes()).is_err());
        let mut v = serde_json::to_value(State::new("b", Timestamp::UNIX_EPOCH)).unwrap();
        v["version"] = 99.into();
        let e = parse(v.to_string().as_bytes()).unwrap_err();
        assert!(matches!(e, ParseError::Version(99)), "{e}");
        assert!(e.to_string().contains("99"), "{e}");
    }

    /// The runtime's record of the slot (since when, the autoscaler's annotation) is optional
    /// both ways: a file without it reads as "none", and a state without it is written as
    /// before, so an older rebootd still reads the file.
    #[test]
    fn the_slots_record_is_backward_compatible() {
        let old = r#"{"version":1,"phase":"draining","since":"2026-11-20T03:00:00Z",
            "boot_id":"b1","slot_held":true,"reboots":3}"#;
        let s = parse(old.as_bytes()).unwrap();
        assert!(s.slot_held && !s.scale_down_disabled && s.slot_since.is_none());
        let v = serde_json::to_value(&s).unwrap();
        assert!(
            v.get("scale_down_disabled").is_none() && v.get("slot_since").is_none(),
            "{v}"
        );
        let mut held = s.clone();
        held.scale_down_disabled = true;
        held.slot_since = Some(Timestamp::UNIX_EPOCH);
        let text = serde_json::to_string(&held).unwrap();
        assert!(text.contains("\"scale_down_disabled\":true"), "{text}");
        assert_eq!(parse(text.as_bytes()).unwrap(), held);
    }

    /// A state file written before the trigger became a type (its `reason` a plain string)
    /// reads with its trigger named, and is written back the same way.
    #[test]
    fn a_state_file_with_the_old_reason_string_still_parses() {
        use crate::need::{Need, TriggerSource};
        let old = r#"{"version":1,"phase":"acquiring_slot","since":"2026-11-20T03:00:00Z",
            "reason":"update_engine: UPDATE_STATUS_UPDATED_NEED_REBOOT (new version 4081.2.0)",
            "boot_id":"b1","slot_held":false,"reboot":null,"failed_attempts":0,"retry_at":null,
            "not_before":null,"last_error":null,"waiting_for":null,"cordon_recorded":false,
            "cordoned_by_us":false,"last_reboot":null,"reboots":3}"#;
        let s = parse(old.as_bytes()).unwrap();
        let want = Need::new(
            TriggerSource::UpdateEngine,
            "UPDATE_STATUS_UPDATED_NEED_REBOOT (new version 4081.2.0)",
        );
        assert_eq!(s.reason.as_ref(), Some(&want));
        let v = serde_json::to_value(&s).unwrap();
        assert_eq!(
            v["reason"],
            "update_engine: UPDATE_STATUS_UPDATED_NEED_REBOOT (new version 4081.2.0)"
        );
        for (text, source) in [
            (
                "sentinel_file: /run/reboot-required exists",
                TriggerSource::SentinelFile,
            ),
            (
                "sentinel_command: [\"/bin/true\"] exited 0",
                TriggerSource::SentinelCommand,
            ),
            (
                "rebootctl: /var/lib/rebootd/reboot-request exists",
                TriggerSource::Rebootctl,
            ),
        ] {
            let mut v = serde_json::to_value(State::new("b", Timestamp::UNIX_EPOCH)).unwrap();
            v["reason"] = text.into();
            let s = parse(v.to_string().as_bytes()).unwrap();
            assert_eq!(s.reason.map(|r| r.source), Some(source), "{text}");
        }
        // A source rebootd never wrote is refused with the file kept, as any corrupt file.
        let mut v = serde_json::to_value(State::new("b", Timestamp::UNIX_EPOCH)).unwrap();
        v["reason"] = "apt: upgraded".into();
        let e = parse(v.to_string().as_bytes()).unwrap_err();
        assert!(matches!(e, ParseError::Json(_)), "{e}");
        assert!(e.to_string().contains("apt"), "{e}");
    }
}
