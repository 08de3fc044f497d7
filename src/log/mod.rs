//! The log: the writer that appends to it (on its thread, or on the thread of
//! a producer appending alone) and the recovery that rebuilds it at open.
//!
//! Owns every decision about what is written where and when: batching, group
//! commit, rotation and sealing, deletion behind a log start (`writer`); what is
//! handed between producers and the writer (`shared`), and the word blocked
//! producers sleep on (`waiters`); the deadlines of async
//! waits (`timer`); the ages of records on a
//! clock that never steps (`clock`); and, at open, what is
//! torn, what is corrupt and what must change on disk (`recovery`).
//!
//! May not touch: the bytes of the format (it calls `format`), or files other
//! than through `io` (segment files through `io::segment_file`).

pub(crate) mod clock;
pub(crate) mod recovery;
pub(crate) mod shared;
pub(crate) mod timer;
pub(crate) mod waiters;
pub(crate) mod writer;
