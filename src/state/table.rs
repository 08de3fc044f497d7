//! The claim/ack state table: where every durable frame of the log stands.
//!
//! # States
//!
//! Every frame of every live segment has one slot, found by its sequence number.
//! A slot is in one of three states, kept in two bitsets per segment:
//!
//! | state   | `claimed` | `done` | meaning                                          |
//! |---------|-----------|--------|--------------------------------------------------|
//! | Pending | 0         | 0      | a durable record waiting to be claimed            |
//! | Claimed | 1         | 0      | handed out by `claim`, not yet acknowledged       |
//! | Done    | 0         | 1      | acknowledged, or set aside as corrupt             |
//! | Internal| 1         | 1      | not a record: an internal frame (`LogStart`, seal) |
//!
//! Legal transitions: Pending → Claimed (`claim`), Claimed → Pending (`release`),
//! Claimed → Done (`ack`), Pending|Claimed → Done (read path found it corrupt).
//! A slot enters the table Pending (a record) or Internal, and only once its frame
//! is durable. Done and Internal are final.
//!
//! # Invariants
//!
//! - No bit is set past the segment's last slot.
//! - `claimed_count` is the number of Claimed slots (`claimed & !done`),
//!   `done_count` the number of Done and Internal slots (`done`); the table's
//!   totals equal the sums over segments.
//! - Every slot with a sequence number below `cursor` is not Pending, so a claim
//!   starts scanning at `cursor`. `release` moves `cursor` back.
//! - Segments are contiguous in sequence numbers and sorted; only the last one
//!   (the writer's active segment) is unsealed.
//!
//! Memory per frame: a 32-bit offset and two bits, so about 4.25 bytes per pending
//! record, and no heap object per record.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::path::Path;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::format::delivery::Change;
use crate::format::fields::Described;
use crate::format::frame::{FRAME_HEADER_LEN, FrameSpan};
use crate::format::frames::FrameList;
use crate::format::segment::{BLOCK, align_up};
use crate::format::seq::{SegmentId, Seq};
use crate::io::StorageFile;
use crate::state::keys::{Joined, Keys};
use crate::state::leases::{Leases, SeqMap};

mod moved;

/// One segment's slots.
pub(crate) struct SegmentSlots {
    pub id: SegmentId,
    pub path: Arc<Path>,
    /// The active segment's file, shared with the writer; `None` once sealed
    /// (sealed files are opened through the outbox's file cache).
    pub file: Option<Arc<dyn StorageFile>>,
    /// The seed of its frames' checksums.
    pub salt: u32,
    /// Set once the segment is sealed: the writer will never write it again.
    pub sealed: bool,
    /// Byte offset of each frame; index = seq - first seq.
    offsets: Vec<u32>,
    /// Byte offset just past the last frame.
    end: u32,
    /// The frames not followed right away by the next one (the last frame of
    /// a sync group, whose successor starts the next block): (slot, end of the
    /// frame), by slot. One per sync group at most; every other frame ends
    /// where the next begins.
    gaps: Vec<(u32, u32)>,
    claimed: Vec<u64>,
    done: Vec<u64>,
    claimed_count: u32,
    done_count: u32,
    /// Bytes of the frames not done (whole frames, headers included): what
    /// carrying them forward would copy.
    live_bytes: u64,
}

impl SegmentSlots {
    /// An empty segment whose frames start at `frames_at`.
    pub(crate) fn new(
        id: SegmentId,
        path: Arc<Path>,
        file: Option<Arc<dyn StorageFile>>,
        salt: u32,
        frames_at: u32,
    ) -> Self {
        SegmentSlots {
            id,
            path,
            file,
            salt,
            sealed: false,
            offsets: Vec::new(),
            end: frames_at,
            gaps: Vec::new(),
            claimed: Vec::new(),
            done: Vec::new(),
            claimed_count: 0,
            done_count: 0,
            live_bytes: 0,
        }
    }

    fn len(&self) -> u64 {
        self.offsets.len() as u64
    }

    fn first(&self) -> u64 {
        self.id.0
    }

    /// One past the last sequence number held.
    fn end_seq(&self) -> u64 {
        self.first() + self.len()
    }

    fn is_finished(&self) -> bool {
        self.sealed && u64::from(self.done_count) == self.len()
    }

    /// Records neither claimed nor done (pending, or waiting: delayed or
    /// held by their key).
    fn pending_count(&self) -> u64 {
        self.len() - u64::from(self.claimed_count) - u64::from(self.done_count)
    }

    /// Bytes of the frames not done, counted from the done bits a word at a
    /// time: what `live_bytes` must hold (checked by `check_invariants`).
    fn live_frame_bytes(&self) -> u64 {
        let mut bytes = 0u64;
        for (w, &word) in self.done.iter().enumerate() {
            let mut live = !word;
            while live != 0 {
                let i = w * 64 + live.trailing_zeros() as usize;
                if i >= self.offsets.len() {
                    break;
                }
                bytes += u64::from(self.frame_range(i).1);
                live &= live - 1;
            }
        }
        // Slots past the bits' words (none are done).
        for i in self.done.len() * 64..self.offsets.len() {
            bytes += u64::from(self.frame_range(i).1);
        }
        bytes
    }

    /// Byte range of slot `i`'s frame.
    fn frame_range(&self, i: usize) -> (u32, u32) {
        let start = self.offsets[i];
        let end = match self.offsets.get(i + 1) {
            // Only a frame followed by one on a block boundary may have a gap.
            Some(&next) if (next as usize).is_multiple_of(BLOCK) => self
                .gaps
                .binary_search_by_key(&(i as u32), |g| g.0)
                .map_or(next, |k| self.gaps[k].1),
            Some(&next) => next,
            None => self.end,
        };
        (start, end - start)
    }

    fn bit(words: &[u64], i: usize) -> bool {
        words[i / 64] & (1 << (i % 64)) != 0
    }

    fn set(words: &mut [u64], i: usize, on: bool) {
        if on {
            words[i / 64] |= 1 << (i % 64);
        } else {
            words[i / 64] &= !(1 << (i % 64));
        }
    }

    /// Memory this segment's slots hold: the structure and its three arrays.
    fn heap_bytes(&self) -> u64 {
        let arrays = self.offsets.capacity() * 4
            + (self.claimed.capacity() + self.done.capacity() + self.gaps.capacity()) * 8;
        (std::mem::size_of::<SegmentSlots>() + arrays) as u64
    }

    fn check_invariants(&self) {
        let len = self.offsets.len();
        assert_eq!(self.claimed.len(), len.div_ceil(64));
        assert_eq!(self.done.len(), len.div_ceil(64));
        let mut claimed = 0;
        let mut done = 0;
        for (w, (&c, &d)) in self.claimed.iter().zip(&self.done).enumerate() {
            let past = !word_mask(w, 0, len);
            assert_eq!((c | d) & past, 0, "bit set past the last slot");
            claimed += (c & !d).count_ones();
            done += d.count_ones();
        }
        assert_eq!(claimed, self.claimed_count);
        assert_eq!(done, self.done_count);
        assert_eq!(self.live_bytes, self.live_frame_bytes());
        assert!(self.offsets.windows(2).all(|w| w[0] < w[1]));
        assert!(self.offsets.last().is_none_or(|&o| o < self.end));
    }
}

/// Why the scan of the segments' slots in a claim stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ScanStop {
    /// The claim has its records or its bytes.
    Limit,
    /// The next pending slot is numbered above the oldest pending relocated
    /// record, which goes first.
    Bound,
    /// No pending slot is left after the cursor.
    Exhausted,
}

/// A run of claimed frames from one segment, to be read outside the table lock.
#[derive(Clone)]
pub(crate) struct ClaimRun {
    pub path: Arc<Path>,
    /// The segment's checksum seed.
    pub salt: u32,
    /// The active segment's file; `None` for a sealed one (read through the
    /// file cache, by path).
    pub file: Option<Arc<dyn StorageFile>>,
    /// The claimed frames, in sequence order.
    pub frames: Vec<ClaimedFrame>,
    /// The claim that holds them (`Leases::last_claim` when it was made,
    /// never 0; 0 before, and for a run that is not a claim's).
    pub claim: u32,
}

/// One claimed frame: its record's sequence number and where it lies.
#[derive(Clone, Debug)]
pub(crate) struct ClaimedFrame {
    pub seq: Seq,
    /// The frame's own number: `seq`, or for a relocated record the number
    /// of the frame that carried it forward.
    pub at: Seq,
    /// Byte offset of the frame in its segment.
    pub offset: u32,
    /// Encoded length of the frame.
    pub len: u32,
    /// Which delivery of the record this is (1 for the first).
    pub attempt: u32,
    /// Why its previous delivery failed, if it was released with a reason.
    pub reason: Option<Arc<str>>,
}

/// Where a slot's frame can be read: for the age of the oldest record.
pub(crate) struct SlotRef {
    pub seq: Seq,
    pub path: Arc<Path>,
    /// The active segment's file; `None` for a sealed one (read through the
    /// file cache, by path).
    pub file: Option<Arc<dyn StorageFile>>,
    /// Byte offset of the frame in its segment.
    pub offset: u32,
}

/// The bits of bitset word `w` that stand for slots in `from..len`.
fn word_mask(w: usize, from: usize, len: usize) -> u64 {
    let mut mask = !0u64;
    if w == from / 64 {
        mask &= !0u64 << (from % 64);
    }
    if w == len / 64 {
        mask &= !(!0u64 << (len % 64));
    }
    mask
}

/// What an operator sees of the table; the rest of [`Stats`](crate::Stats).
#[derive(Default)]
pub(crate) struct TableStats {
    pub pending: u64,
    pub claimed: u64,
    pub backlog_bytes: u64,
    pub segments: usize,
    pub disk_bytes: u64,
    /// Leases that ran out since open.
    pub expired_leases: u64,
    /// Records waiting out a delay (their claimed bit set).
    pub delayed: u64,
    /// Dead letters (their claimed bit set).
    pub dead_letters: u64,
    /// Blocks the sealed segments take (their files end with their seal).
    pub sealed_allocated: u64,
    /// The segments the writer still holds, whose files may have space
    /// reserved past their data.
    pub open_files: Vec<Arc<dyn StorageFile>>,
    pub state_bytes: u64,
    pub first_unacked: Option<SlotRef>,
    pub first_pending: Option<SlotRef>,
    pub last_seq: Option<Seq>,
    /// Sealed segments kept on disk by records not yet acknowledged.
    pub held_segments: usize,
    /// The records not yet acknowledged in those segments.
    pub held_by_records: u64,
    /// Records relocated since open.
    pub relocated: u64,
    /// Keys with a record held back behind an earlier one.
    pub blocked_keys: u64,
    /// Records held back behind an earlier one of their key and not also
    /// waiting out a delay (their claimed bit set).
    pub held_by_key: u64,
    /// Bytes of memory the keys' queues take.
    pub keys_bytes: u64,
}

/// The state table. See the module documentation for its states and invariants.
pub(crate) struct Table {
    segments: VecDeque<SegmentSlots>,
    /// Every slot below this sequence number is not Pending.
    cursor: u64,
    pending: u64,
    claimed: u64,
    /// Payload bytes of records not Done.
    backlog_bytes: u64,
    /// Records acknowledged since the writer last took them, as ranges: the
    /// writer records them in the log (an acks frame) with its next batch.
    unwritten_acks: Vec<(Seq, Seq)>,
    /// Segments finished by a record's becoming Done (a count: an
    /// acknowledgement tells whether it finished one, so that a front the
    /// writer holds back does not wake it at every ack).
    finished: u64,
    /// The leases of claimed records, and the attempts of deliveries.
    leases: Leases,
    /// Changes of delivery state other than acknowledgements, in the order
    /// made, for the writer to record in the log.
    unwritten: Vec<Change>,
    /// The bytes the entries of `unwritten` take in the log
    /// ([`Change::entry_len`]), or in memory where that is more.
    unwritten_bytes: usize,
    /// The reason last kept (a release's or a dead letter's): the next one,
    /// if it says the same, shares its text ([`Table::reason_kept`]).
    last_reason: Option<Arc<str>>,
    /// When the oldest change not yet written was noted
    /// ([`Table::note_unwritten`]), on the outbox's monotonic clock: the
    /// writer has it written and fsynced within the buffered sync interval
    /// of that time, if no batch takes it first.
    unwritten_since_us: Option<u64>,
    /// When a change of delivery state was last noted, written or not: the
    /// writer thread keeps a near deadline while changes keep coming.
    last_noted_us: Option<u64>,
    /// Records released with a delay: (due, seq), due on the outbox's
    /// monotonic clock. They hold the claimed bit (not claimable) until due.
    delayed: BTreeSet<(u64, u64)>,
    /// The due time of each delayed record.
    due: HashMap<u64, u64>,
    /// Dead letters: never handed out until requeued. They hold the claimed
    /// bit.
    dead: BTreeMap<u64, DeadEntry>,
    /// The reason of the last failed delivery of records released with one,
    /// handed out with their next delivery.
    reasons: HashMap<u64, Arc<str>>,
    /// Records carried forward into a later segment (relocated, `moved.rs`):
    /// each one's own number and the number of the frame that holds it now.
    /// That frame's slot holds the record's state.
    moved: BTreeMap<u64, u64>,
    /// The reverse of `moved`: a relocated frame's number and its record's.
    origin: SeqMap<u64>,
    /// The bytes of each relocated frame (by its number) that the backlog
    /// does not count: what the copy adds to the record it carries (its own
    /// number, its delivery state), so that relocation leaves
    /// `backlog_bytes`, and the byte quota, as they were.
    copy_extra: SeqMap<u32>,
    /// The delayed records whose delay is a release's (`release_after`, or
    /// the relay's backoff): they were handed out, and hold their key's
    /// turn while they wait. A record in `due` and not here waits for its
    /// own not-before time and was never handed out.
    released: SeqMap<()>,
    /// A record became claimable when its key's turn passed to it
    /// ([`take_turn_passed`](Table::take_turn_passed)).
    turn_passed: bool,
    /// Events to report once the table's lock is released
    /// ([`take_notices`](Table::take_notices)).
    notices: Vec<Notice>,
    /// The relocated records that are Pending, which a claim hands out before
    /// any other (they are the oldest). The cursor does not cover them.
    moved_pending: BTreeSet<u64>,
    /// Records relocated since the outbox was opened.
    relocated: u64,
    /// The queues of the ordering keys (`state::keys`). A record held back
    /// behind an earlier one of its key holds the claimed bit, as a delay does.
    keys: Keys,
}

/// An event the table has to report (a `tracing` event, feature `tracing`).
/// The table only notes it: its caller reports it once the table's lock is
/// released ([`Notices::report`]), so that a subscriber may call back into the
/// outbox (read its `stats()`, say) without waiting on a lock its own thread
/// holds, and a slow subscriber holds up no claim, ack or append.
#[derive(Debug)]
#[cfg_attr(not(feature = "tracing"), allow(dead_code))]
pub(crate) enum Notice {
    /// Leases ran out: `records` claimed records, the oldest `first_seq`,
    /// went back to pending.
    LeasesRanOut { records: usize, first_seq: u64 },
    /// A claim parked `seq` as a dead letter past `max_attempts`.
    MaxAttempts {
        seq: u64,
        attempts: u32,
        reason: String,
    },
}

/// The notices taken from the table under its lock, to report after it.
#[must_use = "notices are reported once the table's lock is released"]
pub(crate) struct Notices(Vec<Notice>);

impl Notices {
    /// Whether there is nothing to report.
    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Reports each notice as a `tracing` event; call without the table's
    /// lock held.
    pub(crate) fn report(self) {
        #[cfg(feature = "tracing")]
        for notice in self.0 {
            match notice {
                Notice::LeasesRanOut { records, first_seq } => crate::event!(
                    warn,
                    records,
                    first_seq,
                    "leases ran out: claimed records went back to pending"
                ),
                Notice::MaxAttempts {
                    seq,
                    attempts,
                    reason,
                } => crate::event!(warn, seq, attempts, "dead letter: {reason}"),
            }
        }
    }
}

/// Where one record stands ([`Table::standing`]).
#[derive(Clone, Debug)]
pub(crate) enum Standing {
    /// Waiting to be claimed.
    Pending,
    /// Handed out by a claim, not yet acknowledged.
    Claimed,
    /// Held back behind an earlier record of its key.
    HeldByKey,
    /// Waiting out a delay until `due` (the table's clock).
    Delayed { due: u64 },
    /// A dead letter.
    Dead(DeadEntry),
    /// Acknowledged (or set aside as corrupt).
    Done,
}

/// A dead letter's state.
#[derive(Clone, Debug)]
pub(crate) struct DeadEntry {
    pub attempts: u32,
    pub reason: Arc<str>,
    /// When it died (µs since the Unix epoch).
    pub since_us: u64,
}

impl Table {
    pub(crate) fn new() -> Table {
        Table {
            segments: VecDeque::new(),
            cursor: 0,
            pending: 0,
            claimed: 0,
            backlog_bytes: 0,
            unwritten_acks: Vec::new(),
            finished: 0,
            leases: Leases::default(),
            unwritten: Vec::new(),
            unwritten_bytes: 0,
            last_reason: None,
            unwritten_since_us: None,
            last_noted_us: None,
            delayed: BTreeSet::new(),
            due: HashMap::new(),
            dead: BTreeMap::new(),
            reasons: HashMap::new(),
            moved: BTreeMap::new(),
            origin: SeqMap::default(),
            copy_extra: SeqMap::default(),
            turn_passed: false,
            notices: Vec::new(),
            released: SeqMap::default(),
            moved_pending: BTreeSet::new(),
            relocated: 0,
            keys: Keys::default(),
        }
    }

    /// Takes the acknowledgements and the other changes of delivery state
    /// not yet written to the log, for the writer's next batch.
    /// Also returns when the oldest of them was noted, if it was: their
    /// fsync is due a sync interval after that, not after this batch.
    /// Each call also gives back the room of maps that a burst left
    /// mostly empty ([`Table::give_back_room`]).
    pub(crate) fn take_unwritten(&mut self) -> (Vec<(Seq, Seq)>, Vec<Change>, Option<u64>) {
        self.unwritten_bytes = 0;
        self.give_back_room();
        (
            std::mem::take(&mut self.unwritten_acks),
            std::mem::take(&mut self.unwritten),
            self.unwritten_since_us.take(),
        )
    }

    /// Notes that changes made at `now_us` wait to be written, unless older
    /// ones already wait. Returns true if this is the first since the writer
    /// last took them: the caller then makes sure the writer knows
    /// ([`Shared::state_noted`](crate::log::shared::Shared::state_noted)).
    pub(crate) fn note_unwritten(&mut self, now_us: u64) -> bool {
        if !self.has_unwritten() {
            return false;
        }
        self.last_noted_us = Some(now_us);
        if self.unwritten_since_us.is_some() {
            return false;
        }
        self.unwritten_since_us = Some(now_us);
        true
    }

    /// When the oldest noted change not yet written was made, if one waits.
    pub(crate) fn unwritten_since_us(&self) -> Option<u64> {
        self.unwritten_since_us
    }

    /// When the last change of delivery state was noted, written or not.
    pub(crate) fn last_noted_us(&self) -> Option<u64> {
        self.last_noted_us
    }

    /// The bytes the acknowledgements and changes not yet written take, in
    /// the log or in memory, whichever is larger: what a storm of them made
    /// the writer carry at once.
    pub(crate) fn unwritten_bytes(&self) -> usize {
        self.unwritten_acks.len() * crate::format::acks::RANGE_LEN + self.unwritten_bytes
    }

    /// Queues `change` for the writer.
    /// Each counts its entry in the log or its place in memory, whichever
    /// is larger (a discard's entry is 9 bytes, its `Change` about 40).
    fn push_change(&mut self, change: Change) {
        self.unwritten_bytes += change.entry_len().max(size_of::<Change>());
        self.unwritten.push(change);
    }

    /// `reason` cut as the log cuts it, sharing the text of the last reason
    /// kept when it says the same: a relay that releases or parks thousands
    /// of records with its broker's one error keeps that text once, not once
    /// a record.
    fn reason_kept(&mut self, reason: &str) -> Arc<str> {
        let reason = crate::format::delivery::clipped(reason);
        match &self.last_reason {
            Some(last) if **last == *reason => last.clone(),
            _ => {
                let kept: Arc<str> = reason.into();
                self.last_reason = Some(kept.clone());
                kept
            }
        }
    }

    /// Gives back the room of the maps a burst left three-quarters empty
    /// (a million keys delivered, one huge claim settled, a storm of
    /// releases over): each map must lose most of its entries between two
    /// shrinks, so the cost is amortised over those removals.
    fn give_back_room(&mut self) {
        crate::state::shrink_sparse(&mut self.due);
        crate::state::shrink_sparse(&mut self.reasons);
        crate::state::shrink_sparse(&mut self.released);
        crate::state::shrink_sparse(&mut self.origin);
        crate::state::shrink_sparse(&mut self.copy_extra);
        self.leases.give_back_room();
        self.keys.give_back_room();
    }

    /// Whether anything waits to be written to the log.
    pub(crate) fn has_unwritten(&self) -> bool {
        !self.unwritten_acks.is_empty() || !self.unwritten.is_empty()
    }

    /// The claimed record `seq`, held by a claim: its slot, or `NotClaimed`.
    fn held_slot(&self, seq: Seq) -> Result<(usize, usize)> {
        match self.slot(seq)? {
            Some((si, i))
                if SegmentSlots::bit(&self.segments[si].claimed, i)
                    && self.leases.is_held(seq.get()) =>
            {
                Ok((si, i))
            }
            _ => Err(Error::NotClaimed { seq }),
        }
    }

    /// `NotClaimed` unless `by` is `None` (any claim) or the claim that
    /// holds `seq` now: a relay whose lease ran out, and whose record
    /// another claim took since, settles nothing.
    fn held_by(&self, seq: Seq, by: Option<u32>) -> Result<()> {
        match by {
            Some(claim) if self.leases.claim_of(seq.get()) != Some(claim) => {
                Err(Error::NotClaimed { seq })
            }
            _ => Ok(()),
        }
    }

    /// The delivery of the claimed record `seq` failed: it is claimable again
    /// from `due` (monotonic µs; now or earlier: at once), and its next
    /// delivery carries `reason`. `not_before_us` is the same time on the wall
    /// clock, for the log.
    /// `by`: the claim that must hold it ([`Table::held_by`]).
    pub(crate) fn release_after(
        &mut self,
        seq: Seq,
        by: Option<u32>,
        due: u64,
        now: u64,
        not_before_us: u64,
        reason: &str,
    ) -> Result<()> {
        self.held_slot(seq)?;
        self.held_by(seq, by)?;
        let reason = self.reason_kept(reason);
        self.leases.returned(seq.get());
        self.reasons.insert(seq.get(), reason.clone());
        if due > now {
            self.delayed.insert((due, seq.get()));
            self.due.insert(seq.get(), due);
            self.released.insert(seq.get(), ());
        } else {
            self.unclaim(seq)?;
            self.key_repass(seq.get());
        }
        self.push_change(Change::Release {
            seq,
            not_before_us,
            reason,
        });
        Ok(())
    }

    /// Parks the claimed record `seq` as a dead letter, dead since `since_us`
    /// (wall clock).
    pub(crate) fn dead_letter(
        &mut self,
        seq: Seq,
        by: Option<u32>,
        reason: &str,
        since_us: u64,
    ) -> Result<()> {
        self.held_slot(seq)?;
        self.held_by(seq, by)?;
        let attempts = self.leases.attempt_held(seq.get());
        self.leases.done(seq.get());
        // A dead letter no longer blocks its key.
        self.key_left(seq.get(), false);
        let reason = self.reason_kept(reason);
        self.dead.insert(
            seq.get(),
            DeadEntry {
                attempts,
                reason: reason.clone(),
                since_us,
            },
        );
        self.push_change(Change::DeadLetter {
            seq,
            attempts,
            reason,
        });
        Ok(())
    }

    /// Makes the dead letter `seq` pending again, its attempts counted from
    /// zero. `NotClaimed` if it is not a dead letter; `UnknownSeq` if `seq`
    /// was never assigned to a record.
    pub(crate) fn requeue(&mut self, seq: Seq) -> Result<()> {
        if self.dead.remove(&seq.get()).is_none() {
            return Err(self.not_dead(seq));
        }
        self.reasons.remove(&seq.get());
        self.rejoin(seq)?;
        self.push_change(Change::Requeue(seq));
        Ok(())
    }

    /// Acknowledges the dead letter `seq`: done for good. Returns whether the
    /// oldest segment became deletable. `NotClaimed` if it is not a dead
    /// letter; `UnknownSeq` if `seq` was never assigned to a record.
    pub(crate) fn discard(&mut self, seq: Seq) -> Result<bool> {
        if !self.dead.contains_key(&seq.get()) {
            return Err(self.not_dead(seq));
        }
        self.ack(&[seq])
    }

    /// Why `seq`, not a dead letter, cannot be requeued or discarded:
    /// `UnknownSeq` if no record has that number (never assigned, or an
    /// internal frame's), else `NotClaimed`.
    fn not_dead(&self, seq: Seq) -> Error {
        match self.slot(seq) {
            Err(e) => e,
            Ok(Some((si, i)))
                if SegmentSlots::bit(&self.segments[si].claimed, i)
                    && SegmentSlots::bit(&self.segments[si].done, i) =>
            {
                Error::UnknownSeq { seq }
            }
            Ok(_) => Error::NotClaimed { seq },
        }
    }

    /// The dead letters, oldest first, at most `max`: where each frame lies,
    /// and its state.
    pub(crate) fn dead_letters(&self, from: u64, max: usize) -> Vec<(ClaimRun, DeadEntry)> {
        let mut out = Vec::new();
        for (&seq, entry) in self.dead.range(from..).take(max) {
            let Ok(Some((si, i))) = self.slot(Seq::from(seq)) else {
                continue;
            };
            let seg = &self.segments[si];
            let (offset, len) = seg.frame_range(i);
            let run = ClaimRun {
                path: seg.path.clone(),
                salt: seg.salt,
                file: seg.file.clone(),
                claim: 0,
                frames: vec![ClaimedFrame {
                    seq: Seq::from(seq),
                    at: Seq::from(seg.first() + i as u64),
                    offset,
                    len,
                    attempt: entry.attempts,
                    reason: Some(entry.reason.clone()),
                }],
            };
            out.push((run, entry.clone()));
        }
        out
    }

    /// Makes pending the delayed records due by `now`.
    fn release_due(&mut self, now: u64) {
        while let Some(&(due, seq)) = self.delayed.first() {
            if due > now {
                break;
            }
            self.delayed.pop_first();
            self.due.remove(&seq);
            self.released.remove(&seq);
            // A record waiting for its key's turn waits on.
            if self.keys.is_empty() || !self.keys.is_held(seq) {
                let _ = self.unclaim(Seq::from(seq));
                self.key_repass(seq);
            }
        }
    }

    /// Replays, at open, one change the log recorded (in log order); `now` and
    /// `now_wall_us` place a release's wall-clock time on the monotonic clock.
    /// Nothing is claimed yet, and a record done stays done.
    pub(crate) fn replay(&mut self, change: &Change, stamped_us: u64, now: u64, now_wall_us: u64) {
        let seq = match change {
            Change::Attempts { seq: s, .. }
            | Change::Release { seq: s, .. }
            | Change::DeadLetter { seq: s, .. }
            | Change::Requeue(s)
            | Change::Discard(s) => *s,
        };
        let Ok(Some((si, i))) = self.slot(seq) else {
            return;
        };
        let seg = &self.segments[si];
        // Internal frames are Done from the start.
        if SegmentSlots::bit(&seg.done, i) {
            return;
        }
        let claimed = SegmentSlots::bit(&seg.claimed, i);
        match change {
            Change::Attempts { attempts, .. } => self.leases.set_delivered(seq.get(), *attempts),
            Change::Discard(_) => self.set_done(si, i),
            Change::Release {
                not_before_us,
                reason,
                ..
            } => {
                let reason = self.reason_kept(reason);
                self.reasons.insert(seq.get(), reason);
                let wait = not_before_us.saturating_sub(now_wall_us);
                if wait > 0 && !claimed {
                    self.claim_slot(si, i);
                    let due = now.saturating_add(wait);
                    self.delayed.insert((due, seq.get()));
                    self.due.insert(seq.get(), due);
                    self.released.insert(seq.get(), ());
                }
            }
            Change::DeadLetter {
                attempts, reason, ..
            } => {
                if let Some(due) = self.due.remove(&seq.get()) {
                    self.delayed.remove(&(due, seq.get()));
                    self.released.remove(&seq.get());
                } else if !claimed {
                    self.claim_slot(si, i);
                }
                // Its attempts are the dead letter's: a requeue starts them
                // again from zero.
                self.leases.done(seq.get());
                let reason = self.reason_kept(reason);
                self.dead.insert(
                    seq.get(),
                    DeadEntry {
                        attempts: *attempts,
                        reason,
                        since_us: stamped_us,
                    },
                );
            }
            Change::Requeue(_) => {
                if self.dead.remove(&seq.get()).is_some() {
                    self.reasons.remove(&seq.get());
                    let _ = self.rejoin(seq);
                }
            }
        }
    }

    /// Takes the pending slot `i` of segment `si` out of the claimable ones.
    fn claim_slot(&mut self, si: usize, i: usize) {
        if !self.moved_pending.is_empty() {
            let seq = self.seq_at(si, i);
            self.moved_pending.remove(&seq);
        }
        let seg = &mut self.segments[si];
        SegmentSlots::set(&mut seg.claimed, i, true);
        seg.claimed_count += 1;
        self.claimed += 1;
        self.pending -= 1;
    }

    /// Holds the records of `runs`, just claimed, under a lease until
    /// `deadline` (µs on the outbox's monotonic clock, or
    /// [`NEVER`](crate::state::leases::NEVER)), and numbers their deliveries.
    /// With `max_attempts`, a record whose delivery would pass it becomes a
    /// dead letter instead (taken out of `runs`), and the attempt of every
    /// other one is queued for the log, to be made durable before it is handed
    /// out; returns whether this call queued anything (changes queued
    /// before it are written in their own time, as buffered changes are: a
    /// claim that queues nothing waits for no sync), and how many records
    /// were parked.
    pub(crate) fn lease(
        &mut self,
        runs: &mut Vec<ClaimRun>,
        deadline: u64,
        max_attempts: Option<u32>,
        now_wall_us: u64,
        record_attempts: bool,
    ) -> (bool, usize) {
        let seqs: Vec<u64> = runs
            .iter()
            .flat_map(|r| r.frames.iter().map(|f| f.seq.get()))
            .collect();
        let attempts = self.leases.grant(&seqs, deadline);
        let claim = self.leases.last_claim();
        for run in runs.iter_mut() {
            run.claim = claim;
        }
        for (frame, attempt) in runs
            .iter_mut()
            .flat_map(|r| r.frames.iter_mut())
            .zip(attempts)
        {
            frame.attempt = attempt;
            if !self.reasons.is_empty() {
                frame.reason = self.reasons.get(&frame.seq.get()).cloned();
            }
        }
        let Some(max) = max_attempts else {
            return (false, 0);
        };
        let mut over = Vec::new();
        for run in runs.iter_mut() {
            run.frames.retain(|f| {
                let keep = f.attempt <= max;
                if !keep {
                    over.push((f.seq, f.attempt));
                }
                keep
            });
        }
        runs.retain(|r| !r.frames.is_empty());
        let parked = over.len();
        for (seq, attempt) in over {
            let attempts = attempt - 1;
            self.leases.done(seq.get());
            let times = match attempts {
                1 => "once".to_owned(),
                n => format!("{n} times"),
            };
            // The broker's last word (a release's reason), so that an
            // operator sees why the deliveries failed.
            // Clipped as the log clips it, so that memory and a reopen agree.
            let text = match self.reasons.get(&seq.get()) {
                Some(last) if !last.is_empty() => format!(
                    "delivered {times} without an acknowledgement (max_attempts); \
                     last error: {last}"
                ),
                _ => format!("delivered {times} without an acknowledgement (max_attempts)"),
            };
            let reason = self.reason_kept(&text);
            self.notices.push(Notice::MaxAttempts {
                seq: seq.get(),
                attempts,
                reason: reason.to_string(),
            });
            self.dead.insert(
                seq.get(),
                DeadEntry {
                    attempts,
                    reason: reason.clone(),
                    since_us: now_wall_us,
                },
            );
            self.push_change(Change::DeadLetter {
                seq,
                attempts,
                reason,
            });
            // A dead letter no longer blocks its key.
            self.key_left(seq.get(), false);
        }
        let mut queued = parked > 0;
        for f in runs
            .iter()
            .flat_map(|r| r.frames.iter())
            .filter(|_| record_attempts)
        {
            self.push_change(Change::Attempts {
                seq: f.seq,
                attempts: f.attempt,
            });
            queued = true;
        }
        (queued, parked)
    }

    /// Makes pending again the claimed records whose lease ran out by `now`;
    /// returns how many.
    pub(crate) fn expire(&mut self, now: u64) -> usize {
        self.release_due(now);
        let expired = self.leases.expire(now);
        if !expired.is_empty() {
            self.notices.push(Notice::LeasesRanOut {
                records: expired.len(),
                first_seq: expired.iter().min().copied().unwrap_or(0),
            });
        }
        for &seq in &expired {
            // Still claimed: the lease would have let go of it otherwise.
            let _ = self.unclaim(Seq::from(seq));
            self.key_repass(seq);
        }
        expired.len()
    }

    /// When the next lease runs out, if any.
    pub(crate) fn next_lease_deadline(&self) -> Option<u64> {
        let due = self.delayed.first().map(|d| d.0);
        match (self.leases.next_deadline(), due) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Renews the lease of the claimed record `seq` until `deadline`.
    pub(crate) fn extend(&mut self, seq: Seq, by: Option<u32>, deadline: u64) -> Result<()> {
        let Some((si, i)) = self.slot(seq)? else {
            return Err(Error::NotClaimed { seq });
        };
        self.held_by(seq, by)?;
        let seg = &self.segments[si];
        if !SegmentSlots::bit(&seg.claimed, i) || !self.leases.extend(seq.get(), deadline) {
            return Err(Error::NotClaimed { seq });
        }
        Ok(())
    }

    /// Records not acknowledged (pending, claimed, delayed, held back, dead
    /// letters) and their payload bytes: what the backlog quotas measure.
    pub(crate) fn backlog(&self) -> (u64, u64) {
        (self.pending + self.claimed, self.backlog_bytes)
    }

    /// At open without `max_attempts`: attempts live in memory, so every
    /// record starts again at attempt 1, relocated ones too (whose copies
    /// carry their count, for an outbox that counts them). Dead letters keep
    /// theirs.
    pub(crate) fn forget_deliveries(&mut self) {
        self.leases.forget_deliveries();
    }

    /// Records Pending.
    pub(crate) fn pending(&self) -> u64 {
        self.pending
    }

    /// Acknowledges every claimed record numbered at or below `seq`; records not
    /// claimed are left as they are. Returns how many were acknowledged, and
    /// whether the oldest segment is deletable and they finished a segment
    /// (as [`Table::ack`]).
    pub(crate) fn ack_through(&mut self, seq: Seq) -> (u64, bool) {
        let mut count = 0;
        let finished = self.finished;
        // Relocated records held by a claim (their frames' numbers are not
        // theirs, so the walk below does not see them).
        if !self.moved.is_empty() {
            let held: Vec<u64> = self
                .moved
                .range(..=seq.get())
                .map(|(&own, _)| own)
                .filter(|&own| self.leases.is_held(own))
                .collect();
            for own in held {
                if let Ok(Some((si, i))) = self.slot(Seq::from(own)) {
                    self.set_done(si, i);
                    crate::format::acks::push(&mut self.unwritten_acks, Seq::from(own));
                    count += 1;
                }
            }
        }
        for si in 0..self.segments.len() {
            let seg = &self.segments[si];
            if seg.first() > seq.get() {
                break;
            }
            if seg.claimed_count == 0 {
                continue;
            }
            let upto = ((seq.get() - seg.first() + 1).min(seg.len())) as usize;
            let mut claimed = Vec::new();
            for (w, &word) in seg.claimed.iter().enumerate() {
                let mut bits = word;
                while bits != 0 {
                    let i = w * 64 + bits.trailing_zeros() as usize;
                    bits &= bits - 1;
                    // Held by a claim: not delayed, not a dead letter.
                    if i < upto
                        && !SegmentSlots::bit(&seg.done, i)
                        && self.leases.is_held(seg.first() + i as u64)
                    {
                        claimed.push(i);
                    }
                }
                if (w + 1) * 64 >= upto {
                    break;
                }
            }
            let first = seg.first();
            for i in claimed {
                self.set_done(si, i);
                crate::format::acks::push(&mut self.unwritten_acks, Seq::from(first + i as u64));
                count += 1;
            }
        }
        (
            count,
            self.finished != finished && self.segments.front().is_some_and(|s| s.is_finished()),
        )
    }

    /// Marks Done, at open, the records an acks frame of the log recorded
    /// (those still in the log and not Done; nothing is claimed yet, but a
    /// record replayed as delayed or dead holds the claimed bit).
    pub(crate) fn ack_recovered(&mut self, first: Seq, last: Seq) {
        if !self.moved.is_empty() {
            let named: Vec<u64> = self
                .moved
                .range(first.get()..=last.get())
                .map(|(&own, _)| own)
                .collect();
            for own in named {
                if let Ok(Some((si, i))) = self.slot(Seq::from(own))
                    && !SegmentSlots::bit(&self.segments[si].done, i)
                {
                    self.set_done(si, i);
                }
            }
        }
        let mut s = first.get();
        while s <= last.get() {
            let Some(si) = self.locate(s) else {
                // Below the log (deleted) or past it: skip to the next segment.
                match self.segments.iter().find(|g| g.first() > s) {
                    Some(next) => {
                        s = next.first();
                        continue;
                    }
                    None => return,
                }
            };
            let (seg_first, seg_end) = (self.segments[si].first(), self.segments[si].end_seq());
            let end = seg_end.min(last.get() + 1);
            for n in s..end {
                let i = (n - seg_first) as usize;
                let seg = &self.segments[si];
                // A relocated frame's number names no record.
                if !SegmentSlots::bit(&seg.done, i)
                    && (self.origin.is_empty() || !self.origin.contains_key(&n))
                {
                    self.set_done(si, i);
                }
            }
            s = end;
        }
    }

    /// Adds a new last segment. `id` must continue the log.
    pub(crate) fn push_segment(&mut self, slots: SegmentSlots) {
        if let Some(last) = self.segments.back() {
            assert!(
                last.sealed,
                "a segment was added before the last one was sealed"
            );
            assert!(slots.first() >= last.end_seq(), "segments out of order");
        }
        self.segments.push_back(slots);
    }

    /// Seals the last segment: the writer will never write it again.
    pub(crate) fn seal_last(&mut self, id: SegmentId) {
        let last = self.segments.back_mut().expect("seal of an empty table");
        assert_eq!(last.id, id, "seal of a segment that is not the last one");
        last.sealed = true;
        last.file = None;
        // A sealed segment never grows again: give back what doubling reserved.
        last.offsets.shrink_to_fit();
        last.gaps.shrink_to_fit();
        last.claimed.shrink_to_fit();
        last.done.shrink_to_fit();
    }

    /// The seal frame just written at `offset` (`len` bytes, number `seq`)
    /// at the end of the segment `id`, the last one: counted as an internal
    /// frame, so that the segment's bytes (`Stats::disk_bytes`,
    /// `allocated_bytes`) and the last number include it, as they do for a
    /// segment an open reads through its seal. Nothing is counted if it
    /// does not follow the segment's frames.
    pub(crate) fn push_seal(&mut self, id: SegmentId, seq: Seq, offset: u64, len: usize) {
        let Some(seg) = self.segments.back() else {
            return;
        };
        let end = u64::from(seg.end);
        let (Ok(at), Ok(len)) = (u32::try_from(offset), u32::try_from(len)) else {
            return;
        };
        let follows = offset == end || offset == align_up(end);
        if seg.id != id || seg.end_seq() != seq.get() || !follows || at.checked_add(len).is_none() {
            return;
        }
        self.push_frames(id, seq, &[FrameSpan::new(at, len, false)]);
    }

    /// Adds durable frames at the end of the segment `id` (the last one). Records
    /// enter Pending, internal frames Done.
    pub(crate) fn push_frames(&mut self, id: SegmentId, next_seq: Seq, frames: &[FrameSpan]) {
        let seg = self.count_frames(id, next_seq, frames);
        seg.offsets.extend(frames.iter().map(|f| f.offset));
        if cfg!(debug_assertions) {
            seg.check_invariants();
        }
    }

    /// [`push_frames`](Self::push_frames) of a list the caller gives up, as
    /// an open gives each segment's: into a segment that has no frames yet,
    /// the list's own offsets become the segment's, so that an open in a new
    /// process faults in no fresh memory for them. Into one that has frames,
    /// they are copied, as `push_frames` copies them: the outcome is the
    /// same either way.
    pub(crate) fn push_frames_owned(&mut self, id: SegmentId, next_seq: Seq, frames: FrameList) {
        let seg = self.last_segment_at(id, next_seq);
        let base = seg.offsets.len();
        let offsets = frames.offsets();
        let Some(&first) = offsets.first() else {
            return;
        };
        // The list says where sync groups end and which frames are internal:
        // the work is per group and per internal frame, not per frame. The
        // bitmaps' words come zeroed in one go.
        let words = (base + offsets.len()).div_ceil(64);
        seg.claimed.resize(words, 0);
        seg.done.resize(words, 0);
        let joins = |end: u32, next: u32| {
            assert_eq!(
                u64::from(next),
                align_up(u64::from(end)),
                "frames pushed with a gap that is not to a block boundary"
            );
        };
        if first != seg.end {
            joins(seg.end, first);
            if let Some(prev) = base.checked_sub(1) {
                seg.gaps.push((prev as u32, seg.end));
            }
        }
        // Bytes between the list's frames: the rest of each group's block.
        let mut padding = 0u64;
        for &(p, end) in frames.gaps() {
            let next = offsets
                .get(p as usize + 1)
                .copied()
                .expect("a list's gaps come before a frame of the list");
            joins(end, next);
            padding += u64::from(next - end);
            seg.gaps.push(((base + p as usize) as u32, end));
        }
        let mut internal_bytes = 0u64;
        for &p in frames.internal() {
            let i = base + p as usize;
            SegmentSlots::set(&mut seg.claimed, i, true);
            SegmentSlots::set(&mut seg.done, i, true);
            internal_bytes += frames.get(p as usize).map_or(0, |f| u64::from(f.len()));
        }
        let internal = frames.internal().len();
        let records = (offsets.len() - internal) as u64;
        let bytes = u64::from(frames.end()) - u64::from(first) - padding;
        seg.end = frames.end();
        seg.done_count += internal as u32;
        seg.live_bytes += bytes - internal_bytes;
        if seg.offsets.is_empty() {
            seg.offsets = frames.into_offsets();
            seg.offsets.shrink_to_fit();
        } else {
            seg.offsets.extend_from_slice(frames.offsets());
        }
        if cfg!(debug_assertions) {
            seg.check_invariants();
        }
        self.pending += records;
        self.backlog_bytes += bytes - internal_bytes - records * FRAME_HEADER_LEN as u64;
    }

    /// The last segment, which must be `id` and end just before `next_seq`.
    fn last_segment_at(&mut self, id: SegmentId, next_seq: Seq) -> &mut SegmentSlots {
        let seg = self
            .segments
            .back_mut()
            .expect("frames pushed into an empty table");
        assert_eq!(
            seg.id, id,
            "frames pushed into a segment that is not the last one"
        );
        assert_eq!(
            seg.end_seq(),
            next_seq.get(),
            "frames pushed out of sequence"
        );
        seg
    }

    /// Everything [`push_frames`](Self::push_frames) does but add the
    /// offsets, which the caller adds next: the states, the gaps, the counts.
    fn count_frames(
        &mut self,
        id: SegmentId,
        next_seq: Seq,
        frames: &[FrameSpan],
    ) -> &mut SegmentSlots {
        let seg = self.last_segment_at(id, next_seq);
        let base = seg.offsets.len();
        // The bitmaps' words come zeroed in one go, the offsets are added in
        // one pass by the caller, and the loop below keeps its counts in
        // locals, touching the segment only for a sync group's gap or an
        // internal frame.
        let words = (base + frames.len()).div_ceil(64);
        seg.claimed.resize(words, 0);
        seg.done.resize(words, 0);
        let mut end = seg.end;
        let (mut records, mut record_bytes, mut internal) = (0u64, 0u64, 0u32);
        for (k, f) in frames.iter().enumerate() {
            let (offset, len, is_record) = (f.offset, f.len(), f.is_record());
            let i = base + k;
            if offset != end {
                // A new sync group, on the next block boundary.
                assert_eq!(
                    u64::from(offset),
                    align_up(u64::from(end)),
                    "frames pushed with a gap that is not to a block boundary"
                );
                if let Some(prev) = i.checked_sub(1) {
                    seg.gaps.push((prev as u32, end));
                }
            }
            end = offset + len;
            if is_record {
                records += 1;
                record_bytes += u64::from(len);
            } else {
                SegmentSlots::set(&mut seg.claimed, i, true);
                SegmentSlots::set(&mut seg.done, i, true);
                internal += 1;
            }
        }
        seg.end = end;
        seg.done_count += internal;
        seg.live_bytes += record_bytes;
        self.pending += records;
        self.backlog_bytes += record_bytes - records * FRAME_HEADER_LEN as u64;
        self.segments
            .back_mut()
            .expect("the segment just counted into")
    }

    /// Index of the segment holding `seq`, or None if no live segment does.
    fn locate(&self, seq: u64) -> Option<usize> {
        let i = self.segments.partition_point(|s| s.first() <= seq);
        let seg = self.segments.get(i.checked_sub(1)?)?;
        (seq < seg.end_seq()).then(|| i - 1)
    }

    /// One past the last sequence number in the table.
    fn end_seq(&self) -> u64 {
        self.segments.back().map_or(0, |s| s.end_seq())
    }

    /// Marks up to `max_records` of the oldest Pending records Claimed, stopping
    /// before the payload total would exceed `max_bytes` (but always taking at
    /// least one record if any is pending).
    ///
    /// Oldest means lowest sequence number, relocated records included: a
    /// relocated record (found through `moved_pending`) is merged into the
    /// scan of the segments by its own number, so that a record which came
    /// back after a crash in an old segment is still handed out before a
    /// younger one that relocation carried forward.
    pub(crate) fn claim(&mut self, max_records: usize, max_bytes: u64) -> Vec<ClaimRun> {
        let mut runs: Vec<ClaimRun> = Vec::new();
        if max_records == 0 || self.pending == 0 {
            return runs;
        }
        let mut taken = 0usize;
        let mut bytes = 0u64;
        loop {
            let bound = self.moved_pending.first().copied();
            let stop = self.claim_slots(
                &mut runs,
                &mut taken,
                &mut bytes,
                max_records,
                max_bytes,
                bound.unwrap_or(u64::MAX),
            );
            if stop == ScanStop::Limit || bound.is_none() {
                break;
            }
            // The oldest relocated record is older than every slot left.
            let cap = (taken + 1).min(max_records);
            if self.claim_moved(&mut runs, &mut taken, &mut bytes, cap, max_bytes)
                || taken == max_records
            {
                break;
            }
        }
        self.pending -= taken as u64;
        self.claimed += taken as u64;
        runs
    }

    /// The scan of [`Table::claim`] over the segments' slots from the cursor:
    /// claims pending slots numbered below `bound` into `runs` until a limit
    /// stops it, it reaches a slot at or above `bound`, or nothing is left.
    /// Slots of relocated records are never taken here: their own numbers, and
    /// so `bound`, are below their slots' numbers.
    fn claim_slots(
        &mut self,
        runs: &mut Vec<ClaimRun>,
        taken: &mut usize,
        bytes: &mut u64,
        max_records: usize,
        max_bytes: u64,
        bound: u64,
    ) -> ScanStop {
        // The first segment holding anything at or after the cursor. Numbers are
        // not contiguous across segments (seal frames, skipped numbers), so the
        // cursor may point into a gap.
        let start_seg = self
            .segments
            .partition_point(|s| s.end_seq() <= self.cursor);
        let mut stop_at = self.end_seq();
        let mut stop = ScanStop::Exhausted;
        'segments: for si in start_seg..self.segments.len() {
            let seg = &mut self.segments[si];
            let len = seg.offsets.len();
            let from = self.cursor.saturating_sub(seg.first()) as usize;
            let mut run: Option<ClaimRun> = None;
            let mut w = from / 64;
            while w * 64 < len {
                let mut free = !(seg.claimed[w] | seg.done[w]) & word_mask(w, from, len);
                while free != 0 {
                    let i = w * 64 + free.trailing_zeros() as usize;
                    free &= free - 1;
                    let n = seg.first() + i as u64;
                    if n >= bound {
                        stop_at = n;
                        stop = ScanStop::Bound;
                        if let Some(run) = run.take() {
                            runs.push(run);
                        }
                        break 'segments;
                    }
                    let (offset, frame_len) = seg.frame_range(i);
                    let payload = u64::from(frame_len) - FRAME_HEADER_LEN as u64;
                    if *taken > 0 && *bytes + payload > max_bytes {
                        stop_at = n;
                        stop = ScanStop::Limit;
                        if let Some(run) = run.take() {
                            runs.push(run);
                        }
                        break 'segments;
                    }
                    SegmentSlots::set(&mut seg.claimed, i, true);
                    seg.claimed_count += 1;
                    *taken += 1;
                    *bytes += payload;
                    let seq = Seq::from(n);
                    run.get_or_insert_with(|| ClaimRun {
                        path: seg.path.clone(),
                        salt: seg.salt,
                        file: seg.file.clone(),
                        claim: 0,
                        frames: Vec::new(),
                    })
                    .frames
                    .push(ClaimedFrame {
                        seq,
                        at: seq,
                        offset,
                        len: frame_len,
                        attempt: 1,
                        reason: None,
                    });
                    if *taken == max_records {
                        stop_at = n + 1;
                        stop = ScanStop::Limit;
                        if let Some(run) = run.take() {
                            runs.push(run);
                        }
                        break 'segments;
                    }
                }
                w += 1;
            }
            if let Some(run) = run.take() {
                runs.push(run);
            }
            if cfg!(debug_assertions) {
                seg.check_invariants();
            }
        }
        self.cursor = self.cursor.max(stop_at);
        stop
    }

    /// The state of `seq`'s slot, or the error `ack` and `release` give for it.
    fn slot(&self, seq: Seq) -> Result<Option<(usize, usize)>> {
        let s = seq.get();
        if !self.moved.is_empty() {
            if let Some(&at) = self.moved.get(&s) {
                return Ok(self
                    .locate(at)
                    .map(|si| (si, (at - self.segments[si].first()) as usize)));
            }
            if self.origin.contains_key(&s) {
                // The frame of a relocated record: not a record number.
                return Err(Error::UnknownSeq { seq });
            }
        }
        match self.locate(s) {
            Some(si) => Ok(Some((si, (s - self.segments[si].first()) as usize))),
            // Below the oldest live segment: acknowledged and deleted long ago.
            None if self.segments.front().is_some_and(|f| s < f.first()) && s > 0 => Ok(None),
            None => Err(Error::UnknownSeq { seq }),
        }
    }

    fn check_ackable(&self, seq: Seq) -> Result<Option<(usize, usize)>> {
        let Some((si, i)) = self.slot(seq)? else {
            return Ok(None);
        };
        let seg = &self.segments[si];
        let (claimed, done) = (
            SegmentSlots::bit(&seg.claimed, i),
            SegmentSlots::bit(&seg.done, i),
        );
        if claimed && done {
            Err(Error::UnknownSeq { seq })
        } else if claimed
            && !self.keys.is_empty()
            && self.keys.is_held(seq.get())
            && !self.leases.lapsed(seq.get())
        {
            // Held back behind an earlier record of its key: never handed
            // out (a delivery whose lease ran out before it was held back is
            // acknowledged late, below).
            Err(Error::NotClaimed { seq })
        } else if claimed && self.waits_undelivered(seq.get()) {
            // Waiting out its own not-before time: never handed out.
            Err(Error::NotClaimed { seq })
        } else if claimed && self.leases.is_unread(seq.get()) && !self.leases.lapsed(seq.get()) {
            // Its claim failed reading it: never handed out (a late
            // acknowledgement of an earlier delivery is accepted below).
            Err(Error::NotClaimed { seq })
        } else if claimed {
            Ok(Some((si, i)))
        } else if SegmentSlots::bit(&seg.done, i) {
            Ok(None)
        } else if self.leases.lapsed(seq.get()) {
            // A late acknowledgement of a delivery whose lease ran out (or
            // that was released): the record was delivered; accepted.
            Ok(Some((si, i)))
        } else {
            Err(Error::NotClaimed { seq })
        }
    }

    /// Whether `seq` waits out a delay without ever having been handed out
    /// (its own not-before time): no delivery of it counted, no reason
    /// given, no lease of it ran out. A record released with a delay was
    /// handed out, and its acknowledgement is accepted.
    fn waits_undelivered(&self, seq: u64) -> bool {
        !self.due.is_empty()
            && self.due.contains_key(&seq)
            && !self.released.contains_key(&seq)
            && !self.leases.lapsed(seq)
    }

    fn set_done(&mut self, si: usize, i: usize) {
        let at = self.segments[si].first() + i as u64;
        let mut seq = at;
        if !self.origin.is_empty()
            && let Some(own) = self.origin.remove(&seq)
        {
            self.moved.remove(&own);
            self.moved_pending.remove(&own);
            seq = own;
        }
        self.leases.done(seq);
        if !self.reasons.is_empty() {
            self.reasons.remove(&seq);
        }
        let next_of_key = if self.keys.is_empty() {
            None
        } else {
            self.keys.leave(seq, true)
        };
        if !self.due.is_empty()
            && let Some(due) = self.due.remove(&seq)
        {
            self.delayed.remove(&(due, seq));
            self.released.remove(&seq);
        }
        if !self.dead.is_empty() {
            self.dead.remove(&seq);
        }
        let seg = &mut self.segments[si];
        let (_, frame_len) = seg.frame_range(i);
        if SegmentSlots::bit(&seg.claimed, i) {
            SegmentSlots::set(&mut seg.claimed, i, false);
            seg.claimed_count -= 1;
            self.claimed -= 1;
        } else {
            self.pending -= 1;
        }
        SegmentSlots::set(&mut seg.done, i, true);
        seg.done_count += 1;
        seg.live_bytes -= u64::from(frame_len);
        let finished = seg.is_finished();
        if cfg!(debug_assertions) {
            seg.check_invariants();
        }
        self.backlog_bytes -= self.counted(at, frame_len);
        self.finished += u64::from(finished);
        if let Some(next) = next_of_key {
            self.key_head_free(next);
        }
    }

    /// The record `seq` left its key's queue (parked as a dead letter, or,
    /// with `forget`, done): the next record of the key goes.
    fn key_left(&mut self, seq: u64, forget: bool) {
        if self.keys.is_empty() {
            return;
        }
        if let Some(next) = self.keys.leave(seq, forget) {
            self.key_head_free(next);
        }
    }

    /// `seq`, which has its key's turn, became pending again (released, its
    /// lease or delay ran out): if an older record of its key waits for the
    /// turn (requeued meanwhile), that one goes first and `seq` waits.
    fn key_repass(&mut self, seq: u64) {
        if self.keys.is_empty() {
            return;
        }
        if let Some(older) = self.keys.repass(seq) {
            if let Ok(Some((si, i))) = self.slot(Seq::from(seq)) {
                self.claim_slot(si, i);
            }
            self.key_head_free(older);
        }
    }

    /// `seq` got its key's turn: pending, unless it waits out a delay
    /// (then it goes when the delay ends).
    fn key_head_free(&mut self, seq: u64) {
        if !self.due.contains_key(&seq) {
            let _ = self.unclaim(Seq::from(seq));
            self.turn_passed = true;
        }
    }

    /// Whether a record became claimable by its key's turn passing to it
    /// since the last call (its caller wakes those waiting for records).
    pub(crate) fn take_turn_passed(&mut self) -> bool {
        std::mem::take(&mut self.turn_passed)
    }

    /// The events noted since the last call, to report once the table's lock
    /// is released (every caller of [`expire`](Table::expire) and
    /// [`lease`](Table::lease) takes them).
    pub(crate) fn take_notices(&mut self) -> Notices {
        Notices(std::mem::take(&mut self.notices))
    }

    /// The dead letter `seq` (just taken out of `dead`) becomes deliverable:
    /// pending, or behind the records of its key still to deliver.
    fn rejoin(&mut self, seq: Seq) -> Result<()> {
        if self.keys.key_of(seq.get()).is_none() {
            return self.unclaim(seq);
        }
        let free = |table: &Table, head: u64| {
            table
                .slot(Seq::from(head))
                .ok()
                .flatten()
                .is_some_and(|(si, i)| !SegmentSlots::bit(&table.segments[si].claimed, i))
        };
        let mut keys = std::mem::take(&mut self.keys);
        let joined = keys.rejoin(seq.get(), |head| free(self, head));
        self.keys = keys;
        match joined {
            Some(Joined::Head) | None => self.unclaim(seq),
            Some(Joined::Behind) => Ok(()),
            Some(Joined::Displaced(head)) => {
                if let Ok(Some((si, i))) = self.slot(Seq::from(head)) {
                    self.claim_slot(si, i);
                }
                self.unclaim(seq)
            }
        }
    }

    /// What producers said about new records (or, at open, about the
    /// records of the log, in sequence order, after the rest of the state was
    /// replayed): a not-before time in the future holds a record like a
    /// delay; a key holds it behind the earlier records of its key still to
    /// deliver. `now` and `now_wall_us` place a not-before time on the
    /// monotonic clock. Records done, or dead letters (which do not block
    /// their key), only have their key noted.
    pub(crate) fn apply_fields<'a>(
        &mut self,
        described: impl IntoIterator<Item = &'a Described>,
        now: u64,
        now_wall_us: u64,
    ) {
        for d in described {
            let own = d.seq.get();
            let Ok(Some((si, i))) = self.slot(d.seq) else {
                continue;
            };
            let seg = &self.segments[si];
            if SegmentSlots::bit(&seg.done, i) {
                continue;
            }
            let dead = self.dead.contains_key(&own);
            if let Some(nb) = d.not_before_us {
                let wait = nb.saturating_sub(now_wall_us);
                let free = !SegmentSlots::bit(&self.segments[si].claimed, i);
                if wait > 0 && free && !dead {
                    self.claim_slot(si, i);
                    let due = now.saturating_add(wait);
                    self.delayed.insert((due, own));
                    self.due.insert(own, due);
                }
            }
            if let Some(key) = d.key {
                if dead {
                    self.keys.note(own, key);
                } else if !self.keys.push(own, key)
                    && !SegmentSlots::bit(&self.segments[si].claimed, i)
                {
                    self.claim_slot(si, i);
                }
            }
        }
    }

    /// Makes room at open for the keys of `described` that
    /// [`apply_fields`](Self::apply_fields) will keep: those of records not
    /// done.
    pub(crate) fn reserve_keys(&mut self, described: &[&Described]) {
        let kept = described
            .iter()
            .filter(|d| d.key.is_some())
            .filter(|d| {
                matches!(self.slot(d.seq), Ok(Some((si, i)))
                    if !SegmentSlots::bit(&self.segments[si].done, i))
            })
            .count();
        self.keys.reserve(kept);
    }

    /// At open, once every key's queue is built in sequence order: each
    /// record waiting out a release's delay had its key's turn when it was
    /// released, and keeps it while it waits, ahead of an older record of
    /// its key requeued meanwhile (which is held back behind it, as it was
    /// before the restart).
    pub(crate) fn keep_released_turns(&mut self) {
        if self.keys.is_empty() || self.released.is_empty() {
            return;
        }
        let released: Vec<u64> = self
            .released
            .keys()
            .copied()
            .filter(|s| self.due.contains_key(s))
            .collect();
        for seq in released {
            if let Some(held) = self.keys.take_turn(seq)
                && let Ok(Some((si, i))) = self.slot(Seq::from(held))
                && !SegmentSlots::bit(&self.segments[si].claimed, i)
            {
                self.claim_slot(si, i);
            }
        }
    }

    /// Acknowledges the claimed records `seqs`, all or none. Returns whether the
    /// oldest segment is deletable and these acknowledgements finished a
    /// segment (one deletable before, which the writer holds back or is
    /// about to delete, is not news).
    pub(crate) fn ack(&mut self, seqs: &[Seq]) -> Result<bool> {
        for &seq in seqs {
            self.check_ackable(seq)?;
        }
        let finished = self.finished;
        for &seq in seqs {
            // Checked above; a seq listed twice is Done the second time.
            if let Some((si, i)) = self.check_ackable(seq)? {
                self.set_done(si, i);
                crate::format::acks::push(&mut self.unwritten_acks, seq);
            }
        }
        Ok(self.finished != finished && self.segments.front().is_some_and(|s| s.is_finished()))
    }

    /// Returns a claimed record to Pending; it is handed out before newer ones,
    /// as its next attempt.
    pub(crate) fn release(&mut self, seq: Seq) -> Result<()> {
        let Some((si, i)) = self.slot(seq)? else {
            return Err(Error::NotClaimed { seq });
        };
        let seg = &self.segments[si];
        if SegmentSlots::bit(&seg.claimed, i) && SegmentSlots::bit(&seg.done, i) {
            return Err(Error::UnknownSeq { seq });
        }
        if !self.leases.is_held(seq.get()) {
            // Not claimed, delayed, or a dead letter.
            return Err(Error::NotClaimed { seq });
        }
        self.unclaim(seq)?;
        self.leases.returned(seq.get());
        self.key_repass(seq.get());
        Ok(())
    }

    /// Makes the claimed record `seq` Pending again, leases aside.
    fn unclaim(&mut self, seq: Seq) -> Result<()> {
        let Some((si, i)) = self.slot(seq)? else {
            return Err(Error::NotClaimed { seq });
        };
        let seg = &mut self.segments[si];
        let (claimed, done) = (
            SegmentSlots::bit(&seg.claimed, i),
            SegmentSlots::bit(&seg.done, i),
        );
        if claimed && done {
            return Err(Error::UnknownSeq { seq });
        }
        if !claimed {
            return Err(Error::NotClaimed { seq });
        }
        SegmentSlots::set(&mut seg.claimed, i, false);
        seg.claimed_count -= 1;
        self.claimed -= 1;
        self.pending += 1;
        if !self.moved.is_empty() && self.moved.contains_key(&seq.get()) {
            self.moved_pending.insert(seq.get());
        } else {
            self.cursor = self.cursor.min(seq.get());
        }
        if cfg!(debug_assertions) {
            seg.check_invariants();
        }
        Ok(())
    }

    /// Puts back records a claim took but never handed out (its read, or
    /// the sync of its attempts, failed first): pending again, and their
    /// delivery does not count. Where attempts are written to the log
    /// (`record_attempts`, under `max_attempts`), the count it holds is set
    /// back too, by an attempts entry of the count before (replayed as the
    /// latest), so that failed reads cannot make a dead letter of a record
    /// never delivered.
    ///
    /// `taken` pairs each record with the claim that took it
    /// ([`ClaimRun::claim`]): one no longer held by that claim was
    /// acknowledged meanwhile, or its lease ran out and another claim holds
    /// it now (perhaps handed out already, perhaps as the same attempt
    /// after a requeue): it is left as it is.
    pub(crate) fn put_back_unread(
        &mut self,
        taken: impl IntoIterator<Item = (Seq, u32)>,
        record_attempts: bool,
    ) {
        for (seq, claim) in taken {
            if self.leases.claim_of(seq.get()) != Some(claim) || self.unclaim(seq).is_err() {
                continue;
            }
            let attempts = self.leases.returned_unread(seq.get());
            self.key_repass(seq.get());
            if record_attempts {
                self.push_change(Change::Attempts { seq, attempts });
            }
        }
    }

    /// The claim `claim` failed reading the record `seq`, which it still
    /// holds: held back until its lease runs out, never handed out, so no
    /// `ack`, `ack_through`, release, dead letter or renewal settles it
    /// (they answer `NotClaimed`, or pass it by). With `newer` (it holds
    /// what this build does not read: a newer build wrote it) this delivery
    /// does not count either (`record_attempts`: the count set back is
    /// written to the log), so that `max_attempts` never makes it a dead
    /// letter this build cannot show.
    pub(crate) fn hold_unread(&mut self, seq: Seq, claim: u32, newer: bool, record_attempts: bool) {
        if let Some(attempts) = self.leases.hold_unread(seq.get(), claim, newer)
            && record_attempts
        {
            self.push_change(Change::Attempts { seq, attempts });
        }
    }

    /// Sets aside a record whose frame failed its check on the read path, so that
    /// one bad record cannot wedge the queue.
    pub(crate) fn set_aside(&mut self, seq: Seq) -> bool {
        match self.slot(seq) {
            Ok(Some((si, i))) if !SegmentSlots::bit(&self.segments[si].done, i) => {
                self.set_done(si, i);
                self.segments.front().is_some_and(|s| s.is_finished())
            }
            _ => false,
        }
    }

    /// The oldest segments that are sealed and entirely Done, and the first
    /// sequence number of the segment that would then be the oldest.
    pub(crate) fn reclaimable(&self) -> Option<(usize, Seq)> {
        self.front_while(SegmentSlots::is_finished)
    }

    /// The oldest sealed segments whatever they hold: what the negative control
    /// `DeleteLiveSegment` deletes.
    pub(crate) fn sealed_front(&self) -> Option<(usize, Seq)> {
        self.front_while(|s| s.sealed)
    }

    /// The oldest segments that satisfy `take`, as long as one stays after them.
    fn front_while(&self, take: impl Fn(&SegmentSlots) -> bool) -> Option<(usize, Seq)> {
        let count = self.segments.iter().take_while(|s| take(s)).count();
        if count == 0 {
            return None;
        }
        let next = self.segments.get(count)?;
        Some((count, next.id.first_seq()))
    }

    /// The file bytes (headers and frames) of the oldest `count` segments,
    /// and of every segment.
    pub(crate) fn front_bytes(&self, count: usize) -> (u64, u64) {
        let bytes = |s: &SegmentSlots| u64::from(s.end);
        let front = self.segments.iter().take(count).map(bytes).sum();
        (front, self.segments.iter().map(bytes).sum())
    }

    /// The segments in the log, the active one included.
    pub(crate) fn segment_count(&self) -> usize {
        self.segments.len()
    }

    /// The paths of the oldest `count` segments.
    pub(crate) fn front_paths(&self, count: usize) -> Vec<Arc<Path>> {
        self.segments
            .iter()
            .take(count)
            .map(|s| s.path.clone())
            .collect()
    }

    /// Drops the oldest `count` segments from the table (after their files are
    /// deleted). The totals stay true whatever the segments held; the writer only
    /// removes segments entirely Done, save under a negative control.
    pub(crate) fn remove_front(&mut self, count: usize) {
        for _ in 0..count {
            let seg = self
                .segments
                .pop_front()
                .expect("remove_front past the end");
            if seg.is_finished() {
                continue;
            }
            for i in 0..seg.offsets.len() {
                if SegmentSlots::bit(&seg.done, i) {
                    continue;
                }
                if SegmentSlots::bit(&seg.claimed, i) {
                    self.claimed -= 1;
                } else {
                    self.pending -= 1;
                }
                let mut seq = seg.first() + i as u64;
                if let Some(own) = self.origin.remove(&seq) {
                    self.moved.remove(&own);
                    self.moved_pending.remove(&own);
                    seq = own;
                }
                // Nothing is kept of a record that went with its segment.
                self.leases.done(seq);
                self.dead.remove(&seq);
                self.reasons.remove(&seq);
                if let Some(due) = self.due.remove(&seq) {
                    self.delayed.remove(&(due, seq));
                    self.released.remove(&seq);
                }
                let (_, len) = seg.frame_range(i);
                let at = seg.first() + i as u64;
                self.backlog_bytes -= self.counted(at, len);
            }
        }
    }

    /// The backlog's bytes of the frame `at`, `len` bytes long, which leaves
    /// the backlog now: its length but for its header, and, for a relocated
    /// copy, what the copy added to its record.
    fn counted(&mut self, at: u64, len: u32) -> u64 {
        let extra = if self.copy_extra.is_empty() {
            0
        } else {
            self.copy_extra.remove(&at).unwrap_or(0)
        };
        u64::from(len).saturating_sub(FRAME_HEADER_LEN as u64 + u64::from(extra))
    }

    pub(crate) fn stats(&self) -> TableStats {
        let mut stats = TableStats {
            pending: self.pending,
            claimed: self.claimed,
            backlog_bytes: self.backlog_bytes,
            segments: self.segments.len(),
            expired_leases: self.leases.expired,
            delayed: self.delayed.len() as u64,
            dead_letters: self.dead.len() as u64,
            state_bytes: self.leases.heap_bytes()
                + self.side_bytes()
                + self.unwritten_bytes() as u64,
            ..TableStats::default()
        };
        for seg in &self.segments {
            stats.disk_bytes += u64::from(seg.end);
            match &seg.file {
                Some(file) => stats.open_files.push(file.clone()),
                None => stats.sealed_allocated += align_up(u64::from(seg.end)),
            }
            stats.state_bytes += seg.heap_bytes();
        }
        stats.last_seq = self
            .segments
            .iter()
            .rev()
            .find(|s| s.len() > 0)
            .map(|s| Seq::from(s.end_seq() - 1));
        // Relocated records are older than any other still in their place.
        let first_moved = self.moved.keys().next().copied();
        let first_moved_pending = self.moved_pending.first().copied();
        let older = |a: Option<SlotRef>, b: Option<SlotRef>| match (a, b) {
            (Some(a), Some(b)) => Some(if a.seq <= b.seq { a } else { b }),
            (a, b) => a.or(b),
        };
        stats.first_unacked = older(
            first_moved.and_then(|own| self.slot_ref(own)),
            self.find_first(0, |_, d| !d),
        );
        stats.first_pending = older(
            first_moved_pending.and_then(|own| self.slot_ref(own)),
            self.find_first(self.cursor, |c, d| !(c | d)),
        );
        for seg in &self.segments {
            let live = seg.len() - u64::from(seg.done_count);
            if seg.sealed && live > 0 {
                stats.held_segments += 1;
                stats.held_by_records += live;
            }
        }
        stats.relocated = self.relocated;
        if !self.keys.is_empty() {
            stats.blocked_keys = self.keys.blocked();
            stats.held_by_key = self
                .keys
                .held()
                .filter(|s| !self.due.contains_key(s))
                .count() as u64;
        }
        // Counted whether or not a key is left: the maps keep their room
        // until the writer gives it back.
        stats.keys_bytes = self.keys.heap_bytes();
        stats
    }

    /// The heap bytes of the maps beside the slots, roughly: delayed
    /// records, dead letters, reasons, relocated records (a B-tree's entry
    /// counted half again for its nodes' slack). Not the reasons' text, which
    /// consecutive equal reasons share.
    fn side_bytes(&self) -> u64 {
        use crate::state::map_bytes;
        let btree = |len: usize, entry: usize| (len * entry * 3 / 2) as u64;
        btree(self.delayed.len(), 16)
            + btree(self.dead.len(), 8 + size_of::<DeadEntry>())
            + btree(self.moved.len(), 16)
            + btree(self.moved_pending.len(), 8)
            + map_bytes(self.due.capacity(), 16)
            + map_bytes(self.reasons.capacity(), 8 + size_of::<Arc<str>>())
            + map_bytes(self.released.capacity(), 8)
            + map_bytes(self.origin.capacity(), 16)
            + map_bytes(self.copy_extra.capacity(), 12)
    }

    /// Each segment's first seq and its live records (not Done: pending,
    /// claimed, delayed, held back by a key, dead letters), oldest first.
    pub(crate) fn live_by_segment(&self) -> impl Iterator<Item = (Seq, u64)> + '_ {
        self.segments
            .iter()
            .map(|s| (s.id.first_seq(), s.len() - u64::from(s.done_count)))
    }

    /// Where the record `seq` stands, and the deliveries counted so far (for
    /// a dead letter, those before it died); `None` if the table holds no
    /// such record. For a table rebuilt by a read-only check, where nothing
    /// is claimed, a record with its claimed bit set waits out a delay, is a
    /// dead letter, or is held back behind an earlier record of its key. A
    /// record below the oldest segment (a relocated copy of one acknowledged
    /// since, say) is done: every live record has a slot.
    pub(crate) fn standing(&self, seq: Seq) -> Option<(Standing, u32)> {
        let (si, i) = match self.slot(seq) {
            Ok(Some(slot)) => slot,
            Ok(None) => return Some((Standing::Done, 0)),
            Err(_) => return None,
        };
        let seg = &self.segments[si];
        if SegmentSlots::bit(&seg.done, i) {
            return Some((Standing::Done, self.leases.delivered(seq.get())));
        }
        let own = seq.get();
        if let Some(dead) = self.dead.get(&own) {
            return Some((Standing::Dead(dead.clone()), dead.attempts));
        }
        let attempts = self.leases.delivered(own);
        if let Some(&due) = self.due.get(&own) {
            return Some((Standing::Delayed { due }, attempts));
        }
        if SegmentSlots::bit(&seg.claimed, i) {
            let held = !self.keys.is_empty() && self.keys.is_held(own);
            let standing = if held {
                Standing::HeldByKey
            } else {
                Standing::Claimed
            };
            return Some((standing, attempts));
        }
        Some((Standing::Pending, attempts))
    }

    /// The first slot at or after `from` whose words satisfy `pick`.
    fn find_first(&self, from: u64, pick: impl Fn(u64, u64) -> u64) -> Option<SlotRef> {
        for seg in &self.segments {
            if seg.end_seq() <= from {
                continue;
            }
            let start = from.saturating_sub(seg.first()) as usize;
            let len = seg.offsets.len();
            for w in start / 64..len.div_ceil(64) {
                let mut bits = pick(seg.claimed[w], seg.done[w]) & word_mask(w, start, len);
                while bits != 0 {
                    let i = w * 64 + bits.trailing_zeros() as usize;
                    bits &= bits - 1;
                    // A relocated record's slot: not in its place in the order.
                    if !self.origin.is_empty()
                        && self.origin.contains_key(&(seg.first() + i as u64))
                    {
                        continue;
                    }
                    return Some(SlotRef {
                        seq: Seq::from(seg.first() + i as u64),
                        path: seg.path.clone(),
                        file: seg.file.clone(),
                        offset: seg.offsets[i],
                    });
                }
            }
        }
        None
    }

    /// Checks every invariant of the table (tests and debug builds).
    pub(crate) fn check_invariants(&self) {
        let (mut claimed, mut pending) = (0u64, 0u64);
        for (k, seg) in self.segments.iter().enumerate() {
            seg.check_invariants();
            if k + 1 < self.segments.len() {
                assert!(seg.sealed, "an unsealed segment that is not the last");
                assert!(seg.end_seq() <= self.segments[k + 1].first());
            }
            claimed += u64::from(seg.claimed_count);
            pending += seg.len() - u64::from(seg.claimed_count) - u64::from(seg.done_count);
            for i in 0..seg.offsets.len() {
                let n = seg.first() + i as u64;
                if let Some(&own) = self.origin.get(&n) {
                    assert_eq!(self.moved.get(&own), Some(&n), "moved and origin disagree");
                    let pending =
                        !SegmentSlots::bit(&seg.claimed, i) && !SegmentSlots::bit(&seg.done, i);
                    assert_eq!(pending, self.moved_pending.contains(&own));
                    continue;
                }
                if n < self.cursor {
                    assert!(
                        SegmentSlots::bit(&seg.claimed, i) || SegmentSlots::bit(&seg.done, i),
                        "pending slot below the cursor"
                    );
                }
            }
        }
        assert_eq!(claimed, self.claimed);
        assert_eq!(pending, self.pending);
        assert_eq!(self.moved.len(), self.origin.len());
        assert!(
            self.moved_pending
                .iter()
                .all(|s| self.moved.contains_key(s))
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::{StdStorage, Storage};

    /// A table with one unsealed segment holding `n` records of 10-byte payloads,
    /// with frame `internal` (if any) an internal frame.
    fn table(n: u32, internal: Option<u32>) -> (Table, tempfile::TempDir) {
        table_from(1, n, internal)
    }

    /// [`table`] whose segment's first seq is `first`.
    fn table_from(first: u64, n: u32, internal: Option<u32>) -> (Table, tempfile::TempDir) {
        let dir = tempfile::tempdir().expect("tempdir");
        let path: Arc<Path> = dir.path().join("f").into();
        let file = StdStorage::new().create(&path).expect("create");
        let mut t = Table::new();
        t.push_segment(SegmentSlots::new(SegmentId(first), path, Some(file), 0, 64));
        let frame = FRAME_HEADER_LEN as u32 + 10;
        let frames: Vec<FrameSpan> = (0..n)
            .map(|i| FrameSpan::new(64 + i * frame, frame, Some(i) != internal))
            .collect();
        t.push_frames(SegmentId(first), Seq::from(first), &frames);
        (t, dir)
    }

    /// Claims as the outbox does: under a lease (one that never runs out).
    fn take(t: &mut Table, max_records: usize, max_bytes: u64) -> Vec<ClaimRun> {
        let mut runs = t.claim(max_records, max_bytes);
        let _ = t.lease(&mut runs, crate::state::leases::NEVER, None, 0, true);
        runs
    }

    fn seqs(runs: &[ClaimRun]) -> Vec<u64> {
        runs.iter()
            .flat_map(|r| r.frames.iter().map(|f| f.seq.get()))
            .collect()
    }

    #[test]
    fn claims_hand_out_oldest_first_and_skip_internal_frames() {
        let (mut t, _d) = table(200, Some(2));
        assert_eq!(seqs(&take(&mut t, 4, u64::MAX)), vec![1, 2, 4, 5]);
        // An internal frame is not a record: no ack, no release.
        assert!(matches!(
            t.ack(&[Seq::from(3)]),
            Err(Error::UnknownSeq { .. })
        ));
        assert!(matches!(
            t.release(Seq::from(3)),
            Err(Error::UnknownSeq { .. })
        ));
        assert_eq!(seqs(&take(&mut t, 3, u64::MAX)), vec![6, 7, 8]);
        t.check_invariants();
    }

    /// Regression: `dump --state` gave a relocated copy of a record
    /// acknowledged since no state at all (a soak found 40 at its end): its
    /// own number lies below every segment, where only acknowledged records
    /// are. A number of the table's own segment stands as its slot says.
    #[test]
    fn a_record_below_every_segment_stands_as_acknowledged() {
        let (t, _d) = table_from(100, 4, None);
        assert!(matches!(
            t.standing(Seq::from(5)),
            Some((Standing::Done, _))
        ));
        assert!(matches!(
            t.standing(Seq::from(101)),
            Some((Standing::Pending, 0))
        ));
        assert!(t.standing(Seq::from(1000)).is_none());
    }

    /// Regression: claims handed out every pending relocated record before
    /// the scan of the segments, so a record that came back in its old place
    /// (an expired lease, a crash) went out after a younger one that
    /// relocation had carried forward (the crash harness's I3 saw it).
    #[test]
    fn relocated_records_are_handed_out_in_order_with_the_rest() {
        // Frame 12 is the internal slot a relocated copy takes.
        let (mut t, _d) = table(12, Some(11));
        assert_eq!(
            seqs(&take(&mut t, 11, u64::MAX)),
            (1..=11).collect::<Vec<_>>()
        );
        // Record 5, claimed, is carried forward into frame 12.
        t.moved_in(&[(Seq::from(5), Seq::from(12))]);
        t.check_invariants();
        for seq in [5, 7, 2] {
            t.release(Seq::from(seq)).expect("release");
        }
        assert_eq!(seqs(&take(&mut t, 10, u64::MAX)), vec![2, 5, 7]);
        // The copy answers to the record's own number.
        t.ack(&[Seq::from(5)]).expect("ack by its own number");
        t.check_invariants();
    }

    #[test]
    fn released_records_come_back_before_newer_ones() {
        let (mut t, _d) = table(100, None);
        assert_eq!(
            seqs(&take(&mut t, 10, u64::MAX)),
            (1..=10).collect::<Vec<_>>()
        );
        t.release(Seq::from(3)).expect("release");
        t.release(Seq::from(7)).expect("release");
        assert_eq!(seqs(&take(&mut t, 3, u64::MAX)), vec![3, 7, 11]);
        t.check_invariants();
    }

    #[test]
    fn claim_by_bytes_takes_at_least_one_record() {
        let (mut t, _d) = table(10, None);
        assert_eq!(seqs(&take(&mut t, 100, 25)), vec![1, 2]);
        assert_eq!(seqs(&take(&mut t, 100, 1)), vec![3]);
        t.check_invariants();
    }

    #[test]
    fn ack_semantics() {
        let (mut t, _d) = table(10, None);
        take(&mut t, 2, u64::MAX);
        assert!(matches!(
            t.ack(&[Seq::from(5)]),
            Err(Error::NotClaimed { .. })
        ));
        assert!(matches!(
            t.ack(&[Seq::from(11)]),
            Err(Error::UnknownSeq { .. })
        ));
        assert!(matches!(
            t.ack(&[Seq::from(0)]),
            Err(Error::UnknownSeq { .. })
        ));
        // All or nothing: the valid seq in a failing ack_many stays claimed.
        assert!(t.ack(&[Seq::from(1), Seq::from(9)]).is_err());
        assert_eq!(t.claimed, 2);
        t.ack(&[Seq::from(1), Seq::from(2)]).expect("ack");
        // Acking twice is not an error: relays retry acks.
        t.ack(&[Seq::from(1)]).expect("ack again");
        assert!(matches!(
            t.release(Seq::from(1)),
            Err(Error::NotClaimed { .. })
        ));
        assert_eq!((t.pending, t.claimed), (8, 0));
        t.check_invariants();
    }

    #[test]
    fn a_segment_is_reclaimable_only_when_sealed_and_done() {
        let (mut t, d) = table(3, None);
        take(&mut t, 3, u64::MAX);
        assert!(
            !t.ack(&[Seq::from(1), Seq::from(2), Seq::from(3)])
                .expect("ack")
        );
        assert_eq!(t.reclaimable(), None, "unsealed");
        t.seal_last(SegmentId(1));
        let path: Arc<Path> = d.path().join("g").into();
        let file = StdStorage::new().create(&path).expect("create");
        t.push_segment(SegmentSlots::new(SegmentId(4), path, Some(file), 0, 64));
        assert_eq!(t.reclaimable(), Some((1, Seq::from(4))));
        t.remove_front(1);
        // Seqs of deleted segments were acknowledged: acking them again is fine.
        t.ack(&[Seq::from(2)]).expect("ack of a deleted seq");
        t.check_invariants();
    }

    #[test]
    fn only_the_ack_that_finishes_a_segment_says_the_front_is_deletable() {
        // Three records in a sealed segment, three in the active one.
        let (mut t, d) = table(3, None);
        t.seal_last(SegmentId(1));
        let path: Arc<Path> = d.path().join("g").into();
        let file = StdStorage::new().create(&path).expect("create");
        t.push_segment(SegmentSlots::new(SegmentId(4), path, Some(file), 0, 64));
        let frame = FRAME_HEADER_LEN as u32 + 10;
        let spans: Vec<FrameSpan> = (0..3)
            .map(|k| FrameSpan::new(64 + k * frame, frame, true))
            .collect();
        t.push_frames(SegmentId(4), Seq::from(4), &spans);
        take(&mut t, 6, u64::MAX);
        assert!(!t.ack(&[Seq::from(1), Seq::from(2)]).expect("ack"));
        assert!(
            t.ack(&[Seq::from(3)]).expect("ack"),
            "it finished the front"
        );
        // The front stays deletable (the writer may hold it back), but these
        // finish nothing: no news for the writer.
        assert!(!t.ack(&[Seq::from(4)]).expect("ack"));
        assert_eq!(t.ack_through(Seq::from(5)), (1, false));
        t.check_invariants();
    }

    #[test]
    fn claims_cross_a_gap_in_numbers_between_segments() {
        // Regression: a claim that ended exactly at a segment's last record left the
        // cursor in the gap before the next segment, and every later claim found
        // nothing while records were pending.
        let (mut t, d) = table(3, None);
        t.seal_last(SegmentId(1));
        let path: Arc<Path> = d.path().join("g").into();
        let file = StdStorage::new().create(&path).expect("create");
        t.push_segment(SegmentSlots::new(SegmentId(10), path, Some(file), 0, 64));
        let frame = FRAME_HEADER_LEN as u32 + 10;
        t.push_frames(
            SegmentId(10),
            Seq::from(10),
            &[64, 64 + frame].map(|offset| FrameSpan::new(offset, frame, true)),
        );
        assert_eq!(seqs(&take(&mut t, 3, u64::MAX)), vec![1, 2, 3]);
        assert_eq!(seqs(&take(&mut t, 1, u64::MAX)), vec![10]);
        assert_eq!(seqs(&take(&mut t, 5, u64::MAX)), vec![11]);
        t.check_invariants();
    }

    #[test]
    fn frames_given_up_make_the_same_table_as_frames_lent() {
        // Sync groups of three frames, each on a block of its own; every
        // fifth frame internal.
        let frame = FRAME_HEADER_LEN as u32 + 10;
        let mut frames = Vec::new();
        let mut at = 4096u32;
        for i in 0..300u32 {
            if i > 0 && i % 3 == 0 {
                at = at.next_multiple_of(4096);
            }
            frames.push(FrameSpan::new(at, frame, i % 5 != 4));
            at += frame;
        }
        let build = |split: Option<usize>| {
            let mut t = Table::new();
            let path: Arc<Path> = Path::new("00000000000000000001.seg").into();
            t.push_segment(SegmentSlots::new(SegmentId(1), path, None, 0, 4096));
            match split {
                None => t.push_frames(SegmentId(1), Seq::from(1), &frames),
                // Given up in two parts: the second into a segment that
                // already has frames.
                Some(k) => {
                    t.push_frames_owned(
                        SegmentId(1),
                        Seq::from(1),
                        frames[..k].iter().copied().collect(),
                    );
                    let next = Seq::from(k as u64 + 1);
                    t.push_frames_owned(SegmentId(1), next, frames[k..].iter().copied().collect());
                }
            }
            t.seal_last(SegmentId(1));
            t.check_invariants();
            t
        };
        let summary = |t: &mut Table| {
            let s = t.stats();
            let claimed: Vec<(u64, u32, u32)> = take(t, 1000, u64::MAX)
                .iter()
                .flat_map(|r| r.frames.iter().map(|f| (f.seq.get(), f.offset, f.len)))
                .collect();
            (
                s.pending,
                s.backlog_bytes,
                s.disk_bytes,
                s.state_bytes,
                claimed,
            )
        };
        let lent = summary(&mut build(None));
        assert_eq!(lent.0, 240, "the records, not the internal frames");
        assert_eq!(lent.4.len(), 240);
        assert_eq!(summary(&mut build(Some(300))), lent);
        assert_eq!(summary(&mut build(Some(100))), lent);
    }

    /// A claim whose read failed after its lease ran out, and another claim
    /// took (and perhaps handed out) its records, puts back only what it
    /// still holds: the other claim's records stay claimed, their delivery
    /// counted.
    #[test]
    fn a_failed_claim_puts_back_only_what_it_still_holds() {
        let (mut t, _d) = table(3, None);
        let leased = |t: &mut Table, deadline| {
            let mut runs = t.claim(10, u64::MAX);
            let _ = t.lease(&mut runs, deadline, Some(5), 0, true);
            runs
        };
        let taken = |runs: &[ClaimRun]| -> Vec<(Seq, u32)> {
            runs.iter()
                .flat_map(|r| r.frames.iter().map(|f| (f.seq, r.claim)))
                .collect()
        };
        let attempts = |runs: &[ClaimRun]| -> Vec<u32> {
            runs.iter()
                .flat_map(|r| r.frames.iter().map(|f| f.attempt))
                .collect()
        };
        let a = leased(&mut t, 100);
        // The first claim's number too is not that of a run no claim made.
        assert!(a.iter().all(|r| r.claim != 0));
        t.expire(100);
        let b = leased(&mut t, 1_000);
        assert_eq!(attempts(&b), [2, 2, 2]);
        let _ = t.take_unwritten();
        // A's read fails now.
        t.put_back_unread(taken(&a), true);
        assert_eq!(t.stats().claimed, 3, "still B's");
        assert!(t.take_unwritten().1.is_empty(), "no count set back");
        assert_eq!(t.leases.delivered(2), 2);
        // B's own failure puts them back, uncharged.
        t.put_back_unread(taken(&b), true);
        assert_eq!(t.stats().pending, 3);
        assert_eq!(t.leases.delivered(2), 1);
        assert_eq!(t.take_unwritten().1.len(), 3, "counts set back in the log");
        t.check_invariants();

        // A record dead-lettered and requeued starts its attempts again: a
        // later claim may hold it as the very attempt a stale claim took.
        let (mut t, _d) = table(3, None);
        let stale = leased(&mut t, 100);
        t.expire(100);
        let again = leased(&mut t, 1_000);
        for (seq, _) in taken(&again) {
            t.dead_letter(seq, None, "refused", 0).expect("dead letter");
            t.requeue(seq).expect("requeue");
        }
        let live = leased(&mut t, 2_000);
        assert_eq!(attempts(&live), attempts(&stale), "the same attempts");
        t.put_back_unread(taken(&stale), true);
        assert_eq!(t.stats().claimed, 3, "still the live claim's");
        t.check_invariants();
    }

    #[test]
    fn set_aside_moves_past_a_bad_record() {
        let (mut t, _d) = table(5, None);
        let runs = take(&mut t, 2, u64::MAX);
        let first = seqs(&runs);
        t.set_aside(Seq::from(first[0]));
        t.put_back_unread([(Seq::from(first[1]), runs[0].claim)], false);
        assert_eq!(seqs(&take(&mut t, 10, u64::MAX)), vec![2, 3, 4, 5]);
        t.check_invariants();
    }
}
