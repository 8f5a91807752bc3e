//! An outside watcher of locksmith's v2 semaphore document: every version of the key, in etcd's
//! order, from a streaming watch that resumes at the index after the last event when it ends
//! (so no change is missed while etcd keeps it). Tests check invariants on the history (never more holders
//! than `max`) and await states by watching it rather than polling.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rebootd::clients::etcd_v2::{Get, KeysClient, Settings, Timeouts};
use rebootd::http::TlsFiles;
use rebootd::lock::document::SemaphoreDoc;
use tokio::sync::watch;

/// One version of the document as the watcher saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DocVersion {
    /// etcd's modified index of this version.
    pub index: u64,
    /// The raw value; `None` when the key was deleted or expired.
    pub value: Option<String>,
    /// When the watcher received it (the benchmarks time hand-offs by it).
    pub seen: Instant,
}

impl DocVersion {
    /// The holders, when the value is locksmith's document; `None` otherwise.
    pub fn holders(&self) -> Option<Vec<String>> {
        let v = self.value.as_ref()?;
        SemaphoreDoc::parse(v.as_bytes()).ok().map(|d| d.holders)
    }

    /// The document, when the value parses as locksmith's.
    pub fn doc(&self) -> Option<SemaphoreDoc> {
        SemaphoreDoc::parse(self.value.as_ref()?.as_bytes()).ok()
    }
}

/// A running watcher. Dropping it stops the watch.
pub struct V2DocWatcher {
    history: Arc<Mutex<Vec<DocVersion>>>,
    latest: watch::Receiver<Option<DocVersion>>,
    /// Set when the watch broke (e.g. a cleared index): the history may have a gap.
    broken: Arc<Mutex<Option<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for V2DocWatcher {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl V2DocWatcher {
    /// Watch `key` on the plain-http etcd at `endpoint`, starting with its current value.
    pub async fn start(endpoint: &str, key: &str) -> Result<Self, String> {
        Self::start_inner(endpoint, key, None).await
    }

    /// As [`V2DocWatcher::start`], also sending every version on `feed` as it comes.
    pub async fn start_feeding(
        endpoint: &str,
        key: &str,
        feed: tokio::sync::mpsc::UnboundedSender<DocVersion>,
    ) -> Result<Self, String> {
        Self::start_inner(endpoint, key, Some(feed)).await
    }

    async fn start_inner(
        endpoint: &str,
        key: &str,
        feed: Option<tokio::sync::mpsc::UnboundedSender<DocVersion>>,
    ) -> Result<Self, String> {
        let settings = Settings {
            endpoints: vec![endpoint.to_owned()],
            tls: TlsFiles {
                table: "watcher",
                ..TlsFiles::default()
            },
            basic_auth: None,
            timeouts: Timeouts {
                watch: Duration::from_secs(3600),
                ..Timeouts::default()
            },
        };
        let client = KeysClient::new(&settings).map_err(|e| e.to_string())?;
        let (first, mut next_index) = match client.get(key, Get::default()).await {
            Ok(r) => (
                Some(DocVersion {
                    index: r.node.modified_index,
                    value: r.node.value,
                    seen: Instant::now(),
                }),
                r.etcd_index + 1,
            ),
            Err(e) if e.is_key_not_found() => (None, e_index(&e) + 1),
            Err(e) => return Err(e.to_string()),
        };
        let history = Arc::new(Mutex::new(first.iter().cloned().collect::<Vec<_>>()));
        let (tx, latest) = watch::channel(first);
        let broken = Arc::new(Mutex::new(None));
        let (h, b, key) = (history.clone(), broken.clone(), key.to_owned());
        let task = tokio::spawn(async move {
            // One streaming watch, opened again from the index after the last event when it
            // ends: a long poll asked again after each event fell out of etcd's 1000-event
            // history when other keys changed faster than that (a 1000-node rollout's start).
            let mut stream = None;
            loop {
                let open = match stream.take() {
                    Some(s) => Ok(s),
                    None => client.watch_stream(&key, false, next_index).await,
                };
                let next = match open {
                    Ok(mut s) => {
                        let next = s.next().await;
                        if !s.ended() {
                            stream = Some(s);
                        }
                        next
                    }
                    Err(e) => Err(e),
                };
                match next {
                    Ok(None) => continue,
                    Ok(Some(event)) => {
                        next_index = event.node.modified_index + 1;
                        let version = DocVersion {
                            index: event.node.modified_index,
                            value: if event.action.removes() {
                                None
                            } else {
                                event.node.value
                            },
                            seen: Instant::now(),
                        };
                        if let Ok(mut h) = h.lock() {
                            h.push(version.clone());
                        }
                        if let Some(f) = &feed {
                            let _ = f.send(version.clone());
                        }
                        tx.send_replace(Some(version));
                    }
                    Err(e) => {
                        if let Ok(mut b) = b.lock() {
                            *b = Some(e.to_string());
                        }
                        return;
                    }
                }
            }
        });
        Ok(V2DocWatcher {
            history,
            latest,
            broken,
            task,
        })
    }

    /// Every version seen so far, oldest first.
    pub fn history(&self) -> Vec<DocVersion> {
        self.history.lock().map(|h| h.clone()).unwrap_or_default()
    }

    /// Why the watch stopped, if it did (the history is then incomplete).
    pub fn broken(&self) -> Option<String> {
        self.broken.lock().ok().and_then(|b| b.clone())
    }

    /// The most holders any version had.
    pub fn max_holders_seen(&self) -> usize {
        self.history()
            .iter()
            .filter_map(|v| v.holders().map(|h| h.len()))
            .max()
            .unwrap_or(0)
    }

    /// Wait until the latest version satisfies `pred`; the version, or the history on timeout.
    pub async fn wait_for(
        &self,
        what: &str,
        timeout: Duration,
        pred: impl Fn(&DocVersion) -> bool,
    ) -> Result<DocVersion, String> {
        let mut rx = self.latest.clone();
        let found = tokio::time::timeout(timeout, async {
            rx.wait_for(|v| v.as_ref().is_some_and(&pred))
                .await
                .ok()
                .and_then(|v| v.clone())
        })
        .await;
        match found {
            Ok(Some(v)) => Ok(v),
            _ => Err(format!(
                "the v2 document did not come to {what} within {timeout:?}; history {:?}{}",
                self.history(),
                self.broken()
                    .map(|b| format!("; watch broke: {b}"))
                    .unwrap_or_default()
            )),
        }
    }
}

/// etcd's index in an error answer (a read of a missing key).
fn e_index(e: &rebootd::clients::etcd_v2::V2Error) -> u64 {
    match e {
        rebootd::clients::etcd_v2::V2Error::Etcd { index, .. } => *index,
        _ => 0,
    }
}

fn plain_client(endpoint: &str) -> Result<KeysClient, String> {
    KeysClient::new(&Settings {
        endpoints: vec![endpoint.to_owned()],
        tls: TlsFiles {
            table: "lab",
            ..TlsFiles::default()
        },
        basic_auth: None,
        timeouts: Timeouts::default(),
    })
    .map_err(|e| e.to_string())
}

/// Wait until the v2 directory `dir` (on the plain-http etcd at `endpoint`) holds at least `n`
/// keys: a read, then a watch from the read's index, again until it does. Their values, in key
/// order.
pub async fn wait_dir_len(
    endpoint: &str,
    dir: &str,
    n: usize,
    timeout: Duration,
) -> Result<Vec<String>, String> {
    let client = plain_client(endpoint)?;
    let wait = async {
        loop {
            let get = Get {
                recursive: true,
                sorted: true,
                ..Get::default()
            };
            let (values, index) = match client.get(dir, get).await {
                Ok(r) => (
                    r.node
                        .leaves()
                        .iter()
                        .filter(|l| l.key != dir)
                        .map(|l| l.value.clone().unwrap_or_default())
                        .collect::<Vec<_>>(),
                    r.etcd_index,
                ),
                Err(e) if e.is_key_not_found() => (Vec::new(), e_index(&e)),
                Err(e) => return Err(e.to_string()),
            };
            if values.len() >= n {
                return Ok(values);
            }
            client
                .watch(dir, true, index + 1)
                .await
                .map_err(|e| e.to_string())?;
        }
    };
    tokio::time::timeout(timeout, wait)
        .await
        .map_err(|_| format!("{dir} never held {n} keys within {timeout:?}"))?
}

/// Let `ttl` of etcd's own time pass, without sleeping here: a key under `/lab/clock/` with that
/// TTL, its expiry awaited by watch. Costs etcd two v2 requests (the key and the watch).
pub async fn etcd_clock(endpoint: &str, ttl: Duration) -> Result<(), String> {
    let client = plain_client(endpoint)?;
    let created = client
        .create_in_order("/lab/clock", "tick", Some(ttl))
        .await
        .map_err(|e| e.to_string())?;
    let mut from = created.node.modified_index + 1;
    loop {
        match client.watch(&created.node.key, false, from).await {
            Ok(Some(event)) if event.action.removes() => return Ok(()),
            Ok(Some(event)) => from = event.node.modified_index + 1,
            Ok(None) => {}
            Err(e) => return Err(e.to_string()),
        }
    }
}
