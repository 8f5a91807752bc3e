//! Watches: a chunked stream of `{"type":...,"object":...}` lines from a resourceVersion (or
//! the current state as ADDED events), filtered by namespace and selectors the way the real
//! server filters (an object leaving the selection is DELETED, entering it is ADDED), with
//! bookmarks, `sendInitialEvents` and `timeoutSeconds`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use hyper::Response;
use serde_json::{json, Value};
use tokio::sync::{broadcast, mpsc};

use crate::error::ApiError;
use crate::events;
use crate::http::{self, Body, Query};
use crate::kind::Kind;
use crate::meta;
use crate::selector::{FieldSelector, LabelSelector};
use crate::store::{Change, EventType, Store};

/// Watch events (ADDED, MODIFIED, DELETED, ERROR; not bookmarks) sent by every stand-in of
/// this process, for the benches' counts.
static EVENTS_SENT: AtomicU64 = AtomicU64::new(0);

/// Watch events sent so far by every stand-in of this process (bookmarks left out).
pub fn events_sent() -> u64 {
    EVENTS_SENT.load(Ordering::Relaxed)
}

/// What one watch selects.
struct Filter {
    kind: Kind,
    namespace: Option<String>,
    labels: LabelSelector,
    fields: FieldSelector,
}

impl Filter {
    fn matches(&self, obj: &Value) -> bool {
        self.namespace
            .as_deref()
            .is_none_or(|ns| meta::namespace(obj) == ns)
            && self.labels.matches_object(obj)
            && self.fields.matches(obj)
    }

    /// The event this watcher sees for a change, if any.
    fn translate(&self, c: &Change) -> Option<(&'static str, Value)> {
        if c.kind != self.kind.storage() {
            return None;
        }
        let now = self.matches(&c.object);
        let ty = match c.event {
            EventType::Added if now => "ADDED",
            EventType::Deleted if now => "DELETED",
            EventType::Modified => {
                let before = c.old.as_ref().is_some_and(|o| self.matches(o));
                match (before, now) {
                    (true, true) => "MODIFIED",
                    (false, true) => "ADDED",
                    (true, false) => "DELETED",
                    (false, false) => return None,
                }
            }
            _ => return None,
        };
        Some((ty, events::to_view(self.kind, c.object.clone())))
    }

    fn bookmark(&self, rv: u64, initial_end: bool) -> Bytes {
        let mut m = json!({"resourceVersion": rv.to_string()});
        if initial_end {
            m["annotations"] = json!({"k8s.io/initial-events-end": "true"});
        }
        let object = json!({"kind": self.kind.kind_name(), "apiVersion": self.kind.api_version(), "metadata": m});
        line("BOOKMARK", &object)
    }
}

/// One event line, `type` first as the real server writes it.
fn line(ty: &str, object: &Value) -> Bytes {
    if ty != "BOOKMARK" {
        EVENTS_SENT.fetch_add(1, Ordering::Relaxed);
    }
    let obj = serde_json::to_string(object).unwrap_or_else(|_| "{}".into());
    Bytes::from(format!("{{\"type\":\"{ty}\",\"object\":{obj}}}\n"))
}

/// Start a watch and answer with its stream.
pub fn start(
    store: &Store,
    kind: Kind,
    namespace: Option<String>,
    q: &Query,
    bookmark_interval: Duration,
) -> Result<Response<Body>, ApiError> {
    let filter = Filter {
        kind,
        namespace,
        labels: LabelSelector::parse(q.get("labelSelector").unwrap_or(""))?,
        fields: FieldSelector::parse(q.get("fieldSelector").unwrap_or(""), kind)?,
    };
    let rv_param = q.get("resourceVersion").unwrap_or("");
    let send_initial = q.flag("sendInitialEvents");
    let bookmarks = q.flag("allowWatchBookmarks");
    let timeout = q
        .get("timeoutSeconds")
        .and_then(|s| s.parse::<u64>().ok())
        .filter(|s| *s > 0)
        .map(Duration::from_secs)
        .unwrap_or(Duration::from_secs(1800));
    let from_state = send_initial || rv_param.is_empty() || rv_param == "0";
    let from_rv: Option<u64> = if from_state {
        None
    } else {
        Some(rv_param.parse().map_err(|_| {
            ApiError::bad_request(format!("invalid resource version: {rv_param:?}"))
        })?)
    };
    let (initial, past, rx, start_rv) = store.read(|st| {
        let start_rv = from_rv.unwrap_or(st.resource_version());
        let initial: Vec<Value> = if from_rv.is_none() {
            st.iter(kind, filter.namespace.as_deref())
                .filter(|o| filter.matches(o))
                .map(|o| events::to_view(kind, o.clone()))
                .collect()
        } else {
            Vec::new()
        };
        st.watch_from(start_rv)
            .map(|(past, rx)| (initial, past, rx, start_rv))
    })?;
    let (tx, resp) = http::stream();
    tokio::spawn(async move {
        let mut w = Watcher {
            filter,
            tx,
            last_rv: start_rv,
        };
        w.run(
            initial,
            past,
            rx,
            send_initial && bookmarks,
            bookmarks.then_some(bookmark_interval),
            timeout,
        )
        .await;
    });
    Ok(resp)
}

struct Watcher {
    filter: Filter,
    tx: mpsc::Sender<Bytes>,
    /// The resourceVersion of the last change this watcher has seen (of any kind).
    last_rv: u64,
}

impl Watcher {
    async fn send(&self, b: Bytes) -> bool {
        self.tx.send(b).await.is_ok()
    }

    async fn change(&mut self, c: &Change) -> bool {
        if c.rv <= self.last_rv {
            return true;
        }
        self.last_rv = c.rv;
        match self.filter.translate(c) {
            Some((ty, obj)) => self.send(line(ty, &obj)).await,
            None => true,
        }
    }

    async fn run(
        &mut self,
        initial: Vec<Value>,
        past: Vec<Arc<Change>>,
        mut rx: broadcast::Receiver<Arc<Change>>,
        initial_end: bool,
        bookmark_every: Option<Duration>,
        timeout: Duration,
    ) {
        for o in initial {
            if !self.send(line("ADDED", &o)).await {
                return;
            }
        }
        if initial_end && !self.send(self.filter.bookmark(self.last_rv, true)).await {
            return;
        }
        for c in past {
            if !self.change(&c).await {
                return;
            }
        }
        let deadline = tokio::time::sleep(timeout);
        tokio::pin!(deadline);
        let period = bookmark_every.unwrap_or(Duration::from_secs(3600));
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        loop {
            tokio::select! {
                r = rx.recv() => match r {
                    Ok(c) => {
                        if !self.change(&c).await {
                            return;
                        }
                    }
                    Err(broadcast::error::RecvError::Lagged(_)) => {
                        let e = ApiError::gone(self.last_rv);
                        let _ = self.send(line("ERROR", &e.to_status())).await;
                        return;
                    }
                    Err(broadcast::error::RecvError::Closed) => return,
                },
                _ = tick.tick(), if bookmark_every.is_some() => {
                    if !self.send(self.filter.bookmark(self.last_rv, false)).await {
                        return;
                    }
                }
                _ = &mut deadline => return,
                _ = self.tx.closed() => return,
            }
        }
    }
}
