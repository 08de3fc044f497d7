//! [`Options`], [`Durability`], [`RecoveryMode`] and [`OpenCheck`]: how an outbox
//! is configured.

use std::time::Duration;

use crate::error::{Error, Result};
use crate::format::frame::RECORD_BYTES_LIMIT;

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;

/// Smallest accepted [`Options::segment_bytes`].
pub const SEGMENT_BYTES_MIN: u64 = KIB;
/// Largest accepted [`Options::segment_bytes`]; frame offsets within a segment are
/// 32-bit in memory.
pub const SEGMENT_BYTES_MAX: u64 = 2 * 1024 * MIB;
/// Largest accepted [`Options::max_record_bytes`]: the format's own limit (1 GiB).
pub const MAX_RECORD_BYTES_LIMIT: usize = RECORD_BYTES_LIMIT;
/// Largest accepted [`Options::queue_bytes`] (1.5 GiB).
pub const QUEUE_BYTES_MAX: u64 = 3 * 512 * MIB;
/// Largest accepted [`Options::queue_capacity`] (1,048,576 requests). The queue
/// sets no memory aside for its capacity: this bounds requests in flight.
pub const QUEUE_CAPACITY_MAX: usize = 1 << 20;
/// Largest accepted [`Options::linger`] (1 second).
pub const LINGER_MAX: Duration = Duration::from_secs(1);

/// The longest [`Options::dedup_window`]: 30 days.
pub const DEDUP_WINDOW_MAX: Duration = Duration::from_secs(30 * 24 * 3600);
/// The largest [`Options::dedup_capacity`]: 2^26 ids (about 2.7 GB of memory).
pub const DEDUP_CAPACITY_MAX: usize = 1 << 26;
/// The default of [`Options::min_free_disk_bytes`]: 128 MiB.
pub const MIN_FREE_DISK_BYTES_DEFAULT: u64 = 128 * MIB;

/// Largest accepted [`Options::batch_bytes`] (1 GiB).
///
/// With [`SEGMENT_BYTES_MAX`] and [`QUEUE_BYTES_MAX`] it keeps every segment file
/// below 4 GiB, so that frame offsets fit in 32 bits.
pub const BATCH_BYTES_MAX: usize = 1 << 30;

/// When `append` returns, and what survives a crash at that moment.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Durability {
    /// `append` returns Ok only after the record, and every record before it, is
    /// on stable storage: written, `fdatasync`ed, and the directory fsynced if the
    /// record opened a new segment file. It survives a process crash and a power
    /// loss. The writer thread groups concurrent appends so that one fsync serves
    /// a whole batch.
    #[default]
    Sync,
    /// `append` returns Ok once the record is written to the operating system (in
    /// the page cache); the writer fsyncs within
    /// [`Options::buffered_sync_interval`]. Survives a crash of the process, **not
    /// a power loss or kernel crash**: the records appended during the last
    /// interval may then be lost, and their sequence numbers reused. Records
    /// become claimable only once fsynced, so a relay never publishes a record
    /// that a power loss can take back.
    Buffered,
}

/// What recovery does with damage it finds when the outbox is opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum RecoveryMode {
    /// Truncate a torn tail (damage inside the last write batch of the last
    /// segment, whose fsync never completed); any other damage fails the open
    /// with [`Error::Corrupt`] naming the file and offset, and nothing is
    /// changed on disk. Nothing whose fsync completed is ever dropped: under
    /// the default [`Durability::Sync`], no append a producer was told
    /// succeeded (under [`Durability::Buffered`] producers are answered before
    /// the fsync, and a power cut can tear their batch).
    #[default]
    Strict,
    /// For operators, after `Strict` refused to open: truncate the log at the first
    /// damage, delete every later segment, and open. Records after the damage are
    /// lost; [`RecoveryReport::dropped`](crate::RecoveryReport::dropped) says
    /// exactly which sequence numbers. Those numbers are never reused.
    /// What this build does not read is no damage and is not dropped
    /// ([`Corruption::is_unknown_format`](crate::Corruption::is_unknown_format):
    /// a newer build's frame, a segment of another format version): the
    /// open fails with the `Error` a `Strict` open gives.
    Lossy,
}

/// How much of each sealed segment recovery reads when the outbox is opened.
///
/// Every frame's checksum is checked again whenever its record is claimed, in
/// either mode, so a damaged record is never handed out as data: a claim that
/// meets one fails with [`Error::Corrupt`] naming the file,
/// offset and seq, and sets the record aside. The modes differ in *when* damage in
/// a sealed segment is found. The segment holding the newest frames is always
/// read frame by frame, from its last index checkpoint on (docs/FORMAT.md,
/// "Index checkpoints"), since that is where a crash can leave a torn tail.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum OpenCheck {
    /// Read each sealed segment's header and its seal frame, which carries the
    /// offset of every frame of the segment under its own checksum
    /// (docs/FORMAT.md, "The seal index"), and not the frames themselves. Opening
    /// costs about eight bytes read per record instead of every byte; a record
    /// damaged at rest in a sealed segment is reported when it is claimed. A
    /// segment whose seal or index does not check is read whole, as under
    /// `EveryFrame`.
    #[default]
    SealIndex,
    /// Read and check every frame of every segment: damage anywhere fails the open
    /// (under [`RecoveryMode::Strict`]). Opening reads the whole log.
    EveryFrame,
}

/// Configuration of an [`Outbox`](crate::Outbox), built with consuming methods from
/// [`Options::default()`].
///
/// ```
/// use std::time::Duration;
/// use segwal::{Durability, Options};
///
/// let options = Options::default()
///     .segment_bytes(16 << 20)
///     .segment_age(Duration::from_secs(60))
///     .durability(Durability::Sync);
/// # let _ = options;
/// ```
#[derive(Clone, Debug)]
pub struct Options {
    pub(crate) segment_bytes: u64,
    pub(crate) segment_age: Duration,
    pub(crate) max_record_bytes: usize,
    pub(crate) queue_capacity: usize,
    pub(crate) queue_bytes: u64,
    pub(crate) batch_bytes: usize,
    pub(crate) linger: Duration,
    pub(crate) spin_wait: bool,
    pub(crate) caller_writes: bool,
    pub(crate) durability: Durability,
    pub(crate) ack_durability: Durability,
    pub(crate) lease: Duration,
    pub(crate) max_attempts: Option<u32>,
    pub(crate) buffered_sync_interval: Duration,
    pub(crate) recovery: RecoveryMode,
    pub(crate) open_check: OpenCheck,
    pub(crate) dedup_window: Duration,
    pub(crate) dedup_capacity: usize,
    pub(crate) max_backlog_bytes: Option<u64>,
    pub(crate) max_backlog_records: Option<u64>,
    pub(crate) min_free_disk_bytes: u64,
    pub(crate) recycle_segments: bool,
    pub(crate) checkpoint_bytes: Option<u64>,
    #[cfg(feature = "testing")]
    pub(crate) bugs: Vec<crate::sim::Bug>,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            segment_bytes: 64 * MIB,
            segment_age: Duration::from_secs(10 * 60),
            max_record_bytes: 16 * MIB as usize,
            queue_capacity: 4096,
            queue_bytes: 64 * MIB,
            batch_bytes: 4 * MIB as usize,
            linger: Duration::ZERO,
            spin_wait: false,
            caller_writes: true,
            durability: Durability::Sync,
            ack_durability: Durability::Buffered,
            lease: Duration::from_secs(30),
            max_attempts: None,
            buffered_sync_interval: Duration::from_millis(100),
            recovery: RecoveryMode::Strict,
            open_check: OpenCheck::SealIndex,
            dedup_window: Duration::from_secs(10 * 60),
            dedup_capacity: 1_000_000,
            max_backlog_bytes: None,
            max_backlog_records: None,
            min_free_disk_bytes: MIN_FREE_DISK_BYTES_DEFAULT,
            recycle_segments: true,
            checkpoint_bytes: None,
            #[cfg(feature = "testing")]
            bugs: Vec::new(),
        }
    }
}

impl Options {
    /// Size at which the writer starts a new segment file. Default 64 MiB; from
    /// [`SEGMENT_BYTES_MIN`] (1 KiB) to [`SEGMENT_BYTES_MAX`] (2 GiB).
    ///
    /// A write batch never spans two segments, so a segment can exceed this size by
    /// one batch (or by one record larger than the size). Smaller segments free
    /// acknowledged space sooner; larger ones mean fewer files and fewer
    /// rotations. An open reads the index of every sealed segment, and of the
    /// newest the lists of its index checkpoints and the frames after the last
    /// one ([`checkpoint_bytes`](Options::checkpoint_bytes)), whatever the
    /// size.
    ///
    /// Disk space is reserved ahead of the writer (`fallocate`), so that a
    /// batch's `fdatasync` need not also record a grown file: a new segment
    /// reserves 4 MiB (or this size, if smaller), and more, doubling, up to this
    /// size as it fills; a sealed segment gives back what it did not use, and so
    /// does the active one at close. An open, idle outbox therefore holds about
    /// 4 MiB it has not written ([`Stats::allocated_bytes`](crate::Stats::allocated_bytes)
    /// shows it; on tmpfs it is memory).
    pub fn segment_bytes(mut self, bytes: u64) -> Options {
        self.segment_bytes = bytes;
        self
    }

    /// Age at which the writer starts a new segment even when it is far from full.
    /// Default 10 minutes; at least 1 ms, no upper bound: an age too long to
    /// represent as an instant (`Duration::MAX`) means never.
    ///
    /// Only a sealed segment can be deleted, so under light traffic this bounds how
    /// long acknowledged records keep their disk space: at most about one segment
    /// age after the last record of a segment is acknowledged. Each rotation costs
    /// one file creation and two fsyncs; every 10 minutes that is nothing, while a
    /// quiet service never holds more than 10 minutes of acknowledged data. A
    /// segment holding neither a record nor delivery state (acknowledgements,
    /// releases, dead letters, attempts), only the frames that move the log's
    /// start, is never rotated by age: rotating it would write another such
    /// frame, and an idle outbox would rotate for ever.
    pub fn segment_age(mut self, age: Duration) -> Options {
        self.segment_age = age;
        self
    }

    /// Largest payload accepted by `append`. Default 16 MiB; at least 1, at
    /// most [`MAX_RECORD_BYTES_LIMIT`] (1 GiB). [`queue_bytes`](Options::queue_bytes)
    /// must hold one such record: a limit near or above its default (64 MiB)
    /// wants it raised too. Larger payloads fail with
    /// [`Error::RecordTooLarge`] before anything touches the disk. Records written
    /// under a larger limit are still read after the limit is lowered.
    pub fn max_record_bytes(mut self, bytes: usize) -> Options {
        self.max_record_bytes = bytes;
        self
    }

    /// How many append requests may wait for the writer thread. Default 4096;
    /// from 1 to [`QUEUE_CAPACITY_MAX`]. A full queue makes `append` wait and
    /// `try_append` fail with [`Error::Full`]: producers feel backpressure. No
    /// memory is set aside for it up front.
    ///
    /// It also caps the appends one group commit can serve: a write batch holds
    /// at most this many requests (with a capacity of 1, sixteen producers get
    /// about one record per fsync). Keep it at least the number of producer
    /// threads.
    pub fn queue_capacity(mut self, requests: usize) -> Options {
        self.queue_capacity = requests;
        self
    }

    /// How many bytes of encoded records (payload plus a 48-byte frame header
    /// each) may wait for the writer thread. Default 64 MiB; at least one record
    /// of `max_record_bytes`, at most [`QUEUE_BYTES_MAX`]. Also the largest
    /// `append_batch` accepted.
    ///
    /// It bounds memory, not only the channel: a producer copies its payload
    /// only once its share of this budget is granted, so the copies alive at
    /// once stay within it (producers waiting for room hold none). The writer
    /// adds its encode buffer, at most one batch.
    pub fn queue_bytes(mut self, bytes: u64) -> Options {
        self.queue_bytes = bytes;
        self
    }

    /// Encoded bytes after which the writer stops gathering requests into one
    /// write and one fsync (the request that reaches the limit is the last one
    /// gathered, so a batch can pass it by one request). Default 4 MiB; from 1
    /// to [`BATCH_BYTES_MAX`]. A single request larger than this is written in a
    /// batch of its own.
    pub fn batch_bytes(mut self, bytes: usize) -> Options {
        self.batch_bytes = bytes;
        self
    }

    /// Time the writer waits after the first request of a batch for more to
    /// arrive. Default zero (off): a batch is whatever producers queued while the
    /// previous write and fsync ran, which already grows with the load. A linger
    /// adds its full length to the latency of every batch. At most
    /// [`LINGER_MAX`] (1 s).
    pub fn linger(mut self, linger: Duration) -> Options {
        self.linger = linger;
        self
    }

    /// Whether a producer appending alone watches for its answer on the CPU
    /// instead of sleeping until the writer wakes it. Default `false`.
    ///
    /// On: a producer whose append is the only one queued, after a batch of
    /// one, spins (yielding its CPU to any thread waiting for it) for up to
    /// twice the recent batch fsync before it sleeps, and so does not wait
    /// for a wake-up (a `futex` call and, on a virtual machine, often a
    /// halted vCPU to restart). It never spins with other producers
    /// appending, with a [`linger`](Options::linger), on one CPU, before
    /// the first fsync, when fsyncs average over 400 µs, or when the writer
    /// was asleep. The price is a CPU busy for the whole wait of every such
    /// append.
    ///
    /// Measured on a 2-core virtual machine (docs/BENCHMARKS.md, "A lone
    /// producer sleeps for its answer by default"): the spin lowered a lone
    /// producer's median latency by about 15 µs, but its CPU per append
    /// rose from about 50 to 150-200 µs, and the host, which caps the
    /// machine's CPU, took the time back as stalls of several milliseconds
    /// (p99.9 8 to 15 ms against 1 to 3 ms), so that its rate was no
    /// better. Turn it on where a core is free and not capped (bare metal,
    /// a dedicated host). Under [`caller_writes`](Options::caller_writes)
    /// (on by default) a producer appending alone mostly writes its own
    /// batch and has no answer to wait for; the spin is then for its
    /// appends that the writer thread takes (those made while it waits for
    /// the writer's lock, or after more than 10 ms of waiting for it).
    pub fn spin_wait(mut self, on: bool) -> Options {
        self.spin_wait = on;
        self
    }

    /// Whether a producer appending alone writes and syncs its own append on
    /// its thread, instead of handing it to the writer thread and sleeping
    /// until the writer wakes it. Default `true`.
    ///
    /// On: a blocking append ([`Outbox::append`](crate::Outbox::append) and
    /// the other appends that wait for their answer; never an async one) made
    /// under [`Durability::Sync`] without a [`linger`](Options::linger),
    /// which finds no other append queued or in the writer's hands, the
    /// last batch one append or none, and
    /// the writer thread not waiting for the writer's lock, takes that lock
    /// (waiting for it, at most 10 ms, while the writer thread or another
    /// producer's batch holds it) and writes the batch itself:
    /// the same code, the same single write and `fdatasync`, one batch at a
    /// time as ever. It saves the two wake-ups of the hand-over (the writer's
    /// and its own). As soon as appends meet (one finds others queued or in
    /// the writer's hands), they queue for the writer thread, which batches
    /// them as before; the writer thread also keeps every timed duty, and
    /// deletes acknowledged segments and carries stragglers forward after a
    /// producer's batch, which returns once it is answered.
    ///
    /// Off: every append goes through the writer thread.
    pub fn caller_writes(mut self, on: bool) -> Options {
        self.caller_writes = on;
        self
    }

    /// When `append` returns. Default [`Durability::Sync`].
    pub fn durability(mut self, durability: Durability) -> Options {
        self.durability = durability;
        self
    }

    /// How long a claim holds its records. Default 30 s (as Amazon SQS's
    /// visibility timeout); `Duration::MAX` disables leases. A claimed record
    /// not acknowledged, released or [extended](crate::Outbox::extend) within
    /// its lease goes back to pending by itself, ahead of newer records (a relay
    /// that died holding it does not hold it until the next restart), and its
    /// next delivery is a new [attempt](crate::Record::attempt). A late `ack`
    /// of a delivery whose lease ran out is accepted (the record was
    /// delivered): the record is done, whatever became of it since. At
    /// least 1 ms ([`Error::InvalidOption`](crate::Error::InvalidOption)
    /// otherwise).
    pub fn lease(mut self, lease: Duration) -> Options {
        self.lease = lease;
        self
    }

    /// Deliveries a record gets without an acknowledgement before it becomes a
    /// dead letter instead of being delivered again. Default: unlimited. Every
    /// delivery counts: a claim, whatever ends it (an expired lease, a release,
    /// a crash of the process while the record was claimed); a claim that
    /// failed before handing a record out (the read of another record of it
    /// failed) does not count for that record. So that a record
    /// which crashes the process on every delivery ends up dead after
    /// `max_attempts` restarts rather than looping, each delivery's number is
    /// written to the log and fsynced before the record is handed out: with
    /// this option a claim waits for an fsync (group-committed with everything
    /// else). At least 1. A broker's `Retry` does not always mean that the
    /// broker did not store the record (a timeout after it did): with the
    /// NATS publisher, leave this unset or above the deliveries that fit in
    /// the stream's duplicate window (docs/RELAY.md, "What the stream must
    /// promise").
    pub fn max_attempts(mut self, attempts: u32) -> Options {
        self.max_attempts = Some(attempts);
        self
    }

    /// When `ack`, `ack_many` and `ack_through` return. Default
    /// [`Durability::Buffered`]: once the acknowledgement is in memory (the
    /// record is never handed out again by this process) and queued for the
    /// log; it is written with the writer's next batch and fsynced with it
    /// (under [`Durability::Buffered`] appends, that batch is fsynced at the
    /// interval below), or within
    /// [`buffered_sync_interval`](Options::buffered_sync_interval) when
    /// nothing else is written, and at `sync` and `close` (a change answered
    /// Ok while `close` runs is among those; one made after is refused with
    /// `Error::Closed`). A crash in that
    /// window can lose it: the record is then delivered again after the
    /// restart (at least once). Changes outrunning the disk wait for it:
    /// once more than 8 MiB of acknowledgements, releases, dead letters,
    /// requeues and discards (their entries in the log, or in memory where
    /// that is more) wait for the writer, the calls making more return only
    /// once those are fsynced, as under `Sync`, and answer the fsync's
    /// failure (`Error::Poisoned`) if it fails, their change made in memory
    /// but in doubt in the log. Calls from segwal's own threads (a waker,
    /// a tracing subscriber) never wait. [`Durability::Sync`]: an acknowledgement
    /// returns once it is fsynced, group-committed with everything else. Once
    /// durable, a record is never handed out again, after any restart.
    pub fn ack_durability(mut self, durability: Durability) -> Options {
        self.ack_durability = durability;
        self
    }

    /// The longest time written frames wait for their fsync when nothing else
    /// fsyncs them: appends under [`Durability::Buffered`], and
    /// acknowledgements and other delivery-state changes under
    /// [`ack_durability`](Options::ack_durability)`(Buffered)`, the default.
    /// Default 100 ms; at least 1 ms, no upper bound: an interval too long to
    /// represent as an instant means only `sync`, rotation, the next batch of
    /// appends under `Sync`, and close fsync them.
    pub fn buffered_sync_interval(mut self, interval: Duration) -> Options {
        self.buffered_sync_interval = interval;
        self
    }

    /// What recovery does with damage. Default [`RecoveryMode::Strict`].
    pub fn recovery(mut self, mode: RecoveryMode) -> Options {
        self.recovery = mode;
        self
    }

    /// How much of each sealed segment recovery reads. Default
    /// [`OpenCheck::SealIndex`].
    pub fn open_check(mut self, check: OpenCheck) -> Options {
        self.open_check = check;
        self
    }

    /// How long a deduplication id is remembered after its record was
    /// appended. Default 10 minutes (SQS FIFO keeps 5, NATS JetStream 2); from
    /// 1 ms to [`DEDUP_WINDOW_MAX`] (30 days). An id is also forgotten, oldest
    /// first, once [`dedup_capacity`](Options::dedup_capacity) newer ids are
    /// remembered. Measured on the wall clock of each record's append
    /// (docs/GUARANTEES.md, section 10).
    ///
    /// The ids in the window cost disk too: a deletion carries those whose
    /// frames it removes forward (32 bytes each), and where they outweigh a
    /// quarter of what it frees, acknowledged segments wait, for up to this
    /// window after the burst of ids
    /// ([`Stats::held_for_ids`](crate::Stats::held_for_ids)).
    pub fn dedup_window(mut self, window: Duration) -> Options {
        self.dedup_window = window;
        self
    }

    /// The most deduplication ids remembered; beyond it the oldest are
    /// forgotten first. Default 1,000,000; from 1 to [`DEDUP_CAPACITY_MAX`]
    /// (2^26). Memory is 40 to 56 bytes per id remembered (46.9 measured
    /// at a million: docs/BENCHMARKS.md), taken as ids arrive, not up front.
    pub fn dedup_capacity(mut self, ids: usize) -> Options {
        self.dedup_capacity = ids;
        self
    }

    /// An append that would take the bytes of the records not yet
    /// acknowledged (dead letters included) past `bytes` fails at once with
    /// [`Error::QuotaExceeded`]; nothing is written. Default: no quota.
    /// Acknowledged records free room at once. A record counts its payload
    /// and its optional fields (key, not-before time, deduplication id), not
    /// its frame header: the bytes [`Stats::backlog_bytes`](crate::Stats::backlog_bytes)
    /// counts, before its sync as after it. The optional fields count as
    /// encoded (a few bytes each beside their own; a unique item's derived
    /// id, 26). At least 1.
    pub fn max_backlog_bytes(mut self, bytes: u64) -> Options {
        self.max_backlog_bytes = Some(bytes);
        self
    }

    /// Like [`max_backlog_bytes`](Options::max_backlog_bytes), counting records.
    /// Default: no quota. At least 1.
    pub fn max_backlog_records(mut self, records: u64) -> Options {
        self.max_backlog_records = Some(records);
        self
    }

    /// Appends fail with [`Error::QuotaExceeded`] while the file system holding
    /// the outbox has fewer free bytes than this (for an unprivileged user), so
    /// that an outbox never fills a disk to its last byte; 0 turns the floor
    /// off. Default [`MIN_FREE_DISK_BYTES_DEFAULT`] (128 MiB: room for two
    /// segments of the default size, the one the next rotation reserves and
    /// one for relocation's copies, and for the rest of the system to log
    /// that the disk is filling). A file kept for recycling
    /// ([`recycle_segments`](Options::recycle_segments)) counts as free: the
    /// next segment is written into it. Recovery, claims, acknowledgements
    /// and the relay need no free space and are never refused. Checked by the
    /// writer at most every 10 ms.
    pub fn min_free_disk_bytes(mut self, bytes: u64) -> Options {
        self.min_free_disk_bytes = bytes;
        self
    }

    /// Whether a fully acknowledged segment's file is kept and written again
    /// as the next segment instead of being deleted. Default on.
    ///
    /// A new file's blocks are unwritten: a batch written there costs its
    /// `fdatasync` a metadata update, which is why the writer writes zeros
    /// ahead of its frames in a new segment, so that every byte reaches the
    /// disk twice. A recycled file's blocks were written already: the
    /// frames overwrite them once, and no zeros go ahead (docs/BENCHMARKS.md,
    /// "Recycled segments"). At most one file waits to be recycled, named
    /// `<segment>.seg.free`, so the outbox holds at most one segment more on
    /// disk than its live records need. What the old segment held stays in
    /// the file past the new segment's frames until they overwrite it: after
    /// a crash, recovery reads that remainder to prove it holds no frame of
    /// the new segment (docs/FORMAT.md, "Recycled segments"), so an open after
    /// a crash can read up to one segment more. Turn it off on a
    /// copy-on-write file system (btrfs, ZFS), where an overwrite allocates
    /// new blocks anyway.
    pub fn recycle_segments(mut self, recycle: bool) -> Options {
        self.recycle_segments = recycle;
        self
    }

    /// How often the writer lists the frames of the segment it is writing in
    /// an index checkpoint (docs/FORMAT.md, "Index checkpoints"): the first
    /// sync group at or past every multiple of this many bytes of the segment
    /// starts with one. Opening the outbox after a crash then reads the newest
    /// segment's frames only from its last checkpoint on (at most about two
    /// intervals), and the checkpoints' lists before it (8 bytes a frame),
    /// instead of every frame of it: what it reads of a sealed segment (its
    /// seal index) is what it reads of the newest one.
    ///
    /// Default: a sixteenth of [`segment_bytes`](Options::segment_bytes) in
    /// whole 4 KiB blocks, at most 4 MiB (4 MiB for the default 64 MiB
    /// segments), and none for segments under 1 MiB. 0 writes none; otherwise
    /// a multiple of 4096 up to [`SEGMENT_BYTES_MAX`]. The cost is 8 bytes
    /// written per frame (3 % more bytes at 256-byte records, 0.2 % at 4 KiB).
    /// A segment holds at most 1,024 checkpoints (an interval below a
    /// 1,024th of the segment lists only its first part). A segment keeps
    /// the interval it was created with: an outbox opened with another one
    /// reads the old segments as they were written.
    pub fn checkpoint_bytes(mut self, bytes: u64) -> Options {
        self.checkpoint_bytes = Some(bytes);
        self
    }

    /// The interval between index checkpoints the writer uses, as a segment
    /// header records it (0: none).
    pub(crate) fn checkpoint_every(&self) -> u32 {
        match self.checkpoint_bytes {
            Some(bytes) => u32::try_from(bytes).unwrap_or(0),
            None => crate::format::checkpoint::every(self.segment_bytes),
        }
    }

    pub(crate) fn validate(&self) -> Result<()> {
        let invalid = |name, reason: String| Err(Error::InvalidOption { name, reason });
        if !(SEGMENT_BYTES_MIN..=SEGMENT_BYTES_MAX).contains(&self.segment_bytes) {
            return invalid(
                "segment_bytes",
                format!(
                    "{} is outside {SEGMENT_BYTES_MIN}..={SEGMENT_BYTES_MAX}",
                    self.segment_bytes
                ),
            );
        }
        if let Some(bytes) = self.checkpoint_bytes
            && (!bytes.is_multiple_of(4096) || bytes > SEGMENT_BYTES_MAX)
        {
            return invalid(
                "checkpoint_bytes",
                format!("{bytes} is not 0 or a multiple of 4096 up to {SEGMENT_BYTES_MAX}"),
            );
        }
        if self.segment_age < Duration::from_millis(1) {
            return invalid("segment_age", "must be at least 1 ms".into());
        }
        if self.max_attempts == Some(0) {
            return invalid("max_attempts", "must be at least 1".into());
        }
        if self.linger > LINGER_MAX {
            return invalid(
                "linger",
                format!("{:?} exceeds {LINGER_MAX:?}", self.linger),
            );
        }
        if !(1..=MAX_RECORD_BYTES_LIMIT).contains(&self.max_record_bytes) {
            return invalid(
                "max_record_bytes",
                format!(
                    "{} is outside 1..={MAX_RECORD_BYTES_LIMIT}",
                    self.max_record_bytes
                ),
            );
        }
        // A quota of nothing refuses every append: no outbox at all.
        if self.max_backlog_bytes == Some(0) {
            return invalid("max_backlog_bytes", "must be at least 1".into());
        }
        if self.max_backlog_records == Some(0) {
            return invalid("max_backlog_records", "must be at least 1".into());
        }
        if self.lease < Duration::from_millis(1) {
            // A lease of nothing runs out at its claim: every record would
            // be handed out again at the next claim, as a new attempt.
            return invalid("lease", "must be at least 1 ms".into());
        }
        if !(1..=QUEUE_CAPACITY_MAX).contains(&self.queue_capacity) {
            return invalid(
                "queue_capacity",
                format!(
                    "{} is outside 1..={QUEUE_CAPACITY_MAX}",
                    self.queue_capacity
                ),
            );
        }
        let one_record = crate::format::frame::frame_len(self.max_record_bytes) as u64;
        if !(one_record..=QUEUE_BYTES_MAX).contains(&self.queue_bytes) {
            return invalid(
                "queue_bytes",
                format!(
                    "{} is outside {one_record}..={QUEUE_BYTES_MAX} (it must hold one record of \
                     max_record_bytes, encoded: raise it with max_record_bytes)",
                    self.queue_bytes
                ),
            );
        }
        if !(1..=BATCH_BYTES_MAX).contains(&self.batch_bytes) {
            return invalid(
                "batch_bytes",
                format!("{} is outside 1..={BATCH_BYTES_MAX}", self.batch_bytes),
            );
        }
        if self.buffered_sync_interval < Duration::from_millis(1) {
            return invalid("buffered_sync_interval", "must be at least 1 ms".into());
        }
        if !(Duration::from_millis(1)..=DEDUP_WINDOW_MAX).contains(&self.dedup_window) {
            return invalid(
                "dedup_window",
                format!(
                    "{:?} is outside 1ms..={DEDUP_WINDOW_MAX:?}",
                    self.dedup_window
                ),
            );
        }
        if !(1..=DEDUP_CAPACITY_MAX).contains(&self.dedup_capacity) {
            return invalid(
                "dedup_capacity",
                format!(
                    "{} is outside 1..={DEDUP_CAPACITY_MAX}",
                    self.dedup_capacity
                ),
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid() {
        Options::default().validate().expect("defaults validate");
    }

    #[test]
    fn out_of_range_options_are_named() {
        let cases = [
            (Options::default().segment_bytes(10), "segment_bytes"),
            (
                Options::default().segment_age(Duration::ZERO),
                "segment_age",
            ),
            (
                Options::default().max_record_bytes(MAX_RECORD_BYTES_LIMIT + 1),
                "max_record_bytes",
            ),
            (Options::default().max_record_bytes(0), "max_record_bytes"),
            (Options::default().max_backlog_bytes(0), "max_backlog_bytes"),
            (
                Options::default().max_backlog_records(0),
                "max_backlog_records",
            ),
            (Options::default().lease(Duration::ZERO), "lease"),
            (
                Options::default().lease(Duration::from_micros(999)),
                "lease",
            ),
            (Options::default().queue_capacity(0), "queue_capacity"),
            (
                Options::default().checkpoint_bytes(4097),
                "checkpoint_bytes",
            ),
            (
                Options::default().checkpoint_bytes(SEGMENT_BYTES_MAX + 4096),
                "checkpoint_bytes",
            ),
            (Options::default().queue_capacity(1 << 40), "queue_capacity"),
            (
                Options::default().queue_capacity(usize::MAX),
                "queue_capacity",
            ),
            (
                Options::default().queue_capacity(100_000_000),
                "queue_capacity",
            ),
            (Options::default().linger(Duration::from_secs(5)), "linger"),
            (
                Options::default().buffered_sync_interval(Duration::ZERO),
                "buffered_sync_interval",
            ),
            (Options::default().segment_bytes(u64::MAX), "segment_bytes"),
            (Options::default().queue_bytes(u64::MAX), "queue_bytes"),
            (Options::default().batch_bytes(usize::MAX), "batch_bytes"),
            (Options::default().queue_bytes(1), "queue_bytes"),
            (Options::default().batch_bytes(0), "batch_bytes"),
            (
                Options::default().dedup_window(Duration::ZERO),
                "dedup_window",
            ),
            (
                Options::default().dedup_window(Duration::MAX),
                "dedup_window",
            ),
            (Options::default().dedup_capacity(0), "dedup_capacity"),
            (
                Options::default().dedup_capacity(usize::MAX),
                "dedup_capacity",
            ),
        ];
        for (options, expected) in cases {
            match options.validate() {
                Err(Error::InvalidOption { name, .. }) => assert_eq!(name, expected),
                other => panic!("{expected}: {other:?}"),
            }
        }
    }
}
