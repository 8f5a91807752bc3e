//! The v2 waiter's one watch against a real etcd: opened before the read, it is live (never
//! answered from etcd's history), so a change between the read and the wait costs the waiter
//! nothing but the event; and a waiter far back is not asked to decide on every change.

use std::time::Duration;

use super::super::super::acquire::{Waiting, Wake, FAR_BACK};
use super::super::super::race_tests::{etcd, held_then_read, me, v2};
use super::super::super::{Admin, Semaphore};
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
