//! The kubeconfig that points kubectl and kube-rs at the stand-in (one cluster, one context,
//! a bearer token naming the user so the request log can tell clients apart).

use std::path::Path;

use crate::error::Error;

/// A kubeconfig document (YAML) for `server`, user `user`, default namespace `namespace`.
pub fn render(server: &str, user: &str, namespace: &str) -> String {
    format!(
        "apiVersion: v1
kind: Config
preferences: {{}}
clusters:
- name: rebootd-lab
  cluster:
    server: {server}
contexts:
- name: rebootd-lab
  context:
    cluster: rebootd-lab
    user: {user}
    namespace: {namespace}
current-context: rebootd-lab
users:
- name: {user}
  user:
    token: {user}
"
    )
}

/// Write a kubeconfig file (mode 0600, like kubectl's own).
pub fn write(path: &Path, contents: &str) -> Result<(), Error> {
    let err = |source| Error::Kubeconfig {
        path: path.to_path_buf(),
        source,
    };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(err)?;
    }
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, contents).map_err(err)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600)).map_err(err)?;
    }
    std::fs::rename(&tmp, path).map_err(err)
}
