//! Reading one segment file: its header, its frames, and the first damage.
//!
//! [`scan`] is pure: a function of the file's bytes (and of where the file
//! system says data lies), so the crash cases can be tested without a disk.
//! [`scan_file`] opens, reads and scans one file of the directory.

use std::io;
use std::ops::Range;
use std::path::{Path, PathBuf};

use crate::error::{Corruption, Error, Result};
use crate::format::checkpoint::{self, CHECKPOINT};
use crate::format::frame::{self, FRAME_HEADER_LEN, FrameKind, FrameSpan};
use crate::format::frames::FrameList;
use crate::format::seal;
use crate::format::segment::{BLOCK, FRAMES_AT, SegmentHeader};
use crate::format::seq::{SEQ_MAX, SegmentId, Seq};
use crate::io::segment_file::SegmentFile;
use crate::io::{Storage, StorageFile};
use crate::options::OpenCheck;

use super::checkpoints::{self, Listed};

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
    /// The highest number the bytes after the damage could hold, whether or
    /// not their frames can be found: none up to it is assigned again.
    pub could_hold: Option<Seq>,
    /// The end of what the segment's own checksums name from the damage on,
    /// once looked for: the damaged frame as long as its header says when
    /// that header checks, and the frames that follow it one after another.
    /// Not the zeros of the space a segment preallocates, nor the older
    /// bytes of a recycled file (their checksums are another segment's).
    pub written_end: Option<u64>,
    /// The own numbers of the relocated records in the valid frames found
    /// after the damage (each sync group's frames from its first on): copies
    /// that a lossy repair drops with the damage, and names.
    pub relocated: Vec<Seq>,
    /// The ranges of acknowledgements in those frames: a copy acknowledged
    /// is not named.
    pub acked: Vec<(Seq, Seq)>,
    /// The records named by the other changes of delivery state in those
    /// frames (attempts aside): a repair says how many records it keeps
    /// lose one.
    pub changed: Vec<Seq>,
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
            could_hold: None,
            written_end: None,
            relocated: Vec::new(),
            acked: Vec::new(),
            changed: Vec::new(),
        }
    }

    /// Damage that a valid checksum vouches for (a frame that does not fit the
    /// log was written so): corruption wherever it lies, never torn.
    fn structural(offset: usize, expected: Seq, batch_start: usize, cause: Corruption) -> Damage {
        Damage::at(offset as u64, expected, cause, batch_start as u64, false)
    }
}

/// What recovery read of one segment file. Pure data: what it decides from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct SegmentScan {
    pub id: SegmentId,
    pub path: PathBuf,
    pub header: Option<SegmentHeader>,
    /// Every frame before the first damage, in order.
    pub frames: FrameList,
    /// Every `LogStart` frame among them.
    pub log_starts: Vec<LogStartMark>,
    /// The seal frame, if the segment ends with one.
    pub seal: Option<SealAt>,
    /// The file's length.
    pub len: u64,
    pub damage: Option<Damage>,
    /// Its header does not check and every byte of it reads as zero: a file
    /// that holds nothing, whoever made it. The one kind of file with a damaged
    /// header that recovery may remove (docs/FORMAT.md, "Creating a segment").
    pub blank: bool,
    /// Frames taken from index checkpoints rather than read.
    pub listed: u64,
}

impl SegmentScan {
    /// What is known of a file of `len` bytes before any of it is read.
    pub(super) fn empty(id: SegmentId, path: PathBuf, len: u64) -> SegmentScan {
        SegmentScan {
            id,
            path,
            header: None,
            frames: FrameList::new(),
            log_starts: Vec::new(),
            seal: None,
            len,
            damage: None,
            blank: false,
            listed: 0,
        }
    }

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

/// A segment file recovery read: what `apply` needs to open it again. No file
/// stays open between the scan and `apply`, so that a backlog of thousands of
/// segments needs no more descriptors than two (the newest, scanned beside
/// the others, and the one being read).
pub(crate) struct Opened {
    pub id: SegmentId,
    pub path: std::sync::Arc<Path>,
}

impl Opened {
    /// Opens the file again, for `apply` to change it or for the writer.
    pub(crate) fn open(&self, storage: &dyn Storage) -> Result<SegmentFile> {
        let file = storage
            .open(&self.path)
            .map_err(|e| Error::io("open segment", &*self.path, e))?;
        Ok(SegmentFile {
            id: self.id,
            path: self.path.clone(),
            file,
        })
    }
}

/// The bytes of one segment file, by offset: the whole file in memory
/// ([`Whole`]), or a window over it that moves on as the walk does
/// ([`Window`]). The walk over the frames is written once, against this.
pub(crate) trait Bytes {
    /// The file's length.
    fn len(&self) -> usize;
    /// Up to `n` bytes from `at`: fewer only where the file ends.
    fn get(&mut self, at: usize, n: usize) -> &[u8];
    /// The bytes from `at` on that were read from the file already and are
    /// still in memory (none by default): checked where the file system
    /// says a hole lies, at no cost in reads.
    fn held_from(&self, at: usize) -> &[u8] {
        let _ = at;
        &[]
    }
}

/// A whole file's bytes in memory.
pub(crate) struct Whole<'a>(pub &'a [u8]);

impl Bytes for Whole<'_> {
    fn len(&self) -> usize {
        self.0.len()
    }

    fn get(&mut self, at: usize, n: usize) -> &[u8] {
        let end = at.saturating_add(n).min(self.0.len());
        self.0.get(at..end).unwrap_or_default()
    }

    /// All of it: what was not read reads as the zeros it was allocated with.
    fn held_from(&self, at: usize) -> &[u8] {
        self.0.get(at..).unwrap_or_default()
    }
}

/// How much a [`Window`] reads at a time (1 MiB), and how much of the file
/// it holds unless a frame is larger.
const WINDOW: usize = 1 << 20;

/// A file read through one reused buffer as the walk moves on, so that
/// scanning the newest segment (tens of megabytes after a crash) touches 1 MiB
/// of fresh memory rather than the file's size. A read that fails leaves the
/// window empty there and is kept in `failed`: the caller then reads the file
/// whole, and reports the error naming the file and offset.
pub(crate) struct Window<'a> {
    read: &'a dyn Fn(&mut [u8], u64) -> io::Result<()>,
    len: usize,
    /// The file offset of `buf[0]`, and how many bytes of `buf` hold the file.
    base: usize,
    filled: usize,
    buf: Vec<u8>,
    /// How much it reads at a time, unless a frame is larger.
    chunk: usize,
    pub failed: Option<io::Error>,
}

impl<'a> Window<'a> {
    /// A window over a file of `len` bytes that `read` reads (all of a buffer,
    /// at an offset).
    pub(crate) fn new(read: &'a dyn Fn(&mut [u8], u64) -> io::Result<()>, len: usize) -> Self {
        Window::with_chunk(read, len, WINDOW)
    }

    /// The same, reading `chunk` bytes at a time (tests use small ones, so that
    /// frames straddle the window's edge).
    pub(crate) fn with_chunk(
        read: &'a dyn Fn(&mut [u8], u64) -> io::Result<()>,
        len: usize,
        chunk: usize,
    ) -> Self {
        Window {
            read,
            len,
            base: 0,
            filled: 0,
            buf: Vec::new(),
            chunk: chunk.max(1),
            failed: None,
        }
    }
}

impl Bytes for Window<'_> {
    fn len(&self) -> usize {
        self.len
    }

    fn held_from(&self, at: usize) -> &[u8] {
        let end = self.base + self.filled;
        if at < self.base || at >= end {
            return &[];
        }
        self.buf
            .get(at - self.base..self.filled)
            .unwrap_or_default()
    }

    fn get(&mut self, at: usize, n: usize) -> &[u8] {
        self.read_from(at, n, self.chunk)
    }
}

impl Window<'_> {
    /// Up to `n` bytes from `at`, reading at least `least` bytes from `at`
    /// (to the file's end) if they are not held already.
    fn read_from(&mut self, at: usize, n: usize, least: usize) -> &[u8] {
        let end = at.saturating_add(n).min(self.len);
        if at >= end {
            return &[];
        }
        let held = at >= self.base && end <= self.base + self.filled;
        if !held {
            let want = (end - at).max(least).min(self.len - at);
            if self.buf.len() < want {
                self.buf.resize(want, 0);
            }
            self.base = at;
            self.filled = 0;
            let part = self.buf.get_mut(..want).unwrap_or_default();
            match (self.read)(part, at as u64) {
                Ok(()) => self.filled = want,
                Err(e) => {
                    self.failed.get_or_insert(e);
                    return &[];
                }
            }
        }
        self.buf
            .get(at - self.base..end - self.base)
            .unwrap_or_default()
    }
}

/// Decodes the frame at `at` of `src`: its header first, then, if the header's
/// own checksum holds, the whole length it claims. The same outcome as decoding
/// the file's bytes from `at` on: a frame is judged on its own bytes only.
fn frame_at(src: &mut dyn Bytes, at: usize, salt: u32) -> Result<frame::Frame<'_>, Corruption> {
    let claimed = frame::claimed_len(src.get(at, FRAME_HEADER_LEN), salt);
    frame::decode(src.get(at, claimed.unwrap_or(FRAME_HEADER_LEN)), salt)
}

/// Walks the frames of a segment through a [`Window`], for a file expected to
/// be whole: `None` as soon as anything is not (a header that does not check,
/// damage, a read that failed), and the caller scans the file whole, which
/// finds the same and looks past it. Otherwise the same scan as [`scan`] makes
/// under [`OpenCheck::EveryFrame`].
///
/// With `listed` (what the segment's index checkpoints list), the walk
/// starts just past the last checkpoint, taking the frames before it from the
/// list, as a sealed segment's are taken from its seal index. Where the file
/// is not whole, the list is handed back (`Err`, boxed: it is the larger
/// side) for the walk of the bytes read into memory, not copied beforehand:
/// it is megabytes long.
pub(crate) fn scan_window(
    id: SegmentId,
    path: PathBuf,
    src: &mut Window<'_>,
    regions: DataRegions<'_>,
    listed: Option<Listed>,
) -> Result<SegmentScan, Option<Box<Listed>>> {
    let mut scan = SegmentScan::empty(id, path, src.len() as u64);
    // A walk that starts past the checkpoints starts far from the header:
    // only the header's block is read for it.
    let least = if listed.is_some() {
        FRAMES_AT
    } else {
        src.chunk
    };
    let block = src.read_from(0, FRAMES_AT, least).to_vec();
    if scan_header(&block, id, &mut scan).is_some() {
        return Err(listed.map(Box::new));
    }
    let Some(listed) = listed else {
        if scan_frames(src, id, regions, &mut scan, None).is_some() || src.failed.is_some() {
            return Err(None);
        }
        return Ok(scan);
    };
    let rest = listed.without_frames();
    let taken = listed.frames.len();
    if scan_frames(src, id, regions, &mut scan, Some(listed)).is_some() || src.failed.is_some() {
        // The walk took the list's frames first, and only added to them.
        let mut frames = scan.frames;
        let whole = frames.len() >= taken && scan.listed == taken as u64;
        frames.truncate(taken);
        return Err(whole.then(|| Box::new(Listed { frames, ..rest })));
    }
    Ok(scan)
}

/// Checks, for segwal's own tests, that walking `bytes` through a [`Window`]
/// of `chunk` bytes gives the same scan as reading them whole, whenever the
/// window's walk finds the file whole (otherwise the whole read decides).
#[cfg(any(test, feature = "testing"))]
pub(crate) fn check_window_matches_whole(id: SegmentId, bytes: &[u8], chunk: usize) {
    let len = bytes.len() as u64;
    let regions = |at: u64| Ok((at < len).then_some(at..len));
    let read = |part: &mut [u8], at: u64| -> io::Result<()> {
        let from = usize::try_from(at).unwrap_or(usize::MAX);
        let src = bytes
            .get(from..from.saturating_add(part.len()))
            .ok_or_else(|| io::Error::from(io::ErrorKind::UnexpectedEof))?;
        part.copy_from_slice(src);
        Ok(())
    };
    let path = PathBuf::from(id.file_name());
    let whole = scan(id, path.clone(), bytes, OpenCheck::EveryFrame, &regions);
    let mut window = Window::with_chunk(&read, bytes.len(), chunk);
    if let Ok(windowed) = scan_window(id, path.clone(), &mut window, &regions, None) {
        assert_eq!(windowed, whole, "window of {chunk} bytes");
    }
    // Through its index checkpoints, where they chain, the same frames and
    // the same damage, unless the damage lies before the last checkpoint
    // (bit rot there is found when the record is read, as in a sealed
    // segment read through its seal index).
    let Ok(header) = SegmentHeader::decode(bytes) else {
        return;
    };
    let Some(listed) = checkpoints::listed(&|_, _| {}, &read, id, &header, len, len) else {
        return;
    };
    if whole.damage.as_ref().is_some_and(|d| d.offset < listed.end) {
        return;
    }
    let taken = listed.frames.len() as u64;
    let same = |through: &SegmentScan, how: &str| {
        assert_eq!(through.frames, whole.frames, "{how}: frames");
        assert_eq!(through.damage, whole.damage, "{how}: damage");
        assert_eq!(through.seal, whole.seal, "{how}: seal");
        assert_eq!(
            through.log_start_marker(),
            whole.log_start_marker(),
            "{how}: log start"
        );
        assert_eq!(through.listed, taken, "{how}: listed");
    };
    let mut window = Window::with_chunk(&read, bytes.len(), chunk);
    let listed = match scan_window(
        id,
        path.clone(),
        &mut window,
        &regions,
        Some(listed.clone()),
    ) {
        Ok(through) => {
            same(&through, "window through checkpoints");
            listed
        }
        // Handed back whole, as it was given.
        Err(back) => {
            assert_eq!(back.as_deref(), Some(&listed), "the list handed back");
            listed
        }
    };
    let through = walk_whole(id, path, bytes, &regions, Some(listed));
    same(&through, "whole through checkpoints");
}

/// Where the file system says data may lie from an offset on: `None` when the
/// rest reads as zeros ([`StorageFile::next_data`](crate::io::StorageFile::next_data)).
pub(crate) type DataRegions<'a> = &'a dyn Fn(u64) -> io::Result<Option<Range<u64>>>;

/// How many older segments [`prefetch_seals`] asks for at once: their
/// reads in flight together, without holding a descriptor per segment of a
/// long log.
pub(crate) const PREFETCH_SEALS: usize = 16;

/// Tells the file system of the reads a sealed segment's open makes, for
/// every one of `ids` at once. Cold, each costs three reads that wait on one
/// another (its header, the trailer at its end that gives the seal's length,
/// then the seal index, about 7 bytes per record); asked one segment after
/// another they take the device's latency three times per segment. Here the
/// headers and trailers of all are asked for first, then every seal index,
/// so the device serves them together and [`scan_file`] finds them cached.
/// Only a hint: a file that cannot be opened or read is left to
/// [`scan_file`], which reports it.
pub(crate) fn prefetch_seals(storage: &dyn Storage, dir: &Path, ids: &[SegmentId]) {
    let files: Vec<(std::sync::Arc<dyn StorageFile>, u64)> = ids
        .iter()
        .filter_map(|&id| {
            let file = storage.open_read(&SegmentFile::path_of(dir, id)).ok()?;
            let len = file.len().ok()?;
            file.will_need(0, FRAMES_AT as u64);
            file.will_need(len.saturating_sub(TRAILER_READ), TRAILER_READ);
            Some((file, len))
        })
        .collect();
    for (file, len) in &files {
        let mut tail = [0u8; seal::TRAILER_LEN];
        let Some(at) = len.checked_sub(seal::TRAILER_LEN as u64) else {
            continue;
        };
        if crate::io::read_exact_at(&**file, &mut tail, at).is_err() {
            continue;
        }
        if let Some(seal_len) = seal::trailer(&tail) {
            let seal_len = (seal_len as u64).min(*len);
            file.will_need(len - seal_len, seal_len);
        }
    }
}

/// What [`prefetch_seals`] asks for at a segment's end before it knows the
/// seal's length: one page, the trailer's.
const TRAILER_READ: u64 = 4096;

/// Opens and scans the segment `id` of `dir`. `sync` first makes what is about
/// to be read durable (the two newest files: see `recover`).
///
/// The file is read with positioned reads into memory, one file at a time, and
/// never mapped: a read error is an error value, not a `SIGBUS`. Under
/// [`OpenCheck::SealIndex`] a sealed segment costs its header's block and its
/// seal (unless it is the `newest`, which is never read through whatever its
/// last bytes claim: a crash leaves it ending anywhere), and a segment that was
/// being written, its index checkpoints and the frames after the last one;
/// otherwise the regions where the file says data lies are read (and 4
/// KiB past each, so that a hole wrongly reported right after the data cannot
/// hide bytes that fail to decode), and, if that finds damage, every byte, so
/// that a frame beyond a wrongly reported hole still proves damage is not torn.
pub(crate) fn scan_file(
    storage: &dyn Storage,
    dir: &Path,
    id: SegmentId,
    check: OpenCheck,
    sync: bool,
    newest: bool,
    scratch: &mut Vec<u8>,
) -> Result<(SegmentScan, Opened)> {
    let path = SegmentFile::path_of(dir, id);
    // Without a sync to make, nothing is written: the file is opened read-only.
    let file = if sync {
        storage.open(&path)
    } else {
        storage.open_read(&path)
    }
    .map_err(|e| Error::io("open segment", &path, e))?;
    if sync {
        file.sync_data()
            .map_err(|e| Error::io("sync segment", &path, e))?;
    }
    let len = file
        .len()
        .map_err(|e| Error::io("stat segment", &path, e))?;
    // Frame offsets are 32-bit (the option limits keep every segment below
    // 4 GiB): a longer file is not one segwal wrote, and is refused before a
    // buffer of its length is asked for.
    let size = match usize::try_from(len) {
        Ok(size) if len <= u64::from(u32::MAX) => size,
        _ => {
            return Err(Error::Corrupt {
                path,
                offset: 0,
                seq: None,
                kind: Corruption::LengthOutOfRange {
                    len,
                    max: u64::from(u32::MAX),
                },
            });
        }
    };
    let read = |buf: &mut Vec<u8>, from: u64, to: u64| -> Result<()> {
        let to = to.min(len);
        if from >= to {
            return Ok(());
        }
        let range = buf.get_mut(from as usize..to as usize).unwrap_or_default();
        crate::io::read_exact_at(&*file, range, from)
            .map_err(|e| Error::io("read segment", &path, e))
    };
    // The header's block, and a sealed segment's seal read into `scratch`
    // (the caller's, reused from one segment to the next): an open reads
    // hundreds of seal indexes of megabytes each, and fresh memory for each
    // would cost it a page fault every 4 KiB.
    let mut head = vec![0u8; size.min(FRAMES_AT)];
    if check == OpenCheck::SealIndex {
        read(&mut head, 0, FRAMES_AT as u64)?;
    }
    // The file's last (up to) four bytes, its trailer if it is sealed.
    let tail_from = len.saturating_sub(4);
    let mut tail = [0u8; 4];
    let tail = tail
        .get_mut(..(len - tail_from) as usize)
        .unwrap_or_default();
    // Where the seal its trailer names starts; `Err` if it is longer than
    // the file.
    let mut seal_at = None;
    if check == OpenCheck::SealIndex && !newest {
        if !tail.is_empty() {
            crate::io::read_exact_at(&*file, tail, tail_from)
                .map_err(|e| Error::io("read segment", &path, e))?;
        }
        seal_at = seal::trailer(tail).map(|n| size.checked_sub(n).ok_or(()));
        if let Some(Ok(at)) = seal_at {
            scratch.clear();
            scratch.resize(size - at, 0);
            crate::io::read_exact_at(&*file, scratch, at as u64)
                .map_err(|e| Error::io("read segment", &path, e))?;
            if let Some(scan) = scan_sealed(id, path.clone(), &head, scratch, size) {
                return Ok((scan, opened(id, path)));
            }
        }
    }
    // Zeros until read: the allocation is lazy, and unread space reads as the
    // zeros a hole or preallocated space holds.
    let mut buf = vec![0u8; size];
    if let Some(block) = buf.get_mut(..head.len()) {
        block.iter_mut().zip(head.iter()).for_each(|(b, &h)| *b = h);
    }
    drop(head);
    // A sealed segment whose seal did not check is walked with what was read
    // of its end in `buf`: those bytes stand even where the file system calls
    // them a hole. A seal longer than the file is read as the file whole.
    if check == OpenCheck::SealIndex && !newest {
        // (Both lengths follow from the file's: never a panic, whatever
        // the bytes.)
        if let Some(end) = buf.get_mut(tail_from as usize..) {
            end.iter_mut().zip(tail.iter()).for_each(|(b, &t)| *b = t);
        }
        match seal_at {
            Some(Ok(at)) => {
                if let Some(end) = buf.get_mut(at..) {
                    end.iter_mut()
                        .zip(scratch.iter())
                        .for_each(|(b, &t)| *b = t);
                }
            }
            Some(Err(())) => read(&mut buf, 0, len)?,
            None => {}
        }
    }
    // Asked once, before a byte past the header and seal is read (see
    // `DataMap`); a sealed segment read through its index never asks.
    let map = DataMap::of(&*file, len);
    let read_at = |part: &mut [u8], at: u64| crate::io::read_exact_at(&*file, part, at);
    // A segment that was being written lists its frames in index
    // checkpoints: trusted as a seal index is, under the same check.
    let listed = if check == OpenCheck::SealIndex {
        SegmentHeader::decode(buf.get(..FRAMES_AT).unwrap_or_default())
            .ok()
            .filter(|h| h.first_seq == id.first_seq())
            .and_then(|h| {
                let hint = |at, n| file.will_need(at, n);
                checkpoints::listed(&hint, &read_at, id, &h, len, map.end())
            })
    } else {
        None
    };
    // Where the data lies past what the checkpoints list, the file system is
    // told at once, so that it reads it with many requests in flight rather
    // than a window at a time.
    let from = listed.as_ref().map_or(0, |l| l.end);
    for region in &map.regions {
        let start = region.start.max(from);
        file.will_need(start, region.end.saturating_sub(start));
    }
    let regions = |at| Ok(map.next(at));
    // Frame by frame through one reused buffer; only a file that is not whole
    // is read into memory whole.
    let mut window = Window::new(&read_at, size);
    let listed = match scan_window(id, path.clone(), &mut window, &regions, listed) {
        Ok(scan) => return Ok((scan, opened(id, path))),
        Err(listed) => listed.map(|l| *l),
    };
    // Asked again: the walk found the file not whole, and another process
    // (a `verify` or `dump` beside a running owner) may have written past
    // what the first map knew.
    let map = DataMap::of(&*file, len);
    let regions = |at| Ok(map.next(at));
    // What the checkpoints list is not read again: the file is read into
    // memory, and looked past its damage, from the last checkpoint on (its
    // header's block was read with the trailer).
    let from = listed.as_ref().map_or(0, |l| l.at as usize);
    let mut at = from;
    // How far every byte from there was read: where the data regions leave
    // no gap (a recycled file's old bytes are data to its end), the file is
    // in memory whole already.
    let mut read_to = from;
    while let Some((start, end)) = data_region(&regions, size, at) {
        read(&mut buf, start as u64, (end + PAGE) as u64)?;
        if start <= read_to {
            read_to = read_to.max(end + PAGE);
        }
        at = end;
    }
    let mut scan = walk_whole(id, path.clone(), &buf, &regions, listed.clone());
    if scan.damage.is_some() && read_to < size {
        read(&mut buf, from as u64, len)?;
        scan = walk_whole(id, path.clone(), &buf, &regions, listed);
    }
    Ok((scan, opened(id, path)))
}

/// Where a file's data may lie, asked of the file system once, before the
/// file is read, and answered from then on without asking again.
///
/// Asking as the scan goes would ask a file system that the scan itself has
/// misled: a read of space preallocated and never written (the window reads
/// a mebibyte at a time, and the kernel reads ahead of it) leaves pages of
/// zeros in the page cache, which a later `SEEK_DATA` reports as data. Each
/// answer then led the scan of a crashed newest segment further into its
/// preallocation, until it had read all of it: 68 MB for 36 MB of frames
/// (docs/BENCHMARKS.md, "Cold open"). Space written with zeros ahead of the
/// frames is data in the map, and is read as before.
struct DataMap {
    /// The regions, in order; past the last one the file holds no data.
    regions: Vec<Range<u64>>,
}

/// More regions than this (a file fragmented beyond anything segwal writes)
/// and the rest of the file counts as data.
const MAP_REGIONS_MAX: usize = 4096;

impl DataMap {
    /// The map of `file`, `len` bytes long. A query that fails, or makes no
    /// progress, makes the rest of the file count as data.
    fn of(file: &dyn StorageFile, len: u64) -> DataMap {
        let mut regions: Vec<Range<u64>> = Vec::new();
        let mut at = 0;
        while at < len {
            match file.next_data(at) {
                Ok(None) => break,
                Ok(Some(r))
                    if r.end > r.start && r.start >= at && regions.len() < MAP_REGIONS_MAX =>
                {
                    at = r.end;
                    regions.push(r);
                }
                _ => {
                    regions.push(at..len);
                    break;
                }
            }
        }
        DataMap { regions }
    }

    /// Where the last region ends: no data lies past it.
    fn end(&self) -> u64 {
        self.regions.last().map_or(0, |r| r.end)
    }

    /// The next region that may hold data from `at` on (`None`: the rest
    /// reads as zeros).
    fn next(&self, at: u64) -> Option<Range<u64>> {
        let i = self.regions.partition_point(|r| r.end <= at);
        self.regions.get(i).map(|r| r.start.max(at)..r.end)
    }
}

/// Whether the file at `path`, a segment whose creation was interrupted
/// (`<name>.creating`), provably holds nothing: every byte zero, or a whole
/// header block (header, then zeros) and only zeros after it. Reads the regions
/// where the file says data lies, in bounded chunks.
pub(crate) fn creation_holds_nothing(storage: &dyn Storage, path: &Path) -> Result<bool> {
    let file = storage
        .open_read(path)
        .map_err(|e| Error::io("open segment", path, e))?;
    let len = file.len().map_err(|e| Error::io("stat segment", path, e))?;
    let read = |buf: &mut [u8], at: u64| {
        crate::io::read_exact_at(&*file, buf, at).map_err(|e| Error::io("read segment", path, e))
    };
    let mut block = vec![0u8; FRAMES_AT.min(len as usize)];
    read(&mut block, 0)?;
    let header_block = SegmentHeader::decode(&block).is_ok_and(|h| h.encode_block() == block);
    if !header_block && !all_zero(&block) {
        return Ok(false);
    }
    let mut chunk = vec![0u8; 1 << 20];
    let mut at = FRAMES_AT as u64;
    while at < len {
        let region = file
            .next_data(at)
            .map_err(|e| Error::io("read segment", path, e))?;
        let Some(region) = region else { break };
        let start = region.start.max(at);
        if start >= len {
            break;
        }
        // A region that makes no progress is not trusted: read on to the end.
        let end = if region.end > start {
            region.end.min(len)
        } else {
            len
        };
        let n = (end - start).min(chunk.len() as u64) as usize;
        let part = chunk.get_mut(..n).unwrap_or_default();
        read(part, start)?;
        if !all_zero(part) {
            return Ok(false);
        }
        at = start + n as u64;
    }
    Ok(true)
}

/// Whether the file at `path`, kept for recycling (`<name>.seg.free`), proves
/// itself a segment file of the outbox `outbox_id`: its header decodes and
/// names that outbox. Such a file held only acknowledged records (it was
/// renamed only after the `LogStart` frame past it was durable), or, after a
/// crash in the middle of its recycling, a new header and nothing of the new
/// segment yet (a frame is written only once the file bears the segment's
/// name). Reads the header's block alone.
pub(crate) fn spare_is_ours(
    storage: &dyn Storage,
    path: &Path,
    outbox_id: Option<u128>,
) -> Result<bool> {
    let Some(outbox_id) = outbox_id else {
        return Ok(false);
    };
    let file = storage
        .open_read(path)
        .map_err(|e| Error::io("open segment", path, e))?;
    let len = file.len().map_err(|e| Error::io("stat segment", path, e))?;
    let mut block = vec![0u8; FRAMES_AT.min(len as usize)];
    crate::io::read_exact_at(&*file, &mut block, 0)
        .map_err(|e| Error::io("read segment", path, e))?;
    Ok(SegmentHeader::decode(&block).is_ok_and(|h| h.outbox_id == outbox_id))
}

fn opened(id: SegmentId, path: PathBuf) -> Opened {
    Opened {
        id,
        path: path.into(),
    }
}

/// Reads a sealed segment `len` bytes long through its seal index alone, from
/// its header's block `head` and the seal frame `seal` that ends the file:
/// `None` if they do not check.
fn scan_sealed(
    id: SegmentId,
    path: PathBuf,
    head: &[u8],
    seal: &[u8],
    len: usize,
) -> Option<SegmentScan> {
    let mut scan = SegmentScan::empty(id, path, len as u64);
    scan_by_seal(head, seal, len, id, &mut scan).then_some(scan)
}

/// Scans one segment file's bytes `buf`: header, frames, and the first damage
/// if any. Under [`OpenCheck::SealIndex`], a segment that ends with a seal
/// carrying a valid index is read through the index alone. (The pure form of
/// what [`scan_file`] does, for the crash cases' tests.)
#[cfg(any(test, feature = "testing"))]
pub(crate) fn scan(
    id: SegmentId,
    path: PathBuf,
    buf: &[u8],
    check: OpenCheck,
    regions: DataRegions<'_>,
) -> SegmentScan {
    if check == OpenCheck::SealIndex {
        let mut scan = SegmentScan::empty(id, path.clone(), buf.len() as u64);
        if scan_by_index(buf, id, &mut scan) {
            return scan;
        }
    }
    walk_whole(id, path, buf, regions, None)
}

/// Scans a segment file's bytes `buf` frame by frame: its header, then its
/// frames (with `listed`, those after the last index checkpoint, the frames
/// before it taken from the list), and, past the first damage, every block
/// boundary for a frame of a later sync group.
fn walk_whole(
    id: SegmentId,
    path: PathBuf,
    buf: &[u8],
    regions: DataRegions<'_>,
    listed: Option<Listed>,
) -> SegmentScan {
    let mut scan = SegmentScan::empty(id, path, buf.len() as u64);
    scan.damage = match scan_header(buf, id, &mut scan) {
        Some(d) => {
            // On the bytes themselves, never on where the file system says
            // data lies: this decides whether a file may be removed.
            scan.blank = scan.header.is_none() && all_zero(buf);
            Some(d)
        }
        None => scan_frames(&mut Whole(buf), id, regions, &mut scan, listed).map(|mut d| {
            let salt = scan.header.map_or(0, |h| frame::salt(id, h.nonce));
            look_past(buf, salt, regions, &mut d);
            d
        }),
    };
    scan
}

/// Looks past the damage `d` for a frame of a later sync group, which would
/// prove the damaged bytes were fsynced, so not torn. A later sync group always
/// starts on a fresh block, so only block boundaries are candidates, and a
/// candidate costs its header unless that header's own keyed checksum holds: the
/// search is linear in the bytes past the damage, whatever a payload holds.
/// Every byte is read here, holes or not: this runs only after damage, and a
/// hole wrongly reported must not hide the frame that proves it.
///
/// Numbers past the damage count as seen, so that none is assigned again: every
/// number a valid frame found here carries, and as many numbers after the
/// expected one as frames could fit in the bytes up to the last one that is not
/// zero (a frame is at least a header long), since frames of the damaged write
/// batch that did land cannot all be found once its start is gone.
fn look_past(buf: &[u8], salt: u32, regions: DataRegions<'_>, d: &mut Damage) {
    let mut at = (d.offset as usize).saturating_add(1);
    // The end of the frames read for relocated copies.
    let mut walked = 0;
    // The frames right after a damaged frame whose header holds (the damage
    // lies in its payload), for the copies they hold: a relocation step
    // writes its copies one after another in one sync group, and those
    // after the damaged one start on no block boundary. For naming only.
    let after = (d.offset as usize).saturating_add(
        buf.get(d.offset as usize..)
            .and_then(|h| frame::claimed_len(h, salt))
            .unwrap_or(0),
    );
    if after > d.offset as usize
        && let Some(f) = buf
            .get(after..)
            .and_then(|rest| frame::decode(rest, salt).ok())
            .filter(|f| f.header.seq.get() == d.expected.get() + 1)
    {
        walked = read_chain(buf, salt, f, after + f.len.max(1), d);
    }
    d.written_end = Some(after.max(walked) as u64);
    while let Some((found_at, f)) = frame::find_frame_on_block(buf, at, salt) {
        let h = f.header;
        at = found_at + f.len.max(1);
        // Only a frame numbered after the damage counts: one numbered before it
        // cannot have been written there, and is treated as garbage.
        if h.seq <= d.expected {
            continue;
        }
        // The frames that follow it, one after another, for the relocated
        // copies and the acknowledgements they hold: read with a cursor of
        // their own, so that the search for later groups, and all it
        // decides, is as it is without them; and only past the frames read
        // so already, so that each is read once this way (a copy found both
        // ways is named once).
        if found_at >= walked {
            walked = walked.max(read_chain(buf, salt, f, at, d));
        }
        d.max_seen = d.max_seen.max(Some(h.seq));
        if h.group > d.expected && d.evidence.is_none() {
            d.tearable = false;
            d.evidence = Some(Evidence {
                offset: found_at as u64,
                seq: h.seq,
            });
        }
    }
    let data_end = data_end(regions, buf, d.offset as usize);
    let room = data_end.saturating_sub(d.offset as usize) / FRAME_HEADER_LEN;
    if room > 0 {
        let bound = Seq::from(
            d.expected
                .get()
                .saturating_add(room as u64 - 1)
                .min(SEQ_MAX - 1),
        );
        d.could_hold = Some(bound);
    }
}

/// Reads the frame `first` and the frames that follow it one after another
/// (each numbered one past the one before, from `cursor`, the end of
/// `first`), into what `d` names: the own numbers of relocated copies, the
/// acknowledged ranges and the other changes of delivery state. Returns the end of the last frame read.
fn read_chain(
    buf: &[u8],
    salt: u32,
    first: frame::Frame<'_>,
    cursor: usize,
    d: &mut Damage,
) -> usize {
    let mut cursor = cursor;
    let mut next = Some(first);
    while let Some(f) = next.take() {
        if f.header.kind == FrameKind::Relocated
            && let Ok((own, _)) = crate::format::relocated::decode_ext(f.ext)
        {
            d.relocated.push(own);
        } else if f.header.kind == frame::ACKS
            && let Ok(ranges) = crate::format::acks::decode(f.payload)
        {
            d.acked.extend(ranges);
        } else if f.header.kind != crate::format::delivery::ATTEMPTS
            && let Ok(changes) = crate::format::delivery::decode(f.header.kind, f.payload)
        {
            d.changed
                .extend(changes.iter().map(crate::format::delivery::Change::seq));
        }
        let more = buf
            .get(cursor..)
            .and_then(|rest| frame::decode(rest, salt).ok());
        if let Some(g) = more.filter(|g| g.header.seq.get() == f.header.seq.get() + 1) {
            cursor += g.len.max(1);
            next = Some(g);
        }
    }
    cursor
}

/// The end of the last byte from `from` on that is not zero (`from` if none).
fn data_end(regions: DataRegions<'_>, buf: &[u8], from: usize) -> usize {
    let mut end = from;
    let mut at = from;
    while let Some((start, stop)) = data_region(regions, buf.len(), at) {
        if let Some(last) = buf
            .get(start..stop)
            .and_then(|r| r.iter().rposition(|&b| b != 0))
        {
            end = start + last + 1;
        }
        at = stop;
    }
    end
}

/// Reads a sealed segment through the index in its seal frame, the last frame of
/// the file, found through the index's trailer. Fills `scan` and returns true if
/// the header, the seal and the index all check; otherwise leaves `scan` alone
/// and returns false, and the caller reads the segment whole.
///
/// Sound because a seal is written only after every frame before it is fsynced
/// (docs/FORMAT.md, "The seal index"): a seal that checks vouches for a segment
/// that was complete. Frames are checked when their records are read.
#[cfg(any(test, feature = "testing"))]
fn scan_by_index(buf: &[u8], id: SegmentId, scan: &mut SegmentScan) -> bool {
    let Some(seal_len) = seal::trailer(buf) else {
        return false;
    };
    let Some(at) = buf.len().checked_sub(seal_len) else {
        return false;
    };
    scan_by_seal(buf, buf.get(at..).unwrap_or_default(), buf.len(), id, scan)
}

/// [`scan_by_index`] of a file `len` bytes long from the two parts it reads:
/// the file's start `head` (its header's block) and its last bytes `seal`, the
/// seal frame its trailer gives the length of.
fn scan_by_seal(
    head: &[u8],
    seal: &[u8],
    len: usize,
    id: SegmentId,
    scan: &mut SegmentScan,
) -> bool {
    let Ok(header) = SegmentHeader::decode(head) else {
        return false;
    };
    if header.first_seq != id.first_seq() {
        return false;
    }
    let seal_len = seal.len();
    let Some(at) = len.checked_sub(seal_len) else {
        return false;
    };
    let salt = frame::salt(id, header.nonce);
    let Ok(f) = frame::decode(seal, salt) else {
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
    scan.frames
        .push(FrameSpan::new(at32, seal_len as u32, false));
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
///
/// A new segment's header block is written and fsynced, then its directory,
/// before any frame is written to the file, and every write of frames starts
/// on a block boundary with a frame. So a damaged header with no frame magic
/// on any block boundary after its block (zeros, or the garbage a file system
/// can show in space it allocated but never wrote) is a creation a crash
/// interrupted, torn; a damaged header followed by a frame was fsynced once,
/// and is corruption. A whole header of another version or with unknown flags,
/// its checksum valid, was written on purpose: never torn.
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
            let garbled = matches!(
                cause,
                Corruption::ShortSegmentHeader { .. }
                    | Corruption::BadSegmentMagic
                    | Corruption::BadSegmentHeader
            );
            let frame_after = (FRAMES_AT..buf.len()).step_by(BLOCK).any(|at| {
                buf.get(at..)
                    .is_some_and(|b| b.starts_with(&frame::FRAME_MAGIC))
            });
            Some(Damage::at(0, first, cause, 0, garbled && !frame_after))
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
    /// The offsets of the index checkpoints met so far.
    checkpoints: Vec<u32>,
}

/// Walks the frames after the header (or, with `listed`, after the last
/// index checkpoint, the frames before it taken from the list); fills `scan`
/// and returns the first damage.
fn scan_frames(
    src: &mut dyn Bytes,
    id: SegmentId,
    regions: DataRegions<'_>,
    scan: &mut SegmentScan,
    listed: Option<Listed>,
) -> Option<Damage> {
    let salt = frame::salt(id, scan.header?.nonce);
    let mut walk = Walk {
        offset: FRAMES_AT,
        expected: id.first_seq(),
        batch_start: FRAMES_AT,
        prev: None,
        checkpoints: Vec::new(),
    };
    let listed = listed.and_then(|l| Some((usize::try_from(l.at).ok()?, l)));
    if let Some((at, l)) = listed {
        // As the walk would stand just past the checkpoint, had it read every
        // frame before it.
        let end = at + (l.end - l.at) as usize;
        walk.offset = end;
        walk.expected = l.seq.next();
        walk.batch_start = if l.batch_end { end } else { at };
        walk.prev = Some((l.seq, !l.batch_end));
        walk.checkpoints = l.checkpoints;
        scan.listed = l.frames.len() as u64;
        scan.frames = l.frames;
        scan.log_starts.extend(l.log_start);
    }
    while walk.offset < src.len() {
        // After the end of a write batch, zeros to the block boundary are the
        // padding before a new sync group, which starts on a fresh block.
        if walk.prev.is_some_and(|p| !p.1) && !walk.offset.is_multiple_of(BLOCK) {
            let boundary = walk.offset.next_multiple_of(BLOCK);
            if all_zero(src.get(walk.offset, boundary - walk.offset)) {
                // Zeros: padding, unless the frame on the boundary continues a
                // batch whose start (these zeros) never landed: then the batch
                // is torn here, where it began.
                if let Some(found) = continued_past(src, boundary, walk.expected, salt) {
                    return Some(Damage::at(
                        walk.offset as u64,
                        walk.expected,
                        Corruption::UnexpectedSeq {
                            expected: walk.expected,
                            found,
                        },
                        walk.batch_start as u64,
                        true,
                    ));
                }
                walk.offset = boundary;
                walk.batch_start = boundary;
                continue;
            }
            if padding_before(src, boundary, walk.expected, salt) {
                walk.offset = boundary;
                walk.batch_start = boundary;
                continue;
            }
        }
        let decoded = frame_at(src, walk.offset, salt);
        let f = match decoded {
            Ok(f) => f,
            Err(cause) => {
                // Zeros up to the end of the file: space preallocated and never
                // written, the clean end of the data (unless a write batch is
                // still open, checked below).
                if zeros_to_end(regions, src, walk.offset) {
                    break;
                }
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
        if h.kind == CHECKPOINT {
            walk.checkpoints.push(walk.offset as u32);
        }
        walk.offset += f.len;
        walk.expected = h.seq.next();
        walk.prev = Some((h.group, !h.batch_end));
        if h.batch_end {
            walk.batch_start = walk.offset;
        }
        if h.kind == FrameKind::Seal {
            // Nothing is written after a seal, which the file's end follows
            // unless the cut after it was lost: then preallocated zeros follow,
            // or, in a recycled file, what its old segment left there (which
            // fails this segment's checksums). A frame of this segment right
            // after it, or on the next block, is still damage.
            let next_block = walk.offset.next_multiple_of(BLOCK);
            if let Some(at) = [walk.offset, next_block]
                .into_iter()
                .find(|&at| at < src.len() && frame_at(src, at, salt).is_ok())
            {
                return Some(Damage::structural(
                    at,
                    walk.expected,
                    walk.batch_start,
                    Corruption::FrameAfterSeal,
                ));
            }
            break;
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

/// Whether the bytes before `boundary` are padding whatever they hold: the
/// frame numbered `expected` starts a new sync group right there. (Bytes of a
/// torn write batch that continued the group inside the block cannot be taken
/// for padding: the frame after them would be numbered past `expected`.) A bit
/// flipped in padding changes no record, and is not damage.
fn padding_before(src: &mut dyn Bytes, boundary: usize, expected: Seq, salt: u32) -> bool {
    frame_at(src, boundary, salt)
        .is_ok_and(|f| f.header.seq == expected && f.header.group == expected)
}

/// The number of the valid frame on `boundary`, if there is one that cannot
/// follow a frame numbered `expected - 1` across padding: not the next number,
/// and not a seal skipping ahead (recovery seals a segment on the block after
/// its last frame, with a number above every one seen). Under
/// `Durability::Buffered` a write batch continues its sync group inside a block;
/// if a power cut lost its first sectors (zeros) while a frame of it on the next
/// boundary landed, that frame is numbered past `expected`.
fn continued_past(src: &mut dyn Bytes, boundary: usize, expected: Seq, salt: u32) -> Option<Seq> {
    let f = frame_at(src, boundary, salt).ok()?;
    let h = f.header;
    let fits = h.seq == expected || (h.kind == FrameKind::Seal && h.seq > expected);
    (!fits).then_some(h.seq)
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
        FrameKind::Relocated => {
            // Its record must be named, with a state this build knows: a
            // relocated record that cannot be placed is refused, not skipped.
            crate::format::relocated::decode_ext(f.ext)?;
        }
        FrameKind::Fields => {
            // Every entry must read: a fields frame that cannot be applied
            // is refused, not skipped.
            crate::format::fields::decode(f.payload)?;
        }
        CHECKPOINT => check_checkpoint(f.payload, walk, scan)?,
        FrameKind::Record | FrameKind::Skippable(_) => {}
    }
    scan.frames
        .push(FrameSpan::new(offset, len, h.kind == FrameKind::Record));
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

/// An index checkpoint must describe what was read before it: the frames
/// since the checkpoint before it, every earlier checkpoint, and the highest
/// log start so far. One whose checksum holds and which does not is
/// corruption, as a seal index that does not is.
fn check_checkpoint(payload: &[u8], walk: &Walk, scan: &SegmentScan) -> Result<(), Corruption> {
    let cp = checkpoint::decode(payload)?;
    let first = walk
        .checkpoints
        .last()
        .and_then(|&at| scan.frames.position_of(at))
        .map_or(0, |k| k + 1);
    let what = if cp.earlier != walk.checkpoints {
        "earlier checkpoints differ from the segment's"
    } else if cp.first as usize != first
        || first > scan.frames.len()
        || !scan
            .frames
            .range(first, scan.frames.len())
            .eq(cp.frames.iter())
    {
        "frames differ from the segment's"
    } else if cp.log_start != scan.log_start_marker() {
        "log start differs from the segment's"
    } else {
        return Ok(());
    };
    Err(Corruption::BadCheckpoint { what })
}

/// The file's next region that may hold data, from `at` on, as offsets into
/// `buf` (the file's view): `None` if the rest reads as zeros. A file system
/// that cannot tell reports the rest as data; so does a failed query.
fn data_region(regions: DataRegions<'_>, len: usize, at: usize) -> Option<(usize, usize)> {
    if at >= len {
        return None;
    }
    let whole = Some((at, len));
    let Ok(region) = regions(at as u64) else {
        return whole;
    };
    let r = region?;
    let (Ok(start), Ok(end)) = (usize::try_from(r.start), usize::try_from(r.end)) else {
        return whole;
    };
    let start = start.max(at);
    if start >= len {
        return None;
    }
    // A region that makes no progress is not trusted.
    Some((start, if end > start { end.min(len) } else { len }))
}

/// Whether every byte of `buf` from `from` on is zero: the clean end of a
/// preallocated segment. Asks the file where its data lies, so that space
/// preallocated and never written (most of a new segment's file) is not read;
/// but at least the next 4 KiB (to a page boundary) are read first, so that a
/// file system that wrongly reports a hole cannot overrule the bytes that just
/// failed to decode, and so are all the bytes read already ([`Bytes::held_from`]).
fn zeros_to_end(regions: DataRegions<'_>, src: &mut dyn Bytes, from: usize) -> bool {
    let len = src.len();
    let page = from.saturating_add(PAGE).next_multiple_of(PAGE).min(len);
    if !all_zero(src.get(from, page.saturating_sub(from))) {
        return false;
    }
    // What was read past the page already (the rest of the window) is
    // checked too, whatever the file system says of it.
    if !all_zero(src.held_from(page)) {
        return false;
    }
    let mut at = page;
    while let Some((start, end)) = data_region(regions, len, at) {
        let mut k = start;
        while k < end {
            let n = (end - k).min(WINDOW);
            if !all_zero(src.get(k, n)) {
                return false;
            }
            k += n;
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

#[cfg(test)]
mod data_map_tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    /// A file whose data ends at `data_end`, and whose file system, like
    /// ext4's `SEEK_DATA` over preallocated space, reports as data whatever
    /// was read since (pages of zeros left in the page cache), or fails.
    #[derive(Debug)]
    struct Misled {
        len: u64,
        data_end: u64,
        read_to: AtomicU64,
        fails: bool,
    }

    impl StorageFile for Misled {
        fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
            buf.fill(0);
            self.read_to
                .fetch_max(offset + buf.len() as u64, Ordering::Relaxed);
            Ok(buf.len())
        }
        fn write_at(&self, _: &[u8], _: u64) -> io::Result<usize> {
            Err(io::Error::other("read-only"))
        }
        fn sync_data(&self) -> io::Result<()> {
            Ok(())
        }
        fn set_len(&self, _: u64) -> io::Result<()> {
            Ok(())
        }
        fn allocate(&self, _: u64) -> io::Result<()> {
            Ok(())
        }
        fn next_data(&self, offset: u64) -> io::Result<Option<Range<u64>>> {
            if self.fails {
                return Err(io::Error::other("no SEEK_DATA"));
            }
            let end = self.data_end.max(self.read_to.load(Ordering::Relaxed));
            Ok((offset < end).then_some(offset..end))
        }
        fn len(&self) -> io::Result<u64> {
            Ok(self.len)
        }
    }

    fn misled(fails: bool) -> Misled {
        Misled {
            len: 64 << 20,
            data_end: 36 << 20,
            read_to: AtomicU64::new(0),
            fails,
        }
    }

    #[test]
    fn reads_after_the_map_was_made_do_not_extend_it() {
        let file = misled(false);
        let map = DataMap::of(&file, file.len);
        // The scan reads past the frames (the window, the kernel's read-ahead).
        let mut buf = vec![0u8; 8 << 20];
        file.read_at(&mut buf, 36 << 20).expect("read");
        assert_eq!(
            file.next_data(40 << 20).expect("asked"),
            Some((40 << 20)..(44 << 20))
        );
        assert_eq!(map.next(0), Some(0..(36 << 20)));
        assert_eq!(map.next(10 << 20), Some((10 << 20)..(36 << 20)));
        assert_eq!(map.next(36 << 20), None);
        assert_eq!(map.next(40 << 20), None);
    }

    #[test]
    fn a_failed_query_makes_the_rest_data() {
        let file = misled(true);
        let map = DataMap::of(&file, file.len);
        assert_eq!(map.next(5), Some(5..file.len));
        assert_eq!(map.next(file.len), None);
    }

    /// Bytes that were read are checked even where the file system says a
    /// hole lies: a wrong report cannot make them zeros.
    #[test]
    fn bytes_already_read_count_whatever_the_map_says() {
        let mut bytes = vec![0u8; 64 << 10];
        bytes[20_000] = 7;
        let no_data_past_8k = |at: u64| Ok((at < 8192).then_some(at..8192));
        assert!(!zeros_to_end(&no_data_past_8k, &mut Whole(&bytes), 4096));
        let read = |part: &mut [u8], at: u64| -> io::Result<()> {
            let at = at as usize;
            part.copy_from_slice(&bytes[at..at + part.len()]);
            Ok(())
        };
        let mut window = Window::new(&read, bytes.len());
        assert!(!zeros_to_end(&no_data_past_8k, &mut window, 4096));
        // Past what was read, the map is trusted.
        let mut window = Window::with_chunk(&read, bytes.len(), 4096);
        assert!(zeros_to_end(&no_data_past_8k, &mut window, 4096));
        let clean = vec![0u8; 64 << 10];
        assert!(zeros_to_end(&no_data_past_8k, &mut Whole(&clean), 4096));
    }

    #[test]
    fn the_map_answers_between_and_inside_regions() {
        let map = DataMap {
            regions: vec![0..10, 20..30],
        };
        assert_eq!(map.next(5), Some(5..10));
        assert_eq!(map.next(10), Some(20..30));
        assert_eq!(map.next(12), Some(20..30));
        assert_eq!(map.next(25), Some(25..30));
        assert_eq!(map.next(30), None);
    }
}
