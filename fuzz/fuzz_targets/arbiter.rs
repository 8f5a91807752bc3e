//! The lock core's arbiter: on any view (holders with or without tokens and beats, a queue with
//! or without my entry, `max_hold` or not, what one observer saw), `decide` never panics, is
//! deterministic, and keeps its rules: held only by id and token, a take only when the free
//! slots outnumber the live waiters ahead, a reclaim only by the head of the queue, with no free
//! slot, of a holder gone or silent for `max_hold`; with `max_per_zone`, never a take into a
//! full zone, and every waiter deciding at once on one view stays within `max` and the zone
//! cap. See `rebootd::lock::arbiter::props`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    rebootd::lock::arbiter::props::check_bytes(data);
});
