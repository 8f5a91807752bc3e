//! The object store: every object in memory under one lock, a cluster-wide resourceVersion
//! bumped on each change, a bounded change history for watches that start at a
//! resourceVersion, and a broadcast of live changes. Writes go through [`Store::write`], which
//! runs the simulated controllers to a fixed point before releasing the lock.

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::sync::{broadcast, mpsc, watch};

use crate::error::ApiError;
use crate::kind::Kind;
use crate::meta;

/// What happened to an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
}

/// One change, as kept in the history and broadcast to watchers (storage form).
#[derive(Debug)]
pub struct Change {
    pub rv: u64,
    pub kind: Kind,
    pub event: EventType,
    pub object: Value,
    pub old: Option<Value>,
}

/// The changes after a resourceVersion, and the receiver of the changes to come.
pub type ChangeFeed = (Vec<Arc<Change>>, broadcast::Receiver<Arc<Change>>);

/// Simulation settings shared by the controllers.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// Real time = simulated time x `time_scale`.
    pub time_scale: f64,
    /// Simulated time from a pod landing on a Ready node to the pod being Ready.
    pub pod_ready_delay: Duration,
}

impl SimConfig {
    /// A simulated duration in real time.
    pub fn scaled(&self, d: Duration) -> Duration {
        let f = if self.time_scale.is_finite() && self.time_scale > 0.0 {
            self.time_scale
        } else {
            0.0
        };
        Duration::try_from_secs_f64(d.as_secs_f64() * f).unwrap_or(Duration::MAX)
    }
}

/// Work the controllers schedule for later.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum TimerAction {
    /// The simulated kubelet reports the pod Running and Ready.
    PodReady {
        ns: String,
        name: String,
        uid: String,
    },
    /// A terminating object's grace period is over: remove it.
    Finalize {
        kind: Kind,
        ns: String,
        name: String,
        uid: String,
    },
}

#[derive(Debug, Clone)]
pub struct Timer {
    pub at: Instant,
    pub action: TimerAction,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Key {
    kind: Kind,
    ns: String,
    name: String,
}

/// DeleteOptions, from the body or the query.
#[derive(Debug, Clone, Default)]
pub struct DeleteOptions {
    pub grace_period_seconds: Option<i64>,
    pub uid: Option<String>,
    pub resource_version: Option<String>,
    /// propagationPolicy=Orphan: leave dependents alone.
    pub orphan: bool,
    pub dry_run: bool,
}

const HISTORY: usize = 20_000;

/// Everything under the lock.
pub struct State {
    objects: BTreeMap<Key, Value>,
    rv: u64,
    history: VecDeque<Arc<Change>>,
    /// The highest resourceVersion dropped from the history.
    compacted: u64,
    tx: broadcast::Sender<Arc<Change>>,
    pub(crate) timers: Vec<Timer>,
    /// Pods (by uid) whose PodReady timer is pending.
    pub(crate) ready_scheduled: HashSet<String>,
    pub(crate) sim: SimConfig,
    pub(crate) ip_counter: u32,
}

fn key(kind: Kind, ns: &str, name: &str) -> Key {
    Key {
        kind: kind.storage(),
        ns: if kind.namespaced() {
            ns.to_string()
        } else {
            String::new()
        },
        name: name.to_string(),
    }
}

/// A DNS-1123 subdomain, as names of most kinds must be.
fn valid_name(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b.len() <= 253
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-' || *c == b'.')
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
}

/// Equal apart from the resourceVersion.
fn same_content(a: &Value, b: &Value) -> bool {
    let strip = |v: &Value| {
        let mut v = v.clone();
        if let Some(m) = v.get_mut("metadata").and_then(Value::as_object_mut) {
            m.remove("resourceVersion");
        }
        v
    };
    strip(a) == strip(b)
}

impl State {
    fn new(sim: SimConfig, tx: broadcast::Sender<Arc<Change>>) -> Self {
        State {
            objects: BTreeMap::new(),
            rv: 1,
            history: VecDeque::new(),
            compacted: 1,
            tx,
            timers: Vec::new(),
            ready_scheduled: HashSet::new(),
            sim,
            ip_counter: 0,
        }
    }

    /// The current cluster-wide resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.rv
    }

    /// One object (storage form), by kind, namespace ("" for cluster-scoped) and name.
    pub fn get(&self, kind: Kind, ns: &str, name: &str) -> Option<&Value> {
        self.objects.get(&key(kind, ns, name))
    }

    /// The objects of a kind (storage form), optionally in one namespace, ordered by namespace
    /// then name.
    pub fn iter(&self, kind: Kind, ns: Option<&str>) -> impl Iterator<Item = &Value> + '_ {
        let storage = kind.storage();
        let ns = ns.filter(|_| kind.namespaced()).map(str::to_string);
        let start = Key {
            kind: storage,
            ns: ns.clone().unwrap_or_default(),
            name: String::new(),
        };
        self.objects
            .range(start..)
            .take_while(move |(k, _)| k.kind == storage && ns.as_ref().is_none_or(|n| *n == k.ns))
            .map(|(_, v)| v)
    }

    /// Owned copies of [`State::iter`].
    pub fn list(&self, kind: Kind, ns: Option<&str>) -> Vec<Value> {
        self.iter(kind, ns).cloned().collect()
    }

    fn emit(&mut self, kind: Kind, event: EventType, object: Value, old: Option<Value>) {
        let c = Arc::new(Change {
            rv: self.rv,
            kind: kind.storage(),
            event,
            object,
            old,
        });
        self.history.push_back(c.clone());
        while self.history.len() > HISTORY {
            if let Some(old) = self.history.pop_front() {
                self.compacted = old.rv;
            }
        }
        let _ = self.tx.send(c);
    }

    fn next_rv(&mut self) -> u64 {
        self.rv += 1;
        self.rv
    }

    /// Store a new object: name (or generateName), uid, creationTimestamp, resourceVersion.
    pub fn create(&mut self, kind: Kind, mut obj: Value, dry_run: bool) -> Result<Value, ApiError> {
        let kind = kind.storage();
        let d = kind.def();
        if !obj.is_object() {
            return Err(ApiError::bad_request("the body must be a JSON object"));
        }
        obj["kind"] = json!(d.kind_name);
        obj["apiVersion"] = json!(kind.api_version());
        let ns = meta::namespace(&obj).to_string();
        let m = meta::metadata_mut(&mut obj);
        if d.namespaced {
            if ns.is_empty() {
                m.insert("namespace".into(), json!("default"));
            }
        } else {
            m.remove("namespace");
        }
        let mut name = m
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        if name.is_empty() {
            let prefix = m
                .get("generateName")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string();
            if prefix.is_empty() {
                return Err(ApiError::invalid(
                    kind,
                    "",
                    "metadata.name",
                    "Required value: name or generateName is required",
                ));
            }
            name = format!("{prefix}{}", meta::name_suffix());
            m.insert("name".into(), json!(name));
        }
        if !valid_name(&name) {
            return Err(ApiError::invalid(
                kind,
                &name,
                "metadata.name",
                "Invalid value: a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.'",
            ));
        }
        let ns = meta::namespace(&obj).to_string();
        let k = key(kind, &ns, &name);
        if self.objects.contains_key(&k) {
            return Err(ApiError::already_exists(kind, &name));
        }
        let rv = if dry_run { self.rv } else { self.next_rv() };
        let m = meta::metadata_mut(&mut obj);
        m.insert("uid".into(), json!(meta::new_uid()));
        m.insert("creationTimestamp".into(), json!(meta::now_rfc3339()));
        m.insert("resourceVersion".into(), json!(rv.to_string()));
        m.remove("deletionTimestamp");
        m.remove("deletionGracePeriodSeconds");
        if d.has_generation {
            m.insert("generation".into(), json!(1));
        } else {
            m.remove("generation");
        }
        if dry_run {
            return Ok(obj);
        }
        self.objects.insert(k, obj.clone());
        self.emit(kind, EventType::Added, obj.clone(), None);
        Ok(obj)
    }

    /// Replace an object from an API write (PUT, PATCH): the write carries the resourceVersion it
    /// read (empty = unconditional); a stale one is a Conflict. `status_only` is a write to the
    /// `/status` subresource. Identity fields are kept from the stored object.
    pub fn update(
        &mut self,
        kind: Kind,
        obj: Value,
        status_only: bool,
        dry_run: bool,
    ) -> Result<Value, ApiError> {
        let kind = kind.storage();
        let d = kind.def();
        let ns = meta::namespace(&obj).to_string();
        let name = meta::name(&obj).to_string();
        let old = self
            .get(kind, &ns, &name)
            .cloned()
            .ok_or_else(|| ApiError::not_found(kind, &name))?;
        let rv_in = meta::resource_version(&obj);
        if !rv_in.is_empty() && rv_in != meta::resource_version(&old) {
            return Err(ApiError::conflict(kind, &name));
        }
        let mut new = if status_only {
            let mut n = old.clone();
            match obj.get("status") {
                Some(s) => n["status"] = s.clone(),
                None => {
                    if let Some(m) = n.as_object_mut() {
                        m.remove("status");
                    }
                }
            }
            n
        } else {
            let mut n = obj;
            if d.status_subresource {
                if let Some(m) = n.as_object_mut() {
                    match old.get("status") {
                        Some(s) => {
                            m.insert("status".into(), s.clone());
                        }
                        None => {
                            m.remove("status");
                        }
                    }
                }
            }
            n
        };
        if !new.is_object() {
            return Err(ApiError::bad_request("the body must be a JSON object"));
        }
        keep_identity(&mut new, &old, kind);
        self.commit(kind, new, old, dry_run)
    }

    /// Replace a stored object with `new` (identity fields kept), bumping generation on spec
    /// changes; a write that changes nothing keeps the resourceVersion, as the real server does.
    fn commit(
        &mut self,
        kind: Kind,
        mut new: Value,
        old: Value,
        dry_run: bool,
    ) -> Result<Value, ApiError> {
        if kind.def().has_generation && new.get("spec") != old.get("spec") {
            let g = old
                .pointer("/metadata/generation")
                .and_then(Value::as_i64)
                .unwrap_or(1);
            meta::metadata_mut(&mut new).insert("generation".into(), json!(g + 1));
        }
        if same_content(&new, &old) {
            return Ok(old);
        }
        if dry_run {
            return Ok(new);
        }
        let rv = self.next_rv();
        meta::metadata_mut(&mut new).insert("resourceVersion".into(), json!(rv.to_string()));
        let k = key(kind, meta::namespace(&old), meta::name(&old));
        self.objects.insert(k, new.clone());
        self.emit(kind, EventType::Modified, new.clone(), Some(old));
        Ok(new)
    }

    /// Change an object in place (controllers and the in-process API): no resourceVersion check,
    /// every field writable except identity.
    pub fn modify(
        &mut self,
        kind: Kind,
        ns: &str,
        name: &str,
        f: impl FnOnce(&mut Value),
    ) -> Result<Value, ApiError> {
        let kind = kind.storage();
        let old = self
            .get(kind, ns, name)
            .cloned()
            .ok_or_else(|| ApiError::not_found(kind, name))?;
        let mut new = old.clone();
        f(&mut new);
        keep_identity(&mut new, &old, kind);
        self.commit(kind, new, old, false)
    }

    /// Take an object out of the store now (a DELETED event with a new resourceVersion).
    pub fn remove(&mut self, kind: Kind, ns: &str, name: &str) -> Option<Value> {
        let kind = kind.storage();
        let mut obj = self.objects.remove(&key(kind, ns, name))?;
        let rv = self.next_rv();
        meta::metadata_mut(&mut obj).insert("resourceVersion".into(), json!(rv.to_string()));
        self.ready_scheduled.remove(meta::uid(&obj));
        self.emit(kind, EventType::Deleted, obj.clone(), None);
        Some(obj)
    }

    /// DELETE: preconditions, then graceful deletion for pods on a node (deletionTimestamp now,
    /// removal when the grace period is over), immediate removal otherwise. Deleting a
    /// ReplicaSet or DaemonSet deletes the pods it controls unless the policy is Orphan.
    pub fn delete(
        &mut self,
        kind: Kind,
        ns: &str,
        name: &str,
        opts: &DeleteOptions,
    ) -> Result<Value, ApiError> {
        let kind = kind.storage();
        let cur = self
            .get(kind, ns, name)
            .cloned()
            .ok_or_else(|| ApiError::not_found(kind, name))?;
        if let Some(uid) = &opts.uid {
            if uid != meta::uid(&cur) {
                return Err(ApiError::precondition(
                    kind,
                    name,
                    &format!(
                        "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                        meta::uid(&cur)
                    ),
                ));
            }
        }
        if let Some(rv) = &opts.resource_version {
            if rv != meta::resource_version(&cur) {
                return Err(ApiError::precondition(
                    kind,
                    name,
                    &format!(
                        "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}",
                        meta::resource_version(&cur)
                    ),
                ));
            }
        }
        if kind == Kind::Pod {
            return self.delete_pod(cur, opts);
        }
        if opts.dry_run {
            return Ok(cur);
        }
        let out = self.remove(kind, ns, name).unwrap_or(cur);
        if matches!(kind, Kind::ReplicaSet | Kind::DaemonSet) && !opts.orphan {
            let uid = meta::uid(&out).to_string();
            let owned: Vec<String> = self
                .iter(Kind::Pod, Some(ns))
                .filter(|p| meta::controlled_by(p, &uid))
                .map(|p| meta::name(p).to_string())
                .collect();
            for p in owned {
                let _ = self.delete(Kind::Pod, ns, &p, &DeleteOptions::default());
            }
        }
        Ok(out)
    }

    fn delete_pod(&mut self, cur: Value, opts: &DeleteOptions) -> Result<Value, ApiError> {
        let ns = meta::namespace(&cur).to_string();
        let name = meta::name(&cur).to_string();
        let spec_grace = cur
            .pointer("/spec/terminationGracePeriodSeconds")
            .and_then(Value::as_i64)
            .unwrap_or(30);
        let mut grace = opts.grace_period_seconds.unwrap_or(spec_grace).max(0);
        if meta::node_name(&cur).is_empty() || meta::is_terminal(&cur) {
            grace = 0;
        }
        if meta::is_deleting(&cur) {
            let existing = cur
                .pointer("/metadata/deletionGracePeriodSeconds")
                .and_then(Value::as_i64)
                .unwrap_or(0);
            if grace >= existing {
                return Ok(cur);
            }
        }
        if opts.dry_run {
            return Ok(cur);
        }
        if grace == 0 {
            return Ok(self.remove(Kind::Pod, &ns, &name).unwrap_or(cur));
        }
        let real = self.sim.scaled(Duration::from_secs(grace as u64));
        let at = std::time::SystemTime::now() + real;
        let old = cur.clone();
        let mut new = cur;
        let m = meta::metadata_mut(&mut new);
        m.insert("deletionTimestamp".into(), json!(meta::rfc3339(at)));
        m.insert("deletionGracePeriodSeconds".into(), json!(grace));
        let uid = meta::uid(&new).to_string();
        let out = self.commit(Kind::Pod, new, old, false)?;
        self.timers.push(Timer {
            at: Instant::now() + real,
            action: TimerAction::Finalize {
                kind: Kind::Pod,
                ns,
                name,
                uid,
            },
        });
        Ok(out)
    }

    /// The changes after `from` and a receiver for the ones to come, taken together so none is
    /// missed; 410 Gone when `from` is older than the kept history.
    pub fn watch_from(&self, from: u64) -> Result<ChangeFeed, ApiError> {
        if from < self.compacted {
            return Err(ApiError::gone(from));
        }
        let past = self
            .history
            .iter()
            .filter(|c| c.rv > from)
            .cloned()
            .collect();
        Ok((past, self.tx.subscribe()))
    }
}

/// Keep uid, creationTimestamp, deletion fields, generation, name and namespace from `old`, and
/// kind/apiVersion as stored.
fn keep_identity(new: &mut Value, old: &Value, kind: Kind) {
    new["kind"] = json!(kind.kind_name());
    new["apiVersion"] = json!(kind.api_version());
    let om = old.get("metadata").and_then(Value::as_object).cloned();
    let m = meta::metadata_mut(new);
    for f in [
        "uid",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "generation",
        "name",
        "namespace",
    ] {
        match om.as_ref().and_then(|o| o.get(f)) {
            Some(v) => {
                m.insert(f.into(), v.clone());
            }
            None => {
                m.remove(f);
            }
        }
    }
}

struct Inner {
    state: Mutex<State>,
    changed: watch::Sender<u64>,
    timer_tx: mpsc::UnboundedSender<Timer>,
}

/// The shared, lockable store.
#[derive(Clone)]
pub struct Store {
    inner: Arc<Inner>,
}

/// A weak reference for background tasks, so they do not keep the store alive.
#[derive(Clone)]
pub struct WeakStore(Weak<Inner>);

impl WeakStore {
    pub fn upgrade(&self) -> Option<Store> {
        self.0.upgrade().map(|inner| Store { inner })
    }
}

impl Store {
    /// A new empty store and the receiver of the timers its controllers schedule.
    pub fn new(sim: SimConfig) -> (Store, mpsc::UnboundedReceiver<Timer>) {
        let (tx, _) = broadcast::channel(4096);
        let (changed, _) = watch::channel(1);
        let (timer_tx, timer_rx) = mpsc::unbounded_channel();
        let store = Store {
            inner: Arc::new(Inner {
                state: Mutex::new(State::new(sim, tx)),
                changed,
                timer_tx,
            }),
        };
        (store, timer_rx)
    }

    pub fn downgrade(&self) -> WeakStore {
        WeakStore(Arc::downgrade(&self.inner))
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.inner
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Read under the lock.
    pub fn read<R>(&self, f: impl FnOnce(&State) -> R) -> R {
        f(&self.lock())
    }

    /// Write under the lock; the controllers then run to a fixed point, their timers are
    /// handed to the timer task and waiters are woken.
    pub fn write<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        let mut st = self.lock();
        let before = st.rv;
        let r = f(&mut st);
        if st.rv != before {
            st.reconcile();
        }
        let timers = std::mem::take(&mut st.timers);
        let rv = st.rv;
        drop(st);
        for t in timers {
            let _ = self.inner.timer_tx.send(t);
        }
        self.inner.changed.send_replace(rv);
        r
    }

    /// A receiver that changes whenever the store does.
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.inner.changed.subscribe()
    }

    /// Change the simulation settings.
    pub fn update_sim(&self, f: impl FnOnce(&mut SimConfig)) {
        f(&mut self.lock().sim);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store() -> Store {
        Store::new(SimConfig {
            time_scale: 1.0,
            pod_ready_delay: Duration::ZERO,
        })
        .0
    }

    #[test]
    fn create_update_conflict() -> Result<(), ApiError> {
        let s = store();
        let lease = s.write(|st| {
            st.create(
                Kind::Lease,
                json!({"metadata": {"name": "l", "namespace": "ns"}, "spec": {}}),
                false,
            )
        })?;
        assert_eq!(lease["kind"], "Lease");
        assert!(!meta::uid(&lease).is_empty());
        let mut a = lease.clone();
        a["spec"]["holderIdentity"] = json!("a");
        let mut b = lease.clone();
        b["spec"]["holderIdentity"] = json!("b");
        let a2 = s.write(|st| st.update(Kind::Lease, a, false, false))?;
        assert_ne!(meta::resource_version(&a2), meta::resource_version(&lease));
        let err = s.write(|st| st.update(Kind::Lease, b, false, false));
        assert_eq!(err.map_err(|e| e.reason), Err("Conflict".to_string()));
        // A write that changes nothing keeps the resourceVersion.
        let a3 = s.write(|st| st.update(Kind::Lease, a2.clone(), false, false))?;
        assert_eq!(meta::resource_version(&a3), meta::resource_version(&a2));
        let dup = s.write(|st| {
            st.create(
                Kind::Lease,
                json!({"metadata": {"name": "l", "namespace": "ns"}}),
                false,
            )
        });
        assert_eq!(dup.map_err(|e| e.code), Err(409));
        Ok(())
    }

    #[test]
    fn list_by_namespace_and_watch_history() -> Result<(), ApiError> {
        let s = store();
        for (ns, n) in [("a", "x"), ("b", "y"), ("a", "z")] {
            s.write(|st| {
                st.create(
                    Kind::Lease,
                    json!({"metadata": {"name": n, "namespace": ns}}),
                    false,
                )
            })?;
        }
        s.read(|st| {
            assert_eq!(st.list(Kind::Lease, Some("a")).len(), 2);
            assert_eq!(st.list(Kind::Lease, None).len(), 3);
            assert_eq!(st.list(Kind::Pod, None).len(), 0);
            let (past, _) = st.watch_from(2)?;
            assert_eq!(past.len(), 2);
            Ok(())
        })
    }
}
