//! The delivery state the log recorded: acknowledgements, releases with a
//! delay, dead letters, requeues (docs/FORMAT.md, "Frame kinds"), read once
//! recovery has settled which segments and frames are kept, in log order.
//!
//! These are internal frames, found through each segment's frame list (the
//! seal index of a sealed segment, the scan of the newest) without reading the
//! records: a frame's 48-byte header says its kind, and only delivery-state
//! frames are read whole. One that cannot be read or does not check is
//! skipped: its records are delivered once more (or at once), as at-least-once
//! allows; the records themselves are checked when they are claimed.

use super::RecoveredSegment;
use crate::format::acks;
use crate::format::delivery::{self, Change};
use crate::format::frame::{self, FRAME_HEADER_LEN};
use crate::format::seq::Seq;
use crate::io::{Storage, read_exact_at};

/// One change of delivery state the log recorded.
pub(crate) enum Recorded {
    /// Records acknowledged.
    Acks(Seq, Seq),
    /// Another change, with the time its frame was written (µs since the Unix
    /// epoch).
    Change(Change, u64),
}

/// Every change the kept delivery-state frames record, in log order.
pub(crate) fn recorded_state(
    storage: &dyn Storage,
    segments: &[RecoveredSegment],
) -> Vec<Recorded> {
    let mut out = Vec::new();
    for seg in segments {
        let mut internal = seg.frames.iter().filter(|f| !f.is_record).peekable();
        if internal.peek().is_none() {
            continue;
        }
        let Ok(file) = storage.open(&seg.path) else {
            continue;
        };
        let mut header = [0u8; FRAME_HEADER_LEN];
        let mut whole = Vec::new();
        for span in internal {
            let at = u64::from(span.offset);
            if read_exact_at(&*file, &mut header, at).is_err() {
                continue;
            }
            let Some(kind) = frame::kind_of(&header) else {
                continue;
            };
            let known = [
                frame::ACKS,
                delivery::RELEASE,
                delivery::DEAD_LETTER,
                delivery::REQUEUE_OR_DISCARD,
            ];
            if !known.contains(&kind) {
                continue;
            }
            whole.resize(span.len as usize, 0);
            if read_exact_at(&*file, &mut whole, at).is_err() {
                continue;
            }
            let Ok(f) = frame::decode(&whole, seg.salt) else {
                continue;
            };
            if f.header.kind == frame::ACKS {
                if let Ok(found) = acks::decode(f.payload) {
                    out.extend(found.into_iter().map(|(a, b)| Recorded::Acks(a, b)));
                }
            } else if let Ok(changes) = delivery::decode(f.header.kind, f.payload) {
                let at = f.header.timestamp_us;
                out.extend(changes.into_iter().map(|c| Recorded::Change(c, at)));
            }
        }
    }
    out
}
