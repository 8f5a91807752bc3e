//! The reclaim of a holder judged stopped and that holder's own write, against a real etcd
//! (v2): whichever lands first makes the other fail. The waiter's steps are driven one by one
//! (read, then the reclaim it decided on that read), so each order is made on purpose, not by
//! timing. Without the claim of the holder's record (RELIABILITY.md, finding 7) the reclaim
//! compared only the document's index, which a holder's record write does not move: the
//! reclaim passed a holder that had just proved its slot by a write.

use std::time::Duration;

use rebootd_lab::etcd::{EtcdOptions, EtcdServer, EtcdVersion};

use super::super::super::acquire::Waiting;
use super::super::super::{Fence, Identity, Semaphore};
use super::super::{EtcdV2Semaphore, Timeouts};
use super::{EntryGuard, V2Waiting};
use crate::config;

fn me(id: &str) -> Identity {
    Identity {
        id: id.into(),
        node: format!("node-{id}"),
        boot_id: format!("boot-{id}"),
        token: format!("t-{id}"),
    }
}

async fn etcd() -> Option<EtcdServer> {
    let v = *EtcdVersion::available().first()?;
    Some(
        EtcdServer::start_with(v, EtcdOptions::v2())
            .await
            .expect("start etcd"),
    )
}

async fn store(etcd: &EtcdServer) -> EtcdV2Semaphore {
    let settings = config::Etcd {
        api: config::EtcdApi::V2,
        endpoints: vec![etcd.endpoint()],
        ca_file: None,
        cert_file: None,
        key_file: None,
        username: None,
        password_file: None,
    };
    EtcdV2Semaphore::connect_with(
        &settings,
        "default",
        Some(Duration::from_secs(60)),
        Timeouts::default(),
    )
    .await
    .expect("connect")
}

fn waiting<'a>(store: &'a EtcdV2Semaphore, me: &'a Identity) -> V2Waiting<'a> {
    V2Waiting {
        store,
        me,
        snap: None,
        started: jiff::Timestamp::now(),
        refresh_at: None,
        entry: EntryGuard {
            client: store.client.clone(),
            key: None,
        },
        stream: None,
        next_index: None,
        behind: false,
    }
}

/// `h` holds the only slot, with its record; `w`'s waiter has read the semaphore.
async fn held_and_read<'a>(holder: &EtcdV2Semaphore, h: &Identity, w: &mut V2Waiting<'a>) {
    holder.acquire(h).await.expect("h takes the slot");
    w.read().await.expect("w reads");
    let view = w.view().expect("view");
    assert_eq!(view.holders.len(), 1, "{view:?}");
}

#[tokio::test]
async fn a_holder_that_writes_after_the_waiter_read_makes_the_reclaim_fail() {
    let Some(etcd) = etcd().await else {
        assert!(std::env::var("CI").is_err(), "no etcd installed");
        return;
    };
    let (holder, waiter) = (store(&etcd).await, store(&etcd).await);
    let (h, me_w) = (me("h"), me("w"));
    let mut w = waiting(&waiter, &me_w);
    held_and_read(&holder, &h, &mut w).await;
    // The holder proves its slot by a write (the runtime's fence with max_hold) after the
    // waiter's read, before the waiter's reclaim decided on that read lands.
    assert_eq!(holder.heartbeat(&h).await.expect("beat"), Fence::Held);
    assert!(
        !w.reclaim("h", true).await.expect("reclaim"),
        "the reclaim passed a holder that wrote its record after it was judged stopped"
    );
    assert_eq!(holder.fence(&h).await.expect("fence"), Fence::Held);
    assert!(!waiter.fence(&me_w).await.expect("fence").eq(&Fence::Held));
}

#[tokio::test]
async fn a_reclaim_that_lands_first_makes_the_holders_write_say_lost() {
    let Some(etcd) = etcd().await else {
        assert!(std::env::var("CI").is_err(), "no etcd installed");
        return;
    };
    let (holder, waiter) = (store(&etcd).await, store(&etcd).await);
    let (h, me_w) = (me("h"), me("w"));
    let mut w = waiting(&waiter, &me_w);
    held_and_read(&holder, &h, &mut w).await;
    assert!(w.reclaim("h", true).await.expect("reclaim"), "reclaimed");
    assert!(
        matches!(
            holder.heartbeat(&h).await.expect("beat"),
            Fence::Lost { .. }
        ),
        "the holder's write after the takeover must say the slot is lost"
    );
    assert_eq!(waiter.fence(&me_w).await.expect("fence"), Fence::Held);
}

/// A waiter that claimed the holder's record and died before it wrote the document: the
/// holder has lost its slot (its proof says so, its release gives it back), and any waiter may
/// finish the reclaim at once, without waiting `max_hold` again.
#[tokio::test]
async fn a_claim_left_by_a_dead_waiter_is_finished_by_the_holder_or_the_next_waiter() {
    let Some(etcd) = etcd().await else {
        assert!(std::env::var("CI").is_err(), "no etcd installed");
        return;
    };
    let (holder, waiter) = (store(&etcd).await, store(&etcd).await);
    let (h, me_w) = (me("h"), me("w"));
    let mut w = waiting(&waiter, &me_w);
    held_and_read(&holder, &h, &mut w).await;
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
