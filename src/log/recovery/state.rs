//! The delivery state the log recorded: acknowledgements, releases with a
//! delay, dead letters, requeues (docs/FORMAT.md, "Frame kinds"), read once
//! recovery has settled which segments and frames are kept, in log order.
//!
//! These are internal frames, found through each segment's frame list (the
//! seal index of a sealed segment, the scan of the newest) without reading the
//! records. They were fsynced (a torn one is cut with its batch), so one that
//! does not check is damage: refused like any other, except by a lossy repair,
//! which skips it (its records are then delivered once more). The records
//! themselves are checked when they are claimed.

use crate::error::{Corruption, Error, Result};
use crate::format::acks;
use crate::format::checkpoint::CHECKPOINT;
use crate::format::delivery::{self, Change};
use crate::format::fields::{self, DedupDigest, Described, Tombstone};
use crate::format::frame::{self, FRAME_HEADER_LEN, FrameSpan};
use crate::format::frames::FrameList;
use crate::format::hash::{Digest, Hasher};
use crate::format::segment::BLOCK;
use crate::format::seq::Seq;
use crate::io::{Storage, read_exact_at};

/// A segment recovery keeps, as the plan decided it: the file, its checksum
/// seed, and the frames kept.
pub(crate) struct Kept<'a> {
    pub path: &'a std::path::Path,
    pub salt: u32,
    /// The seq of the segment's first frame: frame `i` holds `first_seq + i`.
    pub first_seq: Seq,
    /// The segment's frames, of which those at positions `from` to `kept`
    /// (exclusive) are read.
    pub frames: &'a FrameList,
    pub from: usize,
    pub kept: usize,
}

/// One change of delivery state the log recorded.
pub(crate) enum Recorded {
    /// Records acknowledged.
    Acks(Seq, Seq),
    /// Another change, with the time its frame was written (µs since the Unix
    /// epoch).
    Change(Change, u64),
    /// The record `seq` carried forward into the frame `at`, with its
    /// delivery state, and what its producer said of it (`seq` named in it
    /// is the record's own) with the time it was first written.
    Relocated {
        seq: Seq,
        at: Seq,
        carried: crate::format::relocated::Carried,
        described: Option<Described>,
        stamped_us: u64,
    },
    /// What producers said of the records of the batch that the fields frame
    /// `at` ends, written at `stamped_us`.
    Fields {
        described: Vec<Described>,
        at: Seq,
        stamped_us: u64,
    },
    /// Deduplication ids carried forward into the tombstones frame `at`.
    Tombstones { stones: Vec<Tombstone>, at: Seq },
}

/// What the optional fields of a relocated record's frame say, as digests.
fn described_of(hasher: &Hasher, seq: Seq, ext: &[u8], payload: &[u8]) -> Option<Described> {
    let fields = crate::format::ext::decode(ext).ok()?;
    let d = Described {
        seq,
        key: fields.key.map(|k| hasher.digest(Digest::Key, k)),
        not_before_us: fields.not_before_us,
        dedup: fields.dedup_id.map(|id| DedupDigest {
            id: hasher.digest(Digest::DedupId, id),
            content: hasher.digest(Digest::Content, payload),
        }),
    };
    (!d.is_empty()).then_some(d)
}

/// An internal frame longer than this may be an index checkpoint: its header
/// is read first, and the rest only if it is not.
const LARGE: usize = BLOCK;

/// Every change the kept delivery-state frames record, in log order.
///
/// Each internal frame is read whole and checked, but a segment's seal (its
/// index was checked when the segment was scanned) and an index checkpoint
/// longer than a block (it only says where frames lie), of which the header
/// alone is read and checked: a delivery-state frame of a kept segment was fsynced (a torn one was cut with its batch), so one that
/// fails its checksum is damage, refused as such (`Error::Corrupt`, naming the
/// file and offset), unless `lossy`: then it is skipped, and its records are
/// delivered once more.
pub(crate) fn recorded_state<'a>(
    storage: &dyn Storage,
    segments: impl IntoIterator<Item = Kept<'a>>,
    lossy: bool,
    hasher: &Hasher,
) -> Result<Vec<Recorded>> {
    let mut out = Vec::new();
    let segments: Vec<Kept<'a>> = segments.into_iter().collect();
    // A segment's internal frames, found in one pass over its frames (an
    // open's sealed segments hold hundreds of thousands of records each).
    let mut internal: Vec<(Seq, FrameSpan)> = Vec::new();
    let internal_of = |seg: &Kept<'_>, internal: &mut Vec<(Seq, FrameSpan)>| {
        internal.clear();
        internal.extend(
            seg.frames
                .internal()
                .iter()
                .map(|&p| p as usize)
                .skip_while(|&p| p < seg.from)
                .take_while(|&p| p < seg.kept)
                .filter_map(|p| {
                    let seq = Seq::from(seg.first_seq.get() + p as u64);
                    Some((seq, seg.frames.get(p)?))
                }),
        );
    };
    // Read one at a time, the frames would cost a round trip to the disk
    // each from a cold page cache (thousands of acks frames after a long
    // run, or the index checkpoints of many segments a lone producer
    // filled): the file system is told of all of them, in every segment,
    // first, and reads them at once (docs/BENCHMARKS.md, "Cold open: the
    // state frames asked for at once"). Of a large frame, only its first
    // block: it may be an index checkpoint, which is not read. Only a hint:
    // a file that cannot be opened here is reported by the reads below.
    for seg in &segments {
        internal_of(seg, &mut internal);
        if internal.is_empty() {
            continue;
        }
        let Ok(file) = storage.open(seg.path) else {
            continue;
        };
        for (_, span) in &internal {
            let len = if span.len() as usize > LARGE {
                BLOCK
            } else {
                span.len() as usize
            };
            file.will_need(u64::from(span.offset), len as u64);
        }
    }
    for seg in &segments {
        internal_of(seg, &mut internal);
        if internal.is_empty() {
            continue;
        }
        let path = seg.path;
        let file = storage
            .open(path)
            .map_err(|e| Error::io("open segment", path, e))?;
        let last = (seg.kept.checked_sub(1))
            .and_then(|i| seg.frames.get(i))
            .map(|f| f.offset);
        let mut header = [0u8; FRAME_HEADER_LEN];
        let mut whole = Vec::new();
        for &(own, span) in &internal {
            let at = u64::from(span.offset);
            // The seal (its index was checked when the segment was scanned)
            // and a large index checkpoint (it only says where frames lie)
            // are not delivery state: their header alone is read, and
            // believed only if its own keyed checksum holds, so that damage
            // to a kind byte cannot make recovery skip a delivery-state frame.
            if Some(span.offset) == last || span.len() as usize > LARGE {
                read_exact_at(&*file, &mut header, at)
                    .map_err(|e| Error::io("read segment", path, e))?;
                let kind = frame::kind_of(&header);
                let checked = frame::claimed_len(&header, seg.salt) == Some(span.len() as usize);
                if checked && (kind == Some(frame::FrameKind::Seal) || kind == Some(CHECKPOINT)) {
                    continue;
                }
            }
            whole.resize(span.len() as usize, 0);
            read_exact_at(&*file, &mut whole, at)
                .map_err(|e| Error::io("read segment", path, e))?;
            let corrupt = |kind| Error::Corrupt {
                path: path.to_path_buf(),
                offset: at,
                seq: None,
                kind,
            };
            let decoded = frame::decode(&whole, seg.salt).and_then(|f| {
                // A seal index or checkpoint lists where a frame lies, not
                // what it holds: the frame must hold the seq of its place.
                if f.header.seq != own {
                    return Err(Corruption::WrongFrame {
                        expected: own,
                        found: f.header.seq,
                    });
                }
                let stamped = f.header.timestamp_us;
                if f.header.kind == frame::ACKS {
                    let ranges = acks::decode(f.payload)?;
                    Ok(ranges
                        .into_iter()
                        .map(|(a, b)| Recorded::Acks(a, b))
                        .collect())
                } else if [
                    delivery::ATTEMPTS,
                    delivery::RELEASE,
                    delivery::DEAD_LETTER,
                    delivery::REQUEUE_OR_DISCARD,
                ]
                .contains(&f.header.kind)
                {
                    let changes = delivery::decode(f.header.kind, f.payload)?;
                    Ok(changes
                        .into_iter()
                        .map(|c| Recorded::Change(c, stamped))
                        .collect())
                } else if f.header.kind == frame::FrameKind::Relocated {
                    let (seq, carried) = crate::format::relocated::decode_ext(f.ext)?;
                    // Relocation carries a record forward, never back or
                    // onto itself.
                    if seq >= own {
                        return Err(Corruption::Unsupported {
                            what: "relocated frame naming a record at or after its own seq",
                            value: seq.get(),
                        });
                    }
                    Ok(vec![Recorded::Relocated {
                        seq,
                        at: f.header.seq,
                        carried,
                        described: described_of(hasher, seq, f.ext, f.payload),
                        stamped_us: stamped,
                    }])
                } else if f.header.kind == frame::FrameKind::Fields {
                    Ok(vec![Recorded::Fields {
                        described: fields::decode(f.payload)?,
                        at: f.header.seq,
                        stamped_us: stamped,
                    }])
                } else if f.header.kind == fields::TOMBSTONES {
                    Ok(vec![Recorded::Tombstones {
                        stones: fields::decode_tombstones(f.payload)?,
                        at: f.header.seq,
                    }])
                } else if f.header.kind == frame::FrameKind::Record {
                    // The index that listed it as internal is wrong (its
                    // checksum holds: a writer's bug, or a forgery): skipped,
                    // the record would be lost without a word.
                    Err(Corruption::Unsupported {
                        what: "record listed as an internal frame by its segment's index",
                        value: own.get(),
                    })
                } else {
                    // A log start, an index checkpoint, or a kind this build
                    // may skip.
                    Ok(Vec::new())
                }
            });
            match decoded {
                Ok(found) => out.extend(found),
                // What a newer build wrote is not damage: not skipped.
                Err(kind) if lossy && !kind.is_unknown_format() => {}
                Err(kind) => return Err(corrupt(kind)),
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::{Kept, Recorded, recorded_state};
    use crate::error::{Corruption, Error};
    use crate::format::ext::RecordFields;
    use crate::format::frame::{self, FrameHeader, FrameKind, FrameSpan};
    use crate::format::frames::FrameList;
    use crate::format::hash::Hasher;
    use crate::format::relocated::{self, Carried, CarriedState};
    use crate::format::seq::{SegmentId, Seq};
    use crate::io::Storage;
    use crate::sim::SimDisk;

    const FIRST: u64 = 10;

    /// A segment file of two internal frames, at seqs 10 and 11: a log start,
    /// then a relocated copy whose header says `at` and whose ext names the
    /// record `own`. Returns what recovery reads of it.
    fn read(at: u64, own: u64) -> crate::error::Result<Vec<Recorded>> {
        read_as(at, own, FrameKind::Relocated)
    }

    /// As [`read`], the second frame written as `kind` (a record: its
    /// payload alone).
    fn read_as(at: u64, own: u64, kind: FrameKind) -> crate::error::Result<Vec<Recorded>> {
        read_frame(at, own, kind, b"payload", false)
    }

    /// As [`read_as`], with the second frame's payload `payload`, read as a
    /// lossy repair reads when `lossy`.
    fn read_frame(
        at: u64,
        own: u64,
        kind: FrameKind,
        payload: &[u8],
        lossy: bool,
    ) -> crate::error::Result<Vec<Recorded>> {
        let disk = SimDisk::new(1);
        let dir = Path::new("/outbox");
        disk.create_dir(dir).expect("dir");
        let path = dir.join(SegmentId(FIRST).file_name());
        let salt = frame::salt(SegmentId(FIRST), 7);
        let header = |seq: u64, kind| FrameHeader {
            kind,
            batch_end: true,
            seq: Seq::from(seq),
            group: Seq::from(seq),
            timestamp_us: 1,
        };
        let mut bytes = vec![0u8; 4096];
        frame::encode(
            &mut bytes,
            &header(FIRST, FrameKind::LogStart),
            &1u64.to_le_bytes(),
            salt,
        );
        let second = bytes.len();
        let mut ext = Vec::new();
        let carried = Carried {
            attempts: 0,
            state: CarriedState::Pending,
            reason: None,
        };
        if kind == FrameKind::Relocated {
            relocated::encode_ext(&RecordFields::default(), Seq::from(own), &carried, &mut ext);
        }
        frame::encode_with(&mut bytes, &header(at, kind), &ext, payload, salt);
        let file = disk.create(&path).expect("create");
        crate::io::write_all_at(&*file, &bytes, 0).expect("write");
        let span = |from: usize, to: usize| FrameSpan::new(from as u32, (to - from) as u32, false);
        let frames: FrameList = [span(4096, second), span(second, bytes.len())]
            .into_iter()
            .collect();
        let kept = Kept {
            path: &path,
            salt,
            first_seq: Seq::from(FIRST),
            frames: &frames,
            from: 0,
            kept: frames.len(),
        };
        recorded_state(&disk, [kept], lossy, &Hasher::new(1))
    }

    /// A lossy repair skips a delivery-state frame that does not read (its
    /// records are delivered once more), but not one a newer build wrote
    /// (a code this build does not know): that is refused, as by a strict
    /// open, rather than lose what it says without a word.
    #[test]
    fn a_lossy_read_skips_a_bad_change_but_refuses_a_newer_builds() {
        use crate::format::delivery::REQUEUE_OR_DISCARD;
        // Requeue-or-discard code 3: none this build knows.
        let newer = [3u64.to_le_bytes().as_slice(), &[3]].concat();
        // Acknowledged from 5 to 4: no range any build writes.
        let backwards = [5u64.to_le_bytes(), 4u64.to_le_bytes()].concat();
        for lossy in [false, true] {
            match read_frame(FIRST + 1, 0, REQUEUE_OR_DISCARD, &newer, lossy) {
                Err(Error::Corrupt { kind, .. }) => {
                    assert!(kind.is_unknown_format(), "{kind}");
                }
                other => panic!(
                    "lossy {lossy}: expected Corrupt, got {:?}",
                    other.map(|v| v.len())
                ),
            }
            let read = read_frame(FIRST + 1, 0, frame::ACKS, &backwards, lossy);
            match read {
                Err(Error::Corrupt { kind, .. }) if !lossy => {
                    assert!(!kind.is_unknown_format(), "{kind}");
                }
                Ok(found) if lossy => assert!(found.is_empty()),
                other => panic!("lossy {lossy}: {:?}", other.map(|v| v.len())),
            }
        }
    }

    #[test]
    fn a_relocated_copy_of_an_earlier_record_is_read() {
        let found = read(FIRST + 1, 3).expect("read");
        assert!(matches!(
            found.as_slice(),
            [Recorded::Relocated { seq, at, .. }] if seq.get() == 3 && at.get() == FIRST + 1
        ));
    }

    #[test]
    fn a_frame_that_does_not_hold_the_seq_of_its_place_is_corruption() {
        // A seal index or checkpoint lists the second frame at seq 11; its
        // header (checksum valid) says 12.
        match read(FIRST + 2, 3) {
            Err(Error::Corrupt { kind, offset, .. }) => {
                assert_eq!(
                    kind,
                    Corruption::WrongFrame {
                        expected: Seq::from(FIRST + 1),
                        found: Seq::from(FIRST + 2),
                    }
                );
                assert!(offset > 4096, "the second frame's offset: {offset}");
            }
            other => panic!("expected Corrupt, got {:?}", other.map(|v| v.len())),
        }
    }

    #[test]
    fn a_record_an_index_lists_as_internal_is_corruption_not_skipped() {
        // The seal index or a checkpoint (checksum valid) says the second
        // frame is internal; it is a record, which recovery would otherwise
        // skip, and lose.
        match read_as(FIRST + 1, 3, FrameKind::Record) {
            Err(Error::Corrupt {
                kind: Corruption::Unsupported { value, .. },
                offset,
                ..
            }) => {
                assert_eq!(value, FIRST + 1);
                assert!(offset > 4096, "the second frame's offset: {offset}");
            }
            other => panic!("expected Corrupt, got {:?}", other.map(|v| v.len())),
        }
    }

    #[test]
    fn a_relocated_copy_naming_its_own_seq_or_a_later_one_is_corruption() {
        for own in [FIRST + 1, FIRST + 5] {
            match read(FIRST + 1, own) {
                Err(Error::Corrupt {
                    kind: Corruption::Unsupported { value, .. },
                    ..
                }) => assert_eq!(value, own),
                other => panic!("expected Corrupt, got {:?}", other.map(|v| v.len())),
            }
        }
    }
}
