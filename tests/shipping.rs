//! Shipping checks: the systemd unit (systemd-analyze verify and security exposure), the default
//! configuration fragment, the Ignition and Butane configs, the Kubernetes RBAC manifests and the
//! kubeconfig minting script. The packages (.deb, .rpm, sysext, static binaries) need a release
//! build: packaging/build-all.sh builds them and packaging/check-artifacts.sh checks them.
//!
//! Needs systemd-analyze, bash, openssl and base64 on the machine (all in the base image); a test
//! fails, naming the tool, when one is missing.

use rebootd::config::Config;
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The highest `systemd-analyze security` exposure the unit may have (issue 6).
const MAX_EXPOSURE: f64 = 2.0;
/// ExecStart of the shipped unit (packages and the sysext install the daemon there).
const SHIPPED_EXEC_START: &str = "ExecStart=/usr/bin/rebootd";
/// ExecStart of the unit Ignition writes on Flatcar, where /usr is read-only.
const FLATCAR_EXEC_START: &str = "ExecStart=/opt/bin/rebootd";
/// Butane's flatcar 1.0.0 variant produces this Ignition spec version.
const IGNITION_VERSION: &str = "3.3.0";

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(rel: &str) -> String {
    let path = repo().join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

fn run(cmd: &mut Command) -> Output {
    let program = cmd.get_program().to_string_lossy().into_owned();
    cmd.output()
        .unwrap_or_else(|e| panic!("cannot run {program} (is it installed?): {e}"))
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

// --- systemd unit ------------------------------------------------------------------------------

/// The shipped unit, copied into `dir` with ExecStart pointing at the binary cargo built for this
/// test: `systemd-analyze verify` refuses a unit whose binary does not exist, and a build machine
/// has no /usr/bin/rebootd. Everything else is the shipped file byte for byte.
fn unit_for_analysis(dir: &Path) -> PathBuf {
    let unit = read("systemd/rebootd.service");
    let exec_starts: Vec<&str> = unit
        .lines()
        .filter(|l| l.starts_with("ExecStart="))
        .collect();
    assert_eq!(
        exec_starts,
        [SHIPPED_EXEC_START],
        "one ExecStart, in /usr/bin"
    );
    let built = format!("ExecStart={}", env!("CARGO_BIN_EXE_rebootd"));
    let path = dir.join("rebootd.service");
    std::fs::write(&path, unit.replace(SHIPPED_EXEC_START, &built)).unwrap();
    path
}

/// The `Key=value` settings of a unit file, in order (comments and blank lines left out).
fn unit_settings(unit: &str) -> Vec<&str> {
    unit.lines()
        .map(str::trim_end)
        .filter(|l| !l.is_empty() && !l.starts_with('#') && !l.starts_with(';'))
        .collect()
}

#[test]
fn unit_passes_systemd_analyze_verify() {
    let dir = tempfile::tempdir().unwrap();
    let unit = unit_for_analysis(dir.path());
    let out = run(Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .arg(&unit));
    let report = format!("{}{}", text(&out.stdout), text(&out.stderr));
    assert!(
        out.status.success(),
        "systemd-analyze verify failed:\n{report}"
    );
    // Warnings (an unknown or misspelled key, say) do not change the exit status: refuse them too.
    let about_unit: Vec<&str> = report.lines().filter(|l| l.contains("rebootd")).collect();
    assert!(
        about_unit.is_empty(),
        "systemd-analyze verify warned:\n{report}"
    );
}

#[test]
fn unit_exposure_is_at_most_two() {
    let dir = tempfile::tempdir().unwrap();
    let unit = unit_for_analysis(dir.path());
    let out = run(Command::new("systemd-analyze")
        .args(["security", "--offline=yes", "--no-pager"])
        .arg(&unit));
    let report = text(&out.stdout);
    assert!(
        out.status.success(),
        "systemd-analyze security failed:\n{report}{}",
        text(&out.stderr)
    );
    // "→ Overall exposure level for rebootd.service: 1.4 OK 🙂"
    let line = report
        .lines()
        .find(|l| l.contains("Overall exposure level"))
        .unwrap_or_else(|| panic!("no overall exposure in:\n{report}"));
    let exposure: f64 = line
        .rsplit(": ")
        .next()
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("cannot read the exposure in {line:?}"));
    println!("{line}");
    assert!(
        exposure <= MAX_EXPOSURE,
        "exposure {exposure} > {MAX_EXPOSURE}:\n{report}"
    );
}

#[test]
fn unit_has_the_settings_the_daemon_relies_on() {
    let unit = read("systemd/rebootd.service");
    let settings = unit_settings(&unit);
    for wanted in [
        "Type=notify",
        "NotifyAccess=main",
        SHIPPED_EXEC_START,
        "Restart=on-failure",
        "StateDirectory=rebootd",
        "RuntimeDirectory=rebootd",
        "Requires=dbus.socket",
        "Wants=network-online.target",
        "After=network-online.target",
        "CapabilityBoundingSet=",
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        "RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6",
        "WantedBy=multi-user.target",
    ] {
        assert!(settings.contains(&wanted), "the unit lacks {wanted}");
    }
    assert!(
        settings.iter().any(|s| s.starts_with("WatchdogSec=")),
        "the unit lacks WatchdogSec="
    );
    // Writable beyond its own directories: Flatcar's coordinator file, and nothing else ("-": a
    // host without /run/update-engine starts rebootd all the same).
    let writable: Vec<&&str> = settings
        .iter()
        .filter(|s| s.starts_with("ReadWrite") || s.starts_with("BindPaths"))
        .collect();
    assert_eq!(writable, [&"ReadWritePaths=-/run/update-engine"]);
    // It runs as root on purpose (docs/install.md): a User= or DynamicUser= would need polkit
    // rules for logind's reboot and access to update_engine's bus policy.
    for absent in [
        "User=",
        "DynamicUser=",
        "AmbientCapabilities=CAP",
        "ProcSubset=pid",
    ] {
        assert!(
            !settings.iter().any(|s| s.starts_with(absent)),
            "the unit sets {absent}"
        );
    }
}

/// The paths of `InaccessiblePaths=` lines, "-" prefixes left out.
fn inaccessible_paths(unit: &str) -> Vec<&str> {
    unit_settings(unit)
        .iter()
        .filter_map(|s| s.strip_prefix("InaccessiblePaths="))
        .flat_map(str::split_whitespace)
        .map(|p| p.trim_start_matches('-'))
        .collect()
}

/// Whether `path` is `hidden` or under it.
fn is_under(path: &str, hidden: &str) -> bool {
    path == hidden || path.starts_with(&format!("{hidden}/"))
}

#[test]
fn unit_hides_the_hosts_keys_and_nothing_rebootd_reads() {
    let unit = read("systemd/rebootd.service");
    let hidden = inaccessible_paths(&unit);
    // Every entry may be missing on a host: "-", or the unit would not start there.
    for s in unit_settings(&unit) {
        if let Some(paths) = s.strip_prefix("InaccessiblePaths=") {
            for p in paths.split_whitespace() {
                assert!(p.starts_with("-/"), "{p} in {s} lacks the \"-\" prefix");
            }
        }
    }
    for key in [
        "/var/lib/kubelet/pki/kubelet.key",
        "/var/lib/kubelet/kubeconfig",
        "/etc/kubernetes/admin.conf",
        "/etc/kubernetes/pki/ca.key",
        "/etc/rancher/k3s/k3s.yaml",
        "/var/lib/etcd/member/snap/db",
        "/etc/ssh/ssh_host_ed25519_key",
        "/root/.ssh/id_ed25519",
        "/etc/ssl/private/ssl-cert-snakeoil.key",
        "/etc/pki/tls/private/localhost.key",
        "/etc/shadow",
    ] {
        assert!(
            hidden.iter().any(|h| is_under(key, h)),
            "{key} is not hidden from rebootd"
        );
    }
    // Its configuration and own credentials, identity, trigger, coordinator file and the CA
    // bundles it verifies servers with (/etc/ssl/etcd: Flatcar's locksmith certificates).
    for needed in [
        "/etc/rebootd/config.d/50-site.toml",
        "/etc/rebootd/kubeconfig",
        "/usr/lib/rebootd/config.d/00-default.toml",
        "/etc/machine-id",
        "/proc/sys/kernel/random/boot_id",
        "/run/reboot-required",
        "/run/update-engine/coordinator.conf",
        "/var/lib/rebootd/state.json",
        "/etc/ssl/certs/ca-certificates.crt",
        "/etc/ssl/etcd/client-key.pem",
        "/etc/pki/tls/certs/ca-bundle.crt",
        "/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem",
        "/etc/flatcar/update.conf",
        "/usr/share/zoneinfo/UTC",
    ] {
        assert!(
            !hidden.iter().any(|h| is_under(needed, h)),
            "{needed} is hidden from rebootd"
        );
    }
}

// --- default configuration ---------------------------------------------------------------------

#[test]
fn default_fragment_is_the_embedded_default() {
    let path = repo().join("packaging/config.d/00-default.toml");
    let mut loaded = Config::load(std::slice::from_ref(&path))
        .unwrap_or_else(|e| panic!("the shipped default fragment does not load: {e}"));
    loaded.sources.clear();
    assert_eq!(
        format!("{loaded:?}"),
        format!("{:?}", Config::embedded_default()),
        "packaging/config.d/00-default.toml differs from the embedded default"
    );
}

// --- Ignition and Butane -----------------------------------------------------------------------

fn yaml_documents(text: &str, what: &str) -> Vec<Value> {
    use serde::Deserialize;
    serde_norway::Deserializer::from_str(text)
        .map(|doc| Value::deserialize(doc).unwrap_or_else(|e| panic!("{what}: {e}")))
        .filter(|v| !v.is_null())
        .collect()
}

/// `data:,` URL text as Butane writes it for `inline` contents: everything but RFC 3986's
/// unreserved characters percent-encoded.
fn data_url(contents: &str) -> String {
    let mut url = String::from("data:,");
    for b in contents.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            url.push(b as char);
        } else {
            url.push_str(&format!("%{b:02X}"));
        }
    }
    url
}

fn decode_data_url(url: &str) -> String {
    let body = url
        .strip_prefix("data:,")
        .unwrap_or_else(|| panic!("not a plain data URL: {url:.40}"));
    let bytes = body.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap();
            out.push(u8::from_str_radix(hex, 16).unwrap());
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).unwrap()
}

/// A file mode as written in the Butane config: octal with a leading zero (`0755`), which the
/// YAML reader here returns as the text "0755" (and a YAML 1.2 reader might as the number 755).
fn butane_mode(v: &Value, raw_bu: &str) -> Value {
    let written = match v {
        Value::String(s) => s.clone(),
        Value::Number(n) => format!("0{n}"),
        other => panic!("mode {other} is not a number"),
    };
    assert!(
        written.starts_with('0')
            && raw_bu
                .lines()
                .any(|l| l.trim() == format!("mode: {written}")),
        "write modes in the Butane config as octal with a leading zero (found {v})"
    );
    json!(u64::from_str_radix(&written, 8).expect("octal digits"))
}

/// Butane's translation of the subset of flatcar 1.0.0 that ignition/rebootd.bu uses: the same
/// tree, with the spec version, octal modes as numbers and `inline` contents as data URLs.
fn butane_to_ignition(raw_bu: &str) -> Value {
    let docs = yaml_documents(raw_bu, "ignition/rebootd.bu");
    assert_eq!(docs.len(), 1, "one YAML document");
    let mut bu = docs.into_iter().next().unwrap();
    let bu = bu.as_object_mut().unwrap();
    assert_eq!(bu.remove("variant"), Some(json!("flatcar")));
    assert_eq!(bu.remove("version"), Some(json!("1.0.0")));
    let known: BTreeSet<&str> = ["storage", "systemd"].into();
    for key in bu.keys() {
        assert!(
            known.contains(key.as_str()),
            "extend butane_to_ignition for `{key}`"
        );
    }
    let mut ign = serde_json::Map::new();
    ign.insert("ignition".into(), json!({ "version": IGNITION_VERSION }));
    if let Some(mut storage) = bu.remove("storage") {
        for file in storage["files"].as_array_mut().unwrap() {
            let file = file.as_object_mut().unwrap();
            if let Some(mode) = file.get("mode") {
                let mode = butane_mode(mode, raw_bu);
                file.insert("mode".into(), mode);
            }
            let contents = file["contents"].as_object_mut().unwrap();
            if let Some(inline) = contents.remove("inline") {
                contents.insert("source".into(), json!(data_url(inline.as_str().unwrap())));
            }
        }
        ign.insert("storage".into(), storage);
    }
    if let Some(systemd) = bu.remove("systemd") {
        ign.insert("systemd".into(), systemd);
    }
    Value::Object(ign)
}

fn ignition() -> Value {
    serde_json::from_str(&read("ignition/rebootd.ign"))
        .unwrap_or_else(|e| panic!("ignition/rebootd.ign is not JSON: {e}"))
}

fn ign_file<'a>(ign: &'a Value, path: &str) -> &'a Value {
    ign["storage"]["files"]
        .as_array()
        .expect("storage.files")
        .iter()
        .find(|f| f["path"] == path)
        .unwrap_or_else(|| panic!("no file {path} in the Ignition config"))
}

fn ign_unit<'a>(ign: &'a Value, name: &str) -> &'a Value {
    ign["systemd"]["units"]
        .as_array()
        .expect("systemd.units")
        .iter()
        .find(|u| u["name"] == name)
        .unwrap_or_else(|| panic!("no unit {name} in the Ignition config"))
}

/// `UPDATE_IGNITION=1 cargo test --test shipping ignition` rewrites the JSON from the Butane file.
#[test]
fn ignition_json_is_the_butane_config() {
    let expected = butane_to_ignition(&read("ignition/rebootd.bu"));
    if std::env::var_os("UPDATE_IGNITION").is_some() {
        let text = serde_json::to_string_pretty(&expected).unwrap() + "\n";
        std::fs::write(repo().join("ignition/rebootd.ign"), text).unwrap();
    }
    assert!(
        ignition() == expected,
        "ignition/rebootd.ign differs from ignition/rebootd.bu; regenerate it with \
         UPDATE_IGNITION=1 cargo test --test shipping ignition"
    );
}

#[test]
fn ignition_installs_verified_binaries_from_a_remote_source() {
    let ign = ignition();
    let version = ign["ignition"]["version"]
        .as_str()
        .expect("ignition.version");
    assert!(
        version.starts_with("3."),
        "Ignition spec 3.x, not {version}"
    );
    for binary in ["/opt/bin/rebootd", "/opt/bin/rebootctl"] {
        let file = ign_file(&ign, binary);
        assert_eq!(file["mode"], json!(0o755), "{binary} is executable");
        let source = file["contents"]["source"]
            .as_str()
            .expect("contents.source");
        assert!(source.starts_with("https://"), "{binary} from {source}");
        let file_name = binary.rsplit('/').next().unwrap();
        assert!(
            source.ends_with(&format!("/{file_name}-x86_64-linux")),
            "{binary}: download the file packaging/build-static.sh names, not {source}"
        );
        assert!(
            source.contains(&format!("/v{}/", env!("CARGO_PKG_VERSION"))),
            "{binary}: the download URL names another version than Cargo.toml's: {source}"
        );
        let hash = file["contents"]["verification"]["hash"]
            .as_str()
            .expect("contents.verification.hash");
        let digest = hash.strip_prefix("sha512-").expect("a sha512 hash");
        assert!(
            digest.len() == 128 && digest.bytes().all(|b| b.is_ascii_hexdigit()),
            "{binary}: the hash placeholder must have a valid sha512 shape (so Ignition \
             accepts the config and refuses the download until it is filled in): {hash}"
        );
    }
}

#[test]
fn ignition_writes_a_valid_configuration_fragment() {
    let ign = ignition();
    let fragments: Vec<&Value> = ign["storage"]["files"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| {
            let path = f["path"].as_str().unwrap();
            path.starts_with("/etc/rebootd/config.d/") && path.ends_with(".toml")
        })
        .collect();
    assert_eq!(fragments.len(), 1, "one configuration fragment");
    let toml = decode_data_url(fragments[0]["contents"]["source"].as_str().unwrap());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("50-fleet.toml");
    std::fs::write(&path, toml).unwrap();
    let config = Config::load(&[path])
        .unwrap_or_else(|e| panic!("the Ignition configuration fragment does not load: {e}"));
    assert_eq!(config.lock.backend.name(), "etcd", "locksmith's semaphore");
    assert!(config.triggers.update_engine);
}

#[test]
fn ignition_makes_the_coordinator_file_directory_at_boot() {
    let ign = ignition();
    let file = ign_file(&ign, "/etc/tmpfiles.d/rebootd.conf");
    let text = decode_data_url(file["contents"]["source"].as_str().unwrap());
    assert_eq!(text.trim(), "d /run/update-engine 0755 root root -");
}

#[test]
fn ignition_enables_rebootd_and_masks_locksmithd() {
    let ign = ignition();
    assert_eq!(ign_unit(&ign, "locksmithd.service")["mask"], json!(true));
    let unit = ign_unit(&ign, "rebootd.service");
    assert_eq!(unit["enabled"], json!(true));
    // The same unit as systemd/rebootd.service, but for the binary in /opt/bin.
    let written = unit["contents"].as_str().expect("rebootd.service contents");
    let shipped = read("systemd/rebootd.service").replace(SHIPPED_EXEC_START, FLATCAR_EXEC_START);
    assert_eq!(
        unit_settings(written),
        unit_settings(&shipped),
        "the Ignition unit differs from systemd/rebootd.service (other than ExecStart)"
    );
}

// --- packaging metadata ------------------------------------------------------------------------

#[test]
fn rpm_spec_version_is_the_cargo_version() {
    let spec = read("packaging/rebootd.spec");
    let version = spec
        .lines()
        .find_map(|l| l.strip_prefix("Version:"))
        .expect("Version: in the spec")
        .trim();
    assert_eq!(version, env!("CARGO_PKG_VERSION"));
}

#[test]
fn shell_scripts_parse() {
    let mut scripts = Vec::new();
    for dir in ["packaging", "deploy/kubernetes"] {
        for entry in std::fs::read_dir(repo().join(dir)).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "sh") {
                scripts.push(path);
            }
        }
    }
    assert!(scripts.len() >= 8, "found only {scripts:?}");
    for script in scripts {
        let out = run(Command::new("bash").arg("-n").arg(&script));
        assert!(
            out.status.success(),
            "{}: {}",
            script.display(),
            text(&out.stderr)
        );
    }
}

// --- Kubernetes RBAC ---------------------------------------------------------------------------

const NAMESPACE: &str = "rebootd";
const CLUSTER_ROLE: &str = "rebootd-node";
const POD_DELETE_ROLE: &str = "rebootd-node-pod-delete";
const LEASE_ROLE: &str = "rebootd-lease";
const EVENTS_ROLE: &str = "rebootd-events";
const POLICY: &str = "rebootd-node";

type Grant = (String, String, String); // (API group, resource, verb)

fn grants(kind: &str, name: &str, doc: &Value) -> BTreeSet<Grant> {
    let rules = doc["rules"]
        .as_array()
        .unwrap_or_else(|| panic!("{kind} {name} has no rules"));
    let mut out = BTreeSet::new();
    for rule in rules {
        let rule_obj = rule.as_object().unwrap();
        for key in rule_obj.keys() {
            assert!(
                ["apiGroups", "resources", "verbs"].contains(&key.as_str()),
                "{kind} {name}: a rule with {key} (resourceNames, nonResourceURLs are not expected)"
            );
        }
        let list = |key: &str| -> Vec<String> {
            rule[key]
                .as_array()
                .unwrap_or_else(|| panic!("{kind} {name}: rule without {key}"))
                .iter()
                .map(|v| {
                    let s = v.as_str().unwrap().to_string();
                    assert!(!s.contains('*'), "{kind} {name}: wildcard in {key}");
                    s
                })
                .collect()
        };
        for group in list("apiGroups") {
            for resource in list("resources") {
                for verb in list("verbs") {
                    assert!(
                        out.insert((group.clone(), resource.clone(), verb)),
                        "{kind} {name}: a grant given twice"
                    );
                }
            }
        }
    }
    out
}

fn expected(rows: &[(&str, &str, &[&str])]) -> BTreeSet<Grant> {
    let mut out = BTreeSet::new();
    for (group, resource, verbs) in rows {
        for verb in *verbs {
            out.insert((group.to_string(), resource.to_string(), verb.to_string()));
        }
    }
    out
}

/// Every manifest in deploy/kubernetes (file name, document), and the kustomization.
fn kubernetes_manifests() -> (Vec<(String, Value)>, Value) {
    let dir = repo().join("deploy/kubernetes");
    let mut docs = Vec::new();
    let mut yaml_files = BTreeSet::new();
    let mut kustomization = None;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if !name.ends_with(".yaml") && !name.ends_with(".yml") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let parsed = yaml_documents(&text, &name);
        assert!(!parsed.is_empty(), "{name} is empty");
        if name == "kustomization.yaml" {
            kustomization = parsed.into_iter().next();
            continue;
        }
        yaml_files.insert(name.clone());
        docs.extend(parsed.into_iter().map(|d| (name.clone(), d)));
    }
    // kubectl apply -k deploy/kubernetes applies every manifest.
    let kustomization = kustomization.expect("deploy/kubernetes/kustomization.yaml");
    let listed: BTreeSet<String> = kustomization["resources"]
        .as_array()
        .expect("kustomization resources")
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        listed, yaml_files,
        "kustomization.yaml lists every manifest"
    );
    (docs, kustomization)
}

/// The roles grant exactly what rebootd uses, and nothing is bound to a group: each node's
/// identity gets its own bindings from mint-kubeconfig.sh (so one node is revoked alone), and
/// the admission policy that narrows the writes to the node's own objects is shipped and bound.
#[test]
fn kubernetes_rbac_is_exactly_least_privilege() {
    let (docs, _) = kubernetes_manifests();
    let mut kinds = Vec::new();
    let mut cluster_roles = BTreeMap::new();
    let mut roles = BTreeMap::new();
    for (file, doc) in &docs {
        let kind = doc["kind"]
            .as_str()
            .unwrap_or_else(|| panic!("{file}: no kind"));
        let name = doc["metadata"]["name"]
            .as_str()
            .unwrap_or_else(|| panic!("{file}: no name"));
        kinds.push(kind.to_string());
        match kind {
            "Namespace" => assert_eq!(name, NAMESPACE),
            "ClusterRole" => {
                assert!(doc.get("aggregationRule").is_none());
                cluster_roles.insert(name.to_string(), grants(kind, name, doc));
            }
            "Role" => {
                let ns = doc["metadata"]["namespace"].as_str().unwrap().to_string();
                roles.insert((ns, name.to_string()), grants(kind, name, doc));
            }
            "ValidatingAdmissionPolicy" => {
                assert_eq!(name, POLICY);
                assert_eq!(doc["spec"]["failurePolicy"], "Fail");
            }
            "ValidatingAdmissionPolicyBinding" => {
                assert_eq!(doc["spec"]["policyName"], POLICY);
                assert_eq!(doc["spec"]["validationActions"], json!(["Deny"]));
                assert!(doc["spec"].get("matchResources").is_none(), "bound for every namespace");
            }
            other => panic!(
                "{file}: unexpected kind {other} (no shared bindings, no ServiceAccount, no workload)"
            ),
        }
    }
    kinds.sort();
    assert_eq!(
        kinds,
        [
            "ClusterRole",
            "ClusterRole",
            "Namespace",
            "Role",
            "Role",
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding",
        ]
    );

    assert_eq!(
        cluster_roles,
        BTreeMap::from([
            (
                CLUSTER_ROLE.to_string(),
                expected(&[
                    ("", "nodes", &["get", "list", "watch", "patch"]),
                    ("", "pods", &["get", "list", "watch"]),
                    ("", "pods/eviction", &["create"]),
                    ("policy", "poddisruptionbudgets", &["list", "watch"]),
                ])
            ),
            // Bound only with mint-kubeconfig.sh --allow-pod-delete (force_delete_after).
            (
                POD_DELETE_ROLE.to_string(),
                expected(&[("", "pods", &["delete"])])
            ),
        ]),
        "ClusterRoles"
    );
    assert_eq!(
        roles,
        BTreeMap::from([
            (
                (NAMESPACE.to_string(), LEASE_ROLE.to_string()),
                expected(&[(
                    "coordination.k8s.io",
                    "leases",
                    &["get", "list", "watch", "create", "update", "delete"],
                )])
            ),
            (
                ("default".to_string(), EVENTS_ROLE.to_string()),
                expected(&[("", "events", &["create"])])
            ),
        ]),
        "Roles"
    );

    // The minting script binds the same roles, per node.
    let script = read("deploy/kubernetes/mint-kubeconfig.sh");
    for line in [
        format!("NAMESPACE={NAMESPACE}"),
        format!("CLUSTER_ROLE={CLUSTER_ROLE}"),
        format!("POD_DELETE_ROLE={POD_DELETE_ROLE}"),
        format!("LEASE_ROLE={LEASE_ROLE}"),
        format!("EVENTS_ROLE={EVENTS_ROLE}"),
    ] {
        assert!(
            script.lines().any(|l| l == line),
            "mint-kubeconfig.sh: {line}"
        );
    }
}

/// Each manifest is what its Kubernetes type says (k8s-openapi's types, which come from the API
/// server's OpenAPI schema): read into the type and written back, nothing is lost, so no field is
/// misspelt or misplaced.
#[test]
fn kubernetes_manifests_round_trip_through_their_types() {
    use k8s_openapi::api::admissionregistration::v1 as adm;
    use k8s_openapi::api::core::v1 as core;
    use k8s_openapi::api::rbac::v1 as rbac;
    fn round_trip<T: serde::de::DeserializeOwned + serde::Serialize>(file: &str, doc: &Value) {
        let typed: T =
            serde_json::from_value(doc.clone()).unwrap_or_else(|e| panic!("{file}: {e}"));
        let back = serde_json::to_value(&typed).unwrap();
        assert_eq!(
            &back, doc,
            "{file}: lost or changed in a round trip through its type"
        );
    }
    let (docs, _) = kubernetes_manifests();
    for (file, doc) in &docs {
        match doc["kind"].as_str().unwrap() {
            "Namespace" => round_trip::<core::Namespace>(file, doc),
            "ClusterRole" => round_trip::<rbac::ClusterRole>(file, doc),
            "Role" => round_trip::<rbac::Role>(file, doc),
            "ValidatingAdmissionPolicy" => round_trip::<adm::ValidatingAdmissionPolicy>(file, doc),
            "ValidatingAdmissionPolicyBinding" => {
                round_trip::<adm::ValidatingAdmissionPolicyBinding>(file, doc)
            }
            other => panic!("{file}: no type for {other}"),
        }
    }
}

// --- mint-kubeconfig.sh, against a stand-in kubectl ---------------------------------------------

/// A kubectl that records its arguments and the manifests it is given, answers the config and
/// token queries, and signs an approved CSR with a throw-away CA (openssl), as the cluster would.
const FAKE_KUBECTL: &str = r#"#!/usr/bin/env bash
set -euo pipefail
d=$FAKE_KUBE_DIR
echo "$*" >>"$d/calls"
applied_field() { sed -n "s/^  $1: //p" "$d/applied.yaml" | tail -1; }
case "$*" in
*"cluster.server}"*) printf 'https://127.0.0.1:6443' ;;
*"certificate-authority-data}"*) base64 -w0 "$d/ca.pem" ;;
"apply -f -" | "create -f -") cat >>"$d/applied.yaml"; echo --- >>"$d/applied.yaml" ;;
*"--dry-run=client -o yaml"*) printf 'kind: Stand-in\nargs: "%s"\n' "$*" ;;
"delete csr"*) ;;
"get csr"*"metadata.uid"*)
    # What the cluster holds under that name: what was created, unless a test swaps it.
    request=$(applied_field request)
    usages='["digital signature","client auth"]'
    case "${FAKE_CSR_TAMPER:-}" in
    key) request=$(openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
            -keyout /dev/null -subj "/CN=rebootd:node:worker-1" 2>/dev/null | base64 -w0) ;;
    group) request=$(openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
            -keyout /dev/null -subj "/O=system:masters/CN=rebootd:node:worker-1" 2>/dev/null | base64 -w0) ;;
    usages) usages='["digital signature","client auth","server auth"]' ;;
    esac
    printf 'uid-1\n42\n%s\n%s\n%s\n%s\n' "$(applied_field signerName)" \
        "$(applied_field expirationSeconds)" "$usages" "$request" ;;
"replace --raw /apis/certificates.k8s.io/v1/certificatesigningrequests/"*"/approval -f "*)
    cp "${@: -1}" "$d/approval.json"; touch "$d/approved" ;;
"get csr"*"status.certificate}"*)
    [ -f "$d/approved" ] || exit 0
    applied_field request | base64 -d >"$d/req.pem"
    openssl x509 -req -in "$d/req.pem" -CA "$d/ca.pem" -CAkey "$d/ca-key.pem" \
        -days 1 -out "$d/issued.pem" 2>/dev/null
    base64 -w0 "$d/issued.pem" ;;
*"create token"*) printf 'header.payload.signature' ;;
*"delete clusterrolebinding"* | *"delete rolebinding"* | *"delete serviceaccount"*) ;;
*) echo "stand-in kubectl: unexpected: $*" >&2; exit 1 ;;
esac
"#;

struct FakeCluster {
    dir: tempfile::TempDir,
}

impl FakeCluster {
    fn new() -> FakeCluster {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("bin");
        std::fs::create_dir(&bin).unwrap();
        let kubectl = bin.join("kubectl");
        std::fs::write(&kubectl, FAKE_KUBECTL).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&kubectl, std::fs::Permissions::from_mode(0o755)).unwrap();
        let out = run(Command::new("openssl")
            .args(["req", "-x509", "-newkey", "ec", "-pkeyopt"])
            .args(["ec_paramgen_curve:P-256", "-nodes", "-days", "1"])
            .args(["-subj", "/CN=stand-in cluster CA", "-keyout", "ca-key.pem"])
            .args(["-out", "ca.pem"])
            .current_dir(dir.path()));
        assert!(out.status.success(), "openssl: {}", text(&out.stderr));
        FakeCluster { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn mint(&self, args: &[&str]) -> Output {
        let path = format!(
            "{}:{}",
            self.path("bin").display(),
            std::env::var("PATH").unwrap_or_default()
        );
        run(
            Command::new(repo().join("deploy/kubernetes/mint-kubeconfig.sh"))
                .args(args)
                .env("PATH", path)
                .env("FAKE_KUBE_DIR", self.dir.path())
                .current_dir(self.dir.path()),
        )
    }

    fn kubeconfig(&self, name: &str) -> Value {
        let path = self.path(name);
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "the kubeconfig holds a credential: mode 0600");
        let docs = yaml_documents(&std::fs::read_to_string(path).unwrap(), name);
        docs.into_iter().next().unwrap()
    }

    /// Decode base64 `data` into the file `name` and return its path.
    fn decode(&self, data: &str, name: &str) -> PathBuf {
        let b64 = self.path(&format!("{name}.b64"));
        std::fs::write(&b64, data).unwrap();
        let out = run(Command::new("base64").arg("-d").arg(&b64));
        assert!(out.status.success());
        let path = self.path(name);
        std::fs::write(&path, out.stdout).unwrap();
        path
    }
}

fn openssl(args: &[&str], file: &Path) -> String {
    let out = run(Command::new("openssl").args(args).arg(file));
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        text(&out.stderr)
    );
    text(&out.stdout)
}

fn mint_env(cluster: &FakeCluster, args: &[&str], tamper: Option<&str>) -> Output {
    let path = format!(
        "{}:{}",
        cluster.path("bin").display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut cmd = Command::new(repo().join("deploy/kubernetes/mint-kubeconfig.sh"));
    cmd.args(args)
        .env("PATH", path)
        .env("FAKE_KUBE_DIR", cluster.dir.path())
        .current_dir(cluster.dir.path());
    if let Some(t) = tamper {
        cmd.env("FAKE_CSR_TAMPER", t);
    }
    run(&mut cmd)
}

/// The three bindings, to `subject` alone.
fn assert_bound(calls: &str, node: &str, subject: &str) {
    for wanted in [
        format!(
            "create clusterrolebinding rebootd-node-{node} --clusterrole=rebootd-node {subject}"
        ),
        format!(
            "-n rebootd create rolebinding rebootd-lease-{node} --role=rebootd-lease {subject}"
        ),
        format!(
            "-n default create rolebinding rebootd-events-{node} --role=rebootd-events {subject}"
        ),
    ] {
        assert!(
            calls.contains(&wanted),
            "kubectl {wanted:?} not called:\n{calls}"
        );
    }
}

#[test]
fn mint_kubeconfig_signs_a_client_certificate_for_the_node() {
    let cluster = FakeCluster::new();
    let out = cluster.mint(&[
        "--days",
        "30",
        "--output",
        "worker-1.kubeconfig",
        "worker-1",
    ]);
    assert!(
        out.status.success(),
        "mint-kubeconfig.sh: {}",
        text(&out.stderr)
    );

    // The CSR: the client signer, client auth, the requested lifetime.
    let applied = std::fs::read_to_string(cluster.path("applied.yaml")).unwrap();
    let csr = yaml_documents(&applied, "applied CSR").remove(0);
    assert_eq!(csr["kind"], "CertificateSigningRequest");
    assert_eq!(csr["metadata"]["name"], "rebootd-node-worker-1");
    assert_eq!(
        csr["spec"]["signerName"],
        "kubernetes.io/kube-apiserver-client"
    );
    assert_eq!(csr["spec"]["expirationSeconds"], json!(30 * 86400));
    assert_eq!(
        csr["spec"]["usages"],
        json!(["digital signature", "client auth"])
    );
    // Approved as read back: that uid and resourceVersion only.
    let approval: Value =
        serde_json::from_str(&std::fs::read_to_string(cluster.path("approval.json")).unwrap())
            .unwrap();
    assert_eq!(approval["metadata"]["uid"], "uid-1");
    assert_eq!(approval["metadata"]["resourceVersion"], "42");
    assert_eq!(approval["status"]["conditions"][0]["type"], "Approved");
    let calls = std::fs::read_to_string(cluster.path("calls")).unwrap();
    assert!(!calls.contains("certificate approve"), "approved unchecked");
    assert_bound(&calls, "worker-1", "--user=rebootd:node:worker-1");

    // The kubeconfig: the cluster's address and CA, the signed certificate and its own key.
    let kc = cluster.kubeconfig("worker-1.kubeconfig");
    assert_eq!(kc["current-context"], "rebootd");
    assert_eq!(
        kc["clusters"][0]["cluster"]["server"],
        "https://127.0.0.1:6443"
    );
    let ca = cluster.decode(
        kc["clusters"][0]["cluster"]["certificate-authority-data"]
            .as_str()
            .unwrap(),
        "kc-ca.pem",
    );
    assert_eq!(
        std::fs::read(&ca).unwrap(),
        std::fs::read(cluster.path("ca.pem")).unwrap()
    );
    assert_eq!(kc["users"][0]["name"], "rebootd:node:worker-1");
    let user = &kc["users"][0]["user"];
    let cert = cluster.decode(
        user["client-certificate-data"].as_str().unwrap(),
        "kc-cert.pem",
    );
    let key = cluster.decode(user["client-key-data"].as_str().unwrap(), "kc-key.pem");
    let subject = openssl(
        &["x509", "-noout", "-subject", "-nameopt", "RFC2253", "-in"],
        &cert,
    );
    assert_eq!(
        subject.trim(),
        "subject=CN=rebootd:node:worker-1",
        "the user names its node, and no group"
    );
    assert_eq!(
        openssl(&["x509", "-noout", "-pubkey", "-in"], &cert),
        openssl(&["pkey", "-pubout", "-in"], &key),
        "the key in the kubeconfig is the certificate's"
    );
}

/// A CSR swapped between its creation and its approval (another key, a group in the subject,
/// more usages) is not approved, and nothing is bound or written.
#[test]
fn mint_kubeconfig_approves_only_the_csr_it_made() {
    for (tamper, says) in [
        ("key", "another public key"),
        ("group", "without groups"),
        ("usages", "server auth"),
    ] {
        let cluster = FakeCluster::new();
        let out = mint_env(&cluster, &["worker-1"], Some(tamper));
        assert_eq!(
            out.status.code(),
            Some(1),
            "{tamper}: {}",
            text(&out.stderr)
        );
        let err = text(&out.stderr);
        assert!(
            err.contains("not approved") && err.contains(says),
            "{tamper}: {err}"
        );
        assert!(!cluster.path("approved").exists(), "{tamper}: approved");
        let calls = std::fs::read_to_string(cluster.path("calls")).unwrap();
        assert!(!calls.contains("rolebinding"), "{tamper}: bound:\n{calls}");
        assert!(!cluster.path("rebootd-worker-1.kubeconfig").exists());
    }
}

#[test]
fn mint_kubeconfig_token_mode_binds_a_service_account() {
    let cluster = FakeCluster::new();
    let out = cluster.mint(&["--mode", "token", "--days", "7", "worker-2"]);
    assert!(
        out.status.success(),
        "mint-kubeconfig.sh: {}",
        text(&out.stderr)
    );
    let calls = std::fs::read_to_string(cluster.path("calls")).unwrap();
    for wanted in [
        "-n rebootd create serviceaccount node-worker-2",
        "-n rebootd create token node-worker-2 --duration=168h",
    ] {
        assert!(
            calls.contains(wanted),
            "kubectl {wanted:?} not called:\n{calls}"
        );
    }
    assert_bound(&calls, "worker-2", "--serviceaccount=rebootd:node-worker-2");
    let kc = cluster.kubeconfig("rebootd-worker-2.kubeconfig");
    assert_eq!(
        kc["users"][0]["name"],
        "system:serviceaccount:rebootd:node-worker-2"
    );
    assert_eq!(kc["users"][0]["user"]["token"], "header.payload.signature");
}

/// The pod-delete role (for force_delete_after) is bound only when asked for.
#[test]
fn mint_kubeconfig_binds_pod_delete_only_when_asked() {
    let cluster = FakeCluster::new();
    let out = cluster.mint(&["worker-5"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let calls = std::fs::read_to_string(cluster.path("calls")).unwrap();
    assert!(!calls.contains("rebootd-node-pod-delete"), "{calls}");
    let cluster = FakeCluster::new();
    let out = cluster.mint(&["--allow-pod-delete", "worker-5"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let calls = std::fs::read_to_string(cluster.path("calls")).unwrap();
    assert!(calls.contains(
        "create clusterrolebinding rebootd-node-pod-delete-worker-5 --clusterrole=rebootd-node-pod-delete --user=rebootd:node:worker-5"
    ), "{calls}");
}

/// One node is revoked alone: its bindings (and its ServiceAccount in token mode) go.
#[test]
fn mint_kubeconfig_revokes_one_node() {
    let cluster = FakeCluster::new();
    let out = cluster.mint(&["--revoke", "worker-3"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let calls = std::fs::read_to_string(cluster.path("calls")).unwrap();
    assert_eq!(
        calls.lines().collect::<Vec<_>>(),
        [
            "delete clusterrolebinding rebootd-node-worker-3 --ignore-not-found",
            "delete clusterrolebinding rebootd-node-pod-delete-worker-3 --ignore-not-found",
            "-n rebootd delete rolebinding rebootd-lease-worker-3 --ignore-not-found",
            "-n default delete rolebinding rebootd-events-worker-3 --ignore-not-found",
        ]
    );
    let out = cluster.mint(&["--revoke", "--mode", "token", "worker-4"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let calls = std::fs::read_to_string(cluster.path("calls")).unwrap();
    assert!(calls.contains("-n rebootd delete serviceaccount node-worker-4 --ignore-not-found"));
}

#[test]
fn mint_kubeconfig_refuses_bad_arguments() {
    let cluster = FakeCluster::new();
    for args in [
        &[][..],
        &["--mode", "password", "worker-1"],
        &["--days", "0", "worker-1"],
        &["--days", "366", "worker-1"],
        &["Not_A_Node"],
    ] {
        let out = cluster.mint(args);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{args:?}: {}",
            text(&out.stderr)
        );
    }
    assert!(
        !cluster.path("calls").exists(),
        "kubectl was called for bad arguments"
    );
}
