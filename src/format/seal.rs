//! The seal index: the payload of a segment's seal frame, which lists where every
//! frame of the segment lies, so that opening an outbox need not read every
//! byte of every sealed segment.
//!
//! Pure functions over byte slices, like the frame codec. The byte layout is
//! documented once, in `docs/FORMAT.md` ("The seal index"); the offsets below are
//! derived from each other and must agree with it. An empty seal payload is a
//! valid seal without an index: recovery then reads the segment whole.

#![deny(clippy::indexing_slicing)]

use crate::error::Corruption;
use crate::format::frame::{
    self, FRAME_HEADER_LEN, FRAME_LEN_MAX, FrameHeader, FrameSpan, frame_len,
};
use crate::format::frames::FrameList;
use crate::format::segment::{FRAMES_AT, align_up};
use crate::format::seq::Seq;

/// Offset in the payload of the number of frames indexed (u32).
const COUNT_AT: usize = 0;
/// Offset of the number of internal frames among them (u32).
const INTERNAL_AT: usize = COUNT_AT + 4;
/// Offset of the highest log start recorded by the segment's frames (u64, 0 for
/// none).
const LOG_START_AT: usize = INTERNAL_AT + 4;
/// Offset of the segment header's nonce (u64): the index belongs to that header.
const NONCE_AT: usize = LOG_START_AT + 8;
/// Offset of the frames: offset and length (u32 each) of every frame, then the
/// internal frames' positions in that list (u32 each).
const FRAMES_LIST_AT: usize = NONCE_AT + 8;
/// Bytes of one frame in the list.
const FRAME_ENTRY_LEN: usize = 8;
/// The trailer after the lists: the seal frame's whole length (u32), so that
/// recovery finds the seal from the end of the file.
pub(crate) const TRAILER_LEN: usize = 4;
/// Payload length of an index of nothing.
const EMPTY_INDEX_LEN: usize = FRAMES_LIST_AT + TRAILER_LEN;

/// The most frames one index lists (128 MiB of entries). A segment with more is
/// sealed without an index and read whole at recovery.
pub(crate) const INDEX_FRAMES_MAX: usize = 1 << 24;

/// What a seal index says about its segment.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct SealIndex {
    /// Every frame before the seal, in order.
    pub frames: FrameList,
    /// The highest log start recorded by a `LogStart` frame of the segment.
    pub log_start: Option<Seq>,
    /// The nonce of the segment header the index was written for.
    pub nonce: u64,
}

/// The frames of a segment as a seal index lists them: each frame's offset and
/// length, and which of them are internal. Kept by the writer for its active
/// segment (eight bytes a frame), and rebuilt by recovery for a segment it
/// seals.
#[derive(Debug, Default)]
pub(crate) struct IndexBuilder {
    frames: Vec<(u32, u32)>,
    internal: Vec<u32>,
    log_start: Option<Seq>,
    /// More frames than an index lists: the seal will carry none.
    overflow: bool,
}

impl IndexBuilder {
    /// Adds the next frame of the segment.
    pub(crate) fn push(&mut self, frame: FrameSpan) {
        if self.overflow || self.frames.len() == INDEX_FRAMES_MAX {
            self.overflow = true;
            self.frames = Vec::new();
            self.internal = Vec::new();
            return;
        }
        if !frame.is_record() {
            self.internal.push(self.frames.len() as u32);
        }
        self.frames.push((frame.offset, frame.len()));
    }

    /// Records a `LogStart` frame's value.
    pub(crate) fn log_start(&mut self, value: Seq) {
        self.log_start = self.log_start.max(Some(value));
    }

    /// How many frames it lists.
    pub(crate) fn len(&self) -> usize {
        self.frames.len()
    }

    /// Whether it holds more frames than an index lists (it lists none then).
    pub(crate) fn overflowed(&self) -> bool {
        self.overflow
    }

    /// The payload of an index checkpoint (`format::checkpoint`) listing
    /// every frame from position `from` on, after the checkpoints at
    /// `earlier`. (`hide_internal`: the negative control that lists every
    /// frame as a record.)
    pub(crate) fn checkpoint(&self, from: usize, earlier: &[u32], hide_internal: bool) -> Vec<u8> {
        let frames = self.frames.get(from..).unwrap_or_default();
        let k = if hide_internal {
            self.internal.len()
        } else {
            self.internal.partition_point(|&i| (i as usize) < from)
        };
        let internal: Vec<u32> = self
            .internal
            .get(k..)
            .unwrap_or_default()
            .iter()
            .map(|&i| i - from as u32)
            .collect();
        crate::format::checkpoint::encode(from as u32, frames, &internal, earlier, self.log_start)
    }

    /// The seal payload for the segment whose header carries `nonce`: its index,
    /// or nothing if the segment holds more than [`INDEX_FRAMES_MAX`] frames.
    pub(crate) fn encode(&self, nonce: u64) -> SealPayload {
        if self.overflow {
            return SealPayload::empty();
        }
        encode_lists(
            self.frames.iter().copied(),
            self.internal.len(),
            self.internal.iter().copied(),
            self.log_start,
            nonce,
        )
    }
}

/// The seal payload listing `frames`, whose `LogStart` frames record at most
/// `log_start`, for the segment whose header carries `nonce`: what an
/// [`IndexBuilder`] fed the same frames encodes, built straight from the list
/// (an open seals a crashed newest segment of hundreds of thousands of frames,
/// and a copy of the list first would cost it fresh memory).
pub(crate) fn index_of(frames: &FrameList, log_start: Option<Seq>, nonce: u64) -> SealPayload {
    if frames.len() > INDEX_FRAMES_MAX {
        return SealPayload::empty();
    }
    encode_lists(
        frames.iter().map(|f| (f.offset, f.len())),
        frames.internal().len(),
        frames.internal().iter().copied(),
        log_start,
        nonce,
    )
}

/// The bytes of an index: its counts, `log_start` and `nonce`, every frame's
/// offset and length, the positions of the `internal_count` internal frames,
/// then the trailer.
fn encode_lists(
    frames: impl ExactSizeIterator<Item = (u32, u32)>,
    internal_count: usize,
    internal: impl Iterator<Item = u32>,
    log_start: Option<Seq>,
    nonce: u64,
) -> SealPayload {
    let count = frames.len();
    let len = EMPTY_INDEX_LEN + FRAME_ENTRY_LEN * count + 4 * internal_count;
    let mut out = Vec::with_capacity(FRAME_HEADER_LEN + len);
    out.resize(FRAME_HEADER_LEN, 0);
    out.extend_from_slice(&(count as u32).to_le_bytes());
    out.extend_from_slice(&(internal_count as u32).to_le_bytes());
    out.extend_from_slice(&log_start.map_or(0, Seq::get).to_le_bytes());
    out.extend_from_slice(&nonce.to_le_bytes());
    for (offset, len) in frames {
        out.extend_from_slice(&offset.to_le_bytes());
        out.extend_from_slice(&len.to_le_bytes());
    }
    for i in internal {
        out.extend_from_slice(&i.to_le_bytes());
    }
    out.extend_from_slice(&(frame_len(len) as u32).to_le_bytes());
    debug_assert_eq!(out.len(), FRAME_HEADER_LEN + len);
    SealPayload(out)
}

/// A seal's payload (its index, or nothing) encoded behind room for the seal
/// frame's header, so that the frame is made where the index lies
/// ([`frame::frame_in_place`]): an index of megabytes is not copied to put a
/// header before it.
#[derive(Debug)]
pub(crate) struct SealPayload(Vec<u8>);

impl SealPayload {
    /// A seal without an index.
    fn empty() -> SealPayload {
        SealPayload(vec![0; FRAME_HEADER_LEN])
    }

    /// The payload's bytes (for the tests and the simulated-disk harness,
    /// which frame it as any payload).
    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn bytes(&self) -> &[u8] {
        self.0.get(FRAME_HEADER_LEN..).unwrap_or_default()
    }

    /// The length of the seal frame that carries it.
    pub(crate) fn frame_len(&self) -> usize {
        self.0.len()
    }

    /// The seal frame `header` carrying this payload, checksummed with
    /// `salt`.
    pub(crate) fn into_frame(mut self, header: &FrameHeader, salt: u32) -> Vec<u8> {
        frame::frame_in_place(&mut self.0, header, salt);
        self.0
    }
}

/// The seal frame's length as its trailer records it: the last four bytes of a
/// sealed segment file. `None` if `file` is too short to end with an index.
pub(crate) fn trailer(file: &[u8]) -> Option<usize> {
    let start = file.len().checked_sub(TRAILER_LEN)?;
    let bytes: [u8; 4] = file.get(start..)?.try_into().ok()?;
    let len = u32::from_le_bytes(bytes) as usize;
    (frame_len(EMPTY_INDEX_LEN)..=SEAL_LEN_MAX)
        .contains(&len)
        .then_some(len)
}

/// The longest seal frame: an index of [`INDEX_FRAMES_MAX`] frames, all of
/// them internal (an entry and a position each). A trailer naming a longer
/// one is not a seal's, and sizes no buffer.
const SEAL_LEN_MAX: usize = frame_len(EMPTY_INDEX_LEN + INDEX_FRAMES_MAX * (FRAME_ENTRY_LEN + 4));

fn u32_at(buf: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(buf.get(at..at + 4)?.try_into().ok()?))
}

/// Whether a frame may start at `next` after one that ends at `end`: right
/// after it (the same sync group), or on the next block boundary (a new one).
fn may_follow(end: u64, next: u64) -> bool {
    next == end || next == align_up(end)
}

/// Decodes a seal payload whose seal frame starts at `seal_at`. Checks that the
/// listed frames cover the segment from its first frame's block to the seal,
/// each at least a frame header long, with gaps only up to a block boundary.
pub(crate) fn decode(payload: &[u8], seal_at: u64) -> Result<SealIndex, Corruption> {
    let bad = |what| Corruption::BadSealIndex { what };
    let short = || bad("payload too short");
    let count = u32_at(payload, COUNT_AT).ok_or_else(short)? as usize;
    let internal = u32_at(payload, INTERNAL_AT).ok_or_else(short)? as usize;
    let u64_at = |at: usize| {
        payload
            .get(at..at + 8)
            .and_then(|b| b.try_into().ok())
            .map(u64::from_le_bytes)
            .ok_or_else(short)
    };
    let log_start = u64_at(LOG_START_AT)?;
    let nonce = u64_at(NONCE_AT)?;
    if count > INDEX_FRAMES_MAX || internal > count {
        return Err(bad("frame count out of range"));
    }
    let want = EMPTY_INDEX_LEN + FRAME_ENTRY_LEN * count + 4 * internal;
    if payload.len() != want {
        return Err(bad("payload length does not match the counts"));
    }
    let trailer = u32_at(payload, want - TRAILER_LEN).ok_or_else(short)?;
    if trailer as usize != frame_len(want) {
        return Err(bad("trailer does not match the seal's length"));
    }
    // One more for the seal frame, which a scan adds to the list.
    let mut frames = FrameList::with_capacity(count + 1);
    let mut end = FRAMES_AT as u64;
    for i in 0..count {
        let entry = FRAMES_LIST_AT + FRAME_ENTRY_LEN * i;
        let at = u32_at(payload, entry).ok_or_else(short)?;
        let len = u32_at(payload, entry + 4).ok_or_else(short)?;
        if i == 0 && u64::from(at) != FRAMES_AT as u64 {
            return Err(bad("first frame not at the block after the header"));
        }
        if !may_follow(end, u64::from(at)) {
            return Err(bad("a gap or an overlap between frames"));
        }
        if (len as usize) < FRAME_HEADER_LEN {
            return Err(bad("a frame shorter than a frame header"));
        }
        if len as usize > FRAME_LEN_MAX {
            return Err(bad("a frame longer than the format allows"));
        }
        end = u64::from(at) + u64::from(len);
        frames.push(FrameSpan::new(at, len, true));
    }
    let seal_ok = match frames.last() {
        Some(_) => may_follow(end, seal_at),
        None => seal_at == FRAMES_AT as u64,
    };
    if !seal_ok {
        return Err(bad("the seal is not where the frames end"));
    }
    let internal_at = FRAMES_LIST_AT + FRAME_ENTRY_LEN * count;
    let mut prev = None;
    for k in 0..internal {
        let i = u32_at(payload, internal_at + 4 * k).ok_or_else(short)? as usize;
        if prev.is_some_and(|p| i <= p) {
            return Err(bad("internal frames out of order"));
        }
        prev = Some(i);
        if !frames.set_internal(i) {
            return Err(bad("internal frame out of range"));
        }
    }
    Ok(SealIndex {
        frames,
        log_start: (log_start != 0).then(|| Seq::from(log_start)),
        nonce,
    })
}

#[cfg(test)]
#[expect(
    clippy::indexing_slicing,
    reason = "tests damage bytes at known offsets"
)]
mod tests {
    use super::*;

    /// Three frames from 4096: two of one sync group, then a new group on the
    /// next block; the seal on the block after.
    fn frames() -> Vec<FrameSpan> {
        [(4096, 140, true), (4236, 60, false), (8192, 64, true)]
            .map(|(offset, len, is_record)| FrameSpan::new(offset, len, is_record))
            .to_vec()
    }

    const SEAL_AT: u64 = 12288;

    fn encode(frames: &[FrameSpan], log_start: Option<Seq>) -> Vec<u8> {
        index_of(&frames.iter().copied().collect(), log_start, 77)
            .bytes()
            .to_vec()
    }

    #[test]
    fn an_index_built_from_a_list_is_the_writers() {
        // The writer's builder, fed frame by frame, and recovery's seal of a
        // crashed segment, built from its list, write the same bytes.
        let mut b = IndexBuilder::default();
        for f in frames() {
            b.push(f);
        }
        b.log_start(Seq::from(9));
        assert_eq!(b.encode(77).bytes(), encode(&frames(), Some(Seq::from(9))));
        assert_eq!(
            IndexBuilder::default().encode(77).bytes(),
            encode(&[], None)
        );
    }

    #[test]
    fn a_seal_made_in_place_is_the_frame_encoded_from_a_copy() {
        let header = FrameHeader {
            kind: frame::FrameKind::Seal,
            batch_end: true,
            seq: Seq::from(12),
            group: Seq::from(12),
            timestamp_us: 1_234_567,
        };
        let many: FrameList = (0..5_000u32)
            .map(|i| FrameSpan::new(4096 + 64 * i, 64, i % 7 != 0))
            .collect();
        for payload in [
            index_of(&frames().into_iter().collect(), Some(Seq::from(9)), 77),
            index_of(&many, None, 5),
            IndexBuilder::default().encode(77),
            SealPayload::empty(),
        ] {
            let mut copied = Vec::new();
            frame::encode(&mut copied, &header, payload.bytes(), 0xdead_beef);
            assert_eq!(payload.frame_len(), copied.len());
            assert_eq!(payload.into_frame(&header, 0xdead_beef), copied);
        }
    }

    #[test]
    fn an_index_round_trips() {
        let payload = encode(&frames(), Some(Seq::from(9)));
        let index = decode(&payload, SEAL_AT).expect("decodes");
        assert_eq!(index.frames.iter().collect::<Vec<_>>(), frames());
        assert_eq!(index.log_start, Some(Seq::from(9)));
        assert_eq!(index.nonce, 77);
        let mut file = vec![0u8; SEAL_AT as usize];
        file.extend_from_slice(&[0; FRAME_HEADER_LEN]);
        file.extend_from_slice(&payload);
        assert_eq!(trailer(&file), Some(frame_len(payload.len())));
    }

    #[test]
    fn an_index_that_does_not_cover_the_segment_is_refused() {
        let payload = encode(&frames(), None);
        // The seal starts where the last frame ends, or on the next block.
        assert!(decode(&payload, 8256).is_ok());
        assert!(decode(&payload, SEAL_AT).is_ok());
        assert!(decode(&payload, 8257).is_err());
        assert!(decode(&payload, 8255).is_err());
        let mut overlapping = frames();
        overlapping[1].offset = 4100;
        assert!(decode(&encode(&overlapping, None), SEAL_AT).is_err());
        let mut late = frames();
        late[0].offset = 4097;
        assert!(decode(&encode(&late, None), SEAL_AT).is_err());
        let mut gap = frames();
        gap[2].offset = 8200;
        assert!(decode(&encode(&gap, None), SEAL_AT).is_err());
        assert!(decode(&encode(&[], None), 4096).is_ok());
        assert!(decode(&encode(&[], None), 4097).is_err());
    }

    #[test]
    fn no_length_beyond_the_format_sizes_a_buffer() {
        // A frame listed longer than any frame can be, its seal where it
        // would end.
        let huge = [FrameSpan::new(4096, (FRAME_LEN_MAX + 1) as u32, true)];
        let seal_at = align_up(4096 + FRAME_LEN_MAX as u64 + 1);
        assert_eq!(
            decode(&encode(&huge, None), seal_at),
            Err(Corruption::BadSealIndex {
                what: "a frame longer than the format allows"
            })
        );
        // A trailer naming a seal longer than the longest index is no seal's.
        for len in [SEAL_LEN_MAX + 1, u32::MAX as usize] {
            let mut file = vec![0u8; 64];
            file.extend_from_slice(&(len as u32).to_le_bytes());
            assert_eq!(trailer(&file), None, "{len}");
        }
        let mut file = vec![0u8; 64];
        file.extend_from_slice(&(SEAL_LEN_MAX as u32).to_le_bytes());
        assert_eq!(trailer(&file), Some(SEAL_LEN_MAX));
    }

    #[test]
    fn every_truncation_and_byte_flip_is_an_error_or_a_consistent_index() {
        let payload = encode(&frames(), Some(Seq::from(3)));
        for cut in 0..payload.len() {
            assert!(decode(&payload[..cut], SEAL_AT).is_err(), "cut at {cut}");
        }
        for at in 0..payload.len() {
            let mut p = payload.clone();
            p[at] ^= 0x10;
            if let Ok(index) = decode(&p, SEAL_AT) {
                // Never a panic; a different but well-formed index ends where
                // the seal may follow.
                let end = index.frames.last().map_or(4096, |f| f.end());
                assert!(may_follow(end, SEAL_AT), "{end}");
            }
        }
    }
}
