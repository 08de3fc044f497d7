//! [`Outbox`]: the public handle, and how it opens and closes a directory.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::Sender;
use parking_lot::{Condvar, Mutex, RwLock};

use crate::error::{Error, Result};
use crate::format::ext::RecordFields;
use crate::format::fields::DedupDigest;
use crate::format::frame::frame_len;
use crate::format::hash::{Digest, Hasher};
use crate::format::seq::Seq;
use crate::io::reader::{self, Record};
use crate::io::reserve;
use crate::io::segment_file::FileCache;
use crate::io::segment_file::first_allocation;
use crate::io::{LockError, StdStorage, Storage};
use crate::log::clock::Clock;
use crate::log::recovery::{self, RecoveryReport};
use crate::log::shared::{Budget, Completion, Counters, Noted, Shared, Ticket};
use crate::log::shared::{Verdict, Verdicts};
use crate::log::writer::{self, MessageFields, OwnedMessage, Payloads, Request, Writer};
use crate::message::{Appended, Message};
use crate::options::{Durability, Options};
use crate::state::dedup::Dedup;
use crate::state::table::{Notices, SlotRef, Table};

mod async_api;

/// A durable outbox on one directory.
///
/// A cheap handle: clone it freely and share it between any number of producer
/// and relay threads (`Outbox` is `Send + Sync`). The outbox closes when
/// [`close`](Outbox::close) is called on any handle or when the last handle is
/// dropped; afterwards every fallible call on every handle fails with
/// [`Error::Closed`] ([`stats`](Outbox::stats), [`id`](Outbox::id),
/// [`dir`](Outbox::dir) and [`recovery_report`](Outbox::recovery_report)
/// still answer).
#[derive(Clone)]
pub struct Outbox {
    handle: Arc<Handle>,
}

/// The next opening's number (`Handle::opened`).
static OPENINGS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// The state behind every clone of one `Outbox`; dropping it closes the outbox.
struct Handle {
    shared: Arc<Shared>,
    /// `None` once closed. Producers send under the read lock; `close` takes the
    /// write lock to drop the only sender, so that the writer drains the queue and
    /// no request can be sent after it stopped.
    tx: RwLock<Option<ToWriter>>,
    writer: Mutex<Option<JoinHandle<Result<()>>>>,
    report: RecoveryReport,
    /// The outbox's identity (every segment header names it).
    outbox_id: u128,
    /// Held for the whole of a `close`: a second `close` returns only once the
    /// first has joined the writer and released the directory lock.
    closing: Mutex<()>,
    /// The writer thread's outcome once it ended: whether the close's last
    /// fsync held, for calls whose change that close took.
    ended: Arc<WriterEnd>,
    /// This opening's number, unique in the process (never 0): a `Record`
    /// names it, so that a settling call that takes a `Record` acts only on
    /// a claim of this opening.
    opened: u64,
    /// The figures as they stood when the outbox closed, which
    /// [`Outbox::stats`] answers from then on (the state table goes at
    /// close).
    at_close: Mutex<Option<Stats>>,
}

/// The outcome of the writer thread, set as it ends.
#[derive(Default)]
struct WriterEnd {
    outcome: Mutex<Option<Result<()>>>,
    set: Condvar,
}

impl WriterEnd {
    fn set(&self, outcome: Result<()>) {
        *self.outcome.lock() = Some(outcome);
        self.set.notify_all();
    }

    /// Waits for the writer to end; its outcome.
    fn wait(&self) -> Result<()> {
        let mut outcome = self.outcome.lock();
        loop {
            if let Some(outcome) = outcome.as_ref() {
                return outcome.clone();
            }
            self.set.wait(&mut outcome);
        }
    }
}

/// The way to the writer: its queue, and the writer itself, which a producer
/// appending alone runs on its own thread (`Options::caller_writes`).
struct ToWriter {
    tx: Sender<Request>,
    core: Arc<Mutex<Writer>>,
}

/// A claim made under the table lock ([`Outbox::claim_leased`]), to finish
/// once the lock is released.
pub(crate) struct Claimed {
    /// The records taken, by segment.
    runs: Vec<crate::state::table::ClaimRun>,
    /// Their attempts (or other changes) wait for the log: made durable
    /// before the records are handed out.
    durable_first: bool,
    /// The table's events, reported without the lock.
    notices: Notices,
    /// Dead letters the claim parked wait for a writer that sleeps: a caller
    /// that does not sync wakes it (`nudge_writer`).
    wake: bool,
}

/// What an operator needs to see whether the relay keeps up. From
/// [`Outbox::stats`].
///
/// Serialisable (feature `json`, on by default), so that a metrics endpoint
/// prints what `segwal inspect --json` prints under `stats` (there, what only
/// the running owner knows is null): durations as whole
/// microseconds under names ending in `_us`, sequence numbers as numbers,
/// `None` as `null` (`examples/prometheus.rs` turns it into Prometheus text).
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(feature = "json", derive(serde::Serialize))]
#[non_exhaustive]
pub struct Stats {
    /// Records durable and waiting to be claimed.
    pub pending: u64,
    /// Records claimed by a relay and not yet acknowledged (delayed records
    /// and dead letters not counted).
    pub claimed: u64,
    /// Records waiting out a delay: released with one
    /// ([`release_after`](Outbox::release_after)), or appended with a
    /// not-before time ([`Message::not_before`]) still ahead.
    pub delayed: u64,
    /// Ordering keys with a record held back behind an earlier one of the
    /// key (claimed, delayed, or pending ahead of it).
    pub blocked_keys: u64,
    /// Records held back behind an earlier one of their key (not counted in
    /// `pending` or `claimed`; a record both held back and delayed is counted
    /// in `delayed`).
    pub held_by_key: u64,
    /// Deduplication ids remembered ([`Options::dedup_capacity`] bounds them),
    /// as of the writer's last batch: ids whose window ended while nothing
    /// was appended are counted until the next append forgets them (an
    /// append with such an id is new all the same).
    pub dedup_ids: u64,
    /// Appends answered as duplicates since open.
    pub duplicates: u64,
    /// Dead letters: parked, never handed out until requeued.
    pub dead_letters: u64,
    /// Claimed records whose lease ran out (they went back to pending) since
    /// the outbox was opened.
    pub claimed_expired: u64,
    /// Bytes of the records not yet acknowledged: their payloads and their
    /// optional fields (key, not-before time, deduplication id), frame
    /// headers not counted.
    pub backlog_bytes: u64,
    /// Segment files in the log.
    pub segments: usize,
    /// Bytes written to those segment files (headers and frames).
    pub disk_bytes: u64,
    /// Bytes of storage those files take, space reserved ahead of the writer
    /// included: the active segment reserves 4 MiB (or
    /// [`Options::segment_bytes`](crate::Options::segment_bytes) if smaller) when
    /// it is created, and more, doubling, up to `segment_bytes` as it fills; a
    /// sealed segment gives back what it did not use, and a close gives back the
    /// active segment's. This is what `du` counts (and, on tmpfs, memory).
    pub allocated_bytes: u64,
    /// Bytes of memory held by the state table (about 4.25 per record of the
    /// segments on disk, plus a fixed amount per segment, plus the leases of
    /// the claims in flight), its index of ordering keys, and the
    /// deduplication ids remembered.
    pub state_bytes: u64,
    /// Oldest record not yet acknowledged: pending, claimed, delayed, held
    /// back behind its key, or a dead letter.
    pub first_seq: Option<Seq>,
    /// Newest durable record or internal frame.
    pub last_seq: Option<Seq>,
    /// Age of the oldest pending (not claimed) record.
    ///
    /// Measured on a monotonic clock, so that a wall clock stepped back or
    /// forward does not change it: a record appended by this process ages from
    /// when it was written; a record recovered at open ages from its stamped
    /// time as the wall clock read it at the open (clamped at zero: a clock
    /// that was ahead when it was appended reads zero, not a negative age), and
    /// grows with the monotonic clock from then on. A record stamped while the
    /// wall clock read before 1970 carries time 0 (docs/GUARANTEES.md, 7).
    #[cfg_attr(
        feature = "json",
        serde(rename = "oldest_pending_age_us", serialize_with = "micros")
    )]
    pub oldest_pending_age: Option<Duration>,
    /// Age of the oldest record not yet acknowledged (as
    /// [`first_seq`](Stats::first_seq) counts them), measured as
    /// [`oldest_pending_age`](Stats::oldest_pending_age) is.
    #[cfg_attr(
        feature = "json",
        serde(rename = "oldest_unacked_age_us", serialize_with = "micros")
    )]
    pub oldest_unacked_age: Option<Duration>,
    /// Records appended since open.
    pub records_appended: u64,
    /// Write batches since open.
    pub batches: u64,
    /// Of those, the batches a producer appending alone wrote on its own
    /// thread ([`Options::caller_writes`](crate::Options::caller_writes)).
    pub caller_batches: u64,
    /// `fdatasync` calls since open (segment headers, directories, the
    /// directory after a deletion, the active segment cut back at a close and
    /// the zeros an idle writer writes ahead of its frames included; not the
    /// fsyncs of the reserve the writer makes again after a full disk).
    pub fsyncs: u64,
    /// Records per write batch since open: how well group commit amortises fsyncs.
    pub records_per_batch: f64,
    /// Records appended per `fdatasync` since open, all fsyncs counted.
    pub records_per_fsync: f64,
    /// Segments deleted since open (fully acknowledged; a recycled one
    /// counts too: it left the log).
    pub segments_deleted: u64,
    /// Segments written into the file of a deleted one since open, instead
    /// of a new file ([`Options::recycle_segments`](crate::Options::recycle_segments)).
    pub segments_recycled: u64,
    /// Acknowledged segments still on disk because deleting them now would
    /// write too many deduplication ids for what it frees: a deletion carries
    /// the ids still within [`dedup_window`](crate::Options::dedup_window)
    /// whose frames it removes into a tombstones frame (32 bytes an id), and
    /// waits until it frees at least four times that frame's bytes (twice
    /// while space is short, once while appends are refused for want of it;
    /// docs/FORMAT.md, "Tombstones frames"). Zero
    /// unless the ids in the window take more than a quarter of the segments
    /// a deletion frees; their bytes are at most about five times the ids in
    /// the window × 32 bytes, plus two segments. Also counts a deletion that
    /// waits because its tombstones do not fit in the disk's free space
    /// (then without that bound: it goes once enough space is freed; asked
    /// only where [`min_free_disk_bytes`](crate::Options::min_free_disk_bytes)
    /// is above 0).
    pub held_for_ids: usize,
    /// Sealed segments still on disk because some of their records are not
    /// acknowledged: those a relay has yet to read, and those kept by a few
    /// records nobody acknowledges (dead letters, long delays, claims a stuck
    /// relay holds) until relocation carries those records forward
    /// (docs/FORMAT.md, "Relocation"). Fully acknowledged segments waiting
    /// behind one of them (segments are deleted oldest first) are in
    /// [`segments`](Stats::segments), not here.
    pub held_segments: usize,
    /// The records not yet acknowledged in the
    /// [`held_segments`](Stats::held_segments).
    pub held_by_records: u64,
    /// Records carried forward out of an old segment into the active one
    /// since open, so that they do not keep the old one on disk: copies
    /// made, so a record carried forward again (its copy's segment became
    /// the oldest in turn) counts again.
    pub relocated: u64,
    /// Records set aside by the read path since open because their frame no
    /// longer matched its checksum.
    pub corrupt_records: u64,
    /// Whether a failed write or fsync poisoned the outbox.
    pub poisoned: bool,
    /// Whether the outbox has no reserve (the space an open needs on a full
    /// disk) because the disk had no room for it: appends are then refused
    /// with [`Error::QuotaExceeded`](crate::Error::QuotaExceeded) (quota
    /// `"reserve"`) until acknowledged segments or freed disk space give the
    /// room back.
    pub reserve_missing: bool,
    /// Encoded bytes of the appends in the writer's queue: the budget that
    /// [`Options::queue_bytes`](crate::Options::queue_bytes) bounds. An append
    /// takes its bytes before it is sent (so this includes producers still
    /// waiting for room in the channel), and the writer gives them back once the
    /// append's batch is written (and, under `Durability::Sync`, fsynced), just
    /// before it answers the producers. `sync` requests take none. Near the
    /// bound, producers wait (or `try_append` fails with [`Error::Full`]): the
    /// disk is not keeping up.
    pub queued_bytes: u64,
    /// The median time a batch's `fdatasync` took since open (the fsyncs
    /// appends wait for; those of segment headers, seals and directories are
    /// not counted). Read from a histogram of four buckets per power of two:
    /// at most 25 % above the true value, never below. `None` before the
    /// first.
    #[cfg_attr(
        feature = "json",
        serde(rename = "fsync_p50_us", serialize_with = "micros")
    )]
    pub fsync_p50: Option<Duration>,
    /// The 99th percentile of the batch fsyncs since open, read as
    /// [`fsync_p50`](Stats::fsync_p50) is.
    #[cfg_attr(
        feature = "json",
        serde(rename = "fsync_p99_us", serialize_with = "micros")
    )]
    pub fsync_p99: Option<Duration>,
    /// The longest batch fsync since open, exact.
    #[cfg_attr(
        feature = "json",
        serde(rename = "fsync_max_us", serialize_with = "micros")
    )]
    pub fsync_max: Option<Duration>,
}

/// A duration as whole microseconds (or null), for [`Stats`]' JSON.
#[cfg(feature = "json")]
fn micros<S: serde::Serializer>(
    d: &Option<Duration>,
    s: S,
) -> std::result::Result<S::Ok, S::Error> {
    match d {
        Some(d) => s.serialize_some(&u64::try_from(d.as_micros()).unwrap_or(u64::MAX)),
        None => s.serialize_none(),
    }
}

impl Outbox {
    /// Opens the outbox in `dir`, creating the directory if it is missing.
    ///
    /// Takes the directory lock, recovers the log (see
    /// [`RecoveryMode`](crate::RecoveryMode)), and starts the writer thread. Fails
    /// with [`Error::Locked`] if another outbox has the directory open, in this
    /// process or another, and with [`Error::Corrupt`] if recovery finds damage it
    /// may not repair. What the open itself writes (a torn tail cut, the seal
    /// of the newest segment, the deletion of the segments it finds fully
    /// acknowledged) fails it with the error of that write or sync
    /// ([`Error::Io`] or [`Error::Poisoned`], naming the file); nothing after
    /// it is written, and the next open recovers. On a full disk the open
    /// takes the space of its `RESERVE` file and of a deleted segment kept
    /// for recycling; a deletion whose tombstones (the deduplication ids it
    /// must keep) do not fit in the free space waits
    /// ([`Stats::held_for_ids`](crate::Stats::held_for_ids)) rather than
    /// fail the open (where free space is asked: `min_free_disk_bytes`
    /// above 0).
    ///
    /// ```
    /// # fn main() -> segwal::Result<()> {
    /// # let dir = tempfile::tempdir().expect("temporary directory");
    /// use std::time::Duration;
    /// use segwal::{Durability, Options, Outbox};
    ///
    /// let options = Options::default()
    ///     .lease(Duration::from_secs(60))
    ///     .max_attempts(5)
    ///     .ack_durability(Durability::Buffered);
    /// let outbox = Outbox::open(dir.path(), options)?;
    /// // A second open of the same directory is refused while this one lives.
    /// assert!(matches!(
    ///     Outbox::open(dir.path(), Options::default()),
    ///     Err(segwal::Error::Locked { .. })
    /// ));
    /// # outbox.close()?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn open(dir: impl AsRef<Path>, options: Options) -> Result<Outbox> {
        Outbox::open_on(dir.as_ref(), options, Arc::new(StdStorage::new()))
    }

    /// Opens the outbox through a [`Storage`] other than the real file system: a
    /// simulated or fault-injecting disk. For segwal's own tests (feature
    /// `testing`); not part of the stable API.
    #[cfg(feature = "testing")]
    #[doc(hidden)]
    pub fn open_with_storage(
        dir: impl AsRef<Path>,
        options: Options,
        storage: Arc<dyn Storage>,
    ) -> Result<Outbox> {
        Outbox::open_on(dir.as_ref(), options, storage)
    }

    fn open_on(dir: &Path, options: Options, storage: Arc<dyn Storage>) -> Result<Outbox> {
        options.validate()?;
        let dir = create_durably(&*storage, dir)?;
        let lock = match storage.lock(&dir) {
            Ok(guard) => guard,
            Err(LockError::Held { pid }) => return Err(Error::Locked { dir, pid }),
            Err(LockError::Io(e)) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                return Err(Error::InvalidPath {
                    path: dir,
                    reason: "the process may not write in the directory (permission denied)",
                });
            }
            Err(LockError::Io(e)) if e.kind() == std::io::ErrorKind::ReadOnlyFilesystem => {
                return Err(Error::InvalidPath {
                    path: dir,
                    reason: READ_ONLY,
                });
            }
            Err(LockError::Io(e)) => return Err(Error::io("lock directory", dir, e)),
        };
        // On a full disk, the space the reserve kept is given to the open, once.
        // Then nothing is reserved ahead of the writer, so that the reserve's
        // space goes to what the open must write.
        let preallocate = first_allocation(options.segment_bytes);
        let mut effects = recovery::apply::Effects::default();
        let first = recover_and_seal(&*storage, &dir, &options, preallocate, &mut effects);
        let (recovered, sealed) = match first {
            Err(e) if e.is_no_space() => {
                // Tried again with nothing reserved ahead, and a file kept
                // for recycling removed: its space is this outbox's, and the
                // open needs it more. So even without a reserve (one this
                // outbox could not make at its last open, on a disk as full),
                // a spare's space opens it.
                let released = reserve::release(&*storage, &dir).unwrap_or(false);
                let tight = options.clone().recycle_segments(false);
                let (mut again, sealed) =
                    recover_and_seal(&*storage, &dir, &tight, 0, &mut effects)?;
                // The second try took back the space the first reserved in
                // the empty newest segment (`recovery::apply::reuse`), for
                // the seal first: what is left goes back to that segment,
                // where the drain writes, before the reserve is made again.
                let _ = again.active.segment.file.allocate(preallocate);
                again.report.reserve_released = released;
                (again, sealed)
            }
            // The empty newest segment, the writer's again, could not be
            // given room for a frame: the reserve's space goes to it, as to
            // a segment an open creates on a full disk (nothing written yet
            // needs trying again). Reserved in that segment, so that the
            // reserve made again at the end of this open cannot take it back
            // before the writer writes there.
            Ok((mut recovered, sealed))
                if effects.active_without_room
                    && reserve::release(&*storage, &dir).unwrap_or(false) =>
            {
                let _ = reserve::fill(
                    &*recovered.active.segment.file,
                    reserve::size(options.segment_bytes),
                );
                recovered.report.reserve_released = true;
                (recovered, sealed)
            }
            other => other?,
        };
        // The delivery state the log recorded, in log order: acknowledged
        // records are never handed out, delayed ones wait, dead letters stay.
        let clock = Clock::new(recovered.active.segment.id.first_seq());
        let (now, now_wall) = (clock.now_us(), crate::io::segment_file::now_us());
        let (mut table, ids) =
            recovery::rebuild::rebuild(recovered.segments, &recovered.state, now, now_wall);
        // Replayed: its memory (a million keyed records' descriptions take
        // 64 MB) goes before the deduplication ids are built.
        drop(recovered.state);
        if options.max_attempts.is_none() {
            table.forget_deliveries();
        }
        let dedup = recovered_ids(ids, &options, now_wall);
        let mut report = recovered.report;
        report.records_recovered = table.pending();
        if cfg!(debug_assertions) {
            table.check_invariants();
        }
        // Unbounded: the budget bounds it (in bytes and requests) before a
        // request is even built, and no memory is set aside for its capacity.
        let (tx, rx) = crossbeam_channel::unbounded();
        let outbox_id = recovered.active.outbox_id;
        let shared = Arc::new(Shared {
            hasher: crate::format::hash::Hasher::new(outbox_id),
            clock,
            dir,
            files: FileCache::new(storage.clone()),
            storage,
            budget: Budget::new(options.queue_bytes, options.queue_capacity),
            options,
            table: Mutex::new(table),
            arrived: Condvar::new(),
            closed: AtomicBool::new(false),
            generation: crate::io::fork::watch(),
            poison: OnceLock::new(),
            counters: Counters::default(),
            lock: Mutex::new(Some(lock)),
            arrivals: Default::default(),
            timers: OnceLock::new(),
            writer_waiting_since_us: Default::default(),
            writer_wants_lock: Default::default(),
            reserve_missing: Default::default(),
            writer_sleeps_until_us: AtomicU64::new(crate::log::shared::WRITER_AWAKE),
            caller_batch_end_us: AtomicU64::new(0),
            waiters: Default::default(),
        });
        Counters::add(&shared.counters.fsyncs, u64::from(sealed));
        let thread_rx = rx.clone();
        let mut writer = Writer::start(
            shared.clone(),
            rx,
            recovered.active,
            recovered.log_start,
            dedup,
            recovered.spare,
        )?;
        // Segments the log starts with fully acknowledged (the one the open
        // sealed, those a close or a crash left, those held for their ids) go
        // now, not at the first request: an idle outbox would keep them. A
        // failed write or sync there fails the open, as a failed seal does:
        // nothing is written after it, and the next open recovers.
        writer.delete_at_open();
        if let Some(e) = shared.poison.get() {
            return Err(e.clone());
        }
        let core = Arc::new(Mutex::new(writer));
        let thread_core = core.clone();
        let ended = Arc::new(WriterEnd::default());
        let thread_ended = ended.clone();
        let thread = std::thread::Builder::new()
            .name("segwal-writer".into())
            .spawn(move || {
                let outcome = writer::run(thread_core, thread_rx);
                thread_ended.set(outcome.clone());
                outcome
            })
            .map_err(|e| Error::io("spawn writer thread", &shared.dir, e))?;
        trace_open(&shared.dir, &report);
        // Kept aside for the next open that finds the disk full. Where there
        // is no room for it, appends are refused until there is: what is left is the
        // next open's (the writer tries again, `Writer::reserve_short`). Made
        // after the deletion above: made first, a missing reserve would have
        // the deletion weigh its hold for ids as appends refused, and write
        // tombstones a nearly full disk may not have room for.
        // Not made while the deletion above waits for room for its
        // tombstones: the space freed goes to that deletion first (the
        // writer makes the reserve once it went, `Writer::reserve_short`).
        let size = reserve::size(shared.options.segment_bytes);
        let reserved = if core.lock().held_for_space()
            && reserve::would_grow(&*shared.storage, &shared.dir, size)
        {
            Err(std::io::Error::from_raw_os_error(libc::ENOSPC))
        } else {
            reserve::ensure(&*shared.storage, &shared.dir, size)
        };
        match reserved {
            Err(e) if reserve::is_no_space(&e) => {
                shared
                    .reserve_missing
                    .store(true, std::sync::atomic::Ordering::Relaxed);
                // A segment the deletion above kept for recycling holds
                // space the reserve needs more: it goes now, not at the
                // first append, and the reserve is tried again.
                core.lock().reserve_at_open();
            }
            // Not segwal's to write (a link, another name of a file):
            // left as it is, and no space kept.
            Err(e)
                if e.kind() == std::io::ErrorKind::InvalidData
                    || matches!(e.raw_os_error(), Some(libc::ELOOP | libc::EISDIR)) =>
            {
                crate::event!(
                    warn,
                    path = %shared.dir.join(reserve::RESERVE_FILE).display(),
                    error = %e,
                    "no reserve kept: RESERVE is not a plain file of segwal's own"
                );
            }
            _ => {}
        }
        // Records to carry forward out of the oldest segment (the rule of
        // relocation weighs the log as this open found it, with this open's
        // `segment_bytes`): asked for now, after the reserve was made, not
        // at the first request, which an idle outbox may not get.
        if core.lock().reclaim_due() {
            let _ = tx.try_send(Request::Reclaim);
        }
        Ok(Outbox {
            handle: Arc::new(Handle {
                shared,
                tx: RwLock::new(Some(ToWriter { tx, core })),
                writer: Mutex::new(Some(thread)),
                report,
                outbox_id,
                closing: Mutex::new(()),
                ended,
                at_close: Mutex::new(None),
                opened: OPENINGS.fetch_add(1, Ordering::Relaxed),
            }),
        })
    }

    /// The outbox directory, as resolved when it was opened (absolute, with no
    /// symbolic link left in it).
    pub fn dir(&self) -> &Path {
        &self.handle.shared.dir
    }

    /// The outbox's identity: 128 bits drawn at random when its directory got
    /// its first segment, repeated in every segment header, and kept for the
    /// directory's life. Sequence numbers start again at 1 in a new or wiped
    /// directory, under a new identity; so a record's key for deduplication
    /// downstream is this identity with its sequence number.
    pub fn id(&self) -> u128 {
        self.handle.outbox_id
    }

    /// What recovery found and changed when this outbox was opened.
    pub fn recovery_report(&self) -> &RecoveryReport {
        &self.handle.report
    }

    /// Appends one record and returns its sequence number once it is durable (under
    /// the default [`Durability::Sync`](crate::Durability::Sync)).
    ///
    /// Waits while the writer queue is full. An error means the record may or may
    /// not be delivered after a reopen (it is *in doubt*), except for
    /// [`Error::RecordTooLarge`] and [`Error::Closed`] raised before the record
    /// reached the writer. Zero-length payloads are valid records.
    ///
    /// ```
    /// # fn main() -> segwal::Result<()> {
    /// # let dir = tempfile::tempdir().expect("temporary directory");
    /// # let outbox = segwal::Outbox::open(dir.path(), segwal::Options::default())?;
    /// // Durable once it returns: the record survives a crash or a power cut.
    /// let first = outbox.append(b"order 7781 created")?;
    /// let second = outbox.append(b"order 7782 created")?;
    /// assert!(second > first);
    /// # outbox.close()?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn append(&self, payload: &[u8]) -> Result<Seq> {
        self.check_record(payload)?;
        let bytes = frame_len(payload.len()) as u64;
        self.submit(|| Payloads::One(payload.to_vec()), bytes, true)
    }

    /// Like [`append`](Outbox::append), but fails with [`Error::Full`] instead of
    /// waiting when the writer queue is full. Once queued, it waits like
    /// `append`: for the fsync under [`Durability::Sync`](crate::Durability::Sync),
    /// for the write under [`Durability::Buffered`](crate::Durability::Buffered).
    pub fn try_append(&self, payload: &[u8]) -> Result<Seq> {
        self.check_record(payload)?;
        let bytes = frame_len(payload.len()) as u64;
        self.submit(|| Payloads::One(payload.to_vec()), bytes, false)
    }

    /// Appends many records with one wait. They get contiguous sequence numbers,
    /// are written in one write batch and become durable together: after a crash
    /// either all of them are recovered or none. An empty batch returns at once.
    ///
    /// ```
    /// # fn main() -> segwal::Result<()> {
    /// # let dir = tempfile::tempdir().expect("temporary directory");
    /// # let outbox = segwal::Outbox::open(dir.path(), segwal::Options::default())?;
    /// let seqs = outbox.append_batch(&[&b"first"[..], b"second", b"third"])?;
    /// assert_eq!(seqs.len(), 3);
    /// assert_eq!(seqs[1].get(), seqs[0].get() + 1);
    /// # outbox.close()?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn append_batch<P: AsRef<[u8]>>(&self, payloads: &[P]) -> Result<Vec<Seq>> {
        self.handle.shared.check_usable()?;
        if payloads.is_empty() {
            return Ok(Vec::new());
        }
        let mut bytes = 0u64;
        for p in payloads {
            self.check_record(p.as_ref())?;
            bytes += frame_len(p.as_ref().len()) as u64;
        }
        let max = self.handle.shared.options.queue_bytes;
        if bytes > max {
            return Err(Error::BatchTooLarge { len: bytes, max });
        }
        let owned = || Payloads::Many(payloads.iter().map(|p| p.as_ref().to_vec()).collect());
        let first = self.submit(owned, bytes, true)?;
        Ok((0..payloads.len() as u64)
            .map(|i| Seq::from(first.get() + i))
            .collect())
    }

    /// Makes every record appended so far, and every acknowledgement made so
    /// far, durable. Under the default durabilities appends already are; an
    /// acknowledgement is once this returns.
    ///
    /// ```
    /// # fn main() -> segwal::Result<()> {
    /// # let dir = tempfile::tempdir().expect("temporary directory");
    /// # let outbox = segwal::Outbox::open(dir.path(), segwal::Options::default())?;
    /// let seq = outbox.append(b"order 7781 created")?;
    /// let records = outbox.claim(1)?;
    /// outbox.ack(records[0].seq())?;
    /// // Under the default Durability::Buffered the ack is durable within
    /// // Options::buffered_sync_interval; `sync` makes it durable now.
    /// outbox.sync()?;
    /// assert_eq!(records[0].seq(), seq);
    /// # outbox.close()?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn sync(&self) -> Result<()> {
        self.handle.shared.check_usable()?;
        let (completion, done) = Completion::new(&self.handle.shared.waiters);
        self.send(Request::Sync { done })?;
        completion.wait().map(|_| ())
    }

    fn check_record(&self, payload: &[u8]) -> Result<()> {
        let shared = &self.handle.shared;
        shared.check_usable()?;
        let max = shared.options.max_record_bytes;
        if payload.len() > max {
            return Err(Error::RecordTooLarge {
                len: payload.len(),
                max,
            });
        }
        Ok(())
    }

    /// Sends an append of `bytes` (encoded) whose payloads `copy` makes, and
    /// waits for its outcome. The payloads are copied only once the queue has
    /// room for them: waiting producers hold no copy, so `queue_bytes` bounds
    /// the memory of the queue, not only its channel.
    fn submit(&self, copy: impl FnOnce() -> Payloads, bytes: u64, wait: bool) -> Result<Seq> {
        // The ticket goes back to the budget with the request, whatever becomes
        // of it.
        let ticket = Ticket::take(&self.handle.shared, bytes, wait)?;
        let (completion, done) = Completion::new(&self.handle.shared.waiters);
        let request = Request::Append {
            payloads: copy(),
            ticket,
            done,
        };
        self.hand(request)?;
        completion.wait_spinning(self.handle.shared.spin_for_answer())
    }

    /// Appends `value` serialised as JSON (feature `json`, on by default),
    /// like [`append`](Outbox::append); [`Record::json`] reads it back. Fails
    /// with [`Error::Json`], writing nothing, if `value` cannot be serialised
    /// or is nested more than 127 levels deep, which serde_json's reader
    /// refuses. A float
    /// that is NaN or infinite is written as `null` (serde_json's rule), and
    /// reads back as `null`: see [`Message::json`] for JSON with
    /// deduplication.
    ///
    /// ```
    /// # fn main() -> segwal::Result<()> {
    /// #[derive(serde::Serialize, serde::Deserialize, Debug, PartialEq)]
    /// struct OrderCreated { order: u64, total_cents: u64 }
    ///
    /// let dir = tempfile::tempdir().expect("temporary directory");
    /// let outbox = segwal::Outbox::open(dir.path(), segwal::Options::default())?;
    /// let event = OrderCreated { order: 7781, total_cents: 1999 };
    /// outbox.append_json(&event)?;
    /// let back: OrderCreated = outbox.claim(1)?[0].json()?;
    /// assert_eq!(back, event);
    /// # outbox.close()?;
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "json")]
    pub fn append_json<T: serde::Serialize + ?Sized>(&self, value: &T) -> Result<Seq> {
        let bytes = crate::message::json_bytes(value)?;
        self.append(&bytes)
    }

    /// Appends one [`Message`]: a record with an ordering key, a not-before
    /// time or a deduplication id (any of them). Durable on return, like
    /// [`append`](Outbox::append).
    ///
    /// With a deduplication id already appended within
    /// [`Options::dedup_window`] and the same payload, nothing is written and
    /// the answer is the first record's seq with `duplicate: true` (even if
    /// that record was acknowledged and deleted since); with another payload,
    /// [`Error::Conflict`]. Two producers racing with one id get one record
    /// and one duplicate answer. A backlog quota or the free-disk floor
    /// refuses the append with [`Error::QuotaExceeded`] (a duplicate is never
    /// refused: it writes nothing).
    ///
    /// ```
    /// # fn main() -> segwal::Result<()> {
    /// # let dir = tempfile::tempdir().expect("temporary directory");
    /// # let outbox = segwal::Outbox::open(dir.path(), segwal::Options::default())?;
    /// use segwal::Message;
    ///
    /// let message = Message::new(br#"{"order": 7781}"#)
    ///     .key(b"account-42")
    ///     .dedup_id(b"order-7781/created");
    /// let first = outbox.append_message(&message)?;
    /// // The same id and the same payload again: nothing written, the first seq.
    /// let again = outbox.append_message(&message)?;
    /// assert!(!first.duplicate && again.duplicate);
    /// assert_eq!(again.seq, first.seq);
    /// # outbox.close()?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn append_message(&self, message: &Message<'_>) -> Result<Appended> {
        let bytes = self.check_messages(std::slice::from_ref(message))?;
        let hasher = self.handle.shared.hasher;
        let copy = || Payloads::Message(Box::new(owned(&hasher, message)));
        let (outcome, verdicts) = self.submit_messages(copy, bytes)?;
        let one = std::slice::from_ref(message);
        match (outcome, verdicts) {
            (Ok(_), Verdicts::One(v)) => Ok(appended(v)),
            (outcome, verdicts) => answers(outcome, verdicts, one, &hasher)?
                .pop()
                .ok_or(Error::Closed),
        }
    }

    /// Appends many [`Message`]s with one wait, like
    /// [`append_batch`](Outbox::append_batch): the records written are
    /// numbered in order and become durable together. One answer per
    /// message, in order. All or nothing: a conflict or a quota refuses
    /// every message of the call, and nothing is written. Two messages of
    /// the call with one deduplication id and different payloads are
    /// refused with [`Error::InvalidMessage`] (`"dedup_id"`); with the same
    /// payload, the second is a duplicate of the first. Several messages
    /// larger in all than [`Options::queue_bytes`](crate::Options::queue_bytes)
    /// are [`Error::BatchTooLarge`]; one message alone always fits.
    pub fn append_messages(&self, messages: &[Message<'_>]) -> Result<Vec<Appended>> {
        if messages.is_empty() {
            self.handle.shared.check_usable()?;
            return Ok(Vec::new());
        }
        let bytes = self.check_messages(messages)?;
        let hasher = self.handle.shared.hasher;
        let copy = || Payloads::Messages(messages.iter().map(|m| owned(&hasher, m)).collect());
        let (outcome, verdicts) = self.submit_messages(copy, bytes)?;
        answers(outcome, verdicts, messages, &hasher)
    }

    /// Checks messages before anything is queued; returns their encoded bytes.
    fn check_messages(&self, messages: &[Message<'_>]) -> Result<u64> {
        self.handle.shared.check_usable()?;
        let mut bytes = 0u64;
        for m in messages {
            self.check_record(&m.payload)?;
            m.check()?;
            bytes += frame_len(m.payload.len() + ext_len(m)) as u64;
        }
        // A message alone always fits the queue (as an `append` of
        // `max_record_bytes` does): its optional fields may take it a few
        // hundred bytes past `queue_bytes`.
        let max = self.handle.shared.options.queue_bytes;
        if bytes > max && messages.len() > 1 {
            return Err(Error::BatchTooLarge { len: bytes, max });
        }
        // Ids as the writer sees them: a unique item's derived from its
        // payload, which a caller may also give as an explicit id (it reads
        // it back with `Record::dedup_id`). Unique items alone cannot clash
        // (two payloads, two ids, but for a 64-bit collision): checked only
        // where an id is given.
        if messages.len() > 1
            && messages.iter().any(|m| m.dedup_id.is_some())
            && messages
                .iter()
                .filter(|m| m.dedup_id.is_some() || m.unique)
                .nth(1)
                .is_some()
        {
            let hasher = &self.handle.shared.hasher;
            let mut seen: std::collections::HashMap<Vec<u8>, &[u8]> =
                std::collections::HashMap::new();
            for m in messages {
                let mut buf = [0u8; UNIQUE_ID_LEN];
                let Some(id) = dedup_id(hasher, m, &mut buf) else {
                    continue;
                };
                if *seen.entry(id.to_vec()).or_insert(&m.payload) != &*m.payload {
                    return Err(Error::InvalidMessage {
                        field: "dedup_id",
                        reason: format!(
                            "{} is given to two messages of one call with different payloads; nothing written",
                            String::from_utf8_lossy(id).escape_debug()
                        ),
                    });
                }
            }
        }
        Ok(bytes)
    }

    /// [`submit`](Outbox::submit) for messages: the outcome, and the verdict
    /// of each message.
    fn submit_messages(
        &self,
        copy: impl FnOnce() -> Payloads,
        bytes: u64,
    ) -> Result<(Result<Seq>, Verdicts)> {
        let ticket = Ticket::take(&self.handle.shared, bytes, true)?;
        let (completion, done) = Completion::new(&self.handle.shared.waiters);
        self.hand(Request::Append {
            payloads: copy(),
            ticket,
            done,
        })?;
        let outcome = completion.wait_spinning(self.handle.shared.spin_for_answer());
        Ok((outcome, completion.take_verdicts()))
    }

    /// Hands `request` to the writer (never waits: the queue's bounds were
    /// taken with the request's ticket).
    fn send(&self, request: Request) -> Result<()> {
        let to = self.handle.tx.read();
        let Some(to) = to.as_ref() else {
            return Err(Error::Closed);
        };
        to.tx.send(request).map_err(|_| Error::Closed)
    }

    /// Hands a blocking append to the writer: writes it on this thread when
    /// the producer appends alone and the writer thread does not wait for
    /// the writer's lock
    /// ([`Options::caller_writes`](crate::Options::caller_writes)), else
    /// queues it for the writer thread. A producer appending alone that
    /// finds the lock held waits for it, at most [`ALONE_LOCK_WAIT`], then
    /// queues.
    fn hand(&self, request: Request) -> Result<()> {
        let shared = &self.handle.shared;
        let to = self.handle.tx.read();
        let Some(to) = to.as_ref() else {
            return Err(Error::Closed);
        };
        let options = &shared.options;
        let alone = options.caller_writes
            && options.durability == Durability::Sync
            && options.linger.is_zero()
            && to.tx.is_empty()
            && shared.budget.requests() <= 1
            && shared.counters.last_batch_appends.load(Ordering::Relaxed) <= 1
            && !shared.writer_wants_lock.load(Ordering::Relaxed)
            && shared.poison.get().is_none();
        // The writer's lock may be held by the writer thread for a moment
        // after it answered this producer's last append (its timed duties,
        // the look at its deadlines before it sleeps): waiting for that
        // beats queueing, which would find the thread still awake, be
        // answered by it, and find it awake again. A request queued behind
        // what the thread is doing would wait as long. If the thread began
        // to wait for the lock meanwhile (with a request it took from the
        // queue, perhaps another producer's), the lock is left to it.
        if alone
            && let Some(mut writer) = to.core.try_lock_for(ALONE_LOCK_WAIT)
            && !shared.writer_wants_lock.load(Ordering::Relaxed)
            && shared.poison.get().is_none()
        {
            // The close that follows a write lock on `tx` cannot begin while
            // this thread holds the read lock, so the writer is not finished.
            if writer.write_inline(request) {
                drop(writer);
                let _ = to.tx.try_send(Request::Reclaim);
            }
            return Ok(());
        }
        to.tx.send(request).map_err(|_| Error::Closed)
    }

    /// [`Options::lease`](crate::Options::lease) of this outbox.
    pub(crate) fn lease(&self) -> Duration {
        self.handle.shared.options.lease
    }

    /// Fails with [`Error::Closed`] or the poisoning error if the outbox can
    /// no longer make anything durable.
    pub(crate) fn check_usable(&self) -> Result<()> {
        self.handle.shared.check_usable()
    }

    /// Claims up to `max_records` of the oldest pending records and returns them.
    ///
    /// Records come oldest first (by sequence number), records released back
    /// before newer ones. A claimed record stays claimed until it is acknowledged,
    /// released or dead-lettered, or its lease ([`Options::lease`](crate::Options::lease))
    /// runs out; after a reopen every record not acknowledged is pending again
    /// (or delayed, or dead, as the log recorded). Never waits for an fsync in
    /// progress, except under
    /// [`Options::max_attempts`](crate::Options::max_attempts), where each
    /// delivery's number is made durable (a [`sync`](Outbox::sync)) before the
    /// records are handed out; returns an empty vector when nothing is pending.
    ///
    /// If a record's frame fails its checksum, the claim fails with
    /// [`Error::Corrupt`] naming the file, offset and seq; that record is set aside
    /// (counted in [`Stats::corrupt_records`], never handed out) and the others
    /// are released, so the next claim moves on. A record a newer build wrote
    /// ([`Corruption::is_unknown_format`](crate::Corruption::is_unknown_format))
    /// fails its claim the same way but is held back until its lease runs
    /// out, not set aside (docs/GUARANTEES.md, section 3).
    ///
    /// ```
    /// # fn main() -> segwal::Result<()> {
    /// # let dir = tempfile::tempdir().expect("temporary directory");
    /// # let outbox = segwal::Outbox::open(dir.path(), segwal::Options::default())?;
    /// outbox.append_batch(&[&b"a"[..], b"b", b"c"])?;
    /// let records = outbox.claim(2)?;
    /// assert_eq!(records.len(), 2);
    /// assert_eq!(records[0].payload(), b"a");
    /// assert_eq!(records[0].attempt(), 1);
    /// // Nothing pending is not an error: an empty vector.
    /// outbox.claim(256)?; // "c"
    /// assert!(outbox.claim(256)?.is_empty());
    /// # outbox.close()?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn claim(&self, max_records: usize) -> Result<Vec<Record>> {
        self.claim_bytes(max_records, u64::MAX)
    }

    /// Like [`claim`](Outbox::claim), also stopping before the total bytes of
    /// the records exceed `max_bytes`; at least one record is returned when
    /// any is pending, however large. A record's bytes here are its payload
    /// and the optional fields it was written with (its key, deduplication
    /// id and not-before time; for a record carried forward, also its
    /// delivery state and last reason): the claim weighs what the outbox
    /// keeps in memory, frame lengths, not the payloads alone. So the
    /// payloads handed out never total more than `max_bytes` (but for a
    /// lone record larger than it), and records with optional fields come a
    /// few fewer than their payloads alone would allow.
    pub fn claim_bytes(&self, max_records: usize, max_bytes: u64) -> Result<Vec<Record>> {
        let shared = &self.handle.shared;
        shared.check_open()?;
        let claimed = {
            let mut table = shared.table.lock();
            // Again under the lock: attempts are queued only while the
            // writer can still take them (see `ack_many`).
            shared.check_open()?;
            self.claim_leased(&mut table, max_records, max_bytes)
        };
        claimed.notices.report();
        self.hand_out(claimed.runs, claimed.durable_first, claimed.wake)
    }

    /// Reads the records of a claim's `runs`, then, when their attempts were
    /// queued for the log (`durable_first`), makes those durable before the
    /// records are handed out. Read first, so that a close that begins
    /// during the sync (its writer fsyncs the attempts) still hands them out
    /// rather than leave a delivery counted for records never handed out.
    /// `wake`: the claim parked dead letters the writer must be woken for
    /// if no sync follows ([`Claimed::wake`]).
    fn hand_out(
        &self,
        runs: Vec<crate::state::table::ClaimRun>,
        durable_first: bool,
        wake: bool,
    ) -> Result<Vec<Record>> {
        let records = self.read_before_hand_out(&runs, wake)?;
        if durable_first {
            self.attempts_synced(&runs, self.synced_by_the_close(self.sync()))?;
        }
        Ok(records)
    }

    /// Reads a claim's records ([`read_claimed`](Outbox::read_claimed)). A
    /// read that fails ends the claim before its sync: the writer is woken
    /// then for what the claim noted (`wake`), since the failure's own
    /// changes, noted after them, do not wake it again.
    fn read_before_hand_out(
        &self,
        runs: &[crate::state::table::ClaimRun],
        wake: bool,
    ) -> Result<Vec<Record>> {
        let read = self.read_claimed(runs);
        if read.is_err() && wake {
            self.nudge_writer();
        }
        read
    }

    /// Whether each delivery's number is written to the log (under
    /// `max_attempts`).
    fn records_attempts(&self) -> bool {
        let options = &self.handle.shared.options;
        // The negative control counts attempts in memory only.
        options.max_attempts.is_some() && !crate::injected!(options, AttemptsInMemoryOnly)
    }

    /// The outcome of the sync that makes a claim's attempts durable before
    /// its records are handed out: if it failed, the records go back, never
    /// handed out, rather than stay claimed until their lease runs out. A
    /// close that began after the attempts were queued answers for it
    /// ([`synced_by_the_close`](Outbox::synced_by_the_close)).
    fn attempts_synced(
        &self,
        runs: &[crate::state::table::ClaimRun],
        synced: Result<()>,
    ) -> Result<()> {
        if synced.is_err() {
            let taken = runs
                .iter()
                .flat_map(|r| r.frames.iter().map(|f| (f.seq, r.claim)));
            self.handle
                .shared
                .table
                .lock()
                .put_back_unread(taken, self.records_attempts());
            self.handle.shared.notify_arrived(true);
        }
        synced
    }

    /// The outcome of the sync that makes a change of delivery state durable
    /// (under `ack_durability(Sync)`), the change made under the table lock
    /// while the outbox was open. `Closed` then means a close began after
    /// the change: its writer takes every change made before its mark and
    /// fsyncs them. So the answer is the close's: once its writer ended,
    /// `Ok` if its last fsync held, else the poison.
    fn synced_by_the_close(&self, synced: Result<()>) -> Result<()> {
        // On segwal's own thread the writer may be waiting for this very
        // thread (it is the writer, or the notifier the writer joins as it
        // stops): the change stays in doubt, answered `Closed`.
        if !matches!(synced, Err(Error::Closed)) || crate::log::shared::on_own_thread() {
            return synced;
        }
        // Whoever began the close (one begun on segwal's own thread holds no
        // lock), the writer's end says whether its last fsync held. (An
        // async claim waits here too, for that one fsync.)
        let ended = self.handle.ended.wait();
        match self.handle.shared.poison.get() {
            Some(e) => Err(e.clone()),
            None => ended,
        }
    }

    /// Claims under the table lock: records whose lease ran out go back to
    /// pending first (ahead of newer ones), then the claimed ones are held
    /// under a new lease and their deliveries numbered. Under `max_attempts`,
    /// returns true when the attempts were queued for the log: the caller
    /// makes them durable (`sync`) before it hands the records out. Also
    /// returns the table's notices, which the caller reports once it has
    /// released the lock, and whether the writer must be woken to write the
    /// dead letters the claim parked ([`Claimed::wake`]), which the caller
    /// does (`nudge_writer`) if it does not sync.
    fn claim_leased(&self, table: &mut Table, max_records: usize, max_bytes: u64) -> Claimed {
        let shared = &self.handle.shared;
        let now = shared.clock.now_us();
        table.expire(now);
        let mut any_queued = false;
        let mut any_parked = false;
        loop {
            let mut runs = table.claim(max_records, max_bytes);
            let (queued, parked) = table.lease(
                &mut runs,
                Clock::lease_deadline(now, shared.options.lease),
                shared.options.max_attempts,
                crate::io::segment_file::now_us(),
                // The negative control counts attempts in memory only.
                !crate::injected!(shared.options, AttemptsInMemoryOnly),
            );
            any_queued |= queued;
            any_parked |= parked > 0;
            // Every record taken was parked (past `max_attempts`): take the
            // next ones, so that a claim comes back empty only when nothing
            // is pending.
            if !runs.is_empty() || parked == 0 {
                // A record parked here is a dead letter like one `dead_letter`
                // makes, written within the sync interval: noted for the
                // writer, which otherwise sleeps on past it when this claim
                // hands nothing out (and so makes nothing durable).
                let wake = any_parked && shared.state_noted(table).wake;
                return Claimed {
                    runs,
                    durable_first: any_queued,
                    notices: table.take_notices(),
                    wake,
                };
            }
        }
    }

    /// Renews the lease of the claimed record `seq` for `lease` from now (the
    /// relay is still working on it). Fails with [`Error::NotClaimed`] if it is
    /// not claimed, or its lease already ran out and it went back to pending;
    /// with [`Error::UnknownSeq`] if `seq` was never assigned to a record.
    /// Any `lease` is taken, zero included: a lease that ends at once lets
    /// the record go back to pending at the next claim, as an expiry (and
    /// wakes [`claim_wait`](Outbox::claim_wait) callers, who then take it);
    /// to hand it back without counting an expiry,
    /// [`release`](Outbox::release) it.
    ///
    /// It acts on whichever claim holds `seq` now: after this relay's lease
    /// ran out and another claim (another relay's) took the record, on that
    /// one. With several relays on one outbox, settle with the calls that
    /// take the [`Record`] ([`extend_record`](Outbox::extend_record)), which act only on
    /// the delivery that handed it out.
    ///
    /// ```
    /// # fn main() -> segwal::Result<()> {
    /// # let dir = tempfile::tempdir().expect("temporary directory");
    /// # let outbox = segwal::Outbox::open(dir.path(), segwal::Options::default())?;
    /// use std::time::Duration;
    ///
    /// outbox.append(b"a slow delivery")?;
    /// let record = outbox.claim(1)?.remove(0);
    /// // Still working on it: hold it five more minutes.
    /// outbox.extend(record.seq(), Duration::from_secs(300))?;
    /// outbox.ack(record.seq())?;
    /// assert!(matches!(
    ///     outbox.extend(record.seq(), Duration::from_secs(300)),
    ///     Err(segwal::Error::NotClaimed { .. })
    /// ));
    /// # outbox.close()?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn extend(&self, seq: Seq, lease: Duration) -> Result<()> {
        self.extend_by(seq, None, lease)
    }

    /// Like [`extend`](Outbox::extend), but only while the delivery that
    /// handed out `record` holds it: [`Error::NotClaimed`] once its lease ran
    /// out, even if another claim (another relay's) took the record since.
    /// With several relays on one outbox, a relay renews this way, so that
    /// it never lengthens another's claim.
    ///
    /// ```
    /// # fn main() -> segwal::Result<()> {
    /// # let dir = tempfile::tempdir().expect("temporary directory");
    /// use std::time::Duration;
    ///
    /// let options = segwal::Options::default().lease(Duration::from_millis(50));
    /// let outbox = segwal::Outbox::open(dir.path(), options)?;
    /// outbox.append(b"slow to publish")?;
    /// let mine = outbox.claim(1)?.remove(0);
    /// outbox.extend_record(&mine, Duration::from_secs(60))?;
    /// // Had the lease run out and another relay claimed the record, the
    /// // renewal would be refused, and the other relay's claim left alone.
    /// outbox.ack(mine.seq())?;
    /// assert!(matches!(
    ///     outbox.extend_record(&mine, Duration::from_secs(60)),
    ///     Err(segwal::Error::NotClaimed { .. })
    /// ));
    /// # outbox.close()?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn extend_record(&self, record: &Record, lease: Duration) -> Result<()> {
        self.check_opening(record)?;
        self.extend_by(record.seq(), Some(record.claim), lease)
    }

    /// `NotClaimed` for a record another opening's claim handed out (of this
    /// outbox before a reopen, or of another outbox), whose claim number
    /// means nothing here.
    fn check_opening(&self, record: &Record) -> Result<()> {
        // A closed outbox answers `Closed` to every call, whatever it names.
        self.handle.shared.check_open()?;
        if record.opened != self.handle.opened {
            return Err(Error::NotClaimed { seq: record.seq() });
        }
        Ok(())
    }

    /// [`extend`](Outbox::extend) by the claim `by`, or any.
    pub(crate) fn extend_by(&self, seq: Seq, by: Option<u32>, lease: Duration) -> Result<()> {
        let shared = &self.handle.shared;
        shared.check_open()?;
        let mut table = shared.table.lock();
        shared.check_open()?;
        let now = shared.clock.now_us();
        table.expire(now);
        let deadline = Clock::lease_deadline(now, lease);
        // Waiters sleep until the earliest deadline they knew of: a lease cut
        // shorter than it must wake them, or its record waits for that.
        let sooner = deadline != crate::state::leases::NEVER
            && table.next_lease_deadline().is_none_or(|d| deadline < d);
        let extended = table.extend(seq, by, deadline);
        let notices = table.take_notices();
        drop(table);
        notices.report();
        if sooner && extended.is_ok() {
            shared.notify_arrived(true);
        }
        extended
    }

    /// Like [`claim`](Outbox::claim), but waits up to `timeout` for a record to
    /// become claimable; the writer wakes it as soon as one is durable. Returns an
    /// empty vector on timeout.
    ///
    /// ```
    /// # fn main() -> segwal::Result<()> {
    /// # let dir = tempfile::tempdir().expect("temporary directory");
    /// # let outbox = segwal::Outbox::open(dir.path(), segwal::Options::default())?;
    /// use std::time::Duration;
    ///
    /// let producer = outbox.clone();
    /// let thread = std::thread::spawn(move || producer.append(b"from another thread"));
    /// // Wakes as soon as the record is durable.
    /// let records = outbox.claim_wait(256, Duration::from_secs(10))?;
    /// assert_eq!(records[0].payload(), b"from another thread");
    /// thread.join().expect("producer").map(|_| ())?;
    /// # outbox.close()?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn claim_wait(&self, max_records: usize, timeout: Duration) -> Result<Vec<Record>> {
        let shared = &self.handle.shared;
        // A timeout too long to represent waits without one.
        let deadline = Instant::now().checked_add(timeout);
        // Before the lock too: in a child of a fork the lock may be held for
        // ever by a thread of the parent.
        shared.check_open()?;
        let mut table = shared.table.lock();
        loop {
            shared.check_open()?;
            let claimed = self.claim_leased(&mut table, max_records, u64::MAX);
            if !claimed.runs.is_empty() || max_records == 0 {
                drop(table);
                claimed.notices.report();
                return self.hand_out(claimed.runs, claimed.durable_first, claimed.wake);
            }
            if claimed.wake || !claimed.notices.is_empty() {
                // Without the lock: the writer woken for the dead letters
                // this claim parked (nothing handed out, nothing synced),
                // the notices reported; then a fresh look, as anything may
                // have changed meanwhile.
                parking_lot::MutexGuard::unlocked(&mut table, || {
                    if claimed.wake {
                        self.nudge_writer();
                    }
                    claimed.notices.report();
                });
                continue;
            }
            // Wake when the timeout ends, or when a lease runs out (its record
            // comes back): whichever is first.
            let lease_ends = table
                .next_lease_deadline()
                .and_then(|us| shared.clock.instant_at(us));
            let wake = match (deadline, lease_ends) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            match wake {
                Some(wake) => {
                    let timed_out = shared.arrived.wait_until(&mut table, wake).timed_out();
                    if timed_out && deadline.is_some_and(|d| Instant::now() >= d) {
                        return Ok(Vec::new());
                    }
                }
                None => shared.arrived.wait(&mut table),
            }
        }
    }

    /// Reads and checks the frames of `runs` into `out`. A run whose segment
    /// was deleted since it was claimed (its records carried forward by
    /// relocation meanwhile) is looked up again in the table and read where
    /// its records lie now; so is one whose bytes fail their check if its
    /// records moved meanwhile (the deleted segment's file may have been
    /// recycled under the read).
    fn read_runs(
        &self,
        runs: &[crate::state::table::ClaimRun],
        out: &mut Vec<Record>,
    ) -> std::result::Result<(), reader::ReadFailure> {
        let shared = &self.handle.shared;
        let skip_crc = crate::injected!(shared.options, SkipReadCrc);
        for run in runs {
            let mut found = Vec::new();
            let mut runs = vec![run.clone()];
            // Moved at most once per relocation step, and a step needs a
            // whole segment of appends before the next: a few tries suffice.
            for tries_left in (0..4).rev() {
                found.clear();
                match reader::read_runs(&runs, &shared.files, &mut found, skip_crc) {
                    Ok(()) => break,
                    Err(failure) if failure.gone || failure.corrupt => {
                        let frames: Vec<_> = runs.iter().flat_map(|r| r.frames.clone()).collect();
                        let now = shared.table.lock().runs_of(&frames);
                        // Bytes that fail their check where the records no
                        // longer lie are not damage: their segment was
                        // deleted, and its file recycled, after the read
                        // found it (the frames were carried forward). Where
                        // they still lie, the damage stands.
                        let moved = now.len() != runs.len()
                            || now.iter().zip(&runs).any(|(a, b)| a.path != b.path);
                        if failure.corrupt && !moved {
                            return Err(failure);
                        }
                        if tries_left == 0 && moved {
                            // Moved again under every try: never found bad
                            // where it lies, so not set aside (which would
                            // let its segment go without an ack), but held
                            // back, claimed, until its lease runs out; and the
                            // claim says so rather than pass on a checksum
                            // failure of bytes that are no longer its.
                            let path = runs
                                .first()
                                .map(|r| r.path.to_path_buf())
                                .unwrap_or_default();
                            let moving = std::io::Error::new(
                                std::io::ErrorKind::Interrupted,
                                "its frames moved (relocated) under every retry of the read; \
                                 held back, claimed, until its lease runs out",
                            );
                            return Err(reader::ReadFailure {
                                corrupt: false,
                                error: Error::io("read a claimed record", path, moving),
                                ..failure
                            });
                        }
                        if tries_left == 0 {
                            return Err(failure);
                        }
                        runs = now;
                    }
                    Err(failure) => return Err(failure),
                }
            }
            out.append(&mut found);
        }
        Ok(())
    }

    fn read_claimed(&self, runs: &[crate::state::table::ClaimRun]) -> Result<Vec<Record>> {
        let claimed: usize = runs.iter().map(|r| r.frames.len()).sum();
        let mut records = Vec::with_capacity(claimed);
        match self.read_runs(runs, &mut records) {
            Ok(()) => {
                // One claim's runs share its number.
                let claim = runs.first().map_or(0, |r| r.claim);
                for record in &mut records {
                    record.claim = claim;
                    record.opened = self.handle.opened;
                }
                Ok(records)
            }
            Err(failure) => {
                let shared = &self.handle.shared;
                let mut table = shared.table.lock();
                // Every other record goes back to pending. The one that failed
                // is set aside if its bytes are bad or gone; if the read
                // failed, it stays claimed (held back until its lease runs
                // out, then handed out again as a later attempt), so that a
                // failing range of the disk cannot wedge the queue.
                // The others were never handed out: their delivery does not
                // count.
                let others = runs
                    .iter()
                    .flat_map(|r| r.frames.iter().map(|f| (f.seq, r.claim)))
                    .filter(|&(s, _)| s != failure.seq);
                table.put_back_unread(others, self.records_attempts());
                let unread = matches!(&failure.error, Error::Corrupt { kind, .. } if kind.is_unknown_format());
                if !failure.corrupt
                    && let Some(run) = runs
                        .iter()
                        .find(|r| r.frames.iter().any(|f| f.seq == failure.seq))
                {
                    table.hold_unread(failure.seq, run.claim, unread, self.records_attempts());
                }
                let reclaim = failure.corrupt && table.set_aside(failure.seq);
                let noted = shared.state_noted(&mut table);
                drop(table);
                if noted.wake {
                    self.nudge_writer();
                }
                // The released records are claimable again.
                shared.notify_arrived(true);
                if failure.corrupt {
                    Counters::add(&shared.counters.corrupt_records, 1);
                    // Never handed out again: said where the service's logs
                    // show it, beside the error this one caller gets.
                    crate::event!(
                        warn,
                        seq = failure.seq.get(),
                        error = %failure.error,
                        "corrupt record set aside: it is never handed out again"
                    );
                } else if unread {
                    crate::event!(
                        error,
                        seq = failure.seq.get(),
                        error = %failure.error,
                        "a record this build does not read (a newer build wrote it) is held back, and no segment from its own on can be deleted: open the log with that build"
                    );
                }
                if reclaim {
                    self.nudge_writer();
                }
                Err(failure.error)
            }
        }
    }

    /// Acknowledges a claimed record: it is delivered and will not be handed out
    /// again. Once every record of the oldest sealed segments is acknowledged,
    /// the writer deletes their files, oldest first (one may be kept, renamed,
    /// to be written again as the next segment:
    /// [`Options::recycle_segments`](crate::Options::recycle_segments)).
    ///
    /// Acknowledging a record already acknowledged (or deleted) is Ok, so a relay
    /// may retry. A record that is pending (never claimed, or released;
    /// waiting for its own not-before time or its key's turn without ever
    /// having been handed out) fails with [`Error::NotClaimed`]; a number
    /// never assigned (or an internal frame's, or, under
    /// [`Durability::Buffered`](crate::Durability::Buffered), a record
    /// answered but not yet durable, which no claim can have taken) with
    /// [`Error::UnknownSeq`]. The acknowledgement is written to the log: durable
    /// at once under [`Durability::Sync`](crate::Durability::Sync), else with
    /// the next write batch or within
    /// [`Options::buffered_sync_interval`](crate::Options::buffered_sync_interval)
    /// (or at [`sync`](Outbox::sync)); once durable, the record is never handed
    /// out again, across restarts. An ack that arrives after the lease ran out
    /// and the record was claimed again is accepted: it was delivered. So is
    /// an ack of a record released with a delay
    /// ([`release_after`](Outbox::release_after)) or parked as a dead letter
    /// (its delivery turned out to have succeeded): it is done, and counted
    /// as neither any more.
    ///
    /// ```
    /// # fn main() -> segwal::Result<()> {
    /// # let dir = tempfile::tempdir().expect("temporary directory");
    /// # let outbox = segwal::Outbox::open(dir.path(), segwal::Options::default())?;
    /// outbox.append(b"webhook body")?;
    /// for record in outbox.claim(256)? {
    ///     // deliver(record.payload())?;
    ///     outbox.ack(record.seq())?;
    /// }
    /// assert_eq!(outbox.stats().pending, 0);
    /// # outbox.close()?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn ack(&self, seq: Seq) -> Result<()> {
        self.ack_many(&[seq])
    }

    /// Acknowledges many claimed records, all or none: if any of them would fail
    /// [`ack`](Outbox::ack), none is acknowledged and that error is returned.
    /// A failed write or fsync ([`Error::Poisoned`], under
    /// [`Durability::Sync`](crate::Durability::Sync) acknowledgements) is the
    /// exception: the acknowledgement is then in doubt, record by record, and
    /// after a reopen each record is either done or delivered again
    /// (docs/GUARANTEES.md, section 5).
    pub fn ack_many(&self, seqs: &[Seq]) -> Result<()> {
        let shared = &self.handle.shared;
        shared.check_open()?;
        let (reclaim, noted, passed) = {
            let mut table = shared.table.lock();
            // Again under the lock, as every change of delivery state does:
            // `close` marks the outbox closed before its writer takes the
            // last changes from the table, under this lock, and throws the
            // table away after. A change made after that take would be
            // answered Ok and written nowhere.
            shared.check_open()?;
            let reclaim = table.ack(seqs)?;
            (
                reclaim,
                shared.state_noted(&mut table),
                table.take_turn_passed(),
            )
        };
        // Each key whose turn passed has a record claimable now: as many
        // waiting relays may take one.
        if passed {
            shared.notify_arrived(seqs.len() > 1);
        }
        self.acknowledged(reclaim, noted)
    }

    /// Acknowledges every claimed record numbered at or below `seq`, and
    /// returns how many there were; records not claimed (pending, or already
    /// acknowledged) are left as they are. A relay that publishes in order
    /// acknowledges a whole batch with one call.
    ///
    /// For one relay: it acknowledges claimed records whoever claimed them.
    /// Where several threads or relays claim from one outbox, each must
    /// acknowledge its own records with [`ack`](Outbox::ack) or
    /// [`ack_many`](Outbox::ack_many): an `ack_through` of one would settle
    /// records another holds and has not published, or not even read yet
    /// (a claim whose read then fails would have lost them).
    ///
    /// ```
    /// # fn main() -> segwal::Result<()> {
    /// # let dir = tempfile::tempdir().expect("temporary directory");
    /// # let outbox = segwal::Outbox::open(dir.path(), segwal::Options::default())?;
    /// outbox.append_batch(&[&b"a"[..], b"b", b"c"])?;
    /// let records = outbox.claim(256)?;
    /// // Published in order: one call acknowledges the whole batch.
    /// let last = records.last().expect("three records").seq();
    /// assert_eq!(outbox.ack_through(last)?, 3);
    /// # outbox.close()?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn ack_through(&self, seq: Seq) -> Result<u64> {
        let shared = &self.handle.shared;
        shared.check_open()?;
        let (count, reclaim, noted, passed) = {
            let mut table = shared.table.lock();
            shared.check_open()?;
            let (count, reclaim) = table.ack_through(seq);
            let passed = table.take_turn_passed();
            (count, reclaim, shared.state_noted(&mut table), passed)
        };
        if passed {
            shared.notify_arrived(true);
        }
        if count > 0 {
            self.acknowledged(reclaim, noted)?;
        }
        Ok(count)
    }

    /// After acknowledgements: waits for their fsync under
    /// `ack_durability(Sync)`; otherwise wakes the writer thread to delete
    /// what they freed, or when it would not come to them within the sync
    /// interval (`wake`, from [`Shared::state_noted`](crate::log::shared::Shared::state_noted)).
    fn acknowledged(&self, reclaim: bool, noted: Noted) -> Result<()> {
        let shared = &self.handle.shared;
        if shared.poison.get().is_some() {
            // No writer will write them: a poisoned outbox keeps serving claims
            // and acks from memory, and its changes of delivery state are not
            // durable (they must not pile up either).
            let _ = shared.table.lock().take_unwritten();
            if shared.options.ack_durability == crate::Durability::Buffered {
                return Ok(());
            }
        }
        // Changes piling up faster than the disk takes them: this caller waits
        // for the writer, as under `Sync`. Not on segwal's own threads (a
        // waker), which the writer may be waiting for.
        if shared.options.ack_durability == crate::Durability::Sync
            || (noted.wait && !crate::log::shared::on_own_thread())
        {
            return self.synced_by_the_close(self.sync());
        }
        if reclaim || noted.wake {
            self.nudge_writer();
        }
        Ok(())
    }

    /// Returns a claimed record to pending: it is handed out again before any
    /// newer record. Fails with [`Error::NotClaimed`] if it is not claimed;
    /// with [`Error::UnknownSeq`] if `seq` was never assigned to a record.
    ///
    /// It acts on whichever claim holds `seq` now: after this relay's lease
    /// ran out and another claim (another relay's) took the record, on that
    /// one. With several relays on one outbox, settle with the calls that
    /// take the [`Record`] ([`release_record`](Outbox::release_record)), which act only on
    /// the delivery that handed it out.
    ///
    /// ```
    /// # fn main() -> segwal::Result<()> {
    /// # let dir = tempfile::tempdir().expect("temporary directory");
    /// # let outbox = segwal::Outbox::open(dir.path(), segwal::Options::default())?;
    /// outbox.append_batch(&[&b"a"[..], b"b"])?;
    /// let a = outbox.claim(1)?.remove(0);
    /// outbox.release(a.seq())?;
    /// // Handed out again before the newer record, as a new attempt.
    /// let again = outbox.claim(1)?.remove(0);
    /// assert_eq!(again.seq(), a.seq());
    /// assert_eq!(again.attempt(), 2);
    /// # outbox.close()?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn release(&self, seq: Seq) -> Result<()> {
        let shared = &self.handle.shared;
        shared.check_open()?;
        let mut table = shared.table.lock();
        shared.check_open()?;
        table.release(seq)?;
        drop(table);
        shared.notify_arrived(false);
        Ok(())
    }

    /// The delivery of the claimed record `seq` failed: it becomes claimable
    /// again after `delay` (at once for zero), and its next delivery carries
    /// `reason` as [`Record::last_error`] (cut to
    /// [`REASON_BYTES_MAX`](crate::REASON_BYTES_MAX) bytes). The delivery
    /// counts as an attempt. Durable like an acknowledgement (see
    /// [`Options::ack_durability`](crate::Options::ack_durability)): after a
    /// restart the record is still delayed until the same wall-clock time, and
    /// carries the same reason. [`Error::NotClaimed`] if `seq` is not held by a
    /// claim.
    ///
    /// It acts on whichever claim holds `seq` now: after this relay's lease
    /// ran out and another claim (another relay's) took the record, on that
    /// one. With several relays on one outbox, settle with the calls that
    /// take the [`Record`] ([`release_record`](Outbox::release_record)), which act only on
    /// the delivery that handed it out.
    ///
    /// ```
    /// # fn main() -> segwal::Result<()> {
    /// # let dir = tempfile::tempdir().expect("temporary directory");
    /// # let outbox = segwal::Outbox::open(dir.path(), segwal::Options::default())?;
    /// use std::time::Duration;
    ///
    /// outbox.append(b"webhook body")?;
    /// let record = outbox.claim(1)?.remove(0);
    /// outbox.release_after(record.seq(), Duration::ZERO, "HTTP 503 from the endpoint")?;
    /// let again = outbox.claim(1)?.remove(0);
    /// assert_eq!(again.last_error(), Some("HTTP 503 from the endpoint"));
    /// assert_eq!(again.attempt(), 2);
    /// # outbox.close()?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn release_after(&self, seq: Seq, delay: Duration, reason: &str) -> Result<()> {
        self.release_after_by(seq, None, delay, reason)
    }

    /// Like [`release_after`](Outbox::release_after), but only while the
    /// delivery that handed out `record` holds it: [`Error::NotClaimed`]
    /// once its lease ran out, even if another claim (another relay's) took
    /// the record since, whose claim it would otherwise end. With several
    /// relays on one outbox, a relay releases this way (the
    /// [`Relay`](crate::relay::Relay) does).
    ///
    /// ```
    /// # fn main() -> segwal::Result<()> {
    /// # let dir = tempfile::tempdir().expect("temporary directory");
    /// # let outbox = segwal::Outbox::open(dir.path(), segwal::Options::default())?;
    /// use std::time::Duration;
    ///
    /// outbox.append(b"webhook body")?;
    /// let record = outbox.claim(1)?.remove(0);
    /// outbox.release_record(&record, Duration::ZERO, "HTTP 503 from the endpoint")?;
    /// let again = outbox.claim(1)?.remove(0);
    /// assert_eq!(again.attempt(), 2);
    /// // The first delivery is over: releasing it again would end the second.
    /// assert!(matches!(
    ///     outbox.release_record(&record, Duration::ZERO, "late"),
    ///     Err(segwal::Error::NotClaimed { .. })
    /// ));
    /// # outbox.close()?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn release_record(&self, record: &Record, delay: Duration, reason: &str) -> Result<()> {
        self.check_opening(record)?;
        self.release_after_by(record.seq(), Some(record.claim), delay, reason)
    }

    /// [`release_after`](Outbox::release_after) by the claim `by`, or any.
    pub(crate) fn release_after_by(
        &self,
        seq: Seq,
        by: Option<u32>,
        delay: Duration,
        reason: &str,
    ) -> Result<()> {
        let shared = &self.handle.shared;
        shared.check_open()?;
        let now = shared.clock.now_us();
        let due = Clock::lease_deadline(now, delay);
        let not_before = crate::io::segment_file::now_us()
            .saturating_add(u64::try_from(delay.as_micros()).unwrap_or(u64::MAX));
        let noted = {
            let mut table = shared.table.lock();
            shared.check_open()?;
            table.release_after(seq, by, due, now, not_before, reason)?;
            shared.state_noted(&mut table)
        };
        // Claimable at once: wake a waiting relay.
        shared.notify_arrived(true);
        self.acknowledged(false, noted)
    }

    /// Parks the claimed record `seq` as a dead letter: the far side refused
    /// it for good. It is never handed out again until [`requeue`d](Outbox::requeue)
    /// (or [`discard`ed](Outbox::discard)), survives restarts, and is listed by
    /// [`dead_letters`](Outbox::dead_letters) with `reason` (cut to
    /// [`REASON_BYTES_MAX`](crate::REASON_BYTES_MAX) bytes) and its attempts.
    /// Durable like an acknowledgement. A dead letter does not pin its
    /// segment: once the log takes more than twice the bytes of its live
    /// frames plus two segments, or spans more than 64 segments, the writer
    /// copies the few records that keep the oldest segment, dead letters
    /// among them, forward into the active one wherever the copies take at
    /// most half of what they free, and the old segment is deleted
    /// (relocation, docs/GUARANTEES.md, section 7). [`Error::NotClaimed`] if `seq` is not held by a claim.
    ///
    /// It acts on whichever claim holds `seq` now: after this relay's lease
    /// ran out and another claim (another relay's) took the record, on that
    /// one. With several relays on one outbox, settle with the calls that
    /// take the [`Record`] ([`dead_letter_record`](Outbox::dead_letter_record)), which act only on
    /// the delivery that handed it out.
    ///
    /// ```
    /// # fn main() -> segwal::Result<()> {
    /// # let dir = tempfile::tempdir().expect("temporary directory");
    /// # let outbox = segwal::Outbox::open(dir.path(), segwal::Options::default())?;
    /// outbox.append(b"a body the endpoint refuses")?;
    /// let record = outbox.claim(1)?.remove(0);
    /// outbox.dead_letter(record.seq(), "HTTP 410 Gone")?;
    /// assert!(outbox.claim(256)?.is_empty());
    /// let dead = outbox.dead_letters(10)?;
    /// assert_eq!(dead[0].reason(), "HTTP 410 Gone");
    /// assert_eq!(outbox.stats().dead_letters, 1);
    /// # outbox.close()?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn dead_letter(&self, seq: Seq, reason: &str) -> Result<()> {
        self.dead_letter_by(seq, None, reason)
    }

    /// Like [`dead_letter`](Outbox::dead_letter), but only while the
    /// delivery that handed out `record` holds it: [`Error::NotClaimed`]
    /// once its lease ran out, even if another claim (another relay's) took
    /// the record since, which is publishing it (and, for a keyed record,
    /// would see the key's next record go out beside it). With several
    /// relays on one outbox, a relay parks records this way (the
    /// [`Relay`](crate::relay::Relay) does).
    ///
    /// ```
    /// # fn main() -> segwal::Result<()> {
    /// # let dir = tempfile::tempdir().expect("temporary directory");
    /// # let outbox = segwal::Outbox::open(dir.path(), segwal::Options::default())?;
    /// outbox.append(b"a body the endpoint refuses")?;
    /// let record = outbox.claim(1)?.remove(0);
    /// outbox.dead_letter_record(&record, "HTTP 410 Gone")?;
    /// assert_eq!(outbox.dead_letters(10)?[0].reason(), "HTTP 410 Gone");
    /// # outbox.close()?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn dead_letter_record(&self, record: &Record, reason: &str) -> Result<()> {
        self.check_opening(record)?;
        self.dead_letter_by(record.seq(), Some(record.claim), reason)
    }

    /// [`dead_letter`](Outbox::dead_letter) by the claim `by`, or any.
    pub(crate) fn dead_letter_by(&self, seq: Seq, by: Option<u32>, reason: &str) -> Result<()> {
        let shared = &self.handle.shared;
        shared.check_open()?;
        let (noted, passed) = {
            let mut table = shared.table.lock();
            shared.check_open()?;
            table.dead_letter(seq, by, reason, crate::io::segment_file::now_us())?;
            (shared.state_noted(&mut table), table.take_turn_passed())
        };
        if passed {
            shared.notify_arrived(false);
        }
        let outcome = self.acknowledged(false, noted);
        // Said once it holds (under `ack_durability(Sync)`, once durable).
        if outcome.is_ok() {
            crate::event!(warn, seq = seq.get(), reason, "dead letter");
        }
        outcome
    }

    /// The dead letters, oldest first, at most `max`, with their payloads
    /// (checked against their checksums, like claimed records).
    ///
    /// ```
    /// # fn main() -> segwal::Result<()> {
    /// # let dir = tempfile::tempdir().expect("temporary directory");
    /// # let outbox = segwal::Outbox::open(dir.path(), segwal::Options::default())?;
    /// outbox.append(b"refused")?;
    /// let record = outbox.claim(1)?.remove(0);
    /// outbox.dead_letter(record.seq(), "schema rejected")?;
    /// for dead in outbox.dead_letters(100)? {
    ///     println!("seq {} after {} attempts: {}", dead.seq(), dead.attempts(), dead.reason());
    ///     // A person decides: deliver it again, or drop it.
    ///     outbox.requeue(dead.seq())?;
    /// }
    /// assert_eq!(outbox.claim(1)?[0].seq(), record.seq());
    /// # outbox.close()?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn dead_letters(&self, max: usize) -> Result<Vec<DeadLetter>> {
        self.dead_letters_from(Seq::from(0), max)
    }

    /// The dead letters numbered `from` or later, oldest first, at most
    /// `max`: [`dead_letters`](Outbox::dead_letters) a page at a time, so
    /// that listing many large dead letters does not hold all their
    /// payloads at once (the next page starts after the last seq listed).
    ///
    /// ```
    /// # fn main() -> segwal::Result<()> {
    /// # let dir = tempfile::tempdir().expect("temporary directory");
    /// # let outbox = segwal::Outbox::open(dir.path(), segwal::Options::default())?;
    /// # for p in [&b"a"[..], b"b", b"c"] { outbox.append(p)?; }
    /// # for r in outbox.claim(3)? { outbox.dead_letter(r.seq(), "refused")?; }
    /// let mut from = segwal::Seq::from(0);
    /// let mut seen = 0;
    /// loop {
    ///     let page = outbox.dead_letters_from(from, 2)?;
    ///     let Some(last) = page.last() else { break };
    ///     from = segwal::Seq::from(last.seq().get() + 1);
    ///     seen += page.len();
    /// }
    /// assert_eq!(seen, 3);
    /// # outbox.close()?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn dead_letters_from(&self, from: Seq, max: usize) -> Result<Vec<DeadLetter>> {
        let shared = &self.handle.shared;
        shared.check_open()?;
        let found = shared.table.lock().dead_letters(from.get(), max);
        let mut out = Vec::with_capacity(found.len());
        for (run, entry) in found {
            let mut records = Vec::with_capacity(1);
            self.read_runs(std::slice::from_ref(&run), &mut records)
                .map_err(|f| f.error)?;
            if let Some(record) = records.pop() {
                out.push(DeadLetter {
                    record,
                    attempts: entry.attempts,
                    reason: entry.reason,
                    since_us: entry.since_us,
                });
            }
        }
        Ok(out)
    }

    /// Makes the dead letter `seq` pending again, its attempts counted from
    /// zero. Durable like an acknowledgement. [`Error::NotClaimed`] if it is
    /// not a dead letter; [`Error::UnknownSeq`] if `seq` was never assigned
    /// to a record.
    ///
    /// ```
    /// # fn main() -> segwal::Result<()> {
    /// # let dir = tempfile::tempdir().expect("temporary directory");
    /// # let outbox = segwal::Outbox::open(dir.path(), segwal::Options::default())?;
    /// outbox.append(b"refused, then fixed on the far side")?;
    /// let record = outbox.claim(1)?.remove(0);
    /// outbox.dead_letter(record.seq(), "schema rejected")?;
    /// outbox.requeue(record.seq())?;
    /// let again = outbox.claim(1)?.remove(0);
    /// assert_eq!(again.seq(), record.seq());
    /// # outbox.close()?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn requeue(&self, seq: Seq) -> Result<()> {
        let shared = &self.handle.shared;
        shared.check_open()?;
        let noted = {
            let mut table = shared.table.lock();
            shared.check_open()?;
            table.requeue(seq)?;
            shared.state_noted(&mut table)
        };
        shared.notify_arrived(true);
        self.acknowledged(false, noted)
    }

    /// Acknowledges the dead letter `seq`: done for good, as if delivered.
    /// [`Error::NotClaimed`] if it is not a dead letter;
    /// [`Error::UnknownSeq`] if `seq` was never assigned to a record.
    ///
    /// ```
    /// # fn main() -> segwal::Result<()> {
    /// # let dir = tempfile::tempdir().expect("temporary directory");
    /// # let outbox = segwal::Outbox::open(dir.path(), segwal::Options::default())?;
    /// outbox.append(b"refused for good")?;
    /// let record = outbox.claim(1)?.remove(0);
    /// outbox.dead_letter(record.seq(), "account deleted")?;
    /// outbox.discard(record.seq())?;
    /// assert!(outbox.dead_letters(10)?.is_empty());
    /// # outbox.close()?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn discard(&self, seq: Seq) -> Result<()> {
        let shared = &self.handle.shared;
        shared.check_open()?;
        let (reclaim, noted) = {
            let mut table = shared.table.lock();
            shared.check_open()?;
            let reclaim = table.discard(seq)?;
            (reclaim, shared.state_noted(&mut table))
        };
        self.acknowledged(reclaim, noted)
    }

    /// Asks the writer to delete fully acknowledged segments. A full queue means
    /// the writer is busy and checks after its next batch anyway.
    fn nudge_writer(&self) {
        if let Some(to) = self.handle.tx.read().as_ref() {
            let _ = to.tx.try_send(Request::Reclaim);
        }
    }

    /// A snapshot of the outbox's figures. Works on a closed outbox too: it
    /// then answers the figures as they stood when the close was done (its
    /// last fsync counted, the ages frozen at that moment).
    ///
    /// ```
    /// # fn main() -> segwal::Result<()> {
    /// # let dir = tempfile::tempdir().expect("temporary directory");
    /// # let outbox = segwal::Outbox::open(dir.path(), segwal::Options::default())?;
    /// outbox.append_batch(&[&b"a"[..], b"b"])?;
    /// let _claimed = outbox.claim(1)?;
    /// let stats = outbox.stats();
    /// assert_eq!((stats.pending, stats.claimed), (1, 1));
    /// println!("{} appended, {} fsyncs", stats.records_appended, stats.fsyncs);
    /// # outbox.close()?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn stats(&self) -> Stats {
        self.handle.stats()
    }

    /// Closes the outbox: stops accepting requests, lets the writer finish and
    /// fsync everything it holds, and releases the directory lock.
    ///
    /// Returns the outcome of the final fsync (or the poisoning error). Afterwards
    /// every call on any handle fails with [`Error::Closed`], including `close`.
    /// Records claimed and not acknowledged are pending again at the next open.
    ///
    /// Called (or the last handle dropped) on a thread of segwal's own, as a
    /// waker of an async call or a `tracing` subscriber runs on, `close` cannot
    /// wait for the writer, which may be that very thread: it begins the
    /// close and returns at once (`Ok`, or the poison of an outbox poisoned
    /// already); the writer still writes and fsyncs everything answered
    /// before it stops, and the directory lock goes with it, or with a later
    /// `close` on another thread, which waits for the writer and answers its
    /// failure if its last fsync failed. In a child made by `fork`, it fails
    /// with [`Error::Forked`] and changes nothing.
    ///
    /// ```
    /// # fn main() -> segwal::Result<()> {
    /// # let dir = tempfile::tempdir().expect("temporary directory");
    /// let outbox = segwal::Outbox::open(dir.path(), segwal::Options::default())?;
    /// outbox.append(b"kept")?;
    /// outbox.close()?;
    /// assert!(matches!(outbox.append(b"late"), Err(segwal::Error::Closed)));
    /// // The next open finds the record.
    /// let outbox = segwal::Outbox::open(dir.path(), segwal::Options::default())?;
    /// assert_eq!(outbox.claim(1)?[0].payload(), b"kept");
    /// # outbox.close()?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn close(&self) -> Result<()> {
        self.handle.close()
    }
}

/// The events of an open (feature `tracing`): what recovery found and did.
fn trace_open(_dir: &Path, _report: &RecoveryReport) {
    #[cfg(feature = "tracing")]
    {
        let (dir, report) = (_dir, _report);
        if let Some(torn) = &report.torn_tail {
            crate::event!(
                warn,
                path = %torn.path.display(),
                offset = torn.offset,
                bytes = torn.bytes,
                cause = %torn.cause,
                "torn tail truncated (a write batch a crash cut short)"
            );
        }
        for removed in &report.removed {
            crate::event!(info, path = %removed.display(), "leftover segment removed");
        }
        for q in &report.quarantined {
            crate::event!(
                warn,
                from = %q.from.display(),
                to = %q.to.display(),
                reason = ?q.reason,
                "file set aside in quarantine"
            );
        }
        if let Some(d) = &report.dropped {
            crate::event!(
                error,
                path = %d.path.display(),
                offset = d.offset,
                first_seq = d.first.get(),
                last_seq = d.last.map(|s| s.get()),
                relocated = ?d.relocated,
                "lossy recovery dropped records"
            );
        }
        crate::event!(
            info,
            dir = %dir.display(),
            segments = report.segments_found,
            records = report.records_recovered,
            reserve_released = report.reserve_released,
            frames_from_checkpoints = report.frames_from_checkpoints,
            "outbox opened"
        );
    }
}

/// Recovers the log of `dir` and writes the seal its newest segment lacks, if
/// any (returning whether it did): what an open writes before the writer
/// exists, and may retry once the reserve gave its space (the deletion of a
/// fully acknowledged front comes after, by the writer's own code:
/// `Writer::delete_at_open`).
fn recover_and_seal(
    storage: &dyn Storage,
    dir: &Path,
    options: &Options,
    preallocate: u64,
    effects: &mut recovery::apply::Effects,
) -> Result<(recovery::Recovered, bool)> {
    let mut recovered = recovery::recover(storage, dir, options, preallocate, effects)?;
    let Some(seal) = recovered.seal.take() else {
        return Ok((recovered, false));
    };
    let (id, at, len) = (seal.segment.id, seal.at, seal.index.frame_len());
    if let Err(failed) = seal.segment.seal(seal.at, seal.seq, seal.index, seal.salt) {
        // As in the writer's poisoning: leave nothing the disk may not have.
        seal.segment.cut_back(seal.at);
        return Err(failed.into_error());
    }
    // The seal is a frame of the segment: counted in its bytes and numbers
    // as for a segment read through its seal.
    if let (Some(last), Ok(offset), Ok(len)) = (
        recovered.segments.last_mut(),
        u32::try_from(at),
        u32::try_from(len),
    ) && last.id == id
        && {
            // A segment cut back to no frame ends at its first frame's place.
            let end = if last.frames.is_empty() {
                crate::format::segment::FRAMES_AT as u64
            } else {
                u64::from(last.frames.end())
            };
            end == at || crate::format::segment::align_up(end) == at
        }
    {
        last.frames
            .push(crate::format::frame::FrameSpan::new(offset, len, false));
    }
    Ok((recovered, true))
}

/// Creates `dir` if it is missing (its parent must exist), makes its entry
/// durable, and returns its absolute path, resolved once for the outbox's life.
/// The parent of `dir` is fsynced on every open, created or not: an open cannot
/// prove that the one that created the directory lived to fsync it. A path that
/// cannot be an outbox directory is refused before anything is created.
fn create_durably(storage: &dyn Storage, dir: &Path) -> Result<PathBuf> {
    let invalid = |reason: &'static str| Error::InvalidPath {
        path: dir.to_path_buf(),
        reason,
    };
    if dir.as_os_str().is_empty() {
        return Err(invalid("the path is empty"));
    }
    storage.create_dir(dir).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotADirectory => invalid(not_a_directory(&e)),
        std::io::ErrorKind::NotFound => invalid("its parent directory does not exist"),
        std::io::ErrorKind::PermissionDenied => invalid("permission denied creating the directory"),
        std::io::ErrorKind::ReadOnlyFilesystem => invalid(READ_ONLY),
        _ => Error::io("create directory", dir, e),
    })?;
    let dir = storage
        .resolve(dir)
        .map_err(|e| Error::io("resolve directory", dir, e))?;
    let parent = dir
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    storage.sync_dir(parent).map_err(|e| match e.kind() {
        std::io::ErrorKind::ReadOnlyFilesystem => Error::InvalidPath {
            path: dir.clone(),
            reason: READ_ONLY,
        },
        _ => Error::io("sync parent directory", parent, e),
    })?;
    Ok(dir)
}

/// Why a path whose creation failed with `NotADirectory` is none: what the
/// storage said, when it said one of these.
fn not_a_directory(e: &std::io::Error) -> &'static str {
    const WHY: [&str; 3] = [
        "it exists and is not a directory",
        "it is a symbolic link to nothing",
        "a component of its path is not a directory",
    ];
    let said = e.get_ref().map(|inner| inner.to_string());
    WHY.into_iter()
        .find(|why| said.as_deref() == Some(*why))
        .unwrap_or(WHY[0])
}

/// Why an outbox cannot be opened on a read-only file system.
const READ_ONLY: &str = "the directory is on a read-only file system";

/// `a / b`, or 0 when `b` is 0.
fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 { 0.0 } else { a as f64 / b as f64 }
}

impl Handle {
    /// [`Outbox::stats`]: the figures now, or as they stood at close.
    fn stats(&self) -> Stats {
        let shared = &self.shared;
        // In a child of a fork the table's lock may be held for ever by a
        // thread of the parent: the child reads it only if it is free, and
        // otherwise sees an empty table.
        let table = if shared.forked() {
            shared.table.try_lock()
        } else {
            Some(shared.table.lock())
        };
        let (t, notices) = match table {
            Some(mut table) => {
                // Set before a close empties the table, and asked under its
                // lock: a table found empty by a close was kept here first.
                if let Some(last) = self.at_close.lock().as_ref() {
                    return last.clone();
                }
                table.expire(shared.clock.now_us());
                (table.stats(), table.take_notices())
            }
            None => {
                let mut empty = Table::new();
                (empty.stats(), empty.take_notices())
            }
        };
        notices.report();
        let c = &shared.counters;
        // Ages on the outbox's monotonic clock (`log::clock`): a wall clock
        // stepped back or forward does not change them.
        let age = |first: &Option<SlotRef>| {
            let slot = first.as_ref()?;
            let file = match &slot.file {
                Some(file) => file.clone(),
                None => shared.files.get(&slot.path).ok()?,
            };
            let stamped = reader::frame_stamp(&*file, slot.offset)?;
            Some(shared.clock.age(slot.seq, stamped))
        };
        let load = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        let batches = load(&c.batches);
        let records = load(&c.records_appended);
        Stats {
            pending: t.pending,
            claimed: t
                .claimed
                .saturating_sub(t.delayed + t.dead_letters + t.held_by_key),
            backlog_bytes: t.backlog_bytes,
            segments: t.segments,
            disk_bytes: t.disk_bytes,
            allocated_bytes: t.sealed_allocated
                + t.open_files
                    .iter()
                    .map(|f| f.allocated().unwrap_or(0))
                    .sum::<u64>(),
            state_bytes: t.state_bytes + t.keys_bytes + load(&c.dedup_bytes),
            first_seq: t.first_unacked.as_ref().map(|f| f.seq),
            last_seq: t.last_seq,
            oldest_pending_age: age(&t.first_pending),
            oldest_unacked_age: age(&t.first_unacked),
            records_appended: records,
            batches,
            caller_batches: load(&c.caller_batches),
            fsyncs: load(&c.fsyncs),
            records_per_batch: ratio(records, batches),
            records_per_fsync: ratio(records, load(&c.fsyncs)),
            segments_deleted: load(&c.segments_deleted),
            held_for_ids: load(&c.held_for_ids) as usize,
            segments_recycled: load(&c.segments_recycled),
            held_segments: t.held_segments,
            held_by_records: t.held_by_records,
            relocated: t.relocated,
            corrupt_records: load(&c.corrupt_records),
            claimed_expired: t.expired_leases,
            delayed: t.delayed,
            blocked_keys: t.blocked_keys,
            held_by_key: t.held_by_key,
            dedup_ids: load(&c.dedup_ids),
            duplicates: load(&c.duplicates),
            dead_letters: t.dead_letters,
            poisoned: shared.poison.get().is_some(),
            reserve_missing: shared
                .reserve_missing
                .load(std::sync::atomic::Ordering::Relaxed),
            queued_bytes: shared.budget.used(),
            fsync_p50: c.fsync_latency.quantile(0.50),
            fsync_p99: c.fsync_latency.quantile(0.99),
            fsync_max: c.fsync_latency.max(),
        }
    }

    fn close(&self) -> Result<()> {
        let shared = &self.shared;
        // In a child of the fork: no writer to join (threads are not
        // copied), a lock shared with the parent, files the parent writes.
        // Nothing is touched; every later call fails the same way.
        if shared.forked() {
            shared.closed.store(true, Ordering::Release);
            return Err(Error::Forked);
        }
        // On a thread of segwal's own (a waker or a `tracing` subscriber it
        // runs), which may be the writer itself or one the writer joins as it
        // stops: the close is begun, and the writer finishes it, writing and
        // syncing what was answered; the lock goes with the writer's last
        // reference to the outbox.
        if crate::log::shared::on_own_thread() {
            if !self.begin_close() {
                return Err(Error::Closed);
            }
            // The writer is left to a later `close` or the last drop on
            // another thread to join; the lock goes with the writer's last
            // reference if none comes.
            return match shared.poison.get() {
                Some(e) => Err(e.clone()),
                None => Ok(()),
            };
        }
        let _closing = self.closing.lock();
        let first = self.begin_close();
        // Joined here also after a close begun on segwal's own thread, which
        // could not join it.
        let joined = self
            .writer
            .lock()
            .take()
            .map(|thread| thread.join().unwrap_or(Err(Error::Closed)));
        if first || joined.is_some() {
            // Descriptors and the state table go now, not when the last
            // handle is dropped: every call from here on returns `Closed`.
            let last = self.stats();
            *self.at_close.lock() = Some(last);
            shared.files.clear();
            *shared.table.lock() = Table::new();
            drop(shared.lock.lock().take());
            shared.storage.close();
        }
        if !first {
            // A close begun on segwal's own thread answered before its
            // writer's last fsync: a failure of it is told here.
            return match joined {
                Some(Err(e)) => Err(e),
                _ => Err(Error::Closed),
            };
        }
        joined.unwrap_or(Ok(()))
    }
}

impl Handle {
    /// Marks the outbox closed, wakes every waiter, stops the timers and
    /// drops the writer's only sender, so that the writer drains its queue
    /// and stops. `false` if it was closed already.
    fn begin_close(&self) -> bool {
        let shared = &self.shared;
        if shared.closed.swap(true, Ordering::AcqRel) {
            return false;
        }
        // Wake producers waiting for queue space and relays waiting for records.
        shared.budget.wake_all();
        {
            let _table = shared.table.lock();
            shared.arrived.notify_all();
        }
        shared.arrivals.wake_all();
        // Against a first timed wait starting the timers meanwhile: see
        // `Shared::timers`.
        std::sync::atomic::fence(Ordering::SeqCst);
        if let Some(timers) = shared.timers.get() {
            timers.stop();
        }
        // Dropping the only sender lets the writer drain the queue and stop.
        drop(self.tx.write().take());
        true
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        let _ = self.close();
    }
}

impl std::fmt::Debug for Outbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Outbox")
            .field("dir", &self.dir())
            .finish_non_exhaustive()
    }
}

/// A record parked as a dead letter ([`Outbox::dead_letter`]).
#[derive(Clone, Debug)]
pub struct DeadLetter {
    record: Record,
    attempts: u32,
    reason: Arc<str>,
    since_us: u64,
}

impl DeadLetter {
    /// The record's sequence number: pass it to [`Outbox::requeue`] or
    /// [`Outbox::discard`].
    pub fn seq(&self) -> Seq {
        self.record.seq()
    }

    /// How many times it was delivered before it died, written to the log
    /// with the dead letter and kept across restarts. Deliveries are counted
    /// as [`Record::attempt`] counts them: in memory, from 1 again after a
    /// restart, unless [`Options::max_attempts`](crate::Options::max_attempts)
    /// is set.
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    /// Why it died, as given to [`Outbox::dead_letter`].
    pub fn reason(&self) -> &str {
        &self.reason
    }

    /// The record's payload, exactly as appended.
    pub fn payload(&self) -> &[u8] {
        self.record.payload()
    }

    /// When it was parked: the wall clock at [`Outbox::dead_letter`], or at
    /// the claim that parked it under
    /// [`Options::max_attempts`](crate::Options::max_attempts). After a
    /// restart, the time the frame that recorded it was written, a little
    /// later (the writer's next batch: milliseconds, or up to
    /// [`Options::buffered_sync_interval`](crate::Options::buffered_sync_interval)
    /// when nothing else was written).
    pub fn dead_since(&self) -> std::time::SystemTime {
        std::time::UNIX_EPOCH + Duration::from_micros(self.since_us)
    }
}

/// How long a producer appending alone waits for the writer's lock, held by
/// the writer thread or by another producer's batch, before it queues its
/// append instead (`Outbox::hand`). Far longer than a batch's write and
/// `fdatasync` usually take: a bound, not a tuning. Whatever holds the lock
/// longer (a rotation, a reclaim of many files on a slow disk), a queued
/// request would wait behind it as long.
const ALONE_LOCK_WAIT: Duration = Duration::from_millis(10);

/// `Outbox` must stay a `Send + Sync` handle.
const _: () = {
    const fn is_send_sync<T: Send + Sync + Clone>() {}
    is_send_sync::<Outbox>();
};

/// The deduplication id of `m`: its own, or for a unique item the one derived
/// from its payload.
fn dedup_id_of(hasher: &Hasher, m: &Message<'_>) -> Vec<u8> {
    let mut buf = [0u8; UNIQUE_ID_LEN];
    dedup_id(hasher, m, &mut buf).map_or_else(Vec::new, <[u8]>::to_vec)
}

/// The bytes of a unique item's id: `unique:` and 16 hexadecimal digits.
const UNIQUE_ID_LEN: usize = 23;

/// The deduplication id of `m`, borrowed from it or, for a unique item,
/// written into `buf`.
fn dedup_id<'a>(
    hasher: &Hasher,
    m: &Message<'a>,
    buf: &'a mut [u8; UNIQUE_ID_LEN],
) -> Option<&'a [u8]> {
    match (m.dedup_id, m.unique) {
        (Some(id), _) => Some(id),
        (None, true) => {
            use std::io::Write as _;
            let digest = hasher.digest(Digest::Unique, &m.payload);
            let mut w = &mut buf[..];
            // 23 bytes exactly: cannot fail.
            let _ = write!(w, "unique:{digest:016x}");
            Some(&buf[..])
        }
        (None, false) => None,
    }
}

/// `m`'s not-before time, µs since the Unix epoch (a time before the epoch is
/// no delay).
fn not_before_us(m: &Message<'_>) -> Option<u64> {
    m.not_before.map(|t| {
        t.duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
    })
}

/// The bytes of `m`'s optional-field area, as [`owned`] encodes it.
fn ext_len(m: &Message<'_>) -> usize {
    let id = match (m.dedup_id, m.unique) {
        (Some(id), _) => id.len(),
        (None, true) => UNIQUE_ID_LEN,
        (None, false) => 0,
    };
    m.key.map_or(0, |k| 3 + k.len())
        + if m.not_before.is_some() { 11 } else { 0 }
        + if id > 0 { 3 + id } else { 0 }
}

/// `m` copied for the writer (its optional fields encoded in front of its
/// payload, in one buffer), and its fields digested.
fn owned(hasher: &Hasher, m: &Message<'_>) -> OwnedMessage {
    let mut buf = [0u8; UNIQUE_ID_LEN];
    let id = dedup_id(hasher, m, &mut buf);
    let not_before_us = not_before_us(m);
    let ext_len = ext_len(m);
    let mut bytes = Vec::with_capacity(ext_len + m.payload.len());
    crate::format::ext::encode(
        &RecordFields {
            key: m.key,
            not_before_us,
            origin_seq: None,
            dedup_id: id,
            carried: None,
        },
        &mut bytes,
    );
    debug_assert_eq!(bytes.len(), ext_len);
    bytes.extend_from_slice(&m.payload);
    OwnedMessage {
        bytes,
        ext_len,
        fields: MessageFields {
            key: m.key.map(|k| hasher.digest(Digest::Key, k)),
            not_before_us,
            dedup: id.map(|id| DedupDigest {
                id: hasher.digest(Digest::DedupId, id),
                content: hasher.digest(Digest::Content, &m.payload),
            }),
        },
    }
}

/// The deduplication ids the log keeps (each with its record, the frame that
/// keeps it, its digest and its record's time), remembered again in sequence
/// order; those out of the window or past the capacity are forgotten.
fn recovered_ids(
    mut ids: Vec<(Seq, Seq, DedupDigest, u64)>,
    options: &Options,
    now_wall_us: u64,
) -> Dedup {
    let window_us = u64::try_from(options.dedup_window.as_micros()).unwrap_or(u64::MAX);
    let mut dedup = Dedup::new(window_us, options.dedup_capacity, now_wall_us);
    // One entry per record: the one kept by the newest frame.
    // In place: a stable sort would take half their size again.
    ids.sort_unstable_by_key(|&(seq, home, _, _)| (seq, std::cmp::Reverse(home)));
    ids.dedup_by_key(|e| e.0);
    for (seq, home, id, appended_us) in ids {
        dedup.insert(id, seq, appended_us, home);
    }
    dedup.expire(now_wall_us);
    dedup
}

/// The answers to an append of `messages` from the writer's outcome and
/// verdicts: one `Appended` each, or the refusal (a conflict names the id).
fn answers(
    outcome: Result<Seq>,
    verdicts: Verdicts,
    messages: &[Message<'_>],
    hasher: &Hasher,
) -> Result<Vec<Appended>> {
    let verdicts = verdicts.as_slice();
    match outcome {
        Ok(_) => Ok(verdicts.iter().copied().map(appended).collect()),
        Err(Error::Conflict { existing, .. }) => {
            let k = verdicts
                .iter()
                .position(|v| matches!(v, Verdict::Conflict(_)))
                .unwrap_or(0);
            let dedup_id = messages
                .get(k)
                .map_or_else(Vec::new, |m| dedup_id_of(hasher, m));
            Err(Error::Conflict { dedup_id, existing })
        }
        Err(e) => Err(e),
    }
}

/// The answer of one message written or found a duplicate.
fn appended(v: Verdict) -> Appended {
    match v {
        Verdict::Written(seq) => Appended {
            seq,
            duplicate: false,
        },
        Verdict::Duplicate(seq) | Verdict::Conflict(seq) => Appended {
            seq,
            duplicate: true,
        },
    }
}

#[cfg(test)]
mod tests {
    use crate::{Options, Outbox};

    /// A lone producer sleeps for its answer unless `Options::spin_wait`
    /// asks it to spin: the option reaches what the spin is decided on.
    #[test]
    fn a_producer_spins_for_its_answer_only_when_the_options_ask() {
        for (options, spins) in [
            (Options::default(), false),
            (Options::default().spin_wait(true), true),
            (Options::default().spin_wait(false), false),
        ] {
            let dir = tempfile::tempdir().expect("temporary directory");
            let outbox = Outbox::open(dir.path(), options).expect("open");
            outbox.append(b"one").expect("append");
            assert_eq!(outbox.handle.shared.spin_view().enabled, spins);
            outbox.close().expect("close");
        }
    }

    /// A producer appending alone that finds the writer's lock held (here by
    /// the test, as the writer thread holds it for a moment after it
    /// answered that producer's last append) waits for the lock and writes
    /// its own batch, instead of queueing its append for the thread. With
    /// `try_lock` alone, as before, it queued. Up to twenty tries on fresh
    /// outboxes, until three were written by the producer: a try where the
    /// producer reaches the lock only after the test let it go proves
    /// nothing either way (before, it would be written by the producer
    /// too), and one where the test is kept from the CPU past
    /// [`ALONE_LOCK_WAIT`](super::ALONE_LOCK_WAIT) queues even now.
    #[test]
    fn a_lone_producer_waits_for_a_held_writer_lock_instead_of_queueing() {
        use crate::log::shared::WRITER_AWAKE;
        use std::sync::atomic::Ordering;
        let mut own = 0;
        let mut tries = 0;
        while own < 3 && tries < 20 {
            tries += 1;
            let dir = tempfile::tempdir().expect("temporary directory");
            let outbox = Outbox::open(dir.path(), Options::default()).expect("open");
            let shared = outbox.handle.shared.clone();
            // The writer thread asleep until a request (a fresh outbox has
            // no timed duty): it does not want the lock while the test
            // holds it.
            while shared.writer_sleeps_until_us.load(Ordering::Acquire) == WRITER_AWAKE {
                std::thread::yield_now();
            }
            let core = outbox.handle.tx.read().as_ref().expect("open").core.clone();
            let held = core.lock();
            let producer = {
                let outbox = outbox.clone();
                std::thread::spawn(move || outbox.append(b"order 7781 created"))
            };
            // The producer has its ticket, so it is at the lock or on its
            // way there.
            while shared.budget.requests() == 0 {
                std::thread::yield_now();
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
            drop(held);
            producer.join().expect("producer").expect("append");
            let stats = outbox.stats();
            assert_eq!(stats.batches, 1, "{stats:?}");
            own += stats.caller_batches;
            outbox.close().expect("close");
        }
        assert!(
            own >= 3,
            "{own} of {tries} appends written by their producer, the others queued"
        );
    }
}
