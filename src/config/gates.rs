//! `[gates]`: conditions outside rebootd that must hold before a reboot (see `crate::gate`).
//! Each gate is one of: a command, a Prometheus query or alerts, Node annotations, Ready pods;
//! `before_reboot` or `after_boot`. The keys and an example: docs/configuration.md, `[gates]`.
//!
//! The raw input is read here and validated into [`Gates`]; every error names the file, the
//! key (`gates.before_reboot[2].query`) and the value.

use super::values::HumanDuration;
use super::{file_of, ConfigError};
use crate::gate::prometheus::{Access, Matcher};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

/// How often a closed gate is asked again unless configured: often enough that a reboot
/// follows a resolved alert within a minute, rarely enough to cost Prometheus nothing.
const DEFAULT_INTERVAL: Duration = Duration::from_secs(60);

/// How long one check may take unless configured (a command, an HTTP request).
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// Least interval: shorter would ask Prometheus or run the command in a busy loop.
const LEAST_INTERVAL: Duration = Duration::from_secs(1);

/// The label a Node gate sets while its checks run, unless configured (FLUO's is
/// `flatcar-linux-update.v1.flatcar-linux.net/before-reboot`).
pub const DEFAULT_NODE_LABEL: &str = "rebootd.io/before-reboot";

/// The label an after-boot Node gate sets (FLUO's is
/// `flatcar-linux-update.v1.flatcar-linux.net/after-reboot`).
pub const DEFAULT_AFTER_LABEL: &str = "rebootd.io/after-reboot";

/// Least timeout: no program starts and no HTTP request is answered in less.
const LEAST_TIMEOUT: Duration = Duration::from_millis(100);

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct GatesInput {
    pub interval: Option<HumanDuration>,
    pub settle: Option<HumanDuration>,
    pub before_reboot: Option<Vec<GateInput>>,
    pub after_boot: Option<Vec<GateInput>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct GateInput {
    pub name: Option<String>,
    pub command: Option<Vec<String>>,
    pub prometheus_url: Option<String>,
    pub query: Option<String>,
    pub alerts: Option<Vec<String>>,
    pub alertmanager_url: Option<String>,
    pub ca_file: Option<PathBuf>,
    pub bearer_token_file: Option<PathBuf>,
    pub node_annotations: Option<Vec<String>>,
    pub node_label: Option<String>,
    pub pods_ready: Option<String>,
    pub timeout: Option<HumanDuration>,
}

/// The validated `[gates]`.
#[derive(Debug, Clone)]
pub struct Gates {
    /// A gate that said wait is asked again after this long.
    pub interval: Duration,
    /// Asked before taking a slot, before the cordon and before the call to logind.
    pub before_reboot: Vec<GateSpec>,
    /// Asked after the boot, once the node is Ready, before the uncordon and the release; the
    /// slot is held while one waits.
    pub after_boot: Vec<GateSpec>,
    /// After the node is back (checks passed, uncordoned), hold the slot this long more.
    pub settle: Option<Duration>,
}

impl Default for Gates {
    fn default() -> Gates {
        Gates {
            interval: DEFAULT_INTERVAL,
            before_reboot: Vec::new(),
            after_boot: Vec::new(),
            settle: None,
        }
    }
}

/// One gate: its name (for status and logs) and what it asks.
#[derive(Debug, Clone)]
pub struct GateSpec {
    pub name: String,
    /// Its key, for errors: `gates.before_reboot[1]` (counted from 1).
    pub key: String,
    pub check: GateCheck,
    /// How long one check may take; longer = wait.
    pub timeout: Duration,
}

/// What a gate asks.
#[derive(Debug, Clone)]
pub enum GateCheck {
    /// A program (no shell); exit status 0 = go.
    Command { argv: Vec<String> },
    /// A PromQL query; an empty result = go.
    Query { prometheus: Access, query: String },
    /// Firing alerts matching every matcher (none = any alert); none firing = go.
    Alerts {
        prometheus: Access,
        alertmanager_url: Option<String>,
        selector: Vec<Matcher>,
    },
    /// Annotations other controllers set on this Node, each `"true"` = go; `label` is set to
    /// `"true"` while they are awaited (FLUO's before-reboot contract, `crate::gate::node`).
    NodeAnnotations {
        label: String,
        annotations: Vec<String>,
    },
    /// Pods on this node matching the label selector: every one Ready = go (after boot only).
    PodsReady { selector: String },
}

impl GateCheck {
    /// Whether it reads the Kubernetes API (needs `[kubernetes]`).
    pub fn needs_kube(&self) -> bool {
        matches!(
            self,
            GateCheck::NodeAnnotations { .. } | GateCheck::PodsReady { .. }
        )
    }
}

/// Which list a gate is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum List {
    BeforeReboot,
    AfterBoot,
}

impl List {
    fn key(self) -> &'static str {
        match self {
            List::BeforeReboot => "gates.before_reboot",
            List::AfterBoot => "gates.after_boot",
        }
    }
}

fn invalid(
    origin: &BTreeMap<String, PathBuf>,
    key: String,
    value: String,
    reason: &str,
) -> ConfigError {
    // An array is one value: the file that set `gates.before_reboot` set every gate in it.
    let table = [List::BeforeReboot.key(), List::AfterBoot.key()]
        .into_iter()
        .find(|t| key.starts_with(t))
        .unwrap_or(key.as_str())
        .to_string();
    ConfigError::Invalid {
        path: file_of(origin, &table),
        key,
        value,
        reason: reason.into(),
    }
}

fn url_ok(u: &str) -> bool {
    u.starts_with("http://") || u.starts_with("https://")
}

fn fmt(d: Duration) -> String {
    format!("\"{}\"", humantime::format_duration(d))
}

/// `has_kubernetes`: whether `[kubernetes]` is configured (a Node gate needs it).
pub(super) fn validate(
    input: Option<GatesInput>,
    has_kubernetes: bool,
    origin: &BTreeMap<String, PathBuf>,
) -> Result<Gates, ConfigError> {
    let input = input.unwrap_or_default();
    let interval = input.interval.map(|d| d.0).unwrap_or(DEFAULT_INTERVAL);
    if interval < LEAST_INTERVAL {
        return Err(invalid(
            origin,
            "gates.interval".into(),
            fmt(interval),
            "must be at least 1s: a gate would be asked in a busy loop",
        ));
    }
    let before_reboot = list(
        input.before_reboot,
        List::BeforeReboot,
        has_kubernetes,
        origin,
    )?;
    let after_boot = list(input.after_boot, List::AfterBoot, has_kubernetes, origin)?;
    Ok(Gates {
        interval,
        before_reboot,
        after_boot,
        // Zero is off, as leaving it out.
        settle: input.settle.map(|d| d.0).filter(|d| !d.is_zero()),
    })
}

/// One list of gates; those reading the Kubernetes API need `[kubernetes]`.
fn list(
    input: Option<Vec<GateInput>>,
    which: List,
    has_kubernetes: bool,
    origin: &BTreeMap<String, PathBuf>,
) -> Result<Vec<GateSpec>, ConfigError> {
    let gates = input
        .unwrap_or_default()
        .into_iter()
        .enumerate()
        .map(|(i, g)| gate(g, &format!("{}[{}]", which.key(), i + 1), which, origin))
        .collect::<Result<Vec<_>, _>>()?;
    if !has_kubernetes {
        if let Some(i) = gates.iter().position(|g| g.check.needs_kube()) {
            return Err(ConfigError::Missing {
                key: "kubernetes".into(),
                because: format!(
                    "{}[{}] reads this Node or its pods (set in {})",
                    which.key(),
                    i + 1,
                    file_of(origin, which.key()).display()
                ),
            });
        }
    }
    Ok(gates)
}

/// One gate; `at` is its key (`gates.before_reboot[1]`, counted from 1).
fn gate(
    g: GateInput,
    at: &str,
    which: List,
    origin: &BTreeMap<String, PathBuf>,
) -> Result<GateSpec, ConfigError> {
    let at = At { key: at, origin };
    let timeout = timeout(&g, &at)?;
    one_kind(&g, &at)?;
    let prometheus = || prometheus_access(&g.prometheus_url, &g.ca_file, &g.bearer_token_file, &at);
    let check = if let Some(argv) = g.command {
        command_check(argv, &at)?
    } else if let Some(annotations) = g.node_annotations {
        node_check(annotations, &g.node_label, which, &at)?
    } else if let Some(selector) = g.pods_ready {
        pods_check(selector, which, &at)?
    } else if let Some(query) = g.query {
        query_check(query, &prometheus, &at)?
    } else {
        alerts_check(
            g.alerts.unwrap_or_default(),
            &prometheus,
            &g.alertmanager_url,
            &at,
        )?
    };
    if !matches!(check, GateCheck::Query { .. } | GateCheck::Alerts { .. }) {
        no_prometheus_keys((&g.prometheus_url, &g.ca_file, &g.bearer_token_file), &at)?;
    }
    no_keys_of_other_kinds(&check, &g.node_label, &g.alertmanager_url, &at)?;
    Ok(GateSpec {
        name: gate_name(g.name, &check, &at)?,
        key: at.key.to_string(),
        check,
        timeout,
    })
}

/// Where a gate is, for its errors.
struct At<'a> {
    /// `gates.before_reboot[1]`.
    key: &'a str,
    origin: &'a BTreeMap<String, PathBuf>,
}

impl At<'_> {
    /// The error for `key` of this gate.
    fn bad(&self, key: &str, value: String, reason: &str) -> ConfigError {
        invalid(self.origin, format!("{}.{key}", self.key), value, reason)
    }
}

/// `timeout`: the default, or at least [`LEAST_TIMEOUT`].
fn timeout(g: &GateInput, at: &At) -> Result<Duration, ConfigError> {
    let timeout = g.timeout.map(|d| d.0).unwrap_or(DEFAULT_TIMEOUT);
    if timeout < LEAST_TIMEOUT {
        return Err(at.bad(
            "timeout",
            fmt(timeout),
            "must be at least 100ms: no check answers in less",
        ));
    }
    Ok(timeout)
}

/// A gate asks exactly one thing.
fn one_kind(g: &GateInput, at: &At) -> Result<(), ConfigError> {
    let kinds: Vec<&str> = [
        ("command", g.command.is_some()),
        ("query", g.query.is_some()),
        ("alerts", g.alerts.is_some()),
        ("node_annotations", g.node_annotations.is_some()),
        ("pods_ready", g.pods_ready.is_some()),
    ]
    .into_iter()
    .filter(|(_, set)| *set)
    .map(|(k, _)| k)
    .collect();
    if kinds.len() != 1 {
        return Err(invalid(
            at.origin,
            at.key.to_string(),
            format!("{kinds:?}"),
            "a gate has exactly one of `command`, `query`, `alerts`, `node_annotations` or `pods_ready`",
        ));
    }
    Ok(())
}

/// How a `query` or `alerts` gate reaches Prometheus.
fn prometheus_access(
    url: &Option<String>,
    ca_file: &Option<PathBuf>,
    bearer_token_file: &Option<PathBuf>,
    at: &At,
) -> Result<Access, ConfigError> {
    match url {
        Some(u) if url_ok(u) => Ok(Access {
            url: u.clone(),
            ca_file: ca_file.clone(),
            bearer_token_file: bearer_token_file.clone(),
        }),
        other => Err(at.bad(
            "prometheus_url",
            format!("{:?}", other.clone().unwrap_or_default()),
            "a `query` or `alerts` gate needs an http:// or https:// prometheus_url",
        )),
    }
}

/// `command`: a program and its arguments.
fn command_check(argv: Vec<String>, at: &At) -> Result<GateCheck, ConfigError> {
    if argv.first().is_none_or(|p| p.is_empty()) {
        return Err(at.bad(
            "command",
            format!("{argv:?}"),
            "the command must name a program",
        ));
    }
    Ok(GateCheck::Command { argv })
}

/// `node_annotations`, and the label set while they are awaited (a default per list).
fn node_check(
    annotations: Vec<String>,
    node_label: &Option<String>,
    which: List,
    at: &At,
) -> Result<GateCheck, ConfigError> {
    if annotations.is_empty() {
        return Err(at.bad(
            "node_annotations",
            "[]".into(),
            "name at least one annotation",
        ));
    }
    if let Some(k) = annotations.iter().find(|k| !is_key(k)) {
        return Err(at.bad(
            "node_annotations",
            format!("{k:?}"),
            "not a Kubernetes annotation key ([prefix/]name)",
        ));
    }
    let label = node_label.clone().unwrap_or_else(|| {
        match which {
            List::BeforeReboot => DEFAULT_NODE_LABEL,
            List::AfterBoot => DEFAULT_AFTER_LABEL,
        }
        .to_string()
    });
    if !is_key(&label) {
        return Err(at.bad(
            "node_label",
            format!("{label:?}"),
            "not a Kubernetes label key ([prefix/]name)",
        ));
    }
    Ok(GateCheck::NodeAnnotations { label, annotations })
}

/// `pods_ready`: a label selector, after the boot only.
fn pods_check(selector: String, which: List, at: &At) -> Result<GateCheck, ConfigError> {
    if which != List::AfterBoot {
        return Err(at.bad(
            "pods_ready",
            format!("{selector:?}"),
            "pods are checked after the boot: put this gate in [[gates.after_boot]]",
        ));
    }
    if selector.trim().is_empty() || selector.chars().any(char::is_control) {
        return Err(at.bad(
            "pods_ready",
            format!("{selector:?}"),
            "a label selector such as \"app=csi-node\"",
        ));
    }
    Ok(GateCheck::PodsReady {
        selector: selector.trim().to_string(),
    })
}

/// How a `query` or `alerts` gate reaches Prometheus, read once the gate's own key is checked.
type Prometheus<'a> = dyn Fn() -> Result<Access, ConfigError> + 'a;

/// `query`: a PromQL query, not empty.
fn query_check(query: String, prometheus: &Prometheus, at: &At) -> Result<GateCheck, ConfigError> {
    if query.trim().is_empty() {
        return Err(at.bad(
            "query",
            format!("{query:?}"),
            "the PromQL query must not be empty",
        ));
    }
    Ok(GateCheck::Query {
        prometheus: prometheus()?,
        query,
    })
}

/// `alerts`: label matchers, and where Alertmanager's silences are read, if anywhere.
fn alerts_check(
    matchers: Vec<String>,
    prometheus: &Prometheus,
    alertmanager_url: &Option<String>,
    at: &At,
) -> Result<GateCheck, ConfigError> {
    let selector = matchers
        .iter()
        .map(|m| Matcher::parse(m))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| at.bad("alerts", format!("{matchers:?}"), &e.to_string()))?;
    let prometheus = prometheus()?;
    let alertmanager_url = match alertmanager_url {
        Some(u) if !url_ok(u) => {
            return Err(at.bad(
                "alertmanager_url",
                format!("{u:?}"),
                "not an http:// or https:// URL",
            ))
        }
        other => other.clone(),
    };
    Ok(GateCheck::Alerts {
        prometheus,
        alertmanager_url,
        selector,
    })
}

/// A gate has no key that only another kind of gate reads: `node_label`, `alertmanager_url`.
fn no_keys_of_other_kinds(
    check: &GateCheck,
    node_label: &Option<String>,
    alertmanager_url: &Option<String>,
    at: &At,
) -> Result<(), ConfigError> {
    if let (Some(l), false) = (
        node_label,
        matches!(check, GateCheck::NodeAnnotations { .. }),
    ) {
        return Err(at.bad(
            "node_label",
            format!("{l:?}"),
            "only a `node_annotations` gate sets a label",
        ));
    }
    if let (
        Some(u),
        GateCheck::Command { .. }
        | GateCheck::Query { .. }
        | GateCheck::NodeAnnotations { .. }
        | GateCheck::PodsReady { .. },
    ) = (alertmanager_url, check)
    {
        return Err(at.bad(
            "alertmanager_url",
            format!("{u:?}"),
            "only an `alerts` gate reads Alertmanager's silences",
        ));
    }
    Ok(())
}

/// `name`: not empty; what the gate asks when not given.
fn gate_name(name: Option<String>, check: &GateCheck, at: &At) -> Result<String, ConfigError> {
    match name {
        Some(n) if n.trim().is_empty() => {
            Err(at.bad("name", format!("{n:?}"), "a gate's name must not be empty"))
        }
        Some(n) => Ok(n),
        None => Ok(default_name(check)),
    }
}

/// A gate that asks no Prometheus has none of its keys.
/// `keys`: its `prometheus_url`, `ca_file` and `bearer_token_file`.
fn no_prometheus_keys(
    keys: (&Option<String>, &Option<PathBuf>, &Option<PathBuf>),
    at: &At,
) -> Result<(), ConfigError> {
    let (url, ca_file, bearer_token_file) = keys;
    let why = "only a `query` or `alerts` gate asks Prometheus";
    if let Some(u) = url {
        return Err(at.bad("prometheus_url", format!("{u:?}"), why));
    }
    for (key, file) in [
        ("ca_file", ca_file),
        ("bearer_token_file", bearer_token_file),
    ] {
        if let Some(f) = file {
            return Err(at.bad(key, format!("{:?}", f.display().to_string()), why));
        }
    }
    Ok(())
}

/// A gate's name when none is given: what it asks, briefly.
fn default_name(check: &GateCheck) -> String {
    match check {
        GateCheck::Command { argv } => {
            let program = argv.first().map(String::as_str).unwrap_or("");
            let base = program.rsplit('/').next().unwrap_or(program);
            format!("command {base}")
        }
        GateCheck::Query { .. } => "prometheus query".into(),
        GateCheck::Alerts { .. } => "prometheus alerts".into(),
        GateCheck::NodeAnnotations { .. } => "node annotations".into(),
        GateCheck::PodsReady { selector } => format!("pods {selector}"),
    }
}

/// A Kubernetes label or annotation key: an optional DNS-subdomain prefix and `/`, then a name
/// of at most 63 characters, alphanumeric at both ends, `-`, `_`, `.` inside.
pub(crate) fn is_key(key: &str) -> bool {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    let name_ok = !name.is_empty()
        && name.len() <= 63
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    let prefix_ok = prefix.is_none_or(|p| {
        !p.is_empty()
            && p.len() <= 253
            && p.split('.').all(|part| {
                !part.is_empty()
                    && part.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
                    && part.ends_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
                    && part
                        .chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            })
    });
    name_ok && prefix_ok
}
