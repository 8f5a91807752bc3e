//! etcd v3 lock backend, compatible with locksmith. Owns the connection (TLS, user/password,
//! timeouts), the compare-and-swap transactions on locksmith's semaphore document, waiting for a
//! slot by watch, stale-holder reclaim and rebootd's per-holder records. The document format and
//! the key layout are in [`super::document`].
//!
//! Every write is one transaction guarded by `version(document key) == version read` (`== 0` to
//! create it), so a lost race is detected and retried on a fresh read, and a document that does
//! not parse is never written over: parsing happens before any write is built.

use std::collections::HashMap;
use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{
    Certificate, Client, Compare, CompareOp, ConnectOptions, GetOptions, Identity as TlsIdentity,
    TlsOptions, Txn, TxnOp, TxnOpResponse, TxnResponse, WatchOptions,
};
use tokio::time::Instant;

use super::document::{self, DocError, HolderRecord, SemaphoreDoc};
use super::{Holder, Identity, LockError, Semaphore, SemaphoreStatus};
use crate::config;

const BACKEND: &str = "etcd";
/// Compare-and-swap attempts before an update (other than `acquire`) gives up.
const MAX_CONFLICTS: usize = 64;
/// Longest document value quoted in a [`LockError::Corrupt`].
const QUOTE_MAX: usize = 2000;

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
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            connect: Duration::from_secs(5),
            request: Duration::from_secs(10),
            backoff_min: Duration::from_millis(100),
            backoff_max: Duration::from_secs(10),
        }
    }
}

/// locksmith's semaphore in etcd, plus rebootd's records about its holders.
pub struct EtcdSemaphore {
    client: Client,
    group: String,
    key: String,
    records_prefix: String,
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

/// The document and the records, read in one transaction (one revision).
#[derive(Debug, Clone)]
struct Snapshot {
    /// The store's revision at the read.
    revision: i64,
    /// The document key's version; 0 when absent (`doc` is then locksmith's default).
    version: i64,
    doc: SemaphoreDoc,
    /// By key.
    records: HashMap<String, RecordEntry>,
}

/// What one round of `acquire` ended with.
enum Round {
    Held,
    /// Lost a race: read again at once.
    Again,
    /// No slot: wait for the document to change after `revision`, or until `wake_at` (when a
    /// holder becomes reclaimable).
    Wait {
        revision: i64,
        wake_at: Option<Instant>,
    },
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
            target,
            max_hold,
            timeouts,
        };
        // The client connects lazily: make sure someone answers.
        this.probe().await?;
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

    /// Read the document and the records at one revision. A document that does not parse is
    /// [`LockError::Corrupt`].
    #[tracing::instrument(level = "debug", skip(self), fields(key = %self.key))]
    async fn read(&self) -> Result<Snapshot, LockError> {
        let txn = Txn::new().and_then([
            TxnOp::get(self.key.clone(), None),
            TxnOp::get(
                self.records_prefix.clone(),
                Some(GetOptions::new().with_prefix()),
            ),
        ]);
        let resp = self.txn(txn).await?;
        let revision = resp.header().map(|h| h.revision()).unwrap_or_default();
        let ops = resp.op_responses();
        let [TxnOpResponse::Get(doc_get), TxnOpResponse::Get(records_get)] = ops.as_slice() else {
            return Err(LockError::Backend {
                backend: BACKEND,
                reason: format!("unexpected answer to a read of {}", self.key),
            });
        };
        let (version, doc) = match doc_get.kvs().first() {
            None => (0, SemaphoreDoc::default()),
            Some(kv) => match SemaphoreDoc::parse(kv.value()) {
                Ok(doc) => (kv.version(), doc),
                Err(DocError::Corrupt(reason)) => return Err(self.corrupt(kv.value(), reason)),
                Err(e) => return Err(self.corrupt(kv.value(), e.to_string())),
            },
        };
        let mut records = HashMap::new();
        for kv in records_get.kvs() {
            let key = String::from_utf8_lossy(kv.key()).into_owned();
            let record = match HolderRecord::parse(kv.value()) {
                Ok(r) => Some(r),
                Err(e) => {
                    tracing::warn!(%key, error = %e, "ignoring a holder record that does not parse");
                    None
                }
            };
            records.insert(
                key,
                RecordEntry {
                    record,
                    mod_revision: kv.mod_revision(),
                },
            );
        }
        Ok(Snapshot {
            revision,
            version,
            doc,
            records,
        })
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
            let snap = self.read().await?;
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

    /// One round of `acquire`: read; take a free slot, or reclaim a stale one, or say what to
    /// wait for.
    async fn acquire_round(
        &self,
        me: &Identity,
        first_seen: &mut HashMap<String, Instant>,
        last_logged: &mut Option<(i64, Vec<String>)>,
    ) -> Result<Round, LockError> {
        let snap = self.read().await?;
        if snap.doc.holds(&me.id) {
            tracing::debug!(key = %self.key, id = %me.id, "holding a slot already");
            return Ok(Round::Held);
        }
        let now = jiff::Timestamp::now();
        let my_record = |acquired| HolderRecord {
            node: me.node.clone(),
            boot_id: me.boot_id.clone(),
            phase: None,
            since: now,
            acquired,
        };

        let mut doc = snap.doc.clone();
        if doc.free() > 0 {
            doc.lock(&me.id)
                .map_err(|e| LockError::Refused(e.to_string()))?;
            let mut ops = vec![
                self.put_doc(&doc),
                TxnOp::put(self.record_key(&me.id), my_record(now).to_json(), None),
            ];
            ops.extend(self.stale_record_deletes(&snap, &doc));
            if self.commit(&snap, Vec::new(), ops).await? {
                tracing::info!(key = %self.key, id = %me.id, free = doc.free(), max = doc.max, holders = ?doc.holders, "took a slot");
                return Ok(Round::Held);
            }
            return Ok(Round::Again);
        }

        // No free slot. Track since when this waiter sees each holder, for holders without a
        // record (locksmith's own nodes).
        let seen_now = Instant::now();
        first_seen.retain(|id, _| snap.doc.holds(id));
        for h in &snap.doc.holders {
            first_seen.entry(h.clone()).or_insert(seen_now);
        }

        let mut wake_at = None;
        if let Some(max_hold) = self.max_hold {
            let mut stalest: Option<(&String, Duration)> = None;
            for h in &snap.doc.holders {
                let record = snap
                    .records
                    .get(&self.record_key(h))
                    .and_then(|e| e.record.as_ref());
                let age = match record {
                    Some(r) => Duration::try_from(now.duration_since(r.since)).unwrap_or_default(),
                    None => first_seen
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
            if let Some((stale, age)) = stalest {
                return self.reclaim(&snap, me, stale, age, max_hold, now).await;
            }
        }

        let state = (doc.free(), doc.holders.clone());
        if last_logged.as_ref() != Some(&state) {
            tracing::info!(
                key = %self.key,
                id = %me.id,
                free = doc.free(),
                max = doc.max,
                holders = ?doc.holders,
                reclaim_check_in = ?wake_at.map(|w: Instant| w.saturating_duration_since(seen_now)),
                "waiting for a free slot"
            );
            *last_logged = Some(state);
        }
        Ok(Round::Wait {
            revision: snap.revision,
            wake_at,
        })
    }

    /// Take the slot of `stale` (no progress for `age` >= `max_hold`), in one transaction that
    /// also checks its record did not change since the read.
    async fn reclaim(
        &self,
        snap: &Snapshot,
        me: &Identity,
        stale: &str,
        age: Duration,
        max_hold: Duration,
        now: jiff::Timestamp,
    ) -> Result<Round, LockError> {
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
            };
            ops.push(TxnOp::put(self.record_key(&me.id), record.to_json(), None));
        }
        ops.extend(self.stale_record_deletes(snap, &doc));
        if !self.commit(snap, vec![guard], ops).await? {
            return Ok(Round::Again);
        }
        if got {
            tracing::warn!(key = %self.key, holder = %stale, by = %me.id, "reclaimed the slot of a stale holder");
            Ok(Round::Held)
        } else {
            Ok(Round::Again)
        }
    }

    /// Wait until the document changes after `revision` (by watch), or `wake_at`.
    #[tracing::instrument(level = "debug", skip(self), fields(key = %self.key))]
    async fn wait_for_change(
        &self,
        revision: i64,
        wake_at: Option<Instant>,
        me: &str,
    ) -> Result<(), LockError> {
        let mut watch = self.client.watch_client();
        let options = WatchOptions::new().with_start_revision(revision + 1);
        let mut stream = match tokio::time::timeout(
            self.timeouts.request,
            watch.watch(self.key.clone(), Some(options)),
        )
        .await
        {
            Err(_) => {
                return Err(self.unreachable(format!(
                    "opening a watch: no answer within {:?}",
                    self.timeouts.request
                )))
            }
            Ok(Err(e)) => return Err(self.classify(e)),
            Ok(Ok(s)) => s,
        };
        let wake = async {
            match wake_at {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(wake);
        loop {
            tokio::select! {
                () = &mut wake => return Ok(()),
                msg = stream.message() => match msg {
                    Ok(Some(resp)) => {
                        if resp.compact_revision() > 0 {
                            tracing::debug!(compact_revision = resp.compact_revision(), "watch start compacted; reading again");
                            return Ok(());
                        }
                        if resp.canceled() {
                            return Err(self.unreachable(format!("watch cancelled: {}", resp.cancel_reason())));
                        }
                        if let Some(event) = resp.events().last() {
                            // A change that leaves every slot taken (another waiter won one):
                            // waking up would only read the document again and open a new
                            // watch, for every waiter, on every change.
                            match still_full(event, me) {
                                Some(doc) => tracing::info!(
                                    key = %self.key,
                                    id = %me,
                                    free = doc.free(),
                                    max = doc.max,
                                    holders = ?doc.holders,
                                    "waiting for a free slot"
                                ),
                                None => return Ok(()),
                            }
                        }
                    }
                    Ok(None) => return Err(self.unreachable("watch stream ended".into())),
                    Err(e) => return Err(self.classify(e)),
                },
            }
        }
    }
}

/// Whether `acquire` retries `e` (the cluster did not answer, or answered "not now").
fn retryable(e: &LockError) -> bool {
    matches!(e, LockError::Unreachable { .. })
}

/// Sort etcd client errors: connection trouble and "try again" answers are
/// [`LockError::Unreachable`]; the rest (permission denied, bad request...) is
/// [`LockError::Backend`].
fn classify(target: &str, e: etcd_client::Error) -> LockError {
    use etcd_client::Error as E;
    let unreachable = |reason: String| LockError::Unreachable {
        backend: BACKEND,
        target: target.to_owned(),
        reason,
    };
    match e {
        E::TransportError(_) | E::IoError(_) | E::WatchError(_) | E::EndpointError(_) => {
            unreachable(e.to_string())
        }
        E::GRpcStatus(ref status) => {
            classify_grpc(target, i32::from(status.code()), status.message())
        }
        other => LockError::Backend {
            backend: BACKEND,
            reason: format!("{target}: {other}"),
        },
    }
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

    /// Waits by watch; retries an unreachable cluster with capped exponential backoff; returns
    /// at once on anything else (a corrupt document, permission denied).
    #[tracing::instrument(skip(self, me), fields(key = %self.key, id = %me.id))]
    async fn acquire(&self, me: &Identity) -> Result<(), LockError> {
        let mut backoff = self.timeouts.backoff_min;
        let mut first_seen = HashMap::new();
        let mut last_logged = None;
        loop {
            let failed = match self
                .acquire_round(me, &mut first_seen, &mut last_logged)
                .await
            {
                Ok(Round::Held) => return Ok(()),
                Ok(Round::Again) => {
                    backoff = self.timeouts.backoff_min;
                    continue;
                }
                Ok(Round::Wait { revision, wake_at }) => {
                    match self.wait_for_change(revision, wake_at, &me.id).await {
                        Ok(()) => {
                            backoff = self.timeouts.backoff_min;
                            continue;
                        }
                        Err(e) => e,
                    }
                }
                Err(e) => e,
            };
            if !retryable(&failed) {
                return Err(failed);
            }
            tracing::warn!(error = %failed, retry_in = ?backoff, "etcd trouble while waiting for a slot; retrying");
            // Say again what we wait for once etcd answers.
            last_logged = None;
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(self.timeouts.backoff_max);
        }
    }

    #[tracing::instrument(skip(self), fields(key = %self.key))]
    async fn release(&self, id: &str) -> Result<(), LockError> {
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
    async fn holds(&self, id: &str) -> Result<bool, LockError> {
        Ok(self.read().await?.doc.holds(id))
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
            };
            Ok(Some(vec![TxnOp::put(key.clone(), record.to_json(), None)]))
        })
        .await
    }

    #[tracing::instrument(skip(self), fields(key = %self.key))]
    async fn status(&self) -> Result<SemaphoreStatus, LockError> {
        let snap = self.read().await?;
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

/// The new document when a watched change leaves no slot for `me`: it parses, has no free slot
/// and does not list `me`. Anything else (a delete, a document that does not parse, a free slot)
/// is worth a fresh read: None.
fn still_full(event: &etcd_client::Event, me: &str) -> Option<SemaphoreDoc> {
    if event.event_type() != etcd_client::EventType::Put {
        return None;
    }
    event
        .kv()
        .and_then(|kv| SemaphoreDoc::parse(kv.value()).ok())
        .filter(|doc| doc.free() <= 0 && !doc.holds(me))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn settings(endpoints: &[&str]) -> config::Etcd {
        config::Etcd {
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

    #[test]
    fn grpc_codes_are_sorted() {
        let e = classify_grpc("x:1", 14, "etcdserver: leader changed");
        assert!(matches!(e, LockError::Unreachable { .. }), "{e}");
        let e = classify_grpc("x:1", 7, "etcdserver: permission denied");
        assert!(matches!(e, LockError::Backend { .. }), "{e}");
        assert!(e.to_string().contains("permission denied"));
    }
}
