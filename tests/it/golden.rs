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
fn format_version_2_directories_open_with_every_record() {
    check_version("v2", OpenCheck::SealIndex);
    check_version("v2", OpenCheck::EveryFrame);
}

/// A crash image with index checkpoints: the newest segment, unsealed, is
/// read from its last checkpoint on (and frame by frame under `EveryFrame`,
/// which checks every checkpoint against the frames before it).
#[test]
fn format_version_2_index_checkpoints_of_a_crashed_segment_are_read() {
    check_version("v2-checkpoints", OpenCheck::SealIndex);
    check_version("v2-checkpoints", OpenCheck::EveryFrame);
    for (check, taken) in [(OpenCheck::SealIndex, true), (OpenCheck::EveryFrame, false)] {
        let copy = copy_of("v2-checkpoints");
        let outbox = Outbox::open(copy.path(), Options::default().open_check(check)).expect("open");
        let report = outbox.recovery_report();
        assert_eq!(report.frames_from_checkpoints > 0, taken, "{check:?}");
        outbox.close().expect("close");
    }
}

/// Delivery state written by version 2: acks frames, and a dead letter and a
/// record delayed for a century that relocation carried forward (kind 4
/// frames) out of segments deleted since, so that only their copies hold them.
#[test]
fn format_version_2_delivery_state_and_relocated_records_survive() {
    for check in [OpenCheck::SealIndex, OpenCheck::EveryFrame] {
        check_version("v2-delivery", check);
        let copy = copy_of("v2-delivery");
        let outbox = Outbox::open(copy.path(), Options::default().open_check(check)).expect("open");
        let dead: String = outbox
            .dead_letters(usize::MAX)
            .expect("dead_letters")
            .iter()
            .map(|d| {
                let payload = std::str::from_utf8(d.payload()).expect("utf-8");
                format!("{} {} {}|{payload}\n", d.seq(), d.attempts(), d.reason())
            })
            .collect();
        let want =
            std::fs::read_to_string(golden("v2-delivery").join("dead.txt")).expect("dead.txt");
        assert_eq!(dead, want);
        let delayed: u64 = std::fs::read_to_string(golden("v2-delivery").join("delayed.txt"))
            .expect("delayed.txt")
            .trim()
            .parse()
            .expect("a count");
        let stats = outbox.stats();
        assert_eq!((stats.delayed, delayed), (1, 1));
        // Both live only in copies: every segment now on disk starts after
        // their own numbers.
        let first_segment: u64 = crate::segment_files(copy.path())[0]
            .file_name()
            .and_then(|n| n.to_str())
            .expect("name")[..20]
            .parse()
            .expect("numeric");
        let dead_seq = outbox.dead_letters(1).expect("dead_letters")[0].seq();
        assert!(
            dead_seq.get() < first_segment,
            "{dead_seq} in {first_segment}"
        );
        outbox.close().expect("close");
    }
}

/// Records written as messages by version 2: ordering keys (each key's
/// later records held back behind its first), a record not before a century
/// from now, deduplication ids, fields frames (kind 5) in sealed segments, and
/// a tombstones frame (`0x85`) that carried an id out of a deleted segment.
/// The ids' window (wall clock) has long passed when this runs: what stays
/// checkable is that every frame reads and each record keeps its fields.
#[test]
fn format_version_2_producer_fields_survive() {
    for check in [OpenCheck::SealIndex, OpenCheck::EveryFrame] {
        check_version("v2-producers", check);
        let copy = copy_of("v2-producers");
        let outbox = Outbox::open(copy.path(), Options::default().open_check(check)).expect("open");
        let stats = outbox.stats();
        let mut got = format!(
            "delayed {}\nblocked_keys {}\nheld_by_key {}\n",
            stats.delayed, stats.blocked_keys, stats.held_by_key
        );
        for r in outbox.claim(usize::MAX).expect("claim") {
            if let Some(key) = r.key() {
                let key = std::str::from_utf8(key).expect("utf-8");
                got.push_str(&format!("key {} {key}\n", r.seq()));
            }
            if let Some(id) = r.dedup_id() {
                let id = std::str::from_utf8(id).expect("utf-8");
                got.push_str(&format!("dedup_id {} {id}\n", r.seq()));
            }
        }
        let want =
            std::fs::read_to_string(golden("v2-producers").join("fields.txt")).expect("fields.txt");
        assert_eq!(got, want, "{check:?}");
        outbox.close().expect("close");
    }
}

/// Format version 1 is refused, by number and with the way forward, and
/// nothing in the directory changes: the records are still there for a release
/// that reads version 1 to drain.
#[test]
fn format_version_1_directories_are_refused_and_left_as_they_are() {
    let copy = copy_of("v1");
    let before: Vec<Vec<u8>> = segments_of(copy.path());
    match Outbox::open(copy.path(), Options::default()) {
        Err(e @ segwal::Error::UnsupportedFormat { .. }) => {
            let segwal::Error::UnsupportedFormat {
                found, supported, ..
            } = &e
            else {
                unreachable!()
            };
            assert_eq!((*found, *supported), (1, 2));
            let message = e.to_string();
            assert!(
                message.contains("version 1") && message.contains("drain"),
                "{message}"
            );
        }
        Err(e) => panic!("expected UnsupportedFormat, got {e}"),
        Ok(_) => panic!("a version 1 directory opened"),
    }
    assert_eq!(
        segments_of(copy.path()),
        before,
        "a refused open changed a file"
    );
}

fn segments_of(dir: &Path) -> Vec<Vec<u8>> {
    let mut names: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "seg"))
        .collect();
    names.sort();
    names
        .iter()
        .map(|p| std::fs::read(p).expect("read"))
        .collect()
}

#[test]
fn the_golden_files_are_as_they_were_made() {
    // Guards against a test or a tool rewriting them: the CRC-32 of each file
    // as the tool left it.
    let files = [
        ("v1", "00000000000000000029.seg", 0xce1d_32dd),
        ("v1", "00000000000000000044.seg", 0x5c9a_55e9),
        ("v1", "00000000000000000069.seg", 0x6e86_c5c6),
        ("v1", "records.txt", 0x1d64_04d7),
        ("v2", "00000000000000000032.seg", 0x9600_c0e7),
        ("v2", "00000000000000000056.seg", 0xdf15_2990),
        ("v2", "00000000000000000060.seg", 0xeaf9_7463),
        ("v2", "records.txt", 0x8426_4915),
        ("v2-delivery", "00000000000000000224.seg", 0x120c_70fc),
        ("v2-delivery", "dead.txt", 0x2b64_2825),
        ("v2-delivery", "delayed.txt", 0x6751_fc53),
        ("v2-delivery", "records.txt", 0x3b27_a50a),
        ("v2-producers", "00000000000000000011.seg", 0xb016_f88b),
        ("v2-producers", "00000000000000000018.seg", 0x678e_efd3),
        ("v2-producers", "00000000000000000025.seg", 0x8946_7d15),
        ("v2-producers", "00000000000000000032.seg", 0xc8d1_0f6c),
        ("v2-producers", "00000000000000000039.seg", 0xa854_6538),
        ("v2-producers", "fields.txt", 0x2fe0_7eb8),
        ("v2-producers", "records.txt", 0xe1dd_4b73),
    ];
    for (version, name, crc) in files {
        let bytes = std::fs::read(golden(version).join(name)).expect("golden file");
        assert_eq!(crc32fast::hash(&bytes), crc, "{version}/{name} changed");
    }
}
