//! segwal: a durable outbox for producer processes, on a segmented write-ahead log.
//!
//! A service that must not lose an event appends it to an [`Outbox`]; `append`
//! returns once the record is on stable storage. A relay in the same process
//! claims records, publishes them, and acknowledges them; a segment file is
//! deleted once every record in it is acknowledged.
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
#![deny(clippy::unwrap_used)]
#![cfg(unix)]

mod error;
mod frame;
pub mod io;
mod options;
mod outbox;
mod reader;
mod recovery;
mod seal;
mod segment;
mod seq;
mod shared;
#[cfg(feature = "sim")]
pub mod sim;
mod state;
mod writer;

pub use error::{Corruption, Error, Result};

/// The README's examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
pub use options::{
    BATCH_BYTES_MAX, Durability, MAX_RECORD_BYTES_LIMIT, OpenCheck, Options, QUEUE_BYTES_MAX,
    RecoveryMode, SEGMENT_BYTES_MAX, SEGMENT_BYTES_MIN,
};
pub use outbox::{Outbox, Stats};
pub use reader::Record;
pub use recovery::{Dropped, RecoveryReport, TornTail};
pub use seq::{SegmentId, Seq};
