//! One contract, every lock store: the etcd v3 store and the v2 store (locksmith's semaphore) on
//! real etcd 3.4 and 3.5, and the Lease store on the lab's Kubernetes API stand-in, all through
//! the `Semaphore` and `Admin` traits, each client with its own connection. The contract: `max`
//! is respected, a release hands the slot to the waiters first come, first served, `unlock` by
//! an operator frees a holder's slot (and its fence says so), a new `max` is seen by a waiting
//! client, `set-max` below the holders needs force (and then lets nobody in until they are
//! fewer than `max`), taking twice and giving back twice write nothing, a holder restarted with
//! its token still holds its slot while another host with the same machine id (another token) is
//! never admitted, and `max_hold` reclaims only holders that stopped beating, never without
//! `max_hold`, a pause set between a client's read and its wait is seen by the wait, and a
//! semaphore the store cannot understand is refused by every call and never written over. A
//! scenario that holds for every store belongs here, not in a store's own file.
//! Synchronisation is by log events and task completion; the few timeouts expected to expire
//! assert that something does NOT happen.

use rebootd::state::Phase;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rebootd::config;
use rebootd::lock::{Acquired, Fence, Identity, LockError, Pauses, Reported};
use rebootd_lab::cut_proxy::{CutMode, CutProxy};
use rebootd_lab::kube_api::Options;

/// locksmith's document of the default group (etcd v3 and v2).
const SEMAPHORE_KEY: &str = "coreos.com/updateengine/rebootlock/semaphore";

mod common;
use common::in_process::{a_pause, holder_ids, holds, me, not_within, within};
use common::logs::Logs;
use common::stores::{every_store, run_on, Kind, Store, World};

impl World {
    /// A plain etcd v3 client of the test's etcd, beside the stores.
    async fn v3_client(&self) -> etcd_client::Client {
        let etcd = self.etcd.as_ref().expect("etcd");
        etcd_client::Client::connect([etcd.endpoint()], None)
            .await
            .expect("test client")
    }

    /// A mark that changes whenever anything is written to the store: etcd's revision (v3), the
    /// count of v2 writes etcd reports, the stand-in's resourceVersion (Leases).
    async fn writes(&self) -> String {
        match self.kind {
            Kind::V3(_) => {
                let mut c = self.v3_client().await;
                let header = c.get("any", None).await.expect("get");
                format!("revision {}", header.header().expect("header").revision())
            }
            Kind::V2(_) => {
                let etcd = self.etcd.as_ref().expect("etcd");
                let out = std::process::Command::new("curl")
                    .args(["-sS", &format!("{}/metrics", etcd.endpoint())])
                    .output()
                    .expect("curl /metrics");
                let writes: f64 = String::from_utf8_lossy(&out.stdout)
                    .lines()
                    .filter(|l| l.starts_with("etcd_debugging_store_writes_total{"))
                    .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                    .sum();
                format!("{writes} v2 writes")
            }
            Kind::Lease => {
                let api = self.api.as_ref().expect("API stand-in");
                format!("resourceVersion {}", api.cluster().resource_version())
            }
        }
    }

    /// Values the store cannot understand where it keeps the group's slot count: locksmith's
    /// document (etcd v3 and v2), the control Lease's max annotation (Leases).
    fn corruptions(&self) -> &'static [&'static str] {
        match self.kind {
            Kind::V3(_) | Kind::V2(_) => &[
                "not json",
                r#"{"semaphore":"x"}"#,
                r#"{"semaphore":1,"max":1,"holders":[],"extra":true}"#,
            ],
            Kind::Lease => &["lots"],
        }
    }

    /// Write `bad` (one of [`World::corruptions`]) where the store keeps the group's slot
    /// count; returns the key a `Corrupt` error names.
    async fn corrupt(&self, bad: &str) -> String {
        match self.kind {
            Kind::V3(_) => {
                let mut c = self.v3_client().await;
                c.put(SEMAPHORE_KEY, bad, None).await.expect("put");
                SEMAPHORE_KEY.to_string()
            }
            Kind::V2(_) => {
                let etcd = self.etcd.as_ref().expect("etcd");
                let encoded: String = bad
                    .bytes()
                    .map(|b| match b {
                        b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' => (b as char).to_string(),
                        _ => format!("%{b:02X}"),
                    })
                    .collect();
                let path = format!("/v2/keys/{SEMAPHORE_KEY}");
                let body = format!("value={encoded}");
                let (code, out) = etcd.curl_v2("PUT", &path, Some(&body)).expect("v2 put");
                assert!(code == 200 || code == 201, "{code} {out}");
                format!("/{SEMAPHORE_KEY}")
            }
            Kind::Lease => {
                let api = self.api.as_ref().expect("API stand-in");
                let key = "rebootd.io/max";
                api.cluster()
                    .update(
                        rebootd_lab::kube_api::Kind::Lease,
                        "rebootd",
                        "reboot",
                        |l| {
                            l["metadata"]["annotations"][key] = bad.into();
                        },
                    )
                    .expect("the control Lease");
                key.to_string()
            }
        }
    }

    /// What the store holds where it keeps the slot count, with its version: any write there
    /// changes it.
    async fn semaphore_raw(&self) -> String {
        match self.kind {
            Kind::V3(_) => {
                let mut c = self.v3_client().await;
                let r = c.get(SEMAPHORE_KEY, None).await.expect("get");
                let kv = r.kvs().first().expect("the document");
                format!(
                    "{} at {}",
                    String::from_utf8_lossy(kv.value()),
                    kv.mod_revision()
                )
            }
            Kind::V2(_) => {
                let etcd = self.etcd.as_ref().expect("etcd");
                let path = format!("/v2/keys/{SEMAPHORE_KEY}");
                let (_, body) = etcd.curl_v2("GET", &path, None).expect("v2 get");
                let v: serde_json::Value = serde_json::from_str(&body).expect("v2 answer");
                format!("{} at {}", v["node"]["value"], v["node"]["modifiedIndex"])
            }
            Kind::Lease => {
                let api = self.api.as_ref().expect("API stand-in");
                let lease = api.cluster().lease("rebootd", "reboot");
                lease.expect("the control Lease").to_string()
            }
        }
    }

    /// A new client of the store (its own connection), as `who` (the API stand-in's user).
    async fn store(&self, who: &str, max_hold: Option<Duration>) -> Arc<dyn Store> {
        self.store_via(who, max_hold, None).await
    }

    /// [`World::store`], through `proxy` when given: then with a queue entry that lives 2 s and
    /// requests that give up after 1 s, so that a cut is a break in contact and shows as errors.
    async fn store_via(
        &self,
        who: &str,
        max_hold: Option<Duration>,
        proxy: Option<&CutProxy>,
    ) -> Arc<dyn Store> {
        let (ttl, request) = match proxy {
            Some(_) => (Duration::from_secs(2), Duration::from_secs(1)),
            None => (Duration::from_secs(30), Duration::from_secs(10)),
        };
        let etcd = |api| self.etcd_settings(api, proxy.map(CutProxy::url));
        match self.kind {
            Kind::V3(_) => {
                let t = rebootd::lock::etcd_v3::Timeouts {
                    backoff_min: Duration::from_millis(50),
                    backoff_max: Duration::from_millis(500),
                    queue_ttl: ttl,
                    request,
                    ..Default::default()
                };
                let s = rebootd::lock::etcd_v3::EtcdSemaphore::connect_with(
                    &etcd(config::EtcdApi::V3),
                    "default",
                    max_hold,
                    t,
                )
                .await
                .expect("connect v3");
                Arc::new(s)
            }
            Kind::V2(_) => {
                let mut t = rebootd::lock::etcd_v2::Timeouts {
                    backoff_min: Duration::from_millis(50),
                    backoff_max: Duration::from_millis(500),
                    queue_ttl: ttl,
                    ..Default::default()
                };
                t.client.request = request;
                let s = rebootd::lock::etcd_v2::EtcdV2Semaphore::connect_with(
                    &etcd(config::EtcdApi::V2),
                    "default",
                    max_hold,
                    t,
                )
                .await
                .expect("connect v2");
                Arc::new(s)
            }
            Kind::Lease => {
                let api = self.api.as_ref().expect("API stand-in");
                let client = self.kube_client(who, proxy.map(CutProxy::url)).await;
                let settings = config::KubeLease {
                    namespace: "rebootd".into(),
                    name: "reboot".into(),
                    kubeconfig: None,
                    zone_label: rebootd::config::DEFAULT_ZONE_LABEL.into(),
                    node_selector: None,
                };
                let t = rebootd::lock::kube_lease::Timeouts {
                    request: request.min(Duration::from_secs(3)),
                    backoff_min: Duration::from_millis(50),
                    backoff_max: Duration::from_millis(500),
                    waiter_ttl: ttl,
                    ..Default::default()
                };
                let s =
                    rebootd::lock::kube_lease::KubeLeaseSemaphore::new(client, &settings, max_hold)
                        .with_timeouts(t)
                        .with_target(api.base_url());
                Arc::new(s)
            }
        }
    }
}

async fn run<F, Fut>(kind: Kind, scenario: F)
where
    F: FnOnce(World) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    run_on(kind, Options::default(), scenario).await
}

every_store!(run:
    max_is_respected,
    a_release_hands_the_slot_over_first_come_first_served,
    an_operator_unlock_frees_the_slot_and_the_fence_says_so,
    a_new_max_is_seen_by_a_waiting_client,
    a_restarted_holder_keeps_its_slot_and_a_stranger_with_its_id_is_not_admitted,
    max_hold_reclaims_only_holders_that_stopped_beating,
    a_waiter_cut_off_from_the_store_counts_silence_afresh,
    set_max_below_the_holders_needs_force,
    taking_twice_and_giving_back_twice_write_nothing,
    the_take_writes_the_first_phase_so_its_report_writes_nothing,
    a_pause_set_between_the_read_and_the_wait_is_seen,
    a_semaphore_it_cannot_understand_is_refused_and_left_untouched,
);

/// The holders' ids, sorted, as `rebootctl status` shows them.
async fn holders(s: &Arc<dyn Store>) -> Vec<String> {
    holder_ids(&**s).await
}

/// `x` acquiring on its own client; its id is sent on `took` once it holds.
async fn spawn_acquirer(
    w: &World,
    x: &str,
    max_hold: Option<Duration>,
    took: &tokio::sync::mpsc::UnboundedSender<String>,
) -> (Arc<dyn Store>, tokio::task::JoinHandle<()>) {
    let s = w.store(&format!("node-{x}"), max_hold).await;
    let (s2, x, took) = (s.clone(), x.to_owned(), took.clone());
    let task = tokio::spawn(async move {
        s2.acquire(&me(&x)).await.expect("acquire");
        let _ = took.send(x);
    });
    (s, task)
}

/// Wait until `x` says it waits at `position` in the queue.
async fn waits_at(logs: &mut Logs, x: &str, position: usize) {
    logs.expect(&[
        "waiting for a free slot",
        &format!("id=m-{x} "),
        &format!("position={position} "),
    ])
    .await;
}

// ---------------------------------------------------------------------------------------------
// the contract

/// Five clients, `max = 2`: never more than two hold at once, as the clients see it.
async fn max_is_respected(w: World) {
    let admin = w.store("admin", None).await;
    admin.set_max(2, false).await.expect("set-max 2");
    let holding = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for i in 0..5 {
        let s = w.store(&format!("node-{i}"), None).await;
        let (holding, most) = (holding.clone(), most.clone());
        tasks.push(tokio::spawn(async move {
            let id = me(&i.to_string());
            s.acquire(&id).await.expect("acquire");
            let now = holding.fetch_add(1, Ordering::SeqCst) + 1;
            most.fetch_max(now, Ordering::SeqCst);
            // Hold across a round trip to the store, so the holds overlap.
            assert!(s.status().await.expect("status").holders.len() <= 2);
            holding.fetch_sub(1, Ordering::SeqCst);
            s.release(&id).await.expect("release");
        }));
    }
    for t in tasks {
        within("acquirer", t).await.expect("acquirer task");
    }
    let most = most.load(Ordering::SeqCst);
    assert!((1..=2).contains(&most), "{most} held at once with max 2");
    assert!(holders(&admin).await.is_empty());
}

/// Three waiters queued in a known order take the slot in that order, one release after the
/// other.
async fn a_release_hands_the_slot_over_first_come_first_served(mut w: World) {
    let h = w.store("node-h", None).await;
    within("h", h.acquire(&me("h"))).await.expect("h");
    let (took_tx, mut took) = tokio::sync::mpsc::unbounded_channel();
    let order = ["c", "a", "b"];
    let mut clients = std::collections::BTreeMap::new();
    for (i, x) in order.iter().enumerate() {
        let (s, task) = spawn_acquirer(&w, x, None, &took_tx).await;
        waits_at(&mut w.logs, x, i + 1).await;
        clients.insert(*x, (s, task));
    }
    h.release(&me("h")).await.expect("release h");
    let mut served = Vec::new();
    for _ in order {
        let next = within("the next holder", took.recv())
            .await
            .expect("a holder");
        let (s, task) = clients.remove(next.as_str()).expect("a client");
        within("its task", task).await.expect("task");
        assert_eq!(holders(&s).await, vec![format!("m-{next}")], "one holder");
        s.release(&me(&next)).await.expect("release");
        served.push(next);
    }
    assert_eq!(served, order, "first come, first served");
}

/// `unlock` of a holder by an operator gives its slot to the waiter; the old holder's fence says
/// it lost it.
async fn an_operator_unlock_frees_the_slot_and_the_fence_says_so(mut w: World) {
    let a = w.store("node-a", None).await;
    within("a", a.acquire(&me("a"))).await.expect("a");
    assert_eq!(a.fence(&me("a")).await.expect("fence"), Fence::Held);
    let (took_tx, mut took) = tokio::sync::mpsc::unbounded_channel();
    let (_b, b_task) = spawn_acquirer(&w, "b", None, &took_tx).await;
    waits_at(&mut w.logs, "b", 1).await;

    let operator = w.store("operator", None).await;
    operator.unlock("m-a").await.expect("unlock");
    assert_eq!(within("b", took.recv()).await.as_deref(), Some("b"));
    within("b's task", b_task).await.expect("task");
    assert_eq!(holders(&operator).await, vec!["m-b".to_owned()]);
    match a.fence(&me("a")).await.expect("fence") {
        Fence::Lost { why } => assert!(!why.is_empty()),
        Fence::Held => panic!("a's fence says it holds a slot it lost"),
    }
    // Unlocking what is not held is no error.
    operator.unlock("m-a").await.expect("unlock again");
}

/// A client waiting with `max = 1` taken sees `set-max 2` made elsewhere and takes the new slot.
async fn a_new_max_is_seen_by_a_waiting_client(mut w: World) {
    let a = w.store("node-a", None).await;
    within("a", a.acquire(&me("a"))).await.expect("a");
    let (took_tx, mut took) = tokio::sync::mpsc::unbounded_channel();
    let (_b, b_task) = spawn_acquirer(&w, "b", None, &took_tx).await;
    waits_at(&mut w.logs, "b", 1).await;

    let operator = w.store("operator", None).await;
    operator.set_max(2, false).await.expect("set-max 2");
    assert_eq!(within("b", took.recv()).await.as_deref(), Some("b"));
    within("b's task", b_task).await.expect("task");
    let st = operator.status().await.expect("status");
    assert_eq!((st.max, st.free), (2, 0));
    assert_eq!(holders(&operator).await, vec!["m-a", "m-b"]);
}

/// A holder whose daemon restarts (new connection, same machine id and token) holds its slot at
/// once; another host with the same machine id but its own token is reported and waits until
/// the slot is given back.
async fn a_restarted_holder_keeps_its_slot_and_a_stranger_with_its_id_is_not_admitted(
    mut w: World,
) {
    let before = w.store("node-a", None).await;
    within("a", before.acquire(&me("a"))).await.expect("a");
    drop(before);
    let after = w.store("node-a", None).await;
    within("a after a restart", after.acquire(&me("a")))
        .await
        .expect("a again");
    assert_eq!(after.fence(&me("a")).await.expect("fence"), Fence::Held);
    assert_eq!(holders(&after).await, vec!["m-a"]);

    let stranger = Identity {
        token: "t-another-host".into(),
        boot_id: "boot-another-host".into(),
        ..me("a")
    };
    let s = w.store("node-a", None).await;
    assert!(
        matches!(s.fence(&stranger).await.expect("fence"), Fence::Lost { .. }),
        "another token does not hold the slot"
    );
    // Its phase report proves nothing and does not make the slot its own (it wrote its token
    // into the holder's record on etcd v3 and Leases before).
    let report = s
        .report_phase(&stranger, Phase::Rebooting)
        .await
        .expect("report");
    assert_eq!(report, Reported::Unproven);
    assert_eq!(after.fence(&me("a")).await.expect("fence"), Fence::Held);
    assert!(matches!(
        s.fence(&stranger).await.expect("fence"),
        Fence::Lost { .. }
    ));
    let s2 = s.clone();
    let id = stranger.clone();
    let mut waiting = tokio::spawn(async move { s2.acquire(&id).await });
    w.logs
        .expect(&["ANOTHER HOST HOLDS A SLOT UNDER THIS MACHINE ID"])
        .await;
    not_within("the stranger", Duration::from_millis(700), &mut waiting).await;
    assert_eq!(holders(&after).await, vec!["m-a"]);
    after.release(&me("a")).await.expect("release");
    within("the stranger after the release", &mut waiting)
        .await
        .expect("task")
        .expect("acquire");
    assert_eq!(s.fence(&stranger).await.expect("fence"), Fence::Held);
}

/// With `max_hold`, a holder that beats keeps its slot however long it holds it; once it stops,
/// the head of the queue reclaims it after `max_hold` of silence and the old holder's fence says
/// so. Without `max_hold`, a silent holder is never reclaimed.
async fn max_hold_reclaims_only_holders_that_stopped_beating(mut w: World) {
    let max_hold = Duration::from_millis(800);
    let h = w.store("node-h", Some(max_hold)).await;
    within("h", h.acquire(&me("h"))).await.expect("h");
    let every = h.heartbeat_every().expect("holders beat with max_hold");
    assert_eq!(every, max_hold / 8);

    let (took_tx, mut took) = tokio::sync::mpsc::unbounded_channel();
    let (_r, r_task) = spawn_acquirer(&w, "r", Some(max_hold), &took_tx).await;
    waits_at(&mut w.logs, "r", 1).await;
    let beating = Instant::now();
    let mut tick = tokio::time::interval(every);
    while beating.elapsed() < max_hold * 3 {
        tick.tick().await;
        let fence = h.heartbeat(&me("h")).await.expect("heartbeat");
        assert_eq!(fence, Fence::Held, "reclaimed while beating");
    }
    assert!(!r_task.is_finished(), "a live holder's slot was taken");

    let stopped = Instant::now();
    assert_eq!(
        within("r reclaims", took.recv()).await.as_deref(),
        Some("r")
    );
    let after = stopped.elapsed();
    assert!(
        after >= max_hold - every,
        "reclaimed {after:?} after the last beat"
    );
    w.logs.expect(&["RECLAIMING", "m-h"]).await;
    match h.fence(&me("h")).await.expect("fence") {
        Fence::Lost { why } => assert!(!why.is_empty()),
        Fence::Held => panic!("the reclaimed holder's fence says it holds"),
    }
    assert!(
        matches!(
            h.heartbeat(&me("h")).await.expect("heartbeat"),
            Fence::Lost { .. }
        ),
        "a beat after the reclaim takes nothing back"
    );

    // r never beats; a waiter without max_hold waits on regardless.
    let patient = w.store("node-p", None).await;
    let mut waiting = tokio::spawn(async move { patient.acquire(&me("p")).await });
    waits_at(&mut w.logs, "p", 1).await;
    not_within("p without max_hold", max_hold * 2, &mut waiting).await;
    let r = w.store("node-r", None).await;
    assert_eq!(holders(&r).await, vec!["m-r"]);
    r.release(&me("r")).await.expect("release r");
    within("p after the release", &mut waiting)
        .await
        .expect("task")
        .expect("acquire");
}

/// A waiter cut off from the store for longer than its queue entry lives does not count the
/// holder's silence through the cut (RELIABILITY.md, finding 9): once the store answers it again,
/// the holder gets `max_hold` anew to show a sign of life, as if just seen. Before, the first
/// read after the cut found the holder silent past `max_hold` and took its slot over at once,
/// although the holder could not have written either.
async fn a_waiter_cut_off_from_the_store_counts_silence_afresh(mut w: World) {
    let max_hold = Duration::from_secs(3);
    let h = w.store("node-h", None).await;
    within("h", h.acquire(&me("h"))).await.expect("h");
    let proxy = CutProxy::start(w.upstream()).await.expect("proxy");
    let r = w.store_via("node-r", Some(max_hold), Some(&proxy)).await;
    let (r2, id) = (r.clone(), me("r"));
    let mut waiting = tokio::spawn(async move { r2.acquire(&id).await });
    waits_at(&mut w.logs, "r", 1).await;
    proxy.cut(CutMode::Blackhole);
    // Longer than max_hold and than r's entry lives: r's reclaim check falls in the cut.
    not_within(
        "r while cut off",
        max_hold + Duration::from_secs(2),
        &mut waiting,
    )
    .await;
    proxy.restore();
    let back = Instant::now();
    within("r reclaims", &mut waiting)
        .await
        .expect("task")
        .expect("acquire");
    let after = back.elapsed();
    assert!(
        after >= max_hold - Duration::from_millis(300),
        "the slot was taken over {after:?} after the store answered again: silence counted \
         through the cut"
    );
    w.logs.expect(&["counted afresh"]).await;
    w.logs.expect(&["RECLAIMING", "m-h"]).await;
}

/// `set-max` below the number of holders is refused, writing nothing, unless forced; forced, the
/// holders keep their slots, `free` goes below zero, and a waiter takes a slot only once the
/// holders are fewer than the new max. Growing again gives the waiters the new slots.
async fn set_max_below_the_holders_needs_force(mut w: World) {
    let operator = w.store("operator", None).await;
    operator.set_max(3, false).await.expect("set-max 3");
    let a = w.store("node-a", None).await;
    let b = w.store("node-b", None).await;
    within("a", a.acquire(&me("a"))).await.expect("a");
    within("b", b.acquire(&me("b"))).await.expect("b");

    let before = w.writes().await;
    match operator.set_max(1, false).await {
        Err(LockError::MaxBelowHolders {
            requested: 1,
            holders: 2,
        }) => {}
        other => panic!("expected MaxBelowHolders, got {other:?}"),
    }
    assert_eq!(w.writes().await, before, "the refusal wrote");
    let st = operator.status().await.expect("status");
    assert_eq!((st.max, st.free), (3, 1));

    operator.set_max(1, true).await.expect("set-max 1, forced");
    let st = operator.status().await.expect("status");
    assert_eq!((st.max, st.free), (1, -1));
    assert_eq!(holders(&operator).await, vec!["m-a", "m-b"]);
    // Both still hold their slots: a forced shrink frees nobody's.
    for (s, x) in [(&a, "a"), (&b, "b")] {
        assert_eq!(s.fence(&me(x)).await.expect("fence"), Fence::Held, "{x}");
        assert_eq!(s.heartbeat(&me(x)).await.expect("beat"), Fence::Held, "{x}");
    }

    let (took_tx, mut took) = tokio::sync::mpsc::unbounded_channel();
    let (_c, c_task) = spawn_acquirer(&w, "c", None, &took_tx).await;
    waits_at(&mut w.logs, "c", 1).await;
    b.release(&me("b")).await.expect("release b");
    let st = operator.status().await.expect("status");
    assert_eq!((st.max, st.free), (1, 0));
    let mut next = Box::pin(took.recv());
    not_within(
        "c while a holds the only slot",
        Duration::from_millis(700),
        &mut next,
    )
    .await;
    a.release(&me("a")).await.expect("release a");
    assert_eq!(within("c", &mut next).await.as_deref(), Some("c"));
    within("c's task", c_task).await.expect("task");
    assert_eq!(holders(&operator).await, vec!["m-c"]);

    operator.set_max(3, false).await.expect("set-max 3");
    let st = operator.status().await.expect("status");
    assert_eq!((st.max, st.free), (3, 2));
}

/// Taking a slot one holds, giving it back twice and unlocking a machine that holds nothing all
/// succeed and write nothing to the store; a phase report without a slot takes none.
async fn taking_twice_and_giving_back_twice_write_nothing(w: World) {
    let a = w.store("node-a", None).await;
    within("a", a.acquire(&me("a"))).await.expect("a");
    let before = w.writes().await;
    within("a again", a.acquire(&me("a")))
        .await
        .expect("a again");
    assert_eq!(w.writes().await, before, "the second acquire wrote");
    assert_eq!(holders(&a).await, vec!["m-a"]);
    assert!(holds(&*a, "m-a").await);
    assert!(!holds(&*a, "m-b").await);

    a.release(&me("a")).await.expect("release");
    assert!(!holds(&*a, "m-a").await);
    let before = w.writes().await;
    a.release(&me("a")).await.expect("release again");
    let operator = w.store("operator", None).await;
    operator
        .unlock("m-a")
        .await
        .expect("unlock of a non-holder");
    operator
        .unlock("m-never-held")
        .await
        .expect("unlock of an unknown id");
    assert_eq!(w.writes().await, before, "giving back nothing wrote");
    // A report without a slot takes none and proves nothing. (The v2 store writes once here,
    // whatever it writes is no slot: not asserted as "no write" on every store.)
    let report = a
        .report_phase(&me("a"), Phase::Rebooting)
        .await
        .expect("report without a slot");
    assert_eq!(report, Reported::Unproven, "a report without a slot");
    let st = operator.status().await.expect("status");
    assert_eq!((st.max, st.free), (1, 1));
    assert!(st.holders.is_empty(), "{:?}", st.holders);
}

/// The take writes the phase the holder enters with its slot (`acquire_unless_paused`'s
/// `first`): `rebootctl status` shows it at once, and the first report, of that phase, finds it
/// on record and writes nothing (one request less per reboot). The next phase is written as
/// ever, and proves the slot held.
async fn the_take_writes_the_first_phase_so_its_report_writes_nothing(w: World) {
    let a = w.store("node-a", None).await;
    let taken = within("a", a.acquire_unless_paused(&me("a"), Phase::Draining)).await;
    assert_eq!(taken.expect("a"), Acquired::Held);
    let before = w.writes().await;
    let report = a.report_phase(&me("a"), Phase::Draining).await;
    assert_eq!(
        report.expect("report"),
        Reported::Unproven,
        "written already"
    );
    assert_eq!(w.writes().await, before, "the first report wrote");
    let operator = w.store("operator", None).await;
    let st = operator.status().await.expect("status");
    assert_eq!(st.holders.len(), 1, "{:?}", st.holders);
    assert_eq!(st.holders[0].phase.as_deref(), Some("draining"));

    let report = a.report_phase(&me("a"), Phase::Rebooting).await;
    assert_ne!(w.writes().await, before, "the next phase is written");
    let st = operator.status().await.expect("status");
    assert_eq!(st.holders[0].phase.as_deref(), Some("rebooting"));
    if !matches!(w.kind, Kind::V2(_)) {
        // (On v2 a report on the take's kept read proves nothing: finding 11.)
        assert_eq!(report.expect("report"), Reported::Held);
    }
}

/// A pause set after a client read the group's pause and before it waits for a change is seen
/// by that wait (it waits from what it read); the next wait, from the pause it knows, sees the
/// pause as it is now, and so does a resume.
async fn a_pause_set_between_the_read_and_the_wait_is_seen(w: World) {
    let a = w.store("node-a", None).await;
    let operator = w.store("operator", None).await;
    let (first, second) = (a_pause("first"), a_pause("second"));
    assert_eq!(Pauses::group_pause(&*a).await.expect("read"), None);
    operator.pause_group(&first).await.expect("pause");
    let changed = within("the pause seen", a.group_pause_changed(None)).await;
    assert_eq!(changed.expect("wait"), Some(first.clone()));

    operator.pause_group(&second).await.expect("pause again");
    let changed = within("the new pause seen", a.group_pause_changed(Some(&first))).await;
    assert_eq!(changed.expect("wait"), Some(second.clone()));
    operator.resume_group().await.expect("resume");
    let changed = within("the resume seen", a.group_pause_changed(Some(&second))).await;
    assert_eq!(changed.expect("wait"), None);
    assert_eq!(Pauses::group_pause(&*a).await.expect("read"), None);
}

/// Where the store keeps the group's slot count holds something it cannot understand: every
/// call says `Corrupt` (naming the key and the value), none writes over it, not even a client
/// with `max_hold` that would reclaim at once.
async fn a_semaphore_it_cannot_understand_is_refused_and_left_untouched(w: World) {
    let a = w.store("node-a", Some(Duration::from_millis(1))).await;
    a.set_max(1, false).await.expect("set-max 1");
    for bad in w.corruptions() {
        let key = w.corrupt(bad).await;
        let before = w.semaphore_raw().await;
        let check = |what: &str, r: Result<(), LockError>| match r {
            Err(LockError::Corrupt {
                key: k,
                value,
                reason,
            }) => {
                assert!(k.contains(&key), "{what} on {bad:?}: key {k}, not {key}");
                assert_eq!(value, *bad, "{what}");
                assert!(!reason.is_empty(), "{what}");
            }
            other => panic!("{what} on {bad:?}: expected Corrupt, got {other:?}"),
        };
        check("acquire", within("acquire", a.acquire(&me("a"))).await);
        check("unlock", a.unlock("m-a").await);
        check("set_max", a.set_max(2, false).await);
        check("set_max --force", a.set_max(3, true).await);
        let report = a.report_phase(&me("a"), Phase::Rebooting).await;
        check("report_phase", report.map(drop));
        check("fence", a.fence(&me("a")).await.map(drop));
        check("status", a.status().await.map(drop));
        assert_eq!(w.semaphore_raw().await, before, "{bad:?} was written over");
    }
}
