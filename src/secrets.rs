//! Warnings about the secrets rebootd is configured with: a file holding one that group or
//! others may read (the etcd `password_file` and `key_file`, kubeconfigs, a gate's
//! `bearer_token_file`), and a password or token that would cross the network in clear over
//! `http://` (etcd user and password, a kubeconfig's token, a gate's bearer token). Warnings,
//! not errors: the host may be single-user, or the network a loopback or a tunnel. rebootd logs
//! them at start and `rebootd --check-config` prints them; each names the key and the file.
//!
//! (The webhook's `url_file` is stricter: group or others may not read it at all, see
//! `notify_webhook::read_url_file`.)

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use crate::config::{Config, GateCheck, LockBackend};

/// Every warning about this configuration's secrets; empty when there is none.
pub async fn warnings(config: &Config) -> Vec<String> {
    let mut out: Vec<String> = secret_files(config)
        .iter()
        .filter_map(|(key, path)| readable_by_others(key, path))
        .collect();
    out.extend(clear_text(config));
    for (key, path) in kubeconfigs(config) {
        out.extend(kubeconfig(&key, &path).await);
    }
    out
}

/// The files holding a secret, with their keys.
fn secret_files(config: &Config) -> Vec<(String, PathBuf)> {
    let mut files = Vec::new();
    if let LockBackend::Etcd(e) = &config.lock.backend {
        let keys = [
            ("lock.etcd.password_file", &e.password_file),
            ("lock.etcd.key_file", &e.key_file),
        ];
        for (key, path) in keys {
            if let Some(p) = path {
                files.push((key.to_string(), p.clone()));
            }
        }
    }
    files.extend(kubeconfigs(config));
    for (key, access) in prometheus_gates(config) {
        if let Some(p) = &access.bearer_token_file {
            files.push((format!("{key}.bearer_token_file"), p.clone()));
        }
    }
    files
}

/// The configured kubeconfig files (an inferred one is not rebootd's to judge), each once.
fn kubeconfigs(config: &Config) -> Vec<(String, PathBuf)> {
    let mut files: Vec<(String, PathBuf)> = Vec::new();
    let drain = config
        .kubernetes
        .as_ref()
        .and_then(|k| k.kubeconfig.clone());
    if let Some(p) = &drain {
        files.push(("kubernetes.kubeconfig".into(), p.clone()));
    }
    if let LockBackend::Kubernetes(k) = &config.lock.backend {
        if let Some(p) = k.kubeconfig.as_ref().filter(|p| Some(*p) != drain.as_ref()) {
            files.push(("lock.kubernetes.kubeconfig".into(), p.clone()));
        }
    }
    files
}

/// The Prometheus gates with their keys (`gates.before_reboot[1]`).
fn prometheus_gates(
    config: &Config,
) -> impl Iterator<Item = (&str, &crate::gate::prometheus::Access)> {
    let gates = &config.gates;
    gates
        .before_reboot
        .iter()
        .chain(&gates.after_boot)
        .filter_map(|g| match &g.check {
            GateCheck::Query { prometheus, .. } | GateCheck::Alerts { prometheus, .. } => {
                Some((g.key.as_str(), prometheus))
            }
            _ => None,
        })
}

/// A warning when group or others may read `path` (which holds the secret of `key`). A file
/// that cannot be looked at is not warned about here: using it fails with its own error.
pub fn readable_by_others(key: &str, path: &Path) -> Option<String> {
    let mode = std::fs::metadata(path).ok()?.permissions().mode() & 0o777;
    (mode & 0o044 != 0).then(|| {
        let shown = path.display();
        format!(
            "{key} {shown} holds a secret and group or others may read it (mode {mode:04o}); \
             chmod 600 {shown}"
        )
    })
}

/// Passwords and tokens the configuration would send over plain `http://`.
fn clear_text(config: &Config) -> Vec<String> {
    let mut out = Vec::new();
    if let LockBackend::Etcd(e) = &config.lock.backend {
        let plain: Vec<&str> = e
            .endpoints
            .iter()
            .filter(|u| u.starts_with("http://"))
            .map(String::as_str)
            .collect();
        if let (Some(_), false) = (&e.username, plain.is_empty()) {
            out.push(format!(
                "lock.etcd.username and lock.etcd.password_file: the password is sent in clear \
                 to the plain http:// endpoint(s) {}; use https://",
                plain.join(", ")
            ));
        }
    }
    for (key, access) in prometheus_gates(config) {
        if access.bearer_token_file.is_some() && access.url.starts_with("http://") {
            out.push(format!(
                "{key}.bearer_token_file: the token is sent in clear to the plain http:// \
                 {key}.prometheus_url {}; use https://",
                access.url
            ));
        }
    }
    for g in config
        .gates
        .before_reboot
        .iter()
        .chain(&config.gates.after_boot)
    {
        if let GateCheck::Alerts {
            prometheus,
            alertmanager_url: Some(am),
            ..
        } = &g.check
        {
            if prometheus.bearer_token_file.is_some() && am.starts_with("http://") {
                out.push(format!(
                    "{}.bearer_token_file: the token is sent in clear to the plain http:// \
                     {}.alertmanager_url {am}; use https://",
                    g.key, g.key
                ));
            }
        }
    }
    out
}

/// A kubeconfig whose current context sends a token or password to an `http://` server, and
/// the files of its user that group or others may read. One that does not load is not warned
/// about here (connecting says why).
async fn kubeconfig(key: &str, path: &Path) -> Vec<String> {
    let Ok(file) = kube::config::Kubeconfig::read_from(path) else {
        return Vec::new();
    };
    let Ok(k) =
        kube::Config::from_custom_kubeconfig(file, &kube::config::KubeConfigOptions::default())
            .await
    else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let auth = &k.auth_info;
    let credential = if auth.token.is_some() || auth.token_file.is_some() {
        Some("token")
    } else if auth.password.is_some() {
        Some("password")
    } else if auth.exec.is_some() || auth.auth_provider.is_some() {
        Some("token (from its exec or auth-provider plugin)")
    } else {
        None
    };
    if let (Some(what), Some("http")) = (credential, k.cluster_url.scheme_str()) {
        out.push(format!(
            "{key} {}: its user's {what} is sent in clear to the plain http:// server {}; \
             use https://",
            path.display(),
            k.cluster_url
        ));
    }
    let base = path.parent().unwrap_or(Path::new("."));
    let files = [
        ("token file", &auth.token_file),
        ("client key", &auth.client_key),
    ];
    for (what, file) in files {
        if let Some(f) = file {
            let f = base.join(f);
            let label = format!("{key} {}: its user's {what}", path.display());
            out.extend(readable_by_others(&label, &f));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(text: &str) -> Config {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(&path, text).unwrap();
        Config::load(&[path]).unwrap()
    }

    #[test]
    fn files_group_or_others_may_read_are_named_with_their_key() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("password");
        std::fs::write(&f, "s3cret\n").unwrap();
        for (mode, warned) in [(0o600, false), (0o400, false), (0o640, true), (0o604, true)] {
            std::fs::set_permissions(&f, std::fs::Permissions::from_mode(mode)).unwrap();
            let w = readable_by_others("lock.etcd.password_file", &f);
            assert_eq!(w.is_some(), warned, "{mode:o}: {w:?}");
            if let Some(w) = w {
                assert!(w.contains("lock.etcd.password_file"), "{w}");
                assert!(w.contains(&f.display().to_string()), "{w}");
                assert!(
                    w.contains(&format!("{mode:04o}")) && !w.contains("s3cret"),
                    "{w}"
                );
            }
        }
        assert_eq!(readable_by_others("k", &dir.path().join("missing")), None);
    }

    #[test]
    fn passwords_and_tokens_over_plain_http_are_named() {
        let c = config(
            "[lock]\nbackend = \"etcd\"\n[lock.etcd]\n\
             endpoints = [\"https://a:2379\", \"http://b:2379\"]\n\
             username = \"u\"\npassword_file = \"/p\"\n\
             [[gates.before_reboot]]\nprometheus_url = \"http://prom:9090\"\nquery = \"up\"\n\
             bearer_token_file = \"/t\"\n\
             [[gates.after_boot]]\nprometheus_url = \"https://prom:9090\"\nalerts = []\n\
             alertmanager_url = \"http://am:9093\"\nbearer_token_file = \"/t\"\n",
        );
        let w = clear_text(&c);
        assert_eq!(w.len(), 3, "{w:#?}");
        assert!(w[0].contains("lock.etcd.username") && w[0].contains("http://b:2379"));
        assert!(!w[0].contains("https://a:2379"), "{}", w[0]);
        assert!(w[1].contains("gates.before_reboot[1].bearer_token_file"));
        assert!(w[1].contains("http://prom:9090"));
        assert!(w[2].contains("gates.after_boot[1].alertmanager_url http://am:9093"));
        let tls = config(
            "[lock]\nbackend = \"etcd\"\n[lock.etcd]\nendpoints = [\"https://a:2379\"]\n\
             username = \"u\"\npassword_file = \"/p\"\n\
             [[gates.before_reboot]]\nprometheus_url = \"http://prom:9090\"\nquery = \"up\"\n",
        );
        assert!(clear_text(&tls).is_empty(), "{:?}", clear_text(&tls));
    }
}
