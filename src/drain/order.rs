//! The order in which a drain sends its evictions: the pods on the drain's critical path first.
//!
//! Every eviction is sent at once, but an API server works through them at its own pace, so
//! order matters: a pod under a PodDisruptionBudget usually holds back a sibling until its
//! replacement is Ready, and a pod with a long grace period is the last to go. Those go first:
//! pods a budget selects, then by grace period, longest first.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

/// The grace period a pod gets when neither it nor the drain sets one (Kubernetes' default).
const DEFAULT_GRACE_SECONDS: i64 = 30;

/// Sort key of one pod: greater goes first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Urgency {
    /// A PodDisruptionBudget selects it.
    budgeted: bool,
    /// Its grace period in seconds (the drain's override when set).
    grace_seconds: i64,
}

/// How urgent evicting `pod` is, given the budgets of the cluster and the drain's grace period
/// override.
pub(super) fn urgency(
    pod: &Pod,
    budgets: &[PodDisruptionBudget],
    grace_override: Option<i64>,
) -> Urgency {
    let grace_seconds = grace_override.unwrap_or_else(|| {
        pod.spec
            .as_ref()
            .and_then(|s| s.termination_grace_period_seconds)
            .unwrap_or(DEFAULT_GRACE_SECONDS)
    });
    let empty = BTreeMap::new();
    let labels = pod.metadata.labels.as_ref().unwrap_or(&empty);
    let budgeted = budgets.iter().any(|b| {
        b.metadata.namespace == pod.metadata.namespace
            && b.spec
                .as_ref()
                .and_then(|s| s.selector.as_ref())
                .is_some_and(|sel| selects(sel, labels))
    });
    Urgency {
        budgeted,
        grace_seconds,
    }
}

/// Whether a label selector selects these labels. An empty selector (`{}`) selects every pod
/// of the namespace, as a PodDisruptionBudget's does; an operator it does not know selects
/// nothing.
fn selects(sel: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    let by_labels = sel
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    by_labels
        && sel.match_expressions.iter().flatten().all(|e| {
            let values = e.values.as_deref().unwrap_or(&[]);
            let value = labels.get(&e.key);
            match e.operator.as_str() {
                "In" => value.is_some_and(|v| values.contains(v)),
                "NotIn" => value.is_none_or(|v| !values.contains(v)),
                "Exists" => value.is_some(),
                "DoesNotExist" => value.is_none(),
                _ => false,
            }
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::PodSpec;
    use k8s_openapi::api::policy::v1::PodDisruptionBudgetSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelectorRequirement, ObjectMeta};

    fn pod(ns: &str, labels: &[(&str, &str)], grace: Option<i64>) -> Pod {
        Pod {
            metadata: ObjectMeta {
                namespace: Some(ns.into()),
                labels: Some(
                    labels
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                ),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec {
                termination_grace_period_seconds: grace,
                ..PodSpec::default()
            }),
            ..Pod::default()
        }
    }

    fn budget(ns: &str, sel: LabelSelector) -> PodDisruptionBudget {
        PodDisruptionBudget {
            metadata: ObjectMeta {
                namespace: Some(ns.into()),
                ..ObjectMeta::default()
            },
            spec: Some(PodDisruptionBudgetSpec {
                selector: Some(sel),
                ..PodDisruptionBudgetSpec::default()
            }),
            ..PodDisruptionBudget::default()
        }
    }

    fn match_labels(k: &str, v: &str) -> LabelSelector {
        LabelSelector {
            match_labels: Some([(k.to_string(), v.to_string())].into()),
            ..LabelSelector::default()
        }
    }

    #[test]
    fn budgeted_pods_first_then_longest_grace() {
        let budgets = [budget("shop", match_labels("app", "db"))];
        let db = urgency(&pod("shop", &[("app", "db")], Some(5)), &budgets, None);
        let slow = urgency(&pod("shop", &[("app", "web")], Some(60)), &budgets, None);
        let quick = urgency(&pod("shop", &[("app", "web")], Some(1)), &budgets, None);
        let other_ns = urgency(&pod("other", &[("app", "db")], Some(5)), &budgets, None);
        let default_grace = urgency(&pod("shop", &[], None), &budgets, None);
        assert!(db > slow && slow > default_grace && default_grace > quick);
        assert!(!other_ns.budgeted, "a budget only covers its own namespace");
        let mut order = vec![quick, other_ns, db, slow];
        order.sort_by_key(|u| std::cmp::Reverse(*u));
        assert_eq!(order, vec![db, slow, other_ns, quick]);
        // The drain's override replaces every pod's own grace period.
        assert_eq!(
            urgency(&pod("shop", &[], Some(60)), &budgets, Some(2)).grace_seconds,
            2
        );
    }

    #[test]
    fn label_selectors_as_the_api_server_reads_them() {
        let labels: BTreeMap<String, String> = [("app", "db"), ("tier", "a")]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let expr = |key: &str, op: &str, values: &[&str]| LabelSelector {
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: key.into(),
                operator: op.into(),
                values: Some(values.iter().map(|v| v.to_string()).collect()),
            }]),
            ..LabelSelector::default()
        };
        assert!(
            selects(&LabelSelector::default(), &labels),
            "{{}} selects all"
        );
        assert!(selects(&match_labels("app", "db"), &labels));
        assert!(!selects(&match_labels("app", "web"), &labels));
        assert!(selects(&expr("tier", "In", &["a", "b"]), &labels));
        assert!(!selects(&expr("tier", "NotIn", &["a"]), &labels));
        assert!(selects(&expr("zone", "NotIn", &["x"]), &labels));
        assert!(selects(&expr("app", "Exists", &[]), &labels));
        assert!(!selects(&expr("app", "DoesNotExist", &[]), &labels));
        assert!(!selects(&expr("app", "Gt", &["1"]), &labels));
    }
}
