//! `rebootd-lab bench`: benchmarks of rebootd in the lab. They print figures; they are not
//! timed tests. Results and the commands that produced them are in `BENCHMARKS.md` (what is
//! true now) and `docs/benchmark-history.md` (every round).
//!
//! - `handoff`: slot hand-off latency of the lock backends (library, in-process clients).
//! - `rollout`: a rolling reboot of many in-process nodes (the real `Runtime`), vs the ideal.
//! - `store-sim`: N nodes' real lock adapters against the store, no Runtime; what each reboot
//!   costs the store (requests, bytes, watch events) and the nodes (CPU).
//! - `idle`: resource use and requests of one idle real `rebootd` process.
//! - `drain`: rebootd's drain vs `kubectl drain` on the API stand-in.

mod drain;
mod handoff;
mod idle;
mod peers;
mod rollout;
mod store_sim;
mod usage;
mod util;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(name = "rebootd-lab bench", about = "Benchmarks of rebootd in the lab")]
struct BenchCli {
    #[command(subcommand)]
    command: BenchCommand,
}

#[derive(Debug, Subcommand)]
enum BenchCommand {
    /// Slot hand-off latency: release by the holder -> the next waiter's acquire returns.
    Handoff(handoff::Args),
    /// Rolling reboot of N in-process nodes (real Runtime, agent and lock code).
    Rollout(rollout::Args),
    /// Store-level simulation: N nodes' real lock adapters against the store, no Runtime.
    StoreSim(store_sim::Args),
    /// Idle cost of one real rebootd process (etcd backend, drain configured).
    Idle(idle::Args),
    /// rebootd's KubeDrainer vs `kubectl drain` on the API stand-in.
    Drain(drain::Args),
}

/// Parse the arguments after `bench` and run.
pub async fn cli(args: Vec<String>) -> Result<(), String> {
    let cli =
        BenchCli::try_parse_from(std::iter::once("rebootd-lab bench".to_string()).chain(args))
            .map_err(|e| {
                // --help and usage errors: clap's own text.
                let _ = e.print();
                if e.use_stderr() {
                    "bad arguments".to_string()
                } else {
                    std::process::exit(0)
                }
            })?;
    println!("machine: {}", util::machine());
    // The in-process parts (drainer, semaphores, runtimes) log to stderr when asked, with the
    // time since start, e.g. RUST_LOG=rebootd::drain=info to see each eviction attempt.
    if std::env::var_os("RUST_LOG").is_some() {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_timer(tracing_subscriber::fmt::time::uptime())
            .with_writer(std::io::stderr)
            .try_init();
    }
    match cli.command {
        BenchCommand::Handoff(a) => handoff::run(a).await,
        BenchCommand::Rollout(a) => rollout::run(a).await,
        BenchCommand::StoreSim(a) => store_sim::run(a).await,
        BenchCommand::Idle(a) => idle::run(a).await,
        BenchCommand::Drain(a) => drain::run(a).await,
    }
}
