//! Waiting for this host's Node to report Ready after the boot, and in this boot: the Ready
//! condition is watched, and with a boot id the kubelet must report that boot id too.

use std::time::Duration;

use futures_util::{pin_mut, StreamExt};
use k8s_openapi::api::core::v1::Node;
use kube::runtime::{watcher, WatchStreamExt};

use super::{DrainError, KubeDrainer};

/// The Ready condition of a node: (is Ready, human description).
fn node_ready(n: &Node) -> (bool, String) {
    let cond = n
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"));
    match cond {
        None => (false, "no Ready condition reported".to_string()),
        Some(c) => {
            let mut d = format!("Ready={}", c.status);
            if let Some(r) = c.reason.as_deref().filter(|r| !r.is_empty()) {
                d.push_str(&format!(" ({r}"));
                if let Some(m) = c.message.as_deref().filter(|m| !m.is_empty()) {
                    d.push_str(&format!(": {m}"));
                }
                d.push(')');
            }
            (c.status == "True", d)
        }
    }
}

impl KubeDrainer {
    /// Watch the Node up to `timeout` until it is Ready in this boot ([`super::Drainer::wait_ready`]).
    pub(super) async fn watch_ready(&self, timeout: Duration) -> Result<(), DrainError> {
        let cfg = watcher::Config::default().fields(&format!("metadata.name={}", self.node));
        let stream = watcher(self.nodes.clone(), cfg).default_backoff();
        pin_mut!(stream);
        let mut last = "node not seen yet".to_string();
        let wait = async {
            while let Some(ev) = stream.next().await {
                match ev {
                    Ok(watcher::Event::Apply(n) | watcher::Event::InitApply(n)) => {
                        let (mut ready, mut what) = node_ready(&n);
                        if let (true, Some(ours)) = (ready, &self.boot_id) {
                            let reported = n
                                .status
                                .as_ref()
                                .and_then(|s| s.node_info.as_ref())
                                .map(|i| i.boot_id.trim().to_ascii_lowercase())
                                .unwrap_or_default();
                            if &reported != ours {
                                ready = false;
                                what = format!(
                                    "Ready=True, but reported from boot {reported:?}, not this boot {ours:?} (the kubelet has not reported since the reboot)"
                                );
                            }
                        }
                        if ready {
                            tracing::info!("node {} is Ready", self.node);
                            return true;
                        }
                        if what != last {
                            tracing::info!(
                                "waiting up to {} for node {} to be Ready: {what}",
                                humantime::format_duration(timeout),
                                self.node
                            );
                            last = what;
                        }
                    }
                    Ok(watcher::Event::Delete(_)) => {
                        last = "the Node object was deleted".to_string();
                        tracing::warn!("waiting for node {} to be Ready: {last}", self.node);
                    }
                    Ok(watcher::Event::Init | watcher::Event::InitDone) => {}
                    Err(e) => tracing::warn!("watch of node {} failed, resuming: {e}", self.node),
                }
            }
            false
        };
        match tokio::time::timeout(timeout, wait).await {
            Ok(true) => Ok(()),
            Ok(false) | Err(_) => {
                tracing::error!(
                    "node {} not Ready after {}: {last}",
                    self.node,
                    humantime::format_duration(timeout)
                );
                Err(DrainError::NotReady {
                    node: self.node.clone(),
                    waited: timeout,
                    last,
                })
            }
        }
    }
}
