//! A reclaim of a holder judged stopped (`max_hold`) and that holder's own write, on each etcd
//! store against a real etcd: whichever lands first makes the other fail. The waiter's steps
//! are driven one by one (its read, then the reclaim it decided on that read), so each order is
//! made on purpose, not by timing. The runtime's proof before the cordon and the reboot is such
//! a write where `max_hold` is set (RELIABILITY.md, finding 7); this is what makes it a proof
//! that lasts until the reboot lands. The Lease store runs the same scenarios on the lab's API
//! server stand-in (its reclaim replaces the holder's Lease by the resourceVersion it judged
//! silent, which every holder write moves).

use std::time::Duration;

use rebootd_lab::etcd::{EtcdOptions, EtcdServer, EtcdVersion};
use rebootd_lab::kube_api::{KubeApi, KubeApiHandle, Options};

use super::acquire::Waiting;
use super::etcd_v2::{EtcdV2Semaphore, Timeouts};
use super::etcd_v3::EtcdSemaphore;
use super::kube_lease::KubeLeaseSemaphore;
use super::{Fence, Identity, Semaphore};
use crate::config;

pub(super) fn me(id: &str) -> Identity {
    Identity {
        id: id.into(),
        node: format!("node-{id}"),
        boot_id: format!("boot-{id}"),
        token: format!("t-{id}"),
        zone: None,
    }
}

/// A fresh etcd serving v2 too (`None`: none installed, which CI does not allow).
pub(super) async fn etcd() -> Option<EtcdServer> {
    let Some(v) = EtcdVersion::available().first().copied() else {
        assert!(std::env::var("CI").is_err(), "no etcd installed");
        return None;
    };
    let etcd = EtcdServer::start_with(v, EtcdOptions::v2()).await;
    Some(etcd.expect("start etcd"))
}

pub(super) fn settings(etcd: &EtcdServer, api: config::EtcdApi) -> config::Etcd {
    config::Etcd {
        api,
        endpoints: vec![etcd.endpoint()],
        ca_file: None,
        cert_file: None,
        key_file: None,
        username: None,
        password_file: None,
    }
}

const MAX_HOLD: Option<Duration> = Some(Duration::from_secs(60));

pub(super) async fn v2(etcd: &EtcdServer) -> EtcdV2Semaphore {
    let s = settings(etcd, config::EtcdApi::V2);
    EtcdV2Semaphore::connect_with(&s, "default", MAX_HOLD, Timeouts::default())
        .await
        .expect("connect v2")
}

async fn v3(etcd: &EtcdServer) -> EtcdSemaphore {
    let s = settings(etcd, config::EtcdApi::V3);
    EtcdSemaphore::connect(&s, "default", MAX_HOLD)
        .await
        .expect("connect v3")
}

/// `holder` takes the only slot as `h`; then the waiter `w` reads the semaphore.
pub(super) async fn held_then_read(holder: &dyn Semaphore, h: &Identity, w: &mut dyn Waiting) {
    holder.acquire(h).await.expect("h takes the slot");
    w.read().await.expect("the waiter reads");
    let view = w.view().expect("view");
    assert_eq!(view.holders.len(), 1, "{view:?}");
}

/// The holder writes (a heartbeat: the runtime's proof with `max_hold`) after the waiter's
/// read, before the reclaim decided on that read: the reclaim fails, the holder keeps its slot.
async fn write_first(holder: &dyn Semaphore, waiter: &dyn Semaphore, w: &mut dyn Waiting) {
    let (h, me_w) = (me("h"), me("w"));
    held_then_read(holder, &h, w).await;
    assert_eq!(holder.heartbeat(&h).await.expect("beat"), Fence::Held);
    assert!(
        !w.reclaim("h", true).await.expect("reclaim"),
        "the reclaim passed a holder that wrote its record after it was judged stopped"
    );
    assert_eq!(holder.fence(&h).await.expect("fence"), Fence::Held);
    assert_ne!(waiter.fence(&me_w).await.expect("fence"), Fence::Held);
}

/// The reclaim lands first: the holder's write then says its slot is lost.
async fn reclaim_first(holder: &dyn Semaphore, waiter: &dyn Semaphore, w: &mut dyn Waiting) {
    let (h, me_w) = (me("h"), me("w"));
    held_then_read(holder, &h, w).await;
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

/// Two stores on one fresh etcd (`None`: none installed), and what keeps it running.
async fn on_etcd<S>(connect: impl AsyncFn(&EtcdServer) -> S) -> Option<(EtcdServer, S, S)> {
    let etcd = etcd().await?;
    let (holder, waiter) = (connect(&etcd).await, connect(&etcd).await);
    Some((etcd, holder, waiter))
}

async fn on_etcd_v2() -> Option<(EtcdServer, EtcdV2Semaphore, EtcdV2Semaphore)> {
    on_etcd(v2).await
}

async fn on_etcd_v3() -> Option<(EtcdServer, EtcdSemaphore, EtcdSemaphore)> {
    on_etcd(v3).await
}

/// Two Lease semaphores (users node-h and node-w) on the lab's API server stand-in.
async fn on_leases() -> Option<(
    (KubeApiHandle, tempfile::TempDir),
    KubeLeaseSemaphore,
    KubeLeaseSemaphore,
)> {
    let api = KubeApi::start(Options::default())
        .await
        .expect("start the API stand-in");
    let dir = tempfile::tempdir().expect("tempdir");
    let settings = config::KubeLease {
        namespace: "rebootd".into(),
        name: "reboot".into(),
        kubeconfig: None,
        zone_label: crate::config::DEFAULT_ZONE_LABEL.into(),
        node_selector: None,
    };
    let mut stores = Vec::new();
    for user in ["node-h", "node-w"] {
        let path = dir.path().join(format!("kubeconfig-{user}"));
        api.write_kubeconfig_for(&path, user).expect("kubeconfig");
        let client = crate::kube_client::connect(Some(&path))
            .await
            .expect("client");
        stores
            .push(KubeLeaseSemaphore::new(client, &settings, MAX_HOLD).with_target(api.base_url()));
    }
    let waiter = stores.pop()?;
    let holder = stores.pop()?;
    Some(((api, dir), holder, waiter))
}

macro_rules! per_store {
    ($($name:ident: $stores:ident, $waiting:path, $scenario:ident;)*) => {$(
        #[tokio::test]
        async fn $name() {
            let Some((_running, holder, waiter)) = $stores().await else { return };
            let me_w = me("w");
            let mut w = $waiting(&waiter, &me_w);
            $scenario(&holder, &waiter, &mut w).await;
        }
    )*};
}

per_store! {
    v2_a_holder_write_after_the_waiters_read_makes_the_reclaim_fail:
        on_etcd_v2, super::etcd_v2::waiting::waiting, write_first;
    v2_a_reclaim_that_lands_first_makes_the_holders_write_say_lost:
        on_etcd_v2, super::etcd_v2::waiting::waiting, reclaim_first;
    v3_a_holder_write_after_the_waiters_read_makes_the_reclaim_fail:
        on_etcd_v3, super::etcd_v3::waiting::waiting, write_first;
    v3_a_reclaim_that_lands_first_makes_the_holders_write_say_lost:
        on_etcd_v3, super::etcd_v3::waiting::waiting, reclaim_first;
    leases_a_holder_write_after_the_waiters_read_makes_the_reclaim_fail:
        on_leases, super::kube_lease::waiting::waiting, write_first;
    leases_a_reclaim_that_lands_first_makes_the_holders_write_say_lost:
        on_leases, super::kube_lease::waiting::waiting, reclaim_first;
}
