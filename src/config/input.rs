//! The raw shape of a configuration fragment: every key optional, unknown keys refused, values
//! checked as they are read so a bad one is reported with its line.

use super::values::{Day, HumanDuration, TimeOfDay, Zone};
use serde::Deserialize;
use std::path::PathBuf;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ConfigInput {
    pub identity: Option<IdentityInput>,
    pub triggers: Option<TriggersInput>,
    pub window: Option<Vec<WindowInput>>,
    pub lock: Option<LockInput>,
    pub kubernetes: Option<KubernetesInput>,
    pub reboot: Option<RebootInput>,
    pub metrics: Option<MetricsInput>,
    pub webhook: Option<WebhookInput>,
    pub gates: Option<super::gates::GatesInput>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct WebhookInput {
    pub url: Option<String>,
    pub url_file: Option<PathBuf>,
    pub ca_file: Option<PathBuf>,
    pub timeout: Option<HumanDuration>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct MetricsInput {
    pub listen: Option<std::net::SocketAddr>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct IdentityInput {
    pub group: Option<String>,
    pub node_name: Option<String>,
    pub machine_id_file: Option<PathBuf>,
    pub boot_id_file: Option<PathBuf>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct TriggersInput {
    pub update_engine: Option<bool>,
    pub sentinel_file: Option<PathBuf>,
    pub sentinel_command: Option<Vec<String>>,
    pub sentinel_interval: Option<HumanDuration>,
}

/// `[[window]]`: days, start and length; or `source = "logind"` and a length.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct WindowInput {
    pub source: Option<WindowSourceInput>,
    pub days: Option<Vec<Day>>,
    pub start: Option<TimeOfDay>,
    pub length: Option<HumanDuration>,
    pub time_zone: Option<Zone>,
}

/// `[[window]] source`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(super) enum WindowSourceInput {
    /// The window is written in the fragment (days, start, length).
    Config,
    /// logind's `DesignatedMaintenanceTime` (systemd 257) gives the days and start.
    Logind,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(super) enum BackendInput {
    None,
    Etcd,
    Kubernetes,
    Fleetlock,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct LockInput {
    pub backend: Option<BackendInput>,
    pub max_hold: Option<HumanDuration>,
    pub max: Option<super::zones::MaxInput>,
    pub max_per_zone: Option<i64>,
    pub zone: Option<String>,
    pub etcd: Option<EtcdInput>,
    pub kubernetes: Option<KubeLeaseInput>,
    pub fleetlock: Option<FleetLockInput>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FleetLockInput {
    pub url: Option<String>,
    pub ca_file: Option<PathBuf>,
    pub id: Option<String>,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(super) enum EtcdApiInput {
    V2,
    V3,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct EtcdInput {
    pub api: Option<EtcdApiInput>,
    pub endpoints: Option<Vec<String>>,
    pub ca_file: Option<PathBuf>,
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
    pub username: Option<String>,
    pub password_file: Option<PathBuf>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct KubeLeaseInput {
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub kubeconfig: Option<PathBuf>,
    pub zone_label: Option<String>,
    pub node_selector: Option<String>,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(super) enum DrainFailureInput {
    Abort,
    Reboot,
}

/// `"default"` or a duration.
#[derive(Debug, Clone, Copy)]
pub(super) enum GracePeriodInput {
    Default,
    Duration(std::time::Duration),
}

impl<'de> Deserialize<'de> for GracePeriodInput {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        if s == "default" {
            return Ok(GracePeriodInput::Default);
        }
        super::values::parse_duration(&s)
            .map(GracePeriodInput::Duration)
            .map_err(serde::de::Error::custom)
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct KubernetesInput {
    pub kubeconfig: Option<PathBuf>,
    pub drain_timeout: Option<HumanDuration>,
    pub on_drain_failure: Option<DrainFailureInput>,
    pub pod_grace_period: Option<GracePeriodInput>,
    pub skip_pods: Option<String>,
    pub blocking_pods: Option<String>,
    pub ready_timeout: Option<HumanDuration>,
    pub delete_emptydir_data: Option<bool>,
    pub force: Option<bool>,
    pub force_delete_after: Option<HumanDuration>,
    pub reboot_labels: Option<std::collections::BTreeMap<String, String>>,
    pub reboot_taint: Option<TaintEffectInput>,
    pub exclude_from_load_balancers: Option<HumanDuration>,
}

#[derive(Debug, Clone, Copy, Deserialize)]
pub(super) enum TaintEffectInput {
    NoSchedule,
    PreferNoSchedule,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(super) enum InhibitorsInput {
    Respect,
    Ignore,
}

/// `[reboot] method`.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(super) enum MethodInput {
    Reboot,
    Kexec,
    SoftReboot,
    Auto,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RebootInput {
    pub inhibitors: Option<InhibitorsInput>,
    pub method: Option<MethodInput>,
    pub allow_kexec: Option<bool>,
    pub timeout: Option<HumanDuration>,
    pub retry_interval: Option<HumanDuration>,
    pub coordinator_file: Option<PathBuf>,
    pub users_warning: Option<HumanDuration>,
    pub boot_time: Option<HumanDuration>,
}
