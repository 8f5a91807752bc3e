//! The documentation against the code it describes: every key the configuration parser accepts
//! has its row in `docs/configuration.md` (and every row there is a key the parser accepts), and
//! the README's quick starts are the files in `docs/examples/`, each a configuration the real
//! parser loads.
//!
//! The key list is the parser's own. Every table of the input is a `deny_unknown_fields` struct,
//! so a fragment with an unknown key in a table is refused with serde's message naming the keys
//! that table accepts ("unknown field `x`, expected one of `a`, `b`"). The test puts such a key
//! in the top-level table, then in each key it finds, written first as a table and then as an
//! array of tables: where the parser answers with another list, that key is a table and is
//! walked in turn; anywhere else (a string, a duration, a map of free keys) it is a leaf. A key
//! added to `src/config/input.rs` or `src/config/gates.rs` is therefore found without this file
//! changing.

use rebootd::config::Config;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// A key no table of the configuration has.
const PROBE: &str = "zz_not_a_key";

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(rel: &str) -> String {
    let path = repo().join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

/// How a key on the way to a table is written.
#[derive(Clone, Copy, Debug)]
enum Shape {
    Table,
    ArrayOfTables,
}

/// A fragment with the probe key at the end of `path`, as inline tables.
fn fragment(path: &[(String, Shape)]) -> String {
    let mut value = format!("{{ {PROBE} = 1 }}");
    for (i, (key, shape)) in path.iter().enumerate().rev() {
        let inner = match shape {
            Shape::Table => value,
            Shape::ArrayOfTables => format!("[ {value} ]"),
        };
        value = if i == 0 {
            format!("{key} = {inner}")
        } else {
            format!("{{ {key} = {inner} }}")
        };
    }
    if path.is_empty() {
        format!("{PROBE} = 1")
    } else {
        value
    }
}

/// The keys the table at `path` accepts, if the parser refuses the probe there by naming them.
fn accepted_keys(path: &[(String, Shape)]) -> Option<Vec<String>> {
    let text = fragment(path);
    let err = match Config::check_fragment(Path::new("probe.toml"), &text) {
        Ok(_) => return None,
        Err(e) => e.to_string(),
    };
    let marker = format!("unknown field `{PROBE}`, expected ");
    let line = err.lines().find(|l| l.contains(&marker))?;
    let list = &line[line.find(&marker)? + marker.len()..];
    // "one of `a`, `b`", "`a` or `b`", "`a`": the names are what stands between backticks.
    let names: Vec<String> = list
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect();
    assert!(!names.is_empty(), "no key names in {line:?} (for {text})");
    Some(names)
}

/// Every leaf key the parser accepts, dotted (`lock.etcd.api`, `gates.before_reboot.command`).
fn parser_keys() -> BTreeSet<String> {
    let mut leaves = BTreeSet::new();
    let mut tables: Vec<Vec<(String, Shape)>> = vec![Vec::new()];
    while let Some(path) = tables.pop() {
        let keys = accepted_keys(&path).unwrap_or_else(|| {
            panic!(
                "the parser did not name the keys of {:?}: {}",
                path,
                fragment(&path)
            )
        });
        for key in keys {
            let mut child = path.clone();
            child.push((key.clone(), Shape::Table));
            if accepted_keys(&child).is_some() {
                tables.push(child);
                continue;
            }
            child.last_mut().unwrap().1 = Shape::ArrayOfTables;
            if accepted_keys(&child).is_some() {
                tables.push(child);
                continue;
            }
            let dotted: Vec<&str> = path.iter().map(|(k, _)| k.as_str()).collect();
            leaves.insert(if dotted.is_empty() {
                key
            } else {
                format!("{}.{key}", dotted.join("."))
            });
        }
    }
    leaves
}

/// The keys `docs/configuration.md` documents: the first cell of each table row, when it is a
/// key in backticks (`` | `lock.etcd.api` | ... ``), with the number of cells of its row.
fn documented_keys(doc: &str) -> Vec<(String, usize)> {
    doc.lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("| `")?;
            let key = &rest[..rest.find('`')?];
            let after = &rest[key.len() + 1..];
            if !after.trim_start().starts_with('|') {
                return None;
            }
            Some((key.to_string(), l.split('|').count().saturating_sub(2)))
        })
        .collect()
}

#[test]
fn the_parser_names_its_keys_as_the_probe_expects() {
    // The walk itself, on keys whose shape is known: if serde's message or the input's layout
    // changed, this says so before the comparison with the document does.
    let keys = parser_keys();
    for key in [
        "identity.group",
        "triggers.sentinel_command",
        "window.days",
        "lock.backend",
        "lock.etcd.api",
        "lock.kubernetes.namespace",
        "lock.fleetlock.id",
        "kubernetes.reboot_labels",
        "reboot.boot_time",
        "metrics.listen",
        "webhook.url",
        "gates.settle",
        "gates.before_reboot.command",
        "gates.after_boot.pods_ready",
    ] {
        assert!(keys.contains(key), "{key} not found; found {keys:?}");
    }
    for table in [
        "lock",
        "lock.etcd",
        "gates",
        "gates.before_reboot",
        "window",
    ] {
        assert!(!keys.contains(table), "{table} is a table, not a key");
    }
    assert!(keys.len() > 60, "{} keys: {keys:?}", keys.len());
}

#[test]
fn every_configuration_key_is_in_the_reference_and_nothing_else_is() {
    let doc = read("docs/configuration.md");
    let keys = parser_keys();
    let rows = documented_keys(&doc);
    let documented: BTreeSet<String> = rows.iter().map(|(k, _)| k.clone()).collect();
    let missing: Vec<&String> = keys.difference(&documented).collect();
    assert!(
        missing.is_empty(),
        "docs/configuration.md has no row for these keys the parser accepts: {missing:?}"
    );
    let unknown: Vec<&String> = documented.difference(&keys).collect();
    assert!(
        unknown.is_empty(),
        "docs/configuration.md documents keys the parser refuses: {unknown:?}"
    );
    // Each row: key, type, default, bounds and rules, what it is.
    for (key, cells) in &rows {
        assert_eq!(
            *cells, 5,
            "the row of {key} needs its type, default, bounds and what it is"
        );
    }
    let mut seen = BTreeSet::new();
    for (key, _) in &rows {
        assert!(seen.insert(key), "{key} has two rows");
    }
}

/// The example at the end of the reference loads as it is.
#[test]
fn the_references_example_loads() {
    let doc = read("docs/configuration.md");
    let start = doc.rfind("```toml\n").expect("an example") + "```toml\n".len();
    let example = &doc[start..start + doc[start..].find("```").unwrap()];
    Config::check_fragment(Path::new("docs/configuration.md"), example)
        .unwrap_or_else(|e| panic!("the example does not load: {e}"));
}

/// The quick starts: each file in `docs/examples/` loads with the real parser and validation, and
/// the README shows it as it is.
#[test]
fn the_readme_quick_starts_are_the_example_files_and_load() {
    let readme = read("README.md");
    let dir = repo().join("docs/examples");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .collect();
    files.sort();
    assert_eq!(files.len(), 3, "three quick starts: {files:?}");
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        let lines = text.lines().count();
        assert!(
            (10..=20).contains(&lines),
            "{}: {lines} lines",
            file.display()
        );
        Config::load(std::slice::from_ref(&file))
            .unwrap_or_else(|e| panic!("{} does not load: {e}", file.display()));
        assert!(
            readme.contains(&format!("```toml\n{text}```")),
            "README.md does not show {} as it is",
            file.display()
        );
    }
}
