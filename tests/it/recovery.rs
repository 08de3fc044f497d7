//! Recovery: torn tails of several shapes are truncated with nothing
//! acknowledged lost; any other damage is `Corrupt`, naming file and offset,
//! and leaves the disk untouched; a lossy recovery reports what it dropped.

use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use segwal::{Corruption, Error, OpenCheck, Options, Outbox, RecoveryMode, Seq};

use crate::{drain, drain_ack, flip_byte, segment_files, small_segments, tmp};

/// The block (docs/FORMAT.md, "Blocks"): the header has the first to itself,
/// and every write batch appended alone starts one of its own.
const BLOCK: u64 = 4096;
const FRAME_HEADER: u64 = 48;
/// The frame of a 100-byte record.
const RECORD: u64 = FRAME_HEADER + 100;

/// Offset of the `i`-th record (from 0) of records appended one at a time.
fn single_at(i: u64) -> u64 {
    BLOCK + i * BLOCK
}

/// Where the data of `n` records appended one at a time ends.
fn singles_end(n: u64) -> u64 {
    single_at(n - 1) + RECORD
}

/// Length of the seal frame of a segment of `frames` frames, `internal` of them
/// internal: a frame header and its index (docs/FORMAT.md, "The seal index").
fn seal_len(frames: u64, internal: u64) -> u64 {
    FRAME_HEADER + 28 + 8 * frames + 4 * internal
}

/// Appends `n` records of `len` bytes, one write batch each; returns their seqs.
fn fill(outbox: &Outbox, n: usize, len: usize) -> Vec<Seq> {
    (0..n)
        .map(|i| outbox.append(&vec![i as u8; len]).expect("append"))
        .collect()
}

fn last_segment(dir: &Path) -> PathBuf {
    segment_files(dir).pop().expect("a segment")
}

fn len(path: &Path) -> u64 {
    std::fs::metadata(path).expect("stat").len()
}

fn extend(path: &Path, bytes: &[u8]) {
    let mut f = OpenOptions::new().append(true).open(path).expect("open");
    f.write_all(bytes).expect("extend");
}

fn recovered_seqs(outbox: &Outbox) -> Vec<Seq> {
    drain(outbox).iter().map(|r| r.seq()).collect()
}

/// A closed outbox with `n` records of 100 bytes in a single segment.
fn one_segment(n: usize) -> (tempfile::TempDir, PathBuf, Vec<Seq>) {
    let (t, dir) = tmp();
    let outbox = Outbox::open(&dir, Options::default()).expect("open");
    let seqs = fill(&outbox, n, 100);
    outbox.close().expect("close");
    (t, dir, seqs)
}

#[test]
fn a_partial_last_frame_is_truncated_and_everything_before_it_kept() {
    let (_t, dir, seqs) = one_segment(10);
    let seg = last_segment(&dir);
    let full = singles_end(10);
    for cut in [1, FRAME_HEADER / 2, FRAME_HEADER + 50] {
        let f = OpenOptions::new().write(true).open(&seg).expect("open");
        f.set_len(full - cut).expect("cut");
        drop(f);
        let outbox = Outbox::open(&dir, Options::default()).expect("torn tail opens");
        let torn = outbox
            .recovery_report()
            .torn_tail
            .clone()
            .expect("torn tail reported");
        assert_eq!(torn.path, seg);
        assert_eq!(torn.offset, single_at(9));
        assert_eq!(recovered_seqs(&outbox), seqs[..9].to_vec());
        outbox.close().expect("close");
        // Put the file back for the next shape: the truncated record is gone
        // for good, the test only reuses the directory.
        let _ = std::fs::remove_dir_all(&dir);
        let outbox = Outbox::open(&dir, Options::default()).expect("open");
        assert_eq!(fill(&outbox, 10, 100), seqs);
        outbox.close().expect("close");
    }
}

#[test]
fn a_zero_tail_is_preallocated_space_not_a_torn_write() {
    let (_t, dir, seqs) = one_segment(10);
    let seg = last_segment(&dir);
    let full = len(&seg);
    // A closed outbox leaves the file at its data's length, to a block.
    assert_eq!(full, single_at(10));
    extend(&seg, &vec![0u8; 1 << 20]);
    let outbox = Outbox::open(&dir, Options::default()).expect("open");
    assert!(outbox.recovery_report().torn_tail.is_none());
    assert_eq!(recovered_seqs(&outbox), seqs);
    // The segment is sealed on the block after its last frame, the zeros
    // dropped.
    assert_eq!(len(&seg), full + seal_len(10, 0));
    let more = fill(&outbox, 3, 10);
    assert!(more[0] > seqs[9]);
    outbox.close().expect("close");
    let outbox = Outbox::open(&dir, Options::default()).expect("reopen");
    assert!(outbox.recovery_report().torn_tail.is_none());
    assert_eq!(recovered_seqs(&outbox).len(), 13);
}

#[test]
fn the_active_segment_is_preallocated_and_a_close_gives_the_space_back() {
    let (_t, dir) = tmp();
    let options = Options::default().segment_bytes(1 << 20);
    let outbox = Outbox::open(&dir, options.clone()).expect("open");
    fill(&outbox, 3, 100);
    let seg = last_segment(&dir);
    assert_eq!(len(&seg), 1 << 20, "the active segment is preallocated");
    assert_eq!(outbox.stats().disk_bytes, singles_end(3));
    outbox.close().expect("close");
    assert_eq!(len(&seg), single_at(3));
    // A reopen seals it, on the block after its last frame, and preallocates
    // the next.
    let outbox = Outbox::open(&dir, options).expect("reopen");
    assert_eq!(len(&seg), single_at(3) + seal_len(3, 0));
    assert_eq!(len(&last_segment(&dir)), 1 << 20);
    outbox.close().expect("close");
}

#[test]
fn an_open_write_batch_before_a_zero_tail_is_torn() {
    let (_t, dir) = tmp();
    let outbox = Outbox::open(&dir, Options::default()).expect("open");
    let singles = fill(&outbox, 2, 100);
    outbox
        .append_batch(&[[7u8; 100], [8u8; 100], [9u8; 100]])
        .expect("batch");
    outbox.close().expect("close");
    let seg = last_segment(&dir);
    // The batch's last frame, the one marked as its end, never reached the disk;
    // the space after the others reads as zeros.
    let file = OpenOptions::new().write(true).open(&seg).expect("open");
    file.set_len(single_at(2) + 2 * RECORD).expect("cut");
    drop(file);
    extend(&seg, &vec![0u8; 4096]);
    let outbox = Outbox::open(&dir, Options::default()).expect("open");
    let torn = outbox
        .recovery_report()
        .torn_tail
        .clone()
        .expect("the open batch is a torn tail");
    assert_eq!(torn.offset, single_at(2));
    // What the batch left, not the zeros after it (a crashed segment keeps
    // its preallocated space: megabytes of them).
    assert_eq!(torn.bytes, 2 * RECORD);
    assert!(matches!(torn.cause, Corruption::IncompleteBatch));
    assert_eq!(recovered_seqs(&outbox), singles);
    outbox.close().expect("close");
}

#[test]
fn garbage_tails_are_truncated() {
    for tail in [
        (0..3000u32).map(|i| (i * 7 + 3) as u8).collect::<Vec<u8>>(),
        [vec![0u8; 2048], vec![1u8; 16]].concat(),
    ] {
        let (_t, dir, seqs) = one_segment(10);
        let seg = last_segment(&dir);
        let full = len(&seg);
        extend(&seg, &tail);
        let outbox = Outbox::open(&dir, Options::default()).expect("open");
        let torn = outbox
            .recovery_report()
            .torn_tail
            .clone()
            .expect("torn tail reported");
        // Cut at the end of the last frame; garbage is no frame of a write
        // batch, which `bytes` counts (as no checksum of this segment names
        // it, nor the zeros after a real crash, nor a recycled file's past).
        assert_eq!((torn.offset, torn.bytes), (full, 0));
        assert_eq!(recovered_seqs(&outbox), seqs);
        // The tail is gone; the segment now ends with its seal frame.
        assert_eq!(
            len(&seg),
            full + seal_len(10, 0),
            "the truncation reached the file"
        );
        // The new records go to a new segment and the log reopens cleanly.
        let more = fill(&outbox, 3, 10);
        assert!(more[0] > seqs[9]);
        outbox.close().expect("close");
        let outbox = Outbox::open(&dir, Options::default()).expect("reopen");
        assert!(outbox.recovery_report().torn_tail.is_none());
        assert_eq!(recovered_seqs(&outbox).len(), 13);
    }
}

#[test]
fn damage_inside_the_last_batch_truncates_the_whole_batch() {
    // The last batch's sectors may land in any order after a power cut: its first
    // frame damaged while its later frames are intact is still a torn tail, and
    // the whole batch goes (none of it was acknowledged).
    let (_t, dir) = tmp();
    let outbox = Outbox::open(&dir, Options::default()).expect("open");
    let before = fill(&outbox, 5, 100);
    let batch = outbox
        .append_batch(&[[1u8; 100], [2u8; 100], [3u8; 100]])
        .expect("batch");
    outbox.close().expect("close");
    let seg = last_segment(&dir);
    let batch_at = single_at(5);
    flip_byte(&seg, batch_at + FRAME_HEADER + 3);
    let outbox = Outbox::open(&dir, Options::default()).expect("open");
    let torn = outbox.recovery_report().torn_tail.clone().expect("torn");
    assert_eq!(torn.offset, batch_at);
    assert_eq!(recovered_seqs(&outbox), before);
    // The batch's numbers are not reused: a relay may not have seen them, but
    // nothing is gained by risking it.
    let next = outbox.append(b"next").expect("append");
    assert!(next > batch[2]);
    drop(batch);
}

#[test]
fn a_damaged_frame_followed_by_a_later_batch_is_corruption_not_a_torn_tail() {
    let (_t, dir, _seqs) = one_segment(10);
    let seg = last_segment(&dir);
    let full = len(&seg);
    let at = single_at(4);
    flip_byte(&seg, at + FRAME_HEADER + 20);
    match Outbox::open(&dir, Options::default()) {
        Err(Error::Corrupt {
            path,
            offset,
            seq,
            kind,
        }) => {
            assert_eq!(path, seg);
            assert_eq!(offset, at);
            assert_eq!(seq, Some(Seq::from(5)));
            assert!(
                matches!(kind, Corruption::DamageBeforeValidFrame { .. }),
                "{kind:?}"
            );
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
    assert_eq!(len(&seg), full, "a refused open changed the file");
}

/// Recovery skips preallocated space without reading it (docs/FORMAT.md), yet a
/// valid frame beyond such space still proves that damage before it is not torn.
#[test]
fn a_valid_frame_beyond_unwritten_space_still_proves_damage_is_not_torn() {
    let (_t, dir, seqs) = one_segment(10);
    let seg = last_segment(&dir);
    let last_at = single_at(9);
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&seg)
        .expect("open");
    let mut last = vec![0u8; RECORD as usize];
    file.read_exact_at(&mut last, last_at)
        .expect("read the last frame");
    // Frames 1..=9, the ninth damaged (alone, a torn tail), then 4 MiB of space
    // never written, then the tenth frame, of a later write batch.
    file.set_len(last_at).expect("cut");
    drop(file);
    let ninth_at = single_at(8);
    flip_byte(&seg, ninth_at + FRAME_HEADER + 20);
    let far = 4 << 20;
    let file = OpenOptions::new().write(true).open(&seg).expect("open");
    file.set_len(8 << 20).expect("grow");
    file.write_all_at(&last, far).expect("write far");
    file.sync_all().expect("sync");
    match Outbox::open(&dir, Options::default()) {
        Err(Error::Corrupt {
            path, offset, kind, ..
        }) => {
            assert_eq!(path, seg);
            assert_eq!(offset, ninth_at);
            assert_eq!(
                kind,
                Corruption::DamageBeforeValidFrame {
                    valid_offset: far,
                    valid_seq: seqs[9],
                }
            );
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
    assert_eq!(len(&seg), 8 << 20, "a refused open changed the file");
    // Without the far frame the same damage is a torn tail.
    file.write_all_at(&[0; RECORD as usize], far)
        .expect("zero far");
    file.sync_all().expect("sync");
    let outbox = Outbox::open(&dir, Options::default()).expect("open");
    let torn = outbox
        .recovery_report()
        .torn_tail
        .clone()
        .expect("torn tail");
    assert_eq!(torn.offset, ninth_at);
    assert_eq!(recovered_seqs(&outbox), seqs[..8]);
    outbox.close().expect("close");
}

#[test]
fn a_flipped_length_bit_is_not_mistaken_for_a_torn_tail() {
    let (_t, dir, _seqs) = one_segment(10);
    let seg = last_segment(&dir);
    // The length field of frame 3 (bytes 12..16 of the frame): make it swallow
    // the frames after it, as if the file ended inside it.
    let at = single_at(2);
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&seg)
        .expect("open");
    file.write_all_at(&50_000u32.to_le_bytes(), at + 12)
        .expect("write");
    drop(file);
    match Outbox::open(&dir, Options::default()) {
        Err(Error::Corrupt { offset, path, .. }) => {
            assert_eq!((path, offset), (seg.clone(), at));
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
    assert_eq!(len(&seg), single_at(10));
}

#[test]
fn a_flipped_byte_in_a_sealed_segment_is_corruption_naming_file_and_offset() {
    let (_t, dir) = tmp();
    let outbox = Outbox::open(&dir, small_segments()).expect("open");
    fill(&outbox, 60, 100);
    outbox.close().expect("close");
    let files = segment_files(&dir);
    let sealed = &files[1];
    let at = single_at(2);
    flip_byte(sealed, at + FRAME_HEADER + 50);
    let every_frame = || small_segments().open_check(OpenCheck::EveryFrame);
    match Outbox::open(&dir, every_frame()) {
        Err(e @ Error::Corrupt { .. }) => {
            let Error::Corrupt {
                path, offset, kind, ..
            } = &e
            else {
                unreachable!()
            };
            assert_eq!((path, *offset), (sealed, at));
            assert!(matches!(kind, Corruption::ChecksumMismatch { .. }));
            let message = e.to_string();
            assert!(message.contains(&sealed.display().to_string()), "{message}");
            assert!(message.contains(&format!("offset {at}")), "{message}");
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
    // Even the last byte of a sealed segment is not a torn tail.
    flip_byte(sealed, at + FRAME_HEADER + 50);
    let end = len(sealed) - 1;
    flip_byte(sealed, end);
    for options in [every_frame(), small_segments()] {
        assert!(matches!(
            Outbox::open(&dir, options),
            Err(Error::Corrupt { .. })
        ));
    }
}

#[test]
fn through_the_seal_index_a_damaged_record_is_refused_when_claimed() {
    let (_t, dir) = tmp();
    let outbox = Outbox::open(&dir, small_segments()).expect("open");
    let seqs = fill(&outbox, 60, 100);
    outbox.close().expect("close");
    let files = segment_files(&dir);
    let sealed = &files[1];
    let first_of_second: u64 = sealed.file_name().and_then(|n| n.to_str()).expect("name")[..20]
        .parse()
        .expect("numeric");
    let damaged = Seq::from(first_of_second + 2);
    let at = single_at(2);
    flip_byte(sealed, at + FRAME_HEADER + 50);
    // The open reads the seal's index, not the record.
    let outbox = Outbox::open(&dir, small_segments()).expect("open through the index");
    let (delivered, refused) = crate::drain_past_corruption(&outbox, 7, 100);
    let [r] = refused.as_slice() else {
        panic!("one refusal expected: {refused:?}");
    };
    assert_eq!((&r.path, r.offset, r.seq), (sealed, at, Some(damaged)));
    assert!(matches!(r.kind, Corruption::ChecksumMismatch { .. }));
    let expected: Vec<Seq> = seqs.iter().copied().filter(|&s| s != damaged).collect();
    assert_eq!(delivered, expected, "every other record, in order");
    assert_eq!(outbox.stats().corrupt_records, 1);
    outbox.close().expect("close");
}

#[test]
fn a_missing_middle_segment_is_detected() {
    let (_t, dir) = tmp();
    let outbox = Outbox::open(&dir, small_segments()).expect("open");
    fill(&outbox, 120, 100);
    outbox.close().expect("close");
    let files = segment_files(&dir);
    let expected_first: u64 = files[2].file_name().and_then(|n| n.to_str()).expect("name")[..20]
        .parse()
        .expect("numeric");
    std::fs::remove_file(&files[2]).expect("lose a segment");
    match Outbox::open(&dir, small_segments()) {
        Err(Error::Corrupt {
            path,
            kind: Corruption::MissingSegment { expected_first: e },
            ..
        }) => {
            assert_eq!(path, files[3]);
            assert_eq!(e, Seq::from(expected_first));
        }
        other => panic!("expected a missing segment, got {other:?}"),
    }
}

#[test]
fn a_missing_oldest_segment_is_detected() {
    let (_t, dir) = tmp();
    let outbox = Outbox::open(&dir, small_segments()).expect("open");
    fill(&outbox, 60, 100);
    outbox.close().expect("close");
    let files = segment_files(&dir);
    std::fs::remove_file(&files[0]).expect("lose the oldest segment");
    assert!(matches!(
        Outbox::open(&dir, small_segments()),
        Err(Error::Corrupt {
            kind: Corruption::MissingSegment { .. },
            ..
        })
    ));
    // Nor does a lossy repair open past it: nothing it could drop explains
    // the gap.
    assert!(matches!(
        Outbox::open(&dir, small_segments().recovery(RecoveryMode::Lossy)),
        Err(Error::Corrupt {
            kind: Corruption::MissingSegment { .. },
            ..
        })
    ));
}

#[test]
fn a_foreign_file_named_like_a_segment_is_refused() {
    let (_t, dir) = tmp();
    Outbox::open(&dir, Options::default())
        .expect("open")
        .close()
        .expect("close");
    let foreign = dir.join("00000000000000000000.seg");
    std::fs::write(&foreign, "{\"not\": \"a segment\", \"padding\": \"................................................................\"}")
        .expect("write");
    match Outbox::open(&dir, Options::default()) {
        Err(Error::Corrupt {
            path,
            offset: 0,
            kind: Corruption::BadSegmentMagic,
            ..
        }) => assert_eq!(path, foreign),
        other => panic!("expected BadSegmentMagic, got {other:?}"),
    }
}

/// A newest segment file whose every byte is zero (a file system kept its
/// name and size, not its data) held nothing: removed, and the torn tail it
/// is reported as counts no byte (it counted the file's whole length).
#[test]
fn a_blank_newest_file_is_removed_and_counts_no_byte() {
    let (_t, dir, seqs) = one_segment(5);
    let blank = dir.join(format!("{:020}.seg", seqs[4].get() + 1));
    std::fs::write(&blank, vec![0u8; 1 << 20]).expect("write");
    let outbox = Outbox::open(&dir, Options::default()).expect("open");
    let report = outbox.recovery_report().clone();
    let torn = report.torn_tail.expect("reported as a torn tail");
    assert_eq!(
        (torn.path.as_path(), torn.offset, torn.bytes),
        (blank.as_path(), 0, 0)
    );
    assert_eq!(report.removed, vec![blank.clone()]);
    assert_eq!(recovered_seqs(&outbox), seqs);
    outbox.close().expect("close");
}

#[test]
fn a_segment_created_but_never_made_durable_is_removed() {
    let (_t, dir, seqs) = one_segment(3);
    // A crash during rotation, before the rename: the next segment's file
    // exists under its temporary name with half a header and zeros.
    let next = dir.join(format!("{:020}.seg.creating", seqs[2].get() + 1));
    let mut half = b"SEGWAL\x1a\n\x02\x00".to_vec();
    half.resize(4096, 0);
    std::fs::write(&next, &half).expect("write");
    let outbox = Outbox::open(&dir, Options::default()).expect("open");
    // Half a header is not proof that it holds nothing: set aside, not removed.
    let report = outbox.recovery_report();
    assert_eq!(report.quarantined.len(), 1, "{report:?}");
    assert_eq!(report.quarantined[0].from, next);
    assert_eq!(recovered_seqs(&outbox), seqs);
    outbox.close().expect("close");
    // Under its segment name, the same bytes are refused: a segment is renamed
    // only once its header is durable, so this is not an interrupted creation.
    let named = dir.join(format!("{:020}.seg", seqs[2].get() + 1));
    std::fs::write(&named, &half).expect("write");
    assert!(matches!(
        Outbox::open(&dir, Options::default()),
        Err(Error::Corrupt { path, .. }) if path == named
    ));
    assert_eq!(std::fs::read(&named).expect("kept"), half);
}

#[test]
fn lossy_recovery_drops_from_the_first_damage_and_says_exactly_what() {
    let (_t, dir) = tmp();
    let outbox = Outbox::open(&dir, small_segments()).expect("open");
    let seqs = fill(&outbox, 60, 100);
    outbox.close().expect("close");
    let files = segment_files(&dir);
    let at = single_at(3);
    flip_byte(&files[1], at + FRAME_HEADER + 1);
    let every_frame = || small_segments().open_check(OpenCheck::EveryFrame);
    assert!(Outbox::open(&dir, every_frame()).is_err(), "strict refuses");

    let lossy = every_frame().recovery(RecoveryMode::Lossy);
    let outbox = Outbox::open(&dir, lossy).expect("lossy opens");
    let dropped = outbox.recovery_report().dropped.clone().expect("dropped");
    assert_eq!(dropped.path, files[1]);
    assert_eq!(dropped.offset, at);
    let first_of_second: u64 = files[1].file_name().and_then(|n| n.to_str()).expect("name")[..20]
        .parse()
        .expect("numeric");
    let first = Seq::from(first_of_second + 3);
    assert_eq!(dropped.first, first);
    // At least every number appended after the damage (more may be counted:
    // recovery burns as many as frames could fit in the bytes it drops).
    let last = dropped.last.expect("frames followed the damage");
    assert!(last >= *seqs.last().expect("seqs"), "{last}");
    assert_eq!(dropped.segments_set_aside, files[2..].to_vec());
    let kept: Vec<Seq> = seqs.iter().copied().filter(|&s| s < first).collect();
    assert_eq!(recovered_seqs(&outbox), kept);
    let next = outbox.append(b"after").expect("append");
    assert!(next > last, "dropped numbers reused");
    outbox.close().expect("close");

    // The repaired log opens strictly again.
    let outbox = Outbox::open(&dir, small_segments()).expect("strict reopen");
    assert_eq!(drain_ack(&outbox).len(), kept.len() + 1);
}

#[test]
fn recovery_is_idempotent() {
    let (_t, dir, seqs) = one_segment(10);
    let seg = last_segment(&dir);
    extend(&seg, &[0xAB; 100]);
    let outbox = Outbox::open(&dir, Options::default()).expect("open");
    assert!(outbox.recovery_report().torn_tail.is_some());
    outbox.close().expect("close");
    for _ in 0..2 {
        let outbox = Outbox::open(&dir, Options::default()).expect("open");
        let report = outbox.recovery_report().clone();
        assert!(report.torn_tail.is_none() && report.dropped.is_none());
        assert_eq!(recovered_seqs(&outbox), seqs);
        outbox.close().expect("close");
    }
}

#[test]
fn reopening_without_appends_reuses_the_empty_segment() {
    let (_t, dir, seqs) = one_segment(5);
    for _ in 0..3 {
        let outbox = Outbox::open(&dir, Options::default()).expect("open");
        assert!(outbox.recovery_report().removed.is_empty());
        outbox.close().expect("close");
    }
    // The records' segment, sealed, and one empty active segment: no churn.
    assert_eq!(segment_files(&dir).len(), 2);
    let outbox = Outbox::open(&dir, Options::default()).expect("open");
    assert_eq!(recovered_seqs(&outbox), seqs);
}

#[test]
fn a_crash_between_creating_a_segment_and_sealing_the_one_before_recovers() {
    let (_t, dir, seqs) = one_segment(5);
    // Reopen once so that the writer creates the next segment and seals this one,
    // then cut the seal frame off: the state a crash leaves between the two steps.
    Outbox::open(&dir, Options::default())
        .expect("open")
        .close()
        .expect("close");
    let files = segment_files(&dir);
    assert_eq!(files.len(), 2);
    let sealed_len = len(&files[0]);
    let f = OpenOptions::new()
        .write(true)
        .open(&files[0])
        .expect("open");
    f.set_len(sealed_len - FRAME_HEADER).expect("cut the seal");
    drop(f);
    let outbox = Outbox::open(&dir, Options::default()).expect("recovers");
    assert_eq!(recovered_seqs(&outbox), seqs);
    assert_eq!(len(&files[0]), sealed_len, "sealed again");
    let next = outbox.append(b"next").expect("append");
    assert!(next > seqs[4]);
}

#[test]
fn a_lost_newest_segment_is_detected() {
    let (_t, dir) = tmp();
    let outbox = Outbox::open(&dir, small_segments()).expect("open");
    fill(&outbox, 120, 100);
    outbox.close().expect("close");
    let mut files = segment_files(&dir);
    let newest = files.pop().expect("segments");
    std::fs::remove_file(&newest).expect("lose the newest segment");
    match Outbox::open(&dir, small_segments()) {
        Err(Error::Corrupt {
            path,
            kind: Corruption::MissingSegment { .. },
            ..
        }) => assert_eq!(&path, files.last().expect("segments")),
        other => panic!("expected a missing segment, got {other:?}"),
    }
}

#[test]
fn a_file_named_like_a_segment_with_a_bad_name_is_refused() {
    let (_t, dir) = tmp();
    Outbox::open(&dir, Options::default())
        .expect("open")
        .close()
        .expect("close");
    let odd = dir.join("backup.seg");
    std::fs::write(&odd, b"x").expect("write");
    match Outbox::open(&dir, Options::default()) {
        Err(Error::Corrupt {
            path,
            kind: Corruption::BadSegmentName,
            ..
        }) => assert_eq!(path, odd),
        other => panic!("expected BadSegmentName, got {other:?}"),
    }
    // Files with other names are left alone.
    std::fs::remove_file(&odd).expect("remove");
    std::fs::write(dir.join("README.txt"), b"notes").expect("write");
    Outbox::open(&dir, Options::default()).expect("open with a note beside");
}

/// A seal frame as a producer could forge it inside a record's payload: kind 3,
/// `seq`, and an index of one frame at 4096 of `frame_len` bytes naming
/// `nonce`, checksummed as segment `first_seq` under `nonce` would be
/// (docs/FORMAT.md, "Frames", "The seal index").
fn forged_seal(first_seq: u64, seq: u64, nonce: u64, frame_len: u32) -> Vec<u8> {
    let mut payload = Vec::new();
    payload.extend_from_slice(&1u32.to_le_bytes()); // frames
    payload.extend_from_slice(&0u32.to_le_bytes()); // internal frames
    payload.extend_from_slice(&0u64.to_le_bytes()); // log start
    payload.extend_from_slice(&nonce.to_le_bytes());
    payload.extend_from_slice(&4096u32.to_le_bytes()); // the one frame's offset
    payload.extend_from_slice(&frame_len.to_le_bytes()); // and length
    let seal_len = FRAME_HEADER as usize + payload.len() + 4;
    payload.extend_from_slice(&(seal_len as u32).to_le_bytes()); // trailer
    let mut frame = vec![0xC5, b'W', b'F', b'R', 0, 0, 0, 0, 0, 0, 0, 0];
    frame.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    frame.extend_from_slice(&[3, 1, 0, 0]); // seal, batch end, no ext
    frame.extend_from_slice(&0u32.to_le_bytes()); // reserved
    frame.extend_from_slice(&seq.to_le_bytes());
    frame.extend_from_slice(&seq.to_le_bytes()); // group
    frame.extend_from_slice(&0u64.to_le_bytes()); // timestamp
    let mut salt = crc32fast::Hasher::new();
    salt.update(&nonce.to_le_bytes());
    salt.update(&first_seq.to_le_bytes());
    let salt = salt.finalize();
    let mut header_crc = crc32fast::Hasher::new_with_initial(salt);
    header_crc.update(&frame[12..48]);
    frame[8..12].copy_from_slice(&header_crc.finalize().to_le_bytes());
    frame.extend_from_slice(&payload);
    let mut crc = crc32fast::Hasher::new_with_initial(salt);
    crc.update(&frame[8..]);
    frame[4..8].copy_from_slice(&crc.finalize().to_le_bytes());
    frame
}

/// Writes an empty segment `first` after `prev` next to `like`, with `like`'s
/// header otherwise (docs/FORMAT.md, "Segment header").
fn empty_segment_after(like: &Path, first: u64, prev: u64) -> PathBuf {
    let mut header = std::fs::read(like).expect("read")[..BLOCK as usize].to_vec();
    header[16..24].copy_from_slice(&first.to_le_bytes());
    header[24..32].copy_from_slice(&prev.to_le_bytes());
    header[48..56].copy_from_slice(&0x5eed_u64.to_le_bytes());
    let crc = crc32fast::hash(&header[..124]);
    header[124..128].copy_from_slice(&crc.to_le_bytes());
    let path = like.with_file_name(format!("{first:020}.seg"));
    std::fs::write(&path, &header).expect("write");
    path
}

#[test]
fn a_seal_forged_inside_a_payload_is_never_trusted() {
    // A producer appends, as its last record before a close, bytes that form a
    // seal of this segment, sized so that the record ends on a block boundary.
    // Closed, the file ends with them.
    for nonce_known in [false, true] {
        let (_t, dir) = tmp();
        let outbox = Outbox::open(&dir, Options::default()).expect("open");
        let mut seqs = fill(&outbox, 5, 100);
        let seg = last_segment(&dir);
        let first = seqs[0].get();
        let forged_seq = seqs[4].get() + 1;
        // The header's nonce, as a producer that could read the files would
        // know it; one that cannot guesses.
        let nonce = if nonce_known {
            let bytes = std::fs::read(&seg).expect("read");
            u64::from_le_bytes(bytes[48..56].try_into().expect("8 bytes"))
        } else {
            0x1234
        };
        let record_at = single_at(5);
        let mut seal = forged_seal(first, forged_seq + 1, nonce, 0);
        let seal_at = record_at + BLOCK - seal.len() as u64;
        seal = forged_seal(first, forged_seq + 1, nonce, (seal_at - BLOCK) as u32);
        let mut payload = vec![0x5a; (BLOCK - FRAME_HEADER) as usize - seal.len()];
        payload.extend_from_slice(&seal);
        seqs.push(outbox.append(&payload).expect("append"));
        assert_eq!(seqs[5].get(), forged_seq);
        outbox.close().expect("close");
        let bytes = std::fs::read(&seg).expect("read");
        assert!(bytes.ends_with(&seal), "the file ends with the forged seal");
        assert_eq!(bytes.len() as u64, record_at + BLOCK);
        if !nonce_known {
            // As after a crash between recovery's cut and its seal: the file is
            // no longer the newest, and the next one names the forged seal.
            empty_segment_after(&seg, forged_seq + 2, forged_seq + 1);
        }
        let outbox = Outbox::open(&dir, Options::default()).expect("open");
        let records = drain(&outbox);
        assert_eq!(
            records.iter().map(|r| r.seq()).collect::<Vec<_>>(),
            seqs,
            "every record, the forged one as a record (nonce known: {nonce_known})"
        );
        assert_eq!(records[5].payload(), &payload[..]);
        outbox.close().expect("close");
    }
}

/// A file named like a segment but longer than any segment can be (offsets are
/// 32-bit) is refused by its length, before recovery asks for a buffer of it.
#[test]
fn a_file_longer_than_any_segment_is_refused_by_its_length() {
    let (_t, dir, _seqs) = one_segment(3);
    let huge = dir.join(format!("{:020}.seg", 1_000_000));
    let file = std::fs::File::create(&huge).expect("create");
    file.set_len(5 << 30).expect("a sparse 5 GiB file");
    drop(file);
    match Outbox::open(&dir, Options::default()) {
        Err(Error::Corrupt {
            path,
            kind: Corruption::LengthOutOfRange { len, .. },
            ..
        }) => {
            assert_eq!(path, huge);
            assert_eq!(len, 5 << 30);
        }
        other => panic!("expected LengthOutOfRange, got {other:?}"),
    }
    assert_eq!(len(&huge), 5 << 30, "a refused open changed the file");
}

/// The newest segment is scanned on a thread of its own beside the older
/// ones; the error an open reports is still the first in log order, and the
/// outcome of a clean open the same as ever.
#[test]
fn with_the_newest_segment_scanned_beside_the_others_the_first_error_in_log_order_wins() {
    let (_t, dir) = tmp();
    let outbox = Outbox::open(&dir, small_segments()).expect("open");
    let seqs = fill(&outbox, 60, 100);
    outbox.close().expect("close");
    let reopened = Outbox::open(&dir, small_segments()).expect("a clean reopen");
    assert_eq!(recovered_seqs(&reopened), seqs);
    reopened.close().expect("close");
    let files = segment_files(&dir);
    assert!(files.len() >= 4, "{files:?}");
    let (older, newest) = (&files[1], files.last().expect("a segment"));
    for file in [older, newest] {
        let f = OpenOptions::new().write(true).open(file).expect("open");
        f.set_len(5 << 30).expect("a sparse 5 GiB file");
    }
    match Outbox::open(&dir, small_segments()) {
        Err(Error::Corrupt {
            path,
            kind: Corruption::LengthOutOfRange { .. },
            ..
        }) => assert_eq!(&path, older),
        other => panic!("expected LengthOutOfRange naming {older:?}, got {other:?}"),
    }
}

/// Once the newest segment is read, its thread takes older segments from the
/// back while the opening thread takes them from the front. Wherever each
/// damaged segment was read, the open names the first in log order: a file
/// too long to be a segment (an error of the scan itself), and a damaged seal
/// (damage the scan reports and the plan judges); with the damage mended,
/// every record comes back in order.
#[test]
fn older_segments_read_from_both_ends_still_name_the_first_damage_in_log_order() {
    let (_t, dir) = tmp();
    let outbox = Outbox::open(&dir, small_segments()).expect("open");
    let seqs = fill(&outbox, 700, 100);
    outbox.close().expect("close");
    let files = segment_files(&dir);
    assert!(files.len() > 40, "{} segments", files.len());
    // The last older segments are the second thread's first.
    let (early, late) = (&files[2], &files[files.len() - 2]);
    let (early_len, late_len) = (len(early), len(late));
    let set_len = |path: &PathBuf, to: u64| {
        let f = OpenOptions::new().write(true).open(path).expect("open");
        f.set_len(to).expect("set_len");
    };
    let names = |want: &PathBuf| match Outbox::open(&dir, small_segments()) {
        Err(Error::Corrupt { path, .. }) => assert_eq!(&path, want),
        other => panic!("expected Corrupt naming {want:?}, got {other:?}"),
    };
    set_len(late, 5 << 30);
    names(late);
    set_len(early, 5 << 30);
    for _ in 0..5 {
        names(early);
    }
    set_len(early, early_len);
    set_len(late, late_len);
    flip_byte(late, late_len - 1);
    names(late);
    flip_byte(early, early_len - 1);
    for _ in 0..5 {
        names(early);
    }
    flip_byte(early, early_len - 1);
    flip_byte(late, late_len - 1);
    let reopened = Outbox::open(&dir, small_segments()).expect("a clean reopen");
    assert_eq!(recovered_seqs(&reopened), seqs);
    reopened.close().expect("close");
}

/// An open asks the file system for the headers, trailers and seal indexes
/// of up to 16 older segments at once before it reads them; across more
/// segments than that, every record is still read back in order, and damage
/// in a segment of a later group of 16 is still `Corrupt` naming that file.
#[test]
fn an_open_of_many_sealed_segments_reads_every_index_and_names_the_damaged_one() {
    let (_t, dir) = tmp();
    let outbox = Outbox::open(&dir, small_segments()).expect("open");
    let seqs = fill(&outbox, 700, 100);
    outbox.close().expect("close");
    let files = segment_files(&dir);
    assert!(files.len() > 2 * 16 + 1, "{} segments", files.len());
    let reopened = Outbox::open(&dir, small_segments()).expect("a clean reopen");
    assert_eq!(recovered_seqs(&reopened), seqs);
    reopened.close().expect("close");
    // A seal index damaged in the second group of 16.
    let damaged = &files[20];
    let end = len(damaged) - 1;
    flip_byte(damaged, end);
    match Outbox::open(&dir, small_segments()) {
        Err(Error::Corrupt { path, .. }) => assert_eq!(&path, damaged),
        other => panic!("expected Corrupt naming {damaged:?}, got {other:?}"),
    }
    flip_byte(damaged, end);
    // A segment cut shorter than its trailer in the third group.
    let cut = &files[33];
    OpenOptions::new()
        .write(true)
        .open(cut)
        .expect("open")
        .set_len(2)
        .expect("cut");
    match Outbox::open(&dir, small_segments()) {
        Err(Error::Corrupt { path, .. }) => assert_eq!(&path, cut),
        other => panic!("expected Corrupt naming {cut:?}, got {other:?}"),
    }
}

/// Sets frame flag `0x02` (none this build knows) on the frame at `at` of
/// the segment file `path`, with both checksums made again as a newer
/// build would (docs/FORMAT.md, "Frames"): a frame this build does not read.
fn mark_with_a_newer_flag(path: &Path, at: usize) {
    let mut bytes = std::fs::read(path).expect("read");
    let first_seq = u64::from_le_bytes(bytes[16..24].try_into().expect("8 bytes"));
    let nonce = u64::from_le_bytes(bytes[48..56].try_into().expect("8 bytes"));
    let payload = u32::from_le_bytes(bytes[at + 12..at + 16].try_into().expect("4 bytes"));
    let ext = u16::from_le_bytes(bytes[at + 18..at + 20].try_into().expect("2 bytes"));
    let end = at + 48 + usize::from(ext) + payload as usize;
    bytes[at + 17] |= 0x02;
    let mut salt = crc32fast::Hasher::new();
    salt.update(&nonce.to_le_bytes());
    salt.update(&first_seq.to_le_bytes());
    let salt = salt.finalize();
    let mut header_crc = crc32fast::Hasher::new_with_initial(salt);
    header_crc.update(&bytes[at + 12..at + 48]);
    bytes[at + 8..at + 12].copy_from_slice(&header_crc.finalize().to_le_bytes());
    let mut crc = crc32fast::Hasher::new_with_initial(salt);
    crc.update(&bytes[at + 8..end]);
    bytes[at + 4..at + 8].copy_from_slice(&crc.finalize().to_le_bytes());
    std::fs::write(path, &bytes).expect("write");
}

/// Forty records of 200 bytes in small segments, closed, the first (in the
/// oldest, sealed segment, at offset 4096) made a newer build's: the
/// directory and that segment file.
fn a_newer_builds_first_record() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let (t, dir) = tmp();
    let outbox = Outbox::open(&dir, small_segments()).expect("open");
    for i in 0..40u8 {
        outbox.append(&[i; 200]).expect("append");
    }
    outbox.close().expect("close");
    let oldest = segment_files(&dir).remove(0);
    mark_with_a_newer_flag(&oldest, 4096);
    (t, dir, oldest)
}

/// A record of a sealed segment that a newer build wrote (a frame flag
/// this build does not know, its checksums holding), which the default
/// open does not read: its claim fails naming it, and it is held back, not
/// set aside as a corrupt record is, so its segment stays and the build
/// that wrote it still delivers it. (It was set aside, and its segment
/// deleted or recycled once the rest was acknowledged, until 2026-12-07.)
#[test]
fn a_newer_builds_record_in_a_sealed_segment_is_held_back_never_set_aside() {
    let (_t, dir, oldest) = a_newer_builds_first_record();
    let options = small_segments().lease(std::time::Duration::from_secs(3600));
    let outbox = Outbox::open(&dir, options.clone()).expect("the default open reads seals only");
    match outbox.claim(1) {
        Err(Error::Corrupt { kind, seq, .. }) => {
            assert!(kind.is_unknown_format(), "{kind}");
            assert_eq!(seq, Some(Seq::from(1)));
        }
        other => panic!("expected the newer record's error, got {other:?}"),
    }
    assert_eq!(outbox.stats().corrupt_records, 0);
    // Held back, never handed out: nothing settles it (an acknowledgement
    // of the seq its error named lost it, and `ack_through` past it, until
    // 2026-12-07).
    assert!(matches!(
        outbox.ack(Seq::from(1)),
        Err(Error::NotClaimed { .. })
    ));
    assert!(matches!(
        outbox.dead_letter(Seq::from(1), "unreadable"),
        Err(Error::NotClaimed { .. })
    ));
    let rest = drain(&outbox);
    assert_eq!(rest.len(), 39);
    let last = rest.last().expect("records").seq();
    assert_eq!(outbox.ack_through(last).expect("ack_through"), 39);
    outbox.sync().expect("sync");
    assert!(oldest.exists(), "the segment of a record held back stays");
    outbox.close().expect("close");
    let outbox = Outbox::open(&dir, options).expect("reopen");
    assert_eq!(outbox.stats().pending, 1);
    match outbox.claim(1) {
        Err(Error::Corrupt { kind, .. }) => assert!(kind.is_unknown_format(), "{kind}"),
        other => panic!("the record is still there, unread: {other:?}"),
    }
    outbox.close().expect("close");
}

/// Under `max_attempts`, a record a newer build wrote is claimed again at
/// each lease's end and fails each time, but its deliveries do not count:
/// it never becomes a dead letter this build could neither show nor
/// deliver (it did after `max_attempts` leases until 2026-12-07).
#[test]
fn a_newer_builds_record_never_becomes_a_dead_letter_under_max_attempts() {
    let (_t, dir, _) = a_newer_builds_first_record();
    let options = small_segments()
        .max_attempts(2)
        .lease(std::time::Duration::from_millis(100));
    let outbox = Outbox::open(&dir, options.clone()).expect("open");
    let mut failed = 0;
    while failed < 4 {
        match outbox.claim_wait(1, std::time::Duration::from_secs(10)) {
            Err(Error::Corrupt { kind, seq, .. }) => {
                assert!(kind.is_unknown_format(), "{kind}");
                assert_eq!(seq, Some(Seq::from(1)));
                failed += 1;
            }
            // Ten seconds with nothing to claim: the record left (parked as a
            // dead letter, before).
            Ok(records) if records.is_empty() => break,
            Ok(records) => {
                let seqs: Vec<Seq> = records.iter().map(|r| r.seq()).collect();
                assert!(!seqs.contains(&Seq::from(1)));
                outbox.ack_many(&seqs).expect("ack");
            }
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(failed, 4, "{:?}", outbox.stats());
    assert_eq!(
        outbox.stats().dead_letters,
        0,
        "four leases, max_attempts 2"
    );
    // Its lease over, it is pending, and never delivered: no late
    // acknowledgement settles it (one did, and lost it, until 2026-12-07).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while outbox.stats().pending == 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert!(matches!(
        outbox.ack(Seq::from(1)),
        Err(Error::NotClaimed { .. })
    ));
    outbox.close().expect("close");
    let outbox = Outbox::open(&dir, options).expect("reopen");
    assert_eq!(outbox.stats().dead_letters, 0);
    assert_eq!(outbox.stats().pending, 1);
    outbox.close().expect("close");
}
