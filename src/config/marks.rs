//! `[kubernetes] reboot_labels`, `reboot_taint`, `exclude_from_load_balancers`: what rebootd
//! puts on its Node while rebooting (`crate::drain::marks`), validated with the file, key and
//! value of a bad one.

use super::gates::is_key;
use super::input::{KubernetesInput, TaintEffectInput};
use super::{file_of, ConfigError};
use crate::drain::marks::{Marks, TaintEffect, EXCLUDE_LB};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// A label value: empty, or at most 63 characters, alphanumeric at both ends, `-_.` inside.
fn is_label_value(v: &str) -> bool {
    v.is_empty()
        || (v.len() <= 63
            && v.starts_with(|c: char| c.is_ascii_alphanumeric())
            && v.ends_with(|c: char| c.is_ascii_alphanumeric())
            && v.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
}

pub(super) fn validate(
    k: &KubernetesInput,
    origin: &BTreeMap<String, PathBuf>,
) -> Result<Marks, ConfigError> {
    let labels = k.reboot_labels.clone().unwrap_or_default();
    for (key, value) in &labels {
        let bad = |reason: &str| ConfigError::Invalid {
            path: file_of(origin, &format!("kubernetes.reboot_labels.{key}")),
            key: format!("kubernetes.reboot_labels.{key:?}"),
            value: format!("{value:?}"),
            reason: reason.into(),
        };
        if !is_key(key) {
            return Err(bad("not a Kubernetes label key ([prefix/]name)"));
        }
        if !is_label_value(value) {
            return Err(bad(
                "not a label value (at most 63 characters: letters, digits, -, _, .)",
            ));
        }
        if key == EXCLUDE_LB {
            return Err(bad(
                "set exclude_from_load_balancers instead: it waits before evicting",
            ));
        }
    }
    Ok(Marks {
        labels,
        taint: k.reboot_taint.map(|t| match t {
            TaintEffectInput::NoSchedule => TaintEffect::NoSchedule,
            TaintEffectInput::PreferNoSchedule => TaintEffect::PreferNoSchedule,
        }),
        exclude_lb: k.exclude_from_load_balancers.map(|d| d.0),
    })
}
