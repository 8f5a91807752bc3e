//! `[[window]] source = "logind"`: logind's `DesignatedMaintenanceTime` (a systemd calendar
//! spec, systemd 257) as a weekly [`Window`] of the configured `length`. Pure: the spec is read
//! over D-Bus by `crate::systemd`.
//!
//! The specs that are a weekly start time are understood: an optional weekday list
//! (`Mon,Wed`, `Mon..Fri`), an optional date that must be `*-*-*`, a time `HH:MM[:SS]`
//! (00:00:00 when left out), an optional time zone at the end (else the host's), and the
//! shorthands `daily` and `weekly`. Anything else (a date, repetitions, `hourly`) is refused
//! with the spec and what is not understood, never guessed.

use crate::window::Window;
use jiff::civil::{Time, Weekday};
use jiff::tz::TimeZone;
use std::time::Duration;

/// Why a `DesignatedMaintenanceTime` is no window rebootd can keep.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("logind's DesignatedMaintenanceTime {spec:?}: {reason}")]
pub struct CalendarError {
    pub spec: String,
    pub reason: String,
}

const ALL_DAYS: [Weekday; 7] = [
    Weekday::Monday,
    Weekday::Tuesday,
    Weekday::Wednesday,
    Weekday::Thursday,
    Weekday::Friday,
    Weekday::Saturday,
    Weekday::Sunday,
];

fn day(name: &str) -> Option<Weekday> {
    Some(match name.to_ascii_lowercase().as_str() {
        "mon" | "monday" => Weekday::Monday,
        "tue" | "tuesday" => Weekday::Tuesday,
        "wed" | "wednesday" => Weekday::Wednesday,
        "thu" | "thursday" => Weekday::Thursday,
        "fri" | "friday" => Weekday::Friday,
        "sat" | "saturday" => Weekday::Saturday,
        "sun" | "sunday" => Weekday::Sunday,
        _ => return None,
    })
}

/// Why `spec` is no window.
fn bad(spec: &str, reason: String) -> CalendarError {
    CalendarError {
        spec: spec.to_string(),
        reason,
    }
}

/// `Mon,Wed..Fri` (in `spec`) as days in week order.
fn days(text: &str, spec: &str) -> Result<Vec<Weekday>, CalendarError> {
    let mut out = Vec::new();
    for item in text.split(',') {
        let (from, to) = match item.split_once("..") {
            Some((a, b)) => (a, b),
            None => (item, item),
        };
        let (Some(a), Some(b)) = (day(from), day(to)) else {
            return Err(bad(
                spec,
                format!("{item:?} is not a week day or a range of them"),
            ));
        };
        let (i, j) = (
            a.to_monday_zero_offset() as usize,
            b.to_monday_zero_offset() as usize,
        );
        if i > j {
            return Err(bad(spec, format!("the range {item:?} runs backwards")));
        }
        out.extend_from_slice(&ALL_DAYS[i..=j]);
    }
    out.sort_by_key(|d| d.to_monday_zero_offset());
    out.dedup();
    Ok(out)
}

/// `HH:MM` or `HH:MM:SS` (in `spec`), plain numbers.
fn time(text: &str, spec: &str) -> Result<Time, CalendarError> {
    let parts: Vec<&str> = text.split(':').collect();
    let bad = || {
        bad(spec, format!("{text:?} is not a time HH:MM or HH:MM:SS (lists, ranges and repetitions are not a weekly window)"))
    };
    if !(2..=3).contains(&parts.len())
        || parts
            .iter()
            .any(|p| p.is_empty() || p.len() > 2 || !p.bytes().all(|b| b.is_ascii_digit()))
    {
        return Err(bad());
    }
    let n = |i: usize| parts.get(i).map_or(Ok(0), |p| p.parse::<i8>());
    match (n(0), n(1), n(2)) {
        (Ok(h), Ok(m), Ok(s)) => Time::new(h, m, s, 0).map_err(|_| bad()),
        _ => Err(bad()),
    }
}

/// The window logind's `spec` designates, open for `length`; a spec without a time zone is in
/// `local` (named `local_name`).
pub fn window(
    spec: &str,
    length: Duration,
    local: &TimeZone,
    local_name: &str,
) -> Result<Window, CalendarError> {
    let err = |reason: String| bad(spec, reason);
    let trimmed = spec.trim();
    if trimmed.is_empty() {
        return Err(err(
            "not set (set DesignatedMaintenanceTime= in logind.conf, or configure days and start)"
                .into(),
        ));
    }
    let expanded = match trimmed.to_ascii_lowercase().as_str() {
        "daily" => "*-*-* 00:00:00".to_string(),
        "weekly" => "Mon *-*-* 00:00:00".to_string(),
        "minutely" | "hourly" | "monthly" | "yearly" | "annually" | "quarterly"
        | "semiannually" => {
            return Err(err(format!(
                "{trimmed:?} is not a weekly window; use e.g. \"Sat 02:00\" or \"daily\""
            )))
        }
        _ => trimmed.to_string(),
    };
    let mut words: Vec<&str> = expanded.split_whitespace().collect();
    let mut zone = (local.clone(), local_name.to_string());
    if let Some(last) = words.last().copied() {
        if words.len() > 1 || !last.contains(':') {
            if let Ok(z) = TimeZone::get(last) {
                zone = (z, last.to_string());
                words.pop();
            }
        }
    }
    let mut week = ALL_DAYS.to_vec();
    if let Some(first) = words.first().copied() {
        if first.starts_with(|c: char| c.is_ascii_alphabetic()) {
            week = days(first, spec)?;
            words.remove(0);
        }
    }
    if let Some(first) = words.first().copied() {
        if first.contains('-') {
            if first != "*-*-*" && first != "*-*" {
                return Err(err(format!(
                    "the date {first:?} is not every week; only *-*-* is"
                )));
            }
            words.remove(0);
        }
    }
    let start = match words.as_slice() {
        [] => Time::midnight(),
        [t] => time(t, spec)?,
        more => return Err(err(format!("{:?} is not understood", more.join(" ")))),
    };
    Ok(Window {
        days: week,
        start,
        length,
        time_zone: zone.0,
        time_zone_name: zone.1,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOUR: Duration = Duration::from_secs(3600);

    fn w(spec: &str) -> Result<Window, CalendarError> {
        window(spec, HOUR, &TimeZone::UTC, "UTC")
    }

    #[test]
    fn a_weekday_and_a_time() {
        let got = w("Sat 02:30").unwrap();
        assert_eq!(got.days, vec![Weekday::Saturday]);
        assert_eq!(got.start, Time::new(2, 30, 0, 0).unwrap());
        assert_eq!(got.length, HOUR);
        let got = w("Mon..Wed,Fri *-*-* 03:00:15").unwrap();
        assert_eq!(
            got.days,
            vec![
                Weekday::Monday,
                Weekday::Tuesday,
                Weekday::Wednesday,
                Weekday::Friday
            ]
        );
        assert_eq!(got.start, Time::new(3, 0, 15, 0).unwrap());
    }

    #[test]
    fn every_day_shorthands_and_zones() {
        let got = w("04:00").unwrap();
        assert_eq!(got.days.len(), 7);
        let got = w("daily").unwrap();
        assert_eq!((got.days.len(), got.start), (7, Time::midnight()));
        let got = w("weekly").unwrap();
        assert_eq!(got.days, vec![Weekday::Monday]);
        let got = w("Sun 01:00 Europe/Berlin").unwrap();
        assert_eq!(got.time_zone_name, "Europe/Berlin");
        let got = w("Sun").unwrap();
        assert_eq!(got.start, Time::midnight());
    }

    #[test]
    fn what_is_no_weekly_window_is_refused_naming_it() {
        for (spec, says) in [
            ("", "not set"),
            ("hourly", "not a weekly window"),
            ("*-*-01 02:00", "*-*-01"),
            ("Sat 02:00/2", "02:00/2"),
            ("Sat *:30", "*:30"),
            ("Fri..Mon 02:00", "backwards"),
            ("Caturday 02:00", "Caturday"),
            ("Sat 02:00 03:00", "not understood"),
        ] {
            let e = w(spec).unwrap_err();
            assert!(e.to_string().contains(says), "{spec}: {e}");
            assert!(e.to_string().contains(&format!("{spec:?}")), "{e}");
        }
    }
}
