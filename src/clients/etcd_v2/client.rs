//! The v2 keys client: requests, endpoints, authentication, time limits.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{HeaderValue, ACCEPT, AUTHORIZATION, CONTENT_TYPE, USER_AGENT};
use hyper::{Method, Request, StatusCode};

use super::error::{At, V2Error};
pub use super::options::{escape_path, Get, Put, Settings, Timeouts};
use super::stream::WatchStream;
use super::types::{EtcdErrorBody, Response};
use crate::http::{self, error_chain, HttpClient};

/// Largest answer read (a recursive read of locksmith's whole tree, every group).
const BODY_MAX: usize = 16 * 1024 * 1024;
/// Longest answer text quoted in errors.
const QUOTE_MAX: usize = 300;

/// A client of etcd's v2 keys API (`/v2/keys`).
pub struct KeysClient {
    pub(super) http: HttpClient,
    endpoints: Vec<String>,
    /// The endpoint that answered last (index into `endpoints`).
    current: AtomicUsize,
    authorization: Option<HeaderValue>,
    pub(super) timeouts: Timeouts,
    pub(super) requests: AtomicU64,
}

impl std::fmt::Debug for KeysClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeysClient")
            .field("endpoints", &self.endpoints)
            .field("basic_auth", &self.authorization.is_some())
            .field("timeouts", &self.timeouts)
            .finish_non_exhaustive()
    }
}

/// A table's key, for setting errors.
fn key(table: &str, key: &str) -> String {
    format!("{table}.{key}")
}

impl KeysClient {
    /// A client for `settings`. Makes no request; errors are for settings only (no endpoint, a
    /// URL that is not `http(s)://host:port`, TLS files with `http://`, `https://` without a
    /// CA file, unreadable TLS files).
    pub fn new(settings: &Settings) -> Result<Self, V2Error> {
        let table = settings.tls.table;
        let refused = |m: String| V2Error::Setting(m);
        if settings.endpoints.is_empty() {
            return Err(refused(format!("{} is empty", key(table, "endpoints"))));
        }
        let mut endpoints = Vec::new();
        let mut https = false;
        for e in &settings.endpoints {
            let url = url::Url::parse(e).map_err(|err| {
                refused(format!(
                    "{} {e:?} is not a URL: {err}",
                    key(table, "endpoints")
                ))
            })?;
            match url.scheme() {
                "http" => {
                    if settings.tls.ca_file.is_some() || settings.tls.client_cert.is_some() {
                        return Err(refused(format!(
                            "{table}: TLS files are set but endpoint {e} is plain http://; use https://"
                        )));
                    }
                }
                "https" => {
                    https = true;
                    if settings.tls.ca_file.is_none() {
                        return Err(refused(format!(
                            "endpoint {e} is https:// but {} is not set (system roots are not used)",
                            key(table, "ca_file")
                        )));
                    }
                }
                other => {
                    return Err(refused(format!(
                        "{} {e:?}: scheme {other}:// is not http:// or https://",
                        key(table, "endpoints")
                    )))
                }
            }
            if url.host_str().is_none_or(str::is_empty) || url.path().len() > 1 {
                return Err(refused(format!(
                    "{} {e:?}: expected scheme://host:port",
                    key(table, "endpoints")
                )));
            }
            endpoints.push(e.trim_end_matches('/').to_owned());
        }
        let client = http::client(https, &settings.tls, settings.timeouts.connect)
            .map_err(|e| V2Error::Setting(e.0))?;
        let authorization = match &settings.basic_auth {
            None => None,
            Some((user, password)) => {
                let token =
                    base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
                let mut value = HeaderValue::from_str(&format!("Basic {token}"))
                    .map_err(|e| refused(format!("{}: {e}", key(table, "username"))))?;
                value.set_sensitive(true);
                Some(value)
            }
        };
        Ok(KeysClient {
            http: client,
            endpoints,
            current: AtomicUsize::new(0),
            authorization,
            timeouts: settings.timeouts,
            requests: AtomicU64::new(0),
        })
    }

    /// The endpoints, joined, for messages.
    pub fn target(&self) -> String {
        self.endpoints.join(",")
    }

    /// Requests sent so far (every attempt on every endpoint).
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    pub fn timeouts(&self) -> Timeouts {
        self.timeouts
    }

    /// Read a key or a directory.
    #[tracing::instrument(level = "trace", skip(self))]
    pub async fn get(&self, key: &str, opts: Get) -> Result<Response, V2Error> {
        let mut query = Vec::new();
        if opts.recursive {
            query.push(("recursive", "true".to_owned()));
        }
        if opts.sorted {
            query.push(("sorted", "true".to_owned()));
        }
        if opts.quorum {
            query.push(("quorum", "true".to_owned()));
        }
        self.request(Method::GET, key, &query, None).await
    }

    /// Write `value` at `key` under the conditions of `opts`.
    #[tracing::instrument(level = "trace", skip(self, value))]
    pub async fn put(&self, key: &str, value: &str, opts: Put) -> Result<Response, V2Error> {
        let mut query = Vec::new();
        if let Some(i) = opts.prev_index {
            query.push(("prevIndex", i.to_string()));
        }
        if let Some(e) = opts.prev_exist {
            query.push(("prevExist", e.to_string()));
        }
        let mut form = vec![("value", value.to_owned())];
        if let Some(ttl) = opts.ttl {
            form.push(("ttl", ttl_seconds(ttl).to_string()));
        }
        self.request(Method::PUT, key, &query, Some(form)).await
    }

    /// Create `key` only if it does not exist (`prevExist=false`).
    pub async fn create(
        &self,
        key: &str,
        value: &str,
        ttl: Option<Duration>,
    ) -> Result<Response, V2Error> {
        let opts = Put {
            prev_exist: Some(false),
            ttl,
            ..Put::default()
        };
        self.put(key, value, opts).await
    }

    /// Replace `key` only if its `modifiedIndex` is still `prev_index` (compare-and-swap).
    pub async fn compare_and_swap(
        &self,
        key: &str,
        value: &str,
        prev_index: u64,
        ttl: Option<Duration>,
    ) -> Result<Response, V2Error> {
        let opts = Put {
            prev_index: Some(prev_index),
            ttl,
            ..Put::default()
        };
        self.put(key, value, opts).await
    }

    /// Renew the time to live of an existing key without changing its value or notifying
    /// watchers (`refresh=true&prevExist=true`); its `createdIndex` stays, so an in-order key
    /// keeps its place.
    #[tracing::instrument(level = "trace", skip(self))]
    pub async fn refresh(&self, key: &str, ttl: Duration) -> Result<Response, V2Error> {
        let query = [
            ("refresh", "true".to_owned()),
            ("prevExist", "true".to_owned()),
        ];
        let form = vec![("ttl", ttl_seconds(ttl).to_string())];
        self.request(Method::PUT, key, &query, Some(form)).await
    }

    /// Delete `key`, only if its `modifiedIndex` is `prev_index` when given.
    #[tracing::instrument(level = "trace", skip(self))]
    pub async fn delete(&self, key: &str, prev_index: Option<u64>) -> Result<Response, V2Error> {
        let query: Vec<_> = prev_index
            .map(|i| ("prevIndex", i.to_string()))
            .into_iter()
            .collect();
        self.request(Method::DELETE, key, &query, None).await
    }

    /// Add an in-order key under directory `dir` (POST): etcd names it after its creation index,
    /// so the keys of a directory read `sorted` are in creation order. The answer's node has the
    /// new key.
    #[tracing::instrument(level = "trace", skip(self, value))]
    pub async fn create_in_order(
        &self,
        dir: &str,
        value: &str,
        ttl: Option<Duration>,
    ) -> Result<Response, V2Error> {
        let mut form = vec![("value", value.to_owned())];
        if let Some(ttl) = ttl {
            form.push(("ttl", ttl_seconds(ttl).to_string()));
        }
        self.request(Method::POST, dir, &[], Some(form)).await
    }

    /// Wait (one long poll) for the first change at or after etcd index `wait_index` of `key`
    /// (or, `recursive`, of anything under it). `Ok(None)`: nothing within
    /// [`Timeouts::watch`]; ask again with the same index. An index older than etcd's history
    /// is an error for which [`V2Error::is_index_cleared`] holds: read again and watch from the
    /// index of that read plus one.
    #[tracing::instrument(level = "trace", skip(self))]
    pub async fn watch(
        &self,
        key: &str,
        recursive: bool,
        wait_index: u64,
    ) -> Result<Option<Response>, V2Error> {
        let mut query = vec![
            ("wait", "true".to_owned()),
            ("waitIndex", wait_index.to_string()),
        ];
        if recursive {
            query.push(("recursive", "true".to_owned()));
        }
        self.call(Method::GET, key, &query, None, Wait::LongPoll)
            .await
    }

    /// A streaming watch (`stream=true`) of `key` (recursive or not) from etcd index
    /// `wait_index`, on the endpoint that answered last: etcd keeps the answer open and sends
    /// every later event on it, so a waiter that sees many changes asks once instead of once per
    /// change. See [`WatchStream`] for when it ends. An answer other than 2xx is asked again as
    /// a long poll, whose error (e.g. the index cleared) is returned.
    #[tracing::instrument(level = "trace", skip(self))]
    pub async fn watch_stream(
        &self,
        key: &str,
        recursive: bool,
        wait_index: u64,
    ) -> Result<WatchStream, V2Error> {
        let key = if key.starts_with('/') {
            key.to_owned()
        } else {
            format!("/{key}")
        };
        let i = self.current.load(Ordering::Relaxed) % self.endpoints.len();
        let at = At {
            endpoint: self.endpoints[i].clone(),
            method: "GET",
            key: key.clone(),
        };
        let mut query = vec![
            ("wait", "true".to_owned()),
            ("waitIndex", wait_index.to_string()),
            ("stream", "true".to_owned()),
        ];
        if recursive {
            query.push(("recursive", "true".to_owned()));
        }
        let request = self.build_request(&at, &Method::GET, &query, None)?;
        self.requests.fetch_add(1, Ordering::Relaxed);
        let response =
            match tokio::time::timeout(self.timeouts.request, self.http.request(request)).await {
                Ok(Ok(r)) if r.status().is_success() => r,
                Ok(Ok(r)) => {
                    drop(r);
                    return match self.watch(&key, recursive, wait_index).await {
                        Err(e) => Err(e),
                        Ok(_) => Err(V2Error::Unreachable {
                            at,
                            reason: "a streaming watch was refused".into(),
                        }),
                    };
                }
                Ok(Err(e)) => {
                    return Err(V2Error::Unreachable {
                        at,
                        reason: error_chain(&e),
                    })
                }
                Err(_) => {
                    return Err(V2Error::Unreachable {
                        at,
                        reason: format!("no answer within {:?}", self.timeouts.request),
                    })
                }
            };
        let opened_at = response
            .headers()
            .get("x-etcd-index")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        Ok(WatchStream::new(
            at,
            response.into_body(),
            opened_at,
            self.timeouts.watch,
        ))
    }

    /// A request that is not a watch: it always has an answer or an error.
    async fn request(
        &self,
        method: Method,
        key: &str,
        query: &[(&str, String)],
        form: Option<Vec<(&str, String)>>,
    ) -> Result<Response, V2Error> {
        let name = method_name(&method);
        match self.call(method, key, query, form, Wait::Request).await? {
            Some(r) => Ok(r),
            None => Err(V2Error::Unreachable {
                at: At {
                    endpoint: self.target(),
                    method: name,
                    key: key.to_owned(),
                },
                reason: "no answer".into(),
            }),
        }
    }

    /// One request, on the endpoint that answered last, then on the others while they cannot
    /// be reached or have no quorum ([`try_next`]).
    async fn call(
        &self,
        method: Method,
        key: &str,
        query: &[(&str, String)],
        form: Option<Vec<(&str, String)>>,
        wait: Wait,
    ) -> Result<Option<Response>, V2Error> {
        let key = if key.starts_with('/') {
            key.to_owned()
        } else {
            format!("/{key}")
        };
        let first = self.current.load(Ordering::Relaxed) % self.endpoints.len();
        let mut last_error = None;
        for step in 0..self.endpoints.len() {
            let i = (first + step) % self.endpoints.len();
            let endpoint = &self.endpoints[i];
            let at = At {
                endpoint: endpoint.clone(),
                method: method_name(&method),
                key: key.clone(),
            };
            match self.once(&at, &method, query, form.as_deref(), wait).await {
                Err(e) if try_next(&e) => {
                    tracing::debug!(error = %e, "etcd endpoint unreachable or without a quorum; trying the next one");
                    last_error = Some(e);
                }
                other => {
                    self.current.store(i, Ordering::Relaxed);
                    return other;
                }
            }
        }
        Err(last_error.unwrap_or_else(|| V2Error::Setting("no etcd endpoint".into())))
    }

    /// The HTTP request of one call on the endpoint of `at`.
    fn build_request(
        &self,
        at: &At,
        method: &Method,
        query: &[(&str, String)],
        form: Option<&[(&str, String)]>,
    ) -> Result<Request<Full<Bytes>>, V2Error> {
        let mut url = format!("{}/v2/keys{}", at.endpoint, escape_path(&at.key));
        if !query.is_empty() {
            let mut q = url::form_urlencoded::Serializer::new(String::new());
            for (k, v) in query {
                q.append_pair(k, v);
            }
            url.push('?');
            url.push_str(&q.finish());
        }
        let body = match form {
            Some(pairs) => {
                let mut f = url::form_urlencoded::Serializer::new(String::new());
                for (k, v) in pairs {
                    f.append_pair(k, v);
                }
                Bytes::from(f.finish())
            }
            None => Bytes::new(),
        };
        let mut request = Request::builder()
            .method(method.clone())
            .uri(&url)
            .header(ACCEPT, HeaderValue::from_static("application/json"))
            .header(
                USER_AGENT,
                HeaderValue::from_static(concat!("rebootd/", env!("CARGO_PKG_VERSION"))),
            );
        if form.is_some() {
            request = request.header(
                CONTENT_TYPE,
                HeaderValue::from_static("application/x-www-form-urlencoded"),
            );
        }
        if let Some(auth) = &self.authorization {
            request = request.header(AUTHORIZATION, auth.clone());
        }
        request
            .body(Full::new(body))
            .map_err(|e| V2Error::Unreachable {
                at: at.clone(),
                reason: format!("cannot build the request: {e}"),
            })
    }

    async fn once(
        &self,
        at: &At,
        method: &Method,
        query: &[(&str, String)],
        form: Option<&[(&str, String)]>,
        wait: Wait,
    ) -> Result<Option<Response>, V2Error> {
        let request = self.build_request(at, method, query, form)?;
        let unreachable = |reason: String| V2Error::Unreachable {
            at: at.clone(),
            reason,
        };
        self.requests.fetch_add(1, Ordering::Relaxed);
        let response =
            match tokio::time::timeout(self.timeouts.request, self.http.request(request)).await {
                Err(_) => {
                    return Err(unreachable(format!(
                        "no answer within {:?}",
                        self.timeouts.request
                    )))
                }
                Ok(Err(e)) => return Err(unreachable(error_chain(&e))),
                Ok(Ok(r)) => r,
            };
        let status = response.status();
        let etcd_index = response
            .headers()
            .get("x-etcd-index")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok());
        let read_for = match wait {
            Wait::Request => self.timeouts.request,
            Wait::LongPoll if status.is_success() => self.timeouts.watch,
            Wait::LongPoll => self.timeouts.request,
        };
        let body =
            match tokio::time::timeout(read_for, http::read_body(response.into_body(), BODY_MAX))
                .await
            {
                Err(_) if wait == Wait::LongPoll && status.is_success() => return Ok(None),
                Err(_) => {
                    return Err(unreachable(format!(
                        "the answer (HTTP {status}) did not end within {read_for:?}"
                    )))
                }
                Ok(Err(e)) => {
                    return Err(unreachable(format!(
                        "reading the answer to HTTP {status}: {e}"
                    )))
                }
                Ok(Ok(b)) => b,
            };
        if status.is_success() {
            let Some(index) = etcd_index else {
                return Err(V2Error::NotEtcd {
                    at: at.clone(),
                    status: status.as_u16(),
                    answer: format!("no X-Etcd-Index header: {}", quote(&body)),
                });
            };
            return Response::parse(&body, index)
                .map(Some)
                .map_err(|reason| V2Error::NotEtcd {
                    at: at.clone(),
                    status: status.as_u16(),
                    answer: format!("{reason}: {}", quote(&body)),
                });
        }
        if let Ok(e) = serde_json::from_slice::<EtcdErrorBody>(&body) {
            return Err(V2Error::Etcd {
                at: at.clone(),
                code: e.error_code,
                message: e.message,
                cause: e.cause,
                index: e.index,
            });
        }
        if status == StatusCode::NOT_FOUND {
            return Err(match self.etcd_version(&at.endpoint).await {
                Some(version) => V2Error::NoV2Api {
                    at: at.clone(),
                    version,
                    answer: quote(&body),
                },
                None => V2Error::NotEtcd {
                    at: at.clone(),
                    status: status.as_u16(),
                    answer: quote(&body),
                },
            });
        }
        if status.is_server_error() {
            return Err(unreachable(format!("HTTP {status}: {}", quote(&body))));
        }
        Err(V2Error::NotEtcd {
            at: at.clone(),
            status: status.as_u16(),
            answer: quote(&body),
        })
    }
}

/// Whether a call goes on to the next endpoint after `e`: no answer, or a member that has no
/// quorum. A member cut off from the others still answers, but every write and quorum read
/// fails after etcd's request time-out with `Raft Internal Error` (`etcdserver: request timed
/// out`, code 300), or with code 301 during an election; another member may have a quorum.
/// Such a write may still be applied (as after a time-out on our side): callers write with
/// compare-and-swap, and a retry that finds it applied fails its comparison.
fn try_next(e: &V2Error) -> bool {
    use super::types::code;
    matches!(e, V2Error::Unreachable { .. })
        || matches!(e.code(), Some(code::RAFT_INTERNAL | code::LEADER_ELECT))
}

/// How long a request's answer may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wait {
    Request,
    /// A watch: the headers come at once, the body when something changes.
    LongPoll,
}

fn method_name(m: &Method) -> &'static str {
    match *m {
        Method::GET => "GET",
        Method::PUT => "PUT",
        Method::POST => "POST",
        Method::DELETE => "DELETE",
        _ => "request",
    }
}

/// Whole seconds, rounded up, at least 1 (etcd's TTL unit).
fn ttl_seconds(ttl: Duration) -> u64 {
    let s = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
    s.max(1)
}

/// An answer's text for an error: bounded and escaped ([`crate::text::clean_to`]).
fn quote(body: &[u8]) -> String {
    crate::text::clean_to(String::from_utf8_lossy(body).trim(), QUOTE_MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(endpoints: &[&str]) -> Settings {
        Settings {
            endpoints: endpoints.iter().map(|s| s.to_string()).collect(),
            tls: http::TlsFiles {
                table: "lock.etcd",
                ..http::TlsFiles::default()
            },
            ..Settings::default()
        }
    }

    fn setting_error(s: &Settings) -> String {
        match KeysClient::new(s) {
            Err(V2Error::Setting(m)) => m,
            Err(e) => panic!("expected a setting error, got {e}"),
            Ok(_) => panic!("expected a setting error, got a client"),
        }
    }

    #[test]
    fn keys_are_escaped_for_the_path() {
        assert_eq!(
            escape_path("/coreos.com/updateengine/rebootlock/groups/a%2Fb+c/semaphore"),
            "/coreos.com/updateengine/rebootlock/groups/a%252Fb%2Bc/semaphore"
        );
        assert_eq!(
            escape_path("/q/00000000000000001105"),
            "/q/00000000000000001105"
        );
    }

    #[test]
    fn ttls_round_up_to_whole_seconds() {
        assert_eq!(ttl_seconds(Duration::from_millis(1500)), 2);
        assert_eq!(ttl_seconds(Duration::from_secs(30)), 30);
        assert_eq!(ttl_seconds(Duration::ZERO), 1);
    }

    #[test]
    fn settings_are_checked() {
        assert!(KeysClient::new(&settings(&["http://127.0.0.1:2379"])).is_ok());
        assert!(setting_error(&settings(&[])).contains("lock.etcd.endpoints is empty"));
        assert!(setting_error(&settings(&["ftp://h:1"])).contains("scheme ftp://"));
        assert!(setting_error(&settings(&["http://h:1/v2"])).contains("scheme://host:port"));
        let m = setting_error(&settings(&["https://10.0.0.5:2379"]));
        assert!(m.contains("lock.etcd.ca_file"), "{m}");
        let mut s = settings(&["http://10.0.0.5:2379"]);
        s.tls.ca_file = Some("/nonexistent/ca.pem".into());
        assert!(setting_error(&s).contains("plain http://"));
        let mut s = settings(&["https://10.0.0.5:2379"]);
        s.tls.ca_file = Some("/nonexistent/ca.pem".into());
        assert!(setting_error(&s).contains("/nonexistent/ca.pem"));
    }
}
