//! Lower bounds of the configured durations: a value under its bound is a mistake (a `1ns`
//! retry is a busy loop, a zero timeout never lets anything finish), refused at start with the
//! file, the key and the value, like any other bad value.

use super::{file_of, Config, ConfigError};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

const MS_100: Duration = Duration::from_millis(100);
const SECOND: Duration = Duration::from_secs(1);

/// One bound: the key, its least value, and why.
struct Bound {
    key: &'static str,
    least: Duration,
    why: &'static str,
}

/// Every duration key with its bound. Kept beside each other so a new key gets one.
const BOUNDS: [Bound; 6] = [
    Bound {
        key: "triggers.sentinel_interval",
        least: MS_100,
        why: "the command would run in a busy loop",
    },
    Bound {
        key: "reboot.timeout",
        least: SECOND,
        why: "no host goes down faster; every accepted reboot would count as lost",
    },
    Bound {
        key: "reboot.retry_interval",
        least: SECOND,
        why: "a shorter back-off hammers logind and the lock store",
    },
    Bound {
        key: "kubernetes.drain_timeout",
        least: SECOND,
        why: "no drain finishes in less",
    },
    Bound {
        key: "kubernetes.ready_timeout",
        least: SECOND,
        why: "no node reports Ready in less",
    },
    Bound {
        key: "window.length",
        least: SECOND,
        why: "such a window never lets a reboot start",
    },
];

/// The configured values of each bounded key (several for windows).
fn values(config: &Config, key: &str) -> Vec<Duration> {
    match key {
        "triggers.sentinel_interval" => vec![config.triggers.sentinel_interval],
        "reboot.timeout" => vec![config.reboot.timeout],
        "reboot.retry_interval" => vec![config.reboot.retry_interval],
        "kubernetes.drain_timeout" => config.kubernetes.iter().map(|k| k.drain_timeout).collect(),
        "kubernetes.ready_timeout" => config.kubernetes.iter().map(|k| k.ready_timeout).collect(),
        "window.length" => config.windows.0.iter().map(|w| w.length).collect(),
        _ => Vec::new(),
    }
}

/// Refuse the first value under its bound.
pub(super) fn check(
    config: &Config,
    origin: &BTreeMap<String, PathBuf>,
) -> Result<(), ConfigError> {
    for b in &BOUNDS {
        for v in values(config, b.key) {
            if v < b.least {
                // Windows are an array: the file that set `window` set them all.
                let set_by = if b.key == "window.length" {
                    "window"
                } else {
                    b.key
                };
                return Err(ConfigError::Invalid {
                    path: file_of(origin, set_by),
                    key: b.key.into(),
                    value: format!("\"{}\"", humantime::format_duration(v)),
                    reason: format!(
                        "must be at least {}: {}",
                        humantime::format_duration(b.least),
                        b.why
                    ),
                });
            }
        }
    }
    Ok(())
}
