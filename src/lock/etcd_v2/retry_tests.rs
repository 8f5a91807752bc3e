//! A document update that lost its compare-and-swap tries again on the document alone, against
//! a real etcd: the group's directory grows with the queue, the document does not.

use super::super::super::race_tests::{etcd, me, v2};
use super::super::super::{Admin, Fence, Semaphore};
use crate::clients::etcd_v2::Get;
use crate::state::Phase;

const WHOLE_READS: &str = "etcd_debugging_store_reads_total{action=\"getRecursive\"}";

/// A release on a read that other hosts made stale (one gave its slot back, one took a slot)
/// loses its first write; the retry reads the document alone (no read of the group's
/// directory), gives back only my slot, and deletes my record by the index the first read saw,
/// and no record of a holder that left meanwhile (its own release deletes it).
#[tokio::test]
async fn a_release_that_lost_a_race_rereads_only_the_document() {
    let Some(etcd) = etcd().await else { return };
    let (a, b) = (v2(&etcd).await, v2(&etcd).await);
    a.set_max(3, false).await.expect("set-max 3");
    let (h, x, y) = (me("h"), me("x"), me("y"));
    b.acquire(&y).await.expect("y takes a slot");
    a.acquire(&h).await.expect("h takes a slot");
    // The release right after a report writes on the report's read.
    a.report_phase(&h, Phase::Rebooting).await.expect("report");
    b.release(&y).await.expect("y gives its slot back");
    b.acquire(&x).await.expect("x takes a slot");
    let before = etcd.counter(WHOLE_READS).expect("etcd's count");
    let writes = a.requests();
    a.release(&h).await.expect("release");
    assert_eq!(
        etcd.counter(WHOLE_READS).expect("etcd's count") - before,
        0,
        "the retry read the whole group"
    );
    // The lost write, the document's read, the write, my record's delete.
    assert_eq!(a.requests() - writes, 4);
    assert!(matches!(
        a.fence(&h).await.expect("fence"),
        Fence::Lost { .. }
    ));
    assert_eq!(b.fence(&x).await.expect("fence"), Fence::Held);
    let record = a
        .client
        .get(
            &a.keys.record(&h.id),
            Get {
                recursive: false,
                sorted: false,
                quorum: true,
            },
        )
        .await;
    assert!(
        record.as_ref().is_err_and(|e| e.is_key_not_found()),
        "my record stayed: {record:?}"
    );
    assert!(b
        .status()
        .await
        .expect("status")
        .holders
        .iter()
        .any(|r| r.id == "x"));
}
