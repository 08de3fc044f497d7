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
    replay("recovery", harness::check_recovery_bytes);
}

#[test]
fn crash_ops_corpus_replays_clean() {
    replay("crash_ops", |data| {
        if let Err(v) = harness::check_crash_bytes(data) {
            panic!("{v}");
        }
    });
}
