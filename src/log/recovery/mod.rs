//! Recovery: rebuilds the log from the segment files when an outbox is opened.
//!
//! Reads every segment, checks its header, every frame's checksum and the sequence
//! and group continuity of frames within it, and the chain of segments. The rules,
//! and why each is safe, are argued in `docs/FORMAT.md` ("Recovery"). In short:
//!
//! - damage inside the last write batch of the last segment, with no valid frame
//!   of a *later sync group* after it, is a torn tail: the batch is truncated;
//! - any other damage is [`Error::Corrupt`] naming the file and offset, and
//!   nothing on disk is changed, unless the user asked for [`RecoveryMode::Lossy`];
//! - segments below the log start (recorded in `LogStart` frames and segment
//!   headers) are leftovers of an interrupted deletion and are removed; a segment
//!   missing at or after it is corruption.
//!
//! Recovery decides everything from a read-only pass first, then applies the
//! changes (removals, the truncation) and makes each durable before the writer
//! starts.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::error::{Corruption, Error, Result};
use crate::format::frame::{self, FrameKind};
use crate::format::seal::{self, IndexBuilder};
use crate::format::segment::{SEGMENT_HEADER_LEN, SegmentHeader};
use crate::format::seq::{SegmentId, Seq};
use crate::io::{Mapped, Storage, StorageFile};
use crate::options::{Bug, OpenCheck, Options, RecoveryMode};

/// What recovery found and changed when the outbox was opened.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct RecoveryReport {
    /// Segment files found in the directory.
    pub segments_found: usize,
    /// Records handed back to the relay: every record not acknowledged before the
    /// previous close or crash (acknowledgements are kept in memory only).
    pub records_recovered: u64,
    /// A torn tail truncated from the last segment: bytes of a write batch whose
    /// fsync never completed, so no producer was told it succeeded.
    pub torn_tail: Option<TornTail>,
    /// Segment files removed because they were already fully acknowledged when the
    /// previous run was deleting them, or (the last segment) created but never
    /// made durable.
    pub removed: Vec<PathBuf>,
    /// Under [`RecoveryMode::Lossy`] only: what was dropped at the first damage.
    pub dropped: Option<Dropped>,
}

/// A torn tail truncated at recovery.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct TornTail {
    /// The segment file.
    pub path: PathBuf,
    /// The offset it was truncated to.
    pub offset: u64,
    /// The bytes removed.
    pub bytes: u64,
    /// What the damage was.
    pub cause: Corruption,
}

/// What a lossy recovery dropped.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Dropped {
    /// The segment file holding the first damage.
    pub path: PathBuf,
    /// The offset of the first damage; the file was truncated there.
    pub offset: u64,
    /// What the damage was.
    pub cause: Corruption,
    /// First dropped sequence number: the one expected at the damage.
    pub first: Seq,
    /// Last dropped sequence number: the highest found in any valid frame after
    /// the damage. `None` when no valid frame followed it: then the damaged bytes
    /// held no complete record. Every number in `first..=last` is dropped, and
    /// none of them will be assigned again.
    pub last: Option<Seq>,
    /// Later segment files deleted whole.
    pub deleted_segments: Vec<PathBuf>,
}

/// One segment as recovery leaves it; all of them are sealed.
pub(crate) struct RecoveredSegment {
    pub id: SegmentId,
    pub path: Arc<Path>,
    pub file: Arc<dyn StorageFile>,
    pub map: Mapped,
    /// (offset, length, is_record) of every frame.
    pub frames: Vec<(u32, u32, bool)>,
}

/// The log as recovery leaves it.
pub(crate) struct Recovered {
    /// Every segment holding frames; all sealed from now on.
    pub segments: Vec<RecoveredSegment>,
    /// First sequence number of the oldest segment.
    pub log_start: Seq,
    /// The writer's active segment: empty, its header durable.
    pub active: ActiveStart,
    /// The newest segment, if it lacks its seal frame. The writer writes it
    /// before anything else.
    pub seal_newest: Option<SealTarget>,
    pub report: RecoveryReport,
}

/// A segment the writer seals before anything else.
pub(crate) struct SealTarget {
    pub id: SegmentId,
    pub path: Arc<Path>,
    pub file: Arc<dyn StorageFile>,
    /// Where the seal frame goes: just after the last frame kept.
    pub at: u64,
    /// The seal frame's sequence number.
    pub seq: Seq,
    /// Its payload: the segment's index.
    pub index: Vec<u8>,
}

/// An empty segment, durable, ready for the writer.
pub(crate) struct ActiveStart {
    pub id: SegmentId,
    pub path: Arc<Path>,
    pub file: Arc<dyn StorageFile>,
    /// Its length: frames are written from here.
    pub len: u64,
    /// Its header's nonce.
    pub nonce: u64,
}

/// Damage found while scanning a segment.
struct Damage {
    offset: u64,
    /// The sequence number that was expected at the damage.
    expected: Seq,
    cause: Corruption,
    /// Where a torn-tail truncation would cut: the start of the write batch
    /// holding the damage (0: the whole file, its header never became durable).
    batch_start: u64,
    /// The damage would be a torn tail if its segment is the newest one holding
    /// frames: no valid frame of a later sync group follows it, and no valid
    /// checksum vouches for the damaged bytes.
    tearable: bool,
    /// The first valid frame of a later sync group after the damage: (offset, seq).
    evidence: Option<(u64, Seq)>,
    /// Highest sequence number in any valid frame after the damage.
    max_seen: Option<Seq>,
}

/// The result of scanning one segment file.
struct Scan {
    id: SegmentId,
    path: PathBuf,
    file: Arc<dyn StorageFile>,
    map: Mapped,
    header: Option<SegmentHeader>,
    frames: Vec<(u32, u32, bool)>,
    /// Highest `LogStart` value found in the segment's frames.
    log_start_marker: Option<Seq>,
    /// The seal frame, if the segment ends with one: (seq, offset).
    seal: Option<(Seq, u32)>,
    /// The file's length.
    len: u64,
    /// Where recovery will cut the file, once it has decided everything.
    cut: Option<u64>,
    damage: Option<Damage>,
}

impl Scan {
    /// Sequence number of the `n`-th frame counting from 1 (`None` for 0).
    /// Numbers are contiguous within a segment except that its seal frame, always
    /// the last, may skip ahead.
    fn seq_at(&self, n: usize) -> Option<Seq> {
        match self.seal {
            Some((seal, _)) if n == self.frames.len() && n > 0 => Some(seal),
            _ => (n > 0).then(|| Seq::from(self.id.0 + n as u64 - 1)),
        }
    }

    /// Last sequence number held (before any damage), or the one before the
    /// segment if it holds no frame.
    fn last_seq(&self) -> Seq {
        self.seq_at(self.frames.len()).unwrap_or_else(|| {
            self.header
                .map_or(Seq::from(self.id.0.saturating_sub(1)), |h| h.prev_seq)
        })
    }

    /// Byte offset just past the last frame kept.
    fn end(&self) -> u64 {
        self.frames.last().map_or(SEGMENT_HEADER_LEN as u64, |f| {
            u64::from(f.0) + u64::from(f.1)
        })
    }

    /// A whole header and nothing after it.
    fn is_empty_and_whole(&self) -> bool {
        self.header.is_some() && self.frames.is_empty() && self.damage.is_none()
    }

    /// Plans a cut at `cut` and forgets the frames past it.
    fn cut_at(&mut self, cut: u64) {
        let kept = frames_below(&self.frames, cut);
        self.frames.truncate(kept);
        if self.seal.is_some_and(|(_, at)| u64::from(at) >= cut) {
            self.seal = None;
        }
        self.cut = Some(cut);
    }

    fn corrupt(&self, d: &Damage) -> Error {
        Error::Corrupt {
            path: self.path.clone(),
            offset: d.offset,
            seq: Some(d.expected),
            kind: d.cause.clone(),
        }
    }
}

/// Reads every segment in `dir`, decides what is torn and what is corrupt, applies
/// the changes durably, and returns the log.
pub(crate) fn recover(storage: &dyn Storage, dir: &Path, options: &Options) -> Result<Recovered> {
    let mode = options.recovery;
    // The injected bug treats any damage as the end of the log, silently.
    let silent_cut = options.has_bug(Bug::TruncateMidLogCorruption);
    let mode = if silent_cut {
        RecoveryMode::Lossy
    } else {
        mode
    };
    let names = storage
        .list(dir)
        .map_err(|e| Error::io("list directory", dir, e))?;
    let mut ids = Vec::new();
    for name in &names {
        match SegmentId::parse(name) {
            Some(id) => ids.push(id),
            None if name.ends_with(crate::format::seq::SEGMENT_SUFFIX) => {
                return Err(Error::Corrupt {
                    path: dir.join(name),
                    offset: 0,
                    seq: None,
                    kind: Corruption::BadSegmentName,
                });
            }
            // Other files (the lock file, an operator's notes) are not ours to judge.
            None => {}
        }
    }
    ids.sort();
    let mut report = RecoveryReport {
        segments_found: ids.len(),
        ..RecoveryReport::default()
    };

    // A lossy repair, run by an operator after a strict open failed, reads
    // everything: it must see damage wherever it lies. The newest file is read
    // whole in any case: it is where a crash leaves its marks, and a file that
    // ends inside a record (after a close, or a cut) must not be read through
    // whatever its last bytes claim.
    let check = match mode {
        RecoveryMode::Lossy => OpenCheck::EveryFrame,
        _ => options.open_check,
    };
    let mut scans = Vec::with_capacity(ids.len());
    for (k, &id) in ids.iter().enumerate() {
        let check = if k + 1 == ids.len() {
            OpenCheck::EveryFrame
        } else {
            check
        };
        // The two newest files are the only ones a writer of this process may
        // have left with bytes not yet synced (its active segment, and the one
        // it was sealing), if a write, a cut or a seal failed: make what is
        // about to be read durable first, so that a reopen in the same process
        // never builds on bytes a power cut would take back. (Bytes a failed
        // fsync dropped are the writer's to cut back when it is poisoned.)
        let sync = k + 2 >= ids.len();
        scans.push(scan_segment(storage, dir, id, check, sync)?);
    }

    // The log start: the highest recorded anywhere. Segments wholly below it are
    // leftovers of an interrupted deletion: acknowledged, whatever they now hold,
    // but they must be segwal's own files.
    let log_start = scans
        .iter()
        .flat_map(|s| [s.header.map(|h| h.log_start), s.log_start_marker])
        .flatten()
        .max()
        .unwrap_or(Seq::from(1));
    let leftovers = scans
        .iter()
        .take_while(|s| s.id.first_seq() < log_start)
        .count();
    let mut live: Vec<Scan> = scans.split_off(leftovers);
    let leftover_scans = scans;
    if let Some(foreign) = leftover_scans.iter().find(|s| s.header.is_none()) {
        let d = foreign
            .damage
            .as_ref()
            .map_or(Corruption::BadSegmentHeader, |d| d.cause.clone());
        return Err(Error::Corrupt {
            path: foreign.path.clone(),
            offset: 0,
            seq: None,
            kind: d,
        });
    }
    let missing_start = |path: &Path| Error::Corrupt {
        path: path.to_path_buf(),
        offset: 0,
        seq: Some(log_start),
        kind: Corruption::MissingSegment {
            expected_first: log_start,
        },
    };

    // The highest number the disk shows was ever assigned: in any frame, valid or
    // past damage, in any header, in any file name. Nothing at or below it is
    // assigned again.
    let highest_id = ids.last().map_or(0, |id| id.0);
    let max_seen = live
        .iter()
        .flat_map(|s| {
            [
                s.seq_at(s.frames.len()),
                s.damage.as_ref().and_then(|d| d.max_seen),
                s.header.map(|h| h.prev_seq),
            ]
        })
        .flatten()
        .max()
        .unwrap_or(Seq::from(0))
        .max(Seq::from(highest_id.saturating_sub(1)));

    let mut plan = Plan::default();

    // The newest end of the log, newest file first:
    // - an empty newest segment (created by a rotation or a recovery, nothing
    //   written to it yet) becomes the writer's active segment again;
    // - a newest file whose header never became durable holds nothing and goes
    //   (a header is fsynced before anything after it is written, so a valid
    //   frame after a damaged header would make it corruption);
    // - a torn tail of the newest segment holding frames is cut at the start of
    //   its write batch.
    // A crash inside recovery can leave one of each, so this repeats.
    while !live.is_empty() {
        // Whether the segment before the newest lacks its seal: then the newest
        // never received a frame (a seal is fsynced before its successor's
        // first frame is written).
        let n = live.len();
        let before = n.checked_sub(2).and_then(|k| live.get(k));
        let after_unsealed = before.filter(|b| b.seal.is_none()).map(Scan::last_seq);
        let Some(last) = live.last_mut() else { break };
        if last.is_empty_and_whole() && plan.reuse.is_none() {
            plan.reuse = live.pop();
            continue;
        }
        let Some(d) = last.damage.as_mut() else { break };
        if let Some((valid_offset, valid_seq)) = d.evidence {
            // Not torn: say why, here where a torn tail was possible.
            d.cause = Corruption::DamageBeforeValidFrame {
                valid_offset,
                valid_seq,
            };
            break;
        }
        if !d.tearable {
            break;
        }
        let cut = d.batch_start;
        // ... and the newest names a predecessor after the other's last frame, as
        // a rotation does, and no valid frame of its own lies past the damage.
        let holds_nothing = last.frames.is_empty()
            && d.max_seen.is_none()
            && after_unsealed
                .is_some_and(|prev_last| last.header.is_some_and(|h| h.prev_seq > prev_last));
        if cut < SEGMENT_HEADER_LEN as u64 || holds_nothing {
            // No valid frame follows the damaged header: the file holds nothing.
            // (Recovery itself may have created a newer, empty segment before a
            // crash stopped it from removing this one.) Likewise a whole header
            // followed by garbage (a preallocation or a grown size that reached
            // the disk before the space was written) when the segment before it
            // was never sealed: no frame was ever written after that header.
            plan.torn = Some((last.path.clone(), 0, d.cause.clone(), last.len));
            plan.remove_torn.extend(live.pop());
            continue;
        }
        plan.torn = Some((last.path.clone(), cut, d.cause.clone(), last.len));
        last.damage = None;
        // Even if the cut leaves no frame, the segment is not reused: the writer
        // would hand out the numbers of the frames just cut. It is sealed, and
        // the writer goes on above every number seen.
        last.cut_at(cut);
        break;
    }

    // The oldest segment left must start at the log start.
    match (live.first().or(plan.reuse.as_ref()), leftover_scans.last()) {
        (Some(oldest), _) if oldest.id.first_seq() != log_start => {
            return Err(missing_start(&oldest.path));
        }
        // Every file is below the recorded log start, yet the segment that
        // recorded it must still exist.
        (None, Some(last)) => return Err(missing_start(&last.path)),
        _ => {}
    }

    // Every other damage, in log order: inside a segment, or between two.
    let mut first_damage: Option<(usize, Damage)> = None;
    for k in 0..live.len() {
        if let Some(d) = live[k].damage.take() {
            first_damage = Some((k, d));
            break;
        }
        let next = match live.get(k + 1) {
            Some(n) => Link::Segment(n),
            None => plan.reuse.as_ref().map_or(Link::Nothing, Link::Active),
        };
        if let Some(d) = check_link(&live[k], next) {
            // A broken link is reported on the later file when there is one.
            let at = if d.offset == 0 { k + 1 } else { k };
            first_damage = Some((at, d));
            break;
        }
    }

    if let Some((k, damage)) = first_damage {
        let Some(damaged) = live.get(k).or(plan.reuse.as_ref()) else {
            unreachable!("damage found in a segment that is not in the log");
        };
        if mode != RecoveryMode::Lossy {
            return Err(damaged.corrupt(&damage));
        }
        // Lossy: cut at the start of the damaged write batch, so that what is
        // kept still ends at the end of a batch, and delete every later segment.
        let path = damaged.path.clone();
        plan.remove.extend(live.drain((k + 1).min(live.len())..));
        plan.remove.extend(plan.reuse.take());
        plan.torn = None;
        let mut first = damage.expected;
        if let Some(s) = live.get_mut(k) {
            let kept = frames_below(&s.frames, damage.batch_start);
            first = first.min(s.seq_at(kept + 1).unwrap_or(first));
            if kept == 0 {
                plan.remove.extend(live.pop());
            } else {
                s.cut_at(damage.batch_start);
            }
        }
        report.dropped = (!silent_cut).then_some(Dropped {
            path,
            offset: damage.batch_start,
            cause: damage.cause,
            first,
            last: Some(max_seen).filter(|&m| m >= first),
            deleted_segments: plan.remove.iter().map(|s| s.path.clone()).collect(),
        });
    }

    // The writer's active segment: the empty one found, or a new one named above
    // every number and file seen. The segment before it is sealed with the number
    // the active segment's header names, unless it already is.
    let newest_seal = live.last().and_then(|s| s.seal.map(|(seal, _)| seal));
    let (active_prev, create) = match &plan.reuse {
        Some(r) => (r.header.map_or(max_seen, |h| h.prev_seq), None),
        None => {
            let prev = match (live.last(), newest_seal) {
                (Some(_), Some(seal)) => seal,
                (Some(_), None) => max_seen.next(),
                (None, _) => max_seen,
            };
            let first = prev.max(max_seen).max(Seq::from(highest_id)).next();
            (prev, Some(first))
        }
    };
    let seal_newest = match live.last() {
        Some(s) if s.seal.is_none() => Some(SealTarget {
            id: s.id,
            path: s.path.as_path().into(),
            file: s.file.clone(),
            at: s.end(),
            seq: active_prev,
            index: IndexBuilder::of(&s.frames, kept_log_start(s))
                .encode(s.header.map_or(0, |h| h.nonce)),
        }),
        _ => None,
    };
    let log_start = live.first().map_or_else(
        || {
            plan.reuse
                .as_ref()
                .map_or(create.unwrap_or(log_start), |r| r.id.first_seq())
        },
        |s| s.id.first_seq(),
    );

    // Apply. First the files that hold nothing, so that no later crash leaves
    // them below a newer segment; then the active segment, durably: from here on
    // a crash leaves the highest number on disk; then removals, made durable;
    // then truncations.
    for s in &plan.remove_torn {
        storage
            .remove(&s.path)
            .map_err(|e| Error::io("remove segment", &s.path, e))?;
    }
    if !plan.remove_torn.is_empty() {
        storage
            .sync_dir(dir)
            .map_err(|e| Error::io("sync directory", dir, e))?;
    }
    let active = match (plan.reuse.take(), create) {
        (Some(mut r), _) => {
            if let Some(cut) = r.cut {
                truncate(&mut r, cut)?;
            }
            // Preallocated again if a close gave its space back (only a
            // speed-up, as in the writer).
            let _ = r.file.allocate(options.segment_bytes);
            // Its directory entry may not be durable yet (a crash, or a failed
            // directory fsync, right after it was created).
            storage
                .sync_dir(dir)
                .map_err(|e| Error::io("sync directory", dir, e))?;
            // Frames go right after the header: the rest of the file, if any, is
            // preallocated zeros.
            ActiveStart {
                id: r.id,
                len: r.end(),
                nonce: r.header.map_or(0, |h| h.nonce),
                path: r.path.into(),
                file: r.file,
            }
        }
        (None, Some(first)) => create_active(
            storage,
            dir,
            first,
            active_prev,
            log_start,
            options.segment_bytes,
        )?,
        (None, None) => unreachable!("an active segment is either reused or created"),
    };
    let mut dir_dirty = false;
    for s in leftover_scans.iter().chain(&plan.remove) {
        storage
            .remove(&s.path)
            .map_err(|e| Error::io("remove segment", &s.path, e))?;
        dir_dirty = true;
    }
    report.removed = plan
        .remove_torn
        .iter()
        .chain(&leftover_scans)
        .chain(plan.remove.iter().filter(|_| report.dropped.is_none()))
        .map(|s| s.path.clone())
        .collect();
    if dir_dirty {
        storage
            .sync_dir(dir)
            .map_err(|e| Error::io("sync directory", dir, e))?;
    }
    for s in &mut live {
        if let Some(cut) = s.cut {
            truncate(s, cut)?;
        }
    }
    if let Some((path, cut, cause, old_len)) = plan.torn {
        report.torn_tail = Some(TornTail {
            path,
            offset: cut,
            bytes: old_len.saturating_sub(cut),
            cause,
        });
    }

    report.records_recovered = live
        .iter()
        .map(|s| s.frames.iter().filter(|f| f.2).count() as u64)
        .sum();
    let segments = live
        .into_iter()
        .map(|s| RecoveredSegment {
            id: s.id,
            path: s.path.into(),
            file: s.file,
            map: s.map,
            frames: s.frames,
        })
        .collect();
    Ok(Recovered {
        segments,
        log_start,
        active,
        seal_newest,
        report,
    })
}

/// What recovery will change on disk, decided before anything is changed.
#[derive(Default)]
struct Plan {
    /// The torn tail to report: (file, cut, cause, length before the cut).
    torn: Option<(PathBuf, u64, Corruption, u64)>,
    /// An empty newest segment, to be the writer's active segment.
    reuse: Option<Scan>,
    /// Newest files whose header never became durable: removed first of all.
    remove_torn: Vec<Scan>,
    /// Segments removed whole.
    remove: Vec<Scan>,
}

/// What follows a segment in the log.
enum Link<'a> {
    /// Another segment holding frames.
    Segment(&'a Scan),
    /// The empty segment that becomes the writer's active one.
    Active(&'a Scan),
    /// Nothing: the writer will create the next segment.
    Nothing,
}

/// Checks the link from segment `s` to what follows it.
fn check_link(s: &Scan, next: Link<'_>) -> Option<Damage> {
    let damage = |offset: u64, expected: Seq, cause| Damage {
        offset,
        expected,
        cause,
        batch_start: offset,
        tearable: false,
        max_seen: None,
        evidence: None,
    };
    let prev_of = |n: &Scan| n.header.map_or(Seq::from(0), |h| h.prev_seq);
    match (s.seal, next) {
        (None, Link::Nothing) => None,
        // The writer seals `s` with the number the active segment names.
        (None, Link::Active(n)) if prev_of(n) > s.last_seq() && n.id.first_seq() > prev_of(n) => {
            None
        }
        (None, Link::Active(n)) => Some(damage(
            0,
            s.last_seq().next(),
            Corruption::BrokenChain {
                expected_prev: s.last_seq(),
                found_prev: prev_of(n),
            },
        )),
        (None, Link::Segment(_)) => Some(damage(
            s.end(),
            s.last_seq().next(),
            Corruption::MissingSeal,
        )),
        // Sealed, but what followed is gone.
        (Some((seal, at)), Link::Nothing) => Some(damage(
            u64::from(at),
            seal.next(),
            Corruption::MissingSegment {
                expected_first: seal.next(),
            },
        )),
        // The next segment names the seal's number as its predecessor and starts
        // after it (not always right after: numbers may be skipped, never reused).
        (Some((seal, _)), Link::Segment(n) | Link::Active(n)) => {
            let prev = prev_of(n);
            if prev > seal {
                Some(damage(
                    0,
                    seal.next(),
                    Corruption::MissingSegment {
                        expected_first: seal.next(),
                    },
                ))
            } else if n.id.first_seq() <= seal || prev != seal {
                Some(damage(
                    0,
                    seal.next(),
                    Corruption::BrokenChain {
                        expected_prev: seal,
                        found_prev: prev,
                    },
                ))
            } else {
                None
            }
        }
    }
}

/// Creates the writer's first segment, durably: header fsynced, then the directory.
fn create_active(
    storage: &dyn Storage,
    dir: &Path,
    first: Seq,
    prev_seq: Seq,
    log_start: Seq,
    options_segment_bytes: u64,
) -> Result<ActiveStart> {
    let id = SegmentId(first.get());
    let path: Arc<Path> = dir.join(id.file_name()).into();
    let header = SegmentHeader {
        first_seq: first,
        prev_seq,
        log_start,
        created_unix_ms: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64),
        nonce: storage.random_u64(),
    };
    let file = storage
        .create(&path)
        .map_err(|e| Error::io("create segment", &*path, e))?;
    // Only a speed-up, as in the writer: a failure shows later at a write.
    let _ = file.allocate(options_segment_bytes);
    let made_durable = crate::io::write_all_at(&*file, &header.encode(), 0)
        .map_err(|e| Error::io("write segment header", &*path, e))
        .and_then(|()| {
            file.sync_data()
                .map_err(|e| Error::io("sync segment header", &*path, e))
        })
        .and_then(|()| {
            storage
                .sync_dir(dir)
                .map_err(|e| Error::io("sync directory", dir, e))
        });
    if let Err(e) = made_durable {
        // Leave a file that holds nothing, which the next recovery removes,
        // rather than a header the page cache shows but the disk may not have.
        if file.set_len(0).is_ok() {
            let _ = file.sync_data();
        }
        return Err(e);
    }
    Ok(ActiveStart {
        id,
        path,
        file,
        len: SEGMENT_HEADER_LEN as u64,
        nonce: header.nonce,
    })
}

/// Cuts a segment file to `len` bytes, durably, and maps what is left.
fn truncate(s: &mut Scan, len: u64) -> Result<()> {
    // Drop the view first: a mapped page past the end of a file faults when read.
    s.map = Arc::new(Vec::new());
    s.file
        .set_len(len)
        .map_err(|e| Error::io("truncate segment", &s.path, e))?;
    s.file
        .sync_data()
        .map_err(|e| Error::io("sync truncated segment", &s.path, e))?;
    s.map = s
        .file
        .map(len)
        .map_err(|e| Error::io("map segment", &s.path, e))?;
    s.len = len;
    s.cut = None;
    Ok(())
}

/// How many frames end at or before `cut`.
fn frames_below(frames: &[(u32, u32, bool)], cut: u64) -> usize {
    frames
        .iter()
        .take_while(|f| u64::from(f.0) + u64::from(f.1) <= cut)
        .count()
}

/// The highest log start recorded by the frames `s` keeps (recovery may have
/// planned to cut some).
fn kept_log_start(s: &Scan) -> Option<Seq> {
    let buf: &[u8] = (*s.map).as_ref();
    let salt = frame::salt(s.id);
    s.frames
        .iter()
        .filter(|f| !f.2)
        .filter_map(|f| {
            let f = frame::decode(buf.get(f.0 as usize..)?, salt).ok()?;
            let bytes = <[u8; 8]>::try_from(f.payload).ok()?;
            (f.header.kind == FrameKind::LogStart).then(|| Seq::from(u64::from_le_bytes(bytes)))
        })
        .max()
}

/// Scans one segment file: header, frames, and the first damage if any. Under
/// [`OpenCheck::SealIndex`], a segment that ends with a seal carrying a valid
/// index is read through the index alone.
fn scan_segment(
    storage: &dyn Storage,
    dir: &Path,
    id: SegmentId,
    check: OpenCheck,
    sync: bool,
) -> Result<Scan> {
    let path = dir.join(id.file_name());
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
    let mut scan = Scan {
        id,
        path,
        file,
        map,
        header: None,
        frames: Vec::new(),
        log_start_marker: None,
        seal: None,
        len,
        cut: None,
        damage: None,
    };
    let map = scan.map.clone();
    let buf: &[u8] = (*map).as_ref();
    let salt = frame::salt(id);
    if check == OpenCheck::SealIndex && scan_by_index(buf, id, &mut scan) {
        return Ok(scan);
    }
    let damage = scan_frames(buf, id, &mut scan);
    if let Some(mut d) = damage {
        // Look past the damage: a valid frame of a later sync group proves the
        // damaged one was fsynced, so it cannot be torn.
        // Every byte is read here, holes or not: this runs only after damage,
        // and a hole wrongly reported must not hide the frame that proves it.
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
                d.evidence = Some((found_at as u64, h.seq));
            }
        }
        scan.damage = Some(d);
    }
    Ok(scan)
}

/// Reads a sealed segment through the index in its seal frame, the last frame of
/// the file, found through the index's trailer. Fills `scan` and returns true if
/// the header, the seal and the index all check; otherwise leaves `scan` alone
/// and returns false, and the caller reads the segment whole.
///
/// Sound because a seal is written only after every frame before it is fsynced
/// (docs/FORMAT.md, "The seal index"): a seal that checks vouches for a segment
/// that was complete. Frames are checked when their records are read.
fn scan_by_index(buf: &[u8], id: SegmentId, scan: &mut Scan) -> bool {
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
    // producer's payload cannot know it.
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
    scan.frames.push((at32, seal_len as u32, false));
    scan.seal = Some((f.header.seq, at32));
    scan.log_start_marker = index.log_start;
    true
}

/// Walks the frames after the header; fills `scan` and returns the first damage.
fn scan_frames(buf: &[u8], id: SegmentId, scan: &mut Scan) -> Option<Damage> {
    let salt = frame::salt(id);
    let header = match SegmentHeader::decode(buf) {
        Ok(h) if h.first_seq != id.first_seq() => {
            return Some(Damage {
                offset: 0,
                expected: id.first_seq(),
                cause: Corruption::NameMismatch {
                    expected: id.first_seq(),
                    found: h.first_seq,
                },
                batch_start: 0,
                tearable: false,
                max_seen: None,
                evidence: None,
            });
        }
        Ok(h) => h,
        Err(cause) => {
            // The header is written and fsynced before any frame: a damaged header
            // is torn only if nothing valid follows it (checked by the caller).
            // A whole header from another version or with unknown flags, its
            // checksum valid, was written on purpose: never removed as torn.
            let tearable = matches!(
                cause,
                Corruption::ShortSegmentHeader { .. }
                    | Corruption::BadSegmentMagic
                    | Corruption::BadSegmentHeader
            );
            return Some(Damage {
                offset: 0,
                expected: id.first_seq(),
                cause,
                batch_start: 0,
                tearable,
                max_seen: None,
                evidence: None,
            });
        }
    };
    scan.header = Some(header);
    let mut offset = SEGMENT_HEADER_LEN;
    let mut expected = id.first_seq();
    let mut batch_start = SEGMENT_HEADER_LEN;
    // The sync group of the previous frame, and whether its write batch was open.
    let mut prev: Option<(Seq, bool)> = None;
    // A frame with a valid checksum that does not fit the log was not torn: it
    // is corruption wherever it lies.
    let structural = |offset: usize, expected: Seq, batch_start: usize, cause| {
        Some(Damage {
            offset: offset as u64,
            expected,
            cause,
            batch_start: batch_start as u64,
            tearable: false,
            max_seen: None,
            evidence: None,
        })
    };
    while offset < buf.len() {
        let rest = buf.get(offset..).unwrap_or_default();
        let f = match frame::decode(rest, salt) {
            Ok(f) => f,
            // Zeros up to the end of the file: space preallocated and never
            // written, the clean end of the data (unless a write batch is still
            // open, checked below).
            Err(_) if zeros_to_end(&*scan.file, buf, offset) => break,
            Err(cause) => {
                return Some(Damage {
                    offset: offset as u64,
                    expected,
                    tearable: !frame::is_checksummed(&cause),
                    cause,
                    batch_start: batch_start as u64,
                    max_seen: None,
                    evidence: None,
                });
            }
        };
        let h = f.header;
        if scan.seal.is_some() {
            return structural(offset, expected, batch_start, Corruption::FrameAfterSeal);
        }
        // Seal frames may skip numbers: the writer seals a recovered segment with
        // a number above every one recovery saw, so that none is reused.
        let skips = h.kind == FrameKind::Seal && h.seq > expected;
        if h.seq != expected && !skips {
            return structural(
                offset,
                expected,
                batch_start,
                Corruption::UnexpectedSeq {
                    expected,
                    found: h.seq,
                },
            );
        }
        // A write batch lies inside one sync group; a new batch either continues
        // the group (buffered durability) or starts a new one at its own seq.
        let group_ok = match prev {
            Some((group, true)) => h.group == group,
            Some((group, false)) => h.group == group || h.group == h.seq,
            None => h.group == h.seq,
        };
        if !group_ok {
            let want = prev.map_or(h.seq, |p| p.0);
            return structural(
                offset,
                expected,
                batch_start,
                Corruption::BadGroup {
                    expected: want,
                    found: h.group,
                },
            );
        }
        if h.kind == FrameKind::LogStart {
            let Ok(bytes) = <[u8; 8]>::try_from(f.payload) else {
                return structural(
                    offset,
                    expected,
                    batch_start,
                    Corruption::Unsupported {
                        what: "log start payload length",
                        value: f.payload.len() as u64,
                    },
                );
            };
            let value = Seq::from(u64::from_le_bytes(bytes));
            scan.log_start_marker = scan.log_start_marker.max(Some(value));
        }
        // Offsets fit in u32: segments are capped well below 4 GiB, and a longer
        // file cannot hold a frame past the cap without failing this conversion.
        let (Ok(at), Ok(len)) = (u32::try_from(offset), u32::try_from(f.len)) else {
            return structural(
                offset,
                expected,
                batch_start,
                Corruption::LengthOutOfRange {
                    len: (offset + f.len) as u64,
                    max: u64::from(u32::MAX),
                },
            );
        };
        if h.kind == FrameKind::Seal {
            // An index, if the seal carries one, must describe what was read.
            if !f.payload.is_empty() {
                let fits = seal::decode(f.payload, offset as u64).and_then(|index| {
                    let nonce = scan.header.map_or(0, |h| h.nonce);
                    let what = if index.nonce != nonce {
                        "nonce differs from the segment header's"
                    } else if index.frames != scan.frames {
                        "frames differ from the segment's"
                    } else if index.log_start != scan.log_start_marker {
                        "log start differs from the segment's"
                    } else {
                        return Ok(());
                    };
                    Err(Corruption::BadSealIndex { what })
                });
                if let Err(cause) = fits {
                    return structural(offset, expected, batch_start, cause);
                }
            }
            scan.seal = Some((h.seq, at));
        }
        scan.frames.push((at, len, h.kind == FrameKind::Record));
        offset += f.len;
        expected = h.seq.next();
        prev = Some((h.group, !h.batch_end));
        if h.batch_end {
            batch_start = offset;
        }
    }
    if prev.is_some_and(|p| p.1) {
        // The file ends inside a write batch: its last frames never reached disk.
        return Some(Damage {
            offset: offset as u64,
            expected,
            cause: Corruption::IncompleteBatch,
            batch_start: batch_start as u64,
            tearable: true,
            max_seen: None,
            evidence: None,
        });
    }
    None
}

/// The file's next region that may hold data, from `at` on, as offsets into
/// `buf` (the file's view): `None` if the rest reads as zeros. A file system
/// that cannot tell reports the rest as data; so does a failed query.
fn data_region(file: &dyn StorageFile, buf: &[u8], at: usize) -> Option<(usize, usize)> {
    if at >= buf.len() {
        return None;
    }
    let whole = Some((at, buf.len()));
    let Ok(region) = file.next_data(at as u64) else {
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
fn zeros_to_end(file: &dyn StorageFile, buf: &[u8], from: usize) -> bool {
    let page = from
        .saturating_add(PAGE)
        .next_multiple_of(PAGE)
        .min(buf.len());
    if !all_zero(buf.get(from..page).unwrap_or_default()) {
        return false;
    }
    let mut at = page;
    while let Some((start, end)) = data_region(file, buf, at) {
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
