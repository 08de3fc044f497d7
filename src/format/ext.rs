//! The optional per-record fields of a frame (its `ext` area): a list of
//! tag-length-value entries, documented in `docs/FORMAT.md` ("Optional fields").
//!
//! Each entry is a tag (u8), a length (u16, little-endian) and that many bytes.
//! A tag below `0x80` must be understood: a reader that does not know it
//! refuses the frame, since ignoring it could break a promise (an ordering key,
//! a delay). A tag at or above `0x80` may be skipped by a reader that does not
//! know it (a deduplication id: ignoring it only loses the deduplication).

#![deny(clippy::indexing_slicing)]

use crate::error::Corruption;
use crate::format::seq::Seq;

/// Ordering key: 1 to [`KEY_BYTES_MAX`] bytes.
pub(crate) const TAG_KEY: u8 = 0x01;
/// Not-before time: u64, microseconds since the Unix epoch.
pub(crate) const TAG_NOT_BEFORE: u8 = 0x02;
/// The sequence number of a record carried forward into a later segment
/// (frame kind 4): u64.
pub(crate) const TAG_ORIGIN_SEQ: u8 = 0x03;
/// The delivery state of a relocated record (frame kind 4), carried with it
/// (`format::relocated`).
pub(crate) const TAG_CARRIED: u8 = 0x04;
/// Deduplication id: 1 to [`DEDUP_ID_BYTES_MAX`] bytes. Skippable.
pub(crate) const TAG_DEDUP_ID: u8 = 0x81;

/// The longest ordering key, in bytes.
pub const KEY_BYTES_MAX: usize = 256;
/// The longest deduplication id, in bytes.
pub const DEDUP_ID_BYTES_MAX: usize = 256;

/// The optional fields of one record, borrowed from its frame.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct RecordFields<'a> {
    pub key: Option<&'a [u8]>,
    pub not_before_us: Option<u64>,
    pub origin_seq: Option<Seq>,
    pub dedup_id: Option<&'a [u8]>,
    /// The encoded delivery state of a relocated record.
    pub carried: Option<&'a [u8]>,
}

/// Decodes and checks an `ext` area. Never panics; every length is checked
/// against the bytes left and the field's limit before anything is sliced.
pub(crate) fn decode(mut ext: &[u8]) -> Result<RecordFields<'_>, Corruption> {
    let bad = |what| Err(Corruption::Unsupported { what, value: 0 });
    let mut fields = RecordFields::default();
    while !ext.is_empty() {
        let (Some(&tag), Some(len)) = (ext.first(), ext.get(1..3)) else {
            return bad("truncated optional field");
        };
        let len = usize::from(u16::from_le_bytes([
            len.first().copied().unwrap_or(0),
            len.get(1).copied().unwrap_or(0),
        ]));
        let Some(value) = ext.get(3..3 + len) else {
            return bad("optional field past the end of its area");
        };
        let u64_value = || <[u8; 8]>::try_from(value).map(u64::from_le_bytes);
        match tag {
            TAG_KEY if (1..=KEY_BYTES_MAX).contains(&len) && fields.key.is_none() => {
                fields.key = Some(value);
            }
            TAG_NOT_BEFORE if fields.not_before_us.is_none() => match u64_value() {
                Ok(v) => fields.not_before_us = Some(v),
                Err(_) => return bad("not-before time of the wrong length"),
            },
            TAG_ORIGIN_SEQ if fields.origin_seq.is_none() => match u64_value() {
                Ok(v) => fields.origin_seq = Some(Seq::from(v)),
                Err(_) => return bad("origin seq of the wrong length"),
            },
            TAG_DEDUP_ID
                if (1..=DEDUP_ID_BYTES_MAX).contains(&len) && fields.dedup_id.is_none() =>
            {
                fields.dedup_id = Some(value);
            }
            TAG_CARRIED if fields.carried.is_none() => fields.carried = Some(value),
            TAG_KEY | TAG_NOT_BEFORE | TAG_ORIGIN_SEQ | TAG_DEDUP_ID | TAG_CARRIED => {
                return bad("optional field repeated or out of its limits");
            }
            // Unknown, and skippable.
            0x80..=0xFF => {}
            _ => {
                return Err(Corruption::Unsupported {
                    what: crate::error::newer::FIELD_TAG,
                    value: u64::from(tag),
                });
            }
        }
        ext = ext.get(3 + len..).unwrap_or_default();
    }
    Ok(fields)
}

/// Encodes `fields` as an `ext` area (relocated records; the producer
/// features will write the others).
pub(crate) fn encode(fields: &RecordFields<'_>, out: &mut Vec<u8>) {
    let mut put = |tag: u8, value: &[u8]| {
        out.push(tag);
        out.extend_from_slice(&(value.len() as u16).to_le_bytes());
        out.extend_from_slice(value);
    };
    if let Some(key) = fields.key {
        put(TAG_KEY, key);
    }
    if let Some(t) = fields.not_before_us {
        put(TAG_NOT_BEFORE, &t.to_le_bytes());
    }
    if let Some(seq) = fields.origin_seq {
        put(TAG_ORIGIN_SEQ, &seq.get().to_le_bytes());
    }
    if let Some(carried) = fields.carried {
        put(TAG_CARRIED, carried);
    }
    if let Some(id) = fields.dedup_id {
        put(TAG_DEDUP_ID, id);
    }
}

#[cfg(test)]
#[expect(clippy::indexing_slicing, reason = "tests build areas byte by byte")]
mod tests {
    use super::*;

    #[test]
    fn fields_round_trip() {
        let fields = RecordFields {
            key: Some(b"account-42"),
            not_before_us: Some(1_764_000_000_000_000),
            origin_seq: Some(Seq::from(77)),
            dedup_id: Some(b"order-7781/created"),
            carried: Some(b"\x01\x02"),
        };
        let mut ext = Vec::new();
        encode(&fields, &mut ext);
        assert_eq!(decode(&ext), Ok(fields));
        assert_eq!(decode(&[]), Ok(RecordFields::default()));
    }

    #[test]
    fn unknown_tags_are_skipped_only_from_0x80() {
        let mut ext = vec![0x9A, 2, 0, 1, 2];
        encode(
            &RecordFields {
                key: Some(b"k"),
                ..RecordFields::default()
            },
            &mut ext,
        );
        assert_eq!(decode(&ext).map(|f| f.key), Ok(Some(&b"k"[..])));
        assert!(matches!(
            decode(&[0x7A, 0, 0]),
            Err(Corruption::Unsupported {
                what: crate::error::newer::FIELD_TAG,
                value: 0x7A
            })
        ));
    }

    #[test]
    fn lengths_and_limits_are_checked_before_slicing() {
        assert!(decode(&[TAG_KEY, 0xFF, 0xFF, 1]).is_err());
        assert!(decode(&[TAG_KEY, 0]).is_err());
        assert!(decode(&[TAG_KEY, 0, 0]).is_err(), "an empty key");
        let mut long = vec![TAG_KEY, 1, 1];
        long.resize(3 + 257, b'k');
        assert!(decode(&long).is_err(), "a key of 257 bytes");
        assert!(decode(&[TAG_NOT_BEFORE, 4, 0, 1, 2, 3, 4]).is_err());
        let mut twice = Vec::new();
        let one = RecordFields {
            key: Some(b"a"),
            ..RecordFields::default()
        };
        encode(&one, &mut twice);
        encode(&one, &mut twice);
        assert!(decode(&twice).is_err(), "a key given twice");
        // Every truncation of a valid area is an error or a shorter valid area.
        let mut ext = Vec::new();
        encode(
            &RecordFields {
                key: Some(b"key"),
                not_before_us: Some(5),
                origin_seq: None,
                dedup_id: Some(b"id"),
                carried: None,
            },
            &mut ext,
        );
        for cut in 0..ext.len() {
            let _ = decode(&ext[..cut]);
        }
    }
}
