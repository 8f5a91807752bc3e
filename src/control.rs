//! Operator requests to the agent: `rebootctl pause`, `resume` and `cancel`.
//!
//! Each request is a small JSON file in `<state dir>/control/`, written atomically by `rebootctl`
//! under a name that sorts in the order the requests were made (nanoseconds since the epoch,
//! then the process id). The daemon applies them in that order, each as an agent event: it
//! writes the new state file, then deletes the request. So a request made while the daemon is
//! stopped is applied when it starts, none is lost or applied out of order, and what a request
//! changed (a pause) lives on in the state file across restarts and reboots.
//!
//! While the agent waits (for a trigger, a window, a slot, a drain, inhibitors, the host to go
//! down) the runtime races the wait against [`Inbox::arrived`], so a request takes effect at once.

use crate::agent::Event;
use crate::state::{StateError, StateStore};
use futures_util::StreamExt;
use inotify::{Inotify, WatchMask};
use jiff::Timestamp;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use tracing::warn;

/// Name of the request directory inside the state directory.
pub const CONTROL_DIR: &str = "control";

/// What the operator asks for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "request", rename_all = "snake_case")]
pub enum Request {
    /// Take no slot (and start no reboot) until resumed; back out of one not yet at logind.
    Pause {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
    /// Undo a pause.
    Resume,
    /// Drop the pending reboot, if it has not reached logind.
    Cancel,
}

impl Request {
    /// The agent event this request is.
    pub fn event(&self) -> Event {
        match self {
            Request::Pause { reason } => Event::Paused {
                reason: reason.clone(),
            },
            Request::Resume => Event::Resumed,
            Request::Cancel => Event::Cancelled,
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            Request::Pause { .. } => "pause",
            Request::Resume => "resume",
            Request::Cancel => "cancel",
        }
    }
}

/// One request file's content.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Envelope {
    #[serde(flatten)]
    pub request: Request,
    pub requested_at: Timestamp,
}

/// The request directory of a state directory.
pub fn dir(store: &StateStore) -> PathBuf {
    store.dir().join(CONTROL_DIR)
}

/// The file name of a request made at `at` by process `pid`: sorts in the order made.
pub fn file_name(at: Timestamp, pid: u32) -> String {
    format!("{:020}-{pid:010}.json", at.as_nanosecond().max(0))
}

/// Write a request for the daemon (`rebootctl`). Returns the file written.
pub fn submit(store: &StateStore, request: Request) -> Result<PathBuf, StateError> {
    let now = Timestamp::now();
    let envelope = Envelope {
        request,
        requested_at: now,
    };
    let path = dir(store).join(file_name(now, std::process::id()));
    let text = serde_json::to_string(&envelope).unwrap_or_default();
    crate::state::write_atomic(&path, text.as_bytes())?;
    Ok(path)
}

/// A request file waiting for the daemon: its path and what it says (or why it does not parse).
#[derive(Debug)]
pub struct Pending {
    pub path: PathBuf,
    pub request: Result<Envelope, RequestError>,
}

/// Why a request file is not a request.
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    #[error("{0}")]
    Read(std::io::Error),
    #[error("{0}")]
    Parse(serde_json::Error),
}

/// The requests waiting in `dir`, oldest first. A missing directory has none.
pub fn pending(dir: &Path) -> std::io::Result<Vec<Pending>> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut paths: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| !n.starts_with('.') && n.ends_with(".json"))
        })
        .collect();
    paths.sort();
    Ok(paths
        .into_iter()
        .map(|path| {
            let request = std::fs::read_to_string(&path)
                .map_err(RequestError::Read)
                .and_then(|t| serde_json::from_str(&t).map_err(RequestError::Parse));
            Pending { path, request }
        })
        .collect())
}

/// Without a watch on the request directory, how often a wait looks for a request.
pub const POLL: std::time::Duration = std::time::Duration::from_secs(2);

/// A watch on the request directory `dir` (made if missing).
fn watch(dir: &Path) -> std::io::Result<inotify::EventStream<Vec<u8>>> {
    std::fs::create_dir_all(dir)?;
    let inotify = Inotify::init()?;
    inotify
        .watches()
        .add(dir, WatchMask::MOVED_TO | WatchMask::CLOSE_WRITE)?;
    inotify.into_event_stream(vec![0u8; 4096])
}

/// The daemon's side: the requests in order, and a wait that ends when one arrives.
pub struct Inbox {
    dir: PathBuf,
    events: Option<inotify::EventStream<Vec<u8>>>,
    /// Requests applied whose file could not be deleted: never applied twice.
    applied: std::collections::HashSet<PathBuf>,
}

impl Inbox {
    /// Watch the request directory (made if missing). Without a watch (an error, logged: the
    /// inotify instances used up, say) a request is still applied between two actions, and a
    /// wait looks for one every [`POLL`], trying to watch again.
    pub fn open(store: &StateStore) -> Inbox {
        let dir = dir(store);
        let events = match watch(&dir) {
            Ok(e) => Some(e),
            Err(e) => {
                let path = dir.display().to_string();
                warn!(%path, error = %e, "cannot watch the request directory {path} ({e}): rebootctl pause, resume and cancel are looked for every {}s while waiting", POLL.as_secs());
                None
            }
        };
        Inbox {
            dir,
            events,
            applied: Default::default(),
        }
    }

    /// The oldest request waiting, if any. One that does not parse is set aside (renamed with a
    /// leading dot, logged) so it cannot block the others.
    pub fn next(&self) -> Option<(PathBuf, Envelope)> {
        let list = match pending(&self.dir) {
            Ok(list) => list,
            Err(e) => {
                let path = self.dir.display().to_string();
                warn!(%path, error = %e, "cannot read the request directory {path}: {e}");
                return None;
            }
        };
        for p in list {
            if self.applied.contains(&p.path) {
                continue;
            }
            match p.request {
                Ok(envelope) => return Some((p.path, envelope)),
                Err(reason) => {
                    let path = p.path.display().to_string();
                    warn!(%path, %reason, "request file {path} does not parse ({reason}); set aside");
                    let aside = p.path.with_file_name(format!(
                        ".{}.bad",
                        p.path.file_name().unwrap_or_default().to_string_lossy()
                    ));
                    if std::fs::rename(&p.path, &aside).is_err() {
                        let _ = std::fs::remove_file(&p.path);
                    }
                }
            }
        }
        None
    }

    /// A request was applied (its effect is in the state file): delete it.
    pub fn done(&mut self, path: &Path) {
        if let Err(e) = std::fs::remove_file(path) {
            self.applied.insert(path.to_path_buf());
            let path = path.display().to_string();
            warn!(%path, error = %e, "cannot remove the applied request {path}: {e}");
        }
    }

    /// Resolve once a request is waiting.
    pub async fn arrived(&mut self) {
        loop {
            if self.next().is_some() {
                return;
            }
            match self.events.as_mut() {
                Some(events) => {
                    if events.next().await.is_none() {
                        self.events = None;
                    }
                }
                // No watch: look again a little later (a paused node waits for its resume
                // here), and try to watch again.
                None => {
                    tokio::time::sleep(POLL).await;
                    self.events = watch(&self.dir).ok();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_json_with_their_kind_and_time() {
        let at: Timestamp = "2026-11-23T14:00:00Z".parse().unwrap();
        let e = Envelope {
            request: Request::Pause {
                reason: Some("db migration".into()),
            },
            requested_at: at,
        };
        let text = serde_json::to_string(&e).unwrap();
        assert_eq!(
            text,
            r#"{"request":"pause","reason":"db migration","requested_at":"2026-11-23T14:00:00Z"}"#
        );
        assert_eq!(serde_json::from_str::<Envelope>(&text).unwrap(), e);
        let cancel: Envelope =
            serde_json::from_str(r#"{"request":"cancel","requested_at":"2026-11-23T14:00:00Z"}"#)
                .unwrap();
        assert_eq!(cancel.request.event(), Event::Cancelled);
        assert!(serde_json::from_str::<Envelope>(r#"{"request":"reboot-now"}"#).is_err());
    }

    #[test]
    fn file_names_sort_in_the_order_made() {
        let a: Timestamp = "2026-11-23T14:00:00Z".parse().unwrap();
        let b = a + jiff::SignedDuration::from_nanos(1);
        let c: Timestamp = "2100-01-01T00:00:00Z".parse().unwrap();
        let names = [file_name(a, 99999), file_name(b, 1), file_name(c, 5)];
        let mut sorted = names.clone();
        sorted.sort();
        assert_eq!(sorted, names);
    }

    #[tokio::test]
    async fn the_inbox_gives_requests_oldest_first_and_sets_aside_what_does_not_parse() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::new(dir.path());
        let mut inbox = Inbox::open(&store);
        assert!(inbox.next().is_none());
        let first = submit(&store, Request::Pause { reason: None }).unwrap();
        let second = submit(&store, Request::Cancel).unwrap();
        std::fs::write(super::dir(&store).join("0-garbage.json"), "{").unwrap();
        let (path, e) = inbox.next().unwrap();
        assert_eq!(path, first);
        assert_eq!(e.request, Request::Pause { reason: None });
        inbox.done(&path);
        let (path, e) = inbox.next().unwrap();
        assert_eq!((path.clone(), e.request), (second, Request::Cancel));
        inbox.done(&path);
        assert!(inbox.next().is_none());
        assert!(pending(&super::dir(&store)).unwrap().is_empty());
        assert!(super::dir(&store).join(".0-garbage.json.bad").exists());
    }

    #[tokio::test]
    async fn arrived_resolves_when_a_request_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::new(dir.path());
        let mut inbox = Inbox::open(&store);
        let waiting = tokio::spawn(async move {
            inbox.arrived().await;
            inbox.next().map(|(_, e)| e.request)
        });
        tokio::task::yield_now().await;
        submit(&store, Request::Resume).unwrap();
        let got = tokio::time::timeout(std::time::Duration::from_secs(10), waiting)
            .await
            .expect("arrived in time")
            .unwrap();
        assert_eq!(got, Some(Request::Resume));
    }

    /// Finding 17 (RELIABILITY.md): a daemon that could not watch its request directory at
    /// start (the inotify instances used up by other programs) waited for `rebootctl resume`
    /// for good (chaos smoke `--operators`, seed 95001). Its wait now looks for requests every
    /// [`POLL`].
    #[tokio::test]
    async fn without_a_watch_a_wait_still_ends_when_a_request_comes() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::new(dir.path());
        let mut inbox = Inbox::open(&store);
        inbox.events = None;
        let waiting = tokio::spawn(async move {
            inbox.arrived().await;
            inbox.next().map(|(_, e)| e.request)
        });
        tokio::task::yield_now().await;
        submit(&store, Request::Resume).unwrap();
        let got = tokio::time::timeout(POLL * 3, waiting)
            .await
            .expect("arrived in time without a watch")
            .unwrap();
        assert_eq!(got, Some(Request::Resume));
    }
}
