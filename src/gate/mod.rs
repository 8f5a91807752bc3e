//! Gates before a reboot (and checks after one): conditions outside rebootd that must hold for
//! it to go on, each answering [`Verdict::Go`] or [`Verdict::Wait`] with what it waits for, in
//! words, for `rebootctl status`.
//!
//! - [`command`]: a program; exit status 0 = go (kured's and FLUO's hooks);
//! - [`prometheus`]: a PromQL query that must return nothing, or the firing alerts matching a
//!   selector, minus those an Alertmanager silence covers (kured's `--prometheus-url`);
//! - [`node`]: annotations other controllers set on this Node (FLUO's before-reboot checks);
//!   asked only once the slot is held, and it keeps the slot while it waits;
//! - [`pods`]: after the boot, the pods on this node matching a selector all Ready.
//!
//! `[[gates.after_boot]]` are asked after the boot once the node is Ready, before the uncordon
//! and the release; the slot is held while one waits.
//!
//! A gate that cannot be evaluated (program missing, Prometheus unreachable) answers `Wait`
//! with the reason: a gate fails closed.
//!
//! Configured under `[gates]` ([`crate::config::Gates`]); the runtime asks [`Gates::check`]
//! before taking a slot, before the cordon and before the call to logind.

pub mod command;
pub mod node;
pub mod pods;
pub mod prometheus;

/// A gate's cleanup that failed (the Node gates' label and annotations, see [`Gates::used`]).
#[derive(Debug, thiserror::Error)]
pub enum GateError {
    #[error("gate {name:?}: {error}")]
    Node {
        name: String,
        error: node::NodeGateError,
    },
}

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
    Node(Box<node::NodeGate>),
    Pods(Box<pods::PodsGate>),
}

impl Gate {
    pub async fn check(&self) -> Verdict {
        match self {
            Gate::Command(g) => g.check().await,
            Gate::Query(g) => g.check().await,
            Gate::Alerts(g) => g.check().await,
            Gate::Node(g) => g.check().await,
            Gate::Pods(g) => g.check().await,
        }
    }

    /// Whether the node keeps its slot while this gate waits (and it is asked only once the
    /// slot is held): a gate whose checks run for the node about to reboot.
    pub fn holds_slot(&self) -> bool {
        matches!(self, Gate::Node(_))
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

/// A gate with the name it is shown by.
#[derive(Debug, Clone)]
pub struct Named {
    pub name: String,
    pub gate: Gate,
}

/// The gate that said wait, and what it waits for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Closed {
    pub name: String,
    pub why: String,
    /// The node keeps its slot while this gate waits.
    pub hold: bool,
}

/// Where the gates are asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Before taking a slot: the gates that hold the slot are not asked yet.
    BeforeSlot,
    /// With the slot held (before the cordon, before the call to logind): every gate.
    WithSlot,
}

/// The configured gates before a reboot, in order.
#[derive(Debug, Clone, Default)]
pub struct Gates(pub Vec<Named>);

impl Gates {
    /// Build the configured gates (the HTTP clients of the Prometheus ones); `kube` (a client
    /// and this node's name) is needed by the Node gates.
    pub fn from_config(
        gates: &[crate::config::GateSpec],
        kube: Option<(&kube::Client, &str)>,
    ) -> Result<Gates, crate::http::SetupError> {
        use crate::config::GateCheck;
        let mut out = Vec::new();
        for spec in gates {
            let gate = match &spec.check {
                GateCheck::Command { argv } => Gate::Command(command::CommandGate {
                    argv: argv.clone(),
                    timeout: spec.timeout,
                }),
                GateCheck::Query { prometheus, query } => Gate::Query(Box::new(
                    prometheus::QueryGate::new(&spec.key, prometheus, query, spec.timeout)?,
                )),
                GateCheck::Alerts {
                    prometheus,
                    alertmanager_url,
                    selector,
                } => Gate::Alerts(Box::new(prometheus::AlertsGate::new(
                    &spec.key,
                    prometheus,
                    alertmanager_url.as_deref(),
                    selector.clone(),
                    spec.timeout,
                )?)),
                GateCheck::NodeAnnotations { label, annotations } => match kube {
                    Some((client, node)) => Gate::Node(Box::new(node::NodeGate::new(
                        client.clone(),
                        node,
                        label,
                        annotations,
                    ))),
                    None => return Err(needs_kube(&spec.name)),
                },
                GateCheck::PodsReady { selector } => match kube {
                    Some((client, node)) => Gate::Pods(Box::new(pods::PodsGate::new(
                        client.clone(),
                        node,
                        selector,
                    ))),
                    None => return Err(needs_kube(&spec.name)),
                },
            };
            out.push(Named {
                name: spec.name.clone(),
                gate,
            });
        }
        Ok(Gates(out))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether a gate reading the Kubernetes API is configured (it needs a client).
    pub fn needs_kube(specs: &[crate::config::GateSpec]) -> bool {
        specs.iter().any(|s| s.check.needs_kube())
    }

    /// Ask every gate of `stage` in order: `None` when all say go, else the first that says
    /// wait (the later ones are not asked).
    pub async fn check(&self, stage: Stage) -> Option<Closed> {
        for g in &self.0 {
            if stage == Stage::BeforeSlot && g.gate.holds_slot() {
                continue;
            }
            if let Verdict::Wait(why) = g.gate.check().await {
                return Some(Closed {
                    name: g.name.clone(),
                    why,
                    hold: g.gate.holds_slot(),
                });
            }
        }
        None
    }

    /// Every gate went right before the call to logind: the Node gates' label and annotations
    /// are removed, so the next reboot needs fresh checks.
    pub async fn used(&self) -> Result<(), GateError> {
        for g in &self.0 {
            if let Gate::Node(n) = &g.gate {
                n.clear().await.map_err(|error| GateError::Node {
                    name: g.name.clone(),
                    error,
                })?;
            }
        }
        Ok(())
    }
}

fn needs_kube(name: &str) -> crate::http::SetupError {
    crate::http::SetupError(format!(
        "gate {name:?} reads the Kubernetes API: it needs [kubernetes]"
    ))
}

/// The gates before the reboot and the checks after the boot.
#[derive(Debug, Clone, Default)]
pub struct GateSets {
    pub before_reboot: Gates,
    pub after_boot: Gates,
}
