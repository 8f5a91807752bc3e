//! Errors of the v2 keys client. Each names the endpoint, the request and the key.

use super::types::code;

/// Where a v2 error happened: the endpoint, the HTTP method and the key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct At {
    pub endpoint: String,
    pub method: &'static str,
    pub key: String,
}

impl std::fmt::Display for At {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {} at {}", self.method, self.key, self.endpoint)
    }
}

/// What went wrong talking to etcd's v2 keys API.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum V2Error {
    /// A setting the client cannot be built with (names the key and the file).
    #[error("{0}")]
    Setting(String),
    /// No answer: connection refused or reset, a timeout, TLS failure.
    #[error("cannot reach etcd ({at}): {reason}")]
    Unreachable { at: At, reason: String },
    /// An etcd that does not serve v2 (3.4/3.5 without `--enable-v2=true`, or 3.6): it answers
    /// every `/v2/keys` request with a plain `404 page not found`.
    #[error(
        "etcd {version} at {endpoint} does not serve the v2 keys API ({method} {key} answered \
         {answer:?}), where locksmith keeps its semaphore: start etcd 3.4 or 3.5 with \
         --enable-v2=true (etcd 3.6 has no v2 API; move the semaphore to v3 first, see \
         docs/migrating-from-locksmith.md)",
        endpoint = at.endpoint, method = at.method, key = at.key
    )]
    NoV2Api {
        at: At,
        /// What `/version` said, e.g. `3.5.1`.
        version: String,
        answer: String,
    },
    /// Something that is not etcd answered.
    #[error("{at}: not an etcd v2 keys API: HTTP {status}: {answer:?}")]
    NotEtcd { at: At, status: u16, answer: String },
    /// etcd's own error document (`errorCode`, `message`, `cause`).
    #[error("{at}: {message} (etcd error {code}{})", if cause.is_empty() { String::new() } else { format!(": {cause}") })]
    Etcd {
        at: At,
        code: u32,
        message: String,
        cause: String,
        /// etcd's index when it answered.
        index: u64,
    },
}

impl V2Error {
    /// etcd's error code, for [`V2Error::Etcd`].
    pub fn code(&self) -> Option<u32> {
        match self {
            V2Error::Etcd { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// The key does not exist (code 100).
    pub fn is_key_not_found(&self) -> bool {
        self.code() == Some(code::KEY_NOT_FOUND)
    }

    /// `prevIndex`/`prevValue` did not match (code 101, HTTP 412): someone changed the key.
    pub fn is_compare_failed(&self) -> bool {
        self.code() == Some(code::TEST_FAILED)
    }

    /// `prevExist=false` found the key (code 105).
    pub fn is_node_exists(&self) -> bool {
        self.code() == Some(code::NODE_EXIST)
    }

    /// A watch's `waitIndex` is older than the history etcd keeps (code 401): read again and
    /// watch from the index of that read.
    pub fn is_index_cleared(&self) -> bool {
        matches!(
            self.code(),
            Some(code::EVENT_INDEX_CLEARED | code::WATCHER_CLEARED)
        )
    }

    /// Whether trying again later may succeed: no answer, or etcd busy with its raft (3xx
    /// codes: leader election, internal errors).
    pub fn is_transient(&self) -> bool {
        match self {
            V2Error::Unreachable { .. } => true,
            V2Error::Etcd { code, .. } => (300..400).contains(code),
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at() -> At {
        At {
            endpoint: "http://127.0.0.1:2379".into(),
            method: "GET",
            key: "/coreos.com/updateengine/rebootlock/semaphore".into(),
        }
    }

    #[test]
    fn messages_name_endpoint_key_and_the_fix() {
        let e = V2Error::NoV2Api {
            at: at(),
            version: "3.5.1".into(),
            answer: "404 page not found".into(),
        };
        let m = e.to_string();
        for part in [
            "--enable-v2=true",
            "http://127.0.0.1:2379",
            "/coreos.com/updateengine/rebootlock/semaphore",
            "3.5.1",
        ] {
            assert!(m.contains(part), "{m}");
        }
        let e = V2Error::Etcd {
            at: at(),
            code: 101,
            message: "Compare failed".into(),
            cause: "[3 != 4]".into(),
            index: 9,
        };
        assert!(e.is_compare_failed() && !e.is_transient());
        assert!(e
            .to_string()
            .contains("Compare failed (etcd error 101: [3 != 4])"));
        let e = V2Error::Etcd {
            at: at(),
            code: 301,
            message: "During Leader Election".into(),
            cause: String::new(),
            index: 9,
        };
        assert!(e.is_transient());
    }
}
