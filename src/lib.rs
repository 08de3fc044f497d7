//! segwal: a durable outbox for producer processes, on a segmented write-ahead log.
//!
//! A service that must not lose an event appends it to an [`Outbox`]; `append`
//! returns once the record is on stable storage (under the default
//! [`Durability::Sync`]). A relay in the same process claims records,
//! publishes them, and acknowledges them; sealed segment files are deleted,
//! oldest first, once every record in them is acknowledged (one may be kept to
//! be written again as the next segment:
//! [`Options::recycle_segments`]).
//!
//! ```
//! use segwal::{Options, Outbox};
//!
//! # fn main() -> segwal::Result<()> {
//! let dir = tempfile::tempdir().expect("temporary directory");
//! let outbox = Outbox::open(dir.path(), Options::default())?;
//!
//! // Producer: durable on return.
//! let seq = outbox.append(b"{\"event\": \"order.created\", \"id\": 42}")?;
//!
//! // Relay: claim, publish, acknowledge.
//! for record in outbox.claim(100)? {
//!     assert_eq!(record.seq(), seq);
//!     // publish(record.payload())?;
//!     outbox.ack(record.seq())?;
//! }
//! outbox.close()?;
//! # Ok(())
//! # }
//! ```
//!
//! The guarantees, and the tests that prove them, are in `docs/GUARANTEES.md`;
//! the design in `docs/ARCHITECTURE.md`; the bytes on disk in `docs/FORMAT.md`.

#![deny(missing_docs)]
#![deny(unsafe_code)]
#![deny(clippy::unwrap_used)]
#![cfg(unix)]

/// Whether the known bug `Bug::$bug` is injected into the outbox configured by
/// `$options`: a negative control of the crash harness (`sim::bugs`). Without
/// the `testing` feature it is the constant `false` and evaluates nothing.
macro_rules! injected {
    ($options:expr, $bug:ident) => {{
        #[cfg(feature = "testing")]
        let on = crate::sim::bugs::injected(&$options, crate::sim::bugs::Bug::$bug);
        #[cfg(not(feature = "testing"))]
        let on = false;
        on
    }};
}
pub(crate) use injected;

/// A `tracing` event under the target `segwal` (feature `tracing`): open and
/// recovery, rotation and seal, deletion, relocation, poisoning, lease
/// expiry, dead-lettering. Without the feature it expands to nothing and
/// evaluates nothing.
macro_rules! event {
    ($level:ident, $($arg:tt)+) => {{
        #[cfg(feature = "tracing")]
        ::tracing::$level!(target: "segwal", $($arg)+);
    }};
}
pub(crate) use event;

// The layers, bottom up (docs/ARCHITECTURE.md has the map): the pure codecs of
// the format; everything that touches the disk; the log (writer and recovery);
// the in-memory state machines; and on top, the public API in this folder.
mod error;
mod format;
// The storage interface is an internal seam: published only to segwal's own
// tests (feature `testing`), never part of the stable API.
#[cfg(feature = "testing")]
#[doc(hidden)]
pub mod io;
#[cfg(not(feature = "testing"))]
mod io;
mod log;
mod message;
mod options;
mod outbox;
mod relay;
// The simulated disk, the crash harness and the known bugs of the negative
// controls: for segwal's own tests and fuzz targets (feature `testing`).
#[cfg(feature = "testing")]
#[doc(hidden)]
pub mod sim;
mod state;

pub use error::{Corruption, Error, JSON_REASON_MAX, Result};

/// The README's examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
pub use format::delivery::REASON_BYTES_MAX;
pub use format::seq::{QUARANTINE_DIR, Seq};
pub use io::reader::Record;
pub use log::recovery::dump::{Dump, DumpOptions, DumpedRecord, RecordState, dump};
pub use log::recovery::verify::{
    Problem, SegmentSummary, StateCounts, Verification, verify, verify_with_progress,
};
pub use log::recovery::{Dropped, QuarantineReason, Quarantined, RecoveryReport, TornTail};
pub use message::{Appended, DEDUP_ID_BYTES_MAX, KEY_BYTES_MAX, Message};
pub use options::{
    BATCH_BYTES_MAX, DEDUP_CAPACITY_MAX, DEDUP_WINDOW_MAX, Durability, LINGER_MAX,
    MAX_RECORD_BYTES_LIMIT, MIN_FREE_DISK_BYTES_DEFAULT, OpenCheck, Options, QUEUE_BYTES_MAX,
    QUEUE_CAPACITY_MAX, RecoveryMode, SEGMENT_BYTES_MAX, SEGMENT_BYTES_MIN,
};
pub use outbox::{DeadLetter, Outbox, Stats};
/// The relay's NATS JetStream publisher (feature `nats`; docs/RELAY.md).
#[cfg(feature = "nats")]
pub use relay::nats;
pub use relay::{Outcome, Publisher, Relay, RelayOptions, RelayStats};

/// The pid the `OWNER` file of the outbox directory `dir` names: a hint for
/// messages, written by the process that opened the outbox (the lock itself
/// is a `flock` on the directory, docs/FORMAT.md "The directory"; the file
/// may be stale or missing). `None` if it names no pid, or if it is not a
/// plain file of its own: a symbolic link, a FIFO or a device under that
/// name is never read through, so it can neither block the caller nor be
/// read without end.
pub fn owner_pid(dir: &std::path::Path) -> Option<u32> {
    io::StdStorage::owner_pid(dir)
}
