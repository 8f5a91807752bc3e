//! Import from Zincati: its TOML fragments, found and merged as Zincati does (`config.d` in
//! `/usr/lib/zincati`, `/run/zincati`, `/etc/zincati`; a file name in a later directory hides
//! the earlier one's, a link to `/dev/null` hides it without replacing it; files applied in
//! name order, later keys win, `[[updates.periodic.window]]` entries add up), translated:
//! `[identity] group` and `node_uuid`, `[updates] strategy` (`immediate`, `fleet_lock` with
//! `base_url`, `periodic` windows with their `time_zone`, `"localtime"` resolved).

use super::{
    day, local_zone, time_of_day, BackendOut, Fragment, Import, ImportError, Note, Root, Tool,
    WindowOut,
};
use std::collections::BTreeMap;
use std::time::Duration;

/// Zincati's fragment directories, lowest priority first (`src/config/mod.rs`).
const DIRS: [&str; 3] = [
    "/usr/lib/zincati/config.d",
    "/run/zincati/config.d",
    "/etc/zincati/config.d",
];

/// Said when nothing is found.
pub const LOOKED_AT: &str =
    "/usr/lib/zincati/config.d, /run/zincati/config.d, /etc/zincati/config.d";

/// The fragments that apply, as (host path, file name), in the order Zincati reads them.
fn fragments(root: &Root) -> Vec<String> {
    let mut by_name: BTreeMap<String, String> = BTreeMap::new();
    for dir in DIRS {
        let Ok(entries) = std::fs::read_dir(root.at(dir)) else {
            continue;
        };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().to_string();
            if name.ends_with(".toml") {
                by_name.insert(name.clone(), format!("{dir}/{name}"));
            }
        }
    }
    by_name
        .into_values()
        .filter(|path| {
            // A link to /dev/null masks the name.
            std::fs::read_link(root.at(path))
                .map_or(true, |t| t != std::path::Path::new("/dev/null"))
        })
        .collect()
}

/// Whether the host has Zincati fragments; `Some` names the directories.
pub fn found(root: &Root) -> Option<String> {
    let f = fragments(root);
    (!f.is_empty()).then(|| f.join(", "))
}

/// One key as read, and the fragment that set it last.
#[derive(Debug, Clone)]
struct Set<T> {
    value: T,
    file: String,
}

#[derive(Debug, Clone)]
struct PeriodicWindow {
    days: Vec<String>,
    start_time: String,
    length_minutes: i64,
    file: String,
}

/// The merged settings that matter, plus every other key seen.
#[derive(Debug, Default)]
struct Merged {
    group: Option<Set<String>>,
    node_uuid: Option<Set<String>>,
    enabled: Option<Set<bool>>,
    strategy: Option<Set<String>>,
    base_url: Option<Set<String>>,
    time_zone: Option<Set<String>>,
    windows: Vec<PeriodicWindow>,
    /// Keys Zincati reads that have no meaning for rebootd: (file, dotted key, value).
    other: Vec<(String, String, String)>,
}

fn value_text(v: &toml::Value) -> String {
    match v {
        toml::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn wrong_type(file: &str, key: &str, v: &toml::Value, want: &str) -> ImportError {
    ImportError::Untranslatable {
        file: file.into(),
        key: key.into(),
        value: value_text(v),
        why: format!("Zincati wants {want} here (it would not start)"),
    }
}

/// Walk one fragment's table, recording what matters and naming the rest.
fn merge(m: &mut Merged, file: &str, table: toml::Table) -> Result<(), ImportError> {
    fn flat(prefix: &str, t: &toml::Table, out: &mut Vec<(String, toml::Value)>) {
        for (k, v) in t {
            let key = if prefix.is_empty() {
                k.clone()
            } else {
                format!("{prefix}.{k}")
            };
            match v {
                toml::Value::Table(inner) if key != "updates.periodic.window" => {
                    flat(&key, inner, out)
                }
                _ => out.push((key, v.clone())),
            }
        }
    }
    let mut keys = Vec::new();
    flat("", &table, &mut keys);
    for (key, v) in keys {
        let str_of = |v: &toml::Value| {
            v.as_str()
                .map(|s| s.to_string())
                .ok_or_else(|| wrong_type(file, &key, v, "a string"))
        };
        let set = |value| Set {
            value,
            file: file.to_string(),
        };
        match key.as_str() {
            "identity.group" => m.group = Some(set(str_of(&v)?)),
            "identity.node_uuid" => m.node_uuid = Some(set(str_of(&v)?)),
            "updates.enabled" => {
                let b = v
                    .as_bool()
                    .ok_or_else(|| wrong_type(file, &key, &v, "true or false"))?;
                m.enabled = Some(Set {
                    value: b,
                    file: file.to_string(),
                });
            }
            "updates.strategy" => m.strategy = Some(set(str_of(&v)?)),
            "updates.fleet_lock.base_url" => m.base_url = Some(set(str_of(&v)?)),
            "updates.periodic.time_zone" => m.time_zone = Some(set(str_of(&v)?)),
            "updates.periodic.window" => {
                let entries = v
                    .as_array()
                    .ok_or_else(|| wrong_type(file, &key, &v, "an array of tables"))?;
                for e in entries {
                    let t = e
                        .as_table()
                        .ok_or_else(|| wrong_type(file, &key, e, "a table"))?;
                    let get = |k: &str| {
                        t.get(k).ok_or_else(|| ImportError::Untranslatable {
                            file: file.into(),
                            key: format!("{key}.{k}"),
                            value: String::new(),
                            why: "missing (every window needs days, start_time and length_minutes)"
                                .into(),
                        })
                    };
                    let days = get("days")?
                        .as_array()
                        .ok_or_else(|| {
                            wrong_type(file, &format!("{key}.days"), e, "an array of day names")
                        })?
                        .iter()
                        .map(value_text)
                        .collect();
                    let start = get("start_time")?;
                    let length = get("length_minutes")?;
                    m.windows.push(PeriodicWindow {
                        days,
                        start_time: start
                            .as_str()
                            .ok_or_else(|| {
                                wrong_type(file, &format!("{key}.start_time"), start, "\"hh:mm\"")
                            })?
                            .to_string(),
                        length_minutes: length.as_integer().ok_or_else(|| {
                            wrong_type(
                                file,
                                &format!("{key}.length_minutes"),
                                length,
                                "a number of minutes",
                            )
                        })?,
                        file: file.to_string(),
                    });
                }
            }
            _ => m.other.push((file.to_string(), key, value_text(&v))),
        }
    }
    Ok(())
}

/// What rebootd makes of a key Zincati has that it does not translate.
fn why_not(key: &str) -> &'static str {
    match key {
        "identity.rollout_wariness"
        | "cincinnati.base_url"
        | "updates.allow_downgrade"
        | "agent.timing.steady_interval_secs" => {
            "how Zincati finds and stages updates; rebootd only coordinates the reboot"
        }
        _ => "not a setting Zincati reads, so not translated",
    }
}

/// Translate Zincati's configuration below `root`: the merged fragments, the notes that hold
/// whatever the strategy, then the strategy with its settings.
pub fn import(root: &Root) -> Result<Import, ImportError> {
    let files = fragments(root);
    if files.is_empty() {
        return Err(ImportError::NothingFound(format!(
            "no Zincati fragment in {LOOKED_AT} under {}",
            root.0.display()
        )));
    }
    let m = read_merged(root, &files)?;
    let mut notes = general_notes(&m);
    let mut fragment = Fragment {
        // Fedora CoreOS has no update_engine: the trigger has to be set.
        update_engine: Some(false),
        group: m.group.as_ref().map(|g| g.value.clone()),
        ..Fragment::default()
    };
    let strategy = m.strategy.as_ref().map_or("", |s| s.value.as_str());
    match strategy {
        "" | "immediate" => {
            not_in_effect(&m, "immediate", &mut notes);
            fragment.backend = Some(BackendOut::None);
        }
        "fleet_lock" => {
            not_in_effect(&m, "fleet_lock", &mut notes);
            fragment.backend = Some(fleet_lock(&m)?);
        }
        "periodic" => {
            not_in_effect(&m, "periodic", &mut notes);
            fragment.backend = Some(BackendOut::None);
            fragment.windows = periodic(root, &m, &mut notes)?;
        }
        other => {
            return Err(ImportError::untranslatable(
                strategy_file(&m),
                "updates.strategy",
                other,
                "unknown strategy (Zincati knows immediate, fleet_lock, periodic)",
            ))
        }
    }
    if strategy != "fleet_lock" {
        if let Some(u) = &m.node_uuid {
            notes.push(Note::new(
                u.file.clone(),
                "identity.node_uuid",
                u.value.clone(),
                "Zincati's id is sent only to a FleetLock server; not in effect without one",
            ));
        }
    }
    Ok(Import {
        from: Tool::Zincati,
        read: files,
        fragment,
        notes,
        secrets: Vec::new(),
    })
}

/// The fragments read and merged in order.
fn read_merged(root: &Root, files: &[String]) -> Result<Merged, ImportError> {
    let mut m = Merged::default();
    for path in files {
        let text = super::read_optional(root, path)?.unwrap_or_default();
        let table: toml::Table = text.parse().map_err(|e: toml::de::Error| {
            ImportError::untranslatable(
                path.clone(),
                "(file)",
                "",
                format!("not TOML: {}", e.message()),
            )
        })?;
        merge(&mut m, path, table)?;
    }
    Ok(m)
}

/// Notes whatever the strategy: the keys not translated, the trigger to set, auto-updates off.
fn general_notes(m: &Merged) -> Vec<Note> {
    let mut notes: Vec<Note> = m
        .other
        .iter()
        .map(|(file, key, value)| Note::new(file.clone(), key.clone(), value.clone(), why_not(key)))
        .collect();
    notes.push(Note::new(
        "(Zincati)",
        "trigger",
        "",
        "Zincati stages the update and reboots for it; rebootd has no update_engine to listen to here: set [triggers] sentinel_file or sentinel_command to what says a reboot is needed, or use `rebootctl reboot`",
    ));
    if let Some(e) = m.enabled.as_ref().filter(|e| !e.value) {
        notes.push(Note::new(
            e.file.clone(),
            "updates.enabled",
            "false",
            "Zincati's auto-updates are off; rebootd has no such key: keep this node from rebooting with `rebootctl pause`",
        ));
    }
    notes
}

/// The fragment that set the strategy.
fn strategy_file(m: &Merged) -> String {
    m.strategy
        .as_ref()
        .map(|s| s.file.clone())
        .unwrap_or_default()
}

/// Notes for the settings of the strategies not chosen (`what`): the FleetLock URL, the
/// periodic windows and their zone.
fn not_in_effect(m: &Merged, what: &str, notes: &mut Vec<Note>) {
    let why = format!("not in effect under strategy {what:?}, so not translated");
    if what != "fleet_lock" {
        if let Some(b) = &m.base_url {
            notes.push(Note::new(
                b.file.clone(),
                "updates.fleet_lock.base_url",
                b.value.clone(),
                why.clone(),
            ));
        }
    }
    if what != "periodic" {
        for w in &m.windows {
            notes.push(Note::new(
                w.file.clone(),
                "updates.periodic.window",
                format!("{:?} {} {}m", w.days, w.start_time, w.length_minutes),
                why.clone(),
            ));
        }
        if let Some(tz) = &m.time_zone {
            notes.push(Note::new(
                tz.file.clone(),
                "updates.periodic.time_zone",
                tz.value.clone(),
                why.clone(),
            ));
        }
    }
}

/// Strategy `fleet_lock`: the server's URL, and Zincati's id for this node if set.
fn fleet_lock(m: &Merged) -> Result<BackendOut, ImportError> {
    let url = m
        .base_url
        .as_ref()
        .filter(|b| !b.value.is_empty())
        .ok_or_else(|| {
            ImportError::untranslatable(
                strategy_file(m),
                "updates.fleet_lock.base_url",
                "",
                "strategy \"fleet_lock\" needs a base_url (Zincati would not start)",
            )
        })?;
    // Zincati reads node_uuid as a 128-bit id and sends it as 32 hex digits.
    let id = match &m.node_uuid {
        Some(u) => Some(
            crate::app_id::Id128::parse(&u.value)
                .map_err(|why| {
                    ImportError::untranslatable(
                        u.file.clone(),
                        "identity.node_uuid",
                        u.value.clone(),
                        format!("{why} (Zincati would not start)"),
                    )
                })?
                .to_hex(),
        ),
        None => None,
    };
    Ok(BackendOut::FleetLock {
        url: url.value.clone(),
        id,
    })
}

/// Strategy `periodic`: its windows in its time zone, and a note on what a zone other than UTC
/// changes.
fn periodic(root: &Root, m: &Merged, notes: &mut Vec<Note>) -> Result<Vec<WindowOut>, ImportError> {
    let zone = periodic_zone(root, m)?;
    if m.windows.is_empty() {
        return Err(ImportError::untranslatable(
            strategy_file(m),
            "updates.periodic.window",
            "",
            "strategy \"periodic\" without a window (Zincati would not start)",
        ));
    }
    let windows = m
        .windows
        .iter()
        .map(|w| periodic_window(w, &zone))
        .collect::<Result<Vec<_>, _>>()?;
    if zone != "UTC" {
        let tz = m.time_zone.as_ref();
        notes.push(Note::new(
            tz.map(|t| t.file.clone()).unwrap_or_default(),
            "updates.periodic.time_zone",
            tz.map(|t| t.value.clone()).unwrap_or_default(),
            format!("translated to {zone:?}; one difference: on a day the clocks change, Zincati's window keeps its clock times and grows or shrinks, rebootd's keeps its length"),
        ));
    }
    Ok(windows)
}

/// `updates.periodic.time_zone`: UTC when not set, `"localtime"` resolved as the host has it.
fn periodic_zone(root: &Root, m: &Merged) -> Result<String, ImportError> {
    let tz = m.time_zone.as_ref();
    let file = || tz.map(|t| t.file.clone()).unwrap_or_default();
    match tz.map(|t| t.value.as_str()) {
        None => Ok("UTC".to_string()),
        Some("localtime") => local_zone(root, None).map_err(|why| {
            ImportError::untranslatable(
                file(),
                "updates.periodic.time_zone",
                "localtime",
                why.to_string(),
            )
        }),
        Some(name) => {
            jiff::tz::TimeZone::get(name).map_err(|_| {
                ImportError::untranslatable(
                    file(),
                    "updates.periodic.time_zone",
                    name,
                    "not an IANA time zone name",
                )
            })?;
            Ok(name.to_string())
        }
    }
}

/// One `[[updates.periodic.window]]` in `zone`.
fn periodic_window(w: &PeriodicWindow, zone: &str) -> Result<WindowOut, ImportError> {
    let bad = |key: &str, value: String, why: &str| {
        ImportError::untranslatable(
            w.file.clone(),
            format!("updates.periodic.window.{key}"),
            value,
            why,
        )
    };
    let mut days = Vec::new();
    for d in &w.days {
        let d = day(d).ok_or_else(|| bad("days", d.clone(), "not a week day"))?;
        if !days.contains(&d) {
            days.push(d);
        }
    }
    let start = time_of_day(&w.start_time)
        .ok_or_else(|| bad("start_time", w.start_time.clone(), "not hh:mm"))?;
    if w.length_minutes <= 0 || w.length_minutes > u32::MAX.into() {
        return Err(bad(
            "length_minutes",
            w.length_minutes.to_string(),
            "must be a number of minutes above zero",
        ));
    }
    Ok(WindowOut {
        days,
        start,
        length: Duration::from_secs(w.length_minutes as u64 * 60),
        time_zone: zone.to_string(),
    })
}
