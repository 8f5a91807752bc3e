//! What goes into a host: rebootd as its packages install it, configuration fragments,
//! drop-ins, and the lab's fake update_engine on the container's real system bus.
//!
//! rebootd is installed from the **static release binaries** that ship (`packaging/build-static.sh`:
//! musl, the ones in the .deb, the .rpm, the sysext image and the Ignition download), with
//! `systemd/rebootd.service` and `packaging/config.d/00-default.toml` unchanged at the paths the
//! packages use, and enabled as `systemctl enable` would. [`Artifacts::build`] runs the packaging
//! scripts, so the binaries are those of the tree being tested (cargo rebuilds what changed).

use super::host::Host;
use super::{io, NspawnError};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Where the fake update_engine's status file is inside a container: write
/// `OPERATION NEW_VERSION` into it and the fake emits `StatusUpdate` with it.
pub const UPDATE_ENGINE_STATUS: &str = "/run/rebootd-lab/update-engine-status";
/// Where the lab binary is bound inside a container.
const LAB_IN_CONTAINER: &str = "/usr/libexec/rebootd-lab/rebootd-lab";

/// The unit of the fake update_engine: as Flatcar's update-engine.service (Type=dbus with its
/// bus name), less its container condition.
const UPDATE_ENGINE_UNIT: &str = "[Unit]
Description=Update Engine (rebootd lab stand-in)

[Service]
Type=dbus
BusName=com.coreos.update1
ExecStart=/usr/libexec/rebootd-lab/rebootd-lab update-engine --status-file /run/rebootd-lab/update-engine-status
Restart=always
RestartSec=1

[Install]
WantedBy=multi-user.target
";

/// The D-Bus policy Flatcar's update_engine installs as
/// /usr/share/dbus-1/system.d/com.coreos.update1.conf (coreos-overlay,
/// coreos-base/update_engine): root may own the name and call it; the `core` user may call
/// only GetStatus, AttemptUpdate and ResetStatus; everyone else is denied.
pub const UPDATE_ENGINE_POLICY: &str = r#"<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-BUS Bus Configuration 1.0//EN"
  "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <policy user="root">
    <allow own="com.coreos.update1" />
    <allow send_destination="com.coreos.update1" />
  </policy>
  <policy user="core">
    <deny send_destination="com.coreos.update1"
          send_interface="org.freedesktop.DBus.Introspectable" />
    <deny send_destination="com.coreos.update1"
          send_interface="org.freedesktop.DBus.Properties" />
    <allow send_destination="com.coreos.update1"
           send_interface="com.coreos.update1.Manager"
           send_member="AttemptUpdate"/>
    <allow send_destination="com.coreos.update1"
           send_interface="com.coreos.update1.Manager"
           send_member="ResetStatus"/>
    <allow send_destination="com.coreos.update1"
           send_interface="com.coreos.update1.Manager"
           send_member="GetStatus"/>
  </policy>
  <policy context="default">
    <deny send_destination="com.coreos.update1" />
  </policy>
</busconfig>
"#;

/// The built things a host is given.
#[derive(Debug, Clone)]
pub struct Artifacts {
    /// The repository (unit, default configuration).
    pub repo: PathBuf,
    /// Static rebootd and rebootctl.
    pub rebootd: PathBuf,
    pub rebootctl: PathBuf,
    /// The .deb, when asked for.
    pub deb: Option<PathBuf>,
    /// The lab binary (the fake update_engine), bound into containers.
    pub lab: PathBuf,
}

impl Artifacts {
    /// Build the static binaries (`packaging/build-static.sh`) and, with `deb`, the .deb
    /// (`packaging/build-deb.sh`), in `repo`'s target directory; `lab` is the lab binary to
    /// bind into containers. Output goes to `log` (cargo prints a lot).
    pub fn build(repo: &Path, lab: &Path, deb: bool, log: &Path) -> Result<Artifacts, NspawnError> {
        let target_dir = std::env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| repo.join("target"));
        let static_target = std::env::var("REBOOTD_STATIC_TARGET")
            .unwrap_or_else(|_| "x86_64-unknown-linux-musl".into());
        let mut scripts = vec!["packaging/build-static.sh"];
        if deb {
            scripts.push("packaging/build-deb.sh");
        }
        for script in scripts {
            let out = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(log)
                .map_err(io(format!("opening {}", log.display())))?;
            let err = out.try_clone().map_err(io("log"))?;
            let status = Command::new("bash")
                .arg(repo.join(script))
                .current_dir(repo)
                .stdout(out)
                .stderr(err)
                .status()
                .map_err(io(format!("running {script}")))?;
            if !status.success() {
                let text = std::fs::read_to_string(log).unwrap_or_default();
                return Err(NspawnError::Command {
                    command: script.to_string(),
                    output: format!("{status}; {}:\n{}", log.display(), super::tail(&text, 30)),
                });
            }
        }
        let dir = target_dir.join(&static_target).join("release");
        let deb = if deb {
            let dist = std::env::var_os("REBOOTD_DIST")
                .map(PathBuf::from)
                .unwrap_or_else(|| target_dir.join("dist"));
            let found = std::fs::read_dir(&dist)
                .map_err(io(format!("reading {}", dist.display())))?
                .flatten()
                .map(|e| e.path())
                .find(|p| p.extension().is_some_and(|e| e == "deb"));
            Some(found.ok_or_else(|| NspawnError::Host {
                host: "-".into(),
                what: format!("build-deb.sh left no .deb in {}", dist.display()),
            })?)
        } else {
            None
        };
        Ok(Artifacts {
            repo: repo.to_path_buf(),
            rebootd: dir.join("rebootd"),
            rebootctl: dir.join("rebootctl"),
            deb,
            lab: lab.to_path_buf(),
        })
    }
}

/// Install rebootd as the packages do: binaries in /usr/bin, the shipped unit in
/// /usr/lib/systemd/system, the default fragment in /usr/lib/rebootd/config.d, enabled; and the
/// lab's per-boot id (`BOOT_ID_UNIT`).
pub fn rebootd(host: &Host, a: &Artifacts) -> Result<(), NspawnError> {
    host.copy(&a.rebootd, "/usr/bin/rebootd", 0o755)?;
    host.copy(&a.rebootctl, "/usr/bin/rebootctl", 0o755)?;
    host.copy(
        &a.repo.join("systemd/rebootd.service"),
        "/usr/lib/systemd/system/rebootd.service",
        0o644,
    )?;
    host.copy(
        &a.repo.join("packaging/config.d/00-default.toml"),
        "/usr/lib/rebootd/config.d/00-default.toml",
        0o644,
    )?;
    host.symlink(
        "/usr/lib/systemd/system/rebootd.service",
        "/etc/systemd/system/multi-user.target.wants/rebootd.service",
    )?;
    boot_id(host)
}

/// Where each boot's id is written (see [`BOOT_ID_UNIT`]).
pub const BOOT_ID_FILE: &str = "/run/rebootd-lab/boot_id";

/// Containers share the kernel's boot id. nspawn shows each of its runs a fresh one at
/// /proc/sys/kernel/random/boot_id, but a service with `ProtectKernelTunables=yes` (rebootd's)
/// gets /proc/sys mounted again and sees the kernel's, which a container reboot does not change.
/// So every boot copies nspawn's id (as a unit without that protection sees it) under /run,
/// before rebootd starts, and rebootd is pointed at it (`[identity] boot_id_file`). A soft
/// reboot keeps nspawn running and so its id (measured with systemd 257: the id, /run and the
/// container's PID 1 stay), as a soft reboot keeps a real host's boot id.
const BOOT_ID_UNIT: &str = "[Unit]
Description=A boot id of this container boot (rebootd lab)
DefaultDependencies=no
Before=rebootd.service sysinit.target

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/bin/sh -c 'mkdir -p /run/rebootd-lab && cat /proc/sys/kernel/random/boot_id > /run/rebootd-lab/boot_id'

[Install]
WantedBy=sysinit.target
";

/// The per-boot id: the oneshot unit and the fragment that points rebootd at its file.
fn boot_id(host: &Host) -> Result<(), NspawnError> {
    host.write(
        "/etc/systemd/system/rebootd-lab-boot-id.service",
        BOOT_ID_UNIT,
        0o644,
    )?;
    host.symlink(
        "/etc/systemd/system/rebootd-lab-boot-id.service",
        "/etc/systemd/system/sysinit.target.wants/rebootd-lab-boot-id.service",
    )?;
    config(
        host,
        "10-lab-boot-id.toml",
        &format!("[identity]\nboot_id_file = \"{BOOT_ID_FILE}\"\n"),
    )
}

/// A configuration fragment: /etc/rebootd/config.d/`name`.
pub fn config(host: &Host, name: &str, toml: &str) -> Result<(), NspawnError> {
    host.write(&format!("/etc/rebootd/config.d/{name}"), toml, 0o644)
}

/// A drop-in for `unit`: /etc/systemd/system/`unit`.d/`name`.
pub fn drop_in(host: &Host, unit: &str, name: &str, text: &str) -> Result<(), NspawnError> {
    host.write(&format!("/etc/systemd/system/{unit}.d/{name}"), text, 0o644)
}

/// The fake update_engine as a D-Bus service (Type=dbus, `com.coreos.update1`) under the policy
/// Flatcar ships, enabled; the lab binary is bound read-only into the container.
pub fn update_engine(host: &mut Host, a: &Artifacts) -> Result<(), NspawnError> {
    host.bind_ro(&a.lab, LAB_IN_CONTAINER);
    host.write(
        "/usr/share/dbus-1/system.d/com.coreos.update1.conf",
        UPDATE_ENGINE_POLICY,
        0o644,
    )?;
    host.write(
        "/etc/systemd/system/update-engine.service",
        UPDATE_ENGINE_UNIT,
        0o644,
    )?;
    host.symlink(
        "/etc/systemd/system/update-engine.service",
        "/etc/systemd/system/multi-user.target.wants/update-engine.service",
    )
}

/// Make update_engine report `operation` (and `version`): the fake emits `StatusUpdate`.
pub async fn set_update_status(
    host: &Host,
    operation: &str,
    version: &str,
) -> Result<(), NspawnError> {
    let dir = Path::new(UPDATE_ENGINE_STATUS)
        .parent()
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    // Written to a temporary name and renamed, so the fake never reads half a line.
    host.sh(&format!(
        "mkdir -p {dir} && printf '%s %s\\n' {operation} {version} > {UPDATE_ENGINE_STATUS}.new && mv {UPDATE_ENGINE_STATUS}.new {UPDATE_ENGINE_STATUS}"
    ))
    .await
    .map(|_| ())
}
