//! Import from locksmithd: its environment, built as systemd builds it for `locksmithd.service`
//! (the unit's and its drop-ins' `Environment=` lines, then the `EnvironmentFile=`s, which win:
//! `/usr/share/flatcar/update.conf` then `/etc/flatcar/update.conf` on Flatcar, the `coreos`
//! paths on Container Linux), translated as locksmithd reads it (`locksmith/locksmithctl/`):
//! `REBOOT_STRATEGY`, `LOCKSMITHD_<FLAG>` for each of its flags, and the reboot window
//! `[LOCKSMITHD_]REBOOT_WINDOW_START`/`_LENGTH` in the host's local time.

use super::envfile::{self, Assignment};
pub use super::go_duration::{go_duration, WindowError};
use super::{
    local_zone, read_optional, time_of_day, BackendOut, Fragment, Import, ImportError, Note, Root,
    Secret, Tool, WindowOut, EVERY_DAY,
};
use std::collections::BTreeMap;
use std::time::Duration;

/// Where locksmithd's unit file may be, in priority order (first found wins).
const UNIT_FILES: [&str; 4] = [
    "/etc/systemd/system/locksmithd.service",
    "/run/systemd/system/locksmithd.service",
    "/usr/lib/systemd/system/locksmithd.service",
    "/lib/systemd/system/locksmithd.service",
];

/// Drop-in directories, in priority order (a name in an earlier one hides a later one's).
const DROPIN_DIRS: [&str; 4] = [
    "/etc/systemd/system/locksmithd.service.d",
    "/run/systemd/system/locksmithd.service.d",
    "/usr/lib/systemd/system/locksmithd.service.d",
    "/lib/systemd/system/locksmithd.service.d",
];

/// The environment files when no unit file is found: Flatcar's unit's, after Container
/// Linux's (whose `/etc/coreos` Flatcar keeps as a compatibility link).
const DEFAULT_ENV_FILES: [&str; 4] = [
    "/usr/share/coreos/update.conf",
    "/usr/share/flatcar/update.conf",
    "/etc/coreos/update.conf",
    "/etc/flatcar/update.conf",
];

/// Said when nothing is found.
pub const LOOKED_AT: &str =
    "/etc/flatcar/update.conf, /etc/coreos/update.conf, locksmithd.service and its drop-ins";

/// The secret file the etcd password goes to.
const PASSWORD_FILE: &str = "/etc/rebootd/etcd-password";

/// locksmithctl's endpoints when none is given.
const DEFAULT_ENDPOINTS: [&str; 2] = ["http://127.0.0.1:2379", "http://127.0.0.1:4001"];

/// Whether the host has locksmith configuration; `Some` names what was found.
pub fn found(root: &Root) -> Option<String> {
    let mut found: Vec<&str> = DEFAULT_ENV_FILES
        .iter()
        .chain(UNIT_FILES.iter())
        .copied()
        .filter(|p| root.at(p).exists())
        .collect();
    found.extend(
        DROPIN_DIRS
            .iter()
            .copied()
            .filter(|d| std::fs::read_dir(root.at(d)).is_ok_and(|mut e| e.next().is_some())),
    );
    (!found.is_empty()).then(|| found.join(", "))
}

/// A variable of the final environment and where it was set.
#[derive(Debug, Clone)]
struct Var {
    value: String,
    file: String,
}

/// locksmithd's environment: the variables, the files read, and notes for what could not be read.
type Environment = (BTreeMap<String, Var>, Vec<String>, Vec<Note>);

/// Build locksmithd's environment as systemd would.
fn environment(root: &Root) -> Result<Environment, ImportError> {
    let mut read = Vec::new();
    let mut notes = Vec::new();
    let mut env: Vec<(Assignment, String)> = Vec::new();
    let mut files: Vec<(String, bool)> = Vec::new();
    let mut unit_found = false;

    let mut units: Vec<(String, String)> = Vec::new();
    if let Some(unit) = UNIT_FILES.iter().find(|p| root.at(p).exists()) {
        if let Some(text) = read_optional(root, unit)? {
            units.push((unit.to_string(), text));
            unit_found = true;
        }
    }
    let mut dropins: BTreeMap<String, String> = BTreeMap::new();
    for dir in DROPIN_DIRS.iter().rev() {
        let Ok(entries) = std::fs::read_dir(root.at(dir)) else {
            continue;
        };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().to_string();
            if name.ends_with(".conf") {
                // Later in this loop = higher priority: replaces a lower directory's file.
                dropins.insert(name.clone(), format!("{dir}/{name}"));
            }
        }
    }
    for path in dropins.values() {
        if let Some(text) = read_optional(root, path)? {
            units.push((path.clone(), text));
        }
    }
    for (path, text) in &units {
        read.push(path.clone());
        let u = envfile::parse_unit(text);
        for b in u.bad {
            notes.push(Note {
                file: path.clone(),
                key: format!("line {}", b.line),
                value: b.text,
                why: format!("cannot read it ({})", b.why),
            });
        }
        for a in u.environment {
            match a {
                Some(a) => env.push((a, path.clone())),
                None => env.clear(),
            }
        }
        for f in u.files {
            match f {
                Some(f) => files.push(f),
                None => files.clear(),
            }
        }
    }
    if !unit_found {
        files = DEFAULT_ENV_FILES
            .iter()
            .map(|f| (f.to_string(), true))
            .collect();
    }

    let mut vars: BTreeMap<String, Var> = BTreeMap::new();
    for (a, file) in env {
        vars.insert(
            a.key,
            Var {
                value: a.value,
                file,
            },
        );
    }
    // Files are read after Environment= and win over it (systemd.exec(5)).
    for (path, optional) in files {
        let text = match read_optional(root, &path)? {
            Some(t) => t,
            None if optional => continue,
            None => {
                notes.push(Note {
                    file: path.clone(),
                    key: "EnvironmentFile".into(),
                    value: path.clone(),
                    why: "the unit requires this file but it does not exist (locksmithd would not start)".into(),
                });
                continue;
            }
        };
        read.push(path.clone());
        let (good, bad) = envfile::parse_env_file(&text);
        for b in bad {
            notes.push(Note {
                file: path.clone(),
                key: format!("line {}", b.line),
                value: b.text,
                why: format!("cannot read it ({})", b.why),
            });
        }
        for a in good {
            vars.insert(
                a.key,
                Var {
                    value: a.value,
                    file: path.clone(),
                },
            );
        }
    }
    Ok((vars, read, notes))
}

/// locksmith's reboot window start: `"HH:MM"` (every day) or `"Thu HH:MM"`.
fn window_start(text: &str) -> Result<(Vec<&'static str>, String), WindowError> {
    let fields: Vec<&str> = text.split_whitespace().collect();
    let (days, time) = match fields.as_slice() {
        [time] => (EVERY_DAY.to_vec(), *time),
        [day, time] => {
            // locksmith accepts three-letter names only.
            let d = super::day(day)
                .filter(|_| day.len() == 3)
                .ok_or_else(|| WindowError::Day(day.to_string()))?;
            (vec![d], *time)
        }
        _ => return Err(WindowError::Fields),
    };
    let start = time_of_day(time).ok_or_else(|| WindowError::TimeOfDay(time.to_string()))?;
    Ok((days, start))
}

/// Variables of the environment that are not a reboot setting: update_engine's, and
/// systemd's or the shell's.
fn not_ours(key: &str) -> Option<&'static str> {
    match key {
        "GROUP" | "SERVER" | "DOWNLOAD_USER" | "DOWNLOAD_PASSWORD" | "MACHINE_ALIAS"
        | "PCR_POLICY_SERVER" | "AUTO_UPDATE" => Some(
            "update_engine's setting (release channel, update server, downloads), not a reboot setting; update_engine keeps reading it",
        ),
        "GOMAXPROCS" => Some("a Go runtime setting of locksmithd; rebootd has no use for it"),
        _ => None,
    }
}

/// The strategy.
const STRATEGY: &str = "REBOOT_STRATEGY";

/// The group.
const GROUP: &str = "LOCKSMITHD_GROUP";

/// The etcd settings, read whether or not the strategy uses them.
const ETCD_FLAGS: [&str; 6] = [
    "LOCKSMITHD_ENDPOINT",
    "LOCKSMITHD_ETCD_CAFILE",
    "LOCKSMITHD_ETCD_CERTFILE",
    "LOCKSMITHD_ETCD_KEYFILE",
    "LOCKSMITHD_ETCD_USERNAME",
    "LOCKSMITHD_ETCD_PASSWORD",
];

/// The reboot window (with or without locksmithd's prefix) and the zone of its local time.
const WINDOW_KEYS: [&str; 5] = [
    "LOCKSMITHD_REBOOT_WINDOW_START",
    "REBOOT_WINDOW_START",
    "LOCKSMITHD_REBOOT_WINDOW_LENGTH",
    "REBOOT_WINDOW_LENGTH",
    "TZ",
];

/// Translate locksmithd's configuration below `root`: the strategy, the group, the etcd
/// settings, the window, then a note for every other variable.
pub fn import(root: &Root) -> Result<Import, ImportError> {
    let (vars, read, mut notes) = environment(root)?;
    if read.is_empty() {
        return Err(ImportError::NothingFound(format!(
            "no locksmith configuration: looked at {LOOKED_AT} under {}",
            root.0.display()
        )));
    }
    let vars = Vars(vars);
    let mut secrets = Vec::new();
    let takes_lock = takes_lock(&vars, &mut notes)?;
    let group = group(&vars)?;
    let backend = if takes_lock {
        etcd_backend(&vars, &mut notes, &mut secrets)?
    } else {
        unused_etcd_flags(&vars, &mut notes);
        BackendOut::None
    };
    let window = window(root, &vars)?;
    other_variables(&vars, &mut notes);
    Ok(Import {
        from: Tool::Locksmith,
        read,
        fragment: Fragment {
            group,
            // locksmithd acts on update_engine's status, as rebootd does by default.
            update_engine: Some(true),
            backend: Some(backend),
            windows: window.into_iter().collect(),
        },
        notes,
        secrets,
    })
}

/// locksmithd's final environment.
struct Vars(BTreeMap<String, Var>);

impl Vars {
    /// A variable set to something: locksmithd reads an empty one as not set.
    fn get(&self, key: &str) -> Option<&Var> {
        self.0.get(key).filter(|v| !v.value.is_empty())
    }
}

impl Var {
    /// This variable, set as `key`, cannot be translated.
    fn untranslatable(&self, key: &str, why: impl Into<String>) -> ImportError {
        ImportError::untranslatable(self.file.clone(), key, self.value.clone(), why)
    }
}

/// `REBOOT_STRATEGY`: whether it takes a lock (`etcd-lock`) or not (`reboot`, locksmithd's
/// default); the others have no translation.
fn takes_lock(vars: &Vars, notes: &mut Vec<Note>) -> Result<bool, ImportError> {
    let strategy = vars.get(STRATEGY);
    match strategy.map(|v| v.value.as_str()) {
        None => {
            notes.push(Note::new(
                "(locksmithd's default)",
                STRATEGY,
                "reboot",
                "not set: locksmithd reboots without a lock, and so does the fragment (lock.backend = \"none\")",
            ));
            Ok(false)
        }
        Some("reboot") => Ok(false),
        Some("etcd-lock") => Ok(true),
        Some(other) => {
            let v = strategy.cloned().unwrap_or(Var {
                value: other.into(),
                file: String::new(),
            });
            let why = match other {
                "off" => "locksmithd does not reboot at all; rebootd has no such setting: keep this host from rebooting with `rebootctl pause` once rebootd runs, or leave rebootd disabled",
                "best-effort" => "`best-effort` chose etcd-lock or reboot by whether etcd answered; choose one and set REBOOT_STRATEGY before importing",
                _ => "unknown strategy (locksmithd knows reboot, etcd-lock, off)",
            };
            Err(v.untranslatable(STRATEGY, why))
        }
    }
}

/// `LOCKSMITHD_GROUP`. locksmith's default group is "", which rebootd calls "default";
/// locksmith's group named "default" is a different key that rebootd cannot name.
fn group(vars: &Vars) -> Result<Option<String>, ImportError> {
    match vars.get(GROUP) {
        Some(g) if g.value == "default" => Err(g.untranslatable(
            GROUP,
            "locksmith keeps this group at .../rebootlock/groups/default/semaphore, but rebootd's group \"default\" is locksmith's default group (no group key); rename the group",
        )),
        Some(g) => Ok(Some(g.value.clone())),
        None => Ok(None),
    }
}

/// The `etcd-lock` strategy: the etcd backend on locksmith's own semaphore (the v2 keys API).
fn etcd_backend(
    vars: &Vars,
    notes: &mut Vec<Note>,
    secrets: &mut Vec<Secret>,
) -> Result<BackendOut, ImportError> {
    let endpoints = endpoints(vars, notes);
    let (cert_file, key_file) = client_certificate(vars)?;
    let username = vars
        .get("LOCKSMITHD_ETCD_USERNAME")
        .map(|v| v.value.clone());
    let password_file = password_file(vars, username.is_some(), notes, secrets);
    notes.push(Note::new(
        vars.get(STRATEGY).map(|v| v.file.clone()).unwrap_or_default(),
        STRATEGY,
        "etcd-lock",
        "translated to lock.backend = \"etcd\" with api = \"v2\": locksmith's own semaphore in etcd's v2 keys API, shared with the locksmithd nodes (etcd needs --enable-v2=true); to move the fleet to v3 later see docs/migrating-from-locksmith.md",
    ));
    Ok(BackendOut::Etcd {
        endpoints,
        ca_file: vars.get("LOCKSMITHD_ETCD_CAFILE").map(|v| v.value.clone()),
        cert_file,
        key_file,
        username,
        password_file,
    })
}

/// `LOCKSMITHD_ENDPOINT`, comma-separated; locksmithctl's defaults written out when not set.
fn endpoints(vars: &Vars, notes: &mut Vec<Note>) -> Vec<String> {
    match vars.get("LOCKSMITHD_ENDPOINT") {
        Some(v) => v
            .value
            .split(',')
            .map(|e| e.trim().to_string())
            .filter(|e| !e.is_empty())
            .collect(),
        None => {
            notes.push(Note::new(
                "(locksmithd's default)",
                "LOCKSMITHD_ENDPOINT",
                DEFAULT_ENDPOINTS.join(","),
                "not set: locksmithd's default endpoints are written out",
            ));
            DEFAULT_ENDPOINTS.iter().map(|s| s.to_string()).collect()
        }
    }
}

/// `LOCKSMITHD_ETCD_CERTFILE` and `LOCKSMITHD_ETCD_KEYFILE`: both or neither.
fn client_certificate(vars: &Vars) -> Result<(Option<String>, Option<String>), ImportError> {
    let (cert_key, key_key) = ("LOCKSMITHD_ETCD_CERTFILE", "LOCKSMITHD_ETCD_KEYFILE");
    match (vars.get(cert_key), vars.get(key_key)) {
        (Some(c), None) => Err(c.untranslatable(cert_key, HALF_A_CERTIFICATE)),
        (None, Some(k)) => Err(k.untranslatable(key_key, HALF_A_CERTIFICATE)),
        (c, k) => Ok((c.map(|v| v.value.clone()), k.map(|v| v.value.clone()))),
    }
}

const HALF_A_CERTIFICATE: &str = "a client certificate needs both LOCKSMITHD_ETCD_CERTFILE and LOCKSMITHD_ETCD_KEYFILE (locksmithd fails to load it too)";

/// `LOCKSMITHD_ETCD_PASSWORD`, used with a user name only: rebootd reads it from
/// [`PASSWORD_FILE`], a secret written next to the fragment.
fn password_file(
    vars: &Vars,
    has_username: bool,
    notes: &mut Vec<Note>,
    secrets: &mut Vec<Secret>,
) -> Option<String> {
    let key = "LOCKSMITHD_ETCD_PASSWORD";
    match (has_username, vars.get(key)) {
        (true, Some(p)) => {
            secrets.push(Secret {
                path: PASSWORD_FILE.into(),
                content: p.value.clone(),
                what: "the etcd password".into(),
            });
            notes.push(Note::new(
                p.file.clone(),
                key,
                "(hidden)",
                format!(
                    "rebootd reads the password from a file: `--write` writes it to {PASSWORD_FILE} (mode 0600); otherwise write it there yourself"
                ),
            ));
            Some(PASSWORD_FILE.to_string())
        }
        (true, None) => {
            notes.push(Note::new(
                vars.get("LOCKSMITHD_ETCD_USERNAME").map(|v| v.file.clone()).unwrap_or_default(),
                key,
                "",
                format!("a user name without a password: the fragment reads the password from {PASSWORD_FILE}, which you must write"),
            ));
            Some(PASSWORD_FILE.to_string())
        }
        (false, Some(p)) => {
            notes.push(Note::new(
                p.file.clone(),
                key,
                "(hidden)",
                "a password without LOCKSMITHD_ETCD_USERNAME is not used by locksmithd either",
            ));
            None
        }
        (false, None) => None,
    }
}

/// A strategy without a lock: the etcd settings set are named, not translated.
fn unused_etcd_flags(vars: &Vars, notes: &mut Vec<Note>) {
    for k in ETCD_FLAGS {
        if let Some(v) = vars.get(k) {
            let value = if k.ends_with("PASSWORD") {
                "(hidden)".into()
            } else {
                v.value.clone()
            };
            notes.push(Note::new(
                v.file.clone(),
                k,
                value,
                "not used: the strategy takes no lock",
            ));
        }
    }
}

/// The reboot window, in the host's local time as locksmithd (Go's time.Local) reads it:
/// both its start and its length, or neither.
fn window(root: &Root, vars: &Vars) -> Result<Option<WindowOut>, ImportError> {
    let pick = |a: &'static str, b: &'static str| {
        vars.get(a)
            .map(|v| (a, v))
            .or_else(|| vars.get(b).map(|v| (b, v)))
    };
    let start = pick("LOCKSMITHD_REBOOT_WINDOW_START", "REBOOT_WINDOW_START");
    let length = pick("LOCKSMITHD_REBOOT_WINDOW_LENGTH", "REBOOT_WINDOW_LENGTH");
    let ((sk, sv), (lk, lv)) = match (start, length) {
        (None, None) => return Ok(None),
        (Some((k, v)), None) | (None, Some((k, v))) => {
            return Err(v.untranslatable(
                k,
                "the window needs both its start and its length (locksmithd refuses this too)",
            ))
        }
        (Some(s), Some(l)) => (s, l),
    };
    let (days, start) =
        window_start(&sv.value).map_err(|why| sv.untranslatable(sk, why.to_string()))?;
    let length = go_duration(&lv.value).map_err(|why| lv.untranslatable(lk, why.to_string()))?;
    let period = if days.len() == 1 { 7 * 86400 } else { 86400 };
    if length >= Duration::from_secs(period) {
        return Err(lv.untranslatable(
            lk,
            "the length is not shorter than the period (locksmithd refuses this too)",
        ));
    }
    let tz = vars.0.get("TZ").map(|v| v.value.as_str());
    let time_zone = local_zone(root, tz).map_err(|why| {
        ImportError::untranslatable(
            "/etc/localtime",
            "local time zone",
            "",
            format!("locksmithd's window is in local time, but {why}; write the window by hand"),
        )
    })?;
    Ok(Some(WindowOut {
        days,
        start,
        length,
        time_zone,
    }))
}

/// A note for every variable no step above read.
fn other_variables(vars: &Vars, notes: &mut Vec<Note>) {
    let read = |k: &str| {
        k == STRATEGY || k == GROUP || ETCD_FLAGS.contains(&k) || WINDOW_KEYS.contains(&k)
    };
    for (k, v) in vars.0.iter().filter(|(k, _)| !read(k)) {
        let why = if let Some(why) = not_ours(k) {
            why
        } else if k == "LOCKSMITHD_DEBUG" {
            "locksmithd's debug logging; rebootd's log level is RUST_LOG"
        } else if k.starts_with("LOCKSMITHD_") {
            "not a setting locksmithd reads, so not translated"
        } else {
            "not a locksmithd setting"
        };
        notes.push(Note::new(v.file.clone(), k.clone(), v.value.clone(), why));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations_read_as_go_reads_them() {
        assert_eq!(go_duration("1h30m").unwrap(), Duration::from_secs(5400));
        assert_eq!(go_duration("90m").unwrap(), Duration::from_secs(5400));
        assert_eq!(go_duration("1.5h").unwrap(), Duration::from_secs(5400));
        assert_eq!(go_duration("300ms").unwrap(), Duration::from_millis(300));
        assert_eq!(go_duration("0").unwrap(), Duration::ZERO);
        assert!(go_duration("-1h").is_err());
        assert!(go_duration("1 hour").is_err());
        assert!(go_duration("5").is_err());
        assert!(go_duration("").is_err());
    }

    #[test]
    fn window_starts_with_and_without_a_day() {
        assert_eq!(
            window_start("14:00").unwrap(),
            (EVERY_DAY.to_vec(), "14:00".into())
        );
        assert_eq!(
            window_start("thu 23:00").unwrap(),
            (vec!["Thu"], "23:00".into())
        );
        assert!(window_start("Thursday 23:00").is_err());
        assert!(window_start("Thu 25:00").is_err());
        assert!(window_start("Thu 23:00 x").is_err());
    }
}
