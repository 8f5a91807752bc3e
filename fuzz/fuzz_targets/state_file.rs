//! rebootd's own state file: `state::parse` never panics, and what it accepts is written back
//! (as `StateStore::save` does) and read again unchanged.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(state) = rebootd::state::parse(data) else {
        return;
    };
    let bytes = serde_json::to_vec_pretty(&state).expect("a parsed state serializes");
    let again = rebootd::state::parse(&bytes).expect("a saved state parses");
    assert_eq!(state, again, "round trip changed the state");
});
