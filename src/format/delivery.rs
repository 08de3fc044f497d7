//! The payloads of the delivery-state frames (docs/FORMAT.md, "Frame kinds")
//! other than acks: a release with a delay and a reason (`0x82`), a dead
//! letter (`0x83`), a requeue or a discard of a dead letter (`0x84`). Each
//! payload is a list of entries, all little-endian:
//!
//! - attempts: `seq u64, attempts u32` (deliveries made, written before the
//!   record is handed out when `max_attempts` is set);
//! - release: `seq u64, not_before_us u64, reason_len u16, reason` (UTF-8);
//! - dead letter: `seq u64, attempts u32, reason_len u16, reason`;
//! - requeue / discard: `seq u64, what u8` (1 requeue, 2 discard).
//!
//! The frames are skippable: a reader that does not know them delivers the
//! record again at once (at least once), never loses it.

use std::sync::Arc;

use crate::error::Corruption;
use crate::format::frame::FrameKind;
use crate::format::seq::{SEQ_MAX, Seq};

/// The kind of an attempts frame.
pub(crate) const ATTEMPTS: FrameKind = FrameKind::Skippable(0x81);
/// The kind of a release frame.
pub(crate) const RELEASE: FrameKind = FrameKind::Skippable(0x82);
/// The kind of a dead-letter frame.
pub(crate) const DEAD_LETTER: FrameKind = FrameKind::Skippable(0x83);
/// The kind of a requeue-or-discard frame.
pub(crate) const REQUEUE_OR_DISCARD: FrameKind = FrameKind::Skippable(0x84);

/// The longest reason kept, in bytes (longer ones are cut on a character
/// boundary).
pub const REASON_BYTES_MAX: usize = 1024;

/// The most entry bytes one delivery-state or acks frame carries: a longer
/// run of changes is split over several frames of its kind, so that no
/// frame comes near the format's record limit however many changes pile up
/// between two batches.
pub(crate) const FRAME_ENTRIES_BYTES_MAX: usize = 1 << 20;

/// One change of a record's delivery state, as the log records it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Change {
    /// Delivered for the `attempts`-th time (about to be handed out).
    Attempts { seq: Seq, attempts: u32 },
    /// Released, to be delivered again no earlier than `not_before_us`
    /// (wall clock, µs since the Unix epoch), with the reason of the failure.
    Release {
        seq: Seq,
        not_before_us: u64,
        reason: Arc<str>,
    },
    /// Parked as a dead letter after `attempts` deliveries.
    DeadLetter {
        seq: Seq,
        attempts: u32,
        reason: Arc<str>,
    },
    /// A dead letter made pending again.
    Requeue(Seq),
    /// A dead letter dropped: done for good.
    Discard(Seq),
}

impl Change {
    /// The record it changes.
    pub(crate) fn seq(&self) -> Seq {
        match self {
            Change::Attempts { seq, .. }
            | Change::Release { seq, .. }
            | Change::DeadLetter { seq, .. } => *seq,
            Change::Requeue(seq) | Change::Discard(seq) => *seq,
        }
    }

    /// The bytes of its entry in a frame.
    pub(crate) fn entry_len(&self) -> usize {
        match self {
            Change::Attempts { .. } => 12,
            Change::Release { reason, .. } => 18 + reason.len().min(REASON_BYTES_MAX),
            Change::DeadLetter { reason, .. } => 14 + reason.len().min(REASON_BYTES_MAX),
            Change::Requeue(_) | Change::Discard(_) => 9,
        }
    }
}

/// `reason` cut to [`REASON_BYTES_MAX`] bytes, on a character boundary.
pub(crate) fn clip(reason: &str) -> String {
    clipped(reason).to_owned()
}

/// The part of `reason` [`clip`] keeps.
pub(crate) fn clipped(reason: &str) -> &str {
    let mut end = reason.len().min(REASON_BYTES_MAX);
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    reason.get(..end).unwrap_or_default()
}

fn put_reason(out: &mut Vec<u8>, reason: &str) {
    let reason = clipped(reason);
    out.extend_from_slice(&(reason.len() as u16).to_le_bytes());
    out.extend_from_slice(reason.as_bytes());
}

/// The frames for `changes`, in order: runs of one kind share a frame, of
/// at most [`FRAME_ENTRIES_BYTES_MAX`] bytes.
pub(crate) fn encode(changes: &[Change]) -> Vec<(FrameKind, Vec<u8>)> {
    encode_at_most(changes, FRAME_ENTRIES_BYTES_MAX)
}

fn encode_at_most(changes: &[Change], frame_max: usize) -> Vec<(FrameKind, Vec<u8>)> {
    let mut frames: Vec<(FrameKind, Vec<u8>)> = Vec::new();
    for change in changes {
        let kind = match change {
            Change::Attempts { .. } => ATTEMPTS,
            Change::Release { .. } => RELEASE,
            Change::DeadLetter { .. } => DEAD_LETTER,
            Change::Requeue(_) | Change::Discard(_) => REQUEUE_OR_DISCARD,
        };
        if frames
            .last()
            .is_none_or(|(k, out)| *k != kind || out.len() + change.entry_len() > frame_max)
        {
            frames.push((kind, Vec::new()));
        }
        let Some((_, out)) = frames.last_mut() else {
            continue;
        };
        match change {
            Change::Attempts { seq, attempts } => {
                out.extend_from_slice(&seq.get().to_le_bytes());
                out.extend_from_slice(&attempts.to_le_bytes());
            }
            Change::Release {
                seq,
                not_before_us,
                reason,
            } => {
                out.extend_from_slice(&seq.get().to_le_bytes());
                out.extend_from_slice(&not_before_us.to_le_bytes());
                put_reason(out, reason);
            }
            Change::DeadLetter {
                seq,
                attempts,
                reason,
            } => {
                out.extend_from_slice(&seq.get().to_le_bytes());
                out.extend_from_slice(&attempts.to_le_bytes());
                put_reason(out, reason);
            }
            Change::Requeue(seq) | Change::Discard(seq) => {
                out.extend_from_slice(&seq.get().to_le_bytes());
                out.push(if matches!(change, Change::Requeue(_)) {
                    1
                } else {
                    2
                });
            }
        }
    }
    frames
}

/// Reads `n` bytes from the front of `rest`.
fn take<'a>(rest: &mut &'a [u8], n: usize) -> Result<&'a [u8], Corruption> {
    if rest.len() < n {
        return Err(Corruption::Unsupported {
            what: "delivery-state payload cut short at",
            value: rest.len() as u64,
        });
    }
    let (head, tail) = rest.split_at(n);
    *rest = tail;
    Ok(head)
}

fn u64_of(rest: &mut &[u8]) -> Result<u64, Corruption> {
    Ok(u64::from_le_bytes(
        take(rest, 8)?.try_into().unwrap_or_default(),
    ))
}

fn seq_of(rest: &mut &[u8]) -> Result<Seq, Corruption> {
    let s = u64_of(rest)?;
    if s == 0 || s >= SEQ_MAX {
        return Err(Corruption::Unsupported {
            what: "delivery-state seq",
            value: s,
        });
    }
    Ok(Seq::from(s))
}

/// The next reason, sharing the text of `last` (the frame's previous one)
/// when it says the same: a frame of a thousand releases with the broker's
/// one error holds it once in memory at open.
fn reason_of(rest: &mut &[u8], last: &mut Option<Arc<str>>) -> Result<Arc<str>, Corruption> {
    let len = u16::from_le_bytes(take(rest, 2)?.try_into().unwrap_or_default()) as usize;
    // The writer never writes more than the limit; a frame that says
    // otherwise holds no more than it in memory either.
    let text = String::from_utf8_lossy(take(rest, len)?);
    let text = clipped(&text);
    if let Some(last) = last.as_ref().filter(|l| ***l == *text) {
        return Ok(last.clone());
    }
    let reason: Arc<str> = text.into();
    *last = Some(reason.clone());
    Ok(reason)
}

/// The changes a frame of `kind` (release, dead letter, requeue or discard)
/// with `payload` records. Never panics.
pub(crate) fn decode(kind: FrameKind, payload: &[u8]) -> Result<Vec<Change>, Corruption> {
    let mut rest = payload;
    let mut out = Vec::new();
    let mut last = None;
    while !rest.is_empty() {
        let change = if kind == ATTEMPTS {
            let seq = seq_of(&mut rest)?;
            let attempts = u32::from_le_bytes(take(&mut rest, 4)?.try_into().unwrap_or_default());
            Change::Attempts { seq, attempts }
        } else if kind == RELEASE {
            Change::Release {
                seq: seq_of(&mut rest)?,
                not_before_us: u64_of(&mut rest)?,
                reason: reason_of(&mut rest, &mut last)?,
            }
        } else if kind == DEAD_LETTER {
            let seq = seq_of(&mut rest)?;
            let attempts = u32::from_le_bytes(take(&mut rest, 4)?.try_into().unwrap_or_default());
            Change::DeadLetter {
                seq,
                attempts,
                reason: reason_of(&mut rest, &mut last)?,
            }
        } else if kind == REQUEUE_OR_DISCARD {
            let seq = seq_of(&mut rest)?;
            match take(&mut rest, 1)? {
                [1] => Change::Requeue(seq),
                [2] => Change::Discard(seq),
                other => {
                    return Err(Corruption::Unsupported {
                        what: crate::error::newer::REQUEUE_CODE,
                        value: u64::from(other.first().copied().unwrap_or(0)),
                    });
                }
            }
        } else {
            return Ok(Vec::new());
        };
        out.push(change);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changes_round_trip_in_order_and_reasons_are_clipped() {
        let long = "é".repeat(REASON_BYTES_MAX);
        let changes = vec![
            Change::Attempts {
                seq: Seq::from(2),
                attempts: 4,
            },
            Change::Release {
                seq: Seq::from(3),
                not_before_us: 77,
                reason: "broker said 503".into(),
            },
            Change::Release {
                seq: Seq::from(4),
                not_before_us: 78,
                reason: long.as_str().into(),
            },
            Change::DeadLetter {
                seq: Seq::from(5),
                attempts: 6,
                reason: "refused".into(),
            },
            Change::Requeue(Seq::from(5)),
            Change::Discard(Seq::from(6)),
        ];
        let frames = encode(&changes);
        let kinds: Vec<FrameKind> = frames.iter().map(|f| f.0).collect();
        assert_eq!(kinds, [ATTEMPTS, RELEASE, DEAD_LETTER, REQUEUE_OR_DISCARD]);
        let back: Vec<Change> = frames
            .iter()
            .flat_map(|(k, p)| decode(*k, p).expect("decode"))
            .collect();
        let mut want = changes.clone();
        if let Change::Release { reason, .. } = &mut want[2] {
            *reason = clip(&long).into();
            assert!(reason.len() <= REASON_BYTES_MAX && reason.len() > REASON_BYTES_MAX - 2);
        }
        assert_eq!(back, want);
        // Cut short, or a bad code: refused, never a panic.
        let (k, p) = &frames[1];
        assert!(decode(*k, &p[..p.len() - 1]).is_err());
        assert!(decode(REQUEUE_OR_DISCARD, &[1, 0, 0, 0, 0, 0, 0, 0, 9]).is_err());
    }

    #[test]
    fn a_long_run_of_one_kind_is_split_over_frames_of_bounded_size() {
        let reason: Arc<str> = "x".repeat(100).into();
        let changes: Vec<Change> = (1..=50)
            .map(|s| Change::Release {
                seq: Seq::from(s),
                not_before_us: s,
                reason: reason.clone(),
            })
            .chain((51..=60).map(|s| Change::Discard(Seq::from(s))))
            .collect();
        // 118 bytes an entry: eight releases a frame of 1,000 bytes.
        let frames = encode_at_most(&changes, 1000);
        let kinds: Vec<FrameKind> = frames.iter().map(|f| f.0).collect();
        let mut want = vec![RELEASE; 7];
        want.push(REQUEUE_OR_DISCARD);
        assert_eq!(kinds, want);
        assert!(frames.iter().all(|(_, p)| p.len() <= 1000));
        let back: Vec<Change> = frames
            .iter()
            .flat_map(|(k, p)| decode(*k, p).expect("decode"))
            .collect();
        assert_eq!(back, changes);
        // Equal reasons of one frame share their text once decoded.
        let first = decode(frames[0].0, &frames[0].1).expect("decode");
        let reasons: Vec<&Arc<str>> = first
            .iter()
            .filter_map(|c| match c {
                Change::Release { reason, .. } => Some(reason),
                _ => None,
            })
            .collect();
        assert_eq!(reasons.len(), 8);
        assert!(reasons.iter().all(|r| Arc::ptr_eq(r, reasons[0])));
        let entries: usize = changes.iter().map(Change::entry_len).sum();
        let written: usize = frames.iter().map(|(_, p)| p.len()).sum();
        assert_eq!(entries, written, "entry_len is what encode writes");
    }
}
