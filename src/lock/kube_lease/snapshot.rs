//! The Lease semaphore as one list showed it (kept up to date from the watch): the control
//! Lease, the slots and the waiters, and what the lock core needs of it: the store-neutral
//! [`View`] and whether a holder still holds its slot. Pure: no I/O.
//!
//! A holder is alive while its slot Lease gets new `resourceVersion`s (heartbeats, phase
//! reports), a waiter while its waiter Lease does (renewals): as the observer's own clock sees
//! them. No time written by another host is compared.

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::coordination::v1::Lease;

use super::super::arbiter::share::Share;
use super::super::arbiter::{self, Decision};
use super::super::holding::{self, AnotherHost};
use super::super::view::{Beat, HolderView, Ticket, View, WaiterView};
use super::super::GroupPause;
use super::objects::{annotation, label, Slot, SlotHolder};
use super::pause::pause_of;
use super::queue::{Waiter, ANNOTATION_WAITER_NODE};
use super::*;

/// The semaphore's Leases, as listed (and watched).
#[derive(Debug, Clone)]
pub(super) struct Snapshot {
    pub control: Option<Lease>,
    pub max: u64,
    pub slots: BTreeMap<u64, Slot>,
    /// The waiter Leases, by name.
    pub waiters: BTreeMap<String, Waiter>,
    /// The group's pause and the `resourceVersion` of the Lease that says it.
    pub pause: Option<(GroupPause, String)>,
}

impl Snapshot {
    pub(super) fn held(&self) -> impl Iterator<Item = (&Slot, &SlotHolder)> {
        self.slots
            .values()
            .filter_map(|s| s.holder.as_ref().map(|h| (s, h)))
    }

    pub(super) fn holders(&self) -> usize {
        self.held().count()
    }

    /// The slot that is `me`'s by the lock core's rule ([`arbiter::whose`]): held under my
    /// node name (`holderIdentity`, the one field the admission policy binds to the writer),
    /// not foreign; with the decision (held, to adopt, or another host's under my machine id).
    pub(super) fn mine(&self, me: &Identity) -> Option<(&Slot, &SlotHolder, Decision)> {
        let held: Vec<(&Slot, &SlotHolder)> = self.held().collect();
        let views: Vec<HolderView> = held
            .iter()
            .map(|(slot, h)| self.holder_view(slot, h, None))
            .collect();
        let (i, decision) = arbiter::whose(&views, true, &me.as_me())?;
        held.get(i).map(|(slot, h)| (*slot, *h, decision))
    }

    /// The holders as the lock core sees them, without the queue: what a holder's own calls
    /// (fence, heartbeat, report, release) decide on.
    pub(super) fn holders_view(&self) -> View {
        View {
            max: self.max,
            holders: self
                .held()
                .map(|(slot, h)| self.holder_view(slot, h, None))
                .collect(),
            waiters: Vec::new(),
            node_is_identity: true,
            my_zone: None,
            unlisted_ahead: 0,
        }
    }

    /// What the lock core sees of holder `h` of `slot`; `gone`: why its Node is known gone.
    pub(super) fn holder_view(
        &self,
        slot: &Slot,
        h: &SlotHolder,
        gone: Option<String>,
    ) -> HolderView {
        HolderView {
            id: h.id().to_owned(),
            node: Some(h.node.clone()),
            boot_id: h.boot_id.clone(),
            phase: h.phase.clone(),
            token: h.token.clone(),
            beat: beat(&slot.lease),
            gone,
            foreign: slot.foreign(self.max),
            claimed_by: None,
            since: h.since,
            zone: crate::lock::document::zone_of(h.zone.as_deref()),
        }
    }
}

impl KubeLeaseSemaphore {
    /// Put `lease` (listed or seen on the watch) in `snap` as the control Lease, a slot or a
    /// waiter; anything else is ignored. `snap.max` is not recomputed.
    pub(super) fn put_lease(&self, snap: &mut Snapshot, lease: Lease) {
        let lease_name = lease.metadata.name.clone().unwrap_or_default();
        let role = label(&lease.metadata, LABEL_ROLE);
        if lease_name == self.name && role == Some(ROLE_CONTROL) {
            snap.control = Some(lease);
        } else if lease_name == self.pause_name() && role == Some(ROLE_PAUSE) {
            snap.pause = pause_of(&lease).map(|p| {
                let rv = lease.metadata.resource_version.clone().unwrap_or_default();
                (p, rv)
            });
        } else if let Some(index) = self.slot_index(&lease_name) {
            snap.slots.insert(index, Slot::new(index, lease));
        } else if lease_name.starts_with(&self.waiter_prefix) && role == Some(ROLE_WAITER) {
            snap.waiters.insert(lease_name, Waiter::from_lease(lease));
        } else if self.is_member(&lease) {
            // A node's fleet record ([`super::members`]): nothing the semaphore decides on.
        } else {
            tracing::warn!(lease = ?lease_name, role = ?role, selector = %self.selector, "ignoring a Lease of the semaphore whose name and role label do not agree (not written by rebootd)");
        }
    }

    /// Remove the Lease named `lease_name` (deleted) from `snap`.
    pub(super) fn drop_lease(&self, snap: &mut Snapshot, lease_name: &str) {
        if lease_name == self.name {
            snap.control = None;
        } else if lease_name == self.pause_name() {
            snap.pause = None;
        } else if let Some(index) = self.slot_index(lease_name) {
            snap.slots.remove(&index);
        } else {
            snap.waiters.remove(lease_name);
        }
    }

    /// The number of slots `snap` says. A control Lease whose max does not parse is reported
    /// by name and the last valid max this process read is used; without one it is
    /// [`LockError::Corrupt`] (wait: the slot count is unknown).
    /// The number of slots waiters go by: with `lock.max = "N%"`, that share of the Nodes the
    /// last `acquire` counted ([`arbiter::zones::share_of`]: rounded down, at least one);
    /// else the control Lease's ([`Self::max_of`]).
    pub(super) fn effective_max(&self, snap: &Snapshot) -> Result<u64, LockError> {
        let max = self.max_of(snap)?;
        Ok(match self.max_percent {
            Some(p) => {
                let known = self.known_nodes.load(std::sync::atomic::Ordering::Relaxed);
                arbiter::zones::share_of(p, known)
            }
            None => max,
        })
    }

    /// With `lock.max = "N%"`, what the slots are a share of, for `rebootctl status` and
    /// `fleet`: the Nodes counted now (one list), beside the control Lease's count.
    pub(super) async fn share(&self, snap: &Snapshot) -> Result<Option<Share>, LockError> {
        let Some(percent) = self.max_percent else {
            return Ok(None);
        };
        let stored_max = self.max_of(snap)?;
        let known = self.count_nodes().await?;
        Ok(Some(Share {
            percent,
            known,
            stored_max,
        }))
    }

    pub(super) fn max_of(&self, snap: &Snapshot) -> Result<u64, LockError> {
        use std::sync::atomic::Ordering::Relaxed;
        let read = match &snap.control {
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
        };
        match read {
            Ok(max) => {
                if snap.control.is_some() {
                    self.known_max.store(max, Relaxed);
                }
                Ok(max)
            }
            Err(e) => match self.known_max.load(Relaxed) {
                NO_MAX => Err(e),
                known => {
                    tracing::warn!(namespace = %self.namespace, lease = %self.name, error = %e, max = known, "the control Lease is unreadable; going on with the last max read from it (an administrator fixes it with `rebootctl set-max`)");
                    Ok(known)
                }
            },
        }
    }

    /// Whether `me` holds a slot in `snap`, by the lock core's rule ([`holding::fence`]).
    pub(super) fn fence_of(&self, snap: &Snapshot, me: &Identity) -> Fence {
        holding::fence(&snap.holders_view(), &me.as_me(), &self.target())
    }

    /// The slots `me` may free in `snap`, by the lock core's rule ([`holding::release`]): the
    /// ones held under my node, or why none may be.
    pub(super) fn releasable<'a>(
        &self,
        snap: &'a Snapshot,
        me: &Identity,
    ) -> Result<Vec<&'a Slot>, AnotherHost> {
        let mine = holding::release(&snap.holders_view(), &me.as_me(), &self.target())?;
        let held: Vec<&Slot> = snap.held().map(|(slot, _)| slot).collect();
        Ok(mine.iter().filter_map(|i| held.get(*i).copied()).collect())
    }

    /// The semaphore's name in reasons: its Leases.
    pub(super) fn target(&self) -> String {
        format!("Leases {}/{}*", self.namespace, self.name)
    }
}

impl Snapshot {
    /// Nothing listed yet.
    pub(super) fn empty() -> Snapshot {
        Snapshot {
            control: None,
            max: DEFAULT_MAX,
            slots: BTreeMap::new(),
            waiters: BTreeMap::new(),
            pause: None,
        }
    }
}

/// A Lease's `resourceVersion`: its beat.
fn beat(lease: &Lease) -> Beat {
    Beat::Revision(lease.metadata.resource_version.clone().unwrap_or_default())
}

/// A waiter's place: when it started waiting (`acquireTime`, the waiter's clock: it orders the
/// queue, it never decides who is alive), then its name.
pub(super) fn ticket(w: &Waiter) -> Ticket {
    lease_ticket(&w.lease)
}

/// The place of waiter Lease `lease` (as [`ticket`] of its [`Waiter`], before it is one).
pub(super) fn lease_ticket(lease: &Lease) -> Ticket {
    Ticket {
        order: (super::queue::since(lease).as_microsecond(), 0),
        name: lease.metadata.name.clone().unwrap_or_default(),
    }
}

impl KubeLeaseSemaphore {
    /// The arbiter's view of `snap` for the waiter whose waiter Lease is `my_waiter`; `gone`:
    /// why the Nodes of some holders are known to be gone (node name → the uid the holder
    /// recorded, words). A control
    /// Lease whose max does not parse is [`LockError::Corrupt`].
    pub(super) fn view(
        &self,
        snap: &Snapshot,
        my_waiter: &str,
        gone: &HashMap<String, (String, String)>,
    ) -> Result<View, LockError> {
        let max = self.effective_max(snap)?;
        let holders = snap
            .held()
            .map(|(slot, h): (&Slot, &SlotHolder)| {
                let gone = gone
                    .get(&h.node)
                    .filter(|(uid, _)| h.node_uid.as_ref() == Some(uid))
                    .map(|(_, why)| why.clone());
                let mut v = snap.holder_view(slot, h, gone);
                v.foreign = slot.foreign(max);
                v
            })
            .collect();
        let mut waiters: Vec<WaiterView> = snap
            .waiters
            .values()
            .map(|w| WaiterView {
                key: w.name.clone(),
                ticket: ticket(w),
                id: None,
                node: annotation(&w.lease, ANNOTATION_WAITER_NODE).map(str::to_owned),
                beat: beat(&w.lease),
                mine: w.name == my_waiter,
                zone: crate::lock::document::zone_of(annotation(&w.lease, ANNOTATION_ZONE)),
                since: Some(super::queue::since(&w.lease)).filter(|t| *t != jiff::Timestamp::MIN),
            })
            .collect();
        waiters.sort_by(|a, b| a.ticket.cmp(&b.ticket));
        Ok(View {
            max,
            holders,
            waiters,
            node_is_identity: true,
            my_zone: None,
            unlisted_ahead: 0,
        })
    }
}

/// The queues the waiting helpers' unit tests start from.
#[cfg(test)]
pub(super) mod fixtures {
    use std::collections::BTreeMap;

    use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;

    use super::super::queue::{Waiter, ANNOTATION_WAITER_NODE};
    use super::Snapshot;

    /// Waiter Leases `w-node-0`.. `w-node-{n-1}` queued in that order (`acquireTime` 1000 + i
    /// s, `resourceVersion` 100 + i), then mine, `w-node-me`.
    pub(in crate::lock::kube_lease) fn queue(n: usize) -> Snapshot {
        let mut snap = Snapshot::empty();
        for i in 0..=n {
            let node = if i == n {
                "node-me".to_owned()
            } else {
                format!("node-{i}")
            };
            let mut lease = Lease::default();
            lease.metadata.name = Some(format!("w-{node}"));
            lease.metadata.resource_version = Some(format!("{}", 100 + i));
            lease.metadata.annotations = Some(BTreeMap::from([(
                ANNOTATION_WAITER_NODE.to_owned(),
                node.clone(),
            )]));
            let at = jiff::Timestamp::from_second(1_000 + i as i64).unwrap();
            lease.spec = Some(LeaseSpec {
                acquire_time: Some(MicroTime(at)),
                ..LeaseSpec::default()
            });
            let w = Waiter::from_lease(lease);
            snap.waiters.insert(w.name.clone(), w);
        }
        snap
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn me(x: &str) -> Identity {
        Identity {
            id: format!("m-{x}"),
            node: format!("node-{x}"),
            boot_id: format!("boot-{x}"),
            token: format!("t-{x}"),
            zone: None,
        }
    }

    fn with_rv(mut l: Lease, rv: &str) -> Lease {
        l.metadata.resource_version = Some(rv.into());
        l
    }

    /// Semaphore `reboot` in namespace `ns`, on a client that is never called.
    fn semaphore() -> KubeLeaseSemaphore {
        let config = kube::Config::new("http://127.0.0.1:1".parse().unwrap());
        let client = kube::Client::try_from(config).unwrap();
        let settings = config::KubeLease {
            namespace: "ns".into(),
            name: "reboot".into(),
            kubeconfig: None,
            zone_label: crate::config::DEFAULT_ZONE_LABEL.into(),
            node_selector: None,
        };
        KubeLeaseSemaphore::new(client, &settings, None)
    }

    #[tokio::test]
    async fn the_view_beats_by_resource_version_and_queues_by_acquire_time() {
        let s = semaphore();
        let t0 = jiff::Timestamp::from_second(1_700_000_000).unwrap();
        let mut snap = Snapshot::empty();
        s.put_lease(&mut snap, with_rv(s.control_lease(2), "1"));
        let held = KubeLeaseSemaphore::taken(&s.free_slot_lease(0), &me("a"), t0, Some("uid-a"));
        s.put_lease(&mut snap, with_rv(held, "7"));
        s.put_lease(&mut snap, with_rv(s.free_slot_lease(1), "2"));
        let later = t0 + jiff::SignedDuration::from_secs(5);
        s.put_lease(&mut snap, with_rv(s.waiter_lease(&me("c"), later), "9"));
        s.put_lease(&mut snap, with_rv(s.waiter_lease(&me("b"), t0), "8"));
        let why = "its Node node-a no longer exists".to_owned();
        let gone = HashMap::from([("node-a".to_owned(), ("uid-a".to_owned(), why))]);
        let v = s.view(&snap, &s.waiter_name("node-c"), &gone).unwrap();
        assert_eq!(v.max, 2);
        assert!(v.node_is_identity);
        assert_eq!(v.holders.len(), 1);
        let h = &v.holders[0];
        assert_eq!((h.id.as_str(), h.node.as_deref()), ("m-a", Some("node-a")));
        assert_eq!(h.token.as_deref(), Some("t-a"));
        assert_eq!(h.beat, Beat::Revision("7".into()));
        assert_eq!(h.gone.as_deref(), Some("its Node node-a no longer exists"));
        let order: Vec<(&str, bool)> = v
            .waiters
            .iter()
            .map(|w| (w.node.as_deref().unwrap_or(""), w.mine))
            .collect();
        assert_eq!(order, vec![("node-b", false), ("node-c", true)]);
        assert_eq!(v.waiters[0].beat, Beat::Revision("8".into()));

        // A holder without a node uid is never gone; a corrupt max is the last valid one read,
        // or an error when none was.
        let ghost = KubeLeaseSemaphore::taken(&s.free_slot_lease(1), &me("g"), t0, None);
        s.put_lease(&mut snap, with_rv(ghost, "10"));
        let gone = HashMap::from([
            ("node-g".to_owned(), ("uid-g".to_owned(), "x".to_owned())),
            (
                "node-a".to_owned(),
                ("an-older-uid".to_owned(), "x".to_owned()),
            ),
        ]);
        let v = s.view(&snap, "", &gone).unwrap();
        assert!(v.holders.iter().all(|h| h.gone.is_none()));
        let mut bad = s.control_lease(2);
        bad.metadata.annotations = None;
        s.put_lease(&mut snap, bad);
        assert_eq!(s.view(&snap, "", &gone).unwrap().max, 2);
        let fresh = semaphore();
        assert!(matches!(
            fresh.view(&snap, "", &gone),
            Err(LockError::Corrupt { .. })
        ));
    }

    /// What rebootd did not write is never mine: a slot past max or without the slot role
    /// (counted as held), a pause or control Lease without its role; ownership is the
    /// `holderIdentity`, whatever machine id or token a Lease carries.
    #[tokio::test]
    async fn only_what_the_api_server_authenticated_makes_a_slot_mine() {
        let s = semaphore();
        let t0 = jiff::Timestamp::from_second(1_700_000_000).unwrap();
        let victim = me("v");
        let mut snap = Snapshot::empty();
        s.put_lease(&mut snap, with_rv(s.control_lease(1), "1"));
        snap.max = 1;
        // Node x writes the victim's machine id and token on slots it holds: one below max, one
        // past it.
        let forged = |index: u64| {
            let mut l = KubeLeaseSemaphore::taken(&s.free_slot_lease(index), &victim, t0, None);
            l.spec.as_mut().unwrap().holder_identity = Some("node-x".into());
            l
        };
        s.put_lease(&mut snap, with_rv(forged(0), "2"));
        s.put_lease(&mut snap, with_rv(forged(7), "3"));
        assert!(snap.mine(&victim).is_none());
        assert!(matches!(s.fence_of(&snap, &victim), Fence::Lost { .. }));
        let v = s.view(&snap, "", &HashMap::new()).unwrap();
        assert_eq!(v.holders.len(), 2, "both count as held");
        let foreign: Vec<Option<&str>> = v.holders.iter().map(|h| h.foreign.as_deref()).collect();
        assert_eq!(foreign[0], None);
        assert!(foreign[1].unwrap().contains("past max 1"), "{foreign:?}");
        assert_eq!(v.free(), -1);

        // My own node's slot is mine (held, or to adopt without a token), past max too (a max
        // forced below the holders) or without its role: only my node writes under its name.
        let mut past = KubeLeaseSemaphore::taken(&s.free_slot_lease(5), &victim, t0, None);
        past = with_rv(past, "4");
        let mut alone = Snapshot::empty();
        alone.max = 1;
        s.put_lease(&mut alone, past);
        assert!(matches!(alone.mine(&victim), Some((_, _, Decision::Held))));
        assert_eq!(s.fence_of(&alone, &victim), Fence::Held);
        let mut mine = s.free_slot_lease(0);
        mine = KubeLeaseSemaphore::taken(&mine, &victim, t0, None);
        s.put_lease(&mut snap, with_rv(mine, "4"));
        assert!(matches!(snap.mine(&victim), Some((_, _, Decision::Held))));
        assert_eq!(s.fence_of(&snap, &victim), Fence::Held);
        let mut unlabelled = KubeLeaseSemaphore::taken(&s.free_slot_lease(0), &victim, t0, None);
        unlabelled
            .metadata
            .labels
            .as_mut()
            .unwrap()
            .remove(LABEL_ROLE);
        s.put_lease(&mut snap, with_rv(unlabelled, "5"));
        assert!(
            matches!(snap.mine(&victim), Some((_, _, Decision::Held))),
            "a slot of my node without its role"
        );

        // A control Lease or a pause without its role is neither.
        let mut snap = Snapshot::empty();
        let mut control = s.control_lease(3);
        control.metadata.labels.as_mut().unwrap().remove(LABEL_ROLE);
        s.put_lease(&mut snap, control);
        assert!(snap.control.is_none());
        let mut pause = s.control_lease(1);
        pause.metadata.name = Some(s.pause_name());
        pause.metadata.annotations.as_mut().unwrap().insert(
            super::super::pause::ANNOTATION_PAUSED.to_owned(),
            r#"{"since":"2026-01-01T00:00:00Z","reason":"forged"}"#.to_owned(),
        );
        s.put_lease(&mut snap, pause.clone());
        assert!(snap.pause.is_none(), "a pause Lease with role control");
        assert!(s.pause_in(&pause).is_none());
        pause.metadata.labels = Some(s.labels(ROLE_PAUSE, None));
        assert!(s.pause_in(&pause).is_some());
    }
}
