//! The read path: turns claimed slots into [`Record`]s, checking every frame's
//! checksum again on the way out.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::error::{Corruption, Error};
use crate::format::frame::{self, FRAME_HEADER_LEN, FrameKind};
use crate::format::seq::Seq;
use crate::io::{self, Mapped};
use crate::state::table::{ClaimRun, ClaimedFrame, Source};

/// A claimed record: its sequence number and its payload.
///
/// The payload is checked against its frame's CRC before the record is handed
/// out. Payloads of sealed segments are not copied: a record borrows the
/// segment's memory map, which stays valid while any record of it lives, even
/// after the segment file is deleted.
#[derive(Clone)]
pub struct Record {
    seq: Seq,
    bytes: Mapped,
    start: usize,
    len: usize,
    timestamp_us: u64,
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

    /// When the writer thread wrote the record (its wall clock, microsecond
    /// resolution).
    pub fn appended_at(&self) -> SystemTime {
        UNIX_EPOCH + Duration::from_micros(self.timestamp_us)
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
    /// The frame failed its check: set it aside rather than hand it out again.
    pub corrupt: bool,
}

/// Reads and checks every claimed frame; stops at the first failure.
/// `skip_crc` is an injected bug (negative control of the crash tests).
pub(crate) fn read_runs(
    runs: &[ClaimRun],
    out: &mut Vec<Record>,
    skip_crc: bool,
) -> Result<(), ReadFailure> {
    for run in runs {
        match &run.source {
            Source::Map(map) => {
                for &f in &run.frames {
                    out.push(check(run, map, f.offset as usize, f, skip_crc)?);
                }
            }
            Source::File(file) => {
                // One read per stretch of adjacent frames.
                let mut i = 0;
                while i < run.frames.len() {
                    let start = run.frames[i].offset;
                    let mut j = i;
                    let mut end = start + run.frames[i].len;
                    while j + 1 < run.frames.len() && run.frames[j + 1].offset == end {
                        j += 1;
                        end += run.frames[j].len;
                    }
                    let mut buf = vec![0u8; (end - start) as usize];
                    if let Err(e) = io::read_exact_at(&**file, &mut buf, u64::from(start)) {
                        return Err(ReadFailure {
                            seq: run.frames[i].seq,
                            error: Error::io("read segment", &*run.path, e),
                            corrupt: false,
                        });
                    }
                    let bytes: Mapped = Arc::new(buf);
                    for &f in &run.frames[i..=j] {
                        let at = (f.offset - start) as usize;
                        out.push(check(run, &bytes, at, f, skip_crc)?);
                    }
                    i = j + 1;
                }
            }
        }
    }
    Ok(())
}

/// Decodes the frame at `at` in `bytes` and checks it is record `seq`.
fn check(
    run: &ClaimRun,
    bytes: &Mapped,
    at: usize,
    frame: ClaimedFrame,
    skip_crc: bool,
) -> Result<Record, ReadFailure> {
    let ClaimedFrame { seq, offset, len } = frame;
    let all: &[u8] = (**bytes).as_ref();
    let fail = |kind| ReadFailure {
        seq,
        error: Error::Corrupt {
            path: run.path.to_path_buf(),
            offset: u64::from(offset),
            seq: Some(seq),
            kind,
        },
        corrupt: true,
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
        });
    }
    let f = frame::decode(window, run.salt).map_err(fail)?;
    if f.header.seq != seq || f.header.kind != FrameKind::Record || f.len != len as usize {
        return Err(fail(Corruption::WrongFrame {
            expected: seq,
            found: f.header.seq,
        }));
    }
    Ok(Record {
        seq,
        bytes: bytes.clone(),
        start: at + FRAME_HEADER_LEN,
        len: f.payload.len(),
        timestamp_us: f.header.timestamp_us,
    })
}

/// The append time of the frame at `offset`, for statistics; `None` if unreadable.
pub(crate) fn frame_time(source: &Source, offset: u32) -> Option<SystemTime> {
    let mut header = [0u8; FRAME_HEADER_LEN];
    match source {
        Source::Map(map) => {
            let all: &[u8] = (**map).as_ref();
            header.copy_from_slice(all.get(offset as usize..offset as usize + FRAME_HEADER_LEN)?);
        }
        Source::File(file) => io::read_exact_at(&**file, &mut header, u64::from(offset)).ok()?,
    }
    frame::timestamp_us(&header).map(|us| UNIX_EPOCH + Duration::from_micros(us))
}
