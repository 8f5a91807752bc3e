//! `rebootctl fleet` as a person reads it: one line for the group, one per node (holders, then
//! the queue, then the others). Every string was cleaned when the view was built.

use super::view::{FleetNode, FleetView, RecordState, Role};
use crate::status::age;
use jiff::Timestamp;
use std::fmt::Write;

/// The whole view as text.
pub fn render(v: &FleetView) -> String {
    let now = v.read_at;
    let mut out = String::new();
    let held = v.nodes.iter().filter(|n| n.role == Role::Holder).count();
    let share = v
        .share
        .map(|s| format!(" (max {} is {})", v.max, s.describe(v.backend)))
        .unwrap_or_default();
    let _ = writeln!(
        out,
        "group {} ({}): {held} of {} slots held, {} free{share}",
        v.group, v.backend, v.max, v.free
    );
    if let Some(p) = &v.group_paused {
        let _ = writeln!(out, "group paused {}", p.describe());
    }
    if v.nodes.is_empty() {
        out.push_str("no node has a slot, waits for one, or keeps a record\n");
    }
    for n in &v.nodes {
        let _ = writeln!(out, "{}", line(n, now));
    }
    out
}

/// One node: who, what it does, why it waits, its last reboot.
pub fn line(n: &FleetNode, now: Timestamp) -> String {
    let who = n.node.as_deref().or(n.id.as_deref()).unwrap_or("(unnamed)");
    let mut s = match n.role {
        Role::Holder => format!("holder   {who}"),
        Role::Waiter => format!("{:<8} {who}", format!("#{}", n.position.unwrap_or(0))),
        Role::Member => format!("node     {who}"),
    };
    let phase = n.phase.as_deref().map(|p| p.replace('_', " "));
    match (n.role, &phase) {
        (Role::Holder, Some(p)) => {
            let _ = write!(s, ": {p}");
        }
        (Role::Holder, None) => s.push_str(": holds a slot"),
        _ => {}
    }
    if let Some(since) = n.since {
        if n.role == Role::Holder || n.waiting.is_none() {
            let _ = write!(s, " for {} (since {since})", age(since, now));
        }
    }
    if let Some(why) = reason(n) {
        let _ = write!(s, ": {why}");
    } else if let (Role::Member, Some(p)) = (n.role, &phase) {
        let _ = write!(s, ": {p}");
    }
    if let Some(p) = &n.paused {
        let said = p
            .reason
            .as_deref()
            .map_or(String::new(), |r| format!(": {r}"));
        let _ = write!(s, " [paused for {}{said}]", age(p.since, now));
    }
    if let Some(c) = n.cancelled {
        let _ = write!(s, " [reboot cancelled {} ago]", age(c, now));
    }
    if let Some(f) = &n.foreign {
        let _ = write!(s, " [foreign, counted as held: {f}]");
    }
    match n.last_reboot {
        Some(t) => {
            let _ = write!(s, "; last reboot {} ago", age(t, now));
        }
        None if n.record == RecordState::Ok => s.push_str("; no reboot on record"),
        None => {}
    }
    if let Some(u) = &n.unreadable {
        let _ = write!(
            s,
            " [record unreadable ({}), left as it is: {}]",
            u.reason, u.value
        );
    }
    s
}

/// Why the node waits, in words.
fn reason(n: &FleetNode) -> Option<String> {
    let why = n.waiting.as_deref()?;
    let detail = n.detail.as_deref();
    let with = |what: &str| match detail {
        Some(d) => format!("{what} ({d})"),
        None => what.to_owned(),
    };
    Some(match why {
        "slot" => match n.behind {
            Some(0) => "first in the queue for a slot".to_owned(),
            Some(1) => "behind 1 other for a slot".to_owned(),
            Some(k) => format!("behind {k} others for a slot"),
            None => "waiting for a slot (not in the queue now)".to_owned(),
        },
        "window" => with("waiting for the maintenance window"),
        "gate" => with("held by a gate"),
        "inhibitor" => with("held by an inhibitor"),
        "users" => with("warning logged-in users"),
        "blocking_pods" => with("held by blocking pods"),
        "paused" => "paused by an operator".to_owned(),
        "group_paused" => "waiting for the group to be resumed".to_owned(),
        "retry" => with("backing off before a retry"),
        other => with(&format!("waiting ({other})")),
    })
}

#[cfg(test)]
mod tests {
    use super::super::view::RecordState;
    use super::*;

    #[test]
    fn a_waiter_says_how_many_are_ahead_and_a_gate_its_reason() {
        let now = Timestamp::from_second(1000).unwrap();
        let mut n = FleetNode {
            node: Some("n1".into()),
            id: None,
            role: Role::Waiter,
            phase: Some("acquiring_slot".into()),
            since: Some(Timestamp::from_second(400).unwrap()),
            for_seconds: Some(600),
            position: Some(3),
            behind: Some(2),
            waiting: Some("slot".into()),
            detail: None,
            paused: None,
            cancelled: None,
            last_reboot: None,
            foreign: None,
            record: RecordState::Ok,
            unreadable: None,
        };
        let l = line(&n, now);
        assert!(l.starts_with("#3       n1"), "{l}");
        assert!(l.contains("behind 2 others for a slot"), "{l}");
        n.role = Role::Member;
        n.waiting = Some("gate".into());
        n.detail = Some("alerts: NodeDown firing".into());
        let l = line(&n, now);
        assert!(
            l.contains("held by a gate (alerts: NodeDown firing)"),
            "{l}"
        );
    }
}
