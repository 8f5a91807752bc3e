//! Building the runtime from the configuration: this node's identity, the lock backend, the
//! drainer, the gates, Flatcar's coordinator file, the policy, and [`Runtime`] itself.

use super::{HostSeams, NodeSeams, Runtime, RuntimeError};
use crate::agent::Policy;
use crate::config::Config;
use crate::drain::KubeDrainer;
use crate::lock::{self, LockError, Semaphore};
use crate::metrics::Metrics;
use crate::notify::Watchdog;
use crate::state::StateStore;
use std::path::Path;
use std::time::Duration;
use tracing::{error, info, warn};

/// Read a one-line id file (machine id, boot id), trimmed and checked non-empty.
pub fn read_id(what: &'static str, path: &Path) -> Result<String, RuntimeError> {
    let err = |reason: String| RuntimeError::Identity {
        what,
        path: path.display().to_string(),
        reason,
    };
    let text = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
    let id = text.trim().to_string();
    if id.is_empty() {
        return Err(err("the file is empty".into()));
    }
    Ok(id)
}

/// This node's holder id in the semaphore: the machine id (locksmith's holder id) for the
/// stores rebootd keeps; for a FleetLock server, the configured id or else Zincati's
/// app-specific id, so a node keeps its slot when it moves from Zincati and poseidon/fleetlock
/// can map it to its Node.
pub fn holder_id(config: &Config) -> Result<String, RuntimeError> {
    let path = &config.identity.machine_id_file;
    let machine_id = read_id("the machine id", path)?;
    match &config.lock.backend {
        crate::config::LockBackend::FleetLock(f) => match &f.id {
            Some(id) => Ok(id.clone()),
            None => crate::app_id::zincati_node_id(&machine_id).map_err(|reason| {
                RuntimeError::Identity {
                    what: "the machine id",
                    path: path.display().to_string(),
                    reason: format!(
                        "{reason}; set [lock.fleetlock] id to send another id to the FleetLock server"
                    ),
                }
            }),
        },
        _ => Ok(machine_id),
    }
}

/// This node's identity in the semaphore, from the configured files and the holder token in
/// the state directory (made there if it is not yet).
pub fn identity(config: &Config, store: &StateStore) -> Result<lock::Identity, RuntimeError> {
    Ok(lock::Identity {
        id: holder_id(config)?,
        node: config.identity.node_name.clone(),
        boot_id: read_id("the boot id", &config.identity.boot_id_file)?,
        token: store.holder_token()?,
        zone: config.lock.limits.zone.clone(),
    })
}

/// Open the configured lock backend (remote ones connect on first use).
pub async fn open_semaphore(config: &Config) -> Result<Box<dyn Semaphore>, LockError> {
    lock::open::open(config).await
}

/// This host's Kubernetes node (its drain and its status), when `[kubernetes]` is configured.
/// Its health gate also requires the Node to report `boot_id`: right after a fast reboot the
/// Node may still show the Ready posted before it.
pub async fn open_drainer(
    config: &Config,
    boot_id: &str,
    metrics: &Metrics,
) -> Result<Option<NodeSeams>, RuntimeError> {
    let Some(settings) = &config.kubernetes else {
        return Ok(None);
    };
    let client = crate::kube_client::connect(settings.kubeconfig.as_deref()).await?;
    let drainer = KubeDrainer::new(client, &config.identity.node_name, settings)?
        .with_boot_id(boot_id)
        .with_metrics(metrics.clone());
    Ok(Some(NodeSeams::new(drainer)))
}

/// The gates before a reboot and the checks after the boot (`[gates]`), their HTTP clients
/// built (and a Kubernetes client for the Node and pods gates).
pub async fn open_gates(config: &Config) -> Result<crate::gate::GateSets, RuntimeError> {
    use crate::gate::Gates;
    let (before, after) = (&config.gates.before_reboot, &config.gates.after_boot);
    let client = match &config.kubernetes {
        Some(k) if Gates::needs_kube(before) || Gates::needs_kube(after) => {
            Some(crate::kube_client::connect(k.kubeconfig.as_deref()).await?)
        }
        _ => None,
    };
    let kube = client
        .as_ref()
        .map(|c| (c, config.identity.node_name.as_str()));
    Ok(crate::gate::GateSets {
        before_reboot: Gates::from_config(before, kube)?,
        after_boot: Gates::from_config(after, kube)?,
    })
}

/// Flatcar's coordinator file, locked and saying `STATE=starting`, when configured; a failure is
/// logged with the path and rebootd runs without it.
pub fn open_coordinator(config: &Config) -> Option<crate::coordinator::CoordinatorFile> {
    use crate::coordinator::{strategy, CoordinatorError, CoordinatorFile};
    let path = config.reboot.coordinator_file.as_deref()?;
    match CoordinatorFile::open(path, strategy(&config.lock.backend)) {
        Ok(file) => Some(file),
        Err(e @ CoordinatorError::Held { .. }) => {
            error!("{e}");
            None
        }
        Err(e) => {
            let path = path.display().to_string();
            warn!(%path, "Flatcar's coordinator file {path} is not written: {e}");
            None
        }
    }
}

/// What the configuration needs of this host's systemd, checked at start: a soft reboot
/// (`reboot.method = "soft-reboot"`) needs systemd 254, refused naming the version found; and
/// each `[[window]] source = "logind"` becomes a window from logind's
/// `DesignatedMaintenanceTime` (systemd 257), in the host's time zone unless the spec names
/// one. A change of that setting is seen at rebootd's next start.
pub async fn check_host(config: &mut Config) -> Result<(), RuntimeError> {
    check_reboot_method(config).await?;
    resolve_logind_windows(config).await
}

/// `reboot.method = "soft-reboot"` needs systemd 254: refused, naming the version found.
pub async fn check_reboot_method(config: &Config) -> Result<(), RuntimeError> {
    use crate::reboot_method::{systemd_major, Method, SOFT_REBOOT_SINCE};
    if config.reboot.method == Method::SoftReboot {
        let manager = crate::systemd::manager().await?;
        if systemd_major(&manager.version).is_none_or(|v| v < SOFT_REBOOT_SINCE) {
            return Err(RuntimeError::SoftRebootUnsupported {
                needs: SOFT_REBOOT_SINCE,
                version: manager.version,
            });
        }
    }
    Ok(())
}

/// Each `[[window]] source = "logind"` as a window from logind's `DesignatedMaintenanceTime`.
pub async fn resolve_logind_windows(config: &mut Config) -> Result<(), RuntimeError> {
    if config.logind_windows.is_empty() {
        return Ok(());
    }
    let spec = crate::systemd::designated_maintenance_time()
        .await
        .map_err(|e| RuntimeError::LogindWindow(e.to_string()))?;
    let local = jiff::tz::TimeZone::system();
    let name = local.iana_name().unwrap_or("local").to_string();
    for w in std::mem::take(&mut config.logind_windows) {
        let window = crate::window_calendar::window(&spec, w.length, &local, &name)
            .map_err(|e| RuntimeError::LogindWindow(e.to_string()))?;
        info!(spec = %spec, window = %window, "maintenance window from logind's DesignatedMaintenanceTime");
        config.windows.0.push(window);
    }
    Ok(())
}

/// The policy the state machine follows, from the configuration.
pub fn policy(config: &Config) -> Policy {
    Policy {
        drain: config.kubernetes.is_some(),
        reboot_timeout: config.reboot.timeout,
        retry_interval: config.reboot.retry_interval,
        gate_interval: config.gates.interval,
        settle: config.gates.settle,
    }
}

/// The longest a slot is held when every step takes as long as its settings allow (drain,
/// users' warning, the reboot to happen, the boot, Ready, settle): past this, something is
/// stuck (`rebootd_slot_expected_seconds`, the alert RebootdSlotHeldPastExpected).
pub fn expected_hold(config: &Config) -> Duration {
    let kube = config
        .kubernetes
        .as_ref()
        .map_or(Duration::ZERO, |k| k.drain_timeout + k.ready_timeout);
    let reboot = &config.reboot;
    kube + reboot.users_warning
        + reboot.timeout
        + reboot.boot_time
        + config.gates.settle.unwrap_or_default()
}

impl Runtime {
    /// Build a runtime on this host's logind, draining `node` when there is one.
    pub fn new(
        config: Config,
        store: StateStore,
        semaphore: Box<dyn Semaphore>,
        node: Option<NodeSeams>,
        me: lock::Identity,
    ) -> Runtime {
        let host =
            HostSeams::logind(config.reboot.inhibitors == crate::config::Inhibitors::Respect);
        let policy = policy(&config);
        let fleet = crate::fleet::publish::Publisher::new(store.dir());
        Runtime {
            config,
            store,
            semaphore,
            host,
            node,
            me,
            policy,
            metrics: Metrics::default(),
            webhook: None,
            gates: crate::gate::Gates::default(),
            after_boot: crate::gate::Gates::default(),
            watchdog: Watchdog::from_env(),
            coordinator: None,
            reported_held: std::sync::Mutex::default(),
            scale_down_asked: std::sync::atomic::AtomicBool::new(false),
            fleet,
        }
    }

    /// Ask these gates before taking a slot, before the cordon and before calling logind, and
    /// these checks after the boot before the uncordon and the release.
    pub fn with_gates(mut self, gates: crate::gate::GateSets) -> Runtime {
        self.gates = gates.before_reboot;
        self.after_boot = gates.after_boot;
        self
    }

    /// Send notifications of state changes to this webhook (`[webhook]`).
    pub fn with_webhook(mut self, webhook: crate::notify_webhook::Webhook) -> Runtime {
        self.webhook = Some(webhook);
        self
    }

    /// Show the phase in Flatcar's coordinator file (`[reboot] coordinator_file`).
    pub fn with_coordinator(mut self, file: crate::coordinator::CoordinatorFile) -> Runtime {
        self.coordinator = Some(file);
        self
    }

    /// Reboot, look at inhibitors and warn users through these instead of logind (the lab's
    /// in-process nodes).
    pub fn with_host(mut self, host: HostSeams) -> Runtime {
        self.host = host;
        self
    }

    /// Publish metrics to this collector (served by the caller).
    pub fn with_metrics(mut self, metrics: Metrics) -> Runtime {
        metrics.expect_hold(expected_hold(&self.config));
        metrics.identify(&self.me.node, &self.config.identity.group);
        self.metrics = metrics;
        self
    }
}
