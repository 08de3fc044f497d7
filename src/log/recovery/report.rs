//! What recovery tells the user it found and changed: [`RecoveryReport`],
//! [`TornTail`], [`Dropped`].

use std::path::PathBuf;

use crate::error::Corruption;
use crate::format::seq::Seq;

#[cfg(doc)]
use crate::options::RecoveryMode;

/// What recovery found and changed when the outbox was opened.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct RecoveryReport {
    /// Segment files found in the directory.
    pub segments_found: usize,
    /// Records handed back to the relay: every record not acknowledged before the
    /// previous close or crash (acknowledgements are kept in memory only).
    pub records_recovered: u64,
    /// A torn tail truncated from the last segment: bytes of a write batch whose
    /// fsync never completed, so no producer was told it succeeded.
    pub torn_tail: Option<TornTail>,
    /// Segment files removed because they were already fully acknowledged when the
    /// previous run was deleting them, or (the last segment) created but never
    /// made durable.
    pub removed: Vec<PathBuf>,
    /// Under [`RecoveryMode::Lossy`] only: what was dropped at the first damage.
    pub dropped: Option<Dropped>,
}

/// A torn tail truncated at recovery.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct TornTail {
    /// The segment file.
    pub path: PathBuf,
    /// The offset it was truncated to.
    pub offset: u64,
    /// The bytes removed.
    pub bytes: u64,
    /// What the damage was.
    pub cause: Corruption,
}

/// What a lossy recovery dropped.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Dropped {
    /// The segment file holding the first damage.
    pub path: PathBuf,
    /// The offset of the first damage; the file was truncated there.
    pub offset: u64,
    /// What the damage was.
    pub cause: Corruption,
    /// First dropped sequence number: the one expected at the damage.
    pub first: Seq,
    /// Last dropped sequence number: the highest found in any valid frame after
    /// the damage. `None` when no valid frame followed it: then the damaged bytes
    /// held no complete record. Every number in `first..=last` is dropped, and
    /// none of them will be assigned again.
    pub last: Option<Seq>,
    /// Later segment files deleted whole.
    pub deleted_segments: Vec<PathBuf>,
}
