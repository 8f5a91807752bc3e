//! Discovery documents: `/version`, `/api`, `/apis`, `/apis/<group>` and the resource lists of
//! each group version (legacy discovery; the aggregated v2 form is not served, clients fall
//! back to this).

use std::net::SocketAddr;

use serde_json::{json, Value};

use crate::error::ApiError;
use crate::kind::{Kind, ResourceDef};

/// The Kubernetes version the stand-in claims (kubectl warns beyond one minor of skew).
pub const MAJOR: &str = "1";
pub const MINOR: &str = "32";

pub fn version() -> Value {
    json!({
        "major": MAJOR,
        "minor": MINOR,
        "gitVersion": format!("v{MAJOR}.{MINOR}.0-rebootd-lab"),
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2025-01-01T00:00:00Z",
        "goVersion": "go1.23.0",
        "compiler": "gc",
        "platform": "linux/amd64",
    })
}

/// `/api`
pub fn api_versions(addr: SocketAddr) -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": addr.to_string()}],
    })
}

/// The API groups served (besides the core group), in discovery order.
fn groups() -> Vec<&'static str> {
    let mut out: Vec<&'static str> = Vec::new();
    for k in Kind::ALL {
        let g = k.def().group;
        if !g.is_empty() && !out.contains(&g) {
            out.push(g);
        }
    }
    out
}

fn group_doc(name: &str) -> Value {
    let gv = json!({"groupVersion": format!("{name}/v1"), "version": "v1"});
    json!({
        "name": name,
        "versions": [gv.clone()],
        "preferredVersion": gv,
    })
}

/// `/apis`
pub fn group_list() -> Value {
    let groups: Vec<Value> = groups().into_iter().map(group_doc).collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

/// `/apis/<group>`
pub fn group(name: &str) -> Result<Value, ApiError> {
    if !groups().contains(&name) {
        return Err(ApiError::no_route());
    }
    let mut g = group_doc(name);
    g["kind"] = json!("APIGroup");
    g["apiVersion"] = json!("v1");
    Ok(g)
}

fn resource_entry(d: &ResourceDef) -> Value {
    let mut r = json!({
        "name": d.plural,
        "singularName": d.singular,
        "namespaced": d.namespaced,
        "kind": d.kind_name,
        "verbs": d.kind.verbs(),
    });
    if !d.short_names.is_empty() {
        r["shortNames"] = json!(d.short_names);
    }
    if !d.categories.is_empty() {
        r["categories"] = json!(d.categories);
    }
    r
}

fn subresource(name: &str, d: &ResourceDef, kind: &str, verbs: &[&str]) -> Value {
    json!({
        "name": format!("{}/{}", d.plural, name),
        "singularName": "",
        "namespaced": d.namespaced,
        "kind": kind,
        "verbs": verbs,
    })
}

/// `/api/v1` or `/apis/<group>/<version>`
pub fn resource_list(group: &str, version: &str) -> Result<Value, ApiError> {
    let kinds: Vec<Kind> = Kind::ALL
        .into_iter()
        .filter(|k| k.def().group == group && k.def().version == version)
        .collect();
    if kinds.is_empty() {
        return Err(ApiError::no_route());
    }
    let mut resources = Vec::new();
    for k in kinds {
        let d = k.def();
        resources.push(resource_entry(d));
        if d.status_subresource {
            resources.push(subresource(
                "status",
                d,
                d.kind_name,
                &["get", "patch", "update"],
            ));
        }
        if k == Kind::Pod {
            // kubectl drain looks for exactly this entry to decide to evict rather than delete.
            let mut e = subresource("eviction", d, "Eviction", &["create"]);
            e["group"] = json!("policy");
            e["version"] = json!("v1");
            resources.push(e);
        }
    }
    let gv = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    Ok(json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": gv,
        "resources": resources,
    }))
}

/// Whether the Accept header leaves room for the legacy (plain JSON) discovery documents: an
/// Accept that only asks for aggregated discovery gets 406, so clients fall back.
pub fn accepts_legacy(accept: &str) -> bool {
    if accept.trim().is_empty() {
        return true;
    }
    accept.split(',').any(|part| {
        let mut it = part.split(';').map(str::trim);
        let media = it.next().unwrap_or("");
        let has_as = it.any(|p| p.starts_with("as="));
        !has_as && matches!(media, "application/json" | "*/*" | "application/*")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v1_lists_eviction() -> Result<(), ApiError> {
        let l = resource_list("", "v1")?;
        let names: Vec<&str> = l["resources"]
            .as_array()
            .map(|a| a.iter().filter_map(|r| r["name"].as_str()).collect())
            .unwrap_or_default();
        assert!(names.contains(&"pods/eviction"));
        assert!(names.contains(&"nodes"));
        assert!(resource_list("apps", "v2").is_err());
        assert_eq!(
            group("policy")?["preferredVersion"]["groupVersion"],
            "policy/v1"
        );
        Ok(())
    }

    #[test]
    fn accept() {
        let kubectl = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json";
        assert!(accepts_legacy(kubectl));
        assert!(!accepts_legacy(
            "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"
        ));
        assert!(accepts_legacy(""));
    }
}
