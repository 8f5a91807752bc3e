//! Maintenance windows: when a node may reboot. (Being written; API fixed.)

use jiff::civil::{Time, Weekday};
use jiff::tz::TimeZone;
use jiff::Timestamp;
use std::time::Duration;

/// One weekly maintenance window: on each of `days`, from `start` local time in `time_zone`,
/// for `length` of elapsed time (so it may cross midnight).
#[derive(Debug, Clone)]
pub struct Window {
    pub days: Vec<Weekday>,
    pub start: Time,
    pub length: Duration,
    pub time_zone: TimeZone,
    /// The IANA name the window was configured with, for display.
    pub time_zone_name: String,
}

/// A set of windows: their union. No window at all means "any time".
#[derive(Debug, Clone, Default)]
pub struct Windows(pub Vec<Window>);

impl Windows {
    /// Whether a reboot may start at `at`.
    pub fn is_open(&self, at: Timestamp) -> bool {
        let _ = at;
        true
    }

    /// The first instant at or after `at` when a window is open (`at` itself when open now).
    pub fn next_open(&self, at: Timestamp) -> Option<Timestamp> {
        Some(at)
    }
}
