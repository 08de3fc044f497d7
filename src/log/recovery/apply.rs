//! Applying a plan: the only part of recovery that changes files.
//!
//! The order makes every step safe to interrupt (docs/FORMAT.md, "Crash during
//! recovery"): first the files that provably hold nothing, so that no later
//! crash leaves them below a newer segment; then the writer's active segment,
//! durably, so that from here on a crash leaves the highest number on disk;
//! then what a lossy repair drops or cuts, set aside in the quarantine folder;
//! then removals, made durable; then cuts, each fsynced. No file is deleted
//! unless its bytes prove it holds nothing or it is this outbox's and wholly
//! acknowledged (docs/FORMAT.md, "Recovery").

use std::path::{Path, PathBuf};

use super::plan::{ActivePlan, Plan};
use super::report::{QuarantineReason, Quarantined, RecoveryReport};
use super::scan::{self, Opened, SegmentScan};
use super::{Recovered, RecoveredSegment};
use crate::error::{Error, Result};
use crate::format::frame;
use crate::format::seal;
use crate::format::segment::{BLOCK, FRAMES_AT};
use crate::io::Storage;
use crate::io::segment_file::{self, FreshSegment, PendingSeal, SegmentFile, Successor};

/// What recoveries of one open removed and set aside so far: an open that
/// retries (a full disk, once the reserve is released) reports the first
/// attempt's changes too.
#[derive(Default)]
pub(crate) struct Effects {
    pub removed: Vec<PathBuf>,
    pub quarantined: Vec<Quarantined>,
    /// The empty newest segment made the writer's again has no room for a
    /// block of frames (the disk is full): the writer could not write a frame
    /// into it, and `Outbox::open` gives it the reserve's space.
    pub active_without_room: bool,
    /// The torn tail an attempt cut, and what a lossy one dropped: a retry
    /// finds them gone.
    pub torn_tail: Option<super::report::TornTail>,
    pub dropped: Option<super::report::Dropped>,
}

/// What recovery found in the directory.
pub(crate) struct Found {
    /// Every segment file, scanned, in log order.
    pub scans: Vec<SegmentScan>,
    /// The same files, to open again (one per scan).
    pub opened: Vec<Opened>,
    /// Files of segments whose creation a crash interrupted.
    pub creating: Vec<PathBuf>,
    /// Files of fully acknowledged segments kept for recycling.
    pub free: Vec<PathBuf>,
}

/// The leftover `files` that `ours` proves this outbox's to deal with
/// (remove, or keep); every other one is moved to `quarantine/` for `reason`
/// and noted in `effects`.
fn ours_or_aside(
    storage: &dyn Storage,
    dir: &Path,
    files: Vec<PathBuf>,
    ours: impl Fn(&Path) -> Result<bool>,
    reason: QuarantineReason,
    effects: &mut Effects,
) -> Result<Vec<PathBuf>> {
    let mut kept = Vec::new();
    for file in files {
        if ours(&file)? {
            kept.push(file);
        } else {
            effects.quarantined.push(aside(storage, dir, file, reason)?);
        }
    }
    Ok(kept)
}

/// How the writer's segments are made: what recovery hands it.
pub(crate) struct NewSegments {
    /// The space a new (or reused) active segment reserves.
    pub preallocate: u64,
    /// The interval between index checkpoints a new segment's header names.
    pub checkpoint_every: u32,
    /// Whether one file kept for recycling is handed on.
    pub keep_spare: bool,
}

/// Applies `plan`, decided from what was `found` in `dir`; new segments are
/// made as `new` says.
pub(crate) fn apply(
    storage: &dyn Storage,
    dir: &Path,
    found: Found,
    plan: Plan,
    new: NewSegments,
    effects: &mut Effects,
) -> Result<Recovered> {
    let Found {
        scans,
        opened,
        creating,
        free,
    } = found;
    // Noted before anything is cut, removed or set aside: a try that fails
    // after that leaves the next one without them.
    if plan.torn.is_some() {
        effects.torn_tail.clone_from(&plan.torn);
    }
    if let Some(dropped) = &plan.dropped {
        match effects.dropped.as_mut() {
            Some(before) => before.absorb(dropped),
            None => effects.dropped = Some(dropped.clone()),
        }
    }
    let mut report = RecoveryReport {
        segments_found: scans.len(),
        records_recovered: plan.records,
        frames_from_checkpoints: scans.iter().map(|s| s.listed).sum(),
        ..RecoveryReport::default()
    };
    let path = |k: usize| scans[k].path.clone();
    // Unfinished creations never held a record (a segment is renamed to its
    // name before its first frame): removed where their bytes prove they hold
    // nothing, set aside otherwise, and so is one that cannot be read (a
    // FIFO under the name, a bad block): the log needs none of them.
    let mut unfinished = ours_or_aside(
        storage,
        dir,
        creating,
        |file| Ok(scan::creation_holds_nothing(storage, file).unwrap_or(false)),
        QuarantineReason::UnfinishedCreation,
        effects,
    )?;
    // Files kept for recycling held only acknowledged records: one whose
    // header proves it this outbox's is kept for the writer (or removed);
    // any other is set aside, and so is one that cannot be read (a bad
    // block under a file the log no longer needs must not stop the open).
    let mut kept = ours_or_aside(
        storage,
        dir,
        free,
        |file| Ok(scan::spare_is_ours(storage, file, plan.outbox_id).unwrap_or(false)),
        QuarantineReason::UnfinishedRecycling,
        effects,
    )?
    .into_iter();
    let spare = if new.keep_spare { kept.next() } else { None };
    unfinished.extend(kept);
    let removed: Vec<PathBuf> = unfinished
        .into_iter()
        .chain(plan.remove_empty.iter().map(|&k| path(k)))
        .collect();
    remove_all(storage, dir, removed.iter().cloned())?;
    effects.removed.extend(removed);
    let repairing = plan.dropped.is_some();
    let active = match plan.active {
        ActivePlan::Reuse { scan } => reuse(
            storage,
            dir,
            &scans[scan],
            &opened[scan],
            new.preallocate,
            effects,
        )?,
        ActivePlan::Create { first, prev } => {
            // A new outbox draws its identity with its first segment.
            let outbox_id = plan.outbox_id.unwrap_or_else(|| {
                u128::from(storage.random_u64()) << 64 | u128::from(storage.random_u64())
            });
            SegmentFile::create(
                storage,
                dir,
                Successor {
                    first,
                    prev_seq: prev,
                    log_start: plan.log_start,
                    outbox_id,
                    checkpoint_every: new.checkpoint_every,
                },
                // A lossy repair reserves the new segment's space once its
                // copies are made: a try that fails for want of room for
                // them leaves a segment the next try sets aside, which would
                // take its reservation into `quarantine/` on a full disk.
                if repairing { 0 } else { new.preallocate },
            )
            .map_err(|f| f.into_error())?
        }
    };
    // A lossy repair drops whole files by moving them aside, and keeps a copy of
    // each file it cuts: it never deletes what it cannot prove it may.
    for &k in &plan.remove {
        let moved = aside(storage, dir, path(k), QuarantineReason::DroppedByRepair)?;
        effects.quarantined.push(moved);
    }
    if plan.dropped.is_some() {
        for keep in plan.keep.iter().filter(|k| k.cut.is_some()) {
            let copy = segment_file::copy_aside(
                storage,
                dir,
                &path(keep.scan),
                QuarantineReason::CutByRepair.as_str(),
            )
            .map_err(|f| f.into_error())?;
            effects.quarantined.push(Quarantined {
                from: path(keep.scan),
                to: copy,
                reason: QuarantineReason::CutByRepair,
            });
        }
    }
    remove_all(storage, dir, plan.leftovers.iter().map(|&k| path(k)))?;
    effects
        .removed
        .extend(plan.leftovers.iter().map(|&k| path(k)));
    let (segments, seal) = keep_segments(storage, scans, opened, &plan)?;
    if repairing && matches!(plan.active, ActivePlan::Create { .. }) {
        // As a creation does, after the header is durable: a disk without
        // the room leaves the writer to reserve it as it goes.
        let _ = active.segment.file.allocate(new.preallocate);
    }
    report.removed.clone_from(&effects.removed);
    report.quarantined.clone_from(&effects.quarantined);
    report.torn_tail.clone_from(&effects.torn_tail);
    report.dropped.clone_from(&effects.dropped);
    Ok(Recovered {
        segments,
        log_start: plan.log_start,
        active,
        state: Vec::new(),
        seal,
        spare,
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
    let mut pending = None;
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
            pending = Some(PendingSeal {
                salt: frame::salt(file.id, nonce),
                segment: file.open(storage)?,
                at: target.at,
                seq: target.seq,
                index: seal::index_of(&frames, kept_log_start, nonce),
            });
        }
        segments.push(RecoveredSegment {
            salt: frame::salt(file.id, nonce),
            id: file.id,
            path: file.path,
            frames,
        });
    }
    Ok((segments, pending))
}

/// Makes the empty newest segment the writer's active one again.
fn reuse(
    storage: &dyn Storage,
    dir: &Path,
    scan: &SegmentScan,
    opened: &Opened,
    preallocate: u64,
    effects: &mut Effects,
) -> Result<FreshSegment> {
    // Preallocated again if a close gave its space back: only a speed-up, as
    // in the writer, unless the disk is full, without room for even a block
    // of frames. Then the writer could not write a frame into it either, and
    // every reopen would answer its first write with a full disk: said, so
    // that the open gives it the reserve's space.
    let segment = opened.open(storage)?;
    // An open's second try on a full disk reserves nothing ahead (its
    // `preallocate` is 0): the space its first try reserved in this segment,
    // made for it, goes back, for the seal of the segment before it.
    // Only zeros lie past the header of an empty segment.
    if preallocate == 0
        && segment
            .file
            .len()
            .is_ok_and(|len| len > (FRAMES_AT + BLOCK) as u64)
    {
        let _ = segment.file.set_len(FRAMES_AT as u64);
    }
    let _ = segment.file.allocate(preallocate);
    if !room_for_a_block(&*segment.file) {
        effects.active_without_room = true;
    }
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
        written_to: FRAMES_AT as u64,
        checkpoint_every: scan.header.map_or(0, |h| h.checkpoint_every),
    })
}

/// Whether `file`, an empty segment, has room past its header for a block
/// of frames: reserved, or, where the file system cannot reserve (its
/// `allocate` then does nothing), written as zeros. False only when that
/// fails for want of space.
fn room_for_a_block(file: &dyn crate::io::StorageFile) -> bool {
    use crate::io::reserve::is_no_space;
    let end = (FRAMES_AT + BLOCK) as u64;
    match file.allocate(end) {
        Err(e) if is_no_space(&e) => return false,
        Ok(()) if file.len().is_ok_and(|len| len >= end) => return true,
        _ => {}
    }
    !crate::io::write_all_at(file, &[0u8; BLOCK], FRAMES_AT as u64).is_err_and(|e| is_no_space(&e))
}

/// Moves `file` of `dir` into the quarantine folder for `reason`.
fn aside(
    storage: &dyn Storage,
    dir: &Path,
    file: PathBuf,
    reason: QuarantineReason,
) -> Result<Quarantined> {
    let to = segment_file::set_aside(storage, dir, &file, reason.as_str())
        .map_err(|f| f.into_error())?;
    Ok(Quarantined {
        from: file,
        to,
        reason,
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
