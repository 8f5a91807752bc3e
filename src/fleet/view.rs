//! The fleet view: the semaphore's holders and queue joined with the nodes' records and the
//! group's pause. Pure. Its JSON (`rebootctl fleet --json`) is a stable interface: fields are
//! only ever added (docs/fleet-view.md).

use super::{FleetRead, NodeRecord, RecordRead, Unreadable};
use crate::lock::document::query_escape;
use crate::lock::{Backend, GroupPause};
use crate::metrics::Waiting;
use crate::state::{Pause, Phase};
use jiff::Timestamp;
use serde::Serialize;

/// What a node is in the group right now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// It holds a slot.
    Holder,
    /// It is in the queue for one.
    Waiter,
    /// Neither: known by its record alone.
    Member,
}

/// Whether the node's record could be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RecordState {
    Ok,
    /// No record (locksmithd, a node not yet started, an older rebootd).
    Absent,
    /// There is one, and it does not parse: see `unreadable`.
    Unreadable,
}

/// One node of the fleet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FleetNode {
    pub node: Option<String>,
    pub id: Option<String>,
    pub role: Role,
    /// Holders: the phase on the holder record; others: on their own record.
    pub phase: Option<String>,
    pub since: Option<Timestamp>,
    /// Seconds from `since` to the read (the writer's clock against the reader's: shown only).
    pub for_seconds: Option<i64>,
    /// Waiters: place in the queue, 1 first.
    pub position: Option<usize>,
    /// Waiters: how many wait ahead of it.
    pub behind: Option<usize>,
    /// Why it waits (`window`, `gate`, `inhibitor`, `paused`, `group_paused`, `slot`, ...).
    pub waiting: Option<String>,
    /// The node's words about the wait (the gate and its reason, inhibitors, the window).
    pub detail: Option<String>,
    pub paused: Option<Pause>,
    pub cancelled: Option<Timestamp>,
    pub last_reboot: Option<Timestamp>,
    /// A holder rebootd would not have written (counted as held), and why.
    pub foreign: Option<String>,
    pub record: RecordState,
    pub unreadable: Option<Unreadable>,
}

/// The whole group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FleetView {
    pub backend: Backend,
    pub group: String,
    pub max: u64,
    pub free: i64,
    /// With `lock.max = "N%"` on etcd: `max` is this share of the known nodes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub share: Option<crate::lock::arbiter::share::Share>,
    pub group_paused: Option<GroupPause>,
    /// Holders (in the store's order), then waiters in queue order, then the other nodes by
    /// name.
    pub nodes: Vec<FleetNode>,
    pub read_at: Timestamp,
}

impl FleetView {
    /// Join `read` at `now`. Every string from the store is bounded and escaped.
    pub fn of(read: &FleetRead, now: Timestamp) -> FleetView {
        let by_node = read.view.node_is_identity;
        let mut records: Vec<Option<&RecordRead>> = read.records.iter().map(Some).collect();
        // The record named `name`, taken once.
        let mut take = |name: &str| -> Option<&RecordRead> {
            records
                .iter_mut()
                .find(|r| r.is_some_and(|r| r.name == name))
                .and_then(Option::take)
        };
        let join = |id: Option<&str>, node: Option<&str>| -> Option<String> {
            if by_node {
                node.map(str::to_owned)
            } else {
                id.map(query_escape)
            }
        };
        let mut nodes = Vec::new();
        for h in &read.view.holders {
            let rec = join(Some(&h.id), h.node.as_deref()).and_then(|n| take(&n));
            let mut n = node_of(rec, Role::Holder, now);
            n.node = h.node.clone().or(n.node);
            n.id = Some(h.id.clone());
            n.phase = h.phase.clone();
            n.since = h.since;
            n.for_seconds = h.since.map(|s| seconds(s, now));
            n.waiting = None;
            n.detail = None;
            n.foreign = h.foreign.clone();
            nodes.push(n);
        }
        for (i, w) in read.view.waiters.iter().enumerate() {
            let rec = join(w.id.as_deref(), w.node.as_deref()).and_then(|n| take(&n));
            let mut n = node_of(rec, Role::Waiter, now);
            n.node = w.node.clone().or(n.node);
            n.id = w.id.clone().or(n.id);
            n.position = Some(i + 1);
            n.behind = Some(i);
            // In the queue, it waits for a slot since its entry says: its record is the one
            // before the wait (a waiter writes none; the entry says it), and keeps its last
            // reboot.
            n.phase = Some(Phase::AcquiringSlot.as_str().to_owned());
            n.waiting = Some(Waiting::Slot.label().to_owned());
            n.detail = None;
            n.since = w.since;
            n.for_seconds = w.since.map(|s| seconds(s, now));
            nodes.push(n);
        }
        let mut rest: Vec<FleetNode> = records
            .into_iter()
            .flatten()
            .map(|r| {
                let mut n = node_of(Some(r), Role::Member, now);
                if n.record == RecordState::Unreadable && n.node.is_none() {
                    n.node = Some(r.name.clone());
                }
                n
            })
            .collect();
        rest.sort_by(|a, b| (&a.node, &a.id).cmp(&(&b.node, &b.id)));
        nodes.extend(rest);
        FleetView {
            backend: read.backend,
            group: read.group.clone(),
            max: read.view.max,
            free: read.view.free(),
            share: read.share,
            group_paused: read.pause.clone(),
            nodes,
            read_at: now,
        }
        .cleaned()
    }

    fn cleaned(mut self) -> FleetView {
        use crate::text::clean;
        let opt = |o: &mut Option<String>| {
            if let Some(v) = o.as_mut() {
                *v = clean(v);
            }
        };
        self.group = clean(&self.group);
        if let Some(p) = self.group_paused.as_mut() {
            opt(&mut p.reason);
            opt(&mut p.by);
        }
        for n in &mut self.nodes {
            opt(&mut n.node);
            opt(&mut n.id);
            opt(&mut n.phase);
            opt(&mut n.waiting);
            opt(&mut n.detail);
            opt(&mut n.foreign);
            if let Some(p) = n.paused.as_mut() {
                opt(&mut p.reason);
            }
            if let Some(u) = n.unreadable.as_mut() {
                u.value = clean(&u.value);
                u.reason = clean(&u.reason);
            }
        }
        self
    }
}

fn seconds(since: Timestamp, now: Timestamp) -> i64 {
    now.duration_since(since).as_secs()
}

/// A node as its record (if any) shows it.
fn node_of(rec: Option<&RecordRead>, role: Role, now: Timestamp) -> FleetNode {
    let mut n = FleetNode {
        node: None,
        id: None,
        role,
        phase: None,
        since: None,
        for_seconds: None,
        position: None,
        behind: None,
        waiting: None,
        detail: None,
        paused: None,
        cancelled: None,
        last_reboot: None,
        foreign: None,
        record: RecordState::Absent,
        unreadable: None,
    };
    match rec.map(|r| &r.record) {
        None => {}
        Some(Err(u)) => {
            n.record = RecordState::Unreadable;
            n.unreadable = Some(u.clone());
        }
        Some(Ok(r)) => {
            let NodeRecord {
                node,
                id,
                phase,
                since,
                waiting,
                detail,
                paused,
                cancelled,
                last_reboot,
            } = r.clone();
            n.record = RecordState::Ok;
            n.node = Some(node);
            n.id = Some(id);
            n.phase = Some(phase);
            n.since = Some(since);
            n.for_seconds = Some(seconds(since, now));
            n.waiting = waiting;
            n.detail = detail;
            n.paused = paused;
            n.cancelled = cancelled;
            n.last_reboot = last_reboot;
        }
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lock::view::{Beat, HolderView, Ticket, View, WaiterView};

    fn t(s: i64) -> Timestamp {
        Timestamp::from_second(s).unwrap()
    }

    fn record(node: &str, waiting: Option<&str>) -> NodeRecord {
        NodeRecord {
            node: node.into(),
            id: format!("id-{node}"),
            phase: "acquiring_slot".into(),
            since: t(100),
            waiting: waiting.map(str::to_owned),
            detail: None,
            paused: None,
            cancelled: None,
            last_reboot: Some(t(50)),
        }
    }

    fn read(by_node: bool, records: Vec<RecordRead>) -> FleetRead {
        let waiter = |k: &str, order: i64, id: &str| WaiterView {
            key: k.into(),
            ticket: Ticket {
                order: (order, 0),
                name: k.into(),
            },
            id: Some(id.into()),
            node: Some(k.into()),
            beat: Beat::Ttl,
            mine: false,
            zone: None,
            since: Some(t(order * 10)),
        };
        FleetRead {
            backend: Backend::Etcd,
            group: "default".into(),
            view: View {
                max: 1,
                holders: vec![HolderView {
                    id: "id-a".into(),
                    node: Some("a".into()),
                    boot_id: None,
                    phase: Some("draining".into()),
                    since: Some(t(190)),
                    token: None,
                    beat: Beat::Silent,
                    gone: None,
                    foreign: None,
                    claimed_by: None,
                    zone: None,
                }],
                waiters: vec![waiter("b", 1, "id-b"), waiter("c", 2, "id-c")],
                node_is_identity: by_node,
                my_zone: None,
                unlisted_ahead: 0,
            },
            records,
            pause: None,
            share: None,
            at: "9".into(),
        }
    }

    #[test]
    fn holders_then_the_queue_then_the_rest_each_with_its_record() {
        let recs = vec![
            RecordRead {
                name: "id-c".into(),
                record: Ok(record("c", Some("slot"))),
            },
            RecordRead {
                name: "id-a".into(),
                record: Ok(record("a", Some("slot"))),
            },
            RecordRead {
                name: "id-d".into(),
                record: Ok(record("d", Some("window"))),
            },
            RecordRead {
                name: "id-e".into(),
                record: NodeRecord::parse(b"{oops"),
            },
        ];
        let v = FleetView::of(&read(false, recs), t(200));
        let names: Vec<_> = v.nodes.iter().map(|n| n.node.clone().unwrap()).collect();
        assert_eq!(names, ["a", "b", "c", "d", "id-e"]);
        let a = &v.nodes[0];
        assert_eq!(
            (a.role, a.phase.as_deref()),
            (Role::Holder, Some("draining"))
        );
        assert_eq!((a.for_seconds, a.waiting.clone()), (Some(10), None));
        assert_eq!(a.last_reboot, Some(t(50)), "from its own record");
        let (b, c) = (&v.nodes[1], &v.nodes[2]);
        assert_eq!(
            (b.position, b.behind, b.record),
            (Some(1), Some(0), RecordState::Absent)
        );
        assert_eq!(b.waiting.as_deref(), Some("slot"));
        assert_eq!((c.behind, c.record), (Some(1), RecordState::Ok));
        assert_eq!(v.nodes[3].waiting.as_deref(), Some("window"));
        assert_eq!(
            v.nodes[4].record,
            RecordState::Unreadable,
            "shown, not dropped"
        );
        assert_eq!(v.free, 0);
    }

    #[test]
    fn on_leases_records_join_by_node_and_strings_are_escaped() {
        let mut evil = record("d", Some("gate"));
        evil.detail = Some("\x1b[2Jgate".into());
        let mut queued = record("c", Some("window"));
        queued.detail = Some("before it queued".into());
        let recs = vec![
            RecordRead {
                name: "c".into(),
                record: Ok(queued),
            },
            RecordRead {
                name: "d".into(),
                record: Ok(evil),
            },
        ];
        let v = FleetView::of(&read(true, recs), t(200));
        let c = &v.nodes[2];
        assert_eq!((c.role, c.record), (Role::Waiter, RecordState::Ok));
        assert_eq!(
            (
                c.phase.as_deref(),
                c.waiting.as_deref(),
                c.detail.as_deref()
            ),
            (Some("acquiring_slot"), Some("slot"), None),
            "in the queue, whatever its record said before"
        );
        assert_eq!(c.since, Some(t(20)), "from its queue entry");
        assert_eq!(v.nodes[3].record, RecordState::Ok);
        assert_eq!(v.nodes[3].detail.as_deref(), Some("\\u{1b}[2Jgate"));
    }
}
