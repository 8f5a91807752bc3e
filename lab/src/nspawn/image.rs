//! The Debian root file systems containers boot from: `debootstrap --variant=minbase` of
//! Debian 12 (bookworm, systemd 252) or Debian 13 (trixie, systemd 257) with systemd,
//! systemd-sysv, dbus and libpam-systemd, from the mirror this machine's apt uses. Each is made
//! once into the cache directory and shared read-only (each container writes to an overlay
//! above it). A directory's name carries its key; a change of packages, mirror or
//! [`IMAGE_VERSION`] makes a new one and removes the old one of the same suite.

use super::{io, run, NspawnError};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The Debian release the containers run unless a test asks for another.
pub const SUITE: &str = "bookworm";

/// A Debian release the lab can boot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Suite {
    /// Debian 12, systemd 252: no soft reboot, no `DesignatedMaintenanceTime`.
    Bookworm,
    /// Debian 13, systemd 257: `RebootWithFlags` soft reboot, `SoftRebootsCount`,
    /// `DesignatedMaintenanceTime=`.
    Trixie,
}

impl Suite {
    /// debootstrap's name of the release.
    pub fn name(self) -> &'static str {
        match self {
            Suite::Bookworm => "bookworm",
            Suite::Trixie => "trixie",
        }
    }
}
/// Packages on top of minbase: real systemd as PID 1, logind (with pam_systemd for sessions)
/// and the D-Bus system bus.
pub const PACKAGES: &[&str] = &["systemd", "systemd-sysv", "dbus", "libpam-systemd"];
/// Raised whenever what [`finish`] does to the image changes.
pub const IMAGE_VERSION: u32 = 1;
/// Used when this machine's apt sources name no mirror for [`SUITE`]. The mirror that serves
/// [`SUITE`] serves the other suites too (one archive).
pub const DEFAULT_MIRROR: &str = "http://deb.debian.org/debian";

/// Where the lab caches images: `$REBOOTD_LAB_CACHE`, else `$XDG_CACHE_HOME/rebootd-lab`, else
/// `~/.cache/rebootd-lab`; images go under `nspawn/` in it.
pub fn cache_dir() -> PathBuf {
    let base = std::env::var_os("REBOOTD_LAB_CACHE")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("XDG_CACHE_HOME").map(|d| PathBuf::from(d).join("rebootd-lab"))
        })
        .or_else(|| std::env::var_os("HOME").map(|d| PathBuf::from(d).join(".cache/rebootd-lab")))
        .unwrap_or_else(|| PathBuf::from("/var/cache/rebootd-lab"));
    base.join("nspawn")
}

/// The Debian mirror of `/etc/apt/sources.list.d/debian.sources` (deb822: the `URIs:` of the
/// stanza whose `Suites:` has [`SUITE`]) or of a `deb URL bookworm ...` line in
/// `/etc/apt/sources.list`; [`DEFAULT_MIRROR`] when neither names one.
pub fn mirror() -> String {
    let deb822 =
        std::fs::read_to_string("/etc/apt/sources.list.d/debian.sources").unwrap_or_default();
    if let Some(m) = mirror_from_deb822(&deb822) {
        return m;
    }
    let list = std::fs::read_to_string("/etc/apt/sources.list").unwrap_or_default();
    list.lines()
        .filter_map(|l| {
            let mut words = l.split_whitespace().filter(|w| !w.starts_with('['));
            (words.next() == Some("deb")).then(|| (words.next(), words.next()))
        })
        .find_map(|(url, suite)| {
            (suite == Some(SUITE))
                .then_some(url)
                .flatten()
                .map(str::to_string)
        })
        .unwrap_or_else(|| DEFAULT_MIRROR.to_string())
}

fn mirror_from_deb822(text: &str) -> Option<String> {
    text.split("\n\n").find_map(|stanza| {
        let field = |name: &str| {
            stanza
                .lines()
                .find_map(|l| l.strip_prefix(name).map(|v| v.trim().to_string()))
        };
        let suites = field("Suites:")?;
        if !suites.split_whitespace().any(|s| s == SUITE) {
            return None;
        }
        field("URIs:")?
            .split_whitespace()
            .next()
            .map(str::to_string)
    })
}

/// FNV-1a: a hash that stays the same across Rust releases (unlike `DefaultHasher`).
fn fnv1a(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The image's key: what it is made of.
pub fn key(suite: Suite, mirror: &str) -> String {
    let suite = suite.name();
    let what = format!("{suite} {} {mirror} v{IMAGE_VERSION}", PACKAGES.join(","));
    format!("{suite}-v{IMAGE_VERSION}-{:016x}", fnv1a(&what))
}

/// The cached bookworm image, made first if missing or stale (see [`ensure_suite`]).
pub fn ensure() -> Result<PathBuf, NspawnError> {
    ensure_suite(Suite::Bookworm)
}

/// The cached image of `suite`, made first if missing or stale. Blocks (debootstrap takes a
/// minute or more); several processes asking at once wait for one build (a lock file).
pub fn ensure_suite(suite: Suite) -> Result<PathBuf, NspawnError> {
    let dir = cache_dir();
    std::fs::create_dir_all(&dir).map_err(io(format!("creating {}", dir.display())))?;
    let lock_path = dir.join(".lock");
    let lock = File::create(&lock_path).map_err(io(format!("creating {}", lock_path.display())))?;
    lock.lock()
        .map_err(io(format!("locking {}", lock_path.display())))?;
    let mirror = mirror();
    let key = key(suite, &mirror);
    let root = dir.join(format!("rootfs-{key}"));
    if !root.join(".complete").exists() {
        build(&dir, &root, suite, &mirror)?;
    }
    remove_stale(&dir, &root, suite);
    Ok(root)
}

fn build(dir: &Path, root: &Path, suite: Suite, mirror: &str) -> Result<(), NspawnError> {
    let partial = dir.join(format!(
        "{}.partial",
        root.file_name().unwrap_or_default().to_string_lossy()
    ));
    if partial.exists() {
        std::fs::remove_dir_all(&partial).map_err(io(format!("removing {}", partial.display())))?;
    }
    let log = dir.join(format!("debootstrap-{}.log", suite.name()));
    let log_file = File::create(&log).map_err(io(format!("creating {}", log.display())))?;
    let status = Command::new("debootstrap")
        .arg("--variant=minbase")
        .arg(format!("--include={}", PACKAGES.join(",")))
        .arg(suite.name())
        .arg(&partial)
        .arg(mirror)
        .stdout(log_file.try_clone().map_err(io("debootstrap log"))?)
        .stderr(log_file)
        .status()
        .map_err(io(
            "running debootstrap (is it installed? apt-get install debootstrap)",
        ))?;
    if !status.success() {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        return Err(NspawnError::Command {
            command: format!("debootstrap {} from {mirror}", suite.name()),
            output: format!("{status}; {}:\n{}", log.display(), super::tail(&text, 30)),
        });
    }
    finish(&partial)?;
    std::fs::write(
        partial.join(".complete"),
        format!("{}\n", key(suite, mirror)),
    )
    .map_err(io("marking the image complete"))?;
    std::fs::rename(&partial, root).map_err(io(format!("moving the image to {}", root.display())))
}

/// What every container needs beyond debootstrap: a persistent journal (so a test reads the
/// boot before a reboot), no machine id of its own (each container gets one), no package cache.
fn finish(root: &Path) -> Result<(), NspawnError> {
    std::fs::create_dir_all(root.join("var/log/journal")).map_err(io("var/log/journal"))?;
    std::fs::write(root.join("etc/machine-id"), "").map_err(io("etc/machine-id"))?;
    run(Command::new("find")
        .arg(root.join("var/cache/apt/archives"))
        .args(["-name", "*.deb", "-delete"]))?;
    Ok(())
}

/// Remove images of `suite` with other keys (a previous package list or version); the other
/// suites' images stay.
fn remove_stale(dir: &Path, keep: &Path, suite: Suite) {
    let prefix = format!("rootfs-{}-", suite.name());
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let path = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with(&prefix) && path != keep {
            if let Err(err) = std::fs::remove_dir_all(&path) {
                tracing::warn!(path = %path.display(), error = %err, "cannot remove a stale image");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mirror_comes_from_the_stanza_of_the_suite() {
        let text =
            "Types: deb\nURIs: http://mirror.example/debian\nSuites: bookworm bookworm-updates\n\
                    Components: main\n\nTypes: deb\nURIs: http://mirror.example/debian-security\n\
                    Suites: bookworm-security\n";
        assert_eq!(
            mirror_from_deb822(text).as_deref(),
            Some("http://mirror.example/debian")
        );
        assert_eq!(
            mirror_from_deb822("Types: deb\nSuites: trixie\nURIs: x\n"),
            None
        );
    }

    #[test]
    fn the_key_changes_with_what_the_image_is_made_of() {
        let b = Suite::Bookworm;
        assert_ne!(key(b, "http://a/debian"), key(b, "http://b/debian"));
        assert_eq!(key(b, "http://a/debian"), key(b, "http://a/debian"));
        assert!(key(b, "http://a/debian").starts_with("bookworm-v"));
        assert!(key(Suite::Trixie, "http://a/debian").starts_with("trixie-v"));
        assert_ne!(
            key(b, "http://a/debian"),
            key(Suite::Trixie, "http://a/debian")
        );
    }
}
