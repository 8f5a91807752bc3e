//! Gates before a reboot (and checks after one): conditions outside rebootd that must hold for
//! it to go on, each answering [`Verdict::Go`] or [`Verdict::Wait`] with what it waits for, in
//! words, for `rebootctl status`.
//!
//! - [`command`]: a program; exit status 0 = go (kured's and FLUO's hooks);
//! - [`prometheus`]: a PromQL query that must return nothing, or the firing alerts matching a
//!   selector, minus those an Alertmanager silence covers (kured's `--prometheus-url`).
//!
//! A gate that cannot be evaluated (program missing, Prometheus unreachable) answers `Wait`
//! with the reason: a gate fails closed. Not wired into the agent yet (issue 15).

pub mod command;
pub mod prometheus;

/// What a gate says now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Go,
    /// Not yet: what it waits for.
    Wait(String),
}

/// One configured gate.
#[derive(Debug, Clone)]
pub enum Gate {
    Command(command::CommandGate),
    Query(Box<prometheus::QueryGate>),
    Alerts(Box<prometheus::AlertsGate>),
}

impl Gate {
    pub async fn check(&self) -> Verdict {
        match self {
            Gate::Command(g) => g.check().await,
            Gate::Query(g) => g.check().await,
            Gate::Alerts(g) => g.check().await,
        }
    }
}

/// Every gate, in order: `Go` when all say go, else the first `Wait`.
pub async fn check_all(gates: &[Gate]) -> Verdict {
    for g in gates {
        if let Verdict::Wait(why) = g.check().await {
            return Verdict::Wait(why);
        }
    }
    Verdict::Go
}
