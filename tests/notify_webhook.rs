//! Webhook notifications end to end: real rebootd processes in a lab fleet (Kubernetes API
//! stand-in, drain, Lease semaphore) POST to a real HTTP receiver on loopback. And the sender
//! in-process against the lab's canned HTTP server: the URL (a secret) never logged whole, a
//! `url_file`, an answer over the cap.

mod common;

use common::*;
use rebootd::notify_webhook::{Webhook, WebhookSettings, WebhookUrl};
use rebootd::state::Phase;
use rebootd_lab::fleet::{FleetLock, FleetOptions};
use rebootd_lab::http_stub::HttpStub;
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

/// A failed send logs the scheme and host of the URL, never its path or query (a Slack or Teams
/// URL is the secret); an answer over the cap is a failure that says the cap; a `url_file`
/// (mode 0600) is where the notifications go.
#[tokio::test]
async fn failures_never_log_the_url_path_and_answers_are_capped() {
    let (_guard, mut logs) = logs::capture_on_this_thread();
    let stub = HttpStub::start().await.unwrap();
    let secret_path = "/services/T0/B0/s3cret?token=abc";
    let settings = WebhookSettings {
        url: WebhookUrl::Inline(format!("{}{secret_path}", stub.url())),
        ca_file: None,
        timeout: Duration::from_secs(5),
    };
    let hook = Webhook::start(&settings).unwrap();
    let host = stub.url();
    stub.answer(500, "no");
    hook.send(serde_json::json!({"event": "rebooting"}));
    hook.flush().await;
    let line = logs
        .expect(&["webhook notification failed: HTTP 500", &host])
        .await;
    assert!(
        !line.contains("s3cret") && !line.contains("token"),
        "{line}"
    );
    assert_eq!(stub.seen()[0].path, secret_path, "sent to the whole URL");

    stub.answer(200, vec![b'x'; rebootd::notify_webhook::BODY_MAX + 1]);
    hook.send(serde_json::json!({"event": "back"}));
    hook.flush().await;
    let line = logs
        .expect(&["webhook notification failed", "longer than 64 KiB"])
        .await;
    assert!(!line.contains("s3cret"), "{line}");

    // Nothing listens: a connection error, still no path.
    drop(stub);
    hook.send(serde_json::json!({"event": "healthy"}));
    hook.flush().await;
    let line = logs
        .expect(&["webhook notification failed", &host, "healthy"])
        .await;
    assert!(
        !line.contains("s3cret") && !line.contains("token"),
        "{line}"
    );

    // The URL from a private file.
    use std::os::unix::fs::PermissionsExt;
    let stub = HttpStub::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("webhook-url");
    std::fs::write(&file, format!("{}{secret_path}\n", stub.url())).unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let from_file = WebhookSettings {
        url: WebhookUrl::File(file.clone()),
        ..settings
    };
    let hook = Webhook::start(&from_file).unwrap();
    hook.send(serde_json::json!({"event": "rebooting"}));
    hook.flush().await;
    let seen = stub.seen();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0].path, secret_path);
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let e = Webhook::start(&from_file).unwrap_err();
    assert!(
        e.0.contains("webhook.url_file") && e.0.contains("0644"),
        "{e}"
    );
}
