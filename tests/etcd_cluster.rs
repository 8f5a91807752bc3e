//! The lab's multi-member etcd (`rebootd_lab::etcd_cluster`), on every etcd version installed:
//! three members come up and elect a leader, the leader found through the members' status is
//! killed and another takes over, and a member cut off from the others by the peer proxies
//! loses its quorum (its linearizable reads fail) while its clients still reach it and the
//! other two keep answering; reconnected, it answers again.

use rebootd_lab::cut_proxy::CutMode;
use rebootd_lab::etcd::EtcdVersion;
use rebootd_lab::etcd_cluster::EtcdCluster;
use std::time::{Duration, Instant};

/// A linearizable read through member `endpoint` alone, within `limit`.
async fn reads(endpoint: &str, limit: Duration) -> bool {
    let attempt = async {
        let mut c = etcd_client::Client::connect([endpoint], None).await.ok()?;
        c.get("k", None).await.ok()
    };
    matches!(tokio::time::timeout(limit, attempt).await, Ok(Some(_)))
}

/// The leader, once there is one (within 15 s).
async fn leader(c: &EtcdCluster) -> usize {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        if let Some(l) = c.leader().await {
            return l;
        }
        assert!(Instant::now() < deadline, "no leader within 15 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_members_elect_lose_their_leader_and_one_is_cut_off() {
    for v in EtcdVersion::available() {
        let mut c = EtcdCluster::start(v, 3, true).await.unwrap();
        for e in c.endpoints() {
            assert!(reads(&e, Duration::from_secs(5)).await, "{v}: {e}");
        }
        // The leader killed: another member leads.
        let first = leader(&c).await;
        c.mark(first, true);
        c.kill(first).await.unwrap();
        let second = leader(&c).await;
        assert_ne!(first, second, "{v}");
        c.restart(first).await.unwrap();
        c.mark(first, false);

        // A follower cut off: its clients reach it but it cannot serve a linearizable read;
        // the other two can.
        let leader_now = leader(&c).await;
        let cut = (leader_now + 1) % 3;
        c.cut_off(cut, CutMode::Blackhole);
        assert!(
            !reads(&c.endpoint(cut), Duration::from_secs(4)).await,
            "{v}: the member cut off still served a linearizable read"
        );
        for i in (0..3).filter(|i| *i != cut) {
            assert!(reads(&c.endpoint(i), Duration::from_secs(10)).await, "{v}");
        }
        c.reconnect();
        c.wait_ready(cut).await.unwrap();
        c.heal().await.unwrap();
    }
}
