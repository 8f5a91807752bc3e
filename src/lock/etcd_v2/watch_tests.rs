//! The v2 waiter's one watch against a real etcd: opened before the read, it is live (never
//! answered from etcd's history), so a change between the read and the wait costs the waiter
//! nothing but the event; and a waiter far back is not asked to decide on every change.

use std::time::Duration;

use super::super::super::acquire::{Waiting, Wake, FAR_BACK};
use super::super::super::race_tests::{etcd, held_then_read, me, v2};
use super::super::super::{Admin, Semaphore};
use super::super::{EtcdV2Semaphore, Timeouts};
use super::waiting;

/// Another node writes in the group's directory after the waiter's read and before its wait
/// (a phase report of the holder): the waiter queues and is woken by that write on its one
/// watch, with no second watch and no second read. (A watch opened after the read, from the
/// read's index, starts in etcd's history: etcd answers that one event and closes it.)
#[tokio::test]
async fn a_change_between_the_read_and_the_wait_comes_on_the_one_watch() {
    let Some(etcd) = etcd().await else { return };
    let (holder, waiter) = (v2(&etcd).await, v2(&etcd).await);
    let (h, me_w) = (me("h"), me("w"));
    let mut w = waiting(&waiter, &me_w);
    let before = waiter.requests();
    held_then_read(&holder, &h, &mut w).await;
    assert_eq!(waiter.requests() - before, 2, "the watch, then the read");
    holder
        .report_phase(&h, crate::state::Phase::Rebooting)
        .await
        .expect("the holder reports");
    w.enqueue().await.expect("queue");
    let wake = tokio::time::timeout(Duration::from_secs(10), w.wait(None, false)).await;
    assert_eq!(wake.expect("woken").expect("wait"), Wake::Changed);
    let view = w.view().expect("view");
    assert_eq!(
        view.holders[0].phase.as_deref(),
        Some("rebooting"),
        "{view:?}"
    );
    // And the next change too, on the same watch.
    holder.release(&h).await.expect("release");
    let wake = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            if w.wait(None, false).await? == Wake::Reread {
                return Ok(Wake::Reread);
            }
            if w.view()?.holders.is_empty() {
                return Ok::<_, super::super::super::LockError>(Wake::Changed);
            }
        }
    })
    .await;
    assert_eq!(wake.expect("woken").expect("wait"), Wake::Changed);
    assert_eq!(
        waiter.requests() - before,
        3,
        "the watch, the read, the queue entry: nothing more"
    );
}

/// A take that lost the race for the document decides again only once the watch brings the
/// document's change (the write that won): the changes before it (here a third node queueing
/// and leaving) would show the slot still free, and a take on them would lose again.
#[tokio::test]
async fn a_lost_take_waits_for_the_documents_change() {
    let Some(etcd) = etcd().await else { return };
    let (x, y, waiter) = (v2(&etcd).await, v2(&etcd).await, v2(&etcd).await);
    let (me_x, me_y, me_w) = (me("x"), me("y"), me("w"));
    let mut w = waiting(&waiter, &me_w);
    w.read().await.expect("the waiter reads");
    assert!(w.view().expect("view").holders.is_empty());
    // After the read: y queues and leaves again, then x takes the only slot.
    let mut wy = waiting(&y, &me_y);
    wy.read().await.expect("y reads");
    wy.enqueue().await.expect("y queues");
    wy.leave(Vec::new()).await;
    x.acquire(&me_x).await.expect("x takes the slot");
    assert!(!w.take(0).await.expect("take"), "the slot went to x");
    w.enqueue().await.expect("queue");
    let wake = tokio::time::timeout(Duration::from_secs(10), w.wait(None, false)).await;
    assert_eq!(wake.expect("woken").expect("wait"), Wake::Changed);
    let view = w.view().expect("view");
    assert_eq!(
        view.holders
            .iter()
            .map(|h| h.id.as_str())
            .collect::<Vec<_>>(),
        ["x"],
        "woken by the document's change, not by y's entry: {view:?}"
    );
}

/// A waiter far back in a long queue is not woken by changes that cannot let it act (the
/// snapshot takes them, the arbiter is not asked): here a holder's report is passed over, and
/// the pause that follows wakes it (a pause ends the wait anywhere in the queue).
#[tokio::test]
async fn a_waiter_far_back_decides_only_on_what_can_concern_it() {
    let Some(etcd) = etcd().await else { return };
    let (holder, others, waiter) = (v2(&etcd).await, v2(&etcd).await, v2(&etcd).await);
    let h = me("h");
    holder.acquire(&h).await.expect("h takes the only slot");
    let ids: Vec<_> = (0..FAR_BACK).map(|i| me(&format!("o{i}"))).collect();
    let mut ahead = Vec::new();
    for id in &ids {
        let mut o = waiting(&others, id);
        o.read().await.expect("read");
        o.enqueue().await.expect("queue");
        ahead.push(o);
    }
    let me_w = me("w");
    let mut w = waiting(&waiter, &me_w);
    w.read().await.expect("read");
    w.enqueue().await.expect("queue");
    holder
        .report_phase(&h, crate::state::Phase::Rebooting)
        .await
        .expect("the holder reports");
    holder
        .pause_group(&crate::lock::GroupPause::parse(r#"{"reason":"freeze"}"#))
        .await
        .expect("pause");
    let wake = tokio::time::timeout(Duration::from_secs(10), w.wait(None, false)).await;
    assert_eq!(wake.expect("woken").expect("wait"), Wake::Changed);
    assert!(
        w.paused().is_some(),
        "woken by the pause, not by the report before it"
    );
    let view = w.view().expect("view");
    assert_eq!(
        view.holders[0].phase.as_deref(),
        Some("rebooting"),
        "the report was taken in"
    );
}

/// A waiter's entry is refreshed every third of its TTL near the front and every two thirds
/// far back in a long queue (the same TTL, so a dead waiter holds the queue up no longer),
/// measured in one run: over the same stretch of waiting, the far waiter sends about half the
/// refreshes of the near one, and its entry stays.
#[tokio::test]
async fn a_waiter_far_back_refreshes_its_entry_half_as_often() {
    let Some(etcd) = etcd().await else { return };
    let holder = v2(&etcd).await;
    holder
        .acquire(&me("h"))
        .await
        .expect("h takes the only slot");
    let others = v2(&etcd).await;
    let ids: Vec<_> = (0..FAR_BACK).map(|i| me(&format!("o{i}"))).collect();
    let mut ahead = Vec::new();
    for id in &ids {
        let mut o = waiting(&others, id);
        o.read().await.expect("read");
        o.enqueue().await.expect("queue");
        ahead.push(o);
    }
    // The near waiter is alone in a group of its own; both have a 3 s TTL.
    let settings = super::super::super::race_tests::settings(&etcd, crate::config::EtcdApi::V2);
    let timeouts = Timeouts {
        queue_ttl: Duration::from_secs(3),
        ..Timeouts::default()
    };
    let (near_store, far_store) = (
        EtcdV2Semaphore::connect_with(&settings, "near", None, timeouts),
        EtcdV2Semaphore::connect_with(&settings, "default", None, timeouts),
    );
    let (near_store, far_store) = (near_store.await.expect("v2"), far_store.await.expect("v2"));
    let near_holder = v2_group(&etcd, "near").await;
    near_holder
        .acquire(&me("nh"))
        .await
        .expect("nh takes the only slot");
    let (me_n, me_f) = (me("n"), me("f"));
    let (mut n, mut f) = (waiting(&near_store, &me_n), waiting(&far_store, &me_f));
    for w in [&mut n, &mut f] {
        w.read().await.expect("read");
        w.enqueue().await.expect("queue");
    }
    let (n0, f0) = (near_store.requests(), far_store.requests());
    let until = std::time::Instant::now() + Duration::from_millis(4_500);
    // The far waiter's group is busy (its holder reports), so its watch is heard: a quiet one
    // is checked at the near rate.
    let busy = async {
        let phases = [
            crate::state::Phase::Rebooting,
            crate::state::Phase::Draining,
        ];
        for phase in phases.iter().cycle() {
            if std::time::Instant::now() >= until {
                break;
            }
            holder.report_phase(&me("h"), *phase).await.expect("report");
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    };
    let (near, far, ()) = tokio::join!(wait_until(&mut n, until), wait_until(&mut f, until), busy);
    assert!(near.is_ok() && far.is_ok(), "{near:?} {far:?}");
    let (near, far) = (near_store.requests() - n0, far_store.requests() - f0);
    assert!(
        near >= 3,
        "near the front: a refresh a second, {near} in 4.5 s"
    );
    assert!(far <= 2, "far back: a refresh every 2 s, {far} in 4.5 s");
    let queued = far_store.read(true).await.expect("read").queue;
    assert_eq!(queued.len(), FAR_BACK + 1, "the far waiter's entry stayed");
}

async fn v2_group(etcd: &rebootd_lab::etcd::EtcdServer, group: &str) -> EtcdV2Semaphore {
    let s = super::super::super::race_tests::settings(etcd, crate::config::EtcdApi::V2);
    EtcdV2Semaphore::connect_with(&s, group, None, Timeouts::default())
        .await
        .expect("connect v2")
}

/// Wait (deciding nothing) until `until`.
async fn wait_until(
    w: &mut super::V2Waiting<'_>,
    until: std::time::Instant,
) -> Result<(), crate::lock::LockError> {
    while std::time::Instant::now() < until {
        w.wait(Some(until), false).await?;
    }
    Ok(())
}

/// etcd drops a streaming watcher that falls behind a burst of changes (its buffer of 100
/// events full) without ending its answer: the stream goes quiet for good. A waiter that did
/// not read its stream through a burst bigger than the socket's buffers and etcd's still sees
/// the release that follows: a quiet interval makes its next refresh a write the stream must
/// bring back; it does not come, and the waiter reads again on a new watch.
#[tokio::test]
async fn a_watch_etcd_dropped_in_a_burst_is_noticed_and_replaced() {
    let Some(etcd) = etcd().await else { return };
    let holder = v2(&etcd).await;
    let h = me("h");
    holder.acquire(&h).await.expect("h takes the only slot");
    let settings = super::super::super::race_tests::settings(&etcd, crate::config::EtcdApi::V2);
    let timeouts = Timeouts {
        queue_ttl: Duration::from_secs(3),
        client: crate::clients::etcd_v2::Timeouts {
            request: Duration::from_secs(2),
            ..Default::default()
        },
        ..Timeouts::default()
    };
    let store = EtcdV2Semaphore::connect_with(&settings, "default", None, timeouts)
        .await
        .expect("v2");
    let me_w = me("w");
    let mut w = waiting(&store, &me_w);
    w.read().await.expect("read");
    w.enqueue().await.expect("queue");
    // Another group's key, in the directory the waiter watches, written over and over (each
    // event carries the value and the one before); the waiter reads nothing meanwhile.
    let value = "x".repeat(48 * 1024);
    let key = format!("{}/groups/burst/k", holder.keys.root);
    for _ in 0..400 {
        let put = crate::clients::etcd_v2::Put::default();
        holder.client.put(&key, &value, put).await.expect("put");
    }
    holder.release(&h).await.expect("release");
    let seen = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            if w.wait(None, false).await? == Wake::Reread {
                w.read().await?;
            }
            if w.view()?.holders.is_empty() {
                return Ok::<_, crate::lock::LockError>(());
            }
        }
    })
    .await;
    assert!(
        matches!(seen, Ok(Ok(()))),
        "the release never reached the waiter: {seen:?}"
    );
}
