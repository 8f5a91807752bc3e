//! A client of etcd's v2 keys API (`/v2/keys`), where locksmith keeps its semaphore. It speaks
//! HTTP/1.1 JSON over the binary's one HTTP stack ([`crate::http`]): reads (recursive, sorted,
//! quorum), create (`prevExist=false`), compare-and-swap (`prevIndex`), delete (`prevIndex`),
//! TTL keys and their refresh (which keeps the key's index and wakes no watcher), in-order keys
//! (POST to a directory), long-poll watches (`wait=true&waitIndex=N`, one event per request) and
//! streaming watches (`stream=true`, every event on one answer, [`WatchStream`]).
//!
//! etcd keeps the last 1000 events only: a watch on an older index answers error 401 ("The event
//! in requested index is outdated and cleared"), [`V2Error::is_index_cleared`]; the caller reads
//! again and watches from the read's `X-Etcd-Index` plus one.
//!
//! etcd 3.4 and 3.5 serve v2 only when started with `--enable-v2=true`; without it (and in 3.6,
//! which has no v2) every `/v2/keys` request answers a plain-text `404 page not found` while
//! `/version` answers as etcd. That is [`V2Error::NoV2Api`], whose message names the endpoint,
//! the key and `--enable-v2`.
//!
//! v2 authentication (separate from v3's) is HTTP basic authentication, sent with every request.

mod client;
mod error;
mod options;
mod stream;
mod types;
mod version;

pub use client::{escape_path, Get, KeysClient, Put, Settings, Timeouts};
pub use error::{At, V2Error};
pub use stream::WatchStream;
pub use types::{code, Action, EtcdErrorBody, Node, Response};
