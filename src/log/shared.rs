//! State shared by the handles of one outbox and its writer thread, and the small
//! synchronisation types between them.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use parking_lot::{Condvar, Mutex};

use crate::error::{Error, Result};
use crate::format::seq::Seq;
use crate::io::segment_file::FileCache;
use crate::io::{LockGuard, Storage};
use crate::options::Options;
use crate::state::table::Table;

/// Everything the handles and the writer thread share.
pub(crate) struct Shared {
    pub dir: PathBuf,
    pub storage: Arc<dyn Storage>,
    /// The sealed segment files open at once, bounded.
    pub files: FileCache,
    pub options: Options,
    pub table: Mutex<Table>,
    /// Notified when records become claimable, and at close.
    pub arrived: Condvar,
    pub closed: AtomicBool,
    /// Set once, by the writer, at the first failed write or sync.
    pub poison: OnceLock<Error>,
    pub budget: Budget,
    pub counters: Counters,
    pub lock: Mutex<Option<LockGuard>>,
}

impl Shared {
    /// Fails if the outbox is closed or poisoned: the check before an append.
    pub(crate) fn check_usable(&self) -> Result<()> {
        self.check_open()?;
        if let Some(e) = self.poison.get() {
            return Err(e.clone());
        }
        Ok(())
    }

    /// Fails if the outbox is closed: the check before a claim or an ack, which
    /// go on working on a poisoned outbox so that a relay can deliver what is
    /// durable while the process prepares to reopen.
    pub(crate) fn check_open(&self) -> Result<()> {
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::Closed);
        }
        Ok(())
    }
}

/// Counters an operator reads in [`Stats`](crate::Stats).
#[derive(Default)]
pub(crate) struct Counters {
    pub fsyncs: AtomicU64,
    pub batches: AtomicU64,
    pub records_appended: AtomicU64,
    pub bytes_appended: AtomicU64,
    pub segments_deleted: AtomicU64,
    pub corrupt_records: AtomicU64,
}

impl Counters {
    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }
}

/// The byte bound of the writer queue: producers acquire the encoded size of their
/// request before sending it, and the writer releases it once the request is
/// finished.
pub(crate) struct Budget {
    used: Mutex<u64>,
    freed: Condvar,
    max: u64,
}

impl Budget {
    pub(crate) fn new(max: u64) -> Budget {
        Budget {
            used: Mutex::new(0),
            freed: Condvar::new(),
            max,
        }
    }

    /// Waits until `bytes` fit (a request alone always fits), unless the outbox
    /// closes first.
    pub(crate) fn acquire(&self, bytes: u64, closed: &AtomicBool) -> Result<()> {
        let mut used = self.used.lock();
        while *used > 0 && *used + bytes > self.max {
            if closed.load(Ordering::Acquire) {
                return Err(Error::Closed);
            }
            self.freed.wait(&mut used);
        }
        *used += bytes;
        Ok(())
    }

    /// Takes `bytes` if they fit now.
    pub(crate) fn try_acquire(&self, bytes: u64) -> bool {
        let mut used = self.used.lock();
        if *used > 0 && *used + bytes > self.max {
            return false;
        }
        *used += bytes;
        true
    }

    /// Bytes taken and not yet given back.
    pub(crate) fn used(&self) -> u64 {
        *self.used.lock()
    }

    pub(crate) fn release(&self, bytes: u64) {
        if bytes == 0 {
            return;
        }
        let mut used = self.used.lock();
        *used -= bytes;
        drop(used);
        self.freed.notify_all();
    }

    /// Wakes every waiter, so that it sees the outbox closed.
    pub(crate) fn wake_all(&self) {
        let _used = self.used.lock();
        self.freed.notify_all();
    }
}

/// A request's share of the queue budget, given back when the request is gone:
/// answered, or dropped on any path (a closed queue, a panicking writer).
pub(crate) struct Ticket {
    shared: Arc<Shared>,
    bytes: u64,
}

impl Ticket {
    /// Takes `bytes` from the budget, waiting (or not) for room.
    pub(crate) fn take(shared: &Arc<Shared>, bytes: u64, wait: bool) -> Result<Ticket> {
        if wait {
            shared.budget.acquire(bytes, &shared.closed)?;
        } else if !shared.budget.try_acquire(bytes) {
            return Err(Error::Full);
        }
        Ok(Ticket {
            shared: shared.clone(),
            bytes,
        })
    }

    /// The encoded bytes of the request.
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Hands the share to the caller, who must give it back with
    /// [`Budget::release`]; the ticket then gives back nothing when dropped.
    pub(crate) fn disarm(&mut self) -> u64 {
        std::mem::take(&mut self.bytes)
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.shared.budget.release(self.bytes);
    }
}

/// Where the writer puts the outcome of one request, and its producer waits.
pub(crate) struct Completion {
    slot: Mutex<Option<Result<Seq>>>,
    done: Condvar,
}

impl Completion {
    /// A completion and the writer's end of it.
    pub(crate) fn new() -> (Arc<Completion>, Completer) {
        let c = Arc::new(Completion {
            slot: Mutex::new(None),
            done: Condvar::new(),
        });
        (c.clone(), Completer(Some(c)))
    }

    /// Waits for the outcome.
    pub(crate) fn wait(&self) -> Result<Seq> {
        let mut slot = self.slot.lock();
        loop {
            if let Some(outcome) = slot.take() {
                return outcome;
            }
            self.done.wait(&mut slot);
        }
    }
}

/// The writer's end of a [`Completion`]. Completing it wakes the producer; dropping
/// it uncompleted (the writer stopped, or panicked) wakes the producer with
/// [`Error::Closed`], so no waiter sleeps forever on any exit path.
pub(crate) struct Completer(Option<Arc<Completion>>);

impl Completer {
    pub(crate) fn complete(mut self, outcome: Result<Seq>) {
        if let Some(c) = self.0.take() {
            *c.slot.lock() = Some(outcome);
            c.done.notify_all();
        }
    }
}

/// Outcomes for the producers of one batch, in the order they are to be woken.
pub(crate) type Answers = Vec<(Completer, Result<Seq>)>;

/// A thread that wakes the producers of finished batches, so that the writer
/// thread can start its next write and `sync_data` while they wake.
///
/// Waking a blocked producer costs a `futex` call and often an inter-processor
/// interrupt: several microseconds each, which the writer would otherwise spend
/// between two `sync_data` calls, with the device idle, once per producer of the
/// batch. The outcomes are decided by the writer before it hands them over; this
/// thread only delivers them, in order.
pub(crate) struct Notifier {
    tx: crossbeam_channel::Sender<Answers>,
    thread: std::thread::JoinHandle<()>,
}

impl Notifier {
    /// Starts the thread; `None` if the system refuses one (the writer then wakes
    /// producers itself).
    pub(crate) fn spawn() -> Option<Notifier> {
        let (tx, rx) = crossbeam_channel::unbounded::<Answers>();
        let thread = std::thread::Builder::new()
            .name("segwal-notify".into())
            .spawn(move || {
                for answers in rx {
                    for (done, outcome) in answers {
                        done.complete(outcome);
                    }
                }
            })
            .ok()?;
        Some(Notifier { tx, thread })
    }

    /// Hands `answers` to the thread, or gives them back if it is gone.
    pub(crate) fn send(&self, answers: Answers) -> std::result::Result<(), Answers> {
        self.tx.send(answers).map_err(|e| e.into_inner())
    }

    /// Delivers everything handed over, then stops the thread.
    pub(crate) fn stop(self) {
        drop(self.tx);
        let _ = self.thread.join();
    }
}

impl Drop for Completer {
    fn drop(&mut self) {
        if let Some(c) = self.0.take() {
            *c.slot.lock() = Some(Err(Error::Closed));
            c.done.notify_all();
        }
    }
}
