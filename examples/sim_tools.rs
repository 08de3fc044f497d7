//! Tools around the crash harness, for segwal's own developers (they need the
//! `testing` feature, which the crate's dev-dependencies switch on):
//!
//! ```text
//! cargo run --example sim_tools -- replay SEED,POINT,DRAW [STEPS]
//! cargo run --example sim_tools -- write-recovery-seeds
//! cargo run --example sim_tools -- write-frame-seeds
//! ```
//!
//! - `replay` describes one crash point of the crash test (a violation prints
//!   its seed, point and draw): the operations before it, the files after the
//!   crash and what recovery made of them. STEPS is the workload length the
//!   crash test ran with (`SEGWAL_CRASH_STEPS`, 40 by default).
//! - `write-recovery-seeds` rewrites the engine-made seeds of the `recovery`
//!   fuzz target (`fuzz/corpus/recovery/seed-engine-N-close` and `-crash`),
//!   after a format change. The bytes differ from run to run (segment
//!   identities and timestamps are fresh), so every run changes them all;
//!   `seed-engine-delivery-relocated`, made by hand from a golden log, is
//!   left alone.
//! - `write-frame-seeds` rewrites the seeds of the `frame_decode` fuzz target
//!   (`fuzz/corpus/frame_decode/seed-frames-*` and `seed-segment-*`): frames,
//!   and a segment's header block then frames, in the current format.

use std::path::Path;

use segwal::sim::harness::{self, Workload};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("replay") => {
            let spec = args.get(1).ok_or("replay SEED,POINT,DRAW [STEPS]")?;
            let n = spec
                .split(',')
                .map(|v| v.trim().parse::<u64>())
                .collect::<Result<Vec<u64>, _>>()?;
            let &[seed, point, draw] = n.as_slice() else {
                return Err("replay SEED,POINT,DRAW [STEPS]".into());
            };
            let steps = args.get(2).map_or(Ok(40), |s| s.parse::<usize>())?;
            let workload = Workload::random(seed, steps);
            for line in harness::replay(seed, &workload, point, draw, None) {
                println!("{line}");
            }
            Ok(())
        }
        Some("write-recovery-seeds") => write_recovery_seeds(),
        Some("write-frame-seeds") => {
            let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/frame_decode");
            for k in 0..3 {
                std::fs::write(dir.join(format!("seed-frames-{k}")), harness::frame_seed(k, false))?;
                std::fs::write(dir.join(format!("seed-segment-{k}")), harness::frame_seed(k, true))?;
            }
            Ok(())
        }
        _ => Err(
            "usage: sim_tools replay SEED,POINT,DRAW [STEPS] | write-recovery-seeds | write-frame-seeds"
                .into(),
        ),
    }
}

/// The first four workloads, after a close and after a crash, whose log fits a
/// `recovery` input (four files at most) and opens with records in it.
fn write_recovery_seeds() -> Result<(), Box<dyn std::error::Error>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/recovery");
    for entry in std::fs::read_dir(&dir)? {
        let path = entry?.path();
        // Only the seeds this tool writes (`seed-engine-N-close`,
        // `seed-engine-N-crash`): others named alike were made by hand.
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
        let made_here = name.as_deref().is_some_and(|n| {
            n.strip_prefix("seed-engine-")
                .and_then(|rest| rest.split_once('-'))
                .is_some_and(|(seed, kind)| {
                    seed.parse::<u64>().is_ok() && matches!(kind, "close" | "crash")
                })
        });
        if made_here {
            std::fs::remove_file(path)?;
        }
    }
    for crash in [false, true] {
        let mut kept = 0;
        for seed in 1.. {
            let input = harness::recovery_seed(seed, crash);
            if harness::check_recovery_bytes(&input).is_none_or(|n| n == 0) {
                continue;
            }
            let kind = if crash { "crash" } else { "close" };
            std::fs::write(dir.join(format!("seed-engine-{seed}-{kind}")), input)?;
            kept += 1;
            if kept == 4 {
                break;
            }
        }
    }
    Ok(())
}
