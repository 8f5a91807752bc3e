//! Maintenance windows: when a node may start a reboot. This module owns the weekly window
//! model and its pure time logic (is a window open now, when does the next one open, when does
//! the current open period end, and how windows are shown to people). No I/O, no clock reads.

use jiff::civil::{Date, Time, Weekday};
use jiff::tz::TimeZone;
use jiff::Timestamp;
use std::fmt;
use std::time::Duration;

/// One weekly maintenance window: on each of `days`, from `start` local time in `time_zone`,
/// for `length` of elapsed time (so it may cross midnight).
///
/// A local start that falls in a DST gap moves forward by the size of the gap; one that is
/// ambiguous (DST fold) is the earlier of the two instants (jiff's "compatible" rule). The
/// length is elapsed time, so a 3h window over a DST change is open for 3 real hours.
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

/// A window longer than this is treated as always open.
const WEEK: Duration = Duration::from_secs(7 * 24 * 3600);

/// How far `next_open` looks ahead: every window that can open does so within a week
/// (plus any DST shift), so 8 days is enough.
const LOOKAHEAD: Duration = Duration::from_secs(8 * 24 * 3600);

/// How far `close_of_current` follows a chain of overlapping occurrences before deciding the
/// open period never ends. Time zone rules repeat yearly, so a union that stays open for more
/// than a year is taken to stay open for good.
const CHAIN_LIMIT: Duration = Duration::from_secs(400 * 24 * 3600);

/// Extra local days scanned on each side of a range, to absorb DST gaps and folds (some of
/// which move the local date) and gap disambiguation pushing a start forward.
const DATE_MARGIN_DAYS: u32 = 2;

/// One occurrence of a window: open on `[start, end)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Interval {
    start: Timestamp,
    end: Timestamp,
}

impl Window {
    /// Whether this window can never open (no day, or zero length).
    fn never_opens(&self) -> bool {
        self.days.is_empty() || self.length.is_zero()
    }

    /// Whether this window is open at every instant (it has a day and lasts more than a week).
    fn always_open(&self) -> bool {
        !self.days.is_empty() && self.length > WEEK
    }

    /// The instant this window's occurrence on local `date` starts.
    fn start_on(&self, date: Date) -> Option<Timestamp> {
        self.time_zone
            .to_ambiguous_timestamp(date.to_datetime(self.start))
            .compatible()
            .ok()
    }

    /// Appends every occurrence with `end > lo` and `start <= hi` (and possibly a few more).
    /// Only meaningful for windows that neither never open nor are always open.
    fn occurrences(&self, lo: Timestamp, hi: Timestamp, out: &mut Vec<Interval>) {
        if self.never_opens() {
            return;
        }
        // An occurrence that ends after `lo` started after `lo - length`.
        let earliest = lo.saturating_sub(self.length).unwrap_or(Timestamp::MIN);
        let first = shift_date(
            self.time_zone.to_datetime(earliest).date(),
            -i64::from(DATE_MARGIN_DAYS),
        );
        let last = shift_date(
            self.time_zone.to_datetime(hi).date(),
            i64::from(DATE_MARGIN_DAYS),
        );
        let mut date = first;
        while date <= last {
            if self.days.contains(&date.weekday()) {
                if let Some(start) = self.start_on(date) {
                    let end = start.saturating_add(self.length).unwrap_or(Timestamp::MAX);
                    out.push(Interval { start, end });
                }
            }
            match date.tomorrow() {
                Ok(next) => date = next,
                Err(_) => break,
            }
        }
    }
}

/// `date` moved by `days`, clamped to the supported range.
fn shift_date(date: Date, days: i64) -> Date {
    let span = jiff::Span::new().days(days);
    match date.checked_add(span) {
        Ok(d) => d,
        Err(_) if days < 0 => Date::MIN,
        Err(_) => Date::MAX,
    }
}

impl Windows {
    /// Whether any window is open at every instant (or there is no window at all).
    fn always_open(&self) -> bool {
        self.0.is_empty() || self.0.iter().any(Window::always_open)
    }

    /// Occurrences of all windows overlapping `[lo, hi]` (and possibly a few more), sorted by
    /// start.
    fn intervals(&self, lo: Timestamp, hi: Timestamp) -> Vec<Interval> {
        let mut out = Vec::new();
        for w in &self.0 {
            w.occurrences(lo, hi, &mut out);
        }
        out.sort();
        out
    }

    /// Whether a reboot may start at `at`.
    pub fn is_open(&self, at: Timestamp) -> bool {
        if self.always_open() {
            return true;
        }
        self.intervals(at, at)
            .iter()
            .any(|i| i.start <= at && at < i.end)
    }

    /// The first instant at or after `at` when a window is open (`at` itself when open now).
    /// `None` only when no window can ever open (every window has no day or zero length).
    pub fn next_open(&self, at: Timestamp) -> Option<Timestamp> {
        if self.is_open(at) {
            return Some(at);
        }
        let horizon = at.saturating_add(LOOKAHEAD).unwrap_or(Timestamp::MAX);
        self.intervals(at, horizon)
            .into_iter()
            .filter(|i| i.start > at && i.start < i.end)
            .map(|i| i.start)
            .min()
    }

    /// When open at `at`, the instant the open period ends, following overlapping and
    /// adjacent occurrences of all windows. `None` when closed at `at`, and when the open
    /// period never ends: no window at all, a window longer than a week, or windows that
    /// together stay open for more than a year.
    pub fn close_of_current(&self, at: Timestamp) -> Option<Timestamp> {
        if self.always_open() || !self.is_open(at) {
            return None;
        }
        let limit = at.saturating_add(CHAIN_LIMIT).unwrap_or(Timestamp::MAX);
        let mut end = at;
        loop {
            let horizon = end.saturating_add(LOOKAHEAD).unwrap_or(Timestamp::MAX);
            let mut extended = false;
            // Sorted by start, so one sweep merges everything this batch can reach.
            for i in self.intervals(end, horizon) {
                if i.start <= end && i.end > end {
                    end = i.end;
                    extended = true;
                }
            }
            if !extended {
                return Some(end);
            }
            if end >= limit {
                return None;
            }
        }
    }

    /// A one-line description for logs and status: "any time" when there is no window,
    /// else every window joined by "; ".
    pub fn describe(&self) -> String {
        if self.0.is_empty() {
            return "any time".to_string();
        }
        self.0
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("; ")
    }
}

fn day_abbrev(day: Weekday) -> &'static str {
    match day {
        Weekday::Monday => "Mon",
        Weekday::Tuesday => "Tue",
        Weekday::Wednesday => "Wed",
        Weekday::Thursday => "Thu",
        Weekday::Friday => "Fri",
        Weekday::Saturday => "Sat",
        Weekday::Sunday => "Sun",
    }
}

/// A compact duration such as `3h`, `1h30m`, `2d`, `1s500ms` or `0s` (parseable by humantime).
fn fmt_length(f: &mut fmt::Formatter<'_>, length: Duration) -> fmt::Result {
    let secs = length.as_secs();
    let nanos = length.subsec_nanos();
    if secs == 0 && nanos == 0 {
        return f.write_str("0s");
    }
    let parts = [
        (secs / 86_400, "d"),
        (secs % 86_400 / 3600, "h"),
        (secs % 3600 / 60, "m"),
        (secs % 60, "s"),
        (u64::from(nanos / 1_000_000), "ms"),
        (u64::from(nanos / 1_000 % 1_000), "us"),
        (u64::from(nanos % 1_000), "ns"),
    ];
    for (n, unit) in parts {
        if n != 0 {
            write!(f, "{n}{unit}")?;
        }
    }
    Ok(())
}

impl fmt::Display for Window {
    /// For example `Sat,Sun 02:00 +3h Europe/Berlin`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.days.is_empty() {
            f.write_str("(no days)")?;
        }
        for (n, day) in self.days.iter().enumerate() {
            if n > 0 {
                f.write_str(",")?;
            }
            f.write_str(day_abbrev(*day))?;
        }
        if self.start.second() == 0 && self.start.subsec_nanosecond() == 0 {
            write!(f, " {:02}:{:02}", self.start.hour(), self.start.minute())?;
        } else {
            write!(f, " {}", self.start)?;
        }
        f.write_str(" +")?;
        fmt_length(f, self.length)?;
        let zone = if self.time_zone_name.is_empty() {
            self.time_zone.iana_name().unwrap_or("UTC")
        } else {
            &self.time_zone_name
        };
        write!(f, " {zone}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use jiff::civil::{date, time};
    use Weekday::*;

    const H: u64 = 3600;

    fn hours(n: u64) -> Duration {
        Duration::from_secs(n * H)
    }

    fn win(days: &[Weekday], start: Time, length: Duration, zone: &str) -> Window {
        Window {
            days: days.to_vec(),
            start,
            length,
            time_zone: TimeZone::get(zone).unwrap(),
            time_zone_name: zone.to_string(),
        }
    }

    fn utc(days: &[Weekday], start: Time, length: Duration) -> Window {
        win(days, start, length, "UTC")
    }

    /// An instant given as RFC 3339 / jiff timestamp text, e.g. "2026-01-03T02:00:00Z".
    fn ts(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    /// An instant given as local civil time in a zone (compatible disambiguation).
    fn local(zone: &str, y: i16, mo: i8, d: i8, h: i8, mi: i8) -> Timestamp {
        date(y, mo, d)
            .at(h, mi, 0, 0)
            .in_tz(zone)
            .unwrap()
            .timestamp()
    }

    // 2026-01-03 is a Saturday; 2026-01-04 a Sunday.

    #[test]
    fn empty_is_always_open() {
        let w = Windows::default();
        for at in [
            ts("2026-01-03T02:00:00Z"),
            ts("2026-06-17T13:37:00Z"),
            Timestamp::MIN,
            Timestamp::MAX,
        ] {
            assert!(w.is_open(at));
            assert_eq!(w.next_open(at), Some(at));
            assert_eq!(w.close_of_current(at), None);
        }
        assert_eq!(w.describe(), "any time");
    }

    #[test]
    fn inside_and_outside_simple_window() {
        let w = Windows(vec![utc(&[Saturday], time(2, 0, 0, 0), hours(3))]);
        assert!(!w.is_open(ts("2026-01-03T01:59:59Z")));
        assert!(w.is_open(ts("2026-01-03T02:00:00Z")));
        assert!(w.is_open(ts("2026-01-03T04:59:59Z")));
        assert!(!w.is_open(ts("2026-01-03T05:00:00Z")));
        // Same time on another day of the week: closed.
        assert!(!w.is_open(ts("2026-01-04T03:00:00Z")));
        assert!(!w.is_open(ts("2026-01-02T03:00:00Z")));
        // A week later: open again.
        assert!(w.is_open(ts("2026-01-10T03:00:00Z")));
        assert_eq!(
            w.close_of_current(ts("2026-01-03T03:00:00Z")),
            Some(ts("2026-01-03T05:00:00Z"))
        );
        assert_eq!(w.close_of_current(ts("2026-01-03T05:00:00Z")), None);
    }

    #[test]
    fn window_crossing_midnight() {
        let w = Windows(vec![utc(&[Saturday], time(23, 0, 0, 0), hours(3))]);
        assert!(!w.is_open(ts("2026-01-03T22:59:00Z")));
        assert!(w.is_open(ts("2026-01-03T23:30:00Z")));
        // Open after midnight on the next day (Sunday).
        assert!(w.is_open(ts("2026-01-04T00:00:00Z")));
        assert!(w.is_open(ts("2026-01-04T01:00:00Z")));
        assert!(w.is_open(ts("2026-01-04T01:59:59Z")));
        // Closed after it ends.
        assert!(!w.is_open(ts("2026-01-04T02:00:00Z")));
        assert!(!w.is_open(ts("2026-01-04T23:30:00Z")));
        assert_eq!(
            w.close_of_current(ts("2026-01-04T01:00:00Z")),
            Some(ts("2026-01-04T02:00:00Z"))
        );
        assert_eq!(
            w.next_open(ts("2026-01-04T02:00:00Z")),
            Some(ts("2026-01-10T23:00:00Z"))
        );
    }

    #[test]
    fn window_crossing_end_of_week() {
        // Sun 22:00 +4h runs into Monday.
        let w = Windows(vec![utc(&[Sunday], time(22, 0, 0, 0), hours(4))]);
        assert!(w.is_open(ts("2026-01-05T01:00:00Z")));
        assert!(!w.is_open(ts("2026-01-05T02:00:00Z")));
    }

    #[test]
    fn union_of_two_windows() {
        let w = Windows(vec![
            utc(&[Saturday], time(2, 0, 0, 0), hours(1)),
            utc(&[Wednesday], time(14, 0, 0, 0), hours(2)),
        ]);
        assert!(w.is_open(ts("2026-01-03T02:30:00Z")));
        assert!(w.is_open(ts("2026-01-07T15:00:00Z")));
        assert!(!w.is_open(ts("2026-01-03T03:30:00Z")));
        assert!(!w.is_open(ts("2026-01-07T16:00:00Z")));
        // From Saturday after the first window, the Wednesday one is next.
        assert_eq!(
            w.next_open(ts("2026-01-03T03:00:00Z")),
            Some(ts("2026-01-07T14:00:00Z"))
        );
        // From Wednesday after the second window, the Saturday one is next.
        assert_eq!(
            w.next_open(ts("2026-01-07T16:00:00Z")),
            Some(ts("2026-01-10T02:00:00Z"))
        );
    }

    #[test]
    fn close_of_current_across_adjacent_and_overlapping_windows() {
        // 01:00-03:00, then adjacent 03:00-04:00, then overlapping 03:30-06:00.
        let w = Windows(vec![
            utc(&[Saturday], time(1, 0, 0, 0), hours(2)),
            utc(&[Saturday], time(3, 0, 0, 0), hours(1)),
            utc(
                &[Saturday],
                time(3, 30, 0, 0),
                Duration::from_secs(150 * 60),
            ),
        ]);
        let end = ts("2026-01-03T06:00:00Z");
        assert_eq!(w.close_of_current(ts("2026-01-03T01:00:00Z")), Some(end));
        assert_eq!(w.close_of_current(ts("2026-01-03T02:59:59Z")), Some(end));
        assert_eq!(w.close_of_current(ts("2026-01-03T03:00:00Z")), Some(end));
        assert_eq!(w.close_of_current(ts("2026-01-03T05:00:00Z")), Some(end));
        assert_eq!(w.close_of_current(ts("2026-01-03T06:00:00Z")), None);
        assert_eq!(w.close_of_current(ts("2026-01-03T00:59:59Z")), None);
        assert!(w.is_open(ts("2026-01-03T03:00:00Z")));
    }

    #[test]
    fn close_of_current_across_days() {
        // Fri 22:00 +4h, then Sat 02:00 +3h: one period Fri 22:00 to Sat 05:00.
        let w = Windows(vec![
            utc(&[Friday], time(22, 0, 0, 0), hours(4)),
            utc(&[Saturday], time(2, 0, 0, 0), hours(3)),
        ]);
        assert_eq!(
            w.close_of_current(ts("2026-01-02T23:00:00Z")),
            Some(ts("2026-01-03T05:00:00Z"))
        );
    }

    #[test]
    fn close_of_current_chain_longer_than_lookahead() {
        // Every day 00:00 +24h in UTC tiles all time: never closes.
        let all = [
            Monday, Tuesday, Wednesday, Thursday, Friday, Saturday, Sunday,
        ];
        let w = Windows(vec![utc(&all, time(0, 0, 0, 0), hours(24))]);
        assert!(w.is_open(ts("2026-01-03T12:00:00Z")));
        assert_eq!(w.close_of_current(ts("2026-01-03T12:00:00Z")), None);

        // Mon..Sat: six chained occurrences make one period, ending at Sunday 00:00.
        let w = Windows(vec![utc(&all[..6], time(0, 0, 0, 0), hours(24))]);
        assert_eq!(
            w.close_of_current(ts("2026-01-05T12:00:00Z")),
            Some(ts("2026-01-11T00:00:00Z"))
        );

        // Every day 00:00 +24h in Berlin leaves a one-hour gap on the fall-back day
        // (25 hours long), so the chain ends there.
        let w = Windows(vec![win(
            &all,
            time(0, 0, 0, 0),
            hours(24),
            "Europe/Berlin",
        )]);
        let gap = local("Europe/Berlin", 2026, 10, 25, 23, 0);
        assert_eq!(
            w.close_of_current(local("Europe/Berlin", 2026, 6, 1, 12, 0)),
            Some(gap)
        );
        assert!(!w.is_open(gap));
        assert_eq!(
            w.next_open(gap),
            Some(local("Europe/Berlin", 2026, 10, 26, 0, 0))
        );
    }

    #[test]
    fn next_open_same_day_later() {
        let w = Windows(vec![utc(&[Saturday], time(14, 0, 0, 0), hours(2))]);
        assert_eq!(
            w.next_open(ts("2026-01-03T09:15:00Z")),
            Some(ts("2026-01-03T14:00:00Z"))
        );
        // Open now: `at` itself.
        let at = ts("2026-01-03T15:00:00Z");
        assert_eq!(w.next_open(at), Some(at));
        // Right at the start.
        let at = ts("2026-01-03T14:00:00Z");
        assert_eq!(w.next_open(at), Some(at));
    }

    #[test]
    fn next_open_next_week() {
        let w = Windows(vec![utc(&[Saturday], time(2, 0, 0, 0), hours(3))]);
        // Just after it closed: a full week minus the length away.
        assert_eq!(
            w.next_open(ts("2026-01-03T05:00:00Z")),
            Some(ts("2026-01-10T02:00:00Z"))
        );
        // Earlier the same day: today.
        assert_eq!(
            w.next_open(ts("2026-01-03T01:00:00Z")),
            Some(ts("2026-01-03T02:00:00Z"))
        );
        // From the middle of the week.
        assert_eq!(
            w.next_open(ts("2026-01-06T12:00:00Z")),
            Some(ts("2026-01-10T02:00:00Z"))
        );
    }

    #[test]
    fn next_open_picks_nearest_listed_day() {
        let w = Windows(vec![utc(&[Tuesday, Saturday], time(2, 0, 0, 0), hours(1))]);
        assert_eq!(
            w.next_open(ts("2026-01-03T05:00:00Z")),
            Some(ts("2026-01-06T02:00:00Z"))
        );
        assert_eq!(
            w.next_open(ts("2026-01-06T05:00:00Z")),
            Some(ts("2026-01-10T02:00:00Z"))
        );
    }

    #[test]
    fn europe_berlin_window() {
        // Winter: CET = UTC+1.
        let w = Windows(vec![win(
            &[Saturday, Sunday],
            time(2, 0, 0, 0),
            hours(3),
            "Europe/Berlin",
        )]);
        assert!(!w.is_open(ts("2026-01-03T00:59:00Z")));
        assert!(w.is_open(ts("2026-01-03T01:00:00Z")));
        assert!(w.is_open(ts("2026-01-03T03:59:00Z")));
        assert!(!w.is_open(ts("2026-01-03T04:00:00Z")));
        assert!(w.is_open(ts("2026-01-04T01:30:00Z")));
        assert_eq!(
            w.next_open(ts("2026-01-03T04:00:00Z")),
            Some(ts("2026-01-04T01:00:00Z"))
        );
        // Summer: CEST = UTC+2.
        assert!(w.is_open(ts("2026-07-04T00:00:00Z")));
        assert!(!w.is_open(ts("2026-07-04T03:00:00Z")));
        assert_eq!(
            w.close_of_current(ts("2026-07-04T00:30:00Z")),
            Some(ts("2026-07-04T03:00:00Z"))
        );
    }

    #[test]
    fn zone_decides_the_weekday() {
        // Mon 00:30 in Berlin is Sun 23:30 UTC: open on a UTC Sunday.
        let w = Windows(vec![win(
            &[Monday],
            time(0, 30, 0, 0),
            hours(1),
            "Europe/Berlin",
        )]);
        assert!(w.is_open(ts("2026-01-04T23:45:00Z")));
        assert!(!w.is_open(ts("2026-01-05T23:45:00Z")));
    }

    #[test]
    fn america_new_york_window() {
        // Winter: EST = UTC-5.
        let w = Windows(vec![win(
            &[Wednesday],
            time(22, 0, 0, 0),
            hours(4),
            "America/New_York",
        )]);
        // Wed 2026-01-07 22:00 EST = Thu 03:00Z, until 07:00Z.
        assert!(!w.is_open(ts("2026-01-08T02:59:00Z")));
        assert!(w.is_open(ts("2026-01-08T03:00:00Z")));
        assert!(w.is_open(ts("2026-01-08T06:59:00Z")));
        assert!(!w.is_open(ts("2026-01-08T07:00:00Z")));
        assert_eq!(
            w.next_open(ts("2026-01-07T12:00:00Z")),
            Some(ts("2026-01-08T03:00:00Z"))
        );
        // Summer: EDT = UTC-4.
        assert_eq!(
            w.next_open(ts("2026-07-01T12:00:00Z")),
            Some(ts("2026-07-02T02:00:00Z"))
        );
    }

    #[test]
    fn spring_forward_start_in_gap_moves_forward() {
        // 2026-03-08 (Sunday): New York clocks jump 02:00 EST -> 03:00 EDT; 02:30 does not
        // exist. Compatible rule: 02:30 EST = 07:30Z (shown as 03:30 EDT).
        let w = Windows(vec![win(
            &[Sunday],
            time(2, 30, 0, 0),
            hours(1),
            "America/New_York",
        )]);
        let start = ts("2026-03-08T07:30:00Z");
        assert_eq!(w.next_open(ts("2026-03-08T05:00:00Z")), Some(start));
        assert!(!w.is_open(ts("2026-03-08T07:29:59Z")));
        assert!(w.is_open(start));
        assert_eq!(w.close_of_current(start), Some(ts("2026-03-08T08:30:00Z")));
        assert!(!w.is_open(ts("2026-03-08T08:30:00Z")));
        // The Sunday before and after are normal.
        assert_eq!(
            w.next_open(ts("2026-03-01T00:00:00Z")),
            Some(ts("2026-03-01T07:30:00Z"))
        );
        assert_eq!(
            w.next_open(ts("2026-03-08T09:00:00Z")),
            Some(ts("2026-03-15T06:30:00Z"))
        );
    }

    #[test]
    fn fall_back_ambiguous_start_takes_earlier() {
        // 2026-11-01 (Sunday): New York clocks go 02:00 EDT -> 01:00 EST; 01:30 happens twice
        // (05:30Z and 06:30Z). The earlier one counts.
        let w = Windows(vec![win(
            &[Sunday],
            time(1, 30, 0, 0),
            Duration::from_secs(30 * 60),
            "America/New_York",
        )]);
        assert_eq!(
            w.next_open(ts("2026-11-01T00:00:00Z")),
            Some(ts("2026-11-01T05:30:00Z"))
        );
        assert!(w.is_open(ts("2026-11-01T05:45:00Z")));
        // The second 01:30 (EST) is after the window closed.
        assert!(!w.is_open(ts("2026-11-01T06:00:00Z")));
        assert!(!w.is_open(ts("2026-11-01T06:45:00Z")));
    }

    #[test]
    fn window_over_fall_back_is_length_elapsed() {
        // Sun 00:00 +3h on 2026-11-01 in New York: starts 04:00Z (EDT), lasts 3 real hours,
        // to 07:00Z, which is 02:00 EST on the wall clock.
        let w = Windows(vec![win(
            &[Sunday],
            time(0, 0, 0, 0),
            hours(3),
            "America/New_York",
        )]);
        let start = ts("2026-11-01T04:00:00Z");
        let at = ts("2026-11-01T03:00:00Z");
        assert_eq!(w.next_open(at), Some(start));
        let end = w.close_of_current(start).unwrap();
        assert_eq!(end, ts("2026-11-01T07:00:00Z"));
        assert_eq!(
            end.duration_since(start),
            jiff::SignedDuration::from_hours(3)
        );
        assert!(w.is_open(ts("2026-11-01T06:59:59Z")));
        assert!(!w.is_open(end));
    }

    #[test]
    fn window_over_spring_forward_is_length_elapsed() {
        // Sun 01:00 +3h on 2026-03-08 in New York: 06:00Z (EST) to 09:00Z, 05:00 EDT on
        // the wall clock although the local span says 4 hours.
        let w = Windows(vec![win(
            &[Sunday],
            time(1, 0, 0, 0),
            hours(3),
            "America/New_York",
        )]);
        let start = ts("2026-03-08T06:00:00Z");
        let end = w.close_of_current(start).unwrap();
        assert_eq!(
            end.duration_since(start),
            jiff::SignedDuration::from_hours(3)
        );
        assert_eq!(end, ts("2026-03-08T09:00:00Z"));

        // Same in Berlin over its 2026-03-29 change (02:00 CET -> 03:00 CEST).
        let w = Windows(vec![win(
            &[Sunday],
            time(1, 0, 0, 0),
            hours(3),
            "Europe/Berlin",
        )]);
        let start = ts("2026-03-29T00:00:00Z");
        assert_eq!(w.next_open(ts("2026-03-28T12:00:00Z")), Some(start));
        assert_eq!(w.close_of_current(start), Some(ts("2026-03-29T03:00:00Z")));
    }

    #[test]
    fn zero_length_or_no_day_never_opens() {
        let zero = utc(&[Saturday], time(2, 0, 0, 0), Duration::ZERO);
        let no_day = utc(&[], time(2, 0, 0, 0), hours(3));
        let long_no_day = utc(&[], time(2, 0, 0, 0), hours(24 * 30));
        for w in [
            Windows(vec![zero.clone()]),
            Windows(vec![no_day.clone()]),
            Windows(vec![long_no_day]),
            Windows(vec![zero, no_day]),
        ] {
            for at in [ts("2026-01-03T02:00:00Z"), ts("2026-01-03T12:00:00Z")] {
                assert!(!w.is_open(at));
                assert_eq!(w.next_open(at), None);
                assert_eq!(w.close_of_current(at), None);
            }
        }
    }

    #[test]
    fn never_opening_window_does_not_hide_others() {
        let w = Windows(vec![
            utc(&[], time(2, 0, 0, 0), hours(3)),
            utc(&[Saturday], time(2, 0, 0, 0), hours(3)),
        ]);
        assert!(w.is_open(ts("2026-01-03T03:00:00Z")));
        assert_eq!(
            w.next_open(ts("2026-01-03T06:00:00Z")),
            Some(ts("2026-01-10T02:00:00Z"))
        );
    }

    #[test]
    fn longer_than_a_week_is_always_open() {
        let w = Windows(vec![utc(&[Monday], time(0, 0, 0, 0), hours(7 * 24 + 1))]);
        for at in [ts("2026-01-03T02:00:00Z"), ts("2026-11-01T06:00:00Z")] {
            assert!(w.is_open(at));
            assert_eq!(w.next_open(at), Some(at));
            assert_eq!(w.close_of_current(at), None);
        }
        // Even alongside a window that never opens.
        let w = Windows(vec![
            utc(&[], time(0, 0, 0, 0), hours(1)),
            win(&[Friday], time(3, 0, 0, 0), hours(24 * 10), "Europe/Berlin"),
        ]);
        assert!(w.is_open(ts("2026-01-06T12:00:00Z")));
    }

    #[test]
    fn window_of_several_days() {
        // Fri 18:00 +60h: open all weekend until Mon 06:00.
        let w = Windows(vec![utc(&[Friday], time(18, 0, 0, 0), hours(60))]);
        assert!(w.is_open(ts("2026-01-03T12:00:00Z")));
        assert!(w.is_open(ts("2026-01-05T05:59:59Z")));
        assert!(!w.is_open(ts("2026-01-05T06:00:00Z")));
        assert_eq!(
            w.close_of_current(ts("2026-01-03T12:00:00Z")),
            Some(ts("2026-01-05T06:00:00Z"))
        );
    }

    #[test]
    fn extreme_instants_do_not_panic() {
        let w = Windows(vec![win(
            &[Saturday],
            time(2, 0, 0, 0),
            hours(3),
            "Europe/Berlin",
        )]);
        for at in [Timestamp::MIN, Timestamp::MAX] {
            let _ = w.is_open(at);
            let _ = w.next_open(at);
            let _ = w.close_of_current(at);
        }
    }

    #[test]
    fn display_and_describe() {
        let a = win(
            &[Saturday, Sunday],
            time(2, 0, 0, 0),
            hours(3),
            "Europe/Berlin",
        );
        assert_eq!(a.to_string(), "Sat,Sun 02:00 +3h Europe/Berlin");
        let b = utc(
            &[Wednesday],
            time(23, 30, 15, 0),
            Duration::from_secs(90 * 60),
        );
        assert_eq!(b.to_string(), "Wed 23:30:15 +1h30m UTC");
        let c = utc(
            &[
                Monday, Tuesday, Wednesday, Thursday, Friday, Saturday, Sunday,
            ],
            time(0, 0, 0, 0),
            Duration::from_secs(2 * 86_400 + 45),
        );
        assert_eq!(
            c.to_string(),
            "Mon,Tue,Wed,Thu,Fri,Sat,Sun 00:00 +2d45s UTC"
        );
        let d = utc(&[], time(4, 5, 0, 0), Duration::ZERO);
        assert_eq!(d.to_string(), "(no days) 04:05 +0s UTC");
        let e = utc(&[Friday], time(1, 0, 0, 0), Duration::from_millis(1500));
        assert_eq!(e.to_string(), "Fri 01:00 +1s500ms UTC");

        assert_eq!(
            Windows(vec![a.clone()]).describe(),
            "Sat,Sun 02:00 +3h Europe/Berlin"
        );
        assert_eq!(
            Windows(vec![a, b]).describe(),
            "Sat,Sun 02:00 +3h Europe/Berlin; Wed 23:30:15 +1h30m UTC"
        );
    }

    #[test]
    fn display_length_round_trips_through_humantime() {
        for secs in [1, 59, 60, 3600, 5400, 86_400, 90_061] {
            let length = Duration::from_secs(secs);
            let w = utc(&[Monday], time(0, 0, 0, 0), length);
            let text = w.to_string();
            let len_text = text.split(' ').find_map(|p| p.strip_prefix('+')).unwrap();
            assert_eq!(humantime::parse_duration(len_text).unwrap(), length);
        }
    }

    #[test]
    fn test_helper_local_matches_expectations() {
        // Guards the helper the DST tests rely on.
        assert_eq!(
            local("America/New_York", 2026, 11, 1, 1, 30),
            ts("2026-11-01T05:30:00Z")
        );
        assert_eq!(
            local("America/New_York", 2026, 3, 8, 2, 30),
            ts("2026-03-08T07:30:00Z")
        );
    }
}
