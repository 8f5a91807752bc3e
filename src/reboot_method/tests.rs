use super::probe::{platform, staged_deployment};
use super::*;

fn debian(running: &str, installed: &[&str]) -> Platform {
    Platform::Debian {
        running: running.into(),
        installed: installed.iter().map(|s| s.to_string()).collect(),
    }
}

fn facts(systemd: u32, kexec: Option<bool>, platform: Platform) -> HostFacts {
    HostFacts {
        systemd: Some(systemd),
        kexec_loaded: kexec,
        platform,
    }
}

#[test]
fn a_configured_method_is_what_logind_is_asked() {
    let f = facts(252, None, Platform::Flatcar);
    assert_eq!(choose(Method::Reboot, true, &f).kind, Kind::Full);
    assert_eq!(choose(Method::Kexec, false, &f).kind, Kind::Kexec);
    assert_eq!(choose(Method::SoftReboot, false, &f).kind, Kind::Soft);
}

#[test]
fn flags_are_loginds() {
    assert_eq!(Kind::Full.flags(), 0);
    assert_eq!(Kind::Kexec.flags(), 2);
    assert_eq!(Kind::Soft.flags(), 4);
    assert_eq!(Kind::SoftIfNextroot.flags(), 8);
}

#[test]
fn debian_soft_reboots_when_the_newest_kernel_runs() {
    let f = facts(
        257,
        Some(false),
        debian("6.12.48-amd64", &["6.12.38-amd64", "6.12.48-amd64"]),
    );
    let c = choose(Method::Auto, false, &f);
    assert_eq!(c.kind, Kind::Soft, "{}", c.why);
}

#[test]
fn debian_reboots_fully_for_a_newer_kernel_unless_kexec_is_loaded_and_allowed() {
    let newer = debian("6.1.0-9-amd64", &["6.1.0-9-amd64", "6.1.0-28-amd64"]);
    let c = choose(Method::Auto, true, &facts(257, Some(false), newer.clone()));
    assert_eq!(c.kind, Kind::Full, "{}", c.why);
    assert!(c.why.contains("6.1.0-28-amd64"), "{}", c.why);
    let c = choose(Method::Auto, false, &facts(257, Some(true), newer.clone()));
    assert_eq!(c.kind, Kind::Full, "{}", c.why);
    assert!(c.why.contains("allow_kexec"), "{}", c.why);
    let c = choose(Method::Auto, true, &facts(257, Some(true), newer));
    assert_eq!(c.kind, Kind::Kexec, "{}", c.why);
}

#[test]
fn an_old_systemd_or_an_unknown_one_never_soft_reboots() {
    let same = debian("6.1.0-28-amd64", &["6.1.0-28-amd64"]);
    assert_eq!(
        choose(Method::Auto, false, &facts(252, None, same.clone())).kind,
        Kind::Full
    );
    let unknown = HostFacts {
        systemd: None,
        kexec_loaded: None,
        platform: same,
    };
    assert_eq!(choose(Method::Auto, false, &unknown).kind, Kind::Full);
}

#[test]
fn no_kernel_found_and_unknown_platforms_reboot_fully() {
    let c = choose(Method::Auto, false, &facts(257, None, debian("6.1", &[])));
    assert_eq!(c.kind, Kind::Full);
    let c = choose(
        Method::Auto,
        false,
        &facts(257, None, Platform::Unknown("ID=arch".into())),
    );
    assert_eq!(c.kind, Kind::Full);
    assert!(c.why.contains("ID=arch"));
}

#[test]
fn flatcar_always_reboots_fully() {
    let c = choose(
        Method::Auto,
        true,
        &facts(257, Some(true), Platform::Flatcar),
    );
    assert_eq!(c.kind, Kind::Full);
}

#[test]
fn ostree_soft_reboots_into_nextroot_only_with_the_running_kernel_on_systemd_256() {
    let staged = |k: &[&str]| Platform::Ostree {
        running: "6.15.9-200.fc42.x86_64".into(),
        staged: Some(k.iter().map(|s| s.to_string()).collect()),
    };
    let same = staged(&["6.15.9-200.fc42.x86_64"]);
    assert_eq!(
        choose(Method::Auto, false, &facts(257, None, same.clone())).kind,
        Kind::SoftIfNextroot
    );
    assert_eq!(
        choose(Method::Auto, false, &facts(255, None, same)).kind,
        Kind::Full
    );
    assert_eq!(
        choose(
            Method::Auto,
            false,
            &facts(257, None, staged(&["6.16.2-100.fc42.x86_64"]))
        )
        .kind,
        Kind::Full
    );
    assert_eq!(
        choose(Method::Auto, false, &facts(257, None, staged(&[]))).kind,
        Kind::Full
    );
    let none = Platform::Ostree {
        running: "6.15.9".into(),
        staged: None,
    };
    assert_eq!(
        choose(Method::Auto, false, &facts(257, None, none)).kind,
        Kind::Full
    );
}

#[test]
fn kernel_releases_sort_by_version() {
    let v = |a: &str, b: &str| compare_versions(a, b);
    assert_eq!(v("6.1.0-28-amd64", "6.1.0-9-amd64"), Ordering::Greater);
    assert_eq!(v("6.12.1", "6.2.30"), Ordering::Greater);
    assert_eq!(v("6.1.0-28-amd64", "6.1.0-28-amd64"), Ordering::Equal);
    assert_eq!(v("6.1~rc1", "6.1"), Ordering::Less);
    let installed = ["6.1.0-9-amd64", "6.1.0-28-amd64", "6.1.0-10-amd64"]
        .map(String::from)
        .to_vec();
    assert_eq!(
        newest(&installed).map(String::as_str),
        Some("6.1.0-28-amd64")
    );
}

#[test]
fn systemds_version_reads_its_major_number() {
    assert_eq!(systemd_major("257.13-1~deb13u1"), Some(257));
    assert_eq!(systemd_major("252.39-1~deb12u2"), Some(252));
    assert_eq!(systemd_major("254"), Some(254));
    assert_eq!(systemd_major("v254"), None);
}

#[test]
fn the_platform_comes_from_os_release() {
    let k = || vec!["6.1.0-28-amd64".to_string()];
    assert_eq!(
        platform("ID=flatcar\nVERSION=4152.2.0\n", "6.6".into(), k()),
        Platform::Flatcar
    );
    assert!(matches!(
        platform(
            "PRETTY_NAME=\"Debian GNU/Linux 13\"\nID=debian\n",
            "6.1".into(),
            k()
        ),
        Platform::Debian { .. }
    ));
    assert!(matches!(
        platform("ID=ubuntu\nID_LIKE=debian\n", "6.1".into(), k()),
        Platform::Debian { .. }
    ));
    assert_eq!(
        platform("ID=\"fedora\"\n", "6.1".into(), k()),
        Platform::Unknown("ID=fedora".into())
    );
}

#[test]
fn the_staged_deployment_is_read_from_ostree_admin_status() {
    let out = "  fedora-coreos 4a1b2c3d.0 (staged)\n* fedora-coreos 8c2f0e1a.0\n    Version: 42\n";
    assert_eq!(
        staged_deployment(out),
        Some(("fedora-coreos".into(), "4a1b2c3d.0".into()))
    );
    assert_eq!(staged_deployment("* fedora-coreos 8c2f0e1a.0\n"), None);
}
