//! Recovery over arbitrary segment files (the input holds up to four files, each
//! as a u16 length and its bytes, named after the first seq their header claims):
//! never a panic, and only the newest segment holding frames may be cut.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = segwal::sim::harness::check_recovery_bytes(data);
});
