//! The raw limit: what the disk allows this design. Producers copy their
//! payload into one shared buffer; one writer thread takes everything queued,
//! writes it with one `pwrite` into a file preallocated with `fallocate`, calls
//! `fdatasync` once, and wakes the producers of that batch. No framing, no
//! checksum, no sequence numbers, no state: nothing could be recovered from
//! this file, which is the point.
//!
//! Two variants are diagnostics, not limits. One writes into a growing file, to
//! separate what a growing file costs each `fdatasync` (the new size is
//! metadata to journal) from what an engine's own work costs. The other
//! overwrites, round and round, a region whose blocks were written and synced
//! at open: each `fdatasync` then carries data only, with no extent to convert
//! and no size to journal, which is what an engine that recycles zero-filled
//! files gets.

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

use super::{Counters, Engine, Result};

/// Bytes allocated at a time: at open, and again whenever a run outgrows them.
const ALLOCATE_BYTES: u64 = 1 << 30;

/// Where the raw writer's bytes go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// A file preallocated with `fallocate`, 1 GiB at a time.
    Fallocated,
    /// A file that grows with every write.
    Growing,
    /// A region of [`OVERWRITE_BYTES`] written with zeros and synced at open,
    /// then overwritten round and round.
    Overwrite,
    /// Preallocated as `Fallocated`, with each batch's `fdatasync` called by a
    /// second thread while the writer writes the next batch.
    Pipelined,
}

/// The region the overwrite variant writes into, round and round.
const OVERWRITE_BYTES: u64 = 64 << 20;

pub struct Raw {
    shared: Arc<Shared>,
    writer: Option<JoinHandle<()>>,
}

struct Shared {
    state: Mutex<State>,
    /// The writer waits here for a non-empty buffer.
    queued: Condvar,
    /// Producers wait here for their batch to be durable.
    durable: Condvar,
}

struct State {
    /// Payloads queued for the next batch, back to back.
    buf: Vec<u8>,
    /// Records in `buf`.
    queued_records: u64,
    /// The number the batch now filling `buf` will have.
    filling: u64,
    /// The newest batch whose `fdatasync` returned.
    durable: u64,
    closed: bool,
    failed: Option<String>,
    counters: Counters,
}

impl Raw {
    pub fn open(dir: &Path, layout: Layout) -> Result<Raw> {
        let path = dir.join("raw.log");
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)?;
        match layout {
            Layout::Fallocated | Layout::Pipelined => allocate(&file, 0, ALLOCATE_BYTES)?,
            Layout::Growing => {}
            Layout::Overwrite => {
                let zeros = vec![0u8; 1 << 20];
                for i in 0..OVERWRITE_BYTES / zeros.len() as u64 {
                    file.write_all_at(&zeros, i * zeros.len() as u64)?;
                }
            }
        }
        // The allocation (file size and extents) is durable before the run.
        file.sync_all()?;
        File::open(dir)?.sync_all()?;
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                buf: Vec::new(),
                queued_records: 0,
                filling: 1,
                durable: 0,
                closed: false,
                failed: None,
                counters: Counters::default(),
            }),
            queued: Condvar::new(),
            durable: Condvar::new(),
        });
        let writer = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("raw-writer".into())
                .spawn(move || {
                    if layout == Layout::Pipelined {
                        write_loop_pipelined(&shared, file)
                    } else {
                        write_loop(&shared, file, layout)
                    }
                })?
        };
        Ok(Raw {
            shared,
            writer: Some(writer),
        })
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn allocate(file: &File, offset: u64, len: u64) -> std::io::Result<()> {
    // SAFETY: `fallocate` on a file descriptor we own, with plain integers.
    let rc = unsafe { libc::fallocate(file.as_raw_fd(), 0, offset as i64, len as i64) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Waits, holding `state`, until a batch is queued; swaps it into `batch`
/// and returns its number and records, or `None` once the engine is closed
/// with nothing queued.
fn take_batch(
    shared: &Shared,
    mut state: MutexGuard<'_, State>,
    batch: &mut Vec<u8>,
) -> Option<(u64, u64)> {
    while state.buf.is_empty() && !state.closed {
        state = shared.queued.wait(state).unwrap_or_else(|e| e.into_inner());
    }
    if state.buf.is_empty() {
        return None;
    }
    std::mem::swap(batch, &mut state.buf);
    let number = state.filling;
    let records = state.queued_records;
    state.filling += 1;
    state.queued_records = 0;
    Some((number, records))
}

/// Reserves more of the file, 1 GiB at a time, when `len` bytes written at
/// `offset` would pass the `allocated` end.
fn grow(file: &File, offset: u64, len: u64, allocated: &mut u64) -> std::io::Result<()> {
    if offset + len <= *allocated {
        return Ok(());
    }
    let more = (offset + len - *allocated).div_ceil(ALLOCATE_BYTES) * ALLOCATE_BYTES;
    let outcome = allocate(file, *allocated, more);
    *allocated += more;
    outcome
}

/// Publishes the outcome of batch `number`'s sync and wakes the producers;
/// false once the writer failed.
fn publish(shared: &Shared, number: u64, records: u64, outcome: std::io::Result<()>) -> bool {
    let mut state = shared.lock();
    match outcome {
        Ok(()) => {
            state.durable = number;
            state.counters.records += records;
            state.counters.batches += 1;
            state.counters.fsyncs += 1;
        }
        // Fail stop: every waiting and later producer gets the error.
        Err(e) => state.failed = Some(format!("raw writer: {e}")),
    }
    let ok = state.failed.is_none();
    drop(state);
    shared.durable.notify_all();
    ok
}

fn write_loop(shared: &Shared, file: File, layout: Layout) {
    let mut batch = Vec::new();
    let mut offset = 0u64;
    let mut allocated = ALLOCATE_BYTES;
    loop {
        let Some((number, records)) = take_batch(shared, shared.lock(), &mut batch) else {
            return;
        };
        let len = batch.len() as u64;
        let mut outcome = Ok(());
        // Producers have one record each in flight, so a batch is far smaller
        // than the region; one that is not just makes the file grow.
        if layout == Layout::Overwrite && offset + len > OVERWRITE_BYTES {
            offset = 0;
        }
        if layout == Layout::Fallocated {
            outcome = grow(&file, offset, len, &mut allocated);
        }
        let outcome = outcome
            .and_then(|()| file.write_all_at(&batch, offset))
            .and_then(|()| file.sync_data());
        offset += len;
        batch.clear();
        if !publish(shared, number, records, outcome) {
            return;
        }
    }
}

/// The writer of [`Layout::Pipelined`]: batch `n + 1` is written while a
/// second thread syncs batch `n`; a batch is durable once a `fdatasync` that
/// began after its write returned.
fn write_loop_pipelined(shared: &Shared, file: File) {
    let file = std::sync::Arc::new(file);
    // One message a sync: the syncer calls `fdatasync` and sends its outcome.
    let (to_syncer, syncs) = std::sync::mpsc::channel::<()>();
    let (synced_tx, synced) = std::sync::mpsc::channel::<std::io::Result<()>>();
    let syncer = {
        let file = file.clone();
        std::thread::spawn(move || {
            for () in syncs {
                if synced_tx.send(file.sync_data()).is_err() {
                    return;
                }
            }
        })
    };
    let mut batch = Vec::new();
    let mut offset = 0u64;
    let mut allocated = ALLOCATE_BYTES;
    // The batch whose sync is in flight: its number and records.
    let mut in_flight: Option<(u64, u64)> = None;
    let finish = |in_flight: &mut Option<(u64, u64)>| -> bool {
        let Some((number, records)) = in_flight.take() else {
            return true;
        };
        let outcome = synced
            .recv()
            .unwrap_or_else(|_| Err(std::io::Error::other("syncer gone")));
        publish(shared, number, records, outcome)
    };
    loop {
        let state = shared.lock();
        // Nothing queued: the sync in flight is finished first, so that its
        // producers are not left waiting for the next batch.
        if state.buf.is_empty() && in_flight.is_some() {
            drop(state);
            if !finish(&mut in_flight) {
                break;
            }
            continue;
        }
        let Some((number, records)) = take_batch(shared, state, &mut batch) else {
            break;
        };
        let len = batch.len() as u64;
        let outcome = grow(&file, offset, len, &mut allocated)
            .and_then(|()| file.write_all_at(&batch, offset));
        offset += len;
        batch.clear();
        if let Err(e) = outcome {
            shared.lock().failed = Some(format!("raw writer: {e}"));
            shared.durable.notify_all();
            break;
        }
        // The previous batch's sync must end before this one's begins: syncs
        // complete in order, one at a time.
        if !finish(&mut in_flight) {
            break;
        }
        if to_syncer.send(()).is_err() {
            break;
        }
        in_flight = Some((number, records));
    }
    finish(&mut in_flight);
    drop(to_syncer);
    let _ = syncer.join();
}

impl Engine for Raw {
    fn append(&self, payload: &[u8]) -> Result<()> {
        let shared = &*self.shared;
        let mut state = shared.lock();
        if let Some(e) = &state.failed {
            return Err(e.clone().into());
        }
        let was_empty = state.buf.is_empty();
        state.buf.extend_from_slice(payload);
        state.queued_records += 1;
        let mine = state.filling;
        if was_empty {
            shared.queued.notify_one();
        }
        while state.durable < mine {
            if let Some(e) = &state.failed {
                return Err(e.clone().into());
            }
            state = shared
                .durable
                .wait(state)
                .unwrap_or_else(|e| e.into_inner());
        }
        Ok(())
    }

    fn counters(&self) -> Option<Counters> {
        Some(self.shared.lock().counters)
    }

    fn close(mut self: Box<Self>) -> Result<()> {
        self.shared.lock().closed = true;
        self.shared.queued.notify_all();
        if let Some(writer) = self.writer.take() {
            writer.join().map_err(|_| "raw writer panicked")?;
        }
        match self.shared.lock().failed.take() {
            Some(e) => Err(e.into()),
            None => Ok(()),
        }
    }
}
