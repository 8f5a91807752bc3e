//! The etcd v2 keys client against real etcd 3.4 and 3.5 started with `--enable-v2=true`: reads,
//! create, compare-and-swap, delete, TTL keys and refresh, in-order keys, long-poll watches and a
//! cleared watch index, TLS with a client certificate, v2's basic authentication, endpoint
//! failover, and the error of an etcd that does not serve v2. Every scenario runs once per etcd
//! version; a missing version skips (fails when `CI=true`). No sleeps: watches are awaited.

use std::time::Duration;

use rebootd::clients::etcd_v2::{Action, Get, KeysClient, Put, Settings, Timeouts, V2Error};
use rebootd::http::TlsFiles;
use rebootd_lab::etcd::{EtcdOptions, EtcdServer, EtcdVersion};

mod common;
use common::etcd::{per_etcd_version, start_etcd as start};

const WAIT: Duration = Duration::from_secs(20);

/// Runs a scenario on etcd `v`; the scenario starts its etcd (with the options it needs) by
/// [`start`], which skips (fails in CI) when `v` is not installed.
async fn run<F, Fut>(v: EtcdVersion, scenario: F)
where
    F: FnOnce(EtcdVersion) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    scenario(v).await
}

fn settings(etcd: &EtcdServer) -> Settings {
    let tls = match etcd.tls_files() {
        Some(t) => TlsFiles {
            table: "lock.etcd",
            ca_file: Some(t.ca.clone()),
            client_cert: Some((t.client_cert.clone(), t.client_key.clone())),
        },
        None => TlsFiles {
            table: "lock.etcd",
            ..TlsFiles::default()
        },
    };
    Settings {
        endpoints: vec![etcd.endpoint()],
        tls,
        basic_auth: None,
        timeouts: Timeouts::default(),
    }
}

fn client(etcd: &EtcdServer) -> KeysClient {
    KeysClient::new(&settings(etcd)).expect("client")
}

per_etcd_version!(run:
    create_compare_and_swap_and_delete,
    in_order_keys_ttl_and_refresh,
    watches_wait_for_the_next_change_and_report_a_cleared_index,
    an_etcd_without_v2_is_named_with_the_fix,
    tls_client_certificate,
    basic_authentication,
    the_next_endpoint_is_tried_when_one_is_down,
);

async fn create_compare_and_swap_and_delete(v: EtcdVersion) {
    let Some(etcd) = start(v, EtcdOptions::v2()).await else {
        return;
    };
    let c = client(&etcd);
    let key = "/coreos.com/updateengine/rebootlock/groups/a%2Fb+c/semaphore";
    let e = c.get(key, Get::default()).await.unwrap_err();
    assert!(e.is_key_not_found(), "{e}");
    assert!(
        e.to_string().contains(key) && e.to_string().contains(&etcd.endpoint()),
        "{e}"
    );

    let created = c.create(key, "one", None).await.unwrap();
    assert_eq!(created.action, Action::Create);
    // The escaped key arrives unchanged (etcd's own view of it).
    let (code, body) = etcd
        .curl_v2(
            "GET",
            "/v2/keys/coreos.com/updateengine/rebootlock/groups?recursive=true",
            None,
        )
        .unwrap();
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("groups/a%2Fb+c/semaphore"), "{body}");

    let e = c.create(key, "two", None).await.unwrap_err();
    assert!(e.is_node_exists(), "{e}");
    let index = created.node.modified_index;
    let swapped = c.compare_and_swap(key, "two", index, None).await.unwrap();
    assert_eq!(swapped.action, Action::CompareAndSwap);
    assert_eq!(swapped.prev_node.unwrap().value.as_deref(), Some("one"));
    // The old index no longer matches.
    let e = c
        .compare_and_swap(key, "three", index, None)
        .await
        .unwrap_err();
    assert!(e.is_compare_failed(), "{e}");
    let e = c.delete(key, Some(index)).await.unwrap_err();
    assert!(e.is_compare_failed(), "{e}");
    let read = c
        .get(
            key,
            Get {
                quorum: true,
                ..Get::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(read.node.value.as_deref(), Some("two"));
    assert!(read.etcd_index >= read.node.modified_index);
    c.delete(key, Some(read.node.modified_index)).await.unwrap();
    assert!(c
        .get(key, Get::default())
        .await
        .unwrap_err()
        .is_key_not_found());
    // A plain put needs no condition.
    c.put(key, "four", Put::default()).await.unwrap();
}

async fn in_order_keys_ttl_and_refresh(v: EtcdVersion) {
    let Some(etcd) = start(v, EtcdOptions::v2()).await else {
        return;
    };
    let c = client(&etcd);
    let dir = "/test/queue";
    let ttl = Some(Duration::from_secs(60));
    let a = c.create_in_order(dir, "a", ttl).await.unwrap();
    let b = c.create_in_order(dir, "b", ttl).await.unwrap();
    let z = c.create_in_order(dir, "c", None).await.unwrap();
    assert!(a.node.key < b.node.key && b.node.key < z.node.key);
    assert!(a.node.ttl.is_some() && z.node.ttl.is_none());

    // A refresh keeps the key's place (created index) and value, and wakes no watcher.
    let start_index = c.get(dir, Get::default()).await.unwrap().etcd_index + 1;
    let refreshed = c
        .refresh(&a.node.key, Duration::from_secs(120))
        .await
        .unwrap();
    assert_eq!(refreshed.node.created_index, a.node.created_index);
    assert_eq!(refreshed.node.value.as_deref(), Some("a"));
    let e = c
        .refresh("/test/queue/nope", Duration::from_secs(5))
        .await
        .unwrap_err();
    assert!(e.is_key_not_found(), "{e}");

    let listed = c
        .get(
            dir,
            Get {
                recursive: true,
                sorted: true,
                ..Get::default()
            },
        )
        .await
        .unwrap();
    let values: Vec<_> = listed
        .node
        .leaves()
        .iter()
        .map(|n| n.value.clone().unwrap_or_default())
        .collect();
    assert_eq!(values, ["a", "b", "c"]);

    // A key with a 1 s TTL expires: the watch (from before the refresh) sees the expiry first,
    // not the refresh.
    let short = c
        .create_in_order(dir, "short", Some(Duration::from_secs(1)))
        .await
        .unwrap();
    let mut index = start_index;
    let event = loop {
        let e = tokio::time::timeout(WAIT, c.watch(dir, true, index))
            .await
            .expect("an event")
            .unwrap()
            .expect("not a quiet watch");
        index = e.node.modified_index + 1;
        if e.node.key == short.node.key && e.action == Action::Expire {
            break e;
        }
        assert_ne!(e.node.key, a.node.key, "the refresh woke a watcher: {e:?}");
    };
    assert!(event.action.removes());
}

async fn watches_wait_for_the_next_change_and_report_a_cleared_index(v: EtcdVersion) {
    let Some(etcd) = start(v, EtcdOptions::v2()).await else {
        return;
    };
    let c = std::sync::Arc::new(client(&etcd));
    let key = "/test/watched";
    let first = c.create(key, "0", None).await.unwrap();
    let from = first.etcd_index + 1;
    let before = c.requests();
    let watcher = {
        let c = c.clone();
        tokio::spawn(async move { c.watch("/test", true, from).await })
    };
    // The watch is pending (one request), then a change ends it.
    c.compare_and_swap(key, "1", first.node.modified_index, None)
        .await
        .unwrap();
    let event = tokio::time::timeout(WAIT, watcher)
        .await
        .expect("the watch answers")
        .unwrap()
        .unwrap()
        .expect("an event");
    assert_eq!(event.action, Action::CompareAndSwap);
    assert_eq!(event.node.value.as_deref(), Some("1"));
    assert_eq!(event.prev_node.unwrap().value.as_deref(), Some("0"));
    assert_eq!(c.requests() - before, 2, "one watch and one write");

    // A quiet watch ends after Timeouts::watch with nothing.
    let mut quick = settings(&etcd);
    quick.timeouts.watch = Duration::from_millis(200);
    let q = KeysClient::new(&quick).unwrap();
    let none = q
        .watch(key, false, event.node.modified_index + 1)
        .await
        .unwrap();
    assert_eq!(none, None);

    // etcd keeps 1000 events: an index further back is cleared.
    for i in 0..1010 {
        c.put("/test/churn", &i.to_string(), Put::default())
            .await
            .unwrap();
    }
    let e = c.watch(key, false, from).await.unwrap_err();
    assert!(e.is_index_cleared(), "{e}");
    assert!(e.to_string().contains("outdated and cleared"), "{e}");
}

async fn an_etcd_without_v2_is_named_with_the_fix(v: EtcdVersion) {
    let Some(etcd) = start(v, EtcdOptions::default()).await else {
        return;
    };
    assert!(!etcd.serves_v2());
    let c = client(&etcd);
    let key = "/coreos.com/updateengine/rebootlock/semaphore";
    let e = c.get(key, Get::default()).await.unwrap_err();
    let V2Error::NoV2Api {
        version, answer, ..
    } = &e
    else {
        panic!("expected NoV2Api, got {e:?}");
    };
    // What etcd answers without v2, measured: a plain-text 404.
    assert_eq!(answer, "404 page not found");
    assert!(version.starts_with(v.as_str()), "{version}");
    let m = e.to_string();
    for part in ["--enable-v2=true", key, &etcd.endpoint()] {
        assert!(m.contains(part), "{m}");
    }
    assert!(!e.is_transient());
}

async fn tls_client_certificate(v: EtcdVersion) {
    let options = EtcdOptions {
        tls: true,
        enable_v2: true,
    };
    let Some(etcd) = start(v, options).await else {
        return;
    };
    let c = client(&etcd);
    c.create("/test/tls", "yes", None).await.unwrap();
    assert_eq!(
        c.get("/test/tls", Get::default())
            .await
            .unwrap()
            .node
            .value
            .as_deref(),
        Some("yes")
    );
    // Without the client certificate the server refuses the handshake.
    let mut s = settings(&etcd);
    s.tls.client_cert = None;
    let e = KeysClient::new(&s)
        .unwrap()
        .get("/test/tls", Get::default())
        .await
        .unwrap_err();
    assert!(matches!(e, V2Error::Unreachable { .. }), "{e}");
    assert!(e.to_string().contains(&etcd.endpoint()), "{e}");
}

async fn basic_authentication(v: EtcdVersion) {
    let Some(mut etcd) = start(v, EtcdOptions::v2()).await else {
        return;
    };
    etcd.enable_v2_auth("rootpw").unwrap();
    etcd.add_v2_user("rebootd", "s3cret", "/coreos.com/updateengine/rebootlock")
        .unwrap();
    let key = "/coreos.com/updateengine/rebootlock/semaphore";
    let mut s = settings(&etcd);
    s.basic_auth = Some(("rebootd".into(), "s3cret".into()));
    let c = KeysClient::new(&s).unwrap();
    c.create(key, "{}", None).await.unwrap();
    // Outside its prefix, the user is refused; so is a wrong password, and no password.
    let e = c.get("/elsewhere", Get::default()).await.unwrap_err();
    assert_eq!(e.code(), Some(110), "{e}");
    s.basic_auth = Some(("rebootd".into(), "wrong".into()));
    let e = KeysClient::new(&s)
        .unwrap()
        .get(key, Get::default())
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(110), "{e}");
    assert!(e.to_string().contains(key), "{e}");
    s.basic_auth = None;
    let e = KeysClient::new(&s)
        .unwrap()
        .get(key, Get::default())
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(110), "{e}");
}

async fn the_next_endpoint_is_tried_when_one_is_down(v: EtcdVersion) {
    let Some(etcd) = start(v, EtcdOptions::v2()).await else {
        return;
    };
    let dead = format!("http://{}", common::free_loopback_addr());
    let mut s = settings(&etcd);
    s.endpoints = vec![dead.clone(), etcd.endpoint()];
    let c = KeysClient::new(&s).unwrap();
    c.create("/test/failover", "x", None).await.unwrap();
    // The endpoint that answered is used first from then on: one request, not two.
    let before = c.requests();
    c.get("/test/failover", Get::default()).await.unwrap();
    assert_eq!(c.requests() - before, 1);

    s.endpoints = vec![dead.clone()];
    let e = KeysClient::new(&s)
        .unwrap()
        .get("/test/failover", Get::default())
        .await
        .unwrap_err();
    assert!(e.is_transient(), "{e}");
    assert!(
        e.to_string().contains(&dead) && e.to_string().contains("/test/failover"),
        "{e}"
    );
}
