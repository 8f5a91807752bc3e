//! `lock.max_per_zone` end to end on every store: the etcd v3 store and the v2 store on real
//! etcd (the versions of `tests/common`'s matrix; zones from `lock.zone`, carried in the holder
//! records and queue entries), and the Lease store on the lab's Kubernetes API stand-in under
//! the shipped admission policy (zones from each node's own Node label). The contract: never
//! more than `max_per_zone` holders in a zone beside the group's `max`; a waiter whose zone is
//! full is passed over, not in the way of the zones with room behind it; a holder whose zone is
//! unknown (locksmith's, on etcd) counts in every zone.
//!
//! `lock.max = "N%"`: on Leases a share of the Nodes a selector matches; on etcd (v3 and v2) a
//! share of the group's fleet records, holders and waiters, a gone node's record forgotten with
//! `rebootctl fleet forget`.

use std::sync::Arc;
use std::time::Duration;

use rebootd::config;
use rebootd::lock::Identity;
use rebootd_lab::kube_api::Options;

#[path = "common/admission.rs"]
mod admission;
mod common;
use common::in_process::{holder_ids, me, not_within, within};
use common::logs::Logs;
use common::stores::{every_store, run_on, Kind, Store, World};

/// Machine `x` of `zone` (`None`: a node that names none).
fn zoned(x: &str, zone: Option<&str>) -> Identity {
    Identity {
        zone: zone.map(Into::into),
        ..me(x)
    }
}

impl World {
    /// A client of the store for node `node-x`, with `max_per_zone`.
    async fn store(&self, x: &str, max_per_zone: Option<u64>) -> Arc<dyn Store> {
        match self.kind {
            Kind::Lease => Arc::new(self.lease_store(x, max_per_zone).await),
            _ => self.etcd_store(max_per_zone, None).await,
        }
    }

    /// A client of the etcd store (v3 or v2), with `max_per_zone` and `lock.max = "N%"`.
    async fn etcd_store(&self, max_per_zone: Option<u64>, percent: Option<u8>) -> Arc<dyn Store> {
        self.etcd_store_via(max_per_zone, percent, None).await
    }

    /// [`World::etcd_store`] through `endpoint` when given (a proxy).
    async fn etcd_store_via(
        &self,
        max_per_zone: Option<u64>,
        percent: Option<u8>,
        endpoint: Option<String>,
    ) -> Arc<dyn Store> {
        let fast = (Duration::from_millis(50), Duration::from_millis(500));
        match self.kind {
            Kind::V3(_) => {
                let t = rebootd::lock::etcd_v3::Timeouts {
                    backoff_min: fast.0,
                    backoff_max: fast.1,
                    ..Default::default()
                };
                let s = rebootd::lock::etcd_v3::EtcdSemaphore::connect_with(
                    &self.etcd_settings(config::EtcdApi::V3, endpoint),
                    "default",
                    None,
                    t,
                )
                .await
                .expect("connect v3");
                Arc::new(s.with_max_per_zone(max_per_zone).with_max_percent(percent))
            }
            Kind::V2(_) => {
                let t = rebootd::lock::etcd_v2::Timeouts {
                    backoff_min: fast.0,
                    backoff_max: fast.1,
                    ..Default::default()
                };
                let s = rebootd::lock::etcd_v2::EtcdV2Semaphore::connect_with(
                    &self.etcd_settings(config::EtcdApi::V2, endpoint),
                    "default",
                    None,
                    t,
                )
                .await
                .expect("connect v2");
                Arc::new(s.with_max_per_zone(max_per_zone).with_max_percent(percent))
            }
            Kind::Lease => panic!("not an etcd store"),
        }
    }

    async fn lease_store(
        &self,
        x: &str,
        max_per_zone: Option<u64>,
    ) -> rebootd::lock::kube_lease::KubeLeaseSemaphore {
        let api = self.api.as_ref().expect("API stand-in");
        // Nodes as the admission policy knows them; the administrator sets max.
        let who = match x {
            "admin" => "admin".to_owned(),
            x => format!("rebootd:node:node-{x}"),
        };
        let client = self.kube_client(&who, None).await;
        let settings = config::KubeLease {
            namespace: "rebootd".into(),
            name: "reboot".into(),
            kubeconfig: None,
            zone_label: config::DEFAULT_ZONE_LABEL.into(),
            node_selector: None,
        };
        let t = rebootd::lock::kube_lease::Timeouts {
            request: Duration::from_secs(3),
            backoff_min: Duration::from_millis(50),
            backoff_max: Duration::from_millis(500),
            ..Default::default()
        };
        rebootd::lock::kube_lease::KubeLeaseSemaphore::new(client, &settings, None)
            .with_timeouts(t)
            .with_target(api.base_url())
            .with_max_per_zone(max_per_zone)
    }

    /// A Lease client of node `node-x` with `lock.max = "20%"` of the Nodes `selector`
    /// matches.
    async fn share(&self, x: &str, selector: Option<&str>) -> Arc<dyn Store> {
        let s = self.lease_store(x, None).await.with_max_percent(Some(20));
        Arc::new(s.with_node_selector(selector.map(str::to_owned)))
    }

    /// Node `node-x` exists, in `zone` by its label (Leases: where the zone comes from).
    fn node(&self, x: &str, zone: Option<&str>) {
        let Some(api) = &self.api else {
            return;
        };
        let mut labels = serde_json::Map::new();
        if let Some(z) = zone {
            labels.insert(config::DEFAULT_ZONE_LABEL.into(), z.into());
        }
        let node = serde_json::json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": format!("node-{x}"), "labels": labels},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]},
        });
        api.cluster()
            .create(rebootd_lab::kube_api::Kind::Node, node)
            .expect("create the Node");
    }
}

/// Every store; Leases under the shipped admission policy.
async fn run<F, Fut>(kind: Kind, scenario: F)
where
    F: FnOnce(World) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let (hook, _) = admission::enforcing();
    let options = Options {
        admission: Some(hook),
        ..Options::default()
    };
    run_on(kind, options, scenario).await
}

every_store!(run:
    a_full_zone_waits_and_is_passed_over_by_a_zone_with_room,
    a_holder_of_unknown_zone_counts_in_every_zone,
);

/// Wait until `x` says it waits (at any place).
async fn waits(logs: &mut Logs, x: &str) {
    logs.expect(&["waiting for a free slot", &format!("id=m-{x} ")])
        .await;
}

/// `max = 3`, `max_per_zone = 1`: a1 holds in zone a; a2 (zone a) waits although two slots are
/// free; b1 (zone b), queued behind a2, takes a slot past it; a2 takes once a1 gives its slot
/// back.
async fn a_full_zone_waits_and_is_passed_over_by_a_zone_with_room(mut w: World) {
    let cap = Some(1);
    for (x, z) in [("a1", "a"), ("a2", "a"), ("b1", "b")] {
        w.node(x, Some(z));
    }
    let admin = w.store("admin", cap).await;
    admin.set_max(3, false).await.expect("set-max 3");
    let a1 = w.store("a1", cap).await;
    within("a1", a1.acquire(&zoned("a1", Some("a"))))
        .await
        .expect("a1 takes");

    let a2 = w.store("a2", cap).await;
    let a2_task = {
        let a2 = a2.clone();
        tokio::spawn(async move { a2.acquire(&zoned("a2", Some("a"))).await })
    };
    // It says why: its zone is full, not the group.
    w.logs
        .expect(&["waiting for a free slot", "id=m-a2 ", "zone_full=true"])
        .await;

    let b1 = w.store("b1", cap).await;
    within("b1, past a2", b1.acquire(&zoned("b1", Some("b"))))
        .await
        .expect("b1 takes");
    assert_eq!(holder_ids(&*admin).await, vec!["m-a1", "m-b1"]);

    let mut a2_task = a2_task;
    not_within(
        "a2 in a full zone",
        Duration::from_millis(1500),
        &mut a2_task,
    )
    .await;
    a1.release(&zoned("a1", Some("a")))
        .await
        .expect("a1 releases");
    within("a2", a2_task)
        .await
        .expect("a2 task")
        .expect("a2 takes");
    assert_eq!(holder_ids(&*admin).await, vec!["m-a2", "m-b1"]);
}

/// `max = 3`, `max_per_zone = 1`: a holder that names no zone (a rebootd before zones, whose
/// record or Lease has none; on Leases a Node without the label) fills every zone, so a1 waits
/// with two slots free, and takes once it is gone.
async fn a_holder_of_unknown_zone_counts_in_every_zone(mut w: World) {
    w.node("x", None);
    w.node("a1", Some("a"));
    let admin = w.store("admin", None).await;
    admin.set_max(3, false).await.expect("set-max 3");
    let x = w.store("x", None).await;
    within("x", x.acquire(&zoned("x", None)))
        .await
        .expect("x takes");
    let a1 = w.store("a1", Some(1)).await;
    let mut a1_task = tokio::spawn(async move { a1.acquire(&zoned("a1", Some("a"))).await });
    w.logs
        .expect(&["waiting for a free slot", "id=m-a1 ", "zone_full=true"])
        .await;
    not_within(
        "a1 beside a zoneless holder",
        Duration::from_millis(1500),
        &mut a1_task,
    )
    .await;
    x.release(&zoned("x", None)).await.expect("x releases");
    within("a1", a1_task)
        .await
        .expect("task")
        .expect("a1 takes");
    assert_eq!(holder_ids(&*admin).await, vec!["m-a1"]);
}

/// Leases, `lock.max = "20%"` over ten Nodes (the control Lease says 1): two nodes hold at once
/// and a third waits until one gives its slot back; `status` and the fleet view show that
/// share; with `node_selector` matching five of them, one.
#[tokio::test(flavor = "current_thread")]
async fn leases_max_as_a_share_of_the_nodes() {
    run(Kind::Lease, |mut w: World| async move {
        for i in 0..10 {
            w.node(&i.to_string(), Some(if i < 5 { "a" } else { "b" }));
        }
        let n0 = w.share("0", None).await;
        let n1 = w.share("1", None).await;
        within("0", n0.acquire(&me("0"))).await.expect("0 takes");
        within("1, the second of 20% of ten", n1.acquire(&me("1")))
            .await
            .expect("1 takes");
        // `rebootctl status` and `fleet` show the share and what it is of.
        let share = rebootd::lock::arbiter::share::Share {
            percent: 20,
            known: 10,
            stored_max: 1,
        };
        let status = n1.status().await.expect("status");
        assert_eq!((status.max, status.free, status.share), (2, 0, Some(share)));
        let read = rebootd::lock::Semaphore::fleet(&*n1)
            .expect("a fleet")
            .read_fleet()
            .await
            .expect("fleet");
        assert_eq!((read.view.max, read.share), (2, Some(share)));
        let n2 = w.share("2", None).await;
        let mut third = tokio::spawn(async move { n2.acquire(&me("2")).await });
        waits(&mut w.logs, "2").await;
        not_within("a third", Duration::from_millis(1500), &mut third).await;
        n1.release(&me("1")).await.expect("release 1");
        within("2", third).await.expect("task").expect("2 takes");
        let zone_a = format!("{}=a", config::DEFAULT_ZONE_LABEL);
        let n3 = w.share("3", Some(&zone_a)).await;
        let mut fourth = tokio::spawn(async move { n3.acquire(&me("3")).await });
        waits(&mut w.logs, "3").await;
        n0.release(&me("0")).await.expect("release 0");
        not_within(
            "20% of five is one, and 2 holds",
            Duration::from_millis(1500),
            &mut fourth,
        )
        .await;
        let n2 = w.share("2", None).await;
        n2.release(&me("2")).await.expect("release 2");
        within("3", fourth).await.expect("task").expect("3 takes");
    })
    .await;
}

/// One test per etcd store (v3 and v2, on each etcd version of the matrix).
macro_rules! etcd_stores {
    ($($name:ident),* $(,)?) => {
        mod etcd {
            use rebootd_lab::etcd::EtcdVersion;
            $(mod $name {
                use super::*;
                #[tokio::test(flavor = "current_thread")]
                async fn v3_etcd_3_4() {
                    super::super::run(super::super::Kind::V3(EtcdVersion::V34), super::super::$name).await
                }
                #[tokio::test(flavor = "current_thread")]
                async fn v3_etcd_3_5() {
                    super::super::run(super::super::Kind::V3(EtcdVersion::V35), super::super::$name).await
                }
                #[tokio::test(flavor = "current_thread")]
                async fn v2_etcd_3_4() {
                    super::super::run(super::super::Kind::V2(EtcdVersion::V34), super::super::$name).await
                }
                #[tokio::test(flavor = "current_thread")]
                async fn v2_etcd_3_5() {
                    super::super::run(super::super::Kind::V2(EtcdVersion::V35), super::super::$name).await
                }
            })*
        }
    };
}

etcd_stores!(
    max_as_a_share_of_the_fleet_records,
    a_share_costs_no_request_of_its_own,
    rebootctl_forgets_a_gone_nodes_record,
);

/// Node `node-x` wrote its fleet record (idle), as its rebootd does at its first step.
async fn publish(store: &dyn Store, x: &str) {
    let json = format!(
        r#"{{"node":"node-{x}","id":"m-{x}","phase":"idle","since":"2026-11-28T00:00:00Z"}}"#
    );
    let record = rebootd::fleet::NodeRecord::parse(json.as_bytes()).expect("a record");
    let fleet = rebootd::lock::Admin::fleet(store).expect("etcd keeps a fleet view");
    fleet.publish(&me(x), &record, None).await.expect("publish");
}

/// `rebootctl fleet forget who`, through the store's fleet side.
async fn forget(
    store: &dyn Store,
    who: &str,
) -> Result<String, rebootd::fleet::forget::ForgetError> {
    let fleet = rebootd::lock::Admin::fleet(store).expect("etcd keeps a fleet view");
    rebootd::fleet::forget::forget(fleet, who).await
}

/// etcd, `lock.max = "20%"` (the document says 1): with ten nodes' records, two nodes hold at
/// once and a third, without a record, waits: eleven known nodes (its record, written then,
/// counts once with it); status and the fleet view say why max is 2. A holder's and a waiter's
/// records are not forgotten; forgetting six gone nodes' records makes it 20% of five, one: a
/// new waiter waits while one node holds, and takes once it gives its slot back.
async fn max_as_a_share_of_the_fleet_records(mut w: World) {
    use rebootd::fleet::forget::ForgetError;
    use rebootd::lock::arbiter::share::Share;
    let admin = w.etcd_store(None, Some(20)).await;
    for i in (0..=10).filter(|i| *i != 2) {
        publish(&*admin, &i.to_string()).await;
    }
    let n0 = w.etcd_store(None, Some(20)).await;
    let n1 = w.etcd_store(None, Some(20)).await;
    within("0", n0.acquire(&me("0"))).await.expect("0 takes");
    within("1, the second of 20% of ten", n1.acquire(&me("1")))
        .await
        .expect("1 takes");
    let n2 = w.etcd_store(None, Some(20)).await;
    let mut third = tokio::spawn(async move { n2.acquire(&me("2")).await });
    waits(&mut w.logs, "2").await;
    not_within("a third", Duration::from_millis(1500), &mut third).await;

    let status = admin.status().await.expect("status");
    let share = Share {
        percent: 20,
        known: 11,
        stored_max: 1,
    };
    assert_eq!((status.max, status.free, status.share), (2, 0, Some(share)));
    publish(&*admin, "2").await;
    let status = admin.status().await.expect("status");
    assert_eq!(status.share.map(|s| s.known), Some(11), "m-2 counts once");
    // Without the share, the document's count: what locksmithd and a node without it go by.
    let plain = w
        .etcd_store(None, None)
        .await
        .status()
        .await
        .expect("status");
    assert_eq!((plain.max, plain.free, plain.share), (1, -1, None));
    let fleet = rebootd::lock::Admin::fleet(&*admin).expect("fleet");
    let read = fleet.read_fleet().await.expect("read the fleet");
    let text = rebootd::fleet::render::render(&rebootd::fleet::view::FleetView::of(
        &read,
        jiff::Timestamp::now(),
    ));
    assert!(
        text.contains(
            "2 of 2 slots held, 0 free (max 2 is 20% of 11 known nodes; the document says 1)"
        ),
        "{text}"
    );

    for (who, role) in [("m-0", "holds a slot"), ("node-2", "waits for a slot")] {
        match forget(&*admin, who).await {
            Err(ForgetError::Busy { role: r, .. }) => assert_eq!(r, role, "{who}"),
            other => panic!("{who}: {other:?}"),
        }
    }
    for i in 5..=10 {
        let who = if i % 2 == 0 {
            format!("node-{i}")
        } else {
            format!("m-{i}")
        };
        let name = forget(&*admin, &who).await.expect("forget a gone node");
        assert_eq!(name, format!("m-{i}"));
    }
    assert!(matches!(
        forget(&*admin, "node-9").await,
        Err(ForgetError::NotFound { .. })
    ));
    let status = admin.status().await.expect("status");
    assert_eq!((status.max, status.share.map(|s| s.known)), (1, Some(5)));

    // A new wait counts again: 20% of five is one, and 0 holds.
    third.abort();
    n1.release(&me("1")).await.expect("release 1");
    let n3 = w.etcd_store(None, Some(20)).await;
    let mut fourth = tokio::spawn(async move { n3.acquire(&me("3")).await });
    waits(&mut w.logs, "3").await;
    not_within(
        "20% of five is one, and 0 holds",
        Duration::from_millis(1500),
        &mut fourth,
    )
    .await;
    n0.release(&me("0")).await.expect("release 0");
    within("3", fourth).await.expect("task").expect("3 takes");
    assert_eq!(holder_ids(&*admin).await, vec!["m-3"]);
}

/// What one take and release of a slot by `store`, through `proxy`, cost: bytes from etcd and
/// (v2) requests etcd received.
async fn cycle(
    w: &World,
    store: &dyn Store,
    proxy: &rebootd_lab::count_proxy::CountProxy,
) -> (u64, u64) {
    let etcd = w.etcd.as_ref().expect("etcd");
    let (bytes, requests) = (proxy.counts().received, etcd.v2_requests().unwrap_or(0));
    within("take", store.acquire(&me("c"))).await.expect("take");
    store.release(&me("c")).await.expect("release");
    (
        proxy.counts().received - bytes,
        etcd.v2_requests().unwrap_or(0) - requests,
    )
}

/// etcd, ten nodes' records: a take and release with `lock.max = "20%"` sends no request more
/// than without. v3 reads the records in the waiter's own read transaction (the bytes show it,
/// and that they are not read without the setting); v2 has them in the directory it reads anyway.
async fn a_share_costs_no_request_of_its_own(w: World) {
    let admin = w.etcd_store(None, None).await;
    for i in 0..10 {
        publish(&*admin, &i.to_string()).await;
    }
    let proxy = rebootd_lab::count_proxy::CountProxy::start(w.upstream(), None)
        .await
        .expect("proxy");
    let plain = w.etcd_store_via(None, None, Some(proxy.url())).await;
    let share = w.etcd_store_via(None, Some(20), Some(proxy.url())).await;
    // The document is created by the first take: every cycle measured after it.
    cycle(&w, &*plain, &proxy).await;
    let (off, on) = (
        cycle(&w, &*plain, &proxy).await,
        cycle(&w, &*share, &proxy).await,
    );
    eprintln!("bytes, requests per cycle: without {off:?}, with lock.max = \"20%\" {on:?}");
    match w.kind {
        Kind::V2(_) => assert_eq!(on.1, off.1, "v2 requests: {off:?} {on:?}"),
        _ => {
            // Ten records of about 100 bytes each, only with the share.
            assert!(on.0 >= off.0 + 10 * 80, "v3 bytes: {off:?} {on:?}");
        }
    }
}

/// `rebootctl --config <this node's lock.max = "20%" on etcd> args`: (exit code, stdout, stderr).
async fn rebootctl(w: &World, args: &[&str]) -> (i32, String, String) {
    let etcd = w.etcd.as_ref().expect("etcd");
    let api = if matches!(w.kind, Kind::V2(_)) {
        "v2"
    } else {
        "v3"
    };
    let config = w.dir.path().join("rebootd.toml");
    let text = format!(
        "[lock]\nbackend = \"etcd\"\nmax = \"20%\"\n[lock.etcd]\nendpoints = [{:?}]\napi = \"{api}\"\n",
        etcd.endpoint()
    );
    std::fs::write(&config, text).expect("config");
    let run = tokio::process::Command::new(env!("CARGO_BIN_EXE_rebootctl"))
        .arg("--config")
        .arg(&config)
        .args(args)
        .env("STATE_DIRECTORY", w.dir.path())
        .output();
    let out = within("rebootctl", run).await.expect("run rebootctl");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// etcd: `rebootctl fleet forget` deletes a gone node's record by node name, refuses a holder's
/// (exit 1, saying why), and `rebootctl status` shows the share before and after.
async fn rebootctl_forgets_a_gone_nodes_record(w: World) {
    let admin = w.etcd_store(None, None).await;
    for i in 0..10 {
        publish(&*admin, &i.to_string()).await;
    }
    let n0 = w.etcd_store(None, Some(20)).await;
    within("0", n0.acquire(&me("0"))).await.expect("0 takes");
    let (code, out, err) = rebootctl(&w, &["status"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("1 of 2 slots free (max 2 is 20% of 10 known nodes; the document says 1)"),
        "{out}"
    );
    let (code, out, err) = rebootctl(&w, &["fleet", "forget", "node-0"]).await;
    assert_eq!(code, 1, "{out}");
    assert!(err.contains("not forgetting m-0: it holds a slot"), "{err}");
    for i in 5..10 {
        let (code, out, err) = rebootctl(&w, &["fleet", "forget", &format!("node-{i}")]).await;
        assert_eq!(code, 0, "{err}");
        assert!(
            out.contains(&format!("forgot the fleet record m-{i} of group default")),
            "{out}"
        );
    }
    let (code, out, err) = rebootctl(&w, &["status", "--json"]).await;
    assert_eq!(code, 0, "{err}");
    let status: serde_json::Value = serde_json::from_str(&out).expect("json");
    let sem = &status["semaphore"];
    assert_eq!(
        (sem["max"].as_u64(), sem["free"].as_i64()),
        (Some(1), Some(0)),
        "{sem}"
    );
    assert_eq!(
        sem["share"],
        serde_json::json!({"percent": 20, "known": 5, "stored_max": 1})
    );
}
