//! `rebootd-lab chaos ...`: parse the options, run the trials with a line per trial, print the
//! summary. SIGINT or SIGTERM stops the run: the trial in progress is torn down (its rebootd,
//! dbus-daemon and etcd processes ended and reaped), the summary of the trials so far is
//! printed, and the exit status is 128 + the signal (130 for SIGINT). A second signal exits at
//! once, without the tear-down.

use super::{
    replay_command, run, Backend, ChaosOptions, MemberFault, Stop, TrialReport, Violation,
};
use crate::etcd::EtcdVersion;
use clap::Parser;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use tokio::signal::unix::{signal, SignalKind};

#[derive(Debug, Parser)]
#[command(
    name = "rebootd-lab chaos",
    about = "Chaos trials: a small fleet rolls out an update while rebootd, etcd and the API are disrupted; invariants are checked after each trial"
)]
struct Cli {
    #[arg(long, default_value_t = 10)]
    trials: usize,
    /// Trial k runs with seed S+k; a failing trial prints its own seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    #[arg(long, default_value_t = 5)]
    nodes: usize,
    #[arg(long, default_value_t = 2)]
    max: u64,
    /// etcd (locksmith document in etcd v3), etcd-v2 (the same document in etcd's v2 keys
    /// API) or kubernetes (Leases); Nodes are drained either way.
    #[arg(long, default_value = "etcd")]
    backend: Backend,
    /// etcd version: 3.4 or 3.5.
    #[arg(long, default_value = "3.4")]
    etcd: String,
    /// How long a simulated reboot keeps a node down (rebootd's reboot.boot_time).
    #[arg(long, default_value = "300ms", value_parser = rebootd::config::parse_duration)]
    reboot_time: Duration,
    /// rebootd's reboot.timeout in the trial (rebootd's own default is 10m).
    #[arg(long, default_value = "15s", value_parser = rebootd::config::parse_duration)]
    reboot_timeout: Duration,
    /// Disruptive actions per trial at most.
    #[arg(long, default_value_t = 10)]
    actions: usize,
    #[arg(long, default_value = "150s", value_parser = rebootd::config::parse_duration)]
    trial_timeout: Duration,
    /// Where to copy the logs of failing trials (default: the temporary directory).
    #[arg(long)]
    keep_logs: Option<PathBuf>,
    /// Start no new trial after this long (e.g. 25m): a time-boxed long run.
    #[arg(long, value_parser = rebootd::config::parse_duration)]
    duration: Option<Duration>,
    /// The rebootd binary (default: $REBOOTD_BIN, else beside this program).
    #[arg(long)]
    rebootd: Option<PathBuf>,
    /// rebootd's lock.max_hold (off by default); it must be at least drain + reboot timeouts +
    /// reboot time + ready timeout, as rebootd requires.
    #[arg(long, value_parser = rebootd::config::parse_duration)]
    max_hold: Option<Duration>,
    /// rebootd's kubernetes.drain_timeout in the trial.
    #[arg(long, default_value = "60s", value_parser = rebootd::config::parse_duration)]
    drain_timeout: Duration,
    /// rebootd's kubernetes.ready_timeout in the trial.
    #[arg(long, default_value = "60s", value_parser = rebootd::config::parse_duration)]
    ready_timeout: Duration,
    /// One node per trial reaches the store through a proxy the chaos cuts off for a while
    /// (longer than --max-hold in most cuts, when set).
    #[arg(long)]
    cut_off: bool,
    /// One node per trial runs with its clock hours off (libfaketime: apt-get install faketime).
    #[arg(long)]
    skew_clock: bool,
    /// etcd members (odd): with 3, a cluster on loopback whose members the chaos disrupts one
    /// at a time (--faults) instead of stopping and freezing a single etcd; each node lists
    /// every member, in its own order.
    #[arg(long, default_value_t = 1)]
    etcd_members: usize,
    /// The faults of a multi-member etcd: any of leader (killed), follower (stopped),
    /// partition (a member cut off from the others), isolate (the member a node talks to cut
    /// off from the others).
    #[arg(long, default_value = "leader,follower,partition,isolate")]
    faults: String,
    /// An operator runs rebootctl beside the chaos: pause/resume a node, pause/resume the
    /// group, cancel a node's cycle, unlock a holder's slot, set-max 1-3 (etcd stores only).
    #[arg(long)]
    operators: bool,
    /// Every node gets maintenance windows of 2-6 s with gaps of 1-6 s, opening and closing
    /// throughout the rollout (on its own clock with --skew-clock).
    #[arg(long)]
    windows: bool,
    /// Every node has a command gate before the reboot (1 s time-out) whose answer the lab
    /// flips every 0.2-1.5 s: go, wait, or hang past the time-out.
    #[arg(long)]
    gates: bool,
    /// The nodes spread over K zones (node i in z<i mod K>: etcd's lock.zone, the Node's
    /// topology.kubernetes.io/zone on Leases), rebootd with lock.max_per_zone; checked: never
    /// more than --max-per-zone holders or nodes down in a zone.
    #[arg(long, default_value_t = 0)]
    zones: usize,
    /// rebootd's lock.max_per_zone with --zones.
    #[arg(long, default_value_t = 1)]
    max_per_zone: u64,
    /// N of the --nodes run the real locksmithd (../shared/peers) instead of rebootd, on the
    /// same v2 semaphore (--backend etcd-v2); the chaos kills them too.
    #[arg(long, default_value_t = 0)]
    mixed: usize,
    /// Mid-rollout, once the locksmithd nodes are done, the operator runs `rebootctl migrate`
    /// (--backend etcd-v2); the checker watches the v2 and the v3 document.
    #[arg(long)]
    migrate: bool,
    /// Checker self-test: the lab itself adds a holder (`holder`) or cordons a node
    /// (`cordon`) beyond max mid-trial; every trial must then fail.
    #[arg(long, hide = true)]
    inject_violation: Option<Violation>,
}

/// Run `rebootd-lab chaos ARGS`; returns the exit status: 0 all trials passed, 1 a trial
/// failed or the arguments are wrong, 128 + the signal when stopped by SIGINT or SIGTERM.
pub async fn command(args: Vec<String>) -> u8 {
    let cli = match Cli::try_parse_from(std::iter::once("chaos".to_string()).chain(args)) {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() { 2 } else { 0 };
        }
    };
    let opts = match options(cli) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("rebootd-lab: {e}");
            return 1;
        }
    };
    let stop = Stop::new();
    let signal_seen = match on_signals(stop.clone()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("rebootd-lab: signal handlers: {e}");
            return 1;
        }
    };
    println!(
        "chaos: {} trials from seed {}, {} nodes, max {}, backend {}, reboot time {:?}, reboot.timeout {:?}, up to {} actions each{}{}",
        opts.trials,
        opts.seed,
        opts.nodes,
        opts.max,
        opts.backend,
        opts.reboot_time,
        opts.reboot_timeout,
        opts.actions,
        extras(&opts),
        opts.inject
            .map(|v| format!("; injecting a {v} violation in every trial"))
            .unwrap_or_default()
    );
    let started = Instant::now();
    let mut done = 0usize;
    let report = run(&opts, &stop, |t| {
        done += 1;
        print_trial(&opts, done, t);
    })
    .await;
    let failures = report.failures();
    let stats = report.stats();
    println!(
        "chaos: kills after phase write: {:?}; API faults: {:?}",
        stats.phase_kills, stats.api_faults
    );
    if report.stopped {
        let signal = signal_seen.lock().map(|s| *s).unwrap_or(None);
        let name = signal.map_or("a signal", |(name, _)| name);
        match report.interrupted {
            Some(seed) => println!(
                "chaos: stopped by {name} during the trial with seed {seed}: its processes were ended, it was not checked"
            ),
            None => println!("chaos: stopped by {name} between trials"),
        }
    }
    println!(
        "chaos: {} trials in {:.0}s, {} failed; total: {}",
        report.trials.len(),
        started.elapsed().as_secs_f64(),
        failures.len(),
        stats
    );
    if !failures.is_empty() {
        eprintln!(
            "rebootd-lab: {} of {} trials failed; seeds: {}",
            failures.len(),
            report.trials.len(),
            failures
                .iter()
                .map(|t| t.seed.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    if report.stopped {
        let signal = signal_seen.lock().map(|s| *s).unwrap_or(None);
        return 128 + signal.map_or(2, |(_, n)| n);
    }
    if failures.is_empty() {
        0
    } else {
        1
    }
}

/// The signal that stopped the run (name, number), once one came.
type SignalSeen = std::sync::Arc<std::sync::Mutex<Option<(&'static str, u8)>>>;

/// On the first SIGINT or SIGTERM, set `stop`; on a second one, exit at once.
fn on_signals(stop: Stop) -> std::io::Result<SignalSeen> {
    let mut int = signal(SignalKind::interrupt())?;
    let mut term = signal(SignalKind::terminate())?;
    let seen: SignalSeen = Default::default();
    let record = seen.clone();
    tokio::spawn(async move {
        let mut first = None;
        loop {
            let got = tokio::select! {
                _ = int.recv() => ("SIGINT", 2u8),
                _ = term.recv() => ("SIGTERM", 15u8),
            };
            match first {
                None => {
                    first = Some(got);
                    if let Ok(mut s) = record.lock() {
                        *s = Some(got);
                    }
                    eprintln!(
                        "chaos: {}: stopping after tearing down the current trial (again to exit at once)",
                        got.0
                    );
                    stop.set();
                }
                Some(_) => {
                    eprintln!(
                        "chaos: {} again: exiting without tearing down the trial",
                        got.0
                    );
                    std::process::exit(128 + i32::from(got.1));
                }
            }
        }
    });
    Ok(seen)
}

fn options(cli: Cli) -> Result<ChaosOptions, String> {
    let etcd = match cli.etcd.as_str() {
        "3.4" => EtcdVersion::V34,
        "3.5" => EtcdVersion::V35,
        other => return Err(format!("--etcd {other}: expected 3.4 or 3.5")),
    };
    let rebootd = cli
        .rebootd
        .or_else(|| std::env::var_os("REBOOTD_BIN").map(PathBuf::from))
        .or_else(|| {
            std::env::current_exe()
                .ok()
                .and_then(|p| p.parent().map(|d| d.join("rebootd")))
        })
        .unwrap_or_else(|| PathBuf::from("rebootd"));
    if !rebootd.exists() {
        return Err(format!(
            "no rebootd binary at {} (build with `cargo build --workspace`, or pass --rebootd)",
            rebootd.display()
        ));
    }
    Ok(ChaosOptions {
        trials: cli.trials,
        seed: cli.seed,
        nodes: cli.nodes,
        max: cli.max,
        backend: cli.backend,
        etcd,
        reboot_time: cli.reboot_time,
        reboot_timeout: cli.reboot_timeout,
        actions: cli.actions,
        trial_timeout: cli.trial_timeout,
        keep_logs: Some(cli.keep_logs.unwrap_or_else(std::env::temp_dir)),
        duration: cli.duration,
        inject: cli.inject_violation,
        max_hold: cli.max_hold,
        drain_timeout: cli.drain_timeout,
        ready_timeout: cli.ready_timeout,
        cut_off: cli.cut_off,
        skew_clock: cli.skew_clock,
        etcd_members: cli.etcd_members,
        member_faults: MemberFault::parse_list(&cli.faults)?,
        operators: cli.operators,
        windows: cli.windows,
        gates: cli.gates,
        mixed: cli.mixed,
        migrate: cli.migrate,
        zones: cli.zones,
        max_per_zone: cli.max_per_zone,
        ..ChaosOptions::new(rebootd)
    })
    .and_then(|o: ChaosOptions| o.check().map(|()| o))
}

/// The faults beyond the default ones, for the run's first line.
fn extras(opts: &ChaosOptions) -> String {
    let mut out = String::new();
    if let Some(m) = opts.max_hold {
        out.push_str(&format!(
            ", max_hold {m:?} (drain {:?}, ready {:?})",
            opts.drain_timeout, opts.ready_timeout
        ));
    }
    if opts.cut_off {
        out.push_str(", a node cut off from the store");
    }
    if opts.skew_clock {
        out.push_str(", a node's clock hours off");
    }
    if opts.operators {
        out.push_str(", an operator running rebootctl");
    }
    if opts.windows {
        out.push_str(", maintenance windows of a few seconds");
    }
    if opts.gates {
        out.push_str(", a flapping gate before the reboot");
    }
    if opts.mixed > 0 {
        out.push_str(&format!(", {} of the nodes running locksmithd", opts.mixed));
    }
    if opts.migrate {
        out.push_str(", rebootctl migrate mid-rollout");
    }
    if opts.etcd_members > 1 {
        let faults: Vec<String> = opts.member_faults.iter().map(|f| f.to_string()).collect();
        out.push_str(&format!(
            ", {} etcd members (faults: {})",
            opts.etcd_members,
            faults.join(", ")
        ));
    }
    out
}

fn print_trial(opts: &ChaosOptions, k: usize, t: &TrialReport) {
    if t.ok() {
        println!(
            "trial {k}/{} seed {}: ok in {:.1}s (max holders {}, max cordoned {}; {})",
            opts.trials,
            t.seed,
            t.duration.as_secs_f64(),
            t.max_holders_seen,
            t.max_cordoned_seen,
            t.stats
        );
        return;
    }
    println!(
        "trial {k}/{} seed {}: FAILED in {:.1}s ({})",
        opts.trials,
        t.seed,
        t.duration.as_secs_f64(),
        t.stats
    );
    for v in &t.violations {
        println!("  - {v}");
    }
    if let Some(l) = &t.logs {
        println!("  logs: {}", l.display());
    }
    println!("  replay: {}", replay_command(opts, t.seed));
}
