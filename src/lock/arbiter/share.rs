//! `lock.max = "N%"` on a store that keeps no list of the group's nodes (etcd v3 and v2): the
//! nodes it is a share of are the ones the store shows, counted here. Pure.
//!
//! A node is *known* when its id is among the group's readable fleet member records
//! (`…/rebootd/agents/<id>`, docs/fleet-view.md), its holders or its readable waiter entries;
//! each id counts once. A record or entry that does not parse does not count: counting more
//! nodes raises the share, the unsafe side, and a value nobody can read says nothing about a
//! node. The adapters give every id in the same form (as escaped in the store's keys).
//!
//! The share replaces the document's `max` for this node's decisions only ([`effective_max`]);
//! the document is not rewritten, so a node without `lock.max` (or locksmithd, on v2) goes on by
//! the document's count.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use super::zones::share_of;

/// What a share of the known nodes made of `max`, for `rebootctl status` and `fleet`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Share {
    /// `lock.max = "N%"`.
    pub percent: u8,
    /// The nodes it is a share of.
    pub known: u64,
    /// The count the store keeps (the document's `max`, the control Lease's), not used.
    pub stored_max: u64,
}

impl Share {
    /// The slots: `percent` of `known` ([`share_of`]: rounded down, at least one).
    pub fn max(&self) -> u64 {
        share_of(self.percent, self.known)
    }

    /// In words, for a share kept on `backend`: `"20% of 10 known nodes; the document says 1"`
    /// (etcd), `"…; the control Lease says 1"` (Leases).
    pub fn describe(&self, backend: crate::lock::Backend) -> String {
        let kept = match backend {
            crate::lock::Backend::Kubernetes => "the control Lease",
            _ => "the document",
        };
        format!(
            "{}% of {} known nodes; {kept} says {}",
            self.percent, self.known, self.stored_max
        )
    }
}

/// The distinct ids among `members`, `holders` and `waiters`.
pub fn known_nodes<'a>(
    members: impl IntoIterator<Item = &'a str>,
    holders: impl IntoIterator<Item = &'a str>,
    waiters: impl IntoIterator<Item = &'a str>,
) -> u64 {
    let ids: BTreeSet<&str> = members.into_iter().chain(holders).chain(waiters).collect();
    u64::try_from(ids.len()).unwrap_or(u64::MAX)
}

/// [`known_nodes`] where the readable member records are a map already: `members` of them,
/// `is_member` tells one; each of `others` (holders, waiters) counts once when not among them.
/// No set of the records is built: a waiter pays for its holders and waiters at each change,
/// not for every record.
pub fn known_beside<'a>(
    members: u64,
    is_member: impl Fn(&str) -> bool,
    others: impl IntoIterator<Item = &'a str>,
) -> u64 {
    let rest: BTreeSet<&str> = others.into_iter().filter(|id| !is_member(id)).collect();
    members.saturating_add(u64::try_from(rest.len()).unwrap_or(u64::MAX))
}

/// The number of slots this node goes by: the share when there is one, else `stored_max`.
pub fn effective_max(share: Option<&Share>, stored_max: u64) -> u64 {
    share.map_or(stored_max, Share::max)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn share(percent: Option<u8>, stored_max: u64, known: u64) -> Option<Share> {
        percent.map(|percent| Share {
            percent,
            known,
            stored_max,
        })
    }

    #[test]
    fn each_id_counts_once_across_records_holders_and_waiters() {
        let members = ["a", "b", "c"];
        // A locksmithd holder without a record, a waiter that wrote none yet, a holder and a
        // waiter that did.
        assert_eq!(known_nodes(members, ["a", "ls"], ["c", "w"]), 5);
        assert_eq!(known_nodes([], [], []), 0);
        assert_eq!(known_nodes(["x", "x"], ["x"], ["x"]), 1);
    }

    #[test]
    fn the_share_replaces_the_stored_max_only_when_configured() {
        assert_eq!(effective_max(None, 1), 1);
        let s = share(Some(20), 1, 10).unwrap();
        assert_eq!((s.max(), effective_max(Some(&s), 1)), (2, 2));
        assert_eq!(share(None, 3, 10), None);
        // Fewer known nodes than it takes for one slot: still one.
        assert_eq!(share(Some(10), 5, 3).unwrap().max(), 1);
    }

    /// A small deterministic generator (xorshift), so the properties run on many inputs
    /// without a crate.
    fn ids(seed: &mut u64, n: usize) -> Vec<String> {
        (0..n)
            .map(|_| {
                *seed ^= *seed << 13;
                *seed ^= *seed >> 7;
                *seed ^= *seed << 17;
                format!("m{}", *seed % 40)
            })
            .collect()
    }

    fn strs(v: &[String]) -> Vec<&str> {
        v.iter().map(String::as_str).collect()
    }

    /// The count is the size of the union: order and repeats do not matter; it is at least
    /// each part's and at most their sum; adding an id never lowers it (so neither the share).
    #[test]
    fn the_count_is_the_size_of_the_union() {
        let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
        for round in 0..500 {
            let (m, h, w) = (
                ids(&mut seed, round % 30),
                ids(&mut seed, round % 4),
                ids(&mut seed, round % 13),
            );
            let (m, h, w) = (strs(&m), strs(&h), strs(&w));
            let k = known_nodes(m.clone(), h.clone(), w.clone());
            let distinct = |v: &[&str]| v.iter().collect::<BTreeSet<_>>().len() as u64;
            assert!(k >= distinct(&m) && k >= distinct(&h) && k >= distinct(&w));
            assert!(k <= distinct(&m) + distinct(&h) + distinct(&w));
            let mut rev = m.clone();
            rev.reverse();
            assert_eq!(known_nodes(w.clone(), rev, h.clone()), k, "order");
            let set: BTreeSet<&str> = m.iter().copied().collect();
            let beside = known_beside(
                set.len() as u64,
                |id| set.contains(id),
                h.iter().chain(&w).copied(),
            );
            assert_eq!(beside, k, "known_beside");
            let more = known_nodes(m.iter().copied().chain(["new"]), h.clone(), w.clone());
            assert!(more >= k && more <= k + 1);
            for p in [1u8, 10, 20, 50, 100] {
                let s = |known| share(Some(p), 1, known).unwrap().max();
                assert!(s(more) >= s(k));
            }
        }
    }
}
