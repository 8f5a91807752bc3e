//! The Kubernetes API client rebootd uses (drain, Lease semaphore, node state).
//!
//! kube-rs (3 and later) builds its default client with a `RetryLayer` that silently retries
//! 429, 503 and 504 responses. rebootd must see every 429: a PodDisruptionBudget refusing an
//! eviction is reported as 429, and each blocked pod is logged (with the budget that blocks it)
//! and retried on rebootd's own schedule. So [`connect`] builds the same stack as
//! `Client::try_from(Config)` (connector with the config's TLS and timeouts, base URI, auth,
//! extra headers, tracing) but with `Config::default_retry` off, which leaves the retry layer out.
//! Every request is sent once; its outcome is the caller's to handle.
//!
//! On top of that stack, [`deadline::DeadlineLayer`] gives every request but watches
//! [`REQUEST_LIMIT`] to be answered (kube-client has no read time-out by default, and one would
//! cut watches): a request the server never answers fails with [`deadline::NoAnswer`], a
//! transport error, instead of holding its caller for ever.

pub mod deadline;

use std::path::{Path, PathBuf};
use std::time::Duration;

/// How long a Kubernetes API request that is not a watch may take, from sending it to the end
/// of its answer. As the etcd stores' request limit, and well under the unit's
/// `WatchdogSec=60s`, since one step of the run loop can make a few calls in a row.
pub const REQUEST_LIMIT: Duration = Duration::from_secs(10);

/// Why a client could not be built.
#[derive(Debug, thiserror::Error)]
pub enum KubeClientError {
    /// The kubeconfig file could not be read or parsed.
    #[error("kubeconfig {}: {source}", path.display())]
    Kubeconfig {
        /// The file named in the configuration.
        path: PathBuf,
        /// What is wrong with it.
        #[source]
        source: kube::config::KubeconfigError,
    },
    /// No kubeconfig was given and none could be inferred (KUBECONFIG, ~/.kube/config, in-cluster).
    #[error("no kubeconfig given and none could be inferred: {0}")]
    Infer(#[source] kube::config::InferConfigError),
    /// The configuration was read but a client could not be built from it (TLS material, proxy).
    #[error("building the Kubernetes client for {url}: {source}")]
    Build {
        /// The API server URL from the configuration.
        url: String,
        /// The reason.
        #[source]
        source: kube::Error,
    },
}

/// Connects to the API server named by `kubeconfig` (its current context), or by
/// `kube::Config::infer()` (KUBECONFIG, `~/.kube/config`, in-cluster service account) when
/// `None`. The client never retries a request by itself (see the module documentation).
///
/// Nothing is sent to the server here: a bad server address shows up on the first request.
#[tracing::instrument(level = "debug", fields(kubeconfig = ?kubeconfig))]
pub async fn connect(kubeconfig: Option<&Path>) -> Result<kube::Client, KubeClientError> {
    let config = match kubeconfig {
        Some(path) => {
            let file = kube::config::Kubeconfig::read_from(path).map_err(|source| {
                KubeClientError::Kubeconfig {
                    path: path.to_path_buf(),
                    source,
                }
            })?;
            kube::Config::from_custom_kubeconfig(file, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(|source| KubeClientError::Kubeconfig {
                    path: path.to_path_buf(),
                    source,
                })?
        }
        None => kube::Config::infer()
            .await
            .map_err(KubeClientError::Infer)?,
    };
    client_from_config(config)
}

/// Builds a client from an already loaded configuration, without kube-rs's retry layer and
/// with [`REQUEST_LIMIT`] on every request but watches.
pub fn client_from_config(mut config: kube::Config) -> Result<kube::Client, KubeClientError> {
    config.default_retry = false;
    let url = config.cluster_url.to_string();
    let builder = kube::client::ClientBuilder::try_from(config)
        .map_err(|source| KubeClientError::Build { url, source })?;
    Ok(builder
        .with_layer(&deadline::DeadlineLayer::new(REQUEST_LIMIT))
        .build())
}

/// The [`deadline::NoAnswer`] in `err`, if the request got no answer within its limit.
pub fn no_answer(err: &kube::Error) -> Option<&deadline::NoAnswer> {
    match err {
        kube::Error::Service(e) => e.downcast_ref(),
        _ => None,
    }
}

/// Whether `err` is an API answer with HTTP status `code` (e.g. 404, 409, 429).
pub fn is_status(err: &kube::Error, code: u16) -> bool {
    status_code(err) == Some(code)
}

/// The HTTP status of an API error answer, if `err` is one.
pub fn status_code(err: &kube::Error) -> Option<u16> {
    match err {
        kube::Error::Api(status) => Some(status.code),
        _ => None,
    }
}
