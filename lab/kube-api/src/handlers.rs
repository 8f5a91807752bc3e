//! The API verbs: discovery, get, list (selectors, pagination), watch, create, replace,
//! patch, delete, deletecollection and the eviction subresource, each answering like the real
//! server (status codes, `Status` bodies, list shapes).

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use hyper::{Method, Response};
use serde_json::{json, Value};

use crate::admission::{self, Admission, Write};
use crate::discovery;
use crate::error::{success_status, ApiError};
use crate::events;
use crate::http::{self, Body, Query};
use crate::kind::Kind;
use crate::meta;
use crate::openapi;
use crate::patch::{self, PatchType};
use crate::pdb;
use crate::router::{self, ResourceRoute, Route};
use crate::selector::{FieldSelector, LabelSelector};
use crate::store::{DeleteOptions, Store};
use crate::strategy;
use crate::table;
use crate::watch;

/// What the handlers share.
#[derive(Clone)]
pub struct Ctx {
    pub store: Store,
    pub addr: SocketAddr,
    pub bookmark_interval: Duration,
    /// Shown every write before it is stored (see [`crate::admission`]).
    pub admission: Option<Admission>,
}

/// One request, read whole.
pub struct Req {
    pub method: Method,
    pub path: String,
    pub query: Query,
    pub accept: String,
    pub content_type: String,
    pub body: Bytes,
    /// The bearer token, which names the client.
    pub user: Option<String>,
}

impl Req {
    fn dry_run(&self) -> bool {
        self.query.get("dryRun") == Some("All")
    }

    fn json_body(&self) -> Result<Value, ApiError> {
        serde_json::from_slice(&self.body)
            .map_err(|e| ApiError::bad_request(format!("the request body is not valid JSON: {e}")))
    }
}

/// Route and answer a request.
pub fn dispatch(ctx: &Ctx, req: &Req) -> Result<Response<Body>, ApiError> {
    let route = router::parse(&req.path)?;
    let discovery_doc = |v: Result<Value, ApiError>| -> Result<Response<Body>, ApiError> {
        if req.method != Method::GET {
            return Err(ApiError::method_not_allowed());
        }
        if !discovery::accepts_legacy(&req.accept) {
            return Err(ApiError::not_acceptable());
        }
        Ok(http::json(200, &v?))
    };
    match route {
        Route::Version => discovery_doc(Ok(discovery::version())),
        Route::Health => Ok(http::text(200, "ok")),
        Route::ApiVersions => discovery_doc(Ok(discovery::api_versions(ctx.addr))),
        Route::ApiGroupList => discovery_doc(Ok(discovery::group_list())),
        Route::ApiGroup(g) => discovery_doc(discovery::group(&g)),
        Route::ResourceList { group, version } => {
            discovery_doc(discovery::resource_list(&group, &version))
        }
        Route::Resource(r) => resource(ctx, req, r),
        Route::OpenApiRoot => discovery_doc(Ok(openapi::root())),
        Route::OpenApiGroupVersion(gv) => discovery_doc(openapi::group_version(&gv)),
    }
}

fn resource(ctx: &Ctx, req: &Req, r: ResourceRoute) -> Result<Response<Body>, ApiError> {
    let m = &req.method;
    match (r.name.as_deref(), r.sub.as_deref()) {
        (None, None) if *m == Method::GET => {
            if req.query.flag("watch") {
                watch::start(
                    &ctx.store,
                    r.kind,
                    r.namespace.clone(),
                    &req.query,
                    ctx.bookmark_interval,
                )
            } else {
                list(ctx, req, &r)
            }
        }
        (None, None) if *m == Method::POST => create(ctx, req, &r),
        (None, None) if *m == Method::DELETE => delete_collection(ctx, req, &r),
        (Some(name), None | Some("status")) if *m == Method::GET => get(ctx, req, &r, name),
        (Some(name), sub @ (None | Some("status"))) if *m == Method::PUT => {
            replace(ctx, req, &r, name, sub.is_some())
        }
        (Some(name), sub @ (None | Some("status"))) if *m == Method::PATCH => {
            patch(ctx, req, &r, name, sub.is_some())
        }
        (Some(name), None) if *m == Method::DELETE => delete(ctx, req, &r, name),
        (Some(name), Some("eviction")) if *m == Method::POST => evict(ctx, req, &r, name),
        _ => Err(ApiError::method_not_allowed()),
    }
}

/// The admission review of one write (a no-op without a hook).
#[allow(clippy::too_many_arguments)]
fn admit(
    ctx: &Ctx,
    req: &Req,
    operation: &'static str,
    kind: Kind,
    sub_resource: &str,
    (namespace, name): (&str, &str),
    old: Option<&Value>,
    new: Option<&Value>,
) -> Result<(), ApiError> {
    let view = |v: Option<&Value>| v.map(|v| events::to_view(kind, v.clone()));
    let (old, new) = (view(old), view(new));
    admission::review(
        ctx.admission.as_ref(),
        &Write {
            user: req.user.as_deref(),
            operation,
            kind,
            sub_resource,
            namespace,
            name,
            old: old.as_ref(),
            new: new.as_ref(),
            dry_run: req.dry_run(),
        },
    )
}

fn ns_of(r: &ResourceRoute) -> &str {
    r.namespace.as_deref().unwrap_or("")
}

/// Strip what list items do not carry on the real server.
fn as_item(mut v: Value) -> Value {
    if let Some(m) = v.as_object_mut() {
        m.remove("kind");
        m.remove("apiVersion");
    }
    v
}

fn get(ctx: &Ctx, req: &Req, r: &ResourceRoute, name: &str) -> Result<Response<Body>, ApiError> {
    let obj = ctx
        .store
        .read(|st| st.get(r.kind, ns_of(r), name).cloned())
        .ok_or_else(|| ApiError::not_found(r.kind, name))?;
    let view = events::to_view(r.kind, obj);
    if table::wanted(&req.accept) {
        return Ok(http::json(200, &table::render(r.kind, &[view], None)));
    }
    Ok(http::json(200, &view))
}

fn list(ctx: &Ctx, req: &Req, r: &ResourceRoute) -> Result<Response<Body>, ApiError> {
    let labels = LabelSelector::parse(req.query.get("labelSelector").unwrap_or(""))?;
    let fields = FieldSelector::parse(req.query.get("fieldSelector").unwrap_or(""), r.kind)?;
    let limit: usize = req
        .query
        .get("limit")
        .and_then(|l| l.parse().ok())
        .filter(|l| *l > 0)
        .unwrap_or(usize::MAX);
    let after: Option<(String, String)> =
        req.query
            .get("continue")
            .filter(|c| !c.is_empty())
            .map(|c| {
                let (ns, name) = c.split_once('/').unwrap_or(("", c));
                (ns.to_string(), name.to_string())
            });
    let (rv, mut items) = ctx.store.read(|st| {
        let items: Vec<Value> = st
            .iter(r.kind, r.namespace.as_deref())
            .filter(|o| labels.matches_object(o) && fields.matches(o))
            .filter(|o| {
                after.as_ref().is_none_or(|(ns, name)| {
                    (meta::namespace(o), meta::name(o)) > (ns.as_str(), name.as_str())
                })
            })
            .cloned()
            .collect();
        (st.resource_version(), items)
    });
    let mut metadata = json!({"resourceVersion": rv.to_string()});
    if items.len() > limit {
        let rest = items.split_off(limit);
        if let Some(last) = items.last() {
            metadata["continue"] = json!(format!("{}/{}", meta::namespace(last), meta::name(last)));
            metadata["remainingItemCount"] = json!(rest.len());
        }
    }
    let views: Vec<Value> = items
        .into_iter()
        .map(|o| events::to_view(r.kind, o))
        .collect();
    if table::wanted(&req.accept) {
        return Ok(http::json(
            200,
            &table::render(r.kind, &views, Some(metadata)),
        ));
    }
    Ok(http::json(
        200,
        &json!({
            "kind": format!("{}List", r.kind.kind_name()),
            "apiVersion": r.kind.api_version(),
            "metadata": metadata,
            "items": views.into_iter().map(as_item).collect::<Vec<_>>(),
        }),
    ))
}

/// Check a written object's type and namespace against the request, filling the namespace.
fn check_body(r: &ResourceRoute, obj: &mut Value) -> Result<(), ApiError> {
    if !obj.is_object() {
        return Err(ApiError::bad_request("the body must be a JSON object"));
    }
    let want = r.kind.api_version();
    if let Some(av) = obj.get("apiVersion").and_then(Value::as_str) {
        if av != want {
            return Err(ApiError::bad_request(format!(
                "the API version in the data ({av}) does not match the expected API version ({want})"
            )));
        }
    }
    if let Some(k) = obj.get("kind").and_then(Value::as_str) {
        if k != r.kind.kind_name() {
            return Err(ApiError::bad_request(format!(
                "the kind in the data ({k}) does not match the expected kind ({})",
                r.kind.kind_name()
            )));
        }
    }
    if let Some(ns) = &r.namespace {
        let body_ns = meta::namespace(obj).to_string();
        if body_ns.is_empty() {
            meta::metadata_mut(obj).insert("namespace".into(), json!(ns));
        } else if body_ns != *ns {
            return Err(ApiError::bad_request(
                "the namespace of the provided object does not match the namespace sent on the request",
            ));
        }
    }
    Ok(())
}

fn create(ctx: &Ctx, req: &Req, r: &ResourceRoute) -> Result<Response<Body>, ApiError> {
    if r.kind.namespaced() && r.namespace.is_none() {
        return Err(ApiError::method_not_allowed());
    }
    let mut obj = req.json_body()?;
    check_body(r, &mut obj)?;
    let mut stored = events::from_view(r.kind, obj);
    strategy::api_create(r.kind.storage(), &mut stored);
    let dry = req.dry_run();
    let out = ctx.store.write(|st| {
        if ctx.admission.is_some() {
            let preview = st.create(r.kind, stored.clone(), true)?;
            let at = (meta::namespace(&preview), meta::name(&preview));
            admit(ctx, req, "CREATE", r.kind, "", at, None, Some(&preview))?;
        }
        st.create(r.kind, stored, dry)
    })?;
    Ok(http::json(201, &events::to_view(r.kind, out)))
}

fn replace(
    ctx: &Ctx,
    req: &Req,
    r: &ResourceRoute,
    name: &str,
    status: bool,
) -> Result<Response<Body>, ApiError> {
    let mut obj = req.json_body()?;
    check_body(r, &mut obj)?;
    let body_name = meta::name(&obj);
    if body_name != name {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({body_name}) does not match the name on the URL ({name})"
        )));
    }
    let stored = events::from_view(r.kind, obj);
    let dry = req.dry_run();
    let ns = ns_of(r).to_string();
    let out = ctx.store.write(|st| {
        if ctx.admission.is_some() {
            let old = st.get(r.kind, &ns, name).cloned();
            let preview = st.update(r.kind, stored.clone(), status, true)?;
            let sub = if status { "status" } else { "" };
            admit(
                ctx,
                req,
                "UPDATE",
                r.kind,
                sub,
                (&ns, name),
                old.as_ref(),
                Some(&preview),
            )?;
        }
        st.update(r.kind, stored, status, dry)
    })?;
    Ok(http::json(200, &events::to_view(r.kind, out)))
}

fn patch(
    ctx: &Ctx,
    req: &Req,
    r: &ResourceRoute,
    name: &str,
    status: bool,
) -> Result<Response<Body>, ApiError> {
    let ty = PatchType::from_content_type(&req.content_type)?;
    let body: Value = serde_json::from_slice(&req.body).map_err(|e| {
        ApiError::bad_request(format!(
            "the patch is not valid JSON (the lab does not parse YAML): {e}"
        ))
    })?;
    let dry = req.dry_run();
    let kind = r.kind;
    let ns = ns_of(r).to_string();
    let out = ctx.store.write(|st| {
        let Some(cur) = st.get(kind, &ns, name).cloned() else {
            if ty == PatchType::Apply {
                let mut obj = body.clone();
                check_body(r, &mut obj)?;
                meta::metadata_mut(&mut obj).insert("name".into(), json!(name));
                let mut stored = events::from_view(kind, obj);
                strategy::api_create(kind.storage(), &mut stored);
                if ctx.admission.is_some() {
                    let preview = st.create(kind, stored.clone(), true)?;
                    admit(
                        ctx,
                        req,
                        "CREATE",
                        kind,
                        "",
                        (&ns, name),
                        None,
                        Some(&preview),
                    )?;
                }
                return st.create(kind, stored, dry);
            }
            return Err(ApiError::not_found(kind, name));
        };
        let view = events::to_view(kind, cur);
        let mut patched = patch::apply(ty, &view, &body)?;
        if meta::name(&patched) != name {
            return Err(ApiError::bad_request(
                "the name of the object cannot be changed by a patch",
            ));
        }
        check_body(r, &mut patched)?;
        let stored = events::from_view(kind, patched);
        if ctx.admission.is_some() {
            let old = st.get(kind, &ns, name).cloned();
            let preview = st.update(kind, stored.clone(), status, true)?;
            let sub = if status { "status" } else { "" };
            admit(
                ctx,
                req,
                "UPDATE",
                kind,
                sub,
                (&ns, name),
                old.as_ref(),
                Some(&preview),
            )?;
        }
        st.update(kind, stored, status, dry)
    })?;
    Ok(http::json(200, &events::to_view(kind, out)))
}

/// DeleteOptions from the body (if any) and the query.
fn delete_options(req: &Req) -> Result<DeleteOptions, ApiError> {
    let body: Value = if req.body.iter().all(u8::is_ascii_whitespace) {
        json!({})
    } else {
        req.json_body()?
    };
    Ok(options_from(&body, &req.query, req.dry_run()))
}

fn options_from(body: &Value, q: &Query, dry_run: bool) -> DeleteOptions {
    let grace = body
        .get("gracePeriodSeconds")
        .and_then(Value::as_i64)
        .or_else(|| q.get("gracePeriodSeconds").and_then(|s| s.parse().ok()));
    let policy = body
        .get("propagationPolicy")
        .and_then(Value::as_str)
        .or_else(|| q.get("propagationPolicy"));
    let orphan = policy == Some("Orphan")
        || body.get("orphanDependents").and_then(Value::as_bool) == Some(true);
    let body_dry = body
        .get("dryRun")
        .and_then(Value::as_array)
        .is_some_and(|a| a.iter().any(|x| x == "All"));
    DeleteOptions {
        grace_period_seconds: grace,
        uid: body
            .pointer("/preconditions/uid")
            .and_then(Value::as_str)
            .map(str::to_string),
        resource_version: body
            .pointer("/preconditions/resourceVersion")
            .and_then(Value::as_str)
            .map(str::to_string),
        orphan,
        dry_run: dry_run || body_dry,
    }
}

fn deleted_answer(kind: Kind, obj: Value) -> Response<Body> {
    if kind == Kind::Pod {
        return http::json(200, &obj);
    }
    let mut s = success_status(200);
    let d = kind.def();
    s["details"] = json!({"name": meta::name(&obj), "kind": d.plural, "uid": meta::uid(&obj)});
    if !d.group.is_empty() {
        s["details"]["group"] = json!(d.group);
    }
    http::json(200, &s)
}

fn delete(ctx: &Ctx, req: &Req, r: &ResourceRoute, name: &str) -> Result<Response<Body>, ApiError> {
    let opts = delete_options(req)?;
    let out = ctx.store.write(|st| {
        if ctx.admission.is_some() {
            if let Some(old) = st.get(r.kind, ns_of(r), name).cloned() {
                admit(
                    ctx,
                    req,
                    "DELETE",
                    r.kind,
                    "",
                    (ns_of(r), name),
                    Some(&old),
                    None,
                )?;
            }
        }
        st.delete(r.kind, ns_of(r), name, &opts)
    })?;
    Ok(deleted_answer(r.kind, events::to_view(r.kind, out)))
}

fn delete_collection(ctx: &Ctx, req: &Req, r: &ResourceRoute) -> Result<Response<Body>, ApiError> {
    let labels = LabelSelector::parse(req.query.get("labelSelector").unwrap_or(""))?;
    let fields = FieldSelector::parse(req.query.get("fieldSelector").unwrap_or(""), r.kind)?;
    let opts = delete_options(req)?;
    let deleted = ctx.store.write(|st| {
        let targets: Vec<(String, String)> = st
            .iter(r.kind, r.namespace.as_deref())
            .filter(|o| labels.matches_object(o) && fields.matches(o))
            .map(|o| (meta::namespace(o).to_string(), meta::name(o).to_string()))
            .collect();
        let mut out = Vec::new();
        for (ns, name) in targets {
            if let Some(old) = st.get(r.kind, &ns, &name).cloned() {
                admit(
                    ctx,
                    req,
                    "DELETE",
                    r.kind,
                    "",
                    (&ns, &name),
                    Some(&old),
                    None,
                )?;
            }
            if let Ok(o) = st.delete(r.kind, &ns, &name, &opts) {
                out.push(as_item(events::to_view(r.kind, o)));
            }
        }
        Ok::<_, ApiError>((st.resource_version(), out))
    })?;
    Ok(http::json(
        200,
        &json!({
            "kind": format!("{}List", r.kind.kind_name()),
            "apiVersion": r.kind.api_version(),
            "metadata": {"resourceVersion": deleted.0.to_string()},
            "items": deleted.1,
        }),
    ))
}

fn evict(ctx: &Ctx, req: &Req, r: &ResourceRoute, name: &str) -> Result<Response<Body>, ApiError> {
    let body: Value = if req.body.iter().all(u8::is_ascii_whitespace) {
        json!({})
    } else {
        req.json_body()?
    };
    let body_name = meta::name(&body);
    if !body_name.is_empty() && body_name != name {
        return Err(ApiError::bad_request(
            "name in URL does not match name in Eviction object",
        ));
    }
    let opts = options_from(
        body.get("deleteOptions").unwrap_or(&json!({})),
        &req.query,
        req.dry_run(),
    );
    let mut eviction = body.clone();
    if let Some(m) = eviction.as_object_mut() {
        m.insert("apiVersion".into(), json!("policy/v1"));
        m.insert("kind".into(), json!("Eviction"));
    }
    ctx.store.write(|st| {
        admission::review(
            ctx.admission.as_ref(),
            &Write {
                user: req.user.as_deref(),
                operation: "CREATE",
                kind: Kind::Pod,
                sub_resource: "eviction",
                namespace: ns_of(r),
                name,
                old: None,
                new: Some(&eviction),
                dry_run: req.dry_run(),
            },
        )?;
        pdb::evict(st, ns_of(r), name, &opts)
    })?;
    Ok(http::json(201, &success_status(201)))
}
