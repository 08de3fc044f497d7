//! The in-memory state machines: what is pending, claimed and done.
//!
//! Owns the claim/ack table (`table`): per segment, one `u32` offset per frame
//! and two bitsets, rebuilt by recovery and changed only by frames already
//! durable and by claims, releases and acks of those; and the leases of
//! claimed records and the attempts of deliveries (`leases`), which the table
//! owns; the queues of the ordering keys (`keys`); and the deduplication ids
//! remembered (`dedup`), which the writer owns.
//!
//! May not touch: files (it holds handles and maps for the read path, but never
//! reads, writes or syncs them), the writer's queue, or the clock (times are
//! handed in, on the outbox's monotonic clock).

pub(crate) mod dedup;
pub(crate) mod keys;
pub(crate) mod leases;
pub(crate) mod table;

use std::collections::HashMap;
use std::hash::{BuildHasher, Hash};

/// The least room [`shrink_sparse`] leaves a map.
const ROOM_KEPT: usize = 64;

/// The most entries [`shrink_sparse`] moves at once: a shrink moves every
/// entry left, under the table's lock, which claims, acks and the writer's
/// batches wait for (16,384 entries take about a millisecond; the 450,000
/// left of a million keys took 80 to 110 ms).
const SHRINK_ENTRIES_MAX: usize = 16_384;

/// Gives back most of `map`'s room once three quarters of it is empty and
/// few entries are left, so that a burst (a million ordering keys
/// delivered, one huge claim settled) does not keep its peak until close.
/// The map keeps room for twice its entries: it must lose most of them
/// again before the next shrink, so a shrink's cost is spread over the
/// removals that called for it.
pub(crate) fn shrink_sparse<K: Eq + Hash, V, S: BuildHasher>(map: &mut HashMap<K, V, S>) {
    if map.capacity() > ROOM_KEPT
        && map.len() < map.capacity() / 4
        && map.len() <= SHRINK_ENTRIES_MAX
    {
        map.shrink_to(map.len().saturating_mul(2).max(ROOM_KEPT));
    }
}

/// The heap bytes a hash map of `capacity` entries of `entry` bytes takes,
/// roughly (one control byte an entry).
pub(crate) fn map_bytes(capacity: usize, entry: usize) -> u64 {
    (capacity * (entry + 1)) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_map_shrinks_once_mostly_empty_and_small_enough_to_move_at_once() {
        let mut map: HashMap<u64, u64> = (0..200_000).map(|k| (k, k)).collect();
        let full = map.capacity();
        // Three quarters empty, but 40,000 entries left: moving them would
        // hold the table's lock too long.
        map.retain(|&k, _| k < 40_000);
        let before = map.capacity();
        shrink_sparse(&mut map);
        assert_eq!(map.capacity(), before);
        map.retain(|&k, _| k < 10_000);
        shrink_sparse(&mut map);
        assert!(map.capacity() <= full / 8, "{} of {full}", map.capacity());
        assert!(map.capacity() >= 20_000);
        // Right after a shrink, no other until most of it is gone again.
        map.retain(|&k, _| k < 8_000);
        let before = map.capacity();
        shrink_sparse(&mut map);
        assert_eq!(map.capacity(), before);
        assert_eq!(map.len(), 8_000);
    }
}
