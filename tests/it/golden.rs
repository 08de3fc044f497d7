//! The golden directories of `tests/golden/`, one per format version, made once
//! and frozen: every version's directory still opens and hands out exactly its
//! records.

use std::path::{Path, PathBuf};

use segwal::{OpenCheck, Options, Outbox, Seq};

fn golden(version: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(version)
}

/// A copy of a golden directory: opening changes it (the newest segment is
/// sealed), and the golden files must never change.
fn copy_of(version: &str) -> tempfile::TempDir {
    let copy = tempfile::tempdir().expect("tempdir");
    for entry in std::fs::read_dir(golden(version)).expect("golden directory") {
        let entry = entry.expect("entry");
        let name = entry.file_name();
        if name.to_string_lossy().ends_with(".seg") {
            std::fs::copy(entry.path(), copy.path().join(name)).expect("copy");
        }
    }
    copy
}

/// The records the golden directory holds, from its `records.txt`.
fn expected(version: &str) -> Vec<(Seq, String)> {
    let text = std::fs::read_to_string(golden(version).join("records.txt")).expect("records.txt");
    text.lines()
        .map(|line| {
            let (seq, payload) = line.split_once(' ').expect("seq payload");
            (
                Seq::from(seq.parse::<u64>().expect("seq")),
                payload.to_string(),
            )
        })
        .collect()
}

fn check_version(version: &str, check: OpenCheck) {
    let copy = copy_of(version);
    let outbox = Outbox::open(copy.path(), Options::default().open_check(check)).expect("open");
    let report = outbox.recovery_report();
    assert_eq!(
        report.torn_tail, None,
        "{version}: a clean close left no torn tail"
    );
    assert!(report.removed.is_empty(), "{version}: nothing to remove");
    let want = expected(version);
    assert_eq!(report.records_recovered, want.len() as u64);
    let got: Vec<(Seq, String)> = outbox
        .claim(usize::MAX)
        .expect("claim")
        .iter()
        .map(|r| {
            let payload = std::str::from_utf8(r.payload()).expect("utf-8").to_string();
            (r.seq(), payload)
        })
        .collect();
    assert_eq!(got, want, "{version} under {check:?}");
    // The log goes on above every number the directory holds.
    let last = want.last().map(|w| w.0).expect("records");
    let next = outbox.append(b"after the golden records").expect("append");
    assert!(next > last, "{next} after {last}");
    outbox.close().expect("close");
}

#[test]
fn format_version_1_directories_still_open_with_every_record() {
    check_version("v1", OpenCheck::SealIndex);
    check_version("v1", OpenCheck::EveryFrame);
}

#[test]
fn the_golden_files_are_as_they_were_made() {
    // Guards against a test or a tool rewriting them: the CRC-32 of each file
    // as the tool left it.
    let files = [
        ("00000000000000000029.seg", 0xce1d_32dd),
        ("00000000000000000044.seg", 0x5c9a_55e9),
        ("00000000000000000069.seg", 0x6e86_c5c6),
        ("records.txt", 0x1d64_04d7),
    ];
    for (name, crc) in files {
        let bytes = std::fs::read(golden("v1").join(name)).expect("golden file");
        assert_eq!(crc32fast::hash(&bytes), crc, "v1/{name} changed");
    }
}
