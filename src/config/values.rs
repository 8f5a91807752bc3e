//! Value types read from configuration text: durations, week days, times of day, time zones.
//! Each refuses a bad value with a message that shows it and says what is expected.

use serde::Deserialize;
use std::time::Duration;

/// A duration written as text: `"90s"`, `"5m"`, `"2h 30m"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HumanDuration(pub Duration);

/// A configuration value that does not read (serde's error, which the loader places in its file
/// and key, says it).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ValueError {
    #[error("invalid duration {text:?} ({reason}); write e.g. \"90s\", \"5m\", \"2h\"")]
    Duration {
        text: String,
        reason: humantime::DurationError,
    },
}

/// Parse a duration as written in the configuration.
pub fn parse_duration(s: &str) -> Result<Duration, ValueError> {
    humantime::parse_duration(s.trim()).map_err(|reason| ValueError::Duration {
        text: s.to_string(),
        reason,
    })
}

impl<'de> Deserialize<'de> for HumanDuration {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        parse_duration(&s)
            .map(HumanDuration)
            .map_err(serde::de::Error::custom)
    }
}

/// A week day: `"Mon"` or `"Monday"`, any case.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Day(pub jiff::civil::Weekday);

impl<'de> Deserialize<'de> for Day {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use jiff::civil::Weekday::*;
        let s = String::deserialize(d)?;
        let day = match s.to_ascii_lowercase().as_str() {
            "mon" | "monday" => Monday,
            "tue" | "tuesday" => Tuesday,
            "wed" | "wednesday" => Wednesday,
            "thu" | "thursday" => Thursday,
            "fri" | "friday" => Friday,
            "sat" | "saturday" => Saturday,
            "sun" | "sunday" => Sunday,
            _ => {
                return Err(serde::de::Error::custom(format!(
                    "invalid day {s:?}; write one of Mon, Tue, Wed, Thu, Fri, Sat, Sun"
                )))
            }
        };
        Ok(Day(day))
    }
}

/// A local time of day: `"02:00"` or `"02:00:30"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimeOfDay(pub jiff::civil::Time);

impl<'de> Deserialize<'de> for TimeOfDay {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        let bad = || {
            serde::de::Error::custom(format!(
                "invalid time of day {s:?}; write HH:MM or HH:MM:SS, 24-hour"
            ))
        };
        let parts: Vec<&str> = s.split(':').collect();
        if !(2..=3).contains(&parts.len())
            || parts
                .iter()
                .any(|p| p.len() != 2 || !p.bytes().all(|b| b.is_ascii_digit()))
        {
            return Err(bad());
        }
        let num = |i: usize| parts.get(i).map_or(Ok(0), |p| p.parse::<i8>());
        let (h, m, sec) = (num(0), num(1), num(2));
        match (h, m, sec) {
            (Ok(h), Ok(m), Ok(sec)) => jiff::civil::Time::new(h, m, sec, 0)
                .map(TimeOfDay)
                .map_err(|_| bad()),
            _ => Err(bad()),
        }
    }
}

/// An IANA time zone name, checked against the time zone database.
#[derive(Debug, Clone)]
pub struct Zone {
    pub name: String,
    pub zone: jiff::tz::TimeZone,
}

impl<'de> Deserialize<'de> for Zone {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let name = String::deserialize(d)?;
        let zone = jiff::tz::TimeZone::get(&name).map_err(|_| {
            serde::de::Error::custom(format!(
                "unknown time zone {name:?}; write an IANA name such as \"Europe/Berlin\" or \"UTC\""
            ))
        })?;
        Ok(Zone { name, zone })
    }
}
