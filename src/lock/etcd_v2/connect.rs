//! Reaching the v2 store: the client settings of `[lock.etcd]` (TLS files, user and password
//! file) and the client's errors as the lock core sees them.

use super::BACKEND;
use crate::clients::etcd_v2::{Settings, V2Error};
use crate::config;
use crate::lock::LockError;

/// The client settings of `[lock.etcd]` (TLS files, user and password file).
pub fn client_settings(
    settings: &config::Etcd,
    timeouts: crate::clients::etcd_v2::Timeouts,
) -> Result<Settings, LockError> {
    let basic_auth = match (&settings.username, &settings.password_file) {
        (Some(user), Some(file)) => Some((user.clone(), read_password(file)?)),
        (None, None) => None,
        _ => {
            return Err(LockError::Refused(
                "lock.etcd.username and lock.etcd.password_file must be set together".into(),
            ))
        }
    };
    let client_cert = match (&settings.cert_file, &settings.key_file) {
        (Some(c), Some(k)) => Some((c.clone(), k.clone())),
        (None, None) => None,
        _ => {
            return Err(LockError::Refused(
                "lock.etcd.cert_file and lock.etcd.key_file must be set together".into(),
            ))
        }
    };
    Ok(Settings {
        endpoints: settings.endpoints.clone(),
        tls: crate::http::TlsFiles {
            table: "lock.etcd",
            ca_file: settings.ca_file.clone(),
            client_cert,
        },
        basic_auth,
        timeouts,
    })
}

fn read_password(file: &std::path::Path) -> Result<String, LockError> {
    let raw = std::fs::read(file).map_err(|e| {
        LockError::Refused(format!(
            "cannot read lock.etcd.password_file {}: {e}",
            file.display()
        ))
    })?;
    let text = String::from_utf8(raw).map_err(|_| {
        LockError::Refused(format!(
            "lock.etcd.password_file {} is not UTF-8",
            file.display()
        ))
    })?;
    let password = text.trim_end_matches(['\n', '\r']);
    if password.is_empty() {
        return Err(LockError::Refused(format!(
            "lock.etcd.password_file {} is empty",
            file.display()
        )));
    }
    Ok(password.to_owned())
}

/// A v2 client error as the lock core sees it: no answer (or etcd busy electing a leader) is
/// transient; everything else is permanent and says what to fix.
pub fn lock_error(e: V2Error) -> LockError {
    match e {
        V2Error::Unreachable { at, reason } => LockError::Unreachable {
            backend: BACKEND,
            target: at.endpoint,
            reason: format!("{} {}: {reason}", at.method, at.key),
        },
        e if e.is_transient() => LockError::Unreachable {
            backend: BACKEND,
            target: String::new(),
            reason: e.to_string(),
        },
        V2Error::Setting(m) => LockError::Refused(m),
        e @ (V2Error::NoV2Api { .. } | V2Error::NotEtcd { .. }) => {
            LockError::Refused(e.to_string())
        }
        e => LockError::Backend {
            backend: BACKEND,
            reason: e.to_string(),
        },
    }
}
