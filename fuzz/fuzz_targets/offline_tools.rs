//! The offline tools (`segwal verify`, `segwal dump`) over arbitrary segment
//! files, the `recovery` target's inputs: never a panic, and each tool agrees
//! with an open that checks every frame (run it from the `recovery` corpus:
//! `cargo fuzz run -s none offline_tools fuzz/corpus/offline_tools fuzz/corpus/recovery`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = segwal::sim::harness::check_offline_tools_bytes(data);
});
