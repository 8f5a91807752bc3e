//! The faults of a multi-member etcd (`--etcd-members 3`): the leader killed, a follower stopped
//! and restarted, a member cut off from the others, and the member a node is talking to cut off
//! from the others (a partition that leaves that node on the minority side). One at a time, so
//! that two members always have a quorum. And where the outside watchers and the checker's
//! reads go: to a member the lab is not disrupting ([`EtcdAt`]).

use super::trial::{ChaosNode, Shared};
use super::Rng;
use crate::cut_proxy::CutMode;
use crate::etcd_cluster::EtcdCluster;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A fault of one member.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum MemberFault {
    /// The leader (found through the members' status) killed (SIGKILL), restarted 0.2-2.5 s
    /// later with its data.
    Leader,
    /// A follower stopped (SIGTERM), restarted 0.2-2.5 s later.
    Follower,
    /// A member (the leader in half of the cuts) cut off from the others for 0.5-10 s; its
    /// clients still reach it.
    Partition,
    /// The member a node's rebootd has a connection to (else its first endpoint) cut off from
    /// the others for 0.5-10 s.
    Isolate,
}

impl MemberFault {
    pub const ALL: [MemberFault; 4] = [
        MemberFault::Leader,
        MemberFault::Follower,
        MemberFault::Partition,
        MemberFault::Isolate,
    ];

    /// `leader,follower,partition,isolate` (any of them).
    pub fn parse_list(s: &str) -> Result<Vec<MemberFault>, String> {
        let mut out: Vec<MemberFault> = s
            .split(',')
            .filter(|p| !p.is_empty())
            .map(|p| p.trim().parse())
            .collect::<Result<_, _>>()?;
        out.sort();
        out.dedup();
        if out.is_empty() {
            return Err("--faults: no fault named".into());
        }
        Ok(out)
    }
}

impl std::str::FromStr for MemberFault {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "leader" => Ok(MemberFault::Leader),
            "follower" => Ok(MemberFault::Follower),
            "partition" => Ok(MemberFault::Partition),
            "isolate" => Ok(MemberFault::Isolate),
            other => Err(format!(
                "fault {other:?}: expected leader, follower, partition or isolate"
            )),
        }
    }
}

impl std::fmt::Display for MemberFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            MemberFault::Leader => "leader",
            MemberFault::Follower => "follower",
            MemberFault::Partition => "partition",
            MemberFault::Isolate => "isolate",
        })
    }
}

/// Where the outside watchers and the checker's reads reach etcd: one server, or the members
/// of a cluster, of which they use one the lab is not disrupting.
#[derive(Debug, Clone)]
pub(super) struct EtcdAt {
    endpoints: Vec<String>,
    faulted: Option<tokio::sync::watch::Receiver<BTreeSet<usize>>>,
}

impl EtcdAt {
    pub fn single(endpoint: String) -> EtcdAt {
        EtcdAt {
            endpoints: vec![endpoint],
            faulted: None,
        }
    }

    pub fn cluster(c: &EtcdCluster) -> EtcdAt {
        EtcdAt {
            endpoints: c.endpoints(),
            faulted: Some(c.faulted()),
        }
    }

    /// The first member the lab is not disrupting now (the first member if it disrupts all).
    pub fn healthy(&self) -> (usize, String) {
        let faulted = self
            .faulted
            .as_ref()
            .map(|f| f.borrow().clone())
            .unwrap_or_default();
        let i = (0..self.endpoints.len())
            .find(|i| !faulted.contains(i))
            .unwrap_or(0);
        (i, self.endpoints[i].clone())
    }

    /// Resolves once the lab disrupts member `i` (never for a single server).
    pub async fn disrupted(&self, i: usize) {
        let Some(f) = &self.faulted else {
            return std::future::pending().await;
        };
        let mut f = f.clone();
        if f.wait_for(|f| f.contains(&i)).await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// Wait `d`, or less when the chaos stops.
async fn hold(shared: &Shared, d: Duration) {
    let until = Instant::now() + d;
    while !shared.stopped() && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(50).min(until - Instant::now())).await;
    }
}

/// The leader, once the members agree on one (within 10 s).
async fn leader(c: &EtcdCluster) -> Option<usize> {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if let Some(l) = c.leader().await {
            return Some(l);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    None
}

/// The members' chaos: up to `actions` of `faults`, one at a time, each after a pause of
/// 0.2-1.5 s, until the rollout is done.
pub(super) async fn chaos(
    mut rng: Rng,
    actions: usize,
    faults: Vec<MemberFault>,
    cluster: Arc<tokio::sync::Mutex<EtcdCluster>>,
    nodes: Vec<Arc<ChaosNode>>,
    shared: Arc<Shared>,
) {
    for _ in 0..actions {
        hold(&shared, rng.ms(200, 1500)).await;
        if shared.stopped() {
            break;
        }
        fault(&mut rng, &faults, &cluster, &nodes, &shared).await;
    }
}

/// Take one of `faults` on the cluster, and undo it.
async fn fault(
    rng: &mut Rng,
    faults: &[MemberFault],
    cluster: &tokio::sync::Mutex<EtcdCluster>,
    nodes: &[Arc<ChaosNode>],
    shared: &Shared,
) {
    let kind = *rng.pick(faults);
    let mut c = cluster.lock().await;
    let Some(lead) = leader(&c).await else {
        shared.problem(format!("{kind}: no etcd leader within 10 s"));
        return;
    };
    let (member, what) = match kind {
        MemberFault::Leader => (lead, kind.to_string()),
        MemberFault::Follower => {
            let others: Vec<usize> = (0..c.size()).filter(|i| *i != lead).collect();
            (*rng.pick(&others), kind.to_string())
        }
        MemberFault::Partition => {
            let m = if rng.chance(50) {
                lead
            } else {
                rng.below(c.size() as u64) as usize
            };
            let what = if m == lead {
                "partition (leader)"
            } else {
                "partition"
            };
            (m, what.to_string())
        }
        MemberFault::Isolate => {
            let n = rng.pick(nodes).clone();
            let (m, how) = member_of(&c, &n).await;
            (m, format!("isolate ({how})"))
        }
    };
    shared.stats(|s| *s.member_faults.entry(what.clone()).or_default() += 1);
    c.mark(member, true);
    let result = match kind {
        MemberFault::Leader | MemberFault::Follower => {
            let stopped = if kind == MemberFault::Leader {
                c.kill(member).await
            } else {
                c.stop(member).await
            };
            hold(shared, rng.ms(200, 2500)).await;
            match stopped {
                Ok(()) => c.restart(member).await,
                Err(e) => Err(e),
            }
        }
        MemberFault::Partition | MemberFault::Isolate => {
            let mode = if rng.chance(50) {
                CutMode::Blackhole
            } else {
                CutMode::Reset
            };
            c.cut_off(member, mode);
            hold(shared, rng.ms(500, 10_000)).await;
            c.reconnect();
            c.wait_ready(member).await
        }
    };
    if let Err(e) = result {
        shared.problem(format!("{what} of etcd member {}: {e}", c.name(member)));
        return;
    }
    c.mark(member, false);
}

/// The member node `n`'s rebootd is talking to: one it has a connection to, else the first of
/// its endpoints (its order); and which of the two it was.
async fn member_of(c: &EtcdCluster, n: &ChaosNode) -> (usize, &'static str) {
    let pid = n.node.lock().await.daemon_pid();
    let used = pid.map(|p| c.members_used_by(p)).unwrap_or_default();
    match used.first() {
        Some(m) => (*m, "connected"),
        None => (
            node_order(c.size(), node_index(&n.name))[0],
            "first endpoint",
        ),
    }
}

/// `node-3` is node 2.
fn node_index(name: &str) -> usize {
    name.rsplit('-')
        .next()
        .and_then(|i| i.parse::<usize>().ok())
        .map_or(0, |i| i.saturating_sub(1))
}

/// The order in which node `i` lists the members: each node starts one further.
pub(super) fn node_order(members: usize, i: usize) -> Vec<usize> {
    (0..members).map(|k| (i + k) % members).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn faults_parse_and_nodes_list_members_in_different_orders() {
        assert_eq!(
            MemberFault::parse_list("partition,leader,leader").unwrap(),
            vec![MemberFault::Leader, MemberFault::Partition]
        );
        assert!(MemberFault::parse_list("leader,bogus").is_err());
        assert_eq!(node_order(3, 0), vec![0, 1, 2]);
        assert_eq!(node_order(3, 4), vec![1, 2, 0]);
        assert_eq!(node_index("node-3"), 2);
    }
}
