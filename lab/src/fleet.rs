//! A lab fleet: N [`Node`]s sharing one real etcd, each "rebooting" (restart with a new boot
//! id after a simulated reboot time) when its fake logind is asked to, and a watcher outside
//! rebootd that records every change of the semaphore document to check invariants.

use crate::dbus::LabError;
use crate::etcd::{EtcdServer, EtcdVersion};
use crate::node::{Node, NodeOptions};
use futures_util::StreamExt;
use rebootd::lock::document::{semaphore_key, SemaphoreDoc};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::broadcast;

/// How a fleet is set up.
#[derive(Debug, Clone)]
pub struct FleetOptions {
    pub nodes: usize,
    /// Slots of the semaphore (written before the nodes start).
    pub max: u64,
    pub etcd: EtcdVersion,
    /// How long a simulated reboot keeps a node down.
    pub reboot_time: Duration,
    /// Extra TOML for every node.
    pub config: String,
    pub group: String,
}

impl Default for FleetOptions {
    fn default() -> Self {
        FleetOptions {
            nodes: 5,
            max: 2,
            etcd: EtcdVersion::V34,
            reboot_time: Duration::from_millis(500),
            config: String::new(),
            group: "default".into(),
        }
    }
}

/// Something that happened in the fleet, in order, with the time since the fleet started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FleetEvent {
    /// The semaphore document changed: its holders (node names where known).
    Holders { at: Duration, holders: Vec<String> },
    /// logind on this node was asked to reboot.
    RebootRequested { at: Duration, node: String },
    /// The node is up again in a new boot.
    Booted { at: Duration, node: String },
}

/// A running fleet.
pub struct Fleet {
    pub etcd: EtcdServer,
    pub nodes: Vec<Arc<tokio::sync::Mutex<Node>>>,
    pub names: Vec<String>,
    started: Instant,
    events: Arc<Mutex<Vec<FleetEvent>>>,
    notify: broadcast::Sender<FleetEvent>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

fn record(
    events: &Mutex<Vec<FleetEvent>>,
    notify: &broadcast::Sender<FleetEvent>,
    event: FleetEvent,
) {
    if let Ok(mut e) = events.lock() {
        e.push(event.clone());
    }
    let _ = notify.send(event);
}

impl Fleet {
    /// Start etcd, set the semaphore's max, start the nodes and the watchers.
    pub async fn start(rebootd: &Path, opts: FleetOptions) -> Result<Fleet, LabError> {
        let etcd = EtcdServer::start(opts.etcd)
            .await
            .map_err(|e| LabError::DaemonStart(format!("etcd: {e}")))?;
        let key = semaphore_key(&opts.group);
        let doc = SemaphoreDoc {
            semaphore: opts.max as i64,
            max: opts.max,
            holders: Vec::new(),
        };
        let mut client = etcd_client::Client::connect([etcd.endpoint()], None)
            .await
            .map_err(|e| LabError::DaemonStart(format!("etcd client: {e}")))?;
        client
            .put(key.clone(), doc.to_json(), None)
            .await
            .map_err(|e| LabError::DaemonStart(format!("etcd put: {e}")))?;

        let (notify, _) = broadcast::channel(1024);
        let events = Arc::new(Mutex::new(Vec::new()));
        let started = Instant::now();
        let mut nodes = Vec::new();
        let mut names = Vec::new();
        let mut ids = Vec::new();
        let mut tasks = Vec::new();
        for i in 1..=opts.nodes {
            let name = format!("node-{i}");
            let config = format!(
                "[identity]\ngroup = {group:?}\n\n[lock]\nbackend = \"etcd\"\n\n[lock.etcd]\nendpoints = [{ep:?}]\n\n{extra}",
                group = opts.group,
                ep = etcd.endpoint(),
                extra = opts.config
            );
            let node = Node::start(rebootd, NodeOptions::new(&name).config(&config)).await?;
            ids.push((node.machine_id.clone(), name.clone()));
            let mut calls = node.logind.subscribe();
            let node = Arc::new(tokio::sync::Mutex::new(node));
            // The simulated reboot: on each accepted reboot call, go down for `reboot_time`,
            // then come back with a new boot id.
            let (n, ev, tx, nm, delay) = (
                node.clone(),
                events.clone(),
                notify.clone(),
                name.clone(),
                opts.reboot_time,
            );
            tasks.push(tokio::spawn(async move {
                while calls.recv().await.is_ok() {
                    record(
                        &ev,
                        &tx,
                        FleetEvent::RebootRequested {
                            at: started.elapsed(),
                            node: nm.clone(),
                        },
                    );
                    let mut node = n.lock().await;
                    node.kill_daemon().await;
                    tokio::time::sleep(delay).await;
                    if node.reboot().await.is_ok() {
                        record(
                            &ev,
                            &tx,
                            FleetEvent::Booted {
                                at: started.elapsed(),
                                node: nm.clone(),
                            },
                        );
                    }
                }
            }));
            nodes.push(node);
            names.push(name);
        }
        // The watcher outside rebootd: every revision of the document, from etcd's own history.
        let (ev, tx) = (events.clone(), notify.clone());
        let mut stream = client
            .watch(key.clone(), None)
            .await
            .map_err(|e| LabError::DaemonStart(format!("etcd watch: {e}")))?;
        tasks.push(tokio::spawn(async move {
            while let Some(Ok(resp)) = stream.next().await {
                for e in resp.events() {
                    let Some(kv) = e.kv() else { continue };
                    let holders = match SemaphoreDoc::parse(kv.value()) {
                        Ok(doc) => doc
                            .holders
                            .iter()
                            .map(|h| {
                                ids.iter()
                                    .find(|(id, _)| id == h)
                                    .map_or(h.clone(), |(_, n)| n.clone())
                            })
                            .collect(),
                        Err(e) => vec![format!("<unparsable: {e}>")],
                    };
                    record(
                        &ev,
                        &tx,
                        FleetEvent::Holders {
                            at: started.elapsed(),
                            holders,
                        },
                    );
                }
            }
        }));
        Ok(Fleet {
            etcd,
            nodes,
            names,
            started,
            events,
            notify,
            tasks,
        })
    }

    /// Follow the fleet's events as they happen.
    pub fn subscribe(&self) -> broadcast::Receiver<FleetEvent> {
        self.notify.subscribe()
    }

    /// Everything recorded so far.
    pub fn events(&self) -> Vec<FleetEvent> {
        self.events.lock().map(|e| e.clone()).unwrap_or_default()
    }

    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// The most holders the document ever had, as the outside watcher saw it.
    pub fn max_holders_seen(&self) -> usize {
        self.events()
            .iter()
            .filter_map(|e| match e {
                FleetEvent::Holders { holders, .. } => Some(holders.len()),
                _ => None,
            })
            .max()
            .unwrap_or(0)
    }

    /// Wait until every node's rebootd reported ready.
    pub async fn wait_ready(&self, timeout: Duration) -> Result<(), LabError> {
        for n in &self.nodes {
            n.lock().await.wait_ready(timeout).await?;
        }
        Ok(())
    }

    /// Make update_engine on every node say a reboot is needed.
    pub async fn trigger_all(&self, version: &str) -> Result<(), LabError> {
        for n in &self.nodes {
            n.lock()
                .await
                .update_engine
                .set_status("UPDATE_STATUS_UPDATED_NEED_REBOOT", version)
                .await?;
        }
        Ok(())
    }

    /// Wait until every node has rebooted once and is idle again with its slot released.
    pub async fn wait_rolled(&self, timeout: Duration) -> Result<(), LabError> {
        let deadline = tokio::time::Instant::now() + timeout;
        for n in &self.nodes {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            // The node's lock is held by its reboot task while it is down; take it only to
            // look at the state file, which outlives the process.
            let (store, name) = {
                let node = n.lock().await;
                (node.store(), node.name.clone())
            };
            wait_store(&store, &name, left).await?;
        }
        Ok(())
    }
}

/// Wait (inotify on the state directory) until a node's state shows a completed reboot.
async fn wait_store(
    store: &rebootd::state::StateStore,
    name: &str,
    timeout: Duration,
) -> Result<(), LabError> {
    use inotify::{Inotify, WatchMask};
    let done = |s: &rebootd::state::State| {
        s.phase == rebootd::state::Phase::Idle && s.last_reboot.is_some() && !s.slot_held
    };
    let inotify = Inotify::init().map_err(|e| LabError::io("inotify", e))?;
    inotify
        .watches()
        .add(store.dir(), WatchMask::MOVED_TO | WatchMask::CLOSE_WRITE)
        .map_err(|e| LabError::io("inotify watch", e))?;
    let mut events = inotify
        .into_event_stream(vec![0u8; 4096])
        .map_err(|e| LabError::io("inotify stream", e))?;
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if store.load().ok().flatten().as_ref().is_some_and(done) {
            return Ok(());
        }
        match tokio::time::timeout_at(deadline, events.next()).await {
            Ok(Some(_)) => continue,
            _ => {
                return Err(LabError::Timeout {
                    after: timeout,
                    what: format!(
                        "{name} to complete its reboot; last state {:?}",
                        store.load().ok().flatten()
                    ),
                })
            }
        }
    }
}
