//! Files segwal did not write, and paths that cannot be an outbox: recovery
//! never deletes a file it cannot prove it wrote (refused, removed with proof,
//! or set aside in `quarantine/`), and a bad path is refused before anything is
//! created.

use std::path::{Path, PathBuf};

use segwal::{Corruption, Error, Options, Outbox, QUARANTINE_DIR, QuarantineReason, RecoveryMode};

use crate::{mkfifo, segment_files, small_segments, tmp};

/// A segment name far above any this test's outboxes use.
const FOREIGN: &str = "00000000000000100000.seg";

/// What recovery must do with a file named like the newest segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    /// Refused with `Error::Corrupt` naming the file; the file left as it was.
    Refused,
    /// Refused as a segment of another format version; left as it was.
    OtherVersion,
    /// Removed: every byte zero proves it holds nothing.
    Removed,
}

/// A real segment of a closed outbox (its header checks), as bytes.
fn real_segment() -> Vec<u8> {
    let (_t, dir) = tmp();
    let outbox = Outbox::open(&dir, small_segments()).expect("open");
    outbox.append(b"a record").expect("append");
    outbox.close().expect("close");
    std::fs::read(&segment_files(&dir)[0]).expect("read")
}

/// The foreign newest files of the matrix, each with what recovery must do.
fn matrix() -> Vec<(&'static str, Vec<u8>, Outcome)> {
    let mut png = vec![0x89, b'P', b'N', b'G', b'\r', b'\n', 0x1a, b'\n'];
    png.resize(48, 0x42);
    let v1 = std::fs::read(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/v1/00000000000000000029.seg"),
    )
    .expect("golden v1 segment");
    let mut bad_crc = real_segment();
    bad_crc[124] ^= 0xff;
    // A file of the preallocated length whose first block is garbage.
    let mut garbled = vec![0u8; 64 << 20];
    for (i, b) in garbled[..4096].iter_mut().enumerate() {
        *b = (i as u8).wrapping_mul(31).wrapping_add(7);
    }
    vec![
        (
            "26 bytes of text",
            b"some notes, not a segment".to_vec(),
            Outcome::Refused,
        ),
        ("5,000 bytes of x", vec![b'x'; 5000], Outcome::Refused),
        ("48 bytes starting like a PNG", png, Outcome::Refused),
        ("a header of format version 1", v1, Outcome::OtherVersion),
        (
            "a version 2 header with a wrong checksum",
            bad_crc,
            Outcome::Refused,
        ),
        ("64 MiB, its first block garbled", garbled, Outcome::Refused),
        ("zero bytes", Vec::new(), Outcome::Removed),
        ("a few zeros", vec![0; 7], Outcome::Removed),
        ("a block of zeros", vec![0; 4096], Outcome::Removed),
        (
            "a preallocated length of zeros",
            vec![0; 64 << 20],
            Outcome::Removed,
        ),
    ]
}

/// Runs the matrix with the foreign file alone in the directory, or as the
/// newest after the segments of a real outbox.
fn check_matrix(after_a_real_log: bool) {
    for (what, bytes, outcome) in matrix() {
        let (_t, dir) = tmp();
        if after_a_real_log {
            let outbox = Outbox::open(&dir, small_segments()).expect("open");
            for i in 0..40u32 {
                outbox.append(&i.to_le_bytes()).expect("append");
            }
            outbox.close().expect("close");
        } else {
            std::fs::create_dir(&dir).expect("mkdir");
        }
        let path = dir.join(FOREIGN);
        std::fs::write(&path, &bytes).expect("write foreign file");
        let opened = Outbox::open(&dir, small_segments());
        match (outcome, opened) {
            (
                Outcome::Refused,
                Err(Error::Corrupt {
                    path: named, kind, ..
                }),
            ) => {
                assert_eq!(named.file_name(), path.file_name(), "{what}: {kind}");
                assert!(
                    matches!(
                        kind,
                        Corruption::BadSegmentMagic
                            | Corruption::ShortSegmentHeader { .. }
                            | Corruption::BadSegmentHeader
                    ),
                    "{what}: {kind}"
                );
            }
            (Outcome::OtherVersion, Err(Error::UnsupportedFormat { path: named, .. })) => {
                assert_eq!(named.file_name(), path.file_name(), "{what}");
            }
            (Outcome::Removed, Ok(outbox)) => {
                assert!(!path.exists(), "{what}: still there");
                let report = outbox.recovery_report();
                assert!(
                    report
                        .removed
                        .iter()
                        .any(|r| r.file_name() == path.file_name()),
                    "{what}: removal not reported: {report:?}"
                );
                let expected = if after_a_real_log { 40 } else { 0 };
                assert_eq!(crate::drain_ack(&outbox).len(), expected, "{what}");
                outbox.close().expect("close");
                continue;
            }
            (_, other) => panic!("{what}: expected {outcome:?}, got {other:?}"),
        }
        // Refused: the file is exactly as it was, and nothing else was made.
        assert_eq!(std::fs::read(&path).expect("still there"), bytes, "{what}");
        assert!(!dir.join(QUARANTINE_DIR).exists(), "{what}");
    }
}

#[test]
fn a_foreign_file_alone_is_refused_or_removed_with_proof() {
    check_matrix(false);
}

#[test]
fn a_foreign_newest_file_after_a_real_log_is_refused_or_removed_with_proof() {
    check_matrix(true);
}

#[test]
fn a_lossy_repair_sets_a_foreign_newest_file_aside_and_keeps_its_bytes() {
    let (_t, dir) = tmp();
    let outbox = Outbox::open(&dir, small_segments()).expect("open");
    for i in 0..40u32 {
        outbox.append(&i.to_le_bytes()).expect("append");
    }
    outbox.close().expect("close");
    let path = dir.join(FOREIGN);
    let bytes = b"a file another program left here".to_vec();
    std::fs::write(&path, &bytes).expect("write");
    let lossy = small_segments().recovery(RecoveryMode::Lossy);
    let outbox = Outbox::open(&dir, lossy).expect("lossy open");
    let report = outbox.recovery_report().clone();
    assert_eq!(report.quarantined.len(), 1, "{report:?}");
    let q = &report.quarantined[0];
    assert_eq!(q.reason, QuarantineReason::DroppedByRepair);
    assert_eq!(q.from.file_name(), path.file_name());
    assert_eq!(
        q.to,
        outbox
            .dir()
            .join(QUARANTINE_DIR)
            .join(format!("{FOREIGN}.dropped-by-repair"))
    );
    assert!(!path.exists());
    assert_eq!(std::fs::read(&q.to).expect("set aside"), bytes);
    assert!(report.removed.is_empty(), "{report:?}");
    // Every record of the real log is still there.
    assert_eq!(crate::drain_ack(&outbox).len(), 40);
    outbox.close().expect("close");
    // The quarantine folder is not part of the log: the next open is clean.
    let again = Outbox::open(&dir, small_segments()).expect("reopen");
    assert!(again.recovery_report().quarantined.is_empty());
    again.close().expect("close");
}

/// A segment whose creation a crash interrupted (`<name>.creating`): removed
/// when its bytes prove it holds nothing, set aside otherwise; the open goes
/// on either way, and no record is lost.
#[test]
fn an_unfinished_creation_is_removed_with_proof_or_set_aside() {
    let header_then_zeros = {
        let mut b = real_segment();
        b.truncate(4096);
        b.resize(64 << 10, 0);
        b
    };
    let header_then_a_frame = real_segment();
    let mut garbled = vec![0u8; 64 << 10];
    garbled[..4096].fill(0x5a);
    for (what, bytes, removed) in [
        ("empty", Vec::new(), true),
        ("zeros", vec![0; 64 << 10], true),
        ("a whole header block, then zeros", header_then_zeros, true),
        ("a header block garbled by the crash", garbled, false),
        (
            "a header, then bytes that are not zero",
            header_then_a_frame,
            false,
        ),
    ] {
        let (_t, dir) = tmp();
        let outbox = Outbox::open(&dir, small_segments()).expect("open");
        outbox.append(b"kept").expect("append");
        outbox.close().expect("close");
        let name = format!("{FOREIGN}.creating");
        let path = dir.join(&name);
        std::fs::write(&path, &bytes).expect("write");
        let outbox = Outbox::open(&dir, small_segments()).expect("open");
        let report = outbox.recovery_report().clone();
        assert!(!path.exists(), "{what}: left in place");
        if removed {
            assert!(report.removed.contains(&outbox.dir().join(&name)), "{what}");
            assert!(report.quarantined.is_empty(), "{what}");
        } else {
            assert_eq!(report.quarantined.len(), 1, "{what}: {report:?}");
            let q = &report.quarantined[0];
            assert_eq!(q.reason, QuarantineReason::UnfinishedCreation, "{what}");
            assert_eq!(std::fs::read(&q.to).expect("set aside"), bytes, "{what}");
        }
        assert_eq!(crate::drain_ack(&outbox), vec![b"kept".to_vec()], "{what}");
        outbox.close().expect("close");
    }
}

fn invalid_path(result: segwal::Result<Outbox>) -> (PathBuf, &'static str) {
    match result {
        Err(Error::InvalidPath { path, reason }) => (path, reason),
        other => panic!("expected InvalidPath, got {other:?}"),
    }
}

#[test]
fn a_path_that_cannot_be_an_outbox_is_refused_before_anything_is_created() {
    let t = tempfile::tempdir().expect("tempdir");
    // A regular file.
    let file = t.path().join("a-file");
    std::fs::write(&file, b"hello").expect("write");
    let (path, reason) = invalid_path(Outbox::open(&file, Options::default()));
    assert_eq!(path, file);
    assert!(reason.contains("not a directory"), "{reason}");
    assert_eq!(std::fs::read(&file).expect("untouched"), b"hello");
    assert_eq!(reason, "it exists and is not a directory");
    let e = Outbox::open(&file, Options::default()).expect_err("refused");
    assert!(e.to_string().contains("not a directory"), "{e}");
    // Under a regular file: nothing exists there, a component is a file.
    let (_, reason) = invalid_path(Outbox::open(file.join("sub"), Options::default()));
    assert_eq!(reason, "a component of its path is not a directory");
    // A symbolic link to nothing: its parent exists.
    let dangling = t.path().join("dangling");
    std::os::unix::fs::symlink(t.path().join("nowhere"), &dangling).expect("symlink");
    let (_, reason) = invalid_path(Outbox::open(&dangling, Options::default()));
    assert_eq!(reason, "it is a symbolic link to nothing");
    assert!(!t.path().join("nowhere").exists());
    // A missing parent: nothing is created on the way.
    let deep = t.path().join("missing").join("outbox");
    let (_, reason) = invalid_path(Outbox::open(&deep, Options::default()));
    assert!(reason.contains("parent"), "{reason}");
    assert!(!t.path().join("missing").exists());
    // An empty path: nothing is created in the working directory.
    let (path, reason) = invalid_path(Outbox::open("", Options::default()));
    assert_eq!(path, PathBuf::new());
    assert!(reason.contains("empty"), "{reason}");
    for name in ["OWNER", "LOCK"] {
        assert!(
            !Path::new(name).exists(),
            "{name} left in the working directory"
        );
    }
}

/// Set in the environment of the child that opens a directory it cannot write.
const UNWRITABLE: &str = "SEGWAL_TEST_UNWRITABLE_DIR";

/// A directory the process may not write is refused with `InvalidPath`
/// before anything in it is written: an empty one, and one holding an outbox
/// whose files the process could write (the directory made read-only after
/// the outbox was created), which would otherwise open and then fail at its
/// first rotation.
#[test]
fn a_directory_the_process_cannot_write_is_refused_plainly() {
    use std::os::unix::fs::PermissionsExt;
    let t = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(t.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let empty = t.path().join("read-only");
    std::fs::create_dir(&empty).expect("mkdir");
    let outbox_dir = t.path().join("read-only-outbox");
    let outbox = Outbox::open(&outbox_dir, small_segments()).expect("open");
    outbox.append(b"a record").expect("append");
    outbox.close().expect("close");
    for entry in std::fs::read_dir(&outbox_dir).expect("list") {
        let path = entry.expect("entry").path();
        if path.is_file() {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).expect("chmod");
        }
    }
    for dir in [&empty, &outbox_dir] {
        // Read and search only, for everyone (root is held to it by dropping
        // to an unprivileged user in the child).
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o555)).expect("chmod");
        let before = files_of(dir);
        let out = std::process::Command::new(crate::this_binary())
            .args(["--exact", "foreign::child_opening_an_unwritable_directory"])
            .args(["--nocapture", "--test-threads=1"])
            .env(UNWRITABLE, dir)
            .output()
            .expect("spawn child");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "child failed: {stdout}");
        assert!(
            stdout.contains("segwal-child: refused: cannot open an outbox at")
                && stdout.contains("may not write in the directory"),
            "{stdout}"
        );
        assert_eq!(files_of(dir), before, "{}: a file changed", dir.display());
    }
}

/// Every entry of `dir` with its bytes (empty for a directory), sorted.
fn files_of(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .expect("list")
        .map(|e| {
            let path = e.expect("entry").path();
            let bytes = if path.is_file() {
                std::fs::read(&path).expect("read")
            } else {
                Vec::new()
            };
            (path, bytes)
        })
        .collect();
    files.sort();
    files
}

/// The child half: without its environment variable it has nothing to do.
#[test]
fn child_opening_an_unwritable_directory() {
    let Some(dir) = std::env::var_os(UNWRITABLE) else {
        return;
    };
    // SAFETY: getuid/setgid/setuid with plain integers, in a child process
    // running this one test on one thread.
    unsafe {
        if libc::getuid() == 0 {
            assert_eq!(libc::setgid(65534), 0, "setgid");
            assert_eq!(libc::setuid(65534), 0, "setuid");
        }
    }
    match Outbox::open(&dir, Options::default()) {
        Err(e @ Error::InvalidPath { .. }) => println!("segwal-child: refused: {e}"),
        other => panic!("expected InvalidPath, got {other:?}"),
    }
}

/// Something that is not a regular file under a segment's name (a FIFO, a
/// directory) is refused with an error naming it, at once: the open neither
/// blocks on the FIFO nor removes either, and `verify` says the same.
#[test]
fn a_fifo_or_a_directory_named_like_a_segment_is_refused_and_left_alone() {
    for make in [mkfifo as fn(&Path), |p: &Path| {
        std::fs::create_dir(p).expect("dir")
    }] {
        let (_t, dir) = tmp();
        let outbox = Outbox::open(&dir, small_segments()).expect("open");
        outbox.append(b"a record").expect("append");
        outbox.close().expect("close");
        let odd = dir.join(FOREIGN);
        make(&odd);
        match Outbox::open(&dir, small_segments()) {
            Err(Error::Io { path, source, .. }) => {
                assert_eq!(path, odd);
                // A FIFO is refused as not a regular file; a directory
                // cannot even be opened for writing.
                use std::io::ErrorKind::{InvalidInput, IsADirectory};
                assert!(
                    matches!(source.kind(), InvalidInput | IsADirectory),
                    "{source}"
                );
            }
            Err(other) => panic!("expected Io naming {}, got {other}", odd.display()),
            Ok(_) => panic!("opened beside {}", odd.display()),
        }
        assert!(std::fs::symlink_metadata(&odd).is_ok(), "left where it was");
        match segwal::verify(&dir) {
            Err(Error::Io { path, .. }) => assert_eq!(path, odd),
            other => panic!(
                "expected verify to fail naming {}, got {other:?}",
                odd.display()
            ),
        }
        assert!(std::fs::symlink_metadata(&odd).is_ok(), "left where it was");
    }
}

/// A FIFO named like a segment being created, or like a file kept for
/// recycling, holds no record the log needs: the open moves it into
/// `quarantine/` (never opening it for a read that would wait for a writer)
/// and goes on, with every record kept.
#[test]
fn a_fifo_named_like_a_creation_or_a_kept_file_is_set_aside_and_the_open_goes_on() {
    use std::os::unix::fs::FileTypeExt;
    let (_t, dir) = tmp();
    let outbox = Outbox::open(&dir, small_segments()).expect("open");
    let seq = outbox.append(b"a record").expect("append");
    outbox.close().expect("close");
    let creating = dir.join("00000000000000000900.seg.creating");
    let free = dir.join("00000000000000000901.seg.free");
    mkfifo(&creating);
    mkfifo(&free);

    let outbox = Outbox::open(&dir, small_segments()).expect("the FIFOs do not stop the open");
    let report = outbox.recovery_report();
    let mut reasons: Vec<_> = report.quarantined.iter().map(|q| q.reason).collect();
    reasons.sort_by_key(|r| format!("{r:?}"));
    assert_eq!(
        reasons,
        [
            QuarantineReason::UnfinishedCreation,
            QuarantineReason::UnfinishedRecycling
        ],
        "{report:?}"
    );
    for q in &report.quarantined {
        let meta = std::fs::symlink_metadata(&q.to).expect("set aside");
        assert!(
            meta.file_type().is_fifo(),
            "{} moved as it was",
            q.to.display()
        );
    }
    assert!(std::fs::symlink_metadata(&creating).is_err());
    assert!(std::fs::symlink_metadata(&free).is_err());
    let records = outbox.claim(10).expect("claim");
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].seq(), seq);
    assert_eq!(records[0].payload(), b"a record");
    outbox.close().expect("close");
}
