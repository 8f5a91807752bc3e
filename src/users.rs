//! People logged in to the host, as logind knows them, and the warning they get before a
//! reboot.
//!
//! A session counts when it is a `user` session on a seat or a TTY (a console, a graphical
//! login, an ssh login with a pty); logind's own and background sessions do not. The warning
//! is a dry-run scheduled reboot (`ScheduleShutdown("dry-reboot", at)`, what `shutdown -k`
//! asks for): logind announces it to the logged-in users with its wall messages as the time
//! comes near, and withdraws it with `CancelScheduledShutdown` (which it announces too) when
//! the reboot is called off; at the time itself logind does nothing, and rebootd then asks for
//! the reboot as always, inhibitors respected.

use crate::reboot::RebootError;
use serde::{Deserialize, Serialize};

/// The people logged in, and the announcement of a reboot to them.
#[async_trait::async_trait]
pub trait Sessions: Send + Sync {
    /// The people logged in who get a warning before the reboot (see [`counts`]).
    async fn sessions(&self) -> Result<Vec<Session>, RebootError>;

    /// Announce the reboot for `at` to the logged-in users (a dry-run scheduled reboot).
    async fn announce(&self, at: jiff::Timestamp) -> Result<(), RebootError>;

    /// Withdraw the announcement (the reboot was called off).
    async fn withdraw(&self) -> Result<(), RebootError>;
}

/// One logged-in session that gets the warning.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Session {
    pub id: String,
    pub user: String,
    pub uid: u32,
    /// The seat (`seat0`), empty when none.
    pub seat: String,
    /// The TTY (`tty1`, `pts/0`), empty when none.
    pub tty: String,
}

impl Session {
    /// `alice on tty1`, `bob on seat0`.
    pub fn describe(&self) -> String {
        let at = if !self.tty.is_empty() {
            &self.tty
        } else {
            &self.seat
        };
        format!("{} on {at}", self.user)
    }
}

/// Whether a session of this class, seat and TTY is a person to warn.
pub fn counts(class: &str, seat: &str, tty: &str) -> bool {
    class == "user" && (!seat.is_empty() || !tty.is_empty())
}

/// `alice on tty1, bob on pts/0`.
pub fn describe(sessions: &[Session]) -> String {
    sessions
        .iter()
        .map(Session::describe)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The warning given: who was logged in and when the reboot comes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Warning {
    pub until: jiff::Timestamp,
    pub sessions: Vec<Session>,
    /// The time came (or the warning could not be given): the reboot may be asked for.
    #[serde(default)]
    pub over: bool,
}

/// The logind type of the announced, dry-run reboot.
pub const DRY_REBOOT: &str = "dry-reboot";

/// `ScheduleShutdown`'s time: microseconds of CLOCK_REALTIME.
pub fn usec(at: jiff::Timestamp) -> u64 {
    u64::try_from(at.as_microsecond()).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(user: &str, seat: &str, tty: &str) -> Session {
        Session {
            id: "1".into(),
            user: user.into(),
            uid: 1000,
            seat: seat.into(),
            tty: tty.into(),
        }
    }

    #[test]
    fn people_on_a_seat_or_a_tty_count_not_background_sessions() {
        assert!(counts("user", "seat0", ""));
        assert!(counts("user", "", "pts/0"));
        assert!(!counts("user", "", ""), "a session without seat or tty");
        assert!(!counts("manager", "", "tty1"));
        assert!(!counts("greeter", "seat0", ""));
        assert!(!counts("background", "", ""));
    }

    #[test]
    fn descriptions_name_user_and_where() {
        assert_eq!(
            describe(&[
                s("alice", "seat0", "tty1"),
                s("bob", "", "pts/0"),
                s("carol", "seat0", "")
            ]),
            "alice on tty1, bob on pts/0, carol on seat0"
        );
    }

    #[test]
    fn usec_is_realtime_microseconds() {
        let t = jiff::Timestamp::from_second(1_700_000_000).unwrap();
        assert_eq!(usec(t), 1_700_000_000_000_000);
    }
}
