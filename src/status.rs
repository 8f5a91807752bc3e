//! What `rebootctl status` shows: the local agent's state (from the state file, so it works with
//! the daemon stopped), the maintenance windows, and the semaphore as the backend reports it.

use crate::config::Config;
use crate::lock::SemaphoreStatus;
use crate::state::{Phase, State, StateStore};
use jiff::Timestamp;
use serde::Serialize;
use std::fmt::Write;

/// Everything `rebootctl status` reports. Its JSON form is a stable interface: fields are only
/// ever added.
#[derive(Debug, Clone, Serialize)]
pub struct Status {
    pub phase: Phase,
    pub since: Option<Timestamp>,
    /// Why a reboot is needed: `<trigger>: <what it saw>`.
    pub reason: Option<String>,
    /// Which trigger said so (`update_engine`, `sentinel_file`, `sentinel_command`,
    /// `rebootctl`).
    pub trigger: Option<crate::need::TriggerSource>,
    pub waiting_for: Option<String>,
    pub last_error: Option<String>,
    pub retry_at: Option<Timestamp>,
    /// The current boot id (None when the file cannot be read).
    pub boot_id: Option<String>,
    pub slot_held: bool,
    pub reboot_requested: bool,
    pub failed_attempts: u32,
    pub last_reboot: Option<Timestamp>,
    pub windows: String,
    pub window_open: bool,
    pub next_window: Option<Timestamp>,
    pub state_file: String,
    /// False when there is no state file yet (the daemon never ran here).
    pub state_present: bool,
    pub semaphore: Option<SemaphoreStatus>,
    pub semaphore_error: Option<String>,
    /// The block inhibitors on shutdown holding off the reboot now (`waiting for` names them).
    pub inhibited_by: Vec<crate::inhibitor::Inhibitor>,
    /// The people logged in who were warned of this reboot, and until when they have.
    pub users_warned: Option<crate::users::Warning>,
    /// The gate (`[gates]`) that says wait now: name, why, since, next check.
    pub gate: Option<crate::state::GateWait>,
    /// What the operator must know about the semaphore (e.g. two semaphores: etcd v2 still
    /// holds locksmith's while this node uses v3).
    pub warnings: Vec<String>,
    /// Set by `rebootctl pause` (`since`, `reason`); None when not paused.
    pub paused: Option<crate::state::Pause>,
    /// Operator requests (`pause`, `resume`, `cancel`) the daemon has not applied yet, oldest
    /// first.
    pub requests: Vec<String>,
    /// The group's pause (`rebootctl pause --group`) as the lock store says (`since`, `reason`,
    /// `by`); None when not paused or not readable.
    pub group_paused: Option<crate::lock::GroupPause>,
}

impl Status {
    /// Every text that came from outside (a store, logind, a gate, a command, an error) bounded
    /// and escaped ([`crate::text::clean`]), so that neither `status` nor `--json` can carry a
    /// terminal escape sequence or an unbounded value to the operator.
    pub fn cleaned(mut self) -> Status {
        use crate::text::clean;
        let opt = |o: &mut Option<String>| {
            if let Some(v) = o.as_mut() {
                *v = clean(v);
            }
        };
        opt(&mut self.reason);
        opt(&mut self.waiting_for);
        opt(&mut self.last_error);
        opt(&mut self.boot_id);
        opt(&mut self.semaphore_error);
        if let Some(sem) = self.semaphore.as_mut() {
            sem.group = clean(&sem.group);
            for h in &mut sem.holders {
                h.id = clean(&h.id);
                opt(&mut h.node);
                opt(&mut h.phase);
                opt(&mut h.boot_id);
                opt(&mut h.foreign);
            }
        }
        for i in &mut self.inhibited_by {
            i.clean();
        }
        if let Some(g) = self.gate.as_mut() {
            g.name = clean(&g.name);
            g.why = clean(&g.why);
        }
        for w in &mut self.warnings {
            *w = clean(w);
        }
        if let Some(p) = self.paused.as_mut() {
            opt(&mut p.reason);
        }
        if let Some(p) = self.group_paused.as_mut() {
            opt(&mut p.reason);
            opt(&mut p.by);
        }
        self
    }
}

/// Gather the local part of the status.
pub fn local(
    config: &Config,
    store: &StateStore,
    state: Option<&State>,
    boot_id: Option<String>,
    now: Timestamp,
) -> Status {
    let windows = &config.windows;
    Status {
        phase: state.map_or(Phase::Idle, |s| s.phase),
        since: state.map(|s| s.since),
        reason: state.and_then(|s| s.reason.as_ref().map(|r| r.to_string())),
        trigger: state.and_then(|s| s.reason.as_ref().map(|r| r.source)),
        waiting_for: state.and_then(|s| s.waiting_for.clone()),
        last_error: state.and_then(|s| s.last_error.clone()),
        retry_at: state.and_then(|s| s.retry_at),
        boot_id,
        slot_held: state.is_some_and(|s| s.slot_held),
        reboot_requested: store.request_path().exists(),
        failed_attempts: state.map_or(0, |s| s.failed_attempts),
        last_reboot: state.and_then(|s| s.last_reboot),
        windows: windows.describe(),
        window_open: windows.is_open(now),
        next_window: windows.next_open(now),
        state_file: store.path().display().to_string(),
        state_present: state.is_some(),
        semaphore: None,
        semaphore_error: None,
        inhibited_by: state.map(|s| s.inhibited_by.clone()).unwrap_or_default(),
        users_warned: state.and_then(|s| s.users_warned.clone()),
        gate: state.and_then(|s| s.gate.clone()),
        warnings: Vec::new(),
        paused: state.and_then(|s| s.paused.clone()),
        requests: crate::control::pending(&crate::control::dir(store))
            .unwrap_or_default()
            .into_iter()
            .map(|p| match p.request {
                Ok(e) => e.request.name().to_string(),
                Err(_) => "unreadable".to_string(),
            })
            .collect(),
        group_paused: None,
    }
}

/// "4m", "2h13m", "3d": a short age for people.
pub fn age(from: Timestamp, now: Timestamp) -> String {
    let secs = now.duration_since(from).as_secs().max(0) as u64;
    match secs {
        0..=59 => format!("{secs}s"),
        60..=3599 => format!("{}m", secs / 60),
        3600..=86399 => format!("{}h{}m", secs / 3600, (secs % 3600) / 60),
        _ => format!("{}d{}h", secs / 86400, (secs % 86400) / 3600),
    }
}

/// Terminal colours, used only when stdout is a terminal.
#[derive(Debug, Clone, Copy)]
pub struct Style {
    pub colour: bool,
}

impl Style {
    fn paint(self, code: &str, text: &str) -> String {
        if self.colour {
            format!("\x1b[{code}m{text}\x1b[0m")
        } else {
            text.to_string()
        }
    }
}

/// Colour of a phase: idle green, backing off or failing red, in progress yellow.
fn phase_colour(s: &Status) -> &'static str {
    match s.phase {
        _ if s.last_error.is_some() => "31",
        Phase::Idle => "32",
        _ => "33",
    }
}

/// One holder as a person reads it: "held 4m by worker-2, draining".
pub fn describe_holder(h: &crate::lock::Holder, now: Timestamp) -> String {
    let who = h.node.as_deref().unwrap_or(&h.id);
    let mut line = match h.since {
        Some(t) => format!("held {} by {who}", age(t, now)),
        None => format!("held by {who}"),
    };
    if let Some(p) = &h.phase {
        line.push_str(&format!(", {}", p.replace('_', " ")));
    }
    if h.node.is_some() {
        line.push_str(&format!(" ({})", h.id));
    }
    if let Some(why) = &h.foreign {
        line.push_str(&format!(" [foreign, counted as held: {why}]"));
    }
    line
}

/// The human-readable form: one screen, labels aligned.
pub fn render(s: &Status, now: Timestamp, style: Style) -> String {
    let mut screen = Screen {
        out: String::new(),
        now,
        style,
    };
    screen.phase(s);
    screen.pauses(s);
    screen.requests(s);
    screen.errors(s);
    screen.host(s);
    screen.semaphore(s);
    screen.warnings(s);
    screen.out
}

/// The screen as it is written, block by block.
struct Screen {
    out: String,
    now: Timestamp,
    style: Style,
}

impl Screen {
    /// One line: the label, aligned, then the value.
    fn row(&mut self, label: &str, value: String) {
        let _ = writeln!(self.out, "{:<13} {value}", format!("{label}:"));
    }

    /// The phase, since when, and why a reboot is needed.
    fn phase(&mut self, s: &Status) {
        let since = s
            .since
            .map(|t| format!(" for {}", age(t, self.now)))
            .unwrap_or_default();
        let phase = self.style.paint(phase_colour(s), s.phase.as_str());
        self.row("phase", format!("{phase}{since}"));
        if !s.state_present {
            self.row(
                "",
                format!(
                    "(no state file at {}: the daemon has not run here)",
                    s.state_file
                ),
            );
        }
        if let Some(r) = &s.reason {
            self.row("reason", r.clone());
        }
    }

    /// This node's pause and its group's.
    fn pauses(&mut self, s: &Status) {
        let now = self.now;
        if let Some(p) = &s.paused {
            let why = p
                .reason
                .as_deref()
                .map_or(String::new(), |r| format!(": {r}"));
            let text = self.style.paint(
                "33",
                &format!(
                    "for {} (since {}){why}; no slot is taken until `rebootctl resume`",
                    age(p.since, now),
                    p.since
                ),
            );
            self.row("paused", text);
        }
        if let Some(p) = &s.group_paused {
            let text = self.style.paint(
                "33",
                &format!(
                    "for {} ({}); no node of the group takes a slot until `rebootctl resume --group`",
                    age(p.since, now),
                    p.describe()
                ),
            );
            self.row("group paused", text);
        }
    }

    /// Operator requests not yet applied, and what the agent waits for (a gate among them).
    fn requests(&mut self, s: &Status) {
        let now = self.now;
        if s.reboot_requested {
            self.row("request", "`rebootctl reboot` pending".into());
        }
        for r in &s.requests {
            self.row(
                "request",
                format!("`rebootctl {r}` not yet applied by rebootd"),
            );
        }
        if let Some(w) = &s.waiting_for {
            self.row("waiting for", w.clone());
        }
        if let Some(g) = &s.gate {
            self.row(
                "gate",
                format!(
                    "{:?} says wait for {}: {} (asked again {})",
                    g.name,
                    age(g.since, now),
                    g.why,
                    if g.next_check > now {
                        format!("in {}", age(now, g.next_check))
                    } else {
                        "now".into()
                    }
                ),
            );
        }
    }

    /// The last error and when the agent tries again.
    fn errors(&mut self, s: &Status) {
        if let Some(e) = &s.last_error {
            let text = self.style.paint("31", e);
            self.row("last error", text);
        }
        if let Some(t) = s.retry_at {
            self.row("retry in", format!("{} (at {t})", age(self.now, t)));
        }
    }

    /// The windows, the boot, the last reboot and whether this node holds a slot.
    fn host(&mut self, s: &Status) {
        let now = self.now;
        let window = if s.window_open {
            "open now".to_string()
        } else {
            s.next_window.map_or("never opens".into(), |t| {
                format!("next opens in {} ({t})", age(now, t))
            })
        };
        self.row("windows", format!("{} ({window})", s.windows));
        self.row(
            "boot id",
            s.boot_id.clone().unwrap_or_else(|| "(unreadable)".into()),
        );
        if let Some(t) = s.last_reboot {
            self.row("last reboot", format!("{} ago ({t})", age(t, now)));
        }
        self.row("slot held", if s.slot_held { "yes" } else { "no" }.into());
    }

    /// The semaphore as the backend reports it, its holders, or why it could not be read.
    fn semaphore(&mut self, s: &Status) {
        if let Some(sem) = s
            .semaphore
            .as_ref()
            .filter(|sem| sem.backend == crate::lock::Backend::FleetLock)
        {
            self.row(
                "semaphore",
                format!(
                    "fleetlock group {:?}: slots and holders are kept by the server",
                    sem.group
                ),
            );
        } else if let Some(sem) = &s.semaphore {
            let share = sem
                .share
                .map(|s| format!(" (max {} is {})", sem.max, s.describe(sem.backend)))
                .unwrap_or_default();
            self.row(
                "semaphore",
                format!(
                    "{} group {:?}: {} of {} slots free{share}",
                    sem.backend, sem.group, sem.free, sem.max
                ),
            );
            for h in &sem.holders {
                self.row("  holder", describe_holder(h, self.now));
            }
        }
        if let Some(e) = &s.semaphore_error {
            let text = self.style.paint("31", &format!("unavailable: {e}"));
            self.row("semaphore", text);
        }
    }

    fn warnings(&mut self, s: &Status) {
        for w in &s.warnings {
            let text = self.style.paint("31", w);
            self.row("WARNING", text);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_read_well() {
        let t0 = Timestamp::from_second(0).unwrap();
        let at = |s| Timestamp::from_second(s).unwrap();
        assert_eq!(age(t0, at(42)), "42s");
        assert_eq!(age(t0, at(4 * 60 + 5)), "4m");
        assert_eq!(age(t0, at(2 * 3600 + 13 * 60)), "2h13m");
        assert_eq!(age(t0, at(3 * 86400 + 3600)), "3d1h");
        assert_eq!(age(at(10), t0), "0s");
    }

    #[test]
    fn holders_read_at_a_glance_and_colour_only_when_asked() {
        let now = Timestamp::from_second(1000).unwrap();
        let h = crate::lock::Holder {
            id: "abc".into(),
            node: Some("worker-2".into()),
            phase: Some("draining".into()),
            since: Some(Timestamp::from_second(1000 - 4 * 60).unwrap()),
            boot_id: None,
            foreign: None,
        };
        assert_eq!(
            describe_holder(&h, now),
            "held 4m by worker-2, draining (abc)"
        );
        let config = crate::config::Config::embedded_default();
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::new(dir.path());
        let mut st = local(&config, &store, None, Some("b1".into()), now);
        st.last_error = Some("boom".into());
        let plain = render(&st, now, Style { colour: false });
        assert!(!plain.contains('\x1b'), "{plain}");
        assert!(plain.contains("phase:        idle"), "{plain}");
        assert!(plain.contains("last error:   boom"), "{plain}");
        let coloured = render(&st, now, Style { colour: true });
        assert!(coloured.contains("\x1b[31m"), "{coloured}");
    }

    #[test]
    fn a_share_of_the_nodes_says_what_max_is() {
        let now = Timestamp::from_second(1000).unwrap();
        let config = crate::config::Config::embedded_default();
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::new(dir.path());
        let mut st = local(&config, &store, None, Some("b1".into()), now);
        st.semaphore = Some(crate::lock::SemaphoreStatus {
            backend: crate::lock::Backend::Etcd,
            group: "default".into(),
            max: 3,
            free: 1,
            holders: Vec::new(),
            share: Some(crate::lock::arbiter::share::Share {
                percent: 10,
                known: 30,
                stored_max: 1,
            }),
        });
        let text = render(&st, now, Style { colour: false });
        assert!(
            text.contains(
                "1 of 3 slots free (max 3 is 10% of 30 known nodes; the document says 1)"
            ),
            "{text}"
        );
    }
}
