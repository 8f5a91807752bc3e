//! logind's inhibitors as rebootd sees them: which ones hold off a reboot.
//!
//! logind itself lets a caller through the block inhibitors of its own uid (systemd's
//! `verify_shutdown_creds` asks `manager_is_inhibited` to ignore the caller's uid), so root's
//! `RebootWithFlags(SD_LOGIND_ROOT_CHECK_INHIBITORS)` only counts other users' inhibitors and a
//! backup job running as root would not hold off rebootd. With `[reboot] inhibitors = "respect"`
//! rebootd therefore lists the inhibitors itself (`ListInhibitors`) and waits while any
//! [block inhibitor on shutdown](Inhibitor::blocks_shutdown) is held, whatever its uid.

use crate::reboot::RebootError;
use serde::{Deserialize, Serialize};

/// The block inhibitors that hold off a reboot, and the wait for them to change.
#[async_trait::async_trait]
pub trait Inhibitors: Send + Sync {
    /// The block inhibitors on shutdown held now, whoever holds them (none when inhibitors are
    /// ignored).
    async fn blockers(&self) -> Result<Vec<Inhibitor>, RebootError>;

    /// Wait until the blocking inhibitors are no longer `known`; the new list (empty: none
    /// blocks any more).
    async fn blockers_changed(&self, known: &[Inhibitor]) -> Result<Vec<Inhibitor>, RebootError>;
}

/// One inhibitor as logind's `ListInhibitors` reports it: `(what, who, why, mode, uid, pid)`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Inhibitor {
    /// What it inhibits, colon-separated (`shutdown:sleep`).
    pub what: String,
    /// Who took it (a program's name for people).
    pub who: String,
    /// Why, in words.
    pub why: String,
    /// `block` or `delay`.
    pub mode: String,
    pub uid: u32,
    pub pid: u32,
}

impl Inhibitor {
    /// Its texts (from logind, written by whoever took it) bounded and escaped.
    pub fn clean(&mut self) {
        for t in [&mut self.what, &mut self.who, &mut self.why, &mut self.mode] {
            *t = crate::text::clean(t);
        }
    }
}

/// `ListInhibitors`' element type.
pub type Listed = (String, String, String, String, u32, u32);

impl Inhibitor {
    pub fn from_listed((what, who, why, mode, uid, pid): Listed) -> Inhibitor {
        Inhibitor {
            what,
            who,
            why,
            mode,
            uid,
            pid,
        }
    }

    /// Whether it blocks a reboot: mode `block` and `shutdown` among what it inhibits. Delay
    /// inhibitors only delay a shutdown logind has started (logind handles those itself).
    pub fn blocks_shutdown(&self) -> bool {
        self.mode == "block" && self.what.split(':').any(|w| w == "shutdown")
    }
}

impl std::fmt::Display for Inhibitor {
    /// `backup (nightly dump; uid 0, pid 42)`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let who = if self.who.is_empty() {
            "(unnamed)"
        } else {
            &self.who
        };
        if self.why.is_empty() {
            write!(f, "{who} (uid {}, pid {})", self.uid, self.pid)
        } else {
            write!(
                f,
                "{who} ({}; uid {}, pid {})",
                self.why, self.uid, self.pid
            )
        }
    }
}

/// The inhibitors among `listed` that block a reboot, in a stable order (logind lists them in
/// hash order), so two lists of the same inhibitors compare equal.
pub fn blocking(listed: impl IntoIterator<Item = Listed>) -> Vec<Inhibitor> {
    let mut held: Vec<Inhibitor> = listed
        .into_iter()
        .map(Inhibitor::from_listed)
        .filter(Inhibitor::blocks_shutdown)
        .collect();
    held.sort();
    held.dedup();
    held
}

/// `a (why; uid 0, pid 1), b (...)`.
pub fn describe(list: &[Inhibitor]) -> String {
    list.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn l(what: &str, who: &str, mode: &str, uid: u32, pid: u32) -> Listed {
        (what.into(), who.into(), "why".into(), mode.into(), uid, pid)
    }

    #[test]
    fn only_block_inhibitors_on_shutdown_block_whatever_their_uid() {
        let got = blocking([
            l("sleep", "a", "block", 0, 1),
            l("shutdown", "b", "delay", 0, 2),
            l("sleep:shutdown", "c", "block", 1000, 3),
            l("shutdown", "d", "block", 0, 4),
            l("handle-power-key", "e", "block", 0, 5),
            l("shutdownx", "f", "block", 0, 6),
        ]);
        let who: Vec<&str> = got.iter().map(|i| i.who.as_str()).collect();
        assert_eq!(who, ["d", "c"]);
    }

    #[test]
    fn the_same_inhibitors_listed_in_another_order_compare_equal() {
        let a = blocking([
            l("shutdown", "x", "block", 0, 1),
            l("shutdown", "y", "block", 0, 2),
        ]);
        let b = blocking([
            l("shutdown", "y", "block", 0, 2),
            l("shutdown", "x", "block", 0, 1),
        ]);
        assert_eq!(a, b);
    }

    #[test]
    fn descriptions_name_who_why_uid_and_pid() {
        let list = blocking([
            l("shutdown", "backup", "block", 0, 42),
            (
                "shutdown".into(),
                "".into(),
                "".into(),
                "block".into(),
                7,
                8,
            ),
        ]);
        assert_eq!(
            describe(&list),
            "(unnamed) (uid 7, pid 8), backup (why; uid 0, pid 42)"
        );
    }
}
