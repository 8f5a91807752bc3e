//! Link flags for rebootd's release binaries. What they save at idle is measured in
//! docs/benchmark-history.md (4e).
//!
//! - The static musl binaries that ship (packaging/build-static.sh): `-z pack-relative-relocs`,
//!   the relative relocations of the position-independent binary as DT_RELR (about 7 kB)
//!   instead of DT_RELA (about 530 kB, all read, so all resident, when the binary relocates
//!   itself at start). musl reads DT_RELR since 1.2.4; Rust's musl target bundles 1.2.5. (Not
//!   for glibc: a glibc binary with DT_RELR needs glibc 2.36 where it runs.)
//! - The musl build (any profile) and the glibc release build, linked by Rust's own lld
//!   (`rust-lld` through `gcc-ld`): `packaging/rebootd.order` (musl) or
//!   `packaging/rebootd.gnu.order` (glibc; symbol names differ between the two), the functions
//!   rebootd runs from start to idle, placed together at the start of `.text`. The kernel maps a
//!   binary's code 64 kB at a time around each page touched ("fault-around"), so code touched
//!   here and there keeps most of `.text` resident; grouped, it keeps only the part it uses. A
//!   stale list costs nothing but memory: names no longer in the binary are skipped.
//!   `packaging/order-symbols.sh [musl|gnu]` makes a list again, from the linker's map of
//!   `rebootd` (written beside this script's output, `OUT_DIR/rebootd.map`).

use std::path::{Path, PathBuf};

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=packaging/rebootd.order");
    println!("cargo:rerun-if-changed=packaging/rebootd.gnu.order");
    let env = std::env::var("CARGO_CFG_TARGET_ENV").unwrap_or_default();
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let release = std::env::var("PROFILE").is_ok_and(|p| p == "release");
    let order = match (os.as_str(), env.as_str()) {
        ("linux", "musl") => {
            println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
            "packaging/rebootd.order"
        }
        ("linux", "gnu") if release => "packaging/rebootd.gnu.order",
        _ => return,
    };
    let Some(gcc_ld) = rust_lld_dir() else {
        println!(
            "cargo:warning=no rust-lld (gcc-ld) in the toolchain: rebootd's code is not ordered"
        );
        return;
    };
    println!("cargo:rustc-link-arg-bins=-B{}", gcc_ld.display());
    println!("cargo:rustc-link-arg-bins=-fuse-ld=lld");
    let order = Path::new(env!("CARGO_MANIFEST_DIR")).join(order);
    if order.exists() {
        println!(
            "cargo:rustc-link-arg-bin=rebootd=-Wl,--symbol-ordering-file={}",
            order.display()
        );
        println!("cargo:rustc-link-arg-bin=rebootd=-Wl,--no-warn-symbol-ordering");
    }
    if let Ok(out) = std::env::var("OUT_DIR") {
        let map = Path::new(&out).join("rebootd.map");
        println!(
            "cargo:rustc-link-arg-bin=rebootd=-Wl,-Map={}",
            map.display()
        );
    }
}

/// `<sysroot>/lib/rustlib/<host>/bin/gcc-ld`: the `ld.lld` that runs the toolchain's rust-lld.
fn rust_lld_dir() -> Option<PathBuf> {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let host = std::env::var("HOST").ok()?;
    let out = std::process::Command::new(rustc)
        .args(["--print", "sysroot"])
        .output()
        .ok()?;
    let sysroot = String::from_utf8(out.stdout).ok()?;
    let dir = Path::new(sysroot.trim())
        .join("lib/rustlib")
        .join(host)
        .join("bin/gcc-ld");
    dir.join("ld.lld").exists().then_some(dir)
}
