//! Per-key order: the records of each ordering key still to be delivered,
//! oldest first (docs/GUARANTEES.md, section 8).
//!
//! A key's records go one at a time, oldest first: one record of the key has
//! its *turn* and may be pending, claimed or waiting out a delay; the others
//! are held back (the table holds their claimed bit, as for a delay). The
//! turn passes to the oldest record left when its holder is acknowledged or
//! parked as a dead letter. A dead letter leaves its key's queue (it no longer
//! blocks the key); requeued, it rejoins by sequence number, and takes the
//! turn at once if the holder is pending, or when the holder comes back
//! pending or leaves.
//!
//! Keys are known by their digest (`format::hash`): two keys whose digests
//! collide would only be ordered against each other, never delivered out of
//! order. State exists for a key only while it has a record to deliver: its
//! queue (two records inline, more on the heap, 8 bytes each), and the key of
//! each keyed record still in the log (16 bytes, with the map's overhead).

use std::collections::{HashMap, VecDeque};

/// The queues of the ordering keys.
#[derive(Default)]
pub(crate) struct Keys {
    queues: HashMap<u64, KeyQueue>,
    /// The key of every keyed record not yet done (dead letters included).
    key_of: HashMap<u64, u64>,
}

/// One key's records to deliver.
struct KeyQueue {
    /// By sequence number.
    seqs: Seqs,
    /// The one record of the key that may be pending, claimed or waiting out
    /// a delay: the others are held back until it leaves the queue.
    turn: u64,
}

/// A key's records, by sequence number: up to two inline (a key with a record
/// out and one waiting, the common case, allocates nothing), more on the heap.
enum Seqs {
    Inline { len: u8, items: [u64; 2] },
    Heap(VecDeque<u64>),
}

impl Seqs {
    fn one(seq: u64) -> Seqs {
        Seqs::Inline {
            len: 1,
            items: [seq, 0],
        }
    }

    fn iter(&self) -> impl Iterator<Item = u64> + '_ {
        let (inline, heap): (&[u64], Option<&VecDeque<u64>>) = match self {
            Seqs::Inline { len, items } => (items.get(..usize::from(*len)).unwrap_or(&[]), None),
            Seqs::Heap(q) => (&[], Some(q)),
        };
        inline
            .iter()
            .copied()
            .chain(heap.into_iter().flat_map(|q| q.iter().copied()))
    }

    fn len(&self) -> usize {
        match self {
            Seqs::Inline { len, .. } => usize::from(*len),
            Seqs::Heap(q) => q.len(),
        }
    }

    fn front(&self) -> Option<u64> {
        self.iter().next()
    }

    fn contains(&self, seq: u64) -> bool {
        match self {
            Seqs::Heap(q) => q.binary_search(&seq).is_ok(),
            inline => inline.iter().any(|s| s == seq),
        }
    }

    /// Inserts `seq` in order (at the back, for a newer one).
    fn insert(&mut self, seq: u64) {
        match self {
            Seqs::Inline { len: 0, .. } => *self = Seqs::one(seq),
            Seqs::Inline { len: 1, items } => {
                let a = items[0];
                *self = Seqs::Inline {
                    len: 2,
                    items: if seq < a { [seq, a] } else { [a, seq] },
                };
            }
            Seqs::Inline { items, .. } => {
                let mut q: VecDeque<u64> = VecDeque::with_capacity(4);
                q.extend(items.iter().copied());
                let at = q.partition_point(|&s| s < seq);
                q.insert(at, seq);
                *self = Seqs::Heap(q);
            }
            Seqs::Heap(q) => {
                if q.back().is_none_or(|&b| b < seq) {
                    q.push_back(seq);
                } else {
                    let at = q.partition_point(|&s| s < seq);
                    q.insert(at, seq);
                }
            }
        }
    }

    fn remove(&mut self, seq: u64) {
        match self {
            Seqs::Inline { len, items } => {
                let n = usize::from(*len);
                if let Some(at) = items
                    .get(..n)
                    .and_then(|s| s.iter().position(|&x| x == seq))
                {
                    if at == 0 {
                        items[0] = items[1];
                    }
                    *len -= 1;
                }
            }
            Seqs::Heap(q) => {
                if let Ok(at) = q.binary_search(&seq) {
                    q.remove(at);
                }
                if q.len() <= 2 {
                    let mut items = [0u64; 2];
                    for (slot, s) in items.iter_mut().zip(q.iter()) {
                        *slot = *s;
                    }
                    *self = Seqs::Inline {
                        len: q.len() as u8,
                        items,
                    };
                }
            }
        }
    }

    fn heap_bytes(&self) -> usize {
        match self {
            Seqs::Inline { .. } => 0,
            Seqs::Heap(q) => q.capacity() * 8,
        }
    }
}

/// Where a record joined its key's queue.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Joined {
    /// It has the key's turn: free to go.
    Head,
    /// Behind the record that has the turn: held back.
    Behind,
    /// It took the turn from the record returned, a newer one that was
    /// pending and is now held back behind it.
    Displaced(u64),
}

impl Keys {
    /// Whether no record has a key (the table's fast path).
    pub(crate) fn is_empty(&self) -> bool {
        self.key_of.is_empty()
    }

    /// Makes room for `records` more keyed records at once (at open, where
    /// growing a map of a million entries step by step holds the old map
    /// and the new one together).
    pub(crate) fn reserve(&mut self, records: usize) {
        self.key_of.reserve(records);
    }

    /// The key of the record `seq`, if it has one.
    pub(crate) fn key_of(&self, seq: u64) -> Option<u64> {
        self.key_of.get(&seq).copied()
    }

    /// Whether `seq` waits for its key's turn.
    pub(crate) fn is_held(&self, seq: u64) -> bool {
        let Some(key) = self.key_of(seq) else {
            return false;
        };
        self.queues
            .get(&key)
            .is_some_and(|q| q.turn != seq && q.seqs.contains(seq))
    }

    /// Adds the record `seq` of `key`, newer than every record of the key
    /// (an append, or recovery in sequence order). Returns whether it has the
    /// key's turn.
    pub(crate) fn push(&mut self, seq: u64, key: u64) -> bool {
        self.key_of.insert(seq, key);
        match self.queues.get_mut(&key) {
            Some(q) => {
                q.seqs.insert(seq);
                false
            }
            None => {
                self.queues.insert(
                    key,
                    KeyQueue {
                        seqs: Seqs::one(seq),
                        turn: seq,
                    },
                );
                true
            }
        }
    }

    /// Notes the key of `seq` without queueing it (a dead letter at open: it
    /// does not block its key, and rejoins it if requeued).
    pub(crate) fn note(&mut self, seq: u64, key: u64) {
        self.key_of.insert(seq, key);
    }

    /// Puts the keyed record `seq` back in its key's queue, by sequence
    /// number (a dead letter requeued). `turn_free` says whether the record
    /// holding the key's turn is pending: then an older `seq` takes the turn
    /// from it; if it is claimed or delayed, `seq` waits for it.
    pub(crate) fn rejoin(&mut self, seq: u64, turn_free: impl Fn(u64) -> bool) -> Option<Joined> {
        let key = self.key_of(seq)?;
        let Some(q) = self.queues.get_mut(&key) else {
            self.queues.insert(
                key,
                KeyQueue {
                    seqs: Seqs::one(seq),
                    turn: seq,
                },
            );
            return Some(Joined::Head);
        };
        q.seqs.insert(seq);
        if seq < q.turn && turn_free(q.turn) {
            let old = q.turn;
            q.turn = seq;
            Some(Joined::Displaced(old))
        } else {
            Some(Joined::Behind)
        }
    }

    /// Gives the key's turn to its record `seq` (at open: a record waiting
    /// out a `release_after` delay had the turn when it was released, and
    /// keeps it while it waits, as it did before the restart). Returns the
    /// record that had the turn, now held back behind it.
    pub(crate) fn take_turn(&mut self, seq: u64) -> Option<u64> {
        let key = self.key_of(seq)?;
        let q = self.queues.get_mut(&key)?;
        if q.turn == seq || !q.seqs.contains(seq) {
            return None;
        }
        Some(std::mem::replace(&mut q.turn, seq))
    }

    /// The record `seq`, which has its key's turn, became pending again
    /// (released, its lease or delay ran out): if an older record of the key
    /// waits (requeued while `seq` was out), the turn passes to it, which is
    /// returned, and `seq` is held back behind it.
    pub(crate) fn repass(&mut self, seq: u64) -> Option<u64> {
        let key = self.key_of(seq)?;
        let q = self.queues.get_mut(&key)?;
        let front = q.seqs.front()?;
        (q.turn == seq && front < seq).then(|| {
            q.turn = front;
            front
        })
    }

    /// The record `seq` left its key's queue (acknowledged, set aside, or
    /// parked as a dead letter; `forget` also drops its key, as when it is
    /// done for good). Returns the record the key's turn passed to, if `seq`
    /// had it and another record waits.
    pub(crate) fn leave(&mut self, seq: u64, forget: bool) -> Option<u64> {
        let key = if forget {
            self.key_of.remove(&seq)?
        } else {
            self.key_of(seq)?
        };
        let q = self.queues.get_mut(&key)?;
        q.seqs.remove(seq);
        let Some(front) = q.seqs.front() else {
            self.queues.remove(&key);
            return None;
        };
        (q.turn == seq).then(|| {
            q.turn = front;
            front
        })
    }

    /// Keys with at least one record held back behind another.
    pub(crate) fn blocked(&self) -> u64 {
        self.queues.values().filter(|q| q.seqs.len() > 1).count() as u64
    }

    /// The records held back waiting for their key's turn.
    pub(crate) fn held(&self) -> impl Iterator<Item = u64> + '_ {
        self.queues
            .values()
            .flat_map(|q| q.seqs.iter().filter(move |&s| s != q.turn))
    }

    /// Gives back the room of a burst of keys, once delivered
    /// ([`shrink_sparse`](crate::state::shrink_sparse)).
    pub(crate) fn give_back_room(&mut self) {
        crate::state::shrink_sparse(&mut self.queues);
        crate::state::shrink_sparse(&mut self.key_of);
    }

    /// Heap bytes, roughly (for `Stats::state_bytes`).
    pub(crate) fn heap_bytes(&self) -> u64 {
        let queued: usize = self.queues.values().map(|q| q.seqs.heap_bytes()).sum();
        (self.queues.capacity() * (size_of::<(u64, KeyQueue)>() + 1)
            + self.key_of.capacity() * 17
            + queued) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_keys_records_stay_in_order_inline_and_on_the_heap() {
        let mut q = Seqs::one(5);
        for seq in [9, 3, 7, 1, 8] {
            q.insert(seq);
        }
        assert_eq!(q.iter().collect::<Vec<_>>(), [1, 3, 5, 7, 8, 9]);
        assert!(q.contains(7) && !q.contains(6));
        for (gone, left) in [(5, 5), (1, 4), (9, 3), (7, 2), (3, 1), (8, 0)] {
            q.remove(gone);
            assert_eq!(q.len(), left);
            assert!(!q.contains(gone));
        }
        q.insert(4);
        q.insert(2);
        assert_eq!((q.front(), q.len(), q.heap_bytes()), (Some(2), 2, 0));
    }

    #[test]
    fn a_key_goes_one_record_at_a_time_and_dead_letters_step_aside() {
        let mut k = Keys::default();
        assert!(k.push(1, 7));
        assert!(!k.push(3, 7));
        assert!(k.push(2, 8));
        assert!(k.is_held(3) && !k.is_held(1) && !k.is_held(2));
        assert_eq!(k.blocked(), 1);
        // The turn's holder parked as a dead letter: the next one goes.
        assert_eq!(k.leave(1, false), Some(3));
        assert!(!k.is_held(3));
        // Requeued while the turn's holder is claimed: it waits for it...
        assert_eq!(k.rejoin(1, |_| false), Some(Joined::Behind));
        assert!(k.is_held(1));
        // ... and if that one comes back pending, the older goes first.
        assert_eq!(k.repass(3), Some(1));
        assert!(k.is_held(3) && !k.is_held(1));
        assert_eq!(k.repass(1), None);
        assert_eq!(k.leave(1, true), Some(3));
        // Requeued ahead of a pending holder of the turn: it takes the turn.
        assert!(!k.push(5, 7));
        assert_eq!(k.leave(3, false), Some(5));
        assert_eq!(k.rejoin(3, |_| true), Some(Joined::Displaced(5)));
        assert!(k.is_held(5));
        assert_eq!(k.leave(3, true), Some(5));
        assert_eq!(k.leave(5, true), None);
        assert_eq!(k.leave(2, true), None);
        assert!(k.is_empty() && k.queues.is_empty());
    }
}
