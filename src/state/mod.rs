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
