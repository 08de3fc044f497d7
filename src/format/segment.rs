//! The segment header codec: the first bytes of every segment file.
//!
//! Pure functions over byte slices. The layout is documented once, in
//! `docs/FORMAT.md` ("Segment header"); the offsets below chain from each other.

#![deny(clippy::indexing_slicing)]

use super::field;
use crate::error::Corruption;
use crate::format::seq::Seq;

/// Magic bytes at the start of every segment file.
pub(crate) const SEGMENT_MAGIC: [u8; 8] = *b"SEGWAL\x1a\n";
/// The format version this build writes, and the only one it reads.
pub(crate) const FORMAT_VERSION: u16 = 1;

const MAGIC_AT: usize = 0;
const VERSION_AT: usize = MAGIC_AT + 8;
const HEADER_LEN_AT: usize = VERSION_AT + 2;
const FLAGS_AT: usize = HEADER_LEN_AT + 2;
const FIRST_SEQ_AT: usize = FLAGS_AT + 4;
const PREV_SEQ_AT: usize = FIRST_SEQ_AT + 8;
const LOG_START_AT: usize = PREV_SEQ_AT + 8;
const CREATED_AT: usize = LOG_START_AT + 8;
const NONCE_AT: usize = CREATED_AT + 8;
const RESERVED_AT: usize = NONCE_AT + 8;
const CRC_AT: usize = 60;
/// Length of the segment header; frames start right after it.
pub(crate) const SEGMENT_HEADER_LEN: usize = CRC_AT + 4;

const _: () = assert!(RESERVED_AT <= CRC_AT);

/// The decoded segment header.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) struct SegmentHeader {
    /// Sequence number of the segment's first frame; also its file name.
    pub first_seq: Seq,
    /// Sequence number of the last frame of the segment before this one when this
    /// one was created (0 for the very first segment). Recovery checks the chain.
    pub prev_seq: Seq,
    /// First sequence number of the oldest segment in the log when this one was
    /// created.
    pub log_start: Seq,
    /// Wall clock at creation, milliseconds since the Unix epoch.
    pub created_unix_ms: u64,
    /// A random number drawn when the segment was created, repeated in its seal
    /// index: an index that names it was written by segwal for this segment,
    /// not appended by a producer inside a record's payload. 0 in a segment
    /// whose index must not be trusted.
    pub nonce: u64,
}

impl SegmentHeader {
    /// Encodes the header.
    pub(crate) fn encode(&self) -> [u8; SEGMENT_HEADER_LEN] {
        let mut out = [0u8; SEGMENT_HEADER_LEN];
        out[MAGIC_AT..VERSION_AT].copy_from_slice(&SEGMENT_MAGIC);
        out[VERSION_AT..HEADER_LEN_AT].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        out[HEADER_LEN_AT..FLAGS_AT].copy_from_slice(&(SEGMENT_HEADER_LEN as u16).to_le_bytes());
        out[FIRST_SEQ_AT..PREV_SEQ_AT].copy_from_slice(&self.first_seq.get().to_le_bytes());
        out[PREV_SEQ_AT..LOG_START_AT].copy_from_slice(&self.prev_seq.get().to_le_bytes());
        out[LOG_START_AT..CREATED_AT].copy_from_slice(&self.log_start.get().to_le_bytes());
        out[CREATED_AT..NONCE_AT].copy_from_slice(&self.created_unix_ms.to_le_bytes());
        out[NONCE_AT..RESERVED_AT].copy_from_slice(&self.nonce.to_le_bytes());
        let crc = crc32fast::hash(&out[..CRC_AT]);
        out[CRC_AT..].copy_from_slice(&crc.to_le_bytes());
        out
    }

    /// Decodes and checks the header at the start of `file`. Never panics.
    pub(crate) fn decode(file: &[u8]) -> Result<SegmentHeader, Corruption> {
        let Some(Ok(h)) = file
            .get(..SEGMENT_HEADER_LEN)
            .map(<&[u8; SEGMENT_HEADER_LEN]>::try_from)
        else {
            return Err(Corruption::ShortSegmentHeader {
                len: file.len() as u64,
            });
        };
        // From here every index is a constant within the fixed-size header.
        if field::<8>(h, MAGIC_AT) != SEGMENT_MAGIC {
            return Err(Corruption::BadSegmentMagic);
        }
        let crc = u32::from_le_bytes(field(h, CRC_AT));
        if crc32fast::hash(h.get(..CRC_AT).unwrap_or_default()) != crc {
            return Err(Corruption::BadSegmentHeader);
        }
        let version = u16::from_le_bytes(field(h, VERSION_AT));
        if version != FORMAT_VERSION {
            return Err(Corruption::UnsupportedVersion { found: version });
        }
        let header_len = u16::from_le_bytes(field(h, HEADER_LEN_AT));
        if usize::from(header_len) != SEGMENT_HEADER_LEN {
            return Err(Corruption::Unsupported {
                what: "segment header length",
                value: u64::from(header_len),
            });
        }
        let flags = u32::from_le_bytes(field(h, FLAGS_AT));
        if flags != 0 {
            return Err(Corruption::Unsupported {
                what: "segment flags",
                value: u64::from(flags),
            });
        }
        let u64_at = |at| u64::from_le_bytes(field(h, at));
        Ok(SegmentHeader {
            first_seq: Seq::from(u64_at(FIRST_SEQ_AT)),
            prev_seq: Seq::from(u64_at(PREV_SEQ_AT)),
            log_start: Seq::from(u64_at(LOG_START_AT)),
            created_unix_ms: u64_at(CREATED_AT),
            nonce: u64_at(NONCE_AT),
        })
    }
}

#[cfg(test)]
#[expect(
    clippy::indexing_slicing,
    reason = "tests damage bytes at known offsets"
)]
mod tests {
    use super::*;

    fn sample() -> SegmentHeader {
        SegmentHeader {
            first_seq: Seq::from(42),
            prev_seq: Seq::from(41),
            log_start: Seq::from(7),
            created_unix_ms: 1_764_000_000_000,
            nonce: 0x0123_4567_89ab_cdef,
        }
    }

    #[test]
    fn header_round_trips() {
        let bytes = sample().encode();
        assert_eq!(SegmentHeader::decode(&bytes), Ok(sample()));
    }

    #[test]
    fn any_flipped_bit_is_refused() {
        let bytes = sample().encode();
        for bit in 0..SEGMENT_HEADER_LEN * 8 {
            let mut damaged = bytes;
            damaged[bit / 8] ^= 1 << (bit % 8);
            assert!(SegmentHeader::decode(&damaged).is_err(), "bit {bit}");
        }
    }

    #[test]
    fn foreign_and_short_files_are_named_as_such() {
        assert_eq!(
            SegmentHeader::decode(b"{\"json\": true}"),
            Err(Corruption::ShortSegmentHeader { len: 14 })
        );
        assert_eq!(
            SegmentHeader::decode(&[b'x'; 100]),
            Err(Corruption::BadSegmentMagic)
        );
    }

    #[test]
    fn a_newer_version_is_refused_by_number() {
        let mut bytes = sample().encode();
        bytes[VERSION_AT] = 2;
        let crc = crc32fast::hash(&bytes[..CRC_AT]);
        bytes[CRC_AT..].copy_from_slice(&crc.to_le_bytes());
        assert_eq!(
            SegmentHeader::decode(&bytes),
            Err(Corruption::UnsupportedVersion { found: 2 })
        );
    }
}
