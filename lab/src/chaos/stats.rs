//! What the chaos did in a trial, and in a run: [`Stats`], added up and shown.

use std::collections::BTreeMap;

/// What the chaos did in one trial.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    /// rebootd killed (SIGKILL) at a random moment and restarted.
    pub kills: u32,
    /// rebootd killed right after the state file said this phase.
    pub phase_kills: BTreeMap<String, u32>,
    /// rebootd killed after asking logind to reboot, before the reboot happened.
    pub pending_reboot_kills: u32,
    /// Simulated reboots that were delayed after the request.
    pub delayed_reboots: u32,
    pub etcd_stops: u32,
    pub etcd_pauses: u32,
    /// API stand-in faults injected, by answer (`500`, `429`, `409`, `hang`).
    pub api_faults: BTreeMap<String, u32>,
    /// Of those, the ones aimed at `/eviction`.
    pub eviction_faults: u32,
    /// Reboot calls logind accepted (several may lead to one reboot).
    pub reboot_calls: u32,
    /// Evictions the API stand-in granted.
    pub evictions: u32,
    /// Evictions answered 429 (a PodDisruptionBudget refusing, or an injected fault).
    pub evictions_refused: u32,
    /// What the lab broke itself (`--inject-violation`).
    pub injected: Vec<String>,
    /// Times a node was cut off from the store, and of those, cuts longer than `max_hold`.
    pub cut_offs: u32,
    pub long_cut_offs: u32,
    /// Slots reclaimed (a holder replaced by another in one change), as the outside watcher saw.
    pub reclaims: u32,
    /// Nodes run with their clock off (libfaketime), as `node-3 +3h`.
    pub skewed: Vec<String>,
    /// Times the node cut off found, at a fence (before a cordon or the reboot call), that its
    /// slot was gone, and backed out (its log says so).
    pub fenced: u32,
    /// airlock killed (SIGKILL) and started again (`--backend fleetlock`).
    pub airlock_kills: u32,
    /// Faults of a multi-member etcd, by kind (`leader`, `follower`, `partition`, `partition
    /// (leader)`, `isolate (connected)`, `isolate (first endpoint)`).
    pub member_faults: BTreeMap<String, u32>,
    /// The operator's commands, by what came of them (`pause`, `cancel refused`, ...).
    pub operator: BTreeMap<String, u32>,
    /// With windows: what the nodes' logs say the windows did (`left the queue`: closed while
    /// waiting for a slot; `backed out`: closed before the reboot), and `reboots`.
    pub windows: BTreeMap<String, u32>,
    /// With the flapping gate: the answers set (`set go`, ...) and what the nodes' logs say
    /// (`said wait`: a check that said wait).
    pub gates: BTreeMap<String, u32>,
    /// With locksmithd nodes (`--mixed`) and `rebootctl migrate` (`--migrate`): what the lab
    /// did to them and what came of it (`locksmithd kills`, `migrate`, ...).
    pub mixed: BTreeMap<String, u32>,
}

impl Stats {
    pub(super) fn add(&mut self, o: &Stats) {
        self.kills += o.kills;
        for (k, v) in &o.phase_kills {
            *self.phase_kills.entry(k.clone()).or_default() += v;
        }
        self.pending_reboot_kills += o.pending_reboot_kills;
        self.delayed_reboots += o.delayed_reboots;
        self.etcd_stops += o.etcd_stops;
        self.etcd_pauses += o.etcd_pauses;
        for (k, v) in &o.api_faults {
            *self.api_faults.entry(k.clone()).or_default() += v;
        }
        self.eviction_faults += o.eviction_faults;
        self.reboot_calls += o.reboot_calls;
        self.evictions += o.evictions;
        self.evictions_refused += o.evictions_refused;
        self.injected.extend(o.injected.iter().cloned());
        self.cut_offs += o.cut_offs;
        self.long_cut_offs += o.long_cut_offs;
        self.reclaims += o.reclaims;
        self.skewed.extend(o.skewed.iter().cloned());
        self.fenced += o.fenced;
        self.airlock_kills += o.airlock_kills;
        for (k, v) in &o.member_faults {
            *self.member_faults.entry(k.clone()).or_default() += v;
        }
        for (k, v) in &o.operator {
            *self.operator.entry(k.clone()).or_default() += v;
        }
        for (k, v) in &o.windows {
            *self.windows.entry(k.clone()).or_default() += v;
        }
        for (k, v) in &o.gates {
            *self.gates.entry(k.clone()).or_default() += v;
        }
        for (k, v) in &o.mixed {
            *self.mixed.entry(k.clone()).or_default() += v;
        }
    }
}

impl std::fmt::Display for Stats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let phase: u32 = self.phase_kills.values().sum();
        let api: u32 = self.api_faults.values().sum();
        write!(
            f,
            "kills {} (at a phase {}, reboot pending {}), delayed reboots {}, etcd stops {} pauses {}, api faults {} (eviction {}), evictions {} (429 {}), reboot calls {}",
            self.kills,
            phase,
            self.pending_reboot_kills,
            self.delayed_reboots,
            self.etcd_stops,
            self.etcd_pauses,
            api,
            self.eviction_faults,
            self.evictions,
            self.evictions_refused,
            self.reboot_calls
        )?;
        if self.cut_offs > 0 {
            write!(
                f,
                ", cut-offs {} (longer than max_hold {}), reclaims {}, fenced back-outs {}",
                self.cut_offs, self.long_cut_offs, self.reclaims, self.fenced
            )?;
        }
        if !self.skewed.is_empty() {
            write!(f, ", clocks off: {}", self.skewed.len())?;
        }
        if self.airlock_kills > 0 {
            write!(f, ", airlock kills {}", self.airlock_kills)?;
        }
        if !self.member_faults.is_empty() {
            let faults: Vec<String> = self
                .member_faults
                .iter()
                .map(|(k, v)| format!("{k} {v}"))
                .collect();
            write!(f, ", member faults: {}", faults.join(", "))?;
        }
        if !self.operator.is_empty() {
            let ops: Vec<String> = self
                .operator
                .iter()
                .map(|(k, v)| format!("{k} {v}"))
                .collect();
            write!(f, ", operator: {}", ops.join(", "))?;
        }
        if !self.windows.is_empty() {
            let w: Vec<String> = self
                .windows
                .iter()
                .map(|(k, v)| format!("{k} {v}"))
                .collect();
            write!(f, ", windows: {}", w.join(", "))?;
        }
        if !self.gates.is_empty() {
            let g: Vec<String> = self.gates.iter().map(|(k, v)| format!("{k} {v}")).collect();
            write!(f, ", gate: {}", g.join(", "))?;
        }
        if !self.mixed.is_empty() {
            let m: Vec<String> = self.mixed.iter().map(|(k, v)| format!("{k} {v}")).collect();
            write!(f, ", mixed: {}", m.join(", "))?;
        }
        if !self.injected.is_empty() {
            write!(f, "; injected: {}", self.injected.join(", "))?;
        }
        Ok(())
    }
}
