//! What wakes a waiter on etcd v3, against a real etcd: other holders' phase reports change
//! nothing it decides on without `max_hold`, so they do not wake it (in a long queue, deciding
//! again at every change was most of a waiter's work); with `max_hold` a report is a beat, and
//! it does.

use std::time::Duration;

use super::super::acquire::{Waiting, Wake, FAR_BACK};
use super::super::race_tests::{etcd, me, settings};
use super::super::Semaphore;
use super::waiting::waiting;
use super::EtcdSemaphore;
use crate::config;

async fn connect(
    etcd: &rebootd_lab::etcd::EtcdServer,
    group: &str,
    max_hold: Option<Duration>,
) -> EtcdSemaphore {
    let s = settings(etcd, config::EtcdApi::V3);
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
        holder
            .report_phase(&h, crate::state::Phase::Rebooting)
            .await
            .expect("report");
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

/// A waiter far back in a long queue (`FAR_BACK` waiters ahead, and at least `max` besides
/// holders' entries) could not act whatever changed, so changes do not wake it; the one that
/// brings it nearer the head does.
#[tokio::test]
async fn a_waiter_far_back_is_woken_only_nearer_the_head() {
    let Some(etcd) = etcd().await else { return };
    let group = "far";
    let holder = connect(&etcd, group, None).await;
    let h = me("h");
    holder.acquire(&h).await.expect("h takes the only slot");
    let store = connect(&etcd, group, None).await;
    let ids = far_ids();
    let mut ahead = queue_all(&store, &ids).await;
    let w = me("w");
    let mut me_w = waiting(&store, &w);
    me_w.read().await.expect("read");
    me_w.enqueue().await.expect("queue");
    // My own entry arrives on the watch: nothing to act on, far back.
    assert!(quiet(&mut me_w, 500).await.is_err(), "woken far back");
    // The slot is given back: FAR_BACK waiters ahead of one slot; still nothing to do.
    holder.release(&h).await.expect("release");
    assert!(quiet(&mut me_w, 500).await.is_err(), "woken far back");
    // One ahead leaves: nearer the head every change is decided on (and logged) again.
    ahead.remove(0).leave(Vec::new()).await;
    let woken = quiet(&mut me_w, 10_000).await;
    assert_eq!(woken.expect("woken").expect("wait"), Wake::Changed);
    let view = me_w.view().expect("view");
    assert_eq!(
        (view.holders.len(), view.waiters.len()),
        (0, FAR_BACK),
        "{view:?}"
    );
}

/// The group's pause comes with a waiter's own read and watch (no request of its own), and a
/// pause put while it waits wakes it even far back in a long queue, where other changes do not.
#[tokio::test]
async fn a_pause_wakes_a_waiter_even_far_back() {
    let Some(etcd) = etcd().await else { return };
    let holder = connect(&etcd, "paused-far", None).await;
    let h = me("h");
    holder.acquire(&h).await.expect("h takes the only slot");
    let store = connect(&etcd, "paused-far", None).await;
    let ids = far_ids();
    let _ahead = queue_all(&store, &ids).await;
    let w = me("w");
    let mut me_w = waiting(&store, &w);
    me_w.read().await.expect("read");
    assert_eq!(me_w.paused(), None);
    me_w.enqueue().await.expect("queue");
    assert!(quiet(&mut me_w, 500).await.is_err(), "woken far back");
    let pause = pause_wakes(&holder, &mut me_w).await;
    // Read afresh, the pause is in the read.
    let mut again = waiting(&store, &w);
    again.read().await.expect("read");
    assert_eq!(again.paused(), Some(pause));
    crate::lock::Admin::resume_group(&holder)
        .await
        .expect("resume");
    let mut resumed = waiting(&store, &w);
    resumed.read().await.expect("read");
    assert_eq!(resumed.paused(), None);
}

/// The ids of `FAR_BACK` waiters.
fn far_ids() -> Vec<crate::lock::Identity> {
    (0..FAR_BACK).map(|i| me(&format!("a{i:02}"))).collect()
}

/// Each of `ids` read and queued, in that order.
async fn queue_all<'a>(
    store: &'a EtcdSemaphore,
    ids: &'a [crate::lock::Identity],
) -> Vec<super::waiting::V3Waiting<'a>> {
    let mut queued = Vec::new();
    for id in ids {
        let mut q = waiting(store, id);
        q.read().await.expect("read");
        q.enqueue().await.expect("queue");
        queued.push(q);
    }
    queued
}

/// Pause the group through `holder`: `w` wakes to it and sees it.
async fn pause_wakes(
    holder: &EtcdSemaphore,
    w: &mut super::waiting::V3Waiting<'_>,
) -> crate::lock::GroupPause {
    let pause = crate::lock::GroupPause::parse("kernel freeze");
    crate::lock::Admin::pause_group(holder, &pause)
        .await
        .expect("pause");
    let woken = quiet(w, 10_000).await;
    assert_eq!(
        woken.expect("woken by the pause").expect("wait"),
        Wake::Changed
    );
    assert_eq!(w.paused(), Some(pause.clone()));
    pause
}

/// `w`'s next wake within `ms` (`Err`: none came).
async fn quiet(
    w: &mut super::waiting::V3Waiting<'_>,
    ms: u64,
) -> Result<Result<Wake, crate::lock::LockError>, tokio::time::error::Elapsed> {
    tokio::time::timeout(Duration::from_millis(ms), w.wait(None, false)).await
}

/// A waiter's queue entry lives by an etcd lease kept alive every third of its TTL near the
/// front and every two thirds far back in a long queue (the same TTL, so a dead waiter holds
/// the queue up no longer). Counted by etcd, in one run: over the same stretch of waiting, the
/// far waiter's lease is renewed about half as often as the near one's, and its entry stays.
#[tokio::test]
async fn a_waiter_far_back_keeps_its_lease_alive_half_as_often() {
    let Some(etcd) = etcd().await else { return };
    let holder = connect(&etcd, "far", None).await;
    holder
        .acquire(&me("h"))
        .await
        .expect("h takes the only slot");
    let others = connect(&etcd, "far", None).await;
    let ids = far_ids();
    let _ahead = queue_all(&others, &ids).await;
    let near_holder = connect(&etcd, "near", None).await;
    near_holder
        .acquire(&me("nh"))
        .await
        .expect("nh takes the only slot");
    let s = settings(&etcd, config::EtcdApi::V3);
    let timeouts = crate::clients::etcd_v3::Timeouts {
        queue_ttl: Duration::from_secs(3),
        ..Default::default()
    };
    let mut renewed = Vec::new();
    for group in ["near", "far"] {
        let store = EtcdSemaphore::connect_with(&s, group, None, timeouts)
            .await
            .expect("connect v3");
        let w = me(&format!("w-{group}"));
        let mut me_w = waiting(&store, &w);
        me_w.read().await.expect("read");
        me_w.enqueue().await.expect("queue");
        let before = etcd.lease_renewals().expect("etcd's count");
        let until = std::time::Instant::now() + Duration::from_millis(4_500);
        while std::time::Instant::now() < until {
            me_w.wait(Some(until), false).await.expect("wait");
        }
        renewed.push(etcd.lease_renewals().expect("etcd's count") - before);
        assert!(
            me_w.view().expect("view").my_ticket().is_some(),
            "{group}: the entry stayed"
        );
    }
    let (near, far) = (renewed[0], renewed[1]);
    assert!(
        near >= 3,
        "near the front: a keep-alive a second, {near} in 4.5 s"
    );
    assert!(far <= 2, "far back: a keep-alive every 2 s, {far} in 4.5 s");
}

/// A take that lost its race decides nothing on the events before the write that beat it: on
/// those the view still shows the document it lost on, and a take would lose again. The wait
/// ends with the winner's write in the view.
#[tokio::test]
async fn after_a_lost_take_only_the_winners_write_wakes_the_waiter() {
    let Some(etcd) = etcd().await else { return };
    let group = "lost";
    let other = connect(&etcd, group, None).await;
    // Room for a host that comes after two waiters.
    crate::lock::Admin::set_max(&other, 3, false)
        .await
        .expect("set-max 3");
    let store = connect(&etcd, group, None).await;
    let w = me("w");
    let mut me_w = waiting(&store, &w);
    me_w.read().await.expect("read");
    me_w.enqueue().await.expect("queue");
    // The watch opens from the read, so it also brings my own queue entry: let it pass.
    let _ = quiet(&mut me_w, 300).await;
    // Another waiter queues (an event before the winner's), then a host takes a slot.
    let x = me("x");
    let mut queued = queue_all(&store, std::slice::from_ref(&x)).await;
    other.acquire(&me("y")).await.expect("y takes a slot");
    assert!(!me_w.take(0).await.expect("take"), "the take lost its race");
    let woken = quiet(&mut me_w, 10_000).await;
    assert_eq!(woken.expect("woken").expect("wait"), Wake::Changed);
    let view = me_w.view().expect("view");
    assert_eq!(
        view.holders
            .iter()
            .map(|h| h.id.as_str())
            .collect::<Vec<_>>(),
        vec!["y"],
        "woken before the winner's write was in the view: {view:?}"
    );
    queued.remove(0).leave(Vec::new()).await;
}

/// Far back in a long queue (`max` and `MARKER_BEYOND_MAX` ahead), a waiter watches one entry
/// ahead of it (its marker) and the pause, not the whole group: etcd sends it no event of the
/// queue's other changes (counted by etcd), a pause still wakes it, and its marker's leaving
/// makes it read again. Whether the queue ahead was in its read or came between its read and
/// its entry (a start burst: every waiter read an empty queue; it finds its marker with one
/// narrow read, before any watch).
#[tokio::test]
async fn a_waiter_far_back_watches_only_its_marker_and_the_pause() {
    let Some(etcd) = etcd().await else { return };
    for read_first in [false, true] {
        let group = format!("marker-{read_first}");
        let holder = connect(&etcd, &group, None).await;
        holder
            .acquire(&me("h"))
            .await
            .expect("h takes the only slot");
        let store = connect(&etcd, &group, None).await;
        let w = me("w");
        let mut me_w = waiting(&store, &w);
        if read_first {
            me_w.read().await.expect("read");
        }
        // 70 ahead, max 1: the marker is 1 + FAR_BACK / 2 places ahead of me, a61.
        let ids: Vec<_> = (0..70).map(|i| me(&format!("a{i:02}"))).collect();
        let mut ahead = queue_all(&store, &ids).await;
        if !read_first {
            me_w.read().await.expect("read");
        }
        me_w.enqueue().await.expect("queue");
        let sent = || {
            etcd.counter("etcd_debugging_mvcc_events_total")
                .expect("etcd's count")
        };
        let before = sent();
        // Read first, the queue ahead came between the read and the entry: found by one
        // narrow read before any watch, never received entry by entry on the group's watch.
        assert!(
            quiet(&mut me_w, 300).await.is_err(),
            "read first: {read_first}: woken far back"
        );
        let behind: Vec<_> = (0..10).map(|i| me(&format!("b{i:02}"))).collect();
        let _behind = queue_all(&store, &behind).await;
        ahead.remove(0).leave(Vec::new()).await;
        assert!(quiet(&mut me_w, 500).await.is_err(), "woken far back");
        assert_eq!(
            sent() - before,
            0,
            "read first: {read_first}: the queue's changes reached the far waiter"
        );
        if read_first {
            // Its snapshot lacks the queue ahead: a pause makes it read again, and the read
            // has the pause (and the queue: from there on it is placed as the other order).
            let pause = crate::lock::GroupPause::parse("kernel freeze");
            crate::lock::Admin::pause_group(&holder, &pause)
                .await
                .expect("pause");
            let woken = quiet(&mut me_w, 10_000).await;
            assert_eq!(
                woken.expect("woken by the pause").expect("wait"),
                Wake::Reread
            );
            me_w.read().await.expect("read");
            assert_eq!(me_w.paused(), Some(pause));
        } else {
            pause_wakes(&holder, &mut me_w).await;
        }
        crate::lock::Admin::resume_group(&holder)
            .await
            .expect("resume");
        assert!(
            quiet(&mut me_w, 500).await.is_err(),
            "woken by the resume far back"
        );
        // a61 is now the 60th ahead.
        ahead.remove(60).leave(Vec::new()).await;
        let woken = quiet(&mut me_w, 10_000).await;
        assert_eq!(
            woken.expect("woken by the marker").expect("wait"),
            Wake::Reread,
            "read first: {read_first}"
        );
    }
}

/// A waiter that has an entry reads the queue only up to it: the entries behind it decide
/// nothing of its own, and the read then costs its place in the queue, not the queue. One
/// whose entry went (its lease expired) reads the whole queue again, and queues again at the
/// back.
#[tokio::test]
async fn a_waiter_reads_the_queue_only_up_to_its_own_entry() {
    let Some(etcd) = etcd().await else { return };
    let holder = connect(&etcd, "upto", None).await;
    holder.acquire(&me("h")).await.expect("h takes the slot");
    let store = connect(&etcd, "upto", None).await;
    let ahead: Vec<_> = (0..3).map(|i| me(&format!("a{i}"))).collect();
    let _ahead = queue_all(&store, &ahead).await;
    let w = me("w");
    let mut me_w = waiting(&store, &w);
    me_w.read().await.expect("read");
    me_w.enqueue().await.expect("queue");
    let behind: Vec<_> = (0..5).map(|i| me(&format!("b{i}"))).collect();
    let mut behind = queue_all(&store, &behind).await;
    me_w.read().await.expect("read again");
    let ids = |w: &super::waiting::V3Waiting<'_>| -> Vec<String> {
        let view = w.view().expect("view");
        view.waiters.iter().filter_map(|v| v.id.clone()).collect()
    };
    assert_eq!(ids(&me_w), ["a0", "a1", "a2", "w"], "only up to mine");
    // My entry gone: the whole queue, so the next decision queues me at its back.
    let mut kv = etcd_client::Client::connect([etcd.endpoint()], None)
        .await
        .expect("client");
    kv.delete(store.keys.waiter("w"), None)
        .await
        .expect("delete");
    me_w.read().await.expect("read after my entry went");
    assert_eq!(
        ids(&me_w),
        ["a0", "a1", "a2", "b0", "b1", "b2", "b3", "b4"],
        "the whole queue"
    );
    // The waiters behind the first still see everything ahead of them.
    behind[4].read().await.expect("read");
    assert_eq!(ids(&behind[4]).len(), 3 + 5, "{:?}", ids(&behind[4]));
}

/// A newcomer to a queue longer than its read lists counts the queue without listing it: the
/// read costs a bounded number of bytes however long the queue, the arbiter counts every entry
/// as ahead of it, and after its put it finds its marker with one narrow read, so the queue's
/// changes never reach it entry by entry. Its marker's leaving makes it read again, the queue
/// listed up to its entry.
#[tokio::test]
async fn a_newcomer_counts_a_long_queue_without_listing_it() {
    let Some(etcd) = etcd().await else { return };
    let holder = connect(&etcd, "long", None).await;
    holder
        .acquire(&me("h"))
        .await
        .expect("h takes the only slot");
    let store = connect(&etcd, "long", None).await;
    let ids: Vec<_> = (0..500).map(|i| me(&format!("a{i:03}"))).collect();
    let mut ahead = queue_all(&store, &ids).await;
    let sent = || {
        etcd.counter("etcd_network_client_grpc_sent_bytes_total")
            .expect("etcd's count")
    };
    let before = sent();
    let whole = store.read(true).await.expect("read the whole queue");
    let whole_bytes = sent() - before;
    assert_eq!(whole.queue.len(), 500);
    let w = me("w");
    let mut me_w = waiting(&store, &w);
    let before = sent();
    me_w.read().await.expect("read");
    let read_bytes = sent() - before;
    let view = me_w.view().expect("view");
    assert_eq!(
        (view.waiters.len(), view.unlisted_ahead),
        (0, 500),
        "counted, not listed"
    );
    assert!(
        read_bytes * 3 < whole_bytes,
        "the newcomer's read: {read_bytes} bytes; the whole queue's: {whole_bytes}"
    );
    me_w.enqueue().await.expect("queue");
    let events = || {
        etcd.counter("etcd_debugging_mvcc_events_total")
            .expect("etcd's count")
    };
    let before = events();
    assert!(quiet(&mut me_w, 300).await.is_err(), "woken far back");
    let _behind = queue_all(&store, &[me("b0")]).await;
    ahead.remove(0).leave(Vec::new()).await;
    assert!(quiet(&mut me_w, 500).await.is_err(), "woken far back");
    assert_eq!(
        events() - before,
        0,
        "the queue's changes reached the newcomer"
    );
    // Its marker, 1 + FAR_BACK / 2 places ahead: a491, now the 491st.
    ahead.remove(490).leave(Vec::new()).await;
    let woken = quiet(&mut me_w, 10_000).await;
    assert_eq!(
        woken.expect("woken by the marker").expect("wait"),
        Wake::Reread
    );
    me_w.read().await.expect("read again");
    let view = me_w.view().expect("view");
    assert_eq!(
        (view.waiters.len(), view.unlisted_ahead),
        (498 + 1, 0),
        "listed up to mine"
    );
}

/// A newcomer that counted a queue longer than it lists, but not `max + FAR_BACK` long, has no
/// marker and watches the group: the first change ahead of it that may decide for it (a waiter
/// ahead leaving) wakes it to read the queue up to its entry. It took itself for far back
/// once, found no marker in a queue it had not listed and waited for good: at 3000 simulated
/// nodes, max 100, arriving over a minute, the whole queue stalled behind such a waiter with
/// every slot free.
#[tokio::test]
async fn a_counted_newcomer_without_a_marker_is_woken_by_the_queue_ahead() {
    let Some(etcd) = etcd().await else { return };
    let store = connect(&etcd, "counted", None).await;
    crate::lock::Admin::set_max(&store, 80, true)
        .await
        .expect("max 80");
    let ids: Vec<_> = (0..140).map(|i| me(&format!("a{i:03}"))).collect();
    let mut ahead = queue_all(&store, &ids).await;
    let w = me("w");
    let mut me_w = waiting(&store, &w);
    me_w.read().await.expect("read");
    let view = me_w.view().expect("view");
    assert_eq!(
        (view.waiters.len(), view.unlisted_ahead),
        (0, 140),
        "counted, not listed: more than a newcomer lists, fewer than max + FAR_BACK"
    );
    me_w.enqueue().await.expect("queue");
    // My own entry comes on the group's watch: a put at mine decides nothing.
    assert!(
        quiet(&mut me_w, 300).await.is_err(),
        "woken by my own entry"
    );
    ahead.remove(0).leave(Vec::new()).await;
    let woken = quiet(&mut me_w, 10_000).await;
    assert_eq!(
        woken
            .expect("woken by a waiter ahead leaving")
            .expect("wait"),
        Wake::Reread
    );
    me_w.read().await.expect("read again");
    let view = me_w.view().expect("view");
    assert_eq!(
        (view.waiters.len(), view.unlisted_ahead),
        (139 + 1, 0),
        "listed up to mine"
    );
}

/// A waiter near the front of a growing queue stops receiving the entries put behind it once
/// `LEAVE_OUT_AFTER` came (counted by etcd: none of the next ones is sent to it), and is still
/// woken by what decides for it: a waiter ahead leaving, and a slot given back.
#[tokio::test]
async fn a_waiter_near_the_front_leaves_out_the_entries_put_behind_it() {
    let Some(etcd) = etcd().await else { return };
    let holder = connect(&etcd, "growing", None).await;
    let h = me("h");
    holder.acquire(&h).await.expect("h takes the only slot");
    let store = connect(&etcd, "growing", None).await;
    let a = [me("a")];
    let mut ahead = queue_all(&store, &a).await;
    let w = me("w");
    let mut me_w = waiting(&store, &w);
    me_w.read().await.expect("read");
    me_w.enqueue().await.expect("queue");
    let first: Vec<_> = (0..300).map(|i| me(&format!("b{i:03}"))).collect();
    let _first = queue_all(&store, &first).await;
    assert!(
        quiet(&mut me_w, 1_000).await.is_err(),
        "woken by entries behind"
    );
    let events = || {
        etcd.counter("etcd_debugging_mvcc_events_total")
            .expect("etcd's count")
    };
    let before = events();
    let then: Vec<_> = (0..100).map(|i| me(&format!("c{i:03}"))).collect();
    let _then = queue_all(&store, &then).await;
    assert!(
        quiet(&mut me_w, 300).await.is_err(),
        "woken by entries behind"
    );
    assert_eq!(
        events() - before,
        0,
        "entries put behind reached the waiter"
    );
    ahead.remove(0).leave(Vec::new()).await;
    let woken = quiet(&mut me_w, 10_000).await;
    assert_eq!(woken.expect("woken").expect("wait"), Wake::Changed);
    assert_eq!(
        me_w.view().expect("view").waiters[0].id.as_deref(),
        Some("w")
    );
    holder.release(&h).await.expect("release");
    let woken = quiet(&mut me_w, 10_000).await;
    assert_eq!(woken.expect("woken").expect("wait"), Wake::Changed);
    assert_eq!(me_w.view().expect("view").holders.len(), 0);
}
