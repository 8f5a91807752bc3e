//! Store-specific behaviour of the Kubernetes Lease store only (what holds for every store is in
//! lock_conformance.rs), against the lab's Kubernetes API stand-in over real HTTP: the objects
//! it creates, racing on one Lease, waiting by watch (not polling), 409 and 500 answers, reclaim
//! of holders whose Node is gone or who passed max_hold, slot Leases under set-max, waiter
//! Leases and their queue, request counts, and what kubectl sees. Every acquirer has its own
//! client and kubeconfig user, so the stand-in's request log tells who asked what.
//! Synchronisation is by events (log events, watches, task completion) with timeouts, never by
//! sleeping; the few timeouts expected to expire assert that something does NOT happen.

use rebootd::lock::Pauses;
use rebootd::state::Phase;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, ListParams, WatchEvent, WatchParams};
use rebootd::config;
use rebootd::lock::kube_lease::{self, KubeLeaseSemaphore, Timeouts};
use rebootd::lock::{Acquired, Admin, Identity, LockError, Reported, Semaphore};
use rebootd_lab::kube_api::{FaultRule, Kind, KubeApi, KubeApiHandle, NodeBuilder, Options};
use serde_json::{json, Value};
use tokio::time::Instant;

mod common;
use common::in_process::{a_pause, holds, me, not_within, within};
use common::logs::{self, Logs};

const NS: &str = "rebootd";
const NAME: &str = "reboot";

// ---------------------------------------------------------------------------------------------
// harness

struct Env {
    api: KubeApiHandle,
    dir: tempfile::TempDir,
    logs: Logs,
}

async fn run<F, Fut>(scenario: F)
where
    F: FnOnce(Env) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    // The runtime is current-thread, so every task of the test sees this subscriber.
    let (_guard, logs) = logs::capture_on_this_thread();
    let api = KubeApi::start(Options::default())
        .await
        .expect("start the API stand-in");
    let dir = tempfile::tempdir().expect("tempdir");
    scenario(Env { api, dir, logs }).await;
}

macro_rules! scenarios {
    ($($name:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "current_thread")]
            async fn $name() {
                run(scenarios::$name).await
            }
        )*
    };
}

scenarios!(
    first_use_creates_the_objects,
    two_racers_for_the_last_slot_exactly_one_wins,
    a_new_process_of_the_holder_writes_nothing_and_unlock_takes_a_node_name,
    waiter_is_woken_by_the_watch_and_never_polls,
    conflict_on_replace_is_retried,
    a_lost_race_waits_for_the_watch_not_a_list,
    a_lost_race_with_no_change_after_it_lists_again,
    server_errors_are_retried_with_backoff,
    holder_whose_node_is_deleted_is_reclaimed,
    holder_without_a_node_is_never_reclaimed_for_it,
    holder_past_max_hold_is_reclaimed,
    set_max_deletes_the_free_slot_leases_above_max,
    a_lease_of_another_owner_in_the_way_is_refused,
    kubectl_sees_the_holder,
    waiters_take_the_slot_in_fifo_order,
    a_release_wakes_only_the_first_waiter,
    a_dead_waiter_stops_blocking_after_its_ttl,
    a_restarted_waiter_keeps_its_place,
    status_and_set_max_ignore_waiter_leases,
    a_phase_report_is_one_request_whatever_other_holders_do,
    a_release_right_after_a_report_that_listed_is_one_request,
    a_wait_for_the_pause_right_after_reading_it_lists_it_once,
    a_wait_whose_start_is_gone_lists_the_pause_again,
    the_pause_comes_with_the_waiters_list_and_watch,
    a_waiter_far_back_watches_one_lease_ahead_not_the_semaphore,
    a_marker_watch_gone_410_watches_from_now_without_a_read,
    a_far_waiter_renews_half_as_often,
    a_read_of_a_long_queue_is_one_request,
    a_holders_reads_leave_the_waiter_leases_out,
    a_waiter_queued_ahead_of_fast_clocks_takes_the_free_slot_at_once,
    dead_waiters_ahead_hold_back_no_live_waiter,
);

/// The waiters queued ahead in the far-back scenarios: one more than makes a waiter far back.
const AHEAD: [&str; 17] = [
    "o00", "o01", "o02", "o03", "o04", "o05", "o06", "o07", "o08", "o09", "o10", "o11", "o12",
    "o13", "o14", "o15", "o16",
];
const _: () = assert!(AHEAD.len() == rebootd::lock::acquire::FAR_BACK + 1);

/// The first line machine `x` logs about its place: waiting (with its position) or took a slot.
async fn next_place(logs: &mut Logs, x: &str) -> String {
    let id = format!("id=m-{x}");
    loop {
        let line = logs.expect(&[&id]).await;
        if line.contains("waiting for a free slot") || line.contains("took a slot") {
            return line;
        }
    }
}

fn settings() -> config::KubeLease {
    config::KubeLease {
        namespace: NS.into(),
        name: NAME.into(),
        kubeconfig: None,
        zone_label: rebootd::config::DEFAULT_ZONE_LABEL.into(),
        node_selector: None,
    }
}

fn timeouts() -> Timeouts {
    Timeouts {
        request: Duration::from_secs(3),
        watch: Duration::from_secs(290),
        backoff_min: Duration::from_millis(50),
        backoff_max: Duration::from_millis(500),
        waiter_ttl: Duration::from_secs(30),
    }
}

/// A kubeconfig for `user` (the stand-in logs the user of every request).
fn kubeconfig(env: &Env, user: &str) -> PathBuf {
    let path = env.dir.path().join(format!("kubeconfig-{user}"));
    env.api
        .write_kubeconfig_for(&path, user)
        .expect("write kubeconfig");
    path
}

/// A client as rebootd builds it: from a kubeconfig, without kube-rs's own 429/503 retry.
async fn client(env: &Env, user: &str) -> kube::Client {
    let path = kubeconfig(env, user);
    let kc = kube::config::Kubeconfig::read_from(&path).expect("read kubeconfig");
    let mut cfg =
        kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
            .await
            .expect("kube config");
    cfg.default_retry = false;
    kube::Client::try_from(cfg).expect("kube client")
}

/// The semaphore as seen by machine `x` (its own client, user `node-x`).
async fn sem_with(
    env: &Env,
    x: &str,
    max_hold: Option<Duration>,
    t: Timeouts,
) -> KubeLeaseSemaphore {
    KubeLeaseSemaphore::new(
        client(env, &format!("node-{x}")).await,
        &settings(),
        max_hold,
    )
    .with_timeouts(t)
    .with_target(env.api.base_url())
}

async fn sem(env: &Env, x: &str) -> KubeLeaseSemaphore {
    sem_with(env, x, None, timeouts()).await
}

fn add_node(env: &Env, x: &str) {
    env.api
        .cluster()
        .add(&NodeBuilder::new(&format!("node-{x}")))
        .expect("add node");
}

fn lease(env: &Env, name: &str) -> Option<Value> {
    env.api.cluster().lease(NS, name)
}

fn slot(i: u64) -> String {
    format!("{NAME}-{i}")
}

fn waiter_lease(env: &Env, node: &str) -> Option<Value> {
    lease(env, &format!("{NAME}-waiter-{node}"))
}

/// The Leases in the store whose `rebootd.io/role` label is `role`.
fn leases_with_role(env: &Env, role: &str) -> Vec<Value> {
    env.api
        .cluster()
        .list(Kind::Lease, Some(NS))
        .into_iter()
        .filter(|l| {
            l.pointer("/metadata/labels/rebootd.io~1role")
                .and_then(Value::as_str)
                == Some(role)
        })
        .collect()
}

/// Names of the semaphore's waiter Leases in the store.
fn waiter_leases(env: &Env) -> Vec<String> {
    leases_with_role(env, kube_lease::ROLE_WAITER)
        .iter()
        .filter_map(|l| Some(l.pointer("/metadata/name")?.as_str()?.to_owned()))
        .collect()
}

/// An acquirer task for machine `x`: acquires, says so on `acquired`, holds until told, then
/// releases.
struct Acquirer {
    release: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

async fn spawn_acquirer(
    env: &Env,
    x: &'static str,
    t: Timeouts,
    acquired: tokio::sync::mpsc::UnboundedSender<&'static str>,
) -> Acquirer {
    let s = sem_with(env, x, None, t).await;
    let (release, release_rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        s.acquire(&me(x)).await.expect("acquire");
        acquired.send(x).unwrap();
        let _ = release_rx.await;
        s.unlock(&me(x).id).await.expect("release");
    });
    Acquirer { release, task }
}

impl Acquirer {
    async fn release(self) {
        self.release.send(()).unwrap();
        within("release", self.task).await.unwrap();
    }
}

fn holder_of(l: &Value) -> Option<&str> {
    l.pointer("/spec/holderIdentity")
        .and_then(Value::as_str)
        .filter(|h| !h.is_empty())
}

fn ann<'a>(l: &'a Value, k: &str) -> Option<&'a str> {
    l.pointer("/metadata/annotations")
        .and_then(|a| a.get(k))
        .and_then(Value::as_str)
}

/// Holders (node names) of the semaphore's slot Leases, by Lease name, in the store.
fn holders(env: &Env) -> BTreeMap<String, String> {
    leases_with_role(env, kube_lease::ROLE_SLOT)
        .iter()
        .filter_map(|l| {
            let name = l.pointer("/metadata/name")?.as_str()?.to_owned();
            Some((name, holder_of(l)?.to_owned()))
        })
        .collect()
}

/// Requests by `user` matching `f`.
fn requests_by(
    env: &Env,
    user: &str,
    f: impl Fn(&rebootd_lab::kube_api::RequestRecord) -> bool,
) -> usize {
    env.api
        .cluster()
        .requests()
        .count(|r| r.user.as_deref() == Some(user) && f(r))
}

fn is_lease_list(r: &rebootd_lab::kube_api::RequestRecord) -> bool {
    r.method == "GET" && r.path.ends_with("/leases") && !r.query.contains("watch=true")
}

fn is_lease_watch(r: &rebootd_lab::kube_api::RequestRecord) -> bool {
    r.method == "GET" && r.path.ends_with("/leases") && r.query.contains("watch=true")
}

/// The statuses of `user`'s PUTs, in order.
fn put_statuses(env: &Env, user: &str) -> Vec<u16> {
    env.api
        .cluster()
        .requests()
        .all()
        .into_iter()
        .filter(|r| r.user.as_deref() == Some(user) && r.method == "PUT")
        .map(|r| r.status)
        .collect()
}

fn is_write(r: &rebootd_lab::kube_api::RequestRecord) -> bool {
    matches!(r.method.as_str(), "POST" | "PUT" | "PATCH" | "DELETE")
}

/// Await the log line of `x`'s acquire taking its place in the queue (`waiting for a free
/// slot`, `id=m-<x>` and every one of `more`), failing if `waiter`, that acquire, ends first.
async fn queued<W>(logs: &mut Logs, x: &str, more: &[&str], waiter: &mut W) -> String
where
    W: std::future::Future + Unpin,
    W::Output: std::fmt::Debug,
{
    let id = format!("id=m-{x}");
    let mut needles = vec!["waiting for a free slot", id.as_str()];
    needles.extend_from_slice(more);
    within(&format!("{x} waits"), async {
        tokio::select! {
            l = logs.expect(&needles) => l,
            r = waiter => panic!("{x} did not wait: {r:?}"),
        }
    })
    .await
}

/// `user`'s Lease watches, in order.
fn lease_watches(env: &Env, user: &str) -> Vec<rebootd_lab::kube_api::RequestRecord> {
    env.api
        .cluster()
        .requests()
        .all()
        .into_iter()
        .filter(|r| r.user.as_deref() == Some(user) && is_lease_watch(r))
        .collect()
}

/// The query strings of `user`'s Lease watches, in order.
fn watch_queries(env: &Env, user: &str) -> Vec<String> {
    lease_watches(env, user)
        .into_iter()
        .map(|r| r.query)
        .collect()
}

/// A waiter `w` far back: `h` holds the one slot, the `AHEAD` waiters queue in order, then `w`
/// (17 ahead), which watches its marker `o08` (max 1: 1 + 8 places ahead; o16 is the first).
struct FarQueue {
    admin: KubeLeaseSemaphore,
    h: Option<Acquirer>,
    acquirers: Vec<Acquirer>,
    acquired: tokio::sync::mpsc::UnboundedReceiver<&'static str>,
}

impl FarQueue {
    const MARKER: &'static str = "reboot-waiter-node-o08";

    /// Queued as above, once `w` has opened its marker's watch.
    async fn start(env: &mut Env) -> FarQueue {
        FarQueue::start_with(env, timeouts()).await
    }

    /// The same, every waiter with time limits `t`.
    async fn start_with(env: &mut Env, t: Timeouts) -> FarQueue {
        for x in ["h", "w"].iter().chain(AHEAD.iter()) {
            add_node(env, x);
        }
        let admin = sem(env, "admin").await;
        let (tx, mut acquired) = tokio::sync::mpsc::unbounded_channel();
        let h = spawn_acquirer(env, "h", t, tx.clone()).await;
        assert_eq!(within("h", acquired.recv()).await, Some("h"));
        let mut acquirers = Vec::new();
        for x in AHEAD {
            acquirers.push(spawn_acquirer(env, x, t, tx.clone()).await);
            queued(&mut env.logs, x, &[], &mut std::future::pending::<()>()).await;
        }
        acquirers.push(spawn_acquirer(env, "w", t, tx).await);
        let line = next_place(&mut env.logs, "w").await;
        assert!(line.contains("waiters_ahead=17"), "{line}");
        within("w watches its marker", async {
            while !watch_queries(env, "node-w")
                .iter()
                .any(|q| q.contains(Self::MARKER))
                || requests_by(env, "node-w", |r| is_lease_watch(r) && r.status == 200) == 0
            {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await;
        FarQueue {
            admin,
            h: Some(h),
            acquirers,
            acquired,
        }
    }

    /// `h` releases, `o00` takes the slot and leaves the queue.
    async fn hand_off(mut self, env: &Env) -> FarQueue {
        if let Some(h) = self.h.take() {
            h.release().await;
        }
        assert_eq!(within("o00", self.acquired.recv()).await, Some("o00"));
        within("o00 leaves the queue", async {
            while waiter_lease(env, "node-o00").is_some() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await;
        self
    }

    /// Room for all: the waiters near the front take slots, o08 among them; `w` reads again
    /// when o08's Lease goes, and takes a slot.
    async fn let_all_in(&mut self, env: &mut Env) {
        let max = u64::try_from(AHEAD.len()).unwrap() + 2;
        self.admin.set_max(max, false).await.unwrap();
        let line = next_place(&mut env.logs, "w").await;
        assert!(
            line.contains("took a slot"),
            "w's next word on its place is its take: {line}"
        );
    }

    fn stop(self) {
        for a in self.acquirers.into_iter().chain(self.h) {
            a.task.abort();
        }
    }
}

/// A waiter Lease of `node` whose clock runs far ahead: it joined the queue in 2100.
fn fast_clock_waiter(env: &Env, node: &str) {
    let lease = json!({
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": format!("{NAME}-waiter-node-{node}"),
            "namespace": NS,
            "labels": {
                kube_lease::LABEL_SEMAPHORE: NAME,
                kube_lease::LABEL_ROLE: kube_lease::ROLE_WAITER,
            },
            "annotations": {kube_lease::ANNOTATION_WAITER_NODE: format!("node-{node}")},
        },
        "spec": {
            "acquireTime": "2100-01-01T00:00:00.000000Z",
            "renewTime": "2100-01-01T00:00:00.000000Z",
            "leaseDurationSeconds": 30,
        },
    });
    env.api.cluster().create(Kind::Lease, lease).unwrap();
}

/// When `node`'s renewals of its own waiter Lease reached the stand-in, in order.
fn renewals(env: &Env, node: &str) -> Vec<std::time::SystemTime> {
    let user = format!("node-{node}");
    let path = format!("/leases/{NAME}-waiter-node-{node}");
    env.api
        .cluster()
        .requests()
        .all()
        .into_iter()
        .filter(|r| {
            r.user.as_deref() == Some(user.as_str())
                && r.method == "PUT"
                && r.path.ends_with(&path)
                && r.status == 200
        })
        .map(|r| r.at)
        .collect()
}

/// The times between consecutive `times`.
fn gaps(times: &[std::time::SystemTime]) -> Vec<Duration> {
    times
        .windows(2)
        .map(|p| p[1].duration_since(p[0]).unwrap_or_default())
        .collect()
}

/// An outside observer: watches the semaphore's slot Leases over HTTP (every event, in order)
/// and records the largest number of simultaneous holders and every take.
struct Observer {
    task: tokio::task::JoinHandle<(usize, Vec<String>)>,
    stop: tokio::sync::oneshot::Sender<()>,
}

impl Observer {
    async fn start(env: &Env) -> Observer {
        let leases: Api<Lease> = Api::namespaced(client(env, "observer").await, NS);
        let sel = format!("{}={NAME}", kube_lease::LABEL_SEMAPHORE);
        let list = leases
            .list(&ListParams::default().labels(&sel))
            .await
            .expect("observer list");
        let mut state: BTreeMap<String, Option<String>> = list
            .items
            .iter()
            .map(|l| {
                (
                    l.metadata.name.clone().unwrap_or_default(),
                    l.spec.as_ref().and_then(|s| s.holder_identity.clone()),
                )
            })
            .collect();
        let rv = list.metadata.resource_version.unwrap_or_default();
        let mut stream = leases
            .watch(&WatchParams::default().labels(&sel), &rv)
            .await
            .expect("observer watch")
            .boxed();
        let (stop, mut stopped) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(async move {
            let count = |s: &BTreeMap<String, Option<String>>| {
                s.values()
                    .filter(|h| h.as_deref().is_some_and(|h| !h.is_empty()))
                    .count()
            };
            let mut max_seen = count(&state);
            let mut takes = Vec::new();
            loop {
                tokio::select! {
                    _ = &mut stopped => return (max_seen, takes),
                    ev = stream.next() => {
                        let (name, holder) = match ev {
                            Some(Ok(WatchEvent::Added(l) | WatchEvent::Modified(l))) => (
                                l.metadata.name.clone().unwrap_or_default(),
                                l.spec.as_ref().and_then(|s| s.holder_identity.clone()).filter(|h| !h.is_empty()),
                            ),
                            Some(Ok(WatchEvent::Deleted(l))) => (l.metadata.name.clone().unwrap_or_default(), None),
                            Some(Ok(WatchEvent::Bookmark(_))) => continue,
                            other => panic!("observer watch: {other:?}"),
                        };
                        let before = state.insert(name, holder.clone()).flatten();
                        if let Some(h) = holder {
                            if before.as_deref() != Some(h.as_str()) {
                                takes.push(h);
                            }
                        }
                        max_seen = max_seen.max(count(&state));
                    }
                }
            }
        });
        Observer { task, stop }
    }

    /// Stop; the largest number of simultaneous holders seen and the takes (node names).
    async fn finish(self) -> (usize, Vec<String>) {
        let _ = self.stop.send(());
        self.task.await.expect("observer task")
    }
}

mod scenarios {
    use super::*;

    /// What the agent does before it waits for a slot: read the pause, then follow it. The
    /// follow watches from the resourceVersion of that read instead of listing again (one list
    /// and one watch, not a read, a list and a watch); the changes after the read are seen,
    /// a resume too.
    pub async fn a_wait_for_the_pause_right_after_reading_it_lists_it_once(env: Env) {
        let s = sem(&env, "a").await;
        let admin = sem(&env, "admin").await;
        let pause = a_pause("freeze");
        env.api.cluster().requests().clear();
        assert_eq!(Pauses::group_pause(&s).await.unwrap(), None);
        let watched = async {
            within("the pause watched", async {
                while requests_by(&env, "node-a", is_lease_watch) == 0 {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            })
            .await;
            admin.pause_group(&pause).await.unwrap();
        };
        let (changed, ()) =
            tokio::join!(within("pause seen", s.group_pause_changed(None)), watched);
        assert_eq!(changed.unwrap(), Some(pause.clone()));
        let all = env.api.cluster().requests().all();
        let by_a: Vec<_> = all
            .iter()
            .filter(|r| r.user.as_deref() == Some("node-a"))
            .collect();
        assert_eq!(by_a.len(), 2, "one list, one watch: {by_a:#?}");
        assert!(
            is_lease_list(by_a[0]) && is_lease_watch(by_a[1]),
            "{by_a:#?}"
        );

        // Paused, then resumed between the read and the wait: the wait sees the resume.
        assert_eq!(Pauses::group_pause(&s).await.unwrap(), Some(pause.clone()));
        admin.resume_group().await.unwrap();
        let changed = within("resume seen", s.group_pause_changed(Some(&pause))).await;
        assert_eq!(changed.unwrap(), None);
    }

    /// A waiter that follows the group's pause (`acquire_unless_paused`) finds the pause Lease
    /// in its own list and watch of the semaphore's Leases (it carries the semaphore's label):
    /// no list or watch of the pause of its own. Paused, it leaves the queue; the wait for the
    /// resume watches from the pause Lease's resourceVersion (no list).
    pub async fn the_pause_comes_with_the_waiters_list_and_watch(env: Env) {
        add_node(&env, "h");
        add_node(&env, "a");
        let h = sem(&env, "h").await;
        h.acquire(&me("h")).await.unwrap();
        let s = sem(&env, "a").await;
        let admin = sem(&env, "admin").await;
        let pause = a_pause("freeze");
        let w = me("a");
        env.api.cluster().requests().clear();
        let watched = async {
            within("the waiter queues and watches", async {
                while requests_by(&env, "node-a", is_lease_watch) == 0
                    || waiter_lease(&env, "node-a").is_none()
                {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            })
            .await;
            admin.pause_group(&pause).await.unwrap();
        };
        let (acquired, ()) = tokio::join!(
            within(
                "the pause ends the wait",
                s.acquire_unless_paused(&w, Phase::Draining)
            ),
            watched
        );
        assert_eq!(acquired.unwrap(), Acquired::Paused(pause.clone()));
        let lists = requests_by(&env, "node-a", is_lease_list);
        let watches = requests_by(&env, "node-a", is_lease_watch);
        let all = env.api.cluster().requests().all();
        let by_a: Vec<_> = all
            .iter()
            .filter(|r| r.user.as_deref() == Some("node-a"))
            .collect();
        assert_eq!(
            (lists, watches),
            (1, 1),
            "one list and one watch, the pause's among them: {by_a:#?}"
        );
        let writes: Vec<&str> = by_a
            .iter()
            .filter(|r| is_write(r))
            .map(|r| r.method.as_str())
            .collect();
        assert_eq!(writes, ["POST", "DELETE"], "queued, then left: {by_a:#?}");
        assert_eq!(waiter_leases(&env), Vec::<String>::new());

        // The wait for the resume watches from the pause Lease it saw: one watch, no list.
        env.api.cluster().requests().clear();
        let resumed = async {
            within("the resume watched", async {
                while requests_by(&env, "node-a", is_lease_watch) == 0 {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            })
            .await;
            admin.resume_group().await.unwrap();
        };
        let (changed, ()) = tokio::join!(
            within("resume seen", s.group_pause_changed(Some(&pause))),
            resumed
        );
        assert_eq!(changed.unwrap(), None);
        assert_eq!(requests_by(&env, "node-a", is_lease_list), 0);

        // Paused before the wait: the list alone, nothing queued.
        admin.pause_group(&pause).await.unwrap();
        env.api.cluster().requests().clear();
        let acquired = within(
            "paused at once",
            s.acquire_unless_paused(&w, Phase::Draining),
        )
        .await;
        assert_eq!(acquired.unwrap(), Acquired::Paused(pause.clone()));
        assert_eq!(requests_by(&env, "node-a", is_lease_list), 1);
        assert_eq!(requests_by(&env, "node-a", is_write), 0);
        assert_eq!(waiter_leases(&env), Vec::<String>::new());

        // Resumed, the wait goes on to the slot.
        admin.resume_group().await.unwrap();
        h.release(&me("h")).await.unwrap();
        let acquired = within("slot", s.acquire_unless_paused(&w, Phase::Draining)).await;
        assert_eq!(acquired.unwrap(), Acquired::Held);
        assert_eq!(holders(&env).values().collect::<Vec<_>>(), ["node-a"]);
    }

    /// A wait from a read the server no longer has (410 Gone, here injected) lists the pause
    /// again and says it as it is now.
    pub async fn a_wait_whose_start_is_gone_lists_the_pause_again(env: Env) {
        let s = sem(&env, "a").await;
        let admin = sem(&env, "admin").await;
        let pause = a_pause("freeze");
        assert_eq!(Pauses::group_pause(&s).await.unwrap(), None);
        admin.pause_group(&pause).await.unwrap();
        let leases = format!("/namespaces/{NS}/leases");
        env.api
            .cluster()
            .faults()
            .inject(FaultRule::status(&leases, 410, 1).method("GET"));
        let changed = within("pause seen", s.group_pause_changed(None)).await;
        assert_eq!(changed.unwrap(), Some(pause));
        assert_eq!(
            env.api.cluster().faults().pending(),
            0,
            "the watch was refused"
        );
    }

    pub async fn first_use_creates_the_objects(mut env: Env) {
        add_node(&env, "a");
        let a = sem(&env, "a").await;
        assert_eq!(a.backend(), rebootd::lock::Backend::Kubernetes);
        assert!(lease(&env, NAME).is_none() && lease(&env, &slot(0)).is_none());

        // status reads only: it creates nothing.
        let st = a.status().await.expect("status");
        assert_eq!((st.max, st.free, st.holders.len()), (1, 1, 0));
        assert!(lease(&env, NAME).is_none());

        within("acquire", a.acquire(&me("a")))
            .await
            .expect("acquire");
        env.logs
            .expect(&["created the semaphore's control Lease"])
            .await;
        env.logs.expect(&["took a slot", "reboot-0"]).await;

        let control = lease(&env, NAME).expect("control Lease");
        assert_eq!(ann(&control, kube_lease::ANNOTATION_MAX), Some("1"));
        assert_eq!(
            control.pointer("/metadata/labels/rebootd.io~1semaphore"),
            Some(&json!(NAME))
        );
        assert_eq!(holder_of(&control), None, "the control Lease holds no slot");

        let s0 = lease(&env, &slot(0)).expect("slot Lease");
        assert_eq!(holder_of(&s0), Some("node-a"));
        assert_eq!(ann(&s0, kube_lease::ANNOTATION_MACHINE_ID), Some("m-a"));
        assert_eq!(ann(&s0, kube_lease::ANNOTATION_BOOT_ID), Some("boot-a"));
        assert!(ann(&s0, kube_lease::ANNOTATION_SINCE)
            .unwrap()
            .parse::<jiff::Timestamp>()
            .is_ok());
        let node_uid = env
            .api
            .cluster()
            .node("node-a")
            .unwrap()
            .pointer("/metadata/uid")
            .cloned()
            .unwrap();
        assert_eq!(ann(&s0, kube_lease::ANNOTATION_NODE_UID), node_uid.as_str());
        assert_eq!(s0.pointer("/spec/leaseDurationSeconds"), None, "no TTL");
        assert_eq!(s0.pointer("/spec/leaseTransitions"), Some(&json!(1)));
        assert!(s0.pointer("/spec/acquireTime").is_some());
        let renew0 = s0.pointer("/spec/renewTime").cloned().unwrap();

        let st = a.status().await.expect("status");
        assert_eq!(st.backend, rebootd::lock::Backend::Kubernetes);
        assert_eq!(st.group, NAME);
        assert_eq!((st.max, st.free), (1, 0));
        assert_eq!(st.holders.len(), 1);
        assert_eq!(st.holders[0].id, "m-a");
        assert_eq!(st.holders[0].node.as_deref(), Some("node-a"));
        assert_eq!(st.holders[0].boot_id.as_deref(), Some("boot-a"));
        assert!(st.holders[0].since.is_some());
        assert!(holds(&a, "m-a").await);
        assert!(holds(&a, "node-a").await);

        // A phase report (after a "reboot": new boot id) lands on the Lease.
        let mut rebooted = me("a");
        rebooted.boot_id = "boot-a2".into();
        a.report_phase(&rebooted, Phase::Rebooting)
            .await
            .expect("phase");
        let s0 = lease(&env, &slot(0)).unwrap();
        assert_eq!(ann(&s0, kube_lease::ANNOTATION_PHASE), Some("rebooting"));
        assert_eq!(ann(&s0, kube_lease::ANNOTATION_BOOT_ID), Some("boot-a2"));
        assert_ne!(s0.pointer("/spec/renewTime"), Some(&renew0));
        let st = a.status().await.unwrap();
        assert_eq!(st.holders[0].phase.as_deref(), Some("rebooting"));

        // Not holding: a phase report is a no-op.
        let b = sem(&env, "b").await;
        b.report_phase(&me("b"), Phase::Draining)
            .await
            .expect("no-op");
        assert_eq!(holders(&env).len(), 1);

        a.unlock("m-a").await.expect("release");
        let s0 = lease(&env, &slot(0)).expect("the slot Lease stays, free");
        assert_eq!(holder_of(&s0), None);
        assert_eq!(ann(&s0, kube_lease::ANNOTATION_MACHINE_ID), None);
        assert_eq!(ann(&s0, kube_lease::ANNOTATION_PHASE), None);
        assert!(!holds(&a, "m-a").await);
    }

    pub async fn two_racers_for_the_last_slot_exactly_one_wins(env: Env) {
        add_node(&env, "a");
        add_node(&env, "b");
        let admin = sem(&env, "admin").await;
        admin.set_max(1, false).await.unwrap();
        let observer = Observer::start(&env).await;
        let (acquired_tx, mut acquired) = tokio::sync::mpsc::unbounded_channel::<&'static str>();
        let mut releases = BTreeMap::new();
        let mut tasks = Vec::new();
        // Both start on the same free slot Lease with the same resourceVersion.
        for x in ["a", "b"] {
            let s = sem(&env, x).await;
            let tx = acquired_tx.clone();
            let (release_tx, release_rx) = tokio::sync::oneshot::channel::<()>();
            releases.insert(x, release_tx);
            tasks.push(tokio::spawn(async move {
                s.acquire(&me(x)).await.expect("acquire");
                tx.send(x).unwrap();
                release_rx.await.unwrap();
                s.unlock(&me(x).id).await.expect("release");
            }));
        }
        let winner = within("a winner", acquired.recv()).await.unwrap();
        let mut next = Box::pin(acquired.recv());
        not_within("the loser", Duration::from_millis(1500), &mut next).await;
        assert_eq!(
            holders(&env),
            BTreeMap::from([(slot(0), format!("node-{winner}"))])
        );
        releases.remove(winner).unwrap().send(()).unwrap();
        let loser = within("the loser after the release", &mut next)
            .await
            .unwrap();
        assert_ne!(loser, winner);
        drop(next);
        releases.remove(loser).unwrap().send(()).unwrap();
        for t in tasks {
            within("racer task", t).await.unwrap();
        }
        let (max_seen, takes) = observer.finish().await;
        assert_eq!(max_seen, 1);
        assert_eq!(takes.len(), 2, "{takes:?}");
    }

    /// Taking twice and giving back twice on every store: lock_conformance's
    /// taking_twice_and_giving_back_twice_write_nothing. Here: a new process of the holder (same
    /// machine id) holds without a write request, and an operator unlocks by node name (the
    /// Lease's holderIdentity), as `rebootctl unlock node-a` does.
    pub async fn a_new_process_of_the_holder_writes_nothing_and_unlock_takes_a_node_name(env: Env) {
        add_node(&env, "a");
        let a = sem(&env, "a").await;
        within("acquire", a.acquire(&me("a"))).await.unwrap();
        let writes = requests_by(&env, "node-a", is_write);
        within("acquire again", a.acquire(&me("a"))).await.unwrap();
        assert_eq!(requests_by(&env, "node-a", is_write), writes, "no write");
        let a2 = sem(&env, "a").await;
        within("acquire from a new process", a2.acquire(&me("a")))
            .await
            .unwrap();
        assert_eq!(requests_by(&env, "node-a", is_write), writes, "no write");
        assert_eq!(holders(&env).len(), 1);

        let operator = sem(&env, "operator").await;
        operator.unlock("node-a").await.unwrap();
        assert!(!holds(&a, "m-a").await);
        assert!(holders(&env).is_empty());
        let rv = env.api.cluster().resource_version();
        operator.unlock("node-a").await.unwrap();
        operator.unlock("nobody").await.unwrap();
        assert_eq!(env.api.cluster().resource_version(), rv, "no write");
    }

    pub async fn waiter_is_woken_by_the_watch_and_never_polls(mut env: Env) {
        add_node(&env, "a");
        add_node(&env, "b");
        // Short server-side watch limit: the waiter must resume its watches, not list again.
        let t = Timeouts {
            watch: Duration::from_secs(1),
            ..timeouts()
        };
        let a = sem_with(&env, "a", None, t).await;
        let b = sem_with(&env, "b", None, t).await;
        within("acquire a", a.acquire(&me("a"))).await.unwrap();

        let idb = me("b");
        let mut waiter = Box::pin(b.acquire(&idb));
        let line = queued(&mut env.logs, "b", &[], &mut waiter).await;
        assert!(line.contains("node-a"), "{line}");
        let lists_before = requests_by(&env, "node-b", is_lease_list);
        let watches_before = requests_by(&env, "node-b", is_lease_watch);

        // Over 2.5 s (2 server-side watch ends) the waiter makes no list, only resumed watches.
        not_within("b while a holds", Duration::from_millis(2500), &mut waiter).await;
        assert_eq!(
            requests_by(&env, "node-b", is_lease_list),
            lists_before,
            "the waiter listed while nothing changed (polling)"
        );
        let watches = env
            .api
            .cluster()
            .requests()
            .all()
            .into_iter()
            .filter(|r| r.user.as_deref() == Some("node-b") && is_lease_watch(r))
            .collect::<Vec<_>>();
        assert!(
            watches.len() >= watches_before + 2,
            "the watch was not resumed: {watches:?}"
        );
        for w in &watches {
            assert!(
                w.query.contains("resourceVersion=")
                    && !w.query.contains("resourceVersion=&")
                    && !w.query.ends_with("resourceVersion="),
                "every Lease watch resumes from a resourceVersion: {}",
                w.query
            );
        }

        let released = Instant::now();
        a.unlock("m-a").await.unwrap();
        within("b after the release", &mut waiter).await.unwrap();
        let latency = released.elapsed();
        assert!(
            latency < Duration::from_secs(1),
            "woken {latency:?} after the release"
        );
        assert_eq!(holders(&env)[&slot(0)], "node-b");
    }

    pub async fn conflict_on_replace_is_retried(env: Env) {
        add_node(&env, "a");
        let a = sem(&env, "a").await;
        a.set_max(1, false).await.unwrap();
        env.api
            .cluster()
            .faults()
            .inject(FaultRule::status("/leases/", 409, 1).method("PUT"));
        within("acquire", a.acquire(&me("a"))).await.unwrap();
        let puts = put_statuses(&env, "node-a");
        assert_eq!(puts, vec![409, 200], "one conflict, then a successful take");
        assert_eq!(
            requests_by(&env, "node-a", is_lease_list),
            3,
            "set-max read once, the acquire listed, and listed again: no change of the slot came \
             on the watch after the (injected) conflict within the request time limit"
        );
        assert_eq!(holders(&env)[&slot(0)], "node-a");
        let l = lease(&env, &slot(0)).unwrap();
        assert_eq!(l.pointer("/spec/leaseTransitions"), Some(&json!(1)));
    }

    /// A lost race (409) waits for the change of that Lease on the watch, and lists nothing;
    /// other changes before it (here its own waiter Lease, and the control Lease) decide
    /// nothing. The conflict is injected; the change of the slot after it is real (another
    /// client's annotation).
    pub async fn a_lost_race_waits_for_the_watch_not_a_list(env: Env) {
        add_node(&env, "a");
        let a = sem(&env, "a").await;
        let admin = sem(&env, "admin").await;
        a.set_max(1, false).await.unwrap();
        env.api
            .cluster()
            .faults()
            .inject(FaultRule::status("/leases/", 409, 1).method("PUT"));
        let then_a_change = async {
            within("the conflict", async {
                while env.api.cluster().faults().pending() > 0 {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            })
            .await;
            // Other changes first (the control Lease, a new free slot): they must not make it
            // take again on a view that still has slot 0 free (a second conflict).
            admin.set_max(2, false).await.unwrap();
            let leases: kube::Api<k8s_openapi::api::coordination::v1::Lease> =
                kube::Api::namespaced(client(&env, "admin").await, NS);
            let mut s0 = leases.get(&slot(0)).await.unwrap();
            s0.metadata
                .annotations
                .get_or_insert_with(Default::default)
                .insert("example.com/touched".into(), "yes".into());
            leases
                .replace(&slot(0), &Default::default(), &s0)
                .await
                .unwrap();
        };
        let node = me("a");
        let (acquired, ()) = tokio::join!(within("acquire", a.acquire(&node)), then_a_change);
        acquired.unwrap();
        let puts = put_statuses(&env, "node-a");
        assert_eq!(puts, vec![409, 200], "one conflict, then a successful take");
        assert_eq!(
            requests_by(&env, "node-a", is_lease_list),
            2,
            "set-max's read and the acquire's list: none after the conflict"
        );
        let conflicts = env
            .api
            .cluster()
            .requests()
            .count(|r| r.user.as_deref() == Some("node-a") && r.status == 409);
        assert_eq!(
            conflicts, 1,
            "no take on a view that still had the slot free"
        );
        assert_eq!(holders(&env).values().collect::<Vec<_>>(), ["node-a"]);
    }

    /// A lost race after which no change comes on the watch (an injected conflict; the waiter
    /// is queued already, so nothing of its own follows) lists again once the request time
    /// limit has passed, and takes the slot.
    pub async fn a_lost_race_with_no_change_after_it_lists_again(env: Env) {
        add_node(&env, "h");
        add_node(&env, "a");
        let h = sem(&env, "h").await;
        let a = sem(&env, "a").await;
        h.acquire(&me("h")).await.unwrap();
        let node = me("a");
        let released = async {
            within("a queues", async {
                while waiter_lease(&env, "node-a").is_none() {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            })
            .await;
            env.api.cluster().requests().clear();
            env.api.cluster().faults().inject(
                FaultRule::status("/leases/", 409, 1)
                    .method("PUT")
                    .body_contains("\"holderIdentity\":\"node-a\""),
            );
            h.release(&me("h")).await.unwrap();
        };
        let (acquired, ()) = tokio::join!(within("acquire", a.acquire(&node)), released);
        acquired.unwrap();
        assert_eq!(
            env.api.cluster().faults().pending(),
            0,
            "the take met the conflict"
        );
        assert_eq!(
            requests_by(&env, "node-a", is_lease_list),
            1,
            "one list, when no change came within the request time limit"
        );
        assert_eq!(holders(&env).values().collect::<Vec<_>>(), ["node-a"]);
    }

    pub async fn server_errors_are_retried_with_backoff(mut env: Env) {
        add_node(&env, "a");
        let a = sem(&env, "a").await;
        env.api
            .cluster()
            .faults()
            .inject(FaultRule::status(&format!("/namespaces/{NS}/leases"), 500, 2).method("GET"));
        env.api
            .cluster()
            .faults()
            .inject(FaultRule::status(&format!("/namespaces/{NS}/leases"), 429, 1).method("POST"));
        within("acquire", a.acquire(&me("a"))).await.unwrap();
        env.logs
            .expect(&[
                "WARN",
                "Kubernetes API trouble while waiting for a slot; retrying",
            ])
            .await;
        assert_eq!(env.api.cluster().faults().pending(), 0);
        assert_eq!(holders(&env)[&slot(0)], "node-a");

        // A permanent refusal (here: 403 on the list) is returned, not retried forever.
        env.api
            .cluster()
            .faults()
            .inject(FaultRule::status(&format!("/namespaces/{NS}/leases"), 403, 1).method("GET"));
        let e = within("status", a.status()).await.unwrap_err();
        assert!(matches!(e, LockError::Backend { .. }), "{e}");
        assert!(e.to_string().contains("403"), "{e}");
    }

    pub async fn holder_whose_node_is_deleted_is_reclaimed(mut env: Env) {
        add_node(&env, "a");
        add_node(&env, "b");
        let a = sem(&env, "a").await;
        let b = sem(&env, "b").await;
        within("acquire a", a.acquire(&me("a"))).await.unwrap();

        let idb = me("b");
        let mut waiter = Box::pin(b.acquire(&idb));
        queued(&mut env.logs, "b", &[], &mut waiter).await;
        // While node-a exists, b waits.
        not_within(
            "b while node-a exists",
            Duration::from_millis(500),
            &mut waiter,
        )
        .await;

        env.api
            .cluster()
            .delete(Kind::Node, "", "node-a")
            .expect("delete node-a");
        within("b after node-a is deleted", &mut waiter)
            .await
            .expect("reclaimed");
        env.logs
            .expect(&["WARN", "RECLAIMING", "node-a no longer exists"])
            .await;
        env.logs.expect(&["WARN", "reclaimed the slot"]).await;
        let l = lease(&env, &slot(0)).unwrap();
        assert_eq!(holder_of(&l), Some("node-b"));
        assert_eq!(ann(&l, kube_lease::ANNOTATION_MACHINE_ID), Some("m-b"));
        assert_eq!(l.pointer("/spec/leaseTransitions"), Some(&json!(2)));
        assert!(!holds(&a, "m-a").await);
        assert!(holds(&b, "m-b").await);
        // The old holder's release does not touch the new holder's slot.
        a.unlock("m-a").await.unwrap();
        assert!(holds(&b, "m-b").await);
    }

    pub async fn holder_without_a_node_is_never_reclaimed_for_it(mut env: Env) {
        // "ghost" has no Node object: its slot records no node uid.
        add_node(&env, "b");
        let ghost = sem(&env, "ghost").await;
        let b = sem(&env, "b").await;
        within("acquire ghost", ghost.acquire(&me("ghost")))
            .await
            .unwrap();
        env.logs.expect(&["no Node object of this name"]).await;
        let l = lease(&env, &slot(0)).unwrap();
        assert_eq!(ann(&l, kube_lease::ANNOTATION_NODE_UID), None);

        let idb = me("b");
        let mut waiter = Box::pin(b.acquire(&idb));
        not_within(
            "b while ghost holds",
            Duration::from_millis(1500),
            &mut waiter,
        )
        .await;
        assert_eq!(holders(&env)[&slot(0)], "node-ghost");
        ghost.unlock("m-ghost").await.unwrap();
        within("b after the release", &mut waiter).await.unwrap();
    }

    /// A release right after a phase report that listed the Leases (the first report of a new
    /// process, after the boot) lists nothing itself: its PUT is guarded by the
    /// `resourceVersion` of that list. When another holder took a slot in between, the release
    /// still frees only its own slot, at once.
    pub async fn a_release_right_after_a_report_that_listed_is_one_request(env: Env) {
        for x in ["a", "b"] {
            add_node(&env, x);
        }
        let admin = sem(&env, "admin").await;
        admin.set_max(2, false).await.unwrap();
        let a = sem(&env, "a").await;
        within("acquire a", a.acquire(&me("a"))).await.unwrap();
        a.report_phase(&me("a"), Phase::Rebooting).await.unwrap();
        // After the boot: a new process, whose first report lists, then writes.
        let a = sem(&env, "a").await;
        let mut after_boot = me("a");
        after_boot.boot_id = "boot-2".into();
        env.api.cluster().requests().clear();
        a.report_phase(&after_boot, Phase::WaitingForHealthy)
            .await
            .unwrap();
        assert_eq!(requests_by(&env, "node-a", is_lease_list), 1);
        env.api.cluster().requests().clear();
        a.release(&after_boot).await.unwrap();
        let (all, puts) = (
            requests_by(&env, "node-a", |_| true),
            requests_by(&env, "node-a", |r| r.method == "PUT"),
        );
        assert_eq!((all, puts), (1, 1), "the release: one PUT, no list");
        assert!(!holders(&env).values().any(|h| h == "node-a"));

        // Another holder takes the other slot between the report and the release: a's slot
        // Lease is as a wrote it, so the one PUT still frees it.
        let a = sem(&env, "a").await;
        within("acquire a again", a.acquire(&after_boot))
            .await
            .unwrap();
        let a = sem(&env, "a").await;
        a.report_phase(&after_boot, Phase::WaitingForHealthy)
            .await
            .unwrap();
        let b = sem(&env, "b").await;
        within("acquire b", b.acquire(&me("b"))).await.unwrap();
        env.api.cluster().requests().clear();
        a.release(&after_boot).await.unwrap();
        assert_eq!(requests_by(&env, "node-a", |_| true), 1);
        let held: Vec<String> = holders(&env).into_values().collect();
        assert_eq!(held, ["node-b"]);
    }

    /// A holder keeps its slot Lease as it last wrote it: each phase report is one PUT on it, no
    /// list, whatever other holders do; a slot given back by an operator refuses the kept
    /// object (409), and the report then reads, finds it holds nothing, and writes nothing.
    pub async fn a_phase_report_is_one_request_whatever_other_holders_do(env: Env) {
        for x in ["a", "o0", "o1", "o2"] {
            add_node(&env, x);
        }
        let admin = sem(&env, "admin").await;
        admin.set_max(3, false).await.unwrap();
        let a = sem(&env, "a").await;
        within("acquire a", a.acquire(&me("a"))).await.unwrap();
        let a_slot = holders(&env)
            .into_iter()
            .find(|(_, h)| h == "node-a")
            .map(|(slot, _)| slot)
            .unwrap();
        for (k, phase) in [Phase::Draining, Phase::Rebooting, Phase::WaitingForHealthy]
            .into_iter()
            .enumerate()
        {
            let other = sem(&env, &format!("o{k}")).await;
            within("acquire other", other.acquire(&me(&format!("o{k}"))))
                .await
                .unwrap();
            if k > 0 {
                let before = sem(&env, &format!("o{}", k - 1)).await;
                before.release(&me(&format!("o{}", k - 1))).await.unwrap();
            }
            env.api.cluster().requests().clear();
            let proof = a.report_phase(&me("a"), phase).await.unwrap();
            assert_eq!(
                proof,
                Reported::Held,
                "{phase}: a report that wrote proves the slot"
            );
            let by_a = requests_by(&env, "node-a", |_| true);
            let puts = requests_by(&env, "node-a", |r| r.method == "PUT");
            assert_eq!((by_a, puts), (1, 1), "{phase}");
            let l = lease(&env, &a_slot).unwrap();
            assert_eq!(ann(&l, kube_lease::ANNOTATION_PHASE), Some(phase.as_str()));
        }
        env.api.cluster().requests().clear();
        let proof = a
            .report_phase(&me("a"), Phase::WaitingForHealthy)
            .await
            .unwrap();
        assert_eq!(proof, Reported::Unproven, "nothing written");
        assert_eq!(
            requests_by(&env, "node-a", |_| true),
            0,
            "the same phase again"
        );

        admin.unlock("m-a").await.unwrap();
        let proof = a.report_phase(&me("a"), Phase::Uncordoning).await.unwrap();
        assert_eq!(proof, Reported::Unproven, "not held");
        assert!(!holders(&env).values().any(|h| h == "node-a"));
        let l = lease(&env, &a_slot).unwrap();
        assert_ne!(ann(&l, kube_lease::ANNOTATION_PHASE), Some("uncordoning"));
    }

    pub async fn holder_past_max_hold_is_reclaimed(mut env: Env) {
        add_node(&env, "a");
        add_node(&env, "b");
        let a = sem(&env, "a").await;
        within("acquire a", a.acquire(&me("a"))).await.unwrap();
        a.report_phase(&me("a"), Phase::Rebooting).await.unwrap();
        let since: jiff::Timestamp = ann(
            &lease(&env, &slot(0)).unwrap(),
            kube_lease::ANNOTATION_SINCE,
        )
        .unwrap()
        .parse()
        .unwrap();

        let max_hold = Duration::from_secs(1);
        let b = sem_with(&env, "b", Some(max_hold), timeouts()).await;
        within("acquire b (reclaims after max_hold)", b.acquire(&me("b")))
            .await
            .unwrap();
        let age = jiff::Timestamp::now().duration_since(since);
        assert!(
            age >= jiff::SignedDuration::try_from(max_hold).unwrap(),
            "reclaimed after {age:?} only"
        );
        env.logs
            .expect(&["WARN", "RECLAIMING", "node-a", "lock.max_hold", "rebooting"])
            .await;
        let l = lease(&env, &slot(0)).unwrap();
        assert_eq!(holder_of(&l), Some("node-b"));
        assert_eq!(l.pointer("/spec/leaseTransitions"), Some(&json!(2)));
        assert_eq!(ann(&l, kube_lease::ANNOTATION_PHASE), None);
        // Requests by b: no list between its first wait and the reclaim other than the one the
        // timer caused (it waited by watch plus timer, not by polling).
        assert!(requests_by(&env, "node-b", is_lease_list) <= 3);
    }

    /// set-max below the holders on every store: lock_conformance's
    /// set_max_below_the_holders_needs_force. Here: the slot Leases. Forced below the holders,
    /// the free slot Lease above max is deleted, a held one stays until its release deletes it;
    /// growing again creates the free slots; no more than MAX_SLOTS; a no-op writes nothing.
    pub async fn set_max_deletes_the_free_slot_leases_above_max(mut env: Env) {
        for x in ["a", "b"] {
            add_node(&env, x);
        }
        let a = sem(&env, "a").await;
        let b = sem(&env, "b").await;
        a.set_max(3, false).await.unwrap();
        within("a", a.acquire(&me("a"))).await.unwrap();
        within("b", b.acquire(&me("b"))).await.unwrap();
        assert_eq!(holders(&env).len(), 2);
        assert_eq!(holder_of(&lease(&env, &slot(2)).unwrap()), None);
        assert!(matches!(
            a.set_max(kube_lease::MAX_SLOTS + 1, true).await,
            Err(LockError::Refused(_))
        ));

        a.set_max(1, true).await.expect("forced");
        env.logs
            .expect(&["WARN", "set-max below the current holders"])
            .await;
        assert_eq!(
            ann(&lease(&env, NAME).unwrap(), kube_lease::ANNOTATION_MAX),
            Some("1")
        );
        assert!(
            lease(&env, &slot(2)).is_none(),
            "the free slot above max is deleted"
        );
        assert_eq!(
            holder_of(&lease(&env, &slot(1)).unwrap()),
            Some("node-b"),
            "held slot above max stays"
        );
        b.unlock("m-b").await.unwrap();
        assert!(
            lease(&env, &slot(1)).is_none(),
            "released slot above max is deleted"
        );
        assert_eq!(
            holders(&env),
            BTreeMap::from([(slot(0), "node-a".to_owned())])
        );

        // Growing again creates the free slots; a no-op set-max writes nothing.
        a.set_max(2, false).await.unwrap();
        assert_eq!(holder_of(&lease(&env, &slot(1)).unwrap()), None);
        let rv = env.api.cluster().resource_version();
        a.set_max(2, false).await.unwrap();
        assert_eq!(env.api.cluster().resource_version(), rv);
    }

    /// A Lease of another owner in the way of the semaphore's is refused, not fought. (What the
    /// store cannot understand in its own control Lease: lock_conformance's
    /// a_semaphore_it_cannot_understand_is_refused_and_left_untouched.)
    pub async fn a_lease_of_another_owner_in_the_way_is_refused(env: Env) {
        add_node(&env, "a");
        let a = sem(&env, "a").await;
        a.set_max(1, false).await.unwrap();
        let other = KubeLeaseSemaphore::new(
            client(&env, "node-x").await,
            &config::KubeLease {
                namespace: NS.into(),
                name: slot(0),
                kubeconfig: None,
                zone_label: rebootd::config::DEFAULT_ZONE_LABEL.into(),
                node_selector: None,
            },
            None,
        )
        .with_timeouts(timeouts());
        // (set-max created slot Lease reboot-0, labelled for semaphore "reboot".)
        let e = within("acquire", other.acquire(&me("x")))
            .await
            .unwrap_err();
        assert!(matches!(e, LockError::Refused(_)), "{e}");
    }

    pub async fn kubectl_sees_the_holder(env: Env) {
        add_node(&env, "a");
        let a = sem(&env, "a").await;
        within("acquire", a.acquire(&me("a"))).await.unwrap();
        a.report_phase(&me("a"), Phase::Draining).await.unwrap();
        let kc = kubeconfig(&env, "kubectl");
        let out = within(
            "kubectl",
            tokio::process::Command::new("kubectl")
                .arg("--kubeconfig")
                .arg(&kc)
                .args(["get", "leases", "-n", NS, "-o", "json"])
                .output(),
        )
        .await
        .expect("run kubectl");
        assert!(
            out.status.success(),
            "kubectl: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let list: Value = serde_json::from_slice(&out.stdout).expect("kubectl JSON");
        let items = list["items"].as_array().expect("items");
        let s0 = items
            .iter()
            .find(|l| l["metadata"]["name"] == json!(slot(0)))
            .expect("slot Lease listed");
        assert_eq!(s0["spec"]["holderIdentity"], json!("node-a"));
        assert_eq!(
            s0["metadata"]["annotations"]["rebootd.io/phase"],
            json!("draining")
        );
        let control = items
            .iter()
            .find(|l| l["metadata"]["name"] == json!(NAME))
            .expect("control Lease listed");
        assert_eq!(
            control["metadata"]["annotations"]["rebootd.io/max"],
            json!("1")
        );

        // The table view (what an operator types) shows the holder too.
        let out = tokio::process::Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&kc)
            .args([
                "get",
                "leases",
                "-n",
                NS,
                "-l",
                &format!("rebootd.io/semaphore={NAME}"),
            ])
            .output()
            .await
            .expect("run kubectl");
        let table = String::from_utf8_lossy(&out.stdout);
        assert!(
            table.contains("node-a") && table.contains(&slot(0)),
            "{table}"
        );
    }

    pub async fn waiters_take_the_slot_in_fifo_order(mut env: Env) {
        let names = ["a", "b", "c", "d", "e"];
        for x in names {
            add_node(&env, x);
        }
        let (tx, mut acquired) = tokio::sync::mpsc::unbounded_channel();
        let mut acquirers = BTreeMap::new();
        for x in names {
            acquirers.insert(x, spawn_acquirer(&env, x, timeouts(), tx.clone()).await);
            if x == "a" {
                assert_eq!(within("a", acquired.recv()).await, Some("a"));
                assert!(waiter_lease(&env, "node-a").is_none(), "a never queued");
            } else {
                // Queued in this order: each one's waiter Lease exists before the next starts.
                let id = format!("id=m-{x}");
                env.logs.expect(&["waiting for a free slot", &id]).await;
                let w = waiter_lease(&env, &format!("node-{x}")).expect("waiter Lease");
                assert_eq!(
                    w.pointer("/metadata/labels/rebootd.io~1semaphore"),
                    Some(&json!(NAME))
                );
                assert_eq!(
                    w.pointer("/metadata/labels/rebootd.io~1role"),
                    Some(&json!(kube_lease::ROLE_WAITER))
                );
                assert_eq!(
                    ann(&w, kube_lease::ANNOTATION_WAITER_NODE),
                    Some(format!("node-{x}").as_str())
                );
                assert_eq!(holder_of(&w), None, "a waiter Lease holds nothing");
                assert!(w.pointer("/spec/acquireTime").is_some());
                assert!(w.pointer("/spec/renewTime").is_some());
                assert_eq!(w.pointer("/spec/leaseDurationSeconds"), Some(&json!(30)));
            }
        }
        assert_eq!(waiter_leases(&env).len(), 4);
        let mut order = Vec::new();
        let mut holder = "a";
        for _ in 1..names.len() {
            acquirers.remove(holder).unwrap().release().await;
            let next = within("the next holder", acquired.recv()).await.unwrap();
            assert!(
                waiter_lease(&env, &format!("node-{next}")).is_none(),
                "{next}'s waiter Lease is deleted once it holds the slot"
            );
            assert_eq!(holders(&env).len(), 1);
            order.push(next);
            holder = next;
        }
        acquirers.remove(holder).unwrap().release().await;
        assert_eq!(order, ["b", "c", "d", "e"], "first come, first served");
        assert!(waiter_leases(&env).is_empty());
        assert!(holders(&env).is_empty());
    }

    pub async fn a_release_wakes_only_the_first_waiter(mut env: Env) {
        let names = ["a", "b", "c", "d", "e", "f", "g", "h", "i"];
        for x in names {
            add_node(&env, x);
        }
        let (tx, mut acquired) = tokio::sync::mpsc::unbounded_channel();
        let mut acquirers = BTreeMap::new();
        for x in names {
            acquirers.insert(x, spawn_acquirer(&env, x, timeouts(), tx.clone()).await);
            if x == "a" {
                within("a", acquired.recv()).await.unwrap();
            } else {
                let id = format!("id=m-{x}");
                env.logs.expect(&["waiting for a free slot", &id]).await;
            }
        }
        assert_eq!(waiter_leases(&env).len(), 8);

        env.api.cluster().requests().clear();
        let rv_before = env.api.cluster().resource_version();
        // A waiter may still be opening its first watch (from what it listed before).
        let opening_watch = |r: &rebootd_lab::kube_api::RequestRecord| {
            is_lease_watch(r)
                && r.query
                    .split('&')
                    .find_map(|kv| kv.strip_prefix("resourceVersion="))
                    .and_then(|v| v.parse::<u64>().ok())
                    .is_some_and(|v| v <= rv_before)
        };
        acquirers.remove("a").unwrap().release().await;
        assert_eq!(within("b", acquired.recv()).await, Some("b"));
        // c is now first in the queue: it reads once, to check the new holder.
        env.logs
            .expect(&["waiting for a free slot", "id=m-c", "waiters_ahead=0"])
            .await;
        // Negative check: give the others time to (wrongly) react.
        let mut quiet = Box::pin(std::future::pending::<()>());
        not_within("nothing", Duration::from_millis(500), &mut quiet).await;

        let all = env.api.cluster().requests().all();
        let writes: Vec<_> = all.iter().filter(|r| is_write(r)).collect();
        assert!(
            writes.len() <= 4,
            "one release and hand-off: {} writes: {writes:#?}",
            writes.len()
        );
        let lists = all.iter().filter(|r| is_lease_list(r)).count();
        assert!(lists <= 3, "{lists} Lease lists");
        for x in ["d", "e", "f", "g", "h", "i"] {
            let user = format!("node-{x}");
            let by: Vec<_> = all
                .iter()
                .filter(|r| r.user.as_deref() == Some(user.as_str()) && !opening_watch(r))
                .collect();
            assert!(
                by.is_empty(),
                "waiter {x} (not eligible) made requests: {by:#?}"
            );
        }
        assert_eq!(holders(&env)[&slot(0)], "node-b");
        for (_, a) in acquirers {
            a.task.abort();
        }
    }

    pub async fn a_dead_waiter_stops_blocking_after_its_ttl(mut env: Env) {
        for x in ["a", "b", "c"] {
            add_node(&env, x);
        }
        let t = Timeouts {
            waiter_ttl: Duration::from_secs(2),
            ..timeouts()
        };
        let a = sem_with(&env, "a", None, t).await;
        within("a", a.acquire(&me("a"))).await.unwrap();

        // b queues, then its acquire is dropped: its waiter Lease is never renewed again.
        let b = sem_with(&env, "b", None, t).await;
        let idb = me("b");
        let mut waiting_b = Box::pin(b.acquire(&idb));
        queued(&mut env.logs, "b", &[], &mut waiting_b).await;
        drop(waiting_b);
        let b_queued = Instant::now();
        assert!(waiter_lease(&env, "node-b").is_some());

        let c = sem_with(&env, "c", None, t).await;
        let idc = me("c");
        let mut waiting_c = Box::pin(c.acquire(&idc));
        queued(&mut env.logs, "c", &["waiters_ahead=1"], &mut waiting_c).await;
        a.unlock("m-a").await.unwrap();
        // b is still live for a while: c leaves the slot to it.
        not_within(
            "c while b is live",
            Duration::from_millis(1000),
            &mut waiting_c,
        )
        .await;
        assert!(holders(&env).is_empty());
        within("c after b's TTL", &mut waiting_c).await.unwrap();
        assert!(
            b_queued.elapsed() >= Duration::from_secs(2),
            "c went before b's waiter Lease expired ({:?})",
            b_queued.elapsed()
        );
        assert_eq!(holders(&env)[&slot(0)], "node-c");
        assert!(waiter_lease(&env, "node-c").is_none());
    }

    pub async fn a_restarted_waiter_keeps_its_place(mut env: Env) {
        for x in ["a", "b", "c"] {
            add_node(&env, x);
        }
        let a = sem(&env, "a").await;
        within("a", a.acquire(&me("a"))).await.unwrap();
        let b = sem(&env, "b").await;
        let idb = me("b");
        let mut waiting_b = Box::pin(b.acquire(&idb));
        queued(&mut env.logs, "b", &[], &mut waiting_b).await;
        let since = waiter_lease(&env, "node-b").unwrap()["spec"]["acquireTime"].clone();
        let (tx, mut acquired) = tokio::sync::mpsc::unbounded_channel();
        let c = spawn_acquirer(&env, "c", timeouts(), tx.clone()).await;
        env.logs
            .expect(&["waiting for a free slot", "id=m-c", "waiters_ahead=1"])
            .await;

        // b's daemon restarts: a new process, same node, adopts its waiter Lease.
        drop(waiting_b);
        let b2 = spawn_acquirer(&env, "b", timeouts(), tx).await;
        env.logs
            .expect(&["waiting for a free slot", "id=m-b", "waiters_ahead=0"])
            .await;
        assert_eq!(
            waiter_lease(&env, "node-b").unwrap()["spec"]["acquireTime"],
            since,
            "the same place in the queue"
        );
        assert_eq!(waiter_leases(&env).len(), 2);

        a.unlock("m-a").await.unwrap();
        assert_eq!(within("next", acquired.recv()).await, Some("b"));
        b2.release().await;
        assert_eq!(within("then", acquired.recv()).await, Some("c"));
        c.release().await;
        assert!(waiter_leases(&env).is_empty());
    }

    pub async fn status_and_set_max_ignore_waiter_leases(mut env: Env) {
        for x in ["a", "b"] {
            add_node(&env, x);
        }
        let admin = sem(&env, "admin").await;
        within("a", sem(&env, "a").await.acquire(&me("a")))
            .await
            .unwrap();
        let (tx, mut acquired) = tokio::sync::mpsc::unbounded_channel();
        let b = spawn_acquirer(&env, "b", timeouts(), tx).await;
        env.logs
            .expect(&["waiting for a free slot", "id=m-b"])
            .await;
        // A node named with digits only: its waiter Lease must not pass for slot 3.
        let digits = Identity {
            id: "m-3".into(),
            node: "3".into(),
            boot_id: "boot-3".into(),
            token: "t-3".into(),
            zone: None,
        };
        let s3 = sem(&env, "3").await;
        let mut waiting_3 = Box::pin(s3.acquire(&digits));
        queued(&mut env.logs, "3", &[], &mut waiting_3).await;
        let w3 = admin.waiter_name("3");
        assert_ne!(w3, slot(3));
        assert!(admin
            .waiter_name("3")
            .starts_with(&format!("{NAME}-waiter-")));
        assert!(lease(&env, &w3).is_some());
        assert_eq!(waiter_leases(&env).len(), 2);

        let st = admin.status().await.unwrap();
        assert_eq!((st.max, st.free, st.holders.len()), (1, 0, 1), "{st:?}");
        assert_eq!(st.holders[0].node.as_deref(), Some("node-a"));
        admin.set_max(1, false).await.unwrap();
        assert_eq!(
            waiter_leases(&env).len(),
            2,
            "set-max leaves the waiters alone"
        );
        assert!(matches!(
            admin.set_max(0, false).await,
            Err(LockError::MaxBelowHolders { holders: 1, .. })
        ));

        // One more slot: the first waiter takes it; the other still waits.
        admin.set_max(2, false).await.unwrap();
        assert_eq!(within("b", acquired.recv()).await, Some("b"));
        let st = admin.status().await.unwrap();
        assert_eq!((st.max, st.free, st.holders.len()), (2, 0, 2), "{st:?}");
        let slots: Vec<String> = holders(&env).into_keys().collect();
        assert_eq!(slots, [slot(0), slot(1)]);
        assert!(lease(&env, &w3).is_some(), "3 still waits");
        not_within(
            "3 while both slots are held",
            Duration::from_millis(300),
            &mut waiting_3,
        )
        .await;
        b.release().await;
        within("3 after b", &mut waiting_3).await.unwrap();
        assert_eq!(holders(&env)[&slot(1)], "3");
        assert!(waiter_leases(&env).is_empty());
    }

    /// A waiter far back in the queue (`max + FAR_BACK` live waiters ahead) watches one waiter
    /// Lease ahead of it, its marker (`max + FAR_BACK / 2` places ahead), instead of the
    /// semaphore: the renewals of the queue are not events of its watch, and the hand-off to the
    /// first waiter costs it no request. When the marker leaves the queue (here it takes a
    /// slot once a larger max lets every waiter in), the waiter reads the semaphore again and
    /// takes a slot.
    pub async fn a_waiter_far_back_watches_one_lease_ahead_not_the_semaphore(mut env: Env) {
        let q = FarQueue::start(&mut env).await;
        let only = watch_queries(&env, "node-w");
        assert!(
            only.len() == 1
                && only[0].contains("fieldSelector")
                && only[0].contains(FarQueue::MARKER)
                && !only[0].contains("labelSelector"),
            "w's one watch is of its marker's Lease, by name: {only:?}"
        );
        let reads = || requests_by(&env, "node-w", |r| r.method == "GET");
        let before = reads();
        let mut q = q.hand_off(&env).await;
        assert_eq!(reads(), before, "the hand-off ahead costs w no read");
        q.let_all_in(&mut env).await;
        assert_eq!(
            requests_by(&env, "node-w", is_lease_list),
            2,
            "w listed the semaphore when it started and when its marker left"
        );
        assert_eq!(
            watch_queries(&env, "node-w").len(),
            1,
            "and watched nothing else"
        );
        q.stop();
    }

    /// A far waiter renews its Lease every two thirds of its TTL, half as often as a waiter
    /// near the front (every third): with a 3 s TTL, `w` (17 ahead, far) renews 2 s apart while
    /// `o16` (16 ahead, near) renews 1 s apart in the same queue. Its Lease still changes
    /// within the arbiter's time-out (TTL + 2 s), so nobody takes it for dead.
    pub async fn a_far_waiter_renews_half_as_often(mut env: Env) {
        let t = Timeouts {
            waiter_ttl: Duration::from_secs(3),
            ..timeouts()
        };
        let q = FarQueue::start_with(&mut env, t).await;
        within("w renews four times", async {
            while renewals(&env, "w").len() < 4 {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await;
        let far = gaps(&renewals(&env, "w"));
        let near = gaps(&renewals(&env, "o16"));
        // Each renewal is due two thirds of the TTL after the last one's renewTime; the
        // requests' arrival spreads a little around that. The first gap may straddle w's move
        // to far back (a renewal due at the near pace, then the far one): it is left out.
        assert!(
            far.len() >= 3 && far[1..].iter().all(|g| *g >= Duration::from_millis(1800)),
            "w, far back, renews every 2 s: {far:?}"
        );
        assert!(
            near.len() >= 3
                && near
                    .iter()
                    .filter(|g| **g < Duration::from_millis(1500))
                    .count()
                    * 2
                    > near.len(),
            "o16, near the front, renews every second: {near:?}"
        );
        assert!(waiter_lease(&env, "node-w").is_some());
        assert_eq!(watch_queries(&env, "node-w").len(), 1, "w stayed far back");
        q.stop();
    }

    /// A waiter whose Lease goes ahead of waiters already queued (their clocks run ahead of
    /// its own: a later `acquireTime`) decides on its place at once, without a request: it
    /// takes the free slot now, not when the waiter it counted ahead before it queued would
    /// time out (32 s).
    pub async fn a_waiter_queued_ahead_of_fast_clocks_takes_the_free_slot_at_once(env: Env) {
        add_node(&env, "b");
        fast_clock_waiter(&env, "late");
        let b = sem(&env, "b").await;
        within("b takes the free slot", b.acquire(&me("b")))
            .await
            .unwrap();
        assert_eq!(holders(&env)[&slot(0)], "node-b");
        assert_eq!(
            requests_by(&env, "node-b", is_lease_list),
            2,
            "the first use's two reads (before and after creating the control Lease)"
        );
        assert!(waiter_lease(&env, "node-late").is_some());
    }

    /// A read of a long queue is one request: 600 waiter Leases (queued behind `b`: they
    /// joined in the future) and the semaphore's own come in one list, not pages of 500.
    pub async fn a_read_of_a_long_queue_is_one_request(env: Env) {
        for x in ["a", "b"] {
            add_node(&env, x);
        }
        let a = sem(&env, "a").await;
        within("a", a.acquire(&me("a"))).await.unwrap();
        a.unlock("m-a").await.unwrap();
        for i in 0..600 {
            fast_clock_waiter(&env, &format!("late{i:03}"));
        }
        assert_eq!(waiter_leases(&env).len(), 600);
        let b = sem(&env, "b").await;
        within("b", b.acquire(&me("b"))).await.unwrap();
        assert_eq!(holders(&env)[&slot(0)], "node-b");
        let lists: Vec<String> = env
            .api
            .cluster()
            .requests()
            .all()
            .into_iter()
            .filter(|r| r.user.as_deref() == Some("node-b") && is_lease_list(r))
            .map(|r| r.query)
            .collect();
        assert_eq!(lists.len(), 1, "one list: {lists:?}");
        assert!(!lists[0].contains("limit="), "{lists:?}");
    }

    /// What a holder lists (the report after its boot, the release) and `status` are the
    /// control, slot and pause Leases only: their size does not grow with the queue.
    pub async fn a_holders_reads_leave_the_waiter_leases_out(env: Env) {
        add_node(&env, "a");
        let a = sem(&env, "a").await;
        within("a", a.acquire(&me("a"))).await.unwrap();
        for i in 0..20 {
            fast_clock_waiter(&env, &format!("w{i:02}"));
        }
        assert_eq!(waiter_leases(&env).len(), 20);
        let from = env.api.cluster().requests().all().len();
        // After the boot: a new process reports, shows the status and releases.
        let a = sem(&env, "a").await;
        a.report_phase(&me("a"), Phase::WaitingForHealthy)
            .await
            .unwrap();
        let status = a.status().await.unwrap();
        assert_eq!(status.holders.len(), 1, "{status:?}");
        a.release(&me("a")).await.unwrap();
        assert!(!holders(&env).values().any(|h| h == "node-a"));
        let lists: Vec<String> = env.api.cluster().requests().all()[from..]
            .iter()
            .filter(|r| r.user.as_deref() == Some("node-a") && is_lease_list(r))
            .map(|r| {
                r.query
                    .replace("%2F", "/")
                    .replace("%3D", "=")
                    .replace("%21", "!")
                    .replace("%2C", ",")
            })
            .collect();
        assert!(!lists.is_empty());
        assert!(
            lists.iter().all(|q| q.contains("rebootd.io/role!=waiter")),
            "{lists:?}"
        );
    }

    /// A marker's watch whose history no longer reaches the marker's `resourceVersion` (410
    /// Gone: a dead waiter's Lease unchanged for longer than the server keeps, or a slow
    /// server) is opened again from the current state, without reading the semaphore (which
    /// would pick the same marker again); the waiter still follows its marker out of the queue.
    pub async fn a_marker_watch_gone_410_watches_from_now_without_a_read(mut env: Env) {
        let marker = format!("metadata.name%3D{}", FarQueue::MARKER);
        env.api
            .cluster()
            .faults()
            .inject(FaultRule::status("/leases", 410, 1).query_contains(&marker));
        let q = FarQueue::start(&mut env).await;
        let watches = watch_queries(&env, "node-w");
        let statuses: Vec<u16> = lease_watches(&env, "node-w")
            .iter()
            .map(|r| r.status)
            .collect();
        assert_eq!(statuses, vec![410, 200], "{watches:?}");
        assert!(
            watches.iter().all(|w| w.contains(&marker)) && watches[1].ends_with("resourceVersion="),
            "both of the marker, the second from now: {watches:?}"
        );
        assert_eq!(
            requests_by(&env, "node-w", is_lease_list),
            1,
            "no read again"
        );
        let mut q = q.hand_off(&env).await;
        q.let_all_in(&mut env).await;
        assert_eq!(requests_by(&env, "node-w", is_lease_list), 2);
        q.stop();
    }

    /// Waiter Leases ahead whose waiters are gone (never renewed again) do not keep a waiter
    /// behind them far back: its marker (o08) is not renewed for twice the waiter time-out,
    /// so w deletes it as a dead waiter's Lease and reads again; the arbiter then judges the
    /// others dead (unchanged since w's first read), w is first, and takes the released slot.
    pub async fn dead_waiters_ahead_hold_back_no_live_waiter(mut env: Env) {
        let t = Timeouts {
            waiter_ttl: Duration::from_secs(2),
            ..timeouts()
        };
        for x in ["h", "w"].iter().chain(AHEAD.iter()) {
            add_node(&env, x);
        }
        let h = sem_with(&env, "h", None, t).await;
        within("h", h.acquire(&me("h"))).await.unwrap();
        for x in AHEAD {
            let s = sem_with(&env, x, None, t).await;
            let id = me(x);
            let mut waiting = Box::pin(s.acquire(&id));
            queued(&mut env.logs, x, &[], &mut waiting).await;
        }
        assert_eq!(
            waiter_leases(&env).len(),
            AHEAD.len(),
            "all queued, none renewing"
        );
        let w = sem_with(&env, "w", None, t).await;
        let id = me("w");
        let mut waiting_w = Box::pin(w.acquire(&id));
        queued(&mut env.logs, "w", &["waiters_ahead=17"], &mut waiting_w).await;
        // Twice their time-out passes: w deletes its marker's Lease, reads again, and is
        // first in the queue; the other Leases ahead are still there.
        queued(&mut env.logs, "w", &["waiters_ahead=0"], &mut waiting_w).await;
        assert!(
            waiter_lease(&env, "node-o08").is_none(),
            "w's marker, deleted"
        );
        assert_eq!(waiter_leases(&env).len(), AHEAD.len());
        h.unlock("m-h").await.unwrap();
        within("w takes the slot", &mut waiting_w).await.unwrap();
        assert_eq!(holders(&env)[&slot(0)], "node-w");
    }
}
