//! The frame codec: one record (or internal marker) as it lies in a segment file.
//!
//! Pure functions over byte slices: no I/O, testable and fuzzable without a file
//! system. The byte layout is documented once, in `docs/FORMAT.md` ("Frames"); the
//! offsets below are derived from each other and must agree with it.

#![deny(clippy::indexing_slicing)]

use super::field;
use crate::error::Corruption;
use crate::format::segment::BLOCK;
use crate::format::seq::{SEQ_MAX, SegmentId, Seq};

/// Magic bytes that start every frame. Never all zero, so that a zero-filled tail
/// never looks like a frame.
pub(crate) const FRAME_MAGIC: [u8; 4] = [0xC5, b'W', b'F', b'R'];

const MAGIC_AT: usize = 0;
const CRC_AT: usize = MAGIC_AT + 4;
/// The frame checksum covers every byte from here to the end of the payload.
const CHECKED_FROM: usize = CRC_AT + 4;
const HEADER_CRC_AT: usize = CHECKED_FROM;
/// The header checksum covers every byte from here to the end of the fixed
/// header: a candidate frame is refused in constant time, whatever length it
/// claims (recovery's look past damage stays linear in the bytes it scans).
const HEADER_CHECKED_FROM: usize = HEADER_CRC_AT + 4;
const LEN_AT: usize = HEADER_CHECKED_FROM;
const KIND_AT: usize = LEN_AT + 4;
const FLAGS_AT: usize = KIND_AT + 1;
const EXT_LEN_AT: usize = FLAGS_AT + 1;
const RESERVED_AT: usize = EXT_LEN_AT + 2;
const SEQ_AT: usize = RESERVED_AT + 4;
const GROUP_AT: usize = SEQ_AT + 8;
const TIME_AT: usize = GROUP_AT + 8;
/// Length of the fixed frame header.
pub(crate) const FRAME_HEADER_LEN: usize = TIME_AT + 8;

/// Largest payload the format allows, whatever the options say. Checked on encode
/// and on decode, before anything is sliced.
pub(crate) const RECORD_BYTES_LIMIT: usize = 1 << 30;

/// The longest frame the format allows: a header, the longest optional-field
/// area (its length is a u16) and the longest payload. A seal index or an
/// index checkpoint that lists a longer frame is damage, found before any
/// buffer is sized by it.
pub(crate) const FRAME_LEN_MAX: usize = FRAME_HEADER_LEN + u16::MAX as usize + RECORD_BYTES_LIMIT;

/// The seed of a segment's frame checksums, from its secret nonce and its
/// first sequence number: the CRC-32 of both (little-endian u64s). A frame
/// checks only in the segment it was written for, so a stale frame (old disk
/// blocks in a file's unwritten tail) never passes as a frame of another
/// segment; and since the nonce is never in a payload, a producer cannot forge
/// a frame that checks (docs/FORMAT.md, "What the checksum covers").
pub(crate) fn salt(segment: SegmentId, nonce: u64) -> u32 {
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&nonce.to_le_bytes());
    hasher.update(&segment.0.to_le_bytes());
    hasher.finalize()
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
    /// A record carried forward from an older segment (`format::relocated`):
    /// the user's bytes, its own sequence number in the optional field
    /// `origin_seq`, and its delivery state in the field `carried`. Counted
    /// among the internal frames (its frame's number is not the record's).
    Relocated,
    /// Internal: what producers said about the records of its write batch
    /// (ordering keys, not-before times, deduplication ids), so that recovery
    /// learns it without reading the records (`format::fields`). Must be
    /// understood: skipping it would break per-key order and delays.
    Fields,
    /// A kind this build may skip (kinds 0x80..=0xFF): delivery state, such as
    /// [`ACKS`], or a kind from a later format.
    Skippable(u8),
}

/// The kind of an acks frame: records acknowledged (`format::acks`).
pub(crate) const ACKS: FrameKind = FrameKind::Skippable(0x80);

/// The kind a frame header claims, unchecked: to choose which frames to read
/// whole, never to trust one ([`decode`] checks it).
pub(crate) fn kind_of(header: &[u8]) -> Option<FrameKind> {
    FrameKind::from_byte(*header.get(KIND_AT)?)
}

impl FrameKind {
    fn to_byte(self) -> u8 {
        match self {
            FrameKind::Record => 1,
            FrameKind::LogStart => 2,
            FrameKind::Seal => 3,
            FrameKind::Relocated => 4,
            FrameKind::Fields => 5,
            FrameKind::Skippable(b) => b,
        }
    }

    fn from_byte(byte: u8) -> Option<FrameKind> {
        match byte {
            1 => Some(FrameKind::Record),
            2 => Some(FrameKind::LogStart),
            3 => Some(FrameKind::Seal),
            4 => Some(FrameKind::Relocated),
            5 => Some(FrameKind::Fields),
            0x80..=0xFF => Some(FrameKind::Skippable(byte)),
            _ => None,
        }
    }
}

/// Where one frame lies in its segment, and whether it holds a record: what
/// recovery, the seal index and the state table know of a frame without
/// reading it.
///
/// Eight bytes: the writer keeps one for each frame it has written but not
/// yet handed to the state table, and recovery reads and writes lists of
/// them as [`FrameList`](crate::format::frames::FrameList)s, about four
/// bytes a frame (an open lists every frame of every segment it reads, and
/// in a new process each byte is fresh memory it faults in). A frame is
/// shorter than 2 GiB (its payload is at most [`RECORD_BYTES_LIMIT`], and
/// lists refuse longer lengths), so the length's top bit says whether it is
/// internal.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct FrameSpan {
    /// Byte offset of the frame in its segment file.
    pub offset: u32,
    /// Encoded length of the frame, header included, and [`INTERNAL`] for an
    /// internal frame.
    len_kind: u32,
}

/// The bit of [`FrameSpan`]'s length word that marks an internal frame.
const INTERNAL: u32 = 1 << 31;

impl FrameSpan {
    /// The frame at `offset`, `len` bytes long (below 2 GiB), a record or an
    /// internal frame.
    pub(crate) fn new(offset: u32, len: u32, is_record: bool) -> FrameSpan {
        debug_assert!(len < INTERNAL, "a frame of {len} bytes");
        FrameSpan {
            offset,
            len_kind: (len & !INTERNAL) | if is_record { 0 } else { INTERNAL },
        }
    }

    /// Encoded length of the frame, header included.
    pub(crate) fn len(self) -> u32 {
        self.len_kind & !INTERNAL
    }

    /// A record (handed out to relays), not an internal frame.
    pub(crate) fn is_record(self) -> bool {
        self.len_kind & INTERNAL == 0
    }

    /// The offset just past the frame.
    pub(crate) fn end(self) -> u64 {
        u64::from(self.offset) + u64::from(self.len())
    }
}

impl std::fmt::Debug for FrameSpan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FrameSpan")
            .field("offset", &self.offset)
            .field("len", &self.len())
            .field("is_record", &self.is_record())
            .finish()
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
pub(crate) fn encode(out: &mut Vec<u8>, header: &FrameHeader, payload: &[u8], salt: u32) {
    encode_with(out, header, &[], payload, salt);
}

/// Appends one encoded frame with the optional-field area `ext` (already
/// encoded) to `out`, checksummed with `salt`.
#[expect(
    clippy::indexing_slicing,
    reason = "encodes into the writer's own buffer, whose layout it has just written"
)]
pub(crate) fn encode_with(
    out: &mut Vec<u8>,
    header: &FrameHeader,
    ext: &[u8],
    payload: &[u8],
    salt: u32,
) {
    assert!(
        payload.len() <= RECORD_BYTES_LIMIT,
        "payload of {} bytes passed the size check",
        payload.len()
    );
    let ext_len = u16::try_from(ext.len()).expect("optional fields fit their u16 length");
    let start = out.len();
    push_header(out, header, ext_len, payload.len());
    debug_assert_eq!(out.len() - start, FRAME_HEADER_LEN);
    let header_crc = checksum(salt, &out[start + HEADER_CHECKED_FROM..]);
    out[start + HEADER_CRC_AT..start + HEADER_CHECKED_FROM]
        .copy_from_slice(&header_crc.to_le_bytes());
    out.extend_from_slice(ext);
    out.extend_from_slice(payload);
    let crc = checksum(salt, &out[start + CHECKED_FROM..]);
    out[start + CRC_AT..start + CHECKED_FROM].copy_from_slice(&crc.to_le_bytes());
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

/// Makes `frame` one frame without optional fields: `frame` holds
/// [`FRAME_HEADER_LEN`] bytes of room, then the payload, which is checksummed
/// with `salt` where it lies, not copied (a seal's index of megabytes is
/// encoded behind such room).
#[expect(
    clippy::indexing_slicing,
    reason = "`frame` is checked to hold a whole header; the offsets are the header's"
)]
pub(crate) fn frame_in_place(frame: &mut [u8], header: &FrameHeader, salt: u32) {
    assert!(
        frame.len() >= FRAME_HEADER_LEN && frame.len() - FRAME_HEADER_LEN <= RECORD_BYTES_LIMIT,
        "a frame of {} bytes in place",
        frame.len()
    );
    let mut fixed = Vec::with_capacity(FRAME_HEADER_LEN);
    push_header(&mut fixed, header, 0, frame.len() - FRAME_HEADER_LEN);
    frame[..FRAME_HEADER_LEN].copy_from_slice(&fixed);
    let header_crc = checksum(salt, &frame[HEADER_CHECKED_FROM..FRAME_HEADER_LEN]);
    frame[HEADER_CRC_AT..HEADER_CHECKED_FROM].copy_from_slice(&header_crc.to_le_bytes());
    let crc = checksum(salt, &frame[CHECKED_FROM..]);
    frame[CRC_AT..CHECKED_FROM].copy_from_slice(&crc.to_le_bytes());
}

/// Appends a frame's fixed header to `out`, its two checksums zero (filled
/// once the bytes they cover are in place).
#[inline(always)]
fn push_header(out: &mut Vec<u8>, header: &FrameHeader, ext_len: u16, payload_len: usize) {
    let flags = if header.batch_end { FLAG_BATCH_END } else { 0 };
    out.extend_from_slice(&FRAME_MAGIC);
    out.extend_from_slice(&[0; 8]); // the two checksums
    out.extend_from_slice(&(payload_len as u32).to_le_bytes());
    out.push(header.kind.to_byte());
    out.push(flags);
    out.extend_from_slice(&ext_len.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes()); // reserved
    out.extend_from_slice(&header.seq.get().to_le_bytes());
    out.extend_from_slice(&header.group.get().to_le_bytes());
    out.extend_from_slice(&header.timestamp_us.to_le_bytes());
}

/// The length of the frame whose header starts `header`, if the header is
/// whole, its magic right and its own checksum (keyed with `salt`) holds: what a
/// reader must have of the file to [`decode`] it. `None` otherwise, and then the
/// header alone decides the error.
pub(crate) fn claimed_len(header: &[u8], salt: u32) -> Option<usize> {
    let header: &[u8; FRAME_HEADER_LEN] = header.get(..FRAME_HEADER_LEN)?.try_into().ok()?;
    if field::<4>(header, MAGIC_AT) != FRAME_MAGIC {
        return None;
    }
    let (_, header_checked) = header.split_at(HEADER_CHECKED_FROM);
    if checksum(salt, header_checked) != u32::from_le_bytes(field(header, HEADER_CRC_AT)) {
        return None;
    }
    let payload_len = u32::from_le_bytes(field(header, LEN_AT)) as usize;
    let ext_len = u16::from_le_bytes(field(header, EXT_LEN_AT)) as usize;
    (payload_len <= RECORD_BYTES_LIMIT).then_some(FRAME_HEADER_LEN + ext_len + payload_len)
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
    // The header first, in constant time: nothing it claims is believed before.
    let stored_header_crc = u32::from_le_bytes(field(header, HEADER_CRC_AT));
    let (_, header_checked) = header.split_at(HEADER_CHECKED_FROM);
    let computed = checksum(salt, header_checked);
    if computed != stored_header_crc {
        return Err(Corruption::ChecksumMismatch {
            stored: stored_header_crc,
            computed,
        });
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
    let header = checked_header(header)?;
    let (_, rest) = whole.split_at(FRAME_HEADER_LEN);
    let (ext, payload) = rest.split_at(ext_len);
    // Optional fields belong to records; the must-understand ones are checked
    // here, so that no reader hands out a record whose promise it ignores.
    if !ext.is_empty() {
        if !matches!(header.kind, FrameKind::Record | FrameKind::Relocated) {
            return Err(Corruption::Unsupported {
                what: "optional field area of length",
                value: ext_len as u64,
            });
        }
        super::ext::decode(ext)?;
    }
    Ok(Frame {
        header,
        ext,
        payload,
        len,
    })
}

/// The fields of a frame header whose checksum matched: from here on, anything
/// unexpected was written by a format this build does not know, never torn.
fn checked_header(header: &[u8; FRAME_HEADER_LEN]) -> Result<FrameHeader, Corruption> {
    let [kind_byte] = field(header, KIND_AT);
    let Some(kind) = FrameKind::from_byte(kind_byte) else {
        return Err(Corruption::Unsupported {
            what: crate::error::newer::FRAME_KIND,
            value: u64::from(kind_byte),
        });
    };
    let [flags] = field(header, FLAGS_AT);
    if flags & !KNOWN_FLAGS != 0 {
        return Err(Corruption::Unsupported {
            what: crate::error::newer::FRAME_FLAGS,
            value: u64::from(flags),
        });
    }
    let reserved = u32::from_le_bytes(field(header, RESERVED_AT));
    if reserved != 0 {
        return Err(Corruption::Unsupported {
            what: crate::error::newer::FRAME_RESERVED,
            value: u64::from(reserved),
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

/// The first valid frame that starts on a block boundary at or after `from`,
/// with its offset. Used by recovery to look past damage for a later sync
/// group, which always starts on a fresh block (docs/FORMAT.md, "Blocks"). A
/// candidate costs its 48-byte header unless that header's own checksum holds,
/// so the search is linear in the bytes it passes, whatever they hold.
pub(crate) fn find_frame_on_block(
    buf: &[u8],
    from: usize,
    salt: u32,
) -> Option<(usize, Frame<'_>)> {
    let mut at = from.next_multiple_of(BLOCK);
    while at < buf.len() {
        let rest = buf.get(at..)?;
        if rest.starts_with(&FRAME_MAGIC)
            && let Ok(frame) = decode(rest, salt)
        {
            return Some((at, frame));
        }
        at += BLOCK;
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
    fn a_span_keeps_its_length_and_kind_apart_up_to_the_longest_frame() {
        for len in [FRAME_HEADER_LEN as u32, 4096, FRAME_LEN_MAX as u32] {
            for is_record in [true, false] {
                let span = FrameSpan::new(u32::MAX - 7, len, is_record);
                assert_eq!(span.offset, u32::MAX - 7);
                assert_eq!(span.len(), len);
                assert_eq!(span.is_record(), is_record);
                assert_eq!(span.end(), u64::from(u32::MAX - 7) + u64::from(len));
            }
        }
        assert_eq!(std::mem::size_of::<FrameSpan>(), 8);
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
        // Caught by the header's own checksum first...
        assert!(matches!(
            decode(&buf, SALT),
            Err(Corruption::ChecksumMismatch { .. })
        ));
        // ... and by its limit when that checksum is made to hold.
        let header_crc = checksum(SALT, &buf[HEADER_CHECKED_FROM..FRAME_HEADER_LEN]);
        buf[HEADER_CRC_AT..HEADER_CHECKED_FROM].copy_from_slice(&header_crc.to_le_bytes());
        assert!(matches!(
            decode(&buf, SALT),
            Err(Corruption::LengthOutOfRange { .. })
        ));
    }

    #[test]
    fn a_frame_checks_only_in_its_own_segment() {
        let mut buf = Vec::new();
        encode(&mut buf, &header(5), b"stale", salt(SegmentId(1), 9));
        assert!(decode(&buf, salt(SegmentId(1), 9)).is_ok());
        for other in [salt(SegmentId(7), 9), salt(SegmentId(1), 10)] {
            assert!(matches!(
                decode(&buf, other),
                Err(Corruption::ChecksumMismatch { .. })
            ));
        }
    }

    #[test]
    fn frames_are_looked_for_on_block_boundaries_only() {
        let mut buf = vec![0u8; 10];
        // A frame off a boundary is not a candidate, even a valid one.
        encode(&mut buf, &header(12), b"off", SALT);
        buf.resize(BLOCK, 0);
        buf.extend_from_slice(&FRAME_MAGIC);
        buf.resize(2 * BLOCK, 0xFF);
        encode(&mut buf, &header(13), b"real", SALT);
        let (found_at, frame) = find_frame_on_block(&buf, 0, SALT).expect("frame found");
        assert_eq!(found_at, 2 * BLOCK);
        assert_eq!(frame.payload, b"real");
        assert!(find_frame_on_block(&buf, 2 * BLOCK + 1, SALT).is_none());
    }

    #[test]
    fn a_header_that_fails_its_own_checksum_is_refused_before_its_length() {
        let mut buf = Vec::new();
        encode(&mut buf, &header(3), &[9; 100], SALT);
        // A length pointing far past the buffer, with the header checksum
        // broken by it: refused as a checksum error, not a truncation.
        buf[LEN_AT..LEN_AT + 4].copy_from_slice(&(1u32 << 29).to_le_bytes());
        assert!(matches!(
            decode(&buf, SALT),
            Err(Corruption::ChecksumMismatch { .. })
        ));
    }
}
