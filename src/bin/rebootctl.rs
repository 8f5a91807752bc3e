//! rebootctl: show and steer rebootd. Works with the daemon stopped: it reads the configuration,
//! the state file and the lock backend directly.
//!
//! Exit codes: 0 success; 1 the operation failed (backend unreachable, refused, state
//! unreadable, or not possible with this backend: a FleetLock server owns its semaphore, so
//! `unlock` and `set-max` are refused, saying so); 2 bad usage or configuration.

use clap::{Parser, Subcommand};
use rebootd::config::{Config, LockBackend};
use rebootd::control;
use rebootd::lock::{self, SemaphoreStatus};
use rebootd::runtime;
use rebootd::state::{self, StateStore};
use rebootd::status;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Debug, Parser)]
#[command(version, about = "Show and steer rebootd")]
struct Args {
    /// Configuration fragment (repeatable); default: the daemon's search path.
    #[arg(long = "config", value_name = "FILE", global = true)]
    config: Vec<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Show the local phase and the semaphore.
    Status {
        /// Machine-readable output (stable; fields are only added; see docs/status-json.md).
        #[arg(long)]
        json: bool,
        /// Follow changes: redraw when the state file changes, and every 2 s for the semaphore.
        #[arg(long)]
        watch: bool,
    },
    /// Show every node of the group as the lock store has it: holders (phase, since when),
    /// waiters in queue order, why each node waits (window, gate, inhibitor, pause, queue),
    /// last reboots, paused and cancelled nodes. Needs etcd or Leases (see docs/fleet-view.md).
    Fleet {
        #[command(subcommand)]
        action: Option<FleetAction>,
        /// Machine-readable output (stable; fields are only added; see docs/fleet-view.md).
        #[arg(long)]
        json: bool,
        /// Follow changes: redraw at each change the store reports (a watch, not a poll).
        #[arg(long)]
        watch: bool,
    },
    /// Ask for a coordinated reboot of this host (in its window, holding a slot).
    Reboot,
    /// Pause this node: it takes no slot and starts no reboot until `resume` (kept in the state
    /// file across restarts and reboots); a reboot under way that has not reached logind is
    /// backed out of (rebootd's cordon undone, the slot given back), its need kept.
    ///
    /// With --group: pause every node of this node's group, in the lock store (etcd v3 and v2,
    /// Leases): no node of the group takes a slot until `resume --group`; holders finish their
    /// cycle. A FleetLock server has no such call.
    Pause {
        /// Why, shown by `status`.
        #[arg(long)]
        reason: Option<String>,
        /// Pause the whole group (kept in the lock store), not only this node.
        #[arg(long)]
        group: bool,
    },
    /// Undo `pause` (with --group: undo `pause --group`).
    Resume {
        /// Resume the whole group.
        #[arg(long)]
        group: bool,
    },
    /// Drop this node's pending reboot if it has not reached logind: leave the queue or give
    /// the slot back, undoing only the cordon rebootd made. A trigger that says so again starts
    /// a new one (use `pause` to hold reboots off).
    Cancel,
    /// Release a slot of the semaphore (default: this machine's). Refused, without --force,
    /// for a holder whose record says its reboot is on its way (phase `rebooting`: logind was
    /// asked, or is about to be once inhibitors and its last checks let it): a node that
    /// reboots goes down anyway, and the slot given away lets one more node down than max.
    Unlock {
        id: Option<String>,
        /// Release it even if its holder's reboot is on its way.
        #[arg(long)]
        force: bool,
    },
    /// Set the number of slots.
    SetMax {
        max: u64,
        /// Allow fewer slots than current holders.
        #[arg(long)]
        force: bool,
    },
    /// Take a slot for this machine by hand (waits for one).
    Lock,
    /// Move this group's semaphore from etcd v2 (locksmith's) to etcd v3 on the same cluster,
    /// leaving in v2 a document no v2 client can take a slot in; rebootd nodes still on
    /// api = "v2" follow by themselves. Refuses unsafe states (a locksmithd holder, another v3
    /// semaphore), saying why. See docs/migrating-from-locksmith.md.
    Migrate,
    /// Translate this host's locksmithd or Zincati configuration into a rebootd fragment:
    /// printed, or written to /etc/rebootd/config.d/ with --write. Whatever is not translated
    /// is named on stderr and in the fragment's header.
    Import {
        /// Which tool's configuration to read; default: whichever the host has.
        #[arg(long, value_enum, default_value = "auto")]
        from: ImportFrom,
        /// Read (and write) the host's files below this directory instead of /.
        #[arg(long, value_name = "DIR", default_value = "/")]
        root: PathBuf,
        /// Write the fragment to /etc/rebootd/config.d/50-imported-<tool>.toml (and the etcd
        /// password file it refers to, if any) instead of printing it.
        #[arg(long)]
        write: bool,
        /// Replace files --write finds already there.
        #[arg(long, requires = "write")]
        force: bool,
    },
}

#[derive(Debug, Subcommand)]
enum FleetAction {
    /// Delete the fleet record of a node that is gone for good (by machine id or node name),
    /// so that `lock.max = "N%"` no longer counts it. Refused for a node that holds a slot or
    /// waits for one. etcd only (see docs/fleet-view.md).
    Forget {
        /// The node's machine id (as `rebootctl fleet --json` shows it) or node name.
        node: String,
    },
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum ImportFrom {
    Auto,
    Locksmith,
    Zincati,
}

/// Failures, each with its exit code.
enum Failure {
    Usage(String),
    Operation(String),
}

fn main() -> ExitCode {
    let args = Args::parse();
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("rebootctl: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Usage(m)) => {
            eprintln!("rebootctl: {m}");
            ExitCode::from(2)
        }
        Err(Failure::Operation(m)) => {
            eprintln!("rebootctl: {m}");
            ExitCode::FAILURE
        }
    }
}

/// The full status: local state plus the semaphore as the backend reports it.
async fn gather(config: &Config, store: &StateStore) -> Result<status::Status, Failure> {
    let saved = store.load().map_err(op)?;
    let boot_id = runtime::read_id("the boot id", &config.identity.boot_id_file).ok();
    let mut report = status::local(
        config,
        store,
        saved.as_ref(),
        boot_id,
        jiff::Timestamp::now(),
    );
    if let LockBackend::FleetLock(_) = &config.lock.backend {
        // The server owns the semaphore: nothing to read but what the configuration says.
        report.semaphore = Some(SemaphoreStatus {
            backend: config.lock.backend.kind(),
            group: config.identity.group.clone(),
            max: 0,
            free: 0,
            holders: Vec::new(),
            share: None,
        });
        return Ok(report);
    }
    match lock::open::open_admin(config).await {
        Ok(admin) => {
            match admin.status().await {
                Ok(s) => report.semaphore = Some(s),
                Err(e) => report.semaphore_error = Some(e.to_string()),
            }
            match admin.group_pause().await {
                Ok(p) => report.group_paused = p,
                Err(e) => report
                    .warnings
                    .push(format!("cannot read the group's pause: {e}")),
            }
        }
        Err(e) => report.semaphore_error = Some(e.to_string()),
    }
    if let Some(w) = lock::open::split_warning(config).await {
        report.warnings.push(w);
    }
    Ok(report)
}

async fn show(config: &Config, store: &StateStore, json: bool) -> Result<(), Failure> {
    let report = gather(config, store).await?.cleaned();
    if json {
        let text = serde_json::to_string_pretty(&report).map_err(op)?;
        println!("{text}");
    } else {
        let style = status::Style {
            colour: std::io::stdout().is_terminal(),
        };
        print!("{}", status::render(&report, jiff::Timestamp::now(), style));
    }
    Ok(())
}

/// Redraw on every change of the state directory (inotify), and every 2 s for the semaphore,
/// until interrupted.
async fn follow(config: &Config, store: &StateStore, json: bool) -> Result<(), Failure> {
    use futures_util::StreamExt;
    use inotify::{Inotify, WatchMask};
    let inotify = Inotify::init().map_err(op)?;
    // The directory may not exist before the daemon's first start: then only the timer redraws.
    let _ = inotify.watches().add(
        store.dir(),
        WatchMask::MOVED_TO | WatchMask::CLOSE_WRITE | WatchMask::DELETE,
    );
    let mut changes = inotify.into_event_stream(vec![0u8; 4096]).map_err(op)?;
    let terminal = std::io::stdout().is_terminal();
    loop {
        if terminal && !json {
            print!("\x1b[2J\x1b[H");
        }
        show(config, store, json).await?;
        tokio::select! {
            _ = changes.next() => {}
            _ = tokio::time::sleep(std::time::Duration::from_secs(2)) => {}
            _ = tokio::signal::ctrl_c() => return Ok(()),
        }
    }
}

/// How long `pause`, `resume` and `cancel` wait for a running daemon to apply the request.
const APPLY_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Hand a request to the daemon and wait (a little) until it is applied, then say what the
/// node does now. A stopped daemon applies it when it starts.
async fn request(store: &StateStore, request: control::Request) -> Result<(), Failure> {
    use futures_util::StreamExt;
    use inotify::{Inotify, WatchMask};
    let name = request.name();
    let request_kind = request.clone();
    let dir = control::dir(store);
    std::fs::create_dir_all(&dir)
        .map_err(|e| op(format!("cannot create {}: {e}", dir.display())))?;
    let inotify = Inotify::init().map_err(op)?;
    inotify
        .watches()
        .add(&dir, WatchMask::DELETE)
        .map_err(|e| op(format!("cannot watch {}: {e}", dir.display())))?;
    let mut events = inotify.into_event_stream(vec![0u8; 1024]).map_err(op)?;
    let path = control::submit(store, request).map_err(op)?;
    let applied = tokio::time::timeout(APPLY_WAIT, async {
        while path.exists() {
            events.next().await;
        }
    })
    .await
    .is_ok();
    if !applied {
        println!(
            "{name} requested ({}); rebootd has not applied it within {APPLY_WAIT:?}: a stopped rebootd applies it when it starts, a running one once its current step ends (the post-boot health check, a call in progress)",
            path.display()
        );
        return Ok(());
    }
    let state = store.load().map_err(op)?;
    if let (control::Request::Cancel, Some(s)) =
        (&request_kind, state.as_ref().filter(|s| s.logind_asked()))
    {
        let at = s
            .reboot
            .as_ref()
            .map_or("before rebootd restarted".to_string(), |r| {
                format!("at {}", r.requested_at)
            });
        return Err(op(format!(
            "cancel refused: logind was already asked to reboot ({at}); the host goes down"
        )));
    }
    let now = state.as_ref().map_or(String::new(), |s| {
        let paused = s.paused.as_ref().map_or("", |_| ", paused");
        match &s.waiting_for {
            Some(w) => format!(": now {}{paused}, waiting for {w}", s.phase),
            None => format!(": now {}{paused}", s.phase),
        }
    });
    println!("{name} applied{now}");
    Ok(())
}

/// `pause --group` (`Some(reason)`) or `resume --group` (`None`): in the lock store, where every
/// node of the group sees it.
async fn pause_group(config: &Config, pause: Option<Option<String>>) -> Result<(), Failure> {
    let group = &config.identity.group;
    if let LockBackend::FleetLock(f) = &config.lock.backend {
        return Err(op(format!(
            "pause --group is not supported by a FleetLock server ({}): the protocol has no \
             call for it; pause each node (`rebootctl pause`) or stop handing out slots in the \
             server",
            f.url
        )));
    }
    let admin = lock::open::open_admin(config).await.map_err(op)?;
    match pause {
        Some(reason) => {
            let pause = lock::GroupPause {
                since: jiff::Timestamp::now(),
                reason,
                by: Some(config.identity.node_name.clone()),
            };
            admin.pause_group(&pause).await.map_err(op)?;
            println!(
                "group {group} paused ({}): no node of it takes a slot until `rebootctl resume --group`; holders finish their cycle",
                pause.describe()
            );
        }
        None => {
            let was = admin.group_pause().await.map_err(op)?;
            admin.resume_group().await.map_err(op)?;
            match was {
                Some(p) => println!("group {group} resumed (was paused {})", p.describe()),
                None => println!("group {group} was not paused (no change)"),
            }
        }
    }
    Ok(())
}

fn op<E: std::fmt::Display>(e: E) -> Failure {
    Failure::Operation(e.to_string())
}

/// `rebootctl import`: needs no rebootd configuration, so it runs before any is loaded.
fn import(from: ImportFrom, root: PathBuf, write: bool, force: bool) -> Result<(), Failure> {
    use rebootd::import::{self, ImportError, Root, Tool};
    let root = Root(root);
    let fail = |e: ImportError| match e {
        ImportError::Ambiguous { .. } => Failure::Usage(e.to_string()),
        other => Failure::Operation(other.to_string()),
    };
    let tool = match from {
        ImportFrom::Auto => import::detect(&root).map_err(fail)?,
        ImportFrom::Locksmith => Tool::Locksmith,
        ImportFrom::Zincati => Tool::Zincati,
    };
    let result = import::import(&root, tool).map_err(fail)?;
    for n in &result.notes {
        eprintln!("rebootctl: not translated: {n}");
    }
    if write {
        for path in import::write(&root, &result, force).map_err(fail)? {
            eprintln!("rebootctl: wrote {}", path.display());
        }
    } else {
        print!("{}", result.render());
        for s in &result.secrets {
            eprintln!(
                "rebootctl: {} is not printed; write it to {} (mode 0600) or use --write",
                s.what, s.path
            );
        }
    }
    Ok(())
}

async fn run(args: Args) -> Result<(), Failure> {
    if let Command::Import {
        from,
        root,
        write,
        force,
    } = args.command
    {
        return import(from, root, write, force);
    }
    let config = if args.config.is_empty() {
        Config::load_default_locations()
    } else {
        Config::load(&args.config)
    }
    .map_err(|e| Failure::Usage(e.to_string()))?;
    let mut config = config;
    // `[[window]] source = "logind"`: the window as rebootd reads it at its start.
    if let Err(e) = rebootd::runtime::resolve_logind_windows(&mut config).await {
        eprintln!("rebootctl: warning: {e}; the windows shown leave that one out");
    }
    let store = StateStore::new(state::state_dir());
    match args.command {
        Command::Status { json, watch } => {
            if !watch {
                return show(&config, &store, json).await;
            }
            follow(&config, &store, json).await
        }
        Command::Fleet {
            action: Some(FleetAction::Forget { node }),
            ..
        } => rebootd::fleet::cli::forget(&config, &node)
            .await
            .map_err(op),
        Command::Fleet { json, watch, .. } => rebootd::fleet::cli::run(&config, json, watch)
            .await
            .map_err(op),
        Command::Reboot => {
            let body = serde_json::json!({
                "requested_at": jiff::Timestamp::now(),
                "by": "rebootctl",
            });
            state::write_atomic(&store.request_path(), body.to_string().as_bytes()).map_err(op)?;
            println!(
                "reboot requested ({}); rebootd reboots this host in its window ({}) once it holds a slot",
                store.request_path().display(),
                config.windows.describe()
            );
            Ok(())
        }
        Command::Pause {
            reason,
            group: true,
        } => pause_group(&config, Some(reason)).await,
        Command::Resume { group: true } => pause_group(&config, None).await,
        Command::Pause {
            reason,
            group: false,
        } => request(&store, control::Request::Pause { reason }).await,
        Command::Resume { group: false } => request(&store, control::Request::Resume).await,
        Command::Cancel => cancel(&store).await,
        Command::Unlock { id, force } => unlock(&config, &store, id, force).await,
        Command::SetMax { max, force } => {
            let admin = lock::open::open_admin(&config).await.map_err(op)?;
            admin.set_max(max, force).await.map_err(op)?;
            println!("max set to {max}");
            Ok(())
        }
        Command::Lock => {
            let me = runtime::identity(&config, &store).map_err(op)?;
            let sem = runtime::open_semaphore(&config).await.map_err(op)?;
            eprintln!("waiting for a slot for {} ...", me.id);
            sem.acquire(&me).await.map_err(op)?;
            println!("{} holds a slot", me.id);
            Ok(())
        }
        Command::Migrate => {
            let LockBackend::Etcd(settings) = &config.lock.backend else {
                return Err(Failure::Usage(format!(
                    "migrate moves an etcd semaphore from v2 to v3; lock.backend is {:?}",
                    config.lock.backend.name()
                )));
            };
            let done = rebootd::migrate::migrate(settings, &config.identity.group)
                .await
                .map_err(op)?;
            println!("{done}");
            Ok(())
        }
        Command::Import { .. } => Ok(()),
    }
}

/// `rebootctl cancel`: a `rebootctl reboot` the daemon has not taken up yet is dropped here,
/// then the daemon is asked to end its cycle.
async fn cancel(store: &StateStore) -> Result<(), Failure> {
    match std::fs::remove_file(store.request_path()) {
        Ok(()) => println!(
            "dropped the reboot request {}",
            store.request_path().display()
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            return Err(op(format!(
                "cannot remove {}: {e}",
                store.request_path().display()
            )))
        }
    }
    request(store, control::Request::Cancel).await
}

/// `rebootctl unlock [ID] [--force]`: give back the slot of `id` (default: this machine's).
async fn unlock(
    config: &Config,
    store: &StateStore,
    id: Option<String>,
    force: bool,
) -> Result<(), Failure> {
    let own = runtime::holder_id(config).map_err(op)?;
    let id = id.unwrap_or_else(|| own.clone());
    if let (LockBackend::FleetLock(_), true) = (&config.lock.backend, id == own) {
        // The server owns the semaphore, but this node may give back its own slot, as the
        // agent does.
        let me = runtime::identity(config, store).map_err(op)?;
        let sem = runtime::open_semaphore(config).await.map_err(op)?;
        sem.release(&me).await.map_err(op)?;
    } else {
        let admin = lock::open::open_admin(config).await.map_err(op)?;
        if !force {
            let status = admin.status().await.map_err(op)?;
            if let Some(why) = reboot_on_its_way(&status.holders, &id) {
                return Err(op(why));
            }
        }
        admin.unlock(&id).await.map_err(op)?;
    }
    println!("released the slot of {id} (if it held one)");
    Ok(())
}

/// Why `unlock` of `id` is refused without `--force`: its holder's record says its reboot is on
/// its way (phase `rebooting`: rebootd proved its slot and asked logind, or is about to). The
/// node goes down whatever the document says; giving its slot away lets another node down
/// beside it, one more than `max` (RELIABILITY.md, finding 16). The record is read just before
/// the unlock: a holder that reaches `rebooting` in between is not caught.
fn reboot_on_its_way(holders: &[lock::Holder], id: &str) -> Option<String> {
    let h = holders.iter().find(|h| h.id == id)?;
    if h.phase.as_deref() != Some(rebootd::state::Phase::Rebooting.as_str()) {
        return None;
    }
    let node = h.node.as_deref().unwrap_or(id);
    let since = h
        .since
        .map_or("an unknown time".to_string(), |t| t.to_string());
    Some(format!(
        "refusing to unlock {node} ({id}): its reboot is on its way (phase rebooting since \
         {since}: logind was asked, or is about to be once inhibitors and its last checks let \
         it); a node that reboots goes down anyway, and its slot given to another node would put \
         one node more than max down. Wait until it is back and gives the slot back, or use \
         --force"
    ))
}
