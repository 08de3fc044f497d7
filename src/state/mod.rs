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

/// Gives back most of `map`'s room once three quarters of it is empty, so
/// that a burst (a million ordering keys delivered, one huge claim settled)
/// does not keep its peak until close. The map keeps room for twice its
/// entries: it must lose most of them again before the next shrink, so a
/// shrink's cost is spread over the removals that called for it.
pub(crate) fn shrink_sparse<K: Eq + Hash, V, S: BuildHasher>(map: &mut HashMap<K, V, S>) {
    if map.capacity() > ROOM_KEPT && map.len() < map.capacity() / 4 {
        map.shrink_to(map.len().saturating_mul(2).max(ROOM_KEPT));
    }
}

/// The heap bytes a hash map of `capacity` entries of `entry` bytes takes,
/// roughly (one control byte an entry).
pub(crate) fn map_bytes(capacity: usize, entry: usize) -> u64 {
    (capacity * (entry + 1)) as u64
}
