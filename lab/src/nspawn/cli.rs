//! `rebootd-lab hosts`: boot a fleet of real hosts (nspawn containers) running the shipped
//! rebootd against an etcd on the loopback, and optionally roll a reboot through them.

use super::host::Host;
use super::install::{self, Artifacts};
use super::watch::HolderWatch;
use super::{image, NspawnError};
use crate::etcd::{EtcdServer, EtcdVersion};
use clap::Parser;
use std::path::PathBuf;
use std::time::Duration;

const BOOT_WAIT: Duration = Duration::from_secs(120);

#[derive(Debug, Parser)]
#[command(
    name = "rebootd-lab hosts",
    about = "Boot Debian 12 containers (systemd-nspawn) running the shipped rebootd unit against \
             a real etcd on the loopback; Ctrl-C removes them"
)]
struct Args {
    /// How many hosts.
    #[arg(long, default_value_t = 3)]
    hosts: usize,
    /// Slots of the semaphore.
    #[arg(long, default_value_t = 1)]
    max: u64,
    /// etcd to run: 3.4 or 3.5.
    #[arg(long, default_value = "3.5")]
    etcd: String,
    /// Make update_engine on every host report UPDATE_STATUS_UPDATED_NEED_REBOOT and watch the
    /// rolling reboot; stop when every host rebooted once.
    #[arg(long)]
    reboot: bool,
    /// The repository to take the packaging scripts, unit and configuration from.
    #[arg(long, default_value = ".")]
    repo: PathBuf,
}

/// Run the command; Ctrl-C stops it and removes the containers.
pub async fn command(args: Vec<String>) -> Result<(), String> {
    let args = Args::try_parse_from(std::iter::once("hosts".to_string()).chain(args))
        .map_err(|e| e.to_string())?;
    tokio::select! {
        r = run(args) => r.map_err(|e| e.to_string()),
        _ = tokio::signal::ctrl_c() => {
            println!("interrupted: removing the containers");
            Ok(())
        }
    }
}

async fn run(args: Args) -> Result<(), NspawnError> {
    let version = match args.etcd.as_str() {
        "3.4" => EtcdVersion::V34,
        "3.5" => EtcdVersion::V35,
        other => {
            return Err(NspawnError::Host {
                host: "-".into(),
                what: format!("--etcd {other}: expected 3.4 or 3.5"),
            })
        }
    };
    let repo = std::fs::canonicalize(&args.repo).map_err(super::io("--repo"))?;
    println!(
        "image: {} (debootstrap on first use)",
        image::cache_dir().display()
    );
    let root = tokio::task::spawn_blocking(image::ensure)
        .await
        .map_err(|e| NspawnError::Host {
            host: "-".into(),
            what: e.to_string(),
        })??;
    let lab = std::env::current_exe().map_err(super::io("the lab binary"))?;
    let log = std::env::temp_dir().join("rebootd-lab-hosts-build.log");
    println!(
        "building the static binaries (packaging/build-static.sh; log {})",
        log.display()
    );
    let artifacts = {
        let (repo, lab, log) = (repo.clone(), lab.clone(), log.clone());
        tokio::task::spawn_blocking(move || Artifacts::build(&repo, &lab, false, &log))
            .await
            .map_err(|e| NspawnError::Host {
                host: "-".into(),
                what: e.to_string(),
            })??
    };
    let etcd = EtcdServer::start(version)
        .await
        .map_err(|e| NspawnError::Host {
            host: "-".into(),
            what: e.to_string(),
        })?;
    let holders = HolderWatch::start(&etcd.endpoint(), "default").await?;
    let mut hosts = Vec::new();
    for i in 1..=args.hosts {
        let mut host = Host::create(&root, &format!("lab-host-{i}"))?;
        install::rebootd(&host, &artifacts)?;
        install::update_engine(&mut host, &artifacts)?;
        install::config(
            &host,
            "50-lab.toml",
            &format!(
                "[lock]\nbackend = \"etcd\"\n\n[lock.etcd]\nendpoints = [\"{}\"]\n\n[reboot]\nretry_interval = \"2s\"\n",
                etcd.endpoint()
            ),
        )?;
        host.boot()?;
        hosts.push(host);
    }
    if args.max != 1 {
        etcd.etcdctl_run(&[
            "put",
            &rebootd::lock::document::semaphore_key("default"),
            &format!("{{\"semaphore\":{0},\"max\":{0},\"holders\":[]}}", args.max),
        ])
        .map_err(|e| NspawnError::Host {
            host: "-".into(),
            what: e.to_string(),
        })?;
    }
    for h in &hosts {
        let state = h.wait_boot(1, BOOT_WAIT).await?;
        let status = h.unit_property("rebootd", "StatusText").await?;
        println!(
            "{}: systemd {state}; rebootd: {status:?} (machine id {})",
            h.name, h.machine_id
        );
    }
    println!("etcd {} at {}", version.as_str(), etcd.endpoint());
    if !args.reboot {
        println!("hosts are up; enter one with: nsenter -t <leader pid> -a (Ctrl-C removes them)");
        for h in &hosts {
            println!("  {}: leader pid {:?}", h.name, h.boots().borrow().leader);
        }
        std::future::pending::<()>().await;
    }
    for h in &hosts {
        install::set_update_status(h, "UPDATE_STATUS_UPDATED_NEED_REBOOT", "9999.0.0").await?;
    }
    println!("update_engine on every host: UPDATE_STATUS_UPDATED_NEED_REBOOT");
    let mut seen = holders.subscribe();
    let printer = tokio::spawn(async move {
        let mut printed = 0;
        while seen.changed().await.is_ok() {
            let history = seen.borrow().clone();
            for h in &history[printed..] {
                println!("semaphore holders: {h:?}");
            }
            printed = history.len();
        }
    });
    for h in &hosts {
        h.wait_boot(2, BOOT_WAIT * 3).await?;
        println!("{}: rebooted (boot 2 running)", h.name);
    }
    printer.abort();
    println!(
        "every host rebooted once; at most {} held a slot at once (max {})",
        holders.max_holders(),
        args.max
    );
    Ok(())
}
