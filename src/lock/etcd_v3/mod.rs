//! Lock store `[lock.etcd] api = "v3"` (the default): locksmith's semaphore document in etcd v3,
//! rebootd's holder records and FIFO waiter queue beside it (keys: docs/etcd-security.md). An
//! adapter on the lock core: it reads a view (the document, the records and the queue in one
//! transaction, [`snapshot`]), commits the arbiter's decisions by compare-and-swap on the
//! document key's mod revision (`== 0` to create it), and waits by one watch of the group's keys
//! ([`waiting`]; a waiter's queue entry lives under an etcd lease it keeps alive, and its create
//! revision is its ticket). A document that does not parse is never written over: parsing happens
//! before any write is built. A phase report writes only the holder's own record, guarded by that
//! record's revision ([`report`]). Holder liveness is the lock core's (`lock::view::Observations`:
//! a record's revision unchanged for `max_hold` of the waiter's own clock); a reclaim compares that
//! revision too, so a holder that beats at the last moment keeps its slot.

mod import;
mod lease_guard;
mod marker;
pub mod members;
mod pause;
mod report;
mod share;
pub mod snapshot;
pub(in crate::lock) mod waiting;
#[cfg(test)]
mod wake_tests;

use crate::lock::Backend;
use crate::state::Phase;
use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{Client, Compare, CompareOp, GetOptions, Txn, TxnOp, TxnOpResponse, TxnResponse};

use super::document::{HolderRecord, SemaphoreDoc};
use super::holding;
use super::retry::{cas_loop, Cas};
use super::{
    Acquired, Admin, Fence, GroupPause, Identity, LockError, Reported, Semaphore, SemaphoreStatus,
};
pub use crate::clients::etcd_v3::{check_settings, Timeouts};
use crate::clients::etcd_v3::{classify, connect_options, explain_wrong_protocol, BACKEND};
use crate::config;
pub use import::Import;
use snapshot::{Keys, Kv, Snapshot};

/// locksmith's semaphore in etcd, plus rebootd's records about its holders and its waiters.
pub struct EtcdSemaphore {
    client: Client,
    keys: Keys,
    /// The endpoints, for error messages.
    target: String,
    max_hold: Option<Duration>,
    /// `lock.max_per_zone`: at most this many holders in one zone.
    max_per_zone: Option<u64>,
    /// `lock.max = "N%"`: the slots are this share of the known nodes ([`Self::share`]).
    max_percent: Option<u8>,
    timeouts: Timeouts,
    /// My record as this process last wrote it (see [`report`]).
    written: report::Written,
    /// The pause as `group_pause` last read it, for the wait that follows ([`pause`]).
    last_pause: super::pause::LastRead<i64>,
}

impl std::fmt::Debug for EtcdSemaphore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdSemaphore")
            .field("target", &self.target)
            .field("group", &self.keys.group)
            .field("key", &self.keys.doc)
            .field("max_hold", &self.max_hold)
            .finish_non_exhaustive()
    }
}

impl EtcdSemaphore {
    /// With at most `max_per_zone` holders in one zone (`lock.max_per_zone`; the zones are
    /// those the holders' records and the waiters' entries claim, mine is [`Identity::zone`]).
    pub fn with_max_per_zone(mut self, max_per_zone: Option<u64>) -> Self {
        self.max_per_zone = max_per_zone;
        self
    }

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
        let within = timeouts.connect + timeouts.request;
        let client =
            match tokio::time::timeout(within, Client::connect(&settings.endpoints, Some(options)))
                .await
            {
                Err(_) => {
                    return Err(LockError::Unreachable {
                        backend: BACKEND,
                        target,
                        reason: format!("no answer within {within:?}"),
                    })
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
            keys: Keys::new(group),
            target,
            max_hold,
            max_per_zone: None,
            max_percent: None,
            timeouts,
            written: report::Written::default(),
            last_pause: super::pause::LastRead::default(),
        };
        // The client connects lazily: make sure someone answers, and say what else did. The
        // answer is the semaphore, kept a moment for the first call's first attempt (after a
        // boot: the report a new process makes at once, which then reads nothing). A document
        // that does not parse is the calls' to refuse, each saying what it was for.
        match this.read(false).await {
            Ok(snap) => this.written.keep_read(snap),
            Err(e @ LockError::Corrupt { .. }) => {
                tracing::debug!(error = %e, "connected; the semaphore does not parse")
            }
            Err(e) => {
                return Err(explain_wrong_protocol(e, &settings.endpoints, timeouts.connect).await)
            }
        }
        Ok(this)
    }

    /// The key of locksmith's document this semaphore uses.
    pub fn key(&self) -> &str {
        &self.keys.doc
    }

    /// The prefix of rebootd's holder records.
    pub fn records_prefix(&self) -> &str {
        &self.keys.records
    }

    /// The prefix of rebootd's queue of waiters.
    pub fn queue_prefix(&self) -> &str {
        &self.keys.queue
    }

    pub fn group(&self) -> &str {
        &self.keys.group
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
                reason: format!("{reason} (key {})", self.keys.doc),
            },
            other => other,
        }
    }

    /// A watch of the keys from `first` through `last` that etcd cancelled (`reason`). Refused
    /// for permissions, the user's role lacks read on part of that range (etcd allows a watch
    /// only on keys the user may all read, so read on each key alone is not enough): permanent,
    /// since every retry would be refused the same way. Anything else is transient.
    fn watch_cancelled(&self, first: &str, last: &str, reason: &str) -> LockError {
        if reason.contains("permission denied") {
            return LockError::Backend {
                backend: BACKEND,
                reason: format!(
                    "{}: permission denied watching the keys from {first} through {last}: the \
                     user's role needs read on that whole range, not only on each key \
                     (docs/etcd-security.md); etcd said: {reason}",
                    self.target
                ),
            };
        }
        self.unreachable(format!("watch cancelled: {reason}"))
    }

    fn parse_doc(&self, value: &[u8]) -> Result<SemaphoreDoc, LockError> {
        self.keys.parse_doc(value)
    }

    fn record_key(&self, id: &str) -> String {
        self.keys.record(id)
    }

    /// `fut` within the request time limit, its error sorted.
    async fn request<T>(
        &self,
        what: &str,
        fut: impl std::future::Future<Output = Result<T, etcd_client::Error>>,
    ) -> Result<T, LockError> {
        match tokio::time::timeout(self.timeouts.request, fut).await {
            Err(_) => Err(self.unreachable(format!(
                "{what}no answer within {:?}",
                self.timeouts.request
            ))),
            Ok(Err(e)) => Err(self.classify(e)),
            Ok(Ok(r)) => Ok(r),
        }
    }

    /// Whether `snap` says `me` holds its slot, under its own token.
    fn holds_on(&self, snap: &Snapshot, me: &Identity) -> bool {
        snap.fence(&self.keys, &me.as_me()) == Fence::Held
    }

    async fn txn(&self, txn: Txn) -> Result<TxnResponse, LockError> {
        let mut kv = self.client.kv_client();
        self.request("", kv.txn(txn)).await
    }

    /// Read the document and the records (and the queue when `with_queue`) at one revision. A
    /// document that does not parse is [`LockError::Corrupt`].
    #[tracing::instrument(level = "debug", skip(self), fields(key = %self.keys.doc))]
    async fn read(&self, with_queue: bool) -> Result<Snapshot, LockError> {
        self.read_with(with_queue, with_queue && self.max_percent.is_some())
            .await
    }

    /// A waiter's [`Self::read`]: with the queue, and when it has an entry (created at
    /// revision `mine`), only the entries up to it. Those created after mine are behind me and
    /// decide nothing of mine (the arbiter counts the waiters ahead), so the read costs bytes
    /// for my place in the queue, not for the queue.
    async fn read_waiter(&self, mine: Option<i64>) -> Result<Snapshot, LockError> {
        let mut gets = self.read_ops(false, self.max_percent.is_some());
        gets.extend(self.queue_ops(mine));
        let expected = gets.len();
        let resp = self.txn(Txn::new().and_then(gets)).await?;
        self.snapshot_of(&resp, expected)
    }

    /// [`Self::read`], with the fleet member records when `members` (to count the nodes).
    async fn read_with(&self, with_queue: bool, members: bool) -> Result<Snapshot, LockError> {
        let gets = self.read_ops(with_queue, members);
        let expected = gets.len();
        let resp = self.txn(Txn::new().and_then(gets)).await?;
        self.snapshot_of(&resp, expected)
    }

    /// The reads of [`Self::read`]: the document, the records, and the queue and the group's
    /// pause when `with_queue` (what a waiter follows), and the fleet member records when
    /// `members`.
    fn read_ops(&self, with_queue: bool, members: bool) -> Vec<TxnOp> {
        let prefix = |p: &str| TxnOp::get(p.to_owned(), Some(GetOptions::new().with_prefix()));
        let mut gets = vec![
            TxnOp::get(self.keys.doc.clone(), None),
            prefix(&self.keys.records),
        ];
        if with_queue {
            gets.extend(self.queue_ops(None));
        }
        if members {
            gets.push(prefix(&self.keys.members));
        }
        gets
    }

    /// The reads of the queue (up to the entry created at revision `upto`, when given) and the
    /// group's pause: what a waiter follows.
    fn queue_ops(&self, upto: Option<i64>) -> [TxnOp; 2] {
        let mut queue = GetOptions::new().with_prefix();
        if let Some(upto) = upto {
            queue = queue.with_max_create_revision(upto);
        }
        [
            TxnOp::get(self.keys.queue.clone(), Some(queue)),
            TxnOp::get(self.keys.pause.clone(), None),
        ]
    }

    /// The snapshot in the answer to a transaction whose branch taken was [`Self::read_ops`]
    /// (`expected` reads).
    fn snapshot_of(&self, resp: &TxnResponse, expected: usize) -> Result<Snapshot, LockError> {
        let revision = resp.header().map(|h| h.revision()).unwrap_or_default();
        let mut snap = Snapshot::empty(revision);
        let mut answered = 0;
        for op in resp.op_responses() {
            let TxnOpResponse::Get(get) = op else {
                continue;
            };
            answered += 1;
            for kv in get.kvs() {
                snap.put(&self.keys, &Kv::from(kv))?;
            }
        }
        if answered != expected {
            return Err(LockError::Backend {
                backend: BACKEND,
                reason: format!("unexpected answer to a read of {}", self.keys.doc),
            });
        }
        Ok(snap)
    }

    /// Run `ops` if the document is still at `snap`'s mod revision and `extra` holds. Returns
    /// whether it ran.
    async fn commit(
        &self,
        snap: &Snapshot,
        extra: Vec<Compare>,
        ops: Vec<TxnOp>,
    ) -> Result<bool, LockError> {
        Ok(self.commit_at(snap, extra, ops).await?.is_some())
    }

    /// [`Self::commit`], giving the revision it wrote at when it ran.
    async fn commit_at(
        &self,
        snap: &Snapshot,
        extra: Vec<Compare>,
        ops: Vec<TxnOp>,
    ) -> Result<Option<i64>, LockError> {
        let mut compares = vec![Compare::mod_revision(
            self.keys.doc.clone(),
            CompareOp::Equal,
            snap.doc_revision,
        )];
        compares.extend(extra);
        let written = self.commit_when(compares, ops).await?;
        if written.is_none() {
            tracing::debug!(key = %self.keys.doc, revision = snap.doc_revision, "lost a race");
        }
        Ok(written)
    }

    /// Run `ops` if `compares` hold; the revision it wrote at when it ran.
    async fn commit_when(
        &self,
        compares: Vec<Compare>,
        ops: Vec<TxnOp>,
    ) -> Result<Option<i64>, LockError> {
        let resp = self.txn(Txn::new().when(compares).and_then(ops)).await?;
        Ok(resp
            .succeeded()
            .then(|| resp.header().map(|h| h.revision()).unwrap_or_default()))
    }

    fn put_doc(&self, doc: &SemaphoreDoc) -> TxnOp {
        TxnOp::put(self.keys.doc.clone(), doc.to_json(), None)
    }

    /// Deletes of the orphan records in `snap` once the document is `after`.
    fn stale_record_deletes(&self, snap: &Snapshot, after: &SemaphoreDoc) -> Vec<TxnOp> {
        snap.stale_records(&self.keys, after)
            .into_iter()
            .map(|k| TxnOp::delete(k, None))
            .collect()
    }

    /// The record `me` writes on its slot: `phase` when given (`since` moves when it or the boot
    /// changes), else the one in `snap`.
    fn my_record(&self, snap: &Snapshot, me: &Identity, phase: Option<&str>) -> HolderRecord {
        HolderRecord::after(snap.record(&self.keys, &me.id), me, phase.map(Some))
    }

    /// A compare that the record of `id` is as in `snap` (absent: still absent).
    fn record_unchanged(&self, snap: &Snapshot, id: &str) -> Compare {
        let key = self.record_key(id);
        let revision = snap.records.get(&key).map_or(0, |e| e.mod_revision);
        Compare::mod_revision(key, CompareOp::Equal, revision)
    }

    /// One attempt of an update other than `acquire`: `f` builds the operations from `snap`, or
    /// from a fresh read when there is none (`None` = nothing to do).
    async fn try_update<F>(&self, snap: Option<Snapshot>, f: &mut F) -> Result<Cas<()>, LockError>
    where
        F: FnMut(&Snapshot) -> Result<Option<Vec<TxnOp>>, LockError> + Send,
    {
        let snap = match snap {
            Some(s) => s,
            None => self.read(false).await?,
        };
        let Some(ops) = f(&snap)? else {
            return Ok(Cas::Done(()));
        };
        Ok(match self.commit(&snap, Vec::new(), ops).await? {
            true => Cas::Done(()),
            false => Cas::Conflict,
        })
    }

    /// The compare-and-swap loop of the calls other than `acquire`.
    async fn update<F>(&self, what: &str, f: F) -> Result<(), LockError>
    where
        F: FnMut(&Snapshot) -> Result<Option<Vec<TxnOp>>, LockError> + Send,
    {
        self.update_from(what, None, f).await
    }

    /// [`EtcdSemaphore::update`], its first attempt on `first` (a read just made) when given:
    /// the commit compares the document's mod revision, so a stale one only costs a retry.
    async fn update_from<F>(
        &self,
        what: &str,
        mut first: Option<Snapshot>,
        mut f: F,
    ) -> Result<(), LockError>
    where
        F: FnMut(&Snapshot) -> Result<Option<Vec<TxnOp>>, LockError> + Send,
    {
        cas_loop!(
            BACKEND,
            what,
            &self.keys.doc,
            self.try_update(first.take(), &mut f).await
        )
    }

    /// Give the slot of `id` back (and delete orphan records), first on `first`.
    async fn unlock_from(&self, id: &str, first: Option<Snapshot>) -> Result<(), LockError> {
        self.update_from("release", first, |snap| {
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
        tracing::info!(key = %self.keys.doc, %id, "released");
        Ok(())
    }
}

#[async_trait]
impl Semaphore for EtcdSemaphore {
    fn backend(&self) -> Backend {
        BACKEND
    }

    /// The lock core's acquire loop over this store. Cancelled
    /// (dropped), it revokes its queue entry's lease from a spawned task.
    #[tracing::instrument(skip(self, me), fields(key = %self.keys.doc, id = %me.id))]
    async fn acquire(&self, me: &Identity) -> Result<(), LockError> {
        waiting::acquire(self, me).await
    }

    /// The pause is read and watched with the semaphore: no request of its own.
    #[tracing::instrument(skip(self, me, first), fields(key = %self.keys.doc, id = %me.id))]
    async fn acquire_unless_paused(
        &self,
        me: &Identity,
        first: Phase,
    ) -> Result<Acquired, LockError> {
        waiting::acquire_unless_paused(self, me, first).await
    }

    #[tracing::instrument(skip(self, me), fields(key = %self.keys.doc, id = %me.id))]
    async fn fence(&self, me: &Identity) -> Result<Fence, LockError> {
        let snap = self.read(false).await?;
        Ok(snap.fence(&self.keys, &me.as_me()))
    }

    fn heartbeat_every(&self) -> Option<Duration> {
        super::heartbeat_every(self.max_hold)
    }

    /// Writes my record again (a new revision of its key), if I hold my slot.
    #[tracing::instrument(skip(self, me), fields(key = %self.keys.doc, id = %me.id))]
    async fn heartbeat(&self, me: &Identity) -> Result<Fence, LockError> {
        self.written.forget();
        let key = self.record_key(&me.id);
        let mut fence = Fence::Held;
        self.update("heartbeat", |snap| {
            fence = snap.fence(&self.keys, &me.as_me());
            if fence != Fence::Held {
                return Ok(None);
            }
            let record = self.my_record(snap, me, None);
            Ok(Some(vec![TxnOp::put(key.clone(), record.to_json(), None)]))
        })
        .await?;
        Ok(fence)
    }

    /// Releases my slot, unless the record says another host (another token) holds it.
    #[tracing::instrument(skip(self, me), fields(key = %self.keys.doc, id = %me.id))]
    async fn release(&self, me: &Identity) -> Result<(), LockError> {
        // The semaphore as a report read it a moment ago (see `report`), or a read now.
        // Only a read that says I hold it: one that says otherwise is not acted on unread.
        let recent = self.written.recent().filter(|s| self.holds_on(s, me));
        self.written.forget();
        let snap = match recent {
            Some(snap) => snap,
            None => self.read(false).await?,
        };
        let view = snap.view(&self.keys, Some(&me.as_me()));
        if let Err(why) = holding::release(&view, &me.as_me(), &self.keys.doc) {
            tracing::error!(key = %self.keys.doc, id = %me.id, %why, "not releasing a slot another host holds under this machine id");
            return Ok(());
        }
        self.unlock_from(&me.id, Some(snap)).await
    }

    /// Records the phase of a holder; `since` moves only when the phase or boot id changes. Not
    /// holding a slot is a no-op (there is nothing to annotate). One request when my record is
    /// as I last wrote it ([`report`]).
    #[tracing::instrument(skip(self, me), fields(key = %self.keys.doc, id = %me.id))]
    async fn report_phase(&self, me: &Identity, phase: Phase) -> Result<Reported, LockError> {
        self.report(me, phase.as_str()).await
    }

    fn fleet(&self) -> Option<&dyn crate::fleet::FleetStore> {
        Some(self)
    }
}

#[async_trait]
impl Admin for EtcdSemaphore {
    async fn pause_group(&self, pause: &GroupPause) -> Result<(), LockError> {
        self.put_pause(pause).await
    }

    async fn resume_group(&self) -> Result<(), LockError> {
        self.delete_pause().await
    }

    fn fleet(&self) -> Option<&dyn crate::fleet::FleetStore> {
        Some(self)
    }

    #[tracing::instrument(skip(self), fields(key = %self.keys.doc))]
    async fn unlock(&self, id: &str) -> Result<(), LockError> {
        self.unlock_from(id, None).await
    }

    #[tracing::instrument(skip(self), fields(key = %self.keys.doc))]
    async fn status(&self) -> Result<SemaphoreStatus, LockError> {
        // With a share, the queue too: waiters without a record count as the waiters see them.
        let counting = self.max_percent.is_some();
        let snap = self.read_with(counting, counting).await?;
        let mut view = snap.view(&self.keys, None);
        let share = self.share(&snap);
        view.max = self.effective_max(&snap);
        let mut status = view.status(BACKEND, &self.keys.group);
        status.share = share;
        Ok(status)
    }

    #[tracing::instrument(skip(self), fields(key = %self.keys.doc))]
    async fn set_max(&self, max: u64, force: bool) -> Result<(), LockError> {
        self.update("set-max", |snap| {
            let mut doc = snap.doc.clone();
            super::holding::may_set_max(max, doc.holders.len(), force)?;
            doc.set_max(max)
                .map_err(|e| LockError::Refused(format!("set-max {max}: {e}")))?;
            if doc == snap.doc && snap.doc_revision != 0 {
                return Ok(None);
            }
            if doc.free() < 0 {
                tracing::warn!(key = %self.keys.doc, max, holders = ?doc.holders, "set-max below the current holders (forced)");
            }
            Ok(Some(vec![self.put_doc(&doc)]))
        })
        .await
    }
}
