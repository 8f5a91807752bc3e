//! Go's `time.ParseDuration`, as locksmithd reads its reboot window's length, and why a value
//! of the window is not read.

use std::time::Duration;

/// Why a value of locksmith's reboot window is not read (the reason of an
/// [`super::ImportError::untranslatable`], which names the file, the variable and the value).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum WindowError {
    #[error("a negative length")]
    NegativeLength,
    #[error("empty")]
    Empty,
    #[error("a number without a unit")]
    NoUnit,
    #[error("{0:?} is not a number")]
    NotANumber(String),
    #[error("unknown unit {0:?}")]
    UnknownUnit(String),
    #[error("{0}")]
    OutOfRange(std::time::TryFromFloatSecsError),
    #[error("invalid day of week {0:?}")]
    Day(String),
    #[error("wrong number of fields")]
    Fields,
    #[error("invalid time of day {0:?}")]
    TimeOfDay(String),
}

/// A Go `time.ParseDuration` text (`1h30m`, `90m`, `1.5h`, `300ms`) as a duration.
pub fn go_duration(text: &str) -> Result<Duration, WindowError> {
    let t = text.trim();
    if t == "0" {
        return Ok(Duration::ZERO);
    }
    if t.starts_with('-') {
        return Err(WindowError::NegativeLength);
    }
    let mut rest = t.strip_prefix('+').unwrap_or(t);
    if rest.is_empty() {
        return Err(WindowError::Empty);
    }
    let mut total = 0f64;
    while !rest.is_empty() {
        let num_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or(WindowError::NoUnit)?;
        let number: f64 = rest[..num_end]
            .parse()
            .map_err(|_| WindowError::NotANumber(rest[..num_end].to_string()))?;
        rest = &rest[num_end..];
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_end] {
            "ns" => 1e-9,
            "us" | "µs" | "μs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            u => return Err(WindowError::UnknownUnit(u.to_string())),
        };
        total += number * scale;
        rest = &rest[unit_end..];
    }
    Duration::try_from_secs_f64(total).map_err(WindowError::OutOfRange)
}
