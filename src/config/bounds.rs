//! Bounds of the configured durations: a value out of its bounds is a mistake (a `1ns` retry
//! is a busy loop, a zero timeout never lets anything finish, a boot of a day is a typo),
//! refused at start with the file, the key and the value, like any other bad value.

use super::{file_of, Config, ConfigError};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

const MS_100: Duration = Duration::from_millis(100);
const SECOND: Duration = Duration::from_secs(1);
const NO_MOST: Duration = Duration::MAX;

/// One key's bounds: its least and its most value, and why.
struct Bound {
    key: &'static str,
    least: Duration,
    most: Duration,
    why: &'static str,
}

/// Every duration key with its bounds. Kept beside each other so a new key gets them.
const BOUNDS: [Bound; 7] = [
    Bound {
        key: "triggers.sentinel_interval",
        least: MS_100,
        most: NO_MOST,
        why: "the command would run in a busy loop",
    },
    Bound {
        key: "reboot.timeout",
        least: SECOND,
        most: NO_MOST,
        why: "no host goes down faster; every accepted reboot would count as lost",
    },
    Bound {
        key: "reboot.retry_interval",
        least: SECOND,
        most: NO_MOST,
        why: "a shorter back-off hammers logind and the lock store",
    },
    Bound {
        key: "kubernetes.drain_timeout",
        least: SECOND,
        most: NO_MOST,
        why: "no drain finishes in less",
    },
    Bound {
        key: "kubernetes.ready_timeout",
        least: SECOND,
        most: NO_MOST,
        why: "no node reports Ready in less",
    },
    Bound {
        key: "window.length",
        least: SECOND,
        most: NO_MOST,
        why: "such a window never lets a reboot start",
    },
    Bound {
        key: "reboot.boot_time",
        least: Duration::ZERO,
        most: Duration::from_secs(2 * 3600),
        why: "it is the time from going down to rebootd running again (firmware, boot, start), \
              counted in lock.max_hold; a boot of hours is a mistake",
    },
];

/// The configured values of each bounded key (several for windows).
fn values(config: &Config, key: &str) -> Vec<Duration> {
    match key {
        "triggers.sentinel_interval" => vec![config.triggers.sentinel_interval],
        "reboot.timeout" => vec![config.reboot.timeout],
        "reboot.retry_interval" => vec![config.reboot.retry_interval],
        "reboot.boot_time" => vec![config.reboot.boot_time],
        "kubernetes.drain_timeout" => config.kubernetes.iter().map(|k| k.drain_timeout).collect(),
        "kubernetes.ready_timeout" => config.kubernetes.iter().map(|k| k.ready_timeout).collect(),
        "window.length" => config
            .windows
            .0
            .iter()
            .map(|w| w.length)
            .chain(config.logind_windows.iter().map(|w| w.length))
            .collect(),
        _ => Vec::new(),
    }
}

/// Refuse the first value out of its bounds.
pub(super) fn check(
    config: &Config,
    origin: &BTreeMap<String, PathBuf>,
) -> Result<(), ConfigError> {
    let fmt = |d: Duration| humantime::format_duration(d).to_string();
    for b in &BOUNDS {
        for v in values(config, b.key) {
            let reason = if v < b.least {
                format!("must be at least {}: {}", fmt(b.least), b.why)
            } else if v > b.most {
                format!("must be at most {}: {}", fmt(b.most), b.why)
            } else {
                continue;
            };
            // Windows are an array: the file that set `window` set them all.
            let set_by = if b.key == "window.length" {
                "window"
            } else {
                b.key
            };
            return Err(ConfigError::Invalid {
                path: file_of(origin, set_by),
                key: b.key.into(),
                value: format!("\"{}\"", fmt(v)),
                reason,
            });
        }
    }
    Ok(())
}
