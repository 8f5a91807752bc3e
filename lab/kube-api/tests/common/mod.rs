//! Shared test helpers: start the stand-in, run the real kubectl against it, and a minimal
//! HTTP/1.1 client (whole responses and chunked watch streams).

#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Output;
use std::time::Duration;

use rebootd_lab_kube::{KubeApi, KubeApiHandle, Options};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// A running stand-in, its temporary directory and kubeconfig.
pub struct Lab {
    pub api: KubeApiHandle,
    pub dir: tempfile::TempDir,
    pub kubeconfig: PathBuf,
}

/// Fast simulated time: grace periods and readiness delays are a tenth of their nominal value.
pub fn fast() -> Options {
    Options {
        time_scale: 0.1,
        pod_ready_delay: Duration::from_secs(5),
        bookmark_interval: Duration::from_millis(200),
        ..Options::default()
    }
}

pub async fn start(opts: Options) -> Lab {
    let api = KubeApi::start(opts).await.expect("start the stand-in");
    let dir = tempfile::tempdir().expect("temp dir");
    let kubeconfig = dir.path().join("kubeconfig");
    api.write_kubeconfig(&kubeconfig).expect("write kubeconfig");
    Lab {
        api,
        dir,
        kubeconfig,
    }
}

/// The kubectl to test with: `$KUBECTL`, else /usr/bin/kubectl, else `kubectl` on PATH.
fn kubectl_path() -> PathBuf {
    if let Some(p) = std::env::var_os("KUBECTL") {
        return PathBuf::from(p);
    }
    let usr = PathBuf::from("/usr/bin/kubectl");
    if usr.exists() {
        return usr;
    }
    PathBuf::from("kubectl")
}

impl Lab {
    /// Run kubectl with this lab's kubeconfig and a private discovery cache.
    pub async fn kubectl(&self, args: &[&str]) -> Output {
        let cache = self.dir.path().join("kube-cache");
        tokio::process::Command::new(kubectl_path())
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .arg("--cache-dir")
            .arg(&cache)
            .arg("--request-timeout=20s")
            .args(args)
            .env_remove("KUBECONFIG")
            .env("HOME", self.dir.path())
            .kill_on_drop(true)
            .output()
            .await
            .expect("kubectl must be installed (set KUBECTL to its path)")
    }

    /// Run kubectl, require success, return stdout.
    pub async fn kubectl_ok(&self, args: &[&str]) -> String {
        let out = self.kubectl(args).await;
        assert!(
            out.status.success(),
            "kubectl {args:?} failed: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            String::from_utf8_lossy(&out.stdout)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Run kubectl with `-o json` appended and parse the output.
    pub async fn kubectl_json(&self, args: &[&str]) -> Value {
        let mut a = args.to_vec();
        a.extend(["-o", "json"]);
        let out = self.kubectl_ok(&a).await;
        serde_json::from_str(&out).expect("kubectl printed JSON")
    }

    pub fn http(&self) -> Http {
        Http {
            addr: self.api.addr().to_string(),
        }
    }
}

pub fn names(list: &Value) -> Vec<String> {
    list["items"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|i| i["metadata"]["name"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// A raw HTTP/1.1 client.
pub struct Http {
    addr: String,
}

/// A response.
#[derive(Debug)]
pub struct Resp {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Resp {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

async fn read_head(r: &mut BufReader<TcpStream>) -> (u16, Vec<(String, String)>) {
    let mut line = String::new();
    r.read_line(&mut line).await.expect("status line");
    let status: u16 = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("bad status line {line:?}"));
    let mut headers = Vec::new();
    loop {
        let mut h = String::new();
        r.read_line(&mut h).await.expect("header line");
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.push((k.trim().to_string(), v.trim().to_string()));
        }
    }
    (status, headers)
}

/// Read one chunk of a chunked body; `None` at the end.
async fn read_chunk(r: &mut BufReader<TcpStream>) -> Option<Vec<u8>> {
    let mut size = String::new();
    if r.read_line(&mut size).await.ok()? == 0 {
        return None;
    }
    let n = usize::from_str_radix(size.trim(), 16).ok()?;
    let mut buf = vec![0; n + 2];
    r.read_exact(&mut buf).await.ok()?;
    buf.truncate(n);
    if n == 0 {
        None
    } else {
        Some(buf)
    }
}

impl Http {
    async fn send(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<&[u8]>,
    ) -> BufReader<TcpStream> {
        let mut s = TcpStream::connect(&self.addr).await.expect("connect");
        let mut req = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\nAuthorization: Bearer test\r\n",
            self.addr
        );
        for (k, v) in headers {
            req.push_str(&format!("{k}: {v}\r\n"));
        }
        let body = body.unwrap_or_default();
        req.push_str(&format!("Content-Length: {}\r\n\r\n", body.len()));
        s.write_all(req.as_bytes()).await.expect("write");
        s.write_all(body).await.expect("write body");
        BufReader::new(s)
    }

    /// A whole request and response.
    pub async fn request(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<&Value>,
    ) -> Resp {
        let bytes = body.map(|b| serde_json::to_vec(b).expect("json"));
        let mut r = self.send(method, path, headers, bytes.as_deref()).await;
        let (status, headers) = read_head(&mut r).await;
        let chunked = headers
            .iter()
            .any(|(k, v)| k.eq_ignore_ascii_case("transfer-encoding") && v.contains("chunked"));
        let mut body = Vec::new();
        if chunked {
            while let Some(c) = read_chunk(&mut r).await {
                body.extend(c);
            }
        } else {
            r.read_to_end(&mut body).await.expect("body");
        }
        Resp {
            status,
            headers,
            body,
        }
    }

    pub async fn get(&self, path: &str) -> Resp {
        self.request("GET", path, &[], None).await
    }

    /// POST/PUT JSON.
    pub async fn send_json(&self, method: &str, path: &str, body: &Value) -> Resp {
        self.request(
            method,
            path,
            &[("Content-Type", "application/json")],
            Some(body),
        )
        .await
    }

    pub async fn patch(&self, path: &str, content_type: &str, body: &Value) -> Resp {
        self.request("PATCH", path, &[("Content-Type", content_type)], Some(body))
            .await
    }

    /// Start a watch (`path` includes `watch=true`).
    pub async fn watch(&self, path: &str) -> Watch {
        let mut r = self.send("GET", path, &[], None).await;
        let (status, _) = read_head(&mut r).await;
        assert_eq!(status, 200, "watch {path}");
        Watch {
            r,
            pending: Vec::new(),
        }
    }
}

/// A watch stream of JSON lines.
pub struct Watch {
    r: BufReader<TcpStream>,
    pending: Vec<u8>,
}

impl Watch {
    /// The next event, or `None` when the stream ends or `timeout` passes first.
    pub async fn next(&mut self, timeout: Duration) -> Option<Value> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Some(i) = self.pending.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.pending.drain(..=i).collect();
                return Some(serde_json::from_slice(&line).expect("watch line is JSON"));
            }
            let chunk = tokio::time::timeout_at(deadline, read_chunk(&mut self.r))
                .await
                .ok()??;
            self.pending.extend(chunk);
        }
    }

    /// The next event that is not a BOOKMARK.
    pub async fn next_change(&mut self, timeout: Duration) -> Option<Value> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let e = self.next(left).await?;
            if e["type"] != "BOOKMARK" {
                return Some(e);
            }
        }
    }
}
