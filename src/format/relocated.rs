//! Relocated records (frame kind 4, docs/FORMAT.md "Relocation"): a record
//! carried forward from an old segment into the active one, so that it does
//! not keep the old segment on disk.
//!
//! The frame's payload is the record's payload, unchanged; its `ext` area holds
//! the record's own optional fields, its own sequence number (`origin_seq`),
//! and its delivery state at the time it was copied (`carried`, this module):
//!
//! | width | field |
//! |---|---|
//! | 4 | attempts: deliveries counted so far |
//! | 1 | state: `0` pending, `1` delayed (released with a delay), `2` dead letter |
//! | 8 | `at_us`: the delay's end (delayed) or when it died (dead letter), µs since the Unix epoch; `0` when pending |
//! | 2 | reason length, then the reason (UTF-8, at most [`REASON_BYTES_MAX`] bytes): the last failure's, or the dead letter's |
//!
//! A record claimed when it is copied is carried as pending: a claim does not
//! survive a restart. The frame's timestamp is the record's own (when it was
//! first appended), not the copy's. Decoding never panics.

use crate::error::Corruption;
use crate::format::delivery::REASON_BYTES_MAX;
use crate::format::ext::{self, RecordFields};
use crate::format::seq::{SEQ_MAX, Seq};

/// A relocated record's delivery state, as the frame carries it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Carried {
    /// Deliveries counted so far.
    pub attempts: u32,
    /// Pending, delayed or dead.
    pub state: CarriedState,
    /// The last failure's reason, or the dead letter's.
    pub reason: Option<String>,
}

/// Where a relocated record stood when it was copied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CarriedState {
    /// Claimable (or claimed: a claim does not survive a restart).
    Pending,
    /// Released with a delay, claimable from `not_before_us` (wall clock).
    Delayed { not_before_us: u64 },
    /// A dead letter since `since_us` (wall clock).
    Dead { since_us: u64 },
}

/// Appends the `ext` area of a relocated copy of a record: the record's own
/// optional fields (`original`, the area of the frame being copied, already
/// checked), its sequence number and its delivery state.
pub(crate) fn encode_ext(
    original: &RecordFields<'_>,
    seq: Seq,
    carried: &Carried,
    out: &mut Vec<u8>,
) {
    let mut state = Vec::with_capacity(15);
    state.extend_from_slice(&carried.attempts.to_le_bytes());
    let (code, at) = match carried.state {
        CarriedState::Pending => (0u8, 0u64),
        CarriedState::Delayed { not_before_us } => (1, not_before_us),
        CarriedState::Dead { since_us } => (2, since_us),
    };
    state.push(code);
    state.extend_from_slice(&at.to_le_bytes());
    let reason = crate::format::delivery::clip(carried.reason.as_deref().unwrap_or(""));
    state.extend_from_slice(&(reason.len() as u16).to_le_bytes());
    state.extend_from_slice(reason.as_bytes());
    let fields = RecordFields {
        origin_seq: Some(seq),
        carried: Some(&state),
        ..*original
    };
    ext::encode(&fields, out);
}

/// The bytes a relocated copy's `ext` area adds to the record's own fields
/// (its sequence number and its delivery state, each with its tag and
/// length): what the backlog does not count of the copy.
pub(crate) fn added_len(carried: &Carried) -> u32 {
    let reason = crate::format::delivery::clip(carried.reason.as_deref().unwrap_or(""));
    (3 + 8 + 3 + 15 + reason.len()) as u32
}

/// The record a relocated frame's `ext` area names, and its delivery state.
pub(crate) fn decode_ext(area: &[u8]) -> Result<(Seq, Carried), Corruption> {
    let bad = |what, value| Corruption::Unsupported { what, value };
    let fields = ext::decode(area)?;
    let seq = fields
        .origin_seq
        .ok_or(bad("relocated record without its seq", 0))?;
    if seq.get() == 0 || seq.get() >= SEQ_MAX {
        return Err(bad("relocated record's seq", seq.get()));
    }
    let state = fields
        .carried
        .ok_or(bad("relocated record without its state", 0))?;
    let short = || bad("relocated record's state cut short at", state.len() as u64);
    let attempts = state
        .get(0..4)
        .and_then(|b| <[u8; 4]>::try_from(b).ok())
        .map(u32::from_le_bytes)
        .ok_or_else(short)?;
    let code = *state.get(4).ok_or_else(short)?;
    let at = state
        .get(5..13)
        .and_then(|b| <[u8; 8]>::try_from(b).ok())
        .map(u64::from_le_bytes)
        .ok_or_else(short)?;
    let reason_len = state
        .get(13..15)
        .and_then(|b| <[u8; 2]>::try_from(b).ok())
        .map(|b| usize::from(u16::from_le_bytes(b)))
        .ok_or_else(short)?;
    if reason_len > REASON_BYTES_MAX {
        return Err(bad(
            "relocated record's reason of length",
            reason_len as u64,
        ));
    }
    let reason = state.get(15..15 + reason_len).ok_or_else(short)?;
    if state.len() != 15 + reason_len {
        return Err(bad(
            "relocated record's state of length",
            state.len() as u64,
        ));
    }
    let state = match code {
        0 => CarriedState::Pending,
        1 => CarriedState::Delayed { not_before_us: at },
        2 => CarriedState::Dead { since_us: at },
        other => return Err(bad(crate::error::newer::CARRIED_STATE, u64::from(other))),
    };
    let reason = (!reason.is_empty()).then(|| String::from_utf8_lossy(reason).into_owned());
    Ok((
        seq,
        Carried {
            attempts,
            state,
            reason,
        },
    ))
}

#[cfg(test)]
#[expect(clippy::indexing_slicing, reason = "tests cut areas byte by byte")]
mod tests {
    use super::*;

    #[test]
    fn carried_state_round_trips_with_the_records_own_fields() {
        let original = RecordFields {
            key: Some(b"account-42"),
            dedup_id: Some(b"order-1"),
            ..RecordFields::default()
        };
        for state in [
            CarriedState::Pending,
            CarriedState::Delayed { not_before_us: 7 },
            CarriedState::Dead { since_us: 9 },
        ] {
            let carried = Carried {
                attempts: 3,
                state,
                reason: Some("broker said no".into()),
            };
            let mut area = Vec::new();
            encode_ext(&original, Seq::from(41), &carried, &mut area);
            assert_eq!(decode_ext(&area), Ok((Seq::from(41), carried)));
            let fields = ext::decode(&area).expect("valid area");
            assert_eq!(fields.key, original.key);
            assert_eq!(fields.dedup_id, original.dedup_id);
        }
    }

    #[test]
    fn a_relocated_frame_needs_its_seq_and_its_state() {
        let mut area = Vec::new();
        ext::encode(
            &RecordFields {
                origin_seq: Some(Seq::from(5)),
                ..RecordFields::default()
            },
            &mut area,
        );
        assert!(decode_ext(&area).is_err(), "no state");
        let mut area = Vec::new();
        let carried = Carried {
            attempts: 1,
            state: CarriedState::Pending,
            reason: None,
        };
        encode_ext(&RecordFields::default(), Seq::from(5), &carried, &mut area);
        for cut in 0..area.len() {
            assert!(decode_ext(&area[..cut]).is_err(), "cut at {cut}");
        }
        // A state code this build does not know is refused.
        let at = area.len() - 2 - 8 - 1;
        area[at] = 7;
        assert!(decode_ext(&area).is_err());
    }
}
