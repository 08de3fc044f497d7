//! Per-key order: the records of each ordering key still to be delivered,
//! oldest first (docs/GUARANTEES.md, 13).
//!
//! Only the first record of a key (its head) may be pending, claimed or
//! waiting out a delay; the others are held back (the table holds their
//! claimed bit, as for a delay) until every record ahead of them is
//! acknowledged or parked as a dead letter. A dead letter leaves its key's
//! queue (it no longer blocks the key) and rejoins it if requeued.
//!
//! Keys are known by their digest (`format::hash`): two keys whose digests
//! collide would only be ordered against each other, never delivered out of
//! order. State exists for a key only while it has a record to deliver: a
//! queue entry (8 bytes) per record, and the key of each keyed record still in
//! the log (16 bytes, with the map's overhead).

use std::collections::{HashMap, VecDeque};

/// The queues of the ordering keys.
#[derive(Default)]
pub(crate) struct Keys {
    /// Each key's records to deliver, by sequence number.
    queues: HashMap<u64, VecDeque<u64>>,
    /// The key of every keyed record not yet done (dead letters included).
    key_of: HashMap<u64, u64>,
}

/// Where a record joined its key's queue.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Joined {
    /// At the front: free to go.
    Head,
    /// Behind another record: held back.
    Behind,
    /// At the front, ahead of the record returned, which was free to go and
    /// is now held back behind it.
    Displaced(u64),
}

impl Keys {
    /// Whether no record has a key (the table's fast path).
    pub(crate) fn is_empty(&self) -> bool {
        self.key_of.is_empty()
    }

    /// The key of the record `seq`, if it has one.
    pub(crate) fn key_of(&self, seq: u64) -> Option<u64> {
        self.key_of.get(&seq).copied()
    }

    /// Whether `seq` waits behind an earlier record of its key.
    pub(crate) fn is_held(&self, seq: u64) -> bool {
        let Some(key) = self.key_of(seq) else {
            return false;
        };
        self.queues
            .get(&key)
            .is_some_and(|q| q.front() != Some(&seq) && q.contains(&seq))
    }

    /// Adds the record `seq` of `key`, newer than every record of the key
    /// (an append, or recovery in sequence order). Returns whether it is the
    /// key's head.
    pub(crate) fn push(&mut self, seq: u64, key: u64) -> bool {
        self.key_of.insert(seq, key);
        let q = self.queues.entry(key).or_default();
        q.push_back(seq);
        q.len() == 1
    }

    /// Notes the key of `seq` without queueing it (a dead letter at open: it
    /// does not block its key, and rejoins it if requeued).
    pub(crate) fn note(&mut self, seq: u64, key: u64) {
        self.key_of.insert(seq, key);
    }

    /// Puts the keyed record `seq` back in its key's queue by sequence
    /// number (a dead letter requeued). `head_free` says whether the key's
    /// current head is free to go (pending): only then may `seq` go ahead of
    /// it; otherwise it goes right behind it.
    pub(crate) fn rejoin(&mut self, seq: u64, head_free: impl Fn(u64) -> bool) -> Option<Joined> {
        let key = self.key_of(seq)?;
        let q = self.queues.entry(key).or_default();
        let at = q.partition_point(|&s| s < seq);
        match (at, q.front().copied()) {
            (_, None) => {
                q.push_back(seq);
                Some(Joined::Head)
            }
            (0, Some(head)) if head_free(head) => {
                q.push_front(seq);
                Some(Joined::Displaced(head))
            }
            (at, Some(_)) => {
                q.insert(at.max(1), seq);
                Some(Joined::Behind)
            }
        }
    }

    /// The record `seq` left its key's queue (acknowledged, set aside, or
    /// parked as a dead letter; `forget` also drops its key, as when it is
    /// done for good). Returns the key's new head if `seq` was the head.
    pub(crate) fn leave(&mut self, seq: u64, forget: bool) -> Option<u64> {
        let key = if forget {
            self.key_of.remove(&seq)?
        } else {
            self.key_of(seq)?
        };
        let q = self.queues.get_mut(&key)?;
        let was_head = q.front() == Some(&seq);
        if was_head {
            q.pop_front();
        } else if let Some(at) = q.iter().position(|&s| s == seq) {
            q.remove(at);
        }
        let next = q.front().copied();
        if q.is_empty() {
            self.queues.remove(&key);
        }
        if was_head { next } else { None }
    }

    /// Keys with at least one record held back behind an earlier one.
    pub(crate) fn blocked(&self) -> u64 {
        self.queues.values().filter(|q| q.len() > 1).count() as u64
    }

    /// The records held back behind an earlier one of their key.
    pub(crate) fn held(&self) -> impl Iterator<Item = u64> + '_ {
        self.queues.values().flat_map(|q| q.iter().skip(1).copied())
    }

    /// Heap bytes, roughly (for `Stats::state_bytes`).
    pub(crate) fn heap_bytes(&self) -> u64 {
        let queued: usize = self.queues.values().map(|q| q.capacity() * 8).sum();
        (self.queues.capacity() * 41 + self.key_of.capacity() * 17 + queued) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_goes_one_record_at_a_time_and_dead_letters_step_aside() {
        let mut k = Keys::default();
        assert!(k.push(1, 7));
        assert!(!k.push(3, 7));
        assert!(k.push(2, 8));
        assert!(k.is_held(3) && !k.is_held(1) && !k.is_held(2));
        assert_eq!(k.blocked(), 1);
        // The head parked as a dead letter: the next one goes.
        assert_eq!(k.leave(1, false), Some(3));
        assert!(!k.is_held(3));
        // Requeued while the new head is claimed: it goes right behind it.
        assert_eq!(k.rejoin(1, |_| false), Some(Joined::Behind));
        assert!(k.is_held(1));
        assert_eq!(k.leave(3, true), Some(1));
        // Requeued ahead of a head that is free to go: it displaces it.
        assert!(!k.push(5, 7));
        assert_eq!(k.leave(1, false), Some(5));
        assert_eq!(k.rejoin(1, |_| true), Some(Joined::Displaced(5)));
        assert!(k.is_held(5));
        assert_eq!(k.leave(1, true), Some(5));
        assert_eq!(k.leave(5, true), None);
        assert_eq!(k.leave(2, true), None);
        assert!(k.is_empty() && k.queues.is_empty());
    }
}
