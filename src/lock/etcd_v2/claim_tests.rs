//! The v2 store's claim of a holder's record (see `EtcdV2Semaphore::claim`), against a real
//! etcd. The races between a claim and the holder's write are in `lock::race_tests`.

use std::time::Duration;

use super::super::super::race_tests::{etcd, held_then_read, me, v2};
use super::super::super::{Fence, Semaphore};
use super::waiting;

/// A waiter that claimed the holder's record and died before it wrote the document: the
/// holder has lost its slot (its proof says so, its release gives it back), and any waiter may
/// finish the reclaim at once, without waiting `max_hold` again.
#[tokio::test]
async fn a_claim_left_by_a_dead_waiter_is_finished_by_the_holder_or_the_next_waiter() {
    let Some(etcd) = etcd().await else { return };
    let (holder, waiter) = (v2(&etcd).await, v2(&etcd).await);
    let (h, me_w) = (me("h"), me("w"));
    let mut w = waiting(&waiter, &me_w);
    held_then_read(&holder, &h, &mut w).await;
    let snap = w.snap().expect("snap").clone();
    assert!(waiter.claim(&snap, "h", "node-x (x)").await.expect("claim"));
    match holder.fence(&h).await.expect("fence") {
        Fence::Lost { why } => assert!(why.contains("node-x (x) claimed"), "{why}"),
        Fence::Held => panic!("a claimed slot must not prove held"),
    }
    // The next waiter takes it at once (the claimed holder shows as gone).
    let took = tokio::time::timeout(Duration::from_secs(10), waiter.acquire(&me_w)).await;
    assert!(
        took.is_ok_and(|r| r.is_ok()),
        "the waiter finishes the reclaim"
    );
    assert_eq!(waiter.fence(&me_w).await.expect("fence"), Fence::Held);
    // The old holder's release leaves the new holder alone.
    holder.release(&h).await.expect("release");
    assert_eq!(waiter.fence(&me_w).await.expect("fence"), Fence::Held);
}
