//! What the v2 keys API answers: nodes, actions and etcd's error documents. Pure parsing.

use serde::Deserialize;

/// One key or directory as etcd v2 returns it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Node {
    /// The full key, with its leading `/`.
    pub key: String,
    /// The value; `None` for a directory.
    #[serde(default)]
    pub value: Option<String>,
    #[serde(default)]
    pub dir: bool,
    /// Children of a directory read with `recursive=true` (or its direct children otherwise).
    #[serde(default)]
    pub nodes: Vec<Node>,
    /// The etcd index at which the key was created: the order of in-order keys.
    #[serde(default)]
    pub created_index: u64,
    /// The etcd index of the last change: what `prevIndex` compares.
    #[serde(default)]
    pub modified_index: u64,
    /// Seconds left to live, for a key with a TTL.
    #[serde(default)]
    pub ttl: Option<i64>,
}

impl Node {
    /// Every key (not directory) under this node, depth first, itself included if a key.
    pub fn leaves(&self) -> Vec<&Node> {
        let mut out = Vec::new();
        let mut stack = vec![self];
        while let Some(n) = stack.pop() {
            if n.dir {
                stack.extend(n.nodes.iter().rev());
            } else {
                out.push(n);
            }
        }
        out
    }
}

/// What a request did (`get`, `set`, `create`, `compareAndSwap`, `delete`, `compareAndDelete`,
/// `update`, `expire`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Get,
    Set,
    Create,
    Update,
    CompareAndSwap,
    Delete,
    CompareAndDelete,
    Expire,
    /// An action this client does not know (kept so a new etcd does not break a watch).
    Other,
}

impl Action {
    fn parse(s: &str) -> Action {
        match s {
            "get" => Action::Get,
            "set" => Action::Set,
            "create" => Action::Create,
            "update" => Action::Update,
            "compareAndSwap" => Action::CompareAndSwap,
            "delete" => Action::Delete,
            "compareAndDelete" => Action::CompareAndDelete,
            "expire" => Action::Expire,
            _ => Action::Other,
        }
    }

    /// Whether the key is gone after this action.
    pub fn removes(self) -> bool {
        matches!(
            self,
            Action::Delete | Action::CompareAndDelete | Action::Expire
        )
    }
}

/// A successful answer: the action, the node after it (before it, for removals etcd gives
/// the removed node without a value), the node before it, and `X-Etcd-Index` (etcd's index at
/// the time of the answer; for a watch, at the start of the watch).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    pub action: Action,
    pub node: Node,
    pub prev_node: Option<Node>,
    pub etcd_index: u64,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ResponseBody {
    action: String,
    node: Node,
    #[serde(default)]
    prev_node: Option<Node>,
}

/// A 2xx body that is not an answer of the v2 keys API (the caller quotes it, see
/// `V2Error::NotEtcd`).
#[derive(Debug, thiserror::Error)]
pub enum AnswerError {
    #[error("not an etcd v2 answer: {0}")]
    NotV2(serde_json::Error),
}

impl Response {
    /// Parse a 2xx body; `etcd_index` from the `X-Etcd-Index` header.
    pub fn parse(body: &[u8], etcd_index: u64) -> Result<Response, AnswerError> {
        let b: ResponseBody = serde_json::from_slice(body).map_err(AnswerError::NotV2)?;
        Ok(Response {
            action: Action::parse(&b.action),
            node: b.node,
            prev_node: b.prev_node,
            etcd_index,
        })
    }
}

/// etcd's error document, e.g. `{"errorCode":101,"message":"Compare failed","cause":"[3 !=
/// 4]","index":1105}`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EtcdErrorBody {
    pub error_code: u32,
    pub message: String,
    #[serde(default)]
    pub cause: String,
    #[serde(default)]
    pub index: u64,
}

/// etcd's v2 error codes this client acts on.
pub mod code {
    pub const KEY_NOT_FOUND: u32 = 100;
    pub const TEST_FAILED: u32 = 101;
    pub const NOT_FILE: u32 = 102;
    pub const NOT_DIR: u32 = 104;
    pub const NODE_EXIST: u32 = 105;
    pub const UNAUTHORIZED: u32 = 110;
    pub const RAFT_INTERNAL: u32 = 300;
    pub const LEADER_ELECT: u32 = 301;
    /// "The event in requested index is outdated and cleared": the watch's `waitIndex` is older
    /// than the 1000 events etcd keeps.
    pub const EVENT_INDEX_CLEARED: u32 = 401;
    pub const WATCHER_CLEARED: u32 = 400;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_parse() {
        let r = Response::parse(
            br#"{"action":"compareAndSwap","node":{"key":"/a","value":"2","modifiedIndex":9,"createdIndex":4},"prevNode":{"key":"/a","value":"1","modifiedIndex":5,"createdIndex":4}}"#,
            9,
        )
        .unwrap();
        assert_eq!(r.action, Action::CompareAndSwap);
        assert_eq!(r.node.value.as_deref(), Some("2"));
        assert_eq!(r.prev_node.unwrap().modified_index, 5);

        let r = Response::parse(
            br#"{"action":"get","node":{"key":"/d","dir":true,"nodes":[{"key":"/d/x","dir":true,"nodes":[{"key":"/d/x/1","value":"a","modifiedIndex":3,"createdIndex":3}]},{"key":"/d/y","value":"b","ttl":9,"modifiedIndex":4,"createdIndex":4}],"modifiedIndex":2,"createdIndex":2}}"#,
            4,
        )
        .unwrap();
        let leaves: Vec<&str> = r.node.leaves().iter().map(|n| n.key.as_str()).collect();
        assert_eq!(leaves, ["/d/x/1", "/d/y"]);
        assert_eq!(r.node.leaves()[1].ttl, Some(9));

        let r = Response::parse(
            br#"{"action":"expire","node":{"key":"/q/7","modifiedIndex":12,"createdIndex":7},"prevNode":{"key":"/q/7","value":"w","modifiedIndex":7,"createdIndex":7}}"#,
            12,
        )
        .unwrap();
        assert!(r.action.removes());
        assert!(Response::parse(b"404 page not found", 0).is_err());
    }

    #[test]
    fn errors_parse() {
        let e: EtcdErrorBody = serde_json::from_slice(
            br#"{"errorCode":401,"message":"The event in requested index is outdated and cleared","cause":"the requested history has been cleared [105/2]","index":1104}"#,
        )
        .unwrap();
        assert_eq!(e.error_code, code::EVENT_INDEX_CLEARED);
        assert_eq!(e.index, 1104);
    }
}
