//! Triggers: the sources that tell rebootd its host needs a reboot. Each runs as its own task
//! and sends a [`Need`] on a channel. The agent hears them in every phase: idle, the first starts
//! a cycle; during a cycle they are noted and that cycle's reboot serves them.

pub mod command;
pub mod file;
pub mod update_engine;

use crate::config::Triggers;
use std::path::Path;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

/// Sent once by a trigger when it listens (or has given its first try), so start-up can
/// report ready only when no trigger can be missed any more.
pub type Ready = oneshot::Sender<()>;

pub use crate::need::{Need, TriggerSource};

/// The running triggers.
pub struct Running {
    pub tasks: Vec<JoinHandle<()>>,
    /// One receiver per trigger; each resolves when its trigger listens.
    pub ready: Vec<oneshot::Receiver<()>>,
}

/// Start every configured trigger, plus the manual request file of `rebootctl reboot`. A
/// sentinel file found at start that is older than `last_reboot` was met by it (see [`file`]).
pub fn spawn_all(
    triggers: &Triggers,
    request_file: &Path,
    tx: mpsc::Sender<Need>,
    last_reboot: Option<std::time::SystemTime>,
) -> Running {
    let mut running = Running {
        tasks: Vec::new(),
        ready: Vec::new(),
    };
    let mut ready = || {
        let (tx, rx) = oneshot::channel();
        running.ready.push(rx);
        tx
    };
    let mut tasks = Vec::new();
    if triggers.update_engine {
        tasks.push(tokio::spawn(update_engine::run(tx.clone(), ready())));
    }
    if let Some(path) = &triggers.sentinel_file {
        tasks.push(tokio::spawn(file::run(
            TriggerSource::SentinelFile,
            path.clone(),
            tx.clone(),
            ready(),
            last_reboot,
        )));
    }
    if let Some(cmd) = &triggers.sentinel_command {
        tasks.push(tokio::spawn(command::run(
            cmd.clone(),
            triggers.sentinel_interval,
            tx.clone(),
            ready(),
        )));
    }
    tasks.push(tokio::spawn(file::run(
        TriggerSource::Rebootctl,
        request_file.to_path_buf(),
        tx,
        ready(),
        None,
    )));
    running.tasks = tasks;
    running
}
