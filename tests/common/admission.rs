//! `deploy/kubernetes/admission-policy.yaml` evaluated as the API server evaluates a
//! ValidatingAdmissionPolicy (admissionregistration.k8s.io/v1): match constraints (resource
//! rules), match conditions, variables, validations, each a CEL expression run by the `cel`
//! crate (with the strings extension Kubernetes also loads) over the admission variables
//! `object`, `oldObject` and `request` built from an AdmissionRequest (admission.k8s.io/v1) JSON.
//!
//! Stricter than the API server in one way: variables are evaluated in order, eagerly, and an
//! error in any of them denies the request (the server evaluates them lazily), so the policy
//! must not contain an expression that errors on some request.

#![allow(dead_code)]

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use cel::{Context, Env, Program, Value as Cel};
use serde_json::Value;

/// One compiled expression and the text it came from.
struct Expr {
    text: String,
    program: Program,
}

struct Validation {
    expr: Expr,
    message: Option<String>,
    message_expr: Option<Expr>,
}

/// The policy, compiled.
pub struct Policy {
    env: Arc<Env>,
    rules: Vec<Value>,
    match_conditions: Vec<(String, Expr)>,
    variables: Vec<(String, Expr)>,
    validations: Vec<Validation>,
    pub binding: Value,
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A JSON value as CEL sees it: integers are `int`, other numbers `double`, objects maps.
pub fn to_cel(v: &Value) -> Cel {
    match v {
        Value::Null => Cel::Null,
        Value::Bool(b) => Cel::Bool(*b),
        Value::Number(n) => match n.as_i64() {
            Some(i) => Cel::Int(i),
            None => Cel::Float(n.as_f64().unwrap_or(f64::NAN)),
        },
        Value::String(s) => Cel::String(Arc::new(s.clone())),
        Value::Array(a) => Cel::List(Arc::new(a.iter().map(to_cel).collect())),
        Value::Object(o) => {
            let m: HashMap<String, Cel> = o.iter().map(|(k, v)| (k.clone(), to_cel(v))).collect();
            m.into()
        }
    }
}

impl Policy {
    /// Reads and compiles `deploy/kubernetes/admission-policy.yaml`.
    pub fn load() -> Policy {
        let path = repo().join("deploy/kubernetes/admission-policy.yaml");
        let text = std::fs::read_to_string(&path).unwrap();
        Policy::from_yaml(&text)
    }

    pub fn from_yaml(text: &str) -> Policy {
        let mut env = Env::stdlib();
        env.add_extension(cel::extensions::strings)
            .expect("strings extension");
        let env = Arc::new(env);
        let docs: Vec<Value> = serde_norway::Deserializer::from_str(text)
            .map(|d| serde::Deserialize::deserialize(d).unwrap())
            .collect();
        let policy = docs
            .iter()
            .find(|d| d["kind"] == "ValidatingAdmissionPolicy")
            .expect("a ValidatingAdmissionPolicy");
        let binding = docs
            .iter()
            .find(|d| d["kind"] == "ValidatingAdmissionPolicyBinding")
            .expect("a ValidatingAdmissionPolicyBinding")
            .clone();
        let compile = |text: &str| -> Expr {
            let program = env
                .compile(text)
                .unwrap_or_else(|e| panic!("CEL does not parse: {text}\n{e:?}"));
            Expr {
                text: text.to_string(),
                program,
            }
        };
        let spec = &policy["spec"];
        let named = |key: &str| -> Vec<(String, Expr)> {
            spec[key]
                .as_array()
                .map(|a| {
                    a.iter()
                        .map(|v| {
                            (
                                v["name"].as_str().unwrap().to_string(),
                                compile(v["expression"].as_str().unwrap()),
                            )
                        })
                        .collect()
                })
                .unwrap_or_default()
        };
        let match_conditions = named("matchConditions");
        let variables = named("variables");
        let validations = spec["validations"]
            .as_array()
            .expect("validations")
            .iter()
            .map(|v| Validation {
                expr: compile(v["expression"].as_str().unwrap()),
                message: v["message"].as_str().map(str::to_string),
                message_expr: v["messageExpression"].as_str().map(compile),
            })
            .collect();
        Policy {
            env: env.clone(),
            rules: spec["matchConstraints"]["resourceRules"]
                .as_array()
                .expect("resourceRules")
                .clone(),
            match_conditions,
            variables,
            validations,
            binding,
        }
    }

    /// Whether the resource rules select `req` (group, version, resource, operation).
    fn matches(&self, req: &Value) -> bool {
        let in_list = |list: &Value, v: &str| {
            list.as_array()
                .is_some_and(|a| a.iter().any(|x| x == v || x == "*"))
        };
        let res = &req["resource"];
        let resource = match req["subResource"].as_str().filter(|s| !s.is_empty()) {
            Some(sub) => format!("{}/{sub}", res["resource"].as_str().unwrap_or("")),
            None => res["resource"].as_str().unwrap_or("").to_string(),
        };
        self.rules.iter().any(|r| {
            in_list(&r["apiGroups"], res["group"].as_str().unwrap_or(""))
                && in_list(&r["apiVersions"], res["version"].as_str().unwrap_or(""))
                && in_list(&r["resources"], &resource)
                && in_list(&r["operations"], req["operation"].as_str().unwrap_or(""))
        })
    }

    /// Evaluates the policy on an AdmissionRequest: `Ok(true)` = admitted after the validations
    /// ran, `Ok(false)` = not selected (rules or match conditions), `Err(message)` = denied.
    pub fn admit(&self, req: &Value) -> Result<bool, String> {
        if !self.matches(req) {
            return Ok(false);
        }
        let mut ctx = Context::with_env(self.env.clone());
        ctx.add_variable_from_value("object", to_cel(&req["object"]));
        ctx.add_variable_from_value("oldObject", to_cel(&req["oldObject"]));
        ctx.add_variable_from_value("request", to_cel(req));
        for (name, c) in &self.match_conditions {
            match c.program.execute(&ctx) {
                Ok(Cel::Bool(true)) => {}
                Ok(Cel::Bool(false)) => return Ok(false),
                other => return Err(format!("match condition {name}: {other:?}")),
            }
        }
        let mut vars: HashMap<String, Cel> = HashMap::new();
        for (name, v) in &self.variables {
            ctx.add_variable_from_value("variables", vars.clone());
            let value = v
                .program
                .execute(&ctx)
                .map_err(|e| format!("variable {name} ({}) failed: {e:?}", v.text.trim()))?;
            if std::env::var_os("ADMISSION_DEBUG").is_some() {
                eprintln!("variables.{name} = {value:?}");
            }
            vars.insert(name.clone(), value);
        }
        ctx.add_variable_from_value("variables", vars);
        for val in &self.validations {
            match val.expr.program.execute(&ctx) {
                Ok(Cel::Bool(true)) => {}
                Ok(Cel::Bool(false)) => {
                    let msg = match &val.message_expr {
                        Some(m) => match m.program.execute(&ctx) {
                            Ok(Cel::String(s)) => s.to_string(),
                            other => format!("messageExpression failed: {other:?}"),
                        },
                        None => val
                            .message
                            .clone()
                            .unwrap_or_else(|| format!("failed: {}", val.expr.text.trim())),
                    };
                    return Err(msg);
                }
                other => {
                    return Err(format!(
                        "validation error ({}): {other:?}",
                        val.expr.text.trim()
                    ))
                }
            }
        }
        Ok(true)
    }

    /// Every expression's text (for coverage checks).
    pub fn validation_texts(&self) -> Vec<String> {
        self.validations
            .iter()
            .map(|v| v.expr.text.clone())
            .collect()
    }
}

/// An AdmissionRequest (admission.k8s.io/v1) as the API server builds it for a write.
pub fn request(
    user: &str,
    operation: &str,
    (group, version, resource): (&str, &str, &str),
    sub_resource: &str,
    old: Option<&Value>,
    new: Option<&Value>,
) -> Value {
    let obj = new.or(old).cloned().unwrap_or(Value::Null);
    let name = obj["metadata"]["name"].as_str().unwrap_or("").to_string();
    let namespace = obj["metadata"]["namespace"]
        .as_str()
        .unwrap_or("")
        .to_string();
    let kind = obj["kind"].as_str().unwrap_or("").to_string();
    serde_json::json!({
        "uid": "0",
        "kind": {"group": group, "version": version, "kind": kind},
        "resource": {"group": group, "version": version, "resource": resource},
        "subResource": sub_resource,
        "requestKind": {"group": group, "version": version, "kind": kind},
        "requestResource": {"group": group, "version": version, "resource": resource},
        "name": name,
        "namespace": namespace,
        "operation": operation,
        "userInfo": {"username": user, "groups": ["system:authenticated"]},
        "object": new.cloned().unwrap_or(Value::Null),
        "oldObject": old.cloned().unwrap_or(Value::Null),
        "dryRun": false,
        "options": {},
    })
}

/// Every AdmissionRequest the stand-in saw, with the policy's answer.
pub type Reviewed = Arc<std::sync::Mutex<Vec<(Value, Result<bool, String>)>>>;

/// An admission hook for the API stand-in that enforces the policy and records what it decided.
pub fn enforcing() -> (rebootd_lab::kube_api::Admission, Reviewed) {
    let seen: Reviewed = Arc::default();
    let log = seen.clone();
    // The CEL programs are not shared across threads: one compiled policy per thread.
    thread_local! {
        static POLICY: Policy = Policy::load();
    }
    let hook = rebootd_lab::kube_api::Admission::new(move |req: &Value| {
        let verdict = POLICY.with(|p| p.admit(req));
        log.lock().unwrap().push((req.clone(), verdict.clone()));
        verdict.map(|_| ())
    });
    (hook, seen)
}

/// The Kubernetes API stand-in enforcing the shipped policy, and every request it reviewed.
pub async fn enforcing_api() -> (rebootd_lab::kube_api::KubeApiHandle, Reviewed) {
    let (hook, reviewed) = enforcing();
    let api = rebootd_lab::kube_api::KubeApi::start(rebootd_lab::kube_api::Options {
        admission: Some(hook),
        ..Default::default()
    })
    .await
    .expect("start the API stand-in");
    (api, reviewed)
}

/// A kubeconfig in `dir` with node `node`'s identity (user `rebootd:node:<node>`) on `api`.
pub fn kubeconfig_as(
    api: &rebootd_lab::kube_api::KubeApiHandle,
    dir: &std::path::Path,
    node: &str,
) -> PathBuf {
    let path = dir.join(format!("kubeconfig-{node}"));
    api.write_kubeconfig_for(&path, &format!("rebootd:node:{node}"))
        .expect("kubeconfig");
    path
}

/// A client of `api` acting as node `node` (user `rebootd:node:<node>`), connected as rebootd
/// connects.
pub async fn client_as(api: &rebootd_lab::kube_api::KubeApiHandle, node: &str) -> kube::Client {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = kubeconfig_as(api, dir.path(), node);
    rebootd::kube_client::connect(Some(&path))
        .await
        .expect("kube client")
}

/// The requests the policy denied, one line each: who, what, which object, and why.
pub fn refused(reviewed: &Reviewed) -> Vec<String> {
    reviewed
        .lock()
        .unwrap()
        .iter()
        .filter_map(|(r, v)| {
            v.as_ref().err().map(|m| {
                format!(
                    "{} {} {} {}/{}: {m}",
                    r["userInfo"]["username"],
                    r["operation"],
                    r["resource"]["resource"],
                    r["namespace"],
                    r["name"]
                )
            })
        })
        .collect()
}
