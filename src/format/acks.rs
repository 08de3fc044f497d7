//! The payload of an acks frame (kind `0x80`, docs/FORMAT.md, "Frame kinds"):
//! the sequence numbers acknowledged since the previous acks frame, as ranges.
//!
//! Layout: a list of `(first u64, last u64)` pairs, little-endian, `first <=
//! last`, nothing else. The frame is skippable: a reader that does not know it
//! hands the records out once more, which at-least-once delivery allows.

use crate::error::Corruption;
use crate::format::seq::Seq;

/// Bytes of one range.
pub(crate) const RANGE_LEN: usize = 16;

/// The payload for `ranges`.
pub(crate) fn encode(ranges: &[(Seq, Seq)]) -> Vec<u8> {
    let mut out = Vec::with_capacity(ranges.len() * RANGE_LEN);
    for (first, last) in ranges {
        out.extend_from_slice(&first.get().to_le_bytes());
        out.extend_from_slice(&last.get().to_le_bytes());
    }
    out
}

/// The payloads of the acks frames for `ranges`, in order: a frame carries
/// at most [`FRAME_ENTRIES_BYTES_MAX`](crate::format::delivery::FRAME_ENTRIES_BYTES_MAX)
/// bytes of ranges.
pub(crate) fn encode_frames(ranges: &[(Seq, Seq)]) -> impl Iterator<Item = Vec<u8>> + '_ {
    ranges
        .chunks(crate::format::delivery::FRAME_ENTRIES_BYTES_MAX / RANGE_LEN)
        .map(encode)
}

/// The ranges of an acks payload. Never panics; a payload whose checksum held
/// but which is not a list of ranges was written by a format this build does
/// not know.
pub(crate) fn decode(payload: &[u8]) -> Result<Vec<(Seq, Seq)>, Corruption> {
    if !payload.len().is_multiple_of(RANGE_LEN) {
        return Err(Corruption::Unsupported {
            what: "acks payload length",
            value: payload.len() as u64,
        });
    }
    let mut ranges = Vec::with_capacity(payload.len() / RANGE_LEN);
    for pair in payload.chunks_exact(RANGE_LEN) {
        let (a, b) = pair.split_at(8);
        let first = u64::from_le_bytes(a.try_into().unwrap_or_default());
        let last = u64::from_le_bytes(b.try_into().unwrap_or_default());
        if first == 0 || first > last || last >= crate::format::seq::SEQ_MAX {
            return Err(Corruption::Unsupported {
                what: "acks range starting at",
                value: first,
            });
        }
        ranges.push((Seq::from(first), Seq::from(last)));
    }
    Ok(ranges)
}

/// Adds `seq` to `ranges`, extending the last range when it follows it.
pub(crate) fn push(ranges: &mut Vec<(Seq, Seq)>, seq: Seq) {
    match ranges.last_mut() {
        Some((_, last)) if last.next() == seq => *last = seq,
        _ => ranges.push((seq, seq)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_round_trip_and_bad_payloads_are_refused() {
        let mut ranges = Vec::new();
        for s in [3, 4, 5, 9, 10, 42] {
            push(&mut ranges, Seq::from(s));
        }
        let want = [(3, 5), (9, 10), (42, 42)].map(|(a, b)| (Seq::from(a), Seq::from(b)));
        assert_eq!(ranges, want);
        let bytes = encode(&ranges);
        assert_eq!(bytes.len(), 3 * RANGE_LEN);
        assert_eq!(decode(&bytes).expect("decode"), ranges);
        assert!(decode(&bytes[..17]).is_err());
        let mut backwards = encode(&[(Seq::from(9), Seq::from(3))]);
        assert!(decode(&backwards).is_err());
        backwards.clear();
        assert_eq!(decode(&backwards).expect("empty"), Vec::new());
    }
}
