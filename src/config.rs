//! Configuration: TOML fragments merged in file-name order into one validated [`Config`].
//!
//! Each fragment is first parsed on its own into the raw input types (so a wrong key, type or value
//! is reported with the file, line and key), then the fragments are merged key by key (later
//! wins), then cross-field rules are checked, naming the file that set the offending key.

mod bounds;
mod gates;
mod input;
mod marks;
mod validate;
mod values;
mod zones;
pub use zones::{is_zone, DEFAULT_ZONE_LABEL};

pub use gates::{GateCheck, GateSpec, Gates};
use input::ConfigInput;
use validate::validate;
pub use values::{parse_duration, HumanDuration};

use crate::window::Windows;
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
/// Locksmith gives logged-in users 5 minutes; Zincati postpones up to 10.
const DEFAULT_USERS_WARNING: Duration = Duration::from_secs(300);
/// How long a host is down in a reboot: bare-metal firmware (memory training, RAID and network
/// option ROMs) takes minutes, then the boot and rebootd's start. Nothing beats meanwhile, so
/// `lock.max_hold` must cover it.
const DEFAULT_BOOT_TIME: Duration = Duration::from_secs(10 * 60);

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
    /// `[[window]] source = "logind"`: windows whose days and start logind designates
    /// (`DesignatedMaintenanceTime`), added to `windows` by
    /// `runtime::check_host` when rebootd starts.
    pub logind_windows: Vec<LogindWindow>,
    pub lock: Lock,
    pub kubernetes: Option<Kubernetes>,
    pub reboot: Reboot,
    /// Where to serve Prometheus metrics; None = not served.
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// Where to POST notifications (`[webhook]`); None = none sent.
    pub webhook: Option<crate::notify_webhook::WebhookSettings>,
    /// Conditions outside rebootd that must hold before a reboot (`[gates]`).
    pub gates: Gates,
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

/// The lock backend, with its settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LockBackend {
    /// No semaphore: reboot as soon as the window allows.
    None,
    /// locksmith's semaphore in etcd.
    Etcd(Etcd),
    /// Lease objects in a Kubernetes namespace.
    Kubernetes(KubeLease),
    /// A FleetLock server (Zincati's protocol).
    FleetLock(FleetLock),
}

impl LockBackend {
    /// Which store it is; its name is what `lock.backend` says.
    pub fn kind(&self) -> crate::lock::Backend {
        use crate::lock::Backend;
        match self {
            LockBackend::None => Backend::None,
            LockBackend::Etcd(_) => Backend::Etcd,
            LockBackend::Kubernetes(_) => Backend::Kubernetes,
            LockBackend::FleetLock(_) => Backend::FleetLock,
        }
    }

    /// The name `lock.backend` gives it.
    pub fn name(&self) -> &'static str {
        self.kind().as_str()
    }
}

#[derive(Debug, Clone)]
pub struct Lock {
    pub backend: LockBackend,
    /// A holder that shows no sign of life (no heartbeat) for this long may be reclaimed. Off
    /// when `None`.
    pub max_hold: Option<Duration>,
    /// The zone cap and the proportional `max` (`max_per_zone`, `zone`, `max = "N%"`).
    pub limits: Limits,
}

/// `[lock]`'s bounds by the fleet's shape, beside the store's `max`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Limits {
    /// At most this many holders in one zone (`max_per_zone`).
    pub max_per_zone: Option<u64>,
    /// This node's zone on etcd (`zone`); on Leases it is read from the Node.
    pub zone: Option<String>,
    /// `max = "N%"`: the slots are this share of the nodes the store knows.
    pub max_percent: Option<u8>,
}

/// A FleetLock server (Zincati's protocol: airlock, poseidon/fleetlock).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FleetLock {
    pub url: String,
    pub ca_file: Option<PathBuf>,
    /// The id sent to the server; `None` = Zincati's: the machine id made app-specific with
    /// Zincati's application id (see `app_id`).
    pub id: Option<String>,
}

/// Which of etcd's two keyspaces holds the semaphore (`[lock.etcd] api`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EtcdApi {
    /// The v2 keys API, where locksmith keeps its semaphore (etcd <= 3.5 with `--enable-v2`).
    V2,
    /// The v3 API (the default).
    V3,
}

impl EtcdApi {
    pub fn as_str(self) -> &'static str {
        match self {
            EtcdApi::V2 => "v2",
            EtcdApi::V3 => "v3",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Etcd {
    pub api: EtcdApi,
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
    /// The Node label that names its zone (`zone_label`), for `lock.max_per_zone`.
    pub zone_label: String,
    /// The Nodes `lock.max = "N%"` is a share of (a label selector; `None`: all).
    pub node_selector: Option<String>,
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
    /// Pods with emptyDir volumes (`delete_emptydir_data`, as `kubectl drain`).
    pub emptydir_pods: EmptyDirPods,
    /// Pods no controller owns (`force`, as `kubectl drain`).
    pub unmanaged_pods: UnmanagedPods,
    /// Delete (not evict) a pod its PodDisruptionBudget still refuses this long after the drain
    /// began; `None` = never.
    pub force_delete_after: Option<Duration>,
    /// Labels, taint and load-balancer exclusion on the Node while rebooting.
    pub marks: crate::drain::marks::Marks,
}

/// What a drain does with a pod that has emptyDir volumes (their data is lost).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EmptyDirPods {
    /// The drain fails before evicting anything, naming the pods (the default).
    Refuse,
    /// Evicted like the others (`delete_emptydir_data = true`).
    Evict,
}

/// What a drain does with a pod that no controller owns (nothing recreates it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnmanagedPods {
    /// The drain fails before evicting anything, naming the pods (the default).
    Refuse,
    /// Evicted like the others, and gone for good (`force = true`).
    Evict,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Inhibitors {
    Respect,
    Ignore,
}

/// A window whose days and start come from logind (`[[window]] source = "logind"`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogindWindow {
    /// How long it stays open from the designated time.
    pub length: Duration,
}

#[derive(Debug, Clone)]
pub struct Reboot {
    pub inhibitors: Inhibitors,
    /// What logind is asked for (`method`): a full reboot, a kexec, a soft reboot, or the
    /// lightest that does the job (`auto`, see `reboot_method`).
    pub method: crate::reboot_method::Method,
    /// Whether `auto` may kexec into a loaded kernel.
    pub allow_kexec: bool,
    /// After logind accepted the request: how long before rebootd declares it lost and retries.
    pub timeout: Duration,
    /// After logind refused (inhibitor, error): how long before asking again.
    pub retry_interval: Duration,
    /// Flatcar's coordinator file (see `coordinator`); `None` (`coordinator_file = ""`) = none.
    pub coordinator_file: Option<PathBuf>,
    /// When people are logged in, the time between logind's announcement and the reboot
    /// (zero: no warning, no wait). See `users`.
    pub users_warning: Duration,
    /// How long the host may be down, from going down until rebootd runs again (firmware,
    /// boot, start); counted in `lock.max_hold`.
    pub boot_time: Duration,
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
        let mut texts = Vec::new();
        for path in files {
            let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                path: path.clone(),
                source,
            })?;
            texts.push((path.clone(), text));
        }
        Config::from_texts(&texts)
    }

    /// Validate one fragment on its own, as if it were the only file (`rebootctl import`).
    pub fn check_fragment(label: &Path, text: &str) -> Result<Config, ConfigError> {
        Config::from_texts(&[(label.to_path_buf(), text.to_string())])
    }

    /// Merge and validate fragments already read, in order.
    fn from_texts(texts: &[(PathBuf, String)]) -> Result<Config, ConfigError> {
        let files: Vec<PathBuf> = texts.iter().map(|(p, _)| p.clone()).collect();
        let mut merged = toml::Table::new();
        let mut origin = BTreeMap::new();
        for (path, text) in texts {
            let table = parse_fragment(path, text)?;
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

#[cfg(test)]
mod tests;
