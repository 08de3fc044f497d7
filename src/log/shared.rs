//! State shared by the handles of one outbox and its writer thread, and the small
//! synchronisation types between them.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::error::{Error, Result};
use crate::format::seq::Seq;
use crate::io::segment_file::FileCache;
use crate::io::{LockGuard, Storage};
use crate::log::clock::Clock;
use crate::log::waiters::{LaneCell, Lanes, Waiters};
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
    /// The fork count at the open (`io::fork`): a process whose count
    /// differs is a child of the one that opened the outbox.
    pub generation: u64,
    /// Set once, by the writer, at the first failed write or sync.
    pub poison: OnceLock<Error>,
    pub budget: Budget,
    pub counters: Counters,
    pub lock: Mutex<Option<LockGuard>>,
    /// The clock records' ages are measured on.
    pub clock: Clock,
    /// The digests of deduplication ids, payloads and keys (keyed by the
    /// outbox's identity).
    pub hasher: crate::format::hash::Hasher,
    /// The tasks of `claim_wait_async` waiting for records, woken with the
    /// threads waiting on `arrived`.
    pub arrivals: Wakers,
    /// The deadlines of `claim_wait_async` (a timeout, a lease running out),
    /// started by the first that needs one.
    pub timers: OnceLock<Arc<crate::log::timer::Timers>>,
    /// When the writer thread began to wait for a request, on
    /// [`Clock::now_us`] (at least 1); 0 while it works (1 while it writes
    /// zeros ahead when idle: busy for as long as an fsync, not to be spun
    /// beside). A batch a producer writes on its own thread leaves it as it
    /// is. What [`spin_budget`] reads to tell a writer thread that is about
    /// to take the next request from one asleep.
    pub writer_waiting_since_us: AtomicU64,
    /// Set by the writer thread while it waits for the writer's lock
    /// (`lock_for_thread` in `writer.rs`): a producer appending alone then
    /// queues its append instead of taking the lock ahead of the thread and
    /// the request it took.
    pub writer_wants_lock: AtomicBool,
    /// Set when the open could not make the reserve for want of space
    /// (`io/reserve.rs`); cleared by the writer once it made it. While set,
    /// appends are refused: the space left is the next open's.
    pub reserve_missing: AtomicBool,
    /// Until when the writer thread sleeps, on the outbox's clock
    /// ([`WRITER_AWAKE`] while it works, [`WRITER_NO_DEADLINE`] if it sleeps
    /// until a request). Set under the table's lock together with the
    /// deadline it computed from the table, so that a change of delivery
    /// state can tell whether the thread will come to it in time
    /// ([`Shared::state_noted`]).
    pub writer_sleeps_until_us: AtomicU64,
    /// When a producer appending alone last finished a batch it wrote
    /// itself, on the outbox's clock (0: never): while it keeps writing, its
    /// next batch takes the changes of delivery state along.
    pub caller_batch_end_us: AtomicU64,
    /// What producers blocked on an answer sleep on: one word, so that a
    /// batch's producers are woken by one system call.
    pub waiters: Arc<Waiters>,
}

/// A producer alone in the queue spins for its answer only while batch
/// fsyncs take at most this long on average ([`spin_budget`]).
pub(crate) const SPIN_FSYNC_MAX: Duration = Duration::from_micros(400);

/// A producer spins for its answer only if the writer was working, or had
/// waited for a request no longer than this, when the producer's request
/// was queued ([`spin_budget`]): by then the writer has stopped watching the
/// queue and sleeps, and waking it is the first thing the answer waits for.
pub(crate) const SPIN_WRITER_WAITING_MAX: Duration = Duration::from_micros(50);

/// What [`spin_budget`] decides on.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SpinView {
    /// Requests holding room in the queue, the asking producer's included
    /// (and those of the batch the writer is writing or syncing).
    pub requests: usize,
    /// Appends in the writer's last batch.
    pub last_batch_appends: usize,
    /// The moving average of the batch fsyncs (each new one weighs an
    /// eighth), 0 before the first.
    pub fsync_recent_ns: u64,
    /// `Options::spin_wait`.
    pub enabled: bool,
    /// `Options::linger`.
    pub linger: Duration,
    /// The CPUs this process may use.
    pub cores: usize,
    /// How long the writer had been waiting for a request, `None` if it was
    /// working.
    pub writer_waiting: Option<Duration>,
}

/// How long a producer may spin for its answer: never unless
/// `Options::spin_wait` asks for it (a spinner's CPU, on a virtual machine
/// whose host caps the CPU, came back as stalls of milliseconds:
/// docs/BENCHMARKS.md, "A lone producer sleeps for its answer by default").
/// Then only a producer appending alone spins: its request the only one
/// holding queue room, and the writer's last batch one append. Then the
/// writer has another core, and the wake-up a sleeping producer needs is a
/// cost paid on every append. With other producers, group commit shares the wake-ups and a spinner would
/// take a core the writer and the others need (measured: 4 producers on 2
/// cores lost a third of their rate when the first one back after each
/// batch spun). It spins for twice the recent batch fsync; not at all before
/// the first fsync, when fsyncs average more than [`SPIN_FSYNC_MAX`] (a slow
/// disk: the wake-up is a small part of the wait), with a `linger` (the
/// writer waits that long before it writes, so a spin would only burn the
/// CPU), on a single CPU (the spinner would hold off the writer it waits
/// for), or when the writer had waited for a request longer than
/// [`SPIN_WRITER_WAITING_MAX`]: a producer that appends now and then finds
/// the writer asleep, and on a virtual machine a vCPU spinning beside the
/// one being woken delayed that wake-up by about 100 µs at the median and by
/// milliseconds at the 90th percentile (docs/BENCHMARKS.md, "A producer that
/// appends now and then").
pub(crate) fn spin_budget(view: SpinView) -> Duration {
    let alone = view.requests <= 1 && view.last_batch_appends <= 1;
    let fast = view.fsync_recent_ns > 0 && view.fsync_recent_ns <= SPIN_FSYNC_MAX.as_nanos() as u64;
    let writer_asleep = view
        .writer_waiting
        .is_some_and(|waited| waited > SPIN_WRITER_WAITING_MAX);
    if !view.enabled || !alone || !fast || !view.linger.is_zero() || view.cores < 2 || writer_asleep
    {
        return Duration::ZERO;
    }
    Duration::from_nanos(2 * view.fsync_recent_ns)
}

/// The CPUs this process may use (its affinity and, where the system says,
/// its CPU quota), asked once; 1 when the system cannot tell.
fn cores() -> usize {
    static CORES: OnceLock<usize> = OnceLock::new();
    *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, usize::from))
}

impl Shared {
    /// How long a producer that has just queued its request may watch for
    /// the answer on the CPU before it sleeps ([`Completion::wait_spinning`]):
    /// [`spin_budget`] of what the queue and the writer show now.
    pub(crate) fn spin_for_answer(&self) -> Duration {
        spin_budget(self.spin_view())
    }

    /// What [`spin_budget`] decides on, as the queue, the writer and the
    /// options show it now.
    pub(crate) fn spin_view(&self) -> SpinView {
        // The producer took its room in the queue under the budget's lock,
        // after or before the writer gave back the last batch's (under the
        // same lock, having stored that batch's size first): either way these
        // loads see that size or a newer one. A heuristic only: a stale view
        // costs one spin or one sleep, never an answer.
        let requests = self.budget.requests();
        let last_batch_appends = self.counters.last_batch_appends.load(Ordering::Relaxed);
        let since = self.writer_waiting_since_us.load(Ordering::Relaxed);
        let writer_waiting =
            (since != 0).then(|| Duration::from_micros(self.clock.now_us().saturating_sub(since)));
        SpinView {
            requests,
            last_batch_appends,
            fsync_recent_ns: self.counters.fsync_recent_ns.load(Ordering::Relaxed),
            enabled: self.options.spin_wait,
            linger: self.options.linger,
            cores: cores(),
            writer_waiting,
        }
    }

    /// After a change of delivery state made under the table's lock (`table`
    /// is that lock's guard): notes it, and returns true if the writer
    /// thread must be woken to write it. Not if an older change already
    /// waits (its maker saw to it), nor if the thread is awake (it looks at
    /// the table before it sleeps, and writes what waits: `Writer::sleep`),
    /// nor while a producer appending alone is writing its own batches, the
    /// next of which takes the change along, if the thread looks again
    /// within [`PRODUCER_WRITING_WITHIN_US`] anyway (and writes the change
    /// then if that producer stopped). So a relay acknowledging as fast as a
    /// lone producer appends wakes the thread about every 5 ms, not once an
    /// acknowledgement; otherwise a change reaches the file at once, as it
    /// always did, and is fsynced within the sync interval.
    ///
    /// Also says whether the changes not yet written passed
    /// [`UNWRITTEN_CHANGES_MAX`]: the caller then waits for the writer
    /// ([`Noted::wait`]).
    pub(crate) fn state_noted(&self, table: &mut crate::state::table::Table) -> Noted {
        let wait = table.unwritten_bytes() > UNWRITTEN_CHANGES_MAX;
        let now = self.clock.now_us();
        if !table.note_unwritten(now) {
            return Noted { wake: false, wait };
        }
        let until = self.writer_sleeps_until_us.load(Ordering::Acquire);
        if until == WRITER_AWAKE {
            return Noted { wake: false, wait };
        }
        let wake = !(self.producer_writing(now)
            && until <= now.saturating_add(PRODUCER_WRITING_WITHIN_US));
        Noted { wake, wait }
    }

    /// Whether a producer appending alone finished a batch of its own within
    /// the last [`PRODUCER_WRITING_WITHIN_US`]: it is appending back to back,
    /// and its next batch comes about that soon.
    pub(crate) fn producer_writing(&self, now_us: u64) -> bool {
        let end = self.caller_batch_end_us.load(Ordering::Relaxed);
        end != 0 && now_us.saturating_sub(end) <= PRODUCER_WRITING_WITHIN_US
    }

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
        if self.forked() {
            return Err(Error::Forked);
        }
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::Closed);
        }
        Ok(())
    }

    /// Whether this process is a child (by `fork`) of the one that opened
    /// the outbox: it has none of the outbox's threads and shares its lock,
    /// so it may change nothing.
    pub(crate) fn forked(&self) -> bool {
        crate::io::fork::current() != self.generation
    }

    /// Records became claimable (or the outbox closed): wakes the threads
    /// waiting in `claim_wait` (one of them, or all) and every task waiting in
    /// `claim_wait_async`. Called after the table changed.
    pub(crate) fn notify_arrived(&self, all: bool) {
        if all {
            self.arrived.notify_all();
        } else {
            self.arrived.notify_one();
        }
        self.arrivals.wake_all();
    }

    /// The timer thread of `claim_wait_async`, started on first use (`None`
    /// if the system refuses a thread, or the outbox is closed: the caller
    /// then polls, and sees the outbox closed).
    pub(crate) fn timers(&self) -> Option<&Arc<crate::log::timer::Timers>> {
        if let Some(t) = self.timers.get() {
            return Some(t);
        }
        if self.check_open().is_err() {
            return None;
        }
        let started = crate::log::timer::Timers::start()?;
        let kept = self.timers.get_or_init(|| started.clone());
        if !Arc::ptr_eq(kept, &started) {
            // Another task started one first: this one's thread stops.
            started.stop();
        }
        // A close that looked for the timers before they were kept did not
        // stop them (it fences likewise between its mark and its look).
        std::sync::atomic::fence(Ordering::SeqCst);
        if self.check_open().is_err() {
            kept.stop();
        }
        Some(kept)
    }
}

std::thread_local! {
    /// Set on the threads segwal runs (writer, notifier, timer).
    static OWN_THREAD: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Marks the calling thread as one of segwal's own: the wakers and
/// `tracing` subscribers it runs may drop the last handle of an outbox,
/// whose close must then not wait for that very thread
/// ([`on_own_thread`]).
pub(crate) fn mark_own_thread() {
    OWN_THREAD.with(|own| own.set(true));
}

/// Whether the calling thread is one of segwal's own.
pub(crate) fn on_own_thread() -> bool {
    OWN_THREAD.with(std::cell::Cell::get)
}

/// How recently a producer appending alone must have written a batch of its
/// own for the next one to be counted on to take changes of delivery state
/// along ([`Shared::producer_writing`]): several batch times (an `fdatasync`
/// is 0.1 to 1 ms), and short enough that a producer that stopped leaves
/// them to the writer thread soon. 5 ms.
pub(crate) const PRODUCER_WRITING_WITHIN_US: u64 = 5_000;

/// The most bytes of acknowledgements and other changes of delivery state
/// (their entries in the log, or their memory where that is more:
/// `Table::unwritten_bytes`) that wait for the writer before the callers
/// making more wait for it too, as under `ack_durability(Sync)`: a relay
/// that releases or parks records faster than the disk takes their reasons
/// is held to the disk's pace instead of piling them up in memory. A relay
/// within the disk's pace never comes near it: the writer takes what waits
/// with each batch.
pub(crate) const UNWRITTEN_CHANGES_MAX: usize = 8 << 20;

/// What a change of delivery state asks of its caller
/// ([`Shared::state_noted`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Noted {
    /// The writer thread sleeps past when the change is due: wake it.
    pub(crate) wake: bool,
    /// More than [`UNWRITTEN_CHANGES_MAX`] waits to be written: wait for the
    /// writer.
    pub(crate) wait: bool,
}

/// [`Shared::writer_sleeps_until_us`] while the writer thread works.
pub(crate) const WRITER_AWAKE: u64 = 0;
/// [`Shared::writer_sleeps_until_us`] while it sleeps until a request.
pub(crate) const WRITER_NO_DEADLINE: u64 = u64::MAX;

/// Tasks waiting for something, each woken once when it happens (a task
/// that wants to wait again registers again when it is polled). Each waiting
/// future holds its entry's number and takes the entry out when it is
/// dropped or done, so a future given up leaves nothing behind.
#[derive(Default)]
pub(crate) struct Wakers(Mutex<Waiting>);

/// The wakers of the futures waiting, by entry number.
#[derive(Default)]
struct Waiting {
    next: u64,
    wakers: HashMap<u64, Waker>,
}

impl Wakers {
    /// Registers `waker` for the future whose entry is `entry` (given a
    /// number at its first registration).
    pub(crate) fn register(&self, entry: &mut Option<u64>, waker: &Waker) {
        let mut waiting = self.0.lock();
        let id = match *entry {
            Some(id) => id,
            None => {
                waiting.next += 1;
                *entry = Some(waiting.next);
                waiting.next
            }
        };
        match waiting.wakers.get_mut(&id) {
            Some(w) if w.will_wake(waker) => {}
            Some(w) => *w = waker.clone(),
            None => {
                waiting.wakers.insert(id, waker.clone());
            }
        }
    }

    /// Takes out the entry of a future dropped or done (if it is still
    /// there: a wake takes every entry).
    pub(crate) fn deregister(&self, entry: &mut Option<u64>) {
        if let Some(id) = entry.take() {
            self.0.lock().wakers.remove(&id);
        }
    }

    /// Wakes every registered task, outside the lock.
    pub(crate) fn wake_all(&self) {
        let woken = std::mem::take(&mut self.0.lock().wakers);
        for (_, w) in woken {
            w.wake();
        }
    }

    /// The futures registered now.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.0.lock().wakers.len()
    }
}

/// Counters an operator reads in [`Stats`](crate::Stats).
#[derive(Default)]
pub(crate) struct Counters {
    pub fsyncs: AtomicU64,
    pub batches: AtomicU64,
    /// Write batches written on a producer's own thread
    /// (`Options::caller_writes`).
    pub caller_batches: AtomicU64,
    pub records_appended: AtomicU64,
    pub bytes_appended: AtomicU64,
    pub segments_deleted: AtomicU64,
    pub segments_recycled: AtomicU64,
    /// Acknowledged segments whose deletion waits (set by the writer).
    pub held_for_ids: AtomicU64,
    pub corrupt_records: AtomicU64,
    /// Deduplication ids remembered (set by the writer).
    pub dedup_ids: AtomicU64,
    /// Appends answered as duplicates since open.
    pub duplicates: AtomicU64,
    /// The writer's deduplication memory, in bytes (set by the writer).
    pub dedup_bytes: AtomicU64,
    /// How long the batch fsyncs took (those appends wait for).
    pub fsync_latency: Latencies,
    /// A moving average of the batch fsyncs, in nanoseconds (each new one
    /// weighs an eighth): how long a lone producer may spin for its answer.
    pub fsync_recent_ns: AtomicU64,
    /// Appends in the writer's last batch: 1 while a producer appends alone.
    pub last_batch_appends: AtomicUsize,
}

/// Buckets per power of two of a [`Latencies`] histogram.
const SUB_BUCKETS: u32 = 4;
/// Buckets enough for any `u64` of nanoseconds.
const BUCKETS: usize = 64 * SUB_BUCKETS as usize;

/// A histogram of durations since open, lock-free: four buckets per power of
/// two of nanoseconds, so a percentile read from it is at most a quarter
/// (25 %) above the true value, never below it; and the exact maximum.
pub(crate) struct Latencies {
    buckets: [AtomicU64; BUCKETS],
    max_ns: AtomicU64,
}

impl Default for Latencies {
    fn default() -> Latencies {
        Latencies {
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
            max_ns: AtomicU64::new(0),
        }
    }
}

impl Latencies {
    /// The bucket of `ns`: below 4 its own; above, the power of two and the
    /// quarter of it `ns` falls in.
    fn bucket(ns: u64) -> usize {
        if ns < u64::from(SUB_BUCKETS) {
            return ns as usize;
        }
        let e = 63 - ns.leading_zeros();
        let quarter = (ns >> (e - 2)) & 3;
        ((e - 1) * SUB_BUCKETS) as usize + quarter as usize
    }

    /// The largest value bucket `i` holds.
    fn upper(i: usize) -> u64 {
        if i < SUB_BUCKETS as usize {
            return i as u64;
        }
        let e = (i as u32) / SUB_BUCKETS + 1;
        let quarter = (i as u32 % SUB_BUCKETS) as u64;
        let lower = (4 + quarter) << (e - 2);
        lower.saturating_add((1u64 << (e - 2)) - 1)
    }

    pub(crate) fn record(&self, took: std::time::Duration) {
        let ns = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        self.buckets[Latencies::bucket(ns)].fetch_add(1, Ordering::Relaxed);
        self.max_ns.fetch_max(ns, Ordering::Relaxed);
    }

    /// The `q` quantile (0 to 1) of what was recorded, rounded up to its
    /// bucket's top (never above the maximum); `None` before the first.
    pub(crate) fn quantile(&self, q: f64) -> Option<std::time::Duration> {
        let counts: Vec<u64> = self
            .buckets
            .iter()
            .map(|b| b.load(Ordering::Relaxed))
            .collect();
        let total: u64 = counts.iter().sum();
        if total == 0 {
            return None;
        }
        let rank = ((q.clamp(0.0, 1.0) * total as f64).ceil() as u64).max(1);
        let mut seen = 0;
        let max = self.max_ns.load(Ordering::Relaxed);
        for (i, n) in counts.iter().enumerate() {
            seen += n;
            if seen >= rank {
                return Some(std::time::Duration::from_nanos(
                    Latencies::upper(i).min(max),
                ));
            }
        }
        Some(std::time::Duration::from_nanos(max))
    }

    /// The longest recorded; `None` before the first.
    pub(crate) fn max(&self) -> Option<std::time::Duration> {
        let any = self.buckets.iter().any(|b| b.load(Ordering::Relaxed) > 0);
        any.then(|| std::time::Duration::from_nanos(self.max_ns.load(Ordering::Relaxed)))
    }
}

#[cfg(test)]
mod tests {
    use super::{
        Answers, Completion, Latencies, Notifier, NotifyQueue, SPIN_FSYNC_MAX, SpinView, deliver,
        spin_budget,
    };
    use crate::format::seq::Seq;
    use crate::log::waiters::Waiters;
    use std::sync::Arc;
    use std::time::Duration;

    /// Many producers asleep on one word, answered in groups of every size
    /// (one at a time, a few, all queued), some while others are still
    /// queueing, in lanes the writer stamps or the producer guesses: each
    /// gets its own outcome and none sleeps through its wake-up. A lost wake-up shows as a producer that never returns, which
    /// the watchdog turns into a failure naming how many are stuck.
    #[test]
    fn producers_sleeping_on_one_word_each_get_their_own_answer() {
        const PRODUCERS: u64 = 16;
        const ROUNDS: u64 = 2_000;
        let waiters = Arc::new(Waiters::default());
        let (tx, rx) = crossbeam_channel::unbounded();
        let (done_tx, done_rx) = crossbeam_channel::unbounded();
        let mut threads = Vec::new();
        for p in 0..PRODUCERS {
            let (tx, done_tx, waiters) = (tx.clone(), done_tx.clone(), waiters.clone());
            threads.push(std::thread::spawn(move || {
                for round in 0..ROUNDS {
                    let (completion, done) = Completion::new(&waiters);
                    let mine = p * ROUNDS + round;
                    tx.send((done, mine)).expect("writer");
                    // Every fourth waits spinning a little first.
                    let spin = Duration::from_micros(if round % 4 == 0 { 20 } else { 0 });
                    let outcome = completion.wait_spinning(spin);
                    assert_eq!(outcome.ok(), Some(Seq::from(mine)), "producer {p}");
                }
                done_tx.send(p).expect("test");
            }));
        }
        drop(tx);
        let gatherer = waiters.clone();
        let writer = std::thread::spawn(move || {
            let mut group = 1usize;
            while let Ok(first) = rx.recv() {
                let mut answers: Answers = vec![(first.0, Ok(Seq::from(first.1)))];
                while answers.len() < group {
                    match rx.try_recv() {
                        Ok((done, n)) => answers.push((done, Ok(Seq::from(n)))),
                        Err(_) => break,
                    }
                }
                // As the writer: the batch's lane written into each request
                // (unless its producer chose one first), then the next lane.
                let lane = gatherer.gathering();
                for (done, _) in &answers {
                    done.stamp(lane);
                }
                gatherer.gathered();
                // Answered in reverse: order within a delivery does not matter.
                answers.reverse();
                deliver(answers);
                group = group % (PRODUCERS as usize + 3) + 1;
            }
        });
        let mut finished = 0;
        while finished < PRODUCERS {
            match done_rx.recv_timeout(Duration::from_secs(120)) {
                Ok(_) => finished += 1,
                Err(_) => panic!("{} producers never got an answer", PRODUCERS - finished),
            }
        }
        for t in threads {
            t.join().expect("producer");
        }
        writer.join().expect("writer");
    }

    /// A producer spins only when asked to, and then only when it appends
    /// alone, on a fast disk, without a linger, with a second CPU; for twice
    /// the recent fsync.
    #[test]
    fn only_a_lone_producer_on_a_fast_disk_with_a_spare_cpu_spins() {
        let alone = SpinView {
            requests: 1,
            last_batch_appends: 1,
            fsync_recent_ns: 100_000,
            enabled: true,
            linger: Duration::ZERO,
            cores: 2,
            writer_waiting: None,
        };
        assert_eq!(spin_budget(alone), Duration::from_micros(200));
        // A writer that has just begun to wait still watches the queue.
        assert_eq!(
            spin_budget(SpinView {
                writer_waiting: Some(Duration::from_micros(10)),
                ..alone
            }),
            Duration::from_micros(200)
        );
        let no = |view: SpinView, why: &str| assert_eq!(spin_budget(view), Duration::ZERO, "{why}");
        no(
            SpinView {
                requests: 2,
                ..alone
            },
            "another request in the queue",
        );
        no(
            SpinView {
                last_batch_appends: 3,
                ..alone
            },
            "the last batch was shared",
        );
        no(
            SpinView {
                fsync_recent_ns: 0,
                ..alone
            },
            "no fsync yet",
        );
        let slow = SPIN_FSYNC_MAX.as_nanos() as u64 + 1;
        no(
            SpinView {
                fsync_recent_ns: slow,
                ..alone
            },
            "a slow disk",
        );
        no(
            SpinView {
                linger: Duration::from_micros(50),
                ..alone
            },
            "a linger",
        );
        no(SpinView { cores: 1, ..alone }, "one CPU");
        no(
            SpinView {
                enabled: false,
                ..alone
            },
            "not asked for (the default)",
        );
        no(
            SpinView {
                writer_waiting: Some(Duration::from_micros(60)),
                ..alone
            },
            "the writer asleep: a producer that appends now and then",
        );
        // A first append (nothing written yet, no batch) spins once fsyncs
        // are known.
        assert!(
            !spin_budget(SpinView {
                last_batch_appends: 0,
                ..alone
            })
            .is_zero()
        );
    }

    /// A spinning waiter gets its outcome whether it arrives while it spins,
    /// after it gave up spinning and sleeps, or before it started; and a
    /// writer that drops its end unanswered still wakes it.
    #[test]
    fn a_spinning_waiter_gets_its_outcome_early_or_late() {
        let waiters = Arc::new(Waiters::default());
        for (answer_after, spin) in [
            (Duration::ZERO, Duration::from_millis(50)),
            (Duration::from_millis(2), Duration::from_millis(200)),
            (Duration::from_millis(30), Duration::from_micros(50)),
            (Duration::from_millis(30), Duration::ZERO),
        ] {
            let (completion, done) = Completion::new(&waiters);
            let writer = std::thread::spawn(move || {
                std::thread::sleep(answer_after);
                done.complete(Ok(Seq::from(7)));
            });
            let outcome = completion.wait_spinning(spin);
            assert_eq!(
                outcome.ok(),
                Some(Seq::from(7)),
                "{answer_after:?} {spin:?}"
            );
            writer.join().expect("writer");
        }
        let (completion, done) = Completion::new(&waiters);
        let writer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(5));
            drop(done);
        });
        assert!(matches!(
            completion.wait_spinning(Duration::from_micros(100)),
            Err(crate::Error::Closed)
        ));
        writer.join().expect("writer");
    }

    #[test]
    fn every_value_lies_in_its_bucket_and_buckets_tile_the_line() {
        for ns in (0..5000u64).chain([1 << 20, (1 << 20) + 1, u64::MAX / 3, u64::MAX]) {
            let i = Latencies::bucket(ns);
            assert!(ns <= Latencies::upper(i), "{ns} above bucket {i}");
            if i > 0 {
                assert!(
                    ns > Latencies::upper(i - 1),
                    "{ns} also fits bucket {}",
                    i - 1
                );
            }
            // At most a quarter above the value.
            assert!(
                Latencies::upper(i) - ns <= ns / 4 + 1,
                "{ns}: bucket {i} too wide"
            );
        }
    }

    #[test]
    fn quantiles_come_from_what_was_recorded() {
        let l = Latencies::default();
        assert_eq!(l.quantile(0.5), None);
        assert_eq!(l.max(), None);
        for us in 1..=100u64 {
            l.record(Duration::from_micros(us));
        }
        let p50 = l.quantile(0.5).expect("p50");
        let p99 = l.quantile(0.99).expect("p99");
        assert!(
            p50 >= Duration::from_micros(50) && p50 <= Duration::from_micros(63),
            "{p50:?}"
        );
        assert!(
            p99 >= Duration::from_micros(99) && p99 <= Duration::from_micros(100),
            "{p99:?}"
        );
        assert_eq!(l.max(), Some(Duration::from_micros(100)));
    }

    /// Waits for each of `completions` in another thread, and fails the
    /// test if they are not all answered within a minute (rather than hang).
    fn answered_within_a_minute(completions: Vec<Arc<Completion>>) -> Vec<crate::Result<Seq>> {
        let (tx, rx) = crossbeam_channel::bounded(1);
        let n = completions.len();
        std::thread::spawn(move || {
            let outcomes: Vec<_> = completions.iter().map(|c| c.wait()).collect();
            let _ = tx.send(outcomes);
        });
        rx.recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|_| panic!("{n} producers were not all answered"))
    }

    /// Batches handed to the notifier are delivered, every producer its own
    /// outcome, while the thread runs (not only by `stop`), including a
    /// batch handed over while the thread sleeps.
    #[test]
    fn the_notifier_delivers_every_batch_handed_over() {
        const BATCHES: u64 = 200;
        const PER: u64 = 20;
        let waiters = Arc::new(Waiters::default());
        let notifier = Notifier::spawn().expect("a thread");
        for b in 0..BATCHES {
            let mut answers: Answers = Vec::new();
            let mut waiting = Vec::new();
            for k in 0..PER {
                let (completion, done) = Completion::new(&waiters);
                answers.push((done, Ok(Seq::from(b * PER + k + 1))));
                waiting.push(completion);
            }
            // Every tenth batch finds the thread asleep.
            if b % 10 == 0 {
                std::thread::sleep(Duration::from_millis(2));
            }
            assert!(notifier.send(answers).is_ok(), "the thread is running");
            let outcomes = answered_within_a_minute(waiting);
            for (k, outcome) in outcomes.into_iter().enumerate() {
                assert_eq!(outcome.ok(), Some(Seq::from(b * PER + k as u64 + 1)));
            }
        }
        notifier.stop();
    }

    /// Each waiting future has an entry of its own, which it takes out when
    /// it goes; a wake empties them all; a task polled again keeps one.
    #[test]
    fn waiting_futures_leave_no_entry_behind() {
        struct Noop;
        impl std::task::Wake for Noop {
            fn wake(self: Arc<Self>) {}
        }
        let w = super::Wakers::default();
        let waker = std::task::Waker::from(Arc::new(Noop));
        let (mut a, mut b) = (None, None);
        w.register(&mut a, &waker);
        w.register(&mut a, &waker);
        w.register(&mut b, &waker);
        assert_eq!(w.len(), 2, "two futures of one task, one entry each");
        w.deregister(&mut a);
        assert_eq!((w.len(), a), (1, None));
        w.wake_all();
        assert_eq!(w.len(), 0);
        w.deregister(&mut b);
        w.register(&mut b, &waker);
        assert_eq!(w.len(), 1);
        w.deregister(&mut b);
        assert_eq!(w.len(), 0);
    }

    /// A task whose waker panics (its runtime's bug) neither stops the
    /// notifier nor keeps the rest of its batch, or later batches, from
    /// their answers; the task's own outcome is left for it.
    #[test]
    fn a_panicking_waker_does_not_stop_the_notifier() {
        struct Panics;
        impl std::task::Wake for Panics {
            fn wake(self: Arc<Self>) {
                panic!("injected: a runtime's waker panics");
            }
        }
        let waiters = Arc::new(Waiters::default());
        let notifier = Notifier::spawn().expect("a thread");
        let (task, done) = Completion::new(&waiters);
        let waker = std::task::Waker::from(Arc::new(Panics));
        let mut cx = std::task::Context::from_waker(&waker);
        assert!(task.poll(&mut cx).is_pending());
        let mut answers: Answers = vec![(done, Ok(Seq::from(1)))];
        let mut waiting = Vec::new();
        for k in 2..20 {
            let (completion, done) = Completion::new(&waiters);
            answers.push((done, Ok(Seq::from(k))));
            waiting.push(completion);
        }
        assert!(notifier.send(answers).is_ok());
        let outcomes = answered_within_a_minute(waiting);
        assert!(outcomes.iter().all(|o| o.is_ok()), "{outcomes:?}");
        assert!(matches!(task.poll(&mut cx), std::task::Poll::Ready(Ok(s)) if s == Seq::from(1)));
        let (later, done) = Completion::new(&waiters);
        assert!(
            notifier.send(vec![(done, Ok(Seq::from(20)))]).is_ok(),
            "the thread still runs"
        );
        let later = answered_within_a_minute(vec![later]);
        assert_eq!(later[0].as_ref().ok(), Some(&Seq::from(20)));
        notifier.stop();
    }

    /// A delivery that panics (a bug) ends the thread, but first it delivers
    /// every batch still queued, and every later batch is handed back for
    /// the writer to deliver: no producer waits forever, and none is told
    /// `Closed` for a record that was written.
    #[test]
    fn a_notifier_whose_delivery_panicked_delivers_its_queue_and_hands_batches_back() {
        let waiters = Arc::new(Waiters::default());
        let queue = Arc::new(NotifyQueue::default());
        let batch = |seq: u64| {
            let (completion, done) = Completion::new(&waiters);
            let answers: Answers = vec![(done, Ok(Seq::from(seq)))];
            (completion, answers)
        };
        let (first, a) = batch(1);
        let (second, b) = batch(2);
        let (third, c) = batch(3);
        queue.state.lock().batches.extend([a, b, c]);
        let serving = queue.clone();
        let thread = std::thread::spawn(move || {
            let delivered = std::sync::atomic::AtomicU64::new(0);
            serving.serve(|answers| {
                if delivered.fetch_add(1, std::sync::atomic::Ordering::Relaxed) == 0 {
                    panic!("injected: a delivery panics");
                }
                deliver(answers)
            })
        });
        thread.join().expect("the panic is caught in the thread");
        assert!(queue.state.lock().gone);
        let notifier = Notifier {
            queue,
            thread: None,
        };
        let (fourth, d) = batch(4);
        let back = notifier.send(d).expect_err("a gone thread takes nothing");
        deliver(back);
        let outcomes = answered_within_a_minute(vec![first, second, third, fourth]);
        assert!(
            matches!(outcomes[0], Err(crate::Error::Poisoned { .. })),
            "the batch the panic dropped is in doubt: {:?}",
            outcomes[0]
        );
        let rest: Vec<_> = outcomes[1..]
            .iter()
            .map(|o| o.as_ref().ok().copied())
            .collect();
        assert_eq!(
            rest,
            [Some(Seq::from(2)), Some(Seq::from(3)), Some(Seq::from(4))]
        );
        notifier.stop();
    }
}

impl Counters {
    pub(crate) fn set(counter: &AtomicU64, n: u64) {
        counter.store(n, Ordering::Relaxed);
    }

    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }
}

/// The bounds of the writer queue, in bytes and in append requests: producers
/// acquire their request's encoded size (and one request) *before* they copy its
/// payloads, and the writer gives both back once the request is finished. So
/// the payload copies alive at once are bounded by `queue_bytes`, and the
/// queue holds no memory for requests not yet made (its channel is unbounded;
/// this is its bound).
pub(crate) struct Budget {
    used: Mutex<Used>,
    freed: Condvar,
    /// Async producers waiting for room, woken with the threads on `freed`.
    waiting: Wakers,
    max_bytes: u64,
    max_requests: usize,
    /// `used.requests`, readable without the lock.
    requests: AtomicUsize,
}

/// What the queue holds now.
#[derive(Default)]
struct Used {
    bytes: u64,
    requests: usize,
}

impl Used {
    /// Whether a request of `bytes` fits (a request alone always fits).
    fn fits(&self, bytes: u64, budget: &Budget) -> bool {
        self.requests == 0
            || (self.bytes + bytes <= budget.max_bytes && self.requests < budget.max_requests)
    }
}

impl Budget {
    pub(crate) fn new(max_bytes: u64, max_requests: usize) -> Budget {
        Budget {
            used: Mutex::new(Used::default()),
            freed: Condvar::new(),
            waiting: Wakers::default(),
            max_bytes,
            max_requests,
            requests: AtomicUsize::new(0),
        }
    }

    /// Waits until a request of `bytes` fits, unless the outbox closes first.
    pub(crate) fn acquire(&self, bytes: u64, closed: &AtomicBool) -> Result<()> {
        let mut used = self.used.lock();
        while !used.fits(bytes, self) {
            if closed.load(Ordering::Acquire) {
                return Err(Error::Closed);
            }
            self.freed.wait(&mut used);
        }
        used.bytes += bytes;
        used.requests += 1;
        self.requests.store(used.requests, Ordering::Relaxed);
        Ok(())
    }

    /// [`acquire`](Budget::acquire) for a task: takes room for a request of
    /// `bytes` if it fits now, or registers the task to be woken when room is
    /// given back (or the outbox closes).
    pub(crate) fn poll_acquire(
        &self,
        bytes: u64,
        closed: &AtomicBool,
        entry: &mut Option<u64>,
        cx: &mut Context<'_>,
    ) -> Poll<Result<()>> {
        let mut used = self.used.lock();
        if used.fits(bytes, self) {
            used.bytes += bytes;
            used.requests += 1;
            self.requests.store(used.requests, Ordering::Relaxed);
            return Poll::Ready(Ok(()));
        }
        if closed.load(Ordering::Acquire) {
            return Poll::Ready(Err(Error::Closed));
        }
        // Registered under the lock that `release` takes before it wakes:
        // room given back after the check above wakes this task.
        self.waiting.register(entry, cx.waker());
        Poll::Pending
    }

    /// Takes out the waker a future waiting for room registered (dropped,
    /// or given room).
    pub(crate) fn forget_waiter(&self, entry: &mut Option<u64>) {
        self.waiting.deregister(entry);
    }

    /// Takes room for a request of `bytes` if it fits now.
    pub(crate) fn try_acquire(&self, bytes: u64) -> bool {
        let mut used = self.used.lock();
        if !used.fits(bytes, self) {
            return false;
        }
        used.bytes += bytes;
        used.requests += 1;
        self.requests.store(used.requests, Ordering::Relaxed);
        true
    }

    /// Requests holding room now (read without the lock: a moment's view).
    pub(crate) fn requests(&self) -> usize {
        self.requests.load(Ordering::Relaxed)
    }

    /// Bytes taken and not yet given back.
    pub(crate) fn used(&self) -> u64 {
        self.used.lock().bytes
    }

    /// Gives back `requests` requests of `bytes` in all.
    pub(crate) fn release(&self, bytes: u64, requests: usize) {
        if requests == 0 {
            return;
        }
        let mut used = self.used.lock();
        used.bytes -= bytes;
        used.requests -= requests;
        self.requests.store(used.requests, Ordering::Relaxed);
        drop(used);
        self.freed.notify_all();
        self.waiting.wake_all();
    }

    /// Wakes every waiter, so that it sees the outbox closed.
    pub(crate) fn wake_all(&self) {
        {
            let _used = self.used.lock();
            self.freed.notify_all();
        }
        self.waiting.wake_all();
    }
}

/// A producer's share of the queue budget: one request of `bytes`.
pub(crate) struct Ticket {
    shared: Arc<Shared>,
    bytes: u64,
    armed: bool,
}

impl Ticket {
    /// Takes room for one request of `bytes`, waiting (or not) for it.
    pub(crate) fn take(shared: &Arc<Shared>, bytes: u64, wait: bool) -> Result<Ticket> {
        if wait {
            shared.budget.acquire(bytes, &shared.closed)?;
        } else if !shared.budget.try_acquire(bytes) {
            return Err(Error::Full);
        }
        Ok(Ticket {
            shared: shared.clone(),
            bytes,
            armed: true,
        })
    }

    /// [`take`](Ticket::take) for a task: the ticket once the queue has room.
    pub(crate) fn poll_take(
        shared: &Arc<Shared>,
        bytes: u64,
        entry: &mut Option<u64>,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Ticket>> {
        shared
            .budget
            .poll_acquire(bytes, &shared.closed, entry, cx)
            .map_ok(|()| Ticket {
                shared: shared.clone(),
                bytes,
                armed: true,
            })
    }

    /// The encoded bytes of the request.
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Hands the share to the caller, who must give it back with
    /// [`Budget::release`] (its bytes, and one request); the ticket then gives
    /// back nothing when dropped.
    pub(crate) fn disarm(&mut self) -> u64 {
        self.armed = false;
        self.bytes
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if self.armed {
            self.shared.budget.release(self.bytes, 1);
        }
    }
}

/// What became of one message of an append.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    Written(Seq),
    Duplicate(Seq),
    Conflict(Seq),
}

/// The verdicts of one append's messages, in order: none (an append of plain
/// records), one without a heap allocation, or more.
#[derive(Clone, Debug, Default)]
pub(crate) enum Verdicts {
    #[default]
    None,
    One(Verdict),
    Many(Vec<Verdict>),
}

impl Verdicts {
    pub(crate) fn push(&mut self, v: Verdict) {
        *self = match std::mem::take(self) {
            Verdicts::None => Verdicts::One(v),
            Verdicts::One(first) => Verdicts::Many(vec![first, v]),
            Verdicts::Many(mut all) => {
                all.push(v);
                Verdicts::Many(all)
            }
        };
    }

    pub(crate) fn as_slice(&self) -> &[Verdict] {
        match self {
            Verdicts::None => &[],
            Verdicts::One(v) => std::slice::from_ref(v),
            Verdicts::Many(all) => all,
        }
    }
}

/// Where the writer puts the outcome of one request, and its producer waits.
pub(crate) struct Completion {
    slot: Mutex<Slot>,
    /// Set once the outcome is in `slot`: what a waiter watches, spinning or
    /// asleep on `waiters`.
    ready: AtomicBool,
    /// For an append of messages: what became of each.
    verdicts: Mutex<Verdicts>,
    /// The outbox's word its blocked producers sleep on.
    waiters: Arc<Waiters>,
    /// The lane it sleeps in there.
    lane: LaneCell,
}

/// The outcome once the writer left it, and the task to wake then (an async
/// producer), under one lock.
#[derive(Default)]
struct Slot {
    outcome: Option<Result<Seq>>,
    waker: Option<Waker>,
}

impl Completion {
    /// A completion and the writer's end of it; its producer sleeps on
    /// `waiters` (the outbox's, [`Shared::waiters`]).
    pub(crate) fn new(waiters: &Arc<Waiters>) -> (Arc<Completion>, Completer) {
        let c = Arc::new(Completion {
            slot: Mutex::new(Slot::default()),
            ready: AtomicBool::new(false),
            verdicts: Mutex::new(Verdicts::None),
            waiters: waiters.clone(),
            lane: LaneCell::default(),
        });
        (c.clone(), Completer(Some(c)))
    }

    /// Waits for the outcome.
    pub(crate) fn wait(&self) -> Result<Seq> {
        self.wait_spinning(Duration::ZERO)
    }

    /// Waits for the outcome, watching for it on the CPU for up to `spin`
    /// before sleeping: a producer woken from sleep costs a futex call and a
    /// scheduler wake-up (on a virtual machine, often a halted vCPU to
    /// restart), which a lone producer pays on every append.
    ///
    /// Between rounds of watching, the spinner yields its CPU to any thread
    /// waiting to run on it: the scheduler may have put the writer on the
    /// spinner's CPU (it wakes a thread near its waker), and a spinner that
    /// held the CPU would keep the writer from the very write and answer it
    /// waits for, for the whole spin (measured: a lone producer on the
    /// writer's CPU fell to a quarter of its rate; docs/BENCHMARKS.md, "A
    /// spinning producer yields its CPU").
    pub(crate) fn wait_spinning(&self, spin: Duration) -> Result<Seq> {
        if !spin.is_zero() {
            let started = Instant::now();
            'spin: loop {
                for _ in 0..64 {
                    if self.ready.load(Ordering::Acquire) {
                        break 'spin;
                    }
                    std::hint::spin_loop();
                }
                if started.elapsed() >= spin {
                    break;
                }
                std::thread::yield_now();
            }
        }
        self.waiters.sleep_until(&self.ready, &self.lane);
        // `ready` is set after the outcome is left, under this lock; it is
        // taken once, by this one waiter.
        self.slot
            .lock()
            .outcome
            .take()
            .unwrap_or(Err(Error::Closed))
    }

    /// [`wait`](Completion::wait) for a task: the outcome if the writer left
    /// it, else the task is woken when it does.
    pub(crate) fn poll(&self, cx: &mut Context<'_>) -> Poll<Result<Seq>> {
        let mut slot = self.slot.lock();
        if let Some(outcome) = slot.outcome.take() {
            return Poll::Ready(outcome);
        }
        match &slot.waker {
            Some(w) if w.will_wake(cx.waker()) => {}
            _ => slot.waker = Some(cx.waker().clone()),
        }
        Poll::Pending
    }

    /// Leaves `outcome` and wakes the task waiting for it, if any. A thread
    /// asleep on `waiters` is woken by the [`Waiters::wake`] of its lane that
    /// must follow (one call for a whole batch, or [`wake`](Completion::wake)
    /// for this completion alone).
    fn finish(&self, outcome: Result<Seq>) {
        let waker = {
            let mut slot = self.slot.lock();
            slot.outcome = Some(outcome);
            // Sequentially consistent: see `Waiters::sleep_until`.
            self.ready.store(true, Ordering::SeqCst);
            slot.waker.take()
        };
        if let Some(w) = waker {
            // A task's waker is its runtime's code: one that panics (a bug
            // there) must not take the writer or the notifier down with it,
            // nor the wake-ups of the rest of the batch. The task is not
            // woken; a thread waiting on `waiters` is, by the caller.
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| w.wake()));
        }
    }

    /// Wakes the producer of this completion alone, after [`finish`](Completion::finish).
    fn wake(&self) {
        let mut lanes = Lanes::default();
        lanes.add(&self.lane);
        self.waiters.wake(lanes);
    }

    /// The verdicts the writer left (after [`Completion::wait`]).
    pub(crate) fn take_verdicts(&self) -> Verdicts {
        std::mem::take(&mut *self.verdicts.lock())
    }
}

/// The writer's end of a [`Completion`]. Completing it wakes the producer; dropping
/// it uncompleted wakes the producer with [`Error::Closed`] (the writer
/// stopped), or with [`Error::Poisoned`] if a panic of the writer drops it
/// (the request may have been written: it is in doubt), so no waiter sleeps
/// forever on any exit path.
pub(crate) struct Completer(Option<Arc<Completion>>);

impl Completer {
    /// Leaves the verdicts of an append's messages, before it is completed.
    pub(crate) fn set_verdicts(&self, verdicts: Verdicts) {
        if let Some(c) = &self.0 {
            *c.verdicts.lock() = verdicts;
        }
    }

    /// Writes the lane of the batch the writer gathered the request into,
    /// unless its producer already chose one ([`LaneCell::stamp`]).
    pub(crate) fn stamp(&self, lane: u32) {
        if let Some(c) = &self.0 {
            c.lane.stamp(lane);
        }
    }

    /// Leaves `outcome` and wakes its producer.
    pub(crate) fn complete(mut self, outcome: Result<Seq>) {
        if let Some(c) = self.0.take() {
            c.finish(outcome);
            c.wake();
        }
    }
}

/// Leaves every outcome of `answers`, in order, then wakes their producers
/// with one system call ([`Waiters`]).
pub(crate) fn deliver(answers: Answers) {
    let mut waiters = None;
    let mut lanes = Lanes::default();
    for (mut done, outcome) in answers {
        if let Some(c) = done.0.take() {
            c.finish(outcome);
            lanes.add(&c.lane);
            waiters.get_or_insert_with(|| c.waiters.clone());
        }
    }
    if let Some(waiters) = waiters {
        waiters.wake(lanes);
    }
}

/// Outcomes for the producers of one batch (all woken together by [`deliver`]).
pub(crate) type Answers = Vec<(Completer, Result<Seq>)>;

/// A thread that wakes the producers of finished batches, so that the writer
/// thread can start its next write and `sync_data` while they wake.
///
/// A batch is woken by one `futex` call, but that call does the kernel's work
/// for every sleeper it wakes (each one made runnable, often with an
/// inter-processor interrupt), on the calling thread: for a large batch, time
/// the writer would otherwise spend between two `sync_data` calls with the
/// device idle. The outcomes are decided by the writer before it hands them
/// over; this thread only leaves them and makes the call.
pub(crate) struct Notifier {
    queue: Arc<NotifyQueue>,
    /// Taken by [`Notifier::stop`].
    thread: Option<std::thread::JoinHandle<()>>,
}

/// The batches handed to the notifier. A lock and a condition variable
/// rather than a channel: a channel's receiver spins, then yields, before it
/// sleeps, and on two processors that spinning takes the time the producers
/// and the writer need (docs/BENCHMARKS.md, "The notifier sleeps at once").
#[derive(Default)]
struct NotifyQueue {
    state: Mutex<NotifyState>,
    ready: Condvar,
}

#[derive(Default)]
struct NotifyState {
    batches: std::collections::VecDeque<Answers>,
    /// No more batches are coming: the thread delivers what is queued and
    /// ends.
    stopped: bool,
    /// The thread is waiting on `ready` (a batch handed over then wakes it).
    parked: bool,
    /// A delivery panicked (a bug): the thread delivered what was queued and
    /// ended, and whoever hands over a batch now delivers it itself.
    gone: bool,
}

impl NotifyQueue {
    /// The thread's loop: delivers each batch in the order handed over (by
    /// `deliver`: [`deliver`] itself but in tests), sleeping when there is
    /// none, until stopped with nothing queued.
    ///
    /// A delivery that panics (a bug: [`Completion::finish`] already keeps a
    /// task's panicking waker from reaching it) is caught, so that no batch
    /// is left in the queue with nobody to deliver it: the queue is marked
    /// gone and emptied under one hold of its lock, so every batch is either
    /// taken here or handed back to the writer by [`Notifier::send`].
    fn serve(&self, deliver: impl Fn(Answers)) {
        loop {
            let answers = {
                let mut state = self.state.lock();
                loop {
                    if let Some(answers) = state.batches.pop_front() {
                        break answers;
                    }
                    if state.stopped {
                        return;
                    }
                    state.parked = true;
                    self.ready.wait(&mut state);
                    state.parked = false;
                }
            };
            let delivered =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| deliver(answers)));
            if delivered.is_err() {
                let left: Vec<Answers> = {
                    let mut state = self.state.lock();
                    state.gone = true;
                    state.batches.drain(..).collect()
                };
                for answers in left {
                    let _ =
                        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| deliver(answers)));
                }
                return;
            }
        }
    }
}

impl Notifier {
    /// Starts the thread; `None` if the system refuses one (the writer then wakes
    /// producers itself).
    pub(crate) fn spawn() -> Option<Notifier> {
        let queue = Arc::new(NotifyQueue::default());
        let thread = {
            let queue = queue.clone();
            std::thread::Builder::new()
                .name("segwal-notify".into())
                .spawn(move || {
                    mark_own_thread();
                    queue.serve(deliver)
                })
                .ok()?
        };
        Some(Notifier {
            queue,
            thread: Some(thread),
        })
    }

    /// Hands `answers` to the thread, or gives them back if it is gone.
    pub(crate) fn send(&self, answers: Answers) -> std::result::Result<(), Answers> {
        let mut state = self.queue.state.lock();
        if state.gone {
            return Err(answers);
        }
        state.batches.push_back(answers);
        let parked = state.parked;
        drop(state);
        if parked {
            self.queue.ready.notify_one();
        }
        Ok(())
    }

    /// Delivers everything handed over, then stops the thread.
    pub(crate) fn stop(mut self) {
        self.queue.state.lock().stopped = true;
        self.queue.ready.notify_one();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Notifier {
    /// Dropped without [`Notifier::stop`]: the thread still delivers what
    /// was handed over, then ends (not waited for).
    fn drop(&mut self) {
        self.queue.state.lock().stopped = true;
        self.queue.ready.notify_one();
    }
}

impl Drop for Completer {
    fn drop(&mut self) {
        if let Some(c) = self.0.take() {
            // Dropped by a panic of the writer (a bug) that interrupted its
            // batch: the request may have been written, so its producer is
            // told it is in doubt, as the poison tells every later append,
            // never `Closed` (which says it never reached the writer).
            let outcome = if std::thread::panicking() {
                Err(Error::Poisoned {
                    path: std::path::PathBuf::new(),
                    op: "write (the writer panicked with this request in its batch)",
                    source: Arc::new(std::io::Error::other("the writer panicked")),
                })
            } else {
                Err(Error::Closed)
            };
            c.finish(outcome);
            c.wake();
        }
    }
}
