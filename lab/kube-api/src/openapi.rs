//! A minimal OpenAPI v3 (`/openapi/v3` and one document per group version): only what kubectl
//! reads to learn that the server supports the `fieldValidation` query parameter, so
//! `kubectl create/replace -f` validates on the server instead of downloading full schemas.
//! No schemas are served.

use serde_json::{json, Map, Value};

use crate::error::ApiError;
use crate::kind::Kind;

fn gv_path(group: &str, version: &str) -> String {
    if group.is_empty() {
        format!("api/{version}")
    } else {
        format!("apis/{group}/{version}")
    }
}

/// `/openapi/v3`
pub fn root() -> Value {
    let mut paths = Map::new();
    for k in Kind::ALL {
        let d = k.def();
        let p = gv_path(d.group, d.version);
        paths.insert(
            p.clone(),
            json!({"serverRelativeURL": format!("/openapi/v3/{p}?hash=rebootd-lab")}),
        );
    }
    json!({ "paths": paths })
}

/// `/openapi/v3/api/v1`, `/openapi/v3/apis/<group>/<version>`
pub fn group_version(rest: &str) -> Result<Value, ApiError> {
    let mut paths = Map::new();
    for k in Kind::ALL {
        let d = k.def();
        if gv_path(d.group, d.version) != rest {
            continue;
        }
        let item = if d.namespaced {
            format!("/{rest}/namespaces/{{namespace}}/{}/{{name}}", d.plural)
        } else {
            format!("/{rest}/{}/{{name}}", d.plural)
        };
        paths.insert(
            item,
            json!({"patch": {
                "x-kubernetes-group-version-kind": {"group": d.group, "version": d.version, "kind": d.kind_name},
                "parameters": [
                    {"name": "fieldValidation", "in": "query", "schema": {"type": "string"}},
                    {"name": "dryRun", "in": "query", "schema": {"type": "string"}},
                ],
                "responses": {"200": {"description": "OK"}},
            }}),
        );
    }
    if paths.is_empty() {
        return Err(ApiError::no_route());
    }
    Ok(json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes (rebootd lab)", "version": "v1.32.0"},
        "paths": paths,
        "components": {"schemas": {}},
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documents() -> Result<(), ApiError> {
        assert!(root()["paths"]["apis/coordination.k8s.io/v1"]["serverRelativeURL"].is_string());
        let d = group_version("apis/coordination.k8s.io/v1")?;
        let p = &d["paths"]["/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{name}"];
        assert_eq!(
            p["patch"]["x-kubernetes-group-version-kind"]["kind"],
            "Lease"
        );
        assert!(group_version("apis/nope/v1").is_err());
        Ok(())
    }
}
