//! Configuration: TOML fragments merged in file-name order into one validated [`Config`].
//!
//! Each fragment is first parsed on its own into the raw input types (so a wrong key, type or value
//! is reported with the file, line and key), then the fragments are merged key by key (later
//! wins), then cross-field rules are checked, naming the file that set the offending key.

mod input;
mod values;

use input::ConfigInput;
pub use values::{parse_duration, HumanDuration};

use crate::window::{Window, Windows};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Where fragments are looked for when no `--config` is given, in order.
pub const SEARCH_DIRS: [&str; 2] = ["/usr/lib/rebootd/config.d", "/etc/rebootd/config.d"];

/// Namespace of the Lease semaphore: its own, so node identities get Lease write access there
/// and not in kube-system, where the control plane's leader-election Leases live.
pub const DEFAULT_LEASE_NAMESPACE: &str = "rebootd";

/// Default semaphore group, as locksmith's.
pub const DEFAULT_GROUP: &str = "default";

/// How often the sentinel command runs unless configured: as kured's default check period.
const DEFAULT_SENTINEL_INTERVAL: Duration = Duration::from_secs(5 * 60);

/// How long a reboot that logind accepted may take before rebootd calls it failed and retries.
/// Ten minutes covers slow shutdowns (long-stopping services) without hiding a lost reboot.
const DEFAULT_REBOOT_TIMEOUT: Duration = Duration::from_secs(10 * 60);

/// How long to wait before asking logind again after a refusal (e.g. a block inhibitor).
const DEFAULT_REBOOT_RETRY: Duration = Duration::from_secs(60);

/// Errors that stop rebootd before it does anything. Each names the file, key and value.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read configuration {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("configuration {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("configuration {path}: key `{key}` = {value}: {reason}")]
    Invalid {
        path: PathBuf,
        key: String,
        value: String,
        reason: String,
    },
    #[error("configuration: key `{key}` is required when {because}")]
    Missing { key: String, because: String },
}

/// The validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub identity: Identity,
    pub triggers: Triggers,
    pub windows: Windows,
    pub lock: Lock,
    pub kubernetes: Option<Kubernetes>,
    pub reboot: Reboot,
    /// Where to serve Prometheus metrics; None = not served.
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// The fragments this came from, in merge order (empty = embedded default).
    pub sources: Vec<PathBuf>,
}

#[derive(Debug, Clone)]
pub struct Identity {
    pub group: String,
    pub node_name: String,
    pub machine_id_file: PathBuf,
    pub boot_id_file: PathBuf,
}

#[derive(Debug, Clone)]
pub struct Triggers {
    pub update_engine: bool,
    pub sentinel_file: Option<PathBuf>,
    pub sentinel_command: Option<Vec<String>>,
    pub sentinel_interval: Duration,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    None,
    Etcd,
    Kubernetes,
    FleetLock,
}

impl Backend {
    pub fn as_str(self) -> &'static str {
        match self {
            Backend::None => "none",
            Backend::Etcd => "etcd",
            Backend::Kubernetes => "kubernetes",
            Backend::FleetLock => "fleetlock",
        }
    }
}

#[derive(Debug, Clone)]
pub struct Lock {
    pub backend: Backend,
    /// A holder older than this, showing no progress, may be reclaimed. Off when `None`.
    pub max_hold: Option<Duration>,
    pub etcd: Option<Etcd>,
    pub kubernetes: Option<KubeLease>,
    pub fleetlock: Option<FleetLock>,
}

/// A FleetLock server (Zincati's protocol: airlock, poseidon/fleetlock).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FleetLock {
    pub url: String,
    pub ca_file: Option<PathBuf>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Etcd {
    pub endpoints: Vec<String>,
    pub ca_file: Option<PathBuf>,
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
    pub username: Option<String>,
    pub password_file: Option<PathBuf>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeLease {
    pub namespace: String,
    pub name: String,
    /// Kubeconfig for the Lease objects; default `[kubernetes].kubeconfig`, else inferred.
    pub kubeconfig: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DrainFailure {
    Abort,
    Reboot,
}

#[derive(Debug, Clone)]
pub struct Kubernetes {
    pub kubeconfig: Option<PathBuf>,
    pub drain_timeout: Duration,
    pub on_drain_failure: DrainFailure,
    /// `None` = each pod's own grace period.
    pub pod_grace_period: Option<Duration>,
    pub skip_pods: Option<String>,
    pub blocking_pods: Option<String>,
    pub ready_timeout: Duration,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Inhibitors {
    Respect,
    Ignore,
}

#[derive(Debug, Clone)]
pub struct Reboot {
    pub inhibitors: Inhibitors,
    /// After logind accepted the request: how long before rebootd declares it lost and retries.
    pub timeout: Duration,
    /// After logind refused (inhibitor, error): how long before asking again.
    pub retry_interval: Duration,
}

impl Config {
    /// Load the fragments found in [`SEARCH_DIRS`], or the embedded default when there are none.
    pub fn load_default_locations() -> Result<Config, ConfigError> {
        let mut files = Vec::new();
        for dir in SEARCH_DIRS {
            files.extend(fragments_in(Path::new(dir))?);
        }
        Config::load(&files)
    }

    /// Load and merge the given fragments in order (later wins) and validate the result.
    pub fn load(files: &[PathBuf]) -> Result<Config, ConfigError> {
        let mut merged = toml::Table::new();
        let mut origin = BTreeMap::new();
        for path in files {
            let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                path: path.clone(),
                source,
            })?;
            let table = parse_fragment(path, &text)?;
            merge(&mut merged, table, path, "", &mut origin);
        }
        let input: ConfigInput =
            toml::Value::Table(merged)
                .try_into()
                .map_err(|e: toml::de::Error| ConfigError::Parse {
                    path: files.last().cloned().unwrap_or_default(),
                    message: e.message().to_string(),
                })?;
        validate(input, &origin, files.to_vec())
    }

    /// The embedded default: update_engine trigger, no window, no lock, no drain.
    pub fn embedded_default() -> Config {
        // The empty input always validates; the fallback only guards against a future default
        // that fails its own rules, which the unit tests catch.
        validate(ConfigInput::default(), &BTreeMap::new(), Vec::new())
            .expect("the embedded default configuration is valid")
    }
}

/// The `*.toml` files of a directory in file-name order; a missing directory has none.
pub fn fragments_in(dir: &Path) -> Result<Vec<PathBuf>, ConfigError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(ConfigError::Read {
                path: dir.to_path_buf(),
                source,
            })
        }
    };
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .collect();
    files.sort();
    Ok(files)
}

/// Parse one fragment strictly (unknown keys, types and values) and return it as a table.
fn parse_fragment(path: &Path, text: &str) -> Result<toml::Table, ConfigError> {
    toml::from_str::<ConfigInput>(text).map_err(|e| ConfigError::Parse {
        path: path.to_path_buf(),
        message: e.to_string().trim_end().to_string(),
    })?;
    text.parse::<toml::Table>().map_err(|e| ConfigError::Parse {
        path: path.to_path_buf(),
        message: e.to_string().trim_end().to_string(),
    })
}

/// Merge `from` into `into`: tables key by key, anything else (arrays included) replaced.
/// Records which file set each leaf key, for error messages.
fn merge(
    into: &mut toml::Table,
    from: toml::Table,
    path: &Path,
    prefix: &str,
    origin: &mut BTreeMap<String, PathBuf>,
) {
    for (key, value) in from {
        let dotted = if prefix.is_empty() {
            key.clone()
        } else {
            format!("{prefix}.{key}")
        };
        if let toml::Value::Table(incoming) = value {
            let slot = into
                .entry(key.clone())
                .or_insert_with(|| toml::Value::Table(toml::Table::new()));
            if !slot.is_table() {
                *slot = toml::Value::Table(toml::Table::new());
            }
            if let toml::Value::Table(existing) = slot {
                merge(existing, incoming, path, &dotted, origin);
            }
        } else {
            origin.retain(|k, _| !(k == &dotted || k.starts_with(&format!("{dotted}."))));
            origin.insert(dotted, path.to_path_buf());
            into.insert(key, value);
        }
    }
}

fn file_of(origin: &BTreeMap<String, PathBuf>, key: &str) -> PathBuf {
    origin
        .get(key)
        .cloned()
        .unwrap_or_else(|| PathBuf::from("<embedded default>"))
}

fn validate(
    input: ConfigInput,
    origin: &BTreeMap<String, PathBuf>,
    sources: Vec<PathBuf>,
) -> Result<Config, ConfigError> {
    let identity_in = input.identity.unwrap_or_default();
    let identity = Identity {
        group: identity_in
            .group
            .unwrap_or_else(|| DEFAULT_GROUP.to_string()),
        node_name: identity_in.node_name.unwrap_or_else(host_name),
        machine_id_file: identity_in
            .machine_id_file
            .unwrap_or_else(|| PathBuf::from("/etc/machine-id")),
        boot_id_file: identity_in
            .boot_id_file
            .unwrap_or_else(|| PathBuf::from("/proc/sys/kernel/random/boot_id")),
    };
    if identity.group.is_empty() {
        return Err(ConfigError::Invalid {
            path: file_of(origin, "identity.group"),
            key: "identity.group".into(),
            value: "\"\"".into(),
            reason: "the group name must not be empty".into(),
        });
    }

    let triggers_in = input.triggers.unwrap_or_default();
    let triggers = Triggers {
        update_engine: triggers_in.update_engine.unwrap_or(true),
        sentinel_file: triggers_in.sentinel_file,
        sentinel_command: triggers_in.sentinel_command,
        sentinel_interval: triggers_in
            .sentinel_interval
            .map(|d| d.0)
            .unwrap_or(DEFAULT_SENTINEL_INTERVAL),
    };
    if let Some(cmd) = &triggers.sentinel_command {
        if cmd.is_empty() || cmd[0].is_empty() {
            return Err(ConfigError::Invalid {
                path: file_of(origin, "triggers.sentinel_command"),
                key: "triggers.sentinel_command".into(),
                value: format!("{cmd:?}"),
                reason: "the command must name a program".into(),
            });
        }
    }
    if triggers.sentinel_interval.is_zero() {
        return Err(ConfigError::Invalid {
            path: file_of(origin, "triggers.sentinel_interval"),
            key: "triggers.sentinel_interval".into(),
            value: "\"0s\"".into(),
            reason: "the interval must be longer than zero".into(),
        });
    }

    let windows = Windows(
        input
            .window
            .unwrap_or_default()
            .into_iter()
            .map(|w| Window {
                days: w.days.into_iter().map(|d| d.0).collect(),
                start: w.start.0,
                length: w.length.0,
                time_zone_name: w
                    .time_zone
                    .as_ref()
                    .map(|z| z.name.clone())
                    .unwrap_or_else(|| "UTC".into()),
                time_zone: w
                    .time_zone
                    .map(|z| z.zone)
                    .unwrap_or(jiff::tz::TimeZone::UTC),
            })
            .collect(),
    );

    let lock_in = input.lock.unwrap_or_default();
    let backend = lock_in.backend.unwrap_or(input::BackendInput::None);
    let lock = Lock {
        backend: match backend {
            input::BackendInput::None => Backend::None,
            input::BackendInput::Etcd => Backend::Etcd,
            input::BackendInput::Kubernetes => Backend::Kubernetes,
            input::BackendInput::Fleetlock => Backend::FleetLock,
        },
        max_hold: lock_in.max_hold.map(|d| d.0),
        etcd: lock_in.etcd.map(|e| Etcd {
            endpoints: e.endpoints.unwrap_or_default(),
            ca_file: e.ca_file,
            cert_file: e.cert_file,
            key_file: e.key_file,
            username: e.username,
            password_file: e.password_file,
        }),
        kubernetes: lock_in.kubernetes.map(|k| KubeLease {
            namespace: k
                .namespace
                .unwrap_or_else(|| DEFAULT_LEASE_NAMESPACE.into()),
            name: k.name.unwrap_or_else(|| "rebootd".into()),
            kubeconfig: k
                .kubeconfig
                .or_else(|| input.kubernetes.as_ref().and_then(|k| k.kubeconfig.clone())),
        }),
        fleetlock: lock_in.fleetlock.and_then(|f| {
            f.url.map(|url| FleetLock {
                url,
                ca_file: f.ca_file,
            })
        }),
    };
    match lock.backend {
        Backend::Etcd => {
            let endpoints = lock.etcd.as_ref().map(|e| e.endpoints.len()).unwrap_or(0);
            if endpoints == 0 {
                return Err(ConfigError::Missing {
                    key: "lock.etcd.endpoints".into(),
                    because: format!(
                        "lock.backend = \"etcd\" (set in {})",
                        file_of(origin, "lock.backend").display()
                    ),
                });
            }
            if let Some(e) = &lock.etcd {
                if e.cert_file.is_some() != e.key_file.is_some() {
                    return Err(ConfigError::Missing {
                        key: if e.cert_file.is_some() {
                            "lock.etcd.key_file".into()
                        } else {
                            "lock.etcd.cert_file".into()
                        },
                        because: "a client certificate needs both cert_file and key_file".into(),
                    });
                }
                if e.username.is_some() != e.password_file.is_some() {
                    return Err(ConfigError::Missing {
                        key: if e.username.is_some() {
                            "lock.etcd.password_file".into()
                        } else {
                            "lock.etcd.username".into()
                        },
                        because: "etcd authentication needs both username and password_file".into(),
                    });
                }
            }
        }
        Backend::FleetLock => {
            if lock.fleetlock.is_none() {
                return Err(ConfigError::Missing {
                    key: "lock.fleetlock.url".into(),
                    because: format!(
                        "lock.backend = \"fleetlock\" (set in {})",
                        file_of(origin, "lock.backend").display()
                    ),
                });
            }
        }
        Backend::None | Backend::Kubernetes => {}
    }

    let kubernetes = input.kubernetes.map(|k| Kubernetes {
        kubeconfig: k.kubeconfig,
        drain_timeout: k
            .drain_timeout
            .map(|d| d.0)
            .unwrap_or(Duration::from_secs(30 * 60)),
        on_drain_failure: match k.on_drain_failure {
            Some(input::DrainFailureInput::Reboot) => DrainFailure::Reboot,
            _ => DrainFailure::Abort,
        },
        pod_grace_period: match k.pod_grace_period {
            None | Some(input::GracePeriodInput::Default) => None,
            Some(input::GracePeriodInput::Duration(d)) => Some(d),
        },
        skip_pods: k.skip_pods,
        blocking_pods: k.blocking_pods,
        ready_timeout: k
            .ready_timeout
            .map(|d| d.0)
            .unwrap_or(Duration::from_secs(15 * 60)),
    });

    let reboot_in = input.reboot.unwrap_or_default();
    let reboot = Reboot {
        inhibitors: match reboot_in.inhibitors {
            Some(input::InhibitorsInput::Ignore) => Inhibitors::Ignore,
            _ => Inhibitors::Respect,
        },
        timeout: reboot_in
            .timeout
            .map(|d| d.0)
            .unwrap_or(DEFAULT_REBOOT_TIMEOUT),
        retry_interval: reboot_in
            .retry_interval
            .map(|d| d.0)
            .unwrap_or(DEFAULT_REBOOT_RETRY),
    };
    for (key, value) in [
        ("reboot.timeout", reboot.timeout),
        ("reboot.retry_interval", reboot.retry_interval),
    ] {
        if value.is_zero() {
            return Err(ConfigError::Invalid {
                path: file_of(origin, key),
                key: key.into(),
                value: "\"0s\"".into(),
                reason: "must be longer than zero".into(),
            });
        }
    }

    Ok(Config {
        identity,
        triggers,
        windows,
        lock,
        kubernetes,
        reboot,
        metrics_listen: input.metrics.and_then(|m| m.listen),
        sources,
    })
}

/// The host name, as the default node name.
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

#[cfg(test)]
mod tests;
