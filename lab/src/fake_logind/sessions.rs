//! The fake logind's sessions and scheduled shutdowns: `ListSessions` with a
//! `org.freedesktop.login1.Session` object per session (`Id`, `Name`, `TTY`, `Class`, `Seat`),
//! and `ScheduleShutdown` / `CancelScheduledShutdown`, recorded and never carried out.

use std::sync::Mutex;

use tokio::sync::watch;
use zbus::zvariant::OwnedObjectPath;

/// A session as a test sets it up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeSession {
    pub id: String,
    pub uid: u32,
    pub user: String,
    /// Empty: none.
    pub seat: String,
    /// Empty: none.
    pub tty: String,
    /// `user`, `greeter`, `manager`, `background`, ...
    pub class: String,
}

impl FakeSession {
    /// A `user` session of `user` (uid 1000) on `tty`, no seat.
    pub fn on_tty(id: &str, user: &str, tty: &str) -> FakeSession {
        FakeSession {
            id: id.into(),
            uid: 1000,
            user: user.into(),
            seat: String::new(),
            tty: tty.into(),
            class: "user".into(),
        }
    }

    pub(super) fn path(&self) -> String {
        format!("/org/freedesktop/login1/session/{}", self.id)
    }
}

/// What `ScheduleShutdown` and `CancelScheduledShutdown` were asked, in order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Schedule {
    /// The shutdown scheduled now: (type, CLOCK_REALTIME usec).
    pub current: Option<(String, u64)>,
    /// Every `ScheduleShutdown`, oldest first.
    pub asked: Vec<(String, u64)>,
    /// How many `CancelScheduledShutdown` found one to cancel.
    pub cancelled: usize,
}

/// The types `ScheduleShutdown` accepts (systemd 252).
const KNOWN_TYPES: &[&str] = &[
    "poweroff",
    "reboot",
    "halt",
    "kexec",
    "dry-poweroff",
    "dry-reboot",
    "dry-halt",
];

#[derive(Debug)]
pub(super) struct Sessions {
    pub(super) list: Mutex<Vec<FakeSession>>,
    pub(super) schedule: watch::Sender<Schedule>,
}

impl Sessions {
    pub(super) fn new() -> Sessions {
        Sessions {
            list: Mutex::new(Vec::new()),
            schedule: watch::Sender::new(Schedule::default()),
        }
    }

    pub(super) fn listed(&self) -> Vec<(String, u32, String, String, OwnedObjectPath)> {
        self.list
            .lock()
            .expect("sessions lock")
            .iter()
            .filter_map(|s| {
                let path = OwnedObjectPath::try_from(s.path()).ok()?;
                Some((s.id.clone(), s.uid, s.user.clone(), s.seat.clone(), path))
            })
            .collect()
    }

    /// `Err`: the message for `InvalidArgs`.
    pub(super) fn schedule(&self, kind: &str, usec: u64) -> Result<(), String> {
        if !KNOWN_TYPES.contains(&kind) {
            return Err(format!("Unsupported shutdown type: {kind}"));
        }
        tracing::info!(kind, usec, "fake logind: shutdown scheduled");
        self.schedule.send_modify(|s| {
            s.current = Some((kind.to_owned(), usec));
            s.asked.push((kind.to_owned(), usec));
        });
        Ok(())
    }

    pub(super) fn cancel(&self) -> bool {
        let mut had = false;
        self.schedule.send_modify(|s| {
            had = s.current.take().is_some();
            if had {
                s.cancelled += 1;
            }
        });
        tracing::info!(cancelled = had, "fake logind: scheduled shutdown cancelled");
        had
    }
}

/// `org.freedesktop.login1.Session` of one session.
pub(super) struct SessionObject {
    pub(super) session: FakeSession,
}

#[zbus::interface(name = "org.freedesktop.login1.Session")]
impl SessionObject {
    #[zbus(property)]
    fn id(&self) -> String {
        self.session.id.clone()
    }

    #[zbus(property)]
    fn name(&self) -> String {
        self.session.user.clone()
    }

    #[zbus(property, name = "TTY")]
    fn tty(&self) -> String {
        self.session.tty.clone()
    }

    #[zbus(property)]
    fn class(&self) -> String {
        self.session.class.clone()
    }

    #[zbus(property)]
    fn seat(&self) -> (String, OwnedObjectPath) {
        let path = if self.session.seat.is_empty() {
            "/".to_owned()
        } else {
            format!("/org/freedesktop/login1/seat/{}", self.session.seat)
        };
        (
            self.session.seat.clone(),
            OwnedObjectPath::try_from(path).unwrap_or_default(),
        )
    }
}
