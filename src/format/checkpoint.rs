//! Index checkpoints: internal frames (kind `0x86`) that list, every few
//! mebibytes of a segment, where the frames written before them lie, so that
//! opening an outbox after a crash need not read the newest segment whole.
//!
//! A checkpoint is always the first frame of a sync group, so every frame it
//! lists was fsynced before it was written. It lists the frames since the
//! checkpoint before it (or since the segment's start), as the seal index does
//! (offset and length, then which are internal), and the offsets of every
//! earlier checkpoint of its segment, so that recovery, having found the last
//! one, reads all of them at once. The byte layout is documented once, in
//! `docs/FORMAT.md` ("Index checkpoints"); the offsets below chain from each
//! other.
//!
//! Pure functions over byte slices, like the other codecs.

#![deny(clippy::indexing_slicing)]

use crate::error::Corruption;
use crate::format::frame::{FRAME_HEADER_LEN, FRAME_LEN_MAX, FrameKind, FrameSpan};
use crate::format::frames::FrameList;
use crate::format::seal::INDEX_FRAMES_MAX;
use crate::format::segment::{BLOCK, align_up};
use crate::format::seq::Seq;

/// The kind of an index checkpoint frame. Skippable: a reader that skips it
/// reads the segment's frames one by one, as before checkpoints.
pub(crate) const CHECKPOINT: FrameKind = FrameKind::Skippable(0x86);

/// Offset in the payload of the position (in the segment's list of frames,
/// from 0) of the first frame listed (u32).
const FIRST_AT: usize = 0;
/// Offset of the number of frames listed (u32).
const COUNT_AT: usize = FIRST_AT + 4;
/// Offset of how many of them are internal frames (u32).
const INTERNAL_AT: usize = COUNT_AT + 4;
/// Offset of the number of earlier checkpoints in the segment (u32).
const EARLIER_AT: usize = INTERNAL_AT + 4;
/// Offset of the highest log start a `LogStart` frame of the segment recorded
/// before this checkpoint (u64, 0 for none).
const LOG_START_AT: usize = EARLIER_AT + 4;
/// Offset of the lists: the earlier checkpoints' offsets (u32 each), every
/// frame's offset and length (u32 each), the internal frames' positions
/// among them (u32 each, from 0 at the first frame listed).
const LISTS_AT: usize = LOG_START_AT + 8;
/// Bytes of one frame in the list.
const FRAME_ENTRY_LEN: usize = 8;

/// The most checkpoints one segment holds; past them the writer writes none
/// (an interval set far below a sixteenth of the segment, or a segment grown
/// far past its size by huge records). Each lists the ones before it, 4
/// bytes each.
pub(crate) const CHECKPOINTS_MAX: usize = 1024;

/// The largest interval between checkpoints by default.
const EVERY_MAX: u64 = 4 << 20;

/// Segments smaller than this get no checkpoints by default: read whole,
/// they cost an open little.
const SEGMENT_MIN: u64 = 1 << 20;

/// The interval between checkpoints the writer uses by default for segments
/// of `segment_bytes`: a sixteenth of the segment, in whole blocks, at most
/// [`EVERY_MAX`]; 0 (none) for segments under [`SEGMENT_MIN`]. So a
/// crash-open reads at most about two intervals of the newest segment's
/// frames.
pub(crate) fn every(segment_bytes: u64) -> u32 {
    if segment_bytes < SEGMENT_MIN {
        return 0;
    }
    let every = (segment_bytes / 16 / BLOCK as u64 * BLOCK as u64).min(EVERY_MAX);
    every as u32
}

/// Whether `every`, read from a segment header, is an interval a writer of
/// checkpoints could have used: a whole number of blocks. Any other value (0
/// included) means: look for none.
pub(crate) fn valid_every(every: u32) -> bool {
    every != 0 && (every as usize).is_multiple_of(BLOCK)
}

/// What a checkpoint says.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Checkpoint {
    /// The position in the segment's list of frames of the first frame
    /// listed: the one after the previous checkpoint (0 for the first).
    pub first: u32,
    /// The frames listed, in order, each marked record or internal (after
    /// the frames it was decoded onto, by [`decode_onto`]).
    pub frames: FrameList,
    /// The highest log start recorded in the segment before it.
    pub log_start: Option<Seq>,
    /// The offsets of the segment's earlier checkpoints, in order.
    pub earlier: Vec<u32>,
}

/// The payload of a checkpoint listing `frames` (offset and length each,
/// from position `first` of the segment), of which those at the positions
/// `internal` (relative to `first`, ascending) are internal frames, after the
/// checkpoints at `earlier`, the segment's `LogStart` frames having recorded
/// at most `log_start`.
pub(crate) fn encode(
    first: u32,
    frames: &[(u32, u32)],
    internal: &[u32],
    earlier: &[u32],
    log_start: Option<Seq>,
) -> Vec<u8> {
    let len = LISTS_AT + 4 * earlier.len() + FRAME_ENTRY_LEN * frames.len() + 4 * internal.len();
    let mut out = Vec::with_capacity(len);
    out.extend_from_slice(&first.to_le_bytes());
    out.extend_from_slice(&(frames.len() as u32).to_le_bytes());
    out.extend_from_slice(&(internal.len() as u32).to_le_bytes());
    out.extend_from_slice(&(earlier.len() as u32).to_le_bytes());
    out.extend_from_slice(&log_start.map_or(0, Seq::get).to_le_bytes());
    for at in earlier {
        out.extend_from_slice(&at.to_le_bytes());
    }
    for (offset, len) in frames {
        out.extend_from_slice(&offset.to_le_bytes());
        out.extend_from_slice(&len.to_le_bytes());
    }
    for i in internal {
        out.extend_from_slice(&i.to_le_bytes());
    }
    debug_assert_eq!(out.len(), len);
    out
}

fn u32_at(buf: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(buf.get(at..at + 4)?.try_into().ok()?))
}

/// Decodes a checkpoint's payload. Checks what the payload alone can tell:
/// counts in range and consistent with its length, earlier checkpoints on
/// block boundaries in ascending order, each frame at least a header long and
/// starting right after the one before or on the next block boundary, the
/// internal positions ascending and in range. Where the list starts, and how
/// it meets the checkpoints around it, is for the reader of the whole chain
/// (`log::recovery::checkpoints`).
pub(crate) fn decode(payload: &[u8]) -> Result<Checkpoint, Corruption> {
    decode_onto(payload, FrameList::new())
}

/// [`decode`], with the frames the payload lists appended to `frames` (the
/// frames of the checkpoints before it, not checked again here): the
/// checkpoint returned lists them all. Recovery chains a segment's
/// checkpoints into one list this way, with no copy of each checkpoint's.
pub(crate) fn decode_onto(payload: &[u8], mut frames: FrameList) -> Result<Checkpoint, Corruption> {
    let bad = |what| Corruption::BadCheckpoint { what };
    let short = || bad("payload too short");
    let first = u32_at(payload, FIRST_AT).ok_or_else(short)?;
    let count = u32_at(payload, COUNT_AT).ok_or_else(short)? as usize;
    let internal = u32_at(payload, INTERNAL_AT).ok_or_else(short)? as usize;
    let earlier = u32_at(payload, EARLIER_AT).ok_or_else(short)? as usize;
    let log_start = payload
        .get(LOG_START_AT..LOG_START_AT + 8)
        .and_then(|b| b.try_into().ok())
        .map(u64::from_le_bytes)
        .ok_or_else(short)?;
    if count > INDEX_FRAMES_MAX || internal > count || earlier >= CHECKPOINTS_MAX {
        return Err(bad("a count out of range"));
    }
    let want = LISTS_AT + 4 * earlier + FRAME_ENTRY_LEN * count + 4 * internal;
    if payload.len() != want {
        return Err(bad("payload length does not match the counts"));
    }
    let mut offsets = Vec::with_capacity(earlier);
    for k in 0..earlier {
        let at = u32_at(payload, LISTS_AT + 4 * k).ok_or_else(short)?;
        if !(at as usize).is_multiple_of(BLOCK) || offsets.last().is_some_and(|&p| at <= p) {
            return Err(bad(
                "earlier checkpoints out of order or off a block boundary",
            ));
        }
        offsets.push(at);
    }
    let frames_at = LISTS_AT + 4 * earlier;
    let base = frames.len();
    frames.reserve(count);
    // The end of this checkpoint's frame before, if any.
    let mut prev_end: Option<u64> = None;
    for i in 0..count {
        let entry = frames_at + FRAME_ENTRY_LEN * i;
        let at = u32_at(payload, entry).ok_or_else(short)?;
        let len = u32_at(payload, entry + 4).ok_or_else(short)?;
        if (len as usize) < FRAME_HEADER_LEN {
            return Err(bad("a frame shorter than a frame header"));
        }
        if len as usize > FRAME_LEN_MAX {
            return Err(bad("a frame longer than the format allows"));
        }
        if let Some(end) = prev_end
            && u64::from(at) != end
            && u64::from(at) != align_up(end)
        {
            return Err(bad("a gap or an overlap between frames"));
        }
        if u64::from(at) + u64::from(len) > u64::from(u32::MAX) {
            return Err(bad("a frame past 4 GiB"));
        }
        prev_end = Some(u64::from(at) + u64::from(len));
        frames.push(FrameSpan::new(at, len, true));
    }
    let internal_at = frames_at + FRAME_ENTRY_LEN * count;
    let mut prev = None;
    for k in 0..internal {
        let i = u32_at(payload, internal_at + 4 * k).ok_or_else(short)? as usize;
        if prev.is_some_and(|p| i <= p) {
            return Err(bad("internal frames out of order"));
        }
        prev = Some(i);
        // A position counts from this checkpoint's first frame.
        if i >= count || !frames.set_internal(base + i) {
            return Err(bad("internal frame out of range"));
        }
    }
    Ok(Checkpoint {
        first,
        frames,
        log_start: (log_start != 0).then(|| Seq::from(log_start)),
        earlier: offsets,
    })
}

#[cfg(test)]
#[expect(
    clippy::indexing_slicing,
    reason = "tests damage bytes at known offsets"
)]
mod tests {
    use super::*;

    /// Three frames from 12288: two of one sync group, then a new group on
    /// the next block; the second internal.
    fn sample() -> Vec<u8> {
        encode(
            3,
            &[(12288, 140), (12428, 60), (16384, 64)],
            &[1],
            &[4096, 8192],
            Some(Seq::from(9)),
        )
    }

    #[test]
    fn a_checkpoint_round_trips() {
        let cp = decode(&sample()).expect("decodes");
        assert_eq!(cp.first, 3);
        assert_eq!(cp.earlier, vec![4096, 8192]);
        assert_eq!(cp.log_start, Some(Seq::from(9)));
        let kinds: Vec<_> = cp
            .frames
            .iter()
            .map(|f| (f.offset, f.is_record()))
            .collect();
        assert_eq!(kinds, vec![(12288, true), (12428, false), (16384, true)]);
        let empty = decode(&encode(0, &[], &[], &[], None)).expect("decodes");
        assert!(empty.frames.is_empty() && empty.log_start.is_none());
    }

    #[test]
    fn a_list_with_a_gap_an_overlap_or_a_bad_count_is_refused() {
        let gap = encode(0, &[(4096, 100), (4300, 60)], &[], &[], None);
        assert!(decode(&gap).is_err());
        let overlap = encode(0, &[(4096, 100), (4150, 60)], &[], &[], None);
        assert!(decode(&overlap).is_err());
        let short = encode(0, &[(4096, 47)], &[], &[], None);
        assert!(decode(&short).is_err());
        let unordered = encode(0, &[(4096, 100)], &[], &[8192, 4096], None);
        assert!(decode(&unordered).is_err());
        let off_block = encode(0, &[(4096, 100)], &[], &[4097], None);
        assert!(decode(&off_block).is_err());
        let internal_out = encode(0, &[(4096, 100)], &[1], &[], None);
        assert!(decode(&internal_out).is_err());
        let mut long = sample();
        long.push(0);
        assert!(decode(&long).is_err());
    }

    #[test]
    fn every_truncation_and_byte_flip_is_an_error_or_a_consistent_list() {
        let payload = sample();
        for cut in 0..payload.len() {
            assert!(decode(&payload[..cut]).is_err(), "cut at {cut}");
        }
        for at in 0..payload.len() {
            let mut p = payload.clone();
            p[at] ^= 0x10;
            if let Ok(cp) = decode(&p) {
                let frames: Vec<_> = cp.frames.iter().collect();
                for pair in frames.windows(2) {
                    let end = pair[0].end();
                    let next = u64::from(pair[1].offset);
                    assert!(next == end || next == align_up(end), "byte {at}");
                }
            }
        }
    }

    #[test]
    fn the_interval_is_a_sixteenth_of_the_segment_in_whole_blocks() {
        assert_eq!(every(64 << 20), 4 << 20);
        assert_eq!(every(16 << 20), 1 << 20);
        assert_eq!(every(1 << 30), 4 << 20);
        assert_eq!(every(1 << 20), 64 << 10);
        assert_eq!(every(1_000_000 + (1 << 20)), 124 << 10);
        assert_eq!(every((1 << 20) - 1), 0);
        assert_eq!(every(64 << 10), 0);
        for bytes in [1 << 20, 3 << 20, 64 << 20, 1 << 31] {
            assert!(valid_every(every(bytes)), "{bytes}");
        }
        assert!(!valid_every(0) && !valid_every(4097) && valid_every(8 << 20));
    }
}
