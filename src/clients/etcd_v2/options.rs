//! What a v2 client is told: how to reach the cluster, its time limits, the options of a read
//! and a write, and how a key is written in a URL path.

use std::time::Duration;

use crate::http;

/// Time limits of the v2 client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// Opening a connection (TCP and TLS).
    pub connect: Duration,
    /// One request, to the end of its answer (a watch: to its headers, which etcd sends at once).
    pub request: Duration,
    /// How long one long-poll watch waits for an event before it is asked again (same index),
    /// so a peer that went away without closing the connection is noticed.
    pub watch: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            connect: Duration::from_secs(5),
            request: Duration::from_secs(10),
            watch: Duration::from_secs(300),
        }
    }
}

/// How to reach the cluster.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Settings {
    /// Client URLs, `http://host:port` or `https://host:port`; tried in order, the last one that
    /// answered first.
    pub endpoints: Vec<String>,
    /// CA and client certificate (`table` names the configuration table in errors).
    pub tls: http::TlsFiles,
    /// User name and password: v2 authentication is HTTP basic authentication.
    pub basic_auth: Option<(String, String)>,
    pub timeouts: Timeouts,
}

/// Options of a read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Get {
    /// A directory with everything under it.
    pub recursive: bool,
    /// Children in key order (in-order keys: creation order).
    pub sorted: bool,
    /// Through the raft leader (linearizable), not from the member's local store.
    pub quorum: bool,
}

/// Options of a write.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Put {
    /// Only if the key's `modifiedIndex` is this (compare-and-swap).
    pub prev_index: Option<u64>,
    /// `Some(false)`: only if the key does not exist (create); `Some(true)`: only if it does.
    pub prev_exist: Option<bool>,
    /// Time to live; the key is removed (an `expire` event) when it passes.
    pub ttl: Option<Duration>,
}

/// Percent-encode a key for the URL path: `/` separates, every byte but unreserved ones is
/// `%XX`, so a key holding `%` or `+` (locksmith escapes group names with Go's
/// `url.QueryEscape`) reaches etcd unchanged.
pub fn escape_path(key: &str) -> String {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let mut out = String::with_capacity(key.len());
    for &b in key.as_bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' | b'/' => {
                out.push(char::from(b))
            }
            _ => {
                out.push('%');
                out.push(char::from(HEX[usize::from(b >> 4)]));
                out.push(char::from(HEX[usize::from(b & 0x0f)]));
            }
        }
    }
    out
}
