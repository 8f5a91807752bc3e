//! What a waiter's watch brings ([`V3Waiting::on_events`]), and the group's watch of a waiter
//! near the front, in two forms. At first one watcher from the group's pause to the document
//! (one key range, see [`super::super::super::document`]). Once
//! [`LEAVE_OUT_AFTER`] entries were put behind mine, one that leaves the queue's puts out: every
//! new entry is behind mine (an entry's key is put once, with its waiter's lease) and decides
//! nothing of mine, while deletes (a waiter ahead gone, a take) still do. In a growing queue each
//! new entry reached every waiter near the front: at 10 000 nodes millions of events, which
//! etcd buffered for the slower watchers until it ran out of memory. The second form costs
//! two watch creates more, so it waits until the queue behind proves long.

use etcd_client::{WatchFilterType, WatchOptions, WatchStream};

use super::super::marker::watchers;
use super::super::snapshot::{Keys, Kv};
use super::super::EtcdSemaphore;
use super::V3Waiting;
use crate::lock::acquire::Wake;
use crate::lock::LockError;

/// How many entries put behind mine make the watch leave the queue's puts out.
pub(super) const LEAVE_OUT_AFTER: usize = 256;

/// The group's watch from `revision`: the pause, the holder records, the queue and the
/// document.
pub(super) async fn group(store: &EtcdSemaphore, revision: i64) -> Result<WatchStream, LockError> {
    let keys = &store.keys;
    let mut end = keys.doc.clone().into_bytes();
    end.push(0);
    let options = WatchOptions::new()
        .with_range(end)
        .with_start_revision(revision);
    watchers(store, [(keys.pause.clone(), options)]).await
}

/// The group's watch from `revision` without the queue's puts: three watchers on one stream,
/// the pause and the records (every event), the queue (deletes only) and the document.
pub(super) async fn without_queue_puts(
    store: &EtcdSemaphore,
    revision: i64,
) -> Result<WatchStream, LockError> {
    let keys = &store.keys;
    let from = || WatchOptions::new().with_start_revision(revision);
    let watched = [
        (keys.pause.clone(), from().with_range(keys.queue.clone())),
        (
            keys.queue.clone(),
            from().with_prefix().with_filters([WatchFilterType::NoPut]),
        ),
        (keys.doc.clone(), from()),
    ];
    watchers(store, watched).await
}

impl V3Waiting<'_> {
    /// How many of `events` (from the group's watch) put entries behind mine; counted towards
    /// [`LEAVE_OUT_AFTER`].
    pub(super) fn count_puts_behind(&mut self, events: &[(bool, Kv)]) -> usize {
        let mine = self
            .snap
            .as_ref()
            .and_then(|s| s.queue.get(&self.queue_key))
            .map(|e| e.create_revision);
        let Some(mine) = mine.filter(|_| self.marker.is_none()) else {
            return 0;
        };
        let behind = puts_behind(events, &self.store.keys, mine);
        self.puts_behind += behind;
        behind
    }

    /// Once [`LEAVE_OUT_AFTER`] entries were put behind mine, watch the group without
    /// the queue's puts from the snapshot's revision on (it has every event before). Not with
    /// zones, where an entry's record names its zone.
    pub(super) async fn leave_out_puts_behind(&mut self) -> Result<(), LockError> {
        if self.puts_left_out
            || self.puts_behind < LEAVE_OUT_AFTER
            || self.store.max_per_zone.is_some()
        {
            return Ok(());
        }
        let from = self.snap()?.revision + 1;
        tracing::debug!(key = %self.queue_key, behind = self.puts_behind, "the queue grows behind this waiter: watching the group without new entries");
        self.watch = Some(without_queue_puts(self.store, from).await?);
        self.puts_left_out = true;
        Ok(())
    }

    /// What `events` from my watch come to: a wake for the arbiter, or `None` to wait on. They
    /// go into the snapshot either way.
    pub(super) async fn on_events(
        &mut self,
        events: &[(bool, Kv)],
    ) -> Result<Option<Wake>, LockError> {
        if events.is_empty() {
            return Ok(None);
        }
        if let Some(marker) = &self.marker {
            if events.iter().any(|(_, kv)| kv.key == marker.as_bytes()) {
                tracing::debug!(marker = %crate::text::clean(marker), "the entry ahead changed or left; reading again");
                return Ok(Some(Wake::Reread));
            }
        }
        let keys = &self.store.keys;
        let behind = self.count_puts_behind(events);
        if let Some(snap) = self.snap.as_mut() {
            snap.apply(keys, events)?;
        }
        self.leave_out_puts_behind().await?;
        if behind == events.len() {
            // New entries behind mine decide nothing of mine.
            return Ok(None);
        }
        if self.snap.as_ref().is_some_and(|s| s.pause.is_some()) {
            return Ok(Some(self.changed()));
        }
        // After a lost take, only the write that beat it decides again.
        let lost_race = &mut self.lost_race;
        let awaited = events
            .iter()
            .any(|(_, kv)| lost_race.decides(&String::from_utf8_lossy(&kv.key)));
        if !awaited || self.only_others_records(events) {
            return Ok(None);
        }
        if self.queue_unread && self.marker.is_none() {
            // A counted queue, not far enough back for a marker: this change may decide for
            // me; read the queue up to my entry.
            return Ok(Some(Wake::Reread));
        }
        if !self.far_back() {
            return Ok(Some(self.changed()));
        }
        // Moved far back on the group's watch (the queue ahead came after my read).
        if self.marker.is_none() {
            if let Some(marker) = self.place_marker() {
                self.follow(marker, None).await?;
            }
        }
        Ok(None)
    }
}

/// How many of `events` put a queue entry created at `mine` or after: mine (already in the
/// snapshot) or new ones behind it.
pub(super) fn puts_behind(events: &[(bool, Kv)], keys: &Keys, mine: i64) -> usize {
    events
        .iter()
        .filter(|(put, kv)| {
            *put && kv.create_revision >= mine && kv.key.starts_with(keys.queue.as_bytes())
        })
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(put: bool, key: &str, create: i64) -> (bool, Kv) {
        let kv = Kv {
            key: key.as_bytes().to_vec(),
            value: Vec::new(),
            create_revision: create,
            mod_revision: create.max(9),
            lease: 0,
        };
        (put, kv)
    }

    #[test]
    fn only_new_entries_behind_mine_count() {
        let keys = Keys::new("default");
        let entry = |id: &str| keys.waiter(id);
        let events = [
            event(true, &entry("behind"), 9),
            event(true, &entry("ahead, put again"), 3),
            event(false, &entry("gone behind"), 8),
            event(true, &keys.record("holder"), 10),
            event(true, &keys.doc, 1),
            event(true, &entry("behind too"), 11),
        ];
        assert_eq!(puts_behind(&events, &keys, 5), 2);
        assert_eq!(puts_behind(&events, &keys, 11), 1, "mine");
        assert_eq!(puts_behind(&events, &keys, 12), 0);
    }
}
