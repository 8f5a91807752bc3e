//! The runtime (`rebootd::runtime::Runtime`, in this process) with in-memory adapters: a
//! semaphore kept in a `watch` channel, a rebooter that records its calls, a node drainer whose
//! Node is a `watch` channel too. Triggers are the real
//! `rebootctl reboot` request file; state is the real state file in a temporary directory. Its
//! own test binary: the runtime talks to `NOTIFY_SOCKET`, which the library's unit tests set.

use async_trait::async_trait;
use jiff::Timestamp;
use rebootd::config::Config;
use rebootd::control::{self, Request};
use rebootd::drain::{DrainError, Drainer, EventReason, NodeStatus};
use rebootd::inhibitor::{Inhibitor, Inhibitors};
use rebootd::lock::Backend;
use rebootd::lock::Pauses;
use rebootd::lock::{Fence, GroupPause, Identity, LockError, Reported, Semaphore};
use rebootd::reboot::RebootError;
use rebootd::runtime::{identity, HostSeams, NodeSeams, Runtime};
use rebootd::state::{Phase, State, StateStore};
use rebootd::users::{Session, Sessions};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// The semaphore as it stands: slots, holders, waiters, the group's pause.
#[derive(Debug, Clone, Default)]
struct Mem {
    max: usize,
    holders: Vec<String>,
    waiters: usize,
    pause: Option<GroupPause>,
    /// Holders silent for `max_hold` are reclaimed: the runtime beats (the beat is a write).
    max_hold: bool,
    /// A waiter judged the holder stopped, and its takeover (a compare-and-swap on the record it
    /// judged silent) is on its way: a write of the holder's record lands before it and makes it
    /// fail; otherwise it lands when the host goes down.
    takeover: Option<String>,
    /// Reboots asked for while a takeover of the caller's slot was on its way.
    reboots_under_takeover: usize,
    /// A store that connects on first use, under a lock (as the etcd stores do), and whose
    /// connection meets a cut: beat number `.0` (counting from 1; beats every 100 ms) holds the
    /// lock for `.1` while it connects, unless dropped; a phase report needs the lock.
    beat_holds_lock: Option<(usize, Duration)>,
    beats: usize,
    /// The phases reported, in order.
    reported: Vec<String>,
    /// A phase report is a write guarded as a heartbeat is (the etcd and Lease stores): while
    /// the slot is held it lands before a takeover on its way and proves the slot held.
    reports_prove: bool,
    /// The runtime's calls of `fence` (reads; with `max_hold` its proofs are beats).
    fences: usize,
    /// This many releases fail (the store cannot be reached) before one goes through.
    release_fails: usize,
}

#[derive(Clone)]
struct MemLock(Arc<watch::Sender<Mem>>, Arc<tokio::sync::Mutex<()>>);

/// Leaves the queue when the acquire ends or is dropped.
struct Leave<'a>(&'a watch::Sender<Mem>);

impl Drop for Leave<'_> {
    fn drop(&mut self) {
        self.0.send_modify(|m| m.waiters -= 1);
    }
}

impl MemLock {
    fn held(&self, me: &Identity) -> Result<Fence, LockError> {
        Ok(match self.0.borrow().holders.contains(&me.id) {
            true => Fence::Held,
            false => Fence::Lost {
                why: "released".into(),
            },
        })
    }
}

#[async_trait]
impl Semaphore for MemLock {
    fn backend(&self) -> Backend {
        Backend::None
    }

    fn fleet(&self) -> Option<&dyn rebootd::fleet::FleetStore> {
        None
    }

    async fn acquire(&self, me: &Identity) -> Result<(), LockError> {
        let mut rx = self.0.subscribe();
        self.0.send_modify(|m| m.waiters += 1);
        let _leave = Leave(&self.0);
        loop {
            let mut took = false;
            self.0.send_if_modified(|m| {
                took = m.holders.contains(&me.id);
                if !took && m.holders.len() < m.max {
                    m.holders.push(me.id.clone());
                    took = true;
                    return true;
                }
                false
            });
            if took {
                return Ok(());
            }
            let _ = rx.changed().await;
        }
    }

    async fn fence(&self, me: &Identity) -> Result<Fence, LockError> {
        self.0.send_modify(|m| m.fences += 1);
        self.held(me)
    }

    fn heartbeat_every(&self) -> Option<Duration> {
        let m = self.0.borrow();
        if m.beat_holds_lock.is_some() {
            return Some(Duration::from_millis(100));
        }
        // Long: no beat comes due by time in a test; only the runtime's proofs write.
        m.max_hold.then_some(Duration::from_secs(600))
    }

    async fn heartbeat(&self, me: &Identity) -> Result<Fence, LockError> {
        let mut holds = None;
        self.0.send_modify(|m| {
            m.beats += 1;
            holds = m.beat_holds_lock.filter(|(n, _)| *n == m.beats);
        });
        if let Some((_, d)) = holds {
            let _connecting = self.1.lock().await;
            tokio::time::sleep(d).await;
        }
        self.0.send_modify(|m| {
            if m.holders.contains(&me.id) {
                m.takeover = None;
            }
        });
        self.held(me)
    }

    async fn release(&self, me: &Identity) -> Result<(), LockError> {
        let mut failed = false;
        self.0.send_modify(|m| {
            failed = m.release_fails > 0;
            if failed {
                m.release_fails -= 1;
            } else {
                m.holders.retain(|h| *h != me.id);
            }
        });
        match failed {
            true => Err(LockError::Unreachable {
                backend: Backend::None,
                target: "memory".into(),
                reason: "cut off".into(),
            }),
            false => Ok(()),
        }
    }

    async fn report_phase(&self, me: &Identity, phase: Phase) -> Result<Reported, LockError> {
        let _connected = self.1.lock().await;
        let mut proof = Reported::Unproven;
        self.0.send_modify(|m| {
            m.reported.push(phase.as_str().to_owned());
            if m.reports_prove && m.holders.contains(&me.id) {
                m.takeover = None;
                proof = Reported::Held;
            }
        });
        Ok(proof)
    }
}

#[async_trait]
impl Pauses for MemLock {
    async fn group_pause(&self) -> Result<Option<GroupPause>, LockError> {
        Ok(self.0.borrow().pause.clone())
    }

    async fn group_pause_changed(
        &self,
        known: Option<&GroupPause>,
    ) -> Result<Option<GroupPause>, LockError> {
        let mut rx = self.0.subscribe();
        let m = rx
            .wait_for(|m| m.pause.as_ref() != known)
            .await
            .map_err(|e| LockError::Refused(e.to_string()))?;
        Ok(m.pause.clone())
    }
}

/// Counts the reboots asked for; a takeover on its way lands as the host goes down.
struct MemRebooter(Arc<watch::Sender<usize>>, MemLock);

#[async_trait]
impl rebootd::reboot::Rebooter for MemRebooter {
    async fn manager(&self) -> Result<rebootd::systemd::Manager, RebootError> {
        Err(RebootError::Unsupported {
            what: "systemd's manager",
        })
    }

    async fn reboot(&self, _: rebootd::reboot_method::Kind) -> Result<(), RebootError> {
        self.1 .0.send_modify(|m| {
            if let Some(waiter) = m.takeover.take() {
                m.reboots_under_takeover += 1;
                m.holders = vec![waiter];
            }
        });
        self.0.send_modify(|n| *n += 1);
        Ok(())
    }
}

/// No logind here: nothing holds the reboot off.
#[async_trait]
impl Inhibitors for MemRebooter {
    async fn blockers(&self) -> Result<Vec<Inhibitor>, RebootError> {
        Err(RebootError::Unsupported { what: "inhibitors" })
    }

    async fn blockers_changed(&self, _: &[Inhibitor]) -> Result<Vec<Inhibitor>, RebootError> {
        Err(RebootError::Unsupported { what: "inhibitors" })
    }
}

/// No one logged in to warn.
#[async_trait]
impl Sessions for MemRebooter {
    async fn sessions(&self) -> Result<Vec<Session>, RebootError> {
        Err(RebootError::Unsupported { what: "sessions" })
    }

    async fn announce(&self, _: Timestamp) -> Result<(), RebootError> {
        Err(RebootError::Unsupported { what: "sessions" })
    }

    async fn withdraw(&self) -> Result<(), RebootError> {
        Err(RebootError::Unsupported { what: "sessions" })
    }
}

/// This host's Node as the drainer sees it.
#[derive(Debug, Clone, Default)]
struct Node {
    unschedulable: bool,
    /// A drain does not finish (a pod its budget keeps) while true.
    drain_hangs: bool,
    /// A drain takes this long.
    drain_takes: Duration,
    drains: usize,
    uncordons: usize,
    /// The cluster autoscaler's `scale-down-disabled` annotation (`None`: absent).
    scale_down: Option<String>,
    /// How the next adds of it go.
    scale_down_add: AddGoes,
    scale_down_removals: usize,
}

/// How an add of the autoscaler's annotation goes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum AddGoes {
    /// As on the API server: added where absent, answered.
    #[default]
    Answered,
    /// The API server refuses it (an admission policy without the rule): 422, nothing written.
    Refused,
    /// Written, but the answer is lost (a connection cut): the caller cannot tell.
    AnswerLost,
}

/// A drainer whose Node lives in a `watch` channel: the drain cordons, then finishes at once or
/// never (`drain_hangs`); the node is Ready at once.
#[derive(Clone)]
struct MemDrainer(Arc<watch::Sender<Node>>);

#[async_trait]
impl Drainer for MemDrainer {
    async fn is_unschedulable(&self) -> Result<bool, DrainError> {
        Ok(self.0.borrow().unschedulable)
    }

    async fn blocking_pods(&self) -> Result<Vec<String>, DrainError> {
        Ok(Vec::new())
    }

    async fn drain(&self) -> Result<(), DrainError> {
        let (mut hangs, mut takes) = (false, Duration::ZERO);
        self.0.send_modify(|n| {
            n.unschedulable = true;
            n.drains += 1;
            hangs = n.drain_hangs;
            takes = n.drain_takes;
        });
        tokio::time::sleep(takes).await;
        if hangs {
            let _ = self.0.subscribe().wait_for(|n| !n.drain_hangs).await;
        }
        Ok(())
    }

    async fn wait_ready(&self, _timeout: Duration) -> Result<(), DrainError> {
        Ok(())
    }

    async fn uncordon(&self) -> Result<(), DrainError> {
        self.0.send_modify(|n| {
            n.unschedulable = false;
            n.uncordons += 1;
        });
        Ok(())
    }
}

/// The in-memory Node shows nothing of the reboot.
#[async_trait]
impl NodeStatus for MemDrainer {
    async fn annotate(&self, _: Phase, _: Timestamp, _: bool) -> Result<(), DrainError> {
        Err(DrainError::Unsupported {
            what: "Node annotations",
        })
    }

    async fn annotate_paused(&self, _: Option<&str>) -> Result<(), DrainError> {
        Err(DrainError::Unsupported {
            what: "Node annotations",
        })
    }

    async fn annotate_group_paused(&self, _: Option<&str>) -> Result<(), DrainError> {
        Err(DrainError::Unsupported {
            what: "Node annotations",
        })
    }

    async fn event(&self, _: EventReason, _: &str) -> Result<(), DrainError> {
        Err(DrainError::Unsupported {
            what: "Node Events",
        })
    }

    async fn unmark(&self) -> Result<(), DrainError> {
        Err(DrainError::Unsupported {
            what: "Node labels and taint",
        })
    }

    async fn disable_scale_down(&self) -> Result<bool, DrainError> {
        let mut out = Ok(false);
        self.0.send_modify(|n| {
            out = match (n.scale_down_add, &n.scale_down) {
                (AddGoes::Refused, _) => {
                    let status = kube::core::Status::failure("denied by policy", "Invalid");
                    let source = kube::Error::Api(status.with_code(422).boxed());
                    Err(DrainError::Api {
                        call: "annotate".into(),
                        status: Some(422),
                        detail: "422 Invalid".into(),
                        source,
                    })
                }
                (_, Some(_)) => Ok(false),
                (AddGoes::Answered, None) => {
                    n.scale_down = Some("true".into());
                    Ok(true)
                }
                (AddGoes::AnswerLost, None) => {
                    n.scale_down = Some("true".into());
                    let cut = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "cut");
                    Err(DrainError::Api {
                        call: "annotate".into(),
                        status: None,
                        detail: "connection reset".into(),
                        source: kube::Error::Service(Box::new(cut)),
                    })
                }
            };
        });
        out
    }

    async fn enable_scale_down(&self) -> Result<(), DrainError> {
        self.0.send_modify(|n| {
            if n.scale_down.as_deref() == Some("true") {
                n.scale_down = None;
                n.scale_down_removals += 1;
            }
        });
        Ok(())
    }
}

struct Host {
    dir: tempfile::TempDir,
    lock: MemLock,
    reboots: Arc<watch::Sender<usize>>,
    /// `Some`: the config has `[kubernetes]` and the runtime drains through this.
    node: Option<MemDrainer>,
}

type Running = (
    tokio::task::JoinHandle<()>,
    tokio::sync::oneshot::Sender<()>,
);

impl Host {
    fn new(mem: Mem) -> Host {
        Host::with_node(mem, None)
    }

    fn with_node(mem: Mem, node: Option<Node>) -> Host {
        let dir = tempfile::tempdir().unwrap();
        let path = |name: &str| dir.path().join(name);
        std::fs::write(path("machine-id"), "0123456789abcdef0123456789abcdef\n").unwrap();
        std::fs::write(path("boot_id"), "boot-1\n").unwrap();
        let mut config = format!(
            "[identity]\nnode_name = \"n1\"\nmachine_id_file = {:?}\nboot_id_file = {:?}\n\n\
             [triggers]\nupdate_engine = false\n\n[reboot]\nretry_interval = \"1s\"\n",
            path("machine-id"),
            path("boot_id"),
        );
        if node.is_some() {
            // Never opened: the drainer is the in-memory one.
            config.push_str(&format!(
                "\n[kubernetes]\nkubeconfig = {:?}\n",
                path("kubeconfig")
            ));
        }
        std::fs::write(path("rebootd.toml"), config).unwrap();
        Host {
            dir,
            lock: MemLock(Arc::new(watch::channel(mem).0), Arc::default()),
            reboots: Arc::new(watch::channel(0).0),
            node: node.map(|n| MemDrainer(Arc::new(watch::channel(n).0))),
        }
    }

    fn store(&self) -> StateStore {
        StateStore::new(self.dir.path().join("state"))
    }

    /// A running agent on this host, in the boot its boot id file says; stopped by the sender.
    fn start(&self) -> Running {
        let config = Config::load(&[self.dir.path().join("rebootd.toml")]).unwrap();
        let store = self.store();
        std::fs::create_dir_all(store.dir()).unwrap();
        let me = identity(&config, &store).unwrap();
        let node = self.node.clone().map(NodeSeams::new);
        let rt = Runtime::new(config, store, Box::new(self.lock.clone()), node, me).with_host(
            HostSeams::new(MemRebooter(self.reboots.clone(), self.lock.clone())),
        );
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            rt.run(async {
                let _ = stopped.await;
            })
            .await
            .unwrap();
        });
        (task, stop)
    }

    /// Wait (inotify on the state directory) until the state file satisfies `pred`.
    async fn state(&self, what: &str, pred: impl Fn(&State) -> bool) -> State {
        use futures_util::StreamExt;
        let store = self.store();
        let inotify = inotify::Inotify::init().unwrap();
        let mask = inotify::WatchMask::MOVED_TO
            | inotify::WatchMask::CLOSE_WRITE
            | inotify::WatchMask::DELETE;
        inotify.watches().add(store.dir(), mask).unwrap();
        let mut events = inotify.into_event_stream(vec![0u8; 4096]).unwrap();
        let found = tokio::time::timeout(Duration::from_secs(20), async {
            loop {
                if let Some(s) = store.load().ok().flatten().filter(&pred) {
                    return s;
                }
                events.next().await;
            }
        })
        .await;
        found.unwrap_or_else(|_| panic!("{what}: last state {:?}", store.load()))
    }

    async fn mem(&self, what: &str, pred: impl Fn(&Mem) -> bool) {
        let mut rx = self.lock.0.subscribe();
        let waited = tokio::time::timeout(Duration::from_secs(20), rx.wait_for(pred))
            .await
            .is_ok();
        assert!(waited, "{what}: {:?}", *self.lock.0.borrow());
    }

    async fn reboots(&self, n: usize) {
        let mut rx = self.reboots.subscribe();
        let waited = tokio::time::timeout(Duration::from_secs(20), rx.wait_for(|c| *c == n))
            .await
            .is_ok();
        assert!(waited, "{n} reboots: {}", *self.reboots.borrow());
    }

    async fn node(&self, what: &str, pred: impl Fn(&Node) -> bool) -> Node {
        let mut rx = self
            .node
            .as_ref()
            .expect("a host with a node")
            .0
            .subscribe();
        let seen = tokio::time::timeout(Duration::from_secs(20), async {
            rx.wait_for(pred).await.map(|n| n.clone())
        })
        .await;
        match seen {
            Ok(Ok(n)) => n,
            _ => panic!("{what}: {:?}", *rx.borrow()),
        }
    }

    /// The reboot asked for is on record; the agent stops (the host goes down) and starts in
    /// the next boot, which ends idle with the slot given back.
    async fn next_boot(&self, running: Running) -> Running {
        self.state("the reboot on record", |s| {
            s.reboot.as_ref().is_some_and(|r| r.called)
        })
        .await;
        stop(running).await;
        std::fs::write(self.dir.path().join("boot_id"), "boot-2\n").unwrap();
        let running = self.start();
        self.state("idle in the new boot", |s| {
            s.phase == Phase::Idle && s.boot_id == "boot-2"
        })
        .await;
        self.mem("the slot given back", |m| m.holders.is_empty())
            .await;
        running
    }

    fn request(&self) {
        std::fs::write(self.store().request_path(), b"{}").unwrap();
    }
}

async fn stop(running: Running) {
    drop(running.1);
    running.0.await.unwrap();
}

/// With `max_hold`, a waiter may judge a holder stopped (it was cut off from the store for
/// longer) and take its slot over a moment after the holder last read it. So the holder's proof
/// before the reboot is a write of its record, which lands before that takeover and makes it
/// fail (RELIABILITY.md, finding 7). A read proves the slot held only until the takeover lands:
/// the reboot was asked for with the takeover on its way, and the node went down without a slot.
/// (The node drains first: right after the take, the take itself is the proof, see
/// `the_take_and_the_reports_are_the_proofs_before_the_cordon_and_the_reboot`.)
#[tokio::test]
async fn with_max_hold_the_proof_before_the_reboot_is_a_write_that_lands_before_a_takeover() {
    let host = Host::with_node(
        Mem {
            max: 1,
            max_hold: true,
            takeover: Some("node-2".into()),
            ..Mem::default()
        },
        Some(Node::default()),
    );
    let running = host.start();
    host.request();
    host.reboots(1).await;
    let mem = host.lock.0.borrow().clone();
    assert_eq!(
        mem.reboots_under_takeover, 0,
        "the reboot was asked for while node-2's takeover of the slot was on its way"
    );
    assert_eq!(mem.holders.len(), 1, "{mem:?}");
    assert_ne!(mem.holders[0], "node-2", "{mem:?}");
    stop(running).await;
}

/// The take, and a phase report that is a guarded write (the etcd and Lease stores), prove the
/// slot held as a fence does, a step or two later (recording the cordon, the checks before the
/// reboot, both quick here): the take (which wrote `draining`, the first report) is the proof
/// before the cordon and the report of `rebooting` the proof before the logind call, and no
/// fence is sent. A store whose reports prove nothing gets the fence before the logind call; a
/// runtime that ignored the take's proof would send the cordon's too.
#[tokio::test]
async fn the_take_and_the_reports_are_the_proofs_before_the_cordon_and_the_reboot() {
    for (reports_prove, fences) in [(true, 0), (false, 1)] {
        let host = Host::with_node(
            Mem {
                max: 1,
                reports_prove,
                ..Mem::default()
            },
            Some(Node::default()),
        );
        let running = host.start();
        host.request();
        host.reboots(1).await;
        let mem = host.lock.0.borrow().clone();
        assert!(mem.reported.iter().any(|p| p == "rebooting"), "{mem:?}");
        assert_eq!(
            mem.fences, fences,
            "reports prove: {reports_prove}: {mem:?}"
        );
        stop(running).await;
    }
}

/// With `max_hold` the proof before the logind call must be a write that lands before a
/// takeover on its way (finding 7). The report of `rebooting` is such a write: no heartbeat is
/// sent after it, and the takeover still fails.
#[tokio::test]
async fn with_max_hold_the_report_of_rebooting_is_the_write_before_the_reboot() {
    let host = Host::new(Mem {
        max: 1,
        max_hold: true,
        reports_prove: true,
        takeover: Some("node-2".into()),
        ..Mem::default()
    });
    let running = host.start();
    host.request();
    host.reboots(1).await;
    let mem = host.lock.0.borrow().clone();
    assert_eq!(mem.reboots_under_takeover, 0, "{mem:?}");
    assert_eq!(
        (mem.beats, mem.fences),
        (0, 0),
        "a proof sent again: {mem:?}"
    );
    stop(running).await;
}

/// A report proves only what it wrote: when the slot went during the drain, the report of
/// `rebooting` writes nothing and proves nothing, the fence before the logind call is sent and
/// finds the slot lost, and the node backs out without a reboot.
#[tokio::test]
async fn a_slot_lost_during_the_drain_is_found_by_the_fence_after_the_report() {
    let host = Host::with_node(
        Mem {
            max: 1,
            reports_prove: true,
            ..Mem::default()
        },
        Some(Node {
            drain_hangs: true,
            ..Node::default()
        }),
    );
    let running = host.start();
    host.request();
    host.node("draining", |n| n.drains == 1).await;
    // An operator unlocks the slot and another node takes it; then the drain finishes.
    host.lock
        .0
        .send_modify(|m| m.holders = vec!["node-2".into()]);
    host.node
        .as_ref()
        .unwrap()
        .0
        .send_modify(|n| n.drain_hangs = false);
    host.node("uncordoned after backing out", |n| n.uncordons == 1)
        .await;
    let state = host
        .state("back in the queue", |s| s.phase == Phase::AcquiringSlot)
        .await;
    assert!(!state.slot_held, "{state:?}");
    let mem = host.lock.0.borrow().clone();
    assert_eq!(*host.reboots.borrow(), 0, "{mem:?}");
    assert_eq!(
        mem.fences, 1,
        "the reboot's (the cordon's was the report): {mem:?}"
    );
    stop(running).await;
}

/// The phase `releasing` is not written to the holder's record when the release follows at
/// once (the release deletes the record): one request less per reboot. A release that fails
/// writes it, so the store shows what the holder is stuck at until the release goes through.
#[tokio::test]
async fn releasing_is_reported_only_when_the_release_does_not_follow_at_once() {
    let host = Host::new(Mem {
        max: 1,
        ..Mem::default()
    });
    let running = host.start();
    host.request();
    let running = host.next_boot(running).await;
    let mem = host.lock.0.borrow().clone();
    assert_eq!(
        mem.reported,
        ["rebooting", "waiting_for_healthy"],
        "{mem:?}"
    );
    stop(running).await;

    let host = Host::new(Mem {
        max: 1,
        release_fails: 1,
        ..Mem::default()
    });
    let running = host.start();
    host.request();
    let running = host.next_boot(running).await;
    let mem = host.lock.0.borrow().clone();
    assert_eq!(
        mem.reported,
        ["rebooting", "waiting_for_healthy", "releasing"],
        "{mem:?}"
    );
    stop(running).await;
}

/// A beat still under way when the action beside it ends is dropped, not kept unpolled while
/// the step is applied. Kept, it held what the phase report of that step needed (a store that
/// connects on first use, under a lock, as the etcd stores do), and the node waited for ever in
/// the next phase with its slot (RELIABILITY.md, finding 8: three chaos trials on etcd).
#[tokio::test]
async fn a_beat_under_way_when_the_action_ends_does_not_hold_up_the_step() {
    let host = Host::with_node(
        Mem {
            max: 1,
            // The first beat is the proof before the cordon; the second comes during the drain.
            beat_holds_lock: Some((2, Duration::from_secs(3600))),
            ..Mem::default()
        },
        Some(Node {
            // A beat comes due (100 ms) and is under way when the drain ends.
            drain_takes: Duration::from_millis(250),
            ..Node::default()
        }),
    );
    let running = host.start();
    host.request();
    host.node("drained", |n| n.drains == 1).await;
    // The step that follows the drain reports its phase; the beat under way holds the lock an
    // hour, so only dropping it lets the report through.
    host.mem("the phase after the drain reported", |m| {
        m.reported
            .iter()
            .skip_while(|p| *p != "draining")
            .nth(1)
            .is_some()
    })
    .await;
    host.reboots(1).await;
    stop(running).await;
}

/// A `rebootctl reboot` made while the node waits for a slot is consumed by that cycle: the
/// request file goes at once, the queue place is kept, one reboot, idle after the boot.
#[tokio::test]
async fn a_request_made_while_waiting_for_a_slot_is_served_by_that_cycle() {
    let host = Host::new(Mem {
        max: 1,
        holders: vec!["other".into()],
        ..Mem::default()
    });
    let running = host.start();
    host.request();
    host.mem("in the queue", |m| m.waiters == 1).await;
    host.request();
    let request = host.store().request_path();
    host.state("the second request consumed", |s| {
        s.phase == Phase::AcquiringSlot && !request.exists()
    })
    .await;
    assert_eq!(host.lock.0.borrow().waiters, 1, "still in the queue");
    host.lock.0.send_modify(|m| m.holders.clear());
    host.reboots(1).await;
    // The next boot: back to idle, the slot given back, no second cycle.
    let running = host.next_boot(running).await;
    assert_eq!(*host.reboots.borrow(), 1);
    stop(running).await;
}

/// A group paused in the lock store: the waiter leaves the queue, says why, and takes the slot
/// once resumed.
#[tokio::test]
async fn a_paused_group_takes_the_waiter_out_of_the_queue_until_resumed() {
    let host = Host::new(Mem {
        max: 1,
        holders: vec!["other".into()],
        ..Mem::default()
    });
    let running = host.start();
    host.request();
    host.mem("in the queue", |m| m.waiters == 1).await;
    let pause = GroupPause {
        since: Timestamp::now(),
        reason: Some("freeze".into()),
        by: None,
    };
    host.lock.0.send_modify(|m| m.pause = Some(pause.clone()));
    let s = host
        .state("waiting on the group", |s| s.group_paused.is_some())
        .await;
    assert!(s.waiting_for.unwrap().contains("freeze"));
    host.mem("out of the queue", |m| m.waiters == 0).await;
    host.lock.0.send_modify(|m| m.holders.clear());
    assert_eq!(*host.reboots.borrow(), 0);
    host.lock.0.send_modify(|m| m.pause = None);
    host.reboots(1).await;
    assert_eq!(host.lock.0.borrow().holders.len(), 1);
    stop(running).await;
}

/// A cancel while the drain cannot finish takes effect at once: the drain is dropped, the
/// cordon rebootd made comes off, the slot goes back, no reboot.
#[tokio::test]
async fn a_cancel_during_a_drain_that_cannot_finish_undoes_the_cordon_and_gives_the_slot_back() {
    let host = Host::with_node(
        Mem {
            max: 1,
            ..Mem::default()
        },
        Some(Node {
            drain_hangs: true,
            ..Node::default()
        }),
    );
    let running = host.start();
    host.request();
    host.node("cordoned for the drain", |n| {
        n.drains == 1 && n.unschedulable
    })
    .await;
    host.state("draining", |s| s.phase == Phase::Draining).await;
    assert_eq!(host.lock.0.borrow().holders.len(), 1);
    control::submit(&host.store(), Request::Cancel).unwrap();
    let n = host
        .node("uncordoned", |n| !n.unschedulable && n.uncordons == 1)
        .await;
    assert_eq!(n.drains, 1);
    host.mem("the slot given back", |m| m.holders.is_empty())
        .await;
    let s = host
        .state("idle, the need dropped", |s| {
            s.phase == Phase::Idle && s.reason.is_none()
        })
        .await;
    assert!(!s.slot_held);
    assert_eq!(*host.reboots.borrow(), 0, "no reboot after a cancel");
    stop(running).await;
}

/// A Node an operator had cordoned before the cycle stays cordoned: rebootd drains it, reboots,
/// and after the boot gives its slot back without uncordoning what it did not cordon.
#[tokio::test]
async fn a_node_cordoned_by_someone_else_stays_cordoned_after_the_cycle() {
    let host = Host::with_node(
        Mem {
            max: 1,
            ..Mem::default()
        },
        Some(Node {
            unschedulable: true,
            ..Node::default()
        }),
    );
    let running = host.start();
    host.request();
    host.reboots(1).await;
    let running = host.next_boot(running).await;
    let n = host.node("after the cycle", |_| true).await;
    assert_eq!((n.drains, n.uncordons), (1, 0), "{n:?}");
    assert!(n.unschedulable, "still cordoned, as the operator left it");
    stop(running).await;
}

/// The autoscaler's annotation (`runtime::courtesy`), on the runtime's side: added while the slot
/// is held and its add on record in the state file; an add whose answer was lost is on record
/// too (it may have landed) and, across the reboot, taken off before the slot is given back; a
/// refusal clears the record and the reboot goes on; someone else's annotation is left alone.
#[tokio::test]
async fn the_autoscaler_annotation_is_on_record_before_it_is_added_and_off_before_the_release() {
    for goes in [AddGoes::Answered, AddGoes::AnswerLost, AddGoes::Refused] {
        let host = Host::with_node(
            Mem {
                max: 1,
                ..Mem::default()
            },
            Some(Node {
                scale_down_add: goes,
                ..Node::default()
            }),
        );
        let running = host.start();
        host.request();
        let s = host
            .state("rebooting", |s| s.reboot.as_ref().is_some_and(|r| r.called))
            .await;
        let on = host.node("the Node now", |_| true).await.scale_down;
        match goes {
            AddGoes::Refused => {
                assert!(!s.scale_down_disabled, "{goes:?}: {s:?}");
                assert_eq!(on, None);
            }
            _ => {
                assert!(s.scale_down_disabled, "{goes:?}: {s:?}");
                assert_eq!(on.as_deref(), Some("true"), "{goes:?}");
            }
        }
        assert!(s.slot_since.is_some(), "{s:?}");
        // The host goes down; the next boot's agent gives the slot back, the annotation first.
        let running = host.next_boot(running).await;
        let n = host.node("after the cycle", |_| true).await;
        assert_eq!(n.scale_down, None, "{goes:?}");
        let removals = usize::from(goes != AddGoes::Refused);
        assert_eq!(n.scale_down_removals, removals, "{goes:?}");
        let s = host.state("idle", |s| s.phase == Phase::Idle).await;
        assert!(!s.scale_down_disabled && s.slot_since.is_none(), "{s:?}");
        stop(running).await;
    }

    // Someone else's annotation, whatever its value: left alone, never on record.
    let host = Host::with_node(
        Mem {
            max: 1,
            ..Mem::default()
        },
        Some(Node {
            scale_down: Some("true".into()),
            ..Node::default()
        }),
    );
    let running = host.start();
    host.request();
    let s = host
        .state("rebooting", |s| s.reboot.as_ref().is_some_and(|r| r.called))
        .await;
    assert!(!s.scale_down_disabled, "{s:?}");
    let running = host.next_boot(running).await;
    let n = host.node("after the cycle", |_| true).await;
    assert_eq!(
        (n.scale_down.as_deref(), n.scale_down_removals),
        (Some("true"), 0)
    );
    stop(running).await;
}
