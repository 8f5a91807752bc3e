//! Why a reboot is needed: which trigger said so (a [`TriggerSource`], a type) and what it saw.
//!
//! The state file keeps a need as the one string rebootd has always written there,
//! `<source>: <detail>` (e.g. `update_engine: UPDATE_STATUS_UPDATED_NEED_REBOOT (version 1.2)`),
//! so files written before the source became a type, and by this version, read both ways.

use serde::{Deserialize, Serialize};

/// The trigger that says a reboot is needed. Named on disk, in logs and in `--json` by its
/// configuration key (`update_engine`, `sentinel_file`, `sentinel_command`) or `rebootctl`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TriggerSource {
    /// update_engine's status says `UPDATE_STATUS_UPDATED_NEED_REBOOT` (`triggers.update_engine`).
    UpdateEngine,
    /// The sentinel file exists (`triggers.sentinel_file`).
    SentinelFile,
    /// The sentinel command exited 0 (`triggers.sentinel_command`).
    SentinelCommand,
    /// `rebootctl reboot` wrote its request file.
    Rebootctl,
}

impl TriggerSource {
    pub const ALL: [TriggerSource; 4] = [
        TriggerSource::UpdateEngine,
        TriggerSource::SentinelFile,
        TriggerSource::SentinelCommand,
        TriggerSource::Rebootctl,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            TriggerSource::UpdateEngine => "update_engine",
            TriggerSource::SentinelFile => "sentinel_file",
            TriggerSource::SentinelCommand => "sentinel_command",
            TriggerSource::Rebootctl => "rebootctl",
        }
    }
}

impl std::fmt::Display for TriggerSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for TriggerSource {
    type Err = NeedError;

    fn from_str(s: &str) -> Result<TriggerSource, NeedError> {
        TriggerSource::ALL
            .into_iter()
            .find(|t| t.as_str() == s)
            .ok_or_else(|| NeedError::UnknownSource {
                source_name: s.to_string(),
            })
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NeedError {
    #[error("unknown trigger {source_name:?} (known: update_engine, sentinel_file, sentinel_command, rebootctl)")]
    UnknownSource { source_name: String },
    #[error("reboot reason {value:?} is not `<trigger>: <what it saw>`")]
    Malformed { value: String },
}

/// A trigger's word that a reboot is needed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(into = "String", try_from = "String")]
pub struct Need {
    pub source: TriggerSource,
    /// What it saw, for logs and `rebootctl status`.
    pub detail: String,
}

impl Need {
    pub fn new(source: TriggerSource, detail: impl Into<String>) -> Need {
        Need {
            source,
            detail: detail.into(),
        }
    }
}

impl std::fmt::Display for Need {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.source, self.detail)
    }
}

impl From<Need> for String {
    fn from(n: Need) -> String {
        n.to_string()
    }
}

impl TryFrom<String> for Need {
    type Error = NeedError;

    fn try_from(value: String) -> Result<Need, NeedError> {
        let (source, detail) = value.split_once(": ").ok_or_else(|| NeedError::Malformed {
            value: value.clone(),
        })?;
        Ok(Need {
            source: source.parse()?,
            detail: detail.to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_string_form_round_trips_for_every_source() {
        for source in TriggerSource::ALL {
            let need = Need::new(source, "seen: with a colon");
            let text = need.to_string();
            assert!(text.starts_with(&format!("{source}: ")));
            assert_eq!(Need::try_from(text).unwrap(), need);
            let json = serde_json::to_string(&source).unwrap();
            assert_eq!(json, format!("\"{}\"", source.as_str()), "serde renames");
        }
    }

    #[test]
    fn bad_strings_name_what_is_wrong() {
        let e = Need::try_from("apt: upgraded".to_string()).unwrap_err();
        assert!(e.to_string().contains("unknown trigger \"apt\""), "{e}");
        let e = Need::try_from("no separator".to_string()).unwrap_err();
        assert!(e.to_string().contains("\"no separator\""), "{e}");
    }
}
