//! [`Leases`]: how long a claim holds its records, and which delivery of a
//! record a claim is.
//!
//! Every claimed record is held under a lease: a deadline on the outbox's
//! monotonic clock. A record whose lease runs out before it is acknowledged,
//! released or extended goes back to pending by itself, ahead of newer records,
//! and its next delivery is a new attempt. Each delivery of a record has a
//! number, its attempt (1 for the first); a record that came back remembers how
//! many deliveries it had, so the next one is numbered after them.
//!
//! Memory is bounded by what is in flight: an entry per claimed record and one
//! per deadline of a claim that still holds a record (a claim whose records
//! are all acknowledged or returned drops its deadline at once, and one most
//! of whose records are settled lists only those it still holds), and an
//! entry per record that came back and is not yet acknowledged. Without
//! `max_attempts` attempts live in memory only: after a restart every record
//! starts again at attempt 1 (under it, the log holds them: `Change::Attempts`).

use std::collections::{BTreeMap, HashMap};

use std::hash::{BuildHasherDefault, Hasher};

/// A map keyed by sequence numbers. They are the engine's own numbers, never an
/// attacker's choice, so a multiplicative hash spreads them well and costs a
/// fraction of the default keyed one (a claim of 256 records inserts 256 keys,
/// an acknowledgement removes them).
pub(crate) type SeqMap<V> = HashMap<u64, V, BuildHasherDefault<SeqHasher>>;

/// Fibonacci hashing of one `u64`.
#[derive(Default)]
pub(crate) struct SeqHasher(u64);

impl Hasher for SeqHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

/// A lease's deadline that never comes (leases disabled).
pub(crate) const NEVER: u64 = u64::MAX;

/// The records a claim's deadline lists from which it is compacted as they
/// settle ([`Leases::left`]).
const COMPACT_FROM: usize = 8;

/// The leases of the claimed records, and the deliveries of records that came
/// back.
#[derive(Default)]
pub(crate) struct Leases {
    /// Each claimed record: the lease it is held under, and which delivery it is.
    held: SeqMap<Held>,
    /// Deadlines, earliest first, each with the records of its lease.
    deadlines: BTreeMap<(u64, u64), Vec<u64>>,
    /// Each lease in `deadlines`: its deadline, and how many records are
    /// still held under it. A lease whose last record is acknowledged,
    /// released or extended leaves `deadlines` at once, so that what is
    /// kept is bounded by the claims in flight, not by the claims of the
    /// last lease's length.
    live: SeqMap<Live>,
    /// Deliveries made so far of records that came back (released, or their
    /// lease ran out), not yet acknowledged.
    delivered: SeqMap<u32>,
    /// Records whose lease ran out since their last acknowledgement: a late
    /// acknowledgement of that delivery is accepted.
    lapsed: SeqMap<()>,
    next_lease: u64,
    /// Leases that ran out since the outbox was opened (records, not claims).
    pub expired: u64,
}

/// A lease in `deadlines`.
#[derive(Clone, Copy)]
struct Live {
    deadline: u64,
    /// Records still held under it.
    held: u32,
    /// Numbers its entry in `deadlines` lists (the held ones among them).
    listed: u32,
}

/// The claim number of the grant `lease`: never 0, which runs that are no
/// claim's carry.
fn claim_number(lease: u64) -> u32 {
    (lease % u64::from(u32::MAX)) as u32 + 1
}

#[derive(Clone, Copy)]
struct Held {
    lease: u64,
    attempt: u32,
    /// The claim that took it ([`Leases::grant`]'s number, to 32 bits),
    /// kept across renewals: a claim that failed before handing its records
    /// out puts back only those it still holds.
    claim: u32,
    /// Its claim failed reading it, and it was never handed out: held back
    /// until the lease runs out, but no acknowledgement, release, dead
    /// letter or renewal may settle it.
    unread: bool,
}

impl Leases {
    /// The attempt the next delivery of `seq` is.
    fn next_attempt(&self, seq: u64) -> u32 {
        self.delivered
            .get(&seq)
            .copied()
            .unwrap_or(0)
            .saturating_add(1)
    }

    /// Holds the records `seqs`, just claimed, under one lease until
    /// `deadline`; returns each one's attempt, in order.
    pub(crate) fn grant(&mut self, seqs: &[u64], deadline: u64) -> Vec<u32> {
        let lease = self.next_lease;
        self.next_lease += 1;
        let attempts = seqs
            .iter()
            .map(|&seq| {
                let attempt = self.next_attempt(seq);
                let claim = claim_number(lease);
                self.held.insert(
                    seq,
                    Held {
                        lease,
                        attempt,
                        claim,
                        unread: false,
                    },
                );
                attempt
            })
            .collect();
        if deadline != NEVER && !seqs.is_empty() {
            self.deadlines.insert((deadline, lease), seqs.to_vec());
            let n = seqs.len() as u32;
            self.live.insert(
                lease,
                Live {
                    deadline,
                    held: n,
                    listed: n,
                },
            );
        }
        attempts
    }

    /// One record left the lease `lease` (acknowledged, released, extended
    /// under a new one, or run out): the lease's deadline goes with its last.
    /// A claim most of whose records settled keeps only those it still
    /// holds, so that memory follows the records held, not the size of the
    /// claims that hold them (a claim of 512 with one record stuck would
    /// keep 4 KiB until its deadline).
    fn left(&mut self, lease: u64) {
        let Some(live) = self.live.get_mut(&lease) else {
            return;
        };
        live.held -= 1;
        let (deadline, n, listed) = (live.deadline, live.held, live.listed);
        if n == 0 {
            self.live.remove(&lease);
            self.deadlines.remove(&(deadline, lease));
        } else if listed as usize >= COMPACT_FROM
            && n * 4 <= listed
            && let Some(seqs) = self.deadlines.get_mut(&(deadline, lease))
        {
            // Each compaction leaves at most a quarter: amortised, one step
            // per record that leaves.
            let held = &self.held;
            seqs.retain(|s| held.get(s).is_some_and(|h| h.lease == lease));
            seqs.shrink_to_fit();
            live.listed = seqs.len() as u32;
        }
    }

    /// Renews the lease of the claimed record `seq` until `deadline` (its own
    /// lease from now on). False if it is not held.
    pub(crate) fn extend(&mut self, seq: u64, deadline: u64) -> bool {
        let lease = self.next_lease;
        let Some(held) = self.held.get_mut(&seq).filter(|h| !h.unread) else {
            return false;
        };
        self.next_lease += 1;
        let old = std::mem::replace(&mut held.lease, lease);
        if deadline != NEVER {
            self.deadlines.insert((deadline, lease), vec![seq]);
            self.live.insert(
                lease,
                Live {
                    deadline,
                    held: 1,
                    listed: 1,
                },
            );
        }
        self.left(old);
        true
    }

    /// The claimed record `seq` went back to pending: its delivery counts.
    pub(crate) fn returned(&mut self, seq: u64) {
        if let Some(held) = self.held.remove(&seq) {
            self.delivered.insert(seq, held.attempt);
            self.left(held.lease);
        }
    }

    /// The record `seq`, held by the claim `claim`, was not handed out (the
    /// claim failed reading it): it stays held until its lease runs out, but
    /// is no longer [`is_held`](Leases::is_held), so that nothing settles a
    /// record nobody received. With `uncount` (this build could not read
    /// it; the disk did not fail) its delivery does not count either: returns
    /// the deliveries counted before it then.
    pub(crate) fn hold_unread(&mut self, seq: u64, claim: u32, uncount: bool) -> Option<u32> {
        let held = self.held.get_mut(&seq).filter(|h| h.claim == claim)?;
        held.unread = true;
        if !uncount {
            return None;
        }
        held.attempt = held.attempt.saturating_sub(1);
        Some(held.attempt)
    }

    /// The claimed record `seq` went back to pending without being handed
    /// out (the claim's read failed first): this delivery does not count.
    /// Returns the deliveries counted before it.
    pub(crate) fn returned_unread(&mut self, seq: u64) -> u32 {
        let Some(held) = self.held.remove(&seq) else {
            return self.delivered.get(&seq).copied().unwrap_or(0);
        };
        self.left(held.lease);
        let before = held.attempt.saturating_sub(1);
        self.set_exact(seq, before);
        before
    }

    /// At open: `seq` was delivered `attempts` times (the log's latest
    /// attempts entry for it says so: a claim whose read failed sets its
    /// count back).
    pub(crate) fn set_delivered(&mut self, seq: u64, attempts: u32) {
        self.set_exact(seq, attempts);
    }

    /// At open: `seq` was delivered exactly `attempts` times (a relocated
    /// record's state says so).
    pub(crate) fn set_exact(&mut self, seq: u64, attempts: u32) {
        if attempts == 0 {
            self.delivered.remove(&seq);
        } else {
            self.delivered.insert(seq, attempts);
        }
    }

    /// Deliveries of `seq` counted so far, the one held now included.
    pub(crate) fn delivered(&self, seq: u64) -> u32 {
        let held = self.held.get(&seq).map_or(0, |h| h.attempt);
        held.max(self.delivered.get(&seq).copied().unwrap_or(0))
    }

    /// At open, when deliveries are counted in memory only: every record
    /// starts again at its first attempt (nothing is held yet).
    pub(crate) fn forget_deliveries(&mut self) {
        self.delivered = SeqMap::default();
    }

    /// The record `seq` is done: nothing is kept of it.
    pub(crate) fn done(&mut self, seq: u64) {
        if let Some(held) = self.held.remove(&seq) {
            self.left(held.lease);
        }
        self.delivered.remove(&seq);
        if !self.lapsed.is_empty() {
            self.lapsed.remove(&seq);
        }
    }

    /// Whether `seq` is held by a claim (not delayed, not a dead letter).
    pub(crate) fn is_held(&self, seq: u64) -> bool {
        self.held.get(&seq).is_some_and(|h| !h.unread)
    }

    /// Whether `seq` is held back after its claim failed reading it
    /// ([`hold_unread`](Leases::hold_unread)).
    pub(crate) fn is_unread(&self, seq: u64) -> bool {
        self.held.get(&seq).is_some_and(|h| h.unread)
    }

    /// The claim that holds `seq` (see [`Leases::last_claim`]), if any.
    pub(crate) fn claim_of(&self, seq: u64) -> Option<u32> {
        self.held.get(&seq).map(|h| h.claim)
    }

    /// The number of the last [`grant`](Leases::grant), to 32 bits: what
    /// [`claim_of`](Leases::claim_of) says of the records it holds. Unique
    /// among the claims of the last four billion.
    pub(crate) fn last_claim(&self) -> u32 {
        claim_number(self.next_lease.wrapping_sub(1))
    }

    /// Which delivery of `seq` is held now (0 if none).
    pub(crate) fn attempt_held(&self, seq: u64) -> u32 {
        self.held.get(&seq).map_or(0, |h| h.attempt)
    }

    /// Whether a lease of `seq` ran out since it was last acknowledged: a
    /// late acknowledgement of that delivery is accepted. (A record its relay
    /// released is not: the relay said it was not delivered.)
    pub(crate) fn lapsed(&self, seq: u64) -> bool {
        self.lapsed.contains_key(&seq)
    }

    /// The records whose lease ran out at `now`: no longer held, their
    /// delivery counted. The caller makes them pending.
    pub(crate) fn expire(&mut self, now: u64) -> Vec<u64> {
        let mut out = Vec::new();
        while let Some(entry) = self.deadlines.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let lease = entry.key().1;
            for seq in entry.remove() {
                // Only if the record is still held under this lease: not
                // acknowledged, released or extended since.
                if let Some(held) = self.held.get(&seq).filter(|h| h.lease == lease) {
                    // A record its claim failed reading was not delivered:
                    // no late acknowledgement may settle it (one of an
                    // earlier delivery still may).
                    let delivered = !held.unread;
                    self.returned(seq);
                    if delivered {
                        self.lapsed.insert(seq, ());
                    }
                    out.push(seq);
                }
            }
        }
        self.expired += out.len() as u64;
        out
    }

    /// The earliest deadline still to come, if any.
    pub(crate) fn next_deadline(&self) -> Option<u64> {
        self.deadlines.keys().next().map(|k| k.0)
    }

    /// Gives back the room of a huge claim, once settled
    /// ([`shrink_sparse`](crate::state::shrink_sparse)).
    pub(crate) fn give_back_room(&mut self) {
        crate::state::shrink_sparse(&mut self.held);
        crate::state::shrink_sparse(&mut self.live);
        crate::state::shrink_sparse(&mut self.delivered);
        crate::state::shrink_sparse(&mut self.lapsed);
    }

    /// Memory held, roughly.
    pub(crate) fn heap_bytes(&self) -> u64 {
        let held =
            self.held.capacity() * 24 + self.delivered.capacity() * 16 + self.lapsed.capacity() * 8;
        let deadlines: usize = self.deadlines.values().map(|v| 32 + v.capacity() * 8).sum();
        (held + deadlines + self.live.capacity() * 24) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_runs_out_unless_extended_and_each_delivery_is_numbered() {
        let mut l = Leases::default();
        assert_eq!(l.grant(&[1, 2, 3], 100), vec![1, 1, 1]);
        assert!(l.extend(2, 500));
        assert!(!l.extend(9, 500), "not held");
        l.done(3);
        // At 100, only record 1 runs out: 2 was extended, 3 acknowledged.
        assert_eq!(l.expire(99), Vec::<u64>::new());
        assert_eq!(l.expire(100), vec![1]);
        assert_eq!(l.expired, 1);
        assert!(l.lapsed(1));
        // Its next delivery is the second.
        assert_eq!(l.grant(&[1], NEVER), vec![2]);
        // The old lease of 2 has gone; its own runs out at 500.
        assert_eq!(l.expire(499), Vec::<u64>::new());
        assert_eq!(l.expire(500), vec![2]);
        // A record released and claimed again is not expired by its old lease.
        assert_eq!(l.grant(&[7], 1000), vec![1]);
        l.returned(7);
        assert_eq!(l.grant(&[7], 2000), vec![2]);
        assert_eq!(l.expire(1500), Vec::<u64>::new());
        assert_eq!(l.next_deadline(), Some(2000));
        assert!(!l.lapsed(7), "released, not lapsed");
        l.done(7);
        assert_eq!(l.expire(u64::MAX - 1), Vec::<u64>::new());
    }

    /// A claim whose records are all acknowledged, released or extended
    /// keeps no deadline: what is kept is bounded by the claims in flight,
    /// whatever the lease's length.
    #[test]
    fn a_settled_claim_leaves_no_deadline_behind() {
        let mut l = Leases::default();
        for claim in 0..10_000u64 {
            let seqs = [claim * 2, claim * 2 + 1];
            l.grant(&seqs, 1_000_000 + claim);
            l.done(seqs[0]);
            l.returned(seqs[1]);
            l.done(seqs[1]);
        }
        assert!(l.deadlines.is_empty() && l.live.is_empty());
        l.grant(&[1, 2], 10);
        l.extend(1, 20);
        l.done(2);
        assert_eq!(l.deadlines.len(), 1, "the extended record's own lease");
        assert_eq!(l.next_deadline(), Some(20));
        assert_eq!(l.expire(20), vec![1]);
        assert!(l.deadlines.is_empty() && l.live.is_empty());
    }

    #[test]
    fn a_claim_mostly_settled_keeps_only_the_numbers_it_holds() {
        let mut l = Leases::default();
        let listed = |l: &Leases| l.deadlines.values().map(Vec::len).sum::<usize>();
        // 1,000 claims of 512, one record of each stuck.
        for claim in 0..1_000u64 {
            let seqs: Vec<u64> = (claim * 512..(claim + 1) * 512).collect();
            l.grant(&seqs, 1_000_000 + claim);
            for &seq in &seqs[1..] {
                l.done(seq);
            }
        }
        assert_eq!(l.live.len(), 1_000);
        assert!(
            listed(&l) < 1_000 * COMPACT_FROM,
            "{} numbers listed",
            listed(&l)
        );
        // What is still held runs out, and nothing else does.
        let expired = l.expire(2_000_000);
        assert_eq!(expired.len(), 1_000);
        assert!(expired.iter().all(|s| s % 512 == 0));
        assert!(l.deadlines.is_empty() && l.live.is_empty());
        // Extended and released records leave their claim's list too.
        let seqs: Vec<u64> = (0..100).collect();
        l.grant(&seqs, 3_000_000);
        for &seq in &seqs[..50] {
            l.extend(seq, 4_000_000);
        }
        for &seq in &seqs[50..99] {
            l.returned(seq);
        }
        assert_eq!(l.expire(3_000_000), vec![99]);
        assert_eq!(l.expire(4_000_000).len(), 50);
    }
}
