//! A lab fleet: N [`Node`]s sharing one real etcd, each "rebooting" (restart with a new boot
//! id after a simulated reboot time) when its fake logind is asked to, and a watcher outside
//! rebootd that records every change of the semaphore document to check invariants.

use crate::dbus::LabError;
use crate::etcd::{EtcdServer, EtcdVersion};
use crate::kube_api::{KubeApi, KubeApiHandle, NodeBuilder, Options as KubeOptions};
use crate::node::{Node, NodeOptions};
use futures_util::StreamExt;
use rebootd::lock::document::{semaphore_key, SemaphoreDoc};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::broadcast;

/// Where the fleet keeps its semaphore.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FleetLock {
    Etcd(EtcdVersion),
    /// Lease objects in the Kubernetes API stand-in.
    Kubernetes,
}

/// How a fleet is set up.
#[derive(Debug, Clone)]
pub struct FleetOptions {
    pub nodes: usize,
    /// Slots of the semaphore (written before the nodes start).
    pub max: u64,
    pub lock: FleetLock,
    /// Run the Kubernetes API stand-in with one Node per lab node and let rebootd drain.
    pub drain: bool,
    /// After a simulated reboot, how long until the kubelet reports the Node Ready again.
    pub ready_delay: Duration,
    /// Extra keys for the nodes' `[kubernetes]` table (when `drain`).
    pub kubernetes_config: String,
    /// How long a simulated reboot keeps a node down.
    pub reboot_time: Duration,
    /// Extra TOML for every node.
    pub config: String,
    /// Extra keys for the nodes' `[lock]` table (e.g. `max_hold = "3s"`).
    pub lock_config: String,
    pub group: String,
    /// Each node talks to the API stand-in as its own identity, user `rebootd:node:<node>` (as
    /// `deploy/kubernetes/mint-kubeconfig.sh` mints them), with the Lease semaphore in the
    /// namespace `rebootd`; the slot count is written by the lab (an administrator), not by a node.
    pub node_identities: bool,
    /// Validating admission in the API stand-in (every write, before it is stored).
    pub kube_admission: Option<crate::kube_api::Admission>,
    /// With the etcd lock: authentication on, each node talking to etcd as its own user, named
    /// after the node. These shell commands run ([`EtcdServer::shell`]) in the fleet's
    /// directory once etcd is up, before anything is written: they must turn v3 authentication
    /// on with root's password in the file `root.password`, and leave each node's password in
    /// `<node>.etcd-password` (as docs/etcd-security.md's do). The fleet writes the semaphore
    /// and watches it as root.
    pub etcd_users: Option<String>,
}

impl Default for FleetOptions {
    fn default() -> Self {
        FleetOptions {
            nodes: 5,
            max: 2,
            lock: FleetLock::Etcd(EtcdVersion::V34),
            drain: false,
            ready_delay: Duration::from_millis(200),
            kubernetes_config: "drain_timeout = \"60s\"\nready_timeout = \"30s\"\n".into(),
            reboot_time: Duration::from_millis(500),
            config: String::new(),
            lock_config: String::new(),
            group: "default".into(),
            node_identities: false,
            kube_admission: None,
            etcd_users: None,
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
    pub etcd: Option<EtcdServer>,
    pub kube: Option<KubeApiHandle>,
    /// The kubeconfig the nodes use, when the stand-in runs.
    pub kubeconfig: Option<std::path::PathBuf>,
    /// Per node: whether it comes back Ready after a reboot (default true).
    pub comes_back_ready: Vec<Arc<std::sync::atomic::AtomicBool>>,
    _dir: tempfile::TempDir,
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
        let dir = tempfile::tempdir().map_err(|e| LabError::io("fleet dir", e))?;
        let names: Vec<String> = (1..=opts.nodes).map(|i| format!("node-{i}")).collect();
        let uses_kube = opts.drain || opts.lock == FleetLock::Kubernetes;
        let (kube, kubeconfig) = if uses_kube {
            let handle = KubeApi::start(KubeOptions {
                pod_ready_delay: Duration::from_millis(200),
                admission: opts.kube_admission.clone(),
                ..KubeOptions::default()
            })
            .await
            .map_err(|e| LabError::DaemonStart(format!("kube API stand-in: {e}")))?;
            for name in &names {
                handle
                    .cluster()
                    .add(&NodeBuilder::new(name))
                    .map_err(|e| LabError::DaemonStart(format!("add node {name}: {e}")))?;
            }
            let path = dir.path().join("kubeconfig");
            handle
                .write_kubeconfig(&path)
                .map_err(|e| LabError::DaemonStart(format!("kubeconfig: {e}")))?;
            (Some(handle), Some(path))
        } else {
            (None, None)
        };
        let (etcd, mut client, lock_config) = match opts.lock {
            FleetLock::Etcd(version) => {
                let mut etcd = EtcdServer::start(version)
                    .await
                    .map_err(|e| LabError::DaemonStart(format!("etcd: {e}")))?;
                let mut connect = None;
                if let Some(script) = &opts.etcd_users {
                    etcd.shell(script, dir.path())
                        .map_err(|e| LabError::DaemonStart(format!("etcd users: {e}")))?;
                    let root = std::fs::read_to_string(dir.path().join("root.password"))
                        .map_err(|e| LabError::io("root.password", e))?;
                    etcd.auth_turned_on(root.trim());
                    connect =
                        Some(etcd_client::ConnectOptions::new().with_user("root", root.trim()));
                }
                let doc = SemaphoreDoc {
                    semaphore: opts.max as i64,
                    max: opts.max,
                    holders: Vec::new(),
                };
                let mut client = etcd_client::Client::connect([etcd.endpoint()], connect)
                    .await
                    .map_err(|e| LabError::DaemonStart(format!("etcd client: {e}")))?;
                client
                    .put(semaphore_key(&opts.group), doc.to_json(), None)
                    .await
                    .map_err(|e| LabError::DaemonStart(format!("etcd put: {e}")))?;
                let config = format!(
                    "[lock]\nbackend = \"etcd\"\n{}\n[lock.etcd]\nendpoints = [{:?}]\n",
                    opts.lock_config,
                    etcd.endpoint()
                );
                (Some(etcd), Some(client), config)
            }
            FleetLock::Kubernetes => {
                let namespace = if opts.node_identities {
                    "rebootd"
                } else {
                    "kube-system"
                };
                let config = format!(
                    "[lock]\nbackend = \"kubernetes\"\n{}\n[lock.kubernetes]\nnamespace = {namespace:?}\nname = \"rebootd\"\nkubeconfig = @KUBECONFIG@\n",
                    opts.lock_config,
                );
                (None, None, config)
            }
        };
        if let (Some(k), FleetLock::Kubernetes, true) = (&kube, opts.lock, opts.node_identities) {
            // The administrator writes the slot count (a node identity may not).
            k.cluster()
                .create(
                    crate::kube_api::Kind::Lease,
                    serde_json::json!({
                        "metadata": {
                            "name": "rebootd", "namespace": "rebootd",
                            "labels": {"rebootd.io/semaphore": "rebootd", "rebootd.io/role": "control"},
                            "annotations": {"rebootd.io/max": opts.max.to_string()},
                        },
                        "spec": {},
                    }),
                )
                .map_err(|e| LabError::DaemonStart(format!("control Lease: {e}")))?;
        }
        let drain_config = match (&kubeconfig, opts.drain) {
            (Some(_), true) => format!(
                "[kubernetes]\nkubeconfig = @KUBECONFIG@\n{}\n",
                opts.kubernetes_config
            ),
            _ => String::new(),
        };
        let set_max_for_leases = opts.lock == FleetLock::Kubernetes && !opts.node_identities;
        let comes_back_ready: Vec<_> = names
            .iter()
            .map(|_| Arc::new(std::sync::atomic::AtomicBool::new(true)))
            .collect();
        let (notify, _) = broadcast::channel(1024);
        let events = Arc::new(Mutex::new(Vec::new()));
        let started = Instant::now();
        let mut nodes = Vec::new();
        let mut ids = Vec::new();
        let mut tasks = Vec::new();
        for (i, name) in names.iter().enumerate() {
            // The node's kubeconfig: the shared one, or its own identity's.
            let node_kubeconfig = match (&kube, opts.node_identities) {
                (Some(k), true) => {
                    let path = dir.path().join(format!("kubeconfig-{name}"));
                    k.write_kubeconfig_for(&path, &format!("rebootd:node:{name}"))
                        .map_err(|e| LabError::DaemonStart(format!("kubeconfig: {e}")))?;
                    Some(path)
                }
                _ => kubeconfig.clone(),
            };
            let kc = format!("{:?}", node_kubeconfig.as_deref().unwrap_or(Path::new("")));
            // Its own etcd user: the keys go on in `[lock.etcd]`, where `lock_config` ends.
            let user = match (&opts.etcd_users, opts.lock) {
                (Some(_), FleetLock::Etcd(_)) => {
                    let file = dir.path().join(format!("{name}.etcd-password"));
                    if !file.exists() {
                        return Err(LabError::DaemonStart(format!(
                            "the etcd users' commands left no {}",
                            file.display()
                        )));
                    }
                    format!("username = {name:?}\npassword_file = {file:?}\n")
                }
                _ => String::new(),
            };
            let config = format!(
                "[identity]\ngroup = {group:?}\n\n{lock_config}{user}\n{drain_config}\n{extra}",
                group = opts.group,
                extra = opts.config
            )
            .replace("@KUBECONFIG@", &kc);
            let mut node_opts = NodeOptions::new(name).config(&config);
            node_opts.start_daemon = !(set_max_for_leases && i == 0);
            let mut node = Node::start(rebootd, node_opts).await?;
            if set_max_for_leases && i == 0 {
                let rebootctl = rebootd.with_file_name("rebootctl");
                let out = node
                    .command(&rebootctl)
                    .args(["set-max", &opts.max.to_string(), "--force"])
                    .output()
                    .await
                    .map_err(|e| LabError::io("rebootctl set-max", e))?;
                if !out.status.success() {
                    return Err(LabError::DaemonStart(format!(
                        "rebootctl set-max: {}",
                        String::from_utf8_lossy(&out.stderr)
                    )));
                }
                node.start_daemon()?;
            }
            ids.push((node.machine_id.clone(), name.clone()));
            if let Some(k) = &kube {
                // The kubelet reports the boot id of the running boot.
                post_boot_id(k.cluster(), name, &node.boot_id());
            }
            let mut calls = node.logind.subscribe();
            let node = Arc::new(tokio::sync::Mutex::new(node));
            // The simulated reboot: on each accepted reboot call, go down for `reboot_time`,
            // then come back with a new boot id; the kubelet reports Ready a little later.
            let (n, ev, tx, nm, delay) = (
                node.clone(),
                events.clone(),
                notify.clone(),
                name.clone(),
                opts.reboot_time,
            );
            let cluster = kube.as_ref().map(|k| k.cluster().clone());
            let (ready_delay, ready) = (opts.ready_delay, comes_back_ready[i].clone());
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
                    if let Some(c) = &cluster {
                        let _ = c.set_node_ready(&nm, false);
                    }
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
                    if let Some(c) = cluster.clone() {
                        let (nm, ready, boot) = (nm.clone(), ready.clone(), node.boot_id());
                        tokio::spawn(async move {
                            tokio::time::sleep(ready_delay).await;
                            if ready.load(std::sync::atomic::Ordering::SeqCst) {
                                post_boot_id(&c, &nm, &boot);
                                let _ = c.set_node_ready(&nm, true);
                            }
                        });
                    }
                }
            }));
            nodes.push(node);
        }
        // The watcher outside rebootd: every revision of the document, from etcd's own history.
        if let Some(client) = client.as_mut() {
            let (ev, tx) = (events.clone(), notify.clone());
            let mut stream = client
                .watch(semaphore_key(&opts.group), None)
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
        }
        Ok(Fleet {
            etcd,
            kube,
            kubeconfig,
            comes_back_ready,
            _dir: dir,
            nodes,
            names,
            started,
            events,
            notify,
            tasks,
        })
    }

    /// The fleet's directory (where [`FleetOptions::etcd_users`] ran and left the passwords).
    pub fn dir(&self) -> &Path {
        self._dir.path()
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
        let all: Vec<usize> = (0..self.nodes.len()).collect();
        self.wait_rolled_nodes(&all, timeout).await
    }

    /// [`Fleet::wait_rolled`] for some nodes only (indexes into `nodes`).
    pub async fn wait_rolled_nodes(
        &self,
        which: &[usize],
        timeout: Duration,
    ) -> Result<(), LabError> {
        let deadline = tokio::time::Instant::now() + timeout;
        for n in which.iter().filter_map(|&i| self.nodes.get(i)) {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            // The node's lock is held by its reboot task while it is down; take it only to
            // look at the state file, which outlives the process.
            let (store, name) = {
                let node = n.lock().await;
                (node.store(), node.name.clone())
            };
            wait_store(&store, &name, "complete its reboot", left, done).await?;
        }
        Ok(())
    }

    /// Wait until node `i`'s state file satisfies `pred`, without holding the node (its
    /// simulated reboot can go on meanwhile).
    pub async fn wait_state(
        &self,
        i: usize,
        what: &str,
        timeout: Duration,
        pred: impl Fn(&rebootd::state::State) -> bool,
    ) -> Result<rebootd::state::State, LabError> {
        let node = self
            .nodes
            .get(i)
            .ok_or_else(|| LabError::DaemonStart(format!("no node {i}")))?;
        let (store, name) = {
            let node = node.lock().await;
            (node.store(), node.name.clone())
        };
        wait_store(&store, &name, what, timeout, pred).await
    }
}

/// What the kubelet posts after boot: the boot id in `status.nodeInfo.bootID`.
fn post_boot_id(cluster: &crate::kube_api::Cluster, node: &str, boot_id: &str) {
    let _ = cluster.update(crate::kube_api::Kind::Node, "", node, |n| {
        n["status"]["nodeInfo"]["bootID"] = boot_id.into();
    });
}

/// A completed reboot: idle again, after a reboot, with the slot given back.
fn done(s: &rebootd::state::State) -> bool {
    s.phase == rebootd::state::Phase::Idle && s.last_reboot.is_some() && !s.slot_held
}

/// Wait (inotify on the state directory) until a node's state satisfies `pred`.
async fn wait_store(
    store: &rebootd::state::StateStore,
    name: &str,
    what: &str,
    timeout: Duration,
    pred: impl Fn(&rebootd::state::State) -> bool,
) -> Result<rebootd::state::State, LabError> {
    use inotify::{Inotify, WatchMask};
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
        if let Some(s) = store.load().ok().flatten().filter(|s| pred(s)) {
            return Ok(s);
        }
        match tokio::time::timeout_at(deadline, events.next()).await {
            Ok(Some(_)) => continue,
            _ => {
                return Err(LabError::Timeout {
                    after: timeout,
                    what: format!(
                        "{name} to {what}; last state {:?}",
                        store.load().ok().flatten()
                    ),
                })
            }
        }
    }
}
