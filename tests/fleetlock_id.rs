//! The id the `fleetlock` backend sends: by default Zincati's (the machine id made
//! app-specific with Zincati's application id), checked against systemd's own derivation
//! (`systemd-id128 machine-id --app-specific=...`, run in a mount namespace where
//! /etc/machine-id is the id under test) and seen in the real airlock's semaphore; an explicit
//! `[lock.fleetlock] id` is sent as written.

mod common;

use common::*;
use rebootd::app_id::{zincati_node_id, ZINCATI_APP_ID};
use rebootd_lab::airlock::Airlock;
use rebootd_lab::etcd::{EtcdServer, EtcdVersion};

const NEED: &str = "UPDATE_STATUS_UPDATED_NEED_REBOOT";

/// systemd's app-specific id for a machine whose /etc/machine-id is `machine_id`.
fn systemd_app_specific(machine_id: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("machine-id");
    std::fs::write(&file, format!("{machine_id}\n")).unwrap();
    let script = format!(
        "mount --bind {} /etc/machine-id && exec systemd-id128 machine-id --app-specific={ZINCATI_APP_ID}",
        file.display()
    );
    let out = std::process::Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c", &script])
        .output()
        .expect("unshare");
    assert!(
        out.status.success(),
        "systemd-id128 in a mount namespace: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

#[test]
fn zincati_id_matches_systemd_id128() {
    // This host's own id, without any namespace.
    let own = std::fs::read_to_string("/etc/machine-id").unwrap();
    let out = std::process::Command::new("systemd-id128")
        .args(["machine-id", &format!("--app-specific={ZINCATI_APP_ID}")])
        .output()
        .unwrap();
    assert!(out.status.success());
    assert_eq!(
        zincati_node_id(own.trim()).unwrap(),
        String::from_utf8(out.stdout).unwrap().trim()
    );
    // Other machines' ids.
    for _ in 0..3 {
        let id = std::fs::read_to_string("/proc/sys/kernel/random/uuid")
            .unwrap()
            .trim()
            .replace('-', "");
        assert_eq!(
            zincati_node_id(&id).unwrap(),
            systemd_app_specific(&id),
            "{id}"
        );
    }
}

#[tokio::test]
async fn real_airlock_holds_the_zincati_id_then_an_explicit_one() {
    let v = EtcdVersion::available()
        .into_iter()
        .next()
        .expect("an etcd is installed (scripts/setup.sh)");
    let etcd = EtcdServer::start(v).await.expect("etcd");
    let airlock = Airlock::start(&etcd, &[("default", 1), ("workers", 1)])
        .await
        .expect("airlock");
    let config = format!(
        "[lock]\nbackend = \"fleetlock\"\n\n[lock.fleetlock]\nurl = \"{}\"\n",
        airlock.url()
    );
    let mut a = node("fid-a", &config).await;
    let mut reboots = a.logind.subscribe();
    a.wait_ready(WAIT).await.unwrap();
    a.update_engine.set_status(NEED, "1").await.unwrap();
    next_reboot(&a, &mut reboots, WAIT).await;
    let expected = systemd_app_specific(&a.machine_id);
    assert_eq!(
        Airlock::holders(&etcd, "default").unwrap(),
        [expected],
        "airlock holds Zincati's id for this machine, not the machine id {}",
        a.machine_id
    );
    // Back after the reboot: steady-state with the same id frees the slot.
    a.reboot().await.unwrap();
    a.wait_state("released after the reboot", WAIT, |s| {
        s.phase == rebootd::state::Phase::Idle && s.last_reboot.is_some()
    })
    .await
    .unwrap();
    assert!(Airlock::holders(&etcd, "default").unwrap().is_empty());

    let config = format!(
        "[identity]\ngroup = \"workers\"\n\n[lock]\nbackend = \"fleetlock\"\n\n[lock.fleetlock]\nurl = \"{}\"\nid = \"worker-7.example\"\n",
        airlock.url()
    );
    let b = node("fid-b", &config).await;
    let mut reboots = b.logind.subscribe();
    b.wait_ready(WAIT).await.unwrap();
    b.update_engine.set_status(NEED, "1").await.unwrap();
    next_reboot(&b, &mut reboots, WAIT).await;
    assert_eq!(
        Airlock::holders(&etcd, "workers").unwrap(),
        ["worker-7.example"]
    );
    // rebootctl unlock without an id releases this node's slot: the same id.
    let (code, _, err) = rebootctl(&b, &["unlock"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(Airlock::holders(&etcd, "workers").unwrap().is_empty());
    airlock.stop().await;
}
