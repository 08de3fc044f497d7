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
        reason: String,
    },
    /// Parked as a dead letter after `attempts` deliveries.
    DeadLetter {
        seq: Seq,
        attempts: u32,
        reason: String,
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
}

/// `reason` cut to [`REASON_BYTES_MAX`] bytes, on a character boundary.
pub(crate) fn clip(reason: &str) -> String {
    let mut end = reason.len().min(REASON_BYTES_MAX);
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    reason.get(..end).unwrap_or_default().to_owned()
}

fn put_reason(out: &mut Vec<u8>, reason: &str) {
    let reason = clip(reason);
    out.extend_from_slice(&(reason.len() as u16).to_le_bytes());
    out.extend_from_slice(reason.as_bytes());
}

/// The frames for `changes`, in order: runs of one kind share a frame.
pub(crate) fn encode(changes: &[Change]) -> Vec<(FrameKind, Vec<u8>)> {
    let mut frames: Vec<(FrameKind, Vec<u8>)> = Vec::new();
    for change in changes {
        let kind = match change {
            Change::Attempts { .. } => ATTEMPTS,
            Change::Release { .. } => RELEASE,
            Change::DeadLetter { .. } => DEAD_LETTER,
            Change::Requeue(_) | Change::Discard(_) => REQUEUE_OR_DISCARD,
        };
        if frames.last().is_none_or(|(k, _)| *k != kind) {
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

fn reason_of(rest: &mut &[u8]) -> Result<String, Corruption> {
    let len = u16::from_le_bytes(take(rest, 2)?.try_into().unwrap_or_default()) as usize;
    // The writer never writes more than the limit; a frame that says
    // otherwise holds no more than it in memory either.
    Ok(clip(&String::from_utf8_lossy(take(rest, len)?)))
}

/// The changes a frame of `kind` (release, dead letter, requeue or discard)
/// with `payload` records. Never panics.
pub(crate) fn decode(kind: FrameKind, payload: &[u8]) -> Result<Vec<Change>, Corruption> {
    let mut rest = payload;
    let mut out = Vec::new();
    while !rest.is_empty() {
        let change = if kind == ATTEMPTS {
            let seq = seq_of(&mut rest)?;
            let attempts = u32::from_le_bytes(take(&mut rest, 4)?.try_into().unwrap_or_default());
            Change::Attempts { seq, attempts }
        } else if kind == RELEASE {
            Change::Release {
                seq: seq_of(&mut rest)?,
                not_before_us: u64_of(&mut rest)?,
                reason: reason_of(&mut rest)?,
            }
        } else if kind == DEAD_LETTER {
            let seq = seq_of(&mut rest)?;
            let attempts = u32::from_le_bytes(take(&mut rest, 4)?.try_into().unwrap_or_default());
            Change::DeadLetter {
                seq,
                attempts,
                reason: reason_of(&mut rest)?,
            }
        } else if kind == REQUEUE_OR_DISCARD {
            let seq = seq_of(&mut rest)?;
            match take(&mut rest, 1)? {
                [1] => Change::Requeue(seq),
                [2] => Change::Discard(seq),
                other => {
                    return Err(Corruption::Unsupported {
                        what: "requeue-or-discard code",
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
                reason: long.clone(),
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
            *reason = clip(&long);
            assert!(reason.len() <= REASON_BYTES_MAX && reason.len() > REASON_BYTES_MAX - 2);
        }
        assert_eq!(back, want);
        // Cut short, or a bad code: refused, never a panic.
        let (k, p) = &frames[1];
        assert!(decode(*k, &p[..p.len() - 1]).is_err());
        assert!(decode(REQUEUE_OR_DISCARD, &[1, 0, 0, 0, 0, 0, 0, 0, 9]).is_err());
    }
}
