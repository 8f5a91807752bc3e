//! What a holder's own calls decide from a [`View`], written once for every store: whether it
//! still holds its slot (fence, heartbeat, phase report) and which slots its release may free;
//! and the operator's one rule on the slots, [`may_set_max`].
//! Both follow the arbiter's rule of which slot is mine ([`arbiter::whose`]), so no store has an
//! idea of its own. Pure: a store reads its view, asks here, and writes what it was told to.

use super::arbiter::{self, Decision};
use super::view::{Me, View};
use super::{Fence, LockError};
use crate::text::clean;

/// Whether `set-max` may set `max` slots with `holders` held now: fewer slots than holders
/// only with `force` (the holders keep their slots; no new one is taken until they are fewer).
pub fn may_set_max(max: u64, holders: usize, force: bool) -> Result<(), LockError> {
    if (max as u128) < holders as u128 && !force {
        return Err(LockError::MaxBelowHolders {
            requested: max,
            holders,
        });
    }
    Ok(())
}

/// Whether `me` holds its slot in `view`, and which holder of the view it is: a slot held under
/// my id and token, or mine to adopt (no token; my node under another id where nodes identify
/// hosts), is held unless a waiter claimed it ([`super::view::HolderView::claimed_by`]). Another
/// host's slot under my id, or none at all, is lost. `target` names the semaphore in the reason.
pub fn fence_at(view: &View, me: &Me<'_>, target: &str) -> (Option<usize>, Fence) {
    let Some((i, decision)) = arbiter::whose(&view.holders, view.node_is_identity, me) else {
        let who = if view.node_is_identity {
            format!("node {} ({})", me.node, me.id)
        } else {
            me.id.to_owned()
        };
        let why = format!("{who} holds no slot of {target}");
        return (None, Fence::Lost { why });
    };
    let h = &view.holders[i];
    let fence = match (decision, &h.claimed_by) {
        (Decision::Held | Decision::Adopt { .. }, Some(by)) => Fence::Lost {
            why: format!(
                "{} claimed the slot of {} in {target}: it judged this holder stopped (no sign \
                 of life for max_hold)",
                clean(by),
                me.id
            ),
        },
        (Decision::Held | Decision::Adopt { .. }, None) => Fence::Held,
        (_, _) => Fence::Lost {
            why: format!(
                "the slot of {} in {target} is held by another host with the same machine id \
                 (holder token {}, ours {})",
                me.id,
                clean(h.token.as_deref().unwrap_or("")),
                me.token
            ),
        },
    };
    (Some(i), fence)
}

/// [`fence_at`] without the holder.
pub fn fence(view: &View, me: &Me<'_>, target: &str) -> Fence {
    fence_at(view, me, target).1
}

/// Why a release frees nothing: another host holds a slot under my machine id (and, where nodes
/// identify hosts, my node). Its slot is left alone, and the release says so.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{why}")]
pub struct AnotherHost {
    pub why: String,
}

/// Which holders of `view` (indices into [`View::holders`]) `me` may free; none: nothing is
/// held, which is success. Another host's slot under my id is refused. Otherwise every slot
/// that could be mine: where nodes identify hosts, the ones held under my node (whatever machine
/// id a writer put on them: never another node's, which the store would refuse anyway); else
/// the ones under my machine id, claimed by a waiter or not. A foreign slot under my node (past
/// a lowered `max`) is freed too: only my node could have written it.
pub fn release(view: &View, me: &Me<'_>, target: &str) -> Result<Vec<usize>, AnotherHost> {
    if let (Some(_), Fence::Lost { why }) = fence_at(view, me, target) {
        if matches!(
            arbiter::whose(&view.holders, view.node_is_identity, me),
            Some((_, Decision::Duplicate { .. }))
        ) {
            return Err(AnotherHost { why });
        }
    }
    Ok(view
        .holders
        .iter()
        .enumerate()
        .filter(|(_, h)| match view.node_is_identity {
            true => h.node.as_deref() == Some(me.node),
            false => h.id == me.id,
        })
        .map(|(i, _)| i)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::super::view::{test_support, HolderView};
    use super::*;

    #[test]
    fn fewer_slots_than_holders_only_with_force() {
        assert!(may_set_max(2, 2, false).is_ok());
        assert!(may_set_max(3, 2, false).is_ok());
        assert!(matches!(
            may_set_max(1, 2, false),
            Err(LockError::MaxBelowHolders {
                requested: 1,
                holders: 2
            })
        ));
        assert!(may_set_max(0, 2, true).is_ok());
        assert!(may_set_max(u64::MAX, usize::MAX, false).is_ok());
    }

    fn holder(id: &str, node: &str, token: Option<&str>) -> HolderView {
        HolderView {
            node: Some(node.into()),
            token: token.map(Into::into),
            ..test_support::holder(id)
        }
    }

    fn view(holders: Vec<HolderView>, node_is_identity: bool) -> View {
        View {
            node_is_identity,
            ..test_support::view(2, holders, vec![])
        }
    }

    const ME: Me<'static> = Me {
        id: "m-a",
        node: "node-a",
        token: "t-a",
    };

    #[test]
    fn held_adopted_claimed_duplicate_and_absent_on_a_store_keyed_by_machine_id() {
        let held = view(vec![holder("m-a", "node-a", Some("t-a"))], false);
        assert_eq!(fence_at(&held, &ME, "k"), (Some(0), Fence::Held));
        let no_token = view(
            vec![holder("x", "n", None), holder("m-a", "?", None)],
            false,
        );
        assert_eq!(fence_at(&no_token, &ME, "k"), (Some(1), Fence::Held));
        let mut claimed = held.clone();
        claimed.holders[0].claimed_by = Some("m-b".into());
        assert!(
            matches!(fence(&claimed, &ME, "k"), Fence::Lost { why } if why.contains("m-b claimed"))
        );
        assert_eq!(release(&claimed, &ME, "k"), Ok(vec![0]));
        let dup = view(vec![holder("m-a", "node-z", Some("t-z"))], false);
        assert!(
            matches!(fence(&dup, &ME, "k"), Fence::Lost { why } if why.contains("same machine id"))
        );
        assert!(matches!(release(&dup, &ME, "k"), Err(AnotherHost { .. })));
        let none = view(vec![holder("m-b", "node-b", Some("t-b"))], false);
        assert!(
            matches!(fence(&none, &ME, "k"), Fence::Lost { why } if why.contains("holds no slot of k"))
        );
        assert_eq!(release(&none, &ME, "k"), Ok(vec![]));
    }

    /// Where the store authenticated nodes, a slot under another node with my machine id and
    /// token is neither held nor freed; every slot under my node is, past `max` too.
    #[test]
    fn on_a_store_keyed_by_node_only_my_nodes_slots_count() {
        let forged = view(
            vec![
                holder("m-a", "node-x", Some("t-a")),
                holder("m-old", "node-a", None),
            ],
            true,
        );
        assert_eq!(fence_at(&forged, &ME, "Leases"), (Some(1), Fence::Held));
        assert_eq!(release(&forged, &ME, "Leases"), Ok(vec![1]));
        let only_forged = view(vec![holder("m-a", "node-x", Some("t-a"))], true);
        assert!(
            matches!(fence(&only_forged, &ME, "Leases"), Fence::Lost { why } if why.contains("node node-a (m-a)"))
        );
        assert_eq!(release(&only_forged, &ME, "Leases"), Ok(vec![]));
        let mut foreign = view(vec![holder("m-a", "node-a", Some("t-a"))], true);
        foreign.holders[0].foreign = Some("past max".into());
        assert_eq!(
            fence(&foreign, &ME, "Leases"),
            Fence::Held,
            "past a forced-down max"
        );
        assert_eq!(release(&foreign, &ME, "Leases"), Ok(vec![0]));
    }
}
