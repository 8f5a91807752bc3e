//! The configuration loader on arbitrary bytes: `Config::load` reads fragments from files, so
//! the input is written to a file first (valid UTF-8 or not). It must return a config or an
//! error, never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::path::PathBuf;
use std::sync::OnceLock;

fn path() -> &'static PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("rebootd-fuzz-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        dir.join("50-fuzz.toml")
    })
}

fuzz_target!(|data: &[u8]| {
    let p = path();
    std::fs::write(p, data).expect("write fragment");
    if let Err(e) = rebootd::config::Config::load(std::slice::from_ref(p)) {
        // Errors render (they name the file).
        let _ = e.to_string();
    }
});
