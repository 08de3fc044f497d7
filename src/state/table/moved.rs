//! Relocation: records carried forward out of the oldest segment, so that a
//! few records nobody acknowledges (dead letters, long delays, claims a stuck
//! relay holds) do not keep it, and everything behind it, on disk.
//!
//! A relocated record keeps its number. The writer copies its frame into the
//! active segment as a frame of kind 4, which takes a number of its own like
//! any frame; once that frame is durable, [`Table::moved_in`] hands the
//! record's state from its old slot to the new frame's slot, and the old slot
//! becomes Done, so that the old segment is deleted by the usual rule. The
//! table then finds the record through `moved` (its number → the frame's) and
//! the frame's slot through `origin` (the reverse); the leases, delays, dead
//! letters and reasons stay keyed by the record's own number.
//!
//! When (docs/FORMAT.md, "Relocation"): the oldest segment is sealed, none of
//! its records is pending (a relay that is behind reads them next: copying
//! them would only write them twice), some are not acknowledged, the log
//! takes more than twice the bytes of its live frames plus two segments or
//! spans more than [`CROWDED_SEGMENTS`] segments, and copying pays: a run of
//! the oldest segments frees at least twice what copying its live frames
//! costs ([`Table::copying_pays`]). So relocation writes at most one byte per
//! two it frees, and the log shrinks when a run is carried forward.

use std::path::Path;
use std::sync::Arc;

use super::{ClaimRun, ClaimedFrame, SegmentSlots, SlotRef, Table};
use crate::format::frame::FRAME_HEADER_LEN;
use crate::format::relocated::{Carried, CarriedState};
use crate::format::segment::{BLOCK, align_up};
use crate::format::seq::Seq;
use crate::io::StorageFile;

/// A record to carry forward: where its frame lies now, and its state.
#[derive(Clone, Debug)]
pub(crate) struct Straggler {
    /// The record's own number.
    pub seq: Seq,
    /// The number of the frame it lies in (its own, or an earlier copy's).
    pub at: Seq,
    pub offset: u32,
    pub len: u32,
    /// Its delivery state when the writer took it.
    pub carried: Carried,
}

/// Segments on disk above which the oldest segment's records are carried
/// forward, where copying pays, even when the log's bytes are within twice
/// its live bytes plus two segments: small segments (a quiet outbox rotating
/// by age writes a few blocks each) behind one dead letter would otherwise
/// pile up by the thousand before their bytes passed that bound, each a file
/// to open and list.
pub(crate) const CROWDED_SEGMENTS: usize = 64;

/// Records to carry forward out of the oldest segment.
pub(crate) struct Relocation {
    pub path: Arc<Path>,
    pub salt: u32,
    pub file: Option<Arc<dyn StorageFile>>,
    pub stragglers: Vec<Straggler>,
}

impl Table {
    /// The number a claim hands out for slot `i` of segment `si`: the slot's
    /// own, or the record's it carries.
    pub(super) fn seq_at(&self, si: usize, i: usize) -> u64 {
        let n = self.segments[si].first() + i as u64;
        if self.origin.is_empty() {
            return n;
        }
        self.origin.get(&n).copied().unwrap_or(n)
    }

    /// Where the record `seq` can be read, for the age statistics.
    pub(super) fn slot_ref(&self, seq: u64) -> Option<SlotRef> {
        let (si, i) = self.slot(Seq::from(seq)).ok()??;
        let seg = &self.segments[si];
        Some(SlotRef {
            seq: Seq::from(seq),
            path: seg.path.clone(),
            file: seg.file.clone(),
            offset: seg.offsets[i],
        })
    }

    /// Claims pending relocated records, oldest first, into `runs`. Returns
    /// whether the byte limit stopped it.
    pub(super) fn claim_moved(
        &mut self,
        runs: &mut Vec<ClaimRun>,
        taken: &mut usize,
        bytes: &mut u64,
        max_records: usize,
        max_bytes: u64,
    ) -> bool {
        while *taken < max_records {
            let Some(&own) = self.moved_pending.first() else {
                return false;
            };
            let Ok(Some((si, i))) = self.slot(Seq::from(own)) else {
                // Cannot happen: a pending relocated record has a slot.
                self.moved_pending.remove(&own);
                continue;
            };
            let seg = &mut self.segments[si];
            let (offset, len) = seg.frame_range(i);
            let payload = u64::from(len) - FRAME_HEADER_LEN as u64;
            if *taken > 0 && *bytes + payload > max_bytes {
                return true;
            }
            self.moved_pending.remove(&own);
            SegmentSlots::set(&mut seg.claimed, i, true);
            seg.claimed_count += 1;
            *taken += 1;
            *bytes += payload;
            runs.push(ClaimRun {
                path: seg.path.clone(),
                salt: seg.salt,
                file: seg.file.clone(),
                claim: 0,
                frames: vec![ClaimedFrame {
                    seq: Seq::from(own),
                    at: Seq::from(seg.first() + i as u64),
                    offset,
                    len,
                    attempt: 1,
                    reason: None,
                }],
            });
        }
        false
    }

    /// Where the records of `frames` lie now, one run each (in order), for a
    /// reader whose segment was deleted after they were claimed: relocation
    /// carried them forward meanwhile. A record no longer in the log is left
    /// out.
    pub(crate) fn runs_of(&self, frames: &[ClaimedFrame]) -> Vec<ClaimRun> {
        frames
            .iter()
            .filter_map(|f| {
                let (si, i) = self.slot(f.seq).ok()??;
                let seg = &self.segments[si];
                let (offset, len) = seg.frame_range(i);
                Some(ClaimRun {
                    path: seg.path.clone(),
                    salt: seg.salt,
                    file: seg.file.clone(),
                    claim: 0,
                    frames: vec![ClaimedFrame {
                        at: Seq::from(seg.first() + i as u64),
                        offset,
                        len,
                        ..f.clone()
                    }],
                })
            })
            .collect()
    }

    /// The records to carry forward out of the oldest segment, at most
    /// `max_bytes` of frames (but at least one), if the rule in the module
    /// documentation says so; `segment_bytes` is the option. `now` is the
    /// outbox's monotonic clock and `now_wall_us` the wall clock, to turn a
    /// delay's end into a wall-clock time for the log.
    pub(crate) fn stragglers(
        &self,
        segment_bytes: u64,
        max_bytes: u64,
        now: u64,
        now_wall_us: u64,
    ) -> Option<Relocation> {
        let front = self.segments.front()?;
        if self.segments.len() < 2 || !front.sealed || front.is_finished() {
            return None;
        }
        if front.pending_count() > 0 {
            return None;
        }
        let disk: u64 = self.segments.iter().map(|s| u64::from(s.end)).sum();
        let live = self.backlog_bytes + FRAME_HEADER_LEN as u64 * (self.pending + self.claimed);
        if disk <= 2 * live + 2 * segment_bytes && self.segments.len() <= CROWDED_SEGMENTS {
            return None;
        }
        if !self.copying_pays(disk) {
            return None;
        }
        let mut stragglers = Vec::new();
        let mut bytes = 0u64;
        for i in 0..front.offsets.len() {
            if SegmentSlots::bit(&front.done, i) {
                continue;
            }
            let at = front.first() + i as u64;
            let own = self.origin.get(&at).copied().unwrap_or(at);
            let (offset, len) = front.frame_range(i);
            if !stragglers.is_empty() && bytes + u64::from(len) > max_bytes {
                break;
            }
            bytes += u64::from(len);
            stragglers.push(Straggler {
                seq: Seq::from(own),
                at: Seq::from(at),
                offset,
                len,
                carried: self.carried(own, now, now_wall_us),
            });
        }
        Some(Relocation {
            path: front.path.clone(),
            salt: front.salt,
            file: front.file.clone(),
            stragglers,
        })
    }

    /// Whether carrying the oldest segment's live frames forward pays: some
    /// run of the oldest segments, each sealed with no record pending,
    /// frees at least twice what copying its live frames costs. A segment's
    /// cost is its live frames rounded up to a block, plus two blocks (the
    /// log start frame that precedes its deletion, and the copies' own
    /// block); it frees its whole length, and a fully acknowledged segment
    /// inside the run frees its length at no cost, as it goes with the
    /// segments before it.
    ///
    /// The run ends at the first point where it pays. So every shorter run
    /// does not pay, and once the oldest segment's copies are made the rest
    /// of the run still pays on its own: the steps that carry the run
    /// forward, one oldest segment after another, write at most one byte per
    /// two they free, and the log shrinks when the run is done. Without the
    /// rule segments a few blocks long would pass their copies from segment
    /// to segment for ever; with the run counted, and not the oldest segment
    /// alone, a small segment (a quiet outbox rotating by age) holding one
    /// dead letter does not keep every later segment on disk. `disk`: the
    /// bytes of every segment, beyond which no run frees anything. A pass
    /// over the segments, each segment's live bytes kept up to date as its
    /// frames are done (`SegmentSlots::live_bytes`).
    fn copying_pays(&self, disk: u64) -> bool {
        let (mut cost, mut frees) = (0u64, 0u64);
        for seg in self.segments.iter() {
            // No run frees more than the whole log.
            if 2 * cost > disk {
                return false;
            }
            if !seg.sealed {
                return false;
            }
            if !seg.is_finished() {
                if seg.pending_count() > 0 {
                    return false;
                }
                cost += align_up(seg.live_bytes) + 2 * BLOCK as u64;
            }
            frees += u64::from(seg.end);
            if 2 * cost <= frees {
                return true;
            }
        }
        false
    }

    /// The delivery state of the live record `own`, as a relocated frame
    /// carries it.
    fn carried(&self, own: u64, now: u64, now_wall_us: u64) -> Carried {
        if let Some(dead) = self.dead.get(&own) {
            return Carried {
                attempts: dead.attempts,
                state: CarriedState::Dead {
                    since_us: dead.since_us,
                },
                reason: Some(dead.reason.to_string()),
            };
        }
        // Delayed only by a release: a record waiting for its own not-before
        // time is carried as pending, and its copy's not-before field holds
        // it back again at an open.
        let state = match self.due.get(&own) {
            Some(&due) if self.released.contains_key(&own) => CarriedState::Delayed {
                not_before_us: now_wall_us.saturating_add(due.saturating_sub(now)),
            },
            _ => CarriedState::Pending,
        };
        Carried {
            attempts: self.leases.delivered(own),
            state,
            reason: self.reasons.get(&own).map(|r| r.to_string()),
        }
    }

    /// The relocated frames `moves` (each the record's number and the number
    /// of its new frame, Internal until now) are durable: each record's state
    /// moves from its old slot to the new one, and the old slot becomes Done.
    /// A record acknowledged meanwhile stays done; its new frame stays an
    /// internal frame. Returns whether the oldest segment became deletable.
    pub(crate) fn moved_in(&mut self, moves: &[(Seq, Seq)]) -> bool {
        for &(own, at) in moves {
            let Ok(Some((from_si, from_i))) = self.slot(own) else {
                continue;
            };
            if SegmentSlots::bit(&self.segments[from_si].done, from_i) {
                continue;
            }
            let Some(to_si) = self.locate(at.get()) else {
                continue;
            };
            let to_i = (at.get() - self.segments[to_si].first()) as usize;
            let claimed = SegmentSlots::bit(&self.segments[from_si].claimed, from_i);
            // The copy counts as much as the frame it replaces.
            let extra = self.extra_over(to_si, to_i, from_si, from_i);
            self.vacate(from_si, from_i);
            self.occupy(to_si, to_i, own.get(), claimed, extra);
            self.relocated += 1;
        }
        self.segments.front().is_some_and(|s| s.is_finished())
    }

    /// At open: the log carried the record `own` forward into the frame `at`
    /// (an internal slot so far), with the state `carried`; replayed in log
    /// order like the other changes. `now` and `now_wall_us` place a delay on
    /// the monotonic clock.
    pub(crate) fn relocated_recovered(
        &mut self,
        own: Seq,
        at: Seq,
        carried: &Carried,
        now: u64,
        now_wall_us: u64,
    ) {
        let Some(to_si) = self.locate(at.get()) else {
            return;
        };
        let to_i = (at.get() - self.segments[to_si].first()) as usize;
        let extra = match self.slot(own) {
            // Its old place is still in the log (a crash before the old
            // segment was deleted, or an earlier copy): it moves out of it.
            Ok(Some((si, i))) => {
                if SegmentSlots::bit(&self.segments[si].done, i) {
                    // Done before it was copied: cannot be, unless the log
                    // was repaired; the copy stays an internal frame.
                    return;
                }
                self.forget_state(own.get());
                let extra = self.extra_over(to_si, to_i, si, i);
                self.vacate(si, i);
                extra
            }
            // Its old segment was deleted after the copy was durable: the
            // copy counts but for what relocation added to it.
            Ok(None) => crate::format::relocated::added_len(carried),
            Err(_) => return,
        };
        self.occupy(to_si, to_i, own.get(), false, extra);
        let own = own.get();
        self.leases.set_exact(own, carried.attempts);
        match carried.state {
            CarriedState::Pending => {
                if let Some(reason) = &carried.reason {
                    self.reasons.insert(own, reason.as_str().into());
                }
            }
            CarriedState::Delayed { not_before_us } => {
                if let Some(reason) = &carried.reason {
                    self.reasons.insert(own, reason.as_str().into());
                }
                let wait = not_before_us.saturating_sub(now_wall_us);
                if wait > 0 {
                    self.claim_slot(to_si, to_i);
                    let due = now.saturating_add(wait);
                    self.delayed.insert((due, own));
                    self.due.insert(own, due);
                    self.released.insert(own, ());
                }
            }
            CarriedState::Dead { since_us } => {
                self.leases.done(own);
                self.claim_slot(to_si, to_i);
                self.dead.insert(
                    own,
                    super::DeadEntry {
                        attempts: carried.attempts,
                        reason: carried.reason.as_deref().unwrap_or("").into(),
                        since_us,
                    },
                );
            }
        }
    }

    /// Drops what the table keeps of `own`'s delivery state beside its slot
    /// (at open, before a relocated frame sets it afresh).
    fn forget_state(&mut self, own: u64) {
        if let Some(due) = self.due.remove(&own) {
            self.delayed.remove(&(due, own));
            self.released.remove(&own);
        }
        self.dead.remove(&own);
        self.reasons.remove(&own);
    }

    /// Marks the record slot `i` of segment `si` Done because its record now
    /// lies elsewhere: its counts go with it, its state maps stay.
    /// What the frame `(to_si, to_i)`, a copy of the record in
    /// `(from_si, from_i)`, holds beyond the bytes the backlog counts of that
    /// record.
    fn extra_over(&self, to_si: usize, to_i: usize, from_si: usize, from_i: usize) -> u32 {
        let header = FRAME_HEADER_LEN as u32;
        let (_, to_len) = self.segments[to_si].frame_range(to_i);
        let (_, from_len) = self.segments[from_si].frame_range(from_i);
        let from_at = self.segments[from_si].first() + from_i as u64;
        let from_extra = self.copy_extra.get(&from_at).copied().unwrap_or(0);
        let counted_from = from_len.saturating_sub(header + from_extra);
        to_len.saturating_sub(header).saturating_sub(counted_from)
    }

    fn vacate(&mut self, si: usize, i: usize) {
        let n = self.segments[si].first() + i as u64;
        if let Some(own) = self.origin.remove(&n) {
            self.moved.remove(&own);
            self.moved_pending.remove(&own);
        }
        let seg = &mut self.segments[si];
        let (_, len) = seg.frame_range(i);
        if SegmentSlots::bit(&seg.claimed, i) {
            SegmentSlots::set(&mut seg.claimed, i, false);
            seg.claimed_count -= 1;
            self.claimed -= 1;
        } else {
            self.pending -= 1;
        }
        SegmentSlots::set(&mut seg.done, i, true);
        seg.done_count += 1;
        seg.live_bytes -= u64::from(len);
        self.backlog_bytes -= self.counted(n, len);
    }

    /// Makes the internal slot `i` of segment `si` (a relocated frame) hold
    /// the record `own`, claimed or pending.
    fn occupy(&mut self, si: usize, i: usize, own: u64, claimed: bool, extra: u32) {
        let at = self.segments[si].first() + i as u64;
        let seg = &mut self.segments[si];
        let (_, len) = seg.frame_range(i);
        SegmentSlots::set(&mut seg.done, i, false);
        seg.done_count -= 1;
        seg.live_bytes += u64::from(len);
        SegmentSlots::set(&mut seg.claimed, i, claimed);
        if claimed {
            seg.claimed_count += 1;
            self.claimed += 1;
        } else {
            self.pending += 1;
            self.moved_pending.insert(own);
        }
        let extra = extra.min(len.saturating_sub(FRAME_HEADER_LEN as u32));
        if extra > 0 {
            self.copy_extra.insert(at, extra);
        }
        self.backlog_bytes += u64::from(len) - FRAME_HEADER_LEN as u64 - u64::from(extra);
        self.moved.insert(own, at);
        self.origin.insert(at, own);
        if cfg!(debug_assertions) {
            seg.check_invariants();
        }
    }
}
