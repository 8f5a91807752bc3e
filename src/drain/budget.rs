//! Waking an eviction that a PodDisruptionBudget refused as soon as the budget allows a
//! disruption again, rather than on the retry timer alone: the time between a replacement
//! becoming Ready and the next pod's eviction is what a drain under budgets waits for.

use std::pin::Pin;

use futures_util::{Stream, StreamExt};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::Api;
use kube::runtime::watcher;

type Events =
    Pin<Box<dyn Stream<Item = Result<watcher::Event<PodDisruptionBudget>, watcher::Error>> + Send>>;

/// A watch on one PodDisruptionBudget, for one refused eviction.
pub(super) struct BudgetWatch {
    /// `namespace/name`, for logs.
    budget: String,
    /// None once the watch failed (no permission to watch budgets, say): the timer alone then.
    events: Option<Events>,
    /// The resourceVersion of the status that last woke the eviction: an eviction refused again
    /// at that status waits for a newer one, so a stale status cannot spin.
    used: Option<String>,
}

impl BudgetWatch {
    /// Starts lazily: nothing is sent before the first [`BudgetWatch::allows`] is polled.
    pub(super) fn new(client: kube::Client, namespace: &str, name: &str) -> BudgetWatch {
        let api: Api<PodDisruptionBudget> = Api::namespaced(client, namespace);
        let cfg = watcher::Config::default().fields(&format!("metadata.name={name}"));
        BudgetWatch {
            budget: format!("{namespace}/{name}"),
            events: Some(watcher(api, cfg).boxed()),
            used: None,
        }
    }

    /// `namespace/name` of the budget watched.
    pub(super) fn budget(&self) -> &str {
        &self.budget
    }

    /// Resolves once the budget's status allows a disruption, at a version that has not woken
    /// this eviction before; never, once the watch has failed.
    pub(super) async fn allows(&mut self) {
        loop {
            let Some(events) = self.events.as_mut() else {
                return std::future::pending().await;
            };
            match events.next().await {
                Some(Ok(watcher::Event::Apply(pdb) | watcher::Event::InitApply(pdb))) => {
                    if !disruption_allowed(&pdb) {
                        continue;
                    }
                    let version = pdb.metadata.resource_version.clone();
                    if version.is_some() && version != self.used {
                        self.used = version;
                        return;
                    }
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => {
                    tracing::info!(
                        "cannot watch PodDisruptionBudget {}: {e}; retrying the eviction on its timer only",
                        self.budget
                    );
                    self.events = None;
                }
                None => self.events = None,
            }
        }
    }
}

/// Whether the budget's status (as the eviction subresource reads it) allows one more
/// disruption.
fn disruption_allowed(pdb: &PodDisruptionBudget) -> bool {
    pdb.status
        .as_ref()
        .is_some_and(|s| s.disruptions_allowed > 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::policy::v1::PodDisruptionBudgetStatus;

    fn pdb(allowed: Option<i32>) -> PodDisruptionBudget {
        PodDisruptionBudget {
            status: allowed.map(|a| PodDisruptionBudgetStatus {
                disruptions_allowed: a,
                ..PodDisruptionBudgetStatus::default()
            }),
            ..PodDisruptionBudget::default()
        }
    }

    #[test]
    fn only_a_status_with_an_allowed_disruption_wakes() {
        assert!(!disruption_allowed(&pdb(None)));
        assert!(!disruption_allowed(&pdb(Some(0))));
        assert!(disruption_allowed(&pdb(Some(1))));
    }
}
