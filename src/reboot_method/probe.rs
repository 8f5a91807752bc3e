//! Reading [`HostFacts`] from the host: os-release, the running kernel, the installed ones,
//! ostree's staged deployment, `/sys/kernel/kexec_loaded`. What cannot be read is left unknown
//! (and so leads to a full reboot); the parsing is pure and tested here.

use super::{HostFacts, Platform};
use std::path::Path;

/// The files and the command `auto` looks at (a root other than `/` for tests).
pub struct Paths<'a> {
    pub root: &'a Path,
}

impl Paths<'_> {
    fn at(&self, path: &str) -> std::path::PathBuf {
        self.root.join(path.trim_start_matches('/'))
    }
}

/// What `auto` decides from, read now. `systemd` is the manager's major version (read over
/// D-Bus by the caller).
pub fn read(paths: &Paths<'_>, systemd: Option<u32>) -> HostFacts {
    let read = |p: &str| std::fs::read_to_string(paths.at(p)).ok();
    let running = read("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    let kexec_loaded = read("/sys/kernel/kexec_loaded").map(|s| s.trim() == "1");
    let platform = if paths.at("/run/ostree-booted").exists() {
        let status = std::process::Command::new("ostree")
            .args(["admin", "status"])
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned());
        match status {
            None => Platform::Unknown("ostree, but `ostree admin status` did not answer".into()),
            Some(text) => Platform::Ostree {
                staged: staged_deployment(&text).map(|(stateroot, deployment)| {
                    list(
                        &paths.at(&format!(
                            "/ostree/deploy/{stateroot}/deploy/{deployment}/usr/lib/modules"
                        )),
                        "",
                    )
                }),
                running,
            },
        }
    } else {
        platform(
            &read("/etc/os-release")
                .or_else(|| read("/usr/lib/os-release"))
                .unwrap_or_default(),
            running,
            list(&paths.at("/boot"), "vmlinuz-"),
        )
    };
    HostFacts {
        systemd,
        kexec_loaded,
        platform,
    }
}

/// The entries of `dir` named `prefix<rest>`, as `rest`.
fn list(dir: &Path, prefix: &str) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut names: Vec<String> = entries
        .flatten()
        .filter_map(|e| {
            e.file_name()
                .to_str()
                .and_then(|n| n.strip_prefix(prefix))
                .filter(|n| !n.is_empty())
                .map(str::to_string)
        })
        .collect();
    names.sort();
    names
}

/// The platform from os-release (not an ostree host): Flatcar, Debian or a derivative
/// (`ID=debian` or `ID_LIKE` naming it), else unknown.
pub fn platform(os_release: &str, running: String, vmlinuz: Vec<String>) -> Platform {
    let field = |name: &str| {
        os_release.lines().find_map(|l| {
            l.strip_prefix(name)
                .and_then(|v| v.strip_prefix('='))
                .map(|v| v.trim().trim_matches('"').to_string())
        })
    };
    let id = field("ID").unwrap_or_default();
    let like = field("ID_LIKE").unwrap_or_default();
    if id == "flatcar" {
        Platform::Flatcar
    } else if id == "debian" || like.split_whitespace().any(|w| w == "debian") {
        Platform::Debian {
            running,
            installed: vmlinuz,
        }
    } else if id.is_empty() {
        Platform::Unknown("no os-release".into())
    } else {
        Platform::Unknown(format!("ID={id}"))
    }
}

/// The staged deployment in `ostree admin status` output, as (stateroot, `checksum.serial`):
/// the line that ends in `(staged)`, e.g. `  fedora-coreos 4a1b…e2.0 (staged)`.
pub fn staged_deployment(status: &str) -> Option<(String, String)> {
    status.lines().find_map(|line| {
        let words: Vec<&str> = line
            .trim_start_matches(['*', ' '])
            .split_whitespace()
            .collect();
        match words.as_slice() {
            [stateroot, deployment, "(staged)", ..] => {
                Some((stateroot.to_string(), deployment.to_string()))
            }
            _ => None,
        }
    })
}
