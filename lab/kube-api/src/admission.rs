//! Validating admission: every write that reaches the handlers (create, update, patch, delete,
//! eviction) is shown, before it is stored, to an optional hook as an AdmissionRequest
//! (admission.k8s.io/v1) with `object` and `oldObject` as the server would store them (the write
//! is first run as a dry run) and `userInfo.username` = the client's bearer token (the kubeconfig
//! user). An `Err` denies the write with 422 Invalid, as a ValidatingAdmissionPolicy with
//! `validationActions: [Deny]` does. Which policy the hook enforces is the caller's business (the
//! tests evaluate `deploy/kubernetes/admission-policy.yaml` with CEL).

use std::sync::Arc;

use serde_json::{json, Value};

use crate::error::ApiError;
use crate::kind::Kind;

/// The hook: an AdmissionRequest in, allowed (`Ok`) or denied with a message.
pub type AdmissionFn = dyn Fn(&Value) -> Result<(), String> + Send + Sync;

/// An admission hook for [`crate::Options::admission`].
#[derive(Clone)]
pub struct Admission(Arc<AdmissionFn>);

impl Admission {
    pub fn new(f: impl Fn(&Value) -> Result<(), String> + Send + Sync + 'static) -> Self {
        Admission(Arc::new(f))
    }
}

impl std::fmt::Debug for Admission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Admission(..)")
    }
}

/// What is being written, for [`review`].
pub struct Write<'a> {
    pub user: Option<&'a str>,
    pub operation: &'static str,
    pub kind: Kind,
    pub sub_resource: &'a str,
    pub namespace: &'a str,
    pub name: &'a str,
    pub old: Option<&'a Value>,
    pub new: Option<&'a Value>,
    pub dry_run: bool,
}

/// The AdmissionRequest for `w`.
pub fn request(w: &Write<'_>) -> Value {
    let d = w.kind.def();
    let (group, version, resource, kind_name) = if w.sub_resource == "eviction" {
        ("policy", "v1", "pods", "Eviction")
    } else {
        (d.group, d.version, d.plural, d.kind_name)
    };
    json!({
        "uid": "rebootd-lab",
        "kind": {"group": group, "version": version, "kind": kind_name},
        "resource": {"group": d.group, "version": d.version, "resource": if w.sub_resource == "eviction" { "pods" } else { resource }},
        "subResource": w.sub_resource,
        "requestKind": {"group": group, "version": version, "kind": kind_name},
        "requestResource": {"group": d.group, "version": d.version, "resource": d.plural},
        "requestSubResource": w.sub_resource,
        "name": w.name,
        "namespace": w.namespace,
        "operation": w.operation,
        "userInfo": {"username": w.user.unwrap_or("system:anonymous"), "groups": ["system:authenticated"]},
        "object": w.new.cloned().unwrap_or(Value::Null),
        "oldObject": w.old.cloned().unwrap_or(Value::Null),
        "dryRun": w.dry_run,
        "options": {},
    })
}

/// Runs the hook (if any) on `w`; a denial is 422 Invalid naming the write.
pub fn review(hook: Option<&Admission>, w: &Write<'_>) -> Result<(), ApiError> {
    let Some(Admission(f)) = hook else {
        return Ok(());
    };
    f(&request(w)).map_err(|message| {
        ApiError::new(
            422,
            "Invalid",
            format!(
                "{} \"{}\" is forbidden: ValidatingAdmissionPolicy denied request: {message}",
                w.kind.qualified_plural(),
                w.name
            ),
        )
    })
}
