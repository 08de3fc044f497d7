//! The fuzz targets' seed corpora and saved artifacts, replayed through the same
//! check functions, so that `cargo test` catches a regression without cargo-fuzz.

use std::path::{Path, PathBuf};

use segwal::sim::harness;

/// Every file of `fuzz/<kind>/<target>/` that is checked in (seeds, regressions).
fn inputs(target: &str) -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let mut files = Vec::new();
    for kind in ["corpus", "artifacts"] {
        let Ok(dir) = std::fs::read_dir(root.join(kind).join(target)) else {
            continue;
        };
        for entry in dir {
            let path = entry.expect("corpus entry").path();
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if name.starts_with("seed-") || name.starts_with("regression-") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

fn replay(target: &str, check: impl Fn(&[u8])) {
    let files = inputs(target);
    assert!(!files.is_empty(), "no checked-in inputs for {target}");
    for path in files {
        let data = std::fs::read(&path).expect("read input");
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| check(&data)));
        assert!(outcome.is_ok(), "{target} fails on {}", path.display());
    }
}

#[test]
fn frame_decode_corpus_replays_clean() {
    replay("frame_decode", harness::check_frame_bytes);
}

#[test]
fn recovery_corpus_replays_clean() {
    replay("recovery", |data| {
        let _ = harness::check_recovery_bytes(data);
    });
}

/// The engine-made seeds are logs the engine would open: each opens and hands
/// out records, so the fuzzer starts from inputs that pass every check and go
/// through seal indexes, not from inputs refused at the first header.
#[test]
fn engine_made_recovery_seeds_open_and_hand_out_records() {
    let seeds: Vec<PathBuf> = inputs("recovery")
        .into_iter()
        .filter(|p| p.to_string_lossy().contains("seed-engine-"))
        .collect();
    // Eight from the crash harness's workloads, and the golden directory of
    // delivery state (acks frames and relocated records, kind 4).
    assert_eq!(seeds.len(), 9);
    for path in seeds {
        let data = std::fs::read(&path).expect("read seed");
        let records = harness::check_recovery_bytes(&data);
        assert!(
            records.is_some_and(|n| n > 0),
            "{} gave {records:?}",
            path.display()
        );
        // verify and dump agree with the open on a log it accepts.
        assert!(
            harness::check_offline_tools_bytes(&data),
            "{}: the open refused it after the offline tools read it",
            path.display()
        );
    }
}

/// The offline tools read the `recovery` inputs too (the `offline_tools`
/// target is run from `recovery`'s corpus), and their own regressions.
#[test]
fn recovery_corpus_replays_clean_through_the_offline_tools() {
    for target in ["recovery", "offline_tools"] {
        replay(target, |data| {
            let _ = harness::check_offline_tools_bytes(data);
        });
    }
}

#[test]
fn crash_ops_corpus_replays_clean() {
    replay("crash_ops", |data| {
        if let Err(v) = harness::check_crash_bytes(data) {
            panic!("{v}");
        }
    });
}
