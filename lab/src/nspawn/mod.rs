//! Real hosts in the lab: Debian 12 containers booted with `systemd-nspawn`, each running real
//! systemd (PID 1), journald, logind and a D-Bus system bus, with rebootd installed as a package
//! would install it (the shipped unit and configuration layout, unchanged).
//!
//! - [`image`]: the Debian root file system, made once with debootstrap and cached; rebuilt when
//!   its key (suite, package list, mirror, [`image::IMAGE_VERSION`]) changes.
//! - [`host`]: one container: an overlay over the cached image (its own machine id, its own
//!   writable layer kept across reboots), booted by a loop around `systemd-nspawn` that boots it
//!   again after a real reboot (nspawn exits with 133), commands run inside with `nsenter`.
//! - [`install`]: what goes into a host: rebootd's static binaries, unit and default
//!   configuration, configuration fragments, drop-ins, and the lab's fake update_engine as a
//!   D-Bus service under the policy Flatcar's update_engine ships.
//! - [`cli`]: `rebootd-lab hosts`, a fleet of containers against etcd on the loopback.
//!
//! Containers share the host's network (no `--private-network`), so rebootd reaches an etcd on
//! 127.0.0.1. Everything is torn down when the [`host::Host`] is dropped (and on Ctrl-C in the
//! command). Needs root, `debootstrap`, `systemd-nspawn`, `nsenter` and overlayfs.

pub mod cli;
pub mod host;
pub mod image;
pub mod install;
pub mod watch;

/// Errors of the container lab.
#[derive(Debug, thiserror::Error)]
pub enum NspawnError {
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{command} failed: {output}")]
    Command { command: String, output: String },
    #[error("timed out after {after:?} waiting for {what}")]
    Timeout {
        after: std::time::Duration,
        what: String,
    },
    #[error("host {host}: {what}")]
    Host { host: String, what: String },
}

pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> NspawnError {
    let what = what.into();
    move |source| NspawnError::Io { what, source }
}

/// Run a command to completion; its output, or an error with what it printed.
pub(crate) fn run(cmd: &mut std::process::Command) -> Result<String, NspawnError> {
    let command = format!("{cmd:?}");
    let out = cmd.output().map_err(io(format!("running {command}")))?;
    if !out.status.success() {
        return Err(NspawnError::Command {
            command,
            output: format!(
                "{}\n{}{}",
                out.status,
                tail(&String::from_utf8_lossy(&out.stdout), 40),
                tail(&String::from_utf8_lossy(&out.stderr), 40)
            ),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The last `n` lines of `text`.
pub(crate) fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let from = lines.len().saturating_sub(n);
    lines[from..].join("\n")
}
