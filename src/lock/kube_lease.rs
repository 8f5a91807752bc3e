//! Kubernetes lock backend (`lock.backend = "kubernetes"`): a counting semaphore of reboot slots
//! over coordination.k8s.io/v1 Lease objects in `lock.kubernetes.namespace`.
//!
//! # Object layout
//!
//! For a semaphore named `<name>` (`lock.kubernetes.name`, default `rebootd`), every object is a
//! Lease labelled `rebootd.io/semaphore=<name>`:
//!
//! - **Control Lease `<name>`** (label `rebootd.io/role=control`): holds no slot (no
//!   `holderIdentity`); its annotation `rebootd.io/max` is the number of slots. The first
//!   `acquire` (or `set-max`) creates it with `max` 1 (or, if slot Leases exist without it, with as
//!   many slots as there are slot Leases). A control Lease whose `rebootd.io/max` is missing or not
//!   a number is [`LockError::Corrupt`] and is never written over.
//! - **Slot Leases `<name>-<i>`** (labels `rebootd.io/role=slot`, `rebootd.io/slot=<i>`; the
//!   name is what counts), `i` in `0..max` (a slot at or above `max` may survive a forced
//!   shrink while held, until released). A slot is *free* when its
//!   `spec.holderIdentity` is unset or empty. A held slot has:
//!   - `spec.holderIdentity` = the node name, `spec.acquireTime` = when it was taken,
//!     `spec.renewTime` = the last write by the holder (take, phase report),
//!     `spec.leaseTransitions` = how many times the slot was taken (every take, reclaims
//!     included, adds 1); `spec.leaseDurationSeconds` is left unset: there is **no TTL**, a slot
//!     is held across the reboot until it is released or reclaimed;
//!   - annotations `rebootd.io/machine-id`, `rebootd.io/boot-id`, `rebootd.io/phase` (after the
//!     first phase report), `rebootd.io/since` (RFC 3339: when the slot was taken or the phase or
//!     boot id last changed) and `rebootd.io/node-uid` (the uid of the holder's Node object when
//!     it took the slot; absent when there was no such Node or it could not be read).
//!
//!   Slot Leases are created on demand: `acquire` creates the lowest missing slot below `max`
//!   already held (a create is atomic, so two creators cannot both win), `set-max` creates the
//!   missing free ones so `kubectl get leases` shows every slot.
//! - **Waiter Leases `<name>-waiter-<node>`** (label `rebootd.io/role=waiter`): one per node
//!   waiting for a slot, its place in a FIFO queue (see *Waiting*). `spec.acquireTime` = when it
//!   started waiting, `spec.renewTime` = its last renewal, `spec.leaseDurationSeconds` = its TTL
//!   ([`Timeouts::waiter_ttl`]); annotation `rebootd.io/waiter-node` = the node name. It has
//!   **no** `holderIdentity`, so nothing that counts Leases with a holder counts a waiter. The
//!   node part is the node name as is when that is a valid name part, not all digits and short
//!   enough; else escaped to `[a-z0-9-]`, shortened, with `-h<hash>` appended, so a waiter Lease
//!   never reads as a slot `<name>-<digits>`. `status()`, `set-max`, `release` and reclaim
//!   look at the control and slot Leases only.
//!
//! `set-max` accepts at most [`MAX_SLOTS`] slots. `status()` reports the semaphore name as its
//! group, reads only, and creates nothing (without a control Lease it shows the `max` the first
//! `acquire` would create).
//!
//! A semaphore name must be a lowercase DNS label of at most 63 characters (it is a label value
//! and a Lease name prefix). Do not name one semaphore `<other>-<digits>`: its control Lease
//! would be a slot of `<other>`; such a collision is detected and refused, not resolved.
//!
//! # Concurrency
//!
//! Every write is a replace carrying the `resourceVersion` read (409 Conflict = someone else
//! wrote first: read again and retry), a create (409 AlreadyExists = read again), or a delete
//! with a `resourceVersion` precondition. Two processes racing for the last free slot both
//! replace the same Lease with the same `resourceVersion`: exactly one wins. A slot is taken
//! only while fewer than `max` slots (counting held slots above `max`) are held and only below
//! `max`; held slots at or above `max` only ever go away, so a forced shrink converges. A
//! `set-max` racing with a take can leave one holder above the new `max`, exactly as a forced
//! shrink does.
//!
//! # Waiting
//!
//! Waiters queue first come, first served. A waiter that finds no slot for itself creates its
//! waiter Lease (after a restart it finds and adopts it, keeping its place) and renews it every
//! third of its TTL while it waits. The queue is ordered by (`acquireTime`, name); a waiter is
//! *live* while `renewTime` + `leaseDurationSeconds` (+ 2 s for clock skew)
//! is in the future. A waiter's *rank* is the number of live waiters ahead of it; it goes for a
//! slot only while the free slots outnumber its rank (and then for the rank-th free slot, so
//! that the eligible waiters do not race for one Lease). A waiter whose `acquire` was dropped
//! stops renewing and, after its TTL, no longer counts; a waiter Lease dead for another TTL is
//! deleted (resourceVersion precondition) by the next waiter that takes a slot. The taker
//! deletes its own waiter Lease right after taking the slot. Waiters of older rebootd (no
//! waiter Lease) race for free slots as before, which stays safe: every take is a CAS.
//!
//! A waiter never polls. It watches the Leases labelled `rebootd.io/semaphore=<name>` from the
//! `resourceVersion` of its last list (so no change is lost between the list and the watch),
//! keeps its view of the Leases up to date from the watch events, resumes the watch from the
//! last `resourceVersion` seen (bookmarks included) when the server ends it, and lists again
//! only on 410 Gone, when it may take a slot, when it becomes first in the queue, or (first
//! only) when the holders change: a release costs the waiters behind the first no request. The
//! first live waiter also watches the Node object of each holder that has a
//! `rebootd.io/node-uid` (field selector `metadata.name=<node>`), and sleeps until the next
//! holder would pass `lock.max_hold`.
//!
//! # Reclaim
//!
//! The first live waiter in the queue (any waiter of an older rebootd too) that finds no free
//! slot takes over (logged at warn, `leaseTransitions` + 1):
//! - the slot of a holder whose Node object no longer exists: GET node is 404, or the Node now
//!   has another uid than `rebootd.io/node-uid` (deleted and re-registered). A holder without
//!   `rebootd.io/node-uid` (it had no Node object, or could not read it) is never reclaimed on
//!   this ground, so a fleet of machines that are not Kubernetes nodes is never mass-reclaimed;
//! - with `lock.max_hold` set, the slot of a holder whose `rebootd.io/since` (else
//!   `acquireTime`, else when this waiter first saw it) is older than `max_hold`.
//!
//! When holders exceed `max` (forced shrink), a reclaimed slot is freed (or deleted when at or
//! above `max`) instead of taken over.
//!
//! # Identity
//!
//! `release(id)` and `holds(id)` match a holder by `holderIdentity` (node name) or by the
//! `rebootd.io/machine-id` annotation. `acquire(me)` counts as already holding a slot whose
//! machine id is `me.id` or whose `holderIdentity` is `me.node`: node names are unique in a
//! cluster, and a reinstalled node (new machine id, same Node) must not wait for itself; such a
//! slot is adopted (warn) and its annotations rewritten.
//!
//! # Permissions
//!
//! Leases in the namespace: get, list, watch, create, update, delete. Nodes: get (the node uid
//! and the reclaim check) and watch (waking on a holder's Node deletion); without them a waiter
//! still works, reclaiming only on `max_hold`.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::time::Duration;

use async_trait::async_trait;
use futures_util::stream::{self, BoxStream, SelectAll, StreamExt};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{
    Api, DeleteParams, ListParams, PostParams, Preconditions, WatchEvent, WatchParams,
};
use kube::core::Status;
use tokio::time::Instant;

use super::{Admin, Fence, Holder, Identity, LockError, Semaphore, SemaphoreStatus};
use crate::config;

mod queue;
use queue::Waiter;
pub use queue::ANNOTATION_WAITER_NODE;

const BACKEND: &str = "kubernetes";

/// Label on every Lease of a semaphore; its value is the semaphore name.
pub const LABEL_SEMAPHORE: &str = "rebootd.io/semaphore";
/// Label saying what a Lease is: [`ROLE_CONTROL`] or [`ROLE_SLOT`].
pub const LABEL_ROLE: &str = "rebootd.io/role";
pub const ROLE_CONTROL: &str = "control";
/// Label of a slot Lease: its index.
pub const LABEL_SLOT: &str = "rebootd.io/slot";
pub const ROLE_SLOT: &str = "slot";
/// Role of a waiter Lease `<name>-waiter-<node>` (its place in the queue of waiters).
pub const ROLE_WAITER: &str = "waiter";
/// Annotation of the control Lease: the number of slots.
pub const ANNOTATION_MAX: &str = "rebootd.io/max";
/// Annotations of a held slot Lease.
pub const ANNOTATION_MACHINE_ID: &str = "rebootd.io/machine-id";
pub const ANNOTATION_BOOT_ID: &str = "rebootd.io/boot-id";
pub const ANNOTATION_PHASE: &str = "rebootd.io/phase";
pub const ANNOTATION_SINCE: &str = "rebootd.io/since";
pub const ANNOTATION_NODE_UID: &str = "rebootd.io/node-uid";
/// Annotation of a held slot: the holder token of the host that took it.
pub const ANNOTATION_HOLDER_TOKEN: &str = "rebootd.io/holder-token";
/// Annotations rebootd writes on a held slot and removes on release.
const HOLDER_ANNOTATIONS: [&str; 6] = [
    ANNOTATION_MACHINE_ID,
    ANNOTATION_BOOT_ID,
    ANNOTATION_PHASE,
    ANNOTATION_SINCE,
    ANNOTATION_NODE_UID,
    ANNOTATION_HOLDER_TOKEN,
];
/// Slots of a semaphore whose control Lease does not exist yet.
pub const DEFAULT_MAX: u64 = 1;
/// Largest `max` `set-max` accepts (one Lease per slot).
pub const MAX_SLOTS: u64 = 1000;
/// Optimistic-concurrency attempts before an update (other than `acquire`) gives up.
const MAX_CONFLICTS: usize = 64;
/// Added to a waiter Lease's expiry before it counts as dead: the clocks of the waiters (who
/// write `renewTime`) and of the readers may differ by this much.
const WAITER_CLOCK_SLACK: Duration = Duration::from_secs(2);

/// Time limits of the Kubernetes backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// One request (get, list, replace, opening a watch).
    pub request: Duration,
    /// How long the server keeps one watch open (`timeoutSeconds`); the watch is then resumed
    /// from the last resourceVersion. A watch silent for this plus `request` is reopened too.
    pub watch: Duration,
    /// First pause after a transient error inside `acquire`; doubled each time, up to
    /// `backoff_max`.
    pub backoff_min: Duration,
    pub backoff_max: Duration,
    /// `leaseDurationSeconds` of a waiter Lease (whole seconds, at least 1); the waiter renews
    /// it every third of that. A waiter not renewed for this (plus a little clock slack) is
    /// dead and no longer holds its place in the queue.
    pub waiter_ttl: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            request: Duration::from_secs(10),
            watch: Duration::from_secs(290),
            backoff_min: Duration::from_millis(100),
            backoff_max: Duration::from_secs(10),
            waiter_ttl: Duration::from_secs(30),
        }
    }
}

/// The Lease semaphore.
pub struct KubeLeaseSemaphore {
    leases: Api<Lease>,
    nodes: Api<Node>,
    namespace: String,
    name: String,
    /// `rebootd.io/semaphore=<name>`
    selector: String,
    /// `<name>-waiter-`: the names of the waiter Leases.
    waiter_prefix: String,
    /// What error messages say we talk to.
    target: String,
    /// Why `name` cannot be used, if it cannot.
    invalid: Option<String>,
    max_hold: Option<Duration>,
    timeouts: Timeouts,
}

impl std::fmt::Debug for KubeLeaseSemaphore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeLeaseSemaphore")
            .field("target", &self.target)
            .field("namespace", &self.namespace)
            .field("name", &self.name)
            .field("max_hold", &self.max_hold)
            .finish_non_exhaustive()
    }
}

/// Who holds a slot, as recorded on its Lease.
#[derive(Debug, Clone, PartialEq, Eq)]
struct SlotHolder {
    node: String,
    machine_id: Option<String>,
    boot_id: Option<String>,
    phase: Option<String>,
    /// `rebootd.io/since`, else `acquireTime`.
    since: Option<jiff::Timestamp>,
    node_uid: Option<String>,
    token: Option<String>,
}

impl SlotHolder {
    fn from_lease(lease: &Lease) -> Option<SlotHolder> {
        let node = lease
            .spec
            .as_ref()
            .and_then(|s| s.holder_identity.as_deref())
            .filter(|h| !h.is_empty())?;
        let ann = |k: &str| annotation(lease, k).map(str::to_owned);
        let since = annotation(lease, ANNOTATION_SINCE)
            .and_then(|s| s.parse::<jiff::Timestamp>().ok())
            .or_else(|| {
                lease
                    .spec
                    .as_ref()
                    .and_then(|s| s.acquire_time.as_ref())
                    .map(|t| t.0)
            });
        Some(SlotHolder {
            node: node.to_owned(),
            machine_id: ann(ANNOTATION_MACHINE_ID),
            boot_id: ann(ANNOTATION_BOOT_ID),
            phase: ann(ANNOTATION_PHASE),
            since,
            node_uid: ann(ANNOTATION_NODE_UID),
            token: ann(ANNOTATION_HOLDER_TOKEN),
        })
    }

    /// Whether `id` (a machine id or a node name) names this holder.
    fn is(&self, id: &str) -> bool {
        self.machine_id.as_deref() == Some(id) || self.node == id
    }

    /// The id `status` shows: the machine id, else the node name.
    fn id(&self) -> &str {
        self.machine_id.as_deref().unwrap_or(&self.node)
    }
}

#[derive(Debug, Clone)]
struct Slot {
    index: u64,
    lease: Lease,
    holder: Option<SlotHolder>,
}

impl Slot {
    fn name(&self) -> &str {
        self.lease.metadata.name.as_deref().unwrap_or("")
    }
}

/// The semaphore's Leases, read in one list.
#[derive(Debug, Clone)]
struct Snapshot {
    /// The list's resourceVersion: where a watch resumes.
    resource_version: String,
    control: Option<Lease>,
    max: u64,
    slots: BTreeMap<u64, Slot>,
    /// The waiter Leases, by name.
    waiters: BTreeMap<String, Waiter>,
}

impl Snapshot {
    fn held(&self) -> impl Iterator<Item = (&Slot, &SlotHolder)> {
        self.slots
            .values()
            .filter_map(|s| s.holder.as_ref().map(|h| (s, h)))
    }

    fn holders(&self) -> usize {
        self.held().count()
    }

    /// The slot `me` holds: by machine id first, else by node name.
    fn mine(&self, me: &Identity) -> Option<(&Slot, &SlotHolder)> {
        self.held()
            .find(|(_, h)| h.machine_id.as_deref() == Some(me.id.as_str()))
            .or_else(|| self.held().find(|(_, h)| h.node == me.node))
    }

    fn free(&self) -> i64 {
        i64::try_from(self.max)
            .unwrap_or(i64::MAX)
            .saturating_sub(i64::try_from(self.holders()).unwrap_or(i64::MAX))
    }
}

/// What one round of `acquire` ended with.
enum Round {
    Held,
    /// Lost a race: read again at once.
    Again,
    /// No slot: wait for a change of the Leases after `resource_version`, for the deletion of
    /// one of `nodes` (name, uid recorded), or until `wake_at` (a holder passing max_hold).
    /// `view` is the list the round read (kept up to date from the watch); `head` = first
    /// live waiter in the queue (the one that checks holders for reclaim).
    Wait {
        view: Box<Snapshot>,
        head: bool,
        nodes: Vec<(String, String)>,
        wake_at: Option<Instant>,
    },
}

/// What `acquire` remembers between rounds.
#[derive(Default)]
struct AcquireState {
    /// The uid of our own Node (looked up once, when first about to take a slot).
    own_node_uid: Option<Option<String>>,
    /// Since when this waiter sees each holder (node name), for holders without `since`.
    first_seen: HashMap<String, Instant>,
    /// What was last logged about waiting.
    last_logged: Option<WaitState>,
    /// Nodes whose GET or watch was refused (logged once).
    node_access_warned: bool,
    /// Our waiter Lease as last read or written; `None`: not queued.
    waiter: Option<Lease>,
    /// Waiter Leases found long dead by the last round: deleted once we hold a slot.
    dead_waiters: Vec<Lease>,
}

impl AcquireState {
    /// When our waiter Lease started waiting (our place in the queue); `now` if not queued.
    fn queued_since(&self, now: jiff::Timestamp) -> jiff::Timestamp {
        self.waiter
            .as_ref()
            .and_then(|l| l.spec.as_ref()?.acquire_time.as_ref())
            .map_or(now, |t| t.0)
    }
}

/// What a waiter logs about: max, the holders (node, phase) and its rank in the queue.
type WaitState = (u64, Vec<(String, Option<String>)>, usize);

/// What the head of the queue checks for reclaim: (slot, node, node uid, since) of each holder.
type HeldSignature = Vec<(u64, String, Option<String>, Option<jiff::Timestamp>)>;

fn held_signature(snap: &Snapshot) -> HeldSignature {
    snap.held()
        .map(|(s, h)| (s.index, h.node.clone(), h.node_uid.clone(), h.since))
        .collect()
}

/// The `Instant` of wall-clock time `t` (now if past).
fn instant_at(t: jiff::Timestamp) -> Instant {
    let ahead = t.duration_since(jiff::Timestamp::now());
    Instant::now() + Duration::try_from(ahead).unwrap_or_default()
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// What a GET of a Node said.
enum NodeLookup {
    Found(String),
    Missing,
    /// Could not tell (e.g. 403): never a reason to reclaim.
    Unknown(String),
}

/// A failed call: the HTTP code when the server answered one, and the error to report.
struct CallError {
    code: Option<u16>,
    error: LockError,
}

impl From<CallError> for LockError {
    fn from(e: CallError) -> Self {
        e.error
    }
}

type LeaseEvents = BoxStream<'static, Result<WatchEvent<Lease>, kube::Error>>;
type NodeEvents = BoxStream<'static, (String, Option<Result<WatchEvent<Node>, kube::Error>>)>;

fn annotation<'a>(lease: &'a Lease, key: &str) -> Option<&'a str> {
    lease
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .map(String::as_str)
}

fn label<'a>(meta: &'a ObjectMeta, key: &str) -> Option<&'a str> {
    meta.labels
        .as_ref()
        .and_then(|l| l.get(key))
        .map(String::as_str)
}

/// Why `name` cannot name a semaphore, if it cannot.
fn name_problem(name: &str) -> Option<String> {
    let ok_chars = name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    let ends_ok = |b: Option<u8>| b.is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    if name.is_empty() || name.len() > 63 || !ok_chars {
        return Some(format!(
            "lock.kubernetes.name {name:?} must be 1 to 63 lowercase letters, digits or '-'"
        ));
    }
    if !ends_ok(name.bytes().next()) || !ends_ok(name.bytes().last()) {
        return Some(format!(
            "lock.kubernetes.name {name:?} must start and end with a letter or digit"
        ));
    }
    None
}

fn is_transient_code(code: u16) -> bool {
    matches!(code, 408 | 429 | 500 | 502 | 503 | 504)
}

/// Whether `acquire` retries `e` (the API server did not answer, or answered "not now").
fn retryable(e: &LockError) -> bool {
    matches!(e, LockError::Unreachable { .. })
}

impl KubeLeaseSemaphore {
    /// The semaphore `settings.name` in `settings.namespace`, through `client` (which should
    /// not retry 429/503 itself: `acquire` retries with its own backoff). Nothing is contacted
    /// until the first call. `max_hold` enables reclaiming holders without progress for that
    /// long.
    pub fn new(
        client: kube::Client,
        settings: &config::KubeLease,
        max_hold: Option<Duration>,
    ) -> KubeLeaseSemaphore {
        let name = settings.name.clone();
        let namespace = settings.namespace.clone();
        KubeLeaseSemaphore {
            leases: Api::namespaced(client.clone(), &namespace),
            nodes: Api::all(client),
            selector: format!("{LABEL_SEMAPHORE}={name}"),
            waiter_prefix: queue::prefix(&name),
            target: format!("the API server (Leases {namespace}/{name}*)"),
            invalid: name_problem(&name),
            namespace,
            name,
            max_hold,
            timeouts: Timeouts::default(),
        }
    }

    /// Other time limits.
    pub fn with_timeouts(mut self, timeouts: Timeouts) -> Self {
        self.timeouts = timeouts;
        self
    }

    /// Name the API server in error messages (e.g. its URL).
    pub fn with_target(mut self, target: impl Into<String>) -> Self {
        self.target = format!(
            "{} (Leases {}/{}*)",
            target.into(),
            self.namespace,
            self.name
        );
        self
    }

    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The semaphore name: the control Lease's name and the slot Leases' prefix.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The label selector of the semaphore's Leases.
    pub fn label_selector(&self) -> &str {
        &self.selector
    }

    /// The name of the Lease of slot `index`.
    pub fn slot_name(&self, index: u64) -> String {
        format!("{}-{index}", self.name)
    }

    /// The name of the waiter Lease of `node`: `<name>-waiter-<node>` (the node escaped if
    /// need be; never `<name>-<digits>`).
    pub fn waiter_name(&self, node: &str) -> String {
        queue::waiter_name(&self.name, node)
    }

    fn check(&self) -> Result<(), LockError> {
        match &self.invalid {
            Some(reason) => Err(LockError::Refused(reason.clone())),
            None => Ok(()),
        }
    }

    fn unreachable(&self, reason: String) -> LockError {
        LockError::Unreachable {
            backend: BACKEND,
            target: self.target.clone(),
            reason,
        }
    }

    fn status_error(&self, what: &str, s: &Status) -> LockError {
        let reason = format!("{what}: {} ({} {})", s.message, s.code, s.reason);
        if is_transient_code(s.code) {
            self.unreachable(reason)
        } else {
            LockError::Backend {
                backend: BACKEND,
                reason: format!("{reason} at {}", self.target),
            }
        }
    }

    fn classify(&self, what: &str, e: kube::Error) -> CallError {
        match e {
            kube::Error::Api(s) => CallError {
                code: Some(s.code),
                error: self.status_error(what, &s),
            },
            kube::Error::HyperError(_) | kube::Error::Service(_) | kube::Error::ReadEvents(_) => {
                CallError {
                    code: None,
                    error: self.unreachable(format!("{what}: {e}")),
                }
            }
            other => CallError {
                code: None,
                error: LockError::Backend {
                    backend: BACKEND,
                    reason: format!("{what}: {other} at {}", self.target),
                },
            },
        }
    }

    /// One request, bounded by `timeouts.request`.
    async fn call<T>(
        &self,
        what: &str,
        fut: impl Future<Output = Result<T, kube::Error>>,
    ) -> Result<T, CallError> {
        match tokio::time::timeout(self.timeouts.request, fut).await {
            Err(_) => Err(CallError {
                code: None,
                error: self.unreachable(format!(
                    "{what}: no answer within {:?}",
                    self.timeouts.request
                )),
            }),
            Ok(Err(e)) => Err(self.classify(what, e)),
            Ok(Ok(t)) => Ok(t),
        }
    }

    fn slot_index(&self, lease_name: &str) -> Option<u64> {
        let digits = lease_name.strip_prefix(&self.name)?.strip_prefix('-')?;
        let canonical = !digits.is_empty()
            && digits.bytes().all(|b| b.is_ascii_digit())
            && (digits == "0" || !digits.starts_with('0'));
        canonical.then(|| digits.parse().ok()).flatten()
    }

    fn corrupt(&self, value: &str, reason: String) -> LockError {
        LockError::Corrupt {
            key: format!(
                "Lease {}/{} annotation {ANNOTATION_MAX}",
                self.namespace, self.name
            ),
            value: value.to_owned(),
            reason,
        }
    }

    /// List the semaphore's Leases. A control Lease whose max does not parse is
    /// [`LockError::Corrupt`].
    #[tracing::instrument(level = "debug", skip(self), fields(namespace = %self.namespace, name = %self.name))]
    async fn read(&self) -> Result<Snapshot, LockError> {
        let lp = ListParams::default().labels(&self.selector);
        let list = self.call("listing Leases", self.leases.list(&lp)).await?;
        let mut snap = Snapshot {
            resource_version: list.metadata.resource_version.unwrap_or_default(),
            control: None,
            max: DEFAULT_MAX,
            slots: BTreeMap::new(),
            waiters: BTreeMap::new(),
        };
        for lease in list.items {
            self.put_lease(&mut snap, lease);
        }
        snap.max = self.max_of(&snap)?;
        Ok(snap)
    }

    /// Put `lease` (listed or seen on the watch) in `snap` as the control Lease, a slot or a
    /// waiter; anything else is ignored. `snap.max` is not recomputed.
    fn put_lease(&self, snap: &mut Snapshot, lease: Lease) {
        let lease_name = lease.metadata.name.clone().unwrap_or_default();
        if lease_name == self.name {
            snap.control = Some(lease);
        } else if let Some(index) = self.slot_index(&lease_name) {
            let holder = SlotHolder::from_lease(&lease);
            snap.slots.insert(
                index,
                Slot {
                    index,
                    lease,
                    holder,
                },
            );
        } else if lease_name.starts_with(&self.waiter_prefix) {
            snap.waiters.insert(lease_name, Waiter::from_lease(lease));
        } else {
            tracing::debug!(lease = %lease_name, selector = %self.selector, "ignoring a Lease that is neither the control Lease, a slot nor a waiter");
        }
    }

    /// Remove the Lease named `lease_name` (deleted) from `snap`.
    fn drop_lease(&self, snap: &mut Snapshot, lease_name: &str) {
        if lease_name == self.name {
            snap.control = None;
        } else if let Some(index) = self.slot_index(lease_name) {
            snap.slots.remove(&index);
        } else {
            snap.waiters.remove(lease_name);
        }
    }

    /// The number of slots `snap` says. A control Lease whose max does not parse is
    /// [`LockError::Corrupt`].
    fn max_of(&self, snap: &Snapshot) -> Result<u64, LockError> {
        match &snap.control {
            None => Ok((snap.slots.len() as u64).max(DEFAULT_MAX)),
            Some(c) => match annotation(c, ANNOTATION_MAX) {
                None => Err(self.corrupt(
                    "",
                    format!("the control Lease has no {ANNOTATION_MAX} annotation"),
                )),
                Some(v) => v
                    .trim()
                    .parse::<u64>()
                    .map_err(|e| self.corrupt(v, format!("not a number of slots: {e}"))),
            },
        }
    }

    fn labels(&self, role: &str, index: Option<u64>) -> BTreeMap<String, String> {
        let mut l = BTreeMap::from([
            (LABEL_SEMAPHORE.to_owned(), self.name.clone()),
            (LABEL_ROLE.to_owned(), role.to_owned()),
        ]);
        if let Some(i) = index {
            l.insert(LABEL_SLOT.to_owned(), i.to_string());
        }
        l
    }

    fn control_lease(&self, max: u64) -> Lease {
        Lease {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                namespace: Some(self.namespace.clone()),
                labels: Some(self.labels(ROLE_CONTROL, None)),
                annotations: Some(BTreeMap::from([(
                    ANNOTATION_MAX.to_owned(),
                    max.to_string(),
                )])),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec::default()),
        }
    }

    fn free_slot_lease(&self, index: u64) -> Lease {
        Lease {
            metadata: ObjectMeta {
                name: Some(self.slot_name(index)),
                namespace: Some(self.namespace.clone()),
                labels: Some(self.labels(ROLE_SLOT, Some(index))),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                lease_transitions: Some(0),
                ..LeaseSpec::default()
            }),
        }
    }

    /// `lease` taken by `me` at `now` (a new take: `leaseTransitions` + 1, phase cleared).
    fn taken(lease: &Lease, me: &Identity, now: jiff::Timestamp, node_uid: Option<&str>) -> Lease {
        let mut lease = lease.clone();
        let annotations = lease.metadata.annotations.get_or_insert_with(BTreeMap::new);
        for k in HOLDER_ANNOTATIONS {
            annotations.remove(k);
        }
        annotations.insert(ANNOTATION_MACHINE_ID.to_owned(), me.id.clone());
        annotations.insert(ANNOTATION_BOOT_ID.to_owned(), me.boot_id.clone());
        annotations.insert(ANNOTATION_SINCE.to_owned(), now.to_string());
        annotations.insert(ANNOTATION_HOLDER_TOKEN.to_owned(), me.token.clone());
        if let Some(uid) = node_uid {
            annotations.insert(ANNOTATION_NODE_UID.to_owned(), uid.to_owned());
        }
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        spec.holder_identity = Some(me.node.clone());
        spec.acquire_time = Some(MicroTime(now));
        spec.renew_time = Some(MicroTime(now));
        spec.lease_duration_seconds = None;
        spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0).saturating_add(1));
        lease
    }

    /// `lease` with its holder removed.
    fn freed(lease: &Lease, now: jiff::Timestamp) -> Lease {
        let mut lease = lease.clone();
        if let Some(annotations) = lease.metadata.annotations.as_mut() {
            for k in HOLDER_ANNOTATIONS {
                annotations.remove(k);
            }
        }
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        spec.holder_identity = None;
        spec.acquire_time = None;
        spec.renew_time = Some(MicroTime(now));
        lease
    }

    /// Replace `lease` (guarded by the resourceVersion it carries). `false` = lost a race
    /// (409 Conflict, or 404: deleted meanwhile).
    #[tracing::instrument(level = "debug", skip(self, lease), fields(namespace = %self.namespace, lease = lease.metadata.name.as_deref().unwrap_or("")))]
    async fn replace(&self, what: &str, lease: &Lease) -> Result<bool, LockError> {
        let name = lease.metadata.name.as_deref().unwrap_or("");
        let pp = PostParams::default();
        match self.call(what, self.leases.replace(name, &pp, lease)).await {
            Ok(_) => Ok(true),
            Err(CallError {
                code: Some(409 | 404),
                ..
            }) => {
                tracing::debug!(lease = name, what, "lost a race; reading again");
                Ok(false)
            }
            Err(e) => Err(e.error),
        }
    }

    /// Create `lease`. `false` = it exists already (lost a race); refused when the existing
    /// Lease belongs to something else.
    #[tracing::instrument(level = "debug", skip(self, lease), fields(namespace = %self.namespace, lease = lease.metadata.name.as_deref().unwrap_or("")))]
    async fn create(&self, what: &str, lease: &Lease) -> Result<bool, LockError> {
        Ok(self.create_obj(what, lease).await?.is_some())
    }

    /// [`Self::create`], returning the Lease created.
    async fn create_obj(&self, what: &str, lease: &Lease) -> Result<Option<Lease>, LockError> {
        let name = lease.metadata.name.as_deref().unwrap_or("");
        match self
            .call(what, self.leases.create(&PostParams::default(), lease))
            .await
        {
            Ok(l) => Ok(Some(l)),
            Err(CallError {
                code: Some(409), ..
            }) => {
                let existing = self
                    .call("reading an existing Lease", self.leases.get_opt(name))
                    .await?;
                if let Some(existing) = existing {
                    let owner = label(&existing.metadata, LABEL_SEMAPHORE);
                    if owner != Some(self.name.as_str()) {
                        return Err(LockError::Refused(format!(
                            "Lease {}/{name} exists and is not part of semaphore {:?} (its label \
                             {LABEL_SEMAPHORE} is {owner:?}); rename lock.kubernetes.name or \
                             remove that Lease",
                            self.namespace, self.name
                        )));
                    }
                }
                tracing::debug!(lease = name, what, "lost a race; reading again");
                Ok(None)
            }
            Err(e) => Err(e.error),
        }
    }

    /// Delete slot `slot` if it did not change since read. `false` = it did (or is gone).
    #[tracing::instrument(level = "debug", skip(self, slot), fields(namespace = %self.namespace, lease = slot.name()))]
    async fn delete_slot(&self, slot: &Slot) -> Result<bool, LockError> {
        self.delete_lease("deleting a slot Lease", &slot.lease)
            .await
    }

    /// Delete `lease` if it did not change since read. `false` = it did (or is gone).
    async fn delete_lease(&self, what: &str, lease: &Lease) -> Result<bool, LockError> {
        let dp = DeleteParams {
            preconditions: Some(Preconditions {
                resource_version: lease.metadata.resource_version.clone(),
                uid: lease.metadata.uid.clone(),
            }),
            ..DeleteParams::default()
        };
        let name = lease.metadata.name.as_deref().unwrap_or("");
        match self.call(what, self.leases.delete(name, &dp)).await {
            Ok(_) => Ok(true),
            Err(CallError {
                code: Some(409 | 404),
                ..
            }) => Ok(false),
            Err(e) => Err(e.error),
        }
    }

    /// Give back `slot`: delete it when at or above `max`, else clear its holder.
    async fn free_slot(&self, slot: &Slot, max: u64) -> Result<bool, LockError> {
        if slot.index >= max {
            self.delete_slot(slot).await
        } else {
            self.replace(
                "freeing a slot",
                &Self::freed(&slot.lease, jiff::Timestamp::now()),
            )
            .await
        }
    }

    fn waiter_ttl_secs(&self) -> i32 {
        i32::try_from(self.timeouts.waiter_ttl.as_secs().max(1)).unwrap_or(i32::MAX)
    }

    /// A new waiter Lease for `me`, waiting since `now`.
    fn waiter_lease(&self, me: &Identity, now: jiff::Timestamp) -> Lease {
        Lease {
            metadata: ObjectMeta {
                name: Some(self.waiter_name(&me.node)),
                namespace: Some(self.namespace.clone()),
                labels: Some(self.labels(ROLE_WAITER, None)),
                annotations: Some(BTreeMap::from([(
                    ANNOTATION_WAITER_NODE.to_owned(),
                    me.node.clone(),
                )])),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                acquire_time: Some(MicroTime(now)),
                renew_time: Some(MicroTime(now)),
                lease_duration_seconds: Some(self.waiter_ttl_secs()),
                ..LeaseSpec::default()
            }),
        }
    }

    /// When our waiter Lease is due for renewal (a third of its TTL after the last renewal).
    fn renew_due(&self, st: &AcquireState) -> Option<jiff::Timestamp> {
        let spec = st.waiter.as_ref()?.spec.as_ref()?;
        let renewed = spec.renew_time.as_ref().or(spec.acquire_time.as_ref())?.0;
        let every = jiff::SignedDuration::from_secs(i64::from(self.waiter_ttl_secs())) / 3;
        Some(
            renewed
                .saturating_add(every)
                .unwrap_or(jiff::Timestamp::MAX),
        )
    }

    /// Renew our waiter Lease. `false` = it changed or is gone (read again).
    async fn renew_waiter(&self, st: &mut AcquireState) -> Result<bool, LockError> {
        let Some(mut lease) = st.waiter.clone() else {
            return Ok(false);
        };
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        spec.renew_time = Some(MicroTime(jiff::Timestamp::now()));
        spec.lease_duration_seconds = Some(self.waiter_ttl_secs());
        let name = lease.metadata.name.clone().unwrap_or_default();
        let pp = PostParams::default();
        match self
            .call(
                "renewing the waiter Lease",
                self.leases.replace(&name, &pp, &lease),
            )
            .await
        {
            Ok(l) => {
                st.waiter = Some(l);
                Ok(true)
            }
            Err(CallError {
                code: Some(409 | 404),
                ..
            }) => {
                tracing::debug!(lease = %name, "the waiter Lease changed or is gone; reading again");
                st.waiter = None;
                Ok(false)
            }
            Err(e) => Err(e.error),
        }
    }

    /// Once holding a slot: delete our waiter Lease and the long-dead ones seen (best effort:
    /// a waiter Lease left behind expires by itself).
    async fn leave_queue(&self, st: &mut AcquireState) {
        if let Some(w) = st.waiter.take() {
            // Our own Lease: only its uid as precondition (a renewal may be in flight).
            let mut w = w;
            w.metadata.resource_version = None;
            match self.delete_lease("deleting the waiter Lease", &w).await {
                Ok(_) => {
                    tracing::debug!(lease = ?w.metadata.name, "left the queue");
                }
                Err(e) => {
                    tracing::info!(lease = ?w.metadata.name, error = %e, "could not delete the waiter Lease; it expires by itself")
                }
            }
        }
        for dead in std::mem::take(&mut st.dead_waiters) {
            if let Ok(true) = self
                .delete_lease("deleting a dead waiter Lease", &dead)
                .await
            {
                tracing::info!(lease = ?dead.metadata.name, "deleted the Lease of a waiter that stopped renewing it");
            }
        }
    }

    /// Create the control Lease (absent in `snap`).
    async fn create_control(&self, snap: &Snapshot, max: u64) -> Result<bool, LockError> {
        let created = self
            .create("creating the control Lease", &self.control_lease(max))
            .await?;
        if created {
            tracing::info!(namespace = %self.namespace, lease = %self.name, max, slots_found = snap.slots.len(), "created the semaphore's control Lease");
        }
        Ok(created)
    }

    /// GET a Node: its uid, or that it does not exist, or that we cannot tell.
    #[tracing::instrument(level = "debug", skip(self))]
    async fn node_lookup(&self, node: &str) -> Result<NodeLookup, LockError> {
        match self.call("reading a Node", self.nodes.get_opt(node)).await {
            Ok(Some(n)) => Ok(NodeLookup::Found(n.metadata.uid.unwrap_or_default())),
            Ok(None) => Ok(NodeLookup::Missing),
            Err(CallError {
                error: e @ LockError::Unreachable { .. },
                ..
            }) => Err(e),
            Err(e) => Ok(NodeLookup::Unknown(e.error.to_string())),
        }
    }

    /// Our own Node's uid, looked up once per `acquire`.
    async fn own_node_uid(
        &self,
        me: &Identity,
        st: &mut AcquireState,
    ) -> Result<Option<String>, LockError> {
        if let Some(uid) = &st.own_node_uid {
            return Ok(uid.clone());
        }
        let uid = match self.node_lookup(&me.node).await? {
            NodeLookup::Found(uid) if !uid.is_empty() => Some(uid),
            NodeLookup::Found(_) | NodeLookup::Missing => {
                tracing::info!(node = %me.node, "no Node object of this name: the slot will carry no node uid, so it is never reclaimed for a missing Node (only by lock.max_hold)");
                None
            }
            NodeLookup::Unknown(reason) => {
                tracing::warn!(node = %me.node, %reason, "cannot read our own Node: the slot will carry no node uid, so it is never reclaimed for a missing Node");
                None
            }
        };
        st.own_node_uid = Some(uid.clone());
        Ok(uid)
    }

    /// One round of `acquire`: read; take a free slot (when fewer live waiters are ahead of
    /// us in the queue than there are free slots), or reclaim one (first in the queue only),
    /// or queue and say what to wait for.
    async fn acquire_round(
        &self,
        me: &Identity,
        st: &mut AcquireState,
    ) -> Result<Round, LockError> {
        let snap = self.read().await?;
        if snap.control.is_none() {
            self.create_control(&snap, snap.max).await?;
            return Ok(Round::Again);
        }
        let now_ts = jiff::Timestamp::now();
        let my_waiter = self.waiter_name(&me.node);
        // Ours from an earlier round, or left by a previous process (adopted: same place).
        st.waiter = snap.waiters.get(&my_waiter).map(|w| w.lease.clone());
        let ttl = Duration::from_secs(u64::try_from(self.waiter_ttl_secs()).unwrap_or(1));
        st.dead_waiters = snap
            .waiters
            .values()
            .filter(|w| w.name != my_waiter && w.deadline(WAITER_CLOCK_SLACK + ttl) <= now_ts)
            .map(|w| w.lease.clone())
            .collect();
        if let Some((slot, holder)) = snap.mine(me) {
            if holder.machine_id.as_deref() == Some(me.id.as_str()) {
                tracing::debug!(lease = slot.name(), id = %me.id, "holding a slot already");
                return Ok(Round::Held);
            }
            tracing::warn!(
                lease = slot.name(),
                node = %me.node,
                recorded_machine_id = ?holder.machine_id,
                id = %me.id,
                "a slot is held under this node's name by another machine id (reinstalled node?); adopting it"
            );
            let mut lease = slot.lease.clone();
            let annotations = lease.metadata.annotations.get_or_insert_with(BTreeMap::new);
            annotations.insert(ANNOTATION_MACHINE_ID.to_owned(), me.id.clone());
            annotations.insert(ANNOTATION_BOOT_ID.to_owned(), me.boot_id.clone());
            annotations.insert(ANNOTATION_HOLDER_TOKEN.to_owned(), me.token.clone());
            if self.replace("adopting a slot", &lease).await? {
                return Ok(Round::Held);
            }
            return Ok(Round::Again);
        }

        let pos = queue::position(
            snap.waiters.values(),
            st.queued_since(now_ts),
            &my_waiter,
            now_ts,
            WAITER_CLOCK_SLACK,
        );
        let holders = snap.holders();
        if (holders as u64) < snap.max && snap.free() > pos.rank as i64 {
            let node_uid = self.own_node_uid(me, st).await?;
            let now = jiff::Timestamp::now();
            // The waiters ahead of us go for the first free slots: we take the one after them,
            // so that the eligible waiters do not all race for the same Lease.
            enum Candidate<'a> {
                Free(&'a Slot),
                Missing(u64),
            }
            let candidates: Vec<Candidate> = snap
                .slots
                .values()
                .filter(|s| s.index < snap.max && s.holder.is_none())
                .map(Candidate::Free)
                .chain(
                    (0..snap.max)
                        .filter(|i| !snap.slots.contains_key(i))
                        .map(Candidate::Missing),
                )
                .take(pos.rank + 1)
                .collect();
            let (won, lease_name) = match candidates.get(pos.rank).or(candidates.last()) {
                Some(Candidate::Free(slot)) => {
                    let lease = Self::taken(&slot.lease, me, now, node_uid.as_deref());
                    (
                        self.replace("taking a slot", &lease).await?,
                        slot.name().to_owned(),
                    )
                }
                Some(&Candidate::Missing(index)) => {
                    let lease =
                        Self::taken(&self.free_slot_lease(index), me, now, node_uid.as_deref());
                    (
                        self.create("creating a slot", &lease).await?,
                        self.slot_name(index),
                    )
                }
                // Fewer holders than max yet no slot below max free or missing: impossible
                // unless the list changed shape under us; read again.
                None => return Ok(Round::Again),
            };
            if won {
                tracing::info!(
                    namespace = %self.namespace,
                    lease = %lease_name,
                    id = %me.id,
                    node = %me.node,
                    holders = holders + 1,
                    max = snap.max,
                    waiters_ahead = pos.rank,
                    "took a slot"
                );
                return Ok(Round::Held);
            }
            return Ok(Round::Again);
        }

        // Only the first live waiter checks the holders for reclaim (and watches their Nodes):
        // the others wait for their turn without a request.
        let head = pos.rank == 0;
        let mut watch_nodes = Vec::new();
        let mut wake_at = None;
        let seen_now = Instant::now();
        if head {
            // No free slot: is a holder's Node gone?
            for (slot, h) in snap.held() {
                let Some(uid) = &h.node_uid else { continue };
                match self.node_lookup(&h.node).await? {
                    NodeLookup::Found(now_uid) if &now_uid == uid => {
                        watch_nodes.push((h.node.clone(), uid.clone()))
                    }
                    NodeLookup::Found(now_uid) => {
                        let why = format!(
                            "its Node {} was deleted and registered again (uid {uid} is now {now_uid})",
                            h.node
                        );
                        return self.reclaim(&snap, slot, h, me, &why, st).await;
                    }
                    NodeLookup::Missing => {
                        let why = format!("its Node {} no longer exists", h.node);
                        return self.reclaim(&snap, slot, h, me, &why, st).await;
                    }
                    NodeLookup::Unknown(reason) => {
                        if !st.node_access_warned {
                            tracing::warn!(node = %h.node, %reason, "cannot read a holder's Node; it is not checked for deletion");
                            st.node_access_warned = true;
                        }
                    }
                }
            }

            // Track since when this waiter sees each holder, for holders without a time.
            st.first_seen
                .retain(|node, _| snap.held().any(|(_, h)| &h.node == node));
            for (_, h) in snap.held() {
                st.first_seen.entry(h.node.clone()).or_insert(seen_now);
            }

            if let Some(max_hold) = self.max_hold {
                let now = jiff::Timestamp::now();
                let mut stalest: Option<(&Slot, &SlotHolder, Duration)> = None;
                for (slot, h) in snap.held() {
                    let age = match h.since {
                        Some(since) => {
                            Duration::try_from(now.duration_since(since)).unwrap_or_default()
                        }
                        None => st
                            .first_seen
                            .get(&h.node)
                            .map(|t| seen_now.saturating_duration_since(*t))
                            .unwrap_or_default(),
                    };
                    if age >= max_hold {
                        if stalest.is_none_or(|(_, _, a)| age > a) {
                            stalest = Some((slot, h, age));
                        }
                    } else {
                        let at = seen_now + (max_hold - age);
                        wake_at = Some(wake_at.map_or(at, |w: Instant| w.min(at)));
                    }
                }
                if let Some((slot, h, age)) = stalest {
                    let why = format!(
                        "no progress for {} (longer than lock.max_hold {})",
                        humantime::format_duration(Duration::from_secs(age.as_secs())),
                        humantime::format_duration(max_hold)
                    );
                    return self.reclaim(&snap, slot, h, me, &why, st).await;
                }
            }
        }

        // Join the queue (or stay in it).
        match self.renew_due(st) {
            None => {
                let lease = self.waiter_lease(me, jiff::Timestamp::now());
                match self.create_obj("joining the queue", &lease).await? {
                    Some(created) => {
                        tracing::debug!(lease = %my_waiter, waiters_ahead = pos.rank, "joined the queue of waiters");
                        st.waiter = Some(created);
                    }
                    None => return Ok(Round::Again),
                }
            }
            Some(due) if due <= jiff::Timestamp::now() => {
                if !self.renew_waiter(st).await? {
                    return Ok(Round::Again);
                }
            }
            Some(_) => {}
        }

        let state = (
            snap.max,
            snap.held()
                .map(|(_, h)| (h.node.clone(), h.phase.clone()))
                .collect::<Vec<_>>(),
            pos.rank,
        );
        if st.last_logged.as_ref() != Some(&state) {
            tracing::info!(
                namespace = %self.namespace,
                semaphore = %self.name,
                id = %me.id,
                free = snap.free(),
                max = snap.max,
                holders = ?state.1,
                waiters_ahead = pos.rank,
                reclaim_check_in = ?wake_at.map(|w: Instant| w.saturating_duration_since(seen_now)),
                "waiting for a free slot (watching the Leases)"
            );
            st.last_logged = Some(state);
        }
        Ok(Round::Wait {
            view: Box::new(snap),
            head,
            nodes: watch_nodes,
            wake_at,
        })
    }

    /// Take over the slot of a holder that is gone or stale (or free it when holders exceed
    /// `max`).
    async fn reclaim(
        &self,
        snap: &Snapshot,
        slot: &Slot,
        holder: &SlotHolder,
        me: &Identity,
        why: &str,
        st: &mut AcquireState,
    ) -> Result<Round, LockError> {
        let take_over = slot.index < snap.max && snap.holders() as u64 <= snap.max;
        tracing::warn!(
            namespace = %self.namespace,
            lease = slot.name(),
            holder_node = %holder.node,
            holder_id = ?holder.machine_id,
            phase = ?holder.phase,
            since = ?holder.since,
            by = %me.id,
            take_over,
            "RECLAIMING the slot of a holder: {why}"
        );
        if !take_over {
            self.free_slot(slot, snap.max).await?;
            return Ok(Round::Again);
        }
        let node_uid = self.own_node_uid(me, st).await?;
        let lease = Self::taken(&slot.lease, me, jiff::Timestamp::now(), node_uid.as_deref());
        if self.replace("reclaiming a slot", &lease).await? {
            tracing::warn!(namespace = %self.namespace, lease = slot.name(), holder_node = %holder.node, by = %me.id, node = %me.node, "reclaimed the slot");
            Ok(Round::Held)
        } else {
            Ok(Round::Again)
        }
    }

    /// Open a watch on the semaphore's Leases from `resource_version`. `None` = 410 Gone (too
    /// old: list again).
    #[tracing::instrument(level = "debug", skip(self), fields(namespace = %self.namespace, selector = %self.selector))]
    async fn watch_leases(&self, resource_version: &str) -> Result<Option<LeaseEvents>, LockError> {
        let wp = WatchParams::default()
            .labels(&self.selector)
            .timeout(self.timeouts.watch.as_secs().clamp(1, u32::MAX as u64) as u32);
        match self
            .call("watching Leases", self.leases.watch(&wp, resource_version))
            .await
        {
            Ok(s) => Ok(Some(s.boxed())),
            Err(CallError {
                code: Some(410), ..
            }) => Ok(None),
            Err(e) => Err(e.error),
        }
    }

    /// Open a watch on one Node, from `resource_version` (empty: from its current state, which
    /// comes first as an ADDED event). `None` = 410 Gone. The stream ends with `(node, None)`.
    #[tracing::instrument(level = "debug", skip(self))]
    async fn watch_node(
        &self,
        node: &str,
        resource_version: &str,
    ) -> Result<Option<NodeEvents>, CallError> {
        let wp = WatchParams::default()
            .fields(&format!("metadata.name={node}"))
            .timeout(self.timeouts.watch.as_secs().clamp(1, u32::MAX as u64) as u32);
        match self
            .call("watching a Node", self.nodes.watch(&wp, resource_version))
            .await
        {
            Ok(s) => {
                let n1 = node.to_owned();
                let n2 = node.to_owned();
                Ok(Some(
                    s.map(move |e| (n1.clone(), Some(e)))
                        .chain(stream::once(async move { (n2, None) }))
                        .boxed(),
                ))
            }
            Err(CallError {
                code: Some(410), ..
            }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Wait until the Leases, as seen on the watch from `view`, let us go for a slot (free
    /// slots outnumber the live waiters ahead of us), make us first in the queue, or (when
    /// first: `head`) change holders; until one of `nodes` (name, uid recorded) is deleted or
    /// registered again, or `wake_at`. Changes that do none of that cost no request. Renews
    /// our waiter Lease every third of its TTL. Watches that the server ends are resumed from
    /// the last resourceVersion seen; 410 Gone or a watch that cannot be resumed returns, so
    /// that the caller lists again.
    #[tracing::instrument(level = "debug", skip_all, fields(namespace = %self.namespace, semaphore = %self.name))]
    async fn wait_for_change(
        &self,
        me: &Identity,
        mut view: Box<Snapshot>,
        head: bool,
        nodes: &[(String, String)],
        wake_at: Option<Instant>,
        st: &mut AcquireState,
    ) -> Result<(), LockError> {
        let mut rv = view.resource_version.clone();
        let my_waiter = self.waiter_name(&me.node);
        let held_before = held_signature(&view);
        let Some(mut leases) = self.watch_leases(&rv).await? else {
            return Ok(());
        };
        // A watch silent for longer than the server's own limit is reopened (dead connection).
        let silence = self.timeouts.watch + self.timeouts.request;
        let mut lease_deadline = Instant::now() + silence;

        // The holders' Nodes: watched from their current state, then read once more, which
        // closes the gap between the round's check and the watches.
        let mut node_events: SelectAll<NodeEvents> = SelectAll::new();
        let mut node_rv: HashMap<String, String> = HashMap::new();
        let mut node_opened: HashMap<String, Instant> = HashMap::new();
        for (node, _) in nodes {
            match self.watch_node(node, "").await {
                Ok(Some(s)) => {
                    node_events.push(s);
                    node_opened.insert(node.clone(), Instant::now());
                }
                Ok(None) => return Ok(()),
                Err(CallError {
                    error: e @ LockError::Unreachable { .. },
                    ..
                }) => return Err(e),
                Err(e) => {
                    if !st.node_access_warned {
                        tracing::warn!(node = %node, error = %e.error, "cannot watch a holder's Node; its deletion is noticed only at the next change of the Leases");
                        st.node_access_warned = true;
                    }
                }
            }
        }
        for (node, uid) in nodes {
            match self.node_lookup(node).await? {
                NodeLookup::Found(u) if &u == uid => {}
                NodeLookup::Unknown(_) => {}
                _ => return Ok(()),
            }
        }

        let wake = async {
            match wake_at {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(wake);
        loop {
            if let Some(why) = self.wake_reason(&view, me, &my_waiter, head, &held_before, st) {
                tracing::debug!(why, "reading the Leases again");
                return Ok(());
            }
            let now = jiff::Timestamp::now();
            let pos = queue::position(
                view.waiters.values(),
                st.queued_since(now),
                &my_waiter,
                now,
                WAITER_CLOCK_SLACK,
            );
            let expiry = pos.next_expiry.map(instant_at);
            let renew_at = self.renew_due(st).map(instant_at);
            let node_deadline = node_opened.values().min().map(|t| *t + silence);
            let node_silence = async {
                match node_deadline {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = &mut wake => return Ok(()),
                // A waiter ahead stops being live: the rank is computed again.
                () = sleep_until_opt(expiry) => {}
                () = sleep_until_opt(renew_at) => {
                    if !self.renew_waiter(st).await? {
                        return Ok(());
                    }
                }
                ev = leases.next() => match ev {
                    Some(Ok(WatchEvent::Added(l) | WatchEvent::Modified(l))) => {
                        lease_deadline = Instant::now() + silence;
                        if let Some(v) = &l.metadata.resource_version {
                            rv = v.clone();
                        }
                        // Our own waiter Lease: what we wrote last is in `st`.
                        if l.metadata.name.as_deref() != Some(my_waiter.as_str()) {
                            self.put_lease(&mut view, l);
                        }
                    }
                    Some(Ok(WatchEvent::Deleted(l))) => {
                        lease_deadline = Instant::now() + silence;
                        if let Some(v) = &l.metadata.resource_version {
                            rv = v.clone();
                        }
                        let name = l.metadata.name.unwrap_or_default();
                        if name == my_waiter {
                            tracing::info!(lease = %name, "our waiter Lease was deleted (taken for dead?); queueing again");
                            return Ok(());
                        }
                        self.drop_lease(&mut view, &name);
                    }
                    Some(Ok(WatchEvent::Bookmark(b))) => {
                        rv = b.metadata.resource_version;
                        lease_deadline = Instant::now() + silence;
                    }
                    Some(Ok(WatchEvent::Error(s))) if s.code == 410 => {
                        tracing::debug!(%rv, "watch history expired (410 Gone); listing again");
                        return Ok(());
                    }
                    Some(Ok(WatchEvent::Error(s))) => return Err(self.status_error("watching Leases", &s)),
                    Some(Err(e)) => return Err(self.classify("watching Leases", e).error),
                    None => {
                        tracing::debug!(%rv, "the Lease watch ended; resuming it");
                        let Some(s) = self.watch_leases(&rv).await? else { return Ok(()) };
                        leases = s;
                        lease_deadline = Instant::now() + silence;
                    }
                },
                () = tokio::time::sleep_until(lease_deadline) => {
                    tracing::debug!(%rv, ?silence, "the Lease watch is silent; reopening it");
                    let Some(s) = self.watch_leases(&rv).await? else { return Ok(()) };
                    leases = s;
                    lease_deadline = Instant::now() + silence;
                }
                () = node_silence => {
                    tracing::debug!(?silence, "a Node watch is silent; reading again");
                    return Ok(());
                }
                Some((node, ev)) = node_events.next() => match ev {
                    Some(Ok(WatchEvent::Deleted(_))) => {
                        tracing::info!(%node, "a holder's Node was deleted");
                        return Ok(());
                    }
                    Some(Ok(WatchEvent::Added(n) | WatchEvent::Modified(n))) => {
                        let recorded = nodes.iter().find(|(name, _)| name == &node).map(|(_, u)| u.as_str());
                        if n.metadata.uid.as_deref() != recorded {
                            tracing::info!(%node, "a holder's Node was registered again");
                            return Ok(());
                        }
                        if let Some(v) = n.metadata.resource_version {
                            node_rv.insert(node.clone(), v);
                        }
                        node_opened.insert(node, Instant::now());
                    }
                    Some(Ok(WatchEvent::Bookmark(b))) => {
                        node_rv.insert(node.clone(), b.metadata.resource_version);
                        node_opened.insert(node, Instant::now());
                    }
                    Some(Ok(WatchEvent::Error(s))) => {
                        tracing::debug!(%node, code = s.code, message = %s.message, "a Node watch failed; reading again");
                        return Ok(());
                    }
                    Some(Err(e)) => return Err(self.classify("watching a Node", e).error),
                    None => {
                        node_opened.remove(&node);
                        let Some(from) = node_rv.get(&node).cloned() else {
                            tracing::debug!(%node, "a Node watch ended before any event; reading again");
                            return Ok(());
                        };
                        tracing::debug!(%node, rv = %from, "a Node watch ended; resuming it");
                        match self.watch_node(&node, &from).await {
                            Ok(Some(s)) => {
                                node_events.push(s);
                                node_opened.insert(node, Instant::now());
                            }
                            Ok(None) => return Ok(()),
                            Err(CallError { error: e @ LockError::Unreachable { .. }, .. }) => return Err(e),
                            Err(_) => return Ok(()),
                        }
                    }
                },
            }
        }
    }

    /// Why the waiter should read the Leases again after what the watch showed (`view`), if
    /// it should.
    fn wake_reason(
        &self,
        view: &Snapshot,
        me: &Identity,
        my_waiter: &str,
        head: bool,
        held_before: &HeldSignature,
        st: &AcquireState,
    ) -> Option<&'static str> {
        if view.control.is_none() {
            return Some("the control Lease is gone");
        }
        let Ok(max) = self.max_of(view) else {
            return Some("the control Lease does not parse");
        };
        if view.mine(me).is_some() {
            return Some("a slot is held under our name");
        }
        let now = jiff::Timestamp::now();
        let pos = queue::position(
            view.waiters.values(),
            st.queued_since(now),
            my_waiter,
            now,
            WAITER_CLOCK_SLACK,
        );
        let holders = view.holders() as u64;
        if holders < max && max - holders > pos.rank as u64 {
            return Some("a slot is free for us");
        }
        if pos.rank == 0 && !head {
            return Some("first in the queue");
        }
        if head && held_signature(view) != *held_before {
            return Some("the holders changed");
        }
        None
    }

    /// Whether `me` holds a slot in `snap`: one with its machine id (or node name) whose token,
    /// if it has one, is `me`'s.
    fn fence_of(&self, snap: &Snapshot, me: &Identity) -> Fence {
        match snap.mine(me) {
            None => Fence::Lost {
                why: format!(
                    "no slot of Leases {}/{}* is held by {} ({})",
                    self.namespace, self.name, me.node, me.id
                ),
            },
            Some((slot, h)) => match h.token.as_deref() {
                Some(t) if t != me.token => Fence::Lost {
                    why: format!(
                        "slot Lease {} is held by another host under this machine id or node \
                         name (holder token {t}, ours {})",
                        slot.name(),
                        me.token
                    ),
                },
                _ => Fence::Held,
            },
        }
    }

    /// Optimistic-concurrency loop for the calls other than `acquire`: `f` does one attempt on
    /// a fresh read and says whether it is done.
    async fn update<'a, F, Fut>(&'a self, what: &str, mut f: F) -> Result<(), LockError>
    where
        F: FnMut(Snapshot) -> Fut,
        Fut: Future<Output = Result<bool, LockError>> + 'a,
    {
        for _ in 0..MAX_CONFLICTS {
            let snap = self.read().await?;
            if f(snap).await? {
                return Ok(());
            }
        }
        Err(LockError::Backend {
            backend: BACKEND,
            reason: format!(
                "{what}: gave up after {MAX_CONFLICTS} conflicting updates of Leases {}/{}*",
                self.namespace, self.name
            ),
        })
    }
}

#[async_trait]
impl Semaphore for KubeLeaseSemaphore {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    /// Waits by watch; retries an unreachable or overloaded API server with capped exponential
    /// backoff; returns at once on anything else (a corrupt control Lease, permission denied).
    #[tracing::instrument(skip(self, me), fields(namespace = %self.namespace, semaphore = %self.name, id = %me.id))]
    async fn acquire(&self, me: &Identity) -> Result<(), LockError> {
        self.check()?;
        let mut backoff = self.timeouts.backoff_min;
        let mut st = AcquireState::default();
        loop {
            let failed = match self.acquire_round(me, &mut st).await {
                Ok(Round::Held) => {
                    self.leave_queue(&mut st).await;
                    return Ok(());
                }
                Ok(Round::Again) => {
                    backoff = self.timeouts.backoff_min;
                    continue;
                }
                Ok(Round::Wait {
                    view,
                    head,
                    nodes,
                    wake_at,
                }) => match self
                    .wait_for_change(me, view, head, &nodes, wake_at, &mut st)
                    .await
                {
                    Ok(()) => {
                        backoff = self.timeouts.backoff_min;
                        continue;
                    }
                    Err(e) => e,
                },
                Err(e) => e,
            };
            if !retryable(&failed) {
                return Err(failed);
            }
            tracing::warn!(error = %failed, retry_in = ?backoff, "Kubernetes API trouble while waiting for a slot; retrying");
            // Say again what we wait for once the API server answers.
            st.last_logged = None;
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(self.timeouts.backoff_max);
        }
    }

    #[tracing::instrument(skip(self, me), fields(namespace = %self.namespace, semaphore = %self.name, id = %me.id))]
    async fn fence(&self, me: &Identity) -> Result<Fence, LockError> {
        self.check()?;
        Ok(self.fence_of(&self.read().await?, me))
    }

    fn heartbeat_every(&self) -> Option<Duration> {
        super::heartbeat_every(self.max_hold)
    }

    /// Writes `renewTime` on my slot Lease (a new resourceVersion), if I hold it.
    #[tracing::instrument(skip(self, me), fields(namespace = %self.namespace, semaphore = %self.name, id = %me.id))]
    async fn heartbeat(&self, me: &Identity) -> Result<Fence, LockError> {
        self.check()?;
        let fence = std::sync::Mutex::new(Fence::Held);
        self.update("heartbeat", |snap| {
            let fence = &fence;
            async move {
                let f = self.fence_of(&snap, me);
                let held = f == Fence::Held;
                *fence.lock().unwrap_or_else(|p| p.into_inner()) = f;
                let Some((slot, _)) = snap.mine(me).filter(|_| held) else {
                    return Ok(true);
                };
                let mut lease = slot.lease.clone();
                lease.spec.get_or_insert_with(LeaseSpec::default).renew_time =
                    Some(MicroTime(jiff::Timestamp::now()));
                self.replace("heartbeat", &lease).await
            }
        })
        .await?;
        Ok(fence.into_inner().unwrap_or_else(|p| p.into_inner()))
    }

    /// Frees my slot, unless another host (another token) holds it under my machine id.
    #[tracing::instrument(skip(self, me), fields(namespace = %self.namespace, semaphore = %self.name, id = %me.id))]
    async fn release(&self, me: &Identity) -> Result<(), LockError> {
        self.check()?;
        let snap = self.read().await?;
        if let Some((slot, h)) = snap.mine(me) {
            if h.token.as_deref().is_some_and(|t| t != me.token) {
                tracing::error!(lease = slot.name(), id = %me.id, "not releasing a slot another host holds under this machine id");
                return Ok(());
            }
        }
        Admin::unlock(self, &me.id).await
    }

    /// Records the phase (and boot id) on the held slot and renews `renewTime`; `since` moves
    /// only when the phase or boot id changes. Not holding a slot is a no-op.
    #[tracing::instrument(skip(self, me), fields(namespace = %self.namespace, semaphore = %self.name, id = %me.id))]
    async fn report_phase(&self, me: &Identity, phase: &str) -> Result<(), LockError> {
        self.check()?;
        self.update("report phase", |snap| async move {
            let Some((slot, h)) = snap.mine(me) else {
                tracing::debug!(id = %me.id, phase, "not holding a slot; phase not recorded");
                return Ok(true);
            };
            let now = jiff::Timestamp::now();
            let mut lease = slot.lease.clone();
            let annotations = lease.metadata.annotations.get_or_insert_with(BTreeMap::new);
            if h.phase.as_deref() != Some(phase) || h.boot_id.as_deref() != Some(&me.boot_id) {
                annotations.insert(ANNOTATION_SINCE.to_owned(), now.to_string());
            }
            annotations.insert(ANNOTATION_PHASE.to_owned(), phase.to_owned());
            annotations.insert(ANNOTATION_BOOT_ID.to_owned(), me.boot_id.clone());
            annotations.insert(ANNOTATION_MACHINE_ID.to_owned(), me.id.clone());
            annotations.insert(ANNOTATION_HOLDER_TOKEN.to_owned(), me.token.clone());
            lease.spec.get_or_insert_with(LeaseSpec::default).renew_time = Some(MicroTime(now));
            self.replace("recording the phase", &lease).await
        })
        .await
    }
}

#[async_trait]
impl Admin for KubeLeaseSemaphore {
    /// Frees every slot held by `id` (node name or machine id); a slot at or above `max` (left
    /// by a forced shrink) is deleted instead.
    #[tracing::instrument(skip(self), fields(namespace = %self.namespace, semaphore = %self.name))]
    async fn unlock(&self, id: &str) -> Result<(), LockError> {
        self.check()?;
        self.update("release", |snap| async move {
            let mine: Vec<&Slot> = snap
                .held()
                .filter(|(_, h)| h.is(id))
                .map(|(s, _)| s)
                .collect();
            if mine.is_empty() {
                tracing::debug!(%id, "holding no slot; nothing to release");
                return Ok(true);
            }
            let mut done = true;
            for slot in mine {
                if self.free_slot(slot, snap.max).await? {
                    tracing::info!(namespace = %self.namespace, lease = slot.name(), %id, deleted = slot.index >= snap.max, "released");
                } else {
                    done = false;
                }
            }
            Ok(done)
        })
        .await
    }

    #[tracing::instrument(skip(self), fields(namespace = %self.namespace, semaphore = %self.name))]
    async fn status(&self) -> Result<SemaphoreStatus, LockError> {
        self.check()?;
        let snap = self.read().await?;
        let holders = snap
            .held()
            .map(|(_, h)| Holder {
                id: h.id().to_owned(),
                node: Some(h.node.clone()),
                phase: h.phase.clone(),
                since: h.since,
                boot_id: h.boot_id.clone(),
            })
            .collect();
        Ok(SemaphoreStatus {
            backend: BACKEND.into(),
            group: self.name.clone(),
            max: snap.max,
            free: snap.free(),
            holders,
        })
    }

    /// Writes `max` on the control Lease (creating it if absent), then creates the missing
    /// free slots below `max` and deletes the free slots at or above it. Held slots above `max`
    /// (only with `force`) stay until released.
    #[tracing::instrument(skip(self), fields(namespace = %self.namespace, semaphore = %self.name))]
    async fn set_max(&self, max: u64, force: bool) -> Result<(), LockError> {
        self.check()?;
        if max > MAX_SLOTS {
            return Err(LockError::Refused(format!(
                "set-max {max} refused: at most {MAX_SLOTS} slots (one Lease each)"
            )));
        }
        self.update("set-max", |snap| async move {
            let holders = snap.holders();
            if (max as u128) < holders as u128 && !force {
                return Err(LockError::MaxBelowHolders {
                    requested: max,
                    holders,
                });
            }
            match &snap.control {
                None => {
                    if !self.create_control(&snap, max).await? {
                        return Ok(false);
                    }
                }
                Some(c) if snap.max != max => {
                    let mut c = c.clone();
                    c.metadata
                        .annotations
                        .get_or_insert_with(BTreeMap::new)
                        .insert(ANNOTATION_MAX.to_owned(), max.to_string());
                    if !self.replace("writing max", &c).await? {
                        return Ok(false);
                    }
                }
                Some(_) => {}
            }
            if (max as u128) < holders as u128 {
                tracing::warn!(namespace = %self.namespace, semaphore = %self.name, max, holders, "set-max below the current holders (forced); slots above max are deleted when released");
            } else {
                tracing::info!(namespace = %self.namespace, semaphore = %self.name, max, holders, "max set");
            }
            for index in (0..max).filter(|i| !snap.slots.contains_key(i)) {
                self.create("creating a free slot", &self.free_slot_lease(index))
                    .await?;
            }
            for slot in snap.slots.values().filter(|s| s.index >= max && s.holder.is_none()) {
                // Lost = someone took it meanwhile (from the old max): it goes on release.
                self.delete_slot(slot).await?;
            }
            Ok(true)
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked() {
        assert!(name_problem("rebootd").is_none());
        assert!(name_problem("group-1").is_none());
        assert!(name_problem("").is_some());
        assert!(name_problem("Rebootd").is_some());
        assert!(name_problem("a.b").is_some());
        assert!(name_problem("-a").is_some());
        assert!(name_problem(&"a".repeat(64)).is_some());
    }

    #[test]
    fn holder_matches_machine_id_or_node() {
        let h = SlotHolder {
            node: "worker-1".into(),
            machine_id: Some("abc".into()),
            boot_id: None,
            phase: None,
            since: None,
            node_uid: None,
            token: None,
        };
        assert!(h.is("abc") && h.is("worker-1") && !h.is("worker-2"));
        assert_eq!(h.id(), "abc");
    }

    #[test]
    fn taken_then_freed_round_trips() {
        let me = Identity {
            id: "m1".into(),
            node: "n1".into(),
            boot_id: "b1".into(),
            token: "t1".into(),
        };
        let mut base = Lease::default();
        base.metadata.annotations = Some(BTreeMap::from([("other".to_owned(), "x".to_owned())]));
        let now = jiff::Timestamp::now();
        let t = KubeLeaseSemaphore::taken(&base, &me, now, Some("uid-1"));
        let h = SlotHolder::from_lease(&t).expect("held");
        assert_eq!(h.node, "n1");
        assert_eq!(h.machine_id.as_deref(), Some("m1"));
        assert_eq!(h.node_uid.as_deref(), Some("uid-1"));
        assert_eq!(h.since, Some(now));
        assert_eq!(t.spec.as_ref().unwrap().lease_transitions, Some(1));
        let f = KubeLeaseSemaphore::freed(&t, now);
        assert!(SlotHolder::from_lease(&f).is_none());
        assert_eq!(annotation(&f, "other"), Some("x"));
        assert_eq!(annotation(&f, ANNOTATION_MACHINE_ID), None);
        assert_eq!(f.spec.as_ref().unwrap().lease_transitions, Some(1));
    }
}
