//! End-to-end tests of the core daemon: real rebootd processes on real private dbus-daemons,
//! with the lab's fake update_engine and fake logind.

mod common;

use common::*;
use rebootd::state::Phase;
use rebootd_lab::node::{Node, NodeOptions};
use std::path::Path;
use std::time::Duration;

const NEED: &str = "UPDATE_STATUS_UPDATED_NEED_REBOOT";

/// Wait for the daemon to report ready (its triggers listen), and check it is idle.
async fn idle(node: &Node) {
    node.wait_ready(WAIT).await.unwrap();
    assert_eq!(node.state().unwrap().phase, Phase::Idle);
    assert_eq!(node.notify_status(), "idle");
}

#[tokio::test]
async fn need_reboot_signal_leads_to_exactly_one_reboot_and_back_to_idle() {
    let mut node = node("n1", "").await;
    let mut reboots = node.logind.subscribe();
    idle(&node).await;
    let first_boot = node.boot_id();
    node.update_engine.set_status(NEED, "1.2.3").await.unwrap();
    let call = next_reboot(&node, &mut reboots, WAIT).await;
    assert_eq!(call.method, "RebootWithFlags");
    assert_eq!(call.flags, 1, "inhibitors are respected by default");
    let s = node
        .wait_state("the accepted reboot to be recorded", WAIT, |s| {
            s.reboot.as_ref().is_some_and(|r| r.called)
        })
        .await
        .unwrap();
    assert_eq!(s.phase, Phase::Rebooting);
    assert!(s.reason.as_deref().unwrap().contains("1.2.3"), "{s:?}");

    node.reboot().await.unwrap();
    let s = node
        .wait_state("idle in the new boot", WAIT, |s| {
            s.phase == Phase::Idle && s.boot_id != first_boot
        })
        .await
        .unwrap();
    assert!(s.last_reboot.is_some());
    assert!(!s.slot_held);
    assert_eq!(s.reason, None);
    assert_eq!(
        node.logind.reboot_calls().len(),
        1,
        "exactly one reboot call"
    );
    assert!(node.log().contains("rebooted: boot id"), "{}", node.log());
}

#[tokio::test]
async fn status_already_set_before_start_is_seen_through_get_status() {
    let mut node = Node::start(
        Path::new(REBOOTD),
        NodeOptions {
            start_daemon: false,
            ..NodeOptions::new("n2")
        },
    )
    .await
    .unwrap();
    node.update_engine.set_status(NEED, "9.9.9").await.unwrap();
    let mut reboots = node.logind.subscribe();
    node.start_daemon().unwrap();
    next_reboot(&node, &mut reboots, WAIT).await;
    assert!(node.log().contains("GetStatus"), "{}", node.log());
}

#[tokio::test]
async fn nothing_happens_outside_the_window_until_it_opens() {
    // A window that opens a few seconds from now, in UTC, on the weekday of its start.
    let start = jiff::Timestamp::now() + jiff::SignedDuration::from_secs(4);
    let local = start.to_zoned(jiff::tz::TimeZone::UTC);
    let day = local.weekday().to_monday_one_offset();
    let days = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"];
    let config = format!(
        "[[window]]\ndays = [\"{}\"]\nstart = \"{}\"\nlength = \"1h\"\ntime_zone = \"UTC\"\n",
        days[day as usize - 1],
        local.strftime("%H:%M:%S"),
    );
    let node = node("n3", &config).await;
    let mut reboots = node.logind.subscribe();
    idle(&node).await;
    node.update_engine.set_status(NEED, "2.0").await.unwrap();
    let s = node
        .wait_state("waiting for the window", WAIT, |s| {
            s.phase == Phase::WaitingForWindow
        })
        .await
        .unwrap();
    assert!(
        s.waiting_for.as_deref().unwrap().contains("window"),
        "{s:?}"
    );
    assert!(node.logind.reboot_calls().is_empty());
    next_reboot(&node, &mut reboots, WAIT).await;
    let now = jiff::Timestamp::now();
    assert!(
        now >= start.round(jiff::Unit::Second).unwrap() - jiff::SignedDuration::from_secs(1),
        "rebooted at {now}, before the window opened at {start}"
    );
}

#[tokio::test]
async fn block_inhibitor_delays_the_reboot_until_released() {
    let node = node("n4", "").await;
    let mut reboots = node.logind.subscribe();
    let guard = node
        .logind
        .hold_block_inhibitor("backup-job", "nightly dump");
    idle(&node).await;
    node.update_engine.set_status(NEED, "3.0").await.unwrap();
    let s = node
        .wait_state("the refusal to be recorded", WAIT, |s| {
            s.last_error
                .as_deref()
                .is_some_and(|e| e.contains("blocked"))
        })
        .await
        .unwrap();
    let err = s.last_error.unwrap();
    assert!(err.contains("backup-job"), "names who blocks: {err}");
    assert!(node.logind.reboot_calls().is_empty());
    assert!(node.logind.refused_calls() >= 1);
    guard.release();
    let call = next_reboot(&node, &mut reboots, WAIT).await;
    assert_eq!(call.flags, 1);
}

#[tokio::test]
async fn restart_in_the_same_boot_is_not_a_reboot_and_a_lost_reboot_is_retried() {
    let mut node = node("n5", "[reboot]\ntimeout = \"3s\"\n").await;
    let mut reboots = node.logind.subscribe();
    idle(&node).await;
    node.update_engine.set_status(NEED, "4.0").await.unwrap();
    next_reboot(&node, &mut reboots, WAIT).await;
    // The reboot "does not happen": rebootd is restarted in the same boot instead. It asks
    // again at once, without waiting out reboot.timeout.
    node.restart_daemon().await.unwrap();
    let call = tokio::time::timeout(Duration::from_secs(2), reboots.recv())
        .await
        .expect("asked again at once, well before reboot.timeout")
        .unwrap();
    assert_eq!(call.method, "RebootWithFlags");
    assert!(
        node.log().contains("had not happened; asking again"),
        "{}",
        node.log()
    );
    // Accepted again but still no reboot: after reboot.timeout it is reported and asked again.
    next_reboot(&node, &mut reboots, WAIT).await;
    let s = node
        .wait_state("the second failure to be recorded", WAIT, |s| {
            s.failed_attempts >= 2
        })
        .await
        .unwrap();
    assert_eq!(s.phase, Phase::Rebooting, "{s:?}");
    assert!(
        node.log().contains("did not happen within"),
        "{}",
        node.log()
    );
    assert_eq!(s.last_reboot, None, "not counted as a reboot");
}

#[tokio::test]
async fn falls_back_to_reboot_when_logind_lacks_reboot_with_flags() {
    let mut opts = NodeOptions::new("n6");
    opts.logind.reboot_with_flags = false;
    let node = Node::start(Path::new(REBOOTD), opts).await.unwrap();
    let mut reboots = node.logind.subscribe();
    idle(&node).await;
    node.update_engine.set_status(NEED, "5.0").await.unwrap();
    let call = next_reboot(&node, &mut reboots, WAIT).await;
    assert_eq!(call.method, "Reboot");
}

#[tokio::test]
async fn unknown_status_is_logged_and_ignored() {
    let node = node("n7", "").await;
    let mut reboots = node.logind.subscribe();
    idle(&node).await;
    node.update_engine
        .set_status("UPDATE_STATUS_SOMETHING_NEW", "6.0")
        .await
        .unwrap();
    node.update_engine.set_status(NEED, "6.0").await.unwrap();
    next_reboot(&node, &mut reboots, WAIT).await;
    // The signals arrive in order, so the unknown one was handled before the reboot.
    let log = node.log();
    assert!(log.contains("unknown status"), "{log}");
    assert!(log.contains("UPDATE_STATUS_SOMETHING_NEW"), "{log}");
}

#[tokio::test]
async fn update_engine_restart_is_followed() {
    let mut node = node("n8", "").await;
    let mut reboots = node.logind.subscribe();
    idle(&node).await;
    let old = std::mem::replace(
        &mut node.update_engine,
        rebootd_lab::fake_update_engine::FakeUpdateEngine::start(node.bus.address())
            .await
            .unwrap(),
    );
    old.stop().await;
    node.update_engine.set_status(NEED, "7.0").await.unwrap();
    next_reboot(&node, &mut reboots, WAIT).await;
}

#[tokio::test]
async fn sentinel_file_triggers_a_reboot() {
    let dir = tempfile::tempdir().unwrap();
    let sentinel = dir.path().join("reboot-required");
    let config = format!("[triggers]\nupdate_engine = false\nsentinel_file = {sentinel:?}\n");
    let node = node("n9", &config).await;
    let mut reboots = node.logind.subscribe();
    idle(&node).await;
    std::fs::write(&sentinel, b"*** System restart required ***\n").unwrap();
    next_reboot(&node, &mut reboots, WAIT).await;
    assert!(node
        .state()
        .unwrap()
        .reason
        .unwrap()
        .contains("sentinel_file"));
}

#[tokio::test]
async fn sentinel_command_triggers_a_reboot() {
    let dir = tempfile::tempdir().unwrap();
    let flag = dir.path().join("needed");
    let config = format!(
        "[triggers]\nupdate_engine = false\nsentinel_command = [\"/usr/bin/test\", \"-e\", {flag:?}]\nsentinel_interval = \"200ms\"\n"
    );
    let node = node("n10", &config).await;
    let mut reboots = node.logind.subscribe();
    idle(&node).await;
    assert!(node.logind.reboot_calls().is_empty());
    std::fs::write(&flag, b"").unwrap();
    next_reboot(&node, &mut reboots, WAIT).await;
}

#[tokio::test]
async fn rebootctl_reboot_and_status_work_with_the_daemon_stopped() {
    let mut node = Node::start(
        Path::new(REBOOTD),
        NodeOptions {
            start_daemon: false,
            ..NodeOptions::new("n11")
        },
    )
    .await
    .unwrap();
    let (code, out, _) = rebootctl(&node, &["status", "--json"]).await;
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["phase"], "idle");
    assert_eq!(v["state_present"], false);
    assert_eq!(v["boot_id"], node.boot_id());

    let (code, out, err) = rebootctl(&node, &["reboot"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("reboot requested"), "{out}");
    let (_, out, _) = rebootctl(&node, &["status"]).await;
    assert!(out.contains("`rebootctl reboot` pending"), "{out}");

    let mut reboots = node.logind.subscribe();
    node.start_daemon().unwrap();
    next_reboot(&node, &mut reboots, WAIT).await;
    assert!(
        !node.store().request_path().exists(),
        "the request is consumed"
    );
    let (_, out, _) = rebootctl(&node, &["status", "--json"]).await;
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["phase"], "rebooting");
    assert!(v["reason"].as_str().unwrap().contains("rebootctl"));
    node.stop_daemon().await;
    let (_, out, _) = rebootctl(&node, &["status"]).await;
    assert!(out.contains("phase:        rebooting"), "{out}");
}

#[tokio::test]
async fn bad_configuration_stops_rebootd_with_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        ("[triggers]\nsentinel_interval = \"5 parsecs\"\n", vec!["sentinel_interval", "\"5 parsecs\""]),
        ("[reboot]\ninhibitors = \"sometimes\"\n", vec!["inhibitors", "sometimes"]),
        ("[bogus]\nx = 1\n", vec!["bogus"]),
        ("[[window]]\ndays = [\"Sat\"]\nstart = \"2am\"\nlength = \"1h\"\n", vec!["start", "\"2am\""]),
        ("[[window]]\ndays = [\"Sat\"]\nstart = \"02:00\"\nlength = \"1h\"\ntime_zone = \"Europe/Nowhere\"\n", vec!["time_zone", "Europe/Nowhere"]),
        ("[lock]\nbackend = \"etcd\"\n", vec!["lock.etcd.endpoints"]),
        ("not toml at all [", vec!["TOML parse error"]),
    ];
    for (i, (text, needles)) in cases.iter().enumerate() {
        let path = dir.path().join(format!("bad-{i}.toml"));
        std::fs::write(&path, text).unwrap();
        let state = dir.path().join(format!("state-{i}"));
        let out = tokio::process::Command::new(REBOOTD)
            .arg("--config")
            .arg(&path)
            .env("STATE_DIRECTORY", &state)
            .env("DBUS_SYSTEM_BUS_ADDRESS", "unix:path=/nonexistent")
            .output()
            .await
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "case {i}: {err}");
        assert!(
            err.contains(&path.display().to_string()) || needles[0].starts_with("lock."),
            "case {i} names the file: {err}"
        );
        for n in needles {
            assert!(err.contains(n), "case {i}: expected {n:?} in: {err}");
        }
        assert!(
            !state.exists(),
            "case {i}: nothing is done before the config is valid"
        );
    }
}

#[tokio::test]
async fn corrupt_state_file_is_refused_and_kept() {
    let mut node = Node::start(
        Path::new(REBOOTD),
        NodeOptions {
            start_daemon: false,
            ..NodeOptions::new("n12")
        },
    )
    .await
    .unwrap();
    let garbage = b"{\"version\": 1, \"phase\": \"rebooting\", trunc";
    std::fs::write(node.store().path(), garbage).unwrap();
    node.start_daemon().unwrap();
    let code = tokio::time::timeout(WAIT, async {
        loop {
            if let Some(code) = node.daemon_exit() {
                return code;
            }
            tokio::task::yield_now().await;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("rebootd exits on a corrupt state file");
    assert_eq!(code, Some(1));
    assert_eq!(std::fs::read(node.store().path()).unwrap(), garbage);
    assert!(node.log().contains("does not parse"), "{}", node.log());
}

async fn scrape(addr: std::net::SocketAddr) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
    conn.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut out = String::new();
    conn.read_to_string(&mut out).await.unwrap();
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    out
}

#[tokio::test]
async fn metrics_move_through_a_reboot() {
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let mut node = node("n13", &format!("[metrics]\nlisten = \"{addr}\"\n")).await;
    let mut reboots = node.logind.subscribe();
    idle(&node).await;
    let m = scrape(addr).await;
    assert!(m.contains("rebootd_reboot_needed 0"), "{m}");
    assert!(m.contains("rebootd_phase{phase=\"idle\"} 1"), "{m}");
    assert!(m.contains("rebootd_reboots_total 0"), "{m}");
    node.update_engine.set_status(NEED, "8.0").await.unwrap();
    next_reboot(&node, &mut reboots, WAIT).await;
    node.wait_state("the accepted reboot to be recorded", WAIT, |s| {
        s.reboot.as_ref().is_some_and(|r| r.called)
    })
    .await
    .unwrap();
    let m = scrape(addr).await;
    assert!(m.contains("rebootd_reboot_needed 1"), "{m}");
    assert!(m.contains("rebootd_phase{phase=\"rebooting\"} 1"), "{m}");
    assert!(m.contains("rebootd_slot_held 1"), "{m}");
    node.reboot().await.unwrap();
    node.wait_ready(WAIT).await.unwrap();
    node.wait_state("idle after the reboot", WAIT, |s| s.phase == Phase::Idle)
        .await
        .unwrap();
    let m = scrape(addr).await;
    assert!(m.contains("rebootd_reboots_total 1"), "{m}");
    assert!(m.contains("rebootd_phase{phase=\"idle\"} 1"), "{m}");
    assert!(
        !m.contains("rebootd_last_reboot_timestamp_seconds 0.000"),
        "{m}"
    );
}

#[tokio::test]
async fn rebootctl_status_watch_follows_changes() {
    use tokio::io::{AsyncBufReadExt, BufReader};
    let node = Node::start(
        Path::new(REBOOTD),
        NodeOptions {
            start_daemon: false,
            ..NodeOptions::new("n14")
        },
    )
    .await
    .unwrap();
    let mut child = node
        .command(Path::new(REBOOTCTL))
        .args(["status", "--watch", "--json"])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut next_doc = async || -> serde_json::Value {
        let mut text = String::new();
        while let Some(line) = lines.next_line().await.unwrap() {
            let end = line == "}";
            text.push_str(&line);
            if end {
                return serde_json::from_str(&text).unwrap();
            }
        }
        panic!("rebootctl status --watch ended: {text}");
    };
    let first = tokio::time::timeout(WAIT, next_doc()).await.unwrap();
    assert_eq!(first["reboot_requested"], false);
    let (code, _, err) = rebootctl(&node, &["reboot"]).await;
    assert_eq!(code, 0, "{err}");
    let changed = tokio::time::timeout(WAIT, async {
        loop {
            let doc = next_doc().await;
            if doc["reboot_requested"] == true {
                return doc;
            }
        }
    })
    .await
    .expect("the watch shows the request");
    assert_eq!(changed["phase"], "idle");
}

#[tokio::test]
async fn log_lines_carry_node_group_holder_and_phase() {
    use tokio::io::{AsyncBufReadExt, BufReader};
    let node = Node::start(
        Path::new(REBOOTD),
        NodeOptions {
            start_daemon: false,
            ..NodeOptions::new("n15")
        },
    )
    .await
    .unwrap();
    let mut child = node
        .command(Path::new(REBOOTD))
        .args(["--log-format", "json"])
        .env("RUST_LOG", "info")
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let line = tokio::time::timeout(WAIT, async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if line.contains("waiting for a trigger") {
                return line;
            }
        }
        panic!("rebootd ended");
    })
    .await
    .unwrap();
    let v: serde_json::Value = serde_json::from_str(&line).unwrap();
    let spans = v["spans"].as_array().unwrap();
    let agent = spans.iter().find(|s| s["name"] == "agent").unwrap();
    assert_eq!(agent["node"], "n15");
    assert_eq!(agent["group"], "default");
    assert_eq!(agent["holder"], node.machine_id.as_str());
    assert_eq!(v["span"]["phase"], "idle", "{v}");
}

#[tokio::test]
async fn fleetlock_backend_takes_turns_through_a_fleetlock_server() {
    let server = rebootd_lab::fleetlock::FleetLockServer::start(1)
        .await
        .unwrap();
    let config = format!(
        "[lock]\nbackend = \"fleetlock\"\n\n[lock.fleetlock]\nurl = \"{}\"\n",
        server.url()
    );
    let mut a = node("fl-a", &config).await;
    let b = node("fl-b", &config).await;
    let (mut ra, mut rb) = (a.logind.subscribe(), b.logind.subscribe());
    idle(&a).await;
    idle(&b).await;
    let guard = a.logind.hold_block_inhibitor("pin", "keeps a holding");
    a.update_engine.set_status(NEED, "1").await.unwrap();
    a.wait_state("a holds", WAIT, |s| s.slot_held)
        .await
        .unwrap();
    assert_eq!(server.holders(), std::slice::from_ref(&a.machine_id));
    b.update_engine.set_status(NEED, "1").await.unwrap();
    b.wait_state("b waits", WAIT, |s| s.phase == Phase::AcquiringSlot)
        .await
        .unwrap();
    guard.release();
    next_reboot(&a, &mut ra, WAIT).await;
    assert!(b.logind.reboot_calls().is_empty(), "b waits while a holds");
    a.reboot().await.unwrap();
    next_reboot(&b, &mut rb, WAIT).await;
    assert_eq!(server.holders(), std::slice::from_ref(&b.machine_id));
    assert!(server.state().peak("default") <= 1);
}

#[tokio::test]
async fn the_watchdog_is_fed_when_systemd_asks_for_it() {
    let node = Node::start(
        Path::new(REBOOTD),
        NodeOptions {
            start_daemon: false,
            ..NodeOptions::new("n16")
        },
    )
    .await
    .unwrap();
    let mut notified = node.notified();
    // As systemd does for WatchdogSec=400ms: rebootd must ping at least every 400 ms.
    let _child = node
        .command(Path::new(REBOOTD))
        .env("WATCHDOG_USEC", "400000")
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    tokio::time::timeout(WAIT, notified.wait_for(|n| n.ready >= 1 && n.watchdog >= 3))
        .await
        .expect("READY=1 and repeated WATCHDOG=1")
        .unwrap();
}
