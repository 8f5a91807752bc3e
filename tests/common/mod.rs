//! Harness shared by the integration tests: paths of the built binaries and helpers to await
//! what the lab's stand-ins see.
#![allow(dead_code)]

pub mod logs;

use rebootd_lab::fake_logind::RebootCall;
use rebootd_lab::node::{Node, NodeOptions};
use std::path::Path;
use std::time::Duration;
use tokio::sync::broadcast;

pub const REBOOTD: &str = env!("CARGO_BIN_EXE_rebootd");
pub const REBOOTCTL: &str = env!("CARGO_BIN_EXE_rebootctl");

/// Upper bound for anything a test awaits; generous for a loaded 2-core CI machine.
pub const WAIT: Duration = Duration::from_secs(30);

pub async fn node(name: &str, config: &str) -> Node {
    Node::start(Path::new(REBOOTD), NodeOptions::new(name).config(config))
        .await
        .expect("start lab node")
}

/// Await the next reboot call logind accepts, or fail with the node's log.
pub async fn next_reboot(
    node: &Node,
    rx: &mut broadcast::Receiver<RebootCall>,
    within: Duration,
) -> RebootCall {
    match tokio::time::timeout(within, rx.recv()).await {
        Ok(Ok(call)) => call,
        other => panic!(
            "node {}: no reboot call within {within:?} ({other:?})\n--- rebootd log ---\n{}",
            node.name,
            node.log()
        ),
    }
}

/// Run rebootctl as the node's; returns (exit code, stdout, stderr).
pub async fn rebootctl(node: &Node, args: &[&str]) -> (i32, String, String) {
    let out = node
        .command(Path::new(REBOOTCTL))
        .args(args)
        .output()
        .await
        .expect("run rebootctl");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Wait until the node's log has a line containing every one of `needles` (inotify on the log
/// file, no polling); returns that line.
pub async fn log_line(node: &Node, needles: &[&str], within: Duration) -> String {
    use futures_util::StreamExt;
    let path = node.log_path();
    let inotify = inotify::Inotify::init().expect("inotify");
    inotify
        .watches()
        .add(&path, inotify::WatchMask::MODIFY)
        .expect("watch the log");
    let mut events = inotify.into_event_stream(vec![0u8; 1024]).expect("stream");
    let find = || {
        node.log()
            .lines()
            .find(|l| needles.iter().all(|n| l.contains(n)))
            .map(str::to_string)
    };
    let found = tokio::time::timeout(within, async {
        loop {
            if let Some(line) = find() {
                return line;
            }
            events.next().await;
        }
    })
    .await;
    found.unwrap_or_else(|_| {
        panic!(
            "node {}: no log line with {needles:?} within {within:?}\n--- rebootd log ---\n{}",
            node.name,
            node.log()
        )
    })
}
