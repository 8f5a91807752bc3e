//! etcd v3 lock backend, compatible with locksmith. Owns the connection (TLS, user/password,
//! timeouts), the compare-and-swap transactions on locksmith's semaphore document, the queue of
//! waiters, waiting for a slot by watch, stale-holder reclaim and rebootd's per-holder records.
//! The document format and the key layout are in [`super::document`].
//!
//! Every write of the document is one transaction guarded by `version(document key) == version
//! read` (`== 0` to create it), so a lost race is detected and retried on a fresh state, and a
//! document that does not parse is never written over: parsing happens before any write is built.
//!
//! # Waiting: a FIFO queue beside locksmith's document
//!
//! A waiter puts a queue entry (`.../rebootd/waiters/<id>`) under an etcd lease it keeps alive
//! while `acquire` runs; the entry's create revision is its ticket, and its rank the number of
//! entries with a smaller one. It tries the compare-and-swap only when the document has more free
//! slots than its rank, so a release wakes the head of the queue, not every waiter. The CAS that
//! takes the slot also deletes the entry. One watch, on the key range from the queue to the
//! document (from the holder records when `max_hold` is set: reclaim decisions need their
//! `since`), keeps them up to date locally for the whole wait: a change costs the waiters no
//! request; a fresh read happens only after a compaction, a reconnect or an error. (Unwatched,
//! the records a waiter holds are those of its last read; they only serve to delete orphans,
//! which is safe on any past view under the document's version.) A waiter that dies leaves an entry that vanishes with its
//! lease ([`Timeouts::queue_ttl`]); a restarted one re-puts its entry under a new lease, which
//! keeps the create revision, so it keeps its place. locksmith (and rebootd before the queue)
//! never reads the queue: it takes free slots by CAS as before, and queued waiters wait on.

use std::collections::HashMap;
use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{
    Certificate, Client, Compare, CompareOp, ConnectOptions, EventType, GetOptions,
    Identity as TlsIdentity, KeyValue, LeaseKeepAliveStream, LeaseKeeper, PutOptions, TlsOptions,
    Txn, TxnOp, TxnOpResponse, TxnResponse, WatchOptions, WatchStream,
};
use tokio::time::Instant;

use super::document::{self, DocError, HolderRecord, SemaphoreDoc, WaiterRecord};
use super::{Admin, Fence, Holder, Identity, LockError, Semaphore, SemaphoreStatus};
use crate::config;

mod import;
pub use import::Import;

const BACKEND: &str = "etcd";
/// Compare-and-swap attempts before an update (other than `acquire`) gives up.
const MAX_CONFLICTS: usize = 64;
/// Longest document value quoted in a [`LockError::Corrupt`].
const QUOTE_MAX: usize = 2000;
/// What an endpoint that is not an etcd gRPC server is told it is, and asked.
const NOT_GRPC: &str = "the endpoint answered but does not speak etcd's gRPC (HTTP/2) protocol";
const NOT_GRPC_HINT: &str = "is this an etcd client URL (usually port 2379)?";

/// Time limits of the etcd backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// Connecting to an endpoint.
    pub connect: Duration,
    /// One request (read, transaction, opening a watch).
    pub request: Duration,
    /// First pause after a transient error inside `acquire`; doubled each time, up to
    /// `backoff_max`.
    pub backoff_min: Duration,
    pub backoff_max: Duration,
    /// Time to live of a waiter's queue entry (its etcd lease, kept alive every third of it
    /// while `acquire` runs): the longest a waiter that died without a word holds up the queue.
    /// Whole seconds, rounded up; etcd may raise a very short one to its minimum.
    pub queue_ttl: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            connect: Duration::from_secs(5),
            request: Duration::from_secs(10),
            backoff_min: Duration::from_millis(100),
            backoff_max: Duration::from_secs(10),
            // Longer than backoff_max, so a waiter retrying an unreachable cluster keeps its place.
            queue_ttl: Duration::from_secs(30),
        }
    }
}

/// locksmith's semaphore in etcd, plus rebootd's records about its holders.
pub struct EtcdSemaphore {
    client: Client,
    group: String,
    key: String,
    records_prefix: String,
    queue_prefix: String,
    /// The endpoints, for error messages.
    target: String,
    max_hold: Option<Duration>,
    timeouts: Timeouts,
}

impl std::fmt::Debug for EtcdSemaphore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdSemaphore")
            .field("target", &self.target)
            .field("group", &self.group)
            .field("key", &self.key)
            .field("max_hold", &self.max_hold)
            .finish_non_exhaustive()
    }
}

/// One of rebootd's holder records as read.
#[derive(Debug, Clone)]
struct RecordEntry {
    /// `None` when the value does not parse (it is then treated as absent).
    record: Option<HolderRecord>,
    mod_revision: i64,
}

/// One waiter's queue entry as read or watched.
#[derive(Debug, Clone)]
struct QueueEntry {
    /// The ticket: waiters are served in create-revision order.
    create_revision: i64,
    mod_revision: i64,
    /// The lease it is attached to.
    lease: i64,
    /// `None` when the value does not parse (the entry still counts).
    record: Option<WaiterRecord>,
}

/// The document, the records and (for `acquire`) the queue, as of one revision: read in one
/// transaction, then kept up to date from watch events.
#[derive(Debug, Clone)]
struct Snapshot {
    /// The store's revision at the read, then the revision of the last event applied.
    revision: i64,
    /// The document key's version; 0 when absent (`doc` is then locksmith's default).
    version: i64,
    doc: SemaphoreDoc,
    /// By key.
    records: HashMap<String, RecordEntry>,
    /// By key; empty unless read with the queue.
    queue: HashMap<String, QueueEntry>,
}

/// Where `acquire` stands after looking at a state.
enum Step {
    Held,
    /// Wait for a change, or until `wake_at` (when a holder becomes reclaimable).
    Wait {
        wake_at: Option<Instant>,
    },
}

/// What one `acquire` carries across its sessions (a session = a read, then one watch).
struct Waiting<'a> {
    me: &'a Identity,
    /// My queue entry's key.
    queue_key: String,
    /// When this `acquire` started, for the queue entry and the logs.
    started: jiff::Timestamp,
    /// Since when this waiter sees each holder, for holders without a record (locksmith's).
    first_seen: HashMap<String, Instant>,
    /// What was last logged as waited for: free slots, holders, my position.
    last_logged: Option<(i64, Vec<String>, usize)>,
    lease: LeaseGuard,
}

/// The lease of my queue entry; revoked (from a spawned task, best effort) when dropped, so an
/// `acquire` that returns or is cancelled leaves no entry behind. If the process dies instead,
/// the lease expires.
struct LeaseGuard {
    client: Client,
    request: Duration,
    /// The lease and its granted time to live.
    lease: Option<(i64, Duration)>,
}

impl LeaseGuard {
    fn revoke(&mut self) {
        let Some((id, _)) = self.lease.take() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let mut lease = self.client.lease_client();
        let request = self.request;
        runtime.spawn(async move {
            match tokio::time::timeout(request, lease.revoke(id)).await {
                Ok(Ok(_)) => tracing::debug!(lease = id, "queue lease revoked"),
                Ok(Err(e)) => {
                    tracing::debug!(lease = id, error = %e, "queue lease not revoked; it expires")
                }
                Err(_) => {
                    tracing::debug!(lease = id, "queue lease not revoked in time; it expires")
                }
            }
        });
    }
}

impl Drop for LeaseGuard {
    fn drop(&mut self) {
        self.revoke();
    }
}

/// The lease keep-alive stream of one session, opened at the first keep-alive.
struct KeepAlive {
    keeper: LeaseKeeper,
    stream: LeaseKeepAliveStream,
}

impl EtcdSemaphore {
    /// Connect to the cluster in `settings` for the semaphore of `group`, with default
    /// [`Timeouts`]. An unreachable cluster is [`LockError::Unreachable`] naming the endpoints.
    pub async fn connect(
        settings: &config::Etcd,
        group: &str,
        max_hold: Option<Duration>,
    ) -> Result<Self, LockError> {
        Self::connect_with(settings, group, max_hold, Timeouts::default()).await
    }

    /// [`EtcdSemaphore::connect`] with explicit time limits.
    #[tracing::instrument(skip(settings), fields(endpoints = ?settings.endpoints))]
    pub async fn connect_with(
        settings: &config::Etcd,
        group: &str,
        max_hold: Option<Duration>,
        timeouts: Timeouts,
    ) -> Result<Self, LockError> {
        let options = connect_options(settings, timeouts)?;
        let target = settings.endpoints.join(",");
        let unreachable = |reason: String| LockError::Unreachable {
            backend: BACKEND,
            target: target.clone(),
            reason,
        };
        let client = match tokio::time::timeout(
            timeouts.connect + timeouts.request,
            Client::connect(&settings.endpoints, Some(options)),
        )
        .await
        {
            Err(_) => {
                return Err(unreachable(format!(
                    "no answer within {:?}",
                    timeouts.connect + timeouts.request
                )))
            }
            Ok(Err(etcd_client::Error::InvalidArgs(e))) => {
                return Err(LockError::Refused(format!("lock.etcd: {e}")))
            }
            Ok(Err(etcd_client::Error::InvalidUri(e))) => {
                return Err(LockError::Refused(format!("lock.etcd.endpoints: {e}")))
            }
            Ok(Err(e)) => return Err(classify(&target, e)),
            Ok(Ok(c)) => c,
        };
        let this = EtcdSemaphore {
            client,
            group: group.to_owned(),
            key: document::semaphore_key(group),
            records_prefix: document::holder_records_prefix(group),
            queue_prefix: document::waiter_queue_prefix(group),
            target,
            max_hold,
            timeouts,
        };
        // The client connects lazily: make sure someone answers, and say what else did.
        if let Err(e) = this.probe().await {
            return Err(explain_wrong_protocol(e, &settings.endpoints, timeouts.connect).await);
        }
        Ok(this)
    }

    /// The key of locksmith's document this semaphore uses.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The prefix of rebootd's holder records.
    pub fn records_prefix(&self) -> &str {
        &self.records_prefix
    }

    /// The prefix of rebootd's queue of waiters.
    pub fn queue_prefix(&self) -> &str {
        &self.queue_prefix
    }

    pub fn group(&self) -> &str {
        &self.group
    }

    fn unreachable(&self, reason: String) -> LockError {
        LockError::Unreachable {
            backend: BACKEND,
            target: self.target.clone(),
            reason,
        }
    }

    /// [`classify`], naming the key in permanent errors (e.g. permission denied).
    fn classify(&self, e: etcd_client::Error) -> LockError {
        match classify(&self.target, e) {
            LockError::Backend { backend, reason } => LockError::Backend {
                backend,
                reason: format!("{reason} (key {})", self.key),
            },
            other => other,
        }
    }

    fn corrupt(&self, value: &[u8], reason: String) -> LockError {
        let mut value = String::from_utf8_lossy(value).into_owned();
        if value.len() > QUOTE_MAX {
            let mut cut = QUOTE_MAX;
            while !value.is_char_boundary(cut) {
                cut -= 1;
            }
            value.truncate(cut);
            value.push('…');
        }
        LockError::Corrupt {
            key: self.key.clone(),
            value,
            reason,
        }
    }

    fn record_key(&self, id: &str) -> String {
        document::holder_record_key(&self.group, id)
    }

    /// Whether `me` holds its slot in `snap`: its id in the document, and its record (if any)
    /// carries its token.
    fn fence_of(&self, snap: &Snapshot, me: &Identity) -> Fence {
        if !snap.doc.holds(&me.id) {
            return Fence::Lost {
                why: format!("{} is not among the holders in {}", me.id, self.key),
            };
        }
        let record = snap
            .records
            .get(&self.record_key(&me.id))
            .and_then(|e| e.record.as_ref());
        match record.and_then(|r| r.token.as_deref()) {
            Some(t) if t != me.token => Fence::Lost {
                why: format!(
                    "the slot of {} is held by another host with the same machine id (holder \
                     token {t}, ours {})",
                    me.id, me.token
                ),
            },
            _ => Fence::Held,
        }
    }

    #[tracing::instrument(level = "debug", skip(self), fields(key = %self.key))]
    async fn probe(&self) -> Result<(), LockError> {
        let mut kv = self.client.kv_client();
        let get = kv.get(self.key.clone(), Some(GetOptions::new().with_count_only()));
        match tokio::time::timeout(self.timeouts.request, get).await {
            Err(_) => {
                Err(self.unreachable(format!("no answer within {:?}", self.timeouts.request)))
            }
            Ok(Err(e)) => Err(self.classify(e)),
            Ok(Ok(_)) => Ok(()),
        }
    }

    async fn txn(&self, txn: Txn) -> Result<TxnResponse, LockError> {
        let mut kv = self.client.kv_client();
        match tokio::time::timeout(self.timeouts.request, kv.txn(txn)).await {
            Err(_) => {
                Err(self.unreachable(format!("no answer within {:?}", self.timeouts.request)))
            }
            Ok(Err(e)) => Err(self.classify(e)),
            Ok(Ok(r)) => Ok(r),
        }
    }

    /// Read the document and the records (and the queue when `with_queue`) at one revision. A
    /// document that does not parse is [`LockError::Corrupt`].
    #[tracing::instrument(level = "debug", skip(self), fields(key = %self.key))]
    async fn read(&self, with_queue: bool) -> Result<Snapshot, LockError> {
        let prefix = |p: &str| TxnOp::get(p.to_owned(), Some(GetOptions::new().with_prefix()));
        let mut gets = vec![
            TxnOp::get(self.key.clone(), None),
            prefix(&self.records_prefix),
        ];
        if with_queue {
            gets.push(prefix(&self.queue_prefix));
        }
        let resp = self.txn(Txn::new().and_then(gets)).await?;
        let revision = resp.header().map(|h| h.revision()).unwrap_or_default();
        let unexpected = || LockError::Backend {
            backend: BACKEND,
            reason: format!("unexpected answer to a read of {}", self.key),
        };
        let mut gets = resp.op_responses().into_iter().map(|op| match op {
            TxnOpResponse::Get(get) => Ok(get),
            _ => Err(unexpected()),
        });
        let doc_get = gets.next().ok_or_else(unexpected)??;
        let records_get = gets.next().ok_or_else(unexpected)??;
        let queue_get = match gets.next() {
            Some(get) => Some(get?),
            None if with_queue => return Err(unexpected()),
            None => None,
        };
        let (version, doc) = match doc_get.kvs().first() {
            None => (0, SemaphoreDoc::default()),
            Some(kv) => (kv.version(), self.parse_doc(kv.value())?),
        };
        let mut snap = Snapshot {
            revision,
            version,
            doc,
            records: HashMap::new(),
            queue: HashMap::new(),
        };
        for kv in records_get.kvs() {
            self.put_record(&mut snap, kv);
        }
        for kv in queue_get.iter().flat_map(|g| g.kvs()) {
            put_queue_entry(&mut snap, kv);
        }
        Ok(snap)
    }

    fn parse_doc(&self, value: &[u8]) -> Result<SemaphoreDoc, LockError> {
        SemaphoreDoc::parse(value).map_err(|e| match e {
            DocError::Corrupt(reason) => self.corrupt(value, reason),
            e => self.corrupt(value, e.to_string()),
        })
    }

    fn put_record(&self, snap: &mut Snapshot, kv: &KeyValue) {
        let key = String::from_utf8_lossy(kv.key()).into_owned();
        let record = match HolderRecord::parse(kv.value()) {
            Ok(r) => Some(r),
            Err(e) => {
                tracing::warn!(%key, error = %e, "ignoring a holder record that does not parse");
                None
            }
        };
        snap.records.insert(
            key,
            RecordEntry {
                record,
                mod_revision: kv.mod_revision(),
            },
        );
    }

    /// Apply watched events (document, records, queue) to `snap`. A document that does not parse
    /// is [`LockError::Corrupt`], as on a read.
    fn apply(&self, snap: &mut Snapshot, events: &[etcd_client::Event]) -> Result<(), LockError> {
        for event in events {
            let Some(kv) = event.kv() else { continue };
            let put = event.event_type() == EventType::Put;
            snap.revision = snap.revision.max(kv.mod_revision());
            let key = kv.key();
            if key == self.key.as_bytes() {
                (snap.version, snap.doc) = if put {
                    (kv.version(), self.parse_doc(kv.value())?)
                } else {
                    (0, SemaphoreDoc::default())
                };
            } else if key.starts_with(self.records_prefix.as_bytes()) {
                if put {
                    self.put_record(snap, kv);
                } else {
                    snap.records.remove(&*String::from_utf8_lossy(key));
                }
            } else if key.starts_with(self.queue_prefix.as_bytes()) {
                if put {
                    put_queue_entry(snap, kv);
                } else {
                    snap.queue.remove(&*String::from_utf8_lossy(key));
                }
            }
        }
        Ok(())
    }

    /// Run `ops` if the document is still at `snap`'s version and `extra` holds. Returns whether
    /// it ran.
    async fn commit(
        &self,
        snap: &Snapshot,
        extra: Vec<Compare>,
        ops: Vec<TxnOp>,
    ) -> Result<bool, LockError> {
        let mut compares = vec![Compare::version(
            self.key.clone(),
            CompareOp::Equal,
            snap.version,
        )];
        compares.extend(extra);
        let resp = self.txn(Txn::new().when(compares).and_then(ops)).await?;
        if !resp.succeeded() {
            tracing::debug!(key = %self.key, version = snap.version, "lost a race; reading again");
        }
        Ok(resp.succeeded())
    }

    fn put_doc(&self, doc: &SemaphoreDoc) -> TxnOp {
        TxnOp::put(self.key.clone(), doc.to_json(), None)
    }

    /// Deletes of the records read in `snap` whose holder is not in `after`: records of holders
    /// released in the same transaction and orphans left by `locksmithctl unlock`. Safe under
    /// the document's version: a record is only written while its holder is in the document.
    fn stale_record_deletes(&self, snap: &Snapshot, after: &SemaphoreDoc) -> Vec<TxnOp> {
        let live: Vec<String> = after.holders.iter().map(|h| self.record_key(h)).collect();
        let mut keys: Vec<&String> = snap.records.keys().filter(|k| !live.contains(k)).collect();
        keys.sort();
        keys.into_iter()
            .map(|k| TxnOp::delete(k.clone(), None))
            .collect()
    }

    /// Compare-and-swap loop for the calls other than `acquire`: `f` builds the operations
    /// from a fresh read (`None` = nothing to do).
    async fn update<F>(&self, what: &str, mut f: F) -> Result<(), LockError>
    where
        F: FnMut(&Snapshot) -> Result<Option<Vec<TxnOp>>, LockError>,
    {
        for _ in 0..MAX_CONFLICTS {
            let snap = self.read(false).await?;
            let Some(ops) = f(&snap)? else {
                return Ok(());
            };
            if self.commit(&snap, Vec::new(), ops).await? {
                return Ok(());
            }
        }
        Err(LockError::Backend {
            backend: BACKEND,
            reason: format!(
                "{what}: gave up after {MAX_CONFLICTS} conflicting updates of {}",
                self.key
            ),
        })
    }

    /// One session of `acquire`: read the document, the records and the queue; take a slot if
    /// one is free for my place in the queue; otherwise queue up and wait on one watch, deciding
    /// again on every change from the state the watch keeps, without a request.
    #[tracing::instrument(level = "debug", skip_all, fields(key = %self.key, id = %w.me.id))]
    async fn session(&self, w: &mut Waiting<'_>) -> Result<SessionEnd, LockError> {
        let mut snap = self.read(true).await?;
        // Whether a transaction on this very state failed: wait for the change that beat it.
        let mut tried = false;
        if let Step::Held = self.step(&snap, w, &mut tried).await? {
            return Ok(SessionEnd::Held);
        }
        // Queue up, then watch from the read on (the watch brings my own entry too).
        let mut registered = Some(self.register(&snap, w).await?);
        let mut watch = self.open_watch(snap.revision + 1).await?;
        let mut keep_alive: Option<KeepAlive> = None;
        let mut keep_alive_at = self.keep_alive_due(w);
        loop {
            let wake_at = match self.step(&snap, w, &mut tried).await? {
                Step::Held => return Ok(SessionEnd::Held),
                Step::Wait { wake_at } => wake_at,
            };
            self.log_waiting(&snap, w, wake_at);
            let wake = async {
                match wake_at {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = wake => {}
                () = tokio::time::sleep_until(keep_alive_at) => {
                    if !self.keep_alive(w, &mut keep_alive).await? {
                        self.lease_lost(w, &mut keep_alive, &mut registered);
                    }
                    keep_alive_at = self.keep_alive_due(w);
                }
                resp = keep_alive_response(&mut keep_alive) => match resp {
                    Ok(Some(r)) if r.ttl() <= 0 => {
                        self.lease_lost(w, &mut keep_alive, &mut registered);
                    }
                    Ok(Some(_)) => {}
                    Ok(None) => return Err(self.unreachable("lease keep-alive stream ended".into())),
                    Err(e) => return Err(self.classify(e)),
                },
                msg = watch.message() => match msg {
                    Ok(Some(resp)) => {
                        if resp.compact_revision() > 0 {
                            tracing::debug!(compact_revision = resp.compact_revision(), "watch start compacted; reading again");
                            return Ok(SessionEnd::Reread);
                        }
                        if resp.canceled() {
                            return Err(self.unreachable(format!("watch cancelled: {}", resp.cancel_reason())));
                        }
                        if !resp.events().is_empty() {
                            self.apply(&mut snap, resp.events())?;
                            tried = false;
                        }
                    }
                    Ok(None) => return Err(self.unreachable("watch stream ended".into())),
                    Err(e) => return Err(self.classify(e)),
                },
            }
            // My entry is gone (its lease expired while etcd was away, or someone deleted it):
            // queue up again, at the end.
            if let Some(put) = registered {
                if snap.revision >= put && !snap.queue.contains_key(&w.queue_key) {
                    tracing::warn!(key = %w.queue_key, "my queue entry is gone; queueing again");
                    registered = None;
                }
            }
            if registered.is_none() {
                registered = Some(self.register(&snap, w).await?);
                keep_alive_at = self.keep_alive_due(w);
            }
        }
    }

    /// Decide on `snap`: held already, or take a free slot when my place in the queue allows,
    /// or reclaim a stale holder (with `max_hold`), or wait.
    async fn step(
        &self,
        snap: &Snapshot,
        w: &mut Waiting<'_>,
        tried: &mut bool,
    ) -> Result<Step, LockError> {
        let me = w.me;
        if snap.doc.holds(&me.id) {
            tracing::debug!(key = %self.key, id = %me.id, "holding a slot");
            return Ok(Step::Held);
        }
        let now = jiff::Timestamp::now();
        let seen_now = Instant::now();
        w.first_seen.retain(|id, _| snap.doc.holds(id));
        for h in &snap.doc.holders {
            w.first_seen.entry(h.clone()).or_insert(seen_now);
        }

        // Stale holders (no progress for max_hold): any waiter may reclaim one.
        let mut wake_at = None;
        if let (Some(max_hold), false) = (self.max_hold, snap.doc.free() > 0) {
            let mut stalest: Option<(&String, Duration)> = None;
            for h in &snap.doc.holders {
                let record = snap
                    .records
                    .get(&self.record_key(h))
                    .and_then(|e| e.record.as_ref());
                let age = match record {
                    Some(r) => Duration::try_from(now.duration_since(r.since)).unwrap_or_default(),
                    None => w
                        .first_seen
                        .get(h)
                        .map(|t| seen_now.saturating_duration_since(*t))
                        .unwrap_or_default(),
                };
                if age >= max_hold {
                    if stalest.is_none_or(|(_, a)| age > a) {
                        stalest = Some((h, age));
                    }
                } else {
                    let at = seen_now + (max_hold - age);
                    wake_at = Some(wake_at.map_or(at, |w: Instant| w.min(at)));
                }
            }
            if let (Some((stale, age)), false) = (stalest, *tried) {
                if self.reclaim(snap, w, stale, age, max_hold, now).await? {
                    return Ok(Step::Held);
                }
                *tried = true;
            }
        }

        let ahead = self.ahead_of(snap, &w.queue_key).0;
        if snap.doc.free() > i64::try_from(ahead).unwrap_or(i64::MAX) && !*tried {
            if self.take(snap, w, now).await? {
                return Ok(Step::Held);
            }
            *tried = true;
        }
        Ok(Step::Wait { wake_at })
    }

    /// How many waiters are ahead of the entry `queue_key` (all of them when it is not in the
    /// queue yet), and whether it is. Entries of holders do not count (a holder's entry is
    /// deleted with the transaction that made it one; this covers any left by hand).
    fn ahead_of(&self, snap: &Snapshot, queue_key: &str) -> (usize, bool) {
        let holders: Vec<String> = snap
            .doc
            .holders
            .iter()
            .map(|h| document::waiter_key(&self.group, h))
            .collect();
        let mine = snap.queue.get(queue_key).map(|e| e.create_revision);
        let ahead = snap
            .queue
            .iter()
            .filter(|(k, _)| k.as_str() != queue_key && !holders.contains(k))
            .filter(|(k, e)| mine.is_none_or(|m| (e.create_revision, k.as_str()) < (m, queue_key)))
            .count();
        (ahead, mine.is_some())
    }

    /// Say what this waiter waits for, when that changed and its entry is in the queue.
    fn log_waiting(&self, snap: &Snapshot, w: &mut Waiting<'_>, wake_at: Option<Instant>) {
        let (ahead, queued) = self.ahead_of(snap, &w.queue_key);
        if !queued {
            return;
        }
        let position = ahead + 1;
        let state = (snap.doc.free(), snap.doc.holders.clone(), position);
        if w.last_logged.as_ref() == Some(&state) {
            return;
        }
        tracing::info!(
            key = %self.key,
            id = %w.me.id,
            free = snap.doc.free(),
            max = snap.doc.max,
            holders = ?snap.doc.holders,
            position,
            queued = snap.queue.len(),
            reclaim_check_in = ?wake_at.map(|at| at.saturating_duration_since(Instant::now())),
            "waiting for a free slot: position {position} in the queue"
        );
        w.last_logged = Some(state);
    }

    /// Take a free slot: the document, my holder record and the removal of my queue entry in one
    /// transaction guarded by the document's version.
    async fn take(
        &self,
        snap: &Snapshot,
        w: &Waiting<'_>,
        now: jiff::Timestamp,
    ) -> Result<bool, LockError> {
        let me = w.me;
        let mut doc = snap.doc.clone();
        doc.lock(&me.id)
            .map_err(|e| LockError::Refused(e.to_string()))?;
        let record = HolderRecord {
            node: me.node.clone(),
            boot_id: me.boot_id.clone(),
            phase: None,
            since: now,
            acquired: now,
            token: Some(me.token.clone()),
        };
        let mut ops = vec![
            self.put_doc(&doc),
            TxnOp::put(self.record_key(&me.id), record.to_json(), None),
        ];
        ops.extend(self.stale_record_deletes(snap, &doc));
        ops.push(TxnOp::delete(w.queue_key.clone(), None));
        if !self.commit(snap, Vec::new(), ops).await? {
            return Ok(false);
        }
        tracing::info!(
            key = %self.key,
            id = %me.id,
            free = doc.free(),
            max = doc.max,
            holders = ?doc.holders,
            waited = %now.duration_since(w.started).round(jiff::Unit::Millisecond).unwrap_or_default(),
            "took a slot"
        );
        Ok(true)
    }

    /// Take the slot of `stale` (no progress for `age` >= `max_hold`), in one transaction that
    /// also checks its record did not change since the read.
    async fn reclaim(
        &self,
        snap: &Snapshot,
        w: &Waiting<'_>,
        stale: &str,
        age: Duration,
        max_hold: Duration,
        now: jiff::Timestamp,
    ) -> Result<bool, LockError> {
        let me = w.me;
        let record_key = self.record_key(stale);
        let entry = snap.records.get(&record_key);
        let record = entry.and_then(|e| e.record.as_ref());
        tracing::warn!(
            key = %self.key,
            holder = %stale,
            node = record.map(|r| r.node.as_str()),
            phase = record.and_then(|r| r.phase.as_deref()),
            since = ?record.map(|r| r.since),
            no_progress_for = ?age,
            ?max_hold,
            by = %me.id,
            "RECLAIMING the slot of a stale holder: no progress for longer than lock.max_hold; \
             that node is assumed dead and its slot is taken over"
        );
        let guard = match entry {
            Some(e) => Compare::mod_revision(record_key, CompareOp::Equal, e.mod_revision),
            None => Compare::version(record_key, CompareOp::Equal, 0),
        };
        let mut doc = snap.doc.clone();
        doc.unlock(stale);
        let got = doc.lock(&me.id).is_ok();
        let mut ops = vec![self.put_doc(&doc)];
        if got {
            let record = HolderRecord {
                node: me.node.clone(),
                boot_id: me.boot_id.clone(),
                phase: None,
                since: now,
                acquired: now,
                token: Some(me.token.clone()),
            };
            ops.push(TxnOp::put(self.record_key(&me.id), record.to_json(), None));
            ops.push(TxnOp::delete(w.queue_key.clone(), None));
        }
        ops.extend(self.stale_record_deletes(snap, &doc));
        if !self.commit(snap, vec![guard], ops).await? {
            return Ok(false);
        }
        if got {
            tracing::warn!(key = %self.key, holder = %stale, by = %me.id, "reclaimed the slot of a stale holder");
        }
        // Not got (max forced below the holders): the stale holder is gone, the next state tells.
        Ok(got)
    }

    /// Put my queue entry under my lease (granting one when there is none or it expired), unless
    /// it is there under that lease already. Returns the revision of the put. A put keeps the
    /// key's create revision, so an entry left by my previous run keeps its place.
    async fn register(&self, snap: &Snapshot, w: &mut Waiting<'_>) -> Result<i64, LockError> {
        let existing = snap.queue.get(&w.queue_key);
        if let (Some(e), Some((lease, _))) = (existing, w.lease.lease) {
            if e.lease == lease {
                return Ok(e.mod_revision);
            }
        }
        let record = WaiterRecord {
            node: w.me.node.clone(),
            boot_id: w.me.boot_id.clone(),
            token: Some(w.me.token.clone()),
            since: existing
                .and_then(|e| e.record.as_ref())
                .map_or(w.started, |r| r.since),
        };
        for _ in 0..2 {
            let lease = match w.lease.lease {
                Some((id, _)) => id,
                None => self.grant(w).await?,
            };
            let mut kv = self.client.kv_client();
            let put = kv.put(
                w.queue_key.clone(),
                record.to_json(),
                Some(PutOptions::new().with_lease(lease)),
            );
            match tokio::time::timeout(self.timeouts.request, put).await {
                Err(_) => {
                    return Err(self.unreachable(format!(
                        "queueing: no answer within {:?}",
                        self.timeouts.request
                    )))
                }
                Ok(Ok(resp)) => {
                    let revision = resp.header().map(|h| h.revision()).unwrap_or_default();
                    tracing::debug!(key = %w.queue_key, lease, revision, kept_place = existing.is_some(), "queued");
                    return Ok(revision);
                }
                // gRPC NotFound: "requested lease not found" (it expired while etcd was away).
                Ok(Err(etcd_client::Error::GRpcStatus(status)))
                    if i32::from(status.code()) == 5 =>
                {
                    tracing::debug!(lease, "queue lease expired; granting a new one");
                    w.lease.lease = None;
                }
                Ok(Err(e)) => return Err(self.classify(e)),
            }
        }
        Err(LockError::Backend {
            backend: BACKEND,
            reason: format!("{}: a lease just granted was not found", w.queue_key),
        })
    }

    /// Grant the lease of my queue entry.
    async fn grant(&self, w: &mut Waiting<'_>) -> Result<i64, LockError> {
        let ttl = i64::try_from(self.timeouts.queue_ttl.as_millis().div_ceil(1000))
            .unwrap_or(i64::MAX)
            .max(1);
        let mut lease = self.client.lease_client();
        match tokio::time::timeout(self.timeouts.request, lease.grant(ttl, None)).await {
            Err(_) => Err(self.unreachable(format!(
                "granting a lease: no answer within {:?}",
                self.timeouts.request
            ))),
            Ok(Err(e)) => Err(self.classify(e)),
            Ok(Ok(resp)) => {
                let granted = Duration::from_secs(u64::try_from(resp.ttl()).unwrap_or(1).max(1));
                w.lease.lease = Some((resp.id(), granted));
                Ok(resp.id())
            }
        }
    }

    /// When my lease needs its next keep-alive: a third of its time to live from now.
    fn keep_alive_due(&self, w: &Waiting<'_>) -> Instant {
        let ttl = w
            .lease
            .lease
            .map_or(self.timeouts.queue_ttl, |(_, ttl)| ttl);
        Instant::now() + (ttl / 3).max(Duration::from_millis(300))
    }

    /// Send a keep-alive for my lease, opening the session's keep-alive stream the first time.
    /// `false` when the lease is gone.
    async fn keep_alive(
        &self,
        w: &Waiting<'_>,
        keep_alive: &mut Option<KeepAlive>,
    ) -> Result<bool, LockError> {
        let Some((id, _)) = w.lease.lease else {
            return Ok(false);
        };
        if let Some(k) = keep_alive {
            return match k.keeper.keep_alive().await {
                Ok(()) => Ok(true),
                Err(e) => Err(self.unreachable(format!("lease keep-alive: {e}"))),
            };
        }
        let mut lease = self.client.lease_client();
        match tokio::time::timeout(self.timeouts.request, lease.keep_alive(id)).await {
            Err(_) => Err(self.unreachable(format!(
                "lease keep-alive: no answer within {:?}",
                self.timeouts.request
            ))),
            Ok(Ok((keeper, stream))) => {
                *keep_alive = Some(KeepAlive { keeper, stream });
                Ok(true)
            }
            // What the client says when the server answers with a TTL of 0: lease not found.
            Ok(Err(etcd_client::Error::LeaseKeepAliveError(_))) => Ok(false),
            Ok(Err(e)) => Err(self.classify(e)),
        }
    }

    /// My lease expired: its entry went with it. Forget both; the session queues up again.
    fn lease_lost(
        &self,
        w: &mut Waiting<'_>,
        keep_alive: &mut Option<KeepAlive>,
        registered: &mut Option<i64>,
    ) {
        tracing::warn!(key = %w.queue_key, lease = ?w.lease.lease.map(|(id, _)| id), "the lease of my queue entry expired; queueing again");
        w.lease.lease = None;
        *keep_alive = None;
        *registered = None;
    }

    /// Open the watch of the queue and the document, and of the holder records before them when
    /// `max_hold` is set (reclaim decisions need their `since`; otherwise a holder's phase
    /// reports would wake every waiter for nothing): one key range, see [`super::document`].
    async fn open_watch(&self, revision: i64) -> Result<WatchStream, LockError> {
        let start = match self.max_hold {
            Some(_) => &self.records_prefix,
            None => &self.queue_prefix,
        };
        let mut end = self.key.clone().into_bytes();
        end.push(0);
        let options = WatchOptions::new()
            .with_range(end)
            .with_start_revision(revision);
        let mut watch = self.client.watch_client();
        match tokio::time::timeout(
            self.timeouts.request,
            watch.watch(start.clone(), Some(options)),
        )
        .await
        {
            Err(_) => Err(self.unreachable(format!(
                "opening a watch: no answer within {:?}",
                self.timeouts.request
            ))),
            Ok(Err(e)) => Err(self.classify(e)),
            Ok(Ok(s)) => Ok(s),
        }
    }
}

/// How a session of `acquire` ended well.
enum SessionEnd {
    Held,
    /// The watch cannot resume (compacted): read again, at once.
    Reread,
}

/// The next answer on the keep-alive stream, if one is open.
async fn keep_alive_response(
    keep_alive: &mut Option<KeepAlive>,
) -> Result<Option<etcd_client::LeaseKeepAliveResponse>, etcd_client::Error> {
    match keep_alive {
        Some(k) => k.stream.message().await,
        None => std::future::pending().await,
    }
}

fn put_queue_entry(snap: &mut Snapshot, kv: &KeyValue) {
    snap.queue.insert(
        String::from_utf8_lossy(kv.key()).into_owned(),
        QueueEntry {
            create_revision: kv.create_revision(),
            mod_revision: kv.mod_revision(),
            lease: kv.lease(),
            record: WaiterRecord::parse(kv.value()).ok(),
        },
    );
}

/// Whether `acquire` retries `e` (the cluster did not answer, or answered "not now").
fn retryable(e: &LockError) -> bool {
    matches!(e, LockError::Unreachable { .. })
}

/// Sort etcd client errors: connection trouble and "try again" answers are
/// [`LockError::Unreachable`]; the rest (permission denied, bad request...) is
/// [`LockError::Backend`]. The reason carries the causes tonic hides behind "transport error".
fn classify(target: &str, e: etcd_client::Error) -> LockError {
    use etcd_client::Error as E;
    use std::error::Error as _;
    let unreachable = |reason: String| LockError::Unreachable {
        backend: BACKEND,
        target: target.to_owned(),
        reason,
    };
    match e {
        E::TransportError(ref t) => unreachable(with_causes(&e.to_string(), Some(t))),
        E::IoError(_) | E::WatchError(_) | E::EndpointError(_) => unreachable(e.to_string()),
        E::GRpcStatus(ref status) => {
            let message = with_causes(status.message(), status.source());
            classify_grpc(target, i32::from(status.code()), &message)
        }
        other => LockError::Backend {
            backend: BACKEND,
            reason: format!("{target}: {other}"),
        },
    }
}

/// `message`, then each cause in `source`'s chain that it does not say already; when they show
/// that the endpoint answered with something else than HTTP/2 (an HTTP/1 server's status line
/// read as an HTTP/2 frame header is a frame "with invalid size"), say so first.
fn with_causes(message: &str, source: Option<&(dyn std::error::Error + 'static)>) -> String {
    let mut text = message.to_owned();
    let mut cause = source;
    while let Some(c) = cause {
        let t = c.to_string();
        if !t.is_empty() && !text.contains(&t) {
            text.push_str(": ");
            text.push_str(&t);
        }
        cause = c.source();
    }
    if text.contains("frame with invalid size") {
        format!("{NOT_GRPC}: {text}; {NOT_GRPC_HINT}")
    } else {
        text
    }
}

/// When a connection to etcd failed (not a time-out), ask each plain `http://` endpoint, in
/// HTTP/1 over a bare TCP connection, for `GET /version`: etcd serves that on its client port
/// (`{"etcdserver":...}`); another HTTP server answers something else. If one does, say so.
/// Anything else leaves `e` as it is.
async fn explain_wrong_protocol(e: LockError, endpoints: &[String], wait: Duration) -> LockError {
    let LockError::Unreachable {
        backend,
        target,
        reason,
    } = e
    else {
        return e;
    };
    if reason.starts_with(NOT_GRPC) || reason.contains("no answer within") {
        return LockError::Unreachable {
            backend,
            target,
            reason,
        };
    }
    for endpoint in endpoints {
        if let Some(line) = not_etcd_version(endpoint, wait).await {
            let which = if endpoints.len() > 1 {
                format!("{endpoint} ")
            } else {
                String::new()
            };
            return LockError::Unreachable {
                backend,
                target,
                reason: format!(
                    "{NOT_GRPC}: {which}answers HTTP/1 `GET /version` with `{line}` and no etcd \
                     version ({reason}); {NOT_GRPC_HINT}"
                ),
            };
        }
    }
    LockError::Unreachable {
        backend,
        target,
        reason,
    }
}

/// The status line of a plain `http://` endpoint's HTTP/1 answer to `GET /version` when it
/// answers within `wait` and the answer is not etcd's version document.
async fn not_etcd_version(endpoint: &str, wait: Duration) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    const MAX: usize = 8192;
    let url = url::Url::parse(endpoint).ok()?;
    if url.scheme() != "http" {
        return None;
    }
    let host = url.host_str()?;
    let port = url.port_or_known_default()?;
    let request = format!("GET /version HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    let deadline = Instant::now() + wait;
    let addr = host.trim_start_matches('[').trim_end_matches(']');
    let connect = tokio::net::TcpStream::connect((addr, port));
    let mut conn = tokio::time::timeout_at(deadline, connect)
        .await
        .ok()?
        .ok()?;
    tokio::time::timeout_at(deadline, conn.write_all(request.as_bytes()))
        .await
        .ok()?
        .ok()?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 1024];
    // Until the server closes, the answer is complete, or `wait` is over.
    while buf.len() < MAX && !http1_answer_complete(&buf) {
        match tokio::time::timeout_at(deadline, conn.read(&mut chunk)).await {
            Ok(Ok(n)) if n > 0 => buf.extend_from_slice(&chunk[..n]),
            _ => break,
        }
    }
    if !buf.starts_with(b"HTTP/") || buf.windows(10).any(|w| w == b"etcdserver") {
        return None;
    }
    let line = buf
        .split(|&b| b == b'\r' || b == b'\n')
        .next()
        .unwrap_or_default();
    Some(
        String::from_utf8_lossy(line)
            .chars()
            .filter(|c| !c.is_control())
            .take(80)
            .collect(),
    )
}

/// Whether `buf` holds an HTTP/1 answer's head and, when it has a `Content-Length`, its body.
fn http1_answer_complete(buf: &[u8]) -> bool {
    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
        return false;
    };
    let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
    let length = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse::<usize>().ok());
    length.is_some_and(|n| buf.len() >= end + 4 + n)
}

/// gRPC codes 1 cancelled, 2 unknown, 4 deadline exceeded, 8 resource exhausted, 10 aborted,
/// 13 internal and 14 unavailable (etcd's "leader changed", "request timed out") are worth a
/// retry; the others (permission denied, invalid argument...) are not.
fn classify_grpc(target: &str, code: i32, message: &str) -> LockError {
    match code {
        1 | 2 | 4 | 8 | 10 | 13 | 14 => LockError::Unreachable {
            backend: BACKEND,
            target: target.to_owned(),
            reason: message.to_owned(),
        },
        _ => LockError::Backend {
            backend: BACKEND,
            reason: format!("{target}: {message}"),
        },
    }
}

fn read_setting(path: &std::path::Path, key: &str) -> Result<Vec<u8>, LockError> {
    std::fs::read(path)
        .map_err(|e| LockError::Refused(format!("cannot read {key} {}: {e}", path.display())))
}

/// What connecting would refuse before sending anything: the endpoints (URLs with `http://`
/// or `https://` and a host), the TLS rules, the TLS files read and parsed, the password file.
/// For `rebootd --check-config`.
pub fn check_settings(settings: &config::Etcd) -> Result<(), LockError> {
    connect_options(settings, Timeouts::default())?;
    for e in &settings.endpoints {
        let parsed = url::Url::parse(e).map_err(|err| {
            LockError::Refused(format!("lock.etcd.endpoints: {e:?} is not a URL: {err}"))
        })?;
        if !matches!(parsed.scheme(), "http" | "https")
            || parsed.host_str().is_none_or(str::is_empty)
        {
            return Err(LockError::Refused(format!(
                "lock.etcd.endpoints: {e:?} is not an http:// or https:// URL with a host"
            )));
        }
    }
    if settings.ca_file.is_some() || settings.cert_file.is_some() {
        let tls = crate::http::TlsFiles {
            table: "lock.etcd",
            ca_file: settings.ca_file.clone(),
            client_cert: settings.cert_file.clone().zip(settings.key_file.clone()),
        };
        crate::http::client(true, &tls, Duration::from_secs(1))
            .map_err(|e| LockError::Refused(e.to_string()))?;
    }
    Ok(())
}

fn connect_options(
    settings: &config::Etcd,
    timeouts: Timeouts,
) -> Result<ConnectOptions, LockError> {
    if settings.endpoints.is_empty() {
        return Err(LockError::Refused("lock.etcd.endpoints is empty".into()));
    }
    let mut options = ConnectOptions::new()
        .with_connect_timeout(timeouts.connect)
        // Pings on open streams (the watch) notice a dead or frozen member. etcd refuses pings
        // more often than every 5 s.
        .with_keep_alive(Duration::from_secs(10), Duration::from_secs(5))
        .with_require_leader(true);

    let tls_wanted = settings.ca_file.is_some() || settings.cert_file.is_some();
    let plain = settings.endpoints.iter().find(|e| e.starts_with("http://"));
    let https = settings
        .endpoints
        .iter()
        .find(|e| e.starts_with("https://"));
    if tls_wanted {
        if let Some(e) = plain {
            return Err(LockError::Refused(format!(
                "lock.etcd: TLS files are set but endpoint {e} is plain http://; use https://"
            )));
        }
        let mut tls = TlsOptions::new();
        match &settings.ca_file {
            Some(ca) => {
                tls = tls.ca_certificate(Certificate::from_pem(read_setting(
                    ca,
                    "lock.etcd.ca_file",
                )?))
            }
            None => {
                return Err(LockError::Refused(
                    "lock.etcd.cert_file is set but lock.etcd.ca_file is not (system roots are \
                     not used)"
                        .into(),
                ))
            }
        }
        match (&settings.cert_file, &settings.key_file) {
            (Some(cert), Some(key)) => {
                tls = tls.identity(TlsIdentity::from_pem(
                    read_setting(cert, "lock.etcd.cert_file")?,
                    read_setting(key, "lock.etcd.key_file")?,
                ))
            }
            (None, None) => {}
            _ => {
                return Err(LockError::Refused(
                    "lock.etcd.cert_file and lock.etcd.key_file must be set together".into(),
                ))
            }
        }
        options = options.with_tls(tls);
    } else if let Some(e) = https {
        return Err(LockError::Refused(format!(
            "endpoint {e} is https:// but lock.etcd.ca_file is not set (system roots are not used)"
        )));
    }

    match (&settings.username, &settings.password_file) {
        (Some(user), Some(file)) => {
            let raw = read_setting(file, "lock.etcd.password_file")?;
            let password = String::from_utf8(raw).map_err(|_| {
                LockError::Refused(format!(
                    "lock.etcd.password_file {} is not UTF-8",
                    file.display()
                ))
            })?;
            let password = password.trim_end_matches(['\n', '\r']);
            if password.is_empty() {
                return Err(LockError::Refused(format!(
                    "lock.etcd.password_file {} is empty",
                    file.display()
                )));
            }
            options = options
                .with_user(user.clone(), password)
                .with_auto_token_refresh(true);
        }
        (None, None) => {}
        _ => {
            return Err(LockError::Refused(
                "lock.etcd.username and lock.etcd.password_file must be set together".into(),
            ))
        }
    }
    Ok(options)
}

#[async_trait]
impl Semaphore for EtcdSemaphore {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    /// Waits in the queue by watch (see the module documentation); retries an unreachable
    /// cluster with capped exponential backoff, keeping its place; returns at once on anything
    /// else (a corrupt document, permission denied). Cancelled (dropped), it revokes its queue
    /// entry's lease from a spawned task.
    #[tracing::instrument(skip(self, me), fields(key = %self.key, id = %me.id))]
    async fn acquire(&self, me: &Identity) -> Result<(), LockError> {
        let mut w = Waiting {
            me,
            queue_key: document::waiter_key(&self.group, &me.id),
            started: jiff::Timestamp::now(),
            first_seen: HashMap::new(),
            last_logged: None,
            lease: LeaseGuard {
                client: self.client.clone(),
                request: self.timeouts.request,
                lease: None,
            },
        };
        let mut backoff = self.timeouts.backoff_min;
        loop {
            let started = Instant::now();
            let failed = match self.session(&mut w).await {
                Ok(SessionEnd::Held) => return Ok(()),
                Ok(SessionEnd::Reread) => {
                    backoff = self.timeouts.backoff_min;
                    continue;
                }
                Err(e) => e,
            };
            if !retryable(&failed) {
                return Err(failed);
            }
            // A session that ran for a while was not part of a run of failures.
            if started.elapsed() > self.timeouts.backoff_max {
                backoff = self.timeouts.backoff_min;
            }
            tracing::warn!(error = %failed, retry_in = ?backoff, "etcd trouble while waiting for a slot; retrying");
            // Say again what we wait for once etcd answers.
            w.last_logged = None;
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(self.timeouts.backoff_max);
        }
    }

    #[tracing::instrument(skip(self, me), fields(key = %self.key, id = %me.id))]
    async fn fence(&self, me: &Identity) -> Result<Fence, LockError> {
        let snap = self.read(false).await?;
        Ok(self.fence_of(&snap, me))
    }

    fn heartbeat_every(&self) -> Option<Duration> {
        super::heartbeat_every(self.max_hold)
    }

    /// Writes my record again (a new revision of its key), if I hold my slot.
    #[tracing::instrument(skip(self, me), fields(key = %self.key, id = %me.id))]
    async fn heartbeat(&self, me: &Identity) -> Result<Fence, LockError> {
        let key = self.record_key(&me.id);
        let mut fence = Fence::Held;
        self.update("heartbeat", |snap| {
            fence = self.fence_of(snap, me);
            if fence != Fence::Held {
                return Ok(None);
            }
            let now = jiff::Timestamp::now();
            let previous = snap.records.get(&key).and_then(|e| e.record.as_ref());
            let record = HolderRecord {
                node: me.node.clone(),
                boot_id: me.boot_id.clone(),
                phase: previous.and_then(|p| p.phase.clone()),
                since: previous.map_or(now, |p| p.since),
                acquired: previous.map_or(now, |p| p.acquired),
                token: Some(me.token.clone()),
            };
            Ok(Some(vec![TxnOp::put(key.clone(), record.to_json(), None)]))
        })
        .await?;
        Ok(fence)
    }

    /// Releases my slot, unless the record says another host (another token) holds it.
    #[tracing::instrument(skip(self, me), fields(key = %self.key, id = %me.id))]
    async fn release(&self, me: &Identity) -> Result<(), LockError> {
        let snap = self.read(false).await?;
        if let Fence::Lost { why } = self.fence_of(&snap, me) {
            if snap.doc.holds(&me.id) {
                tracing::error!(key = %self.key, id = %me.id, %why, "not releasing a slot another host holds under this machine id");
                return Ok(());
            }
        }
        Admin::unlock(self, &me.id).await
    }

    /// Records the phase of a holder; `since` moves only when the phase or boot id changes. Not
    /// holding a slot is a no-op (there is nothing to annotate).
    #[tracing::instrument(skip(self, me), fields(key = %self.key, id = %me.id))]
    async fn report_phase(&self, me: &Identity, phase: &str) -> Result<(), LockError> {
        let key = self.record_key(&me.id);
        self.update("report phase", |snap| {
            if !snap.doc.holds(&me.id) {
                tracing::debug!(id = %me.id, phase, "not holding a slot; phase not recorded");
                return Ok(None);
            }
            let previous = snap.records.get(&key).and_then(|e| e.record.as_ref());
            if let Some(p) = previous {
                if p.phase.as_deref() == Some(phase) && p.boot_id == me.boot_id && p.node == me.node
                {
                    return Ok(None);
                }
            }
            let now = jiff::Timestamp::now();
            let record = HolderRecord {
                node: me.node.clone(),
                boot_id: me.boot_id.clone(),
                phase: Some(phase.to_owned()),
                since: now,
                acquired: previous.map_or(now, |p| p.acquired),
                token: Some(me.token.clone()),
            };
            Ok(Some(vec![TxnOp::put(key.clone(), record.to_json(), None)]))
        })
        .await
    }
}

#[async_trait]
impl Admin for EtcdSemaphore {
    #[tracing::instrument(skip(self), fields(key = %self.key))]
    async fn unlock(&self, id: &str) -> Result<(), LockError> {
        self.update("release", |snap| {
            let mut doc = snap.doc.clone();
            let held = doc.unlock(id);
            let mut ops = Vec::new();
            if held {
                ops.push(self.put_doc(&doc));
            }
            ops.extend(self.stale_record_deletes(snap, &doc));
            Ok((!ops.is_empty()).then_some(ops))
        })
        .await?;
        tracing::info!(key = %self.key, %id, "released");
        Ok(())
    }

    #[tracing::instrument(skip(self), fields(key = %self.key))]
    async fn status(&self) -> Result<SemaphoreStatus, LockError> {
        let snap = self.read(false).await?;
        let holders = snap
            .doc
            .holders
            .iter()
            .map(|id| {
                let record = snap
                    .records
                    .get(&self.record_key(id))
                    .and_then(|e| e.record.clone());
                Holder {
                    id: id.clone(),
                    node: record.as_ref().map(|r| r.node.clone()),
                    phase: record.as_ref().and_then(|r| r.phase.clone()),
                    since: record.as_ref().map(|r| r.since),
                    boot_id: record.map(|r| r.boot_id),
                }
            })
            .collect();
        Ok(SemaphoreStatus {
            backend: BACKEND.into(),
            group: self.group.clone(),
            max: snap.doc.max,
            free: snap.doc.free(),
            holders,
        })
    }

    #[tracing::instrument(skip(self), fields(key = %self.key))]
    async fn set_max(&self, max: u64, force: bool) -> Result<(), LockError> {
        self.update("set-max", |snap| {
            let mut doc = snap.doc.clone();
            doc.set_max(max, force).map_err(|e| match e {
                DocError::MaxBelowHolders { requested, holders } => {
                    LockError::MaxBelowHolders { requested, holders }
                }
                other => LockError::Refused(format!("set-max {max}: {other}")),
            })?;
            if doc == snap.doc && snap.version != 0 {
                return Ok(None);
            }
            if doc.free() < 0 {
                tracing::warn!(key = %self.key, max, holders = ?doc.holders, "set-max below the current holders (forced)");
            }
            Ok(Some(vec![self.put_doc(&doc)]))
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn settings(endpoints: &[&str]) -> config::Etcd {
        config::Etcd {
            api: config::EtcdApi::V3,
            endpoints: endpoints.iter().map(|s| s.to_string()).collect(),
            ca_file: None,
            cert_file: None,
            key_file: None,
            username: None,
            password_file: None,
        }
    }

    fn refused(r: Result<ConnectOptions, LockError>) -> String {
        match r {
            Err(LockError::Refused(m)) => m,
            Err(e) => panic!("expected Refused, got {e}"),
            Ok(_) => panic!("expected Refused, got options"),
        }
    }

    #[test]
    fn password_file_errors_name_the_file() {
        let mut s = settings(&["http://127.0.0.1:2379"]);
        s.username = Some("rebootd".into());
        s.password_file = Some(PathBuf::from("/nonexistent/etcd-password"));
        let m = refused(connect_options(&s, Timeouts::default()));
        assert!(m.contains("/nonexistent/etcd-password"), "{m}");
        assert!(m.contains("lock.etcd.password_file"), "{m}");

        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("pw");
        std::fs::write(&empty, "\n").unwrap();
        s.password_file = Some(empty.clone());
        let m = refused(connect_options(&s, Timeouts::default()));
        assert!(
            m.contains(&empty.display().to_string()) && m.contains("empty"),
            "{m}"
        );

        std::fs::write(&empty, "secret\n").unwrap();
        assert!(connect_options(&s, Timeouts::default()).is_ok());
    }

    #[test]
    fn tls_settings_are_checked() {
        let mut s = settings(&["https://10.0.0.5:2379"]);
        assert!(refused(connect_options(&s, Timeouts::default())).contains("ca_file"));
        s.ca_file = Some(PathBuf::from("/nonexistent/ca.pem"));
        let m = refused(connect_options(&s, Timeouts::default()));
        assert!(m.contains("/nonexistent/ca.pem"), "{m}");

        let mut s = settings(&["http://10.0.0.5:2379"]);
        s.ca_file = Some(PathBuf::from("/nonexistent/ca.pem"));
        assert!(refused(connect_options(&s, Timeouts::default())).contains("plain http"));

        assert!(refused(connect_options(&settings(&[]), Timeouts::default())).contains("empty"));
    }

    /// A one-shot HTTP/1 server answering `answer` and keeping the connection open.
    async fn http1_server(answer: String) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            let mut buf = [0u8; 1024];
            let _ = s.read(&mut buf).await;
            s.write_all(answer.as_bytes()).await.unwrap();
            tokio::time::sleep(Duration::from_secs(30)).await;
        });
        format!("http://{addr}")
    }

    #[tokio::test]
    async fn http1_servers_other_than_etcd_are_told_apart() {
        let wait = Duration::from_secs(5);
        let started = Instant::now();
        let body = r#"{"etcdserver":"3.5.17","etcdcluster":"3.5.0"}"#;
        let etcd = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        let endpoint = http1_server(etcd).await;
        assert_eq!(not_etcd_version(&endpoint, wait).await, None);
        let other =
            http1_server("HTTP/1.1 404 Not Found\r\nContent-Length: 9\r\n\r\nnot found".into())
                .await;
        assert_eq!(
            not_etcd_version(&other, wait).await.as_deref(),
            Some("HTTP/1.1 404 Not Found")
        );
        // Complete answers are not waited on until the server closes.
        assert!(started.elapsed() < wait, "{:?}", started.elapsed());
        assert_eq!(not_etcd_version("https://127.0.0.1:1", wait).await, None);

        assert!(!http1_answer_complete(
            b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nab"
        ));
        assert!(http1_answer_complete(
            b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nab"
        ));
        assert!(!http1_answer_complete(b"HTTP/1.1 200 OK\r\n"));
    }

    #[test]
    fn http2_framing_errors_name_the_likely_cause() {
        let m = with_causes(
            "h2 protocol error: connection error detected: frame with invalid size",
            None,
        );
        assert!(m.starts_with(NOT_GRPC) && m.ends_with(NOT_GRPC_HINT), "{m}");
        assert_eq!(with_causes("transport error", None), "transport error");
    }

    #[test]
    fn grpc_codes_are_sorted() {
        let e = classify_grpc("x:1", 14, "etcdserver: leader changed");
        assert!(matches!(e, LockError::Unreachable { .. }), "{e}");
        let e = classify_grpc("x:1", 7, "etcdserver: permission denied");
        assert!(matches!(e, LockError::Backend { .. }), "{e}");
        assert!(e.to_string().contains("permission denied"));
    }
}
