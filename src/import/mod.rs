//! `rebootctl import`: read what a host already has for locksmithd (Flatcar, CoreOS Container
//! Linux) or Zincati (Fedora CoreOS) and write the rebootd configuration fragment that does the
//! same. Everything read is either translated or named in a [`Note`], never dropped silently;
//! the fragment is checked with rebootd's own configuration validation before it is shown or
//! written. All paths are read below a root directory (`/` on a host), so tests and offline
//! conversions work on a copy of a host's files.

mod envfile;
mod go_duration;
pub mod locksmith;
pub mod zincati;

use std::fmt;
use std::path::{Path, PathBuf};

/// Where `--write` puts the fragment, below the root.
pub const OUTPUT_DIR: &str = "/etc/rebootd/config.d";

/// The tool whose configuration is imported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tool {
    Locksmith,
    Zincati,
}

impl Tool {
    pub fn as_str(self) -> &'static str {
        match self {
            Tool::Locksmith => "locksmith",
            Tool::Zincati => "zincati",
        }
    }

    /// The file name `--write` uses.
    pub fn file_name(self) -> String {
        format!("50-imported-{}.toml", self.as_str())
    }
}

impl fmt::Display for Tool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Host paths resolved below a root directory.
#[derive(Debug, Clone)]
pub struct Root(pub PathBuf);

impl Root {
    /// The file a host path names, below the root.
    pub fn at(&self, host_path: &str) -> PathBuf {
        self.0.join(host_path.trim_start_matches('/'))
    }
}

/// Something read that the fragment does not carry, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Note {
    /// The host path of the file it was read from.
    pub file: String,
    pub key: String,
    pub value: String,
    pub why: String,
}

impl fmt::Display for Note {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {} = {:?}: {}",
            self.file, self.key, self.value, self.why
        )
    }
}

impl Note {
    /// Why `key = value`, read from `file`, is not in the fragment as it is.
    fn new(
        file: impl Into<String>,
        key: impl Into<String>,
        value: impl Into<String>,
        why: impl Into<String>,
    ) -> Note {
        Note {
            file: file.into(),
            key: key.into(),
            value: value.into(),
            why: why.into(),
        }
    }
}

/// A file to write next to the fragment (a secret that rebootd reads from a file).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Secret {
    /// The host path the fragment refers to.
    pub path: String,
    pub content: String,
    /// What it is, for messages.
    pub what: String,
}

/// A maintenance window as the fragment writes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WindowOut {
    pub days: Vec<&'static str>,
    /// `HH:MM`.
    pub start: String,
    pub length: std::time::Duration,
    pub time_zone: String,
}

/// The lock backend the fragment selects, with its settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BackendOut {
    None,
    Etcd {
        endpoints: Vec<String>,
        ca_file: Option<String>,
        cert_file: Option<String>,
        key_file: Option<String>,
        username: Option<String>,
        password_file: Option<String>,
    },
    FleetLock {
        url: String,
        id: Option<String>,
    },
}

/// The rebootd settings an import produces.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Fragment {
    pub group: Option<String>,
    pub update_engine: Option<bool>,
    pub backend: Option<BackendOut>,
    pub windows: Vec<WindowOut>,
}

/// The result of an import.
#[derive(Debug, Clone)]
pub struct Import {
    pub from: Tool,
    /// Host paths of the files that were read, in the order they apply.
    pub read: Vec<String>,
    pub fragment: Fragment,
    pub notes: Vec<Note>,
    pub secrets: Vec<Secret>,
}

#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("nothing to import: {0}")]
    NothingFound(String),
    #[error("both locksmith ({locksmith}) and Zincati ({zincati}) configuration found; choose one with --from")]
    Ambiguous { locksmith: String, zincati: String },
    #[error("{file}: {key} = {value:?}: {why}")]
    Untranslatable {
        file: String,
        key: String,
        value: String,
        why: String,
    },
    #[error("the imported fragment does not pass rebootd's validation (a bug in the import, please report it): {0}\n{1}")]
    Invalid(String, String),
}

impl ImportError {
    /// `key = value`, read from `file`, has no translation, or one that would not do the same.
    fn untranslatable(
        file: impl Into<String>,
        key: impl Into<String>,
        value: impl Into<String>,
        why: impl Into<String>,
    ) -> ImportError {
        ImportError::Untranslatable {
            file: file.into(),
            key: key.into(),
            value: value.into(),
            why: why.into(),
        }
    }
}

/// Read a file below the root; a missing one is `None`.
fn read_optional(root: &Root, host_path: &str) -> Result<Option<String>, ImportError> {
    match std::fs::read_to_string(root.at(host_path)) {
        Ok(t) => Ok(Some(t)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(ImportError::Read {
            path: host_path.to_string(),
            source,
        }),
    }
}

/// Which tool's configuration the host has, or an error when it has none or both.
pub fn detect(root: &Root) -> Result<Tool, ImportError> {
    let l = locksmith::found(root);
    let z = zincati::found(root);
    match (l, z) {
        (Some(_), None) => Ok(Tool::Locksmith),
        (None, Some(_)) => Ok(Tool::Zincati),
        (Some(locksmith), Some(zincati)) => Err(ImportError::Ambiguous { locksmith, zincati }),
        (None, None) => Err(ImportError::NothingFound(format!(
            "no locksmith configuration ({}) and no Zincati fragment ({}) under {}",
            locksmith::LOOKED_AT,
            zincati::LOOKED_AT,
            root.0.display()
        ))),
    }
}

/// Import the given tool's configuration from the host below `root`.
pub fn import(root: &Root, from: Tool) -> Result<Import, ImportError> {
    let import = match from {
        Tool::Locksmith => locksmith::import(root)?,
        Tool::Zincati => zincati::import(root)?,
    };
    let text = import.render();
    crate::config::Config::check_fragment(Path::new("<imported fragment>"), &text)
        .map_err(|e| ImportError::Invalid(e.to_string(), text.clone()))?;
    Ok(import)
}

/// A week day as rebootd writes it, from a name in any case, short or long.
pub fn day(name: &str) -> Option<&'static str> {
    Some(match name.trim().to_ascii_lowercase().as_str() {
        "mon" | "monday" => "Mon",
        "tue" | "tuesday" => "Tue",
        "wed" | "wednesday" => "Wed",
        "thu" | "thursday" => "Thu",
        "fri" | "friday" => "Fri",
        "sat" | "saturday" => "Sat",
        "sun" | "sunday" => "Sun",
        _ => return None,
    })
}

/// Every day of the week, for a window that repeats daily.
pub const EVERY_DAY: [&str; 7] = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"];

/// `H:MM` or `HH:MM` (24-hour) as rebootd's `HH:MM`.
pub fn time_of_day(text: &str) -> Option<String> {
    let (h, m) = text.trim().split_once(':')?;
    let ok = |s: &str| !s.is_empty() && s.len() <= 2 && s.bytes().all(|b| b.is_ascii_digit());
    if !ok(h) || !ok(m) {
        return None;
    }
    let (h, m): (u8, u8) = (h.parse().ok()?, m.parse().ok()?);
    (h < 24 && m < 60).then(|| format!("{h:02}:{m:02}"))
}

/// Why the host's local time zone has no IANA name rebootd can write.
#[derive(Debug, thiserror::Error)]
pub enum ZoneError {
    #[error("TZ={0:?} is not an IANA time zone name")]
    Tz(String),
    #[error("cannot read /etc/localtime: {0}")]
    Read(std::io::Error),
    #[error(
        "/etc/localtime is a file, not a link into /usr/share/zoneinfo, so its zone has no name"
    )]
    NotALink,
    #[error("/etc/localtime links to {0}, not into a zoneinfo directory")]
    NotZoneinfo(String),
    #[error("/etc/localtime links to {target}: {name:?} is not a known time zone")]
    Unknown { target: String, name: String },
}

/// The IANA name of the host's local time zone, as glibc and Go read it: the `TZ` variable
/// when set, else where `/etc/localtime` links to below `zoneinfo/`, else UTC when it does not
/// exist. `Err` says why it cannot be told.
pub fn local_zone(root: &Root, tz_env: Option<&str>) -> Result<String, ZoneError> {
    if let Some(tz) = tz_env.filter(|t| !t.is_empty()) {
        let name = tz.trim_start_matches(':');
        return jiff::tz::TimeZone::get(name)
            .map(|_| name.to_string())
            .map_err(|_| ZoneError::Tz(tz.to_string()));
    }
    let path = root.at("/etc/localtime");
    match std::fs::symlink_metadata(&path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok("UTC".into()),
        Err(e) => return Err(ZoneError::Read(e)),
        Ok(m) if !m.file_type().is_symlink() => return Err(ZoneError::NotALink),
        Ok(_) => {}
    }
    let target = std::fs::read_link(&path).map_err(ZoneError::Read)?;
    let text = target.to_string_lossy();
    let name = text
        .rsplit_once("zoneinfo/")
        .map(|(_, n)| n.trim_start_matches("posix/").to_string())
        .ok_or_else(|| ZoneError::NotZoneinfo(text.to_string()))?;
    jiff::tz::TimeZone::get(&name)
        .map(|_| name.clone())
        .map_err(|_| ZoneError::Unknown {
            target: text.to_string(),
            name: name.clone(),
        })
}

impl Import {
    /// The fragment as TOML, with a header naming where it came from and what it leaves out.
    pub fn render(&self) -> String {
        let mut out = format!(
            "# Imported by `rebootctl import` from {}'s configuration:\n",
            self.from
        );
        for f in &self.read {
            out.push_str(&format!("#   {f}\n"));
        }
        if self.notes.is_empty() {
            out.push_str("# Everything read is translated.\n");
        } else {
            out.push_str("# Not translated (see `rebootctl import`'s messages):\n");
            for n in &self.notes {
                for (i, line) in n.to_string().lines().enumerate() {
                    out.push_str(if i == 0 { "#   " } else { "#     " });
                    out.push_str(line);
                    out.push('\n');
                }
            }
        }
        out.push('\n');
        out.push_str(&self.fragment.to_toml());
        out
    }
}

impl Fragment {
    /// The settings as TOML text.
    pub fn to_toml(&self) -> String {
        use toml::{Table, Value};
        let s = |v: &str| Value::String(v.to_string());
        let mut root = Table::new();
        if let Some(g) = &self.group {
            let mut t = Table::new();
            t.insert("group".into(), s(g));
            root.insert("identity".into(), Value::Table(t));
        }
        if let Some(ue) = self.update_engine {
            let mut t = Table::new();
            t.insert("update_engine".into(), Value::Boolean(ue));
            root.insert("triggers".into(), Value::Table(t));
        }
        if let Some(b) = &self.backend {
            let mut lock = Table::new();
            match b {
                BackendOut::None => {
                    lock.insert("backend".into(), s("none"));
                }
                BackendOut::Etcd {
                    endpoints,
                    ca_file,
                    cert_file,
                    key_file,
                    username,
                    password_file,
                } => {
                    lock.insert("backend".into(), s("etcd"));
                    let mut e = Table::new();
                    // locksmith's semaphore lives in the v2 keys API.
                    e.insert("api".into(), s("v2"));
                    e.insert(
                        "endpoints".into(),
                        Value::Array(endpoints.iter().map(|x| s(x)).collect()),
                    );
                    for (k, v) in [
                        ("ca_file", ca_file),
                        ("cert_file", cert_file),
                        ("key_file", key_file),
                        ("username", username),
                        ("password_file", password_file),
                    ] {
                        if let Some(v) = v {
                            e.insert(k.into(), s(v));
                        }
                    }
                    lock.insert("etcd".into(), Value::Table(e));
                }
                BackendOut::FleetLock { url, id } => {
                    lock.insert("backend".into(), s("fleetlock"));
                    let mut f = Table::new();
                    f.insert("url".into(), s(url));
                    if let Some(id) = id {
                        f.insert("id".into(), s(id));
                    }
                    lock.insert("fleetlock".into(), Value::Table(f));
                }
            }
            root.insert("lock".into(), Value::Table(lock));
        }
        if !self.windows.is_empty() {
            let windows = self
                .windows
                .iter()
                .map(|w| {
                    let mut t = Table::new();
                    t.insert(
                        "days".into(),
                        Value::Array(w.days.iter().map(|d| s(d)).collect()),
                    );
                    t.insert("start".into(), s(&w.start));
                    t.insert(
                        "length".into(),
                        s(&humantime::format_duration(w.length).to_string()),
                    );
                    t.insert("time_zone".into(), s(&w.time_zone));
                    Value::Table(t)
                })
                .collect();
            root.insert("window".into(), Value::Array(windows));
        }
        toml::to_string(&root).unwrap_or_default()
    }
}

/// Write the fragment (and any secret file it refers to) below the root. Refuses to replace an
/// existing file unless `force`, and a symbolic link always (writing through it would put a
/// secret wherever it points); nothing is written unless every file may be. Each file is
/// written by [`replace`]: a reader never sees it half-written, and a secret is never readable
/// by others, not even for a moment. Returns the host paths written.
pub fn write(root: &Root, import: &Import, force: bool) -> Result<Vec<PathBuf>, ImportError> {
    let target = format!("{OUTPUT_DIR}/{}", import.from.file_name());
    let mut files: Vec<(String, String, u32)> = vec![(target, import.render(), 0o644)];
    for s in &import.secrets {
        files.push((s.path.clone(), format!("{}\n", s.content), 0o600));
    }
    for (path, _, _) in &files {
        let refuse = |why: &str| ImportError::Read {
            path: path.clone(),
            source: std::io::Error::new(std::io::ErrorKind::AlreadyExists, why),
        };
        match std::fs::symlink_metadata(root.at(path)) {
            Ok(m) if m.file_type().is_symlink() => {
                return Err(refuse(
                    "is a symbolic link; not written through (remove it first)",
                ))
            }
            Ok(m) if !m.is_file() => return Err(refuse("exists and is not a regular file")),
            Ok(_) if !force => {
                return Err(refuse("exists already; not replaced (use --force)"));
            }
            _ => {}
        }
    }
    let mut written = Vec::new();
    for (path, text, mode) in files {
        let full = root.at(&path);
        replace(&full, text.as_bytes(), mode).map_err(|source| ImportError::Read {
            path: path.clone(),
            source,
        })?;
        written.push(full);
    }
    Ok(written)
}

/// Put `bytes` at `path` with `mode`: a new temporary file in the same directory, created
/// 0600 (so a secret is never readable by others, whatever the umask), written, given `mode`,
/// fsynced, renamed over `path` (never truncated in place: the old file, and its mode, are
/// gone), and the directory fsynced.
fn replace(path: &Path, bytes: &[u8], mode: u32) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    // A leftover of an earlier run with the same pid (a container) is stale.
    match std::fs::remove_file(&tmp) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let written = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(bytes)?;
        f.set_permissions(std::fs::Permissions::from_mode(mode))?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written?;
    std::fs::File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn days_and_times_read_as_the_peers_write_them() {
        assert_eq!(day("thu"), Some("Thu"));
        assert_eq!(day("Saturday"), Some("Sat"));
        assert_eq!(day("Funday"), None);
        assert_eq!(time_of_day("7:05").as_deref(), Some("07:05"));
        assert_eq!(time_of_day("23:30").as_deref(), Some("23:30"));
        assert_eq!(time_of_day("24:00"), None);
        assert_eq!(time_of_day("2am"), None);
    }

    #[test]
    fn local_zone_follows_tz_then_the_localtime_link() {
        let dir = tempfile::tempdir().unwrap();
        let root = Root(dir.path().to_path_buf());
        assert_eq!(local_zone(&root, None).unwrap(), "UTC");
        assert_eq!(
            local_zone(&root, Some(":Europe/Berlin")).unwrap(),
            "Europe/Berlin"
        );
        assert!(local_zone(&root, Some("Mars/Base")).is_err());
        std::fs::create_dir_all(dir.path().join("etc")).unwrap();
        std::os::unix::fs::symlink(
            "../usr/share/zoneinfo/America/Panama",
            dir.path().join("etc/localtime"),
        )
        .unwrap();
        assert_eq!(local_zone(&root, None).unwrap(), "America/Panama");
        std::fs::remove_file(dir.path().join("etc/localtime")).unwrap();
        std::fs::write(dir.path().join("etc/localtime"), b"TZif").unwrap();
        let e = local_zone(&root, None).unwrap_err();
        assert!(matches!(e, ZoneError::NotALink), "{e}");
        assert!(e.to_string().contains("no name"), "{e}");
    }
}
