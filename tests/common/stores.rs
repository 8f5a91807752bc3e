//! Every lock store under one harness: etcd v3 and etcd v2 on a real etcd (each version of the
//! matrix, see [`super::etcd::etcd_installed`]) and Leases on the lab's Kubernetes API
//! stand-in. A scenario is an `async fn(World)`; `every_store!(run: a, b)` makes one test of each
//! per store, calling the file's own `run` (usually [`run_on`] with its stand-in options). Each
//! file adds the clients it needs in an `impl World` of its own.

use rebootd::config;
use rebootd::lock::{Admin, Semaphore};
use rebootd_lab::etcd::{EtcdOptions, EtcdServer, EtcdVersion};
use rebootd_lab::kube_api::{KubeApi, KubeApiHandle, Options};

use super::etcd::etcd_installed;
use super::logs::{self, Logs};

/// A store under test: the agent's side and the operator's side.
pub trait Store: Semaphore + Admin {}
impl<T: Semaphore + Admin> Store for T {}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    V3(EtcdVersion),
    V2(EtcdVersion),
    Lease,
}

/// The servers of one scenario, and its log events.
pub struct World {
    pub kind: Kind,
    pub etcd: Option<EtcdServer>,
    pub api: Option<KubeApiHandle>,
    pub dir: tempfile::TempDir,
    pub logs: Logs,
}

impl World {
    /// The lock settings of this scenario's etcd, through `endpoint` when given (a proxy).
    pub fn etcd_settings(&self, api: config::EtcdApi, endpoint: Option<String>) -> config::Etcd {
        let mut settings = self.etcd.as_ref().expect("etcd").lock_settings(api);
        if let Some(e) = endpoint {
            settings.endpoints = vec![e];
        }
        settings
    }

    /// Where the store listens (what a proxy forwards to).
    pub fn upstream(&self) -> std::net::SocketAddr {
        let url = match self.kind {
            Kind::V3(_) | Kind::V2(_) => self.etcd.as_ref().expect("etcd").endpoint(),
            Kind::Lease => self.api.as_ref().expect("API stand-in").base_url(),
        };
        let addr = url
            .trim_start_matches("http://")
            .trim_start_matches("https://");
        addr.parse().expect("host:port")
    }

    /// A client of the API stand-in as user `who`, through `server` when given (a proxy's URL),
    /// never retrying on its own.
    pub async fn kube_client(&self, who: &str, server: Option<String>) -> kube::Client {
        let api = self.api.as_ref().expect("API stand-in");
        let tag: String = who
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .collect();
        let path = self.dir.path().join(format!("kubeconfig-{tag}"));
        api.write_kubeconfig_for(&path, who).expect("kubeconfig");
        if let Some(s) = server {
            let text = std::fs::read_to_string(&path).expect("kubeconfig");
            std::fs::write(&path, text.replace(&api.base_url(), &s)).expect("kubeconfig");
        }
        let kc = kube::config::Kubeconfig::read_from(&path).expect("read kubeconfig");
        let mut cfg =
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .expect("kube config");
        cfg.default_retry = false;
        kube::Client::try_from(cfg).expect("kube client")
    }
}

/// Start what `kind` needs (the Leases' stand-in with `lease_options`) and run `scenario` on
/// it, capturing its log events. An etcd version that is not installed is skipped (a failure in
/// CI).
pub async fn run_on<F, Fut>(kind: Kind, lease_options: Options, scenario: F)
where
    F: FnOnce(World) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    // The runtime is current-thread, so every task of the test sees this subscriber.
    let (_guard, logs) = logs::capture_on_this_thread();
    let (etcd, api) = match kind {
        Kind::V3(v) | Kind::V2(v) => {
            if !etcd_installed(v) {
                return;
            }
            let options = match kind {
                Kind::V2(_) => EtcdOptions::v2(),
                _ => EtcdOptions::default(),
            };
            let etcd = EtcdServer::start_with(v, options)
                .await
                .expect("start etcd");
            (Some(etcd), None)
        }
        Kind::Lease => {
            let api = KubeApi::start(lease_options)
                .await
                .expect("start the API stand-in");
            (None, Some(api))
        }
    };
    let dir = tempfile::tempdir().expect("tempdir");
    scenario(World {
        kind,
        etcd,
        api,
        dir,
        logs,
    })
    .await;
}

/// One `#[tokio::test]` (current-thread runtime) per scenario and store, in modules
/// `v3_etcd_3_4`, `v3_etcd_3_5`, `v2_etcd_3_4`, `v2_etcd_3_5` and `leases`:
/// `every_store!(run: a, b)` makes `leases::a` call `run(Kind::Lease, a)`.
#[allow(unused_macros)]
macro_rules! every_store {
    ($run:ident: $($name:ident),* $(,)?) => {
        mod v3_etcd_3_4 {
            $(#[tokio::test(flavor = "current_thread")]
            async fn $name() {
                use rebootd_lab::etcd::EtcdVersion;
                super::$run(super::Kind::V3(EtcdVersion::V34), super::$name).await
            })*
        }
        mod v3_etcd_3_5 {
            $(#[tokio::test(flavor = "current_thread")]
            async fn $name() {
                use rebootd_lab::etcd::EtcdVersion;
                super::$run(super::Kind::V3(EtcdVersion::V35), super::$name).await
            })*
        }
        mod v2_etcd_3_4 {
            $(#[tokio::test(flavor = "current_thread")]
            async fn $name() {
                use rebootd_lab::etcd::EtcdVersion;
                super::$run(super::Kind::V2(EtcdVersion::V34), super::$name).await
            })*
        }
        mod v2_etcd_3_5 {
            $(#[tokio::test(flavor = "current_thread")]
            async fn $name() {
                use rebootd_lab::etcd::EtcdVersion;
                super::$run(super::Kind::V2(EtcdVersion::V35), super::$name).await
            })*
        }
        mod leases {
            $(#[tokio::test(flavor = "current_thread")]
            async fn $name() {
                super::$run(super::Kind::Lease, super::$name).await
            })*
        }
    };
}
#[allow(unused_imports)]
pub(crate) use every_store;
