//! What the Lease semaphore's objects say and how rebootd writes them: a slot's holder as its
//! Lease records it, the control, slot and waiter Leases as built, and the checks on a
//! semaphore name. Pure: no I/O.

use std::collections::BTreeMap;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};

use super::queue::ANNOTATION_WAITER_NODE;
use super::*;

/// Who holds a slot, as recorded on its Lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct SlotHolder {
    pub node: String,
    pub machine_id: Option<String>,
    pub boot_id: Option<String>,
    pub phase: Option<String>,
    /// `rebootd.io/since`, else `acquireTime`.
    pub since: Option<jiff::Timestamp>,
    pub node_uid: Option<String>,
    pub token: Option<String>,
    /// `rebootd.io/zone`: the zone it claims.
    pub zone: Option<String>,
}

impl SlotHolder {
    pub(super) fn from_lease(lease: &Lease) -> Option<SlotHolder> {
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
            zone: ann(ANNOTATION_ZONE),
        })
    }

    /// Whether `id` (a machine id or a node name) names this holder.
    pub(super) fn is(&self, id: &str) -> bool {
        self.machine_id.as_deref() == Some(id) || self.node == id
    }

    /// The id `status` shows: the machine id, else the node name.
    pub(super) fn id(&self) -> &str {
        self.machine_id.as_deref().unwrap_or(&self.node)
    }
}

#[derive(Debug, Clone)]
pub(super) struct Slot {
    pub index: u64,
    pub lease: Lease,
    pub holder: Option<SlotHolder>,
}

impl Slot {
    pub(super) fn new(index: u64, lease: Lease) -> Slot {
        let holder = SlotHolder::from_lease(&lease);
        Slot {
            index,
            lease,
            holder,
        }
    }

    pub(super) fn name(&self) -> &str {
        self.lease.metadata.name.as_deref().unwrap_or("")
    }

    /// Why this slot is not one rebootd would hold, with `max` slots: its index is at or past
    /// `max`, or it lacks the slot's role label. Such a slot counts as held (fail closed) and
    /// is never anyone's to hold or adopt; its own holder may still free it.
    pub(super) fn foreign(&self, max: u64) -> Option<String> {
        let role = label(&self.lease.metadata, LABEL_ROLE);
        if role != Some(ROLE_SLOT) {
            return Some(format!(
                "Lease {:?} is named as a slot but its label {LABEL_ROLE} is {role:?}",
                self.name()
            ));
        }
        (self.index >= max).then(|| format!("slot Lease {:?} is past max {max}", self.name()))
    }
}

pub(super) fn annotation<'a>(lease: &'a Lease, key: &str) -> Option<&'a str> {
    lease
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .map(String::as_str)
}

pub(super) fn label<'a>(meta: &'a ObjectMeta, key: &str) -> Option<&'a str> {
    meta.labels
        .as_ref()
        .and_then(|l| l.get(key))
        .map(String::as_str)
}

/// Why `name` cannot name a semaphore, if it cannot.
pub(super) fn name_problem(name: &str) -> Option<String> {
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

impl KubeLeaseSemaphore {
    pub(super) fn labels(&self, role: &str, index: Option<u64>) -> BTreeMap<String, String> {
        let mut l = BTreeMap::from([
            (LABEL_SEMAPHORE.to_owned(), self.name.clone()),
            (LABEL_ROLE.to_owned(), role.to_owned()),
        ]);
        if let Some(i) = index {
            l.insert(LABEL_SLOT.to_owned(), i.to_string());
        }
        l
    }

    /// The control Lease saying `max`.
    pub(super) fn control_lease(&self, max: u64) -> Lease {
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

    /// Slot Lease `index`, free.
    pub(super) fn free_slot_lease(&self, index: u64) -> Lease {
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
    pub(super) fn taken(
        lease: &Lease,
        me: &Identity,
        now: jiff::Timestamp,
        node_uid: Option<&str>,
    ) -> Lease {
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
    pub(super) fn freed(lease: &Lease, now: jiff::Timestamp) -> Lease {
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

    /// The waiter Lease's TTL in whole seconds (at least 1).
    pub(super) fn waiter_ttl_secs(&self) -> i32 {
        i32::try_from(self.timeouts.waiter_ttl.as_secs().max(1)).unwrap_or(i32::MAX)
    }

    /// A new waiter Lease for `me`, waiting since `now`.
    pub(super) fn waiter_lease(&self, me: &Identity, now: jiff::Timestamp) -> Lease {
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lock::Identity;

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
            zone: None,
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
            zone: None,
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
