//! `rebootctl fleet forget <id|node>`: delete one node's fleet record, for a node that is gone
//! for good. On etcd, `lock.max = "N%"` counts the group's records
//! (`lock::arbiter::share`), so a decommissioned node's record would raise the share for ever.
//! Only a record is deleted, and only one of a node that neither holds a slot nor waits for one
//! as of the read the delete is guarded by ([`FleetStore::forget_record`]).

use super::{FleetRead, FleetStore};
use crate::lock::document::query_escape;
use crate::lock::LockError;
use crate::text::clean;

/// Why a record was not forgotten.
#[derive(Debug, thiserror::Error)]
pub enum ForgetError {
    #[error("no fleet record of {} in group {}", clean(.who), clean(.group))]
    NotFound { who: String, group: String },
    #[error(
        "{} names more than one fleet record ({}); name one by its machine id",
        clean(.who),
        clean(&.names.join(", "))
    )]
    Ambiguous { who: String, names: Vec<String> },
    #[error(
        "not forgetting {}: it {} (a record is only forgotten for a node that is gone; \
         `rebootctl unlock` first if it is)",
        clean(.name),
        .role
    )]
    Busy { name: String, role: &'static str },
    #[error("the fleet record of {} kept changing; try again", clean(.0))]
    KeptChanging(String),
    #[error(transparent)]
    Lock(#[from] LockError),
}

/// The name (as the store keys it) of the one record `who` names in `read`: its name, its
/// machine id, or the node its record gives; refused for a holder or a waiter.
pub fn resolve<'a>(read: &'a FleetRead, who: &str) -> Result<&'a str, ForgetError> {
    let escaped = query_escape(who);
    let node_of = |r: &super::RecordRead| r.record.as_ref().ok().map(|n| n.node.clone());
    let found: Vec<&super::RecordRead> = read
        .records
        .iter()
        .filter(|r| r.name == who || r.name == escaped || node_of(r).as_deref() == Some(who))
        .collect();
    let record = match found.as_slice() {
        [] => {
            return Err(ForgetError::NotFound {
                who: who.to_owned(),
                group: read.group.clone(),
            })
        }
        [one] => *one,
        many => {
            return Err(ForgetError::Ambiguous {
                who: who.to_owned(),
                names: many.iter().map(|r| r.name.clone()).collect(),
            })
        }
    };
    let name = record.name.as_str();
    let node = node_of(record);
    let is = |id: Option<&str>, n: Option<&str>| {
        id.is_some_and(|id| id == name || query_escape(id) == name)
            || (node.is_some() && n == node.as_deref())
    };
    let view = &read.view;
    if view
        .holders
        .iter()
        .any(|h| is(Some(&h.id), h.node.as_deref()))
    {
        return Err(ForgetError::Busy {
            name: name.to_owned(),
            role: "holds a slot",
        });
    }
    if view
        .waiters
        .iter()
        .any(|w| is(w.id.as_deref(), w.node.as_deref()))
    {
        return Err(ForgetError::Busy {
            name: name.to_owned(),
            role: "waits for a slot",
        });
    }
    Ok(name)
}

/// Forget `who`'s record in `store`: read, resolve, delete guarded by the read; again when the
/// group changed in between. Returns the name forgotten.
pub async fn forget(store: &dyn FleetStore, who: &str) -> Result<String, ForgetError> {
    for _ in 0..3 {
        let read = store.read_fleet().await?;
        let name = resolve(&read, who)?;
        if store.forget_record(name, &read).await? {
            return Ok(name.to_owned());
        }
    }
    Err(ForgetError::KeptChanging(who.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::{NodeRecord, RecordRead};
    use crate::lock::view::{test_support, HolderView, View, WaiterView};
    use crate::lock::Backend;

    fn record(name: &str, node: &str) -> RecordRead {
        let json = format!(
            r#"{{"node":"{node}","id":"{name}","phase":"idle","since":"2026-11-28T00:00:00Z"}}"#
        );
        RecordRead {
            name: name.into(),
            record: NodeRecord::parse(json.as_bytes()),
        }
    }

    fn read() -> FleetRead {
        let holder = HolderView {
            node: Some("node-h".into()),
            ..test_support::holder("h1")
        };
        let waiter = WaiterView {
            id: Some("w1".into()),
            node: Some("node-w".into()),
            ..test_support::waiter("q/w1", 1)
        };
        FleetRead {
            backend: Backend::Etcd,
            group: "default".into(),
            view: View {
                max: 1,
                holders: vec![holder],
                waiters: vec![waiter],
                node_is_identity: false,
                my_zone: None,
                unlisted_ahead: 0,
            },
            records: vec![
                record("h1", "node-h"),
                record("w1", "node-w"),
                record("gone1", "node-gone"),
                record("twin1", "node-twin"),
                record("twin2", "node-twin"),
                RecordRead {
                    name: "junk".into(),
                    record: NodeRecord::parse(b"not json"),
                },
            ],
            pause: None,
            share: None,
            at: "7".into(),
        }
    }

    #[test]
    fn a_record_is_named_by_id_or_node_and_only_an_idle_one_is_forgotten() {
        let r = read();
        assert_eq!(resolve(&r, "gone1").unwrap(), "gone1");
        assert_eq!(resolve(&r, "node-gone").unwrap(), "gone1");
        assert_eq!(resolve(&r, "junk").unwrap(), "junk");
        assert!(matches!(
            resolve(&r, "h1"),
            Err(ForgetError::Busy {
                role: "holds a slot",
                ..
            })
        ));
        assert!(matches!(
            resolve(&r, "node-w"),
            Err(ForgetError::Busy {
                role: "waits for a slot",
                ..
            })
        ));
        assert!(matches!(
            resolve(&r, "node-twin"),
            Err(ForgetError::Ambiguous { .. })
        ));
        let e = resolve(&r, "nobody\u{1b}[2J").unwrap_err().to_string();
        assert!(!e.contains('\u{1b}'), "{e}");
    }
}
