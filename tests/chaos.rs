//! Chaos trials, CI-sized: a 5-node fleet (max 2) whose nodes carry ReplicaSet pods (one
//! ReplicaSet under a PodDisruptionBudget) rolls out an update while rebootd is killed at random
//! moments and right after chosen phases, reboots are delayed (and rebootd killed while one is
//! pending), etcd is stopped and frozen, and the API stand-in answers 500/429/409 or hangs,
//! evictions included; after each trial the invariants are checked (see `rebootd_lab::chaos`
//! and RELIABILITY.md). The three stores: etcd v3, etcd's v2 keys API, Leases. Then, on every
//! store, `lock.max_hold` set and one node whose clock is hours off (the node cut off from the
//! store runs in the long runs, see RELIABILITY.md).
//! `REBOOTD_CHAOS_TRIALS` (trials per store, default [`TRIALS`]) and `REBOOTD_CHAOS_SEED` (etcd
//! trials from it, Leases trials from it + 10000, v2 from it + 20000) change the run; a failing
//! trial prints the command that replays it.
//!
//! The checker is tested too: with `--inject-violation` the lab itself breaks an invariant
//! mid-trial and the trial must fail, and SIGINT must stop a run cleanly. Those run
//! `rebootd-lab chaos` as a process of its own: this test binary runs itself again with only
//! [`chaos_command_child`] (the `rebootd-lab` binary belongs to another package, so cargo does
//! not build it for these tests).

use rebootd_lab::chaos::{self, Backend, ChaosOptions, Stop};
use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Trials per store in the suite: two tests run at a time, and this keeps `cargo test --test
/// chaos` within about 4-5 minutes on the shared 2-core machine (trials take 10-15 s there,
/// with outliers to 40 s; see RELIABILITY.md).
const TRIALS: u64 = 7;

/// The hard faults' trials: one per store (4 nodes, max 1).
const HARD_SEEDS_FROM: u64 = 70_000;

/// Where the search for the cut-off trials' seeds starts (one per store).
const CUT_OFF_SEEDS_FROM: u64 = 80_000;

/// The hard faults' `max_hold`.
const HARD_MAX_HOLD: Duration = Duration::from_secs(16);

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

async fn run(backend: Backend, trials: u64, seed: u64) -> chaos::Stats {
    let opts = ChaosOptions {
        trials: trials as usize,
        seed,
        backend,
        ..ChaosOptions::new(env!("CARGO_BIN_EXE_rebootd"))
    };
    run_with(opts).await
}

async fn run_with(opts: ChaosOptions) -> chaos::Stats {
    let (backend, trials) = (opts.backend, opts.trials as u64);
    let started = Instant::now();
    let report = chaos::run(&opts, &Stop::new(), |t| {
        eprintln!(
            "chaos {backend} seed {}: {} in {:.1}s ({})",
            t.seed,
            if t.ok() { "ok" } else { "FAILED" },
            t.duration.as_secs_f64(),
            t.stats
        );
    })
    .await;
    let failures: Vec<String> = report
        .failures()
        .iter()
        .map(|t| {
            format!(
                "seed {}: {}\n  logs: {:?}\n  replay: {}",
                t.seed,
                t.violations.join("\n  "),
                t.logs,
                chaos::replay_command(&opts, t.seed)
            )
        })
        .collect();
    assert!(
        failures.is_empty(),
        "{} of {} chaos trials failed:\n{}",
        failures.len(),
        report.trials.len(),
        failures.join("\n")
    );
    assert_eq!(report.trials.len() as u64, trials);
    // The chaos did happen, and the drains evicted pods.
    let stats = report.stats();
    eprintln!(
        "chaos {backend}: {trials} trials in {:.0}s; {stats}",
        started.elapsed().as_secs_f64()
    );
    assert!(
        stats.kills + stats.pending_reboot_kills + stats.phase_kills.values().sum::<u32>() > 0,
        "no rebootd was killed: {stats}"
    );
    let pods = 3 * opts.nodes as u64;
    assert!(
        stats.evictions as u64 >= pods * trials,
        "every trial evicts at least its {pods} pods: {stats}"
    );
    stats
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_trials_etcd() {
    let trials = env_u64("REBOOTD_CHAOS_TRIALS", TRIALS);
    run(Backend::Etcd, trials, env_u64("REBOOTD_CHAOS_SEED", 1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_trials_kubernetes_leases() {
    let trials = env_u64("REBOOTD_CHAOS_TRIALS", TRIALS);
    run(
        Backend::Kubernetes,
        trials,
        env_u64("REBOOTD_CHAOS_SEED", 1) + 10_000,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_trials_etcd_v2() {
    let trials = env_u64("REBOOTD_CHAOS_TRIALS", TRIALS);
    run(
        Backend::EtcdV2,
        trials,
        env_u64("REBOOTD_CHAOS_SEED", 1) + 20_000,
    )
    .await;
}

/// One trial of the hard faults: 4 nodes, max 1, `max_hold` 16 s (drain 7 s + reboot 4 s +
/// boot 0.3 s + ready 4 s = 15.3 s, as rebootd requires) and one node's clock hours off (libfaketime); with
/// `cut_off`, one node's store traffic is cut by a lab proxy (blackhole or reset) too.
async fn hard_trial(backend: Backend, seed: u64, cut_off: bool) -> chaos::Stats {
    let opts = ChaosOptions {
        trials: 1,
        seed,
        backend,
        nodes: 4,
        max: 1,
        max_hold: Some(HARD_MAX_HOLD),
        drain_timeout: Duration::from_secs(7),
        reboot_timeout: Duration::from_secs(4),
        ready_timeout: Duration::from_secs(4),
        cut_off,
        skew_clock: true,
        ..ChaosOptions::new(env!("CARGO_BIN_EXE_rebootd"))
    };
    opts.check().unwrap();
    let stats = run_with(opts).await;
    assert_eq!(stats.skewed.len(), 1, "{backend}: {stats}");
    stats
}

/// `max_hold` and a clock off, nothing stopped, on each store: every holder beats, so no slot
/// may be reclaimed (a reclaim here would be of a live node judged by a clock).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_trials_max_hold_and_a_clock_hours_off_on_every_store() {
    let seed = env_u64("REBOOTD_CHAOS_SEED", 1) + HARD_SEEDS_FROM;
    for (k, backend) in [Backend::Etcd, Backend::EtcdV2, Backend::Kubernetes]
        .into_iter()
        .enumerate()
    {
        let stats = hard_trial(backend, seed + k as u64, false).await;
        assert_eq!(stats.reclaims, 0, "no node stopped, no reclaim: {stats}");
    }
}

/// The same with a node cut off from the store, on seeds whose first cut comes while that node
/// holds its slot and outlasts `max_hold`, so that the waiters may take its slot over: the
/// checker then requires that every takeover was of the node cut off (for at least
/// `max_hold`/2), that the node cut off never went down without its slot (it must back out at
/// its fence), and that no more than `max` live nodes were cordoned at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_trials_max_hold_a_node_cut_off_and_a_clock_hours_off_on_every_store() {
    let mut seed = env_u64("REBOOTD_CHAOS_SEED", 1) + CUT_OFF_SEEDS_FROM;
    let mut all = chaos::Stats::default();
    for backend in [Backend::Etcd, Backend::EtcdV2, Backend::Kubernetes] {
        while !chaos::cutoff::plan(seed, Some(HARD_MAX_HOLD))
            .first()
            .is_some_and(|c| c.while_holding && c.long)
        {
            seed += 1;
        }
        let stats = hard_trial(backend, seed, true).await;
        assert!(stats.long_cut_offs >= 1, "{backend}: {stats}");
        seed += 1;
        all.cut_offs += stats.cut_offs;
        all.reclaims += stats.reclaims;
        all.fenced += stats.fenced;
    }
    eprintln!(
        "hard faults with a node cut off: {} cut-offs, {} slots taken over, {} fenced back-outs",
        all.cut_offs, all.reclaims, all.fenced
    );
}

/// The one trial of a smoke run, checked: printed with its seed, and failed with its
/// violations, logs and the command that replays it.
fn one_ok(what: &str, opts: &ChaosOptions, report: chaos::RunReport) -> chaos::TrialReport {
    assert_eq!(report.trials.len(), 1);
    let t = report.trials.into_iter().next().expect("one trial");
    eprintln!(
        "chaos {what}, seed {}: {} in {:.1}s ({})",
        t.seed,
        if t.ok() { "ok" } else { "FAILED" },
        t.duration.as_secs_f64(),
        t.stats
    );
    assert!(
        t.ok(),
        "seed {}: {}\n  logs: {:?}\n  replay: {}",
        t.seed,
        t.violations.join("\n  "),
        t.logs,
        chaos::replay_command(opts, t.seed)
    );
    t
}

/// The multi-member etcd's smoke trials: one per store (v3 and v2) at once.
const MEMBERS_SEEDS_FROM: u64 = 90_000;

/// CI-sized chaos on a 3-member etcd (etcd 3.4), v3 and v2 side by side: 3 nodes (max 1), each
/// listing the members in its own order, while the leader is killed and a member is cut off
/// from the others (v3: any member; v2: the member a node talks to), beside the usual kills and
/// API faults. A fixed seed per store; the long runs, with every fault, are in RELIABILITY.md.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_smoke_on_a_three_member_etcd_v3_and_v2() {
    let seed = env_u64("REBOOTD_CHAOS_SEED", 1) + MEMBERS_SEEDS_FROM;
    let opts = |backend, seed, member_faults| ChaosOptions {
        trials: 1,
        seed,
        backend,
        nodes: 3,
        max: 1,
        actions: 4,
        etcd_members: 3,
        member_faults,
        ..ChaosOptions::new(env!("CARGO_BIN_EXE_rebootd"))
    };
    let started = Instant::now();
    // Two faults each, so that a trial of a few faults takes both: the leader killed on both
    // stores; on v3 a member cut off, on v2 the member a node talks to.
    use chaos::MemberFault::{Isolate, Leader, Partition};
    let v3 = opts(Backend::Etcd, seed, vec![Leader, Partition]);
    let v2 = opts(Backend::EtcdV2, seed + 1, vec![Leader, Isolate]);
    let stop = Stop::new();
    let (a, b) = tokio::join!(
        chaos::run(&v3, &stop, |_| {}),
        chaos::run(&v2, &stop, |_| {})
    );
    for (opts, report) in [(&v3, a), (&v2, b)] {
        let t = &one_ok(&format!("{} on 3 members", opts.backend), opts, report);
        assert!(
            !t.stats.member_faults.is_empty(),
            "no member fault: {}",
            t.stats
        );
    }
    eprintln!("3-member smoke: {:.0}s", started.elapsed().as_secs_f64());
}

/// The operator's smoke trials: one per store (v3 and v2) at once.
const OPERATOR_SEEDS_FROM: u64 = 95_000;

/// CI-sized chaos with an operator (`--operators`), v3 and v2 side by side: 5 nodes (max 2),
/// the usual kills, etcd faults and API faults, while an operator runs the real `rebootctl`:
/// pause and resume a node and the group, cancel a node's cycle, unlock a holder's slot and
/// set-max. Each trial must pass and the operator must have acted three times; the long runs are in
/// RELIABILITY.md ("Operators").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_smoke_with_an_operator_on_etcd_v3_and_v2() {
    let seed = env_u64("REBOOTD_CHAOS_SEED", 1) + OPERATOR_SEEDS_FROM;
    let opts = |backend, seed| ChaosOptions {
        trials: 1,
        seed,
        backend,
        actions: 8,
        operators: true,
        ..ChaosOptions::new(env!("CARGO_BIN_EXE_rebootd"))
    };
    let started = Instant::now();
    let (v3, v2) = (opts(Backend::Etcd, seed), opts(Backend::EtcdV2, seed + 1));
    let stop = Stop::new();
    let (a, b) = tokio::join!(
        chaos::run(&v3, &stop, |_| {}),
        chaos::run(&v2, &stop, |_| {})
    );
    for (opts, report) in [(&v3, a), (&v2, b)] {
        let what = format!("{} with an operator", opts.backend);
        let t = &one_ok(&what, opts, report);
        // The harness does not end a trial before the operator took three actions.
        assert!(
            t.stats.operator.values().sum::<u32>() >= 3,
            "the operator did too little: {}",
            t.stats
        );
    }
    eprintln!("operator smoke: {:.0}s", started.elapsed().as_secs_f64());
}

/// The windows' smoke trial.
const WINDOW_SEEDS_FROM: u64 = 96_000;

/// CI-sized chaos with maintenance windows (`--windows`): every node has windows of 2-6 s with
/// gaps of 1-6 s, one node's clock is hours off (its windows are on its own clock), beside the
/// usual kills, etcd and API faults. No node may ask logind to reboot outside its own window;
/// the windows must have made nodes wait. The long runs are in RELIABILITY.md ("Windows").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_smoke_with_short_windows_and_a_clock_hours_off() {
    let seed = env_u64("REBOOTD_CHAOS_SEED", 1) + WINDOW_SEEDS_FROM;
    let opts = ChaosOptions {
        trials: 1,
        seed,
        actions: 6,
        windows: true,
        skew_clock: true,
        ..ChaosOptions::new(env!("CARGO_BIN_EXE_rebootd"))
    };
    let started = Instant::now();
    let report = chaos::run(&opts, &Stop::new(), |_| {}).await;
    let t = &one_ok("with windows", &opts, report);
    assert!(
        t.stats
            .windows
            .get("waited for one")
            .is_some_and(|n| *n > 0),
        "no node waited for a window: {}",
        t.stats
    );
    assert_eq!(t.stats.skewed.len(), 1, "{}", t.stats);
    eprintln!("windows smoke: {:.0}s", started.elapsed().as_secs_f64());
}

/// The gate's smoke trial.
const GATE_SEEDS_FROM: u64 = 97_000;

/// CI-sized chaos with a flapping gate (`--gates`): every node asks a command gate (1 s
/// time-out) before the slot, the cordon and the reboot, whose answer the lab flips between
/// go, wait and hang (past the time-out), and a Prometheus alert gate on the real Prometheus
/// whose alert the lab makes fire and resolve, beside the usual kills, etcd and API faults. No
/// node may reboot unless its last run of each gate before the call said go in time. The long runs are in
/// RELIABILITY.md ("Gates").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_smoke_with_a_flapping_gate() {
    let seed = env_u64("REBOOTD_CHAOS_SEED", 1) + GATE_SEEDS_FROM;
    let opts = ChaosOptions {
        trials: 1,
        seed,
        actions: 6,
        gates: true,
        ..ChaosOptions::new(env!("CARGO_BIN_EXE_rebootd"))
    };
    let started = Instant::now();
    let report = chaos::run(&opts, &Stop::new(), |_| {}).await;
    let t = &one_ok("with a flapping gate", &opts, report);
    let runs = t.stats.gates.get("runs").copied().unwrap_or(0);
    assert!(
        runs as usize >= 3 * opts.nodes,
        "too few gate runs: {}",
        t.stats
    );
    // The Prometheus alert gate was asked, and the alert fired.
    let count = |k: &str| t.stats.gates.get(k).copied().unwrap_or(0);
    assert!(
        count("alert queries") as usize >= opts.nodes,
        "too few alert queries: {}",
        t.stats
    );
    assert!(count("alert set firing") > 0, "{}", t.stats);
    eprintln!("gate smoke: {:.0}s", started.elapsed().as_secs_f64());
}

/// The FleetLock smoke trial.
const FLEETLOCK_SEEDS_FROM: u64 = 98_000;

/// CI-sized chaos through the real airlock (`--backend fleetlock`, built by
/// `../shared/peers/build.sh`): every node asks airlock for its slot (FleetLock), airlock keeps
/// its semaphore in etcd v3; airlock is killed and started again, its etcd stopped and frozen,
/// beside the usual kills and API faults. The outside watcher follows airlock's semaphore in
/// etcd: never more than max holders, never more than max nodes down at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_smoke_through_the_real_airlock() {
    let seed = env_u64("REBOOTD_CHAOS_SEED", 1) + FLEETLOCK_SEEDS_FROM;
    let opts = ChaosOptions {
        trials: 1,
        seed,
        actions: 6,
        backend: Backend::FleetLock,
        ..ChaosOptions::new(env!("CARGO_BIN_EXE_rebootd"))
    };
    let started = Instant::now();
    let report = chaos::run(&opts, &Stop::new(), |_| {}).await;
    let t = &one_ok("through airlock", &opts, report);
    assert!(
        t.stats.airlock_kills > 0,
        "airlock was not killed: {}",
        t.stats
    );
    assert!(
        t.max_holders_seen > 0,
        "the watcher saw no holder: {}",
        t.stats
    );
    eprintln!("airlock smoke: {:.0}s", started.elapsed().as_secs_f64());
}

/// The mixed fleet's and the migration's smoke trials, side by side.
const MIXED_SEEDS_FROM: u64 = 99_000;

/// CI-sized chaos on a mixed fleet (`--mixed 2`, `--backend etcd-v2`): 3 rebootd nodes and 2
/// real locksmithd nodes (built by `../shared/peers/build.sh`) on one v2 semaphore, locksmithd
/// and rebootd killed, etcd stopped and frozen; beside it the same fleet with `rebootctl
/// migrate` mid-rollout (`--migrate`), the checker watching the v2 and the v3 document. Never
/// more than max holders or nodes down across both kinds, every node rebooted once, never two
/// live semaphores. The long runs are in RELIABILITY.md ("Mixed fleets").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_smoke_with_locksmithd_nodes_and_a_migration_mid_rollout() {
    let seed = env_u64("REBOOTD_CHAOS_SEED", 1) + MIXED_SEEDS_FROM;
    let opts = |seed, migrate| ChaosOptions {
        trials: 1,
        seed,
        backend: Backend::EtcdV2,
        actions: 6,
        mixed: 2,
        migrate,
        trial_timeout: Duration::from_secs(240),
        ..ChaosOptions::new(env!("CARGO_BIN_EXE_rebootd"))
    };
    let started = Instant::now();
    let (mixed, migrate) = (opts(seed, false), opts(seed + 1, true));
    let stop = Stop::new();
    let (a, b) = tokio::join!(
        chaos::run(&mixed, &stop, |_| {}),
        chaos::run(&migrate, &stop, |_| {})
    );
    let t = one_ok("mixed fleet", &mixed, a);
    let count = |t: &chaos::TrialReport, k: &str| t.stats.mixed.get(k).copied().unwrap_or(0);
    assert_eq!(count(&t, "locksmithd reboots"), 2, "{}", t.stats);
    assert!(count(&t, "locksmithd kills") > 0, "{}", t.stats);
    let u = one_ok("mixed fleet, rebootctl migrate", &migrate, b);
    assert_eq!(count(&u, "locksmithd reboots"), 2, "{}", u.stats);
    assert_eq!(count(&u, "migrated mid-rollout"), 1, "{}", u.stats);
    let etcd_faults = |t: &chaos::TrialReport| t.stats.etcd_stops + t.stats.etcd_pauses;
    assert!(
        etcd_faults(&t) + etcd_faults(&u) > 0,
        "etcd was neither stopped nor frozen: {}; {}",
        t.stats,
        u.stats
    );
    eprintln!("mixed smoke: {:.0}s", started.elapsed().as_secs_f64());
}

/// A trial's `max_hold` must be one rebootd accepts.
#[test]
fn a_max_hold_shorter_than_drain_reboot_and_ready_is_refused_before_any_trial() {
    let opts = ChaosOptions {
        max_hold: Some(Duration::from_secs(14)),
        drain_timeout: Duration::from_secs(7),
        reboot_timeout: Duration::from_secs(4),
        ready_timeout: Duration::from_secs(4),
        ..ChaosOptions::new(env!("CARGO_BIN_EXE_rebootd"))
    };
    let e = opts.check().unwrap_err();
    assert!(e.contains("--max-hold 14s is shorter than"), "{e}");
    assert!(e.contains("--reboot-time 300ms"), "{e}");
    assert!(e.contains("= 15.3s"), "{e}");
}

/// Not a test by itself: the tests below run this test binary again with only this test and
/// `REBOOTD_CHAOS_CHILD_ARGS` set (the arguments, separated by U+001F), so that it runs
/// `rebootd-lab chaos ARGS` and exits with its status.
#[test]
fn chaos_command_child() {
    let Ok(args) = std::env::var("REBOOTD_CHAOS_CHILD_ARGS") else {
        return;
    };
    let args: Vec<String> = args.split('\u{1f}').map(String::from).collect();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let status = rt.block_on(chaos::command(args));
    std::process::exit(status.into());
}

/// `rebootd-lab chaos ARGS --rebootd <this build's>`, in a process group of its own (so that
/// whatever it starts can be found by its group), stdout and stderr piped.
fn spawn_chaos(args: &[&str]) -> Child {
    let mut all: Vec<&str> = args.to_vec();
    all.extend(["--rebootd", env!("CARGO_BIN_EXE_rebootd")]);
    // Not current_exe(): a concurrent build may have replaced the file; this is still us.
    Command::new("/proc/self/exe")
        .args([
            "chaos_command_child",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("REBOOTD_CHAOS_CHILD_ARGS", all.join("\u{1f}"))
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Collect a child's output lines as they come.
fn collect(child: &mut Child) -> Arc<Mutex<Vec<String>>> {
    let lines = Arc::new(Mutex::new(Vec::new()));
    let out = child.stdout.take().unwrap();
    let err = child.stderr.take().unwrap();
    let spawn = |r: Box<dyn std::io::Read + Send>| {
        let lines = lines.clone();
        std::thread::spawn(move || {
            for l in BufReader::new(r).lines().map_while(Result::ok) {
                lines.lock().unwrap().push(l);
            }
        });
    };
    spawn(Box::new(out));
    spawn(Box::new(err));
    lines
}

fn text(lines: &Mutex<Vec<String>>) -> String {
    lines.lock().unwrap().join("\n")
}

/// Wait for `child` to exit within `limit`; its exit code.
fn wait_exit(child: &mut Child, limit: Duration, lines: &Mutex<Vec<String>>) -> Option<i32> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            // Let the readers take the last lines.
            std::thread::sleep(Duration::from_millis(200));
            return status.code();
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "rebootd-lab chaos did not exit within {limit:?}; output:\n{}",
                text(lines)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Processes (not zombies: those have ended) in process group `pgid`, as "pid comm".
fn group_members(pgid: u32) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // pid (comm) state ppid pgrp ...; comm may hold spaces and parentheses.
        let Some((head, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        if fields.len() > 2 && fields[2] == pgid.to_string() && fields[0] != "Z" {
            found.push(head.replace(" (", " "));
        }
    }
    found
}

/// No extra arguments: a single etcd.
const NO_MEMBERS: &[&str] = &[];
/// A 3-member etcd, every fault.
const THREE_MEMBERS: &[&str] = &["--etcd-members", "3"];
/// A mixed fleet: one of the 3 nodes runs the real locksmithd.
const MIXED: &[&str] = &["--mixed", "1"];

/// The checker's self-test, end to end: with max 2, the lab itself tops the semaphore up to 3
/// holders with made-up ones (etcd v3 and v2 documents; Leases), takes a live holder's slot
/// over (v2 document; a Lease) or cordons nodes up to 3 mid-trial (rebootd may add one more
/// meanwhile); made-up holders on a 3-member etcd too (v3 and v2), and beside a locksmithd
/// node (v2). The trial must fail with
/// that violation, and print its seed, its logs directory and the command replaying it.
#[test]
fn a_violation_injected_by_the_lab_fails_the_trial_with_seed_and_replay() {
    let logs = tempfile::tempdir().unwrap();
    let keep = logs.path().to_str().unwrap().to_string();
    let cases = [
        (
            "holder",
            "etcd",
            31,
            "holders at once (max 2): ",
            "chaos-injected-1",
            NO_MEMBERS,
        ),
        (
            "holder",
            "kubernetes",
            32,
            "holders at once (max 2): ",
            "chaos-injected-1",
            NO_MEMBERS,
        ),
        (
            "holder",
            "etcd-v2",
            34,
            "holders at once (max 2): ",
            "chaos-injected-1",
            NO_MEMBERS,
        ),
        (
            "takeover",
            "etcd-v2",
            35,
            "slot was taken over by chaos-injected-1 at ",
            "without lock.max_hold",
            NO_MEMBERS,
        ),
        (
            "takeover",
            "kubernetes",
            36,
            "slot was taken over by chaos-injected-1 at ",
            "without lock.max_hold",
            NO_MEMBERS,
        ),
        (
            "cordon",
            "etcd",
            33,
            "nodes cordoned at once (max 2): ",
            "node-",
            NO_MEMBERS,
        ),
        // On a 3-member etcd, whose watchers move between members.
        (
            "holder",
            "etcd",
            37,
            "holders at once (max 2): ",
            "chaos-injected-1",
            THREE_MEMBERS,
        ),
        (
            "holder",
            "etcd-v2",
            38,
            "holders at once (max 2): ",
            "chaos-injected-1",
            THREE_MEMBERS,
        ),
        // Beside a locksmithd node.
        (
            "holder",
            "etcd-v2",
            39,
            "holders at once (max 2): ",
            "chaos-injected-1",
            MIXED,
        ),
    ];
    let mut children: Vec<_> = cases
        .iter()
        .map(|(violation, backend, seed, _, _, members)| {
            let seed = seed.to_string();
            let mut args = vec![
                "--trials",
                "1",
                "--seed",
                &seed,
                "--nodes",
                "3",
                "--max",
                "2",
                "--actions",
                "3",
                "--backend",
                backend,
                "--keep-logs",
                &keep,
                "--inject-violation",
                violation,
            ];
            args.extend_from_slice(members);
            let mut child = spawn_chaos(&args);
            let lines = collect(&mut child);
            (child, lines)
        })
        .collect();
    for ((violation, backend, seed, words, who, members), (child, lines)) in
        cases.iter().zip(children.iter_mut())
    {
        let code = wait_exit(child, Duration::from_secs(180), lines);
        let out = text(lines);
        assert_eq!(
            code,
            Some(1),
            "{violation}/{backend}: a failed trial exits 1:\n{out}"
        );
        let failed = format!("trial 1/1 seed {seed}: FAILED");
        assert!(
            out.contains(&failed),
            "{violation}/{backend}: {failed:?} in:\n{out}"
        );
        let reported = out
            .lines()
            .find(|l| l.starts_with("  - ") && l.contains(words))
            .unwrap_or_else(|| panic!("{violation}/{backend}: {words:?} in:\n{out}"));
        assert!(reported.contains(who), "{reported}");
        let dir = logs
            .path()
            .join(format!("rebootd-chaos-{backend}-seed-{seed}"));
        assert!(
            out.contains(&format!("  logs: {}", dir.display())),
            "{violation}/{backend}: logs dir in:\n{out}"
        );
        assert!(dir.join("node-1.log").exists(), "{}", dir.display());
        let replay = format!(
            "  replay: rebootd-lab chaos --trials 1 --seed {seed} --nodes 3 --max 2 --backend {backend} "
        );
        let line = out
            .lines()
            .find(|l| l.starts_with(&replay))
            .unwrap_or_else(|| panic!("{violation}/{backend}: {replay:?} in:\n{out}"));
        let members = match *members {
            [] => String::new(),
            ["--etcd-members", ..] => {
                " --etcd-members 3 --faults leader,follower,partition,isolate".to_string()
            }
            other => format!(" {}", other.join(" ")),
        };
        assert!(
            line.ends_with(&format!(
                "--actions 3{members} --inject-violation {violation}"
            )),
            "{line}"
        );
        assert!(out.contains("seeds: ") && out.contains(&seed.to_string()));
    }
}

/// SIGINT stops a run: the trial in progress is torn down (no rebootd, dbus-daemon or etcd
/// left in the run's process group), the summary of the trials so far is printed, and the
/// exit status is 130.
#[test]
fn a_sigint_stops_the_run_after_tearing_down_the_current_trial() {
    let logs = tempfile::tempdir().unwrap();
    let mut child = spawn_chaos(&[
        "--trials",
        "20",
        "--seed",
        "41",
        "--nodes",
        "3",
        "--max",
        "2",
        "--actions",
        "3",
        "--keep-logs",
        logs.path().to_str().unwrap(),
    ]);
    let pgid = child.id();
    let lines = collect(&mut child);
    // Trial 1 completes; trial 2 has its processes up.
    let deadline = Instant::now() + Duration::from_secs(150);
    while !text(&lines).contains("trial 1/20 seed 41: ok") {
        assert!(
            Instant::now() < deadline && child.try_wait().unwrap().is_none(),
            "trial 1 did not pass:\n{}",
            text(&lines)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let running = |name: &str| {
        group_members(pgid)
            .iter()
            .any(|m| m.ends_with(&format!(" {name}")))
    };
    while !(running("rebootd") && running("etcd") && running("dbus-daemon")) {
        assert!(
            Instant::now() < deadline,
            "trial 2 did not start its processes: {:?}\n{}",
            group_members(pgid),
            text(&lines)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let status = Command::new("kill")
        .args(["-INT", &pgid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let sent = Instant::now();
    let code = wait_exit(&mut child, Duration::from_secs(20), &lines);
    let took = sent.elapsed();
    let out = text(&lines);
    assert_eq!(code, Some(130), "exit status after SIGINT:\n{out}");
    assert!(
        took < Duration::from_secs(10),
        "took {took:?} to stop:\n{out}"
    );
    assert!(
        out.contains("chaos: stopped by SIGINT during the trial with seed 42"),
        "{out}"
    );
    assert!(out.contains("chaos: 1 trials in "), "summary:\n{out}");
    assert!(!out.contains("trial 2/20"), "{out}");
    let left = group_members(pgid);
    assert!(left.is_empty(), "left running: {left:?}\n{out}");
}

/// Found by the chaos trials (seed 1048, etcd): rebootd killed right after it wrote
/// `phase: rebooting` with the reboot request, before the D-Bus call reached logind. Restarted
/// in the same boot, it used to wait out `reboot.timeout` (default 10 min) before asking again,
/// holding its slot and its cordon meanwhile. Now it counts a failed attempt and asks again at
/// once (a reboot call while a shutdown is pending joins it).
#[tokio::test]
async fn a_crash_before_the_logind_call_does_not_stall_for_reboot_timeout() {
    use rebootd::need::{Need, TriggerSource};
    use rebootd::state::{Phase, RebootRequest, State};
    use rebootd_lab::node::{Node, NodeOptions};
    let mut node = Node::start(
        std::path::Path::new(env!("CARGO_BIN_EXE_rebootd")),
        NodeOptions {
            start_daemon: false,
            ..NodeOptions::new("crash-before-call")
        },
    )
    .await
    .unwrap();
    // What the state file says when rebootd died between writing it and calling logind.
    let now = jiff::Timestamp::now();
    let mut s = State::new(&node.boot_id(), now);
    s.phase = Phase::Rebooting;
    s.reason = Some(Need::new(
        TriggerSource::UpdateEngine,
        "UPDATE_STATUS_UPDATED_NEED_REBOOT",
    ));
    s.reboot = Some(RebootRequest {
        requested_at: now,
        boot_id: node.boot_id(),
        called: false,
        kind: Default::default(),
        soft_reboots: None,
    });
    node.store().save(&s).unwrap();
    node.update_engine
        .set_status("UPDATE_STATUS_UPDATED_NEED_REBOOT", "1")
        .await
        .unwrap();
    let mut calls = node.logind.subscribe();
    node.start_daemon().unwrap();
    let called = tokio::time::timeout(Duration::from_secs(30), calls.recv()).await;
    assert!(
        called.is_ok(),
        "no reboot call within 30 s of the restart; state {:?}\n{}",
        node.state(),
        node.log()
    );
}
