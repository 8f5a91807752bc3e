//! The lightest reboot and logind's maintenance time under real systemd: Debian 13 (trixie,
//! systemd 257) containers soft-reboot through real logind, and Debian 12 (bookworm, systemd
//! 252) ones refuse what their systemd cannot do. The same lab as `tests/nspawn.rs` (see
//! `rebootd_lab::nspawn`); the trixie image is built by `debootstrap trixie` beside the
//! bookworm one and cached the same way. Needs root.

mod common;
use common::{lab_binary, repo};
use rebootd_lab::etcd::{EtcdServer, EtcdVersion};
use rebootd_lab::nspawn::host::{Host, Lines};
use rebootd_lab::nspawn::image::{self, Suite};
use rebootd_lab::nspawn::install::{self, Artifacts};
use rebootd_lab::nspawn::watch::HolderWatch;
use serde_json::Value;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

/// A boot, a reboot, a unit's start: generous for a loaded 2-core machine.
const BOOT: Duration = Duration::from_secs(240);

/// The static binaries, built once for all tests of this binary.
fn artifacts() -> &'static Artifacts {
    static MADE: OnceLock<Result<Artifacts, String>> = OnceLock::new();
    let made = MADE.get_or_init(|| {
        let lab = lab_binary()?;
        let log =
            std::env::temp_dir().join(format!("rebootd-trixie-build-{}.log", std::process::id()));
        Artifacts::build(&repo(), &lab, false, &log).map_err(|e| e.to_string())
    });
    match made {
        Ok(a) => a,
        Err(e) => panic!("building rebootd for the container lab: {e}"),
    }
}

fn image(suite: Suite) -> PathBuf {
    image::ensure_suite(suite).unwrap_or_else(|e| panic!("the {} image: {e}", suite.name()))
}

fn unique(name: &str) -> String {
    format!("{name}-{}", std::process::id() % 100_000)
}

/// A host of `suite` with rebootd installed, `config` as /etc/rebootd/config.d/50-test.toml.
fn prepare(suite: Suite, name: &str, config: &str) -> Host {
    let a = artifacts();
    let mut host = Host::create(&image(suite), &unique(name)).unwrap();
    install::rebootd(&host, a).unwrap();
    install::update_engine(&mut host, a).unwrap();
    install::config(&host, "50-test.toml", config).unwrap();
    host
}

/// rebootd's messages, from the first (all boots: a soft reboot is the same boot to journald).
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

async fn etcd() -> EtcdServer {
    let v = EtcdVersion::available()
        .into_iter()
        .last()
        .expect("an etcd is installed (scripts/setup.sh)");
    EtcdServer::start(v).await.unwrap()
}

/// A host on etcd, rebooting when Debian's `/run/reboot-required` appears, with this
/// `[reboot] method`.
fn etcd_config(etcd: &EtcdServer, method: &str) -> String {
    format!(
        "[triggers]\nupdate_engine = false\nsentinel_file = \"/run/reboot-required\"\n\n[lock]\nbackend = \"etcd\"\n\n\
         [lock.etcd]\nendpoints = [\"{}\"]\n\n[reboot]\nmethod = \"{method}\"\nretry_interval = \"2s\"\n",
        etcd.endpoint()
    )
}

async fn state(host: &Host) -> Value {
    serde_json::from_str(
        &host
            .run(&["cat", "/var/lib/rebootd/state.json"])
            .await
            .unwrap(),
    )
    .unwrap()
}

async fn soft_reboots(host: &Host) -> String {
    host.run(&["systemctl", "show", "-p", "SoftRebootsCount", "--value"])
        .await
        .unwrap()
        .trim()
        .to_string()
}

async fn running(host: &Host, n: u32) {
    let state = host.wait_boot(n, BOOT).await.unwrap();
    assert!(
        state == "running" || state == "degraded",
        "boot {n}: {state}"
    );
    assert_eq!(
        host.unit_property("rebootd", "ActiveState").await.unwrap(),
        "active"
    );
}

/// Follow rebootd's messages until one satisfies `pred`. A soft reboot ends every process of
/// the old userspace, the follower too: each time it ends, a new one starts (from the first
/// message again), in the new userspace once it runs. Bounded by [`BOOT`] overall.
async fn until_across_soft_reboot(
    host: &Host,
    mut follow: Lines,
    what: &str,
    pred: impl Fn(&str) -> bool,
) -> String {
    let deadline = tokio::time::Instant::now() + BOOT;
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        match follow.expect_or_end(what, left, &pred).await.unwrap() {
            Some(line) => return line,
            None => follow = follow_rebootd(host),
        }
    }
}

#[tokio::test]
async fn trixie_soft_reboots_through_logind_proves_it_by_the_count_and_releases_then_reboots_fully()
{
    let etcd = etcd().await;
    let holders = HolderWatch::start(&etcd.endpoint(), "default")
        .await
        .unwrap();
    let mut host = prepare(Suite::Trixie, "soft", &etcd_config(&etcd, "soft-reboot"));
    host.boot().unwrap();
    running(&host, 1).await;
    let version = host.run(&["systemctl", "--version"]).await.unwrap();
    assert!(version.starts_with("systemd 257"), "{version}");
    assert_eq!(soft_reboots(&host).await, "0");
    let boot_id = host.run(&["cat", install::BOOT_ID_FILE]).await.unwrap();
    let leader_before = host.boots().borrow().leader;
    let mut follow = follow_rebootd(&host);

    host.run(&["touch", "/run/reboot-required"]).await.unwrap();
    follow
        .expect("logind asked for a soft reboot", BOOT, |l| {
            l.contains("asking logind to soft-reboot")
        })
        .await
        .unwrap();
    let proof =
        until_across_soft_reboot(&host, follow, "the soft reboot proven by the count", |l| {
            l.contains("rebooted: soft reboot: SoftRebootsCount 0 -> 1")
        })
        .await;
    assert!(proof.contains(boot_id.trim()), "{proof}");
    until_across_soft_reboot(&host, follow_rebootd(&host), "the slot released", |l| {
        l.contains("slot released; cycle complete")
    })
    .await;

    // A soft reboot: systemd counted it, nspawn did not restart (boot 1 still runs, the
    // container's PID 1 is the same process), the boot id stayed.
    assert_eq!(soft_reboots(&host).await, "1");
    assert_eq!(
        host.boot_count(),
        1,
        "nspawn did not boot the container again"
    );
    assert_eq!(host.boots().borrow().leader, leader_before);
    assert_eq!(
        host.run(&["cat", install::BOOT_ID_FILE]).await.unwrap(),
        boot_id
    );
    let s = state(&host).await;
    assert_eq!(s["phase"], "idle", "{s}");
    assert_eq!(s["reboots"], 1, "{s}");
    // /run survived the soft reboot, Debian's sentinel with it; the reboot met it, so it
    // started no new cycle ("slot released; cycle complete" above, not "still needed").
    host.run(&["test", "-e", "/run/reboot-required"])
        .await
        .unwrap();
    assert!(s["reason"].is_null(), "{s}");
    assert!(!s["last_reboot"].is_null(), "{s}");
    // Outside: held by this machine across the soft reboot, then given back.
    let history = holders.history();
    assert!(
        history.contains(&vec![host.machine_id.clone()]),
        "{history:?}"
    );
    assert_eq!(history.last(), Some(&Vec::new()), "{history:?}");
    // The previous userspace's rebootd logged the call (same journal boot).
    let log = host
        .run(&["journalctl", "-u", "rebootd", "--no-pager", "-o", "cat"])
        .await
        .unwrap();
    assert!(
        log.contains("logind accepted the reboot (soft-reboot)"),
        "{log}"
    );

    // A full reboot on the same systemd 257 still works: method back to "reboot", and the
    // sentinel written anew.
    install::config(&host, "50-test.toml", &etcd_config(&etcd, "reboot")).unwrap();
    host.run(&["rm", "/run/reboot-required"]).await.unwrap();
    host.run(&["systemctl", "restart", "rebootd"])
        .await
        .unwrap();
    host.run(&["touch", "/run/reboot-required"]).await.unwrap();
    running(&host, 2).await;
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
    if let Err(e) = follow
        .expect("the full reboot proven by the boot id", BOOT, |l| {
            l.contains("rebooted: boot id")
        })
        .await
    {
        panic!(
            "{e}\n--- rebootd, every boot ---\n{}",
            host.unit_journal("rebootd")
        );
    }
    follow
        .expect("the slot released", BOOT, |l| {
            l.contains("slot released; cycle complete")
        })
        .await
        .unwrap();
    assert_ne!(
        host.run(&["cat", install::BOOT_ID_FILE]).await.unwrap(),
        boot_id
    );
    assert_eq!(
        soft_reboots(&host).await,
        "0",
        "a full reboot starts the count again"
    );
    let s = state(&host).await;
    assert_eq!(s["reboots"], 2, "{s}");
    assert_eq!(holders.history().last(), Some(&Vec::new()));
}

#[tokio::test]
async fn trixie_takes_its_window_from_loginds_designated_maintenance_time() {
    let mut host = prepare(
        Suite::Trixie,
        "maint",
        "[triggers]\nupdate_engine = false\n\n[[window]]\nsource = \"logind\"\nlength = \"90m\"\n",
    );
    // Two days from now, so that the 90-minute window is never open while the test runs.
    let day = jiff::Timestamp::now()
        .to_zoned(jiff::tz::TimeZone::UTC)
        .checked_add(jiff::Span::new().days(2))
        .unwrap()
        .strftime("%a")
        .to_string();
    host.write(
        "/etc/systemd/logind.conf.d/50-maintenance.conf",
        &format!("[Login]\nDesignatedMaintenanceTime={day} *-*-* 03:15 UTC\n"),
        0o644,
    )
    .unwrap();
    host.boot().unwrap();
    running(&host, 1).await;
    let spec = host
        .run(&[
            "busctl",
            "get-property",
            "org.freedesktop.login1",
            "/org/freedesktop/login1",
            "org.freedesktop.login1.Manager",
            "DesignatedMaintenanceTime",
        ])
        .await
        .unwrap();
    assert!(spec.contains("03:15"), "real logind: {spec}");
    let mut follow = follow_rebootd(&host);
    let line = follow
        .expect("the window read from logind", BOOT, |l| {
            l.contains("maintenance window from logind's DesignatedMaintenanceTime")
        })
        .await
        .unwrap();
    assert!(line.contains(&day), "{line}");
    // rebootctl reads the same window from logind: outside it now, a requested reboot waits
    // for it.
    let status: Value =
        serde_json::from_str(&host.run(&["rebootctl", "status", "--json"]).await.unwrap()).unwrap();
    let windows = status["windows"].as_str().unwrap_or_default().to_string();
    assert!(
        windows.contains(&day) && windows.contains("03:15"),
        "{status}"
    );
    let next = status["next_window"].as_str().unwrap_or_default();
    assert!(next.contains("T03:15:00"), "{status}");
}

#[tokio::test]
async fn bookworm_refuses_soft_reboot_and_a_logind_window_naming_systemd_252() {
    let mut host = prepare(
        Suite::Bookworm,
        "old",
        "[triggers]\nupdate_engine = false\n\n[reboot]\nmethod = \"soft-reboot\"\n",
    );
    host.boot().unwrap();
    host.wait_boot(1, BOOT).await.unwrap();
    let mut follow = follow_rebootd(&host);
    let line = follow
        .expect("soft-reboot refused at start", BOOT, |l| {
            l.contains("soft-reboot") && l.contains("254")
        })
        .await
        .unwrap();
    assert!(
        line.contains("this host runs systemd 252"),
        "the error names the version: {line}"
    );
    assert_ne!(
        host.unit_property("rebootd", "SubState").await.unwrap(),
        "running"
    );

    install::config(
        &host,
        "50-test.toml",
        "[triggers]\nupdate_engine = false\n\n[[window]]\nsource = \"logind\"\nlength = \"1h\"\n",
    )
    .unwrap();
    // Out of its start limit, or between two attempts: start it again either way.
    let _ = host.run(&["systemctl", "reset-failed", "rebootd"]).await;
    let _ = host.run(&["systemctl", "restart", "rebootd"]).await;
    let line = follow
        .expect("a logind window refused at start", BOOT, |l| {
            l.contains("DesignatedMaintenanceTime") && l.contains("source = \"logind\"")
        })
        .await
        .unwrap();
    assert!(line.contains("systemd 252"), "{line}");
    assert!(line.contains("257"), "{line}");
}
