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

use crate::error::{Corruption, Error, Result};
use crate::frame::{self, FrameKind};
use crate::io::{Mapped, Storage, StorageFile};
use crate::options::RecoveryMode;
use crate::segment::{SEGMENT_HEADER_LEN, SegmentHeader};
use crate::seq::{SegmentId, Seq};

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
    pub segments: Vec<RecoveredSegment>,
    /// The sequence number the writer assigns next.
    pub next_seq: Seq,
    /// The last sequence number of the last segment kept (0 if none).
    pub prev_seq: Seq,
    /// First sequence number of the oldest live segment.
    pub log_start: Seq,
    pub report: RecoveryReport,
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
    /// The damage is a torn tail if it is in the last segment: no valid frame of a
    /// later sync group follows, and the frames before it are well formed.
    tearable: bool,
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
    damage: Option<Damage>,
}

impl Scan {
    /// Last sequence number held (before any damage), or the one before the
    /// segment if it holds no frame.
    fn last_seq(&self) -> Seq {
        let held = self.frames.len() as u64;
        if held > 0 {
            Seq::from(self.id.0 + held - 1)
        } else {
            self.header
                .map_or(Seq::from(self.id.0.saturating_sub(1)), |h| h.prev_seq)
        }
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
pub(crate) fn recover(storage: &dyn Storage, dir: &Path, mode: RecoveryMode) -> Result<Recovered> {
    let names = storage
        .list(dir)
        .map_err(|e| Error::io("list directory", dir, e))?;
    let mut ids: Vec<SegmentId> = names.iter().filter_map(|n| SegmentId::parse(n)).collect();
    ids.sort();
    let mut report = RecoveryReport {
        segments_found: ids.len(),
        ..RecoveryReport::default()
    };

    let mut scans = Vec::with_capacity(ids.len());
    for (k, &id) in ids.iter().enumerate() {
        scans.push(scan_segment(storage, dir, id, k + 1 == ids.len())?);
    }

    // The log start: the highest recorded anywhere. Segments wholly below it are
    // leftovers of an interrupted deletion: acknowledged, whatever they now hold.
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

    if let Some(oldest) = live.first() {
        if oldest.id.first_seq() != log_start {
            return Err(Error::Corrupt {
                path: oldest.path.clone(),
                offset: 0,
                seq: Some(log_start),
                kind: Corruption::MissingSegment {
                    expected_first: log_start,
                },
            });
        }
    } else if !leftover_scans.is_empty() {
        // Every file is below the recorded log start, yet the segment that
        // recorded it must still exist.
        let last = &leftover_scans[leftover_scans.len() - 1];
        return Err(Error::Corrupt {
            path: last.path.clone(),
            offset: 0,
            seq: Some(log_start),
            kind: Corruption::MissingSegment {
                expected_first: log_start,
            },
        });
    }

    // Find the first damage, in file order: a broken chain between segments, or
    // damage inside one.
    let mut first_damage: Option<(usize, Damage)> = None;
    for k in 0..live.len() {
        if k > 0 {
            let prev_last = live[k - 1].last_seq();
            let this = &live[k];
            if let Some(h) = this.header {
                if h.prev_seq != prev_last || this.id.first_seq() <= prev_last {
                    let cause = if h.prev_seq > prev_last {
                        Corruption::MissingSegment {
                            expected_first: prev_last.next(),
                        }
                    } else {
                        Corruption::BrokenChain {
                            expected_prev: prev_last,
                            found_prev: h.prev_seq,
                        }
                    };
                    let damage = Damage {
                        offset: 0,
                        expected: prev_last.next(),
                        cause,
                        batch_start: 0,
                        tearable: false,
                        max_seen: None,
                    };
                    first_damage = Some((k, damage));
                    break;
                }
            }
        }
        if let Some(d) = live[k].damage.take() {
            first_damage = Some((k, d));
            break;
        }
    }

    // Decide, before touching anything.
    let last_index = live.len().checked_sub(1);
    let mut truncate: Option<(usize, u64, Damage)> = None;
    let mut delete_after: Option<usize> = None;
    if let Some((k, damage)) = first_damage {
        let torn = damage.tearable && Some(k) == last_index;
        if torn {
            truncate = Some((k, damage.batch_start, damage));
        } else if mode == RecoveryMode::Lossy {
            // Cut at the start of the damaged write batch, so that the segment,
            // sealed from now on, still ends at the end of a batch.
            delete_after = Some(k);
            truncate = Some((k, damage.batch_start, damage));
        } else {
            return Err(live[k].corrupt(&damage));
        }
    }

    // Apply: remove leftovers of interrupted deletions.
    let mut dir_dirty = false;
    for s in &leftover_scans {
        storage
            .remove(&s.path)
            .map_err(|e| Error::io("remove acknowledged segment", &s.path, e))?;
        report.removed.push(s.path.clone());
        dir_dirty = true;
    }

    // Lossy: later segments go whole; every number they held is dropped too.
    let mut max_seen: Option<Seq> = None;
    let mut deleted = Vec::new();
    if let Some(k) = delete_after {
        for s in live.drain(k + 1..) {
            let held = s.frames.len() as u64;
            let last_held = (held > 0).then(|| Seq::from(s.id.0 + held - 1));
            max_seen = max_seen
                .max(last_held)
                .max(s.damage.and_then(|d| d.max_seen));
            drop(s.map);
            storage
                .remove(&s.path)
                .map_err(|e| Error::io("remove segment after damage", &s.path, e))?;
            deleted.push(s.path);
            dir_dirty = true;
        }
    }

    // Apply the truncation, durably, then map what is left.
    if let Some((k, cut, damage)) = truncate {
        max_seen = max_seen.max(damage.max_seen);
        let s = &mut live[k];
        let old_len = (*s.map).as_ref().len() as u64;
        let kept = frames_below(&s.frames, cut);
        let first_dropped = Seq::from(s.id.0 + kept as u64);
        if s.frames.len() > kept {
            max_seen = max_seen.max(Some(Seq::from(s.id.0 + s.frames.len() as u64 - 1)));
        }
        s.frames.truncate(kept);
        // Drop the view before truncating: a mapped page past the end of a file
        // faults when touched.
        s.map = Arc::new(Vec::new());
        let removed_whole = cut < SEGMENT_HEADER_LEN as u64;
        if removed_whole {
            // Its header is damaged and nothing valid follows: it holds nothing.
            storage
                .remove(&s.path)
                .map_err(|e| Error::io("remove damaged segment", &s.path, e))?;
            report.removed.push(s.path.clone());
            dir_dirty = true;
        } else {
            s.file
                .set_len(cut)
                .map_err(|e| Error::io("truncate segment", &s.path, e))?;
            s.file
                .sync_data()
                .map_err(|e| Error::io("sync truncated segment", &s.path, e))?;
            s.map = s
                .file
                .map(cut)
                .map_err(|e| Error::io("map segment", &s.path, e))?;
        }
        if delete_after.is_some() {
            report.dropped = Some(Dropped {
                path: s.path.clone(),
                offset: cut,
                cause: damage.cause,
                first: first_dropped.min(damage.expected),
                last: max_seen.filter(|&m| m >= first_dropped),
                deleted_segments: std::mem::take(&mut deleted),
            });
        } else {
            report.torn_tail = Some(TornTail {
                path: s.path.clone(),
                offset: cut,
                bytes: old_len - cut,
                cause: damage.cause,
            });
        }
        if removed_whole {
            live.truncate(k);
        }
    }

    // The writer starts a new segment named after the next sequence number; an
    // empty last segment would share its name and holds nothing: remove it.
    if live.last().is_some_and(|s| s.frames.is_empty()) {
        if let Some(s) = live.pop() {
            max_seen = max_seen.max(s.header.map(|h| h.prev_seq));
            drop(s.map);
            storage
                .remove(&s.path)
                .map_err(|e| Error::io("remove empty segment", &s.path, e))?;
            report.removed.push(s.path);
            dir_dirty = true;
        }
    }
    if dir_dirty {
        storage
            .sync_dir(dir)
            .map_err(|e| Error::io("sync directory", dir, e))?;
    }

    let prev_seq = live.last().map_or_else(
        || max_seen.unwrap_or(Seq::from(log_start.get().saturating_sub(1))),
        |s| s.last_seq(),
    );
    let next_seq = prev_seq.max(max_seen.unwrap_or(prev_seq)).next();
    let log_start = live.first().map_or(next_seq, |s| s.id.first_seq());
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
        next_seq,
        prev_seq,
        log_start,
        report,
    })
}

/// How many frames end at or before `cut`.
fn frames_below(frames: &[(u32, u32, bool)], cut: u64) -> usize {
    frames
        .iter()
        .take_while(|f| u64::from(f.0) + u64::from(f.1) <= cut)
        .count()
}

/// Scans one segment file: header, frames, and the first damage if any.
fn scan_segment(storage: &dyn Storage, dir: &Path, id: SegmentId, is_last: bool) -> Result<Scan> {
    let path = dir.join(id.file_name());
    let file = storage
        .open(&path)
        .map_err(|e| Error::io("open segment", &path, e))?;
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
        damage: None,
    };
    let map = scan.map.clone();
    let buf: &[u8] = (*map).as_ref();
    let damage = scan_frames(buf, id, &mut scan);
    if let Some(mut d) = damage {
        // Look past the damage: a valid frame of a later sync group proves the
        // damaged one was fsynced, so it cannot be torn.
        let mut at = (d.offset as usize).saturating_add(1);
        while let Some((found_at, f)) = frame::find_valid_frame(buf, at) {
            d.max_seen = d.max_seen.max(Some(f.header.seq));
            // A header is fsynced before any frame is written, so a valid frame after
            // a damaged header proves the header was once whole.
            if d.offset == 0 || f.header.group > d.expected || f.header.seq <= d.expected {
                if d.tearable {
                    d.tearable = false;
                    d.cause = Corruption::DamageBeforeValidFrame {
                        valid_offset: found_at as u64,
                        valid_seq: f.header.seq,
                    };
                }
            }
            at = found_at + f.len.max(1);
        }
        d.tearable &= is_last;
        scan.damage = Some(d);
    }
    Ok(scan)
}

/// Walks the frames after the header; fills `scan` and returns the first damage.
fn scan_frames(buf: &[u8], id: SegmentId, scan: &mut Scan) -> Option<Damage> {
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
            });
        }
        Ok(h) => h,
        Err(cause) => {
            // The header is written and fsynced before any frame: a damaged header
            // is torn only if nothing valid follows it (checked by the caller).
            return Some(Damage {
                offset: 0,
                expected: id.first_seq(),
                cause,
                batch_start: 0,
                tearable: true,
                max_seen: None,
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
        })
    };
    while offset < buf.len() {
        let rest = buf.get(offset..).unwrap_or_default();
        let f = match frame::decode(rest) {
            Ok(f) => f,
            Err(cause) => {
                return Some(Damage {
                    offset: offset as u64,
                    expected,
                    cause,
                    batch_start: batch_start as u64,
                    tearable: true,
                    max_seen: None,
                });
            }
        };
        let h = f.header;
        if h.seq != expected {
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
        scan.frames.push((at, len, h.kind == FrameKind::Record));
        offset += f.len;
        expected = expected.next();
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
        });
    }
    None
}
