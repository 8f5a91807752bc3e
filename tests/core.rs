//! End-to-end tests of the core daemon: real rebootd processes on real private dbus-daemons,
//! with the lab's fake update_engine and fake logind.

mod common;

use common::*;
use rebootd::need::TriggerSource;
use rebootd::state::Phase;
use rebootd_lab::node::{Node, NodeOptions};
use std::path::Path;
use std::time::{Duration, Instant};

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
    let reason = s.reason.as_ref().unwrap();
    assert_eq!(reason.source, TriggerSource::UpdateEngine, "{s:?}");
    assert!(reason.detail.contains("1.2.3"), "{s:?}");

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

/// rebootd lists logind's inhibitors itself: a block inhibitor holds off the reboot whoever
/// holds it (the fake, like logind, lets root through root's own), `rebootctl status` names
/// each, and the last one's release, which logind signals, lets the reboot through within
/// WAIT, far sooner than the re-check that backs up the signal (INHIBITOR_RECHECK).
#[tokio::test]
async fn block_inhibitors_of_any_uid_delay_the_reboot_until_released() {
    assert!(WAIT < rebootd::reboot::INHIBITOR_RECHECK);
    let node = node("n4", "").await;
    let mut reboots = node.logind.subscribe();
    let root = node
        .logind
        .hold_block_inhibitor("backup-job", "nightly dump");
    let user = node
        .logind
        .hold_block_inhibitor_as(1000, "user-sync", "syncing photos");
    idle(&node).await;
    node.update_engine.set_status(NEED, "3.0").await.unwrap();
    let s = node
        .wait_state("both inhibitors to be named", WAIT, |s| {
            s.inhibited_by.len() == 2
        })
        .await
        .unwrap();
    assert_eq!(s.phase, Phase::Rebooting);
    assert!(s.slot_held);
    let waiting = s.waiting_for.unwrap();
    assert!(
        waiting.contains("backup-job (nightly dump; uid 0, pid "),
        "{waiting}"
    );
    assert!(
        waiting.contains("user-sync (syncing photos; uid 1000"),
        "{waiting}"
    );
    let (code, out, err) = rebootctl(&node, &["status"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("backup-job (nightly dump"), "{out}");
    assert!(out.contains("user-sync (syncing photos"), "{out}");
    let (_, json, _) = rebootctl(&node, &["status", "--json"]).await;
    let st: serde_json::Value = serde_json::from_str(&json).unwrap();
    let whos: Vec<&str> = st["inhibited_by"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["who"].as_str().unwrap())
        .collect();
    assert_eq!(whos, ["backup-job", "user-sync"], "{json}");
    // rebootd did not ask: nothing for logind to refuse.
    assert!(node.logind.reboot_calls().is_empty());
    assert_eq!(node.logind.refused_calls(), 0);

    // Root's own inhibitor, which logind would let root through, still holds it off.
    drop(user);
    node.wait_state("only root's inhibitor left", WAIT, |s| {
        s.inhibited_by.len() == 1 && s.inhibited_by[0].who == "backup-job"
    })
    .await
    .unwrap();
    assert!(node.logind.reboot_calls().is_empty());
    root.release();
    let call = next_reboot(&node, &mut reboots, WAIT).await;
    assert_eq!(call.flags, 1, "logind keeps the last word");
    assert!(
        node.log().contains("block inhibitors released"),
        "{}",
        node.log()
    );
}

#[tokio::test]
async fn ignored_inhibitors_do_not_delay_the_reboot() {
    let node = node("n4i", "[reboot]\ninhibitors = \"ignore\"\n").await;
    let mut reboots = node.logind.subscribe();
    let _held = node
        .logind
        .hold_block_inhibitor_as(1000, "user-sync", "syncing photos");
    idle(&node).await;
    node.update_engine.set_status(NEED, "3.1").await.unwrap();
    let call = next_reboot(&node, &mut reboots, WAIT).await;
    assert_eq!(call.flags, 0, "root overrides inhibitors");
    assert!(node.state().unwrap().inhibited_by.is_empty());
}

#[tokio::test]
async fn the_configured_reboot_method_reaches_logind_as_its_flag() {
    let node = node("n4k", "[reboot]\nmethod = \"kexec\"\n").await;
    let mut reboots = node.logind.subscribe();
    idle(&node).await;
    node.update_engine.set_status(NEED, "3.2").await.unwrap();
    let call = next_reboot(&node, &mut reboots, WAIT).await;
    assert_eq!(call.method, "RebootWithFlags");
    assert_eq!(
        call.flags,
        1 | 2,
        "SD_LOGIND_REBOOT_VIA_KEXEC beside the inhibitor flag"
    );
    let s = node
        .wait_state("the accepted reboot to be recorded", WAIT, |s| {
            s.reboot.as_ref().is_some_and(|r| r.called)
        })
        .await
        .unwrap();
    let r = s.reboot.unwrap();
    assert_eq!(r.kind, rebootd::reboot_method::Kind::Kexec);
    // No systemd manager on the lab's private bus: no count to prove a soft reboot by.
    assert_eq!(r.soft_reboots, None);
    assert!(
        node.log().contains("asking logind to kexec"),
        "{}",
        node.log()
    );
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

/// logind accepts the reboot but the host goes down before its answer is out (the bus says
/// NoReply): the request stays on record, so the boot that follows is rebootd's reboot, not
/// one "outside rebootd's control".
#[tokio::test]
async fn a_reboot_call_without_an_answer_is_taken_as_accepted() {
    let mut opts = NodeOptions::new("n6b");
    opts.logind.lose_reboot_answers = true;
    let mut node = Node::start(Path::new(REBOOTD), opts).await.unwrap();
    let mut reboots = node.logind.subscribe();
    idle(&node).await;
    node.update_engine.set_status(NEED, "5.1").await.unwrap();
    next_reboot(&node, &mut reboots, WAIT).await;
    let s = node
        .wait_state("the unanswered call on record", WAIT, |s| {
            s.last_error
                .as_deref()
                .is_some_and(|e| e.contains("did not answer"))
        })
        .await
        .unwrap();
    assert_eq!(s.phase, Phase::Rebooting, "{s:?}");
    assert!(s.reboot.as_ref().is_some_and(|r| r.called), "{s:?}");
    assert!(s.logind_asked(), "cancel is refused: {s:?}");
    node.reboot().await.unwrap();
    let s = node
        .wait_state("idle in the new boot", WAIT, |s| s.phase == Phase::Idle)
        .await
        .unwrap();
    assert_eq!(s.reboots, 1, "{s:?}");
    let log = node.log();
    assert!(log.contains("rebooted: boot id"), "{log}");
    assert!(!log.contains("outside rebootd's control"), "{log}");
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
    assert_eq!(
        node.state().unwrap().reason.unwrap().source,
        TriggerSource::SentinelFile
    );
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
    let addr = free_loopback_addr();
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
    let last: f64 = m
        .lines()
        .find_map(|l| l.strip_prefix("rebootd_last_reboot_timestamp_seconds "))
        .unwrap_or_else(|| panic!("{m}"))
        .parse()
        .unwrap();
    assert!(last > 0.0, "{m}");
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
    // The id sent is Zincati's for the machine (tests/fleetlock_id.rs checks it with systemd).
    let id = |m: &str| rebootd::app_id::zincati_node_id(m).unwrap();
    assert_eq!(server.holders(), [id(&a.machine_id)]);
    b.update_engine.set_status(NEED, "1").await.unwrap();
    b.wait_state("b waits", WAIT, |s| s.phase == Phase::AcquiringSlot)
        .await
        .unwrap();
    guard.release();
    next_reboot(&a, &mut ra, WAIT).await;
    assert!(b.logind.reboot_calls().is_empty(), "b waits while a holds");
    a.reboot().await.unwrap();
    next_reboot(&b, &mut rb, WAIT).await;
    assert_eq!(server.holders(), [id(&b.machine_id)]);
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

/// The metrics listener defends the daemon: 8 connections at most (one more is told 503 at
/// once), a connection that sends no request is closed after the read timeout (5 s), and while
/// `accept` fails (here: out of file descriptors, by lowering rebootd's limit with prlimit) it
/// backs off instead of spinning, then serves again.
#[tokio::test]
async fn metrics_listener_caps_connections_times_out_idle_ones_and_backs_off() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = free_loopback_addr();
    let node = node("n17", &format!("[metrics]\nlisten = \"{addr}\"\n")).await;
    idle(&node).await;

    let mut quiet = Vec::new();
    for _ in 0..8 {
        quiet.push(tokio::net::TcpStream::connect(addr).await.unwrap());
    }
    let mut ninth = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut answer = String::new();
    tokio::time::timeout(WAIT, ninth.read_to_string(&mut answer))
        .await
        .expect("the ninth connection is answered at once")
        .unwrap();
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    for mut c in quiet {
        let mut buf = Vec::new();
        let n = tokio::time::timeout(WAIT, c.read_to_end(&mut buf))
            .await
            .expect("an idle connection is closed by the server")
            .unwrap();
        assert_eq!(n, 0, "closed without an answer");
    }
    assert!(scrape(addr)
        .await
        .contains("rebootd_metrics_accept_errors_total 0"));

    // No file descriptor left for rebootd: accept fails until the limit is raised again.
    let pid = node.daemon_pid().unwrap().to_string();
    // The lowest free descriptor number: a limit of that leaves no number a new one could get.
    // The server closes a served connection's descriptor in its own task, a moment after the
    // client saw the end of the answer: read the table once it no longer changes.
    let fds = || -> Vec<usize> {
        let mut v: Vec<usize> = std::fs::read_dir(format!("/proc/{pid}/fd"))
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
            .collect();
        v.sort_unstable();
        v
    };
    let settled = Instant::now() + WAIT;
    let mut used = fds();
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = fds();
        if now == used || Instant::now() > settled {
            break;
        }
        used = now;
    }
    let open = (0..).find(|n| !used.contains(n)).unwrap();
    let prlimit = |soft: &str| {
        let out = std::process::Command::new("prlimit")
            .args(["--pid", &pid, &format!("--nofile={soft}:")])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    prlimit(&open.to_string());
    let client = tokio::spawn(async move {
        let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
        c.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let mut out = String::new();
        c.read_to_string(&mut out).await.unwrap();
        out
    });
    log_line(&node, &["accept failed; backing off"], WAIT).await;
    log_line(&node, &["accept failed again", "failures=6"], WAIT).await;
    prlimit("1024");
    let out = tokio::time::timeout(WAIT, client)
        .await
        .expect("served once the limit is raised")
        .unwrap();
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    log_line(&node, &["accepting connections again"], WAIT).await;
    let m = scrape(addr).await;
    let errors: u64 = m
        .lines()
        .find_map(|l| l.strip_prefix("rebootd_metrics_accept_errors_total "))
        .unwrap()
        .parse()
        .unwrap();
    // A busy loop fails thousands of times in the time six back-offs take.
    assert!((6..50).contains(&errors), "{errors} failed accepts");
}

/// `rebootd --check-config` applies what connecting would, without connecting: TLS rules and
/// files parsed, the password file, kubeconfigs, selectors, the identity files and the sentinel
/// command; each problem named, exit 2. A good TLS setup passes.
#[test]
fn check_config_checks_what_connecting_would() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let out = std::process::Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
        ])
        .args(["-nodes", "-days", "1", "-subj", "/CN=rebootd-test"])
        .arg("-keyout")
        .arg(d.join("key.pem"))
        .arg("-out")
        .arg(d.join("cert.pem"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::write(d.join("garbage.pem"), "not a certificate\n").unwrap();
    std::fs::write(d.join("password"), "s3cret\n").unwrap();
    let p = |name: &str| d.join(name).display().to_string();
    let etcd = |endpoint: &str, extra: &str| {
        format!("[lock]\nbackend = \"etcd\"\n\n[lock.etcd]\nendpoints = [\"{endpoint}\"]\n{extra}")
    };
    let tls = |ca: &str, cert: &str, key: &str| {
        format!(
            "ca_file = {:?}\ncert_file = {:?}\nkey_file = {:?}\n",
            p(ca),
            p(cert),
            p(key)
        )
    };
    let identity = format!(
        "[identity]\nmachine_id_file = {:?}\nboot_id_file = \"/proc/sys/kernel/random/boot_id\"\n",
        "/etc/machine-id"
    );
    let cases: Vec<(String, Vec<String>)> = vec![
        (etcd("https://127.0.0.1:2379", ""), vec!["ca_file".into()]),
        (
            etcd("http://127.0.0.1:2379", &tls("cert.pem", "cert.pem", "key.pem")),
            vec!["plain http".into()],
        ),
        (
            etcd("https://127.0.0.1:2379", &tls("missing.pem", "cert.pem", "key.pem")),
            vec!["lock.etcd.ca_file".into(), p("missing.pem")],
        ),
        (
            etcd("https://127.0.0.1:2379", &tls("garbage.pem", "cert.pem", "key.pem")),
            vec!["lock.etcd.ca_file".into(), "no certificate".into()],
        ),
        (
            etcd("https://127.0.0.1:2379", &tls("cert.pem", "cert.pem", "garbage.pem")),
            vec!["lock.etcd.key_file".into(), p("garbage.pem")],
        ),
        (
            etcd(
                "http://127.0.0.1:2379",
                &format!("username = \"u\"\npassword_file = {:?}\n", p("nope")),
            ),
            vec!["lock.etcd.password_file".into(), p("nope")],
        ),
        (etcd("etcd.example:2379", ""), vec!["lock.etcd.endpoints".into()]),
        (
            format!(
                "[lock]\nbackend = \"fleetlock\"\n\n[lock.fleetlock]\nurl = \"http://fl.example\"\nca_file = {:?}\n",
                p("cert.pem")
            ),
            vec!["plain http".into()],
        ),
        (
            format!("[kubernetes]\nkubeconfig = {:?}\n", p("no-kubeconfig")),
            vec!["[kubernetes]".into(), p("no-kubeconfig")],
        ),
        (
            "[triggers]\nsentinel_command = [\"/nonexistent/reboot-needed\"]\n".into(),
            vec!["sentinel_command".into(), "/nonexistent/reboot-needed".into()],
        ),
        (
            format!("[identity]\nmachine_id_file = {:?}\n", p("no-machine-id")),
            vec!["machine id".into(), p("no-machine-id")],
        ),
        (
            "[[gates.before_reboot]]\ncommand = [\"/nonexistent/gate\"]\n".into(),
            vec!["gates.before_reboot[1].command".into(), "/nonexistent/gate".into()],
        ),
        (
            "[[gates.after_boot]]\ncommand = [\"true\"]\n[[gates.after_boot]]\ncommand = [\"/nonexistent/check\"]\n".into(),
            vec!["gates.after_boot[2].command".into(), "/nonexistent/check".into()],
        ),
    ];
    for (i, (text, needles)) in cases.iter().enumerate() {
        let path = d.join(format!("case-{i}.toml"));
        let text = if text.starts_with("[identity]") {
            text.clone()
        } else {
            format!("{identity}\n{text}")
        };
        std::fs::write(&path, &text).unwrap();
        let out = std::process::Command::new(REBOOTD)
            .arg("--check-config")
            .arg("--config")
            .arg(&path)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "case {i}: {text}\n{err}");
        for n in needles {
            assert!(
                err.contains(n.as_str()),
                "case {i}: expected {n:?} in: {err}"
            );
        }
    }
    let good = d.join("good.toml");
    std::fs::write(
        &good,
        format!(
            "{identity}\n{}username = \"u\"\npassword_file = {:?}\n",
            etcd(
                "https://127.0.0.1:2379",
                &tls("cert.pem", "cert.pem", "key.pem")
            ),
            p("password")
        ),
    )
    .unwrap();
    let out = std::process::Command::new(REBOOTD)
        .arg("--check-config")
        .arg("--config")
        .arg(&good)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Wait until the file at `path` satisfies `pred`, following its directory with inotify (the
/// coordinator file is replaced by a rename); returns its text.
async fn wait_file(node: &Node, path: &Path, what: &str, pred: impl Fn(&str) -> bool) -> String {
    let what = format!("node {}: {what}", node.name);
    wait_text(path, &what, pred, || node.log()).await
}

/// Wait until the file at `path` satisfies `pred` (inotify on its directory: renames, writes,
/// appends); fails with `what` and `log()`.
async fn wait_text(
    path: &Path,
    what: &str,
    pred: impl Fn(&str) -> bool,
    log: impl Fn() -> String,
) -> String {
    use futures_util::StreamExt;
    let inotify = inotify::Inotify::init().expect("inotify");
    inotify
        .watches()
        .add(
            path.parent().unwrap(),
            inotify::WatchMask::MOVED_TO
                | inotify::WatchMask::CLOSE_WRITE
                | inotify::WatchMask::MODIFY,
        )
        .expect("watch the directory");
    let mut events = inotify.into_event_stream(vec![0u8; 1024]).expect("stream");
    let read = || std::fs::read_to_string(path).unwrap_or_default();
    let found = tokio::time::timeout(WAIT, async {
        loop {
            let text = read();
            if pred(&text) {
                return text;
            }
            events.next().await;
        }
    })
    .await;
    found.unwrap_or_else(|_| {
        panic!(
            "{what}: {} says {:?}\n--- log ---\n{}",
            path.display(),
            read(),
            log()
        )
    })
}

/// Whether another process holds a lock on the file (as locksmithd would see it).
fn locked(path: &Path) -> bool {
    let f = std::fs::File::open(path).unwrap();
    matches!(f.try_lock(), Err(std::fs::TryLockError::WouldBlock))
}

/// Flatcar's coordinator file, as locksmithd writes it: rebootd names itself and its strategy,
/// holds the lock while it runs, and STATE follows its phase through a whole reboot.
#[tokio::test]
async fn the_coordinator_file_names_rebootd_and_follows_its_phase() {
    let mut node = node("coord1", "").await;
    let path = node.coordinator_path();
    let mut reboots = node.logind.subscribe();
    idle(&node).await;
    let text = wait_file(&node, &path, "running", |t| t.contains("STATE=running")).await;
    assert_eq!(
        text,
        "NAME=rebootd\nSTRATEGY=reboot\nSTATE=running\nPHASE=idle\n"
    );
    assert!(
        locked(&path),
        "rebootd holds the lock on {}",
        path.display()
    );
    // What Flatcar's login banner does with it: a lock it cannot take means a coordinator runs;
    // then it sources the file and reads NAME and STATE.
    let banner = std::process::Command::new("bash")
        .arg("-c")
        .arg(
            r#"flock --nonblock --exclusive "$1" true && echo nobody; . "$1"; echo "$NAME $STATE""#,
        )
        .arg("banner")
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&banner.stdout), "rebootd running\n");
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o644, "readable by every user, as locksmithd's");

    node.update_engine.set_status(NEED, "3.0").await.unwrap();
    next_reboot(&node, &mut reboots, WAIT).await;
    let text = wait_file(&node, &path, "rebooting", |t| t.contains("STATE=rebooting")).await;
    assert!(text.contains("PHASE=rebooting"), "{text}");
    assert!(locked(&path));

    node.reboot().await.unwrap();
    let text = wait_file(&node, &path, "idle after the reboot", |t| {
        t.contains("PHASE=idle")
    })
    .await;
    assert!(text.contains("STATE=running"), "{text}");
    assert!(locked(&path), "the new boot's rebootd holds the lock");
}

/// A coordinator file another coordinator holds (a locksmithd left running) is left alone, the
/// error names the file and that coordinator, and rebootd runs on.
#[tokio::test]
async fn a_coordinator_file_held_by_locksmithd_is_reported_and_rebootd_runs_on() {
    let mut node = Node::start(
        Path::new(REBOOTD),
        NodeOptions {
            start_daemon: false,
            ..NodeOptions::new("coord2")
        },
    )
    .await
    .unwrap();
    let path = node.coordinator_path();
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let theirs = "NAME=locksmithd\nSTRATEGY=etcd-lock\nSTATE=running";
    std::fs::write(&path, theirs).unwrap();
    let held = std::fs::File::open(&path).unwrap();
    held.try_lock().unwrap();
    node.start_daemon().unwrap();
    idle(&node).await;
    let line = log_line(&node, &["another update coordinator holds the lock"], WAIT).await;
    assert!(line.contains("NAME=locksmithd"), "{line}");
    assert!(line.contains(&path.display().to_string()), "{line}");
    assert_eq!(std::fs::read_to_string(&path).unwrap(), theirs);
    // It still does its job.
    let mut reboots = node.logind.subscribe();
    node.update_engine.set_status(NEED, "3.1").await.unwrap();
    next_reboot(&node, &mut reboots, WAIT).await;
    assert_eq!(std::fs::read_to_string(&path).unwrap(), theirs);
}

/// The real locksmithd and rebootd on one host's coordinator file: while rebootd runs, a
/// locksmithd that was not masked cannot become the update coordinator and exits; once rebootd
/// is gone locksmithd takes the file, and a rebootd started then names it in an error and runs
/// on.
#[tokio::test]
async fn the_real_locksmithd_and_rebootd_exclude_each_other_from_the_coordinator_file() {
    use rebootd_lab::etcd::{EtcdOptions, EtcdServer, EtcdVersion};
    use rebootd_lab::locksmith::{LocksmithEtcd, LocksmithNode};
    let v = *EtcdVersion::available().first().expect("an etcd");
    let etcd = EtcdServer::start_with(v, EtcdOptions::v2())
        .await
        .expect("start etcd");
    let mut node = node("coord3", "").await;
    let path = node.coordinator_path();
    idle(&node).await;
    wait_file(&node, &path, "running", |t| t.contains("STATE=running")).await;

    let mut locksmithd = LocksmithNode::start_sharing_update_engine(
        "coord3-locksmithd",
        LocksmithEtcd::new(&etcd.endpoint(), ""),
        path.parent().unwrap(),
    )
    .await
    .expect("start locksmithd");
    wait_text(
        &locksmithd.log_path(),
        "locksmithd refuses to run beside rebootd",
        |t| t.contains("unable to become 'update coordinator'"),
        || locksmithd.log(),
    )
    .await;
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.starts_with("NAME=rebootd\n"), "{text}");
    assert!(locked(&path));

    // rebootd stops: locksmithd can take over the file.
    node.stop_daemon().await;
    assert!(!locked(&path), "the lock goes with rebootd");
    locksmithd.start_daemon().unwrap();
    wait_text(
        &path,
        "locksmithd takes the coordinator file",
        |t| t.contains("NAME=locksmithd") && t.contains("STATE=running"),
        || locksmithd.log(),
    )
    .await;
    // And a rebootd started now leaves it alone, says who holds it, and runs on.
    node.start_daemon().unwrap();
    node.wait_ready(WAIT).await.unwrap();
    let line = log_line(&node, &["another update coordinator holds the lock"], WAIT).await;
    assert!(line.contains("NAME=locksmithd"), "{line}");
    assert!(std::fs::read_to_string(&path)
        .unwrap()
        .contains("NAME=locksmithd"));
    locksmithd.kill_daemon().await;
}
