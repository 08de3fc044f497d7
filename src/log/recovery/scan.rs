//! Reading one segment file: its header, its frames, and the first damage.
//!
//! [`scan`] is pure: a function of the file's bytes (and of where the file
//! system says data lies), so the crash cases can be tested without a disk.
//! [`scan_file`] opens, maps and scans one file of the directory.

use std::io;
use std::ops::Range;
use std::path::{Path, PathBuf};

use crate::error::{Corruption, Error, Result};
use crate::format::frame::{self, FrameKind, FrameSpan};
use crate::format::seal;
use crate::format::segment::{SEGMENT_HEADER_LEN, SegmentHeader};
use crate::format::seq::{SegmentId, Seq};
use crate::io::segment_file::SegmentFile;
use crate::io::{Mapped, Storage};
use crate::options::OpenCheck;

/// A segment's seal frame: the last frame of a sealed segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SealAt {
    /// The seal frame's sequence number (it may skip ahead of the frames).
    pub seq: Seq,
    /// Its offset in the file.
    pub offset: u32,
}

/// A `LogStart` frame: the log start it recorded, and where.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LogStartMark {
    /// The frame's offset (for a segment read through its seal index: the
    /// seal's, the index giving only the highest value).
    pub offset: u32,
    /// The log start it recorded.
    pub value: Seq,
}

/// A valid frame of a later sync group found after damage: proof that the
/// damaged bytes were fsynced, so not torn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Evidence {
    pub offset: u64,
    pub seq: Seq,
}

/// The first damage found in a segment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Damage {
    pub offset: u64,
    /// The sequence number that was expected at the damage.
    pub expected: Seq,
    pub cause: Corruption,
    /// Where a torn-tail truncation would cut: the start of the write batch
    /// holding the damage (0: the whole file, its header never became durable).
    pub batch_start: u64,
    /// The damage would be a torn tail if its segment is the newest one holding
    /// frames: no valid frame of a later sync group follows it, and no valid
    /// checksum vouches for the damaged bytes.
    pub tearable: bool,
    /// The first valid frame of a later sync group after the damage.
    pub evidence: Option<Evidence>,
    /// Highest sequence number in any valid frame after the damage.
    pub max_seen: Option<Seq>,
}

impl Damage {
    /// Damage at `offset`, in the write batch starting at `batch_start`, with
    /// nothing yet known of what follows it.
    pub(crate) fn at(
        offset: u64,
        expected: Seq,
        cause: Corruption,
        batch_start: u64,
        tearable: bool,
    ) -> Damage {
        Damage {
            offset,
            expected,
            cause,
            batch_start,
            tearable,
            evidence: None,
            max_seen: None,
        }
    }

    /// Damage that a valid checksum vouches for (a frame that does not fit the
    /// log was written so): corruption wherever it lies, never torn.
    fn structural(offset: usize, expected: Seq, batch_start: usize, cause: Corruption) -> Damage {
        Damage::at(offset as u64, expected, cause, batch_start as u64, false)
    }
}

/// What recovery read of one segment file. Pure data: what it decides from.
#[derive(Clone, Debug)]
pub(crate) struct SegmentScan {
    pub id: SegmentId,
    pub path: PathBuf,
    pub header: Option<SegmentHeader>,
    /// Every frame before the first damage, in order.
    pub frames: Vec<FrameSpan>,
    /// Every `LogStart` frame among them.
    pub log_starts: Vec<LogStartMark>,
    /// The seal frame, if the segment ends with one.
    pub seal: Option<SealAt>,
    /// The file's length.
    pub len: u64,
    pub damage: Option<Damage>,
}

impl SegmentScan {
    /// The highest log start recorded by a `LogStart` frame below `end`.
    pub(crate) fn log_start_below(&self, end: u64) -> Option<Seq> {
        self.log_starts
            .iter()
            .filter(|m| u64::from(m.offset) < end)
            .map(|m| m.value)
            .max()
    }

    /// The highest log start any of its frames records.
    pub(crate) fn log_start_marker(&self) -> Option<Seq> {
        self.log_starts.iter().map(|m| m.value).max()
    }
}

/// A segment file opened for recovery: what `apply` needs to change it.
pub(crate) struct Opened {
    pub segment: SegmentFile,
    /// The file as it was scanned.
    pub map: Mapped,
}

/// Where the file system says data may lie from an offset on: `None` when the
/// rest reads as zeros ([`StorageFile::next_data`](crate::io::StorageFile::next_data)).
pub(crate) type DataRegions<'a> = &'a dyn Fn(u64) -> io::Result<Option<Range<u64>>>;

/// Opens, maps and scans the segment `id` of `dir`. `sync` first makes what is
/// about to be read durable (the two newest files: see `recover`).
pub(crate) fn scan_file(
    storage: &dyn Storage,
    dir: &Path,
    id: SegmentId,
    check: OpenCheck,
    sync: bool,
) -> Result<(SegmentScan, Opened)> {
    let path = SegmentFile::path_of(dir, id);
    let file = storage
        .open(&path)
        .map_err(|e| Error::io("open segment", &path, e))?;
    if sync {
        file.sync_data()
            .map_err(|e| Error::io("sync segment", &path, e))?;
    }
    let len = file
        .len()
        .map_err(|e| Error::io("stat segment", &path, e))?;
    let map = file
        .map(len)
        .map_err(|e| Error::io("map segment", &path, e))?;
    let buf: &[u8] = (*map).as_ref();
    let scan = scan(id, path.clone(), buf, check, &|at| file.next_data(at));
    let segment = SegmentFile {
        id,
        path: path.into(),
        file,
    };
    Ok((scan, Opened { segment, map }))
}

/// Scans one segment file's bytes `buf`: header, frames, and the first damage
/// if any. Under [`OpenCheck::SealIndex`], a segment that ends with a seal
/// carrying a valid index is read through the index alone.
pub(crate) fn scan(
    id: SegmentId,
    path: PathBuf,
    buf: &[u8],
    check: OpenCheck,
    regions: DataRegions<'_>,
) -> SegmentScan {
    let mut scan = SegmentScan {
        id,
        path,
        header: None,
        frames: Vec::new(),
        log_starts: Vec::new(),
        seal: None,
        len: buf.len() as u64,
        damage: None,
    };
    if check == OpenCheck::SealIndex && scan_by_index(buf, id, &mut scan) {
        return scan;
    }
    if let Some(mut d) = scan_frames(buf, id, regions, &mut scan) {
        look_past(buf, id, &mut d);
        scan.damage = Some(d);
    }
    scan
}

/// Looks past the damage `d` for valid frames: one of a later sync group proves
/// the damaged one was fsynced, so it cannot be torn; and every number a valid
/// frame carries counts as seen. Every byte is read here, holes or not: this
/// runs only after damage, and a hole wrongly reported must not hide the frame
/// that proves it.
fn look_past(buf: &[u8], id: SegmentId, d: &mut Damage) {
    let salt = frame::salt(id);
    let mut at = (d.offset as usize).saturating_add(1);
    while let Some((found_at, f)) = frame::find_valid_frame(buf, at, buf.len(), salt) {
        let h = f.header;
        at = found_at + f.len.max(1);
        // A header is fsynced before any frame is written, so a valid frame after
        // a damaged header proves the header was once whole. After a damaged
        // frame, only a frame numbered after it counts: one numbered before it
        // cannot have been written there, and is treated as garbage.
        if d.offset != 0 && h.seq <= d.expected {
            continue;
        }
        d.max_seen = d.max_seen.max(Some(h.seq));
        if (d.offset == 0 || h.group > d.expected) && d.evidence.is_none() {
            d.tearable = false;
            d.evidence = Some(Evidence {
                offset: found_at as u64,
                seq: h.seq,
            });
        }
    }
}

/// Reads a sealed segment through the index in its seal frame, the last frame of
/// the file, found through the index's trailer. Fills `scan` and returns true if
/// the header, the seal and the index all check; otherwise leaves `scan` alone
/// and returns false, and the caller reads the segment whole.
///
/// Sound because a seal is written only after every frame before it is fsynced
/// (docs/FORMAT.md, "The seal index"): a seal that checks vouches for a segment
/// that was complete. Frames are checked when their records are read.
fn scan_by_index(buf: &[u8], id: SegmentId, scan: &mut SegmentScan) -> bool {
    let Ok(header) = SegmentHeader::decode(buf) else {
        return false;
    };
    if header.first_seq != id.first_seq() {
        return false;
    }
    let Some(seal_len) = seal::trailer(buf) else {
        return false;
    };
    let Some(at) = buf.len().checked_sub(seal_len) else {
        return false;
    };
    let Ok(f) = frame::decode(buf.get(at..).unwrap_or_default(), frame::salt(id)) else {
        return false;
    };
    if f.header.kind != FrameKind::Seal || f.len != seal_len {
        return false;
    }
    let Ok(index) = seal::decode(f.payload, at as u64) else {
        return false;
    };
    // The nonce proves the index was written for this segment by segwal: a
    // producer's payload cannot know it. (A nonce of 0 says: do not trust.)
    if header.nonce == 0 || index.nonce != header.nonce {
        return false;
    }
    // Numbers run on from the file's name; the seal may skip ahead.
    let n = index.frames.len() as u64;
    if f.header.seq.get() < id.first_seq().get().saturating_add(n) {
        return false;
    }
    let Ok(at32) = u32::try_from(at) else {
        return false;
    };
    scan.header = Some(header);
    scan.frames = index.frames;
    scan.frames.push(FrameSpan {
        offset: at32,
        len: seal_len as u32,
        is_record: false,
    });
    scan.seal = Some(SealAt {
        seq: f.header.seq,
        offset: at32,
    });
    // A segment read through its index is sealed: recovery never cuts it, so
    // the index's highest log start stands for all of its frames.
    scan.log_starts
        .extend(index.log_start.map(|value| LogStartMark {
            offset: at32,
            value,
        }));
    true
}

/// Checks the header of a segment named `id`: fills `scan.header`, or returns
/// the damage.
fn scan_header(buf: &[u8], id: SegmentId, scan: &mut SegmentScan) -> Option<Damage> {
    let first = id.first_seq();
    match SegmentHeader::decode(buf) {
        Ok(h) if h.first_seq != first => Some(Damage::at(
            0,
            first,
            Corruption::NameMismatch {
                expected: first,
                found: h.first_seq,
            },
            0,
            false,
        )),
        Ok(h) => {
            scan.header = Some(h);
            None
        }
        Err(cause) => {
            // The header is written and fsynced before any frame: a damaged header
            // is torn only if nothing valid follows it (checked by `look_past`).
            // A whole header from another version or with unknown flags, its
            // checksum valid, was written on purpose: never removed as torn.
            let tearable = matches!(
                cause,
                Corruption::ShortSegmentHeader { .. }
                    | Corruption::BadSegmentMagic
                    | Corruption::BadSegmentHeader
            );
            Some(Damage::at(0, first, cause, 0, tearable))
        }
    }
}

/// Where the walk over a segment's frames stands.
struct Walk {
    offset: usize,
    expected: Seq,
    /// Where the current write batch started.
    batch_start: usize,
    /// The sync group of the previous frame, and whether its write batch was
    /// still open.
    prev: Option<(Seq, bool)>,
}

/// Walks the frames after the header; fills `scan` and returns the first damage.
fn scan_frames(
    buf: &[u8],
    id: SegmentId,
    regions: DataRegions<'_>,
    scan: &mut SegmentScan,
) -> Option<Damage> {
    if let Some(d) = scan_header(buf, id, scan) {
        return Some(d);
    }
    let salt = frame::salt(id);
    let mut walk = Walk {
        offset: SEGMENT_HEADER_LEN,
        expected: id.first_seq(),
        batch_start: SEGMENT_HEADER_LEN,
        prev: None,
    };
    while walk.offset < buf.len() {
        let rest = buf.get(walk.offset..).unwrap_or_default();
        let f = match frame::decode(rest, salt) {
            Ok(f) => f,
            // Zeros up to the end of the file: space preallocated and never
            // written, the clean end of the data (unless a write batch is still
            // open, checked below).
            Err(_) if zeros_to_end(regions, buf, walk.offset) => break,
            Err(cause) => {
                let tearable = !frame::is_checksummed(&cause);
                return Some(Damage::at(
                    walk.offset as u64,
                    walk.expected,
                    cause,
                    walk.batch_start as u64,
                    tearable,
                ));
            }
        };
        if let Err(cause) = fit_frame(&walk, &f, scan) {
            return Some(Damage::structural(
                walk.offset,
                walk.expected,
                walk.batch_start,
                cause,
            ));
        }
        let h = f.header;
        walk.offset += f.len;
        walk.expected = h.seq.next();
        walk.prev = Some((h.group, !h.batch_end));
        if h.batch_end {
            walk.batch_start = walk.offset;
        }
    }
    if walk.prev.is_some_and(|p| p.1) {
        // The file ends inside a write batch: its last frames never reached disk.
        return Some(Damage::at(
            walk.offset as u64,
            walk.expected,
            Corruption::IncompleteBatch,
            walk.batch_start as u64,
            true,
        ));
    }
    None
}

/// Checks that the valid frame `f`, at `walk.offset`, fits the log so far, and
/// adds it to `scan`. A frame with a valid checksum that does not fit was not
/// torn: the error is corruption wherever it lies.
fn fit_frame(walk: &Walk, f: &frame::Frame<'_>, scan: &mut SegmentScan) -> Result<(), Corruption> {
    let h = f.header;
    if scan.seal.is_some() {
        return Err(Corruption::FrameAfterSeal);
    }
    // Seal frames may skip numbers: the writer seals a recovered segment with
    // a number above every one recovery saw, so that none is reused.
    let skips = h.kind == FrameKind::Seal && h.seq > walk.expected;
    if h.seq != walk.expected && !skips {
        return Err(Corruption::UnexpectedSeq {
            expected: walk.expected,
            found: h.seq,
        });
    }
    // A write batch lies inside one sync group; a new batch either continues
    // the group (buffered durability) or starts a new one at its own seq.
    let group_ok = match walk.prev {
        Some((group, true)) => h.group == group,
        Some((group, false)) => h.group == group || h.group == h.seq,
        None => h.group == h.seq,
    };
    if !group_ok {
        return Err(Corruption::BadGroup {
            expected: walk.prev.map_or(h.seq, |p| p.0),
            found: h.group,
        });
    }
    // Offsets fit in u32: segments are capped well below 4 GiB, and a longer
    // file cannot hold a frame past the cap without failing this conversion.
    let (Ok(offset), Ok(len)) = (u32::try_from(walk.offset), u32::try_from(f.len)) else {
        return Err(Corruption::LengthOutOfRange {
            len: (walk.offset + f.len) as u64,
            max: u64::from(u32::MAX),
        });
    };
    match h.kind {
        FrameKind::LogStart => {
            let Ok(bytes) = <[u8; 8]>::try_from(f.payload) else {
                return Err(Corruption::Unsupported {
                    what: "log start payload length",
                    value: f.payload.len() as u64,
                });
            };
            let value = Seq::from(u64::from_le_bytes(bytes));
            scan.log_starts.push(LogStartMark { offset, value });
        }
        FrameKind::Seal => {
            check_seal_index(f.payload, walk.offset as u64, scan)?;
            scan.seal = Some(SealAt { seq: h.seq, offset });
        }
        FrameKind::Record | FrameKind::Skippable(_) => {}
    }
    scan.frames.push(FrameSpan {
        offset,
        len,
        is_record: h.kind == FrameKind::Record,
    });
    Ok(())
}

/// A seal's index, if it carries one, must describe what was read.
fn check_seal_index(payload: &[u8], at: u64, scan: &SegmentScan) -> Result<(), Corruption> {
    if payload.is_empty() {
        return Ok(());
    }
    let index = seal::decode(payload, at)?;
    let nonce = scan.header.map_or(0, |h| h.nonce);
    let what = if index.nonce != nonce {
        "nonce differs from the segment header's"
    } else if index.frames != scan.frames {
        "frames differ from the segment's"
    } else if index.log_start != scan.log_start_marker() {
        "log start differs from the segment's"
    } else {
        return Ok(());
    };
    Err(Corruption::BadSealIndex { what })
}

/// The file's next region that may hold data, from `at` on, as offsets into
/// `buf` (the file's view): `None` if the rest reads as zeros. A file system
/// that cannot tell reports the rest as data; so does a failed query.
fn data_region(regions: DataRegions<'_>, buf: &[u8], at: usize) -> Option<(usize, usize)> {
    if at >= buf.len() {
        return None;
    }
    let whole = Some((at, buf.len()));
    let Ok(region) = regions(at as u64) else {
        return whole;
    };
    let r = region?;
    let (Ok(start), Ok(end)) = (usize::try_from(r.start), usize::try_from(r.end)) else {
        return whole;
    };
    let start = start.max(at);
    if start >= buf.len() {
        return None;
    }
    // A region that makes no progress is not trusted.
    Some((
        start,
        if end > start {
            end.min(buf.len())
        } else {
            buf.len()
        },
    ))
}

/// Whether every byte of `buf` from `from` on is zero: the clean end of a
/// preallocated segment. Asks the file where its data lies, so that space
/// preallocated and never written (most of a new segment's file) is not read;
/// but at least the next 4 KiB (to a page boundary) are read first, so that a
/// file system that wrongly reports a hole cannot overrule the bytes that just
/// failed to decode.
fn zeros_to_end(regions: DataRegions<'_>, buf: &[u8], from: usize) -> bool {
    let page = from
        .saturating_add(PAGE)
        .next_multiple_of(PAGE)
        .min(buf.len());
    if !all_zero(buf.get(from..page).unwrap_or_default()) {
        return false;
    }
    let mut at = page;
    while let Some((start, end)) = data_region(regions, buf, at) {
        if !all_zero(buf.get(start..end).unwrap_or_default()) {
            return false;
        }
        at = end;
    }
    true
}

/// The granularity at which file systems report holes, and the bytes
/// [`zeros_to_end`] reads before it asks.
const PAGE: usize = 4096;

/// Whether every byte of `buf` is zero. Runs over a whole preallocated tail at
/// each open, so it compares eight bytes at a time.
fn all_zero(buf: &[u8]) -> bool {
    let chunks = buf.chunks_exact(8);
    let tail = chunks.remainder();
    chunks
        .map(|c| u64::from_ne_bytes(c.try_into().unwrap_or([1; 8])))
        .fold(0, |acc, w| acc | w)
        == 0
        && tail.iter().all(|&b| b == 0)
}
