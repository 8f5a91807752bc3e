//! Lock store `[lock.etcd] api = "v2"`: locksmith's own semaphore in etcd's v2 keys API, shared
//! with real locksmithd nodes. An adapter on the lock core: it reads a view (one recursive read
//! of the group's directory, see [`tree`]), commits the arbiter's decisions by compare-and-swap
//! on the document's `modifiedIndex` (`prevIndex`, or `prevExist=false` to create it, as
//! locksmith does), and waits by long-poll watch ([`waiting`]).
//!
//! v2 has no multi-key transactions, so only the document is guarded: rebootd's holder record
//! is written right after the compare-and-swap that took the slot, and deleted (by its own
//! index) after the one that gave it back. A record without a holder is an orphan anyone may
//! delete; a holder without a record (locksmith's, or a rebootd that died in between) is shown
//! by its machine id and, for its own host, adopted.
//!
//! When `rebootctl migrate` has moved the semaphore to v3 ([`tree::is_moved`]), every call
//! answers [`LockError::Moved`]; [`super::etcd::EtcdStore`] then goes on in v3.

mod connect;
mod members;
mod pause;
mod share;
pub mod tree;
mod update;
pub(in crate::lock) mod waiting;

use crate::lock::Backend;
use crate::state::Phase;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use super::document::{HolderRecord, SemaphoreDoc};
use super::holding;
use super::recent::Recent;
use super::retry::{cas_loop, Cas};
use super::{
    Acquired, Admin, Fence, GroupPause, Identity, LockError, Reported, Semaphore, SemaphoreStatus,
};
use crate::clients::etcd_v2::{Get, KeysClient, Node, Put, V2Error};
use crate::config;
pub use connect::{client_settings, lock_error};
use tree::{DocState, Keys, Snapshot};

const BACKEND: Backend = Backend::Etcd;

/// Time limits of the v2 store beyond the client's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    pub client: crate::clients::etcd_v2::Timeouts,
    /// First pause after a transient error inside `acquire`, doubled up to `backoff_max`.
    pub backoff_min: Duration,
    pub backoff_max: Duration,
    /// Time to live of a waiter's queue entry, refreshed every third of it while it waits (two
    /// thirds far back, `lock::acquire::beat_due`): the longest a waiter that died without a
    /// word holds up the queue.
    pub queue_ttl: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            client: crate::clients::etcd_v2::Timeouts::default(),
            backoff_min: Duration::from_millis(100),
            backoff_max: Duration::from_secs(10),
            queue_ttl: Duration::from_secs(30),
        }
    }
}

/// locksmith's semaphore in etcd v2, plus rebootd's records and waiter queue beside it.
pub struct EtcdV2Semaphore {
    pub(crate) client: Arc<KeysClient>,
    pub(crate) keys: Keys,
    max_hold: Option<Duration>,
    /// `lock.max_per_zone`: at most this many holders in one zone.
    max_per_zone: Option<u64>,
    /// `lock.max = "N%"`: the slots are this share of the known nodes ([`Self::share`]).
    max_percent: Option<u8>,
    timeouts: Timeouts,
    /// The group as the last phase report read it, for the release right after it.
    recent: Recent<Snapshot>,
    /// The group as a take left it, or as the connection read it, for the first phase report
    /// (never the report's own read: a report always reads, or writes on one of these).
    before_report: Recent<Snapshot>,
    /// The pause as `group_pause` last read it, for the wait that follows ([`pause`]).
    last_pause: super::pause::LastRead<u64>,
    /// The holder record this process last wrote: a report of the phase it says already sends
    /// nothing (the take writes the first phase).
    written: std::sync::Mutex<Option<HolderRecord>>,
}

impl std::fmt::Debug for EtcdV2Semaphore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdV2Semaphore")
            .field("client", &self.client)
            .field("key", &self.keys.doc)
            .finish_non_exhaustive()
    }
}

impl EtcdV2Semaphore {
    /// With at most `max_per_zone` holders in one zone (`lock.max_per_zone`).
    pub fn with_max_per_zone(mut self, max_per_zone: Option<u64>) -> Self {
        self.max_per_zone = max_per_zone;
        self
    }

    /// A store for `group` on the cluster of `settings`, checked with one read: an etcd without
    /// the v2 API is refused at once, naming `--enable-v2`.
    pub async fn connect(
        settings: &config::Etcd,
        group: &str,
        max_hold: Option<Duration>,
    ) -> Result<Self, LockError> {
        Self::connect_with(settings, group, max_hold, Timeouts::default()).await
    }

    /// [`EtcdV2Semaphore::connect`] with explicit time limits.
    #[tracing::instrument(skip(settings), fields(endpoints = ?settings.endpoints))]
    pub async fn connect_with(
        settings: &config::Etcd,
        group: &str,
        max_hold: Option<Duration>,
        timeouts: Timeouts,
    ) -> Result<Self, LockError> {
        let client =
            KeysClient::new(&client_settings(settings, timeouts.client)?).map_err(lock_error)?;
        let this = EtcdV2Semaphore {
            client: Arc::new(client),
            keys: Keys::new(group),
            max_hold,
            max_per_zone: None,
            max_percent: None,
            timeouts,
            recent: Recent::default(),
            before_report: Recent::default(),
            last_pause: super::pause::LastRead::default(),
            written: std::sync::Mutex::default(),
        };
        // Make sure etcd answers with the read the first report after a boot writes on.
        let snap = this.read(true).await?;
        this.before_report.set(snap);
        Ok(this)
    }

    /// locksmith's document key.
    pub fn key(&self) -> &str {
        &self.keys.doc
    }

    pub fn keys(&self) -> &Keys {
        &self.keys
    }

    /// Requests sent to etcd so far.
    pub fn requests(&self) -> u64 {
        self.client.requests()
    }

    /// Read the group's keys (one recursive read).
    pub(crate) async fn read(&self, quorum: bool) -> Result<Snapshot, LockError> {
        let get = Get {
            recursive: true,
            sorted: true,
            quorum,
        };
        let (root, index) = self.get_or_absent(&self.keys.root, get).await?;
        Ok(Snapshot::from_read(&self.keys, root.as_ref(), index))
    }

    /// `key` as read with `get` (`None`: etcd has no such key), and etcd's index of the answer.
    pub(super) async fn get_or_absent(
        &self,
        key: &str,
        get: Get,
    ) -> Result<(Option<Node>, u64), LockError> {
        match self.client.get(key, get).await {
            Ok(r) => Ok((Some(r.node), r.etcd_index)),
            Err(V2Error::Etcd {
                code: crate::clients::etcd_v2::code::KEY_NOT_FOUND,
                index,
                ..
            }) => Ok((None, index)),
            Err(e) => Err(lock_error(e)),
        }
    }

    /// locksmith's document in `snap`, or why it cannot be used.
    pub(crate) fn document(&self, snap: &Snapshot) -> Result<SemaphoreDoc, LockError> {
        match &snap.doc {
            DocState::Absent => Ok(SemaphoreDoc::default()),
            DocState::Doc { doc, .. } => Ok(doc.clone()),
            DocState::Moved { .. } => Err(self.moved()),
            DocState::Corrupt { value, reason, .. } => Err(LockError::Corrupt {
                key: self.keys.doc.clone(),
                value: value.clone(),
                reason: reason.clone(),
            }),
        }
    }

    fn moved(&self) -> LockError {
        LockError::Moved {
            from: format!("{} (etcd v2 at {})", self.keys.doc, self.client.target()),
        }
    }

    /// Write my holder record (a new index of its key), keeping `acquired` and, unless given,
    /// the phase of the one in `snap`. Guarded by the record's index when there is one. The
    /// record as written, or `None` when someone else wrote or deleted it first.
    async fn write_record(
        &self,
        snap: &Snapshot,
        me: &Identity,
        phase: Option<Option<&str>>,
    ) -> Result<Option<tree::Entry<HolderRecord>>, LockError> {
        let key = self.keys.record(&me.id);
        let previous = snap.record(&self.keys, &me.id);
        let record = HolderRecord::after(previous.and_then(|e| e.value.as_ref()), me, phase);
        let Some(modified) = self.put_record(&key, previous, &record).await? else {
            return Ok(None);
        };
        *self.written.lock().unwrap_or_else(|p| p.into_inner()) = Some(record.clone());
        Ok(Some(tree::Entry {
            value: Some(record),
            created: previous.map_or(modified, |e| e.created),
            modified,
        }))
    }

    /// Write `record` at `key` over `previous` as read: compared with its index, or created
    /// when there was none. The index it got; `Ok(None)`: someone else wrote or deleted it
    /// first.
    async fn put_record(
        &self,
        key: &str,
        previous: Option<&tree::Entry<HolderRecord>>,
        record: &HolderRecord,
    ) -> Result<Option<u64>, LockError> {
        let opts = match previous {
            Some(e) => Put {
                prev_index: Some(e.modified),
                ..Put::default()
            },
            None => Put {
                prev_exist: Some(false),
                ..Put::default()
            },
        };
        match self.client.put(key, &record.to_json(), opts).await {
            Ok(r) => Ok(Some(r.node.modified_index)),
            Err(e) if e.is_compare_failed() || e.is_node_exists() || e.is_key_not_found() => {
                Ok(None)
            }
            Err(e) => Err(lock_error(e)),
        }
    }

    /// Whether `me` holds its slot in `snap`, by the lock core's rule ([`holding::fence`]).
    fn fence_of(&self, snap: &Snapshot, doc: &SemaphoreDoc, me: &Identity) -> Fence {
        let me = me.as_me();
        holding::fence(&snap.view(&self.keys, doc, Some(&me)), &me, &self.keys.doc)
    }

    /// Whether a waiter claimed the slot of `id` (see [`Self::claim`]).
    pub(super) fn claimed(&self, snap: &Snapshot, id: &str) -> bool {
        snap.record(&self.keys, id)
            .and_then(|e| e.value.as_ref())
            .is_some_and(|r| r.reclaimed_by.is_some())
    }

    /// The first step of taking back the slot of a holder judged stopped: mark its record as
    /// claimed by `by`, compared with the record as `snap` read it (absent: still absent).
    /// `Ok(false)`: the holder wrote meanwhile, so it is alive. v2 has no transaction over two
    /// keys; this step is what makes a holder's write (a heartbeat, the proof before its reboot)
    /// and a reclaim exclude each other: whichever lands first makes the other fail, where a
    /// reclaim comparing only the document's index would pass a holder that had just written.
    pub(super) async fn claim(
        &self,
        snap: &Snapshot,
        holder: &str,
        by: &str,
    ) -> Result<bool, LockError> {
        let key = self.keys.record(holder);
        let previous = snap.record(&self.keys, holder);
        let old = previous.and_then(|e| e.value.as_ref());
        if old.is_some_and(|r| r.reclaimed_by.is_some()) {
            return Ok(true);
        }
        let now = jiff::Timestamp::now();
        let mut record = old.cloned().unwrap_or(HolderRecord {
            node: holder.to_owned(),
            boot_id: String::new(),
            phase: None,
            since: now,
            acquired: now,
            token: None,
            reclaimed_by: None,
            zone: None,
        });
        record.reclaimed_by = Some(by.to_owned());
        Ok(self.put_record(&key, previous, &record).await?.is_some())
    }

    /// Whether the record this process last wrote says `phase` for `me` already.
    fn wrote(&self, me: &Identity, phase: Phase) -> bool {
        let written = self.written.lock().unwrap_or_else(|p| p.into_inner());
        written.as_ref().is_some_and(|r| r.says(me, phase.as_str()))
    }

    async fn try_heartbeat(&self, me: &Identity) -> Result<Cas<Fence>, LockError> {
        let snap = self.read(true).await?;
        let doc = self.document(&snap)?;
        let fence = self.fence_of(&snap, &doc, me);
        if fence != Fence::Held || self.write_record(&snap, me, None).await?.is_some() {
            return Ok(Cas::Done(fence));
        }
        Ok(Cas::Conflict)
    }

    /// The read kept a moment ago (by the take, or by the connection after a boot), if it says
    /// `me` holds its slot: a report writes on it, its write guarded by my record's index, so a
    /// record changed since (a reclaim's claim) fails the write and the next attempt reads. A
    /// kept read that says anything else is never acted on: read again.
    fn kept_holding(&self, kept: &Recent<Snapshot>, me: &Identity) -> Option<Snapshot> {
        let kept = kept.take()?;
        let doc = self.document(&kept).ok()?;
        (self.fence_of(&kept, &doc, me) == Fence::Held).then_some(kept)
    }

    /// A quorum read (as the fence's), or a read kept from the take or the connection that says
    /// this host holds its slot ([`Self::kept_holding`]); then a write guarded by my record's
    /// index. The write proves only that my record did not change (no reclaim claimed it): the
    /// document may have lost me without touching it (`locksmithctl unlock`, or `rebootctl
    /// unlock` between its document write and its record delete). So a report proves the slot
    /// held ([`Reported::Held`], and the runtime sends no fence right after) only on a quorum
    /// read made for it, as a fence would; on a kept read it proves nothing.
    async fn try_report_phase(
        &self,
        me: &Identity,
        phase: &str,
    ) -> Result<Cas<Reported>, LockError> {
        let (mut snap, fresh) = match self.kept_holding(&self.before_report, me) {
            Some(kept) => (kept, false),
            None => (self.read(true).await?, true),
        };
        let doc = self.document(&snap)?;
        if self.fence_of(&snap, &doc, me) != Fence::Held {
            tracing::debug!(id = %me.id, phase, "not holding a slot; phase not recorded");
            return Ok(Cas::Done(Reported::Unproven));
        }
        let record = snap
            .record(&self.keys, &me.id)
            .and_then(|e| e.value.as_ref());
        if record.is_some_and(|r| r.says(me, phase)) {
            // Written with the take: nothing to write, nothing proved.
            self.recent.set(snap);
            return Ok(Cas::Done(Reported::Unproven));
        }
        if let Some(written) = self.write_record(&snap, me, Some(Some(phase))).await? {
            // For the release right after (see `release`), with my record as written.
            snap.records.insert(self.keys.record(&me.id), written);
            self.recent.set(snap);
            Ok(Cas::Done(match fresh {
                true => Reported::Held,
                false => Reported::Unproven,
            }))
        } else {
            Ok(Cas::Conflict)
        }
    }
}

#[async_trait]
impl Semaphore for EtcdV2Semaphore {
    fn backend(&self) -> Backend {
        BACKEND
    }

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
        let snap = self.read(true).await?;
        let doc = self.document(&snap)?;
        Ok(self.fence_of(&snap, &doc, me))
    }

    fn heartbeat_every(&self) -> Option<Duration> {
        super::heartbeat_every(self.max_hold)
    }

    /// Writes my record again (a new index of its key), if I hold my slot.
    #[tracing::instrument(skip(self, me), fields(key = %self.keys.doc, id = %me.id))]
    async fn heartbeat(&self, me: &Identity) -> Result<Fence, LockError> {
        self.recent.forget();
        self.before_report.forget();
        cas_loop!(
            BACKEND,
            "heartbeat",
            &self.keys.doc,
            self.try_heartbeat(me).await
        )
    }

    /// Releases my slot, unless its record says another host (another token) holds it.
    #[tracing::instrument(skip(self, me), fields(key = %self.keys.doc, id = %me.id))]
    async fn release(&self, me: &Identity) -> Result<(), LockError> {
        // The group as a report read it a moment ago (see `lock::recent`) if it says I hold my
        // slot, or a read now.
        let snap = match self.kept_holding(&self.recent, me) {
            Some(snap) => snap,
            None => self.read(true).await?,
        };
        let doc = self.document(&snap)?;
        let who = me.as_me();
        let view = snap.view(&self.keys, &doc, Some(&who));
        if let Err(why) = holding::release(&view, &who, &self.keys.doc) {
            tracing::error!(key = %self.keys.doc, id = %me.id, %why, "not releasing a slot another host holds under this machine id");
            return Ok(());
        }
        // The read serves the first attempt.
        self.unlock_from(&me.id, Some(snap)).await
    }

    /// Records the phase of a holder; not holding a slot is a no-op.
    #[tracing::instrument(skip(self, me), fields(key = %self.keys.doc, id = %me.id))]
    async fn report_phase(&self, me: &Identity, phase: Phase) -> Result<Reported, LockError> {
        if self.wrote(me, phase) {
            return Ok(Reported::Unproven);
        }
        cas_loop!(
            BACKEND,
            "report phase",
            &self.keys.doc,
            self.try_report_phase(me, phase.as_str()).await
        )
    }

    fn fleet(&self) -> Option<&dyn crate::fleet::FleetStore> {
        Some(self)
    }
}

#[async_trait]
impl Admin for EtcdV2Semaphore {
    async fn pause_group(&self, pause: &GroupPause) -> Result<(), LockError> {
        self.put_pause(pause).await
    }

    fn fleet(&self) -> Option<&dyn crate::fleet::FleetStore> {
        Some(self)
    }

    async fn resume_group(&self) -> Result<(), LockError> {
        self.delete_pause().await
    }

    #[tracing::instrument(skip(self), fields(key = %self.keys.doc))]
    async fn status(&self) -> Result<SemaphoreStatus, LockError> {
        let snap = self.read(false).await?;
        let doc = self.document(&snap)?;
        let mut view = snap.view(&self.keys, &doc, None);
        view.max = self.effective_max(&snap, &doc);
        let mut status = view.status(BACKEND, &self.keys.group);
        status.share = self.share(&snap, &doc);
        Ok(status)
    }

    #[tracing::instrument(skip(self), fields(key = %self.keys.doc))]
    async fn unlock(&self, id: &str) -> Result<(), LockError> {
        self.unlock_from(id, None).await
    }

    #[tracing::instrument(skip(self), fields(key = %self.keys.doc))]
    async fn set_max(&self, max: u64, force: bool) -> Result<(), LockError> {
        self.update_doc("set-max", None, |doc| {
            let mut new = doc.clone();
            super::holding::may_set_max(max, new.holders.len(), force)?;
            new.set_max(max)
                .map_err(|e| LockError::Refused(format!("set-max {max}: {e}")))?;
            Ok((new != *doc).then_some(new))
        })
        .await
    }
}
