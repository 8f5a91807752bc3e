//! The resource types the stand-in serves: names, groups, scopes and verbs, as discovery shows
//! them and as the router looks them up.

use std::fmt;

/// A resource type served by the stand-in.
///
/// `EventV1` (events.k8s.io/v1) is a view of the same storage as `Event` (core v1), converted
/// on the way in and out, as on a real server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    Namespace,
    Node,
    Pod,
    Event,
    ReplicaSet,
    DaemonSet,
    PodDisruptionBudget,
    Lease,
    EventV1,
    /// RBAC and admission objects: stored and served (so `kubectl apply` of rebootd's manifests
    /// works against the stand-in), neither enforced nor validated beyond names.
    ClusterRole,
    ClusterRoleBinding,
    Role,
    RoleBinding,
    ValidatingAdmissionPolicy,
    ValidatingAdmissionPolicyBinding,
}

/// Static description of one resource type.
#[derive(Debug)]
pub struct ResourceDef {
    pub kind: Kind,
    pub group: &'static str,
    pub version: &'static str,
    pub plural: &'static str,
    pub singular: &'static str,
    pub kind_name: &'static str,
    pub namespaced: bool,
    pub short_names: &'static [&'static str],
    pub categories: &'static [&'static str],
    /// Whether the type has a `status` subresource (writes to the main resource keep the
    /// stored status, writes to `/status` change only the status).
    pub status_subresource: bool,
    /// Whether `metadata.generation` is kept and bumped on spec changes.
    pub has_generation: bool,
}

const VERBS: &[&str] = &[
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];

impl Kind {
    /// Every kind, in discovery order.
    pub const ALL: [Kind; 15] = [
        Kind::Namespace,
        Kind::Node,
        Kind::Pod,
        Kind::Event,
        Kind::ReplicaSet,
        Kind::DaemonSet,
        Kind::PodDisruptionBudget,
        Kind::Lease,
        Kind::EventV1,
        Kind::ClusterRole,
        Kind::ClusterRoleBinding,
        Kind::Role,
        Kind::RoleBinding,
        Kind::ValidatingAdmissionPolicy,
        Kind::ValidatingAdmissionPolicyBinding,
    ];

    /// The static description of this kind.
    pub fn def(self) -> &'static ResourceDef {
        match self {
            Kind::Namespace => &NAMESPACE,
            Kind::Node => &NODE,
            Kind::Pod => &POD,
            Kind::Event => &EVENT,
            Kind::ReplicaSet => &REPLICASET,
            Kind::DaemonSet => &DAEMONSET,
            Kind::PodDisruptionBudget => &PDB,
            Kind::Lease => &LEASE,
            Kind::EventV1 => &EVENT_V1,
            Kind::ClusterRole => &CLUSTER_ROLE,
            Kind::ClusterRoleBinding => &CLUSTER_ROLE_BINDING,
            Kind::Role => &ROLE,
            Kind::RoleBinding => &ROLE_BINDING,
            Kind::ValidatingAdmissionPolicy => &VAP,
            Kind::ValidatingAdmissionPolicyBinding => &VAP_BINDING,
        }
    }

    /// The kind whose storage holds this kind's objects.
    pub fn storage(self) -> Kind {
        match self {
            Kind::EventV1 => Kind::Event,
            k => k,
        }
    }

    /// `v1`, `apps/v1`, ...
    pub fn api_version(self) -> String {
        let d = self.def();
        if d.group.is_empty() {
            d.version.to_string()
        } else {
            format!("{}/{}", d.group, d.version)
        }
    }

    /// `Pod`, `Lease`, ...
    pub fn kind_name(self) -> &'static str {
        self.def().kind_name
    }

    /// Whether objects of this kind live in a namespace.
    pub fn namespaced(self) -> bool {
        self.def().namespaced
    }

    /// `pods`, `leases.coordination.k8s.io`: the name used in error messages.
    pub fn qualified_plural(self) -> String {
        let d = self.def();
        if d.group.is_empty() {
            d.plural.to_string()
        } else {
            format!("{}.{}", d.plural, d.group)
        }
    }

    /// Look a kind up by group, version and plural resource name.
    pub fn lookup(group: &str, version: &str, plural: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| {
            let d = k.def();
            d.group == group && d.version == version && d.plural == plural
        })
    }

    /// The verbs discovery lists for this kind.
    pub fn verbs(self) -> &'static [&'static str] {
        VERBS
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.kind_name())
    }
}

static NAMESPACE: ResourceDef = ResourceDef {
    kind: Kind::Namespace,
    group: "",
    version: "v1",
    plural: "namespaces",
    singular: "namespace",
    kind_name: "Namespace",
    namespaced: false,
    short_names: &["ns"],
    categories: &[],
    status_subresource: true,
    has_generation: false,
};
static NODE: ResourceDef = ResourceDef {
    kind: Kind::Node,
    group: "",
    version: "v1",
    plural: "nodes",
    singular: "node",
    kind_name: "Node",
    namespaced: false,
    short_names: &["no"],
    categories: &[],
    status_subresource: true,
    has_generation: false,
};
static POD: ResourceDef = ResourceDef {
    kind: Kind::Pod,
    group: "",
    version: "v1",
    plural: "pods",
    singular: "pod",
    kind_name: "Pod",
    namespaced: true,
    short_names: &["po"],
    categories: &["all"],
    status_subresource: true,
    has_generation: false,
};
static EVENT: ResourceDef = ResourceDef {
    kind: Kind::Event,
    group: "",
    version: "v1",
    plural: "events",
    singular: "event",
    kind_name: "Event",
    namespaced: true,
    short_names: &["ev"],
    categories: &[],
    status_subresource: false,
    has_generation: false,
};
static REPLICASET: ResourceDef = ResourceDef {
    kind: Kind::ReplicaSet,
    group: "apps",
    version: "v1",
    plural: "replicasets",
    singular: "replicaset",
    kind_name: "ReplicaSet",
    namespaced: true,
    short_names: &["rs"],
    categories: &["all"],
    status_subresource: true,
    has_generation: true,
};
static DAEMONSET: ResourceDef = ResourceDef {
    kind: Kind::DaemonSet,
    group: "apps",
    version: "v1",
    plural: "daemonsets",
    singular: "daemonset",
    kind_name: "DaemonSet",
    namespaced: true,
    short_names: &["ds"],
    categories: &["all"],
    status_subresource: true,
    has_generation: true,
};
static PDB: ResourceDef = ResourceDef {
    kind: Kind::PodDisruptionBudget,
    group: "policy",
    version: "v1",
    plural: "poddisruptionbudgets",
    singular: "poddisruptionbudget",
    kind_name: "PodDisruptionBudget",
    namespaced: true,
    short_names: &["pdb"],
    categories: &[],
    status_subresource: true,
    has_generation: true,
};
static LEASE: ResourceDef = ResourceDef {
    kind: Kind::Lease,
    group: "coordination.k8s.io",
    version: "v1",
    plural: "leases",
    singular: "lease",
    kind_name: "Lease",
    namespaced: true,
    short_names: &[],
    categories: &[],
    status_subresource: false,
    has_generation: false,
};
static EVENT_V1: ResourceDef = ResourceDef {
    kind: Kind::EventV1,
    group: "events.k8s.io",
    version: "v1",
    plural: "events",
    singular: "event",
    kind_name: "Event",
    namespaced: true,
    short_names: &["ev"],
    categories: &[],
    status_subresource: false,
    has_generation: false,
};

static CLUSTER_ROLE: ResourceDef = ResourceDef {
    kind: Kind::ClusterRole,
    group: "rbac.authorization.k8s.io",
    version: "v1",
    plural: "clusterroles",
    singular: "clusterrole",
    kind_name: "ClusterRole",
    namespaced: false,
    short_names: &[],
    categories: &[],
    status_subresource: false,
    has_generation: false,
};
static CLUSTER_ROLE_BINDING: ResourceDef = ResourceDef {
    kind: Kind::ClusterRoleBinding,
    group: "rbac.authorization.k8s.io",
    version: "v1",
    plural: "clusterrolebindings",
    singular: "clusterrolebinding",
    kind_name: "ClusterRoleBinding",
    namespaced: false,
    short_names: &[],
    categories: &[],
    status_subresource: false,
    has_generation: false,
};
static ROLE: ResourceDef = ResourceDef {
    kind: Kind::Role,
    group: "rbac.authorization.k8s.io",
    version: "v1",
    plural: "roles",
    singular: "role",
    kind_name: "Role",
    namespaced: true,
    short_names: &[],
    categories: &[],
    status_subresource: false,
    has_generation: false,
};
static ROLE_BINDING: ResourceDef = ResourceDef {
    kind: Kind::RoleBinding,
    group: "rbac.authorization.k8s.io",
    version: "v1",
    plural: "rolebindings",
    singular: "rolebinding",
    kind_name: "RoleBinding",
    namespaced: true,
    short_names: &[],
    categories: &[],
    status_subresource: false,
    has_generation: false,
};
static VAP: ResourceDef = ResourceDef {
    kind: Kind::ValidatingAdmissionPolicy,
    group: "admissionregistration.k8s.io",
    version: "v1",
    plural: "validatingadmissionpolicies",
    singular: "validatingadmissionpolicy",
    kind_name: "ValidatingAdmissionPolicy",
    namespaced: false,
    short_names: &[],
    categories: &[],
    status_subresource: true,
    has_generation: true,
};
static VAP_BINDING: ResourceDef = ResourceDef {
    kind: Kind::ValidatingAdmissionPolicyBinding,
    group: "admissionregistration.k8s.io",
    version: "v1",
    plural: "validatingadmissionpolicybindings",
    singular: "validatingadmissionpolicybinding",
    kind_name: "ValidatingAdmissionPolicyBinding",
    namespaced: false,
    short_names: &[],
    categories: &[],
    status_subresource: false,
    has_generation: true,
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup_finds_every_kind() {
        for k in Kind::ALL {
            let d = k.def();
            assert_eq!(Kind::lookup(d.group, d.version, d.plural), Some(k));
        }
        assert_eq!(Kind::lookup("", "v1", "secrets"), None);
    }

    #[test]
    fn names() {
        assert_eq!(Kind::Lease.api_version(), "coordination.k8s.io/v1");
        assert_eq!(Kind::Pod.api_version(), "v1");
        assert_eq!(Kind::Lease.qualified_plural(), "leases.coordination.k8s.io");
        assert_eq!(Kind::EventV1.storage(), Kind::Event);
    }
}
