//! The deduplication ids remembered (docs/GUARANTEES.md, section 10): owned by the
//! writer, which alone decides whether an append is new, one batch at a time
//! under its lock, so that two producers racing with one id get one record and
//! one duplicate answer.
//!
//! Ids are known by digest (`format::hash`, keyed by the outbox's identity),
//! with the digest of the payload first appended with them. Entries are kept
//! in a ring, in sequence order (appends come in order, recovery sorts), with
//! an open-addressing index of ring positions beside it: 32 bytes an entry
//! (the ring grows by a quarter at a time) and 4 bytes an index slot (a
//! quarter to a half of the slots used), so 40 to 56 bytes per id, about 47
//! at a million (docs/BENCHMARKS.md). An
//! entry goes when it leaves the window or when `capacity` newer ones are
//! kept, oldest first.
//!
//! An entry's *home* is the frame that makes it durable: the fields frame of
//! its record's batch, or the latest tombstones frame that carried it. Before
//! segments are deleted, the writer carries every entry whose home is in them
//! into a new tombstones frame ([`Dedup::carry`]), so that an id stays known
//! for its whole window after its record was acknowledged and deleted.

use std::collections::VecDeque;

use crate::format::fields::{DedupDigest, Tombstone};
use crate::format::seq::Seq;

/// An index slot that holds no entry.
const EMPTY: u32 = u32::MAX;
/// The home delta of an entry forgotten in place (superseded).
const GONE: u32 = u32::MAX;
/// The home delta of an entry whose home is too far past its record to
/// say: it is carried at every deletion (safe, only wasteful).
const FAR: u32 = u32::MAX - 1;
/// Time is kept in sixteenths of a second since `base_us`.
const TICK_US: u64 = 62_500;
/// A day, by which `base_us` lies before the oldest time a window keeps.
const DAY_US: u64 = 86_400_000_000;
/// Ticks from `base_us` past which the wall clock moves the base (about
/// 4.25 years: a clock stepped forward, or an outbox open that long).
const REBASE_TICKS: u64 = (u32::MAX / 2) as u64;

#[derive(Clone, Copy)]
struct Entry {
    id: u64,
    content: u64,
    seq: u64,
    /// `home - seq`, or [`GONE`] or [`FAR`].
    home_delta: u32,
    /// When the record was appended, in ticks since `base_us`.
    at: u32,
}

/// What an append with a deduplication id meets.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Seen {
    /// Nothing within the window: a new record.
    New,
    /// The same id and payload: a duplicate of this record.
    Duplicate(Seq),
    /// The same id, another payload.
    Conflict(Seq),
}

/// The ids remembered.
pub(crate) struct Dedup {
    window_us: u64,
    capacity: usize,
    base_us: u64,
    ring: VecDeque<Entry>,
    /// Absolute position of `ring[0]` (wrapping, as the index stores it).
    front: u32,
    slots: Vec<u32>,
    /// Entries in the index (not gone).
    live: usize,
    /// The exact time of each entry at the last tick (`u32::MAX`), which
    /// may be later than the tick says: stamped by a clock far ahead of the
    /// base, or told from a base a step back moved. Empty but for such
    /// steps.
    pinned: std::collections::HashMap<u64, u64>,
}

impl Dedup {
    /// An empty set for a window of `window_us` and at most `capacity` ids;
    /// `now_us` is the wall clock at the open.
    pub(crate) fn new(window_us: u64, capacity: usize, now_us: u64) -> Dedup {
        Dedup {
            window_us,
            capacity,
            // Ticks count from before the oldest entry a window can keep.
            base_us: Self::base_for(window_us, now_us),
            ring: VecDeque::new(),
            pinned: std::collections::HashMap::new(),
            front: 0,
            slots: Vec::new(),
            live: 0,
        }
    }

    /// Ids remembered.
    pub(crate) fn len(&self) -> usize {
        self.live
    }

    /// Heap bytes.
    pub(crate) fn heap_bytes(&self) -> u64 {
        (self.ring.capacity() * size_of::<Entry>()
            + self.slots.capacity() * 4
            + self.pinned.capacity() * 16) as u64
    }

    /// The base of the ticks for a wall clock at `now_us`: a whole number of
    /// ticks since the epoch, so that every open, whatever its clock, counts
    /// ticks on the same grid. A time rounded down to a tick (a tombstone's,
    /// [`Dedup::carry`]) then reads back as the same time at the next open,
    /// instead of losing up to another tick at each restart.
    fn base_for(window_us: u64, now_us: u64) -> u64 {
        let base = now_us.saturating_sub(window_us.saturating_add(DAY_US));
        base - base % TICK_US
    }

    /// Moves `base_us` when the wall clock at `now_us` left what ticks from
    /// it can say: stepped back before the base (new ids would be stamped
    /// at the base, ahead of the clock, and kept for about the step), or
    /// forward past [`REBASE_TICKS`] (they would be stamped at the last
    /// tick, behind the clock, and forgotten at once). Every entry keeps its
    /// time: one before the new base is older than any window, and one past
    /// its last tick stays there with its exact time in `pinned` (an id
    /// appended before a step back is kept longer: docs/GUARANTEES.md,
    /// section 10). Rare: once a step of more than a day, or once in years.
    fn follow_the_clock(&mut self, now_us: u64) {
        let base = Self::base_for(self.window_us, now_us);
        let behind = now_us < self.base_us.saturating_add(self.window_us) && base < self.base_us;
        let ahead = now_us.saturating_sub(self.base_us) / TICK_US > REBASE_TICKS;
        if !(behind || ahead) {
            return;
        }
        let times: Vec<u64> = self.ring.iter().map(|e| self.time_of(e)).collect();
        self.base_us = base;
        for (k, at) in times.into_iter().enumerate() {
            let ticks = self.ticks(at);
            let e = &mut self.ring[k];
            e.at = ticks;
            if ticks == u32::MAX {
                self.pinned.insert(e.seq, at);
            } else {
                self.pinned.remove(&e.seq);
            }
        }
    }

    fn ticks(&self, us: u64) -> u32 {
        u32::try_from(us.saturating_sub(self.base_us) / TICK_US).unwrap_or(u32::MAX)
    }

    fn us(&self, ticks: u32) -> u64 {
        self.base_us + u64::from(ticks) * TICK_US
    }

    /// When the record of `e` was appended (to the tick; exact for an
    /// entry at the last tick).
    fn time_of(&self, e: &Entry) -> u64 {
        if e.at == u32::MAX {
            self.pinned
                .get(&e.seq)
                .copied()
                .unwrap_or_else(|| self.us(e.at))
        } else {
            self.us(e.at)
        }
    }

    fn expired(&self, e: &Entry, now_us: u64) -> bool {
        // An entry stamped ahead of the clock (the clock stepped back) is
        // young: kept, not dropped.
        now_us.saturating_sub(self.time_of(e)) > self.window_us.saturating_add(TICK_US)
    }

    fn entry(&self, pos: u32) -> Option<&Entry> {
        self.ring.get(pos.wrapping_sub(self.front) as usize)
    }

    fn mask(&self) -> usize {
        self.slots.len() - 1
    }

    /// The index slot holding the entry of `id`, if any.
    fn find(&self, id: u64) -> Option<usize> {
        if self.slots.is_empty() {
            return None;
        }
        let mask = self.mask();
        let mut i = (id as usize) & mask;
        loop {
            let pos = *self.slots.get(i)?;
            if pos == EMPTY {
                return None;
            }
            if self.entry(pos).is_some_and(|e| e.id == id) {
                return Some(i);
            }
            i = (i + 1) & mask;
        }
    }

    /// Empties slot `i` (backward-shift deletion, so probes stay unbroken).
    fn remove_slot(&mut self, mut hole: usize) {
        let mask = self.mask();
        let mut j = hole;
        loop {
            j = (j + 1) & mask;
            let pos = self.slots[j];
            if pos == EMPTY {
                break;
            }
            let ideal = self.entry(pos).map_or(j, |e| (e.id as usize) & mask);
            // Move it into the hole unless its ideal slot lies after the hole.
            if (j.wrapping_sub(ideal) & mask) >= (j.wrapping_sub(hole) & mask) {
                self.slots[hole] = pos;
                hole = j;
            }
        }
        self.slots[hole] = EMPTY;
        self.live -= 1;
    }

    /// Indexes the entry at `pos` (already in the ring, not yet indexed).
    fn insert_slot(&mut self, id: u64, pos: u32) {
        let mask = self.mask();
        let mut i = (id as usize) & mask;
        while self.slots[i] != EMPTY {
            i = (i + 1) & mask;
        }
        self.slots[i] = pos;
        self.live += 1;
    }

    fn grow(&mut self) {
        let len = (self.slots.len() * 2).max(1024);
        self.slots = vec![EMPTY; len];
        self.live = 0;
        let mask = len - 1;
        for (k, e) in self.ring.iter().enumerate() {
            if e.home_delta == GONE {
                continue;
            }
            let mut i = (e.id as usize) & mask;
            while self.slots[i] != EMPTY {
                i = (i + 1) & mask;
            }
            self.slots[i] = self.front.wrapping_add(k as u32);
            self.live += 1;
        }
    }

    /// Drops the oldest entry.
    fn pop_front(&mut self) {
        let Some(e) = self.ring.front().copied() else {
            return;
        };
        if e.home_delta != GONE
            && let Some(i) = self.find(e.id)
            && self.slots[i] == self.front
        {
            self.remove_slot(i);
        }
        if e.at == u32::MAX {
            self.pinned.remove(&e.seq);
        }
        self.ring.pop_front();
        self.front = self.front.wrapping_add(1);
    }

    /// Forgets what left the window by `now_us` and what the capacity cannot
    /// keep; moves the base of the ticks if the wall clock left it behind.
    pub(crate) fn expire(&mut self, now_us: u64) {
        self.follow_the_clock(now_us);
        while let Some(e) = self.ring.front() {
            let over = self.ring.len() > self.capacity;
            if e.home_delta == GONE || over || self.expired(e, now_us) {
                self.pop_front();
            } else {
                break;
            }
        }
    }

    /// What an append of `d` meets at `now_us`.
    pub(crate) fn check(&self, d: DedupDigest, now_us: u64) -> Seen {
        let Some(i) = self.find(d.id) else {
            return Seen::New;
        };
        let Some(e) = self.entry(self.slots[i]) else {
            return Seen::New;
        };
        if self.expired(e, now_us) {
            Seen::New
        } else if e.content == d.content {
            Seen::Duplicate(Seq::from(e.seq))
        } else {
            Seen::Conflict(Seq::from(e.seq))
        }
    }

    /// Remembers `d` for the record `seq`, appended at `appended_us`, made
    /// durable by the frame `home`. `seq` must be above every entry's (in
    /// order); an earlier entry of the id (out of its window) is forgotten.
    pub(crate) fn insert(&mut self, d: DedupDigest, seq: Seq, appended_us: u64, home: Seq) {
        if let Some(i) = self.find(d.id) {
            let pos = self.slots[i];
            self.remove_slot(i);
            let k = pos.wrapping_sub(self.front) as usize;
            if let Some(old) = self.ring.get_mut(k) {
                old.home_delta = GONE;
            }
        }
        let entry = Entry {
            id: d.id,
            content: d.content,
            seq: seq.get(),
            home_delta: delta(seq, home),
            at: self.ticks(appended_us),
        };
        if entry.at == u32::MAX {
            self.pinned.insert(entry.seq, appended_us);
        }
        // Grown before the entry joins the ring: growing indexes the ring.
        if (self.live + 1) * 2 > self.slots.len() {
            self.grow();
        }
        // The ring grows by a quarter at a time, not by doubling: at most a
        // quarter of its memory is unused.
        if self.ring.len() == self.ring.capacity() {
            let more = (self.ring.len() / 4).max(1024);
            self.ring.reserve_exact(more);
        }
        let pos = self.front.wrapping_add(self.ring.len() as u32);
        self.ring.push_back(entry);
        self.insert_slot(d.id, pos);
        while self.ring.len() > self.capacity {
            self.pop_front();
        }
    }

    /// Whether `e` is to be carried before the segments below `log_start`
    /// go: its home lies below it and it is still within the window.
    fn to_carry(&self, e: &Entry, log_start: Seq, now_us: u64) -> bool {
        let home_below = match e.home_delta {
            GONE => false,
            FAR => true,
            d => e.seq + u64::from(d) < log_start.get(),
        };
        home_below && !self.expired(e, now_us)
    }

    /// How many entries [`Dedup::carry`] would take for `log_start` at
    /// `now_us` (the writer weighs a deletion's cost with it).
    pub(crate) fn carry_len(&self, log_start: Seq, now_us: u64) -> usize {
        self.ring
            .iter()
            .take_while(|e| e.seq < log_start.get())
            .filter(|e| self.to_carry(e, log_start, now_us))
            .count()
    }

    /// The wall-clock time (at or after `now_us`) by which at most `keep`
    /// of the entries [`Dedup::carry`] would take for `log_start` are still
    /// within the window.
    pub(crate) fn carry_shrinks_at(&self, log_start: Seq, now_us: u64, keep: usize) -> u64 {
        let carried = self.carry_len(log_start, now_us);
        let Some(go) = carried.checked_sub(keep).filter(|&go| go > 0) else {
            return now_us;
        };
        // The first `go` in the ring have left the window once the latest
        // of them has (the ring is in sequence order; times mostly are).
        let latest = self
            .ring
            .iter()
            .take_while(|e| e.seq < log_start.get())
            .filter(|e| self.to_carry(e, log_start, now_us))
            .take(go)
            .map(|e| self.time_of(e))
            .max()
            .unwrap_or(0);
        let expires = latest
            .saturating_add(self.window_us)
            .saturating_add(TICK_US)
            .saturating_add(1);
        expires.max(now_us)
    }

    /// The entries whose home lies below `log_start` (their frames are about
    /// to be deleted) and that are still within the window at `now_us`, as
    /// tombstones; their home becomes `home`, the frame that will carry them.
    pub(crate) fn carry(&mut self, log_start: Seq, home: Seq, now_us: u64) -> Vec<Tombstone> {
        self.expire(now_us);
        let mut out = Vec::new();
        for k in 0..self.ring.len() {
            let e = self.ring[k];
            if e.seq >= log_start.get() {
                break;
            }
            if self.to_carry(&e, log_start, now_us) {
                out.push(Tombstone {
                    seq: Seq::from(e.seq),
                    appended_us: self.time_of(&e),
                    dedup: DedupDigest {
                        id: e.id,
                        content: e.content,
                    },
                });
                self.ring[k].home_delta = delta(Seq::from(e.seq), home);
            }
        }
        out
    }
}

fn delta(seq: Seq, home: Seq) -> u32 {
    u32::try_from(home.get().saturating_sub(seq.get()))
        .ok()
        .filter(|&d| d < FAR)
        .unwrap_or(FAR)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: u64 = 60_000_000;

    fn d(id: u64, content: u64) -> DedupDigest {
        DedupDigest { id, content }
    }

    #[test]
    fn duplicates_conflicts_and_the_window() {
        let now = 1_000 * MIN;
        let mut s = Dedup::new(10 * MIN, 100, now);
        assert_eq!(s.check(d(1, 5), now), Seen::New);
        s.insert(d(1, 5), Seq::from(10), now, Seq::from(11));
        assert_eq!(s.check(d(1, 5), now + MIN), Seen::Duplicate(Seq::from(10)));
        assert_eq!(s.check(d(1, 6), now + MIN), Seen::Conflict(Seq::from(10)));
        assert_eq!(s.check(d(2, 5), now), Seen::New);
        // Out of the window: new again, and the new record supersedes it.
        assert_eq!(s.check(d(1, 6), now + 11 * MIN), Seen::New);
        s.insert(d(1, 6), Seq::from(20), now + 11 * MIN, Seq::from(21));
        assert_eq!(
            s.check(d(1, 6), now + 11 * MIN),
            Seen::Duplicate(Seq::from(20))
        );
        assert_eq!(s.len(), 1);
        s.expire(now + 11 * MIN);
        assert_eq!(s.ring.len(), 1);
    }

    /// The window runs from each id's own append, whatever the wall clock
    /// did since the open: stepped forward by years (a device whose clock
    /// was set after the open), or back by a year.
    #[test]
    fn an_id_appended_after_a_step_of_the_clock_keeps_its_own_window() {
        const YEAR: u64 = 365 * 24 * 60 * MIN;
        let now = 50 * YEAR;
        for step in [9 * YEAR, 60 * YEAR] {
            let mut s = Dedup::new(MIN, 100, now);
            s.insert(d(1, 1), Seq::from(1), now, Seq::from(2));
            let later = now + step;
            s.expire(later);
            assert_eq!(s.check(d(1, 1), later), Seen::New, "out of its window");
            s.insert(d(2, 2), Seq::from(3), later, Seq::from(4));
            assert_eq!(
                s.check(d(2, 2), later + MIN / 2),
                Seen::Duplicate(Seq::from(3)),
                "{step} µs forward: known within its window"
            );
            let carried = s.carry(Seq::from(10), Seq::from(11), later + MIN / 2);
            assert_eq!(carried.len(), 1);
            assert!(carried[0].appended_us.abs_diff(later) <= TICK_US);
            assert_eq!(s.check(d(2, 2), later + 2 * MIN), Seen::New);
        }
        let mut s = Dedup::new(MIN, 100, now);
        s.insert(d(1, 1), Seq::from(1), now, Seq::from(2));
        let earlier = now - YEAR;
        s.expire(earlier);
        // Appended before the step back: kept longer, as documented.
        assert_eq!(s.check(d(1, 1), earlier), Seen::Duplicate(Seq::from(1)));
        s.insert(d(2, 2), Seq::from(3), earlier, Seq::from(4));
        assert_eq!(s.check(d(2, 2), earlier), Seen::Duplicate(Seq::from(3)));
        // Appended after it: its own window, and its own time carried.
        let carried = s.carry(Seq::from(10), Seq::from(11), earlier);
        let second = carried.iter().find(|t| t.seq == Seq::from(3));
        assert!(second.is_some_and(|t| t.appended_us.abs_diff(earlier) <= TICK_US));
        assert_eq!(s.check(d(2, 2), earlier + 2 * MIN), Seen::New);
        assert_eq!(
            s.check(d(1, 1), earlier + 2 * MIN),
            Seen::Duplicate(Seq::from(1))
        );

        // A step back by more than the ticks can say (a clock reset to 1970
        // or 2000), then put right: an id appended just before is still
        // known for its window.
        for back in [10 * YEAR, 49 * YEAR] {
            let mut s = Dedup::new(MIN, 100, now);
            s.insert(d(1, 1), Seq::from(1), now, Seq::from(2));
            s.expire(now - back);
            // Carried while the clock is wrong: at its own time.
            let carried = s.carry(Seq::from(3), Seq::from(4), now - back);
            assert_eq!(carried.len(), 1);
            assert!(carried[0].appended_us.abs_diff(now) <= TICK_US);
            // Put right in two steps.
            s.expire(now - back / 2);
            s.expire(now + 1_000_000);
            assert_eq!(
                s.check(d(1, 1), now + 1_000_000),
                Seen::Duplicate(Seq::from(1)),
                "{back} µs back, then right"
            );
            assert_eq!(s.carry(Seq::from(10), Seq::from(11), now).len(), 1);
        }
    }

    /// An id carried in a tombstone at every restart (its segment deleted,
    /// the outbox closed and opened again, forty times, each open's clock
    /// on another microsecond) keeps its append time to the tick: its window
    /// does not shrink with the restarts.
    #[test]
    fn a_carried_time_reads_back_the_same_at_every_open() {
        let window = MIN / 3;
        let appended = 30_000_000 * MIN + 12_345;
        let mut at = appended;
        for k in 0..40u64 {
            let now = appended + k * 100_003;
            let mut s = Dedup::new(window, 100, now);
            s.insert(d(1, 1), Seq::from(1), at, Seq::from(2 + k));
            let carried = s.carry(Seq::from(3 + k), Seq::from(3 + k), now);
            assert_eq!(carried.len(), 1, "open {k}: still in its window");
            at = carried[0].appended_us;
            assert!(
                at <= appended && appended - at < TICK_US,
                "open {k}: carried as {at}, appended at {appended}"
            );
        }
        // Known until the end of its window, at the last open as at the first.
        let s = {
            let mut s = Dedup::new(window, 100, appended + window);
            s.insert(d(1, 1), Seq::from(1), at, Seq::from(50));
            s
        };
        assert_eq!(
            s.check(d(1, 1), appended + window),
            Seen::Duplicate(Seq::from(1))
        );
    }

    #[test]
    fn the_oldest_go_first_beyond_capacity_and_colliding_slots_stay_found() {
        let now = 1_000 * MIN;
        let mut s = Dedup::new(10 * MIN, 3000, now);
        // Ids that share their low bits, so that they probe past each other.
        for k in 0..5000u64 {
            s.insert(d(k << 20, k), Seq::from(k + 1), now, Seq::from(k + 2));
        }
        assert_eq!(s.len(), 3000);
        for k in 0..2000u64 {
            assert_eq!(s.check(d(k << 20, k), now), Seen::New, "{k} forgotten");
        }
        for k in 2000..5000u64 {
            assert_eq!(
                s.check(d(k << 20, k), now),
                Seen::Duplicate(Seq::from(k + 1))
            );
        }
        // Under 48 bytes an id, index included.
        assert!(s.heap_bytes() / 3000 < 48 * 2, "{}", s.heap_bytes());
    }

    #[test]
    fn carrying_takes_each_entry_once_per_home() {
        let now = 1_000 * MIN;
        let mut s = Dedup::new(10 * MIN, 100, now);
        s.insert(d(1, 1), Seq::from(5), now, Seq::from(6));
        s.insert(d(2, 2), Seq::from(50), now, Seq::from(51));
        // Segments below 40 go: the entry homed at 6 is carried to 100.
        assert_eq!(s.carry_len(Seq::from(40), now), 1);
        let t = s.carry(Seq::from(40), Seq::from(100), now);
        assert_eq!(t.len(), 1);
        assert_eq!(t[0].seq, Seq::from(5));
        // Below 60: the entry of 50 (home 51) goes; the first is at home 100.
        let t = s.carry(Seq::from(60), Seq::from(120), now);
        assert_eq!(t.iter().map(|t| t.seq.get()).collect::<Vec<_>>(), vec![50]);
        // Below 110: the first one's home (100) goes, it is carried again.
        assert_eq!(s.carry_len(Seq::from(110), now), 1);
        let t = s.carry(Seq::from(110), Seq::from(130), now);
        assert_eq!(t.iter().map(|t| t.seq.get()).collect::<Vec<_>>(), vec![5]);
        // Both are carried for 200 until they leave the window; one of them
        // is kept if one may stay.
        let gone = s.us(s.ticks(now)) + 10 * MIN + TICK_US + 1;
        assert_eq!(s.carry_shrinks_at(Seq::from(200), now, 0), gone);
        assert!(!s.expired(&s.ring[0], gone - 1) && s.expired(&s.ring[0], gone));
        assert_eq!(s.carry_shrinks_at(Seq::from(200), now, 2), now);
        // Out of the window: nothing is carried, and it is forgotten.
        assert_eq!(s.carry_len(Seq::from(200), now + 11 * MIN), 0);
        assert!(
            s.carry(Seq::from(200), Seq::from(300), now + 11 * MIN)
                .is_empty()
        );
        assert_eq!(s.len(), 0);
    }
}
