//! Index checkpoints (docs/FORMAT.md, "Index checkpoints"): an open after a
//! crash takes the newest segment's frames before its last checkpoint from
//! the checkpoints' lists, as it takes a sealed segment's from its seal index,
//! and reads and checks the frames after it; damage after the last checkpoint,
//! or in a checkpoint, is still found and named.
//!
//! The crash images are copies of the segment files of an outbox that is
//! still open: every append had returned, so its frames were durable, and the
//! newest segment has no seal.

use std::path::{Path, PathBuf};

use segwal::{Corruption, Error, OpenCheck, Options, Outbox, Seq};

use crate::{flip_byte, segment_files, tmp};

const BLOCK: u64 = 4096;
const FRAME_HEADER: u64 = 48;
const FRAME_MAGIC: [u8; 4] = [0xC5, b'W', b'F', b'R'];
const RECORD: u8 = 1;
const CHECKPOINT: u8 = 0x86;

/// 4 MiB segments: a checkpoint every 256 KiB by default.
fn options() -> Options {
    Options::default().segment_bytes(4 << 20)
}

/// One frame of a segment file.
#[derive(Clone, Copy, Debug)]
struct Frame {
    offset: u64,
    kind: u8,
    seq: u64,
}

/// The frames of a whole segment file, found as recovery walks them: each
/// after the one before, or on the next block boundary.
fn frames_of(path: &Path) -> Vec<Frame> {
    let bytes = std::fs::read(path).expect("read segment");
    let magic_at = |at: usize| bytes.get(at..at + 4) == Some(&FRAME_MAGIC[..]);
    let u32_at = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"));
    let mut out = Vec::new();
    let mut at = BLOCK as usize;
    loop {
        if !magic_at(at) {
            let next = at.next_multiple_of(BLOCK as usize);
            if next == at || !magic_at(next) {
                return out;
            }
            at = next;
        }
        let payload_len = u32_at(at + 12) as usize;
        let ext_len = u16::from_le_bytes([bytes[at + 18], bytes[at + 19]]) as usize;
        out.push(Frame {
            offset: at as u64,
            kind: bytes[at + 16],
            seq: u64::from_le_bytes(bytes[at + 24..at + 32].try_into().expect("8 bytes")),
        });
        at += FRAME_HEADER as usize + ext_len + payload_len;
    }
}

/// An outbox with 700 records of 1,000 bytes appended one at a time (one
/// block each, so the newest segment holds about 2.8 MB), left open: the
/// running outbox, its directory, and the records' seqs.
fn running() -> (tempfile::TempDir, Outbox, Vec<Seq>) {
    let (t, dir) = tmp();
    let outbox = Outbox::open(&dir, options()).expect("open");
    let seqs = (0..700u32)
        .map(|i| outbox.append(&[i as u8; 1000]).expect("append"))
        .collect();
    (t, outbox, seqs)
}

/// A copy of the segment files of the outbox in `t`, as a crash would
/// leave them; returns the copy's directory and its newest segment.
fn crash_image(t: &tempfile::TempDir, name: &str) -> (PathBuf, PathBuf) {
    let image = t.path().join(name);
    std::fs::create_dir(&image).expect("image directory");
    for file in segment_files(&t.path().join("outbox")) {
        let to = image.join(file.file_name().expect("name"));
        std::fs::copy(&file, to).expect("copy segment");
    }
    let newest = segment_files(&image).pop().expect("a segment");
    (image, newest)
}

#[test]
fn a_crash_open_takes_the_frames_before_the_last_checkpoint_from_the_checkpoints() {
    let (t, outbox, seqs) = running();
    let (image, newest) = crash_image(&t, "image");
    outbox.close().expect("close");
    let frames = frames_of(&newest);
    let checkpoints: Vec<Frame> = frames
        .iter()
        .copied()
        .filter(|f| f.kind == CHECKPOINT)
        .collect();
    // The first sync group at or past every 256 KiB starts with one.
    assert!(checkpoints.len() >= 8, "{checkpoints:?}");
    for (k, cp) in checkpoints.iter().enumerate() {
        assert_eq!(cp.offset % BLOCK, 0, "a checkpoint starts a block");
        let mark = (k as u64 + 1) * (256 << 10);
        assert!(cp.offset >= mark && cp.offset < mark + 2 * BLOCK, "{cp:?}");
    }
    // Bit rot in a record the last checkpoint lists: the open does not read
    // it (with every frame read, the open refuses the segment).
    let last = checkpoints.last().expect("a checkpoint");
    let listed = frames
        .iter()
        .rev()
        .find(|f| f.kind == RECORD && f.offset < last.offset)
        .copied()
        .expect("a record before it");
    flip_byte(&newest, listed.offset + FRAME_HEADER + 10);
    match Outbox::open(&image, options().open_check(OpenCheck::EveryFrame)) {
        Err(Error::Corrupt { path, offset, .. }) => {
            assert_eq!((path, offset), (newest.clone(), listed.offset));
        }
        other => panic!("every frame read: expected Corrupt, got {:?}", other.err()),
    }
    let reopened = Outbox::open(&image, options()).expect("open through the checkpoints");
    let taken = reopened.recovery_report().frames_from_checkpoints;
    let before_last = frames.iter().filter(|f| f.offset <= last.offset).count() as u64;
    assert_eq!(taken, before_last, "every frame up to the last checkpoint");
    let damaged = Seq::from(listed.seq);
    let (delivered, refused) = crate::drain_past_corruption(&reopened, 100, 1000);
    let [r] = refused.as_slice() else {
        panic!("one refusal expected: {refused:?}");
    };
    assert_eq!(
        (&r.path, r.offset, r.seq),
        (&newest, listed.offset, Some(damaged))
    );
    assert!(
        matches!(r.kind, Corruption::ChecksumMismatch { .. }),
        "{:?}",
        r.kind
    );
    let expected: Vec<Seq> = seqs.iter().copied().filter(|&s| s != damaged).collect();
    assert_eq!(delivered, expected, "every other record, in order");
    reopened.close().expect("close");
}

#[test]
fn damage_after_the_last_checkpoint_or_in_a_checkpoint_is_still_named() {
    let (t, outbox, seqs) = running();
    let (after, after_newest) = crash_image(&t, "after");
    let (inside, inside_newest) = crash_image(&t, "inside");
    let (clean, _) = crash_image(&t, "clean");
    outbox.close().expect("close");
    let frames = frames_of(&after_newest);
    let checkpoints: Vec<Frame> = frames
        .iter()
        .copied()
        .filter(|f| f.kind == CHECKPOINT)
        .collect();
    let last = checkpoints.last().expect("a checkpoint");
    // A record after the last checkpoint, with more written after it.
    let walked: Vec<Frame> = frames
        .iter()
        .copied()
        .filter(|f| f.kind == RECORD && f.offset > last.offset)
        .collect();
    assert!(walked.len() > 4, "{walked:?}");
    let rotten = walked[walked.len() / 2];
    flip_byte(&after_newest, rotten.offset + FRAME_HEADER + 10);
    match Outbox::open(&after, options()) {
        Err(Error::Corrupt { path, offset, .. }) => {
            assert_eq!((path, offset), (after_newest, rotten.offset));
        }
        other => panic!("expected Corrupt, got {:?}", other.err()),
    }
    // A checkpoint in the middle of the chain: the checkpoints after it no
    // longer fit, so the segment is read frame by frame, which finds it.
    let middle = checkpoints[checkpoints.len() / 2];
    flip_byte(&inside_newest, middle.offset + FRAME_HEADER + 20);
    match Outbox::open(&inside, options()) {
        Err(Error::Corrupt { path, offset, .. }) => {
            assert_eq!((path, offset), (inside_newest, middle.offset));
        }
        other => panic!("expected Corrupt, got {:?}", other.err()),
    }
    // Undamaged, the image recovers every record through its checkpoints;
    // the open seals the segment, so the next one reads its seal index.
    for taken in [true, false] {
        let reopened = Outbox::open(&clean, options()).expect("open");
        let report = reopened.recovery_report();
        assert_eq!(report.frames_from_checkpoints > 0, taken);
        assert!(report.torn_tail.is_none());
        let got: Vec<Seq> = crate::drain(&reopened).iter().map(|r| r.seq()).collect();
        assert_eq!(got, seqs);
        reopened.close().expect("close");
    }
}

#[test]
fn a_torn_last_batch_is_cut_and_the_frames_before_the_last_checkpoint_are_not_read_again() {
    let (t, outbox, seqs) = running();
    let (image, newest) = crash_image(&t, "torn");
    outbox.close().expect("close");
    let frames = frames_of(&newest);
    let last_record = frames
        .iter()
        .rev()
        .find(|f| f.kind == RECORD)
        .copied()
        .expect("a record");
    // The last batch (one record) torn: its payload half written.
    flip_byte(&newest, last_record.offset + FRAME_HEADER + 500);
    let reopened = Outbox::open(&image, options()).expect("a torn tail, not corruption");
    let report = reopened.recovery_report();
    let torn = report.torn_tail.as_ref().expect("the torn batch cut");
    assert_eq!((&torn.path, torn.offset), (&newest, last_record.offset));
    // Read from the last checkpoint on, the frames before it from the lists.
    assert!(report.frames_from_checkpoints > 0);
    let got: Vec<Seq> = crate::drain(&reopened).iter().map(|r| r.seq()).collect();
    assert_eq!(got, seqs[..seqs.len() - 1].to_vec());
    reopened.close().expect("close");
}
