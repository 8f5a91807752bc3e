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
    assert_eq!(c.lock.backend, Backend::None);
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
