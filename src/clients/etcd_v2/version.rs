//! Asking an endpoint what it is (`GET /version`): told apart, an etcd without the v2 API from
//! something that is no etcd at all.

use std::sync::atomic::Ordering;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Method, Request};

use super::client::KeysClient;
use crate::http;

/// Largest `GET /version` answer read (etcd's is under 100 bytes).
const VERSION_MAX: usize = 4096;

impl KeysClient {
    /// What `GET /version` says the server is (`etcdserver`), if it is an etcd.
    pub(super) async fn etcd_version(&self, endpoint: &str) -> Option<String> {
        #[derive(serde::Deserialize)]
        struct Version {
            etcdserver: String,
        }
        let request = Request::builder()
            .method(Method::GET)
            .uri(format!("{endpoint}/version"))
            .body(Full::new(Bytes::new()))
            .ok()?;
        self.requests.fetch_add(1, Ordering::Relaxed);
        let exchange = async {
            let response = self.http.request(request).await.ok()?;
            let body = http::read_body(response.into_body(), VERSION_MAX)
                .await
                .ok()?;
            serde_json::from_slice::<Version>(&body).ok()
        };
        tokio::time::timeout(self.timeouts.request, exchange)
            .await
            .ok()
            .flatten()
            .map(|v| v.etcdserver)
    }
}
