//! Webhook notifications end to end: real rebootd processes in a lab fleet (Kubernetes API
//! stand-in, drain, Lease semaphore) POST to a real HTTP receiver on loopback.

mod common;

use common::*;
use rebootd::state::Phase;
use rebootd_lab::fleet::{FleetLock, FleetOptions};
use rebootd_lab::webhook::{Answer, WebhookReceiver};
use std::time::Duration;

fn opts(nodes: usize, hook: &WebhookReceiver, timeout: &str, extra: &str) -> FleetOptions {
    FleetOptions {
        config: format!(
            "[webhook]\nurl = {:?}\ntimeout = {timeout:?}\n{extra}",
            hook.url()
        ),
        ..drain_opts(nodes, 1, FleetLock::Kubernetes)
    }
}

/// A node's reboot is told as drain_started, rebooting, back, healthy, in that order, each a JSON
/// POST with the Slack/Teams `text` and the facts as fields.
#[tokio::test]
async fn a_reboot_is_told_drain_rebooting_back_healthy() {
    let hook = WebhookReceiver::start().await.unwrap();
    let fleet = ready_fleet(opts(2, &hook, "5s", "")).await;
    need_reboot(&fleet, 0, "2").await;
    fleet
        .wait_rolled_nodes(&[0], Duration::from_secs(60))
        .await
        .unwrap();
    hook.wait_for(WAIT, |d| d.body["event"] == "healthy")
        .await
        .expect("healthy told");
    let got = hook.deliveries();
    let events: Vec<&str> = got
        .iter()
        .filter(|d| d.body["node"] == "node-1")
        .map(|d| d.body["event"].as_str().unwrap())
        .collect();
    assert_eq!(
        events,
        ["drain_started", "rebooting", "back", "healthy"],
        "{got:?}"
    );
    for d in &got {
        assert_eq!(d.path, "/hook");
        assert_eq!(d.content_type, "application/json");
        let text = d.body["text"].as_str().unwrap();
        assert!(
            text.starts_with("rebootd: node-1 (group default) "),
            "{text}"
        );
        assert_eq!(d.body["group"], "default");
        assert!(d.body["attachments"][0]["fields"].is_array());
    }
    let back = got.iter().find(|d| d.body["event"] == "back").unwrap();
    let boot = fleet.nodes[0].lock().await.boot_id();
    assert_eq!(back.body["boot_id"], boot.as_str(), "the new boot");
}

/// A receiver that answers 500, then one that does not answer at all, holds no reboot up: the
/// node reboots as it would without it, and each failure is logged. A failed drain is told too.
#[tokio::test]
async fn a_failing_receiver_holds_no_reboot_up_and_failures_are_told() {
    let hook = WebhookReceiver::start().await.unwrap();
    hook.answer(Answer::Status(500));
    let mut o = opts(2, &hook, "1s", "[reboot]\nretry_interval = \"1h\"\n");
    o.kubernetes_config = "drain_timeout = \"3s\"\nready_timeout = \"30s\"\n".into();
    let fleet = ready_fleet(o).await;
    need_reboot(&fleet, 0, "2").await;
    fleet
        .wait_rolled_nodes(&[0], Duration::from_secs(60))
        .await
        .expect("rolled although the receiver fails");
    // The sender is sequential: once the second notification arrived, the first one's failure
    // was logged.
    hook.wait_for(WAIT, |d| {
        d.body["node"] == "node-1" && d.body["event"] == "rebooting"
    })
    .await
    .expect("rebooting told");
    let log = fleet.nodes[0].lock().await.log();
    assert!(
        log.contains("webhook notification failed: HTTP 500"),
        "{log}"
    );

    // node-2: its drain cannot finish (a budget that never allows), and the receiver hangs.
    hook.answer(Answer::Hang(Duration::from_secs(300)));
    let cluster = kube_cluster(&fleet);
    unevictable_db(&cluster, ["node-2", "node-2"]);
    let n2 = fleet.nodes[1].lock().await;
    n2.update_engine
        .set_status("UPDATE_STATUS_UPDATED_NEED_REBOOT", "2")
        .await
        .unwrap();
    n2.wait_state("the drain to fail and be backed out of", WAIT, |s| {
        s.phase == Phase::RebootNeeded && !s.slot_held
    })
    .await
    .unwrap();
    let failed = hook
        .wait_for(WAIT, |d| {
            d.body["node"] == "node-2" && d.body["event"] == "failed"
        })
        .await
        .expect("the failed drain is told");
    let error = failed.body["error"].as_str().unwrap();
    assert!(error.contains("drain failed"), "{error}");
    let log = n2.log();
    assert!(
        log.contains("webhook notification failed: no answer within 1s"),
        "{log}"
    );
}
