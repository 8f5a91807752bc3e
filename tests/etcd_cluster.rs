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

/// rebootd's v2 client (`src/etcd_v2/client.rs`) with its first endpoint on a member cut off
/// from the other two: that member still answers, but every quorum read and every write it gets
/// fails after etcd's request time-out (7 s) with `Raft Internal Error` (`etcdserver: request
/// timed out`, code 300), while its local reads answer stale data at once. Found by the chaos
/// trials on a 3-member etcd (RELIABILITY.md, finding 10): the client moved on to the next
/// endpoint only when one did not answer at all, so it kept asking the member cut off for as
/// long as the partition lasted, with two healthy members listed. Now a member without a quorum
/// (codes 300 and 301) counts as unreachable: the same call goes on to the next endpoint, and
/// the calls after it start there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_v2_client_moves_off_a_member_cut_off_from_the_others() {
    use rebootd::etcd_v2::{Get, KeysClient, Put, Settings, Timeouts};
    for v in EtcdVersion::available() {
        let c = EtcdCluster::start(v, 3, true).await.unwrap();
        let cut = (leader(&c).await + 1) % 3;
        let mut endpoints = vec![c.endpoint(cut)];
        endpoints.extend((0..3).filter(|i| *i != cut).map(|i| c.endpoint(i)));
        let client = KeysClient::new(&Settings {
            endpoints,
            tls: rebootd::http::TlsFiles {
                table: "lock.etcd",
                ..rebootd::http::TlsFiles::default()
            },
            basic_auth: None,
            timeouts: Timeouts::default(),
        })
        .unwrap();
        client.put("/k", "1", Put::default()).await.unwrap();
        c.cut_off(cut, CutMode::Blackhole);
        let quorum = Get {
            quorum: true,
            ..Get::default()
        };
        // The first call waits out the member's time-out, then gets its answer elsewhere.
        let r = client.get("/k", quorum).await;
        assert_eq!(r.unwrap().node.value.as_deref(), Some("1"), "{v}");
        // The next ones go to a member with a quorum at once.
        let t = Instant::now();
        client.put("/k", "2", Put::default()).await.unwrap();
        let r = client.get("/k", quorum).await.unwrap();
        assert_eq!(r.node.value.as_deref(), Some("2"), "{v}");
        assert!(
            t.elapsed() < Duration::from_secs(3),
            "{v}: {:?}",
            t.elapsed()
        );
        c.reconnect();
    }
}
