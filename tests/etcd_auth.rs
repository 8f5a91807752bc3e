//! etcd authentication against real etcd 3.4 and 3.5: what a node's user must be allowed for
//! rebootd to work, and what rebootd says when it is not.

mod common;

use std::time::Duration;

use common::*;
use rebootd::config;
use rebootd::lock::etcd::{EtcdSemaphore, Timeouts};
use rebootd::lock::{Identity, LockError, Semaphore};
use rebootd_lab::etcd::{EtcdOptions, EtcdServer, EtcdVersion};

const P: &str = "coreos.com/updateengine/rebootlock";

fn versions() -> Vec<EtcdVersion> {
    let v = EtcdVersion::available();
    if std::env::var("CI").is_ok_and(|c| c == "true" || c == "1") {
        assert_eq!(v.len(), 2, "CI must have etcd 3.4 and 3.5 installed");
    }
    v
}

fn timeouts() -> Timeouts {
    Timeouts {
        connect: Duration::from_secs(2),
        request: Duration::from_secs(3),
        backoff_min: Duration::from_millis(50),
        backoff_max: Duration::from_millis(500),
        queue_ttl: Duration::from_secs(10),
    }
}

fn me(id: &str) -> Identity {
    Identity {
        id: id.into(),
        node: format!("node-{id}"),
        boot_id: format!("boot-{id}"),
        token: format!("t-{id}"),
    }
}

/// A role with read and write on each of rebootd's keys but not read on the range between
/// them lets a node take a free slot, but etcd refuses the watch a waiter needs: the wait ends
/// at once with an error saying which range needs read, not in retries as if etcd were down.
#[tokio::test]
async fn a_role_without_read_on_the_whole_range_is_told_so() {
    for v in versions() {
        let mut etcd = EtcdServer::start_with(v, EtcdOptions::default())
            .await
            .unwrap();
        etcd.enable_auth("rootpw").unwrap();
        let pause = format!("{P}/rebootd/control/paused");
        for args in [
            vec!["role", "add", "keys-only"],
            vec!["role", "grant-permission", "keys-only", "read", &pause],
            vec![
                "role",
                "grant-permission",
                "keys-only",
                "readwrite",
                "coreos.com/updateengine/rebootlock/semaphore",
            ],
            vec![
                "role",
                "grant-permission",
                "keys-only",
                "readwrite",
                "--prefix",
                "coreos.com/updateengine/rebootlock/rebootd/holders/",
            ],
            vec![
                "role",
                "grant-permission",
                "keys-only",
                "readwrite",
                "--prefix",
                "coreos.com/updateengine/rebootlock/rebootd/waiters/",
            ],
            vec![
                "user",
                "add",
                "node-a",
                "--interactive=false",
                "--new-user-password",
                "pa",
            ],
            vec!["user", "grant-role", "node-a", "keys-only"],
        ] {
            etcd.etcdctl_run(&args).unwrap();
        }
        let dir = tempfile::tempdir().unwrap();
        let connect = |user: &str, pw: &str| {
            let file = dir.path().join(format!("{user}.password"));
            std::fs::write(&file, pw).unwrap();
            let settings = config::Etcd {
                username: Some(user.into()),
                password_file: Some(file),
                ..etcd.lock_settings(config::EtcdApi::V3)
            };
            async move {
                EtcdSemaphore::connect_with(&settings, "default", None, timeouts())
                    .await
                    .unwrap()
            }
        };
        let node = connect("node-a", "pa").await;
        let holder = connect("root", "rootpw").await;
        // A free slot: taken and given back without a watch.
        node.acquire(&me("a")).await.expect("take a free slot");
        node.release(&me("a")).await.unwrap();

        holder.acquire(&me("h")).await.unwrap();
        let waited = tokio::time::timeout(WAIT, node.acquire(&me("a"))).await;
        let err = waited
            .expect("the wait ends instead of retrying")
            .expect_err("refused");
        eprintln!("{v}: {err}");
        assert!(matches!(err, LockError::Backend { .. }), "{v}: {err}");
        let text = err.to_string();
        assert!(text.contains("permission denied watching"), "{v}: {text}");
        assert!(
            text.contains(&pause) && text.contains("rebootlock/semaphore"),
            "{v}: {text}"
        );
    }
}
