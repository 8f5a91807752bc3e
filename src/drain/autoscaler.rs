//! The cluster autoscaler's courtesy: while rebootd holds a slot, its Node carries
//! `cluster-autoscaler.kubernetes.io/scale-down-disabled=true`, so the autoscaler does not
//! remove a node that is draining or rebooting (it would count the drained node as unneeded).
//!
//! Only where the annotation is absent: a value anyone else set (any value) is theirs and left
//! alone, and only the value rebootd sets is ever taken off. Both writes carry the
//! resourceVersion they were computed from, so an annotation added by someone else between the
//! read and the write is a conflict, read again, not overwritten. Whether rebootd added it is
//! the runtime's record (`State::scale_down_disabled`), written before the add, so it survives a
//! restart and the reboot itself. The admission policy (`deploy/kubernetes`) allows a node
//! identity exactly this on its own Node.

use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use serde_json::{json, Value};

use super::marks::read_modify_write;
use super::DrainError;

/// The annotation the cluster autoscaler reads on a Node.
pub const SCALE_DOWN_DISABLED: &str = "cluster-autoscaler.kubernetes.io/scale-down-disabled";

/// The value rebootd sets, and the only one it takes off.
pub const VALUE: &str = "true";

fn annotation(node: &Node) -> Option<&str> {
    node.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(SCALE_DOWN_DISABLED))
        .map(String::as_str)
}

fn guarded(node: &Node, value: Value) -> Value {
    json!({"metadata": {
        "resourceVersion": node.metadata.resource_version,
        "annotations": {SCALE_DOWN_DISABLED: value},
    }})
}

/// The merge patch that adds the annotation; `None` when it is there, whatever its value.
pub fn add_patch(node: &Node) -> Option<Value> {
    annotation(node)
        .is_none()
        .then(|| guarded(node, json!(VALUE)))
}

/// The merge patch that takes the annotation off; `None` when it is gone or holds another value
/// than rebootd's (someone changed it meanwhile: it is theirs now).
pub fn remove_patch(node: &Node) -> Option<Value> {
    (annotation(node) == Some(VALUE)).then(|| guarded(node, Value::Null))
}

/// Add the annotation where absent; whether it was added (`false`: it was there already).
pub async fn disable(nodes: &Api<Node>, name: &str) -> Result<bool, DrainError> {
    let added = read_modify_write(
        nodes,
        name,
        "disable the autoscaler's scale-down",
        add_patch,
    )
    .await?;
    if added {
        tracing::info!("node {name}: {SCALE_DOWN_DISABLED}={VALUE} while holding the slot");
    } else {
        tracing::info!("node {name}: {SCALE_DOWN_DISABLED} was there already; left alone");
    }
    Ok(added)
}

/// Take off the annotation rebootd added, if it still says rebootd's value.
pub async fn enable(nodes: &Api<Node>, name: &str) -> Result<(), DrainError> {
    if read_modify_write(
        nodes,
        name,
        "enable the autoscaler's scale-down",
        remove_patch,
    )
    .await?
    {
        tracing::info!("node {name}: {SCALE_DOWN_DISABLED} taken off after the slot");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(annotations: Value) -> Node {
        serde_json::from_value(json!({
            "metadata": {"name": "n", "resourceVersion": "7", "annotations": annotations},
        }))
        .unwrap()
    }

    #[test]
    fn added_only_where_absent_and_removed_only_with_rebootds_value() {
        let absent = node(json!({"rebootd.io/phase": "draining"}));
        assert_eq!(
            add_patch(&absent),
            Some(json!({"metadata": {"resourceVersion": "7",
                "annotations": {SCALE_DOWN_DISABLED: "true"}}}))
        );
        assert_eq!(remove_patch(&absent), None);
        for theirs in ["true", "false", ""] {
            let n = node(json!({SCALE_DOWN_DISABLED: theirs}));
            assert_eq!(add_patch(&n), None, "{theirs:?} is left alone");
        }
        let ours = node(json!({SCALE_DOWN_DISABLED: "true"}));
        assert_eq!(
            remove_patch(&ours),
            Some(json!({"metadata": {"resourceVersion": "7",
                "annotations": {SCALE_DOWN_DISABLED: null}}}))
        );
        let changed = node(json!({SCALE_DOWN_DISABLED: "false"}));
        assert_eq!(remove_patch(&changed), None, "changed by someone: theirs");
    }
}
