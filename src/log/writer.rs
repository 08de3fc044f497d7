//! The writer: the only code that writes segments, calls `sync_data` and
//! deletes segment files, one batch at a time under its lock.
//!
//! The writer thread takes whatever producers queued while its previous write
//! and fsync ran (no fixed wait, unless a linger is configured), encodes the
//! frames into one reused buffer, issues one write and one `sync_data`,
//! publishes the now durable records to the state table, and completes every
//! producer of the batch (waking them is left to a second thread, the notifier,
//! when there are many: see [`NOTIFY_ABOVE`]). A producer appending alone,
//! unless the writer thread waits for the writer's lock, runs that same batch
//! on its own thread
//! ([`Writer::write_inline`], `Options::caller_writes`), holding the writer's
//! lock, which the writer thread holds only while it works, never while it
//! waits for a request; the writer thread keeps every timed duty, and the
//! deletion and relocation that follow a batch. After the
//! first failed write or sync the writer poisons the outbox and answers every
//! request with the error until the outbox is closed; it never retries.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError};
use parking_lot::{Mutex, MutexGuard};

use crate::error::{Error, Result};
use crate::format::checkpoint;
use crate::format::fields::{DedupDigest, Described};
use crate::format::frame::{self, FrameHeader, FrameKind, FrameSpan};
use crate::format::seal::IndexBuilder;
use crate::format::segment::{BLOCK, FRAMES_AT, align_up};
use crate::format::seq::{SegmentId, Seq};
use crate::io;
use crate::io::reserve;
use crate::io::segment_file::{FreshSegment, SegmentFile, Successor, now_us};
use crate::log::shared::{
    Answers, Completer, Counters, Notifier, PRODUCER_WRITING_WITHIN_US, Shared, Ticket, Verdict,
    Verdicts, WRITER_AWAKE, WRITER_NO_DEADLINE, deliver,
};
use crate::options::Durability;
use crate::state::dedup::{Dedup, Seen};
use crate::state::table::{SegmentSlots, Table};

/// Batches answering more producers than this have them woken by the notifier
/// thread; smaller ones by the writer itself.
///
/// A batch's producers are woken by one system call, but its cost in the
/// kernel grows with the number of sleepers it wakes, and it sits on the
/// writer's critical path between two `sync_data` calls; so large batches are
/// handed over. A hand-over costs a wake of its own and gives each producer one
/// more hop; and while the writer wakes a batch itself, the producers woken
/// first queue their next append in time for its next batch, which then holds
/// nearly all of them, rather than two groups of half taking turns. The
/// threshold is measured, not derived: it was 16 until the engine of
/// 2026-12-05, on which eight alternating pairs at 64 producers gave 1.10 and
/// 1.12 times the rate with 64, in batches of 62 and 59 against 34 and 43:
/// docs/BENCHMARKS.md ("Waking producers off the writer's path", "One
/// wake-up call per batch" and "The writer wakes batches of up to 64
/// itself").
const NOTIFY_ABOVE: usize = 64;

/// The encode buffer's memory is always kept up to this size (64 KiB).
const BUF_KEEP_MIN: usize = 1 << 16;

/// The payloads of one append request.
pub(crate) enum Payloads {
    One(Vec<u8>),
    Many(Vec<Vec<u8>>),
    /// A record with what its producer said about it (boxed: a request stays
    /// as small as a plain append's in the writer's queue).
    Message(Box<OwnedMessage>),
    /// Records with what their producers said about them.
    Messages(Vec<OwnedMessage>),
}

/// A [`Message`](crate::Message) copied for the writer: its encoded optional
/// fields and its payload, in one buffer, and the fields' digests.
pub(crate) struct OwnedMessage {
    /// The frame's optional-field area (`format::ext`), then the payload.
    pub bytes: Vec<u8>,
    /// Where the payload starts in `bytes`.
    pub ext_len: usize,
    pub fields: MessageFields,
}

impl OwnedMessage {
    fn parts(&self) -> (&[u8], &[u8]) {
        self.bytes.split_at(self.ext_len.min(self.bytes.len()))
    }
}

/// What the state table and the deduplication need of a message.
#[derive(Clone, Copy, Default)]
pub(crate) struct MessageFields {
    pub key: Option<u64>,
    pub not_before_us: Option<u64>,
    pub dedup: Option<DedupDigest>,
}

impl Payloads {
    /// Each record's optional-field area and payload.
    fn iter(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        let (one, many) = match self {
            Payloads::One(p) => (Some(p.as_slice()), &[][..]),
            Payloads::Many(ps) => (None, ps.as_slice()),
            _ => (None, &[][..]),
        };
        one.into_iter()
            .chain(many.iter().map(Vec::as_slice))
            .map(|p| (&[][..], p))
            .chain(self.messages().iter().map(OwnedMessage::parts))
    }

    /// The messages, if these are messages.
    fn messages(&self) -> &[OwnedMessage] {
        match self {
            Payloads::Message(m) => std::slice::from_ref(&**m),
            Payloads::Messages(ms) => ms,
            _ => &[],
        }
    }

    /// The fields of the `k`-th record, if it is a message.
    fn fields(&self, k: usize) -> Option<MessageFields> {
        self.messages().get(k).map(|m| m.fields)
    }

    /// How many records the fields frame may describe.
    fn described_max(&self) -> usize {
        self.messages().len()
    }
}

/// What one append of a batch writes, as [`Writer::plan`] decided.
struct Plan {
    /// Refused (a quota) or not.
    outcome: Result<()>,
    /// One per message of the append (none for plain records, none if
    /// refused by a quota).
    verdicts: Verdicts,
    /// The first record written.
    first: Option<Seq>,
    /// The answer of a negative control that writes what it refuses.
    lie: Option<Error>,
}

impl Default for Plan {
    fn default() -> Plan {
        Plan {
            outcome: Ok(()),
            verdicts: Verdicts::None,
            first: None,
            lie: None,
        }
    }
}

impl Plan {
    /// Whether the `k`-th record of the append is written.
    fn writes(&self, k: usize) -> bool {
        self.outcome.is_ok()
            && matches!(
                self.verdicts.as_slice().get(k),
                Some(Verdict::Written(_)) | None
            )
    }
}

/// A request to the writer thread.
pub(crate) enum Request {
    /// Append records; complete with the first one's sequence number once they are
    /// written (buffered) or durable (sync).
    Append {
        payloads: Payloads,
        /// Encoded size, acquired from the queue budget.
        ticket: Ticket,
        done: Completer,
    },
    /// Make everything written so far durable.
    Sync { done: Completer },
    /// A nudge to the writer thread: the oldest segment may be fully
    /// acknowledged (delete what can be), a producer's batch brought a
    /// timed duty forward or left reclaiming to do, or a change of delivery
    /// state waits to be written. Alone in the queue, it runs no batch of
    /// appends: the thread reclaims, runs its timed duties, and writes what
    /// delivery state waits before it sleeps.
    Reclaim,
}

impl Request {
    /// Tells the request's producer the lane of the batch it was gathered
    /// into (see `log::waiters`).
    fn stamp(&self, lane: u32) {
        match self {
            Request::Append { done, .. } | Request::Sync { done } => done.stamp(lane),
            Request::Reclaim => {}
        }
    }
}

/// The segment being written.
struct Active {
    seg: SegmentFile,
    /// Bytes written (header and frames).
    len: u64,
    /// Bytes known durable: the length at the last successful `sync_data`.
    synced_len: u64,
    /// Bytes from the start of the file written at least once, frames or zeros
    /// written ahead of them: a write below this overwrites allocated blocks.
    zeroed: u64,
    /// Bytes of a recycled file written before it became this segment (the
    /// old segment's, past the header's block): a write that ends inside a
    /// block below this fills the block with zeros, so that the kernel never
    /// reads the old block in to merge it. 0 for a new file.
    stale_to: u64,
    /// The space reserved for it (`fallocate`), which zeros may be written
    /// into (never past it: the file does not grow for them). Starts at the
    /// file's length when it became active; grows, doubling, as frames near it.
    room: u64,
    /// Whether more space may still be reserved (not after a failure).
    growable: bool,
    created: Instant,
    /// Records written to it (internal frames not counted).
    records: u64,
    /// Delivery-state frames written to it (acks, releases, dead letters).
    state_frames: u64,
    /// Its header's nonce, repeated in its seal index.
    nonce: u64,
    /// The seed of its frames' checksums.
    salt: u32,
    /// The bytes of the current sync group in the block the group's writes
    /// have reached but not filled: the next write of the group starts at that
    /// block's boundary and writes them again, so that every write covers whole
    /// blocks of unsynced bytes only (docs/FORMAT.md, "Blocks").
    tail: Vec<u8>,
    /// Every frame written to it: its seal index to be.
    index: IndexBuilder,
    /// Bytes between its index checkpoints, as its header says (0: none).
    checkpoint_every: u64,
    /// The offset at or past which the next sync group starts with a
    /// checkpoint.
    next_checkpoint: u64,
    /// The offsets of the checkpoints written to it, in order.
    checkpoints: Vec<u32>,
    /// The position in `index` of the first frame no checkpoint lists yet.
    unlisted_from: usize,
}

impl Active {
    /// Whether it holds records or delivery state: then it rotates by age.
    /// (A segment holding only `LogStart` frames does not: rotating it would
    /// write another one, and an idle outbox would rotate for ever.)
    fn holds_state(&self) -> bool {
        self.records > 0 || self.state_frames > 0
    }

    /// The writer's view of a new, empty segment.
    fn new(fresh: FreshSegment) -> Active {
        // Its preallocated space, which zeros may be written into.
        let room = fresh.segment.file.len().unwrap_or(fresh.len);
        let salt = fresh.salt();
        let recycled = fresh.written_to > fresh.len;
        Active {
            seg: fresh.segment,
            len: fresh.len,
            synced_len: fresh.len,
            // What lies past the header is not known to be written, unless
            // the file is recycled: then its old segment's blocks are.
            zeroed: fresh.written_to,
            stale_to: if recycled { fresh.written_to } else { 0 },
            room,
            growable: true,
            created: Instant::now(),
            records: 0,
            state_frames: 0,
            nonce: fresh.nonce,
            salt,
            tail: Vec::new(),
            index: IndexBuilder::default(),
            checkpoint_every: if checkpoint::valid_every(fresh.checkpoint_every) {
                u64::from(fresh.checkpoint_every)
            } else {
                0
            },
            next_checkpoint: u64::from(fresh.checkpoint_every),
            checkpoints: Vec::new(),
            unlisted_from: 0,
        }
    }

    /// The payload of an index checkpoint, if the write about to start is
    /// due one (docs/FORMAT.md, "Index checkpoints"): it starts a sync group
    /// (`group_open` false: every frame before it is durable) on a block
    /// boundary at or past the next multiple of the interval, and some frame
    /// is not listed yet.
    fn checkpoint_due(&self, group_open: bool, hide_internal: bool) -> Option<Vec<u8>> {
        let due = self.checkpoint_every > 0
            && !group_open
            && self.tail.is_empty()
            && self.len >= self.next_checkpoint
            && self.len.is_multiple_of(BLOCK as u64)
            && self.checkpoints.len() < checkpoint::CHECKPOINTS_MAX
            && !self.index.overflowed()
            && self.index.len() > self.unlisted_from;
        due.then(|| {
            self.index
                .checkpoint(self.unlisted_from, &self.checkpoints, hide_internal)
        })
    }

    /// Notes the checkpoint `span`, the next frame of the segment.
    fn listed(&mut self, span: FrameSpan) {
        self.checkpoints.push(span.offset);
        self.unlisted_from = self.index.len() + 1;
        let every = self.checkpoint_every.max(1);
        self.next_checkpoint = (u64::from(span.offset) / every + 1) * every;
    }
}

/// The notifier thread, started with the first batch of more than
/// [`NOTIFY_ABOVE`] producers.
enum NotifierState {
    NotStarted,
    Running(Notifier),
    /// The system refused the thread: the writer wakes every producer itself.
    Refused,
}

pub(crate) struct Writer {
    shared: Arc<Shared>,
    rx: Receiver<Request>,
    active: Active,
    /// Sequence number of the next frame.
    next_seq: Seq,
    /// Sequence number of the last frame written to disk.
    last_written: Seq,
    log_start: Seq,
    /// The outbox's identity, named in every segment it creates.
    outbox_id: u128,
    /// Encoding buffer, reused across batches.
    buf: Vec<u8>,
    /// What writes usually need of `buf`: a moving average of their sizes.
    buf_need: usize,
    /// Frames written since the last sync.
    unsynced: Vec<FrameSpan>,
    /// Frames encoded into `buf` and not yet written.
    staged: Vec<FrameSpan>,
    /// Sequence number of the first of them: the current sync group.
    group: Option<Seq>,
    unsynced_since: Option<Instant>,
    batch: Vec<Request>,
    /// The outcome of each append of the batch being processed, in order:
    /// the sequence number of its first record, or its refusal; assigned
    /// once, by `write_batch`.
    firsts: Vec<Result<Seq>>,
    notifier: NotifierState,
    /// The deduplication ids remembered.
    dedup: Dedup,
    /// What the fields frames written since the last sync say: published to
    /// the state table with their records.
    unsynced_described: Vec<Described>,
    /// Records (and their payload bytes) written but not yet in the state
    /// table, for the backlog quotas.
    unpublished: (u64, u64),
    /// The last answer of the file system's free space, and when.
    free_checked: Option<(Instant, Option<u64>)>,
    /// When the writer last tried to make the missing reserve.
    reserve_tried: Option<Instant>,
    /// The acknowledged front whose deletion waits for more to delete with
    /// it ([`Writer::hold_deletion`]), if one does.
    held: Option<Held>,
    /// Scratch space of [`Writer::plan`], kept across batches so that a
    /// batch of messages allocates nothing for it: what the fields frame
    /// says, the ids the batch writes, and those of the append being planned.
    described: Vec<Described>,
    planned: HashMap<u64, (u64, Seq)>,
    local: Vec<(DedupDigest, Seq)>,
    inserted: Vec<(DedupDigest, Seq)>,
    /// A fully acknowledged segment's file, renamed `<name>.seg.free`
    /// durably, to be written again as the next segment (see
    /// [`Options::recycle_segments`](crate::Options::recycle_segments)).
    spare: Option<PathBuf>,
    /// When the last batch ended, on whichever thread wrote it: an idle
    /// writer writes the zeros ahead a grace period after it.
    last_active: Instant,
    /// How many grace periods the writer thread waits past `last_active`
    /// before it writes zeros while idle: doubled each time it woke for them
    /// and found that batches written on a producer's thread
    /// ([`Writer::write_inline`]) kept it busy, so that a lone producer
    /// appending without pause does not wake the thread at every append;
    /// back to one once zeros are no longer due (written while idle or by a
    /// batch), or when the thread, woken for the zeros, finds that the batch
    /// written meanwhile followed a pause longer than the grace plus how late
    /// the thread woke (`quiet_before_last`, [`Writer::idle`]): at one grace
    /// it would have looked before such a batch, so a producer that slows
    /// down after a burst finds the zeros written in its pauses again.
    idle_scale: u32,
    /// How long before the last batch began the batch before it ended, on
    /// either thread (other work of the writer in between, zeros or
    /// reclaiming, counts as quiet): a producer's pause, which tells
    /// [`Writer::idle`] whether the thread can look for the zeros between
    /// that producer's batches.
    quiet_before_last: Duration,
    /// Until when the writer thread sleeps, while it does: `Some(None)`
    /// without a deadline, `None` while it is awake (and will look at the
    /// deadlines again before it sleeps).
    thread_sleeps_until: Option<Option<Instant>>,
    /// Whether the batch being written runs on a producer's thread.
    inline: bool,
}

impl Writer {
    /// Returns the writer, ready to run on the active segment recovery
    /// prepared (the open has already sealed the newest recovered segment if
    /// it needed a seal: `recover_and_seal` in `outbox.rs`).
    pub(crate) fn start(
        shared: Arc<Shared>,
        rx: Receiver<Request>,
        active: FreshSegment,
        log_start: Seq,
        dedup: Dedup,
        spare: Option<PathBuf>,
    ) -> Result<Writer> {
        let outbox_id = active.outbox_id;
        // What recovery remembered shows in `Stats` before the first append.
        Counters::set(&shared.counters.dedup_ids, dedup.len() as u64);
        Counters::set(&shared.counters.dedup_bytes, dedup.heap_bytes());
        let active = Active::new(active);
        push_active(&shared, &active);
        let next_seq = active.seg.id.first_seq();
        Ok(Writer {
            shared,
            rx,
            active,
            next_seq,
            last_written: Seq::from(next_seq.get() - 1),
            log_start,
            outbox_id,
            buf: Vec::with_capacity(BUF_KEEP_MIN),
            buf_need: 0,
            unsynced: Vec::new(),
            staged: Vec::new(),
            group: None,
            unsynced_since: None,
            batch: Vec::new(),
            firsts: Vec::new(),
            notifier: NotifierState::NotStarted,
            dedup,
            unsynced_described: Vec::new(),
            unpublished: (0, 0),
            free_checked: None,
            reserve_tried: None,
            held: None,
            described: Vec::new(),
            planned: HashMap::new(),
            local: Vec::new(),
            inserted: Vec::new(),
            spare,
            last_active: Instant::now(),
            idle_scale: 1,
            quiet_before_last: Duration::ZERO,
            thread_sleeps_until: None,
            inline: false,
        })
    }

    /// Deletes the segments the log starts with fully acknowledged (or holds
    /// the deletion for its ids, to be weighed again by the timer), on the
    /// opening thread before the writer thread starts: what recovery kept of
    /// them (a segment the open sealed, those a close or a crash left behind)
    /// would otherwise stay on disk until the first request. Relocation
    /// is the writer thread's: the open asks for it once the reserve is
    /// made, where [`Writer::reclaim_due`] says it is due.
    pub(crate) fn delete_at_open(&mut self) {
        self.delete_finished();
    }

    /// Whether a deletion waits because its tombstones do not fit in the
    /// space left ([`Writer::stones_fit`]): an open then does not make a
    /// missing reserve, so that the space freed goes to the deletion first.
    pub(crate) fn held_for_space(&self) -> bool {
        self.held.as_ref().is_some_and(|h| h.for_space)
    }

    /// Called by an open that could not make its reserve for want of
    /// space: where the open's deletion kept a file for recycling, removes
    /// it and makes the reserve with its space ([`Writer::reserve_short`]),
    /// rather than at the first append.
    pub(crate) fn reserve_at_open(&mut self) {
        if self.spare.is_some() {
            self.reserve_tried = None;
            let _ = self.reserve_short();
        }
    }

    /// Answers what a panic (a bug) interrupted: the outbox is poisoned and
    /// the batch in flight fails with that error. Returns the error.
    fn panicked(&mut self) -> Error {
        let error = Error::Poisoned {
            path: self.active.seg.path.to_path_buf(),
            op: "write (the writer panicked)",
            source: Arc::new(std::io::Error::other("the writer panicked")),
        };
        let _ = self.shared.poison.set(error.clone());
        let error = self.shared.poison.get().cloned().unwrap_or(error);
        for r in self.batch.drain(..) {
            fail(r, &error);
        }
        error
    }

    /// Writes `first` and whatever else is queued as one batch on the calling
    /// thread: a producer appending alone, which holds the writer's lock and
    /// found the queue empty, writes and syncs its own append instead of
    /// handing it to the writer thread and sleeping for the answer (see
    /// [`Options::caller_writes`](crate::Options::caller_writes)). The caller
    /// holds the writer's lock, so batches stay one at a time. Returns true
    /// if the writer thread, asleep until a later deadline, must be woken for
    /// a duty the batch brought forward (a buffered sync, a rotation by age).
    pub(crate) fn write_inline(&mut self, first: Request) -> bool {
        self.inline = true;
        let done = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.gather(first);
            // Deletions, relocation and the timed duties are the writer
            // thread's: the producer returns once its batch is answered.
            self.process(false);
        }));
        self.inline = false;
        if done.is_err() {
            self.panicked();
            return false;
        }
        let now = self.shared.clock.now_us();
        self.shared
            .caller_batch_end_us
            .store(now, std::sync::atomic::Ordering::Relaxed);
        // Every batch that brings a duty forward, or leaves segments to
        // delete or records to carry forward, says so until the thread has
        // woken (`awake`): the `Reclaim` of one may be gathered by the next
        // producer's batch instead of reaching the thread.
        let brought_forward = match self.thread_sleeps_until {
            Some(until) => match (self.wait_until().0, until) {
                (Some(due), Some(until)) => due < until,
                (Some(_), None) => true,
                (None, _) => false,
            },
            None => false,
        };
        // A thread awake but not yet asleep looks at its deadlines again
        // before it sleeps, not at the work of reclaiming: that is asked
        // for whatever the thread is doing.
        brought_forward || self.reclaim_due()
    }

    /// Whether [`Writer::reclaim`] has work: a fully acknowledged front to
    /// delete, or records to carry forward out of the oldest segment.
    pub(crate) fn reclaim_due(&self) -> bool {
        if self.shared.poison.get().is_some() {
            return false;
        }
        // A held deletion stands while the log and the shortage of space
        // stay as they were (the free space as last asked: a batch whose
        // appends the floor refused asked it).
        let pressure = self.pressure(self.free_checked.and_then(|(_, free)| free));
        let table = self.shared.table.lock();
        table.reclaimable().is_some_and(|front| {
            !self
                .held
                .as_ref()
                .is_some_and(|h| h.pressure == pressure && h.holds(front, &table))
        }) || table
            .stragglers(
                self.shared.options.segment_bytes,
                RELOCATE_BYTES,
                self.shared.clock.now_us(),
                now_us(),
            )
            .is_some()
    }

    /// The last duties of a closed outbox: everything queued was processed,
    /// and the acknowledgements made meanwhile are written; make it all
    /// durable, and leave the active file at the length of its data.
    fn finish(&mut self) -> Result<()> {
        self.stop_notifier();
        if let Some(e) = self.shared.poison.get() {
            return Err(e.clone());
        }
        self.write_batch(&[])?;
        self.sync()?;
        if self.active.seg.trim(self.active.len) {
            Counters::add(&self.shared.counters.fsyncs, 1);
        }
        Ok(())
    }

    /// Every producer the writer answered is woken before the writer thread
    /// ends: a closed outbox has answered everything.
    fn stop_notifier(&mut self) {
        if let NotifierState::Running(notifier) =
            std::mem::replace(&mut self.notifier, NotifierState::NotStarted)
        {
            notifier.stop();
        }
    }

    /// Until when the writer thread may sleep: the next timed duty
    /// ([`Writer::deadline_given`]) or, with zeros soon needed, the end of the
    /// idle grace after the last batch, whichever comes first; and that end
    /// of the grace, if any.
    ///
    /// Leaves out the looks at delivery state the thread takes while it
    /// sleeps (see [`StateTimes::look_again`]): a producer's batch that took
    /// the changes brings no duty forward.
    fn wait_until(&self) -> (Option<Instant>, Option<Instant>) {
        let state = StateTimes::of(&self.shared.table.lock(), false);
        self.wait_until_given(state)
    }

    /// [`Writer::wait_until`], with the times of the delivery-state changes
    /// read from the table.
    fn wait_until_given(&self, state: StateTimes) -> (Option<Instant>, Option<Instant>) {
        let idle_until = self
            .zeros_due()
            .then(|| {
                let grace = idle_grace(&self.shared).saturating_mul(self.idle_scale);
                self.last_active.checked_add(grace.min(IDLE_GRACE_MAX))
            })
            .flatten();
        let until = match (self.deadline_given(state), idle_until) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        (until, idle_until)
    }

    /// The writer thread is about to sleep: returns until when, and the end
    /// of the idle grace.
    fn sleep(&mut self) -> (Option<Instant>, Option<Instant>) {
        if !self.zeros_due() {
            self.idle_scale = 1;
        }
        // Computed and published under the table's lock: a change of
        // delivery state made after this sees the deadline, one made before
        // is in it (`Shared::state_noted`). Changes that wait are written
        // first (to the file, fsynced by the timer a sync interval after
        // they were made), so that a crash of the process does not lose
        // them, unless a producer appending alone is writing its own
        // batches, which take them along. One such write at a time: if more
        // came meanwhile, or a request waits, the thread comes back at once,
        // through its queue and its timed duties.
        let shared = self.shared.clone();
        let mut table = shared.table.lock();
        let mut wrote = false;
        let mut again = false;
        loop {
            if table.unwritten_since_us().is_none()
                || shared.poison.get().is_some()
                || shared.producer_writing(shared.clock.now_us())
            {
                break;
            }
            if wrote || !self.rx.is_empty() {
                again = true;
                break;
            }
            drop(table);
            self.process(true);
            wrote = true;
            table = shared.table.lock();
        }
        let (mut until, idle_until) = self.wait_until_given(StateTimes::of(&table, true));
        if again {
            until = Some(Instant::now());
        }
        let published = until.map_or(WRITER_NO_DEADLINE, |t| shared.clock.us_at(t));
        shared
            .writer_sleeps_until_us
            .store(published, std::sync::atomic::Ordering::Release);
        drop(table);
        self.thread_sleeps_until = Some(until);
        // Producers spin for their answer only while the writer works or has
        // just begun to wait (`spin_budget`).
        let since = self.shared.clock.now_us().max(1);
        self.shared
            .writer_waiting_since_us
            .store(since, std::sync::atomic::Ordering::Relaxed);
        (until, idle_until)
    }

    /// The writer thread woke.
    fn awake(&mut self) {
        self.thread_sleeps_until = None;
        self.shared
            .writer_sleeps_until_us
            .store(WRITER_AWAKE, std::sync::atomic::Ordering::Release);
        self.shared
            .writer_waiting_since_us
            .store(0, std::sync::atomic::Ordering::Relaxed);
    }

    /// The writer thread woke at the end of the idle grace it slept for,
    /// `slept_until`, with no request: writes the zeros ahead if no batch was
    /// written since, else waits longer next time, unless that batch
    /// followed a pause the thread could have used (see
    /// [`Writer::idle_scale`]).
    fn idle(&mut self, rx: &Receiver<Request>, slept_until: Instant) {
        let (_, idle_until) = self.wait_until();
        let now = Instant::now();
        match idle_until {
            Some(t) if now >= t && rx.is_empty() => {
                self.idle_scale = 1;
                // Busy, but not to be spun beside: the fsync of zeros takes
                // as long as a batch's.
                self.shared
                    .writer_waiting_since_us
                    .store(1, std::sync::atomic::Ordering::Relaxed);
                self.zero_ahead_idle();
            }
            // A batch came first. If the pause before it was longer than a
            // grace period plus how late this thread woke, the thread
            // waiting one grace would have looked before it: next time it
            // does, and writes the zeros in such a pause. Batches closer
            // than that: it waits longer next time, rather than wake at
            // every batch for a race it loses.
            Some(_)
                if self.quiet_before_last
                    >= idle_grace(&self.shared) + now.saturating_duration_since(slept_until) =>
            {
                self.idle_scale = 1
            }
            Some(_) => self.idle_scale = (self.idle_scale * 2).min(IDLE_SCALE_MAX),
            None => {}
        }
    }

    /// The next time the writer must act without a request; none once
    /// poisoned. Delivery-state changes not yet written are due to be
    /// fsynced a sync interval after the oldest of them. With `look_again`,
    /// the thread also looks at them within [`PRODUCER_WRITING_WITHIN_US`]
    /// while they wait (a producer writing its own batches was to take
    /// them; if it stopped, the thread writes them), and as long after the
    /// last one while they keep coming, so that the next one finds the
    /// thread's deadline near and need not wake it (`Shared::state_noted`).
    fn deadline_given(&self, state: StateTimes) -> Option<Instant> {
        if self.shared.poison.get().is_some() {
            return None;
        }
        let opts = &self.shared.options;
        let rotate = self
            .active
            .holds_state()
            .then(|| self.active.created.checked_add(opts.segment_age))
            .flatten();
        let sync = self
            .unsynced_since
            .and_then(|t| t.checked_add(opts.buffered_sync_interval));
        let interval = u64::try_from(opts.buffered_sync_interval.as_micros()).ok();
        let now = self.shared.clock.now_us();
        let within = PRODUCER_WRITING_WITHIN_US;
        let state = match (state.since, state.last.filter(|_| state.look_again)) {
            (Some(since), _) if !state.look_again => interval.and_then(|i| since.checked_add(i)),
            // Waiting (a producer appending alone was to take them): fsynced
            // an interval after the first at the latest, and looked at again
            // soon, in case that producer stopped.
            (Some(since), _) => [
                interval.and_then(|i| since.checked_add(i)),
                now.checked_add(within),
            ]
            .into_iter()
            .flatten()
            .min(),
            // Taken by batches, but still coming: looked at again soon, so
            // that the next one finds the thread's deadline near enough not
            // to wake it (`Shared::state_noted`).
            (None, Some(last)) => last.checked_add(within).filter(|&t| t > now),
            (None, None) => None,
        }
        .and_then(|us| self.shared.clock.instant_at(us));
        // A held deletion is weighed again as its ids leave the window, even
        // with nothing else to do.
        let held = self.held.as_ref().map(|h| h.recheck);
        [rotate, sync, state, held].into_iter().flatten().min()
    }

    /// Whether changes of delivery state have waited a sync interval for a
    /// batch to take them ([`Writer::deadline_given`]).
    fn state_due(&self) -> bool {
        let Some(since) = self.shared.table.lock().unwritten_since_us() else {
            return false;
        };
        let interval = self.shared.options.buffered_sync_interval;
        u64::try_from(interval.as_micros())
            .ok()
            .and_then(|i| since.checked_add(i))
            .is_some_and(|due| self.shared.clock.now_us() >= due)
    }

    /// Timed duties: the buffered sync interval, rotation by age, and a held
    /// deletion weighed again ([`Writer::hold_deletion`]).
    fn on_timer(&mut self) {
        if self.shared.poison.get().is_some() {
            return;
        }
        let interval = self.shared.options.buffered_sync_interval;
        if self.state_due() {
            // Changes of delivery state no batch took within the interval:
            // a batch of their own, fsynced at once.
            self.process(true);
            if self.unsynced_since.is_some() {
                let _ = self.sync();
            }
        }
        if self.unsynced_since.is_some_and(|t| t.elapsed() >= interval) {
            let _ = self.sync();
        }
        if self
            .held
            .as_ref()
            .is_some_and(|h| Instant::now() >= h.recheck)
        {
            self.reclaim();
        }
        let age = self.shared.options.segment_age;
        if self.active.holds_state()
            && self.active.created.elapsed() >= age
            && self.rotate().is_ok()
        {
            self.reclaim();
        }
    }

    /// Collects the first request and whatever else is queued, up to the batch size.
    fn gather(&mut self, first: Request) {
        let opts = &self.shared.options;
        let limit = opts.batch_bytes as u64;
        let lane = self.shared.waiters.gathering();
        let mut bytes = request_bytes(&first);
        first.stamp(lane);
        self.batch.push(first);
        let linger_until = (!opts.linger.is_zero())
            .then(|| Instant::now().checked_add(opts.linger))
            .flatten();
        while bytes < limit {
            let next = match linger_until {
                Some(until) => self.rx.recv_deadline(until).ok(),
                None => self.rx.try_recv().ok(),
            };
            let Some(r) = next else { break };
            bytes += request_bytes(&r);
            r.stamp(lane);
            self.batch.push(r);
        }
        self.shared.waiters.gathered();
    }

    /// Writes the gathered batch, makes it durable as the durability asks,
    /// answers its producers, deletes what acknowledgements freed, then answers
    /// its sync barriers.
    fn process_batch(&mut self) {
        self.process(true);
    }

    /// [`Writer::process_batch`], deleting and relocating after it only if
    /// `reclaim` or the batch holds a sync barrier (which completes after
    /// the deletions its batch allows).
    fn process(&mut self, reclaim: bool) {
        self.quiet_before_last = self.last_active.elapsed();
        let mut batch = std::mem::take(&mut self.batch);
        let durability = self.shared.options.durability;
        let written = self.write_batch(&batch);
        // A batch of appends syncs as their durability says; acknowledgements
        // alone wait for the timer (their durability, when `Sync`, is a sync
        // request of the acknowledging caller).
        let appends = batch.iter().any(|r| matches!(r, Request::Append { .. }));
        let wants_sync = (appends && durability == Durability::Sync)
            || batch.iter().any(|r| matches!(r, Request::Sync { .. }));
        // The negative control answers producers first and syncs after.
        let answer_first = wants_sync && crate::injected!(self.shared.options, AckBeforeFsync);
        let durable = match &written {
            Ok(()) if wants_sync && !answer_first => self.sync(),
            other => other.clone(),
        };
        // What an append is told: under Buffered, that its batch was written.
        let told = match durability {
            Durability::Buffered => &written,
            Durability::Sync => &durable,
        };
        let mut firsts = std::mem::take(&mut self.firsts).into_iter();
        let mut barriers = Vec::new();
        let mut answers = Answers::with_capacity(batch.len());
        // Queue budget given back once for the batch, not once per request.
        let (mut freed, mut requests) = (0, 0);
        for r in batch.drain(..) {
            match r {
                Request::Append {
                    done, mut ticket, ..
                } => {
                    freed += ticket.disarm();
                    requests += 1;
                    let first = firsts.next().unwrap_or(Ok(self.next_seq));
                    answers.push((done, told.clone().and(first)));
                }
                Request::Sync { done } => barriers.push(done),
                Request::Reclaim => {}
            }
        }
        self.batch = batch;
        if requests > 0 {
            let appends = &self.shared.counters.last_batch_appends;
            appends.store(requests, std::sync::atomic::Ordering::Relaxed);
        }
        self.shared.budget.release(freed, requests);
        self.answer(answers);
        if answer_first && written.is_ok() {
            let _ = self.sync();
        }
        if reclaim || !barriers.is_empty() {
            self.reclaim();
        }
        // A sync request is a barrier: it completes after everything queued before
        // it, deletions included.
        let barriers = barriers
            .into_iter()
            .map(|done| (done, durable.clone().map(|()| self.last_written)))
            .collect();
        self.answer(barriers);
        self.last_active = Instant::now();
    }

    /// Wakes the producers of a finished batch: directly when they are few, through
    /// the notifier thread when there are more than [`NOTIFY_ABOVE`], so that the
    /// next write and `sync_data` start while they wake. The notifier starts with
    /// the first such batch.
    fn answer(&mut self, answers: Answers) {
        let answers = if answers.len() > NOTIFY_ABOVE {
            if let NotifierState::NotStarted = self.notifier {
                self.notifier = match Notifier::spawn() {
                    Some(notifier) => NotifierState::Running(notifier),
                    None => NotifierState::Refused,
                };
            }
            match &self.notifier {
                NotifierState::Running(notifier) => match notifier.send(answers) {
                    Ok(()) => return,
                    Err(answers) => answers,
                },
                _ => answers,
            }
        } else {
            answers
        };
        deliver(answers);
    }

    /// Decides what each append of the batch writes ([`Writer::plan`]), then
    /// encodes and writes it all as one write batch, and records in `firsts`
    /// each append's outcome: the sequence number of its first record, or why
    /// it was refused.
    fn write_batch(&mut self, batch: &[Request]) -> Result<()> {
        self.firsts.clear();
        if let Some(e) = self.shared.poison.get() {
            return Err(e.clone());
        }
        let timestamp_us = now_us();
        // Changes of delivery state made since the last batch ride with this
        // one, after its records: what producers said of the records, the
        // acks frames, then the other changes in the order made, each run in
        // frames of at most 1 MiB of entries (docs/FORMAT.md, "Frame kinds").
        let state_since;
        let (acks, changes, backlog) = {
            let mut table = self.shared.table.lock();
            let (acks, changes, since) = table.take_unwritten();
            state_since = since.and_then(|us| self.shared.clock.instant_at(us));
            (acks, changes, table.backlog())
        };
        // What the quotas count: the table's backlog and the records written
        // since the last sync, which the table does not hold yet. Added up
        // now, as a rotation below syncs: its sync moves those records into
        // the table's figure, read before it, and they would be counted
        // nowhere.
        let backlog = (
            backlog.0 + self.unpublished.0,
            backlog.1 + self.unpublished.1,
        );
        let mut internal: Vec<(FrameKind, Vec<u8>)> = Vec::new();
        internal.extend(crate::format::acks::encode_frames(&acks).map(|p| (frame::ACKS, p)));
        internal.extend(crate::format::delivery::encode(&changes));
        // At most what the batch encodes (every record written, each with
        // every field described): a rotation, if due, comes before the
        // records are numbered.
        let described_max: usize = batch
            .iter()
            .map(|r| match r {
                Request::Append { payloads, .. } => payloads.described_max(),
                _ => 0,
            })
            .sum();
        // Appends the writer will refuse whole (below the free-disk floor, or
        // while the reserve is missing) write nothing: they do not count,
        // lest a batch of refusals rotate and spend the space kept.
        let has_appends = batch.iter().any(|r| matches!(r, Request::Append { .. }));
        let appends_refused = has_appends && {
            let floor = self.shared.options.min_free_disk_bytes;
            self.free_bytes().is_some_and(|free| free < floor) || self.reserve_short().is_some()
        };
        let counted = |r: &Request| match r {
            Request::Append { .. } if appends_refused => 0,
            r => request_bytes(r),
        };
        let described_max = if appends_refused { 0 } else { described_max };
        let upper: u64 = batch.iter().map(counted).sum::<u64>()
            + internal
                .iter()
                .map(|(_, p)| frame::frame_len(p.len()) as u64)
                .sum::<u64>()
            + if described_max > 0 {
                frame::frame_len(described_max * crate::format::fields::ENTRY_MAX) as u64
            } else {
                0
            };
        // Appends are answered from the plan below, even when none writes.
        if upper == 0 && !has_appends {
            return Ok(());
        }
        // A checkpoint, if due, is the first frame of the write, numbered
        // before its records. None goes out below the free-disk floor, where
        // appends are refused: it could be most of what the batch writes.
        let floor = self.shared.options.min_free_disk_bytes;
        let mut checkpoint = self
            .active
            .checkpoint_due(
                self.group.is_some(),
                crate::injected!(self.shared.options, CheckpointHidesInternal),
            )
            .filter(|_| self.free_bytes().is_none_or(|free| free >= floor));
        let listing = checkpoint
            .as_ref()
            .map_or(0, |p| frame::frame_len(p.len()) as u64);
        let over = self.active.len + upper + listing > self.shared.options.segment_bytes;
        // Any frame past the header counts for size: a segment filling with
        // delivery-state frames only (a relay draining with nothing appended)
        // must rotate too, or it would grow without bound.
        if over && self.active.len > FRAMES_AT as u64 {
            self.rotate()?;
            // A new segment has nothing to list.
            checkpoint = None;
        }
        let checkpoint = checkpoint.map(|payload| {
            let seq = self.next_seq;
            self.next_seq = seq.next();
            (seq, payload)
        });
        let mut plans = self.plan(batch, backlog, timestamp_us);
        if !self.described.is_empty() {
            internal.insert(
                0,
                (
                    FrameKind::Fields,
                    crate::format::fields::encode(&self.described),
                ),
            );
        }
        let mut records = 0u64;
        let mut records_bytes = 0u64;
        let appends = batch.iter().filter(|r| matches!(r, Request::Append { .. }));
        for (r, plan) in appends.zip(&plans) {
            if let (Request::Append { payloads, .. }, Ok(())) = (r, &plan.outcome) {
                for (k, (ext, payload)) in payloads.iter().enumerate() {
                    if plan.writes(k) {
                        records += 1;
                        records_bytes += frame::frame_len(ext.len() + payload.len()) as u64;
                    }
                }
            }
        }
        let first = self.next_seq;
        self.firsts = plans
            .iter()
            .map(|p| match &p.lie {
                Some(e) => Err(e.clone()),
                None => p.outcome.clone().map(|()| p.first.unwrap_or(first)),
            })
            .collect();
        if records == 0 && internal.is_empty() && checkpoint.is_none() {
            hand_verdicts(batch, &mut plans);
            return Ok(());
        }
        self.begin_write();
        self.shared.clock.stamping(self.next_seq);
        let salt = self.active.salt;
        let mut offset = self.active.len;
        // Frames still to encode: the last one ends the write batch.
        let mut left = records as usize + internal.len() + usize::from(checkpoint.is_some());
        if let Some((seq, payload)) = &checkpoint {
            left -= 1;
            let span = self.encode_internal(
                checkpoint::CHECKPOINT,
                payload,
                *seq,
                left == 0,
                offset,
                timestamp_us,
            );
            self.active.listed(span);
            offset = span.end();
        }
        let appends = batch.iter().filter(|r| matches!(r, Request::Append { .. }));
        for (r, plan) in appends.zip(&plans) {
            let Request::Append { payloads, .. } = r else {
                continue;
            };
            if plan.outcome.is_err() {
                continue;
            }
            for (k, (ext, payload)) in payloads.iter().enumerate() {
                if !plan.writes(k) {
                    continue;
                }
                let seq = self.next_seq;
                let group = *self.group.get_or_insert(seq);
                left -= 1;
                frame::encode_with(
                    &mut self.buf,
                    &FrameHeader {
                        kind: FrameKind::Record,
                        batch_end: left == 0,
                        seq,
                        group,
                        timestamp_us,
                    },
                    ext,
                    payload,
                    salt,
                );
                let span = FrameSpan::new(
                    offset32(offset),
                    frame::frame_len(ext.len() + payload.len()) as u32,
                    true,
                );
                self.staged.push(span);
                offset = span.end();
                self.next_seq = seq.next();
            }
        }
        hand_verdicts(batch, &mut plans);
        // The table needs only keys and times (ids are the writer's).
        self.unsynced_described.extend(
            self.described
                .iter()
                .filter(|d| d.key.is_some() || d.not_before_us.is_some()),
        );
        for (kind, payload) in &internal {
            let seq = self.next_seq;
            left -= 1;
            let span = self.encode_internal(*kind, payload, seq, left == 0, offset, timestamp_us);
            offset = span.end();
            self.next_seq = seq.next();
        }
        self.write_buf()?;
        // Changes of delivery state noted before this batch are due for
        // their fsync a sync interval after they were noted, not after the
        // batch that took them (under `Durability::Buffered`, the next fsync
        // may be a timer's).
        if let (Some(since), Some(unsynced)) = (state_since, self.unsynced_since) {
            self.unsynced_since = Some(unsynced.min(since));
        }
        if records > 0 && crate::injected!(self.shared.options, WriterPanics) {
            panic!("injected: the writer panics after a batch's write");
        }
        self.active.records += records;
        self.active.state_frames += internal.len() as u64;
        self.unpublished.0 += records;
        // The table's backlog leaves the frame headers out; so does this.
        self.unpublished.1 += records_bytes - records * frame::FRAME_HEADER_LEN as u64;
        if records > 0 {
            Counters::add(&self.shared.counters.batches, 1);
            if self.inline {
                Counters::add(&self.shared.counters.caller_batches, 1);
            }
        }
        Counters::add(&self.shared.counters.records_appended, records);
        Counters::add(&self.shared.counters.bytes_appended, records_bytes);
        Ok(())
    }

    /// Encodes the internal frame `seq` of `kind` carrying `payload` at
    /// `offset` of the active segment, in the current sync group (which it
    /// starts if none is open), into the write buffer; stages and returns its
    /// span.
    fn encode_internal(
        &mut self,
        kind: FrameKind,
        payload: &[u8],
        seq: Seq,
        batch_end: bool,
        offset: u64,
        timestamp_us: u64,
    ) -> FrameSpan {
        let group = *self.group.get_or_insert(seq);
        frame::encode(
            &mut self.buf,
            &FrameHeader {
                kind,
                batch_end,
                seq,
                group,
                timestamp_us,
            },
            payload,
            self.active.salt,
        );
        let span = FrameSpan::new(
            offset32(offset),
            frame::frame_len(payload.len()) as u32,
            false,
        );
        self.staged.push(span);
        span
    }

    /// Decides, for each append of the batch in order, what it writes: the
    /// quotas (backlog, free disk) refuse a whole append; a message whose
    /// deduplication id was appended within the window writes nothing and is
    /// answered with the first record (or a conflict). The records written
    /// are numbered from `next_seq`, and the fields frame comes right after
    /// them; the ids written are remembered at once, so that the next append
    /// of the same id, in this batch or a later one, is its duplicate.
    /// `backlog` is the (records, payload bytes) not acknowledged, those
    /// written since the last sync included.
    fn plan(&mut self, batch: &[Request], backlog: (u64, u64), now: u64) -> Vec<Plan> {
        let mut plans = Vec::new();
        clear_keeping_room(&mut self.described);
        if !batch.iter().any(|r| matches!(r, Request::Append { .. })) {
            return plans;
        }
        self.dedup.expire(now);
        let free = self.free_bytes();
        let reserve_short = self.reserve_short();
        let opts = &self.shared.options;
        let mut next = self.next_seq.get();
        let (mut records, mut bytes) = backlog;
        // The ids this batch writes, with the content digest and record of
        // each, to answer a second append of one within the batch.
        let mut planned = std::mem::take(&mut self.planned);
        let mut inserted = std::mem::take(&mut self.inserted);
        let mut local = std::mem::take(&mut self.local);
        let used = planned.len();
        planned.clear();
        if planned.capacity() > ROOM_KEPT && planned.capacity() / 4 > used {
            planned.shrink_to(used.max(ROOM_KEPT));
        }
        clear_keeping_room(&mut inserted);
        for r in batch {
            let Request::Append { payloads, .. } = r else {
                continue;
            };
            let mut plan = Plan::default();
            let is_message = !payloads.messages().is_empty();
            let (mut new_records, mut new_bytes) = (0u64, 0u64);
            local.clear();
            let mut seq = next;
            for (k, (ext, payload)) in payloads.iter().enumerate() {
                let dedup = payloads.fields(k).and_then(|f| f.dedup);
                let seen = match dedup {
                    None => Seen::New,
                    Some(d) => match planned.get(&d.id) {
                        Some(&(content, s)) if content == d.content => Seen::Duplicate(s),
                        Some(&(_, s)) => Seen::Conflict(s),
                        None => self.dedup.check(d, now),
                    },
                };
                let verdict = match seen {
                    Seen::New => {
                        if let Some(d) = dedup {
                            planned.insert(d.id, (d.content, Seq::from(seq)));
                            local.push((d, Seq::from(seq)));
                        }
                        new_records += 1;
                        // Counted as the table counts its backlog: payload
                        // and optional fields, no frame header.
                        new_bytes += (ext.len() + payload.len()) as u64;
                        seq += 1;
                        Verdict::Written(Seq::from(seq - 1))
                    }
                    Seen::Duplicate(s) => Verdict::Duplicate(s),
                    Seen::Conflict(s) => Verdict::Conflict(s),
                };
                if is_message {
                    plan.verdicts.push(verdict);
                }
            }
            let conflict = plan.verdicts.as_slice().iter().find_map(|v| match v {
                Verdict::Conflict(s) => Some(*s),
                _ => None,
            });
            let refusal = if new_records == 0 {
                None
            } else if let Some(limit) = opts.max_backlog_records
                && records + new_records > limit
            {
                Some(("max_backlog_records", limit, records))
            } else if let Some(limit) = opts.max_backlog_bytes
                && bytes + new_bytes > limit
            {
                Some(("max_backlog_bytes", limit, bytes))
            } else if let Some(free) = free
                && free < opts.min_free_disk_bytes
            {
                Some(("min_free_disk_bytes", opts.min_free_disk_bytes, free))
            } else {
                reserve_short.map(|free| ("reserve", reserve::size(opts.segment_bytes), free))
            };
            let refused = match (conflict, refusal) {
                // All or nothing: the producer names the id (the writer knows
                // only its digest) from the verdicts.
                (Some(existing), _) => Some(Error::Conflict {
                    dedup_id: Vec::new(),
                    existing,
                }),
                // The negative control writes it all the same, and says not.
                (None, Some((quota, limit, current)))
                    if crate::injected!(self.shared.options, QuotaWritesAnyway) =>
                {
                    plan.lie = Some(Error::QuotaExceeded {
                        quota,
                        limit,
                        current,
                    });
                    None
                }
                (None, Some((quota, limit, current))) => {
                    plan.verdicts = Verdicts::None;
                    Some(Error::QuotaExceeded {
                        quota,
                        limit,
                        current,
                    })
                }
                (None, None) => None,
            };
            if let Some(e) = refused {
                for (d, _) in &local {
                    planned.remove(&d.id);
                }
                plan.outcome = Err(e);
                plans.push(plan);
                continue;
            }
            if new_records > 0 {
                plan.first = Some(Seq::from(next));
            }
            records += new_records;
            bytes += new_bytes;
            next = seq;
            inserted.extend(local.iter().copied());
            for (k, verdict) in plan.verdicts.as_slice().iter().enumerate() {
                let Verdict::Written(seq) = *verdict else {
                    continue;
                };
                if let Some(f) = payloads.fields(k) {
                    let d = Described {
                        seq,
                        key: f.key,
                        not_before_us: f.not_before_us,
                        dedup: f.dedup,
                    };
                    if !d.is_empty() {
                        self.described.push(d);
                    }
                }
            }
            plans.push(plan);
        }
        // The fields frame follows the records: it makes the ids durable.
        let home = Seq::from(next);
        for &(d, seq) in &inserted {
            self.dedup.insert(d, seq, now, home);
        }
        self.planned = planned;
        self.inserted = inserted;
        self.local = local;
        Counters::set(&self.shared.counters.dedup_ids, self.dedup.len() as u64);
        Counters::set(&self.shared.counters.dedup_bytes, self.dedup.heap_bytes());
        let duplicates = plans
            .iter()
            .flat_map(|p| p.verdicts.as_slice())
            .filter(|v| matches!(v, Verdict::Duplicate(_)))
            .count();
        Counters::add(&self.shared.counters.duplicates, duplicates as u64);
        plans
    }

    /// The file system's free bytes, asked at most every
    /// [`FREE_BYTES_EVERY`]; `None` when the floor is off or it cannot tell.
    fn free_bytes(&mut self) -> Option<u64> {
        if self.shared.options.min_free_disk_bytes == 0 {
            return None;
        }
        if let Some((at, free)) = self.free_checked
            && at.elapsed() < FREE_BYTES_EVERY
        {
            return free;
        }
        // A failed query does not refuse appends: the floor is a courtesy to
        // the rest of the system, and a full disk still fails cleanly. A file
        // kept for recycling counts as free: the next segment is written
        // into it instead of taking new space.
        let free = self
            .shared
            .storage
            .free_bytes(&self.shared.dir)
            .ok()
            .flatten()
            .map(|free| free.saturating_add(self.spare_len()));
        self.free_checked = Some((Instant::now(), free));
        free
    }

    /// While the outbox has no reserve for want of space (set at open), tries
    /// to make it again, at most every [`RESERVE_RETRY_EVERY`] (every
    /// [`FREE_BYTES_EVERY`] while the file system says it has the room);
    /// returns the file system's free
    /// bytes (0 when it cannot tell) while it is still missing, and appends
    /// are then refused: the space left is what the next open needs on a
    /// full disk. A try that fails for another reason (no descriptor left,
    /// an I/O error) leaves it missing too, to be tried again.
    fn reserve_short(&mut self) -> Option<u64> {
        if !self.shared.reserve_missing.load(Ordering::Relaxed) {
            return None;
        }
        let size = reserve::size(self.shared.options.segment_bytes);
        let free = self
            .shared
            .storage
            .free_bytes(&self.shared.dir)
            .ok()
            .flatten();
        // Space freed goes to a deletion waiting for room for its
        // tombstones first (the timer weighs it again within a second):
        // that deletion frees more than it writes, the reserve only takes.
        if self.held.as_ref().is_some_and(|h| h.for_space) {
            return Some(free.unwrap_or(0));
        }
        // Paced even when the file system says it has the room: a try can
        // fail all the same (the room fragmented, or kept for the superuser).
        let due = self.reserve_tried.is_none_or(|at| {
            at.elapsed() >= RESERVE_RETRY_EVERY
                || (free.is_some_and(|free| free >= size) && at.elapsed() >= FREE_BYTES_EVERY)
        });
        if !due {
            return Some(free.unwrap_or(0));
        }
        self.reserve_tried = Some(Instant::now());
        match reserve::ensure(&*self.shared.storage, &self.shared.dir, size) {
            Ok(()) => {
                self.shared.reserve_missing.store(false, Ordering::Relaxed);
                None
            }
            Err(e) => {
                // A file kept for recycling holds space the reserve needs
                // more: it goes, and the reserve is tried again at once.
                if reserve::is_no_space(&e) && self.drop_spare("the reserve") {
                    self.reserve_tried = None;
                    return self.reserve_short();
                }
                let free = self.shared.storage.free_bytes(&self.shared.dir);
                Some(free.ok().flatten().unwrap_or(0))
            }
        }
    }

    /// The length of the file kept for recycling, 0 without one (or when it
    /// cannot be asked).
    fn spare_len(&self) -> u64 {
        self.spare
            .as_deref()
            .and_then(|spare| self.shared.storage.open_read(spare).ok())
            .and_then(|file| file.len().ok())
            .unwrap_or(0)
    }

    /// Writes `buf` at the end of the active segment, and zeros ahead of it when
    /// it reached space not written before (see [`ZERO_AHEAD_MIN`]), unless
    /// writes are large (see [`ZEROS_SKIPPED_FROM`]).
    fn write_buf(&mut self) -> Result<()> {
        let start = self.active.len - self.active.tail.len() as u64;
        let frames_end = start + self.buf.len() as u64;
        // In a recycled file's old blocks, the write is filled to its block's
        // end with zeros: a write of part of a block that is not in the page
        // cache would make the kernel read it from the disk first. (A new
        // file's blocks past the frames are zeros written ahead, or unwritten.)
        let fill = if frames_end < self.active.stale_to {
            (frames_end.next_multiple_of(BLOCK as u64) - frames_end) as usize
        } else {
            0
        };
        let frames_len = self.buf.len();
        self.buf.resize(frames_len + fill, 0);
        let written = io::write_all_at(&*self.active.seg.file, &self.buf, start);
        self.buf.truncate(frames_len);
        if let Err(e) = written {
            self.staged.clear();
            return Err(self.write_failed(e));
        }
        for span in self.staged.drain(..) {
            self.unsynced.push(span);
            self.active.index.push(span);
        }
        let batch = self.buf.len() as u64;
        self.active.len = start + batch;
        let end = self.active.len;
        let partial = (end % BLOCK as u64) as usize;
        self.active.tail.clear();
        // The buffer starts on the block boundary (after the tail it carried),
        // so it holds the whole partial block; save under the negative control
        // that starts a sync group inside a block, where the tail stays empty.
        if let Some(tail) = self
            .buf
            .len()
            .checked_sub(partial)
            .and_then(|k| self.buf.get(k..))
        {
            self.active.tail.extend_from_slice(tail);
        }
        self.fit_buffer(batch as usize);
        if end > self.active.zeroed && self.buf_need as u64 >= ZEROS_SKIPPED_FROM {
            // Large writes: their frames go into space never written, and
            // the fdatasync records that it now is (see `ZEROS_SKIPPED_FROM`).
            self.reserve(end + (4 * batch).clamp(ZERO_AHEAD_MIN, ZERO_AHEAD_MAX));
        } else if end > self.active.zeroed {
            let wanted = end + (4 * batch).clamp(ZERO_AHEAD_MIN, ZERO_AHEAD_MAX);
            self.reserve(wanted);
            let ahead = wanted.min(self.active.room);
            // Past the preallocated space (a batch larger than what is left)
            // there is nothing to write: the file grows with the frames.
            let zeros = ZEROS.get(..ahead.saturating_sub(end) as usize);
            let written = zeros.is_some_and(|z| {
                z.is_empty() || io::write_all_at(&*self.active.seg.file, z, end).is_ok()
            });
            if written {
                self.active.zeroed = ahead.max(end);
            } else {
                // Only a speed-up: zeros written in part over preallocated zeros
                // change nothing, and a failing device shows at the fdatasync.
                // (A copy-on-write file system may refuse space its fallocate
                // never reserved.) No more zeros ahead in this segment.
                self.active.zeroed = end;
                self.active.room = end;
                self.active.growable = false;
            }
        }
        self.last_written = Seq::from(self.next_seq.get() - 1);
        if self.unsynced_since.is_none() {
            self.unsynced_since = Some(Instant::now());
        }
        Ok(())
    }

    /// Whether the frames are near the end of the zeros written ahead of them
    /// (less than [`ZERO_AHEAD_MIN`] left, and room for more), with nothing
    /// waiting to be synced and writes small enough to want zeros ahead
    /// (below [`ZEROS_SKIPPED_FROM`]): the next batches would carry zeros. Never in a
    /// segment without frames: an outbox opened and left idle (a command
    /// that only looks at it) writes no zeros, and a crash during the zeros
    /// never leaves a torn tail in a segment that holds nothing. False again
    /// once [`Writer::zero_ahead_idle`] ran, whatever it managed, so an idle
    /// writer does not wake for it again and again.
    fn zeros_due(&self) -> bool {
        let a = &self.active;
        // How far zeros could go: the space reserved, or the segment's size
        // while more can be reserved.
        let limit = if a.growable {
            a.room.max(self.shared.options.segment_bytes)
        } else {
            a.room
        };
        self.shared.poison.get().is_none()
            && self.group.is_none()
            && self.unsynced_since.is_none()
            && a.len > FRAMES_AT as u64
            && a.zeroed.max(a.len) < limit
            && a.zeroed.saturating_sub(a.len) < ZERO_AHEAD_MIN
            && (self.buf_need as u64) < ZEROS_SKIPPED_FROM
    }

    /// Writes the zeros the next batches will need while no request waits,
    /// and makes them durable with an `fdatasync` of their own, so that no
    /// producer's batch carries them (nor the metadata that marks their
    /// blocks written). Called only while nothing is unsynced, so that the
    /// fsync carries zeros alone. A failed write of zeros is what it is in
    /// [`Writer::write_buf`]: no more zeros in this segment. A failed
    /// `fdatasync` poisons the outbox, as any failed fsync does: the device
    /// is failing, and the next batch's fsync could no longer be trusted to
    /// report it.
    fn zero_ahead_idle(&mut self) {
        if !self.zeros_due() {
            return;
        }
        let end = self.active.len;
        let wanted = end + 2 * ZERO_AHEAD_MIN;
        self.reserve(wanted);
        let from = self.active.zeroed.max(end);
        let ahead = wanted.min(self.active.room);
        if ahead <= from {
            return;
        }
        let zeros = ZEROS.get(..(ahead - from) as usize);
        let written =
            zeros.is_some_and(|z| io::write_all_at(&*self.active.seg.file, z, from).is_ok());
        if !written {
            self.active.zeroed = end;
            self.active.room = end;
            self.active.growable = false;
            return;
        }
        self.active.zeroed = ahead;
        if let Err(e) = self.active.seg.file.sync_data() {
            let path = self.active.seg.path.clone();
            let _ = self.poison("fsync", &path, e);
            return;
        }
        Counters::add(&self.shared.counters.fsyncs, 1);
    }

    /// Reserves space in the active segment up to `wanted` bytes if it has less:
    /// twice what it has, at least `wanted`, at most the segment size. Only a
    /// speed-up, like the first reservation: the next `fdatasync` records the
    /// new size once, and later batches overwrite reserved blocks in place. On
    /// failure nothing more is reserved in this segment; the file grows as it is
    /// written.
    fn reserve(&mut self, wanted: u64) {
        let a = &mut self.active;
        let max = self.shared.options.segment_bytes;
        if wanted <= a.room || !a.growable || a.room >= max {
            return;
        }
        let to = (2 * a.room).max(wanted).min(max);
        if a.seg.file.allocate(to).is_ok() {
            a.room = to;
        } else {
            a.growable = false;
        }
    }

    /// Starts the buffer of a write: the current sync group's bytes in its
    /// unfilled block first, if any (the write starts at that block's boundary).
    fn begin_write(&mut self) {
        self.buf.clear();
        self.buf.extend_from_slice(&self.active.tail);
    }

    /// Gives back the encode buffer's memory when it is far above what writes
    /// usually need: one 16 MiB record must not leave an idle outbox holding 16
    /// MiB for the rest of its life. The need is a moving average of the write
    /// sizes before this one (each write weighs an eighth): steady large batches
    /// keep their buffer, while one write far above them gives its memory back
    /// at once.
    fn fit_buffer(&mut self, written: usize) {
        let keep = (2 * self.buf_need).max(BUF_KEEP_MIN);
        self.buf_need = self.buf_need - self.buf_need / 8 + written / 8;
        if self.buf.capacity() > 2 * keep {
            self.buf.clear();
            self.buf.shrink_to(keep);
        }
    }

    /// A write failed: the outbox is poisoned. Appends of the current sync
    /// group answered Ok under `Durability::Buffered` are written but not yet
    /// fsynced: they are made durable first (their first fsync, not a retry), so
    /// that a failed write, a full disk for one, never takes back a record that
    /// was answered Ok. Only if that fsync fails too can they be lost
    /// (docs/GUARANTEES.md).
    fn write_failed(&mut self, e: std::io::Error) -> Error {
        if self.group.is_some()
            && !self.unsynced.is_empty()
            && let Err(fsync_error) = self.sync()
        {
            return fsync_error;
        }
        self.poison("write", &self.active.seg.path.clone(), e)
    }

    /// Makes every written frame durable and publishes it to the state table.
    /// The next write starts on a fresh block, so that no later write touches a
    /// block holding the bytes this fsync made durable.
    fn sync(&mut self) -> Result<()> {
        if let Some(e) = self.shared.poison.get() {
            return Err(e.clone());
        }
        let Some(group) = self.group else {
            return Ok(());
        };
        let started = std::time::Instant::now();
        if let Err(e) = self.active.seg.file.sync_data() {
            return Err(self.poison("fsync", &self.active.seg.path.clone(), e));
        }
        let took = started.elapsed();
        self.shared.counters.fsync_latency.record(took);
        let took_ns = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        let recent = &self.shared.counters.fsync_recent_ns;
        let before = recent.load(std::sync::atomic::Ordering::Relaxed);
        let average = if before == 0 {
            took_ns
        } else {
            before - before / 8 + took_ns / 8
        };
        recent.store(average, std::sync::atomic::Ordering::Relaxed);
        Counters::add(&self.shared.counters.fsyncs, 1);
        self.active.tail.clear();
        // The negative control goes on in the middle of the block instead.
        if !crate::injected!(self.shared.options, UnalignedSyncGroups) {
            self.active.len = align_up(self.active.len);
        }
        self.active.synced_len = self.active.len;
        {
            let mut table = self.shared.table.lock();
            table.push_frames(self.active.seg.id, group, &self.unsynced);
            if crate::injected!(self.shared.options, IgnoreKeys) {
                for d in &mut self.unsynced_described {
                    d.key = None;
                }
            }
            if !self.unsynced_described.is_empty() {
                let now = self.shared.clock.now_us();
                table.apply_fields(&self.unsynced_described, now, now_us());
            }
        }
        clear_keeping_room(&mut self.unsynced_described);
        self.unpublished = (0, 0);
        clear_keeping_room(&mut self.unsynced);
        self.group = None;
        self.unsynced_since = None;
        self.shared.notify_arrived(true);
        Ok(())
    }

    /// Records the first failure; every later request gets this error.
    ///
    /// The page cache can no longer be trusted: it may hold bytes a failed sync
    /// dropped from the disk, which a reopen in this process would read as
    /// written. So the active segment is cut back to what its last successful
    /// sync made durable (best effort, never retried), and nothing is written to
    /// it again.
    fn poison(&self, op: &'static str, path: &Path, e: std::io::Error) -> Error {
        let error = Error::Poisoned {
            path: path.to_path_buf(),
            op,
            source: Arc::new(e),
        };
        if self.shared.poison.get().is_none() && self.active.len > self.active.synced_len {
            self.active.seg.cut_back(self.active.synced_len);
        }
        if self.shared.poison.set(error.clone()).is_ok() {
            crate::event!(
                error,
                path = %path.display(),
                op,
                error = %error,
                "outbox poisoned: appends fail until it is reopened"
            );
        }
        // Claimers waiting for records will get none from this run.
        self.shared.notify_arrived(true);
        self.shared.poison.get().cloned().unwrap_or(error)
    }

    /// Seals the active segment and starts a new one.
    ///
    /// Order matters for recovery: everything written is fsynced; the new segment
    /// is created and made durable; only then is the seal frame written and
    /// fsynced into the old one. A crash in between leaves an empty newest
    /// segment after an unsealed one, which recovery keeps as the active segment
    /// and whose predecessor the writer then seals (docs/FORMAT.md, "Crash
    /// between creating the next segment and sealing the old one").
    fn rotate(&mut self) -> Result<()> {
        self.sync()?;
        let seal_seq = self.next_seq;
        let first = seal_seq.next();
        let next = self.next_segment(first, seal_seq);
        let next = match next {
            Ok(next) => next,
            Err(f) => return Err(self.poison(f.op, &f.path, f.source)),
        };
        Counters::add(&self.shared.counters.fsyncs, 2);
        let records_end = self.active.len;
        let index = self.active.index.encode(self.active.nonce);
        let seal_len = index.frame_len();
        // Count the seal as written before its fsync, so that a failed fsync
        // poisons with the seal cut off again: a reopen in this process must not
        // read from the page cache a seal the disk may not have.
        self.active.len += index.frame_len() as u64;
        if let Err(f) = self
            .active
            .seg
            .seal(records_end, seal_seq, index, self.active.salt)
        {
            return Err(self.poison(f.op, &f.path, f.source));
        }
        Counters::add(&self.shared.counters.fsyncs, 1);
        crate::event!(
            info,
            sealed = %self.active.seg.path.display(),
            last_seq = seal_seq.get(),
            bytes = self.active.len,
            next = first.get(),
            "segment sealed, the next one started"
        );
        self.next_seq = first;
        self.last_written = seal_seq;
        {
            let mut table = self.shared.table.lock();
            let id = self.active.seg.id;
            table.push_seal(id, seal_seq, records_end, seal_len);
            table.seal_last(id);
        }
        let next = Active::new(next);
        push_active(&self.shared, &next);
        self.active = next;
        Ok(())
    }

    /// Makes the segment whose first frame is `first`, after the seal
    /// `seal_seq`, durable: from the file kept for recycling if there is one
    /// (a failure there only costs the file: a new one is created instead),
    /// otherwise a new file.
    fn next_segment(
        &mut self,
        first: Seq,
        seal_seq: Seq,
    ) -> std::result::Result<FreshSegment, crate::io::segment_file::Failed> {
        let shared = &self.shared;
        let next = Successor {
            first,
            prev_seq: seal_seq,
            log_start: self.log_start,
            outbox_id: self.outbox_id,
            checkpoint_every: shared.options.checkpoint_every(),
        };
        if let Some(spare) = self.spare.take() {
            let recycled = SegmentFile::recycle(
                &*shared.storage,
                &shared.dir,
                &spare,
                next,
                !crate::injected!(shared.options, RecycleHeaderUnsynced),
            );
            match recycled {
                Ok(fresh) => {
                    crate::event!(
                        debug,
                        from = %spare.display(),
                        to = %fresh.segment.path.display(),
                        "acknowledged segment recycled as the next one"
                    );
                    Counters::add(&shared.counters.segments_recycled, 1);
                    return Ok(fresh);
                }
                Err(crate::io::segment_file::Recycling::After(failed)) => return Err(failed),
                Err(crate::io::segment_file::Recycling::Before(_failed)) => {
                    crate::event!(
                        warn,
                        path = %_failed.path.display(),
                        op = _failed.op,
                        error = %_failed.source,
                        "recycling a segment failed; a new file is created instead"
                    );
                }
            }
        }
        SegmentFile::create(
            &*shared.storage,
            &shared.dir,
            next,
            crate::io::segment_file::first_allocation(shared.options.segment_bytes),
        )
    }

    /// Deletes the oldest segments that are sealed and fully acknowledged, and
    /// carries forward the few records that keep the oldest one when the rule
    /// of relocation says so (`state::table::moved`), copying at most
    /// [`RELOCATE_BYTES`] per call.
    fn reclaim(&mut self) {
        self.delete_finished();
        let mut budget = RELOCATE_BYTES;
        while budget > 0 {
            let Some(copied) = self.relocate(budget) else {
                break;
            };
            budget = budget.saturating_sub(copied.max(1));
            self.delete_finished();
        }
    }

    /// Carries forward the records the state table names (if it names any):
    /// reads each frame from the oldest segment and checks it, writes the
    /// copies as relocated frames (kind 4) in a batch of their own, makes them
    /// durable, and only then hands each record's state to its copy. Copies
    /// at most `budget` bytes of frames (at least one frame); returns how many
    /// it copied, or `None` if it did nothing.
    ///
    /// A frame that fails its check, or cannot be read now, is left where it
    /// is for this step (and the segment with it): the relay that holds it
    /// may hold good bytes of it, a read may have failed only this once, and
    /// a claim or `dead_letters` that reads it reports the damage itself
    /// (`Error::Corrupt`, with the file and offset). Returns `None` if
    /// nothing could be copied, so that a damaged frame is read at most once
    /// per call of [`Writer::reclaim`].
    fn relocate(&mut self, budget: u64) -> Option<u64> {
        if self.shared.poison.get().is_some() {
            return None;
        }
        let found = self.shared.table.lock().stragglers(
            self.shared.options.segment_bytes,
            budget,
            self.shared.clock.now_us(),
            now_us(),
        );
        let relocation = found?;
        let file = match &relocation.file {
            Some(file) => file.clone(),
            None => self.shared.files.get(&relocation.path).ok()?,
        };
        let mut copies: Vec<(Seq, Vec<u8>, Vec<u8>, u64)> = Vec::new();
        let mut whole = Vec::new();
        for st in &relocation.stragglers {
            whole.resize(st.len as usize, 0);
            if io::read_exact_at(&*file, &mut whole, u64::from(st.offset)).is_err() {
                continue;
            }
            let Ok(f) = frame::decode(&whole, relocation.salt) else {
                continue;
            };
            let holds_it = match f.header.kind {
                FrameKind::Record => f.header.seq == st.seq && st.at == st.seq,
                FrameKind::Relocated => {
                    f.header.seq == st.at
                        && crate::format::relocated::decode_ext(f.ext)
                            .is_ok_and(|(own, _)| own == st.seq)
                }
                _ => false,
            };
            let fields = crate::format::ext::decode(f.ext);
            let (true, Ok(fields)) = (holds_it, fields) else {
                continue;
            };
            let mut ext = Vec::new();
            crate::format::relocated::encode_ext(&fields, st.seq, &st.carried, &mut ext);
            copies.push((st.seq, ext, f.payload.to_vec(), f.header.timestamp_us));
        }
        if copies.is_empty() {
            return None;
        }
        // The negative control leaves the first record behind uncopied, and
        // lets its old place go as if it had been moved.
        let dropped = if crate::injected!(self.shared.options, RelocationDropsRecord) {
            copies.first().map(|c| c.0)
        } else {
            None
        };
        let copies = if dropped.is_some() {
            &copies[1..]
        } else {
            &copies[..]
        };
        let moves = self.write_relocated(copies).ok()?;
        let mut table = self.shared.table.lock();
        if let Some(seq) = dropped {
            table.set_aside(seq);
        }
        table.moved_in(&moves);
        // Reported without the lock: a subscriber may read the outbox's stats.
        drop(table);
        crate::event!(
            info,
            from = %relocation.path.display(),
            records = moves.len(),
            "records carried forward so that their old segment can go"
        );
        let copied = copies
            .iter()
            .map(|(_, ext, payload, _)| frame::frame_len(ext.len() + payload.len()) as u64)
            .sum();
        Some(copied)
    }

    /// Writes `copies` (each a record's number, its optional fields, its
    /// payload and its first timestamp) as relocated frames, one write batch,
    /// fsynced; returns each record's number with its copy's.
    fn write_relocated(
        &mut self,
        copies: &[(Seq, Vec<u8>, Vec<u8>, u64)],
    ) -> Result<Vec<(Seq, Seq)>> {
        let written = copies;
        let encoded: u64 = written
            .iter()
            .map(|(_, ext, payload, _)| frame::frame_len(ext.len() + payload.len()) as u64)
            .sum();
        if self.active.len + encoded > self.shared.options.segment_bytes
            && self.active.len > FRAMES_AT as u64
        {
            self.rotate()?;
        }
        self.begin_write();
        let salt = self.active.salt;
        let mut offset = self.active.len;
        let mut moves = Vec::with_capacity(copies.len());
        for (k, (own, ext, payload, stamped)) in written.iter().enumerate() {
            let seq = self.next_seq;
            let group = *self.group.get_or_insert(seq);
            frame::encode_with(
                &mut self.buf,
                &FrameHeader {
                    kind: FrameKind::Relocated,
                    batch_end: k + 1 == written.len(),
                    seq,
                    group,
                    timestamp_us: *stamped,
                },
                ext,
                payload,
                salt,
            );
            let span = FrameSpan::new(
                offset32(offset),
                frame::frame_len(ext.len() + payload.len()) as u32,
                false,
            );
            self.staged.push(span);
            offset = span.end();
            self.next_seq = seq.next();
            moves.push((*own, seq));
        }
        if !written.is_empty() {
            self.write_buf()?;
            self.active.state_frames += written.len() as u64;
        }
        self.sync()?;
        Ok(moves)
    }

    /// Deletes the oldest segments once they are sealed and fully acknowledged.
    ///
    /// The new log start is written and fsynced in a `LogStart` frame *before* any
    /// file is removed, so that recovery can tell a deleted segment from a missing
    /// one (docs/FORMAT.md, "Crash during deletion").
    fn delete_finished(&mut self) {
        if self.shared.poison.get().is_some() {
            return;
        }
        let front = {
            let table = self.shared.table.lock();
            // The negative control deletes sealed segments whatever they hold.
            if crate::injected!(self.shared.options, DeleteLiveSegment) {
                table.sealed_front()
            } else {
                table.reclaimable()
            }
        };
        let Some((count, new_start)) = front else {
            self.set_held(None);
            return;
        };
        if !crate::injected!(self.shared.options, DeleteLiveSegment)
            && self.hold_deletion(count, new_start)
        {
            return;
        }
        // The deletion held until now counts as held until it is done.
        if self.write_log_start(new_start).is_err() {
            return;
        }
        self.log_start = new_start;
        let paths = self.shared.table.lock().front_paths(count);
        for (k, path) in paths.iter().enumerate() {
            // A file that cannot be removed now is below the durable log start:
            // the next recovery removes it.
            self.shared.files.forget(path);
            // The newest of them is kept, renamed, to be written again as the
            // next segment, if none is kept yet. Renamed, not written: its
            // bytes change only once the directory fsync below made the new
            // name durable (a crash before leaves it under its own name,
            // below the log start: a leftover recovery removes).
            if k + 1 == paths.len() && self.keep_spare(path) {
                continue;
            }
            let _removed = self.shared.storage.remove(path);
            crate::event!(
                info,
                path = %path.display(),
                log_start = new_start.get(),
                removed = _removed.is_ok(),
                "acknowledged segment deleted"
            );
        }
        if let Err(e) = self.shared.storage.sync_dir(&self.shared.dir) {
            let _ = self.poison("directory fsync", &self.shared.dir.clone(), e);
            return;
        }
        Counters::add(&self.shared.counters.fsyncs, 1);
        self.shared.table.lock().remove_front(count);
        Counters::add(&self.shared.counters.segments_deleted, count as u64);
        self.set_held(None);
        // The space freed may hold the missing reserve: the next append tries.
        self.reserve_tried = None;
    }

    /// Whether the deletion of the oldest `count` segments (all acknowledged,
    /// the log then starting at `new_start`) waits for more segments to
    /// delete with it. A deletion first carries the deduplication ids whose
    /// frames it removes into a tombstones frame ([`Dedup::carry`]): with many
    /// ids in the window and small segments, that frame can be larger than
    /// what the deletion frees, and the segment it fills is the next one
    /// deleted, so each deletion would write all the ids again. A deletion
    /// therefore waits until it frees at least [`HOLD_RATIO`] times the bytes
    /// it carries; while no deletion is let through early (below), the
    /// tombstones written are then at most a third of the other bytes
    /// written (docs/FORMAT.md, "Tombstones frames").
    ///
    /// While space is short (the file system under twice the free-disk
    /// floor) it waits only until it frees [`HOLD_RATIO_SHORT`] times what it
    /// carries, so that each deletion gives space back and less is kept
    /// waiting; while appends are refused for want of space (under the
    /// floor, or the reserve missing), only while it would write more than
    /// it frees. It does not wait once the log holds more than
    /// `HOLD_RATIO + 1` times the carry and two segments: relocation, which
    /// works on the oldest segment only, must then see the segment behind the
    /// acknowledged ones. The answer stands while the log's segments and the
    /// shortage stay as they are, until enough of the ids have left the
    /// window to let the deletion through (at least [`HOLD_RECHECK`]); then
    /// the timer weighs it again ([`Writer::on_timer`]).
    fn hold_deletion(&mut self, count: usize, new_start: Seq) -> bool {
        let free = self.free_bytes();
        let pressure = self.pressure(free);
        let table = self.shared.table.lock();
        if let Some(held) = &self.held
            && held.holds((count, new_start), &table)
            && held.pressure == pressure
            && Instant::now() < held.recheck
        {
            return true;
        }
        let (freed, disk) = table.front_bytes(count);
        let segments = table.segment_count();
        drop(table);
        let now = now_us();
        let carried = self.dedup.carry_len(new_start, now) as u64;
        // The most tombstones the deletion may write.
        let ratio = match pressure {
            Pressure::Room => HOLD_RATIO,
            Pressure::Short => HOLD_RATIO_SHORT,
            Pressure::Refusing => 1,
        };
        let most = freed / (ratio * TOMBSTONE_BYTES);
        let bound = (carried * TOMBSTONE_BYTES)
            .saturating_mul(HOLD_RATIO + 1)
            .saturating_add(self.shared.options.segment_bytes.saturating_mul(2));
        let for_ids = carried > most && disk <= bound;
        // Held for space, it is weighed again within a second, whatever the
        // ids' window says: space may come back sooner.
        let for_space = !for_ids && !self.stones_fit(carried);
        let hold = for_ids || for_space;
        if for_space && !self.held.as_ref().is_some_and(|h| h.for_space) {
            crate::event!(
                warn,
                dir = %self.shared.dir.display(),
                tombstones = carried,
                "deletion waits: its tombstones do not fit in the space left"
            );
        }
        let held = hold.then(|| {
            let keep = usize::try_from(most).unwrap_or(usize::MAX);
            let wait_us = if for_space {
                0
            } else {
                self.dedup
                    .carry_shrinks_at(new_start, now, keep)
                    .saturating_sub(now)
            };
            Held {
                front: (count, new_start),
                segments,
                pressure,
                recheck: Instant::now() + Duration::from_micros(wait_us).max(HOLD_RECHECK),
                for_space,
            }
        });
        if hold {
            self.set_held(held);
        }
        hold
    }

    /// Whether the tombstones of `carried` ids, written before the deletion
    /// frees anything, fit in the space left: the active segment's file
    /// past its frames (its length, not the room the writer asked for: a
    /// file system without `fallocate` reserves nothing), and the file
    /// system's free bytes. A deletion whose tombstones do not fit waits
    /// ([`Writer::hold_deletion`], weighed again by the timer every
    /// second), for its write would fail and poison the outbox, and at an
    /// open fail that open and every later one on the same disk. A file
    /// kept for recycling goes first where its space makes the room. True
    /// where free space is not asked (`min_free_disk_bytes` 0, as for the
    /// floor) or cannot be told: the write then decides. (On a copy-on-write
    /// file system even the file's own blocks take new space when written:
    /// there too the write decides.)
    fn stones_fit(&mut self, carried: u64) -> bool {
        if carried == 0 {
            return true;
        }
        let frames = carried.div_ceil(TOMBSTONES_PER_FRAME as u64);
        let need = (carried * TOMBSTONE_BYTES)
            .saturating_add(frames.saturating_mul(STONES_FRAME_SLACK))
            .saturating_add(STONES_WRITE_SLACK);
        let file_len = self.active.seg.file.len().unwrap_or(self.active.len);
        let reserved = file_len.saturating_sub(self.active.len);
        if need <= reserved {
            return true;
        }
        // The file system's free bytes, with a file kept for recycling
        // counted in (`Writer::free_bytes`).
        let Some(free) = self.free_bytes() else {
            return true;
        };
        if reserved.saturating_add(free) < need {
            return false;
        }
        let spare = self.spare_len();
        if spare > 0 && reserved.saturating_add(free.saturating_sub(spare)) < need {
            self.drop_spare("room for tombstones");
        }
        true
    }

    /// Removes the file kept for recycling, if there is one: its space is
    /// wanted for `what` (named in the INFO event). Returns whether there
    /// was one.
    fn drop_spare(&mut self, what: &'static str) -> bool {
        let Some(spare) = self.spare.take() else {
            return false;
        };
        let _removed = self.shared.storage.remove(&spare);
        let _ = what;
        crate::event!(
            info,
            path = %spare.display(),
            removed = _removed.is_ok(),
            "file kept for recycling removed to make {what}"
        );
        self.free_checked = None;
        true
    }

    /// How short space is, with `free` the file system's free bytes (if
    /// known), for [`Writer::hold_deletion`].
    fn pressure(&self, free: Option<u64>) -> Pressure {
        let floor = self.shared.options.min_free_disk_bytes;
        if self.shared.reserve_missing.load(Ordering::Relaxed) || free.is_some_and(|f| f < floor) {
            Pressure::Refusing
        } else if free.is_some_and(|f| f < floor.saturating_mul(2)) {
            Pressure::Short
        } else {
            Pressure::Room
        }
    }

    /// Keeps `held` as the deletion that waits, and says so in the stats.
    fn set_held(&mut self, held: Option<Held>) {
        let count = held.as_ref().map_or(0, |h| h.front.0);
        Counters::set(&self.shared.counters.held_for_ids, count as u64);
        self.held = held;
    }

    /// Renames the deleted segment file `path` to its spare's name and keeps
    /// it for the next rotation, if recycling is on and no file is kept yet;
    /// returns whether it did. (The directory fsync that follows every
    /// deletion makes the name durable.)
    fn keep_spare(&mut self, path: &Path) -> bool {
        // Without a reserve, a deleted segment's space is the reserve's.
        if !self.shared.options.recycle_segments
            || self.spare.is_some()
            || self.shared.reserve_missing.load(Ordering::Relaxed)
        {
            return false;
        }
        let Some(id) = path
            .file_name()
            .and_then(|n| SegmentId::parse(&n.to_string_lossy()))
        else {
            return false;
        };
        let to = self.shared.dir.join(id.free_name());
        if self.shared.storage.rename(path, &to).is_err() {
            return false;
        }
        self.spare = Some(to);
        true
    }

    /// Writes a `LogStart` frame recording `new_start` as a batch of its own, and
    /// makes it durable. The deduplication ids whose frames are about to be
    /// deleted with the segments below `new_start` ride in front of it, in
    /// tombstones frames of the same batch.
    fn write_log_start(&mut self, new_start: Seq) -> Result<()> {
        self.begin_write();
        let mut stones = self.dedup.carry(new_start, self.next_seq, now_us());
        if crate::injected!(self.shared.options, ForgetTombstones) {
            stones.clear();
        }
        // The first tombstones frame takes the number carry was given; a
        // long list takes more frames, numbered after it (the next deletion
        // carries those entries again a little early: harmless).
        for chunk in stones.chunks(TOMBSTONES_PER_FRAME) {
            let seq = self.next_seq;
            let group = *self.group.get_or_insert(seq);
            let payload = crate::format::fields::encode_tombstones(chunk);
            let before = self.buf.len();
            frame::encode(
                &mut self.buf,
                &FrameHeader {
                    kind: crate::format::fields::TOMBSTONES,
                    batch_end: false,
                    seq,
                    group,
                    timestamp_us: now_us(),
                },
                &payload,
                self.active.salt,
            );
            let span = FrameSpan::new(
                offset32(self.active.len + (before - self.active.tail.len()) as u64),
                (self.buf.len() - before) as u32,
                false,
            );
            self.staged.push(span);
            self.active.state_frames += 1;
            self.next_seq = seq.next();
        }
        let seq = self.next_seq;
        let group = *self.group.get_or_insert(seq);
        frame::encode(
            &mut self.buf,
            &FrameHeader {
                kind: FrameKind::LogStart,
                batch_end: true,
                seq,
                group,
                timestamp_us: now_us(),
            },
            &new_start.get().to_le_bytes(),
            self.active.salt,
        );
        let before = self.staged.last().map_or(self.active.len, |s| s.end());
        let span = FrameSpan::new(offset32(before), frame::frame_len(8) as u32, false);
        self.staged.push(span);
        self.active.index.log_start(new_start);
        self.next_seq = seq.next();
        self.write_buf()?;
        self.sync()
    }
}

/// The writer thread: serves the queue until every handle is closed and the
/// queue is drained. Returns the outcome of the final sync.
///
/// If the writer panics (a bug), the outbox is poisoned and the thread goes on
/// answering every request with that error until the outbox is closed, so no
/// producer waits forever.
pub(crate) fn run(core: Arc<Mutex<Writer>>, rx: Receiver<Request>) -> Result<()> {
    crate::log::shared::mark_own_thread();
    let served = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| serve(&core, &rx)));
    if let Ok(outcome) = served {
        return outcome;
    }
    let error = {
        let mut writer = core.lock();
        let error = writer.panicked();
        writer.stop_notifier();
        error
    };
    for r in rx.iter() {
        fail(r, &error);
    }
    Err(error)
}

/// The writer thread's loop. The writer's lock is held while a batch or a
/// timed duty runs, never while the thread waits for a request.
fn serve(core: &Mutex<Writer>, rx: &Receiver<Request>) -> Result<()> {
    let shared = core.lock().shared.clone();
    loop {
        let (until, idle_until) = PoisonOnPanic(lock_for_thread(core, &shared)).sleep();
        let got = match until {
            Some(until) => rx.recv_deadline(until),
            None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
        };
        let mut writer = PoisonOnPanic(lock_for_thread(core, &shared));
        writer.awake();
        match got {
            // A nudge alone, with no batch to write: what it asks for is
            // reclaiming (deletions, relocation) or a look at the deadlines;
            // changes of delivery state are written by `sleep` (or left to a
            // producer writing its own batches).
            Ok(Request::Reclaim) if rx.is_empty() => {
                writer.reclaim();
                writer.on_timer();
            }
            Ok(first) => {
                writer.gather(first);
                writer.process_batch();
                writer.on_timer();
            }
            Err(RecvTimeoutError::Timeout) => {
                writer.on_timer();
                if let Some(t) = idle_until.filter(|&t| Instant::now() >= t) {
                    writer.idle(rx, t);
                }
            }
            Err(RecvTimeoutError::Disconnected) => return writer.finish(),
        }
    }
}

/// The writer's lock, for the writer thread. The lock is fair to no one: a
/// producer appending alone could take it ahead of the thread again and
/// again. So while the thread waits for it, it says so
/// (`Shared::writer_wants_lock`), and such a producer queues its append
/// instead (`Outbox::hand`). Once the thread holds the lock it no longer
/// says so: a producer that finds the lock held then waits for it, which
/// takes no longer than its request would wait in the queue.
fn lock_for_thread<'a>(core: &'a Mutex<Writer>, shared: &Shared) -> MutexGuard<'a, Writer> {
    if let Some(writer) = core.try_lock() {
        return writer;
    }
    shared.writer_wants_lock.store(true, Ordering::Relaxed);
    let writer = core.lock();
    shared.writer_wants_lock.store(false, Ordering::Relaxed);
    writer
}

/// The writer thread's hold on the writer's lock: a panic while it is held
/// poisons the outbox before the lock goes, so that no producer takes the
/// lock and writes a batch on the state the panic left half changed (a
/// producer checks the poison before it writes its own batch).
struct PoisonOnPanic<'a>(parking_lot::MutexGuard<'a, Writer>);

impl Drop for PoisonOnPanic<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.panicked();
        }
    }
}

impl std::ops::Deref for PoisonOnPanic<'_> {
    type Target = Writer;
    fn deref(&self) -> &Writer {
        &self.0
    }
}

impl std::ops::DerefMut for PoisonOnPanic<'_> {
    fn deref_mut(&mut self) -> &mut Writer {
        &mut self.0
    }
}

/// When changes of delivery state were noted, as the writer's deadlines
/// need them ([`Writer::deadline_given`]).
#[derive(Clone, Copy)]
struct StateTimes {
    /// The oldest change not yet written, if one waits.
    since: Option<u64>,
    /// The last change noted, written or not.
    last: Option<u64>,
    /// Whether the deadline includes the thread's looks at the changes
    /// within [`PRODUCER_WRITING_WITHIN_US`] (the thread about to sleep), or
    /// only their fsync an interval after the first (a producer's batch
    /// asking whether it brought a duty forward: its looks are the
    /// thread's business, and counting them would wake the thread once a
    /// batch).
    look_again: bool,
}

impl StateTimes {
    fn of(table: &crate::state::table::Table, look_again: bool) -> StateTimes {
        StateTimes {
            since: table.unwritten_since_us(),
            last: table.last_noted_us(),
            look_again,
        }
    }
}

/// Answers a request the writer will not serve with `error`.
fn fail(r: Request, error: &Error) {
    match r {
        Request::Append { done, .. } => done.complete(Err(error.clone())),
        Request::Sync { done } => done.complete(Err(error.clone())),
        Request::Reclaim => {}
    }
}

/// The most grace periods an idle writer thread waits (see
/// [`Writer::idle_scale`]); the wait is at most [`IDLE_GRACE_MAX`] whatever
/// the scale.
const IDLE_SCALE_MAX: u32 = 32;

/// Encoded bytes of a request: what it takes of the queue budget and the batch.
pub(crate) fn request_bytes(r: &Request) -> u64 {
    match r {
        Request::Append { ticket, .. } => ticket.bytes(),
        _ => 0,
    }
}

/// Leaves with each append of messages what became of each (its producer
/// reads them once the append is answered).
fn hand_verdicts(batch: &[Request], plans: &mut [Plan]) {
    let appends = batch.iter().filter(|r| matches!(r, Request::Append { .. }));
    for (r, plan) in appends.zip(plans) {
        if let Request::Append { done, .. } = r
            && !matches!(plan.verdicts, Verdicts::None)
        {
            done.set_verdicts(std::mem::take(&mut plan.verdicts));
        }
    }
}

/// How many times the bytes of its tombstones a deletion must free before
/// it goes ahead ([`Writer::hold_deletion`]).
const HOLD_RATIO: u64 = 4;

/// [`HOLD_RATIO`] while space is short: a deletion then frees at least as
/// much again as it writes.
const HOLD_RATIO_SHORT: u64 = 2;

/// The shortest time [`Writer::hold_deletion`]'s answer stands while the
/// segments stay the same.
const HOLD_RECHECK: Duration = Duration::from_secs(1);

/// The bytes of one tombstone in a tombstones frame.
const TOMBSTONE_BYTES: u64 = 32;

/// How short space is, for [`Writer::hold_deletion`].
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Pressure {
    /// Room enough.
    Room,
    /// Under twice the free-disk floor.
    Short,
    /// Under the floor, or the reserve missing: appends are refused.
    Refusing,
}

/// An acknowledged front whose deletion waits ([`Writer::hold_deletion`]).
struct Held {
    /// The front's segments and the log start after them.
    front: (usize, Seq),
    /// The segments in the log when it was decided.
    segments: usize,
    /// How short space was then.
    pressure: Pressure,
    /// When it is weighed again: once enough of its ids have left the
    /// window (within a second when held for space).
    recheck: Instant,
    /// Held because its tombstones do not fit in the space left
    /// ([`Writer::stones_fit`]), not for its ids.
    for_space: bool,
}

impl Held {
    /// Whether the decision still stands for the front `front` of `table`:
    /// nothing was added to the front or the log since.
    fn holds(&self, front: (usize, Seq), table: &Table) -> bool {
        self.front == front && self.segments == table.segment_count()
    }
}

/// Room counted for each tombstones frame's header and padding, for
/// [`Writer::stones_fit`].
const STONES_FRAME_SLACK: u64 = 8 << 10;

/// Room counted for the rest of a deletion's write (its `LogStart` frame,
/// the block of the sync group written again, a checkpoint), for
/// [`Writer::stones_fit`].
const STONES_WRITE_SLACK: u64 = 64 << 10;

/// Tombstones per frame (2 MiB of entries).
const TOMBSTONES_PER_FRAME: usize = 1 << 16;

/// How long an answer of the file system's free space is used before it is
/// asked again (a `statvfs` call).
const FREE_BYTES_EVERY: std::time::Duration = std::time::Duration::from_millis(10);

/// How often the writer tries to make a reserve it could not make for want of
/// space, while appends come (each try creates a file, reserves its space and
/// syncs the directory).
const RESERVE_RETRY_EVERY: std::time::Duration = std::time::Duration::from_millis(100);

/// The most frame bytes one step of relocation copies: the step runs on the
/// writer thread, between two batches, so it is kept short (the next step
/// follows the next batch).
const RELOCATE_BYTES: u64 = 1 << 20;

/// A frame offset within a segment. The option limits keep every segment below
/// 4 GiB (`Options::validate`), so a larger offset is a bug.
fn offset32(offset: u64) -> u32 {
    u32::try_from(offset).expect("segment offsets stay below 4 GiB by the option limits")
}

/// Adds the new active segment to the state table.
fn push_active(shared: &Shared, active: &Active) {
    shared.table.lock().push_segment(SegmentSlots::new(
        active.seg.id,
        active.seg.path.clone(),
        Some(active.seg.file.clone()),
        active.salt,
        FRAMES_AT as u32,
    ));
}

/// Zeros written ahead of the frames, into the active segment's preallocated
/// space, once the frames pass what was written before: four times the batch,
/// at least `ZERO_AHEAD_MIN` and at most `ZERO_AHEAD_MAX` bytes. A block written
/// once is overwritten in place afterwards, so the fdatasync of a later write
/// into it need not also record that unwritten (preallocated) space became
/// written (measured in docs/BENCHMARKS.md, "Zeros written ahead"). The bounds keep the
/// occasional fdatasync that carries the zeros short. Recovery reads zeros after
/// the frames as the clean end of the data, written or not.
const ZERO_AHEAD_MIN: u64 = 256 << 10;
/// See [`ZERO_AHEAD_MIN`].
const ZERO_AHEAD_MAX: u64 = 1 << 20;

/// No zeros are written ahead while writes average this many bytes or more
/// (the moving average `Writer::buf_need`): their frames go straight into
/// preallocated space never written, and each batch's `fdatasync` also
/// records that its blocks are now written, a cost paid once per batch,
/// where zeros ahead would write every byte twice, a cost that grows with
/// the batch (measured in docs/BENCHMARKS.md, "No zeros ahead of large
/// writes"). Writes this large are those of many producers of large
/// records; smaller ones keep the zeros.
const ZEROS_SKIPPED_FROM: u64 = 64 << 10;

/// How long the writer, idle with zeros soon due ([`Writer::zeros_due`]),
/// waits for a request before it writes them ([`Writer::zero_ahead_idle`]):
/// the recent batch `fdatasync` time, at least [`IDLE_GRACE_MIN`] and at most
/// [`IDLE_GRACE_MAX`]. A producer appending as fast as it can is back within
/// microseconds of its answer, so its batches carry the zeros as before; one
/// that pauses longer finds them written and synced, and none of its appends
/// waits for them.
fn idle_grace(shared: &Shared) -> Duration {
    let recent = shared
        .counters
        .fsync_recent_ns
        .load(std::sync::atomic::Ordering::Relaxed);
    Duration::from_nanos(recent).clamp(IDLE_GRACE_MIN, IDLE_GRACE_MAX)
}

/// See [`idle_grace`].
const IDLE_GRACE_MIN: Duration = Duration::from_micros(200);
/// See [`idle_grace`].
const IDLE_GRACE_MAX: Duration = Duration::from_millis(5);

/// The source of the zeros written ahead: one static buffer (zero-filled pages
/// the process never writes), not a fresh megabyte cleared at every open.
static ZEROS: [u8; ZERO_AHEAD_MAX as usize] = [0; ZERO_AHEAD_MAX as usize];

/// The least room [`clear_keeping_room`] leaves.
const ROOM_KEPT: usize = 1024;

/// Empties a scratch list for its next use, and gives back its room when
/// that use took less than a quarter of it: a burst (100,000 buffered
/// appends between two syncs) leaves no peak behind, while steady use
/// keeps its room and allocates nothing.
fn clear_keeping_room<T>(v: &mut Vec<T>) {
    let used = v.len();
    v.clear();
    if v.capacity() > ROOM_KEPT && v.capacity() / 4 > used {
        v.shrink_to(used.max(ROOM_KEPT));
    }
}
