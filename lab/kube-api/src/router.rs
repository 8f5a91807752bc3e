//! Request paths to routes: discovery documents, health, or a resource (kind, namespace, name,
//! subresource).

use crate::error::ApiError;
use crate::kind::Kind;

#[derive(Debug, Clone, PartialEq)]
pub enum Route {
    Version,
    Health,
    /// `/api`
    ApiVersions,
    /// `/apis`
    ApiGroupList,
    /// `/apis/<group>`
    ApiGroup(String),
    /// `/api/v1`, `/apis/<group>/<version>`
    ResourceList {
        group: String,
        version: String,
    },
    Resource(ResourceRoute),
    /// `/openapi/v3`
    OpenApiRoot,
    /// `/openapi/v3/<api/v1 | apis/group/version>`
    OpenApiGroupVersion(String),
}

#[derive(Debug, Clone, PartialEq)]
pub struct ResourceRoute {
    pub kind: Kind,
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub sub: Option<String>,
}

/// Parse a request path.
pub fn parse(path: &str) -> Result<Route, ApiError> {
    let segs: Vec<&str> = path
        .trim_matches('/')
        .split('/')
        .filter(|s| !s.is_empty())
        .collect();
    match segs.as_slice() {
        ["version"] => Ok(Route::Version),
        ["healthz" | "readyz" | "livez", ..] => Ok(Route::Health),
        ["api"] => Ok(Route::ApiVersions),
        ["api", v] => Ok(Route::ResourceList {
            group: String::new(),
            version: v.to_string(),
        }),
        ["api", v, rest @ ..] => resource("", v, rest),
        ["openapi", "v3"] => Ok(Route::OpenApiRoot),
        ["openapi", "v3", rest @ ..] => Ok(Route::OpenApiGroupVersion(rest.join("/"))),
        ["apis"] => Ok(Route::ApiGroupList),
        ["apis", g] => Ok(Route::ApiGroup(g.to_string())),
        ["apis", g, v] => Ok(Route::ResourceList {
            group: g.to_string(),
            version: v.to_string(),
        }),
        ["apis", g, v, rest @ ..] => resource(g, v, rest),
        _ => Err(ApiError::no_route()),
    }
}

fn resource(group: &str, version: &str, rest: &[&str]) -> Result<Route, ApiError> {
    let namespaced_path = rest.first() == Some(&"namespaces")
        && rest.len() >= 3
        && !(rest.len() == 3 && matches!(rest[2], "status" | "finalize"));
    let (namespace, rest) = if namespaced_path {
        (Some(rest[1].to_string()), &rest[2..])
    } else {
        (None, rest)
    };
    if rest.is_empty() || rest.len() > 3 {
        return Err(ApiError::no_route());
    }
    let kind = Kind::lookup(group, version, rest[0]).ok_or_else(ApiError::no_route)?;
    let name = rest.get(1).map(|s| s.to_string());
    let sub = rest.get(2).map(|s| s.to_string());
    if namespace.is_some() && !kind.namespaced() {
        return Err(ApiError::no_route());
    }
    if namespace.is_none() && kind.namespaced() && name.is_some() {
        return Err(ApiError::no_route());
    }
    if let Some(s) = &sub {
        let ok = (s == "status" && kind.def().status_subresource)
            || (s == "eviction" && kind == Kind::Pod);
        if !ok {
            return Err(ApiError::no_route());
        }
    }
    Ok(Route::Resource(ResourceRoute {
        kind,
        namespace,
        name,
        sub,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn res(p: &str) -> Option<ResourceRoute> {
        match parse(p) {
            Ok(Route::Resource(r)) => Some(r),
            _ => None,
        }
    }

    #[test]
    fn paths() {
        assert_eq!(parse("/version"), Ok(Route::Version));
        assert_eq!(parse("/api"), Ok(Route::ApiVersions));
        let r = res("/api/v1/namespaces/default/pods/web-1/eviction");
        assert_eq!(
            r,
            Some(ResourceRoute {
                kind: Kind::Pod,
                namespace: Some("default".into()),
                name: Some("web-1".into()),
                sub: Some("eviction".into()),
            })
        );
        assert_eq!(res("/api/v1/pods").map(|r| r.namespace), Some(None));
        assert_eq!(
            res("/api/v1/nodes/n1").map(|r| r.name),
            Some(Some("n1".into()))
        );
        assert_eq!(
            res("/api/v1/namespaces/kube-system").map(|r| (r.kind, r.name)),
            Some((Kind::Namespace, Some("kube-system".into())))
        );
        assert_eq!(
            res("/api/v1/namespaces/kube-system/status").map(|r| r.sub),
            Some(Some("status".into()))
        );
        assert_eq!(
            res("/apis/coordination.k8s.io/v1/namespaces/x/leases").map(|r| r.kind),
            Some(Kind::Lease)
        );
        assert!(res("/api/v1/namespaces/x/nodes").is_none());
        assert!(res("/api/v1/pods/x").is_none());
        assert!(res("/api/v1/namespaces/x/pods/p/log").is_none());
        assert!(res("/api/v1/namespaces/x/leases").is_none());
    }
}
