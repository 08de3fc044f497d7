//! Recovery: rebuilds the log from the segment files when an outbox is opened.
//!
//! Decide, then apply, in four files read top to bottom:
//! - `scan`: reads each segment file (header, frames, first damage), a pure
//!   function of its bytes;
//! - `plan`: decides from the scans what is kept, cut, removed and created, or
//!   why the outbox must not open, a pure function of the scans;
//! - `apply`: the only part that changes files, in an order safe to interrupt;
//! - `report`: what the user is told it found and changed.
//!
//! Beside them: `state` reads the delivery state the kept frames record,
//! `rebuild` turns the kept segments and that state into the state table
//! (for an open and for the read-only checks alike), and `verify` and `dump`
//! are the read-only passes the `segwal` command is built on.
//!
//! The rules, and why each is safe, are argued in `docs/FORMAT.md` ("Recovery"
//! and "Crash cases, one by one"). In short:
//!
//! - damage inside the last write batch of the last segment, with no valid frame
//!   of a *later sync group* after it, is a torn tail: the batch is truncated;
//! - any other damage is [`Error::Corrupt`] naming the file and offset, and
//!   nothing on disk is changed, unless the user asked for [`RecoveryMode::Lossy`];
//! - segments below the log start (recorded in `LogStart` frames and segment
//!   headers) are leftovers of an interrupted deletion and are removed; a segment
//!   missing at or after it is corruption.

pub(crate) mod apply;
mod checkpoints;
pub(crate) mod dump;
mod plan;
pub(crate) mod rebuild;
mod report;
mod scan;
pub(crate) mod state;
pub(crate) mod verify;

use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use report::{Dropped, QuarantineReason, Quarantined, RecoveryReport, TornTail};
#[cfg(feature = "testing")]
pub(crate) use scan::check_window_matches_whole;

use crate::error::{Corruption, Error, Result};
use crate::format::frames::FrameList;
use crate::format::seq::{SEGMENT_SUFFIX, SegmentId, Seq};
use crate::io::Storage;
use crate::io::segment_file::{FreshSegment, PendingSeal};
use crate::options::{OpenCheck, Options, RecoveryMode};

/// One segment as recovery leaves it; all of them are sealed (the newest, if it
/// lacks its seal, by the open before the writer starts).
pub(crate) struct RecoveredSegment {
    pub id: SegmentId,
    pub path: Arc<Path>,
    /// The seed of its frames' checksums.
    pub salt: u32,
    pub frames: FrameList,
}

/// The log as recovery leaves it.
pub(crate) struct Recovered {
    /// Every segment holding frames, oldest first.
    pub segments: Vec<RecoveredSegment>,
    /// First sequence number of the oldest segment.
    pub log_start: Seq,
    /// The writer's active segment: empty, its header durable.
    pub active: FreshSegment,
    /// The delivery state the log recorded, in log order: replayed into the
    /// state table before anything is claimed.
    pub state: Vec<state::Recorded>,
    /// The seal the newest segment lacks, written by the open before the
    /// writer starts.
    pub seal: Option<PendingSeal>,
    /// A fully acknowledged segment's file of this outbox, kept to be
    /// recycled as the writer's next segment (`<name>.seg.free`).
    pub spare: Option<PathBuf>,
    pub report: RecoveryReport,
}

/// Reads every segment in `dir`, decides what is torn and what is corrupt, applies
/// the changes durably, and returns the log.
/// `preallocate` is the space a new (or reused) active segment reserves: none
/// when the open is short of space.
pub(crate) fn recover(
    storage: &dyn Storage,
    dir: &Path,
    options: &Options,
    preallocate: u64,
    effects: &mut apply::Effects,
) -> Result<Recovered> {
    // The negative control treats any damage as the end of the log, silently.
    let silent_cut = crate::injected!(options, TruncateMidLogCorruption);
    let mode = if silent_cut {
        RecoveryMode::Lossy
    } else {
        options.recovery
    };
    let (ids, creating, free) = segment_ids(storage, dir)?;
    // A lossy repair, run by an operator after a strict open failed, reads
    // everything: it must see damage wherever it lies. The newest file is never
    // read through a seal found from its end: it is where a crash leaves its
    // marks, and a file that ends inside a record (after a close, or a cut)
    // must not be read through whatever its last bytes claim. Its index
    // checkpoints, found from its start, stand for the frames before the last
    // one, as a seal index does for a sealed segment's.
    let check = match mode {
        RecoveryMode::Lossy => OpenCheck::EveryFrame,
        _ => options.open_check,
    };
    #[cfg_attr(not(feature = "testing"), allow(unused_mut))]
    let (mut scans, opened) = scan_all(storage, dir, &ids, check)?;
    // The negative control takes damage in the newest segment for a torn
    // tail, whatever follows it.
    if crate::injected!(options, NewestDamageIsTorn)
        && let Some(d) = scans.last_mut().and_then(|s| s.damage.as_mut())
    {
        d.evidence = None;
        d.tearable = true;
    }
    let mut plan = plan::plan(&scans, mode)?;
    if silent_cut {
        plan.dropped = None;
    }
    // The delivery state of what is kept, read (and checked) before anything
    // changes on disk: a strict open that refuses changes nothing.
    let hasher = crate::format::hash::Hasher::new(plan.outbox_id.unwrap_or(0));
    let kept = rebuild::kept(&scans, &plan.keep);
    let mut recorded = state::recorded_state(storage, kept, mode == RecoveryMode::Lossy, &hasher)?;
    name_relocated(storage, &scans, &mut plan, &recorded, &hasher);
    // The negative controls forget what the log recorded.
    if crate::injected!(options, ForgetAcksAtRecovery) {
        recorded.retain(|r| !matches!(r, state::Recorded::Acks(..)));
    }
    if crate::injected!(options, ForgetFieldsAtRecovery) {
        recorded.retain(|r| !matches!(r, state::Recorded::Fields { .. }));
    }
    if crate::injected!(options, ForgetDeadLettersAtRecovery) {
        recorded.retain(|r| {
            !matches!(
                r,
                state::Recorded::Change(crate::format::delivery::Change::DeadLetter { .. }, _)
            )
        });
    }
    let mut recovered = apply::apply(
        storage,
        dir,
        apply::Found {
            scans,
            opened,
            creating,
            free,
        },
        plan,
        apply::NewSegments {
            preallocate,
            checkpoint_every: options.checkpoint_every(),
            keep_spare: options.recycle_segments,
        },
        effects,
    )?;
    recovered.state = recorded;
    Ok(recovered)
}

/// A lossy repair names what it drops: numbers from the damage on
/// (`Dropped::first` to `last`), and the records carried forward into what
/// it drops out of segments gone before, whose numbers lie below those
/// (`Dropped::relocated`), read here from the dropped frames, leaving out
/// those acknowledged in either part; `kept` is the state the kept frames
/// record. And the delivery state of records kept that only the dropped
/// frames record (`Dropped::acks_dropped`, `changes_dropped`). Nothing to
/// do for a plan that drops nothing.
pub(crate) fn name_relocated(
    storage: &dyn Storage,
    scans: &[scan::SegmentScan],
    plan: &mut plan::Plan,
    kept: &[state::Recorded],
    hasher: &crate::format::hash::Hasher,
) {
    if let Some(dropped) = plan.dropped.as_mut()
        && let Some(damaged) = scans.iter().position(|s| s.path == dropped.path)
    {
        let part = rebuild::dropped(scans, &plan.keep, damaged);
        // A repair is for a disk that fails: a read of what it drops that
        // fails does not stop it, and names what the rest shows.
        let mut listed = state::recorded_state(storage, part, true, hasher).unwrap_or_default();
        let mut copies: Vec<Seq> = listed
            .iter()
            .filter_map(|r| match r {
                state::Recorded::Relocated { seq, .. } => Some(*seq),
                _ => None,
            })
            .collect();
        // And the copies, acknowledgements and other changes in valid frames
        // past the damage of each dropped file.
        let mut changed = Vec::new();
        for d in scans.iter().skip(damaged).filter_map(|s| s.damage.as_ref()) {
            copies.extend_from_slice(&d.relocated);
            let acked = d.acked.iter().map(|&(a, b)| state::Recorded::Acks(a, b));
            listed.extend(acked);
            changed.extend_from_slice(&d.changed);
        }
        dropped.relocated = rebuild::relocated_dropped(copies, kept, &listed, plan.log_start);
        (dropped.acks_dropped, dropped.changes_dropped) =
            rebuild::kept_state_dropped(&listed, changed, kept, plan.log_start, dropped.first);
    }
}

/// Scans every segment of `ids` (in log order), the newest never through a
/// seal found from its end (frame by frame, from its last index checkpoint on
/// under `OpenCheck::SealIndex`), and the others as `check` says. Where the
/// storage allows it, the newest segment is scanned on a second thread while
/// this one reads the others (their seal indexes) from the oldest on; once
/// done with the newest, the second thread takes the others from the back,
/// so that neither processor idles while the other has segments left. The
/// scans are pure functions of each file's bytes, so the outcome, and the
/// first error in log order, are those of one thread: each thread stops at
/// its first error, the second thread only ever takes segments after every
/// one this thread took, and this thread goes on until the two meet.
fn scan_all(
    storage: &dyn Storage,
    dir: &Path,
    ids: &[SegmentId],
    check: OpenCheck,
) -> Result<(Vec<scan::SegmentScan>, Vec<scan::Opened>)> {
    // The two newest files are the only ones a writer of this process may
    // have left with bytes not yet synced (its active segment, and the one
    // it was sealing), if a write, a cut or a seal failed: make what is
    // about to be read durable first, so that a reopen in the same process
    // never builds on bytes a power cut would take back. (Bytes a failed
    // fsync dropped are the writer's to cut back when it is poisoned.)
    let one = |k: usize, id: SegmentId, scratch: &mut Vec<u8>| {
        let newest = k + 1 == ids.len();
        scan::scan_file(storage, dir, id, check, k + 2 >= ids.len(), newest, scratch)
    };
    let Some((&newest_id, older)) = ids.split_last() else {
        return Ok((Vec::new(), Vec::new()));
    };
    let newest_k = older.len();
    // The older segments not taken yet, by either end.
    let left = parking_lot::Mutex::new(0..older.len());
    let prefetch = check == OpenCheck::SealIndex && storage.parallel_reads();
    let (front, newest, back) = std::thread::scope(|s| {
        let beside = (storage.parallel_reads() && !older.is_empty())
            .then(|| {
                std::thread::Builder::new()
                    .name("segwal-open".into())
                    .spawn_scoped(s, || {
                        let mut scratch = Vec::new();
                        let newest = one(newest_k, newest_id, &mut scratch);
                        let mut back = Vec::new();
                        if newest.is_ok() {
                            loop {
                                // The lock is let go before the scan: the
                                // other thread takes its next one meanwhile.
                                let next = left.lock().next_back();
                                let Some(k) = next else {
                                    break;
                                };
                                let scanned = one(k, older[k], &mut scratch);
                                let failed = scanned.is_err();
                                back.push(scanned);
                                if failed {
                                    break;
                                }
                            }
                        }
                        (newest, back)
                    })
                    .ok()
            })
            .flatten();
        let mut front = Vec::with_capacity(older.len());
        let mut scratch = Vec::new();
        let front_scanned = loop {
            let next = left.lock().next();
            let Some(k) = next else {
                break Ok(());
            };
            if prefetch && k % scan::PREFETCH_SEALS == 0 {
                let chunk = k..(k + scan::PREFETCH_SEALS).min(older.len());
                scan::prefetch_seals(storage, dir, &older[chunk]);
            }
            match one(k, older[k], &mut scratch) {
                Ok(scanned) => front.push(scanned),
                Err(e) => {
                    // This error comes before anything the second thread
                    // could find: it takes no more.
                    *left.lock() = 0..0;
                    break Err(e);
                }
            }
        };
        let beside = match beside.map(|thread| thread.join()) {
            Some(Ok(beside)) => Some(beside),
            Some(Err(panic)) if front_scanned.is_ok() => std::panic::resume_unwind(panic),
            // An older file's error stands, as it did when the newest was
            // read after the others.
            Some(Err(_)) | None => None,
        };
        front_scanned?;
        // No second thread (a simulated disk, one segment, or the system
        // refused one): this thread took every older segment, and reads the
        // newest after them.
        let (newest, back) =
            beside.unwrap_or_else(|| (one(newest_k, newest_id, &mut scratch), Vec::new()));
        Ok::<_, Error>((front, newest, back))
    })?;
    Ok(in_log_order(front, back, newest)?.into_iter().unzip())
}

/// What the two threads of [`scan_all`] read, in log order: the opening
/// thread's segments `front` (from the oldest on, all read), the second
/// thread's `back` (as it took them, from the back), and the newest. The
/// second thread's error, if any, is the last it took, the oldest of its own,
/// and every segment before it was the opening thread's: it is the first in
/// log order, before the newest's.
fn in_log_order<T, E>(
    front: Vec<T>,
    back: Vec<std::result::Result<T, E>>,
    newest: std::result::Result<T, E>,
) -> std::result::Result<Vec<T>, E> {
    let mut all = front;
    all.reserve(back.len() + 1);
    for scanned in back.into_iter().rev() {
        all.push(scanned?);
    }
    all.push(newest?);
    Ok(all)
}

/// The segment files of `dir`, in log order, the files of segments whose
/// creation was interrupted (`<name>.creating`), and the files kept for
/// recycling (`<name>.free`). A file with the segment suffix but not a
/// segment's name is refused: it is not ours to judge or to skip.
fn segment_ids(storage: &dyn Storage, dir: &Path) -> Result<SegmentFiles> {
    let names = storage
        .list(dir)
        .map_err(|e| Error::io("list directory", dir, e))?;
    let mut ids = Vec::new();
    let mut creating = Vec::new();
    let mut free = Vec::new();
    for name in &names {
        if SegmentId::parse_creating(name).is_some() {
            creating.push(dir.join(name));
            continue;
        }
        if SegmentId::parse_free(name).is_some() {
            free.push(dir.join(name));
            continue;
        }
        match SegmentId::parse(name) {
            Some(id) => ids.push(id),
            None if name.ends_with(SEGMENT_SUFFIX) => {
                return Err(Error::Corrupt {
                    path: dir.join(name),
                    offset: 0,
                    seq: None,
                    kind: Corruption::BadSegmentName,
                });
            }
            // Other files (the lock file, an operator's notes) are not ours.
            None => {}
        }
    }
    ids.sort();
    creating.sort();
    free.sort();
    Ok((ids, creating, free))
}

/// What [`segment_ids`] lists: segments, unfinished creations, spares.
type SegmentFiles = (Vec<SegmentId>, Vec<PathBuf>, Vec<PathBuf>);

#[cfg(test)]
mod tests {
    use super::in_log_order;

    #[test]
    fn the_second_threads_segments_go_back_in_log_order_after_the_first_threads() {
        let back = vec![Ok(5), Ok(4), Ok(3)];
        assert_eq!(
            in_log_order::<u32, &str>(vec![1, 2], back, Ok(6)),
            Ok(vec![1, 2, 3, 4, 5, 6])
        );
        assert_eq!(
            in_log_order::<u32, &str>(vec![], vec![], Ok(1)),
            Ok(vec![1])
        );
        assert_eq!(
            in_log_order::<u32, &str>(vec![1, 2, 3], vec![], Ok(4)),
            Ok(vec![1, 2, 3, 4])
        );
    }

    #[test]
    fn the_second_threads_error_comes_before_the_newest_segments() {
        // It stopped at its first error: the oldest segment it took.
        let back = vec![Ok(5), Err("4")];
        assert_eq!(in_log_order(vec![1, 2, 3], back, Err("6")), Err("4"));
        assert_eq!(
            in_log_order(vec![1, 2], vec![Ok(4), Ok(3)], Err("5")),
            Err("5")
        );
    }
}
