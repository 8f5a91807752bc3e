//! Real hosts: Debian 12 containers booted with systemd-nspawn (real systemd, journald, logind
//! and D-Bus system bus) running the shipped rebootd unit with the static release binaries, etcd
//! on the host's loopback. See `rebootd_lab::nspawn` and the test section of docs/design-notes.md.
//!
//! The first test to run builds what every test shares, once: the Debian image (debootstrap,
//! cached under ~/.cache/rebootd-lab), the static binaries and the .deb (packaging/build-static.sh,
//! packaging/build-deb.sh) and the lab binary (the fake update_engine). Needs root.

mod common;
use common::{lab_binary, repo};
use rebootd_lab::etcd::{EtcdServer, EtcdVersion};
use rebootd_lab::nspawn::host::{Host, Lines};
use rebootd_lab::nspawn::image;
use rebootd_lab::nspawn::install::{self, Artifacts};
use rebootd_lab::nspawn::watch::HolderWatch;
use serde_json::Value;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

/// A boot, a reboot, a unit's start: generous for a loaded 2-core machine.
const BOOT: Duration = Duration::from_secs(180);
/// The exposure README and docs/install.md state for the shipped unit.
const DOCUMENTED_EXPOSURE: &str = "1.4";
const NEED: &str = "UPDATE_STATUS_UPDATED_NEED_REBOOT";

/// The image and the artifacts, made once for all tests of this binary.
fn setup() -> &'static (PathBuf, Artifacts) {
    static SETUP: OnceLock<Result<(PathBuf, Artifacts), String>> = OnceLock::new();
    let made = SETUP.get_or_init(|| {
        let image = image::ensure().map_err(|e| e.to_string())?;
        let lab = lab_binary()?;
        let log =
            std::env::temp_dir().join(format!("rebootd-nspawn-build-{}.log", std::process::id()));
        let artifacts = Artifacts::build(&repo(), &lab, true, &log).map_err(|e| e.to_string())?;
        Ok((image, artifacts))
    });
    match made {
        Ok(s) => s,
        Err(e) => panic!("setting up the container lab: {e}"),
    }
}

/// A host name unique to this run (other runs may boot hosts at the same time).
fn unique(name: &str) -> String {
    format!("{name}-{}", std::process::id() % 100_000)
}

/// A host with rebootd installed and the fake update_engine, `config` as /etc/rebootd/config.d/50-test.toml.
fn prepare(name: &str, config: &str) -> Host {
    let (image, a) = setup();
    let mut host = Host::create(image, &unique(name)).unwrap();
    install::rebootd(&host, a).unwrap();
    install::update_engine(&mut host, a).unwrap();
    install::config(&host, "50-test.toml", config).unwrap();
    host
}

/// Boot and wait until systemd finished starting up, rebootd's unit included.
async fn boot(mut host: Host) -> Host {
    host.boot().unwrap();
    came_up(&host, 1, BOOT, true).await;
    host
}

/// Wait until boot `n` runs and systemd finished starting it: "running" (no unit failed), or
/// "degraded" with rebootd's own unit active when the host has rebootd (`rebootd`). Under load
/// on a cgroup v1 host one of Debian's units now and then fails "at step CGROUP"
/// (systemd-update-utmp, systemd-remount-fs); what matters here is rebootd's unit.
async fn came_up(host: &Host, n: u32, within: Duration, rebootd: bool) {
    let state = host.wait_boot(n, within).await.unwrap();
    assert!(
        state == "running" || state == "degraded",
        "boot {n}: {state}: {}",
        failed_units(host).await
    );
    if state == "degraded" && rebootd {
        let active = host.unit_property("rebootd", "ActiveState").await.unwrap();
        assert_eq!(active, "active", "boot {n}: {}", failed_units(host).await);
    }
}

/// Follow rebootd's messages in the journal (`journalctl -u rebootd -f -o cat`), from the first.
fn follow_rebootd(host: &Host) -> Lines {
    host.follow(&[
        "journalctl",
        "-u",
        "rebootd",
        "-f",
        "-n",
        "all",
        "-o",
        "cat",
    ])
    .unwrap()
}

/// A unit's messages in the boot before this one.
async fn previous_boot(host: &Host, unit: &str) -> String {
    host.run(&[
        "journalctl",
        "-u",
        unit,
        "-b",
        "-1",
        "-o",
        "cat",
        "--no-pager",
    ])
    .await
    .unwrap()
}

async fn failed_units(host: &Host) -> String {
    let failed = host
        .sh("systemctl --failed --no-legend; journalctl -b --no-pager -n 60")
        .await;
    format!("{failed:?}")
}

async fn journal(host: &Host, args: &str) -> String {
    host.sh(&format!("journalctl -u rebootd --no-pager {args}"))
        .await
        .unwrap()
}

fn etcd_config(etcd: &EtcdServer) -> String {
    format!(
        "[triggers]\nsentinel_file = \"/run/reboot-required\"\n\n[lock]\nbackend = \"etcd\"\n\n\
         [lock.etcd]\nendpoints = [\"{}\"]\n\n[reboot]\nretry_interval = \"2s\"\n",
        etcd.endpoint()
    )
}

const SENTINEL_ONLY: &str =
    "[triggers]\nupdate_engine = false\nsentinel_file = \"/run/reboot-required\"\n\n[reboot]\nretry_interval = \"2s\"\n";

async fn etcd() -> EtcdServer {
    let v = EtcdVersion::available()
        .into_iter()
        .last()
        .expect("an etcd is installed (scripts/setup.sh)");
    EtcdServer::start(v).await.unwrap()
}

/// Key material of the host that the unit hides from rebootd (`InaccessiblePaths=`): one file
/// under each hidden path, as Debian, Fedora CoreOS, Flatcar and Kubernetes put them there.
/// The test writes each (root's, mode 0600) unless the image has it (`/etc/shadow`).
const HOST_KEYS: &[&str] = &[
    "/var/lib/kubelet/pki/kubelet.key",
    "/etc/kubernetes/admin.conf",
    "/etc/rancher/k3s/k3s.yaml",
    "/var/lib/rancher/k3s/server/token",
    "/var/lib/etcd/member/snap/db",
    "/etc/ssh/ssh_host_ed25519_key",
    "/root/.ssh/id_ed25519",
    "/etc/ssl/private/host.key",
    "/etc/pki/tls/private/host.key",
    "/etc/shadow",
    "/etc/gshadow",
    "/etc/krb5.keytab",
    "/var/lib/systemd/credential.secret",
    "/var/lib/cloud/instance/user-data.txt",
];

/// What rebootd reads, beside the keys: its configuration and its own kubeconfig under
/// /etc/rebootd, the machine id, the boot id, and the CA bundles next to the hidden private
/// keys (the last two, and the kubeconfig, written by the test).
const REBOOTD_READS: &[&str] = &[
    "/etc/rebootd/config.d/50-test.toml",
    "/etc/rebootd/kubeconfig",
    "/etc/machine-id",
    install::BOOT_ID_FILE,
    "/etc/ssl/certs/lab-ca.pem",
    "/etc/pki/tls/certs/ca-bundle.crt",
];

/// A sentinel command that tries to read each file it is given and says on its stderr, which
/// rebootd logs a line each (`sentinel command: …`), whether it could: `key-probe read PATH` or `key-probe denied PATH`, then
/// `key-probe done`. It runs as rebootd's child, with rebootd's credentials, namespaces and
/// mounts: what it reads, rebootd could. It exits 1 (no reboot needed).
fn key_probe_config() -> String {
    let script = r#"for f in "$@"; do if cat "$f" >/dev/null 2>&1; then r=read; else r=denied; fi; echo "key-probe $r $f" >&2; done; echo "key-probe done" >&2; exit 1"#;
    let paths: Vec<String> = HOST_KEYS
        .iter()
        .chain(REBOOTD_READS)
        .map(|p| format!("\"{p}\""))
        .collect();
    format!(
        "[triggers]\nsentinel_command = [\"/bin/sh\", \"-c\", '{script}', \"key-probe\", {}]\n",
        paths.join(", ")
    )
}

#[tokio::test]
async fn the_shipped_unit_runs_under_real_systemd() {
    let host = prepare("unit", &key_probe_config());
    // Dummy keys where the host's are, and what rebootd is given, before rebootd starts.
    for path in HOST_KEYS {
        if !host.path(path).exists() {
            host.write(path, &format!("lab secret {path}\n"), 0o600)
                .unwrap();
        }
    }
    host.write("/etc/rebootd/kubeconfig", "lab kubeconfig\n", 0o600)
        .unwrap();
    for path in [
        "/etc/ssl/certs/lab-ca.pem",
        "/etc/pki/tls/certs/ca-bundle.crt",
    ] {
        host.write(path, "lab CA\n", 0o644).unwrap();
    }
    let host = boot(host).await;
    // Type=notify: "active (running)" only after READY=1; STATUS= is what rebootd sent.
    assert_eq!(
        host.unit_property("rebootd", "Type").await.unwrap(),
        "notify"
    );
    assert_eq!(
        host.unit_property("rebootd", "ActiveState").await.unwrap(),
        "active"
    );
    assert_eq!(
        host.unit_property("rebootd", "SubState").await.unwrap(),
        "running"
    );
    assert_eq!(
        host.unit_property("rebootd", "StatusText").await.unwrap(),
        "idle"
    );
    assert_eq!(
        host.unit_property("rebootd", "NRestarts").await.unwrap(),
        "0"
    );
    assert_eq!(
        host.unit_property("rebootd", "WatchdogUSec").await.unwrap(),
        "1min"
    );
    // StateDirectoryMode=0700, owned by root.
    assert_eq!(
        host.run(&["stat", "-c", "%a %U", "/var/lib/rebootd"])
            .await
            .unwrap()
            .trim(),
        "700 root"
    );
    assert!(host
        .run(&["test", "-f", "/var/lib/rebootd/state.json"])
        .await
        .is_ok());

    // The boot id rebootd recorded is this boot's.
    let state: Value = serde_json::from_str(
        &host
            .run(&["cat", "/var/lib/rebootd/state.json"])
            .await
            .unwrap(),
    )
    .unwrap();
    let boot_id = host.run(&["cat", install::BOOT_ID_FILE]).await.unwrap();
    assert_eq!(state["boot_id"], boot_id.trim(), "{state}");

    // The host's keys are there, and root outside the service reads them; rebootd's sentinel
    // command (rebootd's own credentials and sandbox) cannot, and reads what rebootd needs.
    let mut follow = follow_rebootd(&host);
    follow
        .expect("the key probe ran", BOOT, |l| {
            l == "sentinel command: key-probe done"
        })
        .await
        .unwrap();
    let probe: Vec<&str> = follow
        .seen
        .iter()
        .filter_map(|l| l.strip_prefix("sentinel command: "))
        .filter(|l| l.starts_with("key-probe "))
        .collect();
    println!("{}", follow.seen.join("\n"));
    for path in HOST_KEYS {
        host.run(&["test", "-s", path]).await.unwrap();
        let line = format!("key-probe denied {path}");
        assert!(probe.contains(&line.as_str()), "{line:?} not in {probe:#?}");
    }
    for path in REBOOTD_READS {
        let line = format!("key-probe read {path}");
        assert!(probe.contains(&line.as_str()), "{line:?} not in {probe:#?}");
    }
    // Even root with every capability, in rebootd's mount namespace, finds nothing there
    // (an empty directory or an empty file, mode 0000, in place of each).
    let pid = host.unit_property("rebootd", "MainPID").await.unwrap();
    host.run(&[
        "nsenter",
        "-t",
        &pid,
        "-m",
        "--",
        "test",
        "-s",
        "/etc/rebootd/kubeconfig",
    ])
    .await
    .unwrap();
    for path in HOST_KEYS {
        let seen = host
            .exec(&["nsenter", "-t", &pid, "-m", "--", "test", "-s", path])
            .await
            .unwrap();
        assert!(
            !seen.status.success(),
            "{path} is in rebootd's mount namespace"
        );
    }

    // The exposure systemd computes for the running unit is the one the docs state.
    let report = host
        .run(&["systemd-analyze", "security", "rebootd", "--no-pager"])
        .await
        .unwrap();
    let line = report
        .lines()
        .find(|l| l.contains("Overall exposure level"))
        .unwrap_or_else(|| panic!("no exposure in {report}"));
    let exposure = line
        .rsplit(": ")
        .next()
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap();
    println!("{line}");
    assert_eq!(exposure, DOCUMENTED_EXPOSURE, "{line}");
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    assert!(readme.contains(&format!("exposure {DOCUMENTED_EXPOSURE}")));

    // update_engine's policy is in force on the real bus: root may call it, nobody may not.
    let status = host
        .run(&[
            "busctl",
            "call",
            "com.coreos.update1",
            "/com/coreos/update1",
            "com.coreos.update1.Manager",
            "GetStatus",
        ])
        .await
        .unwrap();
    assert!(status.contains("UPDATE_STATUS_IDLE"), "{status}");
    let denied = host
        .exec(&[
            "setpriv",
            "--reuid=nobody",
            "--regid=nogroup",
            "--clear-groups",
            "busctl",
            "call",
            "com.coreos.update1",
            "/com/coreos/update1",
            "com.coreos.update1.Manager",
            "GetStatus",
        ])
        .await
        .unwrap();
    assert!(!denied.status.success());
    assert!(
        String::from_utf8_lossy(&denied.stderr).contains("Access denied"),
        "{denied:?}"
    );

    // Every journal line carries who this is.
    let json = journal(&host, "-o json").await;
    let entries: Vec<Value> = json
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let own: Vec<&Value> = entries
        .iter()
        .filter(|e| e["SYSLOG_IDENTIFIER"] == "rebootd")
        .collect();
    assert!(!own.is_empty(), "{json}");
    // The agent's lines name the node, group and holder.
    let agent: Vec<&&Value> = own
        .iter()
        .filter(|e| e["TARGET"] == "rebootd::runtime")
        .collect();
    assert!(!agent.is_empty(), "{json}");
    for e in agent {
        assert_eq!(e["NODE"], host.name.as_str(), "{e}");
        assert_eq!(e["GROUP"], "default", "{e}");
        assert_eq!(e["HOLDER"], host.machine_id.as_str(), "{e}");
    }
}

/// Fields that say where a message comes from rather than what happened: the spans' fields
/// (with tracing-journald's `SPAN_NAME`, `SPAN_TARGET`, `SPAN_CODE_*` of each span) and
/// journald's own.
fn context_field(key: &str) -> bool {
    key.starts_with('_')
        || key.starts_with("SYSLOG_")
        || key.starts_with("CODE_")
        || key.starts_with("SPAN_")
        || matches!(
            key,
            "MESSAGE"
                | "PRIORITY"
                | "TARGET"
                | "NODE"
                | "GROUP"
                | "HOLDER"
                | "PHASE"
                | "ACTION"
                | "RESPECT_INHIBITORS"
        )
}

/// Every rebootd message in the short view says the values of its own fields.
fn check_journal_reads_on_its_own(json: &str) {
    for line in json.lines() {
        let e: Value = serde_json::from_str(line).unwrap();
        if e["SYSLOG_IDENTIFIER"] != "rebootd" {
            continue;
        }
        let message = e["MESSAGE"].as_str().unwrap_or_else(|| panic!("{e}"));
        for (k, v) in e.as_object().unwrap() {
            let Some(v) = v.as_str() else { continue };
            if context_field(k) || v.is_empty() {
                continue;
            }
            assert!(
                message.contains(v),
                "{k}={v} is not in the message {message:?}"
            );
        }
    }
}

#[tokio::test]
async fn a_sentinel_trigger_reboots_through_logind_and_the_next_boot_releases_the_slot() {
    let etcd = etcd().await;
    let holders = HolderWatch::start(&etcd.endpoint(), "default")
        .await
        .unwrap();
    let host = boot(prepare("trigger", &etcd_config(&etcd))).await;
    let first_boot = host.run(&["cat", install::BOOT_ID_FILE]).await.unwrap();

    host.run(&["touch", "/run/reboot-required"]).await.unwrap();
    // logind reboots the container: nspawn ends with 133 and the lab boots it again.
    came_up(&host, 2, BOOT, true).await;
    let mut follow = host
        .follow(&[
            "journalctl",
            "-u",
            "rebootd",
            "-b",
            "-f",
            "-n",
            "all",
            "-o",
            "cat",
        ])
        .unwrap();
    follow
        .expect("idle in the new boot", BOOT, |l| {
            l.ends_with("→ idle: slot released") || l.contains("→ idle")
        })
        .await
        .unwrap();
    let second_boot = host.run(&["cat", install::BOOT_ID_FILE]).await.unwrap();
    assert_ne!(first_boot, second_boot, "a reboot changes the boot id");
    let state: Value = serde_json::from_str(
        &host
            .run(&["cat", "/var/lib/rebootd/state.json"])
            .await
            .unwrap(),
    )
    .unwrap();
    assert_eq!(state["phase"], "idle", "{state}");
    assert_eq!(state["boot_id"], second_boot.trim(), "{state}");
    assert!(!state["last_reboot"].is_null(), "{state}");
    assert_eq!(
        host.unit_property("rebootd", "StatusText").await.unwrap(),
        "idle"
    );

    // Outside: the slot was held by this machine across the reboot, then given back.
    let history = holders.history();
    assert!(
        history.contains(&vec![host.machine_id.clone()]),
        "{history:?}"
    );
    assert_eq!(history.last(), Some(&Vec::new()), "{history:?}");

    // The journal reads on its own: phase changes as "from → to: why".
    let short = journal(&host, "-o short").await;
    println!("--- journalctl -u rebootd ---\n{short}");
    for wanted in [
        "idle → reboot_needed: ",
        "reboot_needed → acquiring_slot: ",
        "acquiring_slot → rebooting: ",
        "rebooting → waiting_for_healthy: ",
        "waiting for a reboot slot (etcd semaphore, group default)",
    ] {
        assert!(short.contains(wanted), "{wanted:?} not in\n{short}");
    }
    assert!(!short.contains("phase change"), "{short}");
    let json = journal(&host, "-o json").await;
    let entries: Vec<Value> = json
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let change = entries
        .iter()
        .find(|e| e["FROM"] == "idle" && e["TO"] == "reboot_needed")
        .unwrap_or_else(|| panic!("no FROM=idle TO=reboot_needed entry in {json}"));
    assert!(
        change["WHY"]
            .as_str()
            .unwrap()
            .contains("/run/reboot-required"),
        "{change}"
    );
    assert_eq!(change["NODE"], host.name.as_str(), "{change}");
    check_journal_reads_on_its_own(&json);
}

#[tokio::test]
async fn the_watchdog_restarts_a_daemon_stuck_in_a_logind_call() {
    let host = prepare("watchdog", SENTINEL_ONLY);
    install::drop_in(
        &host,
        "rebootd.service",
        "watchdog.conf",
        "[Service]\nWatchdogSec=5s\n",
    )
    .unwrap();
    let host = boot(host).await;
    assert_eq!(
        host.unit_property("rebootd", "WatchdogUSec").await.unwrap(),
        "5s"
    );
    let mut follow = follow_rebootd(&host);
    // logind stops answering: rebootd's RebootWithFlags call hangs in its agent loop.
    let logind = host
        .unit_property("systemd-logind", "MainPID")
        .await
        .unwrap();
    host.sh(&format!("kill -STOP {logind}")).await.unwrap();
    host.run(&["touch", "/run/reboot-required"]).await.unwrap();
    follow
        .expect("systemd's watchdog fires", BOOT, |l| {
            l.contains("Watchdog timeout")
        })
        .await
        .unwrap();
    follow
        .expect("systemd restarts rebootd", BOOT, |l| {
            l.starts_with("Started ")
        })
        .await
        .unwrap();
    let restarts: u32 = host
        .unit_property("rebootd", "NRestarts")
        .await
        .unwrap()
        .parse()
        .unwrap();
    assert!(restarts >= 1);
    // logind answers again: the restarted daemon's request goes through.
    host.sh(&format!("kill -CONT {logind}")).await.unwrap();
    host.wait_boot(2, BOOT).await.unwrap();
}

/// A real `systemd-inhibit --mode=block` held by root, which real logind would let root's own
/// reboot call through, holds off the reboot; `rebootctl status` names who holds it and why;
/// its release (logind's `BlockInhibited` change) lets the reboot through.
#[tokio::test]
async fn a_real_block_inhibitor_delays_the_reboot_and_status_names_it() {
    let host = boot(prepare("inhibit", SENTINEL_ONLY)).await;
    let mut follow = follow_rebootd(&host);
    // The inhibitor is held before the trigger exists: systemd-inhibit takes it, then runs the
    // command, which makes the reboot needed and stays (a transient unit, so nothing of the
    // test's holds it).
    host.run(&[
        "systemd-run",
        "--unit=backup-job",
        "systemd-inhibit",
        "--mode=block",
        "--what=shutdown",
        "--who=backup-job",
        "--why=nightly dump",
        "sh",
        "-c",
        "touch /run/reboot-required; exec sleep infinity",
    ])
    .await
    .unwrap();
    follow
        .expect("rebootd names the inhibitor it waits for", BOOT, |l| {
            l.contains("backup-job (nightly dump")
        })
        .await
        .unwrap();
    let status = host.run(&["rebootctl", "status"]).await.unwrap();
    assert!(status.contains("backup-job (nightly dump"), "{status}");
    let json: Value =
        serde_json::from_str(&host.run(&["rebootctl", "status", "--json"]).await.unwrap()).unwrap();
    assert_eq!(json["phase"], "rebooting", "{json}");
    assert_eq!(json["inhibited_by"][0]["who"], "backup-job", "{json}");
    assert_eq!(json["inhibited_by"][0]["mode"], "block", "{json}");
    assert_eq!(host.boot_count(), 1, "rebooted through the block inhibitor");

    host.run(&["systemctl", "stop", "backup-job"])
        .await
        .unwrap();
    came_up(&host, 2, BOOT, true).await;
    let before = previous_boot(&host, "rebootd").await;
    assert!(before.contains("block inhibitors released"), "{before}");
}

/// A person logged in through real PAM and logind (su on a pty, pam_systemd: a `user` session
/// with a TTY): rebootd names them, real logind holds the announced dry-run reboot, and the
/// reboot comes once the time given has passed.
#[tokio::test]
async fn a_logged_in_user_is_warned_by_real_logind_before_the_reboot() {
    let config = "[triggers]\nupdate_engine = false\nsentinel_file = \"/run/lab-trigger/reboot-required\"\n\n[reboot]\nretry_interval = \"2s\"\nusers_warning = \"20s\"\n";
    let host = boot(prepare("users", config)).await;
    host.sh("useradd -m alice && install -d -m 1777 /run/lab-trigger")
        .await
        .unwrap();
    let mut follow = follow_rebootd(&host);
    // alice logs in (on a pty, through su's PAM stack) and then makes the reboot needed, so
    // her session exists before rebootd looks.
    host.run(&[
        "systemd-run",
        "--unit=alice-login",
        "script",
        "-qfc",
        "su - alice -c 'touch /run/lab-trigger/reboot-required; exec sleep infinity'",
        "/dev/null",
    ])
    .await
    .unwrap();
    let line = follow
        .expect("rebootd names the logged-in user", BOOT, |l| {
            l.contains("logged in: alice on pts/")
        })
        .await
        .unwrap();
    assert!(line.contains("logind announces the reboot for"), "{line}");
    let sessions = host
        .run(&["loginctl", "list-sessions", "--no-legend"])
        .await
        .unwrap();
    assert!(sessions.contains("alice"), "{sessions}");
    // Real logind holds the announcement rebootd asked for.
    let scheduled = host
        .run(&[
            "busctl",
            "get-property",
            "org.freedesktop.login1",
            "/org/freedesktop/login1",
            "org.freedesktop.login1.Manager",
            "ScheduledShutdown",
        ])
        .await
        .unwrap();
    let json: Value =
        serde_json::from_str(&host.run(&["rebootctl", "status", "--json"]).await.unwrap()).unwrap();
    assert_eq!(
        json["users_warned"]["sessions"][0]["user"], "alice",
        "{json}"
    );
    // logind shows a dry-run "dry-reboot" as "reboot" (it keeps the dry run apart), for the
    // time rebootd gave.
    let until: jiff::Timestamp = json["users_warned"]["until"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(
        scheduled.trim(),
        format!("(st) \"reboot\" {}", until.as_microsecond()),
        "{json}"
    );
    assert_eq!(host.boot_count(), 1, "rebooted before the time given");
    // The time passes; then the reboot.
    came_up(&host, 2, BOOT, true).await;
    let before = previous_boot(&host, "rebootd").await;
    assert!(
        before.contains("the time announced to logged-in users passed"),
        "{before}"
    );
    // At that time logind itself did nothing but say so: the reboot was rebootd's call.
    let logind = previous_boot(&host, "systemd-logind").await;
    assert!(
        logind.contains("Running in dry run, suppressing action"),
        "{logind}"
    );
}

#[tokio::test]
async fn a_fleet_of_three_with_max_one_reboots_one_at_a_time() {
    let etcd = etcd().await;
    let holders = HolderWatch::start(&etcd.endpoint(), "default")
        .await
        .unwrap();
    let config = format!(
        "[lock]\nbackend = \"etcd\"\n\n[lock.etcd]\nendpoints = [\"{}\"]\n\n[reboot]\nretry_interval = \"2s\"\n",
        etcd.endpoint()
    );
    let mut hosts = Vec::new();
    for i in 1..=3 {
        hosts.push(boot(prepare(&format!("fleet{i}"), &config)).await);
    }
    // update_engine (the lab's, on each host's real system bus under Flatcar's policy).
    for h in &hosts {
        install::set_update_status(h, NEED, "9999.0.0")
            .await
            .unwrap();
    }
    for h in &hosts {
        came_up(h, 2, BOOT * 2, true).await;
    }
    let mut released = holders.subscribe();
    tokio::time::timeout(
        BOOT,
        released.wait_for(|h| {
            let held: Vec<&String> = h.iter().flatten().collect();
            hosts.iter().all(|x| held.contains(&&x.machine_id)) && h.last() == Some(&Vec::new())
        }),
    )
    .await
    .unwrap_or_else(|_| {
        panic!(
            "every host held the slot once and released it: {:?}",
            holders.history()
        )
    })
    .unwrap();
    assert_eq!(holders.max_holders(), 1, "{:?}", holders.history());
    for h in &hosts {
        assert_eq!(h.boot_count(), 2, "{} rebooted once", h.name);
    }
}

#[tokio::test]
async fn the_deb_installs_enables_and_does_not_start() {
    let (image, a) = setup();
    let deb = a.deb.as_ref().expect("the .deb");
    let mut host = Host::create(image, &unique("deb")).unwrap();
    host.copy(deb, "/root/rebootd.deb", 0o644).unwrap();
    host.boot().unwrap();
    came_up(&host, 1, BOOT, false).await;
    let out = host
        .run(&["dpkg", "-i", "/root/rebootd.deb"])
        .await
        .unwrap();
    println!("{out}");
    assert_eq!(
        host.run(&["systemctl", "is-enabled", "rebootd"])
            .await
            .unwrap()
            .trim(),
        "enabled"
    );
    let active = host
        .exec(&["systemctl", "is-active", "rebootd"])
        .await
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&active.stdout).trim(), "inactive");
    assert!(
        host.run(&["test", "-e", "/var/lib/rebootd"]).await.is_err(),
        "never started, so no state directory"
    );
    // Enabled: the next boot starts it.
    host.run(&["systemctl", "reboot"]).await.unwrap();
    came_up(&host, 2, BOOT, true).await;
    assert_eq!(
        host.unit_property("rebootd", "ActiveState").await.unwrap(),
        "active"
    );
    assert_eq!(
        host.unit_property("rebootd", "StatusText").await.unwrap(),
        "idle"
    );
}
