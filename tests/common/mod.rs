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
