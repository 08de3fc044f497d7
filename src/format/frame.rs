//! The frame codec: one record (or internal marker) as it lies in a segment file.
//!
//! Pure functions over byte slices: no I/O, testable and fuzzable without a file
//! system. The byte layout is documented once, in `docs/FORMAT.md` ("Frames"); the
//! offsets below are derived from each other and must agree with it.

#![deny(clippy::indexing_slicing)]

use super::field;
use crate::error::Corruption;
use crate::format::seq::{SEQ_MAX, SegmentId, Seq};

/// Magic bytes that start every frame. Never all zero, so that a zero-filled tail
/// never looks like a frame.
pub(crate) const FRAME_MAGIC: [u8; 4] = [0xC5, b'W', b'F', b'R'];

const MAGIC_AT: usize = 0;
const CRC_AT: usize = MAGIC_AT + 4;
/// The checksum covers every byte from here to the end of the payload.
const CHECKED_FROM: usize = CRC_AT + 4;
const LEN_AT: usize = CHECKED_FROM;
const KIND_AT: usize = LEN_AT + 4;
const FLAGS_AT: usize = KIND_AT + 1;
const EXT_LEN_AT: usize = FLAGS_AT + 1;
const SEQ_AT: usize = EXT_LEN_AT + 2;
const GROUP_AT: usize = SEQ_AT + 8;
const TIME_AT: usize = GROUP_AT + 8;
/// Length of the fixed frame header.
pub(crate) const FRAME_HEADER_LEN: usize = TIME_AT + 8;

/// Largest payload the format allows, whatever the options say. Checked on encode
/// and on decode, before anything is sliced.
pub(crate) const RECORD_BYTES_LIMIT: usize = 1 << 30;

/// The seed of a segment's frame checksums: its first sequence number folded to
/// 32 bits. A frame checks only in the segment it was written for, so a stale
/// frame (old disk blocks in a file's unwritten tail) never passes as a frame of
/// another segment.
pub(crate) fn salt(segment: SegmentId) -> u32 {
    (segment.0 ^ (segment.0 >> 32)) as u32
}

fn checksum(salt: u32, bytes: &[u8]) -> u32 {
    let mut hasher = crc32fast::Hasher::new_with_initial(salt);
    hasher.update(bytes);
    hasher.finalize()
}

/// Flag: this frame is the last one of a write batch.
pub(crate) const FLAG_BATCH_END: u8 = 0x01;
const KNOWN_FLAGS: u8 = FLAG_BATCH_END;

/// What a frame holds.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum FrameKind {
    /// A user record: the payload is the user's bytes.
    Record,
    /// Internal: the payload is a little-endian u64, the first sequence number of
    /// the oldest segment still in the log. Written before segments are deleted.
    LogStart,
    /// Internal: the last frame of every segment but the newest, written once the
    /// next segment exists. Its payload is the segment's seal index
    /// (`format::seal`), or empty for a segment too large to index. It lets
    /// recovery tell a lost newest segment from one that was never created.
    Seal,
    /// A kind from a later format that this build may skip (kinds 0x80..=0xFF).
    Skippable(u8),
}

impl FrameKind {
    fn to_byte(self) -> u8 {
        match self {
            FrameKind::Record => 1,
            FrameKind::LogStart => 2,
            FrameKind::Seal => 3,
            FrameKind::Skippable(b) => b,
        }
    }

    fn from_byte(byte: u8) -> Option<FrameKind> {
        match byte {
            1 => Some(FrameKind::Record),
            2 => Some(FrameKind::LogStart),
            3 => Some(FrameKind::Seal),
            0x80..=0xFF => Some(FrameKind::Skippable(byte)),
            _ => None,
        }
    }
}

/// Where one frame lies in its segment, and whether it holds a record: what
/// recovery, the seal index and the state table know of a frame without
/// reading it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) struct FrameSpan {
    /// Byte offset of the frame in its segment file.
    pub offset: u32,
    /// Encoded length of the frame, header included.
    pub len: u32,
    /// A record (handed out to relays), not an internal frame.
    pub is_record: bool,
}

impl FrameSpan {
    /// The offset just past the frame.
    pub(crate) fn end(self) -> u64 {
        u64::from(self.offset) + u64::from(self.len)
    }
}

/// The fields of a frame header that the writer chooses.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) struct FrameHeader {
    pub kind: FrameKind,
    /// Set on the last frame of a write batch.
    pub batch_end: bool,
    pub seq: Seq,
    /// The sequence number of the first frame written since the last fsync of this
    /// segment: the frame's *sync group*. See the torn-tail rule in `docs/FORMAT.md`.
    pub group: Seq,
    /// Wall clock at encode time, microseconds since the Unix epoch.
    pub timestamp_us: u64,
}

/// A frame decoded from a byte slice, borrowing its payload.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) struct Frame<'a> {
    pub header: FrameHeader,
    /// Optional per-record fields (empty in format version 1).
    pub ext: &'a [u8],
    pub payload: &'a [u8],
    /// Total encoded length of the frame in bytes.
    pub len: usize,
}

/// Encoded length of a frame with this payload length.
pub(crate) const fn frame_len(payload_len: usize) -> usize {
    FRAME_HEADER_LEN + payload_len
}

/// Appends one encoded frame to `out`, checksummed with `salt`.
#[expect(
    clippy::indexing_slicing,
    reason = "encodes into the writer's own buffer, whose layout it has just written"
)]
pub(crate) fn encode(out: &mut Vec<u8>, header: &FrameHeader, payload: &[u8], salt: u32) {
    assert!(
        payload.len() <= RECORD_BYTES_LIMIT,
        "payload of {} bytes passed the size check",
        payload.len()
    );
    let start = out.len();
    let flags = if header.batch_end { FLAG_BATCH_END } else { 0 };
    out.extend_from_slice(&FRAME_MAGIC);
    out.extend_from_slice(&[0; 4]); // checksum, filled below
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.push(header.kind.to_byte());
    out.push(flags);
    out.extend_from_slice(&0u16.to_le_bytes()); // no optional fields
    out.extend_from_slice(&header.seq.get().to_le_bytes());
    out.extend_from_slice(&header.group.get().to_le_bytes());
    out.extend_from_slice(&header.timestamp_us.to_le_bytes());
    debug_assert_eq!(out.len() - start, FRAME_HEADER_LEN);
    out.extend_from_slice(payload);
    let crc = checksum(salt, &out[start + CHECKED_FROM..]);
    out[start + CRC_AT..start + CRC_AT + 4].copy_from_slice(&crc.to_le_bytes());
    if cfg!(debug_assertions) {
        // Check a frame right after it is encoded, as it will be checked when read.
        match decode(&out[start..], salt) {
            Ok(frame) => {
                debug_assert_eq!(frame.header, *header);
                debug_assert_eq!(frame.payload, payload);
            }
            Err(e) => panic!("encoded frame does not decode: {e:?}"),
        }
    }
}

/// Decodes the frame at the start of `buf`, checking it against `salt`. `buf` may
/// extend past the frame.
///
/// Never panics and never allocates, whatever `buf` holds. Errors for which
/// [`is_checksummed`] holds come from a frame whose checksum matched.
pub(crate) fn decode(buf: &[u8], salt: u32) -> Result<Frame<'_>, Corruption> {
    let Some(Ok(header)) = buf
        .get(..FRAME_HEADER_LEN)
        .map(<&[u8; FRAME_HEADER_LEN]>::try_from)
    else {
        if buf.get(..4).is_some_and(|m| m != FRAME_MAGIC) {
            return Err(Corruption::BadFrameMagic);
        }
        return Err(Corruption::Truncated {
            needed: FRAME_HEADER_LEN as u64,
            available: buf.len() as u64,
        });
    };
    // From here every header index is a constant within the fixed-size header.
    if field::<4>(header, MAGIC_AT) != FRAME_MAGIC {
        return Err(Corruption::BadFrameMagic);
    }
    let stored_crc = u32::from_le_bytes(field(header, CRC_AT));
    let payload_len = u32::from_le_bytes(field(header, LEN_AT)) as usize;
    if payload_len > RECORD_BYTES_LIMIT {
        return Err(Corruption::LengthOutOfRange {
            len: payload_len as u64,
            max: RECORD_BYTES_LIMIT as u64,
        });
    }
    let ext_len = u16::from_le_bytes(field(header, EXT_LEN_AT)) as usize;
    let len = FRAME_HEADER_LEN + ext_len + payload_len;
    let Some(whole) = buf.get(..len) else {
        return Err(Corruption::Truncated {
            needed: len as u64,
            available: buf.len() as u64,
        });
    };
    let (_, checked) = whole.split_at(CHECKED_FROM);
    let computed = checksum(salt, checked);
    if computed != stored_crc {
        return Err(Corruption::ChecksumMismatch {
            stored: stored_crc,
            computed,
        });
    }
    let header = checked_header(header, ext_len)?;
    let (_, rest) = whole.split_at(FRAME_HEADER_LEN);
    let (ext, payload) = rest.split_at(ext_len);
    Ok(Frame {
        header,
        ext,
        payload,
        len,
    })
}

/// The fields of a frame header whose checksum matched: from here on, anything
/// unexpected was written by a format this build does not know, never torn.
fn checked_header(
    header: &[u8; FRAME_HEADER_LEN],
    ext_len: usize,
) -> Result<FrameHeader, Corruption> {
    let [kind_byte] = field(header, KIND_AT);
    let Some(kind) = FrameKind::from_byte(kind_byte) else {
        return Err(Corruption::Unsupported {
            what: "frame kind",
            value: u64::from(kind_byte),
        });
    };
    let [flags] = field(header, FLAGS_AT);
    if flags & !KNOWN_FLAGS != 0 {
        return Err(Corruption::Unsupported {
            what: "frame flags",
            value: u64::from(flags),
        });
    }
    if ext_len != 0 && kind != FrameKind::Skippable(kind_byte) {
        return Err(Corruption::Unsupported {
            what: "optional field area of length",
            value: ext_len as u64,
        });
    }
    let seq = Seq::from(u64::from_le_bytes(field(header, SEQ_AT)));
    let group = Seq::from(u64::from_le_bytes(field(header, GROUP_AT)));
    if seq.get() >= SEQ_MAX || seq.get() == 0 {
        return Err(Corruption::Unsupported {
            what: "sequence number",
            value: seq.get(),
        });
    }
    if group > seq || group.get() == 0 {
        return Err(Corruption::BadGroup {
            expected: seq,
            found: group,
        });
    }
    Ok(FrameHeader {
        kind,
        batch_end: flags & FLAG_BATCH_END != 0,
        seq,
        group,
        timestamp_us: u64::from_le_bytes(field(header, TIME_AT)),
    })
}

/// Whether a decode error was found in a frame whose checksum matched: written by
/// a writer, not torn, so never to be truncated as a torn tail.
pub(crate) fn is_checksummed(error: &Corruption) -> bool {
    matches!(
        error,
        Corruption::Unsupported { .. } | Corruption::BadGroup { .. }
    )
}

/// Reads the timestamp of a frame header without checking it (for statistics).
pub(crate) fn timestamp_us(header: &[u8]) -> Option<u64> {
    let bytes = header.get(TIME_AT..TIME_AT + 8)?;
    Some(u64::from_le_bytes(bytes.try_into().ok()?))
}

/// Offset of the first position in `from..until` where a valid frame decodes,
/// with that frame (which may extend past `until`). Used by recovery to look
/// past damage.
pub(crate) fn find_valid_frame(
    buf: &[u8],
    from: usize,
    until: usize,
    salt: u32,
) -> Option<(usize, Frame<'_>)> {
    let until = until.min(buf.len());
    let mut at = from;
    while at < until && at + FRAME_HEADER_LEN <= buf.len() {
        // The magic's first byte, then the rest of it.
        at += buf
            .get(at..until)?
            .iter()
            .position(|&b| b == FRAME_MAGIC[0])?;
        let rest = buf.get(at..)?;
        if rest.starts_with(&FRAME_MAGIC)
            && let Ok(frame) = decode(rest, salt)
        {
            return Some((at, frame));
        }
        at += 1;
    }
    None
}

#[cfg(test)]
#[expect(
    clippy::indexing_slicing,
    reason = "tests damage bytes at known offsets"
)]
mod tests {
    use super::*;

    const SALT: u32 = 0x5EED;

    fn header(seq: u64) -> FrameHeader {
        FrameHeader {
            kind: FrameKind::Record,
            batch_end: seq.is_multiple_of(2),
            seq: Seq::from(seq),
            group: Seq::from(1 + (seq - 1) / 4 * 4),
            timestamp_us: 1_700_000_000_000_000 + seq,
        }
    }

    #[test]
    fn frames_round_trip_including_empty_payloads() {
        let mut buf = Vec::new();
        let payloads: [&[u8]; 3] = [b"", b"hello", &[0xAB; 1000]];
        for (i, p) in payloads.iter().enumerate() {
            encode(&mut buf, &header(4 + i as u64), p, SALT);
        }
        let mut at = 0;
        for (i, p) in payloads.iter().enumerate() {
            let frame = decode(&buf[at..], SALT).expect("valid frame");
            assert_eq!(frame.header, header(4 + i as u64));
            assert_eq!(frame.payload, *p);
            assert_eq!(frame.len, frame_len(p.len()));
            at += frame.len;
        }
        assert_eq!(at, buf.len());
    }

    #[test]
    fn every_single_bit_flip_is_detected() {
        let mut buf = Vec::new();
        encode(&mut buf, &header(7), b"payload bytes", SALT);
        for bit in 0..buf.len() * 8 {
            let mut damaged = buf.clone();
            damaged[bit / 8] ^= 1 << (bit % 8);
            assert!(
                decode(&damaged, SALT).is_err(),
                "flip of bit {bit} went unnoticed"
            );
        }
    }

    #[test]
    fn a_flipped_length_bit_is_an_error_not_a_shorter_frame() {
        let mut buf = Vec::new();
        encode(&mut buf, &header(8), &[1; 64], SALT);
        encode(&mut buf, &header(9), &[2; 64], SALT);
        buf[LEN_AT] ^= 0x10; // 64 -> 80: the frame now swallows the next one's header
        assert!(matches!(
            decode(&buf, SALT),
            Err(Corruption::ChecksumMismatch { .. })
        ));
    }

    #[test]
    fn truncated_frames_report_what_they_need() {
        let mut buf = Vec::new();
        encode(&mut buf, &header(10), &[3; 100], SALT);
        for cut in [0, 3, 10, FRAME_HEADER_LEN, buf.len() - 1] {
            match decode(&buf[..cut], SALT) {
                Err(Corruption::Truncated { available, .. }) => {
                    assert_eq!(available, cut as u64)
                }
                other => panic!("cut at {cut}: {other:?}"),
            }
        }
    }

    #[test]
    fn zeros_and_huge_lengths_are_refused_before_slicing() {
        assert_eq!(decode(&[0; 64], SALT), Err(Corruption::BadFrameMagic));
        let mut buf = Vec::new();
        encode(&mut buf, &header(2), b"x", SALT);
        buf[LEN_AT..LEN_AT + 4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(
            decode(&buf, SALT),
            Err(Corruption::LengthOutOfRange { .. })
        ));
    }

    #[test]
    fn a_frame_checks_only_in_its_own_segment() {
        let mut buf = Vec::new();
        encode(&mut buf, &header(5), b"stale", salt(SegmentId(1)));
        assert!(decode(&buf, salt(SegmentId(1))).is_ok());
        assert!(matches!(
            decode(&buf, salt(SegmentId(7))),
            Err(Corruption::ChecksumMismatch { .. })
        ));
    }

    #[test]
    fn find_valid_frame_skips_garbage_and_false_magic() {
        let mut buf = vec![0u8; 10];
        buf.extend_from_slice(&FRAME_MAGIC);
        buf.extend_from_slice(&[0xFF; 50]);
        let at = buf.len();
        encode(&mut buf, &header(12), b"real", SALT);
        let (found_at, frame) = find_valid_frame(&buf, 0, buf.len(), SALT).expect("frame found");
        assert_eq!(found_at, at);
        assert_eq!(frame.payload, b"real");
        assert!(find_valid_frame(&buf, at + 1, buf.len(), SALT).is_none());
        // Only starts before `until` count; the frame found may run past it.
        assert!(find_valid_frame(&buf, 0, at, SALT).is_none());
        let (found_at, _) =
            find_valid_frame(&buf, 0, at + 1, SALT).expect("frame starts before until");
        assert_eq!(found_at, at);
    }
}
