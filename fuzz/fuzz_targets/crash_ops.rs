//! Structure-aware: a workload decoded from the input (two bytes a step) runs on
//! the simulated disk, which dies at a crash point taken from the input's first
//! three bytes; recovery must keep every invariant of the crash harness.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Err(violation) = segwal::sim::harness::check_crash_bytes(data) {
        panic!("{violation}");
    }
});
