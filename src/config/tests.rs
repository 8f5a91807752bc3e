use super::*;
use std::io::Write;

fn write(dir: &tempfile::TempDir, name: &str, text: &str) -> PathBuf {
    let path = dir.path().join(name);
    let mut f = std::fs::File::create(&path).unwrap();
    f.write_all(text.as_bytes()).unwrap();
    path
}

#[test]
fn embedded_default_is_update_engine_no_window_no_lock() {
    let c = Config::embedded_default();
    assert!(c.triggers.update_engine);
    assert!(c.windows.0.is_empty());
    assert_eq!(c.lock.backend, LockBackend::None);
    assert!(c.kubernetes.is_none());
    assert_eq!(c.identity.group, "default");
    assert_eq!(c.reboot.inhibitors, Inhibitors::Respect);
}

#[test]
fn later_fragment_wins_key_by_key() {
    let dir = tempfile::tempdir().unwrap();
    let a = write(
        &dir,
        "10-a.toml",
        "[identity]\ngroup = \"a\"\nnode_name = \"n1\"\n[reboot]\nretry_interval = \"5s\"\n",
    );
    let b = write(&dir, "20-b.toml", "[identity]\ngroup = \"b\"\n");
    let c = Config::load(&[a, b]).unwrap();
    assert_eq!(c.identity.group, "b");
    assert_eq!(c.identity.node_name, "n1");
    assert_eq!(c.reboot.retry_interval, Duration::from_secs(5));
}

#[test]
fn unknown_key_names_file_and_key() {
    let dir = tempfile::tempdir().unwrap();
    let a = write(&dir, "a.toml", "[triggers]\nupdate_engin = true\n");
    let err = Config::load(std::slice::from_ref(&a))
        .unwrap_err()
        .to_string();
    assert!(err.contains(&a.display().to_string()), "{err}");
    assert!(err.contains("update_engin"), "{err}");
}

#[test]
fn bad_duration_names_file_key_and_value() {
    let dir = tempfile::tempdir().unwrap();
    let a = write(&dir, "a.toml", "[triggers]\nsentinel_interval = \"5x\"\n");
    let err = Config::load(std::slice::from_ref(&a))
        .unwrap_err()
        .to_string();
    assert!(err.contains(&a.display().to_string()), "{err}");
    assert!(err.contains("sentinel_interval"), "{err}");
    assert!(err.contains("\"5x\""), "{err}");
}

#[test]
fn bad_day_time_and_zone_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    for (text, needle) in [
        (
            "[[window]]\ndays = [\"Funday\"]\nstart = \"02:00\"\nlength = \"1h\"\n",
            "\"Funday\"",
        ),
        (
            "[[window]]\ndays = [\"Sat\"]\nstart = \"25:00\"\nlength = \"1h\"\n",
            "\"25:00\"",
        ),
        (
            "[[window]]\ndays = [\"Sat\"]\nstart = \"02:00\"\nlength = \"1h\"\ntime_zone = \"Mars/Olympus\"\n",
            "\"Mars/Olympus\"",
        ),
    ] {
        let a = write(&dir, "w.toml", text);
        let err = Config::load(std::slice::from_ref(&a)).unwrap_err().to_string();
        assert!(err.contains(needle), "{err}");
        assert!(err.contains(&a.display().to_string()), "{err}");
    }
}

#[test]
fn window_is_read_with_zone() {
    let dir = tempfile::tempdir().unwrap();
    let a = write(
        &dir,
        "w.toml",
        "[[window]]\ndays = [\"sat\", \"Sunday\"]\nstart = \"02:30\"\nlength = \"3h\"\ntime_zone = \"Europe/Berlin\"\n",
    );
    let c = Config::load(&[a]).unwrap();
    let w = &c.windows.0[0];
    assert_eq!(w.days.len(), 2);
    assert_eq!(w.start, jiff::civil::time(2, 30, 0, 0));
    assert_eq!(w.length, Duration::from_secs(3 * 3600));
    assert_eq!(w.time_zone_name, "Europe/Berlin");
}

#[test]
fn etcd_backend_needs_endpoints_and_names_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let a = write(&dir, "l.toml", "[lock]\nbackend = \"etcd\"\n");
    let err = Config::load(std::slice::from_ref(&a))
        .unwrap_err()
        .to_string();
    assert!(err.contains("lock.etcd.endpoints"), "{err}");
    assert!(err.contains(&a.display().to_string()), "{err}");
}

#[test]
fn unknown_backend_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let a = write(&dir, "l.toml", "[lock]\nbackend = \"zookeeper\"\n");
    let err = Config::load(&[a]).unwrap_err().to_string();
    assert!(err.contains("zookeeper"), "{err}");
}

#[test]
fn fragments_are_read_in_name_order_and_only_toml() {
    let dir = tempfile::tempdir().unwrap();
    write(&dir, "20-b.toml", "");
    write(&dir, "10-a.toml", "");
    write(&dir, "README", "");
    let files = fragments_in(dir.path()).unwrap();
    let names: Vec<_> = files
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().to_string())
        .collect();
    assert_eq!(names, ["10-a.toml", "20-b.toml"]);
    assert!(fragments_in(&dir.path().join("missing"))
        .unwrap()
        .is_empty());
}

#[test]
fn durations_under_their_bounds_name_file_key_and_value() {
    let dir = tempfile::tempdir().unwrap();
    for (text, key, value) in [
        (
            "[reboot]\nretry_interval = \"1ns\"\n",
            "reboot.retry_interval",
            "\"1ns\"",
        ),
        ("[reboot]\ntimeout = \"0s\"\n", "reboot.timeout", "\"0s\""),
        (
            "[triggers]\nsentinel_interval = \"10ms\"\n",
            "triggers.sentinel_interval",
            "\"10ms\"",
        ),
        (
            "[kubernetes]\ndrain_timeout = \"0s\"\n",
            "kubernetes.drain_timeout",
            "\"0s\"",
        ),
        (
            "[kubernetes]\nready_timeout = \"500ms\"\n",
            "kubernetes.ready_timeout",
            "\"500ms\"",
        ),
        (
            "[[window]]\ndays = [\"Sat\"]\nstart = \"02:00\"\nlength = \"0s\"\n",
            "window.length",
            "\"0s\"",
        ),
    ] {
        let a = write(&dir, "b.toml", text);
        let err = Config::load(std::slice::from_ref(&a))
            .unwrap_err()
            .to_string();
        assert!(err.contains(&a.display().to_string()), "{err}");
        assert!(err.contains(key), "{err}");
        assert!(err.contains(value), "{err}");
        assert!(err.contains("must be at least"), "{err}");
    }
    // At the bound is fine.
    let a = write(
        &dir,
        "ok.toml",
        "[reboot]\nretry_interval = \"1s\"\ntimeout = \"1s\"\n",
    );
    Config::load(&[a]).unwrap();
}

#[test]
fn a_boot_time_over_two_hours_is_refused_naming_file_key_and_value() {
    let dir = tempfile::tempdir().unwrap();
    let a = write(&dir, "b.toml", "[reboot]\nboot_time = \"3h\"\n");
    let err = Config::load(std::slice::from_ref(&a))
        .unwrap_err()
        .to_string();
    for needle in [
        &a.display().to_string(),
        "reboot.boot_time",
        "\"3h\"",
        "must be at most 2h",
    ] {
        assert!(err.contains(needle), "{needle}: {err}");
    }
    for ok in ["0s", "2h"] {
        let a = write(
            &dir,
            "ok.toml",
            &format!("[reboot]\nboot_time = \"{ok}\"\n"),
        );
        assert_eq!(
            Config::load(&[a]).unwrap().reboot.boot_time,
            humantime::parse_duration(ok).unwrap()
        );
    }
    let none = write(&dir, "none.toml", "");
    assert_eq!(
        Config::load(&[none]).unwrap().reboot.boot_time,
        Duration::from_secs(600),
        "10 minutes unless configured"
    );
}

#[test]
fn etcd_api_is_v3_unless_v2_is_asked_for() {
    let dir = tempfile::tempdir().unwrap();
    let base = "[lock]\nbackend = \"etcd\"\n[lock.etcd]\nendpoints = [\"http://127.0.0.1:2379\"]\n";
    let api = |c: &Config| match &c.lock.backend {
        LockBackend::Etcd(e) => e.api,
        other => panic!("{other:?}"),
    };
    let a = write(&dir, "a.toml", base);
    assert_eq!(api(&Config::load(&[a]).unwrap()), EtcdApi::V3);
    let a = write(&dir, "b.toml", &format!("{base}api = \"v2\"\n"));
    assert_eq!(api(&Config::load(&[a]).unwrap()), EtcdApi::V2);
    let a = write(&dir, "c.toml", &format!("{base}api = \"v4\"\n"));
    let err = Config::load(std::slice::from_ref(&a))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("v4") && err.contains(&a.display().to_string()),
        "{err}"
    );
    let a = write(&dir, "d.toml", &format!("{base}apis = \"v2\"\n"));
    let err = Config::load(&[a]).unwrap_err().to_string();
    assert!(err.contains("apis"), "{err}");
}

#[test]
fn the_backend_carries_its_settings() {
    let dir = tempfile::tempdir().unwrap();
    let a = write(
        &dir,
        "k.toml",
        "[lock]\nbackend = \"kubernetes\"\n[kubernetes]\nkubeconfig = \"/k\"\n",
    );
    match Config::load(&[a]).unwrap().lock.backend {
        LockBackend::Kubernetes(k) => {
            assert_eq!(k.namespace, DEFAULT_LEASE_NAMESPACE);
            assert_eq!(k.name, "rebootd");
            assert_eq!(k.kubeconfig, Some(PathBuf::from("/k")));
        }
        other => panic!("{other:?}"),
    }
    let a = write(&dir, "f.toml", "[lock]\nbackend = \"fleetlock\"\n");
    let err = Config::load(&[a]).unwrap_err().to_string();
    assert!(err.contains("lock.fleetlock.url"), "{err}");
}

#[test]
fn max_hold_shorter_than_drain_reboot_boot_and_ready_is_refused_naming_them() {
    let dir = tempfile::tempdir().unwrap();
    let a = write(
        &dir,
        "m.toml",
        "[lock]\nmax_hold = \"40m\"\n[kubernetes]\ndrain_timeout = \"30m\"\nready_timeout = \"15m\"\n[reboot]\ntimeout = \"10m\"\n",
    );
    let err = Config::load(std::slice::from_ref(&a))
        .unwrap_err()
        .to_string();
    for needle in [
        "lock.max_hold",
        "\"40m\"",
        "kubernetes.drain_timeout (30m)",
        "reboot.timeout (10m)",
        "kubernetes.ready_timeout (15m)",
        // Logged-in users are given 5 minutes by default: a holder waiting for them is alive.
        "reboot.users_warning (5m)",
        // The host is down meanwhile (10 minutes by default): nothing beats.
        "reboot.boot_time (10m)",
        "= 1h 10m",
        &a.display().to_string(),
    ] {
        assert!(err.contains(needle), "{needle}: {err}");
    }
    let ok = write(
        &dir,
        "n.toml",
        "[lock]\nmax_hold = \"70m\"\n[kubernetes]\ndrain_timeout = \"30m\"\nready_timeout = \"15m\"\n[reboot]\ntimeout = \"10m\"\n",
    );
    assert!(Config::load(&[ok]).is_ok());
    let fast_boot = write(
        &dir,
        "q.toml",
        "[lock]\nmax_hold = \"1h\"\n[kubernetes]\ndrain_timeout = \"30m\"\nready_timeout = \"15m\"\n[reboot]\ntimeout = \"10m\"\nboot_time = \"0s\"\n",
    );
    assert!(
        Config::load(&[fast_boot]).is_ok(),
        "no boot time, none counted"
    );
    let off = write(
        &dir,
        "p.toml",
        "[lock]\nmax_hold = \"65m\"\n[kubernetes]\ndrain_timeout = \"30m\"\nready_timeout = \"15m\"\n[reboot]\ntimeout = \"10m\"\nusers_warning = \"0s\"\n",
    );
    assert!(Config::load(&[off]).is_ok(), "no warning, no time for it");
    // Without [kubernetes] there is no drain and no wait for Ready: the reboot timeout only.
    let a = write(&dir, "o.toml", "[lock]\nmax_hold = \"5m\"\n");
    let err = Config::load(&[a]).unwrap_err().to_string();
    assert!(
        err.contains("reboot.timeout (10m) + reboot.boot_time (10m)")
            && !err.contains("drain_timeout"),
        "{err}"
    );
}

#[test]
fn drain_fallbacks_are_off_unless_set_and_force_delete_comes_before_the_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let a = write(&dir, "a.toml", "[kubernetes]\n");
    let k = Config::load(&[a]).unwrap().kubernetes.unwrap();
    assert_eq!(k.emptydir_pods, EmptyDirPods::Refuse);
    assert_eq!(k.unmanaged_pods, UnmanagedPods::Refuse);
    assert_eq!(k.force_delete_after, None);
    let b = write(
        &dir,
        "b.toml",
        "[kubernetes]\ndelete_emptydir_data = true\nforce = true\nforce_delete_after = \"10m\"\n",
    );
    let k = Config::load(&[b]).unwrap().kubernetes.unwrap();
    assert_eq!(k.emptydir_pods, EmptyDirPods::Evict);
    assert_eq!(k.unmanaged_pods, UnmanagedPods::Evict);
    assert_eq!(k.force_delete_after, Some(Duration::from_secs(600)));
    let c = write(
        &dir,
        "c.toml",
        "[kubernetes]\ndrain_timeout = \"10m\"\nforce_delete_after = \"10m\"\n",
    );
    let err = Config::load(std::slice::from_ref(&c))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("c.toml") && err.contains("force_delete_after") && err.contains("10m"),
        "{err}"
    );
}

#[test]
fn gates_are_read_in_order_with_names_and_defaults() {
    let dir = tempfile::tempdir().unwrap();
    assert!(Config::embedded_default().gates.before_reboot.is_empty());
    let a = write(
        &dir,
        "g.toml",
        r#"[gates]
interval = "15s"

[[gates.before_reboot]]
command = ["/usr/local/bin/backup-idle", "--quiet"]

[[gates.before_reboot]]
name = "deployments"
prometheus_url = "http://prometheus:9090"
query = "kube_deployment_status_replicas_unavailable > 0"
timeout = "5s"

[[gates.before_reboot]]
prometheus_url = "https://prometheus:9090/"
alerts = ['severity="critical"', 'alertname!~"Watchdog|Info.*"']
alertmanager_url = "http://alertmanager:9093"
ca_file = "/etc/rebootd/prometheus-ca.pem"
bearer_token_file = "/etc/rebootd/prometheus-token"
"#,
    );
    let g = Config::load(&[a]).unwrap().gates;
    assert_eq!(g.interval, Duration::from_secs(15));
    let names: Vec<&str> = g.before_reboot.iter().map(|g| g.name.as_str()).collect();
    assert_eq!(
        names,
        ["command backup-idle", "deployments", "prometheus alerts"]
    );
    assert_eq!(g.before_reboot[0].timeout, Duration::from_secs(30));
    assert_eq!(g.before_reboot[1].timeout, Duration::from_secs(5));
    assert_eq!(g.before_reboot[1].key, "gates.before_reboot[2]");
    match &g.before_reboot[2].check {
        GateCheck::Alerts {
            prometheus,
            alertmanager_url,
            selector,
        } => {
            assert_eq!(prometheus.url, "https://prometheus:9090/");
            assert_eq!(
                prometheus.ca_file.as_deref(),
                Some(Path::new("/etc/rebootd/prometheus-ca.pem"))
            );
            assert_eq!(
                prometheus.bearer_token_file.as_deref(),
                Some(Path::new("/etc/rebootd/prometheus-token"))
            );
            assert_eq!(
                alertmanager_url.as_deref(),
                Some("http://alertmanager:9093")
            );
            assert_eq!(selector.len(), 2);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn bad_gates_name_file_key_and_value() {
    let dir = tempfile::tempdir().unwrap();
    let prom = "prometheus_url = \"http://p:9090\"\n";
    for (text, key, value) in [
        (
            "[[gates.before_reboot]]\nname = \"x\"\n".to_string(),
            "gates.before_reboot[1]",
            "[]",
        ),
        (
            format!("[[gates.before_reboot]]\ncommand = [\"true\"]\n[[gates.before_reboot]]\n{prom}query = \"up\"\nalerts = []\n"),
            "gates.before_reboot[2]",
            "[\"query\", \"alerts\"]",
        ),
        (
            "[[gates.before_reboot]]\nquery = \"up\"\n".to_string(),
            "gates.before_reboot[1].prometheus_url",
            "\"\"",
        ),
        (
            "[[gates.before_reboot]]\nprometheus_url = \"prometheus:9090\"\nquery = \"up\"\n".to_string(),
            "gates.before_reboot[1].prometheus_url",
            "\"prometheus:9090\"",
        ),
        (
            format!("[[gates.before_reboot]]\n{prom}alerts = ['severity']\n"),
            "gates.before_reboot[1].alerts",
            "severity",
        ),
        (
            format!("[[gates.before_reboot]]\n{prom}query = \"up\"\nalertmanager_url = \"http://am\"\n"),
            "gates.before_reboot[1].alertmanager_url",
            "\"http://am\"",
        ),
        (
            "[[gates.before_reboot]]\ncommand = []\n".to_string(),
            "gates.before_reboot[1].command",
            "[]",
        ),
        (
            "[[gates.before_reboot]]\ncommand = [\"true\"]\ntimeout = \"1ms\"\n".to_string(),
            "gates.before_reboot[1].timeout",
            "\"1ms\"",
        ),
        (
            "[gates]\ninterval = \"10ms\"\n".to_string(),
            "gates.interval",
            "\"10ms\"",
        ),
        (
            "[[gates.before_reboot]]\nname = \" \"\ncommand = [\"true\"]\n".to_string(),
            "gates.before_reboot[1].name",
            "\" \"",
        ),
        (
            "[[gates.before_reboot]]\ncommand = [\"true\"]\nbearer_token_file = \"/t\"\n"
                .to_string(),
            "gates.before_reboot[1].bearer_token_file",
            "\"/t\"",
        ),
        (
            "[[gates.before_reboot]]\ncommand = [\"true\"]\nca_file = \"/ca.pem\"\n".to_string(),
            "gates.before_reboot[1].ca_file",
            "\"/ca.pem\"",
        ),
    ] {
        let a = write(&dir, "g.toml", &text);
        let err = Config::load(std::slice::from_ref(&a))
            .unwrap_err()
            .to_string();
        assert!(err.contains(&a.display().to_string()), "{err}");
        assert!(err.contains(key), "{key}: {err}");
        assert!(err.contains(value), "{value}: {err}");
    }
    // An unknown key in a gate is refused with its name.
    let a = write(
        &dir,
        "u.toml",
        "[[gates.before_reboot]]\ncomand = [\"true\"]\n",
    );
    let err = Config::load(&[a]).unwrap_err().to_string();
    assert!(err.contains("comand"), "{err}");
}

#[test]
fn coordinator_file_defaults_to_flatcars_and_an_empty_path_turns_it_off() {
    let c = Config::embedded_default();
    assert_eq!(
        c.reboot.coordinator_file.as_deref(),
        Some(Path::new("/run/update-engine/coordinator.conf"))
    );
    let dir = tempfile::tempdir().unwrap();
    let a = write(
        &dir,
        "a.toml",
        "[reboot]\ncoordinator_file = \"/tmp/c.conf\"\n",
    );
    let c = Config::load(&[a]).unwrap();
    assert_eq!(
        c.reboot.coordinator_file.as_deref(),
        Some(Path::new("/tmp/c.conf"))
    );
    let b = write(&dir, "b.toml", "[reboot]\ncoordinator_file = \"\"\n");
    assert_eq!(Config::load(&[b]).unwrap().reboot.coordinator_file, None);
}

#[test]
fn node_gates_need_kubernetes_and_valid_keys() {
    let dir = tempfile::tempdir().unwrap();
    let gate = "[[gates.before_reboot]]\nnode_annotations = [\"example.com/backup-done\"]\n";
    let a = write(&dir, "n.toml", gate);
    let err = Config::load(std::slice::from_ref(&a))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("`kubernetes`") && err.contains("gates.before_reboot[1]"),
        "{err}"
    );
    let a = write(&dir, "k.toml", &format!("[kubernetes]\n{gate}"));
    let g = &Config::load(&[a]).unwrap().gates.before_reboot[0];
    assert_eq!(g.name, "node annotations");
    match &g.check {
        GateCheck::NodeAnnotations { label, annotations } => {
            assert_eq!(label, "rebootd.io/before-reboot");
            assert_eq!(annotations, &["example.com/backup-done"]);
        }
        other => panic!("{other:?}"),
    }
    for (text, key, value) in [
        (
            "node_annotations = [\"Bad Key\"]\n",
            "gates.before_reboot[1].node_annotations",
            "\"Bad Key\"",
        ),
        (
            "node_annotations = [\"a.io/x\"]\nnode_label = \"-x\"\n",
            "gates.before_reboot[1].node_label",
            "\"-x\"",
        ),
        (
            "command = [\"true\"]\nnode_label = \"a.io/x\"\n",
            "gates.before_reboot[1].node_label",
            "\"a.io/x\"",
        ),
        (
            "node_annotations = []\n",
            "gates.before_reboot[1].node_annotations",
            "[]",
        ),
    ] {
        let a = write(
            &dir,
            "b.toml",
            &format!("[kubernetes]\n[[gates.before_reboot]]\n{text}"),
        );
        let err = Config::load(std::slice::from_ref(&a))
            .unwrap_err()
            .to_string();
        assert!(err.contains(&a.display().to_string()), "{err}");
        assert!(err.contains(key) && err.contains(value), "{err}");
    }
    assert!(gates::is_key(
        "flatcar-linux-update.v1.flatcar-linux.net/before-reboot"
    ));
}

#[test]
fn checks_after_the_boot_and_the_settle_time() {
    let dir = tempfile::tempdir().unwrap();
    let a = write(
        &dir,
        "a.toml",
        "[kubernetes]\n[gates]\nsettle = \"5m\"\n[[gates.after_boot]]\npods_ready = \"app=csi\"\n[[gates.after_boot]]\nnode_annotations = [\"a.io/ok\"]\n",
    );
    let g = Config::load(&[a]).unwrap().gates;
    assert_eq!(g.settle, Some(Duration::from_secs(300)));
    assert!(g.before_reboot.is_empty());
    assert_eq!(g.after_boot[0].name, "pods app=csi");
    match &g.after_boot[1].check {
        GateCheck::NodeAnnotations { label, .. } => assert_eq!(label, "rebootd.io/after-reboot"),
        other => panic!("{other:?}"),
    }
    assert_eq!(Config::embedded_default().gates.settle, None);
    // Pods are checked after the boot only; and need [kubernetes].
    let b = write(
        &dir,
        "b.toml",
        "[kubernetes]\n[[gates.before_reboot]]\npods_ready = \"app=csi\"\n",
    );
    let err = Config::load(std::slice::from_ref(&b))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("gates.before_reboot[1].pods_ready") && err.contains("b.toml"),
        "{err}"
    );
    let c = write(
        &dir,
        "c.toml",
        "[[gates.after_boot]]\npods_ready = \"app=csi\"\n",
    );
    let err = Config::load(&[c]).unwrap_err().to_string();
    assert!(
        err.contains("gates.after_boot[1]") && err.contains("`kubernetes`"),
        "{err}"
    );
    // The settle time counts in lock.max_hold.
    let d = write(
        &dir,
        "d.toml",
        "[lock]\nmax_hold = \"21m\"\n[gates]\nsettle = \"2m\"\n",
    );
    let err = Config::load(&[d]).unwrap_err().to_string();
    assert!(err.contains("gates.settle (2m)"), "{err}");
}

#[test]
fn reboot_labels_taint_and_load_balancer_exclusion() {
    let dir = tempfile::tempdir().unwrap();
    let a = write(
        &dir,
        "a.toml",
        "[kubernetes]\nreboot_taint = \"PreferNoSchedule\"\nexclude_from_load_balancers = \"30s\"\n[kubernetes.reboot_labels]\n\"rebootd.io/rebooting\" = \"true\"\n",
    );
    let m = Config::load(&[a]).unwrap().kubernetes.unwrap().marks;
    assert_eq!(m.labels["rebootd.io/rebooting"], "true");
    assert_eq!(
        m.taint,
        Some(crate::drain::marks::TaintEffect::PreferNoSchedule)
    );
    assert_eq!(m.exclude_lb, Some(Duration::from_secs(30)));
    assert!(Config::load(&[write(&dir, "e.toml", "[kubernetes]\n")])
        .unwrap()
        .kubernetes
        .unwrap()
        .marks
        .is_empty());
    for (text, needle) in [
        ("reboot_taint = \"NoExecute\"\n", "NoExecute"),
        (
            "[kubernetes.reboot_labels]\n\"bad key\" = \"x\"\n",
            "\"bad key\"",
        ),
        ("[kubernetes.reboot_labels]\n\"a.io/x\" = \"-\"\n", "\"-\""),
        (
            "drain_timeout = \"1m\"\nexclude_from_load_balancers = \"1m\"\n",
            "kubernetes.exclude_from_load_balancers",
        ),
    ] {
        let b = write(&dir, "b.toml", &format!("[kubernetes]\n{text}"));
        let err = Config::load(std::slice::from_ref(&b))
            .unwrap_err()
            .to_string();
        assert!(err.contains("b.toml") && err.contains(needle), "{err}");
    }
}

#[test]
fn a_webhook_has_url_or_url_file_and_errors_keep_the_url_secret() {
    use crate::notify_webhook::WebhookUrl;
    let dir = tempfile::tempdir().unwrap();
    let a = write(
        &dir,
        "w.toml",
        "[webhook]\nurl_file = \"/etc/rebootd/webhook-url\"\n",
    );
    let w = Config::load(&[a]).unwrap().webhook.unwrap();
    assert_eq!(
        w.url,
        WebhookUrl::File(PathBuf::from("/etc/rebootd/webhook-url"))
    );
    let both = write(
        &dir,
        "w.toml",
        "[webhook]\nurl = \"https://hooks.slack.com/services/s3cret\"\nurl_file = \"/u\"\n",
    );
    let err = Config::load(std::slice::from_ref(&both))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("webhook.url_file") && err.contains("not both"),
        "{err}"
    );
    assert!(!err.contains("s3cret"), "{err}");
    let no_scheme = write(
        &dir,
        "w.toml",
        "[webhook]\nurl = \"hooks.slack.com/services/s3cret\"\n",
    );
    let err = Config::load(std::slice::from_ref(&no_scheme))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("webhook.url") && !err.contains("s3cret"),
        "{err}"
    );
    let neither = write(&dir, "w.toml", "[webhook]\ntimeout = \"1s\"\n");
    let err = Config::load(&[neither]).unwrap_err().to_string();
    assert!(err.contains("url_file"), "{err}");
}

#[test]
fn reboot_method_is_read_and_a_bad_one_named() {
    use crate::reboot_method::Method;
    let dir = tempfile::tempdir().unwrap();
    assert_eq!(Config::embedded_default().reboot.method, Method::Reboot);
    assert!(!Config::embedded_default().reboot.allow_kexec);
    for (text, method) in [
        ("reboot", Method::Reboot),
        ("kexec", Method::Kexec),
        ("soft-reboot", Method::SoftReboot),
        ("auto", Method::Auto),
    ] {
        let a = write(&dir, "m.toml", &format!("[reboot]\nmethod = \"{text}\"\n"));
        assert_eq!(Config::load(&[a]).unwrap().reboot.method, method);
    }
    let a = write(
        &dir,
        "m.toml",
        "[reboot]\nmethod = \"auto\"\nallow_kexec = true\n",
    );
    assert!(Config::load(&[a]).unwrap().reboot.allow_kexec);
    let a = write(&dir, "m.toml", "[reboot]\nmethod = \"softreboot\"\n");
    let err = Config::load(std::slice::from_ref(&a))
        .unwrap_err()
        .to_string();
    assert!(err.contains(&a.display().to_string()), "{err}");
    assert!(
        err.contains("softreboot") && err.contains("method"),
        "{err}"
    );
}

#[test]
fn a_logind_window_has_a_length_and_nothing_logind_gives() {
    let dir = tempfile::tempdir().unwrap();
    let a = write(
        &dir,
        "w.toml",
        "[[window]]\nsource = \"logind\"\nlength = \"2h\"\n",
    );
    let c = Config::load(&[a]).unwrap();
    assert!(c.windows.0.is_empty(), "resolved at start, from logind");
    assert_eq!(
        c.logind_windows,
        vec![LogindWindow {
            length: Duration::from_secs(7200)
        }]
    );
    for (text, key, value) in [
        (
            "[[window]]\nsource = \"logind\"\n",
            "window[0].length",
            "(not set)",
        ),
        (
            "[[window]]\nsource = \"logind\"\nlength = \"1h\"\nstart = \"02:00\"\n",
            "window[0].start",
            "\"02:00:00\"",
        ),
        (
            "[[window]]\nsource = \"logind\"\nlength = \"1h\"\ndays = [\"Sat\"]\n",
            "window[0].days",
            "1 day(s)",
        ),
        (
            "[[window]]\ndays = [\"Sat\"]\nstart = \"02:00\"\nlength = \"1h\"\n\n[[window]]\nlength = \"1h\"\n",
            "window[1].days",
            "(not set)",
        ),
        (
            "[[window]]\nsource = \"logind\"\nlength = \"0s\"\n",
            "window.length",
            "\"0s\"",
        ),
    ] {
        let a = write(&dir, "w.toml", text);
        let err = Config::load(std::slice::from_ref(&a)).unwrap_err().to_string();
        assert!(err.contains(&a.display().to_string()), "{err}");
        assert!(err.contains(key), "{key}: {err}");
        assert!(err.contains(value), "{value}: {err}");
    }
    let a = write(
        &dir,
        "w.toml",
        "[[window]]\nsource = \"dbus\"\nlength = \"1h\"\n",
    );
    let err = Config::load(std::slice::from_ref(&a))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("dbus") && err.contains(&a.display().to_string()),
        "{err}"
    );
}
