//! A read-only walk over the records of an outbox directory, in seq order
//! (`segwal dump`): each record once, at its own seq, with its frame's time,
//! its optional fields and its payload, as recovery would place it.
//!
//! Like `verify`, it changes nothing: files are opened read-only through the
//! same [`ReadOnly`] storage, no lock is taken, and it works while the owner
//! appends (each file is read as it is when the walk reaches it; a torn
//! batch at the end of the newest segment is where the walk ends).
//!
//! Memory: one segment's frame list and a read buffer of 1 MiB (or one
//! frame, if larger), whatever the log's size, plus the few relocated copies
//! whose original segment is gone. With the records' states, the state table
//! an open would rebuild (about 4.25 bytes per record on disk, plus the
//! delivery state of the live ones).

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::scan::{self, Damage};
use super::verify::ReadOnly;
use super::{plan, rebuild, state};
use crate::error::{Corruption, Error, Result};
use crate::format::frame::{self, FRAME_HEADER_LEN, FrameKind, FrameSpan};
use crate::format::frames::FrameList;
use crate::format::seq::{SegmentId, Seq};
use crate::io::{StdStorage, Storage, StorageFile, read_exact_at};
use crate::options::{OpenCheck, RecoveryMode};
use crate::state::table::{Standing, Table};

/// How much a [`Dump`] reads at a time, unless a frame is larger.
const READ_BYTES: usize = 1 << 20;

/// How many times the states' snapshot is read at most when the log changes
/// under it (as `verify` does).
const PASSES_MAX: usize = 5;

/// What [`dump`] reads.
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct DumpOptions {
    from: u64,
    states: bool,
}

impl DumpOptions {
    /// Every record, without its state.
    pub fn new() -> DumpOptions {
        DumpOptions::default()
    }

    /// Starts at the record `seq` (or the first after it).
    pub fn from(mut self, seq: Seq) -> DumpOptions {
        self.from = seq.get();
        self
    }

    /// Gives each record its state and attempts ([`DumpedRecord::state`]),
    /// from the state table an open would rebuild: read once, before the
    /// first record, at the cost of that table's memory (a few bytes per
    /// record on disk). The walk then ends where that snapshot of the log
    /// ended, and a log an open would refuse is refused
    /// ([`Error::Corrupt`], naming the file and offset).
    pub fn with_states(mut self) -> DumpOptions {
        self.states = true;
        self
    }
}

/// Where a record stood when [`dump`] read the log
/// ([`DumpOptions::with_states`]).
///
/// Claims live only in the memory of the owner that made them: a record a
/// running owner has claimed and not yet acknowledged reads as pending.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RecordState {
    /// Waiting to be delivered (or claimed by a running owner).
    Pending,
    /// Held back behind an earlier record of its ordering key.
    HeldByKey,
    /// Waiting out a delay (released with one, or appended with a
    /// not-before time still ahead).
    Delayed {
        /// When it becomes claimable: µs since the Unix epoch.
        not_before_us: u64,
    },
    /// A dead letter.
    Dead {
        /// Why it was parked.
        reason: String,
        /// When: µs since the Unix epoch.
        since_us: u64,
    },
    /// Acknowledged; its frame stays on disk until its segment is deleted.
    Acknowledged,
}

/// One record, as [`dump`] read it from its frame.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct DumpedRecord {
    /// The record's own seq.
    pub seq: Seq,
    /// The segment file holding the frame read.
    pub path: Arc<Path>,
    /// The frame's byte offset in it.
    pub offset: u64,
    /// Read from a relocated copy (docs/FORMAT.md, "Relocation"): the
    /// segment it was appended to is deleted.
    pub relocated: bool,
    /// When the writer wrote it (the frame's timestamp; a copy keeps the
    /// record's own): µs since the Unix epoch.
    pub timestamp_us: u64,
    /// Its ordering key, as appended (the frame stores the bytes).
    pub key: Option<Vec<u8>>,
    /// Its not-before time, µs since the Unix epoch.
    pub not_before_us: Option<u64>,
    /// Its deduplication id, as appended (the frame stores the bytes; a
    /// unique item's id is the one derived from its payload).
    pub dedup_id: Option<Vec<u8>>,
    /// The payload, exactly as appended.
    pub payload: Vec<u8>,
    /// Its state, with [`DumpOptions::with_states`].
    pub state: Option<RecordState>,
    /// Deliveries counted in the log so far (written under
    /// `Options::max_attempts`, and carried by a relocated copy, which an
    /// open without that option sets back to none; for a dead letter, those
    /// before it died), with [`DumpOptions::with_states`].
    pub attempts: Option<u32>,
}

/// The records of an outbox directory in seq order: an iterator from
/// [`dump`]. It ends after the last record, or after the first damage, which
/// it yields as an [`Error::Corrupt`] naming the file, offset and seq.
pub struct Dump {
    storage: Arc<dyn Storage>,
    /// How long to wait before reading again what changed under the walk
    /// ([`SETTLE`](super::verify::SETTLE)).
    settle: std::time::Duration,
    dir: PathBuf,
    from: u64,
    /// Segments still to read, oldest first, and how many of their frames
    /// at most (the snapshot's, with states).
    segments: VecDeque<(SegmentId, usize)>,
    /// Records only a relocated copy holds, by seq, to yield first.
    copies: VecDeque<Copy>,
    /// Damage found among those copies: yielded after them.
    copy_damage: Option<Error>,
    current: Option<Cursor>,
    /// The seal of the segment read before the current one, when it ended
    /// with one and the current one followed it in the listing: the number
    /// the current one's header must name as its predecessor.
    prev_seal: Option<Seq>,
    /// The state table, with states.
    table: Option<Table>,
    finished: bool,
}

impl std::fmt::Debug for Dump {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dump")
            .field("dir", &self.dir)
            .field("from", &self.from)
            .finish_non_exhaustive()
    }
}

/// A relocated copy of a record whose segment is gone.
struct Copy {
    seq: Seq,
    id: SegmentId,
    at: Seq,
    span: FrameSpan,
}

/// The segment being read.
struct Cursor {
    id: SegmentId,
    path: Arc<Path>,
    file: Arc<dyn StorageFile>,
    salt: u32,
    frames: FrameList,
    /// The next frame to look at, and how many to read at most.
    next: usize,
    limit: usize,
    damage: Option<Damage>,
    /// The seal it ends with, if it does.
    seal: Option<Seq>,
    /// The newest segment listed: damage it may tear is its torn tail.
    newest: bool,
    /// Read again once already, for damage a rotation may have left.
    again: bool,
    buf: Vec<u8>,
    buf_at: u64,
}

/// Reads the records of the outbox directory `dir` in seq order, changing
/// nothing (no lock taken, every file opened read-only), so it can run while
/// the owner appends. Without [`DumpOptions::with_states`] its memory does
/// not grow with the log. An error is returned when the directory cannot be
/// read, when a dump from before the oldest segment (the default) meets a
/// segment it cannot read while it looks for relocated copies, or, with
/// states, when an open would refuse the log; damage met while reading the
/// records ends the iterator with an [`Error::Corrupt`].
///
/// ```
/// # fn main() -> segwal::Result<()> {
/// # let dir = tempfile::tempdir().expect("temporary directory");
/// # let outbox = segwal::Outbox::open(dir.path(), segwal::Options::default())?;
/// # outbox.append_batch(&[&b"a"[..], b"b", b"c"])?;
/// // While the owner runs, from another thread or process:
/// let from = segwal::Seq::from(2);
/// for record in segwal::dump(dir.path(), segwal::DumpOptions::new().from(from))? {
///     let record = record?; // damage ends the dump with Error::Corrupt
///     println!("{} {} bytes", record.seq, record.payload.len());
/// }
/// # outbox.close()?;
/// # Ok(())
/// # }
/// ```
pub fn dump(dir: impl AsRef<Path>, options: DumpOptions) -> Result<Dump> {
    let dir = dir.as_ref();
    let meta = std::fs::metadata(dir).map_err(|e| Error::io("stat directory", dir, e))?;
    if !meta.is_dir() {
        return Err(Error::InvalidPath {
            path: dir.to_path_buf(),
            reason: "not a directory",
        });
    }
    let dir = std::fs::canonicalize(dir).map_err(|e| Error::io("resolve directory", dir, e))?;
    dump_with(
        Arc::new(StdStorage::new()),
        dir,
        options,
        super::verify::SETTLE,
    )
}

/// [`dump`] through `storage` (the fuzz target's simulated disk).
pub(crate) fn dump_with(
    storage: Arc<dyn Storage>,
    dir: PathBuf,
    options: DumpOptions,
    settle: std::time::Duration,
) -> Result<Dump> {
    let mut out = Dump {
        storage,
        settle,
        dir,
        from: options.from,
        segments: VecDeque::new(),
        copies: VecDeque::new(),
        copy_damage: None,
        current: None,
        prev_seal: None,
        table: None,
        finished: false,
    };
    if options.states {
        let (segments, table) = out.snapshot()?;
        out.segments = segments.into();
        out.table = Some(table);
    } else {
        out.segments = out.list()?.into_iter().map(|id| (id, usize::MAX)).collect();
    }
    // A relocated copy whose segment is gone holds a record numbered below
    // every segment on disk (segments are deleted oldest first).
    if let Some(&(oldest, _)) = out.segments.front()
        && out.from < oldest.0
    {
        out.find_copies(oldest.first_seq())?;
    }
    Ok(out)
}

/// Whether `e` is a file found missing: on a log being written, a segment
/// deleted by its owner since the directory was listed.
fn gone(e: &Error) -> bool {
    matches!(e, Error::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound)
}

impl Dump {
    /// The segment files of the directory, in log order. A file named with
    /// the segment suffix but not as a segment is refused, as an open
    /// refuses it.
    fn list(&self) -> Result<Vec<SegmentId>> {
        let names = ReadOnly(&*self.storage)
            .list(&self.dir)
            .map_err(|e| Error::io("list directory", &self.dir, e))?;
        let mut ids = Vec::with_capacity(names.len());
        for name in &names {
            match SegmentId::parse(name) {
                Some(id) => ids.push(id),
                None if name.ends_with(crate::format::seq::SEGMENT_SUFFIX) => {
                    return Err(Error::Corrupt {
                        path: self.dir.join(name),
                        offset: 0,
                        seq: None,
                        kind: Corruption::BadSegmentName,
                    });
                }
                None => {}
            }
        }
        ids.sort();
        Ok(ids)
    }

    /// Scans the segment `id`: through its seal index unless it is the
    /// newest (read frame by frame: its records are read anyway). `None` if it is
    /// gone (deleted by the running owner: every record of it acknowledged).
    fn scan_segment(&self, id: SegmentId, newest: bool) -> Result<Option<scan::SegmentScan>> {
        let check = if newest {
            OpenCheck::EveryFrame
        } else {
            OpenCheck::SealIndex
        };
        let mut attempt = 0;
        loop {
            attempt += 1;
            match scan::scan_file(
                &ReadOnly(&*self.storage),
                &self.dir,
                id,
                check,
                false,
                false,
                &mut Vec::new(),
            ) {
                Ok((scan, _)) => return Ok(Some(scan)),
                Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
                    return Ok(None);
                }
                // Cut by the owner while it was read (a seal cuts the space
                // reserved after it): read again, at its new length.
                Err(Error::Io { source, .. })
                    if super::verify::changed_under_read(&source) && attempt < PASSES_MAX =>
                {
                    continue;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// The log as an open would keep it, and its state table: the segments
    /// with how many of their frames it keeps.
    fn snapshot(&self) -> Result<(Vec<(SegmentId, usize)>, Table)> {
        let storage = ReadOnly(&*self.storage);
        let mut attempt = 0;
        loop {
            attempt += 1;
            let ids = self.list()?;
            let mut scans = Vec::with_capacity(ids.len());
            for (k, &id) in ids.iter().enumerate() {
                if let Some(scan) = self.scan_segment(id, k + 1 == ids.len())? {
                    scans.push(scan);
                }
            }
            // A seal in the newest file read: the owner created its successor
            // after the listing (it creates a segment before it seals the
            // one before). Those are read too, as `verify` follows them.
            for _ in 0..super::verify::FOLLOW_MAX {
                let Some(last) = scans.last().filter(|s| s.seal.is_some()).map(|s| s.id) else {
                    break;
                };
                let newer: Vec<SegmentId> =
                    self.list()?.into_iter().filter(|&id| id > last).collect();
                if newer.is_empty() {
                    break;
                }
                for (k, &id) in newer.iter().enumerate() {
                    if let Some(scan) = self.scan_segment(id, k + 1 == newer.len())? {
                        scans.push(scan);
                    }
                }
            }
            // A log being written changes under a pass (a rotation, a seal):
            // refused only when passes in a row find it so.
            let planned = plan::plan(&scans, RecoveryMode::Strict).and_then(|plan| {
                let hasher = crate::format::hash::Hasher::new(plan.outbox_id.unwrap_or(0));
                let kept = rebuild::kept(&scans, &plan.keep);
                let recorded = state::recorded_state(&storage, kept, false, &hasher)?;
                Ok((plan, recorded))
            });
            let (plan, recorded) = match planned {
                Ok(found) => found,
                // A segment the owner deleted between the listing and the
                // read (every record of it acknowledged) is gone, too.
                Err(e)
                    if attempt < PASSES_MAX && (matches!(e, Error::Corrupt { .. }) || gone(&e)) =>
                {
                    std::thread::sleep(self.settle);
                    continue;
                }
                Err(e) => return Err(e),
            };
            let keep: Vec<(SegmentId, usize)> = plan
                .keep
                .iter()
                .filter_map(|k| scans.get(k.scan).map(|s| (s.id, k.frames)))
                .collect();
            let segments = rebuild::kept_segments(&mut scans, &plan.keep);
            // No monotonic clock here: a delay ends at its wall-clock time.
            let now = crate::io::segment_file::now_us();
            let (table, _) = rebuild::rebuild(segments, &recorded, now, now);
            return Ok((keep, table));
        }
    }

    /// Finds the relocated copies of records numbered below `oldest` (and at
    /// or after `from`), the newest copy of each, in seq order.
    fn find_copies(&mut self, oldest: Seq) -> Result<()> {
        let storage = ReadOnly(&*self.storage);
        let mut copies = Vec::new();
        let mut damage = None;
        let count = self.segments.len();
        for (k, &(id, limit)) in self.segments.iter().enumerate() {
            let Some(scan) = self.scan_segment(id, k + 1 == count)? else {
                continue;
            };
            let Some(header) = scan.header else {
                continue;
            };
            let salt = frame::salt(id, header.nonce);
            let internal = scan
                .frames
                .iter()
                .enumerate()
                .take(limit)
                .filter(|(_, f)| !f.is_record());
            let mut file: Option<Arc<dyn StorageFile>> = None;
            for (i, span) in internal {
                let file = match &file {
                    Some(file) => file.clone(),
                    None => {
                        let opened = match storage.open_read(&scan.path) {
                            Ok(f) => f,
                            Err(e) if e.kind() == std::io::ErrorKind::NotFound => break,
                            Err(e) => return Err(Error::io("open segment", &scan.path, e)),
                        };
                        file.insert(opened).clone()
                    }
                };
                let at = u64::from(span.offset);
                let mut head = [0u8; FRAME_HEADER_LEN];
                read_exact_at(&*file, &mut head, at)
                    .map_err(|e| Error::io("read segment", &scan.path, e))?;
                if frame::kind_of(&head) != Some(FrameKind::Relocated) {
                    continue;
                }
                let mut whole = vec![0u8; span.len() as usize];
                read_exact_at(&*file, &mut whole, at)
                    .map_err(|e| Error::io("read segment", &scan.path, e))?;
                let frame_seq = Seq::from(id.0 + i as u64);
                let own = frame::decode(&whole, salt)
                    .and_then(|f| crate::format::relocated::decode_ext(f.ext).map(|(s, _)| s));
                match own {
                    Ok(seq) if seq < oldest && seq.get() >= self.from => copies.push(Copy {
                        seq,
                        id,
                        at: frame_seq,
                        span,
                    }),
                    Ok(_) => {}
                    Err(kind) => {
                        damage = Some(Error::Corrupt {
                            path: scan.path.clone(),
                            offset: at,
                            seq: Some(frame_seq),
                            kind,
                        });
                    }
                }
            }
            if damage.is_some() {
                break;
            }
        }
        self.copy_damage = damage;
        // The newest copy of a record relocated more than once wins, as at
        // recovery.
        copies.sort_by_key(|c| (c.seq, std::cmp::Reverse(c.at)));
        copies.dedup_by_key(|c| c.seq);
        self.copies = copies.into();
        Ok(())
    }

    /// The state of the record `seq`, with states.
    fn state_of(&self, seq: Seq) -> (Option<RecordState>, Option<u32>) {
        let Some((standing, attempts)) = self.table.as_ref().and_then(|t| t.standing(seq)) else {
            return (None, None);
        };
        let state = match standing {
            // Nothing is claimed in a rebuilt table.
            Standing::Pending | Standing::Claimed => RecordState::Pending,
            Standing::HeldByKey => RecordState::HeldByKey,
            Standing::Delayed { due } => RecordState::Delayed { not_before_us: due },
            Standing::Dead(entry) => RecordState::Dead {
                reason: entry.reason.to_string(),
                since_us: entry.since_us,
            },
            Standing::Done => RecordState::Acknowledged,
        };
        (Some(state), Some(attempts))
    }

    /// Reads the relocated copy `c`; `None` if its file is gone.
    fn read_copy(&self, c: &Copy) -> Option<Result<DumpedRecord>> {
        let path = crate::io::segment_file::SegmentFile::path_of(&self.dir, c.id);
        let file = match ReadOnly(&*self.storage).open_read(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
            Err(e) => return Some(Err(Error::io("open segment", &path, e))),
        };
        let cursor = Cursor::open(
            c.id,
            Arc::from(path.as_path()),
            file,
            None,
            std::iter::once(c.span).collect(),
            (usize::MAX, false),
        );
        let mut cursor = match cursor {
            Ok(cursor) => cursor,
            Err(e) => return Some(Err(e)),
        };
        Some(cursor.record(0, c.at, Some(c.seq)).map(|mut r| {
            (r.state, r.attempts) = self.state_of(r.seq);
            r
        }))
    }

    /// Opens the next segment to read; `Ok(false)` when none is left.
    fn open_next(&mut self) -> Result<bool> {
        let mut prev_seal = self.prev_seal.take();
        while let Some((id, limit)) = self.segments.pop_front() {
            let newest = self.segments.is_empty();
            // Every record of it numbered below the next segment's first.
            if self
                .segments
                .front()
                .is_some_and(|next| next.0.0 <= self.from)
            {
                prev_seal = None;
                continue;
            }
            let Some(scan) = self.scan_segment(id, newest)? else {
                // Deleted by the running owner since the listing: the next
                // one follows a segment not read.
                prev_seal = None;
                continue;
            };
            // Checked as an open checks them, without states (with them the
            // snapshot's plan did): a segment file's header, which it takes
            // before its name, and the chain from the segment before.
            if limit == usize::MAX {
                if scan.header.is_none() && !scan.blank {
                    let kind = scan
                        .damage
                        .map_or(Corruption::BadSegmentHeader, |d| d.cause);
                    // A version this build does not read is not damage.
                    if let Corruption::UnsupportedVersion { found } = kind {
                        return Err(Error::UnsupportedFormat {
                            path: scan.path,
                            found,
                            supported: crate::format::segment::FORMAT_VERSION,
                        });
                    }
                    return Err(Error::Corrupt {
                        path: scan.path,
                        offset: 0,
                        seq: None,
                        kind,
                    });
                }
                if let (Some(seal), Some(header)) = (prev_seal, scan.header)
                    && (header.prev_seq != seal || id.first_seq() <= seal)
                {
                    let kind = if header.prev_seq > seal {
                        Corruption::MissingSegment {
                            expected_first: seal.next(),
                        }
                    } else {
                        Corruption::BrokenChain {
                            expected_prev: seal,
                            found_prev: header.prev_seq,
                        }
                    };
                    return Err(Error::Corrupt {
                        path: scan.path,
                        offset: 0,
                        seq: Some(seal.next()),
                        kind,
                    });
                }
            }
            let seal = scan.seal.map(|s| s.seq);
            let file = match ReadOnly(&*self.storage).open_read(&scan.path) {
                Ok(f) => f,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(Error::io("open segment", &scan.path, e)),
            };
            let salt = scan.header.map(|h| frame::salt(id, h.nonce));
            let mut cursor = Cursor::open(
                id,
                Arc::from(scan.path.as_path()),
                file,
                salt,
                scan.frames,
                (limit, newest),
            )?;
            cursor.damage = scan.damage;
            cursor.seal = seal;
            // Skip the frames below `from`.
            cursor.next = usize::try_from(self.from.saturating_sub(id.0)).unwrap_or(usize::MAX);
            self.current = Some(cursor);
            return Ok(true);
        }
        Ok(false)
    }

    /// The next record of the current segment, or what ends it.
    fn next_in_segment(&mut self) -> Option<Result<DumpedRecord>> {
        let cursor = self.current.as_mut()?;
        let end = cursor.frames.len().min(cursor.limit);
        while cursor.next < end {
            let i = cursor.next;
            cursor.next += 1;
            if cursor.frames.get(i).is_some_and(|f| f.is_record()) {
                let seq = Seq::from(cursor.id.0 + i as u64);
                return Some(cursor.record(i, seq, None));
            }
        }
        // Past the frames read: the segment ends, cleanly or at damage.
        let Some(damage) = cursor.damage.take() else {
            // A segment followed by another ends with a seal, unless a crash
            // came between the next one's creation and this seal, before
            // anything was written to the next one; a seal being written by
            // a rotation is read again.
            if cursor.seal.is_some() || cursor.newest || cursor.limit != usize::MAX {
                return None;
            }
            let (again, end) = (cursor.again, cursor.frames.last().map(|f| f.end()));
            let expected = Seq::from(cursor.id.0 + cursor.frames.len() as u64);
            if self.later_hold_no_frames() {
                return None;
            }
            if !again {
                std::thread::sleep(self.settle);
                return self.read_again();
            }
            self.finished = true;
            let path = self.current.as_ref()?.path.to_path_buf();
            return Some(Err(Error::Corrupt {
                path,
                offset: end.unwrap_or(crate::format::segment::FRAMES_AT as u64),
                seq: Some(expected),
                kind: Corruption::MissingSeal,
            }));
        };
        if cursor.limit != usize::MAX && end == cursor.limit {
            // With states, the snapshot ended here.
            return None;
        }
        let (newest, again) = (cursor.newest, cursor.again);
        if damage.tearable && (newest || self.later_hold_no_frames()) {
            // A batch being written, or torn by a crash, in the newest
            // segment holding frames: the end of the log, as at recovery.
            self.finished = true;
            return None;
        }
        if damage.tearable && !again {
            // A seal being written by a rotation looks torn for a moment.
            std::thread::sleep(self.settle);
            return self.read_again();
        }
        self.finished = true;
        let path = self.current.as_ref()?.path.to_path_buf();
        Some(Err(Error::Corrupt {
            path,
            offset: damage.offset,
            seq: Some(damage.expected),
            kind: damage.cause,
        }))
    }

    /// Whether no segment after the current one holds a frame (each is a
    /// header with nothing after it, or gone): a crash left a new segment
    /// before anything was written to it, and the current segment is the
    /// newest holding frames, where recovery reads damage as a torn tail.
    fn later_hold_no_frames(&self) -> bool {
        let count = self.segments.len();
        self.segments.iter().enumerate().all(|(k, &(id, _))| {
            match self.scan_segment(id, k + 1 == count) {
                Ok(Some(scan)) => scan.frames.is_empty(),
                Ok(None) => true,
                Err(_) => false,
            }
        })
    }

    /// Scans the current segment again, going on where it stopped.
    fn read_again(&mut self) -> Option<Result<DumpedRecord>> {
        let cursor = self.current.as_mut()?;
        let (id, next, limit, newest) = (cursor.id, cursor.next, cursor.limit, cursor.newest);
        let scan = match self.scan_segment(id, true) {
            Ok(Some(scan)) => scan,
            Ok(None) => {
                self.current = None;
                return self.next();
            }
            Err(e) => {
                self.finished = true;
                return Some(Err(e));
            }
        };
        let cursor = self.current.as_mut()?;
        cursor.seal = scan.seal.map(|s| s.seq);
        cursor.frames = scan.frames;
        cursor.damage = scan.damage;
        cursor.next = next;
        cursor.limit = limit;
        cursor.newest = newest;
        cursor.again = true;
        self.next()
    }
}

impl Cursor {
    /// A cursor over `frames` of the segment `id` (its salt `None` when its
    /// header does not check: it holds no frame then).
    fn open(
        id: SegmentId,
        path: Arc<Path>,
        file: Arc<dyn StorageFile>,
        salt: Option<u32>,
        frames: FrameList,
        (limit, newest): (usize, bool),
    ) -> Result<Cursor> {
        let salt = match salt {
            Some(salt) => salt,
            // No header that checks, and no frame to read: an empty file, or
            // one holding only zeros, which recovery removes.
            None if frames.is_empty() => 0,
            None => {
                let mut head = [0u8; crate::format::segment::FRAMES_AT];
                read_exact_at(&*file, &mut head, 0)
                    .map_err(|e| Error::io("read segment", &*path, e))?;
                crate::format::segment::SegmentHeader::decode(&head)
                    .map(|h| frame::salt(id, h.nonce))
                    .unwrap_or(0)
            }
        };
        Ok(Cursor {
            id,
            path,
            file,
            salt,
            frames,
            next: 0,
            limit,
            damage: None,
            seal: None,
            newest,
            again: false,
            buf: Vec::new(),
            buf_at: 0,
        })
    }

    /// The bytes of the frame `span`, read with the frames after it (up to
    /// [`READ_BYTES`]) when they are not already in the buffer.
    fn bytes(&mut self, span: FrameSpan) -> std::io::Result<&[u8]> {
        let (start, end) = (u64::from(span.offset), span.end());
        let held = start >= self.buf_at && end <= self.buf_at + self.buf.len() as u64;
        if !held {
            let last = self.frames.last().map_or(end, |f| f.end());
            let upto = end.max(last.min(start + READ_BYTES as u64));
            self.buf.resize((upto - start) as usize, 0);
            self.buf_at = start;
            let mut read = read_exact_at(&*self.file, &mut self.buf, start);
            if read.is_err() && upto > end {
                // Only the frame itself, in case the file ends after it.
                self.buf.resize(span.len() as usize, 0);
                read = read_exact_at(&*self.file, &mut self.buf, start);
            }
            if let Err(e) = read {
                self.buf.clear();
                return Err(e);
            }
        }
        let from = (start - self.buf_at) as usize;
        Ok(self
            .buf
            .get(from..from + span.len() as usize)
            .unwrap_or_default())
    }

    /// Reads and checks frame `i` of the cursor: a record numbered `at`, or,
    /// when `own` is given, a relocated copy numbered `at` of the record
    /// `own`.
    fn record(&mut self, i: usize, at: Seq, own: Option<Seq>) -> Result<DumpedRecord> {
        let Some(span) = self.frames.get(i) else {
            return Err(Error::Corrupt {
                path: self.path.to_path_buf(),
                offset: 0,
                seq: Some(at),
                kind: Corruption::WrongFrame {
                    expected: at,
                    found: at,
                },
            });
        };
        let (path, salt) = (self.path.clone(), self.salt);
        let corrupt = |kind| Error::Corrupt {
            path: path.to_path_buf(),
            offset: u64::from(span.offset),
            seq: Some(own.unwrap_or(at)),
            kind,
        };
        let bytes = match self.bytes(span) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                return Err(corrupt(Corruption::Truncated {
                    needed: u64::from(span.len()),
                    available: 0,
                }));
            }
            Err(e) => return Err(Error::io("read segment", &*path, e)),
        };
        let f = frame::decode(bytes, salt).map_err(corrupt)?;
        let expected = if own.is_some() {
            FrameKind::Relocated
        } else {
            FrameKind::Record
        };
        if f.header.seq != at || f.header.kind != expected || f.len != span.len() as usize {
            return Err(corrupt(Corruption::WrongFrame {
                expected: at,
                found: f.header.seq,
            }));
        }
        let fields = crate::format::ext::decode(f.ext).map_err(corrupt)?;
        Ok(DumpedRecord {
            seq: own.unwrap_or(at),
            path: path.clone(),
            offset: u64::from(span.offset),
            relocated: own.is_some(),
            timestamp_us: f.header.timestamp_us,
            key: fields.key.map(<[u8]>::to_vec),
            not_before_us: fields.not_before_us,
            dedup_id: fields.dedup_id.map(<[u8]>::to_vec),
            payload: f.payload.to_vec(),
            state: None,
            attempts: None,
        })
    }
}

impl Iterator for Dump {
    type Item = Result<DumpedRecord>;

    fn next(&mut self) -> Option<Result<DumpedRecord>> {
        loop {
            if self.finished {
                return None;
            }
            if let Some(c) = self.copies.pop_front() {
                match self.read_copy(&c) {
                    Some(Err(e)) => {
                        self.finished = true;
                        return Some(Err(e));
                    }
                    Some(found) => return Some(found),
                    None => continue,
                }
            }
            if let Some(e) = self.copy_damage.take() {
                self.finished = true;
                return Some(Err(e));
            }
            if self.current.is_none() {
                match self.open_next() {
                    Ok(true) => {}
                    Ok(false) => {
                        self.finished = true;
                        return None;
                    }
                    Err(e) => {
                        self.finished = true;
                        return Some(Err(e));
                    }
                }
            }
            match self.next_in_segment() {
                Some(Ok(mut r)) => {
                    if self.table.is_some() {
                        (r.state, r.attempts) = self.state_of(r.seq);
                    }
                    return Some(Ok(r));
                }
                Some(Err(e)) => {
                    self.finished = true;
                    return Some(Err(e));
                }
                None if self.finished => return None,
                None => self.prev_seal = self.current.take().and_then(|c| c.seal),
            }
        }
    }
}
