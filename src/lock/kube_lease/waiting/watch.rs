//! The watcher of the semaphore's Leases: its first list, in one request, and its errors as the
//! lock core sees them.

use futures_util::StreamExt;
use kube::runtime::watcher;

use super::super::snapshot::Snapshot;
use super::super::KubeLeaseSemaphore;
use super::LeaseEvents;
use crate::lock::LockError;

/// A watcher error as the lock core sees it.
pub(super) fn watch_error(store: &KubeLeaseSemaphore, e: watcher::Error) -> LockError {
    let what = "watching Leases";
    match e {
        watcher::Error::InitialListFailed(e) => store.classify("listing Leases", e).error,
        watcher::Error::WatchStartFailed(e) | watcher::Error::WatchFailed(e) => {
            store.classify(what, e).error
        }
        watcher::Error::WatchError(s) => store.status_error(what, &s),
        e => store.unreachable(format!("{what}: {e}")),
    }
}

/// A new watcher of the semaphore's Leases; its first events are a list, in one request
/// however long the queue: not in pages of 500 (kube-runtime's default), which made each read
/// of a 1000-node queue two or three requests where one answer serves. A real API server
/// answers the watcher's list (`resourceVersion=0`) from its watch cache, whole, whatever the
/// limit (Kubernetes 1.13 and later); a server that honours the limit now sends the whole list
/// too.
pub(super) fn lease_watcher(store: &KubeLeaseSemaphore) -> LeaseEvents {
    let mut config = watcher::Config::default()
        .labels(&store.selector)
        .timeout(store.timeouts.watch.as_secs().clamp(1, 290 * 60) as u32);
    config.page_size = None;
    watcher::watcher(store.leases.clone(), config).boxed()
}

/// The watcher's list, up to `InitDone`, within the request time limit.
pub(super) async fn initial(
    store: &KubeLeaseSemaphore,
    stream: &mut LeaseEvents,
) -> Result<Snapshot, LockError> {
    let list = async {
        let mut snap = Snapshot::empty();
        loop {
            match stream.next().await {
                Some(Ok(watcher::Event::Init)) => snap = Snapshot::empty(),
                Some(Ok(watcher::Event::InitApply(l) | watcher::Event::Apply(l))) => {
                    store.put_lease(&mut snap, l)
                }
                Some(Ok(watcher::Event::Delete(l))) => {
                    let name = l.metadata.name.unwrap_or_default();
                    store.drop_lease(&mut snap, &name);
                }
                Some(Ok(watcher::Event::InitDone)) => return Ok(snap),
                Some(Err(e)) => return Err(watch_error(store, e)),
                None => return Err(store.unreachable("the Lease list ended".into())),
            }
        }
    };
    match tokio::time::timeout(store.timeouts.request, list).await {
        Ok(r) => r,
        Err(_) => Err(store.unreachable(format!(
            "listing Leases: no answer within {:?}",
            store.timeouts.request
        ))),
    }
}
