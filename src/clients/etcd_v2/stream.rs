//! A streaming watch's answer: etcd writes each event as one JSON document and a newline, and
//! flushes it, on an answer it keeps open.
//!
//! When the watch's index is already in etcd's history, etcd answers that one event and no
//! other on the stream (its watcher hub does not register a watcher that found its event in the
//! history). So an event not newer than the index etcd had when the stream opened ends the
//! stream here: the caller opens a new one after it, and, caught up, gets a live stream.

use std::time::Duration;

use bytes::Buf;
use http_body_util::BodyExt;
use hyper::body::Incoming;

use super::error::{At, V2Error};
use super::types::Response;

/// Longest event line kept before it is complete.
const LINE_MAX: usize = 16 * 1024 * 1024;

/// An open streaming watch ([`super::KeysClient::watch_stream`]).
pub struct WatchStream {
    at: At,
    body: Incoming,
    buf: Vec<u8>,
    /// etcd's index when the stream opened (its `X-Etcd-Index`).
    opened_at: u64,
    /// Longest silence before [`WatchStream::next`] says so.
    idle: Duration,
    ended: bool,
}

impl std::fmt::Debug for WatchStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WatchStream")
            .field("at", &self.at)
            .field("opened_at", &self.opened_at)
            .field("ended", &self.ended)
            .finish_non_exhaustive()
    }
}

impl WatchStream {
    pub(super) fn new(at: At, body: Incoming, opened_at: u64, idle: Duration) -> Self {
        WatchStream {
            at,
            body,
            buf: Vec::new(),
            opened_at,
            idle,
            ended: false,
        }
    }

    /// etcd's index when the stream opened: an event older than it came from the history.
    pub fn opened_at(&self) -> u64 {
        self.opened_at
    }

    /// Whether the stream is over (etcd closed it, or it was a one-event answer from the
    /// history): open a new one from the index after the last event.
    pub fn ended(&self) -> bool {
        self.ended
    }

    /// The next event. `Ok(None)`: nothing within the watch time limit, or the stream ended
    /// ([`WatchStream::ended`]); open a new one from the index after the last event. Cancel-safe:
    /// what was read stays buffered.
    pub async fn next(&mut self) -> Result<Option<Response>, V2Error> {
        loop {
            if let Some(line) = take_line(&mut self.buf) {
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                let event =
                    Response::parse(&line, self.opened_at).map_err(|reason| V2Error::NotEtcd {
                        at: self.at.clone(),
                        status: 200,
                        answer: reason.to_string(),
                    })?;
                if event.node.modified_index <= self.opened_at {
                    // From the history: etcd sends nothing more on this answer.
                    self.ended = true;
                }
                return Ok(Some(event));
            }
            if self.ended {
                return Ok(None);
            }
            match tokio::time::timeout(self.idle, self.body.frame()).await {
                Err(_) => return Ok(None),
                Ok(None) => {
                    self.ended = true;
                    return Ok(None);
                }
                Ok(Some(Err(e))) => {
                    self.ended = true;
                    return Err(V2Error::Unreachable {
                        at: self.at.clone(),
                        reason: format!("the watch stream broke: {e}"),
                    });
                }
                Ok(Some(Ok(frame))) => {
                    if let Ok(mut data) = frame.into_data() {
                        while data.has_remaining() {
                            let chunk = data.chunk();
                            self.buf.extend_from_slice(chunk);
                            let n = chunk.len();
                            data.advance(n);
                        }
                    }
                    if self.buf.len() > LINE_MAX {
                        self.ended = true;
                        return Err(V2Error::Unreachable {
                            at: self.at.clone(),
                            reason: format!("a watch event longer than {LINE_MAX} bytes"),
                        });
                    }
                }
            }
        }
    }
}

/// The first complete line of `buf` (without its newline), removed from it.
fn take_line(buf: &mut Vec<u8>) -> Option<Vec<u8>> {
    let end = buf.iter().position(|b| *b == b'\n')?;
    let mut line: Vec<u8> = buf.drain(..=end).collect();
    line.pop();
    Some(line)
}

#[cfg(test)]
mod tests {
    use super::take_line;

    #[test]
    fn lines_come_out_whole_and_in_order() {
        let mut buf = b"{\"a\":1}\n{\"b\"".to_vec();
        assert_eq!(take_line(&mut buf).as_deref(), Some(&b"{\"a\":1}"[..]));
        assert_eq!(take_line(&mut buf), None);
        buf.extend_from_slice(b":2}\n");
        assert_eq!(take_line(&mut buf).as_deref(), Some(&b"{\"b\":2}"[..]));
        assert!(buf.is_empty());
    }
}
