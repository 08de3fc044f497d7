//! The delivery state the log recorded: the acknowledgements in its acks
//! frames (docs/FORMAT.md, "Frame kinds"), read once recovery has settled
//! which segments and frames are kept.
//!
//! Acks frames are internal frames, found through each segment's frame list
//! (the seal index of a sealed segment, the scan of the newest) without reading
//! the records: a frame's 48-byte header says its kind, and only acks frames
//! are read whole. An acks frame that cannot be read or does not check is
//! skipped: its records are delivered once more, as at-least-once allows; the
//! records themselves are checked when they are claimed.

use super::RecoveredSegment;
use crate::format::acks;
use crate::format::frame::{self, FRAME_HEADER_LEN};
use crate::format::seq::Seq;
use crate::io::{Storage, read_exact_at};

/// Every range of sequence numbers the kept acks frames acknowledge.
pub(crate) fn recorded_acks(
    storage: &dyn Storage,
    segments: &[RecoveredSegment],
) -> Vec<(Seq, Seq)> {
    let mut ranges = Vec::new();
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
            if read_exact_at(&*file, &mut header, at).is_err()
                || frame::kind_of(&header) != Some(frame::ACKS)
            {
                continue;
            }
            whole.resize(span.len as usize, 0);
            if read_exact_at(&*file, &mut whole, at).is_err() {
                continue;
            }
            let Ok(f) = frame::decode(&whole, seg.salt) else {
                continue;
            };
            if f.header.kind == frame::ACKS
                && let Ok(found) = acks::decode(f.payload)
            {
                ranges.extend(found);
            }
        }
    }
    ranges
}
