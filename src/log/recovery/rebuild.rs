//! The state table rebuilt from what recovery kept: the segments' frames, then
//! the delivery state the log recorded, replayed in log order. The one place
//! this is done: an open builds the table the outbox runs on from it, and the
//! read-only commands (`verify`, `inspect`, `dump --state`) the table they
//! count and look records up in, so that both see the same states.

use std::sync::Arc;

use super::RecoveredSegment;
use super::plan::Keep;
use super::scan::SegmentScan;
use super::state::{Kept, Recorded};
use crate::format::fields::DedupDigest;
use crate::format::frame;
use crate::format::segment::FRAMES_AT;
use crate::format::seq::Seq;
use crate::state::table::{SegmentSlots, Table};

/// A deduplication id the log keeps: its record, the frame that keeps it
/// (its home), its digest and its record's time (µs since the Unix epoch).
pub(crate) type KeptId = (Seq, Seq, DedupDigest, u64);

/// The segments a plan keeps, with the frames it keeps of each: what
/// [`recorded_state`](super::state::recorded_state) reads.
pub(crate) fn kept<'a>(
    scans: &'a [SegmentScan],
    keep: &'a [Keep],
) -> impl Iterator<Item = Kept<'a>> {
    keep.iter().map(|k| {
        let s = &scans[k.scan];
        Kept {
            path: &s.path,
            salt: s.header.map_or(0, |h| frame::salt(s.id, h.nonce)),
            first_seq: s.id.first_seq(),
            frames: &s.frames,
            from: 0,
            kept: k.frames.min(s.frames.len()),
        }
    })
}

/// The frames a lossy repair drops, as [`recorded_state`](super::state::recorded_state)
/// reads them: those of the damaged segment `damaged` (an index into
/// `scans`) from where the plan cuts it, and every frame of each segment
/// after it.
pub(crate) fn dropped<'a>(
    scans: &'a [SegmentScan],
    keep: &'a [Keep],
    damaged: usize,
) -> impl Iterator<Item = Kept<'a>> {
    scans.iter().enumerate().skip(damaged).map(move |(k, s)| {
        let from = keep
            .iter()
            .find(|kept| kept.scan == k)
            .map_or(0, |kept| kept.frames);
        Kept {
            path: &s.path,
            salt: s.header.map_or(0, |h| frame::salt(s.id, h.nonce)),
            first_seq: s.id.first_seq(),
            frames: &s.frames,
            from,
            kept: s.frames.len(),
        }
    })
}

/// The records a lossy repair drops below the numbers it reports: each
/// record carried forward (relocated) out of a segment deleted before, whose
/// copies all lie in what is dropped (`copies`: the own numbers its
/// relocated frames name), is gone with them; its own number lies below the
/// log's start (`log_start`), so no range of what is dropped names it. Not
/// those with a copy or an acknowledgement in what is kept (`kept`, the
/// state the kept frames record), nor those acknowledged in what is dropped
/// (`dropped`, the state the dropped frames record, of which only the
/// acknowledgements count): a record delivered and acknowledged is not lost
/// with its copy. In order.
pub(crate) fn relocated_dropped(
    copies: impl IntoIterator<Item = Seq>,
    kept: &[Recorded],
    dropped: &[Recorded],
    log_start: Seq,
) -> Vec<Seq> {
    let acked = |seq: Seq, r: &Recorded| matches!(r, Recorded::Acks(first, last) if (*first..=*last).contains(&seq));
    let safe = |seq: Seq| {
        kept.iter().any(|r| match r {
            Recorded::Relocated { seq: own, .. } => *own == seq,
            r => acked(seq, r),
        }) || dropped.iter().any(|r| acked(seq, r))
    };
    let mut out: Vec<Seq> = copies
        .into_iter()
        .filter(|&seq| seq < log_start && !safe(seq))
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}

/// What the dropped frames (`dropped`, and `more_changed`, the records the
/// changes read past the damage name) record of the records a lossy repair
/// keeps: those numbered from `log_start` to below `first` (the first number
/// dropped), and those carried forward out of segments deleted before whose
/// copies are kept (`kept`, the state the kept frames record). Returns how
/// many of them they acknowledge (a discard of a dead letter is written as
/// an acknowledgement), and how many they change otherwise (a dead letter, a
/// release, a requeue; attempts aside). Ranges are merged before they are
/// counted, so a record acknowledged twice counts once.
pub(crate) fn kept_state_dropped(
    dropped: &[Recorded],
    more_changed: Vec<Seq>,
    kept: &[Recorded],
    log_start: Seq,
    first: Seq,
) -> (u64, u64) {
    use crate::format::delivery::Change;
    let own_range = log_start.get()..first.get();
    let carried: std::collections::BTreeSet<u64> = kept
        .iter()
        .filter_map(|r| match r {
            Recorded::Relocated { seq, .. } if !own_range.contains(&seq.get()) => Some(seq.get()),
            _ => None,
        })
        .collect();
    let is_kept = |seq: u64| own_range.contains(&seq) || carried.contains(&seq);
    let mut changed: std::collections::BTreeSet<u64> = more_changed
        .into_iter()
        .map(Seq::get)
        .filter(|&s| is_kept(s))
        .collect();
    let mut ranges: Vec<(u64, u64)> = Vec::new();
    for r in dropped {
        match r {
            Recorded::Acks(a, b) => ranges.push((a.get(), b.get())),
            Recorded::Change(Change::Attempts { .. }, _) => {}
            Recorded::Change(change, _) if is_kept(change.seq().get()) => {
                changed.insert(change.seq().get());
            }
            _ => {}
        }
    }
    ranges.sort_unstable();
    let mut merged: Vec<(u64, u64)> = Vec::with_capacity(ranges.len());
    for (a, b) in ranges {
        match merged.last_mut() {
            Some(last) if a <= last.1.saturating_add(1) => last.1 = last.1.max(b),
            _ => merged.push((a, b)),
        }
    }
    let mut acks = 0u64;
    for &(a, b) in &merged {
        let from = a.max(own_range.start);
        let to = b.saturating_add(1).min(own_range.end);
        acks = acks.saturating_add(to.saturating_sub(from));
    }
    let carried_acked = carried
        .iter()
        .filter(|&&seq| {
            let at = merged.partition_point(|&(a, _)| a <= seq);
            at.checked_sub(1)
                .and_then(|k| merged.get(k))
                .is_some_and(|&(_, b)| b >= seq)
        })
        .count() as u64;
    (acks.saturating_add(carried_acked), changed.len() as u64)
}

/// The segments a plan keeps as an open would leave them (without the seal
/// an open would add to the newest), taking their frames out of `scans`: for
/// a check that changes nothing on disk.
pub(crate) fn kept_segments(scans: &mut [SegmentScan], keep: &[Keep]) -> Vec<RecoveredSegment> {
    keep.iter()
        .filter_map(|k| {
            let s = scans.get_mut(k.scan)?;
            let mut frames = std::mem::take(&mut s.frames);
            frames.truncate(k.frames);
            Some(RecoveredSegment {
                id: s.id,
                path: Arc::from(s.path.as_path()),
                salt: s.header.map_or(0, |h| frame::salt(s.id, h.nonce)),
                frames,
            })
        })
        .collect()
}

/// The state table of `segments` (oldest first, as recovery keeps them) once
/// `recorded` is replayed into it, and the deduplication ids the log keeps.
///
/// Acknowledged records are done, delayed ones wait, dead letters stay, and
/// what producers said of the records (keys, not-before times) is applied
/// last, in sequence order. `now` (the outbox's monotonic clock) and
/// `now_wall_us` (the wall clock) place a delay's end on the monotonic clock;
/// a caller with no monotonic clock of its own passes the wall clock twice,
/// and delays then end at their wall-clock times.
pub(crate) fn rebuild(
    segments: impl IntoIterator<Item = RecoveredSegment>,
    recorded: &[Recorded],
    now: u64,
    now_wall_us: u64,
) -> (Table, Vec<KeptId>) {
    let mut table = Table::new();
    for seg in segments {
        let frames_at = FRAMES_AT as u32;
        table.push_segment(SegmentSlots::new(
            seg.id, seg.path, None, seg.salt, frames_at,
        ));
        table.push_frames_owned(seg.id, seg.id.first_seq(), seg.frames);
        table.seal_last(seg.id);
    }
    // What producers said of the records (keys, not-before times, ids),
    // applied once the rest is replayed, in sequence order; and the
    // deduplication ids, with their records' times and the frames that
    // keep them.
    let mut described = Vec::new();
    let mut ids = Vec::new();
    for r in recorded {
        match r {
            Recorded::Acks(first, last) => table.ack_recovered(*first, *last),
            Recorded::Change(change, at) => table.replay(change, *at, now, now_wall_us),
            Recorded::Relocated {
                seq,
                at,
                carried,
                described: d,
                stamped_us,
            } => {
                table.relocated_recovered(*seq, *at, carried, now, now_wall_us);
                if let Some(d) = d {
                    described.push(d);
                    if let Some(id) = d.dedup {
                        ids.push((*seq, *at, id, *stamped_us));
                    }
                }
            }
            Recorded::Fields {
                described: ds,
                at,
                stamped_us,
            } => {
                for d in ds {
                    described.push(d);
                    if let Some(id) = d.dedup {
                        ids.push((d.seq, *at, id, *stamped_us));
                    }
                }
            }
            Recorded::Tombstones { stones, at } => {
                for t in stones {
                    ids.push((t.seq, *at, t.dedup, t.appended_us));
                }
            }
        }
    }
    // A record described twice (its batch's fields frame, then a relocated
    // copy) keeps the later word. The fields frames come in sequence order
    // but for relocated copies: only then is the list sorted (it holds
    // references, a tenth of the descriptions' size, as a log of a million
    // keyed records holds a million of them).
    if !described.is_sorted_by(|a, b| a.seq < b.seq) {
        described.reverse();
        described.sort_by_key(|d| d.seq);
        described.dedup_by_key(|d| d.seq);
    }
    table.reserve_keys(&described);
    table.apply_fields(described, now, now_wall_us);
    table.keep_released_turns();
    (table, ids)
}

/// The distinct records whose frames lie in `segments`: every record frame,
/// and the records only a relocated copy still holds (their own seq below the
/// oldest segment: the segment they were appended to is deleted, as recovery
/// places them). A record present both in its place and as a copy counts once.
pub(crate) fn records_on_disk(segments: &[RecoveredSegment], recorded: &[Recorded]) -> u64 {
    let in_place: usize = segments
        .iter()
        .map(|s| s.frames.iter().filter(|f| f.is_record()).count())
        .sum();
    let oldest = segments.first().map_or(0, |s| s.id.first_seq().get());
    let mut copies: Vec<u64> = recorded
        .iter()
        .filter_map(|r| match r {
            Recorded::Relocated { seq, .. } if seq.get() < oldest => Some(seq.get()),
            _ => None,
        })
        .collect();
    copies.sort_unstable();
    copies.dedup();
    (in_place + copies.len()) as u64
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use super::*;
    use crate::format::frame::FrameSpan;
    use crate::format::relocated::{Carried, CarriedState};
    use crate::format::seq::SegmentId;

    fn segment(first: u64, records: u32) -> RecoveredSegment {
        let frames = (0..records)
            .map(|i| FrameSpan::new(FRAMES_AT as u32 + i * 100, 100, true))
            .collect();
        RecoveredSegment {
            id: SegmentId(first),
            path: Arc::from(Path::new("segment")),
            salt: 0,
            frames,
        }
    }

    fn copy(seq: u64, at: u64) -> Recorded {
        Recorded::Relocated {
            seq: Seq::from(seq),
            at: Seq::from(at),
            carried: Carried {
                attempts: 0,
                state: CarriedState::Pending,
                reason: None,
            },
            described: None,
            stamped_us: 0,
        }
    }

    #[test]
    fn acknowledged_records_are_done() {
        let recorded = vec![Recorded::Acks(Seq::from(10), Seq::from(12))];
        let (table, ids) = rebuild(vec![segment(10, 5)], &recorded, 0, 0);
        assert_eq!(table.pending(), 2);
        assert!(ids.is_empty());
    }

    #[test]
    fn a_record_only_a_copy_holds_counts_once_and_one_in_its_place_not_again() {
        let segs = vec![segment(10, 5)];
        assert_eq!(records_on_disk(&segs, &[]), 5);
        // Seq 3's segment is gone: two copies of it (relocated twice) are
        // one record; seq 11 is still in its place.
        let recorded = vec![copy(3, 12), copy(3, 14), copy(11, 13)];
        assert_eq!(records_on_disk(&segs, &recorded), 6);
    }

    #[test]
    fn a_repair_names_the_carried_records_it_drops_and_nothing_kept() {
        // Copies of 3, 5, 7, 9, 11, 13 (3 twice) and of 30 dropped; the log
        // now starts at 20. 5 has a copy in what is kept, 7 an
        // acknowledgement; 11 is acknowledged in what is dropped, whereas
        // 13's other copy there does not keep it; 30 lies in a kept segment
        // of its own.
        let kept = vec![copy(5, 21), Recorded::Acks(Seq::from(6), Seq::from(8))];
        let in_dropped = vec![Recorded::Acks(Seq::from(10), Seq::from(11)), copy(13, 40)];
        let copies = [3, 9, 5, 7, 3, 30, 11, 13].map(Seq::from);
        assert_eq!(
            relocated_dropped(copies, &kept, &in_dropped, Seq::from(20)),
            vec![Seq::from(3), Seq::from(9), Seq::from(13)]
        );
        assert!(relocated_dropped([], &kept, &in_dropped, Seq::from(20)).is_empty());
    }

    #[test]
    fn a_repair_reads_the_damaged_segment_from_its_cut_and_every_later_one_whole() {
        let scan = |first: u64, frames: u32| {
            let mut s = SegmentScan::empty(SegmentId(first), PathBuf::from("s"), 0);
            s.frames = (0..frames)
                .map(|i| FrameSpan::new(FRAMES_AT as u32 + i * 100, 100, i % 2 == 0))
                .collect();
            s
        };
        let scans = vec![scan(1, 10), scan(11, 10), scan(21, 6), scan(27, 4)];
        let keep = vec![
            Keep {
                scan: 0,
                frames: 10,
                cut: None,
            },
            Keep {
                scan: 1,
                frames: 4,
                cut: Some(4096 + 400),
            },
        ];
        let read: Vec<(Seq, usize, usize)> = dropped(&scans, &keep, 1)
            .map(|k| (k.first_seq, k.from, k.kept))
            .collect();
        assert_eq!(
            read,
            vec![
                (Seq::from(11), 4, 10),
                (Seq::from(21), 0, 6),
                (Seq::from(27), 0, 4)
            ]
        );
    }

    /// What a repair drops of the delivery state of the records it keeps:
    /// acknowledgements counted once however their ranges overlap, only
    /// those of records kept (its own numbers from the log's start to the
    /// first dropped, and the records whose relocated copies are kept), and
    /// the other changes by record, attempts aside.
    #[test]
    fn the_delivery_state_a_repair_drops_counts_each_kept_record_once() {
        use crate::format::delivery::Change;
        let s = Seq::from;
        let release = |seq: u64| {
            Recorded::Change(
                Change::Release {
                    seq: s(seq),
                    not_before_us: 5,
                    reason: "".into(),
                },
                0,
            )
        };
        let dropped = vec![
            // 5 and 8..=12 below the log's start (of which 7 is carried),
            // 20..=24 kept, 30.. dropped.
            Recorded::Acks(s(5), s(12)),
            Recorded::Acks(s(20), s(22)),
            Recorded::Acks(s(21), s(24)),
            Recorded::Acks(s(29), s(40)),
            release(21),
            release(21),
            release(7),
            release(6),
            release(35),
            Recorded::Change(
                Change::Attempts {
                    seq: s(23),
                    attempts: 2,
                },
                0,
            ),
        ];
        let kept = vec![copy(7, 25), copy(6, 26)];
        let (acks, changes) = kept_state_dropped(&dropped, vec![s(22), s(3)], &kept, s(20), s(30));
        // 20..=29 own (20 to 24 and 29 acknowledged), 6 and 7 carried.
        assert_eq!(acks, 5 + 1 + 2);
        // 21, 7, 6 and 22 (read past the damage); not 35 nor 3.
        assert_eq!(changes, 4);
    }
}
