//! Validation: the merged raw input into a [`Config`], a step per table in a fixed order (the
//! first error found is the one reported), then the rules that span tables. Every error names
//! the file that set the key, the key and the value.

use super::input::{self, ConfigInput};
use super::{
    bounds, file_of, gates, marks, Config, ConfigError, DrainFailure, EmptyDirPods, Etcd, EtcdApi,
    FleetLock, Identity, Inhibitors, KubeLease, Kubernetes, Lock, LockBackend, LogindWindow,
    Reboot, Triggers, UnmanagedPods, DEFAULT_BOOT_TIME, DEFAULT_GROUP, DEFAULT_LEASE_NAMESPACE,
    DEFAULT_REBOOT_RETRY, DEFAULT_REBOOT_TIMEOUT, DEFAULT_SENTINEL_INTERVAL, DEFAULT_USERS_WARNING,
};
use crate::window::{Window, Windows};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

/// Validate the merged input into a [`Config`], table by table, in a fixed order (the first
/// error found is the one reported), then the rules that span tables.
pub(super) fn validate(
    input: ConfigInput,
    origin: &BTreeMap<String, PathBuf>,
    sources: Vec<PathBuf>,
) -> Result<Config, ConfigError> {
    let identity = validate_identity(input.identity.unwrap_or_default(), origin)?;
    let triggers = validate_triggers(input.triggers.unwrap_or_default(), origin)?;
    let (windows, logind_windows) = validate_windows(input.window.unwrap_or_default(), origin)?;
    let lock = validate_lock(input.lock.unwrap_or_default(), &input.kubernetes, origin)?;
    let kubernetes = input
        .kubernetes
        .map(|k| validate_kubernetes(k, origin))
        .transpose()?;
    let webhook = input
        .webhook
        .map(|w| validate_webhook(w, origin))
        .transpose()?;
    let gates = gates::validate(input.gates, kubernetes.is_some(), origin)?;
    let reboot = validate_reboot(input.reboot.unwrap_or_default());
    let config = Config {
        identity,
        triggers,
        windows,
        logind_windows,
        lock,
        kubernetes,
        reboot,
        metrics_listen: input.metrics.and_then(|m| m.listen),
        webhook,
        gates,
        sources,
    };
    bounds::check(&config, origin)?;
    check_max_hold(
        &config.lock,
        config.kubernetes.as_ref(),
        &config.reboot,
        config.gates.settle,
        origin,
    )?;
    Ok(config)
}

/// `[identity]`: defaults for what is not set; the group has a name.
fn validate_identity(
    identity_in: input::IdentityInput,
    origin: &BTreeMap<String, PathBuf>,
) -> Result<Identity, ConfigError> {
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
    Ok(identity)
}

/// `[triggers]`: update_engine on unless turned off; a sentinel command names a program.
fn validate_triggers(
    triggers_in: input::TriggersInput,
    origin: &BTreeMap<String, PathBuf>,
) -> Result<Triggers, ConfigError> {
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
    Ok(triggers)
}

/// `[[window]]`: each already checked as it was read; a window without a zone is in UTC. A
/// `source = "logind"` window has only a length (its days and start come from logind when
/// rebootd starts, see `runtime::check_host`).
fn validate_windows(
    windows_in: Vec<input::WindowInput>,
    origin: &BTreeMap<String, PathBuf>,
) -> Result<(Windows, Vec<LogindWindow>), ConfigError> {
    use input::WindowSourceInput;
    let mut windows = Vec::new();
    let mut logind = Vec::new();
    for (i, w) in windows_in.into_iter().enumerate() {
        let bad = |key: &str, value: String, reason: &str| ConfigError::Invalid {
            path: file_of(origin, "window"),
            key: format!("window[{i}].{key}"),
            value,
            reason: reason.into(),
        };
        if w.source == Some(WindowSourceInput::Logind) {
            let from_logind = "with source = \"logind\" the days, start and time zone come from logind's DesignatedMaintenanceTime";
            if let Some(d) = &w.days {
                return Err(bad("days", format!("{} day(s)", d.len()), from_logind));
            }
            if let Some(t) = &w.start {
                return Err(bad("start", format!("\"{}\"", t.0), from_logind));
            }
            if let Some(z) = &w.time_zone {
                return Err(bad("time_zone", format!("{:?}", z.name), from_logind));
            }
            let Some(length) = w.length else {
                return Err(bad(
                    "length",
                    "(not set)".into(),
                    "a logind window needs a length: DesignatedMaintenanceTime gives only its start",
                ));
            };
            logind.push(LogindWindow { length: length.0 });
            continue;
        }
        let required = "required unless source = \"logind\"";
        let gone = [w.days.is_none(), w.start.is_none(), w.length.is_none()];
        let (Some(days), Some(start), Some(length)) = (w.days, w.start, w.length) else {
            let missing = ["days", "start", "length"]
                .into_iter()
                .zip(gone)
                .find_map(|(k, gone)| gone.then_some(k))
                .unwrap_or("days");
            return Err(bad(missing, "(not set)".into(), required));
        };
        windows.push(Window {
            days: days.into_iter().map(|d| d.0).collect(),
            start: start.0,
            length: length.0,
            time_zone_name: w
                .time_zone
                .as_ref()
                .map(|z| z.name.clone())
                .unwrap_or_else(|| "UTC".into()),
            time_zone: w
                .time_zone
                .map(|z| z.zone)
                .unwrap_or(jiff::tz::TimeZone::UTC),
        });
    }
    Ok((Windows(windows), logind))
}

/// `[kubernetes]`: the drain's settings and the marks put on the Node; the waits inside the
/// drain are shorter than the drain.
fn validate_kubernetes(
    k: input::KubernetesInput,
    origin: &BTreeMap<String, PathBuf>,
) -> Result<Kubernetes, ConfigError> {
    let marks = marks::validate(&k, origin)?;
    let kubernetes = Kubernetes {
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
        emptydir_pods: if k.delete_emptydir_data == Some(true) {
            EmptyDirPods::Evict
        } else {
            EmptyDirPods::Refuse
        },
        unmanaged_pods: if k.force == Some(true) {
            UnmanagedPods::Evict
        } else {
            UnmanagedPods::Refuse
        },
        force_delete_after: k.force_delete_after.map(|d| d.0),
        marks,
    };
    check_drain_waits(&kubernetes, origin)?;
    Ok(kubernetes)
}

/// The wait before evicting and the time before a forced delete both end within the drain.
fn check_drain_waits(
    k: &Kubernetes,
    origin: &BTreeMap<String, PathBuf>,
) -> Result<(), ConfigError> {
    if let Some(wait) = k.marks.exclude_lb.filter(|w| *w >= k.drain_timeout) {
        return Err(ConfigError::Invalid {
            path: file_of(origin, "kubernetes.exclude_from_load_balancers"),
            key: "kubernetes.exclude_from_load_balancers".into(),
            value: format!("\"{}\"", humantime::format_duration(wait)),
            reason: format!(
                "the wait before evicting must be shorter than drain_timeout ({})",
                humantime::format_duration(k.drain_timeout)
            ),
        });
    }
    if let Some(after) = k.force_delete_after.filter(|a| *a >= k.drain_timeout) {
        return Err(ConfigError::Invalid {
            path: file_of(origin, "kubernetes.force_delete_after"),
            key: "kubernetes.force_delete_after".into(),
            value: humantime::format_duration(after).to_string(),
            reason: format!(
                "must be shorter than drain_timeout ({}), or the drain stops before it",
                humantime::format_duration(k.drain_timeout)
            ),
        });
    }
    Ok(())
}

/// `[reboot]`: defaults for what is not set; an empty `coordinator_file` turns it off.
fn validate_reboot(reboot_in: input::RebootInput) -> Reboot {
    use crate::reboot_method::Method;
    Reboot {
        method: match reboot_in.method {
            None | Some(input::MethodInput::Reboot) => Method::Reboot,
            Some(input::MethodInput::Kexec) => Method::Kexec,
            Some(input::MethodInput::SoftReboot) => Method::SoftReboot,
            Some(input::MethodInput::Auto) => Method::Auto,
        },
        allow_kexec: reboot_in.allow_kexec.unwrap_or(false),
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
        users_warning: reboot_in
            .users_warning
            .map(|d| d.0)
            .unwrap_or(DEFAULT_USERS_WARNING),
        boot_time: reboot_in
            .boot_time
            .map(|d| d.0)
            .unwrap_or(DEFAULT_BOOT_TIME),
        coordinator_file: match reboot_in.coordinator_file {
            Some(p) if p.as_os_str().is_empty() => None,
            Some(p) => Some(p),
            None => Some(PathBuf::from(crate::coordinator::DEFAULT_PATH)),
        },
    }
}

/// `[webhook]`: exactly one of `url` (http:// or https://) and `url_file`. A URL is a secret:
/// errors show its scheme and host only.
fn validate_webhook(
    w: input::WebhookInput,
    origin: &BTreeMap<String, PathBuf>,
) -> Result<crate::notify_webhook::WebhookSettings, ConfigError> {
    use crate::notify_webhook::{WebhookSettings, WebhookUrl};
    let url = match (w.url, w.url_file) {
        (Some(_), Some(file)) => {
            return Err(ConfigError::Invalid {
                path: file_of(origin, "webhook.url_file"),
                key: "webhook.url_file".into(),
                value: format!("{:?}", file.display().to_string()),
                reason: "set either url or url_file, not both".into(),
            })
        }
        (None, Some(file)) => WebhookUrl::File(file),
        (Some(u), None) if u.starts_with("http://") || u.starts_with("https://") => {
            WebhookUrl::Inline(u)
        }
        (other, None) => {
            return Err(ConfigError::Invalid {
                path: file_of(origin, "webhook.url"),
                key: "webhook.url".into(),
                value: match other {
                    Some(u) => crate::http::redact(&u),
                    None => "\"\"".into(),
                },
                reason: "[webhook] needs an http:// or https:// url, or a url_file".into(),
            })
        }
    };
    Ok(WebhookSettings {
        url,
        ca_file: w.ca_file,
        timeout: w.timeout.map(|d| d.0).unwrap_or(Duration::from_secs(10)),
    })
}

/// `[lock]`: the backend with its settings, each backend's table checked on its own.
fn validate_lock(
    lock_in: input::LockInput,
    kubernetes: &Option<input::KubernetesInput>,
    origin: &BTreeMap<String, PathBuf>,
) -> Result<Lock, ConfigError> {
    let backend_file = || file_of(origin, "lock.backend").display().to_string();
    let backend = match lock_in.backend.unwrap_or(input::BackendInput::None) {
        input::BackendInput::None => LockBackend::None,
        input::BackendInput::Etcd => LockBackend::Etcd(validate_etcd(
            lock_in.etcd.unwrap_or_default(),
            &backend_file,
        )?),
        input::BackendInput::Kubernetes => {
            let k = lock_in.kubernetes.unwrap_or_default();
            LockBackend::Kubernetes(KubeLease {
                namespace: k
                    .namespace
                    .unwrap_or_else(|| DEFAULT_LEASE_NAMESPACE.into()),
                name: k.name.unwrap_or_else(|| "rebootd".into()),
                kubeconfig: k
                    .kubeconfig
                    .or_else(|| kubernetes.as_ref().and_then(|k| k.kubeconfig.clone())),
                zone_label: super::zones::zone_label(k.zone_label, origin)?,
                node_selector: super::zones::node_selector(k.node_selector, origin)?,
            })
        }
        input::BackendInput::Fleetlock => LockBackend::FleetLock(validate_fleetlock(
            lock_in.fleetlock.unwrap_or_default(),
            origin,
            &backend_file,
        )?),
    };
    let limits = super::zones::validate(
        super::zones::LimitsInput {
            max: lock_in.max,
            max_per_zone: lock_in.max_per_zone,
            zone: lock_in.zone,
        },
        &backend,
        origin,
    )?;
    Ok(Lock {
        backend,
        max_hold: lock_in.max_hold.map(|d| d.0),
        limits,
    })
}

/// `[lock.etcd]`: endpoints, and a client certificate or a user name each complete.
/// `backend_file`: the file that chose the backend, for the error when endpoints are missing.
fn validate_etcd(
    e: input::EtcdInput,
    backend_file: &dyn Fn() -> String,
) -> Result<Etcd, ConfigError> {
    let endpoints = e.endpoints.unwrap_or_default();
    if endpoints.is_empty() {
        return Err(ConfigError::Missing {
            key: "lock.etcd.endpoints".into(),
            because: format!("lock.backend = \"etcd\" (set in {})", backend_file()),
        });
    }
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
    Ok(Etcd {
        api: match e.api {
            Some(input::EtcdApiInput::V2) => EtcdApi::V2,
            Some(input::EtcdApiInput::V3) | None => EtcdApi::V3,
        },
        endpoints,
        ca_file: e.ca_file,
        cert_file: e.cert_file,
        key_file: e.key_file,
        username: e.username,
        password_file: e.password_file,
    })
}

/// `[lock.fleetlock]`: a URL, and an id that is one word if given.
fn validate_fleetlock(
    f: input::FleetLockInput,
    origin: &BTreeMap<String, PathBuf>,
    backend_file: &dyn Fn() -> String,
) -> Result<FleetLock, ConfigError> {
    if let Some(id) = &f.id {
        if id.is_empty() || id.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(ConfigError::Invalid {
                path: file_of(origin, "lock.fleetlock.id"),
                key: "lock.fleetlock.id".into(),
                value: format!("{id:?}"),
                reason: "the id must be a non-empty word (e.g. Zincati's node_uuid)".into(),
            });
        }
    }
    let Some(url) = f.url else {
        return Err(ConfigError::Missing {
            key: "lock.fleetlock.url".into(),
            because: format!("lock.backend = \"fleetlock\" (set in {})", backend_file()),
        });
    };
    Ok(FleetLock {
        url,
        ca_file: f.ca_file,
        id: f.id,
    })
}

/// `lock.max_hold` must outlast everything a live holder may do without beating: the drain,
/// the reboot and the boot (the host is down, nothing beats), the wait for Ready and the settle
/// time.
/// Shorter, a slow but live holder could lose its slot to a waiter.
fn check_max_hold(
    lock: &Lock,
    kubernetes: Option<&Kubernetes>,
    reboot: &Reboot,
    settle: Option<Duration>,
    origin: &BTreeMap<String, PathBuf>,
) -> Result<(), ConfigError> {
    let Some(max_hold) = lock.max_hold else {
        return Ok(());
    };
    let fmt = |d: Duration| humantime::format_duration(d).to_string();
    let mut parts = vec![("reboot.timeout", reboot.timeout)];
    if !reboot.boot_time.is_zero() {
        parts.push(("reboot.boot_time", reboot.boot_time));
    }
    if !reboot.users_warning.is_zero() {
        parts.insert(0, ("reboot.users_warning", reboot.users_warning));
    }
    if let Some(k) = kubernetes {
        parts.insert(0, ("kubernetes.drain_timeout", k.drain_timeout));
        parts.push(("kubernetes.ready_timeout", k.ready_timeout));
    }
    if let Some(d) = settle {
        parts.push(("gates.settle", d));
    }
    let total = parts
        .iter()
        .fold(Duration::ZERO, |t, (_, d)| t.saturating_add(*d));
    if max_hold >= total {
        return Ok(());
    }
    let sum = parts
        .iter()
        .map(|(k, d)| format!("{k} ({})", fmt(*d)))
        .collect::<Vec<_>>()
        .join(" + ");
    Err(ConfigError::Invalid {
        path: file_of(origin, "lock.max_hold"),
        key: "lock.max_hold".into(),
        value: format!("\"{}\"", fmt(max_hold)),
        reason: format!(
            "must be at least {sum} = {}: a holder that is draining, rebooting, booting or \
             waiting for Ready is alive, and a shorter max_hold would let another node take its \
             slot",
            fmt(total)
        ),
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
