//! The segment header codec: the first bytes of every segment file.
//!
//! Pure functions over byte slices. The layout is documented once, in
//! `docs/FORMAT.md` ("Segment header"); the offsets below chain from each other.

#![deny(clippy::indexing_slicing)]

use super::field;
use crate::error::Corruption;
use crate::format::seq::{SEQ_MAX, Seq};

/// Magic bytes at the start of every segment file.
pub(crate) const SEGMENT_MAGIC: [u8; 8] = *b"SEGWAL\x1a\n";
/// The format version this build writes, and the only one it reads.
pub(crate) const FORMAT_VERSION: u16 = 2;

/// The block: the unit in which a drive may rewrite, and a power cut garble,
/// what it holds. No byte that was fsynced ever shares an aligned block with a
/// later write: the header has block 0 to itself, and every sync group starts
/// on a fresh block (docs/FORMAT.md, "Blocks").
pub(crate) const BLOCK: usize = 4096;
/// Where the first frame of a segment starts: the block after the header's.
pub(crate) const FRAMES_AT: usize = BLOCK;

/// `offset` rounded up to a block boundary.
pub(crate) const fn align_up(offset: u64) -> u64 {
    offset.next_multiple_of(BLOCK as u64)
}

const MAGIC_AT: usize = 0;
const VERSION_AT: usize = MAGIC_AT + 8;
const HEADER_LEN_AT: usize = VERSION_AT + 2;
const FLAGS_AT: usize = HEADER_LEN_AT + 2;
const FIRST_SEQ_AT: usize = FLAGS_AT + 4;
const PREV_SEQ_AT: usize = FIRST_SEQ_AT + 8;
const LOG_START_AT: usize = PREV_SEQ_AT + 8;
const CREATED_AT: usize = LOG_START_AT + 8;
const NONCE_AT: usize = CREATED_AT + 8;
const BLOCK_SIZE_AT: usize = NONCE_AT + 8;
/// Bytes between index checkpoints (u32, 0 for none): a word that was
/// reserved (zero) before index checkpoints, which earlier builds ignore.
const CHECKPOINT_EVERY_AT: usize = BLOCK_SIZE_AT + 4;
const OUTBOX_ID_AT: usize = CHECKPOINT_EVERY_AT + 4;
const RESERVED_B_AT: usize = OUTBOX_ID_AT + 16;
const CRC_AT: usize = 124;
/// Length of the segment header; the rest of its block is zeros.
pub(crate) const SEGMENT_HEADER_LEN: usize = CRC_AT + 4;
/// The header length of format version 1, whose CRC sat at its last four
/// bytes too: read only to name the version of a file this build refuses.
const V1_HEADER_LEN: usize = 64;

const _: () = assert!(RESERVED_B_AT <= CRC_AT && SEGMENT_HEADER_LEN <= BLOCK);

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
    /// A random number drawn when the segment was created, never 0: the secret
    /// key of its frames' checksums (`frame::salt`), so that no frame validates
    /// unless segwal wrote it for this segment, whatever a producer's payload
    /// holds.
    pub nonce: u64,
    /// The identity of the outbox, drawn when its first segment was created and
    /// repeated in every segment since.
    pub outbox_id: u128,
    /// How often the writer lists the frames written so far in an index
    /// checkpoint (`format::checkpoint`): one starts the first sync group at
    /// or after every multiple of this many bytes. 0: none is written (a
    /// segment of a build before checkpoints, or one too small for them).
    pub checkpoint_every: u32,
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
        out[NONCE_AT..BLOCK_SIZE_AT].copy_from_slice(&self.nonce.to_le_bytes());
        out[BLOCK_SIZE_AT..CHECKPOINT_EVERY_AT].copy_from_slice(&(BLOCK as u32).to_le_bytes());
        out[CHECKPOINT_EVERY_AT..OUTBOX_ID_AT]
            .copy_from_slice(&self.checkpoint_every.to_le_bytes());
        out[OUTBOX_ID_AT..RESERVED_B_AT].copy_from_slice(&self.outbox_id.to_le_bytes());
        let crc = crc32fast::hash(&out[..CRC_AT]);
        out[CRC_AT..].copy_from_slice(&crc.to_le_bytes());
        out
    }

    /// The header's whole block, as written to a new segment: the header, then
    /// zeros.
    pub(crate) fn encode_block(&self) -> Vec<u8> {
        let mut block = self.encode().to_vec();
        block.resize(BLOCK, 0);
        block
    }

    /// Decodes and checks the header at the start of `file`. Never panics.
    ///
    /// The checks run in an order a rule of recovery depends on: magic, then
    /// the checksum (at the end of the length the header names, 64 or 128
    /// bytes), then the version and the rest. A header whose checksum holds was
    /// written whole, so another version in it is refused by number
    /// (`UnsupportedVersion`), never taken for a torn header.
    pub(crate) fn decode(file: &[u8]) -> Result<SegmentHeader, Corruption> {
        if file.get(..MAGIC_AT + 8).is_some_and(|m| m != SEGMENT_MAGIC) {
            return Err(Corruption::BadSegmentMagic);
        }
        let header_len = file
            .get(HEADER_LEN_AT..FLAGS_AT)
            .map_or(SEGMENT_HEADER_LEN, |b| {
                usize::from(u16::from_le_bytes(field(b, 0)))
            });
        // Only the two lengths a version ever wrote; anything else is damage.
        let header_len = if header_len == V1_HEADER_LEN {
            V1_HEADER_LEN
        } else {
            SEGMENT_HEADER_LEN
        };
        let Some(h) = file.get(..header_len) else {
            return Err(Corruption::ShortSegmentHeader {
                len: file.len() as u64,
            });
        };
        let (checked, crc) = h.split_at(header_len - 4);
        if crc32fast::hash(checked) != u32::from_le_bytes(field(crc, 0)) {
            return Err(Corruption::BadSegmentHeader);
        }
        let version = u16::from_le_bytes(field(h, VERSION_AT));
        if version != FORMAT_VERSION || header_len != SEGMENT_HEADER_LEN {
            return Err(Corruption::UnsupportedVersion { found: version });
        }
        let flags = u32::from_le_bytes(field(h, FLAGS_AT));
        if flags != 0 {
            return Err(Corruption::Unsupported {
                what: crate::error::newer::SEGMENT_FLAGS,
                value: u64::from(flags),
            });
        }
        let block = u32::from_le_bytes(field(h, BLOCK_SIZE_AT));
        if block as usize != BLOCK {
            return Err(Corruption::BadBlockSize { found: block });
        }
        let u64_at = |at| u64::from_le_bytes(field(h, at));
        let (first_seq, prev_seq, log_start) = (
            u64_at(FIRST_SEQ_AT),
            u64_at(PREV_SEQ_AT),
            u64_at(LOG_START_AT),
        );
        // The writer never writes anything else: the segment before ends
        // below this one's first frame, the log starts at or before it, and
        // every number is within the format's bound. A header that says
        // otherwise, its checksum valid, was not written by segwal.
        if first_seq == 0 || first_seq > SEQ_MAX || prev_seq >= first_seq || log_start > first_seq {
            return Err(Corruption::ImpossibleSegmentSeqs {
                first_seq,
                prev_seq,
                log_start,
            });
        }
        Ok(SegmentHeader {
            first_seq: Seq::from(first_seq),
            prev_seq: Seq::from(prev_seq),
            log_start: Seq::from(log_start),
            created_unix_ms: u64_at(CREATED_AT),
            nonce: u64_at(NONCE_AT),
            outbox_id: u128::from_le_bytes(field(h, OUTBOX_ID_AT)),
            checkpoint_every: u32::from_le_bytes(field(h, CHECKPOINT_EVERY_AT)),
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
            outbox_id: 0xfeed_beef_0000_1111_2222_3333_4444_5555,
            checkpoint_every: 4 << 20,
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
            Err(Corruption::BadSegmentMagic)
        );
        assert_eq!(
            SegmentHeader::decode(b"SEG"),
            Err(Corruption::ShortSegmentHeader { len: 3 })
        );
        assert_eq!(
            SegmentHeader::decode(&SEGMENT_MAGIC),
            Err(Corruption::ShortSegmentHeader { len: 8 })
        );
        assert_eq!(
            SegmentHeader::decode(&[b'x'; 100]),
            Err(Corruption::BadSegmentMagic)
        );
    }

    #[test]
    fn a_newer_version_is_refused_by_number() {
        let mut bytes = sample().encode();
        bytes[VERSION_AT] = 3;
        let crc = crc32fast::hash(&bytes[..CRC_AT]);
        bytes[CRC_AT..].copy_from_slice(&crc.to_le_bytes());
        assert_eq!(
            SegmentHeader::decode(&bytes),
            Err(Corruption::UnsupportedVersion { found: 3 })
        );
    }

    #[test]
    fn a_version_1_header_is_named_as_such() {
        // Version 1: 64 bytes, its CRC at 60, 4 reserved bytes before it.
        let mut v1 = [0u8; 128];
        v1[..8].copy_from_slice(&SEGMENT_MAGIC);
        v1[VERSION_AT..VERSION_AT + 2].copy_from_slice(&1u16.to_le_bytes());
        v1[HEADER_LEN_AT..HEADER_LEN_AT + 2].copy_from_slice(&64u16.to_le_bytes());
        let crc = crc32fast::hash(&v1[..60]);
        v1[60..64].copy_from_slice(&crc.to_le_bytes());
        // A first frame follows in a real file.
        v1[64..68].copy_from_slice(&[0xC5, b'W', b'F', b'R']);
        assert_eq!(
            SegmentHeader::decode(&v1),
            Err(Corruption::UnsupportedVersion { found: 1 })
        );
    }

    #[test]
    fn impossible_sequence_numbers_are_refused_even_with_a_valid_checksum() {
        let impossible = [
            (0, 0, 0),
            ((1 << 62) + 1, 1, 1),
            (42, 42, 7),
            (42, u64::MAX, 7),
            (42, 41, 43),
        ];
        for (first, prev, start) in impossible {
            let header = SegmentHeader {
                first_seq: Seq::from(first),
                prev_seq: Seq::from(prev),
                log_start: Seq::from(start),
                ..sample()
            };
            assert_eq!(
                SegmentHeader::decode(&header.encode()),
                Err(Corruption::ImpossibleSegmentSeqs {
                    first_seq: first,
                    prev_seq: prev,
                    log_start: start,
                }),
                "{first} {prev} {start}"
            );
        }
        // The edges a header may hold: the first segment ever, and a segment
        // named at the format's bound (which an open then refuses, for the
        // numbers it would assign: `plan::SEQ_OPEN_LIMIT`).
        for (first, prev, start) in [(1, 0, 1), (1 << 62, (1 << 62) - 1, 1)] {
            let header = SegmentHeader {
                first_seq: Seq::from(first),
                prev_seq: Seq::from(prev),
                log_start: Seq::from(start),
                ..sample()
            };
            assert_eq!(SegmentHeader::decode(&header.encode()), Ok(header));
        }
    }

    #[test]
    fn the_header_block_is_the_header_then_zeros() {
        let block = sample().encode_block();
        assert_eq!(block.len(), BLOCK);
        assert_eq!(SegmentHeader::decode(&block), Ok(sample()));
        assert!(block[SEGMENT_HEADER_LEN..].iter().all(|&b| b == 0));
    }
}
