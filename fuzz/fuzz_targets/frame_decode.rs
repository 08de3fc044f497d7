//! Arbitrary bytes through the frame and segment-header decoders, and the
//! decoders of what frames carry (optional fields, seal indexes, index
//! checkpoints, acknowledgements, delivery changes, fields and tombstones,
//! relocated copies): a value or a typed error, never a panic, never a slice
//! past the input.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    segwal::sim::harness::check_frame_bytes(data);
});
