//! `rebootctl import` on host trees written in locksmithd's and Zincati's documented formats
//! (Flatcar's `update.conf` and `locksmithd.service` drop-ins; Zincati's `config.d` fragments as
//! its `dist/config.d` and `docs/usage/*.md` write them). Each fragment it prints or writes is
//! loaded by rebootd's configuration validation (`Config::load`, what `rebootd` runs at start;
//! `--check-config` would also want the TLS and password files the fragments name to exist).

mod common;

use common::REBOOTCTL;
use std::path::{Path, PathBuf};

/// A host tree below a temporary directory.
struct Host {
    dir: tempfile::TempDir,
}

impl Host {
    fn new() -> Host {
        Host {
            dir: tempfile::Builder::new()
                .prefix("hostdropin-import-")
                .tempdir()
                .unwrap(),
        }
    }

    fn path(&self, host_path: &str) -> PathBuf {
        self.dir.path().join(host_path.trim_start_matches('/'))
    }

    fn file(&self, host_path: &str, text: &str) -> &Host {
        let p = self.path(host_path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
        self
    }

    fn link(&self, host_path: &str, target: &str) -> &Host {
        let p = self.path(host_path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink(target, p).unwrap();
        self
    }

    /// Run `rebootctl import --root <tree> ARGS`: (exit code, stdout, stderr).
    fn import(&self, args: &[&str]) -> (i32, String, String) {
        let out = std::process::Command::new(REBOOTCTL)
            .arg("import")
            .arg("--root")
            .arg(self.dir.path())
            .args(args)
            .env_remove("TZ")
            .output()
            .unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }
}

/// rebootd's configuration validation on one fragment file.
fn check_config(path: &Path) -> (i32, String) {
    match rebootd::config::Config::load(&[path.to_path_buf()]) {
        Ok(_) => (0, String::new()),
        Err(e) => (2, e.to_string()),
    }
}

/// The printed fragment must load in rebootd; returns it parsed.
fn loads(text: &str) -> toml::Table {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("imported.toml");
    std::fs::write(&path, text).unwrap();
    let (code, out) = check_config(&path);
    assert_eq!(
        code, 0,
        "rebootd refuses the imported fragment: {out}\n{text}"
    );
    text.parse().unwrap()
}

/// Flatcar's locksmithd.service, as the unit in flatcar/locksmith's `systemd/` directory sets
/// its environment.
const FLATCAR_UNIT: &str = "[Unit]\nDescription=Cluster reboot manager\nAfter=update-engine.service\n\n\
[Service]\nCPUWeight=10\nEnvironment=GOMAXPROCS=1\nEnvironmentFile=-/usr/share/flatcar/update.conf\n\
EnvironmentFile=-/etc/flatcar/update.conf\nExecStart=/usr/lib/locksmith/locksmithd\nRestart=on-failure\n\n\
[Install]\nWantedBy=multi-user.target\n";

#[test]
fn locksmith_etcd_lock_with_window_drop_in_and_local_zone() {
    let host = Host::new();
    host.file("/usr/lib/systemd/system/locksmithd.service", FLATCAR_UNIT)
        .file(
            "/usr/share/flatcar/update.conf",
            "GROUP=stable\nSERVER=https://public.update.flatcar-linux.net/v1/update/\n",
        )
        .file(
            "/etc/flatcar/update.conf",
            "# written by Ignition\nREBOOT_STRATEGY=etcd-lock\nLOCKSMITHD_REBOOT_WINDOW_START=\"Thu 23:00\"\n\
             LOCKSMITHD_REBOOT_WINDOW_LENGTH=1h30m\nLOCKSMITHD_GROUP=workers\n",
        )
        // A drop-in as `systemctl edit locksmithd` writes it. Its group is overridden by
        // update.conf: EnvironmentFile= wins over Environment= (systemd.exec(5)).
        .file(
            "/etc/systemd/system/locksmithd.service.d/10-etcd.conf",
            "[Service]\nEnvironment=\"LOCKSMITHD_ENDPOINT=https://10.0.0.5:2379,https://10.0.0.6:2379\"\n\
             Environment=LOCKSMITHD_ETCD_CAFILE=/etc/ssl/etcd/ca.pem LOCKSMITHD_GROUP=overridden\n\
             Environment=LOCKSMITHD_ETCD_USERNAME=reboot LOCKSMITHD_ETCD_PASSWORD=s3cret\n",
        )
        .link("/etc/localtime", "../usr/share/zoneinfo/Europe/Berlin");

    let (code, out, err) = host.import(&[]);
    assert_eq!(code, 0, "{err}");
    assert!(
        !out.contains("s3cret"),
        "the password is never printed: {out}"
    );
    let t = loads(&out);
    assert_eq!(t["identity"]["group"].as_str(), Some("workers"));
    assert_eq!(t["lock"]["backend"].as_str(), Some("etcd"));
    let etcd = &t["lock"]["etcd"];
    assert_eq!(
        etcd["endpoints"].as_array().unwrap(),
        &vec![
            toml::Value::from("https://10.0.0.5:2379"),
            toml::Value::from("https://10.0.0.6:2379")
        ]
    );
    assert_eq!(etcd["ca_file"].as_str(), Some("/etc/ssl/etcd/ca.pem"));
    assert_eq!(etcd["username"].as_str(), Some("reboot"));
    assert_eq!(
        etcd["password_file"].as_str(),
        Some("/etc/rebootd/etcd-password")
    );
    let w = &t["window"].as_array().unwrap()[0];
    assert_eq!(
        w["days"].as_array().unwrap(),
        &vec![toml::Value::from("Thu")]
    );
    assert_eq!(w["start"].as_str(), Some("23:00"));
    assert_eq!(w["length"].as_str(), Some("1h 30m"));
    assert_eq!(w["time_zone"].as_str(), Some("Europe/Berlin"));
    // Named, not dropped: update_engine's keys, the Go setting, the password's new home.
    for needle in [
        "GROUP = \"stable\"",
        "SERVER = ",
        "GOMAXPROCS",
        "LOCKSMITHD_ETCD_PASSWORD",
    ] {
        assert!(err.contains(needle), "stderr names {needle}: {err}");
        assert!(out.contains(needle), "the header names {needle}: {out}");
    }
    assert!(err.contains("/usr/share/flatcar/update.conf"), "{err}");

    // --write puts the fragment and the password file in place, and refuses to replace them.
    let (code, _, err) = host.import(&["--write"]);
    assert_eq!(code, 0, "{err}");
    let written = host.path("/etc/rebootd/config.d/50-imported-locksmith.toml");
    assert_eq!(std::fs::read_to_string(&written).unwrap(), out);
    assert_eq!(check_config(&written).0, 0);
    let secret = host.path("/etc/rebootd/etcd-password");
    assert_eq!(std::fs::read_to_string(&secret).unwrap(), "s3cret\n");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&secret).unwrap().permissions().mode() & 0o777,
        0o600
    );
    std::fs::write(&written, "# edited by hand\n").unwrap();
    let (code, _, err) = host.import(&["--write"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("--force"), "{err}");
    assert_eq!(
        std::fs::read_to_string(&written).unwrap(),
        "# edited by hand\n"
    );
    let (code, _, err) = host.import(&["--write", "--force"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(std::fs::read_to_string(&written).unwrap(), out);
}

#[test]
fn locksmith_defaults_without_a_unit_file_are_written_out() {
    let host = Host::new();
    // Container Linux's path; no unit file: the documented update.conf locations are read.
    host.file(
        "/etc/coreos/update.conf",
        "REBOOT_WINDOW_START=04:00\nREBOOT_WINDOW_LENGTH=45m\nLOCKSMITHD_DEBUG=true\n",
    );
    let (code, out, err) = host.import(&["--from", "locksmith"]);
    assert_eq!(code, 0, "{err}");
    let t = loads(&out);
    assert_eq!(t["lock"]["backend"].as_str(), Some("none"));
    let w = &t["window"].as_array().unwrap()[0];
    assert_eq!(w["days"].as_array().unwrap().len(), 7, "every day: {out}");
    assert_eq!(w["start"].as_str(), Some("04:00"));
    assert_eq!(w["length"].as_str(), Some("45m"));
    assert_eq!(
        w["time_zone"].as_str(),
        Some("UTC"),
        "no /etc/localtime = UTC"
    );
    assert!(
        err.contains("REBOOT_STRATEGY"),
        "the default is named: {err}"
    );
    assert!(err.contains("RUST_LOG"), "{err}");
}

#[test]
fn locksmith_settings_rebootd_cannot_express_are_refused_by_name() {
    for (conf, key, why) in [
        (
            "REBOOT_STRATEGY=off\n",
            "REBOOT_STRATEGY",
            "rebootctl pause",
        ),
        (
            "REBOOT_STRATEGY=etcd-lock\nLOCKSMITHD_GROUP=default\n",
            "LOCKSMITHD_GROUP",
            "groups/default/semaphore",
        ),
        (
            "REBOOT_STRATEGY=etcd-lock\nLOCKSMITHD_ETCD_CERTFILE=/etc/c.pem\n",
            "LOCKSMITHD_ETCD_CERTFILE",
            "KEYFILE",
        ),
        (
            "LOCKSMITHD_REBOOT_WINDOW_START=Thu 23:00\n",
            "LOCKSMITHD_REBOOT_WINDOW_START",
            "length",
        ),
        (
            "REBOOT_WINDOW_START=Thu 23:00\nREBOOT_WINDOW_LENGTH=1 hour\n",
            "REBOOT_WINDOW_LENGTH",
            "unit",
        ),
    ] {
        let host = Host::new();
        host.file("/etc/flatcar/update.conf", conf);
        let (code, out, err) = host.import(&[]);
        assert_eq!(code, 1, "{conf}: {err}");
        assert!(out.is_empty(), "{conf}: nothing printed: {out}");
        assert!(err.contains("/etc/flatcar/update.conf"), "{conf}: {err}");
        assert!(err.contains(key), "{conf}: {err}");
        assert!(err.contains(why), "{conf}: {err}");
    }
}

#[test]
fn zincati_fleet_lock_with_identity_keeps_the_node_uuid() {
    let host = Host::new();
    // Fedora CoreOS's distribution defaults, then the user's fragments.
    host.file(
        "/usr/lib/zincati/config.d/10-agent.toml",
        "[agent.timing]\nsteady_interval_secs = 300\n",
    )
    .file(
        "/usr/lib/zincati/config.d/10-identity.toml",
        "[identity]\ngroup = \"default\"\n",
    )
    .file(
        "/usr/lib/zincati/config.d/30-updates-strategy.toml",
        "[updates]\nstrategy = \"immediate\"\n",
    )
    .file(
        "/usr/lib/zincati/config.d/50-fedora-coreos-cincinnati.toml",
        "[cincinnati]\nbase_url= \"https://updates.coreos.fedoraproject.org\"\n",
    )
    .file(
        "/etc/zincati/config.d/55-updates-strategy.toml",
        "[updates]\nstrategy = \"fleet_lock\"\n\n[updates.fleet_lock]\nbase_url = \"http://fleet-lock.example.com:8080/\"\n",
    )
    .file(
        "/etc/zincati/config.d/90-custom-identity.toml",
        "[identity]\ngroup = \"workers\"\nnode_uuid = \"27E3AC02-AF39-46AF-995C-9940E18B0CCE\"\nrollout_wariness = 0.5\n",
    );
    let (code, out, err) = host.import(&[]);
    assert_eq!(code, 0, "{err}");
    let t = loads(&out);
    assert_eq!(t["identity"]["group"].as_str(), Some("workers"));
    assert_eq!(t["triggers"]["update_engine"].as_bool(), Some(false));
    assert_eq!(t["lock"]["backend"].as_str(), Some("fleetlock"));
    let f = &t["lock"]["fleetlock"];
    assert_eq!(
        f["url"].as_str(),
        Some("http://fleet-lock.example.com:8080/")
    );
    assert_eq!(
        f["id"].as_str(),
        Some("27e3ac02af3946af995c9940e18b0cce"),
        "node_uuid as Zincati sends it"
    );
    for needle in [
        "rollout_wariness",
        "cincinnati.base_url",
        "steady_interval_secs",
        "sentinel_file",
    ] {
        assert!(err.contains(needle), "stderr names {needle}: {err}");
    }
}

#[test]
fn zincati_periodic_windows_add_up_across_fragments_in_the_local_zone() {
    let host = Host::new();
    host.file(
        "/usr/lib/zincati/config.d/30-updates-strategy.toml",
        "[updates]\nstrategy = \"immediate\"\n",
    )
    // Masked by a link to /dev/null in /etc: never read.
    .file(
        "/usr/lib/zincati/config.d/40-site.toml",
        "[[updates.periodic.window]]\ndays = [ \"Mon\" ]\nstart_time = \"12:00\"\nlength_minutes = 5\n",
    )
    .link("/etc/zincati/config.d/40-site.toml", "/dev/null")
    .file(
        "/etc/zincati/config.d/55-updates-strategy.toml",
        "[updates]\nstrategy = \"periodic\"\n\n[updates.periodic]\ntime_zone = \"localtime\"\n\n\
         [[updates.periodic.window]]\ndays = [ \"Sat\", \"Sunday\" ]\nstart_time = \"23:30\"\nlength_minutes = 60\n",
    )
    // /run is read before /etc: its name sorts later, so it adds a window here.
    .file(
        "/run/zincati/config.d/60-more.toml",
        "[[updates.periodic.window]]\ndays = [ \"Wed\" ]\nstart_time = \"1:00\"\nlength_minutes = 30\n",
    )
    .link("/etc/localtime", "/usr/share/zoneinfo/America/Panama");
    let (code, out, err) = host.import(&[]);
    assert_eq!(code, 0, "{err}");
    let t = loads(&out);
    assert_eq!(t["lock"]["backend"].as_str(), Some("none"));
    let windows = t["window"].as_array().unwrap();
    assert_eq!(windows.len(), 2, "{out}");
    assert_eq!(
        windows[0]["days"].as_array().unwrap(),
        &vec![toml::Value::from("Sat"), toml::Value::from("Sun")]
    );
    assert_eq!(windows[0]["length"].as_str(), Some("1h"));
    assert_eq!(windows[1]["start"].as_str(), Some("01:00"));
    assert_eq!(windows[1]["length"].as_str(), Some("30m"));
    for w in windows {
        assert_eq!(w["time_zone"].as_str(), Some("America/Panama"));
    }
    assert!(
        !out.contains("12:00"),
        "the masked fragment is not read: {out}"
    );
    assert!(
        err.contains("grows or shrinks"),
        "the DST difference is named: {err}"
    );
}

#[test]
fn zincati_errors_and_detection_name_what_is_wrong() {
    let host = Host::new();
    host.file(
        "/etc/zincati/config.d/55-updates-strategy.toml",
        "[updates]\nstrategy = \"fleet_lock\"\n",
    );
    let (code, _, err) = host.import(&[]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("base_url"), "{err}");
    assert!(err.contains("55-updates-strategy.toml"), "{err}");

    // Both tools configured: the user chooses.
    host.file("/etc/flatcar/update.conf", "REBOOT_STRATEGY=reboot\n");
    let (code, _, err) = host.import(&[]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--from"), "{err}");
    let (code, out, err) = host.import(&["--from", "locksmith"]);
    assert_eq!(code, 0, "{err}");
    loads(&out);

    // Neither.
    let empty = Host::new();
    let (code, _, err) = empty.import(&[]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("nothing to import"), "{err}");
}

/// `--write` never writes through a symbolic link (with or without `--force`), and `--force`
/// replaces a file (rename of a new one) rather than truncating it in place: an existing
/// password file that others could read ends up 0600, and a hard link to the old one keeps
/// the old content.
#[test]
fn write_replaces_files_and_never_writes_through_a_symlink() {
    use std::os::unix::fs::PermissionsExt;
    let host = Host::new();
    host.file("/usr/lib/systemd/system/locksmithd.service", FLATCAR_UNIT)
        .file(
            "/etc/flatcar/update.conf",
            "REBOOT_STRATEGY=etcd-lock\nLOCKSMITHD_ENDPOINT=https://10.0.0.5:2379\n\
             LOCKSMITHD_ETCD_USERNAME=reboot\nLOCKSMITHD_ETCD_PASSWORD=s3cret\n",
        );
    let secret = host.path("/etc/rebootd/etcd-password");
    let fragment = host.path("/etc/rebootd/config.d/50-imported-locksmith.toml");

    // A link where the password goes, pointing somewhere else: refused, even with --force,
    // and nothing is written (neither the target nor the fragment).
    let elsewhere = host.path("/tmp/elsewhere");
    host.link("/etc/rebootd/etcd-password", elsewhere.to_str().unwrap());
    for args in [&["--write"][..], &["--write", "--force"][..]] {
        let (code, _, err) = host.import(args);
        assert_eq!(code, 1, "{err}");
        assert!(err.contains("symbolic link"), "{err}");
        assert!(!elsewhere.exists(), "written through the link");
        assert!(
            !fragment.exists(),
            "nothing written when one file may not be"
        );
    }
    std::fs::remove_file(&secret).unwrap();

    // An old password file others may read, hard-linked elsewhere: --force puts a new file in
    // its place (mode 0600), the old one is untouched (not truncated in place).
    host.file("/etc/rebootd/etcd-password", "old\n");
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o644)).unwrap();
    let old = host.path("/etc/rebootd/old-password");
    std::fs::hard_link(&secret, &old).unwrap();
    let (code, _, err) = host.import(&["--write", "--force"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(std::fs::read_to_string(&secret).unwrap(), "s3cret\n");
    assert_eq!(
        std::fs::metadata(&secret).unwrap().permissions().mode() & 0o777,
        0o600
    );
    assert_eq!(std::fs::read_to_string(&old).unwrap(), "old\n");
    assert_eq!(
        std::fs::metadata(&fragment).unwrap().permissions().mode() & 0o777,
        0o644
    );
    // No temporary file left behind.
    let dir: Vec<_> = std::fs::read_dir(host.path("/etc/rebootd"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(dir.iter().all(|n| !n.ends_with(".tmp")), "{dir:?}");
}
