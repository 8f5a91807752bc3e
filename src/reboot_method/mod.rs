//! The lightest reboot that does the job (`[reboot] method`): what logind is asked for, and,
//! for `auto`, the pure choice from what the host shows ([`HostFacts`], read by [`probe`]).
//!
//! logind's `RebootWithFlags` takes `SD_LOGIND_REBOOT_VIA_KEXEC` (a kexec into a loaded kernel,
//! else a full reboot: logind falls back by itself), `SD_LOGIND_SOFT_REBOOT` (systemd 254: only
//! userspace restarts, the kernel and the boot id stay) and `SD_LOGIND_SOFT_REBOOT_IF_NEXTROOT_SET_UP`
//! (systemd 256: a soft reboot into `/run/nextroot` when one is set up there, else a full reboot).
//!
//! `auto` picks a soft reboot only when the kernel that would boot next is the running one, a
//! kexec only where a kernel is loaded and the operator allowed it (`allow_kexec`), and a full
//! reboot for anything it does not know. Per platform:
//! - Debian (and its derivatives): the kernel that boots next is the newest installed
//!   `/boot/vmlinuz-*` (the packages' grub default); equal to `uname -r`: soft.
//! - ostree/bootc: a soft reboot must switch to the staged deployment, which only
//!   `/run/nextroot` does, so the flag is `..._IF_NEXTROOT_SET_UP` (systemd 256+), and only when
//!   the staged deployment's kernel is the running one; without a staged deployment what the
//!   reboot is for is unknown: full.
//! - Flatcar: always full (update_engine replaces the kernel together with `/usr`).

use serde::{Deserialize, Serialize};
use std::cmp::Ordering;

pub mod probe;

/// `SD_LOGIND_REBOOT_VIA_KEXEC`.
pub const FLAG_KEXEC: u64 = 1 << 1;
/// `SD_LOGIND_SOFT_REBOOT` (systemd 254).
pub const FLAG_SOFT_REBOOT: u64 = 1 << 2;
/// `SD_LOGIND_SOFT_REBOOT_IF_NEXTROOT_SET_UP` (systemd 256).
pub const FLAG_SOFT_REBOOT_IF_NEXTROOT: u64 = 1 << 3;
/// The first systemd whose logind soft-reboots (`SD_LOGIND_SOFT_REBOOT`, `SoftRebootsCount`).
pub const SOFT_REBOOT_SINCE: u32 = 254;
/// The first systemd whose logind knows `SD_LOGIND_SOFT_REBOOT_IF_NEXTROOT_SET_UP`.
pub const NEXTROOT_SINCE: u32 = 256;

/// `[reboot] method`: what the operator asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Method {
    /// A full reboot (firmware, boot loader, kernel).
    #[default]
    Reboot,
    /// A kexec into the loaded kernel (logind reboots fully when none is loaded).
    Kexec,
    /// A userspace-only reboot (systemd 254+; refused at start on older systemd).
    SoftReboot,
    /// The lightest that does the job, chosen per reboot from the host ([`choose`]).
    Auto,
}

impl Method {
    pub fn as_str(self) -> &'static str {
        match self {
            Method::Reboot => "reboot",
            Method::Kexec => "kexec",
            Method::SoftReboot => "soft-reboot",
            Method::Auto => "auto",
        }
    }
}

/// The reboot logind is asked for; recorded in the state before the call, so the proof after
/// it knows what to look for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    #[default]
    Full,
    Kexec,
    Soft,
    /// A soft reboot into `/run/nextroot` if one is set up there, else a full reboot.
    SoftIfNextroot,
}

impl Kind {
    /// logind's `RebootWithFlags` flags for this kind (beside the inhibitor flag).
    pub fn flags(self) -> u64 {
        match self {
            Kind::Full => 0,
            Kind::Kexec => FLAG_KEXEC,
            Kind::Soft => FLAG_SOFT_REBOOT,
            Kind::SoftIfNextroot => FLAG_SOFT_REBOOT_IF_NEXTROOT,
        }
    }

    /// Whether the boot id may stay: the proof is then systemd's `SoftRebootsCount`.
    pub fn may_be_soft(self) -> bool {
        matches!(self, Kind::Soft | Kind::SoftIfNextroot)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Full => "reboot",
            Kind::Kexec => "kexec",
            Kind::Soft => "soft-reboot",
            Kind::SoftIfNextroot => "soft-reboot if /run/nextroot is set up",
        }
    }
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What the host shows about the next boot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Platform {
    /// Kernels installed by packages: `/boot/vmlinuz-<release>`.
    Debian {
        running: String,
        installed: Vec<String>,
    },
    /// ostree/bootc: the staged deployment's kernel releases (`/usr/lib/modules/*` of it), or
    /// `None` when no deployment is staged.
    Ostree {
        running: String,
        staged: Option<Vec<String>>,
    },
    /// Flatcar Container Linux.
    Flatcar,
    /// Anything else, with what was seen (`ID=` of os-release, or why it is unknown).
    Unknown(String),
}

/// Everything `auto` decides from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostFacts {
    /// systemd's major version, when it could be read.
    pub systemd: Option<u32>,
    /// `/sys/kernel/kexec_loaded`: Some(true) when a kernel is loaded.
    pub kexec_loaded: Option<bool>,
    pub platform: Platform,
}

/// The kind of reboot, and why, in words for the log and the state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Choice {
    pub kind: Kind,
    pub why: String,
}

/// The reboot about to be asked for, as the state records it before the call.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Plan {
    pub kind: Kind,
    /// Why this kind (the method, or what `auto` saw).
    pub why: String,
    /// The manager's `SoftRebootsCount` before the call, when it could be read.
    pub soft_reboots: Option<u64>,
}

fn choice(kind: Kind, why: impl Into<String>) -> Choice {
    Choice {
        kind,
        why: why.into(),
    }
}

/// The reboot to ask for: the configured method, or for `auto` the lightest that `facts`
/// show to do the job. Anything unknown is a full reboot (or a kexec where allowed and loaded).
pub fn choose(method: Method, allow_kexec: bool, facts: &HostFacts) -> Choice {
    match method {
        Method::Reboot => choice(Kind::Full, "reboot.method = \"reboot\""),
        Method::Kexec => choice(Kind::Kexec, "reboot.method = \"kexec\""),
        Method::SoftReboot => choice(Kind::Soft, "reboot.method = \"soft-reboot\""),
        Method::Auto => auto(allow_kexec, facts),
    }
}

fn auto(allow_kexec: bool, facts: &HostFacts) -> Choice {
    let soft_ok = facts.systemd.is_some_and(|v| v >= SOFT_REBOOT_SINCE);
    let kernel_changes = |why: String| -> Choice {
        if allow_kexec && facts.kexec_loaded == Some(true) {
            choice(Kind::Kexec, format!("{why}; a kernel is loaded for kexec"))
        } else if facts.kexec_loaded == Some(true) {
            choice(
                Kind::Full,
                format!("{why}; a kernel is loaded but reboot.allow_kexec is off"),
            )
        } else {
            choice(Kind::Full, format!("{why}; no kernel loaded for kexec"))
        }
    };
    let systemd = match facts.systemd {
        Some(v) => format!("systemd {v}"),
        None => "an unknown systemd version".into(),
    };
    match &facts.platform {
        Platform::Flatcar => choice(
            Kind::Full,
            "Flatcar: update_engine changes the kernel with /usr",
        ),
        Platform::Unknown(what) => kernel_changes(format!("unknown platform ({what})")),
        Platform::Debian { running, installed } => match newest(installed) {
            Some(next) if next == running && soft_ok => choice(
                Kind::Soft,
                format!("the newest installed kernel {next} is the running one"),
            ),
            Some(next) if next == running => kernel_changes(format!(
                "the newest installed kernel {next} is the running one, but {systemd} cannot soft-reboot (254+)"
            )),
            Some(next) => kernel_changes(format!(
                "kernel {next} is installed, {running} is running"
            )),
            None => kernel_changes(format!(
                "no /boot/vmlinuz-* found (running {running})"
            )),
        },
        Platform::Ostree { running, staged } => match staged {
            None => kernel_changes("ostree: no staged deployment".into()),
            Some(kernels) if kernels.iter().all(|k| k == running) && !kernels.is_empty() => {
                if facts.systemd.is_some_and(|v| v >= NEXTROOT_SINCE) {
                    choice(
                        Kind::SoftIfNextroot,
                        format!("ostree: the staged deployment has the running kernel {running}"),
                    )
                } else {
                    kernel_changes(format!(
                        "ostree: the staged deployment keeps kernel {running}, but {systemd} cannot soft-reboot into /run/nextroot (256+)"
                    ))
                }
            }
            Some(kernels) => kernel_changes(format!(
                "ostree: the staged deployment has kernel {}, {running} is running",
                if kernels.is_empty() {
                    "unknown".to_string()
                } else {
                    kernels.join(", ")
                }
            )),
        },
    }
}

/// The newest of kernel releases, by version order (`6.1.0-28-amd64` after `6.1.0-9-amd64`).
pub fn newest(releases: &[String]) -> Option<&String> {
    releases.iter().max_by(|a, b| compare_versions(a, b))
}

/// Compare version strings as runs of digits (by number) and of other characters (by text),
/// in the spirit of dpkg's order for kernel releases; `~` sorts before anything.
pub fn compare_versions(a: &str, b: &str) -> Ordering {
    let (mut a, mut b) = (a, b);
    loop {
        match (a.is_empty(), b.is_empty()) {
            (true, true) => return Ordering::Equal,
            (true, false) => {
                return if b.starts_with('~') {
                    Ordering::Greater
                } else {
                    Ordering::Less
                }
            }
            (false, true) => {
                return if a.starts_with('~') {
                    Ordering::Less
                } else {
                    Ordering::Greater
                }
            }
            _ => {}
        }
        let (ra, rest_a) = run(a);
        let (rb, rest_b) = run(b);
        let order = match (ra.parse::<u128>(), rb.parse::<u128>()) {
            (Ok(x), Ok(y)) => x.cmp(&y),
            _ => text_order(ra, rb),
        };
        if order != Ordering::Equal {
            return order;
        }
        a = rest_a;
        b = rest_b;
    }
}

/// The leading run of digits, or of non-digits, and the rest.
fn run(s: &str) -> (&str, &str) {
    let digits = s.starts_with(|c: char| c.is_ascii_digit());
    let end = s
        .find(|c: char| c.is_ascii_digit() != digits)
        .unwrap_or(s.len());
    s.split_at(end)
}

/// Text runs: `~` first, letters before other characters (dpkg's order).
fn text_order(a: &str, b: &str) -> Ordering {
    let weight = |c: char| -> i32 {
        match c {
            '~' => -1,
            c if c.is_ascii_digit() => 0,
            c if c.is_ascii_alphabetic() => c as i32,
            c => c as i32 + 256,
        }
    };
    let mut ca = a.chars();
    let mut cb = b.chars();
    loop {
        match (ca.next(), cb.next()) {
            (None, None) => return Ordering::Equal,
            (x, y) => {
                let (wx, wy) = (x.map_or(0, weight), y.map_or(0, weight));
                if wx != wy {
                    return wx.cmp(&wy);
                }
            }
        }
    }
}

/// The major version of systemd's `Version` property (`"257.13-1~deb13u1"` → 257,
/// `"252"` → 252); `None` when it does not start with a number.
pub fn systemd_major(version: &str) -> Option<u32> {
    let digits: String = version
        .trim()
        .chars()
        .take_while(|c| c.is_ascii_digit())
        .collect();
    digits.parse().ok()
}

#[cfg(test)]
mod tests;
