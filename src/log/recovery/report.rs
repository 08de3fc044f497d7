//! What recovery tells the user it found and changed: [`RecoveryReport`],
//! [`TornTail`], [`Dropped`], [`Quarantined`].

use std::path::PathBuf;

use crate::error::Corruption;
use crate::format::seq::Seq;

#[cfg(doc)]
use crate::options::RecoveryMode;

/// What recovery found and changed when the outbox was opened.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct RecoveryReport {
    /// Segment files found in the directory.
    pub segments_found: usize,
    /// Records pending after the open, as [`Stats::pending`](crate::Stats::pending)
    /// counts them: every record in the log whose acknowledgement the log does
    /// not record (acknowledgements become durable with the writer's group
    /// commit: see `Options::ack_durability`), except the delayed ones, the
    /// dead letters and those held back behind an earlier record of their key.
    pub records_recovered: u64,
    /// A torn tail truncated from the last segment: bytes of a write batch whose
    /// fsync never completed, so under the default `Durability::Sync` no
    /// producer was told it succeeded (under `Durability::Buffered` producers
    /// are answered before the fsync).
    pub torn_tail: Option<TornTail>,
    /// Segment files removed because they were already fully acknowledged when the
    /// previous run was deleting them, or (the newest) provably held nothing:
    /// every byte zero, or this outbox's header and no frame. Recovery removes
    /// no other file.
    pub removed: Vec<PathBuf>,
    /// Files moved (or, before a lossy cut, copied) into the `quarantine`
    /// folder of the outbox directory: recovery had to get past them but could
    /// not prove they hold nothing. Nothing in them is part of the log any more;
    /// they are kept for a person to look at, and removed only by one.
    pub quarantined: Vec<Quarantined>,
    /// The disk was full: the open removed the `RESERVE` file the outbox keeps
    /// for this (docs/FORMAT.md, "The directory") to make the room it needed
    /// (false where that file was empty: it freed nothing).
    /// Drain the backlog, or free space, before appending much more; the next
    /// open with space keeps a reserve again.
    pub reserve_released: bool,
    /// Under [`RecoveryMode::Lossy`] only: what was dropped at the first damage.
    pub dropped: Option<Dropped>,
    /// Frames the open took from index checkpoints instead of reading them:
    /// those of the newest segment (which has no seal after a crash or a
    /// close) before its last checkpoint (docs/FORMAT.md, "Index
    /// checkpoints"). 0 when the newest segment holds no checkpoint (less
    /// than one interval of frames), and under
    /// [`OpenCheck::EveryFrame`](crate::OpenCheck::EveryFrame).
    pub frames_from_checkpoints: u64,
}

/// A torn tail truncated at recovery.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct TornTail {
    /// The segment file.
    pub path: PathBuf,
    /// The offset it was truncated to.
    pub offset: u64,
    /// The bytes of the write batch cut, as far as the segment's own
    /// checksums name them: its frames before the damage, and the damaged
    /// frame as long as its header says when that header checks. The zeros
    /// of the space the segment preallocated, and the older bytes of a
    /// recycled file, are cut too and not counted; a newest file removed
    /// whole (it provably held no frame) counts its header's block, or 0
    /// when every byte is zero.
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
    /// The start of the write batch holding the first damage: the file was cut
    /// there, or, when nothing of it was kept before, set aside whole (then
    /// also in [`segments_set_aside`](Dropped::segments_set_aside)).
    pub offset: u64,
    /// What the damage was.
    pub cause: Corruption,
    /// First dropped sequence number: the first of the batch cut (the one
    /// expected at the damage, or lower when the damage lies inside a batch).
    pub first: Seq,
    /// Last dropped sequence number: the highest number the dropped bytes
    /// could hold, as recovery bounds it (valid frames after the damage, the
    /// headers and names of the files dropped, and a bound from the damaged
    /// bytes themselves), so it may lie above any record that was written.
    /// `None` when nothing recovery saw reaches `first`: the damaged bytes held
    /// no complete record. Every number in `first..=last` is dropped, and none
    /// of them will be assigned again.
    pub last: Option<Seq>,
    /// Records dropped whose numbers lie below [`first`](Dropped::first):
    /// each was carried forward (relocated, keeping its number) out of a
    /// segment deleted before, and every copy of it lay in what is dropped,
    /// with no acknowledgement of it in what is kept or in what is dropped
    /// (a record delivered and acknowledged is not lost with its copy; its
    /// acknowledgement may lie in the dropped part, and is read there). In
    /// order; empty when there are none. Found by reading what is dropped:
    /// a copy whose own bytes are the damage cannot be read, nor, when the
    /// damage took its header, the copies written after it in its sync
    /// group (they start on no block boundary), nor what a failed read of
    /// the dropped part (the disk a repair is for) would have shown; such
    /// records are missing from the list.
    pub relocated: Vec<Seq>,
    /// Acknowledgements of records the repair keeps that lay only in what
    /// it drops (changes of delivery state are written after the records
    /// they concern, often in a later segment): those records are
    /// unacknowledged afterwards, and delivered again (the relay that
    /// acknowledged them sees them twice). A discard of a dead letter is
    /// written as an acknowledgement and counted here: that record is a dead
    /// letter again. The records kept are those numbered from the log's start
    /// up to [`first`](Dropped::first), and those carried forward out of
    /// segments deleted before whose copies are kept.
    pub acks_dropped: u64,
    /// Records the repair keeps whose other changes of delivery state (a
    /// dead letter, a release with its delay and reason, a requeue) lay only
    /// in what it drops: each goes back to the state the kept frames record
    /// (a dead letter made so in the dropped part is pending again; a dead
    /// letter requeued there is a dead letter again). A record may be
    /// counted here and in [`acks_dropped`](Dropped::acks_dropped) (made a
    /// dead letter, then discarded).
    pub changes_dropped: u64,
    /// Segment files dropped whole (later segments, and the damaged one when
    /// nothing of it is kept): moved into the `quarantine` folder (each also
    /// listed in [`RecoveryReport::quarantined`]), never deleted. An open
    /// that tried again (a full disk, once the reserve gave its space) names
    /// those of both tries, the segment its failed try created among them.
    pub segments_set_aside: Vec<PathBuf>,
}

impl Dropped {
    /// Takes in what a retry of the same open (a full disk, once the reserve
    /// gave its space) dropped, `again`. A try that failed after setting
    /// files aside leaves the retry without them: this report, the first
    /// try's, saw the whole drop, and keeps what it says of the records
    /// (those carried forward, and the delivery state lost: the retry, not
    /// seeing the acknowledgements the moved segments held, would name
    /// acknowledged records as lost). The retry adds only what the failed
    /// try left behind it: the segment it had created, dropped whole, whose
    /// name may raise [`last`](Dropped::last).
    pub(crate) fn absorb(&mut self, again: &Dropped) {
        self.last = self.last.max(again.last);
        for path in &again.segments_set_aside {
            if !self.segments_set_aside.contains(path) {
                self.segments_set_aside.push(path.clone());
            }
        }
    }
}

/// A file recovery set aside in the `quarantine` folder of the outbox directory.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Quarantined {
    /// Where the file was.
    pub from: PathBuf,
    /// Where it is now: `quarantine/<its name>.<reason>` (with `.1`, `.2`, ...
    /// added if that name is taken).
    pub to: PathBuf,
    /// Why it was set aside.
    pub reason: QuarantineReason,
}

/// Why recovery set a file aside.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum QuarantineReason {
    /// A segment whose creation a crash interrupted (`<name>.seg.creating`),
    /// holding bytes that are neither all zero nor a whole header and zeros
    /// (a power cut garbled its header's block), or that recovery could not
    /// open or read (an I/O error, or not a regular file). It never held a
    /// record: a segment is renamed to its name before its first frame.
    UnfinishedCreation,
    /// A fully acknowledged segment's file kept for recycling
    /// (`<name>.seg.free`) whose header does not prove it this outbox's: a
    /// power cut garbled the new header being written into it, or it came
    /// from elsewhere. It held no live record.
    UnfinishedRecycling,
    /// A segment file a lossy repair dropped whole (it was moved).
    DroppedByRepair,
    /// A segment a lossy repair cut: a copy of the whole file as it was before
    /// the cut.
    CutByRepair,
}

impl QuarantineReason {
    /// The word added to the file's name in the quarantine folder.
    pub fn as_str(self) -> &'static str {
        match self {
            QuarantineReason::UnfinishedCreation => "unfinished-creation",
            QuarantineReason::UnfinishedRecycling => "unfinished-recycling",
            QuarantineReason::DroppedByRepair => "dropped-by-repair",
            QuarantineReason::CutByRepair => "before-repair-cut",
        }
    }
}

impl std::fmt::Display for QuarantineReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dropped(last: u64, relocated: &[u64], acks: u64, aside: &[&str]) -> Dropped {
        Dropped {
            path: PathBuf::from("/o/00000000000000000001.seg"),
            offset: 126_976,
            cause: Corruption::ChecksumMismatch {
                stored: 1,
                computed: 2,
            },
            first: Seq::from(31),
            last: Some(Seq::from(last)),
            relocated: relocated.iter().map(|&s| Seq::from(s)).collect(),
            acks_dropped: acks,
            changes_dropped: 0,
            segments_set_aside: aside.iter().map(PathBuf::from).collect(),
        }
    }

    /// A retry that no longer sees the segments the first try moved aside
    /// (nor the acknowledgements in them) names a carried-forward record as
    /// lost and counts fewer acknowledgements: the first try's word on the
    /// records stands; the retry adds the files it set aside and a bound.
    #[test]
    fn a_retry_adds_files_and_a_bound_not_records() {
        let mut first = dropped(14_134, &[], 10, &["/o/102.seg", "/o/203.seg"]);
        let again = dropped(14_135, &[4], 0, &["/o/14136.seg"]);
        first.absorb(&again);
        assert_eq!(
            first,
            dropped(
                14_135,
                &[],
                10,
                &["/o/102.seg", "/o/203.seg", "/o/14136.seg"]
            )
        );
    }
}
