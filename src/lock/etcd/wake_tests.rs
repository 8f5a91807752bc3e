//! What wakes a waiter on etcd v3, against a real etcd: other holders' phase reports change
//! nothing it decides on without `max_hold`, so they do not wake it (in a long queue, deciding
//! again at every change was most of a waiter's work); with `max_hold` a report is a beat, and
//! it does.

use std::time::Duration;

use super::super::acquire::{Waiting, Wake};
use super::super::race_tests::{etcd, me};
use super::super::Semaphore;
use super::waiting::waiting;
use super::EtcdSemaphore;
use crate::config;

async fn connect(
    etcd: &rebootd_lab::etcd::EtcdServer,
    group: &str,
    max_hold: Option<Duration>,
) -> EtcdSemaphore {
    let s = config::Etcd {
        api: config::EtcdApi::V3,
        endpoints: vec![etcd.endpoint()],
        ca_file: None,
        cert_file: None,
        key_file: None,
        username: None,
        password_file: None,
    };
    EtcdSemaphore::connect(&s, group, max_hold)
        .await
        .expect("connect v3")
}

#[tokio::test]
async fn other_holders_reports_wake_a_waiter_only_with_max_hold() {
    let Some(etcd) = etcd().await else { return };
    for (group, max_hold) in [("quiet", None), ("beats", Some(Duration::from_secs(600)))] {
        let holder = connect(&etcd, group, max_hold).await;
        let store = connect(&etcd, group, max_hold).await;
        let (h, me_w) = (me("h"), me("w"));
        holder.acquire(&h).await.expect("h takes the slot");
        let mut w = waiting(&store, &me_w);
        w.read().await.expect("read");
        w.enqueue().await.expect("queue");
        // The watch opens from the read, so it also brings my own queue entry: let it pass.
        let _ = tokio::time::timeout(Duration::from_millis(300), w.wait(None, false)).await;
        holder.report_phase(&h, "rebooting").await.expect("report");
        let woken = tokio::time::timeout(Duration::from_millis(500), w.wait(None, false)).await;
        match max_hold {
            None => assert!(
                woken.is_err(),
                "woken by another holder's report: {woken:?}"
            ),
            Some(_) => assert_eq!(
                woken.expect("woken by the beat").expect("wait"),
                Wake::Changed
            ),
        }
        holder.release(&h).await.expect("release");
        let woken = tokio::time::timeout(Duration::from_secs(10), w.wait(None, false)).await;
        assert_eq!(
            woken.expect("woken by the release").expect("wait"),
            Wake::Changed,
            "{group}"
        );
        assert_eq!(w.view().expect("view").holders.len(), 0, "{group}");
    }
}
