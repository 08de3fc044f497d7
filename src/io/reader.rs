//! The read path: turns claimed slots into [`Record`]s, checking every frame's
//! checksum again on the way out.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::error::{Corruption, Error};
use crate::format::frame::{self, FRAME_HEADER_LEN, FrameKind};
use crate::format::segment::BLOCK;
use crate::format::seq::Seq;
use crate::io::segment_file::FileCache;
use crate::io::{self, StorageFile};
use crate::state::table::{ClaimRun, ClaimedFrame};

/// The bytes of one read, shared by the records cut from it.
type Bytes = Arc<Vec<u8>>;

/// The most bytes one read of a claim covers; frames of one run further apart
/// are read separately.
const READ_BYTES_MAX: u32 = 8 << 20;

/// A claimed record: its sequence number and its payload.
///
/// The payload is checked against its frame's CRC before the record is handed
/// out. Records read together share one buffer, read from the segment file with
/// positioned reads (never through a memory map, where a read error would be a
/// `SIGBUS` rather than an error), which stays valid while any record of it
/// lives, even after the segment file is deleted.
#[derive(Clone)]
pub struct Record {
    seq: Seq,
    bytes: Bytes,
    start: usize,
    len: usize,
    timestamp_us: u64,
    attempt: u32,
    last_error: Option<Arc<str>>,
    /// Where the frame's optional fields lie in `bytes` (`start..start+len`
    /// of the frame's `ext` area), empty for a record with none.
    ext: (usize, usize),
    /// The claim that handed it out (`Leases::last_claim` then; 0 for a
    /// record read otherwise), which the settling calls that take a
    /// `Record` require to hold it still.
    pub(crate) claim: u32,
    /// The opening of the outbox whose claim handed it out (`Handle::opened`;
    /// 0 for a record read otherwise): claim numbers start afresh at each
    /// open, and are not an outbox's own.
    pub(crate) opened: u64,
}

impl Record {
    /// The record's sequence number: pass it to `ack` or `release`.
    pub fn seq(&self) -> Seq {
        self.seq
    }

    /// The record's payload, exactly as appended.
    pub fn payload(&self) -> &[u8] {
        let all: &[u8] = (*self.bytes).as_ref();
        all.get(self.start..self.start + self.len)
            .unwrap_or_default()
    }

    /// The payload decoded from JSON as a `T` (feature `json`, on by
    /// default), as [`Outbox::append_json`](crate::Outbox::append_json) or
    /// [`Message::json`](crate::Message::json) wrote it. Fails with
    /// [`Error::Json`](crate::Error::Json) naming this record's seq if the
    /// bytes are not a `T`.
    #[cfg(feature = "json")]
    pub fn json<T: serde::de::DeserializeOwned>(&self) -> crate::Result<T> {
        serde_json::from_slice(self.payload()).map_err(|e| Error::Json {
            seq: Some(self.seq),
            reason: crate::error::json_reason(&e),
        })
    }

    /// The ordering key it was appended with
    /// ([`Message::key`](crate::Message::key)), if any.
    pub fn key(&self) -> Option<&[u8]> {
        self.fields().key
    }

    /// The not-before time it was appended with
    /// ([`Message::not_before`](crate::Message::not_before)), if any, to the
    /// microsecond, as it was kept: the Unix epoch for a time before it, the
    /// last microsecond of 64 bits (in the year 586,524) for one past it.
    pub fn not_before(&self) -> Option<SystemTime> {
        self.fields()
            .not_before_us
            .map(|us| UNIX_EPOCH + Duration::from_micros(us))
    }

    /// The deduplication id it was appended with
    /// ([`Message::dedup_id`](crate::Message::dedup_id)); for a unique item
    /// ([`Message::unique`](crate::Message::unique)), the id derived from its
    /// payload.
    pub fn dedup_id(&self) -> Option<&[u8]> {
        self.fields().dedup_id
    }

    /// The optional fields, checked when the frame was read (its checksum
    /// covers them).
    fn fields(&self) -> crate::format::ext::RecordFields<'_> {
        let all: &[u8] = (*self.bytes).as_ref();
        let ext = all
            .get(self.ext.0..self.ext.0 + self.ext.1)
            .unwrap_or_default();
        crate::format::ext::decode(ext).unwrap_or_default()
    }

    /// When the writer wrote the record (the wall clock, microsecond
    /// resolution).
    pub fn appended_at(&self) -> SystemTime {
        UNIX_EPOCH + Duration::from_micros(self.timestamp_us)
    }

    /// Which delivery of the record this is: 1 the first time it is handed
    /// out, one more each time it comes back (released, or its lease ran out)
    /// and is handed out again. Counted in memory, so that after a restart a
    /// record starts again at 1, unless
    /// [`Options::max_attempts`](crate::Options::max_attempts) is set: then
    /// every delivery's number is written to the log before the record is
    /// handed out, and the count goes on after a restart (a record relocated
    /// forward keeps its count then too).
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// Why a delivery failed: the reason the latest
    /// [`release_after`](crate::Outbox::release_after) of this record gave (at
    /// most [`REASON_BYTES_MAX`](crate::REASON_BYTES_MAX) bytes), kept, after
    /// a restart too, until the record is acknowledged or requeued. A later
    /// [`release`](crate::Outbox::release) or a lease running out, which give
    /// no reason, leave it as it is. `None` if no delivery of the record was
    /// released with a reason.
    pub fn last_error(&self) -> Option<&str> {
        self.last_error.as_deref()
    }
}

impl fmt::Debug for Record {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Record")
            .field("seq", &self.seq)
            .field("len", &self.len)
            .finish()
    }
}

/// A claimed record that could not be read.
pub(crate) struct ReadFailure {
    pub seq: Seq,
    pub error: Error,
    /// The frame failed its check, or its bytes are gone (the file is shorter
    /// than its frames): set it aside rather than hand it out again. Otherwise
    /// the read failed, or the frame holds what a newer build wrote: the
    /// record is held back (still claimed) until its lease runs out, so that
    /// a failing range of the disk cannot wedge the queue and a passing
    /// failure loses nothing.
    pub corrupt: bool,
    /// The segment file was not found: its records may have been carried
    /// forward (relocated) and the file deleted since they were claimed; the
    /// caller looks them up again.
    pub gone: bool,
}

/// Reads and checks every claimed frame; stops at the first failure.
/// `skip_crc` is an injected bug (negative control of the crash tests).
pub(crate) fn read_runs(
    runs: &[ClaimRun],
    files: &FileCache,
    out: &mut Vec<Record>,
    skip_crc: bool,
) -> Result<(), ReadFailure> {
    for run in runs {
        let file = match &run.file {
            Some(file) => file.clone(),
            None => files.get(&run.path).map_err(|e| ReadFailure {
                seq: run.frames.first().map_or(Seq::from(0), |f| f.seq),
                gone: e.kind() == std::io::ErrorKind::NotFound,
                error: Error::io("open segment", &*run.path, e),
                corrupt: false,
            })?,
        };
        // One read per stretch of frames at most a block apart (the padding
        // between sync groups is read with them), up to `READ_BYTES_MAX`; one
        // read per frame once a stretch failed (a bad range, the end of the
        // file), so that the record named is the one whose bytes fail.
        let mut i = 0;
        let mut one_by_one = false;
        while i < run.frames.len() {
            let start = run.frames[i].offset;
            let mut j = i;
            let mut end = start + run.frames[i].len;
            while let Some(next) = run.frames.get(j + 1).filter(|_| !one_by_one) {
                let next_end = next.offset + next.len;
                if u64::from(next.offset) > u64::from(end) + BLOCK as u64
                    || next_end - start > READ_BYTES_MAX
                {
                    break;
                }
                j += 1;
                end = next_end;
            }
            let bytes = match read(run, &*file, start, end) {
                Ok(bytes) => bytes,
                Err(_) if j > i => {
                    one_by_one = true;
                    continue;
                }
                Err((error, corrupt)) => {
                    return Err(ReadFailure {
                        seq: run.frames[i].seq,
                        error,
                        corrupt,
                        gone: false,
                    });
                }
            };
            for f in run.frames[i..=j].iter().cloned() {
                let at = (f.offset - start) as usize;
                out.push(check(run, &bytes, at, f, skip_crc)?);
            }
            i = j + 1;
        }
    }
    Ok(())
}

/// Reads bytes `start..end` of a run's segment. A file that ends before them is
/// corruption (its frames' bytes are gone); a failed read is an I/O error.
fn read(
    run: &ClaimRun,
    file: &dyn StorageFile,
    start: u32,
    end: u32,
) -> Result<Bytes, (Error, bool)> {
    let mut buf = vec![0u8; (end - start) as usize];
    match io::read_exact_at(file, &mut buf, u64::from(start)) {
        Ok(()) => Ok(Arc::new(buf)),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
            let available = file
                .len()
                .map_or(0, |len| len.saturating_sub(u64::from(start)));
            Err((
                Error::Corrupt {
                    path: run.path.to_path_buf(),
                    offset: u64::from(start),
                    seq: run.frames.first().map(|f| f.seq),
                    kind: Corruption::Truncated {
                        needed: u64::from(end - start),
                        available,
                    },
                },
                true,
            ))
        }
        Err(e) => Err((Error::io("read segment", &*run.path, e), false)),
    }
}

/// Decodes the frame at `at` in `bytes` and checks it is record `seq`.
fn check(
    run: &ClaimRun,
    bytes: &Bytes,
    at: usize,
    frame: ClaimedFrame,
    skip_crc: bool,
) -> Result<Record, ReadFailure> {
    let ClaimedFrame {
        seq,
        at: frame_seq,
        offset,
        len,
        attempt,
        reason,
    } = frame;
    let all: &[u8] = bytes;
    let fail = |kind: Corruption| ReadFailure {
        seq,
        // What a newer build wrote (its checksums hold) is no damage: the
        // record is held back as after a failed read, never set aside, so
        // that the build that wrote it can still deliver it.
        corrupt: !kind.is_unknown_format(),
        error: Error::Corrupt {
            path: run.path.to_path_buf(),
            offset: u64::from(offset),
            seq: Some(seq),
            kind,
        },
        gone: false,
    };
    let window = all.get(at..at + len as usize).ok_or_else(|| {
        fail(Corruption::Truncated {
            needed: u64::from(len),
            available: all.len().saturating_sub(at) as u64,
        })
    })?;
    if skip_crc && window.len() >= FRAME_HEADER_LEN {
        // The injected bug: trust the table's offsets and hand out the bytes.
        return Ok(Record {
            seq,
            bytes: bytes.clone(),
            start: at + FRAME_HEADER_LEN,
            len: window.len() - FRAME_HEADER_LEN,
            timestamp_us: 0,
            attempt,
            last_error: reason,
            ext: (0, 0),
            claim: 0,
            opened: 0,
        });
    }
    let f = frame::decode(window, run.salt).map_err(fail)?;
    // The record's own frame, or a relocated copy that names it.
    let holds_it = match f.header.kind {
        FrameKind::Record => f.header.seq == seq,
        FrameKind::Relocated => {
            f.header.seq == frame_seq
                && crate::format::relocated::decode_ext(f.ext).is_ok_and(|(own, _)| own == seq)
        }
        _ => false,
    };
    if !holds_it || f.len != len as usize {
        return Err(fail(Corruption::WrongFrame {
            expected: frame_seq,
            found: f.header.seq,
        }));
    }
    Ok(Record {
        seq,
        bytes: bytes.clone(),
        // The payload follows the header and the optional fields.
        start: at + (f.len - f.payload.len()),
        len: f.payload.len(),
        timestamp_us: f.header.timestamp_us,
        attempt,
        last_error: reason,
        ext: (at + FRAME_HEADER_LEN, f.ext.len()),
        claim: 0,
        opened: 0,
    })
}

/// The time stamped in the frame at `offset` (microseconds since the Unix
/// epoch), for statistics; `None` if unreadable.
pub(crate) fn frame_stamp(file: &dyn StorageFile, offset: u32) -> Option<u64> {
    let mut header = [0u8; FRAME_HEADER_LEN];
    io::read_exact_at(file, &mut header, u64::from(offset)).ok()?;
    frame::timestamp_us(&header)
}
