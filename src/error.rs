//! The one error type of segwal.

use std::fmt;
use std::io;
use std::path::PathBuf;
use std::sync::Arc;

use crate::format::seq::Seq;

/// Result with segwal's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in segwal.
///
/// Every variant about a file names it; corruption also names the byte offset and
/// what was expected there. The type is `Clone` (I/O causes are shared behind an
/// `Arc`) so that one failed fsync can be reported to every producer of its batch.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Error {
    /// An I/O operation on a file or directory failed.
    Io {
        /// What segwal was doing, e.g. `"open segment"`.
        op: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The operating system's error.
        source: Arc<io::Error>,
    },
    /// A segment file holds bytes that are not what segwal wrote there, or
    /// (checksums holding) what a newer build of segwal wrote, which this
    /// build does not read: [`Corruption::is_unknown_format`] tells the two
    /// apart ([`Error::is_unknown_format`] covers a directory of another
    /// format version too).
    ///
    /// Recovery reports it for damage that cannot be a torn tail (see
    /// `docs/FORMAT.md`); the read path reports it for a record whose checksum no
    /// longer matches (set aside) or that a newer build wrote (held back).
    Corrupt {
        /// The segment file.
        path: PathBuf,
        /// Byte offset of the damage within the file.
        offset: u64,
        /// The sequence number that was expected at that offset, where known.
        seq: Option<Seq>,
        /// What was found, and what was expected.
        kind: Corruption,
    },
    /// The directory is owned by another open outbox, in this process or another.
    Locked {
        /// The outbox directory.
        dir: PathBuf,
        /// The process that holds the lock, where it could be learned.
        pid: Option<u32>,
    },
    /// The outbox was closed; nothing more can be done with any of its handles.
    Closed,
    /// A write or fsync failed; the outbox accepts no append until reopened.
    ///
    /// After a failed fsync the page cache can no longer be trusted, so segwal
    /// never retries one. Claims and acknowledgements of records already durable
    /// go on working, except those that must write before they return: a claim
    /// under `Options::max_attempts` and an acknowledgement under
    /// `ack_durability(Sync)` fail with this error too. Reopening the directory
    /// recovers from what is on disk.
    /// Appends that failed with this error are *in doubt*: they may or may not be
    /// delivered after the reopen.
    Poisoned {
        /// The segment file whose write or sync failed.
        path: PathBuf,
        /// The operation that failed.
        op: &'static str,
        /// The operating system's error.
        source: Arc<io::Error>,
    },
    /// A record is larger than [`Options::max_record_bytes`](crate::Options::max_record_bytes).
    RecordTooLarge {
        /// Length of the refused payload.
        len: usize,
        /// The configured maximum.
        max: usize,
    },
    /// An `append_batch` or `append_messages` of several records is larger
    /// than the writer queue can ever hold ([`Options::queue_bytes`](crate::Options::queue_bytes)).
    BatchTooLarge {
        /// Encoded bytes of the refused batch: its payloads and a frame header
        /// (48 bytes) each, the measure `queue_bytes` is in.
        len: u64,
        /// The configured maximum.
        max: u64,
    },
    /// `try_append` found the writer queue full.
    Full,
    /// This process is a child (made by `fork`) of the process that opened
    /// the outbox: it has none of the outbox's threads, and shares its
    /// directory lock and files with that process, which goes on writing
    /// them. Every call fails so, `close` and the drop included, and changes
    /// nothing on disk. Open the outbox in one process only: a child that
    /// needs one opens it after the parent has closed it (or another).
    Forked,
    /// No record with this sequence number was ever appended; or, under
    /// [`Durability::Buffered`](crate::Durability::Buffered), its append was
    /// answered but is not yet durable, so the state table does not hold it
    /// yet (it cannot have been claimed).
    UnknownSeq {
        /// The sequence number.
        seq: Seq,
    },
    /// `ack`, `release`, `release_after`, `extend` or `dead_letter` of a
    /// record that is not claimed; `requeue` or `discard` of one that is not
    /// a dead letter.
    NotClaimed {
        /// The sequence number.
        seq: Seq,
    },
    /// A segment was written in a format version this build does not read.
    ///
    /// Nothing was changed on disk. The way forward is in the message: drain the
    /// outbox with a segwal release that reads version `found`, then open the
    /// empty directory with this one.
    UnsupportedFormat {
        /// The segment file.
        path: PathBuf,
        /// The version its header names.
        found: u16,
        /// The version this build reads and writes.
        supported: u16,
    },
    /// The path given to [`Outbox::open`](crate::Outbox::open) cannot be an
    /// outbox directory; nothing was created or written.
    InvalidPath {
        /// The path, as given.
        path: PathBuf,
        /// Why: empty, not a directory, its parent missing, the process may
        /// not write in it, a read-only file system.
        reason: &'static str,
    },
    /// An option is out of its documented range.
    InvalidOption {
        /// The option's name.
        name: &'static str,
        /// Why it was refused.
        reason: String,
    },
    /// A [`Message`](crate::Message) field is out of its documented range
    /// (an empty key, an id longer than 256 bytes); nothing was written.
    InvalidMessage {
        /// The field: `"key"` or `"dedup_id"`.
        field: &'static str,
        /// Why it was refused.
        reason: String,
    },
    /// A record with this deduplication id and a *different* payload was
    /// appended within the deduplication window; nothing was written.
    Conflict {
        /// The deduplication id.
        dedup_id: Vec<u8>,
        /// The record appended first with it.
        existing: Seq,
    },
    /// A value could not be serialised to JSON (nothing was written), or a
    /// record's payload is not the JSON of the type asked for.
    Json {
        /// The record whose payload did not decode; `None` when serialising.
        seq: Option<Seq>,
        /// What serde_json said, cut to its first [`JSON_REASON_MAX`] bytes
        /// (it may quote the payload, which can be megabytes, and is then
        /// logged).
        reason: String,
    },
    /// An append would take the outbox past a quota; nothing was written.
    /// Acknowledged records free room; so does free disk space.
    QuotaExceeded {
        /// The quota: `"max_backlog_bytes"`, `"max_backlog_records"` or
        /// `"min_free_disk_bytes"`; or `"reserve"`, when the disk has no room
        /// for the reserve an open needs on a full disk (see
        /// [`Stats::reserve_missing`](crate::Stats::reserve_missing)).
        quota: &'static str,
        /// Its configured limit (for `"reserve"`, the reserve's size).
        limit: u64,
        /// The value the append found: the backlog (bytes or records), or the
        /// free bytes of the file system.
        current: u64,
    },
}

impl Error {
    /// Whether this is no damage but what this build does not read: a
    /// directory of another format version ([`Error::UnsupportedFormat`]),
    /// or a frame or segment a newer build wrote
    /// ([`Error::Corrupt`] whose [`Corruption::is_unknown_format`]). The
    /// build that wrote the log reads it; nothing was dropped.
    pub fn is_unknown_format(&self) -> bool {
        match self {
            Error::UnsupportedFormat { .. } => true,
            Error::Corrupt { kind, .. } => kind.is_unknown_format(),
            _ => false,
        }
    }

    /// Whether the error is a full disk (or a full quota).
    pub(crate) fn is_no_space(&self) -> bool {
        match self {
            Error::Io { source, .. } | Error::Poisoned { source, .. } => {
                crate::io::reserve::is_no_space(source)
            }
            _ => false,
        }
    }

    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, source: io::Error) -> Error {
        Error::Io {
            op,
            path: path.into(),
            source: Arc::new(source),
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Io { op, path, source } => {
                write!(f, "{op} {}: {source}", path.display())
            }
            Error::Corrupt {
                path,
                offset,
                seq,
                kind,
            } => {
                write!(f, "corrupt segment {} at offset {offset}", path.display())?;
                if let Some(seq) = seq {
                    write!(f, " (seq {seq})")?;
                }
                write!(f, ": {kind}")
            }
            Error::Locked { dir, pid } => {
                write!(
                    f,
                    "outbox directory {} is locked by another outbox",
                    dir.display()
                )?;
                if let Some(pid) = pid {
                    write!(f, " (pid {pid})")?;
                }
                Ok(())
            }
            Error::Closed => f.write_str("outbox is closed"),
            Error::Poisoned { path, op, source } => write!(
                f,
                "outbox is poisoned by a failed {op} on {}: {source}; reopen it to recover",
                path.display()
            ),
            Error::RecordTooLarge { len, max } => {
                write!(f, "record of {len} bytes exceeds max_record_bytes ({max})")
            }
            Error::BatchTooLarge { len, max } => {
                write!(
                    f,
                    "batch of {len} encoded bytes exceeds queue_bytes ({max})"
                )
            }
            Error::Full => f.write_str("writer queue is full"),
            Error::Forked => f.write_str(
                "this process is a child (fork) of the process that opened the outbox: only that process may use it; open it here once that one has closed it",
            ),
            Error::UnknownSeq { seq } => write!(f, "no record with seq {seq} was ever appended"),
            Error::NotClaimed { seq } => write!(
                f,
                "record {seq} is not claimed (for requeue and discard: not a dead letter)"
            ),
            Error::UnsupportedFormat {
                path,
                found,
                supported,
            } => write!(
                f,
                "segment {} is in format version {found}; this build reads version {supported} \
                 only: drain the outbox with a segwal release that reads version {found}, then \
                 open the empty directory with this one",
                path.display()
            ),
            Error::InvalidPath { path, reason } => {
                write!(f, "cannot open an outbox at {:?}: {reason}", path)
            }
            Error::InvalidOption { name, reason } => write!(f, "invalid option {name}: {reason}"),
            Error::InvalidMessage { field, reason } => {
                write!(f, "invalid message field {field}: {reason}")
            }
            Error::Conflict { dedup_id, existing } => write!(
                f,
                "deduplication id {} was appended as record {existing} with another payload; nothing written",
                String::from_utf8_lossy(dedup_id).escape_debug()
            ),
            Error::Json {
                seq: Some(seq),
                reason,
            } => write!(f, "record {seq} is not the JSON asked for: {reason}"),
            Error::Json { seq: None, reason } => {
                write!(
                    f,
                    "value cannot be serialised as JSON (nothing written): {reason}"
                )
            }
            Error::QuotaExceeded {
                quota,
                limit,
                current,
            } => match *quota {
                "min_free_disk_bytes" => write!(
                    f,
                    "quota {quota}: the file system has {current} bytes free, below the floor of {limit}; nothing written"
                ),
                "reserve" => write!(
                    f,
                    "quota {quota}: the file system has {current} bytes free, no room for the outbox's reserve of {limit} bytes (what an open needs on a full disk); appends resume once acknowledged segments or freed space make room for it; nothing written"
                ),
                _ => write!(
                    f,
                    "quota {quota} of {limit} exceeded (the backlog is at {current}); nothing written"
                ),
            },
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Io { source, .. } | Error::Poisoned { source, .. } => Some(&**source),
            _ => None,
        }
    }
}

/// What a corrupt segment holds, and what was expected; or, where
/// [`Corruption::is_unknown_format`] says so, what a newer build wrote that
/// this one does not read.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Corruption {
    /// A file named like a segment (`*.seg`) whose name is not a 20-digit
    /// sequence number: not a segwal file.
    BadSegmentName,
    /// The segment header's magic bytes are wrong: not a segwal segment.
    BadSegmentMagic,
    /// The segment header is from a format version this build cannot read.
    UnsupportedVersion {
        /// The version found.
        found: u16,
    },
    /// The segment header's checksum does not match.
    BadSegmentHeader,
    /// The file is shorter than a segment header.
    ShortSegmentHeader {
        /// The file's length.
        len: u64,
    },
    /// The first sequence number in the header differs from the file name.
    NameMismatch {
        /// From the file name.
        expected: Seq,
        /// From the header.
        found: Seq,
    },
    /// The segment header names another outbox than the newest segment's: a
    /// file of another outbox's directory, not this one's.
    ForeignOutbox {
        /// The outbox identity of the newest segment.
        expected: u128,
        /// The identity this header names.
        found: u128,
    },
    /// The segment header's sequence numbers, its checksum valid, are ones
    /// the writer never writes: a first seq of 0 or beyond the format's
    /// bound (2^62), a predecessor's last seq at or after it, or a log start
    /// after it. Not a segment segwal wrote.
    ImpossibleSegmentSeqs {
        /// The header's `first_seq`.
        first_seq: u64,
        /// The header's `prev_seq`.
        prev_seq: u64,
        /// The header's `log_start`.
        log_start: u64,
    },
    /// The segment header names a block size this build does not write.
    BadBlockSize {
        /// The block size found.
        found: u32,
    },
    /// A frame does not start with the frame magic.
    BadFrameMagic,
    /// A frame's checksum does not match its contents.
    ChecksumMismatch {
        /// The checksum stored in the frame.
        stored: u32,
        /// The checksum of the bytes found.
        computed: u32,
    },
    /// A frame's length field is beyond the format's limit.
    LengthOutOfRange {
        /// The length found.
        len: u64,
        /// The largest valid length.
        max: u64,
    },
    /// A frame runs past the end of the file.
    Truncated {
        /// Bytes the frame needs.
        needed: u64,
        /// Bytes left in the file.
        available: u64,
    },
    /// A frame whose checksums hold but whose content this build does not
    /// take: an unknown kind, flag, field or code (what a newer build
    /// writes: [`Corruption::is_unknown_format`] is true), or a value no
    /// segwal writes (a length or number out of its bounds: damage, or
    /// not segwal's).
    Unsupported {
        /// What was not understood.
        what: &'static str,
        /// The value found.
        value: u64,
    },
    /// A frame's sequence number breaks the log's order.
    UnexpectedSeq {
        /// The sequence number that should come next.
        expected: Seq,
        /// The one found.
        found: Seq,
    },
    /// A frame's group number is inconsistent with the frames around it.
    BadGroup {
        /// The group the frame should belong to.
        expected: Seq,
        /// The group it names.
        found: Seq,
    },
    /// A sealed segment does not end at the end of a write batch.
    IncompleteBatch,
    /// A valid frame of a later, fsynced write batch follows the damage: the
    /// damage cannot be a torn tail.
    DamageBeforeValidFrame {
        /// Offset of the valid frame found after the damage.
        valid_offset: u64,
        /// Its sequence number.
        valid_seq: Seq,
    },
    /// A segment is missing from the sequence.
    MissingSegment {
        /// The first sequence number the missing segment should hold.
        expected_first: Seq,
    },
    /// A segment that is not the newest does not end with a seal frame: its tail
    /// was lost.
    MissingSeal,
    /// A frame follows the seal frame of its segment.
    FrameAfterSeal,
    /// A segment's header names a predecessor other than the segment before it.
    BrokenChain {
        /// The last sequence number of the segment before, as found on disk.
        expected_prev: Seq,
        /// The predecessor the header names.
        found_prev: Seq,
    },
    /// A seal frame's index of the segment's frames, its checksum valid, does
    /// not describe the segment.
    BadSealIndex {
        /// What does not fit.
        what: &'static str,
    },
    /// An index checkpoint (docs/FORMAT.md, "Index checkpoints"), its
    /// checksum valid, does not describe the frames before it: corruption,
    /// as a seal index that does not. Found by a walk over every frame (under
    /// `OpenCheck::EveryFrame`, by `segwal verify`, or where the checkpoints
    /// of the newest segment do not chain and recovery reads its frames).
    BadCheckpoint {
        /// What does not fit.
        what: &'static str,
    },
    /// A frame of another kind or sequence number than expected at that
    /// offset: found by the read path against the state table, or by
    /// recovery against the place a seal index or index checkpoint lists it
    /// at (frame `i` of a segment holds `first_seq + i`).
    WrongFrame {
        /// The sequence number expected at that offset.
        expected: Seq,
        /// The sequence number found.
        found: Seq,
    },
}

/// The names [`Corruption::Unsupported`] gives the places where a newer
/// build may write what this one does not know (docs/FORMAT.md, "Growing
/// the format"): a frame kind, flag or reserved field, an optional field's
/// tag, a segment flag, a code of a delivery-state entry, a relocated
/// record's state or a fields entry's flags.
pub(crate) mod newer {
    pub(crate) const FRAME_KIND: &str = "frame kind";
    pub(crate) const FRAME_FLAGS: &str = "frame flags";
    pub(crate) const FRAME_RESERVED: &str = "frame reserved field";
    pub(crate) const FIELD_TAG: &str = "optional field tag";
    pub(crate) const SEGMENT_FLAGS: &str = "segment flags";
    pub(crate) const REQUEUE_CODE: &str = "requeue-or-discard code";
    pub(crate) const CARRIED_STATE: &str = "relocated record's state code";
    pub(crate) const FIELDS_FLAGS: &str = "flags of a fields entry";
    pub(crate) const ALL: [&str; 8] = [
        FRAME_KIND,
        FRAME_FLAGS,
        FRAME_RESERVED,
        FIELD_TAG,
        SEGMENT_FLAGS,
        REQUEUE_CODE,
        CARRIED_STATE,
        FIELDS_FLAGS,
    ];
}

impl Corruption {
    /// Whether this is no damage but what this build does not read, under
    /// checksums that hold: a segment of another format version (as
    /// [`verify`](crate::verify) lists it; an open of such a directory
    /// answers [`Error::UnsupportedFormat`]: see
    /// [`Error::is_unknown_format`]), or a frame with a kind, flag,
    /// optional field or code that a newer build of segwal writes. A lossy recovery
    /// ([`RecoveryMode::Lossy`](crate::RecoveryMode::Lossy), `segwal
    /// repair`) refuses it rather than drop it with every record after it,
    /// and `segwal verify` exits 2 on it: the build that wrote the log
    /// reads it.
    pub fn is_unknown_format(&self) -> bool {
        match self {
            Corruption::UnsupportedVersion { .. } => true,
            Corruption::Unsupported { what, .. } => newer::ALL.contains(what),
            _ => false,
        }
    }
}

impl fmt::Display for Corruption {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Corruption::BadSegmentName => {
                f.write_str("file named like a segment but not a segment name")
            }
            Corruption::BadSegmentMagic => f.write_str("bad segment magic: not a segwal segment"),
            Corruption::UnsupportedVersion { found } => {
                write!(f, "unsupported segment format version {found}")
            }
            Corruption::BadSegmentHeader => f.write_str("segment header checksum mismatch"),
            Corruption::ShortSegmentHeader { len } => {
                write!(f, "file of {len} bytes is shorter than a segment header")
            }
            Corruption::NameMismatch { expected, found } => write!(
                f,
                "header says first seq {found}, file name says {expected}"
            ),
            Corruption::ForeignOutbox { expected, found } => write!(
                f,
                "segment of outbox {found:032x}, not of this directory's outbox {expected:032x}"
            ),
            Corruption::ImpossibleSegmentSeqs {
                first_seq,
                prev_seq,
                log_start,
            } => write!(
                f,
                "segment header with impossible sequence numbers: first_seq {first_seq}, \
                 prev_seq {prev_seq}, log_start {log_start} (a segment's predecessor \
                 ends before its first seq, and the log starts at or before it)"
            ),
            Corruption::BadBlockSize { found } => {
                write!(f, "segment header names a block size of {found} bytes")
            }
            Corruption::BadFrameMagic => f.write_str("expected frame magic"),
            Corruption::ChecksumMismatch { stored, computed } => write!(
                f,
                "frame checksum mismatch: stored {stored:#010x}, computed {computed:#010x}"
            ),
            Corruption::LengthOutOfRange { len, max } => {
                write!(f, "frame length {len} exceeds the limit {max}")
            }
            Corruption::Truncated { needed, available } => write!(
                f,
                "frame needs {needed} bytes but only {available} remain in the file"
            ),
            Corruption::Unsupported { what, value } => write!(f, "unsupported {what} {value:#x}"),
            Corruption::UnexpectedSeq { expected, found } => {
                write!(f, "expected seq {expected}, found seq {found}")
            }
            Corruption::BadGroup { expected, found } => {
                write!(f, "expected sync group {expected}, found group {found}")
            }
            Corruption::IncompleteBatch => f.write_str("sealed segment ends inside a write batch"),
            Corruption::DamageBeforeValidFrame {
                valid_offset,
                valid_seq,
            } => write!(
                f,
                "damaged frame followed by a valid frame of a later fsynced batch (seq {valid_seq} at offset {valid_offset})"
            ),
            Corruption::MissingSegment { expected_first } => {
                write!(
                    f,
                    "missing segment: expected one starting at seq {expected_first}"
                )
            }
            Corruption::MissingSeal => {
                f.write_str("segment is followed by another but does not end with a seal frame")
            }
            Corruption::FrameAfterSeal => f.write_str("frame after the segment's seal frame"),
            Corruption::BrokenChain {
                expected_prev,
                found_prev,
            } => write!(
                f,
                "segment follows seq {found_prev} but the segment before it ends at seq {expected_prev}"
            ),
            Corruption::BadSealIndex { what } => write!(f, "bad seal index: {what}"),
            Corruption::BadCheckpoint { what } => write!(f, "bad index checkpoint: {what}"),
            Corruption::WrongFrame { expected, found } => {
                write!(f, "expected record {expected}, found frame {found}")
            }
        }
    }
}

/// The longest [`Error::Json`] reason kept, in bytes.
pub const JSON_REASON_MAX: usize = 256;

/// What serde_json said, at most [`JSON_REASON_MAX`] bytes: a longer one is
/// cut in the middle on a character boundary, with an ellipsis, keeping its
/// end, where serde_json says the line and column.
#[cfg(feature = "json")]
pub(crate) fn json_reason(e: &serde_json::Error) -> String {
    clip_reason(e.to_string())
}

#[cfg(feature = "json")]
fn clip_reason(reason: String) -> String {
    const CUT: &str = "…";
    if reason.len() <= JSON_REASON_MAX {
        return reason;
    }
    let tail = reason.rfind(" at line ").map_or("", |at| &reason[at..]);
    let tail = if tail.len() <= JSON_REASON_MAX / 2 {
        tail
    } else {
        ""
    };
    let mut end = JSON_REASON_MAX - CUT.len() - tail.len();
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{CUT}{tail}", &reason[..end])
}

#[cfg(all(test, feature = "json"))]
mod tests {
    use super::*;

    #[test]
    fn a_long_json_reason_is_cut_within_the_limit_and_keeps_where() {
        let long = format!(
            "invalid type: string \"{}\", expected u64 at line 1 column 812",
            "é".repeat(400)
        );
        let cut = clip_reason(long);
        assert!(cut.len() <= JSON_REASON_MAX, "{} bytes", cut.len());
        assert!(cut.starts_with("invalid type: string"));
        assert!(cut.ends_with("… at line 1 column 812"), "{cut}");
        let short = String::from("expected value at line 1 column 1");
        assert_eq!(clip_reason(short.clone()), short);
        // No location: the head alone, within the limit.
        let cut = clip_reason("x".repeat(1000));
        assert_eq!(cut.len(), JSON_REASON_MAX);
        assert!(cut.ends_with('…'));
    }
}
