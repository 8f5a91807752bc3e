//! For the tests that run rebootd's lock stores in-process (no daemon): a machine's identity and
//! awaits bounded in time.

use rebootd::lock::{Admin, GroupPause, Identity};
use std::future::Future;
use std::time::Duration;

/// Upper bound for anything an in-process lock test awaits.
pub const STORE_WAIT: Duration = Duration::from_secs(20);

/// A group pause made now, saying `reason`.
pub fn a_pause(reason: &str) -> GroupPause {
    GroupPause {
        since: jiff::Timestamp::now(),
        reason: Some(reason.into()),
        by: Some("test".into()),
    }
}

/// Machine `x`: id `m-x`, node `node-x`, boot `boot-x`, token `t-x`.
pub fn me(x: &str) -> Identity {
    Identity {
        id: format!("m-{x}"),
        ..machine(x)
    }
}

/// Machine `id` by that very id (as locksmith's documents name holders): node `node-id`, boot
/// `boot-id`, token `t-id`.
pub fn machine(id: &str) -> Identity {
    Identity {
        id: id.into(),
        node: format!("node-{id}"),
        boot_id: format!("boot-{id}"),
        token: format!("t-{id}"),
        zone: None,
    }
}

/// Whether `id` (a machine id or a node name) holds a slot, as `rebootctl status` shows it.
pub async fn holds(s: &(impl Admin + ?Sized), id: &str) -> bool {
    s.status()
        .await
        .expect("status")
        .holders
        .iter()
        .any(|h| h.id == id || h.node.as_deref() == Some(id))
}

/// The holders' ids, sorted, as `rebootctl status` shows them.
pub async fn holder_ids(s: &(impl Admin + ?Sized)) -> Vec<String> {
    let mut ids: Vec<String> = s
        .status()
        .await
        .expect("status")
        .holders
        .into_iter()
        .map(|h| h.id)
        .collect();
    ids.sort();
    ids
}

/// Await `fut`, failing with `what` if it is not done within [`STORE_WAIT`].
pub async fn within<T>(what: &str, fut: impl Future<Output = T>) -> T {
    tokio::time::timeout(STORE_WAIT, fut)
        .await
        .unwrap_or_else(|_| panic!("{what}: not done within {STORE_WAIT:?}"))
}

/// Assert `fut` does NOT finish within `d` (a negative check, not synchronisation).
pub async fn not_within<F: Future + Unpin>(what: &str, d: Duration, fut: &mut F) {
    if tokio::time::timeout(d, fut).await.is_ok() {
        panic!("{what}: finished, but should still be waiting");
    }
}
