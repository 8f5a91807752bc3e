//! The binary's one HTTP client stack (hyper 1 over rustls with the ring provider, HTTP/1.1),
//! shared by every client that speaks HTTP: the FleetLock client, the etcd v2 keys client, the
//! Prometheus gates and the webhook sender. (etcd v3 speaks gRPC through `etcd-client`,
//! Kubernetes goes through kube-rs.)
//!
//! [`client`] builds a pooled client from [`TlsFiles`]: the CA(s) to trust instead of the
//! system roots, and optionally a client certificate. Errors name the setting and the file.
//! [`read_body`] reads an answer up to a cap: every body rebootd reads goes through it, so no
//! server can make rebootd hold more than the cap in memory. [`redact`] is how a URL that is a
//! secret (a webhook's) is shown.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper_rustls::{ConfigBuilderExt, HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// A pooled HTTP/1.1 client for `http://` and `https://` URLs.
pub type HttpClient = Client<HttpsConnector<HttpConnector>, Full<Bytes>>;

/// The TLS files of one client, and the configuration keys they came from (for errors).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsFiles {
    /// The table the settings are in, e.g. `lock.etcd`; errors say `<table>.ca_file` etc.
    pub table: &'static str,
    /// PEM file of the CA(s) to trust instead of the system roots.
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate (chain) and its private key, presented when the server asks.
    pub client_cert: Option<(PathBuf, PathBuf)>,
}

/// A setting the client cannot be built with; the text names the key and the file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct SetupError(pub String);

/// A client with these TLS files (the system roots when `https` and no `ca_file`), connecting
/// within `connect_timeout`, with TCP keep-alive so a silent peer of a long poll is noticed.
pub fn client(
    https: bool,
    tls: &TlsFiles,
    connect_timeout: Duration,
) -> Result<HttpClient, SetupError> {
    let config = tls_config(https, tls)?;
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_connect_timeout(Some(connect_timeout));
    http.set_nodelay(true);
    http.set_keepalive(Some(Duration::from_secs(30)));
    let connector = HttpsConnectorBuilder::new()
        .with_tls_config(config)
        .https_or_http()
        .enable_http1()
        .wrap_connector(http);
    Ok(Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(30))
        .build(connector))
}

fn read(table: &str, key: &str, path: &Path) -> Result<Vec<u8>, SetupError> {
    std::fs::read(path)
        .map_err(|e| SetupError(format!("cannot read {table}.{key} {}: {e}", path.display())))
}

/// rustls configuration: `ca_file` or (for `https://`) the system roots, and the client
/// certificate if any. For `http://` without TLS files an empty one (never used; the connector
/// needs one).
fn tls_config(https: bool, tls: &TlsFiles) -> Result<rustls::ClientConfig, SetupError> {
    let table = tls.table;
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| SetupError(format!("{table}: TLS setup: {e}")))?;
    let builder = match &tls.ca_file {
        Some(path) => {
            let pem = read(table, "ca_file", path)?;
            let bad = |e: String| SetupError(format!("{table}.ca_file {}: {e}", path.display()));
            let mut roots = rustls::RootCertStore::empty();
            for cert in CertificateDer::pem_slice_iter(&pem) {
                roots
                    .add(cert.map_err(|e| bad(e.to_string()))?)
                    .map_err(|e| bad(e.to_string()))?;
            }
            if roots.is_empty() {
                return Err(SetupError(format!(
                    "{table}.ca_file {} holds no certificate",
                    path.display()
                )));
            }
            builder.with_root_certificates(roots)
        }
        None if https => builder.with_native_roots().map_err(|e| {
            SetupError(format!(
                "{table}: no system CA certificates for https:// ({e}); set {table}.ca_file"
            ))
        })?,
        None => builder.with_root_certificates(rustls::RootCertStore::empty()),
    };
    match &tls.client_cert {
        None => Ok(builder.with_no_client_auth()),
        Some((cert, key)) => {
            let pem = read(table, "cert_file", cert)?;
            let chain = CertificateDer::pem_slice_iter(&pem)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| SetupError(format!("{table}.cert_file {}: {e}", cert.display())))?;
            if chain.is_empty() {
                return Err(SetupError(format!(
                    "{table}.cert_file {} holds no certificate",
                    cert.display()
                )));
            }
            let key_pem = read(table, "key_file", key)?;
            let private = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| {
                SetupError(format!(
                    "{table}.key_file {} holds no usable private key: {e}",
                    key.display()
                ))
            })?;
            builder.with_client_auth_cert(chain, private).map_err(|e| {
                SetupError(format!(
                    "{table}.cert_file {} and {table}.key_file {}: {e}",
                    cert.display(),
                    key.display()
                ))
            })
        }
    }
}

/// Why an answer's body could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BodyError {
    /// Longer than the cap: the rest was not read.
    #[error("the answer is longer than {} (the most rebootd reads)", size(*cap))]
    TooLong { cap: usize },
    /// The connection broke (or the server misbehaved) before the end.
    #[error("{0}")]
    Broken(String),
}

/// The whole body, or an error when it is longer than `cap` bytes (not read past the cap).
pub async fn read_body<B>(body: B, cap: usize) -> Result<Bytes, BodyError>
where
    B: hyper::body::Body,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    match Limited::new(body, cap).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(BodyError::TooLong { cap }),
        Err(e) => Err(BodyError::Broken(error_chain(&*e))),
    }
}

/// `cap` bytes for people: `64 KiB`, `16 MiB`, `300 bytes`.
fn size(cap: usize) -> String {
    const KIB: usize = 1024;
    const MIB: usize = 1024 * KIB;
    if cap >= MIB && cap.is_multiple_of(MIB) {
        format!("{} MiB", cap / MIB)
    } else if cap >= KIB && cap.is_multiple_of(KIB) {
        format!("{} KiB", cap / KIB)
    } else {
        format!("{cap} bytes")
    }
}

/// A URL that is a secret as it may be shown: scheme, host and port only
/// (`https://hooks.slack.com/…`); the user, path, query and fragment are left out.
pub fn redact(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(u) => {
            let host = u.host_str().unwrap_or("");
            let port = u.port().map(|p| format!(":{p}")).unwrap_or_default();
            format!("{}://{host}{port}/…", u.scheme())
        }
        Err(_) => "(a URL that does not parse; not shown, it may be a secret)".into(),
    }
}

/// An error and its causes, e.g. "client error (Connect): tcp connect error: Connection refused
/// (os error 111)".
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let part = s.to_string();
        if !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        source = s.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(ca: Option<PathBuf>, cert: Option<(PathBuf, PathBuf)>) -> TlsFiles {
        TlsFiles {
            table: "lock.etcd",
            ca_file: ca,
            client_cert: cert,
        }
    }

    #[test]
    fn errors_name_the_setting_and_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.pem");
        let e = client(
            true,
            &files(Some(missing.clone()), None),
            Duration::from_secs(1),
        )
        .unwrap_err();
        assert!(
            e.0.contains("lock.etcd.ca_file") && e.0.contains(&missing.display().to_string()),
            "{e}"
        );
        let junk = dir.path().join("junk.pem");
        std::fs::write(&junk, "not a certificate\n").unwrap();
        let e = client(
            true,
            &files(Some(junk.clone()), None),
            Duration::from_secs(1),
        )
        .unwrap_err();
        assert!(e.0.contains("holds no certificate"), "{e}");
        // A client certificate that is not one, with a key that is not one.
        let e = client(
            false,
            &files(None, Some((junk.clone(), missing.clone()))),
            Duration::from_secs(1),
        )
        .unwrap_err();
        assert!(e.0.contains("lock.etcd.cert_file"), "{e}");
    }

    #[tokio::test]
    async fn bodies_are_read_up_to_the_cap_and_an_over_cap_one_says_the_cap() {
        let body = |n: usize| Full::new(Bytes::from(vec![b'x'; n]));
        assert_eq!(
            read_body(body(64 * 1024), 64 * 1024).await.unwrap().len(),
            64 * 1024
        );
        let e = read_body(body(64 * 1024 + 1), 64 * 1024).await.unwrap_err();
        assert_eq!(e, BodyError::TooLong { cap: 64 * 1024 });
        assert!(e.to_string().contains("longer than 64 KiB"), "{e}");
        let e = read_body(body(17 << 20), 16 << 20).await.unwrap_err();
        assert!(e.to_string().contains("16 MiB"), "{e}");
        let e = read_body(body(301), 300).await.unwrap_err();
        assert!(e.to_string().contains("300 bytes"), "{e}");
    }

    #[test]
    fn redacted_urls_keep_the_scheme_and_host_only() {
        assert_eq!(
            redact("https://hooks.slack.com/services/T0/B0/s3cret?x=1#f"),
            "https://hooks.slack.com/…"
        );
        assert_eq!(
            redact("http://user:pw@127.0.0.1:8080/hook?token=s3cret"),
            "http://127.0.0.1:8080/…"
        );
        let bad = redact("hooks.slack.com/services/s3cret");
        assert!(!bad.contains("s3cret"), "{bad}");
    }

    #[test]
    fn plain_http_needs_no_files() {
        assert!(client(false, &files(None, None), Duration::from_secs(1)).is_ok());
    }
}
