//! A small FleetLock server (Zincati's reboot-lock protocol) with a real counting semaphore per
//! group, for tests of rebootd's `fleetlock` backend. It answers as airlock does:
//!
//! - `POST /v1/pre-reboot` and `POST /v1/steady-state` with header `fleet-lock-protocol: true`
//!   and body `{"client_params": {"id": ..., "group": ...}}`;
//! - 200 with an empty body on success: a lock by a holder is granted again (recursive), an
//!   unlock by a non-holder succeeds;
//! - all slots taken: airlock's 500 with kind `failed_lock` ([`BusyAnswer::Airlock`], the default)
//!   or poseidon/fleetlock's 423 with kind `locked` ([`BusyAnswer::Poseidon`]);
//! - a missing or wrong header, a body that is not such JSON, an empty id or group: 400 with kind
//!   `invalid_client_identity` (values as airlock words them: `failed to validate client
//!   identity: wrong 'fleet-lock-protocol' header`, `... empty client group`, `... empty client
//!   ID`); another path: a plain-text 404. Like airlock, the method is not checked (a `GET` with
//!   no body is an invalid identity; a `PUT` with one works as a `POST`). Checked against the
//!   real airlock by `tests/fleetlock.rs`.
//!
//! Error bodies are `{"kind": ..., "value": ...}`, written as airlock's Go `http.Error` writes
//! them (`text/plain`, trailing newline). Every group has [`FleetLockServer::set_max`] slots; all
//! groups exist unless [`FleetLockServer::only_groups`] says otherwise (others get airlock's 400
//! `unknown_group`).
//!
//! Faults: [`FleetLockServer::fail_next`] makes the next requests answer 500
//! `internal_error`. Tests observe and wait on the server's state ([`ServerState`]) without
//! sleeping: [`FleetLockServer::wait_for`].

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;

/// How the server answers a lock request when every slot is taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BusyAnswer {
    /// airlock: 500, kind `failed_lock`, value `all N semaphore slots currently locked`.
    #[default]
    Airlock,
    /// poseidon/fleetlock: 423 Locked, kind `locked`.
    Poseidon,
}

/// One group's semaphore.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GroupState {
    /// Holder ids, in the order they took their slots.
    pub holders: Vec<String>,
    /// The most holders this group ever had at once.
    pub peak: usize,
}

/// Everything the server knows, as tests see it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServerState {
    /// Slots of every group.
    pub max: u64,
    pub groups: BTreeMap<String, GroupState>,
    pub busy_answer: BusyAnswer,
    /// The groups that exist; `None` = every group. Others get airlock's 400 `unknown_group`.
    pub known_groups: Option<Vec<String>>,
    /// Requests answered, of any kind.
    pub requests: u64,
    pub pre_reboot_requests: u64,
    pub steady_state_requests: u64,
    /// `pre-reboot` answers that gave a slot to a new holder (not re-grants).
    pub grants: u64,
    /// `pre-reboot` answers "all slots taken".
    pub denials: u64,
    /// Answers with status 400.
    pub bad_requests: u64,
    /// Requests still to answer with 500 `internal_error`.
    pub fail_next: u32,
    /// Answers of injected 500s so far.
    pub injected_failures: u64,
}

impl ServerState {
    /// Holders of `group` (empty for a group never used).
    pub fn holders(&self, group: &str) -> Vec<String> {
        self.groups
            .get(group)
            .map(|g| g.holders.clone())
            .unwrap_or_default()
    }

    /// The most holders `group` ever had at once.
    pub fn peak(&self, group: &str) -> usize {
        self.groups.get(group).map_or(0, |g| g.peak)
    }
}

/// A wait on the server's state did not end in time.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("FleetLock server state: condition not met within {timeout:?}; state: {state:?}")]
pub struct WaitTimeout {
    pub timeout: Duration,
    pub state: ServerState,
}

/// A FleetLock server on a free loopback port; stops when dropped.
pub struct FleetLockServer {
    addr: SocketAddr,
    state: watch::Sender<ServerState>,
    task: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for FleetLockServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FleetLockServer")
            .field("addr", &self.addr)
            .field("state", &*self.state.borrow())
            .finish()
    }
}

impl FleetLockServer {
    /// Start a server on 127.0.0.1 (a free port) whose groups have `max` slots each.
    pub async fn start(max: u64) -> std::io::Result<Self> {
        Self::start_on(SocketAddr::from(([127, 0, 0, 1], 0)), max).await
    }

    /// [`FleetLockServer::start`] on a given address (port 0 = a free one).
    pub async fn start_on(addr: SocketAddr, max: u64) -> std::io::Result<Self> {
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let (state, _) = watch::channel(ServerState {
            max,
            ..ServerState::default()
        });
        let task = tokio::spawn(accept_loop(listener, state.clone()));
        tracing::debug!(%addr, max, "FleetLock server started");
        Ok(FleetLockServer { addr, state, task })
    }

    /// The base URL clients use (`http://127.0.0.1:PORT`).
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Holders of the group `default`.
    pub fn holders(&self) -> Vec<String> {
        self.holders_of("default")
    }

    pub fn holders_of(&self, group: &str) -> Vec<String> {
        self.state.borrow().holders(group)
    }

    /// Change the number of slots of every group (holders beyond it keep their slots).
    pub fn set_max(&self, n: u64) {
        self.state.send_modify(|s| s.max = n);
    }

    /// Make only these groups exist (airlock serves the groups it is configured with).
    pub fn only_groups(&self, groups: &[&str]) {
        let groups = groups.iter().map(|g| g.to_string()).collect();
        self.state.send_modify(|s| s.known_groups = Some(groups));
    }

    pub fn set_busy_answer(&self, answer: BusyAnswer) {
        self.state.send_modify(|s| s.busy_answer = answer);
    }

    /// Answer the next `n` requests with 500 `internal_error`, touching nothing.
    pub fn fail_next(&self, n: u32) {
        self.state.send_modify(|s| s.fail_next = n);
    }

    /// Requests answered so far.
    pub fn requests(&self) -> u64 {
        self.state.borrow().requests
    }

    /// A function reading the state, to hand to code that cannot borrow the server.
    pub fn state_handle(&self) -> impl Fn() -> ServerState + Send + Sync + 'static {
        let rx = self.state.subscribe();
        move || rx.borrow().clone()
    }

    /// A copy of the whole state.
    pub fn state(&self) -> ServerState {
        self.state.borrow().clone()
    }

    /// Wait until `cond` holds on the state (checked at once and after every change).
    pub async fn wait_for<F>(
        &self,
        timeout: Duration,
        mut cond: F,
    ) -> Result<ServerState, WaitTimeout>
    where
        F: FnMut(&ServerState) -> bool,
    {
        let mut rx = self.state.subscribe();
        let waited = tokio::time::timeout(timeout, async {
            rx.wait_for(|s| cond(s)).await.map(|s| s.clone())
        })
        .await;
        match waited {
            Ok(Ok(s)) => Ok(s),
            // The sender lives in `self`: it cannot be closed while we borrow it.
            Ok(Err(_)) | Err(_) => Err(WaitTimeout {
                timeout,
                state: self.state(),
            }),
        }
    }

    /// Stop serving; open connections are cut.
    pub fn stop(&self) {
        self.task.abort();
    }
}

impl Drop for FleetLockServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn accept_loop(listener: TcpListener, state: watch::Sender<ServerState>) {
    // Connections live in the set, so aborting this task cuts them too.
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            r = listener.accept() => match r {
                Ok((stream, _)) => {
                    let state = state.clone();
                    conns.spawn(async move {
                        let svc = service_fn(move |req| {
                            let state = state.clone();
                            async move { Ok::<_, Infallible>(handle(&state, req).await) }
                        });
                        if let Err(e) = http1::Builder::new()
                            .serve_connection(TokioIo::new(stream), svc)
                            .await
                        {
                            tracing::debug!("FleetLock connection ended: {e}");
                        }
                    });
                }
                Err(e) => {
                    tracing::warn!("FleetLock server: accept failed: {e}");
                    tokio::task::yield_now().await;
                }
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
}

type Body = Full<Bytes>;

/// airlock's error answers: Go's `http.Error` with a JSON text.
fn error(status: StatusCode, kind: &str, value: &str) -> Response<Body> {
    let text = serde_json::json!({ "kind": kind, "value": value }).to_string() + "\n";
    let mut r = Response::new(Full::new(Bytes::from(text)));
    *r.status_mut() = status;
    r.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r.headers_mut().insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    r
}

fn ok() -> Response<Body> {
    Response::new(Full::new(Bytes::new()))
}

#[derive(serde::Deserialize)]
struct Message {
    #[serde(default)]
    client_params: ClientParams,
}

#[derive(serde::Deserialize, Default)]
struct ClientParams {
    #[serde(default)]
    id: String,
    #[serde(default)]
    group: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Call {
    PreReboot,
    SteadyState,
}

async fn handle(state: &watch::Sender<ServerState>, req: Request<Incoming>) -> Response<Body> {
    let call = match req.uri().path() {
        "/v1/pre-reboot" => Some(Call::PreReboot),
        "/v1/steady-state" => Some(Call::SteadyState),
        _ => None,
    };
    let method = req.method().clone();
    let header_ok = req
        .headers()
        .get("fleet-lock-protocol")
        .is_some_and(|v| v.as_bytes() == b"true");
    let body = Limited::new(req.into_body(), 64 * 1024)
        .collect()
        .await
        .map(|b| b.to_bytes())
        .map_err(|e| e.to_string());

    let mut answer = None;
    state.send_modify(|s| {
        s.requests += 1;
        match call {
            Some(Call::PreReboot) => s.pre_reboot_requests += 1,
            Some(Call::SteadyState) => s.steady_state_requests += 1,
            None => {}
        }
        if s.fail_next > 0 {
            s.fail_next -= 1;
            s.injected_failures += 1;
            answer = Some(error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal_error",
                "injected failure",
            ));
            return;
        }
        let r = answer_to(s, call, &method, header_ok, &body);
        if r.status() == StatusCode::BAD_REQUEST {
            s.bad_requests += 1;
        }
        answer = Some(r);
    });
    answer.unwrap_or_else(|| {
        error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal_error",
            "no answer",
        )
    })
}

/// The answer to one request, changing the semaphore as it says.
fn answer_to(
    s: &mut ServerState,
    call: Option<Call>,
    method: &Method,
    header_ok: bool,
    body: &Result<Bytes, String>,
) -> Response<Body> {
    let Some(call) = call else {
        let mut r = Response::new(Full::new(Bytes::from_static(b"404 page not found\n")));
        *r.status_mut() = StatusCode::NOT_FOUND;
        return r;
    };
    // airlock reads any method's body: no 405.
    let _ = method;
    let invalid = |why: String| {
        error(
            StatusCode::BAD_REQUEST,
            "invalid_client_identity",
            &format!("failed to validate client identity: {why}"),
        )
    };
    if !header_ok {
        return invalid("wrong 'fleet-lock-protocol' header".into());
    }
    let body = match body {
        Ok(b) => b,
        Err(e) => return invalid(format!("reading the body: {e}")),
    };
    if body.is_empty() {
        // Go's json decoder on an empty body.
        return invalid("EOF".into());
    }
    let msg: Message = match serde_json::from_slice(body) {
        Ok(m) => m,
        Err(e) => return invalid(e.to_string()),
    };
    let ClientParams { id, group } = msg.client_params;
    if group.is_empty() {
        return invalid("empty client group".into());
    }
    if id.is_empty() {
        return invalid("empty client ID".into());
    }
    if s.known_groups.as_ref().is_some_and(|k| !k.contains(&group)) {
        return error(
            StatusCode::BAD_REQUEST,
            "unknown_group",
            &format!("unknown group {group:?}"),
        );
    }
    let max = s.max;
    let g = s.groups.entry(group.clone()).or_default();
    match call {
        Call::PreReboot => {
            if g.holders.contains(&id) {
                tracing::debug!(%group, %id, "FleetLock: re-lock by a holder");
                return ok();
            }
            if g.holders.len() as u64 >= max {
                s.denials += 1;
                return match s.busy_answer {
                    BusyAnswer::Airlock => error(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "failed_lock",
                        &format!("all {max} semaphore slots currently locked"),
                    ),
                    BusyAnswer::Poseidon => error(
                        StatusCode::LOCKED,
                        "locked",
                        &format!(
                            "reboot lease unavailable: all {max} slots of group {group} are held"
                        ),
                    ),
                };
            }
            g.holders.push(id.clone());
            g.peak = g.peak.max(g.holders.len());
            s.grants += 1;
            tracing::debug!(%group, %id, holders = ?g.holders, "FleetLock: slot granted");
            ok()
        }
        Call::SteadyState => {
            g.holders.retain(|h| h != &id);
            tracing::debug!(%group, %id, holders = ?g.holders, "FleetLock: unlock if held");
            ok()
        }
    }
}
