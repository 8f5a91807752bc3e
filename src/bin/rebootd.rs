//! The rebootd daemon: parse arguments, load the configuration, run the agent.

use clap::Parser;
use rebootd::config::Config;
use rebootd::logging::{self, LogFormat};
use rebootd::runtime::{self, Runtime};
use rebootd::state::{self, StateStore};
use std::path::PathBuf;
use std::process::ExitCode;

/// Reboot coordinator: reboots this host when it needs it, in its maintenance window, holding a
/// slot of a fleet-wide semaphore.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// Configuration fragment (repeatable, merged in order); replaces the search of
    /// /usr/lib/rebootd/config.d and /etc/rebootd/config.d.
    #[arg(long = "config", value_name = "FILE")]
    config: Vec<PathBuf>,
    /// Log format.
    #[arg(long, value_enum, default_value = "auto")]
    log_format: LogFormat,
    /// Check the configuration and everything it names (identity files, TLS files, password
    /// file, kubeconfigs, selectors, the sentinel command) as connecting would, without
    /// connecting; exit 0 when all is well, 2 naming each problem. Secrets others may read or
    /// that would cross the network in clear are warned about (exit status unchanged).
    #[arg(long)]
    check_config: bool,
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        std::future::pending::<()>().await;
        return;
    };
    tokio::select! {
        _ = term.recv() => {},
        _ = int.recv() => {},
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    logging::init(args.log_format);
    let config = if args.config.is_empty() {
        Config::load_default_locations()
    } else {
        Config::load(&args.config)
    };
    let config = match config {
        Ok(c) => c,
        Err(e) => {
            tracing::error!("{e}");
            eprintln!("rebootd: {e}");
            return ExitCode::from(2);
        }
    };
    // One thread: rebootd waits most of its life, and a small footprint matters on every host.
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("rebootd: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    // Files holding secrets that others may read, passwords and tokens over plain http://.
    let secret_warnings = rt.block_on(rebootd::secrets::warnings(&config));
    if args.check_config {
        for w in &secret_warnings {
            eprintln!("rebootd: warning: {w}");
        }
        let problems = rt.block_on(rebootd::check::offline(&config));
        if problems.is_empty() {
            println!(
                "configuration OK ({} fragment(s); lock backend {}; files it names read)",
                config.sources.len(),
                config.lock.backend.name()
            );
            return ExitCode::SUCCESS;
        }
        for p in &problems {
            eprintln!("rebootd: {p}");
        }
        return ExitCode::from(2);
    }
    for w in &secret_warnings {
        tracing::warn!("{w}");
    }
    let result = rt.block_on(async move {
        let mut config = config;
        runtime::check_host(&mut config).await?;
        let store = StateStore::new(state::state_dir());
        let me = runtime::identity(&config, &store)?;
        tracing::info!(
            node = %me.node, machine_id = %me.id, boot_id = %me.boot_id,
            group = %config.identity.group, backend = config.lock.backend.name(),
            windows = %config.windows.describe(),
            sources = ?config.sources, "rebootd starting"
        );
        let semaphore = runtime::open_semaphore(&config).await?;
        // Two semaphores (v2 and v3) mean twice max: say so loudly, without delaying the start.
        let check = config.clone();
        tokio::spawn(async move {
            if let Some(w) = rebootd::lock::open::split_warning(&check).await {
                tracing::error!("{w}");
            }
        });
        let metrics = rebootd::metrics::Metrics::default();
        let drainer = runtime::open_drainer(&config, &me.boot_id, &metrics).await?;
        let _server = match config.metrics_listen {
            Some(addr) => Some(
                rebootd::metrics::serve(addr, metrics.clone())
                    .await
                    .map_err(|e| {
                        runtime::RuntimeError::Metrics(format!("cannot listen on {addr}: {e}"))
                    })?,
            ),
            None => None,
        };
        let webhook = match &config.webhook {
            Some(w) => Some(
                rebootd::notify_webhook::Webhook::start(w)
                    .map_err(|e| runtime::RuntimeError::Webhook(e.to_string()))?,
            ),
            None => None,
        };
        let gates = runtime::open_gates(&config).await?;
        let coordinator = runtime::open_coordinator(&config);
        let mut runtime = Runtime::new(config, store, semaphore, drainer, me)
            .with_metrics(metrics)
            .with_gates(gates);
        if let Some(c) = coordinator {
            runtime = runtime.with_coordinator(c);
        }
        if let Some(w) = webhook {
            runtime = runtime.with_webhook(w);
        }
        runtime.run(shutdown_signal()).await
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e}");
            eprintln!("rebootd: {e}");
            ExitCode::FAILURE
        }
    }
}
