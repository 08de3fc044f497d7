//! The crash cases of docs/FORMAT.md ("Crash cases, one by one"), one test
//! each and named after it: segment files built byte by byte in memory, damaged
//! as the case says, scanned and planned without a disk.

use std::collections::BTreeMap;
use std::path::PathBuf;

use super::*;
use crate::format::frame::{self, FrameHeader, FrameKind, FrameSpan};
use crate::format::seal::IndexBuilder;
use crate::format::segment::{FRAMES_AT, SegmentHeader, align_up};
use crate::format::seq::SegmentId;
use crate::log::recovery::scan::{self, SegmentScan};
use crate::options::OpenCheck;

const NONCE: u64 = 0x5eed;
const OUTBOX: u128 = 0x0b0;

/// A segment file being built: header, then frames in write batches.
struct Seg {
    id: SegmentId,
    /// The header's nonce, keying its frames' checksums.
    nonce: u64,
    bytes: Vec<u8>,
    next: u64,
    index: IndexBuilder,
    /// Offset of every frame, by sequence number.
    at: BTreeMap<u64, usize>,
}

impl Seg {
    /// A segment whose first frame is `first`, after a segment ending at `prev`.
    fn new(first: u64, prev: u64, log_start: u64) -> Seg {
        Seg::keyed(first, prev, log_start, NONCE)
    }

    /// [`Seg::new`] with the nonce `nonce` (0: checksums any producer can
    /// compute, the negative control of `a_payload_cannot_forge_a_frame`).
    fn keyed(first: u64, prev: u64, log_start: u64, nonce: u64) -> Seg {
        let header = SegmentHeader {
            first_seq: Seq::from(first),
            prev_seq: Seq::from(prev),
            log_start: Seq::from(log_start),
            created_unix_ms: 0,
            nonce,
            outbox_id: OUTBOX,
            checkpoint_every: 0,
        };
        Seg {
            id: SegmentId(first),
            nonce,
            bytes: header.encode_block(),
            next: first,
            index: IndexBuilder::default(),
            at: BTreeMap::new(),
        }
    }

    fn frame(&mut self, kind: FrameKind, payload: &[u8], group: u64, batch_end: bool) -> u64 {
        let seq = self.next;
        let offset = self.bytes.len();
        frame::encode(
            &mut self.bytes,
            &FrameHeader {
                kind,
                batch_end,
                seq: Seq::from(seq),
                group: Seq::from(group),
                timestamp_us: 1,
            },
            payload,
            frame::salt(self.id, self.nonce),
        );
        self.index.push(FrameSpan::new(
            offset as u32,
            (self.bytes.len() - offset) as u32,
            kind == FrameKind::Record,
        ));
        self.at.insert(seq, offset);
        self.next += 1;
        seq
    }

    /// Zeros to the next block boundary: a new sync group starts there.
    fn align(mut self) -> Seg {
        let len = self
            .bytes
            .len()
            .next_multiple_of(crate::format::segment::BLOCK);
        self.bytes.resize(len, 0);
        self
    }

    /// A write batch of `n` records of 20 bytes, a sync group of its own on a
    /// fresh block.
    fn batch(self, n: usize) -> Seg {
        let mut seg = self.align();
        let group = seg.next;
        for k in 0..n {
            seg.frame(FrameKind::Record, &[7; 20], group, k + 1 == n);
        }
        seg
    }

    /// A write batch continuing the sync group of the one before it
    /// (`Durability::Buffered`): right after it, in the same block.
    fn continue_group(mut self, n: usize) -> Seg {
        let group = self.last_group();
        for k in 0..n {
            self.frame(FrameKind::Record, &[7; 20], group, k + 1 == n);
        }
        self
    }

    /// The sync group of the last frame written.
    fn last_group(&self) -> u64 {
        let at = self.at.values().last().copied().unwrap_or(0);
        frame::decode(&self.bytes[at..], frame::salt(self.id, self.nonce))
            .map_or(self.next, |f| f.header.group.get())
    }

    /// A write batch whose last frame lacks the batch-end flag: the file ends
    /// inside it.
    fn open_batch(self, n: usize) -> Seg {
        let mut seg = self.align();
        let group = seg.next;
        for _ in 0..n {
            seg.frame(FrameKind::Record, &[7; 20], group, false);
        }
        seg
    }

    /// A `LogStart` frame recording `value`, as the writer writes it.
    fn log_start(self, value: u64) -> Seg {
        let mut seg = self.align();
        let group = seg.next;
        seg.frame(FrameKind::LogStart, &value.to_le_bytes(), group, true);
        seg.index.log_start(Seq::from(value));
        seg
    }

    /// A seal frame numbered `seq`, carrying the segment's index.
    fn seal_as(self, seq: u64) -> Seg {
        let mut seg = self.align();
        let index = seg.index.encode(seg.nonce);
        seg.next = seq;
        seg.frame(FrameKind::Seal, index.bytes(), seq, true);
        seg
    }

    fn seal(self) -> Seg {
        let seq = self.next;
        self.seal_as(seq)
    }

    /// Where frame `seq` starts.
    fn offset_of(&self, seq: u64) -> usize {
        self.at[&seq]
    }

    fn zeros(mut self, n: usize) -> Seg {
        self.bytes.resize(self.bytes.len() + n, 0);
        self
    }

    fn garbage(mut self, n: usize) -> Seg {
        self.bytes.extend((0..n).map(|k| (k * 131 % 251) as u8 | 1));
        self
    }

    fn flip(mut self, offset: usize, bit: u8) -> Seg {
        self.bytes[offset] ^= 1 << bit;
        self
    }

    /// Overwrites `n` bytes from `offset` with garbage.
    fn garble(mut self, offset: usize, n: usize) -> Seg {
        for (k, b) in self.bytes[offset..offset + n].iter_mut().enumerate() {
            *b = (k * 97 % 253) as u8 | 0x40;
        }
        self
    }

    fn cut(mut self, len: usize) -> Seg {
        self.bytes.truncate(len);
        self
    }

    fn file(self) -> (SegmentId, Vec<u8>) {
        (self.id, self.bytes)
    }
}

/// The record frame's payload offset within a frame: past its header.
const PAYLOAD: usize = frame::FRAME_HEADER_LEN;
/// Offset of the length field within a frame header (magic, then the two
/// checksums).
const LEN_FIELD: usize = 12;

/// Scans `files` as recovery does: the newest whole, the others through their
/// seal index where it checks.
fn scans(files: &[(SegmentId, Vec<u8>)]) -> Vec<SegmentScan> {
    files
        .iter()
        .enumerate()
        .map(|(k, (id, bytes))| {
            let check = if k + 1 == files.len() {
                OpenCheck::EveryFrame
            } else {
                OpenCheck::SealIndex
            };
            // The window's walk, where it finds the file whole, agrees.
            for chunk in [64, 4096, 5000] {
                scan::check_window_matches_whole(*id, bytes, chunk);
            }
            let len = bytes.len() as u64;
            let path = PathBuf::from(id.file_name());
            scan::scan(*id, path, bytes, check, &|at| Ok(Some(at..len)))
        })
        .collect()
}

fn decide(files: &[(SegmentId, Vec<u8>)]) -> Result<Plan> {
    plan(&scans(files), RecoveryMode::Strict)
}

fn kept(plan: &Plan) -> Vec<(usize, usize, Option<u64>)> {
    plan.keep
        .iter()
        .map(|k| (k.scan, k.frames, k.cut))
        .collect()
}

fn corruption(result: Result<Plan>) -> Corruption {
    match result {
        Err(Error::Corrupt { kind, .. }) => kind,
        other => panic!("expected Corrupt, got {other:?}"),
    }
}

fn create(plan: &Plan) -> (Seq, Seq) {
    match plan.active {
        ActivePlan::Create { first, prev } => (first, prev),
        ActivePlan::Reuse { scan } => panic!("reuses {scan}, expected a new segment"),
    }
}

#[test]
fn crash_while_writing_a_batch_before_its_fdatasync_returned() {
    // Batch 4..=6 reached the disk in part: its second sector never did.
    let seg = Seg::new(1, 0, 1).batch(3).batch(3);
    let torn_at = seg.offset_of(4) as u64;
    assert_eq!(torn_at % 4096, 0, "a sync group starts a block");
    let garbled = seg.offset_of(5);
    let plan = decide(&[seg.garble(garbled, 30).file()]).expect("a torn tail opens");
    assert_eq!(kept(&plan), vec![(0, 3, Some(torn_at))]);
    let torn = plan.torn.as_ref().expect("torn tail reported");
    assert_eq!(torn.offset, torn_at);
    assert_eq!(plan.records, 3);
    assert_eq!(plan.seal.as_ref().map(|s| s.at), Some(torn_at));
    // Numbers 4..=6 were seen (frame 6 is valid past the damage): never reused.
    let (first, _) = create(&plan);
    assert!(first > Seq::from(6), "active segment starts at {first}");

    // The first frame of the batch lost, later frames of the same batch
    // whole: still the same unacknowledged batch, still torn.
    let seg = Seg::new(1, 0, 1).batch(3).batch(3);
    let at = seg.offset_of(4);
    let plan = decide(&[seg.garble(at, 12).file()]).expect("torn");
    assert_eq!(kept(&plan), vec![(0, 3, Some(at as u64))]);
}

#[test]
fn the_header_reached_the_disk_but_the_payload_did_not() {
    let seg = Seg::new(1, 0, 1).batch(2).batch(1);
    let at = seg.offset_of(3);
    let seg = seg.zeros(0);
    let len = seg.bytes.len();
    // The payload's bytes are zeros: the header landed, the payload did not.
    let mut seg = seg;
    seg.bytes[at + PAYLOAD..len].fill(0);
    let plan = decide(&[seg.file()]).expect("torn");
    assert_eq!(kept(&plan), vec![(0, 2, Some(at as u64))]);
    assert!(matches!(
        plan.torn.map(|t| t.cause),
        Some(Corruption::ChecksumMismatch { .. })
    ));

    // The reverse: the payload landed, the header did not.
    let seg = Seg::new(1, 0, 1).batch(2).batch(1);
    let at = seg.offset_of(3);
    let plan = decide(&[seg.garble(at, PAYLOAD).file()]).expect("torn");
    assert_eq!(kept(&plan), vec![(0, 2, Some(at as u64))]);
}

#[test]
fn a_flipped_length_field() {
    // A length bit flipped in an fsynced batch makes its frame look longer,
    // past the end of the file; the later batch proves it was not torn.
    let seg = Seg::new(1, 0, 1).batch(2).batch(2);
    let at = seg.offset_of(2);
    let kind = corruption(decide(&[seg.flip(at + LEN_FIELD + 2, 6).file()]));
    assert!(
        matches!(kind, Corruption::DamageBeforeValidFrame { valid_seq, .. } if valid_seq == Seq::from(3)),
        "{kind:?}"
    );
}

#[test]
fn the_file_grew_but_its_data_did_not_land() {
    // Garbage after the last whole batch: a torn tail cut at its end.
    let seg = Seg::new(1, 0, 1).batch(3);
    let end = seg.bytes.len() as u64;
    let plan = decide(&[seg.garbage(5000).file()]).expect("torn");
    assert_eq!(kept(&plan), vec![(0, 3, Some(end))]);

    // Old blocks of another segment: its frames fail this segment's salted
    // checksum, so they are garbage too.
    let other = Seg::new(900, 0, 1).batch(4);
    let seg = Seg::new(1, 0, 1).batch(3);
    let end = seg.bytes.len() as u64;
    let mut bytes = seg.bytes;
    bytes.extend_from_slice(&other.bytes[FRAMES_AT..]);
    let plan = decide(&[(SegmentId(1), bytes)]).expect("torn");
    assert_eq!(kept(&plan), vec![(0, 3, Some(end))]);
}

#[test]
fn bit_rot_in_a_batch_that_was_fsynced() {
    // Followed by a later batch: corruption, named with its offset.
    let seg = Seg::new(1, 0, 1).batch(2).batch(2);
    let at = seg.offset_of(1);
    let files = [seg.flip(at + PAYLOAD + 3, 0).file()];
    match decide(&files) {
        Err(Error::Corrupt { offset, seq, .. }) => {
            assert_eq!(offset, at as u64);
            assert_eq!(seq, Some(Seq::from(1)));
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
    // In the last batch of the newest segment it cannot be told from a torn
    // write: the batch is cut (the documented limit).
    let seg = Seg::new(1, 0, 1).batch(2).batch(2);
    let at = seg.offset_of(4);
    let plan = decide(&[seg.flip(at + PAYLOAD, 0).file()]).expect("cut");
    assert_eq!(kept(&plan), vec![(0, 2, Some(seg_offset(2, 2, 3)))]);

    // In a sealed segment, read whole: corruption, whatever follows.
    let old = Seg::new(1, 0, 1).batch(2).seal();
    let at = old.offset_of(2);
    let files = [old.flip(at + PAYLOAD, 1).file(), Seg::new(4, 3, 1).file()];
    let scans = scans(&files);
    let every_frame = plan_every_frame(&files);
    assert!(scans[0].damage.is_none(), "the seal index vouches for it");
    assert!(matches!(every_frame, Err(Error::Corrupt { .. })));
}

#[test]
fn bit_rot_before_sync_groups_that_end_on_block_boundaries_is_corruption() {
    // Frames of 512 bytes, sixteen to a sync group: every eighth frame
    // starts a block, and each group ends where a block ends, so the next
    // group starts right after it. Looking past the damage must still see
    // the later groups' first frames, not read on from a frame of the
    // damaged group into them.
    let mut seg = Seg::new(1, 0, 1);
    for _ in 0..3 {
        seg = seg.align();
        let group = seg.next;
        for k in 0..16 {
            seg.frame(FrameKind::Record, &[7; 464], group, k == 15);
        }
    }
    assert_eq!(seg.offset_of(17), seg.offset_of(16) + 512, "no padding");
    let at = seg.offset_of(2);
    match decide(&[seg.flip(at + PAYLOAD + 3, 0).file()]) {
        Err(Error::Corrupt { offset, seq, .. }) => {
            assert_eq!(offset, at as u64);
            assert_eq!(seq, Some(Seq::from(2)));
        }
        other => panic!("fsynced groups followed the damage: expected Corrupt, got {other:?}"),
    }
}

#[test]
fn looking_past_damage_reads_the_acknowledgements_of_later_groups() {
    // A repair names the relocated records it drops unless an
    // acknowledgement covers them, and reads those past the damage too: in
    // each later group, its first frame's and the frames after it.
    let mut seg = Seg::new(1, 0, 1).batch(3).align();
    let group = seg.next;
    seg.frame(FrameKind::Record, &[7; 20], group, false);
    let acks = crate::format::acks::encode(&[(Seq::from(2), Seq::from(3))]);
    seg.frame(frame::ACKS, &acks, group, true);
    let mut seg = seg.align();
    let group = seg.next;
    let acks = crate::format::acks::encode(&[(Seq::from(5), Seq::from(5))]);
    seg.frame(frame::ACKS, &acks, group, true);
    let at = seg.offset_of(2);
    let scans = scans(&[seg.flip(at + PAYLOAD, 2).file()]);
    let damage = scans[0].damage.as_ref().expect("damage");
    assert_eq!(damage.offset, at as u64);
    assert_eq!(
        damage.acked,
        vec![(Seq::from(2), Seq::from(3)), (Seq::from(5), Seq::from(5))]
    );
    assert!(damage.relocated.is_empty());
}

#[test]
fn looking_past_a_damaged_copy_reads_the_copies_after_it_in_its_group() {
    // A relocation step writes its copies one after another in one sync
    // group: damage in one copy's payload (its header holds, so its length
    // is known) leaves the copies after it, which start on no block
    // boundary, to be found from its end, and named.
    use crate::format::ext::RecordFields;
    use crate::format::relocated::{self, Carried, CarriedState};
    let mut seg = Seg::new(10, 0, 1).batch(2).align();
    let group = seg.next;
    let salt = frame::salt(seg.id, seg.nonce);
    let mut copies = Vec::new();
    for (k, own) in [3u64, 5, 7].into_iter().enumerate() {
        let carried = Carried {
            attempts: 0,
            state: CarriedState::Pending,
            reason: None,
        };
        let mut ext = Vec::new();
        relocated::encode_ext(&RecordFields::default(), Seq::from(own), &carried, &mut ext);
        let at = seg.bytes.len();
        let seq = seg.next;
        frame::encode_with(
            &mut seg.bytes,
            &FrameHeader {
                kind: FrameKind::Relocated,
                batch_end: k == 2,
                seq: Seq::from(seq),
                group: Seq::from(group),
                timestamp_us: 1,
            },
            &ext,
            &[7; 100],
            salt,
        );
        seg.at.insert(seq, at);
        seg.next += 1;
        copies.push(at);
    }
    let seg = seg.batch(1);
    let damaged = seg.flip(copies[0] + PAYLOAD + 40, 3);
    let scans = scans(&[damaged.file()]);
    let damage = scans[0].damage.as_ref().expect("damage");
    assert_eq!(damage.offset, copies[0] as u64);
    assert_eq!(damage.relocated, vec![Seq::from(5), Seq::from(7)]);
}

#[test]
fn bit_rot_in_the_newest_segment_is_cut_only_in_its_last_group() {
    // Sync groups of random lengths, some of frames that fill whole blocks
    // (so that the next group follows with no padding), a bit flipped in a
    // random frame's payload: corruption wherever a later group follows it,
    // a torn tail (its group cut) only in the last group.
    let mut rng = crate::sim::Rng::new(20261206);
    for case in 0..400 {
        let mut seg = Seg::new(1, 0, 1);
        let mut groups = Vec::new();
        let mut sizes = std::collections::BTreeMap::new();
        for _ in 0..2 + rng.below(4) {
            seg = seg.align();
            let group = seg.next;
            groups.push(group);
            let size = match rng.below(4) {
                0 => 464,
                1 => 976,
                2 => 2000,
                _ => 8 + rng.below(600) as usize,
            };
            let n = 1 + rng.below(24);
            for k in 0..n {
                let seq = seg.frame(FrameKind::Record, &vec![7; size], group, k + 1 == n);
                sizes.insert(seq, size);
            }
        }
        let victim = 1 + rng.below(seg.next - 1);
        let at = seg.offset_of(victim) + PAYLOAD + rng.below(sizes[&victim] as u64) as usize;
        let last = *groups.last().expect("groups");
        let cut = seg.offset_of(last) as u64;
        let result = decide(&[seg.flip(at, rng.below(8) as u8).file()]);
        if victim >= last {
            let plan = result.unwrap_or_else(|e| panic!("case {case}: {e:?}"));
            assert_eq!(
                kept(&plan),
                vec![(0, last as usize - 1, Some(cut))],
                "case {case}"
            );
        } else {
            assert!(
                matches!(result, Err(Error::Corrupt { .. })),
                "case {case}: damage in frame {victim} before group {last}: {result:?}"
            );
        }
    }
}

/// Offset of frame `seq` in a segment of batches of `sizes` records from 1.
fn seg_offset(first_batch: usize, second_batch: usize, seq: u64) -> u64 {
    Seg::new(1, 0, 1)
        .batch(first_batch)
        .batch(second_batch)
        .offset_of(seq) as u64
}

/// Plans with every segment read whole.
fn plan_every_frame(files: &[(SegmentId, Vec<u8>)]) -> Result<Plan> {
    let scans: Vec<SegmentScan> = files
        .iter()
        .map(|(id, bytes)| {
            let len = bytes.len() as u64;
            let path = PathBuf::from(id.file_name());
            scan::scan(*id, path, bytes, OpenCheck::EveryFrame, &|at| {
                Ok(Some(at..len))
            })
        })
        .collect();
    plan(&scans, RecoveryMode::Strict)
}

#[test]
fn a_preallocated_tail() {
    // Zeros after a batch end: the clean end of the data, nothing cut.
    let plan = decide(&[Seg::new(1, 0, 1).batch(3).zeros(1 << 16).file()]).expect("clean");
    assert_eq!(kept(&plan), vec![(0, 3, None)]);
    assert_eq!(plan.torn, None);
    // The seal goes on the block after the last frame, not after the zeros.
    let end = Seg::new(1, 0, 1).batch(3).bytes.len() as u64;
    assert_eq!(plan.seal.as_ref().map(|s| s.at), Some(align_up(end)));

    // Zeros after a frame whose batch is still open: that batch is torn.
    let seg = Seg::new(1, 0, 1).batch(2).open_batch(2);
    let at = seg.offset_of(3) as u64;
    let plan = decide(&[seg.zeros(8192).file()]).expect("torn");
    assert_eq!(kept(&plan), vec![(0, 2, Some(at))]);
    assert_eq!(
        plan.torn.map(|t| t.cause),
        Some(Corruption::IncompleteBatch)
    );

    // Zeros torn into garbage sectors after the last batch: cut on the block
    // after it (the zeros before that block are the padding of its group).
    let seg = Seg::new(1, 0, 1).batch(3);
    let end = align_up(seg.bytes.len() as u64);
    let plan = decide(&[seg.zeros(4096).garbage(512).zeros(4096).file()]).expect("torn");
    assert_eq!(kept(&plan), vec![(0, 3, Some(end))]);
}

/// `seg`'s bytes laid over those of `old` (a deleted segment whose file was
/// recycled): the new segment's header and frames, then what the old
/// segment left past them.
fn recycled(seg: Seg, old: &Seg) -> Seg {
    let mut seg = seg;
    if old.bytes.len() > seg.bytes.len() {
        let from = seg.bytes.len();
        seg.bytes.extend_from_slice(&old.bytes[from..]);
    }
    seg
}

/// The old segment of the recycled-file cases: many batches of records, keyed
/// by another nonce and named below the new segment, sealed.
fn stale() -> Seg {
    let mut old = Seg::keyed(1, 0, 1, 0xdead_beef);
    for _ in 0..40 {
        old = old.batch(9);
    }
    old.seal()
}

#[test]
fn a_recycled_file() {
    let old = stale();
    let first = old.next + 1;
    // The clean end: a batch, filled with zeros to its block's end, then the
    // old segment's frames, which fail the new salt. Damage with nothing of
    // a later group after it: cut on the block after the batch, no frame lost.
    let seg = Seg::new(first, first - 1, first).batch(3).align();
    let end = seg.bytes.len() as u64;
    let file = recycled(seg, &old);
    let plan = decide(&[file.file()]).expect("a recycled file's old bytes are not damage");
    assert_eq!(kept(&plan), vec![(0, 3, Some(end))]);
    // None of the old frames' numbers is believed, so none is reused below
    // them... but none of the new one's either.
    assert!(create(&plan).0 > Seq::from(first + 3));

    // A crash while the second batch was written: its first sector landed,
    // the rest is the old segment's. That batch is cut.
    let seg = Seg::new(first, first - 1, first).batch(3).batch(40);
    let second = seg.offset_of(first + 3);
    let file = recycled(seg.cut(second + 512), &old);
    let plan = decide(&[file.file()]).expect("torn");
    assert_eq!(kept(&plan), vec![(0, 3, Some(second as u64))]);

    // Bit rot in a fsynced batch followed by a later one is still corruption
    // with old bytes after them.
    let seg = Seg::new(first, first - 1, first).batch(2).batch(2).align();
    let at = seg.offset_of(first);
    let file = recycled(seg.flip(at + PAYLOAD + 3, 0), &old);
    assert!(matches!(
        corruption(decide(&[file.file()])),
        Corruption::DamageBeforeValidFrame { .. }
    ));

    // A sealed recycled segment whose cut after the seal was lost: the old
    // bytes after its seal are not read as frames, it is whole, read frame by
    // frame (its last bytes are not its trailer), and cut at its seal's end
    // again, so that later opens read it through its index.
    let sealed = Seg::new(first, first - 1, first).batch(3).seal();
    let end = sealed.bytes.len() as u64;
    let sealed = recycled(sealed.align(), &old);
    let next = first + 4;
    let files = [sealed.file(), Seg::new(next, next - 1, first).file()];
    for plan in [decide(&files), plan_every_frame(&files)] {
        let plan = plan.expect("sealed");
        assert_eq!(kept(&plan), vec![(0, 4, Some(end))]);
        assert_eq!(plan.active, ActivePlan::Reuse { scan: 1 });
        assert_eq!(plan.torn, None);
    }
    // A frame of the segment itself after its seal is still damage.
    let mut sealed = Seg::new(first, first - 1, first).batch(3).seal();
    let after = sealed.next;
    sealed.frame(FrameKind::Record, &[1; 20], after, true);
    let files = [sealed.file(), Seg::new(after + 1, after, first).file()];
    assert_eq!(
        corruption(plan_every_frame(&files)),
        Corruption::FrameAfterSeal
    );
}

#[test]
fn crash_between_writing_a_seal_and_its_fdatasync() {
    // The successor is durable and empty; the seal is torn.
    let old = Seg::new(1, 0, 1).batch(3).seal_as(4);
    let seal_at = old.offset_of(4);
    let len = old.bytes.len();
    let files = [
        old.garble(seal_at + 10, len - seal_at - 10).file(),
        Seg::new(5, 4, 1).file(),
    ];
    let plan = decide(&files).expect("a torn seal is a torn tail");
    assert_eq!(kept(&plan), vec![(0, 3, Some(seal_at as u64))]);
    assert_eq!(plan.active, ActivePlan::Reuse { scan: 1 });
    // The writer seals it again, with the number the successor names.
    assert_eq!(
        plan.seal,
        Some(SealPlan {
            at: seal_at as u64,
            seq: Seq::from(4)
        })
    );

    // A whole seal whose truncation was lost: zeros after it, still sealed,
    // and cut at the seal's end again.
    let sealed = Seg::new(1, 0, 1).batch(3).seal();
    let end = sealed.bytes.len() as u64;
    let files = [sealed.zeros(1 << 14).file(), Seg::new(5, 4, 1).file()];
    let plan = decide(&files).expect("sealed");
    assert_eq!(kept(&plan), vec![(0, 4, Some(end))]);
    assert_eq!(plan.seal, None);
    assert_eq!(plan.torn, None);
}

#[test]
fn a_seal_index_that_checks() {
    let files = [
        Seg::new(1, 0, 1)
            .batch(2)
            .log_start(1)
            .batch(1)
            .seal()
            .file(),
        Seg::new(6, 5, 1).file(),
    ];
    let scans = scans(&files);
    // Read through the index: the same frames as read whole.
    let whole = scan::scan(
        SegmentId(1),
        PathBuf::from("whole"),
        &files[0].1,
        OpenCheck::EveryFrame,
        &|_| Ok(None),
    );
    assert_eq!(scans[0].frames, whole.frames);
    assert_eq!(scans[0].log_start_marker(), whole.log_start_marker());
    let plan = plan(&scans, RecoveryMode::Strict).expect("open");
    assert_eq!(plan.records, 3);

    // An index whose nonce is not the header's (a producer's bytes shaped like
    // one) is not trusted: the segment is read whole, and under another nonce
    // not one of its frames checks.
    let mut forged = files[0].1.clone();
    let nonce_at = 48;
    forged[nonce_at] ^= 1;
    let crc = crc32fast::hash(&forged[..124]);
    forged[124..128].copy_from_slice(&crc.to_le_bytes());
    let scan = scan::scan(
        SegmentId(1),
        PathBuf::from("forged"),
        &forged,
        OpenCheck::SealIndex,
        &|_| Ok(None),
    );
    let damage = scan.damage.expect("damage");
    assert_eq!(damage.offset, FRAMES_AT as u64);
    assert!(matches!(damage.cause, Corruption::ChecksumMismatch { .. }));
}

#[test]
fn crash_during_segment_creation() {
    // A segment takes its name only once its header is durable: a crash before
    // leaves `<name>.creating` (apply's to judge), or, on a file system that
    // kept the name and size but not the data, a file of zeros, removed.
    let prev = Seg::new(1, 0, 1).batch(3);
    let end = align_up(prev.bytes.len() as u64);
    for newest in [Vec::new(), vec![0; 100], vec![0; 4096], vec![0; 3 * 4096]] {
        let files = [
            Seg::new(1, 0, 1).batch(3).file(),
            (SegmentId(5), newest.clone()),
        ];
        let plan = decide(&files).unwrap_or_else(|e| panic!("{} bytes: {e}", newest.len()));
        assert_eq!(plan.remove_empty, vec![1], "{} bytes", newest.len());
        assert_eq!(kept(&plan), vec![(0, 3, None)]);
        assert_eq!(plan.seal.as_ref().map(|s| s.at), Some(end));
        // Numbers up to the name of the removed file are never reused.
        assert!(create(&plan).0 > Seq::from(5));
    }
    // A whole header and nothing else: reused.
    let files = [Seg::new(1, 0, 1).batch(3).file(), Seg::new(5, 4, 1).file()];
    assert_eq!(
        decide(&files).expect("open").active,
        ActivePlan::Reuse { scan: 1 }
    );
}

#[test]
fn a_newest_file_that_segwal_cannot_prove_it_wrote_is_refused() {
    // Not an interrupted creation (those never bear a segment's name): a
    // header that does not check, whatever follows it, is not removed.
    let mut png = vec![0x89, b'P', b'N', b'G', b'\r', b'\n', 0x1a, b'\n'];
    png.resize(48, 7);
    for newest in [
        b"not a segment, just notes".to_vec(),
        vec![b'x'; 5000],
        png,
        vec![0; 4096].into_iter().chain([1]).collect(),
        Seg::new(5, 4, 1).bytes[..20].to_vec(),
        Seg::new(5, 4, 1).garble(8, 40).bytes,
        Seg::new(5, 4, 1).zeros(1 << 12).garble(0, 4096).bytes,
    ] {
        let files = [
            Seg::new(1, 0, 1).batch(3).file(),
            (SegmentId(5), newest.clone()),
        ];
        let e = decide(&files).expect_err("a foreign newest file is refused");
        assert!(
            matches!(
                e,
                Error::Corrupt {
                    ref path,
                    offset: 0,
                    kind: Corruption::BadSegmentMagic
                        | Corruption::ShortSegmentHeader { .. }
                        | Corruption::BadSegmentHeader,
                    ..
                } if path.as_os_str() == SegmentId(5).file_name().as_str()
            ),
            "{} bytes: {e}",
            newest.len()
        );
        // A lossy repair gets past it by dropping it whole (apply moves it
        // into the quarantine folder).
        let lossy = plan(&scans(&files), RecoveryMode::Lossy).expect("repair");
        assert_eq!(
            (lossy.remove.clone(), lossy.remove_empty.len()),
            (vec![1], 0)
        );
        assert_eq!(kept(&lossy), vec![(0, 3, None)]);
        // Alone in the directory, the same.
        assert!(decide(&[(SegmentId(1), newest)]).is_err());
    }
}

#[test]
fn crash_between_creating_the_next_segment_and_sealing_the_old_one() {
    let files = [
        Seg::new(1, 0, 1).batch(3).file(),
        Seg::new(5, 4, 1).zeros(1 << 12).file(),
    ];
    let plan = decide(&files).expect("open");
    assert_eq!(plan.active, ActivePlan::Reuse { scan: 1 });
    assert_eq!(plan.seal.map(|s| s.seq), Some(Seq::from(4)));
    assert_eq!(plan.torn, None);

    // A successor naming a predecessor that does not follow the old segment's
    // frames was not made by this rotation.
    let files = [Seg::new(1, 0, 1).batch(3).file(), Seg::new(5, 2, 1).file()];
    assert!(matches!(
        corruption(decide(&files)),
        Corruption::BrokenChain { .. }
    ));
}

#[test]
fn crash_after_the_seal_before_a_frame_reached_the_new_segment() {
    let files = [
        Seg::new(1, 0, 1).batch(3).seal().file(),
        Seg::new(5, 4, 1).file(),
    ];
    let plan = decide(&files).expect("open");
    assert_eq!(plan.active, ActivePlan::Reuse { scan: 1 });
    assert_eq!(plan.seal, None);
    assert_eq!(kept(&plan), vec![(0, 4, None)]);
}

#[test]
fn the_newest_segment_is_lost() {
    let files = [Seg::new(1, 0, 1).batch(3).seal().file()];
    assert_eq!(
        corruption(decide(&files)),
        Corruption::MissingSegment {
            expected_first: Seq::from(5)
        }
    );
}

#[test]
fn crash_during_deletion() {
    // The log start moved to 5 and was fsynced; segment 1 came back.
    let files = [
        Seg::new(1, 0, 1).batch(3).seal().file(),
        Seg::new(5, 4, 1).batch(2).log_start(5).file(),
    ];
    let plan = decide(&files).expect("open");
    assert_eq!(plan.leftovers, vec![0]);
    assert_eq!(kept(&plan), vec![(1, 3, None)]);
    assert_eq!(plan.log_start, Seq::from(5));
    assert_eq!(plan.records, 2);

    // A middle segment missing at or above the log start: corruption.
    let files = [
        Seg::new(1, 0, 1).batch(3).seal().file(),
        Seg::new(9, 8, 1).batch(2).file(),
    ];
    assert!(matches!(
        corruption(decide(&files)),
        Corruption::MissingSegment { .. } | Corruption::BrokenChain { .. }
    ));
    // The oldest segment missing: corruption.
    let files = [Seg::new(5, 4, 1).batch(2).file()];
    assert_eq!(
        corruption(decide(&files)),
        Corruption::MissingSegment {
            expected_first: Seq::from(1)
        }
    );
}

/// Applies `plan` to the in-memory files as `apply` does to the disk, up to
/// `steps` of its steps (a crash after them), and returns the files left.
fn apply_in_memory(
    files: &[(SegmentId, Vec<u8>)],
    plan: &Plan,
    steps: usize,
) -> Vec<(SegmentId, Vec<u8>)> {
    let mut out: BTreeMap<SegmentId, Vec<u8>> = files.iter().cloned().collect();
    let id = |k: usize| files[k].0;
    let mut step = 0;
    let mut take = || {
        step += 1;
        step <= steps
    };
    if take() {
        for &k in &plan.remove_empty {
            out.remove(&id(k));
        }
    }
    if let (true, ActivePlan::Create { first, prev }) = (take(), &plan.active) {
        let seg = Seg::new(first.get(), prev.get(), plan.log_start.get());
        out.insert(seg.id, seg.bytes);
    }
    if take() {
        for &k in plan.leftovers.iter().chain(&plan.remove) {
            out.remove(&id(k));
        }
    }
    for keep in &plan.keep {
        if let (Some(cut), true, Some(f)) = (keep.cut, take(), out.get_mut(&id(keep.scan))) {
            f.truncate(cut as usize);
        }
    }
    // The writer's seal, after recovery.
    if let (Some(seal), Some(last), true) = (&plan.seal, plan.keep.last(), take()) {
        let k = last.scan;
        let scan = &scans(&files[k..=k])[0];
        let mut frames = scan.frames.clone();
        frames.truncate(last.frames);
        let index = crate::format::seal::index_of(&frames, scan.log_start_below(seal.at), NONCE);
        if let Some(f) = out.get_mut(&id(k)) {
            f.resize(seal.at as usize, 0);
            frame::encode(
                f,
                &FrameHeader {
                    kind: FrameKind::Seal,
                    batch_end: true,
                    seq: seal.seq,
                    group: seal.seq,
                    timestamp_us: 1,
                },
                index.bytes(),
                frame::salt(id(k), NONCE),
            );
        }
    }
    out.into_iter().collect()
}

#[test]
fn crash_during_recovery() {
    // Everything at once: a leftover below the log start, a torn tail, and an
    // empty newest file whose header never landed.
    let torn = Seg::new(5, 4, 1).batch(2).log_start(5).batch(2);
    let at = torn.offset_of(8);
    let files = [
        Seg::new(1, 0, 1).batch(3).seal().file(),
        torn.garble(at, 16).file(),
        (SegmentId(11), vec![0; 100]),
    ];
    let first = decide(&files).expect("open");
    // Interrupted after any step, recovery decides the same again; run to the
    // end, it has nothing left to do.
    for steps in 0..=6 {
        let left = apply_in_memory(&files, &first, steps);
        let again = decide(&left).unwrap_or_else(|e| panic!("after {steps} steps: {e}"));
        assert_eq!(again.records, first.records, "after {steps} steps");
        let frames: Vec<usize> = again.keep.iter().map(|k| k.frames).collect();
        let want: Vec<usize> = first.keep.iter().map(|k| k.frames).collect();
        // The seal the writer adds is one more frame.
        assert!(
            frames == want || (steps >= 5 && frames == vec![want[0] + 1]),
            "after {steps} steps: {frames:?} vs {want:?}"
        );
        if steps >= 5 {
            assert_eq!(again.torn, None);
            assert!(again.remove_empty.is_empty() && again.leftovers.is_empty());
            assert!(matches!(again.active, ActivePlan::Reuse { .. }));
            assert_eq!(again.seal, None);
        }
    }
}

#[test]
fn a_failed_write_or_fsync_then_a_reopen_in_the_same_process() {
    // The writer cut its active segment back to its last fsynced length after
    // a failed fsync: what is left is whole, nothing to cut.
    let seg = Seg::new(1, 0, 1).batch(2);
    let synced = seg.bytes.len();
    let seg = seg.batch(2).cut(synced);
    let plan = decide(&[seg.file()]).expect("open");
    assert_eq!(kept(&plan), vec![(0, 2, None)]);
    // A segment whose creation failed was cut to zero bytes: it held nothing.
    let files = [
        Seg::new(1, 0, 1).batch(2).file(),
        (SegmentId(4), Vec::new()),
    ];
    let plan = decide(&files).expect("open");
    assert_eq!(plan.remove_empty, vec![1]);
}

#[test]
fn numbers_are_never_reused() {
    // Frames numbered up to 30 lie past the damage in the newest segment; and
    // a lossy repair drops them: the next number is above all of them.
    let seg = Seg::new(1, 0, 1).batch(2).batch(28);
    let at = seg.offset_of(3);
    let files = [seg.garble(at, 10).file()];
    let plan = decide(&files).expect("torn");
    assert!(create(&plan).0 > Seq::from(30));
}

#[test]
fn lossy_recovery_drops_from_the_first_damage() {
    let old = Seg::new(1, 0, 1).batch(2).batch(2);
    let at = old.offset_of(3);
    let files = [
        old.seal().flip(at + PAYLOAD, 2).file(),
        Seg::new(6, 5, 1).batch(3).file(),
    ];
    assert!(plan_every_frame(&files).is_err());
    let scans: Vec<SegmentScan> = files
        .iter()
        .map(|(id, b)| {
            scan::scan(
                *id,
                PathBuf::from(id.file_name()),
                b,
                OpenCheck::EveryFrame,
                &|_| Ok(None),
            )
        })
        .collect();
    let plan = plan(&scans, RecoveryMode::Lossy).expect("lossy opens");
    let dropped = plan.dropped.as_ref().expect("reported");
    assert_eq!(dropped.first, Seq::from(3));
    // At least every number a frame after the damage carried.
    let last = dropped.last.expect("frames followed the damage");
    assert!(last >= Seq::from(8), "{last}");
    assert_eq!(dropped.offset, at as u64);
    assert_eq!(plan.remove, vec![1]);
    assert_eq!(kept(&plan), vec![(0, 2, Some(at as u64))]);
    assert!(create(&plan).0 > last);
}

#[test]
fn a_block_garbled_under_an_unsynced_write_holds_no_fsynced_byte() {
    // Group 1 was fsynced; group 2 starts the next block, and a power cut
    // garbled that whole block. Group 1 is untouched, and kept whole.
    let seg = Seg::new(1, 0, 1).batch(3).batch(2);
    let g2 = seg.offset_of(4);
    assert_eq!(g2 % 4096, 0);
    let plan = decide(&[seg.zeros(4096).garble(g2, 4096).file()]).expect("torn");
    assert_eq!(kept(&plan), vec![(0, 3, Some(g2 as u64))]);
    assert_eq!(plan.records, 3);
}

#[test]
fn a_torn_batch_of_a_buffered_sync_group_is_cut_inside_its_block() {
    // Under `Durability::Buffered` batches of one sync group follow each other
    // in a block; none of them was fsynced, so the cut may fall inside it.
    let seg = Seg::new(1, 0, 1).batch(2).continue_group(2);
    let at = seg.offset_of(3);
    assert_ne!(at % 4096, 0);
    let plan = decide(&[seg.garble(at, 10).file()]).expect("torn");
    assert_eq!(kept(&plan), vec![(0, 2, Some(at as u64))]);
    // Whole, the continued group reads as one.
    let plan = decide(&[Seg::new(1, 0, 1).batch(2).continue_group(2).file()]).expect("open");
    assert_eq!(kept(&plan), vec![(0, 4, None)]);
}

#[test]
fn a_payload_cannot_forge_a_frame() {
    // A producer's payload holds a well-formed frame (and a seal, and a log
    // start) for every salt it could know: the segment's first seq with nonce
    // 0, the version 1 salt, its neighbours. After a torn write, none of them
    // is taken as a later batch, and no number it carries is believed.
    // Inside the payload, a frame header takes 48 bytes: payload byte 4048
    // + k * 4096 lies on a block boundary of the file.
    let on_block = |k: usize| 4096 - frame::FRAME_HEADER_LEN + k * 4096;
    let mut forged = Vec::new();
    let mut k = 0;
    for nonce in [0, 1, NONCE ^ 1] {
        let salt = frame::salt(SegmentId(1), nonce);
        for kind in [FrameKind::Record, FrameKind::Seal, FrameKind::LogStart] {
            forged.resize(on_block(k), 0);
            k += 1;
            frame::encode(
                &mut forged,
                &FrameHeader {
                    kind,
                    batch_end: true,
                    seq: Seq::from((1 << 62) - 1),
                    group: Seq::from((1 << 62) - 1),
                    timestamp_us: 1,
                },
                &(1u64 << 61).to_le_bytes(),
                salt,
            );
        }
    }
    // Then a stretch dense with magic bytes.
    forged.resize(on_block(k) + 4096, 0xC5);
    let torn_with_forgery = |nonce: u64| {
        let mut seg = Seg::keyed(1, 0, 1, nonce).batch(1).align();
        let group = seg.next;
        seg.frame(FrameKind::Record, &forged, group, true);
        let at = seg.offset_of(2);
        assert_eq!((at + frame::FRAME_HEADER_LEN + on_block(0)) % 4096, 0);
        (at, [seg.garble(at, 8).file()])
    };
    let (at, files) = torn_with_forgery(NONCE);
    let plan = decide(&files).expect("a torn tail, not corruption");
    assert_eq!(kept(&plan), vec![(0, 1, Some(at as u64))]);
    let (first, _) = create(&plan);
    assert!(
        first < Seq::from(1 << 40),
        "a forged number was believed: {first}"
    );
    // The negative control: under checksums keyed with a nonce the producer
    // knows (0, as in a salt made of public numbers only), the same bytes make
    // recovery trust the forged frame: it refuses to open, calling the torn
    // write corruption before a later fsynced batch. So this test sees a
    // forgery when one is possible.
    let (_, files) = torn_with_forgery(0);
    assert!(matches!(
        corruption(decide(&files)),
        Corruption::DamageBeforeValidFrame { .. }
    ));
}

#[test]
fn a_buffered_batch_whose_first_sectors_never_landed_is_torn_not_corrupt() {
    // Under Buffered, batch 2 continues the sync group of batch 1 inside its
    // block; its first frame fills the block, its second starts the next. A
    // power cut loses the first (zeros) but not the second.
    let mut seg = Seg::new(1, 0, 1).batch(1);
    let group = seg.last_group();
    let x = seg.bytes.len();
    let fill = 8192 - x - frame::FRAME_HEADER_LEN;
    seg.frame(FrameKind::Record, &vec![5; fill], group, false);
    seg.frame(FrameKind::Record, &[6; 20], group, true);
    assert_eq!(seg.offset_of(3), 8192);
    seg.bytes[x..8192].fill(0);
    let plan = decide(&[seg.file()]).expect("a torn tail, not corruption");
    assert_eq!(kept(&plan), vec![(0, 1, Some(x as u64))]);
    // A seal that recovery wrote on the next block, numbered ahead, is not that.
    let seg = Seg::new(1, 0, 1).batch(1).seal_as(7);
    let plan = decide(&[seg.file(), Seg::new(8, 7, 1).file()]).expect("sealed");
    assert_eq!(plan.torn, None);
}

/// A segment of two batches and a log start, then a sync group starting with
/// an index checkpoint whose list is `list(&index)`, and a record after it.
fn checkpointed(list: impl Fn(&IndexBuilder) -> Vec<u8>) -> Seg {
    let mut seg = Seg::new(1, 0, 1).batch(3).log_start(1).batch(2).align();
    // A header naming a checkpoint every four blocks (this one is the first
    // past 16384, as the writer places it), so that the window's walk
    // through the checkpoints is checked against the whole walk too.
    let mut header = SegmentHeader::decode(&seg.bytes).expect("header");
    header.checkpoint_every = 16384;
    let block = header.encode_block();
    seg.bytes[..block.len()].copy_from_slice(&block);
    let payload = list(&seg.index);
    let group = seg.next;
    seg.frame(
        crate::format::checkpoint::CHECKPOINT,
        &payload,
        group,
        false,
    );
    assert_eq!(seg.offset_of(group), 16384);
    seg.frame(FrameKind::Record, &[8; 20], group, true);
    seg
}

#[test]
fn an_index_checkpoint_must_describe_the_frames_before_it() {
    // The truth: every frame so far, the log start frame internal.
    let seg = checkpointed(|index| index.checkpoint(0, &[], false));
    let plan = decide(&[seg.file()]).expect("a checkpoint that tells the truth");
    assert_eq!(plan.torn, None);
    assert_eq!(plan.records, 6);
    // A list that hides the internal frame, that starts at the wrong
    // position, or that names a checkpoint that is not there: its checksum
    // holds, so it was written so, and the segment is corrupt.
    for lie in [
        checkpointed(|index| index.checkpoint(0, &[], true)),
        checkpointed(|index| index.checkpoint(1, &[], false)),
        checkpointed(|index| index.checkpoint(0, &[4096], false)),
    ] {
        assert!(
            matches!(
                corruption(decide(&[lie.file()])),
                Corruption::BadCheckpoint { .. }
            ),
            "a lying checkpoint is corruption"
        );
    }
}

#[test]
fn numbers_at_or_above_half_the_format_bound_are_refused() {
    // An empty segment named at the format's bound (a name it allows): its
    // first append would be numbered 2^62, which no frame may hold.
    let at_bound = Seg::new(1 << 62, (1 << 62) - 1, 1 << 62).file();
    assert!(matches!(
        corruption(decide(&[at_bound])),
        Corruption::Unsupported { value, .. } if value == 1 << 62
    ));
    // Records just past the open's limit, 2^61.
    let past = Seg::new(1 << 61, (1 << 61) - 1, 1 << 61).batch(2).file();
    assert!(matches!(
        corruption(decide(&[past])),
        Corruption::Unsupported { value, .. } if value >= 1 << 61
    ));
    // Just below it, a log opens and numbers on.
    let below = Seg::new((1 << 61) - 10, 5, (1 << 61) - 10).batch(2).file();
    let plan = decide(&[below]).expect("opens");
    assert!(create(&plan).0 < Seq::from(1 << 61));
}

/// The frame `seq` of `seg` made a frame of kind `kind`, checksums and
/// all: a frame of a kind a newer build writes, as this build reads it.
fn rekind(mut seg: Seg, seq: u64, kind: u8) -> Seg {
    let at = seg.offset_of(seq);
    let salt = frame::salt(seg.id, seg.nonce);
    let len = frame::decode(&seg.bytes[at..], salt).expect("a frame").len;
    let checksum = |bytes: &[u8]| {
        let mut h = crc32fast::Hasher::new_with_initial(salt);
        h.update(bytes);
        h.finalize().to_le_bytes()
    };
    // The layout of docs/FORMAT.md, "Frames": magic, checksum of the rest,
    // checksum of the header's rest, length, kind.
    seg.bytes[at + 16] = kind;
    let header = checksum(&seg.bytes[at + 12..at + PAYLOAD]);
    seg.bytes[at + 8..at + 12].copy_from_slice(&header);
    let whole = checksum(&seg.bytes[at + 8..at + len]);
    seg.bytes[at + 4..at + 8].copy_from_slice(&whole);
    seg
}

/// A frame a newer build wrote, of a kind this one does not know, is
/// refused as unsupported wherever it lies in the newest segment: not as
/// damage when a later batch follows, and not dropped by a lossy repair
/// (with every intact record after it).
#[test]
fn a_frame_of_a_newer_build_is_unsupported_and_no_repair_drops_it() {
    let unknown = |then_more: bool| {
        let seg = Seg::new(1, 0, 1).batch(2).batch(1);
        let seg = rekind(seg, 3, 6);
        let seg = if then_more { seg.batch(2) } else { seg };
        vec![seg.file()]
    };
    for then_more in [false, true] {
        let files = unknown(then_more);
        for mode in [RecoveryMode::Strict, RecoveryMode::Lossy] {
            let refused = plan(&scans(&files), mode);
            assert!(
                matches!(
                    corruption(refused),
                    Corruption::Unsupported {
                        what: "frame kind",
                        value: 6
                    }
                ),
                "then_more {then_more}, {mode:?}"
            );
        }
    }
    // The same frame damaged (its checksum fails) before a later batch is
    // damage, which a lossy repair cuts.
    let damaged = Seg::new(1, 0, 1).batch(2).batch(1);
    let at = damaged.offset_of(3);
    let files = vec![damaged.flip(at + PAYLOAD + 1, 0).batch(2).file()];
    assert!(matches!(
        corruption(decide(&files)),
        Corruption::DamageBeforeValidFrame { .. }
    ));
    let lossy = plan(&scans(&files), RecoveryMode::Lossy).expect("repair");
    assert_eq!(lossy.dropped.map(|d| d.first), Some(Seq::from(3)));
}

/// A lossy repair cuts at the first real damage and sets every later
/// segment aside whole: not when one of them holds a newer build's frame,
/// which it would drop unread with them.
#[test]
fn no_repair_sets_aside_a_later_segment_holding_a_newer_builds_frame() {
    let older = Seg::new(1, 0, 1).batch(2).seal();
    let seal_at = older.offset_of(3);
    let older = older.flip(seal_at + PAYLOAD + 1, 0);
    let newest = rekind(Seg::new(4, 3, 1).batch(1).batch(1), 5, 6);
    let files = vec![older.file(), newest.file()];
    let lossy = plan(&scans(&files), RecoveryMode::Lossy);
    assert!(
        matches!(
            corruption(lossy),
            Corruption::Unsupported {
                what: "frame kind",
                value: 6
            }
        ),
        "the newer build's frame is named"
    );
    // Without it, the same damage is repaired.
    let plain = vec![
        Seg::new(1, 0, 1)
            .batch(2)
            .seal()
            .flip(seal_at + PAYLOAD + 1, 0)
            .file(),
        Seg::new(4, 3, 1).batch(1).batch(1).file(),
    ];
    let repaired = plan(&scans(&plain), RecoveryMode::Lossy).expect("repair");
    assert!(repaired.dropped.is_some());
}
