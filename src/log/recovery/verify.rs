//! A read-only pass of recovery's checks: scans every segment file whole and
//! plans the open, changing nothing (no lock taken, no file written, cut,
//! synced or removed), then rebuilds the state table as an open would, to
//! count the records in each state. `segwal verify` and `segwal inspect` are
//! built on it.

use std::path::{Path, PathBuf};

use crate::error::{Corruption, Error, Result};
use crate::format::seq::{SEGMENT_SUFFIX, SegmentId, Seq};
use crate::io::Storage;
use crate::options::{OpenCheck, RecoveryMode};

use super::{plan, rebuild, scan, state};

/// How long the offline tools wait before they read a log again that
/// changed under them or showed a problem (a rotation, a seal, a deletion by
/// the running owner settles within it). A log that cannot change (the fuzz
/// target's simulated disk) is read again without waiting.
pub(crate) const SETTLE: std::time::Duration = std::time::Duration::from_millis(20);

/// The storage seen through a pass that must change nothing: files open
/// read-only, and every call that would create, remove, rename, sync or lock
/// fails, so no code path below can write, whatever it tries.
#[derive(Debug)]
pub(super) struct ReadOnly<'a>(pub(super) &'a dyn Storage);

fn refused() -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::PermissionDenied,
        "a read-only check changes nothing",
    )
}

impl Storage for ReadOnly<'_> {
    fn create_dir(&self, _: &Path) -> std::io::Result<bool> {
        Err(refused())
    }
    fn list(&self, dir: &Path) -> std::io::Result<Vec<String>> {
        self.0.list(dir)
    }
    fn create(&self, _: &Path) -> std::io::Result<std::sync::Arc<dyn crate::io::StorageFile>> {
        Err(refused())
    }
    fn open(&self, path: &Path) -> std::io::Result<std::sync::Arc<dyn crate::io::StorageFile>> {
        self.0.open_read(path)
    }
    fn open_read(
        &self,
        path: &Path,
    ) -> std::io::Result<std::sync::Arc<dyn crate::io::StorageFile>> {
        self.0.open_read(path)
    }
    fn remove(&self, _: &Path) -> std::io::Result<()> {
        Err(refused())
    }
    fn rename(&self, _: &Path, _: &Path) -> std::io::Result<()> {
        Err(refused())
    }
    fn sync_dir(&self, _: &Path) -> std::io::Result<()> {
        Err(refused())
    }
    fn lock(&self, _: &Path) -> std::result::Result<crate::io::LockGuard, crate::io::LockError> {
        Err(crate::io::LockError::Io(refused()))
    }
}

/// How many passes a check makes at most when the log changes under it.
const PASSES_MAX: usize = 5;

/// How many times one pass lists the directory again for the segments a
/// running owner created since its first listing.
pub(crate) const FOLLOW_MAX: usize = 64;

/// One segment file, as [`verify`](crate::verify) found it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct SegmentSummary {
    /// The file.
    pub path: PathBuf,
    /// The seq its name (and header) give: that of its first frame.
    pub first_seq: Seq,
    /// The seq of its last valid frame (`None` when it holds none).
    pub last_seq: Option<Seq>,
    /// Valid frames in it (records and internal frames).
    pub frames: usize,
    /// Of them, records.
    pub records: usize,
    /// The file's length.
    pub bytes: u64,
    /// Ends with a seal (a segment the writer finished); the newest segment
    /// of a running outbox has none.
    pub sealed: bool,
    /// When the segment was created (its header), milliseconds since the
    /// Unix epoch; `None` when the header does not check.
    pub created_unix_ms: Option<u64>,
    /// The records it holds not yet acknowledged (pending, delayed, held back
    /// by a key, dead letters), as an open would count them, relocated copies
    /// (kind 4 frames, not counted in [`records`](SegmentSummary::records))
    /// included, so this may exceed `records`; `None` when the
    /// log is too damaged to plan an open, or the open would not keep the
    /// segment (a leftover below the log start, an empty file).
    pub live_records: Option<u64>,
}

/// The records of an outbox in each state, as an open would rebuild them
/// from the log ([`Verification::states`]).
///
/// A claim lives only in the memory of the process that made it: a record a
/// running owner has claimed and not yet acknowledged is counted here as
/// pending (or delayed, or held back, as the log last recorded it). The
/// running owner's [`Outbox::stats`](crate::Outbox::stats) counts its claims.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct StateCounts {
    /// Records whose frames lie on disk, each counted once: those in their
    /// own segment ([`Verification::records`]), and those only a relocated
    /// copy still holds (docs/FORMAT.md, "Relocation"). The sum of the
    /// counts below.
    pub records: u64,
    /// Records waiting to be claimed (claimed ones of a running owner
    /// included).
    pub pending: u64,
    /// Records held back behind an earlier record of their ordering key
    /// (a record both held back and delayed is counted in `delayed`).
    pub held_by_key: u64,
    /// Records waiting out a delay: released with one, or appended with a
    /// not-before time still ahead (by the wall clock now).
    pub delayed: u64,
    /// Dead letters.
    pub dead: u64,
    /// Records acknowledged whose frames are still on disk: their segment also
    /// holds a live record, or is the newest, or lies after a segment that
    /// does (segments are deleted oldest first); or a relocated copy of them
    /// lies in such a segment.
    pub acknowledged: u64,
    /// The oldest pending record: its seq and when it was appended (its
    /// frame's timestamp, microseconds since the Unix epoch).
    pub oldest_pending: Option<(Seq, u64)>,
    /// Sealed segments kept on disk by records not yet acknowledged.
    pub held_segments: usize,
    /// The live records in those [`held_segments`](StateCounts::held_segments).
    pub held_by_records: u64,
    /// Ordering keys with a record held back behind an earlier one of the key.
    pub blocked_keys: u64,
    /// Bytes of the records not acknowledged: their payloads and optional
    /// fields, as [`Stats::backlog_bytes`](crate::Stats::backlog_bytes) counts
    /// them.
    pub backlog_bytes: u64,
    /// The oldest record not acknowledged (pending, held back, delayed or
    /// dead): its seq and its frame's timestamp, as for
    /// [`oldest_pending`](StateCounts::oldest_pending).
    pub oldest_unacked: Option<(Seq, u64)>,
    /// The newest seq the log holds (a record's or an internal frame's).
    pub last_seq: Option<Seq>,
    /// Bytes of headers and frames in the segment files (their lengths less
    /// the space reserved or zeroed past the last frame), as
    /// [`Stats::disk_bytes`](crate::Stats::disk_bytes) counts them.
    pub disk_bytes: u64,
}

/// A problem [`verify`](crate::verify) found: what an open that checks every
/// frame ([`OpenCheck::EveryFrame`]) would refuse. (The default open, through
/// seal indexes, may accept it: [`Verification::default_open_accepts`].)
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Problem {
    /// The file.
    pub path: PathBuf,
    /// The byte offset of the damage in it.
    pub offset: u64,
    /// The seq the damaged frame would have held, when known.
    pub seq: Option<Seq>,
    /// What is wrong.
    pub kind: Corruption,
}

/// What [`verify`](crate::verify) found in an outbox directory.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Verification {
    /// The directory.
    pub dir: PathBuf,
    /// Every segment file, oldest first.
    pub segments: Vec<SegmentSummary>,
    /// What an open that checks every frame would refuse (empty when the log
    /// is clean; see [`default_open_accepts`](Verification::default_open_accepts)
    /// for the default open). Recovery
    /// stops at a segment's first damage, so this lists at most one damage per
    /// segment, besides what concerns the log's chain (a missing segment, a
    /// broken link, another outbox's file), which may name the same file.
    pub problems: Vec<Problem>,
    /// A torn write at the end of the newest segment (a crash in the middle
    /// of a write batch): not damage, it is what the next open truncates.
    pub torn_tail: Option<Problem>,
    /// The outbox's identity ([`Outbox::id`](crate::Outbox::id)), from its
    /// segments' headers.
    pub outbox_id: Option<u128>,
    /// The format version of the segments: the one this build writes, when
    /// any segment's header checks; else the version a whole header names
    /// that this build does not read (a problem
    /// [`Corruption::UnsupportedVersion`] names it too).
    pub format_version: Option<u16>,
    /// Records the log holds (acknowledged or not): those an open would
    /// keep (a record only a relocated copy still holds included), or, when
    /// it would refuse, the record frames read before each damage.
    pub records: u64,
    /// Bytes of segment files read.
    pub bytes: u64,
    /// When damage was found: what a lossy repair
    /// ([`RecoveryMode::Lossy`](crate::RecoveryMode::Lossy), `segwal repair`)
    /// would drop, planned without doing it.
    pub repair: Option<crate::Dropped>,
    /// The pid the directory's `OWNER` file names (the last process that
    /// opened it; running or not).
    pub owner_pid: Option<u32>,
    /// The records in each state, from the state table rebuilt as an open
    /// would; `None` when the log is too damaged for an open to plan it.
    pub states: Option<StateCounts>,
    /// When damage was found: whether an open with the default check
    /// ([`OpenCheck::SealIndex`]), which reads a sealed segment's seal index
    /// rather than its frames, opens the log all the same. `Some(true)` when
    /// the damage lies only in the bytes of records such an open does not
    /// read: it opens, every other record is delivered, and the claim of a
    /// damaged record fails with [`Error::Corrupt`](crate::Error::Corrupt)
    /// naming it, and sets it aside (an acknowledged one is never read
    /// again; a record holding what this build does not read,
    /// [`Corruption::is_unknown_format`], is held back instead, for the
    /// build that wrote it). No repair is needed to open such a log, and a repair would
    /// drop every record after the damage. `None` when the log is clean.
    pub default_open_accepts: Option<bool>,
}

impl Verification {
    /// No problem found (a torn tail is not one).
    pub fn is_clean(&self) -> bool {
        self.problems.is_empty()
    }
}

fn problem(error: Error) -> std::result::Result<Problem, Error> {
    match error {
        Error::Corrupt {
            path,
            offset,
            seq,
            kind,
        } => Ok(Problem {
            path,
            offset,
            seq,
            kind,
        }),
        // A segment of another format version: damage as far as this
        // build can tell, named like any other.
        Error::UnsupportedFormat { path, found, .. } => Ok(Problem {
            path,
            offset: 0,
            seq: None,
            kind: Corruption::UnsupportedVersion { found },
        }),
        other => Err(other),
    }
}

/// Checks the outbox directory `dir` as an open would (every frame's
/// checksum, the chain of segments, the log start, the delivery state the log
/// records) without changing anything: no lock is taken, nothing is written,
/// truncated, synced or removed, so it can run while the owner process
/// appends (it then sees the log as far as it was written when each file was
/// read; a tail being written can read as torn). Damage is listed in
/// [`Verification::problems`] with file, offset, seq and kind. An error is
/// returned when the directory or one of its segment files cannot be read, or
/// a segment file is too long to be one (over 4 GiB, `Error::Corrupt`).
///
/// ```
/// # fn main() -> segwal::Result<()> {
/// # let dir = tempfile::tempdir().expect("temporary directory");
/// # let outbox = segwal::Outbox::open(dir.path(), segwal::Options::default())?;
/// # outbox.append(b"a")?;
/// let report = segwal::verify(dir.path())?;
/// for problem in &report.problems {
///     eprintln!("{}: offset {}: {}", problem.path.display(), problem.offset, problem.kind);
/// }
/// assert!(report.is_clean());
/// # outbox.close()?;
/// # Ok(())
/// # }
/// ```
pub fn verify(dir: impl AsRef<Path>) -> Result<Verification> {
    verify_with_progress(dir, |_, _| {})
}

/// [`verify`], telling `progress` how far it got: after each segment file
/// read, the bytes of segment files read so far and the bytes of all of them
/// (as listed when the pass began). A pass that finds a problem is made
/// again, to tell damage from a log that changed under the first pass, and
/// reports from 0 again. For a progress bar: `progress` is called once per
/// segment file, and once with 0 first, in each pass.
pub fn verify_with_progress(
    dir: impl AsRef<Path>,
    mut progress: impl FnMut(u64, u64),
) -> Result<Verification> {
    let dir = dir.as_ref();
    let meta = std::fs::metadata(dir).map_err(|e| Error::io("stat directory", dir, e))?;
    if !meta.is_dir() {
        return Err(Error::InvalidPath {
            path: dir.to_path_buf(),
            reason: "not a directory",
        });
    }
    let dir = std::fs::canonicalize(dir).map_err(|e| Error::io("resolve directory", dir, e))?;
    verify_with(&crate::io::StdStorage::new(), &dir, &mut progress, SETTLE)
}

/// [`verify`] through `storage`. A log being written changes while it is
/// read (a rotation, a seal, a deletion, a batch landing): a pass that finds
/// a problem, or a file gone or cut under the read, is made again, and a
/// problem is reported only once two passes in a row find it (real damage is
/// durable and does not move; an artefact of a concurrent write does not
/// repeat).
pub(crate) fn verify_with(
    storage: &dyn Storage,
    dir: &Path,
    progress: &mut dyn FnMut(u64, u64),
    settle: std::time::Duration,
) -> Result<Verification> {
    let storage = ReadOnly(storage);
    let mut previous: Option<Verification> = None;
    for attempt in 1..=PASSES_MAX {
        let current = match pass(&storage, dir, progress) {
            Ok(v) => v,
            // A file deleted (or replaced) by the running owner mid-pass, or
            // cut under the read (a seal cuts the preallocated space after
            // it): it ends before the length measured when its read began.
            Err(Error::Io { source, .. })
                if changed_under_read(&source) && attempt < PASSES_MAX =>
            {
                continue;
            }
            Err(e) => return Err(e),
        };
        if current.is_clean() {
            return Ok(current);
        }
        if let Some(before) = &previous
            && before.problems == current.problems
        {
            return Ok(current);
        }
        previous = Some(current);
        std::thread::sleep(settle);
    }
    previous.ok_or_else(|| {
        Error::io(
            "list directory",
            dir,
            std::io::Error::from(std::io::ErrorKind::NotFound),
        )
    })
}

/// Whether a read failed because the running owner changed the file under
/// it: deleted it (every record acknowledged), or cut it shorter than the
/// length measured when the read began (a seal cuts the space reserved after
/// it). A pass that meets one is made again.
pub(super) fn changed_under_read(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::NotFound | std::io::ErrorKind::UnexpectedEof
    )
}

/// One pass over `dir`.
fn pass(
    storage: &dyn Storage,
    dir: &Path,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Verification> {
    let names = storage
        .list(dir)
        .map_err(|e| Error::io("list directory", dir, e))?;
    let mut out = Verification {
        dir: dir.to_path_buf(),
        segments: Vec::new(),
        problems: Vec::new(),
        torn_tail: None,
        outbox_id: None,
        format_version: None,
        records: 0,
        bytes: 0,
        repair: None,
        owner_pid: crate::io::StdStorage::owner_pid(dir),
        states: None,
        default_open_accepts: None,
    };
    let mut ids = Vec::new();
    for name in &names {
        match SegmentId::parse(name) {
            Some(id) => ids.push(id),
            None if name.ends_with(SEGMENT_SUFFIX) && SegmentId::parse_creating(name).is_none() => {
                out.problems.push(Problem {
                    path: dir.join(name),
                    offset: 0,
                    seq: None,
                    kind: Corruption::BadSegmentName,
                });
            }
            None => {}
        }
    }
    ids.sort();
    // The bytes to read, for the progress report: the files' lengths now (a
    // file gone since the listing counts nothing).
    let total: u64 = ids
        .iter()
        .filter_map(|&id| {
            let path = crate::io::segment_file::SegmentFile::path_of(dir, id);
            storage.open_read(&path).and_then(|f| f.len()).ok()
        })
        .sum();
    progress(0, total);
    let mut scans = Vec::with_capacity(ids.len());
    let mut damaged = Vec::new();
    // The files listed, then, while the newest one read ends with a seal,
    // those the running owner created since: it creates a segment before it
    // seals the one before, so a seal read in the newest file listed means
    // its successor was created after the listing (a log that rotates
    // faster than it is read), not that it is missing.
    let mut queue: std::collections::VecDeque<SegmentId> = ids.iter().copied().collect();
    let mut follows = 0;
    loop {
        let Some(id) = queue.pop_front() else {
            let newest_sealed = scans
                .last()
                .is_some_and(|s: &scan::SegmentScan| s.seal.is_some());
            if !newest_sealed || follows == FOLLOW_MAX {
                break;
            }
            follows += 1;
            let last = scans.last().map(|s: &scan::SegmentScan| s.id);
            let names = storage
                .list(dir)
                .map_err(|e| Error::io("list directory", dir, e))?;
            let mut newer: Vec<SegmentId> = names
                .iter()
                .filter_map(|n| SegmentId::parse(n))
                .filter(|&id| last.is_none_or(|last| id > last))
                .collect();
            if newer.is_empty() {
                break;
            }
            newer.sort();
            queue.extend(newer);
            continue;
        };
        let scan = match scan::scan_file(
            storage,
            dir,
            id,
            OpenCheck::EveryFrame,
            false,
            false,
            &mut Vec::new(),
        ) {
            Ok((scan, _)) => scan,
            // Deleted by the running owner since the directory was listed
            // (all its records acknowledged): no longer part of the log.
            Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
                continue;
            }
            Err(e) => return Err(e),
        };
        out.bytes += scan.len;
        // A file the owner appended to since the listing reads longer.
        progress(out.bytes, total.max(out.bytes));
        let records = scan.frames.iter().filter(|f| f.is_record()).count();
        let last_seq = match (scan.seal, scan.frames.len()) {
            (_, 0) => None,
            (Some(seal), _) => Some(seal.seq),
            (None, n) => Some(Seq::from(id.0 + n as u64 - 1)),
        };
        out.segments.push(SegmentSummary {
            path: scan.path.clone(),
            first_seq: id.first_seq(),
            last_seq,
            frames: scan.frames.len(),
            records,
            bytes: scan.len,
            sealed: scan.seal.is_some(),
            created_unix_ms: scan.header.map(|h| h.created_unix_ms),
            live_records: None,
        });
        if scan.header.is_some() {
            out.format_version = Some(crate::format::segment::FORMAT_VERSION);
        }
        if let Some(damage) = &scan.damage {
            damaged.push(Problem {
                path: scan.path.clone(),
                offset: damage.offset,
                seq: Some(damage.expected),
                kind: damage.cause.clone(),
            });
        }
        scans.push(scan);
    }
    if out.format_version.is_none() {
        out.format_version = damaged.iter().find_map(|p| match p.kind {
            Corruption::UnsupportedVersion { found } => Some(found),
            _ => None,
        });
    }
    match plan::plan(&scans, RecoveryMode::Strict) {
        Ok(plan) => {
            out.outbox_id = plan.outbox_id;
            out.records = plan.records;
            // The plan accepted the damage it saw as a torn tail (and
            // nothing else: it refuses any other).
            out.torn_tail = plan.torn.map(|torn| Problem {
                path: torn.path,
                offset: torn.offset,
                seq: None,
                kind: torn.cause,
            });
            // The delivery state the kept frames record: read and checked
            // as an open would, then replayed into a state table.
            let kept = rebuild::kept(&scans, &plan.keep);
            let hasher = crate::format::hash::Hasher::new(plan.outbox_id.unwrap_or(0));
            match state::recorded_state(storage, kept, false, &hasher) {
                Ok(recorded) => {
                    let segments = rebuild::kept_segments(&mut scans, &plan.keep);
                    let states = count_states(storage, &mut out, segments, &recorded);
                    // The records only a relocated copy still holds (their
                    // own segment deleted) are records of the log too.
                    out.records = out.records.max(states.records);
                    out.states = Some(states);
                }
                Err(e) => {
                    out.problems.push(problem(e)?);
                    let listed: Vec<SegmentId> = scans.iter().map(|s| s.id).collect();
                    out.default_open_accepts = Some(opens_by_seal_index(storage, dir, &listed));
                }
            }
        }
        Err(e) => {
            let listed: Vec<SegmentId> = scans.iter().map(|s| s.id).collect();
            out.default_open_accepts = Some(opens_by_seal_index(storage, dir, &listed));
            // The identity the newest readable header names, as the plan
            // takes it (a damaged log is still this outbox's).
            out.outbox_id = scans
                .iter()
                .rev()
                .find_map(|s| s.header.map(|h| h.outbox_id));
            out.records = out.segments.iter().map(|s| s.records as u64).sum();
            // What a repair would drop, with the records carried forward
            // into it (read as the repair would; a read of what is kept that
            // fails leaves them out of this preview).
            out.repair = plan::plan(&scans, RecoveryMode::Lossy)
                .ok()
                .and_then(|mut p| {
                    let hasher = crate::format::hash::Hasher::new(p.outbox_id.unwrap_or(0));
                    let kept = rebuild::kept(&scans, &p.keep);
                    if let Ok(kept) = state::recorded_state(storage, kept, true, &hasher) {
                        super::name_relocated(storage, &scans, &mut p, &kept, &hasher);
                    }
                    p.dropped
                });
            // The first rule broken, as an open reports it, then the damage
            // of every other segment.
            out.problems.push(problem(e)?);
            for found in damaged {
                let known = out
                    .problems
                    .iter()
                    .any(|p| p.path == found.path && p.offset == found.offset);
                if !known {
                    out.problems.push(found);
                }
            }
        }
    }
    Ok(out)
}

/// Whether a strict open with the default check ([`OpenCheck::SealIndex`])
/// accepts the segments `ids` of `dir`: their scans (sealed segments through
/// their seal indexes), the plan, and the delivery state it reads, as such
/// an open makes them, without changing anything.
fn opens_by_seal_index(storage: &dyn Storage, dir: &Path, ids: &[SegmentId]) -> bool {
    let mut scans = Vec::with_capacity(ids.len());
    for (k, &id) in ids.iter().enumerate() {
        let newest = k + 1 == ids.len();
        match scan::scan_file(
            storage,
            dir,
            id,
            OpenCheck::SealIndex,
            false,
            newest,
            &mut Vec::new(),
        ) {
            Ok((scan, _)) => scans.push(scan),
            Err(_) => return false,
        }
    }
    let Ok(plan) = plan::plan(&scans, RecoveryMode::Strict) else {
        return false;
    };
    let hasher = crate::format::hash::Hasher::new(plan.outbox_id.unwrap_or(0));
    let kept = rebuild::kept(&scans, &plan.keep);
    state::recorded_state(storage, kept, false, &hasher).is_ok()
}

/// The records of `segments` in each state, from the state table an open
/// would rebuild (`recorded` replayed into it); fills each summary's live
/// records.
fn count_states(
    storage: &dyn Storage,
    out: &mut Verification,
    segments: Vec<super::RecoveredSegment>,
    recorded: &[state::Recorded],
) -> StateCounts {
    let on_disk = rebuild::records_on_disk(&segments, recorded);
    // No monotonic clock of its own: a delay ends at its wall-clock time.
    let now = crate::io::segment_file::now_us();
    let (table, _) = rebuild::rebuild(segments, recorded, now, now);
    for (first, live) in table.live_by_segment() {
        if let Some(s) = out.segments.iter_mut().find(|s| s.first_seq == first) {
            s.live_records = Some(live);
        }
    }
    let mut t = table.stats();
    // A segment with no frame yet (the owner's newest, just rotated) is not
    // in a rebuilt table; the owner's `Stats::disk_bytes` counts its header.
    // Not a file without a whole header that reads (a creation a crash cut
    // short, or blank), which the next open deletes.
    let header = crate::format::segment::FRAMES_AT as u64;
    let frameless = out
        .segments
        .iter()
        .filter(|s| {
            s.frames == 0
                && s.live_records.is_none()
                && s.bytes >= header
                && s.created_unix_ms.is_some()
        })
        .count() as u64;
    t.disk_bytes += frameless * header;
    // Sealed by the writer: the newest segment, sealed in a table an open
    // rebuilds, is still the owner's active one.
    let held: Vec<u64> = out
        .segments
        .iter()
        .filter(|s| s.sealed)
        .filter_map(|s| s.live_records.filter(|&n| n > 0))
        .collect();
    // Nothing is claimed in a rebuilt table: its claimed records are
    // delayed, dead letters, or held back by their key.
    let live = t.pending + t.claimed;
    let stamp = |slot: Option<crate::state::table::SlotRef>| {
        let slot = slot?;
        let file = storage.open_read(&slot.path).ok()?;
        let stamped = crate::io::reader::frame_stamp(&*file, slot.offset)?;
        Some((slot.seq, stamped))
    };
    let oldest_pending = stamp(t.first_pending);
    let oldest_unacked = stamp(t.first_unacked);
    StateCounts {
        records: on_disk.max(live),
        pending: t.pending,
        held_by_key: t.held_by_key,
        delayed: t.delayed,
        dead: t.dead_letters,
        acknowledged: on_disk.saturating_sub(live),
        oldest_pending,
        held_segments: held.len(),
        held_by_records: held.iter().sum(),
        blocked_keys: t.blocked_keys,
        backlog_bytes: t.backlog_bytes,
        oldest_unacked,
        last_seq: t.last_seq,
        disk_bytes: t.disk_bytes,
    }
}
