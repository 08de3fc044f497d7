//! The payloads of the two frames that let recovery know what producers said
//! about their records without reading the records (docs/FORMAT.md, "Frame
//! kinds"):
//!
//! - a fields frame (kind 5, must be understood), written in the write batch
//!   of the records it describes, after them: for each record that has an
//!   ordering key, a not-before time or a deduplication id, `seq u64, flags
//!   u8`, then as the flags say (bit 0) the key's digest `u64`, (bit 1) the
//!   not-before time `u64` (µs since the Unix epoch), (bit 2) the
//!   deduplication id's digest `u64` and the payload's `u64`;
//! - a tombstones frame (kind `0x85`, skippable), written before segments are
//!   deleted: for each deduplication id still remembered whose record (or
//!   earlier tombstone) lies in them, `seq u64, appended_us u64, id u64,
//!   content u64`. A reader that skips it forgets those ids early: it may
//!   accept a duplicate, never lose a record.
//!
//! Digests are `format::hash` keyed by the outbox's identity. All
//! little-endian.

#![deny(clippy::indexing_slicing)]

use crate::error::Corruption;
use crate::format::frame::FrameKind;
use crate::format::seq::{SEQ_MAX, Seq};

/// The kind of a tombstones frame.
pub(crate) const TOMBSTONES: FrameKind = FrameKind::Skippable(0x85);

/// The longest entry of a fields frame.
pub(crate) const ENTRY_MAX: usize = 8 + 1 + 8 + 8 + 16;

const HAS_KEY: u8 = 0x01;
const HAS_NOT_BEFORE: u8 = 0x02;
const HAS_DEDUP: u8 = 0x04;

/// What the log says of one record's producer-given fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Described {
    pub seq: Seq,
    /// The ordering key's digest.
    pub key: Option<u64>,
    /// Not before this time (µs since the Unix epoch).
    pub not_before_us: Option<u64>,
    pub dedup: Option<DedupDigest>,
}

/// A deduplication id's digest and the digest of its record's payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct DedupDigest {
    pub id: u64,
    pub content: u64,
}

/// A deduplication id remembered after its record left the log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Tombstone {
    pub seq: Seq,
    /// When its record was appended (µs since the Unix epoch).
    pub appended_us: u64,
    pub dedup: DedupDigest,
}

impl Described {
    /// Whether there is anything to describe.
    pub(crate) fn is_empty(&self) -> bool {
        self.key.is_none() && self.not_before_us.is_none() && self.dedup.is_none()
    }
}

/// Encodes a fields frame's payload.
pub(crate) fn encode(entries: &[Described]) -> Vec<u8> {
    let mut out = Vec::with_capacity(entries.len() * 25);
    for e in entries {
        out.extend_from_slice(&e.seq.get().to_le_bytes());
        let flags = (if e.key.is_some() { HAS_KEY } else { 0 })
            | (if e.not_before_us.is_some() {
                HAS_NOT_BEFORE
            } else {
                0
            })
            | (if e.dedup.is_some() { HAS_DEDUP } else { 0 });
        out.push(flags);
        if let Some(k) = e.key {
            out.extend_from_slice(&k.to_le_bytes());
        }
        if let Some(t) = e.not_before_us {
            out.extend_from_slice(&t.to_le_bytes());
        }
        if let Some(d) = e.dedup {
            out.extend_from_slice(&d.id.to_le_bytes());
            out.extend_from_slice(&d.content.to_le_bytes());
        }
    }
    out
}

/// A reader of little-endian numbers that fails instead of panicking.
struct Cursor<'a>(&'a [u8]);

impl Cursor<'_> {
    fn u64(&mut self) -> Result<u64, Corruption> {
        let (Some(bytes), rest) = (
            self.0.get(..8).and_then(|b| <[u8; 8]>::try_from(b).ok()),
            self.0.get(8..),
        ) else {
            return Err(truncated());
        };
        self.0 = rest.unwrap_or_default();
        Ok(u64::from_le_bytes(bytes))
    }

    fn u8(&mut self) -> Result<u8, Corruption> {
        let (Some(&b), Some(rest)) = (self.0.first(), self.0.get(1..)) else {
            return Err(truncated());
        };
        self.0 = rest;
        Ok(b)
    }

    fn seq(&mut self) -> Result<Seq, Corruption> {
        let s = self.u64()?;
        if s == 0 || s >= SEQ_MAX {
            return Err(Corruption::Unsupported {
                what: "sequence number in a fields or tombstones frame",
                value: s,
            });
        }
        Ok(Seq::from(s))
    }
}

fn truncated() -> Corruption {
    Corruption::Unsupported {
        what: "truncated fields or tombstones entry",
        value: 0,
    }
}

/// Decodes a fields frame's payload.
pub(crate) fn decode(payload: &[u8]) -> Result<Vec<Described>, Corruption> {
    let mut c = Cursor(payload);
    let mut out = Vec::new();
    while !c.0.is_empty() {
        let seq = c.seq()?;
        let flags = c.u8()?;
        if flags & !(HAS_KEY | HAS_NOT_BEFORE | HAS_DEDUP) != 0 || flags == 0 {
            return Err(Corruption::Unsupported {
                what: crate::error::newer::FIELDS_FLAGS,
                value: u64::from(flags),
            });
        }
        let key = (flags & HAS_KEY != 0).then(|| c.u64()).transpose()?;
        let not_before_us = (flags & HAS_NOT_BEFORE != 0).then(|| c.u64()).transpose()?;
        let dedup = if flags & HAS_DEDUP != 0 {
            Some(DedupDigest {
                id: c.u64()?,
                content: c.u64()?,
            })
        } else {
            None
        };
        out.push(Described {
            seq,
            key,
            not_before_us,
            dedup,
        });
    }
    Ok(out)
}

/// Encodes a tombstones frame's payload.
pub(crate) fn encode_tombstones(entries: &[Tombstone]) -> Vec<u8> {
    let mut out = Vec::with_capacity(entries.len() * 32);
    for t in entries {
        out.extend_from_slice(&t.seq.get().to_le_bytes());
        out.extend_from_slice(&t.appended_us.to_le_bytes());
        out.extend_from_slice(&t.dedup.id.to_le_bytes());
        out.extend_from_slice(&t.dedup.content.to_le_bytes());
    }
    out
}

/// Decodes a tombstones frame's payload.
pub(crate) fn decode_tombstones(payload: &[u8]) -> Result<Vec<Tombstone>, Corruption> {
    if !payload.len().is_multiple_of(32) {
        return Err(Corruption::Unsupported {
            what: "tombstones payload length",
            value: payload.len() as u64,
        });
    }
    let mut c = Cursor(payload);
    let mut out = Vec::with_capacity(payload.len() / 32);
    while !c.0.is_empty() {
        out.push(Tombstone {
            seq: c.seq()?,
            appended_us: c.u64()?,
            dedup: DedupDigest {
                id: c.u64()?,
                content: c.u64()?,
            },
        });
    }
    Ok(out)
}

#[cfg(test)]
#[expect(clippy::indexing_slicing, reason = "tests cut encoded bytes")]
mod tests {
    use super::*;

    #[test]
    fn fields_and_tombstones_round_trip_and_truncations_fail() {
        let entries = vec![
            Described {
                seq: Seq::from(3),
                key: Some(7),
                not_before_us: None,
                dedup: Some(DedupDigest { id: 1, content: 2 }),
            },
            Described {
                seq: Seq::from(4),
                key: None,
                not_before_us: Some(99),
                dedup: None,
            },
        ];
        let bytes = encode(&entries);
        assert_eq!(decode(&bytes), Ok(entries));
        for cut in 1..bytes.len() {
            if cut != 33 {
                assert!(decode(&bytes[..cut]).is_err(), "cut at {cut}");
            }
        }
        let stones = vec![Tombstone {
            seq: Seq::from(5),
            appended_us: 6,
            dedup: DedupDigest { id: 8, content: 9 },
        }];
        let bytes = encode_tombstones(&stones);
        assert_eq!(decode_tombstones(&bytes), Ok(stones));
        assert!(decode_tombstones(&bytes[..31]).is_err());
        assert!(decode(&[1, 0, 0, 0, 0, 0, 0, 0, 0]).is_err(), "no flags");
        assert!(decode(&[0; 9]).is_err(), "seq 0");
    }
}
