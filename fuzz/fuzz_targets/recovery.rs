//! Recovery over arbitrary segment files (the input cut at 0xFE bytes into up to
//! four consecutive segments): never a panic, and only the newest segment holding
//! frames may be cut.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    segwal::sim::harness::check_recovery_bytes(data);
});
