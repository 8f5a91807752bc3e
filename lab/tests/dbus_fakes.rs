//! Checks the lab's D-Bus pieces (PrivateBus, FakeUpdateEngine, FakeLogind) against real
//! clients: busctl, dbus-send, dbus-monitor, systemd-inhibit, and a separate zbus connection.

use std::pin::Pin;
use std::process::{Output, Stdio};
use std::time::Duration;

use rebootd_lab::dbus::PrivateBus;
use rebootd_lab::fake_logind::{self, FakeLogind, FakeLogindOptions, RebootCall};
use rebootd_lab::fake_update_engine::{self, FakeUpdateEngine};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;
use zbus::export::futures_core::Stream;

/// Upper bound for anything a test waits for.
const WAIT: Duration = Duration::from_secs(10);

async fn bounded<F: std::future::Future>(what: &str, fut: F) -> F::Output {
    tokio::time::timeout(WAIT, fut)
        .await
        .unwrap_or_else(|_| panic!("timed out after {WAIT:?} waiting for {what}"))
}

async fn next<S: Stream + Unpin>(s: &mut S) -> Option<S::Item> {
    std::future::poll_fn(|cx| Pin::new(&mut *s).poll_next(cx)).await
}

/// Runs a real client to completion (bounded) and returns its output.
async fn run(program: &str, args: &[&str]) -> Output {
    let child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    bounded(&format!("{program} {args:?}"), child)
        .await
        .unwrap_or_else(|e| panic!("running {program}: {e}"))
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Runs a client that must succeed and returns its stdout.
async fn run_ok(program: &str, args: &[&str]) -> String {
    let out = run(program, args).await;
    assert!(
        out.status.success(),
        "{program} {args:?} failed ({}): {}",
        out.status,
        text(&out.stderr)
    );
    text(&out.stdout)
}

/// Runs a client that must fail and returns its stderr.
async fn run_err(program: &str, args: &[&str]) -> String {
    let out = run(program, args).await;
    assert!(
        !out.status.success(),
        "{program} {args:?} unexpectedly succeeded: {}",
        text(&out.stdout)
    );
    text(&out.stderr)
}

/// `busctl --json=short call ...` parsed: `{"type": signature, "data": [...]}`.
async fn busctl_call(addr: &str, dest: &str, path: &str, iface: &str, method: &str) -> Value {
    let address = format!("--address={addr}");
    let out = run_ok(
        "busctl",
        &[&address, "--json=short", "call", dest, path, iface, method],
    )
    .await;
    serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("busctl printed {out:?}: {e}"))
}

async fn get_status(addr: &str) -> Value {
    busctl_call(
        addr,
        fake_update_engine::BUS_NAME,
        fake_update_engine::OBJECT_PATH,
        fake_update_engine::INTERFACE,
        "GetStatus",
    )
    .await
}

async fn list_inhibitors(addr: &str) -> Value {
    busctl_call(
        addr,
        fake_logind::BUS_NAME,
        fake_logind::OBJECT_PATH,
        fake_logind::INTERFACE,
        "ListInhibitors",
    )
    .await
}

/// `dbus-send ... org.freedesktop.login1.Manager.<method> <args>`.
async fn logind_send(addr: &str, method: &str, args: &[&str]) -> Output {
    // dbus-send's --address is --peer (no Hello): on a bus it must be --bus.
    let address = format!("--bus={addr}");
    let member = format!("{}.{method}", fake_logind::INTERFACE);
    let mut argv = vec![
        address.as_str(),
        "--print-reply",
        "--dest=org.freedesktop.login1",
        fake_logind::OBJECT_PATH,
        member.as_str(),
    ];
    argv.extend_from_slice(args);
    run("dbus-send", &argv).await
}

async fn next_reboot(rx: &mut tokio::sync::broadcast::Receiver<RebootCall>) -> RebootCall {
    bounded("a reboot call", rx.recv())
        .await
        .expect("reboot broadcast closed")
}

fn my_uid() -> u32 {
    rustix::process::getuid().as_raw()
}

// ---- PrivateBus ----------------------------------------------------------------------------

#[tokio::test]
async fn private_bus_answers_real_clients_and_dies_on_drop() {
    let bus = PrivateBus::start().await.expect("start bus");
    let addr = bus.address().to_owned();
    assert!(addr.starts_with("unix:path="), "address {addr}");

    // Any name may be owned (no policy file needed) and busctl sees it.
    let conn = bus.connect().await.expect("connect");
    conn.request_name("org.example.Anything")
        .await
        .expect("own an arbitrary name");
    let names = run_ok(
        "busctl",
        &[&format!("--address={addr}"), "list", "--acquired"],
    )
    .await;
    assert!(
        names.contains("org.example.Anything"),
        "busctl list: {names}"
    );
    drop(conn);

    let socket = bus.dir().join("bus");
    assert!(socket.exists());
    drop(bus);
    let err = run_err("busctl", &[&format!("--address={addr}"), "list"]).await;
    assert!(!err.is_empty());
    assert!(!socket.exists(), "temp dir removed with the bus");
}

// ---- update_engine -------------------------------------------------------------------------

#[tokio::test]
async fn get_status_via_busctl_follows_set_status() {
    let bus = PrivateBus::start().await.expect("start bus");
    let ue = FakeUpdateEngine::start(bus.address())
        .await
        .expect("start update_engine");

    let v = get_status(bus.address()).await;
    assert_eq!(v["type"], "xdssx", "{v}");
    assert_eq!(v["data"][2], "UPDATE_STATUS_IDLE", "{v}");

    ue.set_status(
        fake_update_engine::UPDATE_STATUS_UPDATED_NEED_REBOOT,
        "4152.2.1",
    )
    .await
    .expect("set_status");
    let v = get_status(bus.address()).await;
    assert_eq!(v["type"], "xdssx", "{v}");
    let data = v["data"].as_array().expect("data array");
    assert_eq!(data.len(), 5, "{v}");
    assert!(data[0].is_i64(), "{v}");
    assert_eq!(data[1].as_f64(), Some(1.0), "{v}");
    assert_eq!(data[2], "UPDATE_STATUS_UPDATED_NEED_REBOOT", "{v}");
    assert_eq!(data[3], "4152.2.1", "{v}");
    assert!(data[4].is_i64(), "{v}");

    // ResetStatus from a real client puts it back to idle.
    run_ok(
        "busctl",
        &[
            &format!("--address={}", bus.address()),
            "call",
            fake_update_engine::BUS_NAME,
            fake_update_engine::OBJECT_PATH,
            fake_update_engine::INTERFACE,
            "ResetStatus",
        ],
    )
    .await;
    let v = get_status(bus.address()).await;
    assert_eq!(v["data"][2], "UPDATE_STATUS_IDLE", "{v}");

    run_ok(
        "busctl",
        &[
            &format!("--address={}", bus.address()),
            "call",
            fake_update_engine::BUS_NAME,
            fake_update_engine::OBJECT_PATH,
            fake_update_engine::INTERFACE,
            "AttemptUpdate",
        ],
    )
    .await;
    assert_eq!(ue.attempt_update_calls(), 1);
}

#[tokio::test]
async fn dbus_monitor_sees_status_update_signal() {
    let bus = PrivateBus::start().await.expect("start bus");
    let ue = FakeUpdateEngine::start(bus.address())
        .await
        .expect("start update_engine");

    let mut monitor = Command::new("dbus-monitor")
        .args([
            "--address",
            bus.address(),
            "type='signal',interface='com.coreos.update1.Manager'",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn dbus-monitor");
    let mut lines = BufReader::new(monitor.stdout.take().expect("stdout")).lines();

    // After BecomeMonitor the bus tells the monitor it lost its unique name: from then on it
    // sees everything.
    bounded("dbus-monitor to become a monitor", async {
        while let Some(line) = lines.next_line().await.expect("read dbus-monitor") {
            if line.contains("member=NameLost") {
                return;
            }
        }
        panic!("dbus-monitor exited before becoming a monitor");
    })
    .await;

    ue.set_status(
        fake_update_engine::UPDATE_STATUS_UPDATED_NEED_REBOOT,
        "4152.2.1",
    )
    .await
    .expect("set_status");

    let sender = ue.unique_name().expect("unique name");
    let args = bounded("the StatusUpdate signal in dbus-monitor", async {
        while let Some(line) = lines.next_line().await.expect("read dbus-monitor") {
            if line.contains("member=StatusUpdate") {
                assert!(line.contains(&format!("sender={sender}")), "{line}");
                assert!(line.contains("path=/com/coreos/update1"), "{line}");
                let mut args = Vec::new();
                for _ in 0..5 {
                    let arg = lines.next_line().await.expect("read").expect("argument");
                    args.push(arg.trim().to_owned());
                }
                return args;
            }
        }
        panic!("dbus-monitor exited before the signal");
    })
    .await;
    // dbus-monitor prints each argument with its type: the signature is xdssx.
    let types: Vec<&str> = args
        .iter()
        .map(|a| a.split_whitespace().next().unwrap_or(""))
        .collect();
    assert_eq!(
        types,
        ["int64", "double", "string", "string", "int64"],
        "{args:?}"
    );
    assert_eq!(args[2], "string \"UPDATE_STATUS_UPDATED_NEED_REBOOT\"");
    assert_eq!(args[3], "string \"4152.2.1\"");
}

#[tokio::test]
async fn zbus_match_rule_on_well_known_name_receives_signal() {
    let bus = PrivateBus::start().await.expect("start bus");
    let ue = FakeUpdateEngine::start(bus.address())
        .await
        .expect("start update_engine");
    let client = bus.connect().await.expect("client connection");
    let rule = zbus::MatchRule::builder()
        .msg_type(zbus::message::Type::Signal)
        .sender(fake_update_engine::BUS_NAME)
        .expect("sender")
        .path(fake_update_engine::OBJECT_PATH)
        .expect("path")
        .interface(fake_update_engine::INTERFACE)
        .expect("interface")
        .member("StatusUpdate")
        .expect("member")
        .build();
    // for_match_rule returns once AddMatch is done, so nothing emitted after it is missed.
    let mut stream = zbus::MessageStream::for_match_rule(rule, &client, None)
        .await
        .expect("subscribe");

    ue.set_status("UPDATE_STATUS_DOWNLOADING", "4152.2.1")
        .await
        .expect("set_status");
    let msg = bounded("StatusUpdate via zbus", next(&mut stream))
        .await
        .expect("stream ended")
        .expect("message");
    let body = msg.body();
    // zbus shows a multi-argument body as one structure; the arguments are xdssx.
    assert_eq!(body.signature().to_string_no_parens(), "xdssx");
    let (_, _, op, version, _): (i64, f64, String, String, i64) =
        body.deserialize().expect("deserialize");
    assert_eq!(op, "UPDATE_STATUS_DOWNLOADING");
    assert_eq!(version, "4152.2.1");
}

#[tokio::test]
async fn update_engine_goes_away_and_comes_back() {
    let bus = PrivateBus::start().await.expect("start bus");
    let client = bus.connect().await.expect("client connection");
    let dbus = zbus::fdo::DBusProxy::new(&client)
        .await
        .expect("DBus proxy");
    let mut owners = dbus
        .receive_name_owner_changed_with_args(&[(0, fake_update_engine::BUS_NAME)])
        .await
        .expect("subscribe NameOwnerChanged");

    let ue = FakeUpdateEngine::start(bus.address()).await.expect("start");
    let first = ue.unique_name().expect("unique name");
    let change = bounded("update_engine to appear", next(&mut owners))
        .await
        .expect("stream");
    let args = change.args().expect("args");
    assert_eq!(
        args.new_owner().as_ref().map(|n| n.to_string()),
        Some(first)
    );

    ue.stop().await;
    let change = bounded("update_engine to go away", next(&mut owners))
        .await
        .expect("stream");
    assert!(change.args().expect("args").new_owner().is_none());
    let err = run_err(
        "busctl",
        &[
            &format!("--address={}", bus.address()),
            "call",
            fake_update_engine::BUS_NAME,
            fake_update_engine::OBJECT_PATH,
            fake_update_engine::INTERFACE,
            "GetStatus",
        ],
    )
    .await;
    assert!(!err.is_empty());

    let ue = FakeUpdateEngine::start(bus.address())
        .await
        .expect("restart");
    let change = bounded("update_engine to come back", next(&mut owners))
        .await
        .expect("stream");
    assert!(change.args().expect("args").new_owner().is_some());
    assert_eq!(
        get_status(bus.address()).await["data"][2],
        "UPDATE_STATUS_IDLE"
    );
    drop(ue);
}

// ---- logind --------------------------------------------------------------------------------

#[tokio::test]
async fn reboot_with_flags_via_dbus_send_is_recorded() {
    let bus = PrivateBus::start().await.expect("start bus");
    let logind = FakeLogind::start(bus.address(), FakeLogindOptions::default())
        .await
        .expect("start logind");
    let mut rx = logind.subscribe();

    let out = logind_send(bus.address(), "RebootWithFlags", &["uint64:1"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let expected = RebootCall {
        method: "RebootWithFlags".into(),
        flags: 1,
    };
    assert_eq!(next_reboot(&mut rx).await, expected);
    assert_eq!(logind.reboot_calls(), vec![expected]);
    assert_eq!(logind.refused_calls(), 0);

    // The legacy call is there too.
    let out = logind_send(bus.address(), "Reboot", &["boolean:false"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        next_reboot(&mut rx).await,
        RebootCall {
            method: "Reboot".into(),
            flags: 0
        }
    );
    assert_eq!(logind.reboot_calls().len(), 2);
}

/// logind's rule (systemd's verify_shutdown_creds; the same seen with systemd 252 in
/// tests/nspawn.rs): the caller's own uid's block inhibitors do not count; another uid's refuse
/// root's RebootWithFlags(1) with AccessDenied, and root without the flag goes through.
#[tokio::test]
async fn block_inhibitors_follow_loginds_uid_rule() {
    assert_eq!(my_uid(), 0, "these checks call as root");
    let bus = PrivateBus::start().await.expect("start bus");
    let logind = FakeLogind::start(bus.address(), FakeLogindOptions::default())
        .await
        .expect("start logind");

    // Root's own block inhibitor: root's RebootWithFlags(1) goes through it.
    let own = logind.hold_block_inhibitor("root-backup", "copying the database");
    let out = logind_send(bus.address(), "RebootWithFlags", &["uint64:1"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(logind.refused_calls(), 0);
    drop(own);

    // Another user's: refused, as logind refuses root.
    let guard = logind.hold_block_inhibitor_as(1000, "lab-backup", "copying the database");
    let out = logind_send(bus.address(), "RebootWithFlags", &["uint64:1"]).await;
    assert!(
        !out.status.success(),
        "RebootWithFlags(1) passed an inhibitor"
    );
    let err = text(&out.stderr);
    assert!(err.contains(fake_logind::ERROR_ACCESS_DENIED), "{err}");
    assert!(err.contains(fake_logind::ROOT_BLOCKED_MESSAGE), "{err}");
    assert_eq!(logind.refused_calls(), 1);
    assert_eq!(logind.reboot_calls().len(), 1);

    // Without flag 1 root overrides the block inhibitor, and so does the legacy Reboot.
    let out = logind_send(bus.address(), "RebootWithFlags", &["uint64:0"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = logind_send(bus.address(), "Reboot", &["boolean:false"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(logind.reboot_calls().len(), 3);

    guard.release();
    let out = logind_send(bus.address(), "RebootWithFlags", &["uint64:1"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        logind.reboot_calls().last(),
        Some(&RebootCall {
            method: "RebootWithFlags".into(),
            flags: 1
        })
    );
    assert_eq!(logind.refused_calls(), 1);
}

/// logind signals every inhibitor taken or released as a change of `BlockInhibited`; rebootd
/// waits on that signal.
#[tokio::test]
async fn inhibitors_taken_and_released_are_signalled() {
    let bus = PrivateBus::start().await.expect("start bus");
    let logind = FakeLogind::start(bus.address(), FakeLogindOptions::default())
        .await
        .expect("start logind");
    let client = bus.connect().await.expect("client connection");
    let rule = zbus::MatchRule::builder()
        .msg_type(zbus::message::Type::Signal)
        .sender(fake_logind::BUS_NAME)
        .unwrap()
        .interface("org.freedesktop.DBus.Properties")
        .unwrap()
        .member("PropertiesChanged")
        .unwrap()
        .build();
    let mut changes = zbus::MessageStream::for_match_rule(rule, &client, None)
        .await
        .expect("subscribe");
    let guard = logind.hold_block_inhibitor("lab-test", "testing");
    assert_eq!(block_inhibited(&mut changes).await, "shutdown");
    drop(guard);
    assert_eq!(block_inhibited(&mut changes).await, "");
}

/// The `BlockInhibited` value of the next `PropertiesChanged`.
async fn block_inhibited(changes: &mut zbus::MessageStream) -> String {
    use futures_util::StreamExt;
    let msg = bounded("PropertiesChanged", changes.next())
        .await
        .expect("a signal")
        .expect("a message");
    let (iface, changed, _): (
        String,
        std::collections::HashMap<String, zbus::zvariant::OwnedValue>,
        Vec<String>,
    ) = msg.body().deserialize().expect("PropertiesChanged body");
    assert_eq!(iface, fake_logind::INTERFACE);
    String::try_from(changed["BlockInhibited"].clone()).expect("a string")
}

#[tokio::test]
async fn unknown_flag_bits_are_invalid_args() {
    let bus = PrivateBus::start().await.expect("start bus");
    let logind = FakeLogind::start(bus.address(), FakeLogindOptions::default())
        .await
        .expect("start logind");
    let flags = format!("uint64:{}", 1u64 << 40 | 1);
    let out = logind_send(bus.address(), "RebootWithFlags", &[&flags]).await;
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("org.freedesktop.DBus.Error.InvalidArgs"),
        "{err}"
    );
    assert!(logind.reboot_calls().is_empty());
    assert_eq!(logind.refused_calls(), 0);
}

#[tokio::test]
async fn legacy_logind_has_no_reboot_with_flags() {
    let bus = PrivateBus::start().await.expect("start bus");
    let logind = FakeLogind::start(
        bus.address(),
        FakeLogindOptions {
            reboot_with_flags: false,
            ..FakeLogindOptions::default()
        },
    )
    .await
    .expect("start logind");

    let out = logind_send(bus.address(), "RebootWithFlags", &["uint64:1"]).await;
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("org.freedesktop.DBus.Error.UnknownMethod"),
        "{err}"
    );

    let intro = run_ok(
        "busctl",
        &[
            &format!("--address={}", bus.address()),
            "introspect",
            fake_logind::BUS_NAME,
            fake_logind::OBJECT_PATH,
            fake_logind::INTERFACE,
        ],
    )
    .await;
    assert!(!intro.contains("RebootWithFlags"), "{intro}");
    assert!(intro.contains(".Reboot "), "{intro}");

    // The fallback a caller takes works.
    let out = logind_send(bus.address(), "Reboot", &["boolean:false"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        logind.reboot_calls(),
        vec![RebootCall {
            method: "Reboot".into(),
            flags: 0
        }]
    );
}

/// A logind that goes down before its answer is out: the real client gets the bus's NoReply,
/// and the call is on record as accepted.
#[tokio::test]
async fn a_lost_reboot_answer_reaches_dbus_send_as_no_reply() {
    let bus = PrivateBus::start().await.expect("start bus");
    let logind = FakeLogind::start(
        bus.address(),
        FakeLogindOptions {
            lose_reboot_answers: true,
            ..FakeLogindOptions::default()
        },
    )
    .await
    .expect("start logind");
    let mut calls = logind.subscribe();
    let out = logind_send(bus.address(), "RebootWithFlags", &["uint64:1"]).await;
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains("org.freedesktop.DBus.Error.NoReply"), "{err}");
    assert_eq!(next_reboot(&mut calls).await.method, "RebootWithFlags");
}

#[tokio::test]
async fn busctl_introspect_lists_the_methods() {
    let bus = PrivateBus::start().await.expect("start bus");
    let _logind = FakeLogind::start(bus.address(), FakeLogindOptions::default())
        .await
        .expect("start logind");
    let intro = run_ok(
        "busctl",
        &[
            &format!("--address={}", bus.address()),
            "introspect",
            fake_logind::BUS_NAME,
            fake_logind::OBJECT_PATH,
            fake_logind::INTERFACE,
        ],
    )
    .await;
    // busctl prints: NAME TYPE SIGNATURE RESULT/VALUE FLAGS
    let row = |name: &str| -> Vec<String> {
        intro
            .lines()
            .find(|l| l.split_whitespace().next() == Some(name))
            .unwrap_or_else(|| panic!("{name} missing from:\n{intro}"))
            .split_whitespace()
            .map(str::to_owned)
            .collect()
    };
    assert_eq!(row(".RebootWithFlags")[1..4], ["method", "t", "-"]);
    assert_eq!(row(".Reboot")[1..4], ["method", "b", "-"]);
    assert_eq!(row(".Inhibit")[1..4], ["method", "ssss", "h"]);
    assert_eq!(row(".ListInhibitors")[1..4], ["method", "-", "a(ssssuu)"]);
    // logind's signatures (systemd 252's introspection).
    assert_eq!(row(".ListSessions")[1..4], ["method", "-", "a(susso)"]);
    assert_eq!(row(".ScheduleShutdown")[1..4], ["method", "st", "-"]);
    assert_eq!(row(".CancelScheduledShutdown")[1..4], ["method", "-", "b"]);

    let bus_addr = format!("--address={}", bus.address());
    let ue = FakeUpdateEngine::start(bus.address())
        .await
        .expect("start ue");
    let intro = run_ok(
        "busctl",
        &[
            &bus_addr,
            "introspect",
            fake_update_engine::BUS_NAME,
            fake_update_engine::OBJECT_PATH,
            fake_update_engine::INTERFACE,
        ],
    )
    .await;
    for (name, sig, result) in [
        (".GetStatus", "method", "xdssx"),
        (".AttemptUpdate", "method", "-"),
        (".ResetStatus", "method", "-"),
        (".StatusUpdate", "signal", "xdssx"),
    ] {
        let line = intro
            .lines()
            .find(|l| l.split_whitespace().next() == Some(name))
            .unwrap_or_else(|| panic!("{name} missing from:\n{intro}"));
        let cols: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(cols[1], sig, "{line}");
        let shown = if sig == "signal" { cols[2] } else { cols[3] };
        assert_eq!(shown, result, "{line}");
    }
    drop(ue);
}

#[tokio::test]
async fn list_inhibitors_via_busctl_shows_held_inhibitor() {
    let bus = PrivateBus::start().await.expect("start bus");
    let logind = FakeLogind::start(bus.address(), FakeLogindOptions::default())
        .await
        .expect("start logind");
    assert_eq!(
        list_inhibitors(bus.address()).await,
        json!({"type": "a(ssssuu)", "data": [[]]})
    );

    let guard = logind.hold_block_inhibitor("lab-test", "testing");
    let v = list_inhibitors(bus.address()).await;
    assert_eq!(v["type"], "a(ssssuu)");
    assert_eq!(
        v["data"][0],
        json!([[
            "shutdown",
            "lab-test",
            "testing",
            "block",
            my_uid(),
            std::process::id()
        ]])
    );

    drop(guard);
    assert_eq!(list_inhibitors(bus.address()).await["data"][0], json!([]));
}

#[tokio::test]
async fn inhibit_fd_from_zbus_lasts_until_closed() {
    let bus = PrivateBus::start().await.expect("start bus");
    let logind = FakeLogind::start(bus.address(), FakeLogindOptions::default())
        .await
        .expect("start logind");
    let mut watch = logind.watch_inhibitors();
    let client = bus.connect().await.expect("client connection");

    let reply = client
        .call_method(
            Some(fake_logind::BUS_NAME),
            fake_logind::OBJECT_PATH,
            Some(fake_logind::INTERFACE),
            "Inhibit",
            &("shutdown", "zbus-client", "fd test", "block"),
        )
        .await
        .expect("Inhibit");
    assert_eq!(reply.body().signature().to_string_no_parens(), "h");
    let fd: zbus::zvariant::OwnedFd = reply.body().deserialize().expect("fd");
    drop(reply);

    // A real client sees it, with this process's uid and pid (looked up from the bus).
    let v = list_inhibitors(bus.address()).await;
    assert_eq!(
        v["data"][0],
        json!([[
            "shutdown",
            "zbus-client",
            "fd test",
            "block",
            my_uid(),
            std::process::id()
        ]])
    );
    // Held by this uid, it does not block this uid's RebootWithFlags(1) (logind's rule).
    client
        .call_method(
            Some(fake_logind::BUS_NAME),
            fake_logind::OBJECT_PATH,
            Some(fake_logind::INTERFACE),
            "RebootWithFlags",
            &(1u64,),
        )
        .await
        .expect("the caller's own inhibitor does not count");

    // Closing our end of the pipe is what releases it.
    drop(fd);
    bounded(
        "the inhibitor to go once its fd is closed",
        watch.wait_for(|v| v.is_empty()),
    )
    .await
    .expect("watch");
    assert_eq!(list_inhibitors(bus.address()).await["data"][0], json!([]));
    client
        .call_method(
            Some(fake_logind::BUS_NAME),
            fake_logind::OBJECT_PATH,
            Some(fake_logind::INTERFACE),
            "RebootWithFlags",
            &(1u64,),
        )
        .await
        .expect("accepted");
    assert_eq!(logind.reboot_calls().len(), 2);
}

#[tokio::test]
async fn systemd_inhibit_holds_until_its_command_exits() {
    let bus = PrivateBus::start().await.expect("start bus");
    let logind = FakeLogind::start(bus.address(), FakeLogindOptions::default())
        .await
        .expect("start logind");
    let mut watch = logind.watch_inhibitors();

    // systemd-inhibit (sd-bus) takes the lock on the "system bus" named by the environment,
    // keeps the fd while its command runs and closes it when the command exits. The command
    // waits for a line on stdin, so the test decides when it ends.
    let mut child = Command::new("systemd-inhibit")
        .env("DBUS_SYSTEM_BUS_ADDRESS", bus.address())
        .args([
            "--what=shutdown",
            "--who=systemd-inhibit-test",
            "--why=real client",
            "--mode=block",
            "head",
            "-n1",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn systemd-inhibit");

    let held = bounded(
        "systemd-inhibit's inhibitor",
        watch.wait_for(|v| !v.is_empty()),
    )
    .await
    .expect("watch")
    .clone();
    assert_eq!(held.len(), 1);
    assert_eq!(held[0].who, "systemd-inhibit-test");
    assert_eq!(held[0].mode, "block");
    let child_pid = child.id().expect("pid");
    assert_eq!(held[0].pid, child_pid, "pid of the real caller");

    // It shows in ListInhibitors (what rebootd reads); held by root, it does not refuse root's
    // RebootWithFlags(1) (logind's uid rule).
    let v = list_inhibitors(bus.address()).await;
    assert_eq!(v["data"][0][0][1], "systemd-inhibit-test", "{v}");
    let out = logind_send(bus.address(), "RebootWithFlags", &["uint64:1"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));

    // End the command: systemd-inhibit exits and its fd closes.
    drop(child.stdin.take());
    let status = bounded("systemd-inhibit to exit", child.wait())
        .await
        .expect("wait");
    assert!(status.success(), "systemd-inhibit: {status}");
    bounded("the inhibitor to go", watch.wait_for(|v| v.is_empty()))
        .await
        .expect("watch");
    let out = logind_send(bus.address(), "RebootWithFlags", &["uint64:1"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
}

/// Sessions and scheduled shutdowns as busctl sees them: a session's `TTY`, `Class` and `Seat`
/// have logind's types, `ScheduleShutdown` records what it was asked and refuses an unknown
/// type, `CancelScheduledShutdown` says whether there was one.
#[tokio::test]
async fn busctl_reads_sessions_and_schedules_shutdowns() {
    use rebootd_lab::fake_logind::FakeSession;
    let bus = PrivateBus::start().await.expect("start bus");
    let logind = FakeLogind::start(bus.address(), FakeLogindOptions::default())
        .await
        .expect("start logind");
    logind
        .add_session(FakeSession {
            seat: "seat0".into(),
            ..FakeSession::on_tty("7", "alice", "tty1")
        })
        .await
        .unwrap();
    let addr = format!("--address={}", bus.address());
    let manager = |method: &str, args: &[&str]| -> Vec<String> {
        let mut v: Vec<String> = [
            addr.as_str(),
            "call",
            fake_logind::BUS_NAME,
            fake_logind::OBJECT_PATH,
            fake_logind::INTERFACE,
            method,
        ]
        .map(str::to_owned)
        .to_vec();
        v.extend(args.iter().map(|a| a.to_string()));
        v
    };
    fn as_strs(v: &[String]) -> Vec<&str> {
        v.iter().map(String::as_str).collect()
    }
    let listed = run_ok("busctl", &as_strs(&manager("ListSessions", &[]))).await;
    assert_eq!(
        listed.trim(),
        "a(susso) 1 \"7\" 1000 \"alice\" \"seat0\" \"/org/freedesktop/login1/session/7\""
    );
    let prop = |name: &'static str| {
        let addr = addr.clone();
        async move {
            run_ok(
                "busctl",
                &[
                    &addr,
                    "get-property",
                    fake_logind::BUS_NAME,
                    "/org/freedesktop/login1/session/7",
                    "org.freedesktop.login1.Session",
                    name,
                ],
            )
            .await
        }
    };
    assert_eq!(prop("TTY").await.trim(), "s \"tty1\"");
    assert_eq!(prop("Class").await.trim(), "s \"user\"");
    assert_eq!(
        prop("Seat").await.trim(),
        "(so) \"seat0\" \"/org/freedesktop/login1/seat/seat0\""
    );

    let schedule = logind.schedule();
    let asked = manager(
        "ScheduleShutdown",
        &["st", "dry-reboot", "1700000000000000"],
    );
    run_ok("busctl", &as_strs(&asked)).await;
    assert_eq!(
        schedule.borrow().current,
        Some(("dry-reboot".to_string(), 1_700_000_000_000_000))
    );
    let unknown = manager("ScheduleShutdown", &["st", "nap", "1"]);
    let err = run_err("busctl", &as_strs(&unknown)).await;
    assert!(err.contains("Unsupported shutdown type"), "{err}");
    let cancelled = run_ok("busctl", &as_strs(&manager("CancelScheduledShutdown", &[]))).await;
    assert_eq!(cancelled.trim(), "b true");
    assert_eq!(schedule.borrow().cancelled, 1);
    assert_eq!(schedule.borrow().current, None);
}
