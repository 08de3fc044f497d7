//! Finding the index checkpoints of a segment that was being written, so that
//! its scan starts at the last one instead of its first frame
//! (docs/FORMAT.md, "Index checkpoints").
//!
//! The writer starts the first sync group at or past every multiple of the
//! interval its header names with a checkpoint listing the frames before it.
//! Recovery looks for them in order: from each multiple (or the end of the
//! checkpoint before, if later) it reads block boundaries until one holds a
//! checkpoint frame that checks with the segment's keyed salt, and stops at
//! the first multiple after which it finds none within two intervals. Each one
//! found must continue the list exactly where the one before ended; anything
//! else (a checksum that holds on a list that does not fit) and recovery reads
//! the segment's frames from its first, as without checkpoints.
//!
//! Sound for the same reason a seal index is: a checkpoint starts a sync
//! group, so every frame it lists was fsynced before it was written, and its
//! checksum, keyed by the segment's secret nonce, proves segwal wrote it for
//! this segment. The frames it lists are checked when their records are read.

use std::io;

use crate::format::checkpoint::{self, CHECKPOINT};
use crate::format::frame::{self, FRAME_HEADER_LEN, FrameSpan};
use crate::format::frames::FrameList;
use crate::format::segment::{BLOCK, FRAMES_AT, SegmentHeader, align_up};
use crate::format::seq::{SegmentId, Seq};

use super::scan::LogStartMark;

/// What the checkpoints of a segment list, up to the last one found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Listed {
    /// Every frame from the segment's first to the last checkpoint, that one
    /// included (as an internal frame), in order.
    pub frames: FrameList,
    /// The highest log start a `LogStart` frame among them records, marked at
    /// the last frame before the last checkpoint.
    pub log_start: Option<LogStartMark>,
    /// Where the last checkpoint starts, and just past it.
    pub at: u64,
    pub end: u64,
    /// Its number: it starts its sync group.
    pub seq: Seq,
    /// Whether it ends its write batch.
    pub batch_end: bool,
    /// The offsets of every checkpoint found, in order.
    pub checkpoints: Vec<u32>,
}

impl Listed {
    /// The same, its frames left out: what a walk that takes the frames
    /// needs to hand the list back.
    pub(crate) fn without_frames(&self) -> Listed {
        Listed {
            frames: FrameList::new(),
            log_start: self.log_start,
            at: self.at,
            end: self.end,
            seq: self.seq,
            batch_end: self.batch_end,
            checkpoints: self.checkpoints.clone(),
        }
    }
}

/// How much is read at a time while looking for a checkpoint.
const CHUNK: usize = 64 << 10;

/// What is hinted after each multiple of the interval before the search
/// starts: a checkpoint usually lies within the first write batch after it,
/// and lists about 8 bytes per frame of the interval before it (128 KiB for
/// 4 MiB of 256-byte records).
const HINT_AFTER_MARK: u64 = 256 << 10;

/// The checkpoints of the segment `id` whose header is `header`, in a file of
/// `len` bytes (data up to `data_end`) read through `read`, which `hint`
/// tells of what is about to be read (offset, length): `None` if it has none
/// that can be trusted, and its frames are read from the first.
pub(crate) fn listed(
    hint: &dyn Fn(u64, u64),
    read: &dyn Fn(&mut [u8], u64) -> io::Result<()>,
    id: SegmentId,
    header: &SegmentHeader,
    len: u64,
    data_end: u64,
) -> Option<Listed> {
    if !checkpoint::valid_every(header.checkpoint_every) || header.nonce == 0 {
        return None;
    }
    let every = u64::from(header.checkpoint_every);
    let end = data_end.min(len);
    let salt = frame::salt(id, header.nonce);
    // The first blocks after every multiple are asked for at once.
    let mut mark = every;
    let mut hinted = 0;
    while mark < end && hinted < checkpoint::CHECKPOINTS_MAX {
        hint(mark, HINT_AFTER_MARK.min(end - mark));
        mark += every;
        hinted += 1;
    }
    let mut found: Option<Listed> = None;
    let mut offsets: Vec<u32> = Vec::new();
    let mut position = 0u64;
    let mut mark = every;
    while mark < end && offsets.len() < checkpoint::CHECKPOINTS_MAX {
        let from = align_up(found.as_ref().map_or(mark, |f| f.end.max(mark)));
        let until = (from + 2 * every).min(end);
        let Some((at, bytes)) = search(read, salt, from, until, len) else {
            break;
        };
        let mut cp = fit(&bytes, at, salt, id, &offsets, position, found.take())?;
        position = cp.seq.get() - id.first_seq().get() + 1;
        offsets.push(u32::try_from(at).ok()?);
        cp.checkpoints.clone_from(&offsets);
        mark = (at / every + 1) * every;
        found = Some(cp);
    }
    found
}

/// The first checkpoint frame of this segment on a block boundary from `from`
/// (a block boundary) up to `until`, in a file of `len` bytes: its offset and
/// bytes.
fn search(
    read: &dyn Fn(&mut [u8], u64) -> io::Result<()>,
    salt: u32,
    from: u64,
    until: u64,
    len: u64,
) -> Option<(u64, Vec<u8>)> {
    let mut buf = vec![0u8; CHUNK];
    let mut at = from;
    while at < until {
        let n = (until - at).min(CHUNK as u64) as usize;
        let chunk = buf.get_mut(..n)?;
        read(chunk, at).ok()?;
        for k in (0..n).step_by(BLOCK) {
            let Some(head) = chunk.get(k..k + FRAME_HEADER_LEN) else {
                break;
            };
            if frame::kind_of(head) != Some(CHECKPOINT) {
                continue;
            }
            let Some(claimed) = frame::claimed_len(head, salt) else {
                continue;
            };
            let offset = at + k as u64;
            // Nothing is allocated for a length the file cannot hold.
            if offset.saturating_add(claimed as u64) > len {
                continue;
            }
            let mut whole = vec![0u8; claimed];
            read(&mut whole, offset).ok()?;
            if frame::decode(&whole, salt).is_ok() {
                return Some((offset, whole));
            }
        }
        at += n as u64;
    }
    None
}

/// Checks that the checkpoint frame `bytes`, at `at`, continues the list
/// `before` (the checkpoints at `offsets`, listing frames up to `position`),
/// and returns the list with it. `None` if it does not fit: then nothing the
/// checkpoints say is used.
fn fit(
    bytes: &[u8],
    at: u64,
    salt: u32,
    id: SegmentId,
    offsets: &[u32],
    position: u64,
    before: Option<Listed>,
) -> Option<Listed> {
    let f = frame::decode(bytes, salt).ok()?;
    let h = f.header;
    let before_end = before.as_ref().map(|b| b.end);
    // Decoded onto the list so far: the segment's frames end in one vector.
    let base = before.as_ref().map_or(0, |b| b.frames.len());
    let cp = checkpoint::decode_onto(f.payload, before.map_or_else(FrameList::new, |b| b.frames))
        .ok()?;
    // It starts its sync group on a block, continues the list where the one
    // before ended, names every checkpoint before it, and its own number is
    // the next after the frames it lists.
    let n = (cp.frames.len() - base) as u64;
    let fits = h.kind == CHECKPOINT
        && h.group == h.seq
        && at.is_multiple_of(BLOCK as u64)
        && u64::from(cp.first) == position
        && cp.earlier == offsets
        && n > 0
        && h.seq.get() == id.first_seq().get().checked_add(position + n)?;
    if !fits {
        return None;
    }
    let first = u64::from(cp.frames.get(base)?.offset);
    let starts_right = match before_end {
        Some(end) => first == end || first == align_up(end),
        None => first == FRAMES_AT as u64,
    };
    let last = cp.frames.last()?;
    let last_end = last.end();
    if !starts_right || !(at == last_end || at == align_up(last_end)) {
        return None;
    }
    let last_listed = last.offset;
    let mut frames = cp.frames;
    frames.push(FrameSpan::new(
        u32::try_from(at).ok()?,
        u32::try_from(f.len).ok()?,
        false,
    ));
    Some(Listed {
        frames,
        log_start: cp.log_start.map(|value| LogStartMark {
            offset: last_listed,
            value,
        }),
        at,
        end: at + f.len as u64,
        seq: h.seq,
        batch_end: h.batch_end,
        checkpoints: Vec::new(),
    })
}
