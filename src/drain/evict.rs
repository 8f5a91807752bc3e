//! Evicting the pods on this host's node, as `kubectl drain` does it but with the waits visible:
//! 1. cordon (strategic merge patch `{"spec":{"unschedulable":true}}`, see `node_status`);
//! 2. list the pods on the node (`spec.nodeName=<node>`, see `pods`) and leave out DaemonSet pods
//!    (controller owner reference of kind DaemonSet), mirror pods (annotation
//!    `kubernetes.io/config.mirror`), finished pods (phase Succeeded or Failed) and the pods
//!    matching `skip_pods` (listed separately with that label selector and subtracted by uid);
//! 3. evict the others concurrently (policy/v1 Eviction with a uid precondition and the configured
//!    grace period); 404 means already gone, 409 that the uid precondition failed (checked: if the
//!    name now belongs to another pod, ours is gone, else the eviction is retried); 429 is a
//!    PodDisruptionBudget refusing for now: logged with the budget that blocks the pod (once per
//!    change), recorded as an `EvictionBlocked` Event, and retried as soon as a watch on that
//!    budget shows a disruption allowed (a replacement became Ready), else after 1 s, doubling
//!    up to 5 s (the timer alone when budgets cannot be watched);
//!    server errors and transport failures are retried the same way; any other answer fails the
//!    drain;
//! 4. wait, with one watch on the node's pods, until every pod evicted is gone *by uid* (a
//!    StatefulSet pod comes back with the same name);
//! 5. all of this within `drain_timeout`; past it the drain stops with [`DrainError::Timeout`]
//!    naming the pods still there (the node stays cordoned: the caller decides).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Mutex;
use std::time::Duration;

use futures_util::stream::FuturesUnordered;
use futures_util::{pin_mut, StreamExt};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::Eviction;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{DeleteOptions, ObjectMeta, Preconditions};
use kube::api::{Api, PostParams};
use kube::runtime::{watcher, WatchStreamExt};
use tokio::time::Instant;

use super::budget::BudgetWatch;
use super::pods::{name_list, pod_key, PodRef};
use super::{describe, lock, marks, DrainError, EventReason, KubeDrainer};
use crate::backoff::Backoff;
use crate::kube_client::status_code;

/// The first wait after a refused eviction; doubled after each refusal up to [`BACKOFF_MAX`].
const BACKOFF_START: Duration = Duration::from_secs(1);
/// kubectl drain retries every 5 s.
const BACKOFF_MAX: Duration = Duration::from_secs(5);
/// How often the pods still awaited are logged at info level.
const PROGRESS_EVERY: Duration = Duration::from_secs(5);

/// The PodDisruptionBudget named in a 429 refusal ("The disruption budget web needs 2 healthy
/// pods and has 1 currently"), and the cause's message.
fn blocking_budget(err: &kube::Error) -> Option<(Option<String>, String)> {
    let kube::Error::Api(s) = err else {
        return None;
    };
    let cause = s
        .details
        .as_ref()
        .and_then(|d| d.causes.iter().find(|c| c.reason == "DisruptionBudget"));
    match cause {
        Some(c) => {
            let name = c
                .message
                .strip_prefix("The disruption budget ")
                .and_then(|rest| rest.split_whitespace().next())
                .map(str::to_string);
            Some((name, c.message.clone()))
        }
        None if s.message.contains("disruption budget") => Some((None, s.message.clone())),
        None => None,
    }
}

fn is_retryable(err: &kube::Error) -> bool {
    match status_code(err) {
        Some(code) => code == 429 || code >= 500,
        // Transport errors (connection refused or reset, no answer within
        // `kube_client::REQUEST_LIMIT`): the server may come back.
        None => !matches!(
            err,
            kube::Error::SerdeError(_) | kube::Error::BuildRequest(_)
        ),
    }
}

/// What became of one eviction.
pub(super) enum Evicted {
    /// Accepted: the pod is terminating.
    Accepted,
    /// The pod (that uid) was already gone.
    Gone,
}

impl KubeDrainer {
    /// One eviction request for `pod` (by uid).
    async fn evict_once(&self, pod: &PodRef) -> Result<(), kube::Error> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &pod.namespace);
        let eviction = Eviction {
            metadata: ObjectMeta {
                name: Some(pod.name.clone()),
                namespace: Some(pod.namespace.clone()),
                ..ObjectMeta::default()
            },
            delete_options: Some(DeleteOptions {
                grace_period_seconds: self.pod_grace_period.map(|d| d.as_secs_f64().ceil() as i64),
                preconditions: Some(Preconditions {
                    uid: Some(pod.uid.clone()),
                    resource_version: None,
                }),
                ..DeleteOptions::default()
            }),
        };
        // kube's `Api::evict` sends its DeleteParams as `delete_options`, a field the API server
        // does not know (it is `deleteOptions`), so the grace period and preconditions would be
        // dropped: post the policy/v1 Eviction ourselves.
        // The answer on success (a Status) says nothing more: not looked at.
        let _: serde_json::Value = api
            .create_subresource("eviction", &pod.name, &PostParams::default(), &eviction)
            .await?;
        Ok(())
    }

    /// Whether the pod with this uid may still exist (after a 409 to its eviction); a failed
    /// read counts as "may".
    async fn still_there(&self, pod: &PodRef) -> bool {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &pod.namespace);
        match api.get_opt(&pod.name).await {
            Ok(Some(p)) => p.metadata.uid.as_deref() == Some(pod.uid.as_str()),
            Ok(None) => false,
            Err(_) => true,
        }
    }

    /// Evict `pod` until the API server accepts (or the pod is gone), retrying refusals by a
    /// PodDisruptionBudget and transient failures with backoff. Only returns an error that
    /// retrying cannot cure.
    #[tracing::instrument(level = "debug", skip_all, fields(node = %self.node, pod = %pod))]
    async fn evict(
        &self,
        pod: &PodRef,
        blocked: &Mutex<HashMap<String, String>>,
        force_at: Option<Instant>,
    ) -> Result<Evicted, DrainError> {
        let mut backoff = Backoff::new(BACKOFF_START, BACKOFF_MAX);
        let mut refusals = 0u32;
        let mut last_log: Option<String> = None;
        let mut last_budget: Option<Option<String>> = None;
        let mut budget_watch: Option<BudgetWatch> = None;
        loop {
            let err = match self.evict_once(pod).await {
                Ok(()) => {
                    if refusals > 0 {
                        tracing::info!(
                            "eviction of {} accepted after {refusals} refusal(s)",
                            pod.key()
                        );
                    } else {
                        tracing::info!("eviction of {} accepted", pod.key());
                    }
                    lock(blocked).remove(&pod.uid);
                    return Ok(Evicted::Accepted);
                }
                Err(e) => e,
            };
            match status_code(&err) {
                Some(404) => {
                    tracing::info!("{} is already gone", pod.key());
                    return Ok(Evicted::Gone);
                }
                Some(409) if !self.still_there(pod).await => {
                    // The uid precondition failed: the name belongs to another pod now.
                    tracing::info!(
                        "{} is gone (the name now belongs to another pod)",
                        pod.key()
                    );
                    return Ok(Evicted::Gone);
                }
                _ => {}
            }
            if !is_retryable(&err) && status_code(&err) != Some(409) {
                return Err(DrainError::api(format!("evict pod {}", pod.key()), err));
            }
            refusals += 1;
            let (why, budget) = match blocking_budget(&err) {
                Some((Some(b), cause)) => {
                    let key = format!("{}/{b}", pod.namespace);
                    if budget_watch.as_ref().map(BudgetWatch::budget) != Some(key.as_str()) {
                        budget_watch =
                            Some(BudgetWatch::new(self.client.clone(), &pod.namespace, &b));
                    }
                    (
                        format!("blocked by PodDisruptionBudget {key}: {cause}"),
                        Some(key),
                    )
                }
                Some((None, cause)) => (
                    format!("blocked by a PodDisruptionBudget: {cause}"),
                    Some(String::new()),
                ),
                None => (format!("refused: {}", describe(&err)), None),
            };
            lock(blocked).insert(pod.uid.clone(), why.clone());
            if let (Some(m), Some(_)) = (&self.metrics, &budget) {
                m.evictions_blocked(1);
            }
            if last_log.as_deref() != Some(why.as_str()) {
                tracing::warn!(
                    "eviction of {} {why}; retrying (at least every {}s) until the drain deadline",
                    pod.key(),
                    BACKOFF_MAX.as_secs()
                );
                last_log = Some(why.clone());
            }
            let by_budget = budget.is_some();
            if let (Some(at), true) = (force_at, by_budget) {
                if Instant::now() >= at {
                    let outcome = self.delete_past_budget(pod, &why).await?;
                    lock(blocked).remove(&pod.uid);
                    return Ok(outcome);
                }
            }
            if budget.is_some() && last_budget.as_ref() != Some(&budget) {
                let message = format!("Eviction of pod {} {why}", pod.key());
                let reason = EventReason::EvictionBlocked;
                if let Err(e) = self.record_event(reason, &message).await {
                    tracing::warn!("could not record the {reason} event: {e}");
                }
                last_budget = Some(budget);
            }
            // Again when the budget allows a disruption (a replacement became Ready), or on the
            // timer: it also covers refusals without a named budget and a budget we cannot watch.
            let wake = async {
                match budget_watch.as_mut() {
                    Some(w) => w.allows().await,
                    None => std::future::pending().await,
                }
            };
            let force = async {
                match force_at.filter(|_| by_budget) {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            // The pause grows only when it ran out: a retry the budget's watch woke keeps it.
            let mut after_pause = backoff.clone();
            let pause = after_pause.next_delay();
            tokio::select! {
                () = tokio::time::sleep(pause) => backoff = after_pause,
                () = force => {}
                () = wake => {
                    tracing::debug!("{}: the budget allows a disruption now; evicting again", pod.key());
                }
            }
        }
    }

    /// Cordon, evict, wait; without the deadline (the caller puts it around this).
    async fn drain_inner(
        &self,
        remaining: &Mutex<BTreeMap<String, PodRef>>,
        blocked: &Mutex<HashMap<String, String>>,
    ) -> Result<(), DrainError> {
        let force_at = self.force_delete_after.map(|d| Instant::now() + d);
        let lb_wait = marks::add(&self.nodes, &self.node, &self.marks).await?;
        self.cordon().await?;
        if let Some(wait) = lb_wait {
            tracing::info!(
                "node {} is out of external load balancers; waiting {} before evicting",
                self.node,
                humantime::format_duration(wait)
            );
            tokio::time::sleep(wait).await;
        }
        let pods = self.pods_to_evict().await?;
        if pods.is_empty() {
            tracing::info!("no pods to evict from node {}", self.node);
            return Ok(());
        }
        *lock(remaining) = pods.iter().map(|p| (p.uid.clone(), p.clone())).collect();
        tracing::info!(
            "evicting {} pod(s) from node {}: {}",
            pods.len(),
            self.node,
            name_list(pods.iter().map(PodRef::key))
        );

        // The watch that sees them go (by uid).
        let pod_api: Api<Pod> = Api::all(self.client.clone());
        let cfg = watcher::Config::default().fields(&format!("spec.nodeName={}", self.node));
        let stream = watcher(pod_api, cfg).default_backoff();
        pin_mut!(stream);
        let mut relisted: Option<HashSet<String>> = None;
        let mut last_info: Option<Instant> = None;

        let mut evictions: FuturesUnordered<_> = pods
            .iter()
            .map(|p| async move { (p, self.evict(p, blocked, force_at).await) })
            .collect();

        loop {
            if lock(remaining).is_empty() {
                tracing::info!("node {} drained", self.node);
                return Ok(());
            }
            tokio::select! {
                Some((pod, outcome)) = evictions.next(), if !evictions.is_empty() => {
                    match outcome? {
                        Evicted::Accepted => {}
                        Evicted::Gone => {
                            if lock(remaining).remove(&pod.uid).is_some() {
                                self.log_remaining(remaining, &format!("{} gone", pod.key()), &mut last_info);
                            }
                        }
                    }
                }
                ev = stream.next() => {
                    self.on_pod_event(ev, remaining, &mut relisted, &mut last_info)?;
                }
            }
        }
    }

    /// Takes note of one event of the watch on the node's pods: a pod evicted is gone when its
    /// uid is deleted, or missing from a relist.
    fn on_pod_event(
        &self,
        ev: Option<Result<watcher::Event<Pod>, watcher::Error>>,
        remaining: &Mutex<BTreeMap<String, PodRef>>,
        relisted: &mut Option<HashSet<String>>,
        last_info: &mut Option<Instant>,
    ) -> Result<(), DrainError> {
        match ev {
            Some(Ok(watcher::Event::Delete(p))) => {
                if let Some(uid) = p.metadata.uid.as_deref() {
                    if lock(remaining).remove(uid).is_some() {
                        self.log_remaining(remaining, &format!("{} gone", pod_key(&p)), last_info);
                    }
                }
            }
            Some(Ok(watcher::Event::Init)) => *relisted = Some(HashSet::new()),
            Some(Ok(watcher::Event::InitApply(p))) => {
                if let (Some(seen), Some(uid)) = (relisted.as_mut(), p.metadata.uid) {
                    seen.insert(uid);
                }
            }
            Some(Ok(watcher::Event::InitDone)) => {
                if let Some(seen) = relisted.take() {
                    let gone: Vec<String> = {
                        let mut rem = lock(remaining);
                        let gone = rem
                            .iter()
                            .filter(|(uid, _)| !seen.contains(*uid))
                            .map(|(_, p)| p.key())
                            .collect();
                        rem.retain(|uid, _| seen.contains(uid));
                        gone
                    };
                    if !gone.is_empty() {
                        self.log_remaining(
                            remaining,
                            &format!("{} gone", name_list(&gone)),
                            last_info,
                        );
                    }
                }
            }
            Some(Ok(watcher::Event::Apply(p))) => {
                if let Some(uid) = p.metadata.uid.as_deref() {
                    if lock(remaining).contains_key(uid) {
                        if let Some(t) = &p.metadata.deletion_timestamp {
                            tracing::debug!("{} terminating, gone by {}", pod_key(&p), t.0);
                        }
                    }
                }
            }
            Some(Err(e)) => {
                tracing::warn!("watch of pods on node {} failed, resuming: {e}", self.node);
            }
            None => {
                return Err(DrainError::WatchEnded(format!(
                    "pods on node {}",
                    self.node
                )));
            }
        }
        Ok(())
    }

    /// Says which pods are still awaited: every change at debug level, at info level at most
    /// every [`PROGRESS_EVERY`] (a node with a hundred pods would otherwise log a hundred lines).
    fn log_remaining(
        &self,
        remaining: &Mutex<BTreeMap<String, PodRef>>,
        what: &str,
        last_info: &mut Option<Instant>,
    ) {
        let rem = lock(remaining);
        if rem.is_empty() {
            tracing::info!("{what}; no pods left on node {}", self.node);
            return;
        }
        let now = Instant::now();
        if last_info.is_none_or(|t| now.duration_since(t) >= PROGRESS_EVERY) {
            *last_info = Some(now);
            tracing::info!(
                "{what}; waiting for {} pod(s) to be gone: {}",
                rem.len(),
                name_list(rem.values())
            );
        } else {
            tracing::debug!(
                "{what}; waiting for {} pod(s) to be gone: {}",
                rem.len(),
                name_list(rem.values())
            );
        }
    }

    /// The whole drain within `drain_timeout` ([`super::Drainer::drain`]).
    pub(super) async fn drain_by_deadline(&self) -> Result<(), DrainError> {
        let deadline = Instant::now() + self.drain_timeout;
        let remaining = Mutex::new(BTreeMap::new());
        let blocked = Mutex::new(HashMap::new());
        match tokio::time::timeout_at(deadline, self.drain_inner(&remaining, &blocked)).await {
            Ok(r) => r,
            Err(_) => {
                let rem = lock(&remaining);
                let blocked = lock(&blocked);
                let mut left: Vec<String> = rem.values().map(PodRef::key).collect();
                left.sort();
                for p in rem.values() {
                    match blocked.get(&p.uid) {
                        Some(why) => tracing::warn!("{p} still there: eviction {why}"),
                        None => tracing::warn!("{p} still there (evicted, terminating)"),
                    }
                }
                tracing::error!(
                    "drain of node {} stopped after {}: {} pod(s) left",
                    self.node,
                    humantime::format_duration(self.drain_timeout),
                    left.len()
                );
                Err(DrainError::Timeout { left })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kube_client::deadline::NoAnswer;

    #[test]
    fn no_answer_in_time_is_retried_and_described_plainly() {
        let err = kube::Error::Service(Box::new(NoAnswer {
            limit: Duration::from_secs(10),
            method: hyper::Method::PATCH,
            path: "/api/v1/nodes/node-1".into(),
        }));
        assert!(is_retryable(&err));
        let e = DrainError::api("annotate node node-1", err);
        assert_eq!(e.status(), None);
        assert_eq!(
            e.to_string(),
            "annotate node node-1: no answer from the Kubernetes API server within 10s: PATCH /api/v1/nodes/node-1"
        );
    }
}
