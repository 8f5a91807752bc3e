//! `rebootd --check-config`: everything rebootd checks before it first talks to anything,
//! without talking to anything. The configuration is valid already (it loaded); this reads
//! the files it names and applies the rules connecting applies: the identity files, the lock
//! store's endpoints, TLS rules and files (parsed, not just opened), the password file, the
//! kubeconfigs and label selectors, and that the sentinel command can be found.

use crate::config::{Config, EtcdApi, LockBackend};
use std::path::{Path, PathBuf};

/// Every problem found, each naming the key and the file; empty when all is well.
pub async fn offline(config: &Config) -> Vec<String> {
    let mut problems = Vec::new();
    // The identity files; the holder token in the state directory is made at the first start.
    let identity = crate::runtime::holder_id(config)
        .and_then(|_| crate::runtime::read_id("the boot id", &config.identity.boot_id_file));
    if let Err(e) = identity {
        problems.push(e.to_string());
    }
    match &config.lock.backend {
        LockBackend::None => {}
        LockBackend::Etcd(settings) if settings.api == EtcdApi::V3 => {
            if let Err(e) = crate::clients::etcd_v3::check_settings(settings) {
                problems.push(e.to_string());
            }
        }
        // Opening it builds the client: the URL, the group, the TLS rules and the CA file.
        LockBackend::Etcd(_) | LockBackend::FleetLock(_) | LockBackend::Kubernetes(_) => {
            if let Err(e) = crate::lock::open::open(config).await {
                problems.push(e.to_string());
            }
        }
    }
    if let Some(k) = &config.kubernetes {
        match crate::kube_client::connect(k.kubeconfig.as_deref()).await {
            Ok(client) => {
                if let Err(e) =
                    crate::drain::KubeDrainer::new(client, &config.identity.node_name, k)
                {
                    problems.push(format!("[kubernetes]: {e}"));
                }
            }
            Err(e) => problems.push(format!("[kubernetes]: {e}")),
        }
    }
    // Building the sender reads the URL and the CA file (it sends nothing).
    if let Some(w) = &config.webhook {
        if let Err(e) = crate::notify_webhook::Webhook::start(w) {
            problems.push(format!("[webhook]: {e}"));
        }
    }
    // Building the gates reads their URLs; a command gate's program must be there.
    if let Err(e) = crate::runtime::open_gates(config).await {
        problems.push(e.to_string());
    }
    let lists = [
        ("gates.before_reboot", &config.gates.before_reboot),
        ("gates.after_boot", &config.gates.after_boot),
    ];
    for (list, gates) in lists {
        for (i, g) in gates.iter().enumerate() {
            if let crate::config::GateCheck::Command { argv } = &g.check {
                let program = argv.first().map(String::as_str).unwrap_or("");
                if let Err(why) = find_program(program) {
                    problems.push(format!("{list}[{}].command: {program:?}: {why}", i + 1));
                }
            }
        }
    }
    if let Some(cmd) = &config.triggers.sentinel_command {
        if let Err(why) = find_program(&cmd[0]) {
            problems.push(format!("triggers.sentinel_command: {:?}: {why}", cmd[0]));
        }
    }
    problems
}

/// Why a command's program would not run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
enum ProgramError {
    #[error("not an executable file")]
    NotExecutable,
    #[error("not found in PATH")]
    NotInPath,
}

/// The program a command would run: a path, or a name looked up in `PATH` as `execvp` does.
fn find_program(program: &str) -> Result<PathBuf, ProgramError> {
    use std::os::unix::fs::PermissionsExt;
    let runnable = |p: &Path| {
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if program.contains('/') {
        return if runnable(Path::new(program)) {
            Ok(program.into())
        } else {
            Err(ProgramError::NotExecutable)
        };
    }
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into());
    std::env::split_paths(&path)
        .map(|d| d.join(program))
        .find(|p| runnable(p))
        .ok_or(ProgramError::NotInPath)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn programs_are_found_as_execvp_finds_them() {
        assert!(find_program("sh").is_ok());
        assert!(find_program("/bin/sh").is_ok());
        let dir = tempfile::tempdir().unwrap();
        let plain = dir.path().join("not-executable");
        std::fs::write(&plain, "#!/bin/sh\n").unwrap();
        assert!(find_program(plain.to_str().unwrap()).is_err());
        assert!(
            find_program(dir.path().to_str().unwrap()).is_err(),
            "a directory"
        );
        assert_eq!(
            find_program("no-such-program-here"),
            Err(ProgramError::NotInPath)
        );
    }
}
