//! `[lock]`'s bounds by the fleet's shape: `max_per_zone` with this node's zone (`zone` on
//! etcd, the Node's `[lock.kubernetes] zone_label` on Leases), and `max = "N%"`, a share of the
//! nodes the store knows: on Leases the Nodes `[lock.kubernetes] node_selector` matches, on
//! etcd the group's fleet members, holders and waiters (`lock::arbiter::share`). FleetLock and
//! `none` keep no nodes to count.

use super::{file_of, ConfigError, Limits, LockBackend};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::PathBuf;

/// The well-known Node label of a node's zone.
pub const DEFAULT_ZONE_LABEL: &str = "topology.kubernetes.io/zone";

/// `lock.max` as written: a share (`"10%"`) or, refused with a pointer to `set-max`, a number.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub(super) enum MaxInput {
    Count(i64),
    Text(String),
}

/// The keys of `[lock]` that [`validate`] reads.
pub(super) struct LimitsInput {
    pub max: Option<MaxInput>,
    pub max_per_zone: Option<i64>,
    pub zone: Option<String>,
}

/// Check the bounds against the backend they apply to.
pub(super) fn validate(
    l: LimitsInput,
    backend: &LockBackend,
    origin: &BTreeMap<String, PathBuf>,
) -> Result<Limits, ConfigError> {
    let invalid = |key: &str, value: String, reason: String| ConfigError::Invalid {
        path: file_of(origin, key),
        key: key.into(),
        value,
        reason,
    };
    let backend_name = backend.name();
    let with_store = matches!(backend, LockBackend::Etcd(_) | LockBackend::Kubernetes(_));
    let max_per_zone = match l.max_per_zone {
        None => None,
        Some(n) if n < 1 => {
            return Err(invalid(
                "lock.max_per_zone",
                n.to_string(),
                "must be at least 1".into(),
            ))
        }
        Some(n) if !with_store => {
            return Err(invalid(
                "lock.max_per_zone",
                n.to_string(),
                format!(
                    "lock.backend = \"{backend_name}\" keeps no holders here to count by zone; \
                     use the etcd or kubernetes backend"
                ),
            ))
        }
        Some(n) => u64::try_from(n).ok(),
    };
    let zone =
        match (l.zone, backend) {
            (None, _) => None,
            (Some(z), _) if !is_zone(&z) => return Err(invalid(
                "lock.zone",
                format!("{z:?}"),
                "a zone is 1 to 63 letters, digits, '-', '_' or '.', beginning and ending with \
                 a letter or digit (as a Kubernetes label value)"
                    .into(),
            )),
            (Some(z), LockBackend::Etcd(_)) => Some(z),
            (Some(z), _) => {
                return Err(invalid(
                    "lock.zone",
                    format!("{z:?}"),
                    format!(
                        "only the etcd backend takes the zone from here (lock.backend = \
                     \"{backend_name}\"; on kubernetes it is the Node's label \
                     lock.kubernetes.zone_label)"
                    ),
                ))
            }
        };
    if max_per_zone.is_some() && zone.is_none() && matches!(backend, LockBackend::Etcd(_)) {
        return Err(ConfigError::Missing {
            key: "lock.zone".into(),
            because: format!(
                "lock.max_per_zone is set (in {}) on the etcd backend: this node's zone",
                file_of(origin, "lock.max_per_zone").display()
            ),
        });
    }
    let max_percent = l
        .max
        .map(|m| max_percent(m, backend, &invalid))
        .transpose()?;
    Ok(Limits {
        max_per_zone,
        zone,
        max_percent,
    })
}

/// `lock.max`: `"N%"` with N in 1..=100, on the kubernetes and etcd backends.
fn max_percent(
    m: MaxInput,
    backend: &LockBackend,
    invalid: &dyn Fn(&str, String, String) -> ConfigError,
) -> Result<u8, ConfigError> {
    let text = match m {
        MaxInput::Count(n) => {
            return Err(invalid(
                "lock.max",
                n.to_string(),
                format!(
                    "a number of slots is kept in the store, not here: `rebootctl set-max {n}`; \
                     lock.max only takes a share of the nodes, such as \"10%\""
                ),
            ))
        }
        MaxInput::Text(t) => t,
    };
    let percent = text
        .strip_suffix('%')
        .and_then(|n| n.trim().parse::<u8>().ok())
        .filter(|n| (1..=100).contains(n));
    let Some(percent) = percent else {
        return Err(invalid(
            "lock.max",
            format!("{text:?}"),
            "must be a share of the nodes from \"1%\" to \"100%\"".into(),
        ));
    };
    if !matches!(backend, LockBackend::Kubernetes(_) | LockBackend::Etcd(_)) {
        return Err(invalid(
            "lock.max",
            format!("{text:?}"),
            format!(
                "a share of the nodes needs lock.backend = \"etcd\" or \"kubernetes\" (they \
                 count the group's nodes; lock.backend = \"{}\" keeps no list of them); set a \
                 number of slots with `rebootctl set-max N`, or on the FleetLock server",
                backend.name()
            ),
        ));
    }
    Ok(percent)
}

/// `[lock.kubernetes] zone_label`: a label key (`prefix/name`), by default the well-known one.
pub(super) fn zone_label(
    label: Option<String>,
    origin: &BTreeMap<String, PathBuf>,
) -> Result<String, ConfigError> {
    let Some(label) = label else {
        return Ok(DEFAULT_ZONE_LABEL.into());
    };
    let (prefix, name) = label.rsplit_once('/').unwrap_or(("", &label));
    let prefix_ok = prefix.len() <= 253
        && prefix
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.');
    if !prefix_ok || !is_zone(name) {
        return Err(ConfigError::Invalid {
            path: file_of(origin, "lock.kubernetes.zone_label"),
            key: "lock.kubernetes.zone_label".into(),
            value: format!("{label:?}"),
            reason: "must be a Kubernetes label key, such as \"topology.kubernetes.io/zone\""
                .into(),
        });
    }
    Ok(label)
}

/// `[lock.kubernetes] node_selector`: a label selector, passed to the API server as written
/// (which refuses a malformed one); one line of printable text.
pub(super) fn node_selector(
    selector: Option<String>,
    origin: &BTreeMap<String, PathBuf>,
) -> Result<Option<String>, ConfigError> {
    match selector {
        Some(s) if s.trim().is_empty() || s.len() > 1024 || s.chars().any(char::is_control) => {
            Err(ConfigError::Invalid {
                path: file_of(origin, "lock.kubernetes.node_selector"),
                key: "lock.kubernetes.node_selector".into(),
                value: format!("{:?}", crate::text::clean(&s)),
                reason: "must be a label selector on one line, such as \
                         \"node-role.kubernetes.io/worker\""
                    .into(),
            })
        }
        s => Ok(s),
    }
}

/// Whether `z` is a Kubernetes label value that is not empty (what a zone label holds).
pub fn is_zone(z: &str) -> bool {
    let b = z.as_bytes();
    let edge = |c: &u8| c.is_ascii_alphanumeric();
    !b.is_empty()
        && b.len() <= 63
        && b.first().is_some_and(edge)
        && b.last().is_some_and(edge)
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

#[cfg(test)]
mod tests {
    use super::super::{Config, LockBackend};
    use std::io::Write;

    const ETCD: &str =
        "[lock.etcd]\nendpoints = [\"http://127.0.0.1:2379\"]\n[lock]\nbackend = \"etcd\"\n";
    const LEASES: &str = "[lock]\nbackend = \"kubernetes\"\n";

    /// `text` as one fragment: the config, or the error's text and the fragment's path.
    fn load(text: &str) -> Result<Config, (String, String)> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("l.toml");
        std::fs::File::create(&path)
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
        Config::load(std::slice::from_ref(&path))
            .map_err(|e| (e.to_string(), path.display().to_string()))
    }

    fn refused(text: &str, needles: &[&str]) {
        let (err, path) = load(text).expect_err(text);
        assert!(err.contains(&path), "{err}");
        for n in needles {
            assert!(err.contains(n), "{n:?} not in {err}");
        }
    }

    #[test]
    fn zones_on_etcd_take_the_zone_from_the_configuration() {
        let c = load(&format!("{ETCD}max_per_zone = 2\nzone = \"eu-1a\"\n")).unwrap();
        assert_eq!(c.lock.limits.max_per_zone, Some(2));
        assert_eq!(c.lock.limits.zone.as_deref(), Some("eu-1a"));
        let c = load(ETCD).unwrap();
        assert_eq!(c.lock.limits, super::super::Limits::default());
        let missing = load(&format!("{ETCD}max_per_zone = 1\n")).unwrap_err().0;
        assert!(
            missing.contains("lock.zone") && missing.contains("lock.max_per_zone"),
            "{missing}"
        );
        refused(
            &format!("{ETCD}max_per_zone = 0\nzone = \"a\"\n"),
            &["lock.max_per_zone", "0", "at least 1"],
        );
        refused(
            &format!("{ETCD}zone = \"a b\"\n"),
            &["lock.zone", "\"a b\""],
        );
    }

    #[test]
    fn zones_on_leases_come_from_a_node_label() {
        let c = load(&format!("{LEASES}max_per_zone = 1\n")).unwrap();
        let LockBackend::Kubernetes(k) = &c.lock.backend else {
            panic!("{:?}", c.lock.backend)
        };
        assert_eq!(k.zone_label, "topology.kubernetes.io/zone");
        let c = load(&format!(
            "{LEASES}max_per_zone = 1\n[lock.kubernetes]\nzone_label = \"example.com/rack\"\n"
        ))
        .unwrap();
        let LockBackend::Kubernetes(k) = &c.lock.backend else {
            panic!()
        };
        assert_eq!(k.zone_label, "example.com/rack");
        refused(
            &format!("{LEASES}zone = \"a\"\n"),
            &["lock.zone", "zone_label"],
        );
        refused(
            &format!("{LEASES}[lock.kubernetes]\nzone_label = \"Bad Label\"\n"),
            &["lock.kubernetes.zone_label"],
        );
        refused("[lock]\nmax_per_zone = 1\n", &["lock.max_per_zone", "none"]);
    }

    #[test]
    fn max_is_a_share_of_the_nodes_on_leases_and_etcd_only() {
        let c = load(&format!(
            "{LEASES}max = \"10%\"\n[lock.kubernetes]\nnode_selector = \"pool=web\"\n"
        ))
        .unwrap();
        assert_eq!(c.lock.limits.max_percent, Some(10));
        let LockBackend::Kubernetes(k) = &c.lock.backend else {
            panic!()
        };
        assert_eq!(k.node_selector.as_deref(), Some("pool=web"));
        for bad in ["\"0%\"", "\"101%\"", "\"10\"", "\"ten%\""] {
            refused(&format!("{LEASES}max = {bad}\n"), &["lock.max", bad, "1%"]);
        }
        refused(
            &format!("{LEASES}max = 3\n"),
            &["lock.max", "rebootctl set-max 3"],
        );
        for api in ["v3", "v2"] {
            let etcd = ETCD.replacen("]\n", &format!("]\napi = \"{api}\"\n"), 1);
            let c = load(&format!("{etcd}max = \"10%\"\n")).unwrap();
            assert_eq!(c.lock.limits.max_percent, Some(10), "{api}");
            let LockBackend::Etcd(e) = &c.lock.backend else {
                panic!("{:?}", c.lock.backend)
            };
            assert_eq!(format!("{:?}", e.api).to_lowercase(), api);
        }
        refused(
            &format!("{ETCD}max = 2\n"),
            &["lock.max", "rebootctl set-max 2"],
        );
        refused(
            "[lock]\nmax = \"10%\"\n",
            &["lock.max", "\"10%\"", "etcd", "kubernetes", "\"none\""],
        );
        refused(
            "[lock]\nbackend = \"fleetlock\"\nmax = \"10%\"\n[lock.fleetlock]\n\
             url = \"https://fl.example.com\"\n",
            &["lock.max", "\"fleetlock\"", "FleetLock server"],
        );
    }
}
