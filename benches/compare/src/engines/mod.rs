//! The engines under comparison, behind one trait, and how each is opened.

mod fjall;
mod okaywal;
mod raw;
mod segwal;
mod sqlite;

use std::path::Path;
use std::time::Duration;

/// Any engine's error, boxed: the harness only reports it and stops.
pub type Error = Box<dyn std::error::Error + Send + Sync>;
/// The harness's result.
pub type Result<T> = std::result::Result<T, Error>;

/// One storage engine opened on a fresh directory, shared by every producer.
pub trait Engine: Send + Sync {
    /// Appends one record and returns once the engine says it is durable (for
    /// the engines labelled not durable, once it says it is committed).
    fn append(&self, payload: &[u8]) -> Result<()>;

    /// Write batches and fsyncs so far, for the engines that count them.
    fn counters(&self) -> Option<Counters> {
        None
    }

    /// The engine's queue, for the engines that have one (claim and acknowledge).
    fn queue(&self) -> Option<&dyn Queue> {
        None
    }

    /// Flushes and closes the engine, reporting a failure of its last fsync.
    fn close(self: Box<Self>) -> Result<()>;
}

/// An outbox queue: records come out oldest first and leave once acknowledged.
pub trait Queue: Sync {
    /// Appends `count` copies of `payload` as fast as the engine allows (in
    /// batches or one transaction); the setup of a drain, not timed.
    fn fill(&self, payload: &[u8], count: u64) -> Result<()>;

    /// Takes up to `max` of the oldest records, reads their payloads, and
    /// acknowledges (deletes) them. Returns how many it took.
    fn drain(&self, max: usize) -> Result<usize>;

    /// Like [`drain`](Queue::drain), but when nothing is pending waits for
    /// records the engine's own way, up to about `wait`, as a relay that keeps
    /// up does. Without a way to wait, the engine is polled: one `drain`, and
    /// a nap of a tenth of a millisecond when it found nothing, which leaves
    /// the CPU to the producers.
    fn drain_wait(&self, max: usize, wait: Duration) -> Result<usize> {
        let n = self.drain(max)?;
        if n == 0 {
            std::thread::sleep(POLL_NAP.min(wait));
        }
        Ok(n)
    }
}

/// How long a polled queue's relay naps when it found nothing pending.
const POLL_NAP: Duration = Duration::from_micros(100);

/// Records, write batches and fsyncs since the engine opened.
#[derive(Clone, Copy, Debug, Default)]
pub struct Counters {
    pub records: u64,
    pub batches: u64,
    pub fsyncs: u64,
}

impl Counters {
    /// What happened between `self` (earlier) and `later`.
    pub fn delta(self, later: Counters) -> Counters {
        Counters {
            records: later.records - self.records,
            batches: later.batches - self.batches,
            fsyncs: later.fsyncs - self.fsyncs,
        }
    }
}

/// The engines, in the order a cell runs them: the raw limit first, so that
/// every other engine's ratio is to a limit measured just before it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// One writer thread, one `pwrite` and one `fdatasync` per batch into a
    /// file preallocated with `fallocate`: no framing, no state.
    Raw,
    /// The same writer into a file that grows with every write: not a limit,
    /// a diagnostic of what file growth costs each `fdatasync`.
    RawGrowing,
    /// The same writer overwriting a region written and synced at open: not a
    /// limit, a diagnostic of what a data-only `fdatasync` allows.
    RawOverwrite,
    /// The raw writer with its `fdatasync` on a second thread, so that the
    /// next batch is written while the last one syncs: run only when named,
    /// a diagnostic of what overlapping the two allows.
    RawPipelined,
    /// segwal with a linger (`Options::linger`, [`segwal::LINGER`]): batches
    /// that hold every producer, at the cost of the wait. Run only when named,
    /// a diagnostic of what bigger batches give.
    SegwalLinger,
    /// segwal with `Options::spin_wait(true)`: a producer appending alone
    /// watches for its answer on the CPU. Run only when named.
    SegwalSpin,
    /// segwal with `Options::caller_writes(false)`: every append handed to
    /// the writer thread, a lone producer's included. Run only when named.
    SegwalHandoff,
    /// segwal with default options (`Durability::Sync`).
    Segwal,
    /// segwal with segment recycling off (`Options::recycle_segments(false)`):
    /// every segment a new file, zeros written ahead of its frames. Run only
    /// when named (`--only`), to measure what recycling changes.
    SegwalNewFiles,
    /// segwal with index checkpoints off (`Options::checkpoint_bytes(0)`):
    /// run only when named, to measure what writing them costs an append.
    SegwalNoCheckpoints,
    /// segwal, each record appended as a message with a deduplication id of
    /// its own: what remembering ids costs an append.
    SegwalDedup,
    /// SQLite in WAL mode, `synchronous=FULL`: every commit fsyncs the WAL.
    SqliteFull,
    /// SQLite in WAL mode, `synchronous=NORMAL`: commits are not fsynced, only
    /// checkpoints are. Survives a process crash, not a power loss.
    SqliteNormal,
    /// fjall: insert under a big-endian u64 key, then `persist(SyncData)`.
    Fjall,
    /// okaywal: one entry of one chunk per record, committed.
    Okaywal,
}

impl Kind {
    /// Every engine, in running order.
    pub const ALL: [Kind; 15] = [
        Kind::Raw,
        Kind::RawGrowing,
        Kind::RawOverwrite,
        Kind::RawPipelined,
        Kind::Segwal,
        Kind::SegwalLinger,
        Kind::SegwalSpin,
        Kind::SegwalHandoff,
        Kind::SegwalNewFiles,
        Kind::SegwalNoCheckpoints,
        Kind::SegwalDedup,
        Kind::SqliteFull,
        Kind::SqliteNormal,
        Kind::Fjall,
        Kind::Okaywal,
    ];

    /// The engines a run takes unless `--only` names others.
    pub const DEFAULT: [Kind; 9] = [
        Kind::Raw,
        Kind::RawGrowing,
        Kind::RawOverwrite,
        Kind::Segwal,
        Kind::SegwalDedup,
        Kind::SqliteFull,
        Kind::SqliteNormal,
        Kind::Fjall,
        Kind::Okaywal,
    ];

    /// The name in tables, charts and JSON.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Raw => "raw limit",
            Kind::RawGrowing => "raw (growing file)",
            Kind::RawOverwrite => "raw (overwrite)",
            Kind::RawPipelined => "raw (pipelined sync)",
            Kind::SegwalLinger => "segwal linger",
            Kind::SegwalSpin => "segwal spin",
            Kind::SegwalHandoff => "segwal handoff",
            Kind::Segwal => "segwal",
            Kind::SegwalNewFiles => "segwal new files",
            Kind::SegwalNoCheckpoints => "segwal no checkpoints",
            Kind::SegwalDedup => "segwal dedup ids",
            Kind::SqliteFull => "sqlite FULL",
            Kind::SqliteNormal => "sqlite NORMAL",
            Kind::Fjall => "fjall",
            Kind::Okaywal => "okaywal",
        }
    }

    /// Whether a record is on stable storage when `append` returns.
    pub fn durable(self) -> bool {
        self != Kind::SqliteNormal
    }

    /// Whether the engine has a queue (claim and acknowledge), so runs the drain.
    pub fn has_queue(self) -> bool {
        matches!(
            self,
            Kind::Segwal
                | Kind::SegwalSpin
                | Kind::SegwalHandoff
                | Kind::SegwalNewFiles
                | Kind::SegwalNoCheckpoints
                | Kind::SqliteFull
                | Kind::SqliteNormal
        )
    }

    /// Opens the engine on `dir`, an empty directory.
    pub fn open(self, dir: &Path) -> Result<Box<dyn Engine>> {
        Ok(match self {
            Kind::Raw => Box::new(raw::Raw::open(dir, raw::Layout::Fallocated)?),
            Kind::RawGrowing => Box::new(raw::Raw::open(dir, raw::Layout::Growing)?),
            Kind::RawOverwrite => Box::new(raw::Raw::open(dir, raw::Layout::Overwrite)?),
            Kind::SegwalLinger => Box::new(segwal::Segwal::open_linger(dir)?),
            Kind::SegwalSpin => Box::new(segwal::Segwal::open_spin(dir)?),
            Kind::SegwalHandoff => Box::new(segwal::Segwal::open_handoff(dir)?),
            Kind::RawPipelined => Box::new(raw::Raw::open(dir, raw::Layout::Pipelined)?),
            Kind::Segwal => Box::new(segwal::Segwal::open(dir)?),
            Kind::SegwalNewFiles => Box::new(segwal::Segwal::open_new_files(dir)?),
            Kind::SegwalNoCheckpoints => Box::new(segwal::Segwal::open_no_checkpoints(dir)?),
            Kind::SegwalDedup => Box::new(segwal::Segwal::open_dedup(dir)?),
            Kind::SqliteFull => Box::new(sqlite::Sqlite::open(dir, sqlite::Sync::Full)?),
            Kind::SqliteNormal => Box::new(sqlite::Sqlite::open(dir, sqlite::Sync::Normal)?),
            Kind::Fjall => Box::new(fjall::Fjall::open(dir)?),
            Kind::Okaywal => Box::new(okaywal::Okaywal::open(dir)?),
        })
    }
}
