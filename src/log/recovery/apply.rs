//! Applying a plan: the only part of recovery that changes files.
//!
//! The order makes every step safe to interrupt (docs/FORMAT.md, "Crash during
//! recovery"): first the files that hold nothing, so that no later crash leaves
//! them below a newer segment; then the writer's active segment, durably, so
//! that from here on a crash leaves the highest number on disk; then removals,
//! made durable; then cuts, each fsynced.

use std::path::{Path, PathBuf};

use super::plan::{ActivePlan, Plan};
use super::report::RecoveryReport;
use super::scan::{Opened, SegmentScan};
use super::{Recovered, RecoveredSegment};
use crate::error::{Error, Result};
use crate::format::frame;
use crate::format::seal::IndexBuilder;
use crate::format::segment::FRAMES_AT;
use crate::io::Storage;
use crate::io::segment_file::{FreshSegment, PendingSeal, SegmentFile};

/// Applies `plan`, decided from `scans`, to the files `opened` (one per scan) in
/// `dir`; new segments are preallocated to `preallocate` bytes.
pub(crate) fn apply(
    storage: &dyn Storage,
    dir: &Path,
    scans: Vec<SegmentScan>,
    opened: Vec<Opened>,
    plan: Plan,
    preallocate: u64,
) -> Result<Recovered> {
    let mut report = RecoveryReport {
        segments_found: scans.len(),
        records_recovered: plan.records,
        ..RecoveryReport::default()
    };
    let path = |k: usize| scans[k].path.clone();
    remove_all(storage, dir, plan.remove_empty.iter().map(|&k| path(k)))?;
    let active = match plan.active {
        ActivePlan::Reuse { scan } => {
            reuse(storage, dir, &scans[scan], &opened[scan], preallocate)?
        }
        ActivePlan::Create { first, prev } => {
            // A new outbox draws its identity with its first segment.
            let outbox_id = plan.outbox_id.unwrap_or_else(|| {
                u128::from(storage.random_u64()) << 64 | u128::from(storage.random_u64())
            });
            SegmentFile::create(
                storage,
                dir,
                first,
                prev,
                plan.log_start,
                outbox_id,
                preallocate,
            )
            .map_err(|f| f.into_error())?
        }
    };
    let dropped = plan.leftovers.iter().chain(&plan.remove);
    remove_all(storage, dir, dropped.map(|&k| path(k)))?;
    report.removed = plan
        .remove_empty
        .iter()
        .chain(&plan.leftovers)
        .chain(plan.remove.iter().filter(|_| plan.dropped.is_none()))
        .map(|&k| path(k))
        .collect();
    let (segments, seal) = keep_segments(storage, scans, opened, &plan)?;
    report.torn_tail = plan.torn;
    report.dropped = plan.dropped;
    Ok(Recovered {
        segments,
        log_start: plan.log_start,
        active,
        seal,
        report,
    })
}

/// The segments `plan` keeps, cut where it says, and the seal their newest one
/// lacks.
fn keep_segments(
    storage: &dyn Storage,
    scans: Vec<SegmentScan>,
    opened: Vec<Opened>,
    plan: &Plan,
) -> Result<(Vec<RecoveredSegment>, Option<PendingSeal>)> {
    let mut scans: Vec<Option<SegmentScan>> = scans.into_iter().map(Some).collect();
    let mut opened: Vec<Option<Opened>> = opened.into_iter().map(Some).collect();
    let mut segments = Vec::with_capacity(plan.keep.len());
    let mut seal = None;
    let newest = plan.keep.len().checked_sub(1);
    for (n, keep) in plan.keep.iter().enumerate() {
        let (Some(scan), Some(file)) = (scans[keep.scan].take(), opened[keep.scan].take()) else {
            unreachable!("a plan keeps each segment once");
        };
        let target = plan.seal.as_ref().filter(|_| Some(n) == newest);
        let kept_log_start = target.and_then(|t| scan.log_start_below(t.at));
        let nonce = scan.header.map_or(0, |h| h.nonce);
        let mut frames = scan.frames;
        frames.truncate(keep.frames);
        if let Some(cut) = keep.cut {
            file.open(storage)?.cut(cut).map_err(|f| f.into_error())?;
        }
        if let Some(target) = target {
            let index = IndexBuilder::of(&frames, kept_log_start);
            seal = Some(PendingSeal {
                salt: frame::salt(file.id, nonce),
                segment: file.open(storage)?,
                at: target.at,
                seq: target.seq,
                index: index.encode(nonce),
            });
        }
        segments.push(RecoveredSegment {
            salt: frame::salt(file.id, nonce),
            id: file.id,
            path: file.path,
            frames,
        });
    }
    Ok((segments, seal))
}

/// Makes the empty newest segment the writer's active one again.
fn reuse(
    storage: &dyn Storage,
    dir: &Path,
    scan: &SegmentScan,
    opened: &Opened,
    preallocate: u64,
) -> Result<FreshSegment> {
    // Preallocated again if a close gave its space back (only a speed-up, as in
    // the writer).
    let segment = opened.open(storage)?;
    let _ = segment.file.allocate(preallocate);
    // Its directory entry may not be durable yet (a crash, or a failed
    // directory fsync, right after it was created).
    storage
        .sync_dir(dir)
        .map_err(|e| Error::io("sync directory", dir, e))?;
    // Frames go right after the header: the rest of the file, if any, is
    // preallocated zeros.
    Ok(FreshSegment {
        segment,
        len: FRAMES_AT as u64,
        nonce: scan.header.map_or(0, |h| h.nonce),
        outbox_id: scan.header.map_or(0, |h| h.outbox_id),
    })
}

/// Removes every file of `paths`, then fsyncs the directory if there was any.
fn remove_all(
    storage: &dyn Storage,
    dir: &Path,
    paths: impl Iterator<Item = PathBuf>,
) -> Result<()> {
    let mut removed = false;
    for path in paths {
        storage
            .remove(&path)
            .map_err(|e| Error::io("remove segment", &path, e))?;
        removed = true;
    }
    if removed {
        storage
            .sync_dir(dir)
            .map_err(|e| Error::io("sync directory", dir, e))?;
    }
    Ok(())
}
