//! The watches of the holders' Nodes, kept while first in the queue: a holder whose Node was
//! deleted (or registered again under another uid) is gone, and its slot may be reclaimed
//! without `max_hold`.

use std::collections::{BTreeSet, HashMap};

use futures_util::stream::SelectAll;
use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::runtime::watcher;

use super::super::calls::NodeLookup;
use super::{LeaseWaiting, NodeEvents};
use crate::lock::LockError;

/// The watchers of the holders' Nodes (head of the queue only).
#[derive(Default)]
pub(super) struct NodeWatches {
    /// The holders watched: (node, uid recorded on the slot).
    pub(super) watched: BTreeSet<(String, String)>,
    /// Nodes whose watch was refused: not watched again.
    pub(super) refused: BTreeSet<String>,
    /// Whether each node's current list found it.
    pub(super) found: HashMap<String, bool>,
    pub(super) streams: SelectAll<NodeEvents>,
}

impl LeaseWaiting<'_> {
    /// Our own Node's uid, looked up once per `acquire`.
    pub(super) async fn own_node_uid(&mut self) -> Result<Option<String>, LockError> {
        if let Some(uid) = &self.own_node_uid {
            return Ok(uid.clone());
        }
        let node = &self.me.node;
        let uid = match self.store.node_lookup(node).await? {
            NodeLookup::Found { uid, zone } if !uid.is_empty() => {
                self.own_zone = zone;
                Some(uid)
            }
            NodeLookup::Found { .. } | NodeLookup::Missing => {
                tracing::info!(%node, "no Node object of this name: the slot will carry no node uid, so it is never reclaimed for a missing Node (only by lock.max_hold)");
                None
            }
            NodeLookup::Unknown(reason) => {
                tracing::warn!(%node, %reason, "cannot read our own Node: the slot will carry no node uid, so it is never reclaimed for a missing Node");
                None
            }
        };
        if self.store.max_per_zone.is_some() && self.own_zone.is_none() {
            tracing::warn!(%node, label = %self.store.zone_label, "no zone from our own Node's label: under lock.max_per_zone this node counts as in every zone, so it takes a slot only when every zone has room");
        }
        self.own_node_uid = Some(uid.clone());
        Ok(uid)
    }

    /// Watch the Nodes of the holders that recorded one while first in the queue (`head`);
    /// forget them otherwise. Restarted only when the holders change.
    pub(super) fn sync_node_watches(&mut self, head: bool) -> Result<(), LockError> {
        let mut want = BTreeSet::new();
        if head {
            for (_, h) in self.snap()?.held() {
                if let Some(uid) = &h.node_uid {
                    if !self.nodes.refused.contains(&h.node) {
                        want.insert((h.node.clone(), uid.clone()));
                    }
                }
            }
        }
        let held: BTreeSet<&String> = want.iter().map(|(n, _)| n).collect();
        self.gone.retain(|node, _| held.contains(node));
        if want == self.nodes.watched {
            return Ok(());
        }
        let mut streams = SelectAll::new();
        for (node, _) in &want {
            let config = watcher::Config::default()
                .fields(&format!("metadata.name={node}"))
                .timeout(self.store.timeouts.watch.as_secs().clamp(1, 290 * 60) as u32);
            let name = node.clone();
            streams.push(
                watcher::watcher(self.store.nodes.clone(), config)
                    .map(move |e| (name.clone(), e))
                    .boxed(),
            );
        }
        self.nodes.streams = streams;
        self.nodes.found.clear();
        self.nodes.watched = want;
        Ok(())
    }

    /// A Node event: whether it makes a holder gone.
    pub(super) fn node_event(
        &mut self,
        node: String,
        event: Result<watcher::Event<Node>, watcher::Error>,
    ) -> bool {
        let recorded = self
            .nodes
            .watched
            .iter()
            .find(|(n, _)| *n == node)
            .map(|(_, u)| u.clone());
        let Some(uid) = recorded else {
            return false;
        };
        let why = match event {
            Ok(watcher::Event::Init) => {
                self.nodes.found.insert(node, false);
                return false;
            }
            Ok(watcher::Event::InitApply(n) | watcher::Event::Apply(n)) => {
                self.nodes.found.insert(node.clone(), true);
                match n.metadata.uid {
                    Some(now) if now != uid => format!(
                        "its Node {node} was deleted and registered again (uid {uid} is now {now})"
                    ),
                    _ => return false,
                }
            }
            Ok(watcher::Event::InitDone) => {
                if self.nodes.found.get(&node).copied().unwrap_or(false) {
                    return false;
                }
                format!("its Node {node} no longer exists")
            }
            Ok(watcher::Event::Delete(_)) => format!("its Node {node} no longer exists"),
            Err(e) => {
                if !self.node_access_warned {
                    tracing::warn!(%node, error = %e, "cannot watch a holder's Node; it is not checked for deletion");
                    self.node_access_warned = true;
                }
                self.nodes.refused.insert(node);
                return false;
            }
        };
        tracing::info!(%node, %why, "a holder's Node is gone");
        self.gone.insert(node, (uid, why));
        true
    }
}
