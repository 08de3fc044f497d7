//! The crash harness: runs a workload on a [`SimDisk`], crashes it at every
//! mutating I/O operation in turn with several damage draws, recovers, and checks
//! the invariants. Everything derives from one seed; a failure names the seed,
//! the crash point and the draw, which reproduce it exactly, but for what the
//! writer does on its own clock: rotations by age, batches of concurrent
//! producers, and the zeros an idle writer writes ahead once a step leaves it
//! idle longer than its grace (at least 200 µs; the `Age` steps always do).
//!
//! The invariants (docs/RELIABILITY.md):
//! - I1: every record whose append returned Ok and which the relay did not
//!   acknowledge is recovered, with identical bytes;
//! - I2: nothing is recovered that was never appended, and no garbage;
//! - I3: recovered records are in strictly increasing sequence order;
//! - I4: a strict recovery of a crash (no corruption at rest) opens, and only a
//!   torn tail is cut: nothing is reported dropped;
//! - I5: recovery is idempotent: reopening again finds the same records and
//!   nothing left to repair;
//! - I7: deleting segments never loses a live record (I1 after deletions);
//! - I9: once everything is acknowledged, every sealed segment is deleted
//!   (but those a deletion holds back for the ids it would carry, within
//!   their bound, and deleted by an open with nothing to carry);
//! - I10: a record whose acknowledgement was made durable is never delivered
//!   again;
//! - I11: a dead letter made durable is listed and never delivered;
//! - I12: under `max_attempts`, attempts never decrease;
//! - I13: a record whose delayed release was made durable, or appended with a
//!   not-before time, is not delivered before its delay ends, and is counted
//!   as delayed;
//! - I14: no two records of one ordering key are claimed at once, and a
//!   keyed record is not delivered while an earlier record of its key is
//!   still to deliver (in a run and after every crash);
//! - I16: one deduplication id never yields two records, and an id whose
//!   append was answered Ok is still known after every crash (its append
//!   again is its first record's duplicate);
//! - I17: an append refused by a quota wrote nothing.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::bugs::Bug;
use super::disk::{CrashModel, Fault, FaultRule, Rng, SimDisk};
use crate::error::Error;
use crate::format::seq::Seq;
use crate::log::recovery::RecoveryReport;
use crate::options::{OpenCheck, Options};
use crate::outbox::Outbox;

/// One step of a workload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Append one record of this many bytes (at least 8).
    Append(usize),
    /// Append a batch of this many records of this many bytes each.
    AppendBatch(usize, usize),
    /// Claim up to this many records.
    Claim(usize),
    /// Acknowledge every claimed record, then wait for the writer (deletions).
    AckAll,
    /// Acknowledge the oldest claimed record.
    AckOne,
    /// Release the newest claimed record.
    ReleaseOne,
    /// Park the newest claimed record as a dead letter, then sync.
    DeadLetterOne,
    /// Release the newest claimed record with a delay of an hour (never
    /// reached in a run) and a reason, then sync.
    DelayOne,
    /// Close the outbox and open it again.
    Reopen,
    /// Wait past the segment age, then sync: the writer rotates the active
    /// segment by age in between, if it holds records.
    Age,
    /// Append one record of this many bytes from each of this many threads at
    /// once: the writer may gather them into one batch, in any order.
    Concurrent(usize, usize),
    /// The oldest claimed record stays claimed for the rest of the run, as
    /// by a stuck relay (no acknowledgement step takes it), then sync.
    Hold,
    /// Append one record of this many bytes with this ordering key (of a
    /// few).
    AppendKeyed(usize, u8),
    /// Append one record of this many bytes with this deduplication id (of a
    /// few): the id's first payload again if the id was used before (a
    /// duplicate), a new one otherwise.
    AppendDedup(usize, u8),
    /// Append one record of this many bytes not to be delivered before an
    /// hour from now (never reached in a run).
    AppendDelayed(usize),
    /// Append this many records of this many bytes in one call, each with a
    /// deduplication id never used before: enough ids stay in the window for
    /// a deletion to wait until it frees four times their tombstones.
    AppendFreshIds(usize, usize),
    /// The oldest claimed record's lease runs out (`extend` by zero: the
    /// relay that held it is gone): the next claim hands it out again, ahead
    /// of newer records, as its next attempt.
    LeaseRunsOut,
}

/// A workload: the steps and the options it runs with.
#[derive(Clone, Debug)]
pub struct Workload {
    /// The steps, in order.
    pub steps: Vec<Step>,
    /// Segment size: small, so that the workload rotates and deletes.
    pub segment_bytes: u64,
    /// How recovery reads sealed segments.
    pub open_check: OpenCheck,
    /// Segment age: an hour (never reached), or short where the workload
    /// rotates by age (see [`Workload::with_age_rotation`]).
    pub segment_age: std::time::Duration,
    /// `Options::max_attempts`: set where the workload checks that attempts
    /// survive crashes (see [`Workload::stragglers`]).
    pub max_attempts: Option<u32>,
    /// `Options::max_backlog_records`: set where the workload checks that a
    /// refused append writes nothing.
    pub max_backlog_records: Option<u64>,
    /// `Options::caller_writes`: on for even seeds, off for odd ones, so
    /// that a lone step's append is written both ways, on the stepping
    /// thread and by the writer thread (drawn from the seed, not its random
    /// stream, so that a seed's steps are what they were before the option).
    pub caller_writes: bool,
}

impl Workload {
    /// A random workload of `len` steps.
    pub fn random(seed: u64, len: usize) -> Workload {
        let mut rng = Rng::new(seed);
        let steps = (0..len)
            .map(|_| match rng.below(100) {
                0..=39 => Step::Append(8 + rng.below(400) as usize),
                40..=49 => {
                    Step::AppendBatch(1 + rng.below(4) as usize, 8 + rng.below(200) as usize)
                }
                50..=64 => Step::Claim(1 + rng.below(6) as usize),
                65..=74 => Step::AckAll,
                75..=84 => Step::AckOne,
                85..=88 => Step::ReleaseOne,
                89..=90 => Step::LeaseRunsOut,
                91..=93 => Step::DeadLetterOne,
                94 => Step::DelayOne,
                _ => Step::Reopen,
            })
            .collect();
        let steps = with_producer_fields(steps, &mut rng);
        // A header block and two to five blocks of write batches: rotations
        // come often, in every phase of a workload.
        let segment_bytes = 12288 + 4096 * rng.below(4);
        let open_check = drawn_open_check(&mut rng);
        Workload {
            steps,
            segment_bytes,
            open_check,
            segment_age: std::time::Duration::from_secs(3600),
            max_attempts: None,
            max_backlog_records: Some(40),
            caller_writes: seed.is_multiple_of(2),
        }
    }

    /// A workload decoded from arbitrary bytes (for the fuzzer): two bytes a
    /// step, every kind of step but the timed and threaded ones.
    pub fn from_bytes(data: &[u8]) -> Workload {
        let mut steps = Vec::new();
        for pair in data.chunks(2).take(200) {
            let (op, arg) = (pair[0], usize::from(pair.get(1).copied().unwrap_or(0)));
            steps.push(match op % 16 {
                2 => Step::AppendBatch(1 + arg % 4, 8 + arg),
                3 => Step::Claim(1 + arg % 8),
                4 => Step::AckAll,
                5 => Step::AckOne,
                6 => Step::ReleaseOne,
                7 => Step::Reopen,
                8 => Step::AppendKeyed(8 + arg * 3, (arg % 3) as u8),
                9 => Step::AppendDedup(8 + arg, (arg % 4) as u8),
                10 => Step::AppendDelayed(8 + arg),
                11 => Step::LeaseRunsOut,
                12 => Step::DeadLetterOne,
                13 => Step::DelayOne,
                _ => Step::Append(8 + arg * 3),
            });
        }
        Workload {
            steps,
            segment_bytes: 12288,
            open_check: OpenCheck::SealIndex,
            segment_age: std::time::Duration::from_secs(3600),
            max_attempts: None,
            max_backlog_records: None,
            caller_writes: true,
        }
    }

    /// A random workload of `len` steps whose relay keeps up, save for a few
    /// records it parks as dead letters or holds claimed for ever: the
    /// stragglers that relocation carries forward out of old segments. With
    /// `max_attempts` set (high enough never to park a record), so that every
    /// delivery's attempt is durable before it is handed out.
    pub fn stragglers(seed: u64, len: usize) -> Workload {
        let mut rng = Rng::new(seed);
        let mut steps = Vec::with_capacity(len);
        while steps.len() < len {
            steps.push(match rng.below(10) {
                0..=5 => Step::Append(8 + rng.below(300) as usize),
                _ => Step::AppendBatch(1 + rng.below(4) as usize, 8 + rng.below(200) as usize),
            });
            steps.push(Step::Claim(8));
            match rng.below(20) {
                0..=1 => steps.push(Step::DeadLetterOne),
                2 => steps.push(Step::Hold),
                3 => steps.push(Step::ReleaseOne),
                4 => steps.push(Step::Reopen),
                5 => steps.push(Step::DelayOne),
                6 => steps.push(Step::LeaseRunsOut),
                _ => {}
            }
            steps.push(Step::AckAll);
        }
        steps.truncate(len);
        let steps = with_producer_fields(steps, &mut rng);
        Workload {
            steps,
            // Segments of five to seven blocks: relocation pays only when a
            // segment is well larger than the blocks a copy takes.
            segment_bytes: 24576 + 4096 * rng.below(3),
            open_check: drawn_open_check(&mut rng),
            segment_age: std::time::Duration::from_secs(3600),
            max_attempts: Some(1000),
            max_backlog_records: None,
            caller_writes: seed.is_multiple_of(2),
        }
    }

    /// A random workload of `len` steps whose appends carry deduplication
    /// ids never used before, 16 to 48 records at a time (with, now and
    /// then, one of the four ids used again and again, and a plain append),
    /// each followed by a claim and an acknowledgement of everything, in
    /// segments of three to five blocks: the ids in the window soon take
    /// more than a quarter of what a deletion frees, so that deletions wait
    /// for more to delete with them (`Stats::held_for_ids`), and are crashed
    /// at while they wait and when they go.
    pub fn many_ids(seed: u64, len: usize) -> Workload {
        let mut rng = Rng::new(seed);
        let mut steps = Vec::with_capacity(len + 3);
        while steps.len() < len {
            steps.push(match rng.below(10) {
                0..=6 => {
                    Step::AppendFreshIds(16 + rng.below(33) as usize, 8 + rng.below(40) as usize)
                }
                7 => Step::AppendDedup(8 + rng.below(100) as usize, rng.below(4) as u8),
                _ => Step::Append(8 + rng.below(300) as usize),
            });
            steps.push(Step::Claim(64));
            if rng.below(10) == 0 {
                steps.push(Step::Reopen);
            }
            steps.push(Step::AckAll);
        }
        steps.truncate(len);
        Workload {
            steps,
            segment_bytes: 12288 + 4096 * rng.below(3),
            open_check: drawn_open_check(&mut rng),
            segment_age: std::time::Duration::from_secs(3600),
            max_attempts: None,
            max_backlog_records: None,
            caller_writes: seed.is_multiple_of(2),
        }
    }

    /// A random workload of `len` steps whose appends are large (64 to 128
    /// KiB, alone or two or three at once), in segments of 512 to 896 KiB:
    /// the writer's moving average of its writes passes 64 KiB within a few
    /// of them, so that frames go straight into space never written, with
    /// no zeros ahead, and the few small writes between (acknowledgements, a
    /// dead letter, a delay) bring the zeros back at times: both ways, and
    /// the turns between them, are crashed at.
    pub fn large_writes(seed: u64, len: usize) -> Workload {
        let mut rng = Rng::new(seed);
        let large = |rng: &mut Rng| (64 << 10) + rng.below(64 << 10) as usize;
        let steps = (0..len)
            .map(|_| match rng.below(100) {
                0..=59 => Step::Append(large(&mut rng)),
                60..=69 => Step::AppendBatch(2 + rng.below(2) as usize, large(&mut rng) / 2),
                70..=79 => Step::Claim(1 + rng.below(4) as usize),
                80..=86 => Step::AckAll,
                87..=90 => Step::AckOne,
                91..=92 => Step::ReleaseOne,
                93 => Step::DeadLetterOne,
                94 => Step::DelayOne,
                _ => Step::Reopen,
            })
            .collect();
        let steps = with_producer_fields(steps, &mut rng);
        Workload {
            steps,
            segment_bytes: (512 << 10) + (128 << 10) * rng.below(4),
            open_check: drawn_open_check(&mut rng),
            segment_age: std::time::Duration::from_secs(3600),
            max_attempts: None,
            max_backlog_records: None,
            caller_writes: seed.is_multiple_of(2),
        }
    }

    /// The same workload under a backlog quota of `records`.
    pub fn with_quota(mut self, records: u64) -> Workload {
        self.max_backlog_records = Some(records);
        self
    }

    /// The same workload with a segment age of 10 ms and an [`Step::Age`] after
    /// every tenth step, so that segments are also rotated by age. Drawn from
    /// nothing: the steps of the workload stay those of its seed. The writer's
    /// timer runs on its own thread, so a rotation by age may also fall inside a
    /// slow step: such a workload may not repeat its I/O exactly, though every
    /// run is checked in full.
    pub fn with_age_rotation(mut self) -> Workload {
        self.segment_age = std::time::Duration::from_millis(10);
        let mut steps = Vec::with_capacity(self.steps.len() * 11 / 10 + 1);
        for (i, step) in self.steps.into_iter().enumerate() {
            steps.push(step);
            if i % 10 == 9 {
                steps.push(Step::Age);
            }
        }
        self.steps = steps;
        self
    }

    /// The same workload with every fifth single append made by four producer
    /// threads at once ([`Step::Concurrent`]), so that batches gather several
    /// producers' records. Drawn from nothing, like [`Workload::with_age_rotation`];
    /// how the writer batches the threads' records varies from run to run, so
    /// such a workload may not repeat its I/O exactly, though every run is
    /// checked in full.
    pub fn with_concurrent_producers(mut self) -> Workload {
        let mut appends = 0;
        for step in &mut self.steps {
            if let Step::Append(len) = *step {
                appends += 1;
                if appends % 5 == 0 {
                    *step = Step::Concurrent(4, len);
                }
            }
        }
        self
    }

    /// The options the workload runs with. Index checkpoints at every block
    /// (every sync group that starts past the first block, so that crashes
    /// land around them) where the segment is an even number of blocks, none
    /// where it is odd: both ways of reading the newest segment run.
    fn options(&self, bug: Option<Bug>) -> Options {
        let checkpoint_bytes = if (self.segment_bytes / 4096).is_multiple_of(2) {
            4096
        } else {
            0
        };
        let options = Options::default()
            .segment_bytes(self.segment_bytes)
            .segment_age(self.segment_age)
            .open_check(self.open_check)
            .checkpoint_bytes(checkpoint_bytes)
            .caller_writes(self.caller_writes);
        let options = match self.max_attempts {
            Some(max) => options.max_attempts(max),
            None => options,
        };
        let options = match self.max_backlog_records {
            Some(max) => options.max_backlog_records(max),
            None => options,
        };
        match bug {
            Some(bug) => options.inject_bug(bug),
            None => options,
        }
    }
}

/// How a workload's recoveries read sealed segments: every frame in one
/// workload in four, the seal's index in the others.
fn drawn_open_check(rng: &mut Rng) -> OpenCheck {
    if rng.below(4) == 0 {
        OpenCheck::EveryFrame
    } else {
        OpenCheck::SealIndex
    }
}

/// Turns some single appends of `steps` into appends of messages: one in
/// three keyed (three keys), one in six with a deduplication id (four ids),
/// one in ten with a not-before time.
fn with_producer_fields(mut steps: Vec<Step>, rng: &mut Rng) -> Vec<Step> {
    for step in &mut steps {
        if let Step::Append(len) = *step {
            *step = match rng.below(30) {
                0..=9 => Step::AppendKeyed(len, rng.below(3) as u8),
                10..=14 => Step::AppendDedup(len, rng.below(4) as u8),
                15..=17 => Step::AppendDelayed(len),
                _ => Step::Append(len),
            };
        }
    }
    steps
}

/// An invariant that did not hold, with what reproduces it.
#[derive(Clone, Debug)]
pub struct Violation {
    /// The invariant, e.g. `"I1"`.
    pub invariant: &'static str,
    /// What was wrong.
    pub detail: String,
    /// The workload's seed (or `u64::MAX` for a workload from bytes).
    pub seed: u64,
    /// The mutating operation at which the disk died.
    pub crash_point: u64,
    /// The damage draw.
    pub draw: u64,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} violated (seed {}, crash point {}, draw {}): {}",
            self.invariant, self.seed, self.crash_point, self.draw, self.detail
        )
    }
}

/// Figures of a run of the harness.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Figures {
    /// Crash points explored (workload prefix run, disk crashed there).
    pub crash_points: u64,
    /// Recoveries checked (crash points times damage draws).
    pub recoveries: u64,
    /// Recoveries that were themselves crashed before a final recovery.
    pub crashes_in_recovery: u64,
    /// Recoveries that cut a torn tail.
    pub torn_tails: u64,
    /// Files of interrupted segment creations that recoveries set aside in the
    /// quarantine folder (their header's block garbled by the crash).
    pub quarantined: u64,
    /// Records checked against the model.
    pub records_checked: u64,
    /// Faults injected by the fault loop.
    pub faults: u64,
    /// [`Step::Age`] steps after which a new segment existed: rotations by age.
    pub age_rotations: u64,
    /// [`Step::Concurrent`] steps whose records took fewer batches than threads:
    /// one batch held several producers' records.
    pub shared_batches: u64,
    /// Records relocated (carried forward out of an old segment) while the
    /// workloads ran.
    pub relocated: u64,
    /// Segments written into the file of a deleted one (recycled) while the
    /// workloads ran.
    pub recycled: u64,
    /// Steps after which a deletion was held back for the deduplication ids
    /// it would carry (`Stats::held_for_ids` above 0).
    pub held_steps: u64,
    /// Leases that ran out ([`Step::LeaseRunsOut`]) and whose record was
    /// handed out again in the run, as a later attempt.
    pub leases_expired: u64,
    /// Recoveries after a crash that took frames from index checkpoints.
    pub checkpointed: u64,
    /// Batches of large frames written straight into space never written,
    /// with no zeros ahead, while the workloads ran
    /// ([`DiskStats::large_writes_unzeroed`](crate::sim::disk::DiskStats::large_writes_unzeroed)).
    pub large_writes_unzeroed: u64,
    /// Bits [`bit_rot`] flipped in the newest segment (outside its last
    /// sync group), among [`faults`](Figures::faults).
    pub newest_flips: u64,
    /// Of those, the flips after which the outbox opened and every check
    /// held (in padding, say); the others were refused with `Corrupt`.
    pub newest_harmless: u64,
    /// Bits [`bit_rot`] flipped inside a frame of a sealed segment (a byte
    /// of a frame picked on purpose, where the other draws pick any byte of
    /// the file, most of them padding), among [`faults`](Figures::faults).
    pub frame_flips: u64,
    /// Of those, the flips after which the outbox opened and every check
    /// held (a frame of a record acknowledged before the crash, say, which
    /// no reader needs again); the others were refused with `Corrupt`.
    pub frame_harmless: u64,
}

impl Figures {
    /// Adds another run's figures.
    pub fn add(&mut self, o: &Figures) {
        self.crash_points += o.crash_points;
        self.recoveries += o.recoveries;
        self.crashes_in_recovery += o.crashes_in_recovery;
        self.torn_tails += o.torn_tails;
        self.quarantined += o.quarantined;
        self.records_checked += o.records_checked;
        self.faults += o.faults;
        self.age_rotations += o.age_rotations;
        self.shared_batches += o.shared_batches;
        self.relocated += o.relocated;
        self.recycled += o.recycled;
        self.held_steps += o.held_steps;
        self.leases_expired += o.leases_expired;
        self.checkpointed += o.checkpointed;
        self.large_writes_unzeroed += o.large_writes_unzeroed;
        self.newest_flips += o.newest_flips;
        self.newest_harmless += o.newest_harmless;
        self.frame_flips += o.frame_flips;
        self.frame_harmless += o.frame_harmless;
    }
}

/// The payload of record `id`: its id, its length, then bytes derived from both.
/// Self-checking: [`payload_id`] recognises exactly these.
///
/// One payload in four is hostile, as a producer that controls every byte of
/// a record can make it: after its id and length come well-formed frames (a
/// record, a seal, a log start) under every salt a producer could know (the
/// first segment's and its own id's, under nonces 0 and 1), numbered near
/// 2^62, then bytes dense with the frame magic. Nothing in them may change
/// what recovery decides.
pub fn payload(id: u64, len: usize) -> Vec<u8> {
    let len = len.max(12);
    let mut p = Vec::with_capacity(len);
    p.extend_from_slice(&id.to_le_bytes());
    p.extend_from_slice(&(len as u32).to_le_bytes());
    if id % 4 == 3 {
        hostile_tail(id, len, &mut p);
        return p;
    }
    let start = p.len();
    p.resize(len, 0);
    if let Some(rest) = p.get_mut(start..) {
        let mut words = filler(id);
        for chunk in rest.chunks_mut(8) {
            let word = words.next().unwrap_or(0).to_le_bytes();
            chunk.copy_from_slice(word.get(..chunk.len()).unwrap_or(&[]));
        }
    }
    p
}

/// The bytes of an ordinary payload after its id and length, eight at a
/// time: an endless xorshift stream seeded by the id.
fn filler(id: u64) -> impl Iterator<Item = u64> {
    let mut x = id.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    std::iter::repeat_with(move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    })
}

/// Fills `p` to `len` bytes with forged frames, then the frame magic.
fn hostile_tail(id: u64, len: usize, p: &mut Vec<u8>) {
    use crate::format::frame::FRAME_MAGIC;
    let forged = forged_frames(id);
    let room = len.saturating_sub(p.len());
    p.extend_from_slice(forged.get(..room.min(forged.len())).unwrap_or_default());
    while p.len() < len {
        let k = p.len() % FRAME_MAGIC.len();
        p.push(FRAME_MAGIC.get(k).copied().unwrap_or(0));
    }
}

thread_local! {
    /// The forged frames of hostile payloads, by id. Forging them (twelve
    /// frames, each salted and checksummed) is most of what checking a
    /// hostile payload costs, and the checks meet the same ids at every crash
    /// point of a run; emptied when it holds 4,096 ids.
    static FORGED: std::cell::RefCell<BTreeMap<u64, Arc<[u8]>>> =
        const { std::cell::RefCell::new(BTreeMap::new()) };
}

/// Frames a hostile payload of `id` carries: records, seals and log starts
/// checksummed under the salts of two segments and two nonces, their seqs
/// near the end of the range.
fn forged_frames(id: u64) -> Arc<[u8]> {
    use crate::format::frame::{self, FrameHeader, FrameKind};
    use crate::format::seq::{SEQ_MAX, SegmentId};
    if let Some(known) = FORGED.with(|f| f.borrow().get(&id).cloned()) {
        return known;
    }
    let mut forged = Vec::new();
    for segment in [1, id.max(1)] {
        for nonce in [0, 1] {
            let salt = frame::salt(SegmentId(segment), nonce);
            for kind in [FrameKind::Record, FrameKind::Seal, FrameKind::LogStart] {
                let seq = Seq::from(SEQ_MAX - 1 - id % 7);
                frame::encode(
                    &mut forged,
                    &FrameHeader {
                        kind,
                        batch_end: true,
                        seq,
                        group: seq,
                        timestamp_us: id,
                    },
                    &(SEQ_MAX - 2).to_le_bytes(),
                    salt,
                );
            }
        }
    }
    let forged: Arc<[u8]> = Arc::from(forged);
    FORGED.with(|f| {
        let mut f = f.borrow_mut();
        if f.len() >= 4096 {
            f.clear();
        }
        f.insert(id, Arc::clone(&forged));
    });
    forged
}

/// The id of a payload made by [`payload`], or `None` for any other bytes.
pub fn payload_id(bytes: &[u8]) -> Option<u64> {
    let id = u64::from_le_bytes(bytes.get(..8)?.try_into().ok()?);
    let len = u32::from_le_bytes(bytes.get(8..12)?.try_into().ok()?) as usize;
    if len != bytes.len() {
        return None;
    }
    // Ordinary payloads are compared as they are generated, without a copy:
    // the check runs on every record of every recovery the harness makes.
    let same = if id % 4 == 3 {
        payload(id, len) == bytes
    } else {
        bytes.get(12..).is_some_and(|rest| {
            rest.chunks(8)
                .zip(filler(id))
                .all(|(chunk, word)| word.to_le_bytes().get(..chunk.len()) == Some(chunk))
        })
    };
    same.then_some(id)
}

/// What the workload was told, against which recovery is checked. Every fact
/// carries the disk's operation count when the workload learned it, so that one
/// run yields the model at every crash point.
#[derive(Default, Clone)]
struct Model {
    /// Appends that returned Ok: seq to (payload, operations done by then; the
    /// writer may have done more since, which only makes the check weaker).
    acked: BTreeMap<Seq, (Vec<u8>, u64)>,
    /// Records the relay acknowledged (they may or may not come back), with the
    /// operations done by then.
    consumed: BTreeMap<Seq, u64>,
    /// Records whose acknowledgement was made durable (a `sync` after it
    /// returned Ok), with the operations done by then: never delivered again.
    durably_consumed: BTreeMap<Seq, u64>,
    /// Records parked as dead letters (they may or may not be after a crash).
    dead: BTreeMap<Seq, u64>,
    /// Records parked as dead letters durably (a `sync` after it returned Ok):
    /// never delivered again, always listed.
    durably_dead: BTreeMap<Seq, u64>,
    /// Records released with a delay of an hour (they may or may not be
    /// delayed after a crash).
    delayed: BTreeMap<Seq, u64>,
    /// Records whose delayed release was made durable: never delivered
    /// before the delay ends (not in a run), counted in `Stats::delayed`.
    durably_delayed: BTreeMap<Seq, u64>,
    /// Every payload id ever handed to `append`.
    attempted: BTreeSet<u64>,
    next_id: u64,
    /// Age steps after which a new segment existed.
    age_rotations: u64,
    /// Concurrent steps whose records shared a batch.
    shared_batches: u64,
    /// Each delivery a claim handed out under `max_attempts`: its attempt,
    /// durable before it was handed out, with the operations done by then.
    attempts: BTreeMap<Seq, Vec<(u32, u64)>>,
    /// Records relocated while the workload ran.
    relocated: u64,
    /// Segments recycled while the workload ran.
    recycled: u64,
    /// Steps after which a deletion was held back.
    held_steps: u64,
    /// The ordering key of every keyed payload handed to an append (by
    /// payload id), in doubt or not.
    key_of: BTreeMap<u64, u8>,
    /// The deduplication id of every payload appended with one.
    dedup_of: BTreeMap<u64, u8>,
    /// Each deduplication id's payload (what its appends send).
    dedup_payload: BTreeMap<u8, Vec<u8>>,
    /// The record each deduplication id's append was answered with (written
    /// or duplicate), with the operations done by then.
    dedup_seq: BTreeMap<u8, (Seq, u64)>,
    /// Payloads appended with a not-before time an hour ahead, in doubt or not.
    not_before: BTreeSet<u64>,
    /// Payloads whose append a quota refused: never written.
    refused: BTreeSet<u64>,
    /// Records whose lease ran out in the run, with the attempt they were
    /// handed out as: their next delivery must be a later attempt.
    lapsed: BTreeMap<Seq, u32>,
    /// Records handed out again after their lease ran out.
    leases_expired: u64,
}

impl Model {
    /// A new payload of `len` bytes, with its id, counted as attempted.
    fn new_payload(&mut self, len: usize) -> (u64, Vec<u8>) {
        let id = self.next_id;
        self.next_id += 1;
        self.attempted.insert(id);
        (id, payload(id, len))
    }

    /// Records that the append of `p` returned `seq` when the disk had done
    /// `ops` operations.
    fn record(&mut self, seq: Seq, p: Vec<u8>, ops: u64) -> Result<(), String> {
        if self.acked.insert(seq, (p, ops)).is_some() {
            return Err(format!("seq {seq} assigned twice"));
        }
        Ok(())
    }

    /// What the workload knew when the disk had done `ops` operations.
    fn at(&self, ops: u64) -> Model {
        Model {
            acked: self
                .acked
                .iter()
                .filter(|(_, (_, at))| *at <= ops)
                .map(|(s, v)| (*s, v.clone()))
                .collect(),
            consumed: learned_by(&self.consumed, ops),
            durably_consumed: learned_by(&self.durably_consumed, ops),
            dead: learned_by(&self.dead, ops),
            durably_dead: learned_by(&self.durably_dead, ops),
            delayed: learned_by(&self.delayed, ops),
            durably_delayed: learned_by(&self.durably_delayed, ops),
            attempted: self.attempted.clone(),
            next_id: self.next_id,
            age_rotations: self.age_rotations,
            shared_batches: self.shared_batches,
            attempts: self
                .attempts
                .iter()
                .filter_map(|(s, seen)| {
                    let seen: Vec<(u32, u64)> =
                        seen.iter().filter(|(_, at)| *at <= ops).copied().collect();
                    (!seen.is_empty()).then_some((*s, seen))
                })
                .collect(),
            relocated: self.relocated,
            recycled: self.recycled,
            held_steps: self.held_steps,
            key_of: self.key_of.clone(),
            dedup_of: self.dedup_of.clone(),
            dedup_payload: self.dedup_payload.clone(),
            dedup_seq: self
                .dedup_seq
                .iter()
                .filter(|(_, (_, at))| *at <= ops)
                .map(|(d, v)| (*d, *v))
                .collect(),
            not_before: self.not_before.clone(),
            refused: self.refused.clone(),
            lapsed: BTreeMap::new(),
            leases_expired: self.leases_expired,
        }
    }

    /// The ordering key of the record with these bytes, if it has one.
    fn key(&self, bytes: &[u8]) -> Option<u8> {
        payload_id(bytes).and_then(|id| self.key_of.get(&id).copied())
    }
}

/// The entries of `facts` (seq to the operations done when the workload
/// learned it) learned by `ops` operations.
fn learned_by(facts: &BTreeMap<Seq, u64>, ops: u64) -> BTreeMap<Seq, u64> {
    facts
        .iter()
        .filter(|(_, at)| **at <= ops)
        .map(|(s, at)| (*s, *at))
        .collect()
}

const DIR: &str = "/outbox";

fn dir() -> PathBuf {
    PathBuf::from(DIR)
}

fn open(disk: &SimDisk, options: Options) -> Result<Outbox, Error> {
    let storage = super::bugs::storage_for(Arc::new(disk.clone()), &options);
    Outbox::open_with_storage(dir(), options, storage)
}

/// Why a workload run stopped.
enum Stop {
    /// It ran to the end.
    Done,
    /// The disk died (crash point) or a fault poisoned the outbox.
    Failed,
}

/// Runs `workload` on `disk`, recording in `model` what it was told. Stops at the
/// first error once the disk is dead or a fault fired.
fn execute(
    disk: &SimDisk,
    w: &Workload,
    options: &Options,
    model: &mut Model,
) -> Result<Stop, String> {
    execute_rotting(disk, w, options, model, 0)
}

/// Like [`execute`], with reads rotting at `rot` percent while the outbox is
/// open (not during recovery: a rotten read there is another fault model).
fn execute_rotting(
    disk: &SimDisk,
    w: &Workload,
    options: &Options,
    model: &mut Model,
    rot: u64,
) -> Result<Stop, String> {
    let Ok(outbox) = open(disk, options.clone()) else {
        return Ok(Stop::Failed);
    };
    disk.rot_reads(rot);
    disk.fail_reads(rot / 4);
    let mut run = Run {
        disk,
        options,
        model,
        outbox,
        claimed: Vec::new(),
        held: Vec::new(),
        attempt_of: BTreeMap::new(),
        rot,
    };
    for step in &w.steps {
        let failed = match run.step(step)? {
            Some(failed) => failed,
            None => return Ok(Stop::Failed),
        };
        if failed {
            if disk.is_dead() || disk.stats().faults_injected > 0 {
                let _ = run.outbox.close();
                return Ok(Stop::Failed);
            }
            return Err(format!("step {step:?} failed on a healthy disk"));
        }
        run.model.held_steps += u64::from(run.outbox.stats().held_for_ids > 0);
    }
    run.model.relocated += run.outbox.stats().relocated;
    run.model.recycled += run.outbox.stats().segments_recycled;
    let _ = run.outbox.close();
    disk.rot_reads(0);
    disk.fail_reads(0);
    Ok(Stop::Done)
}

/// The model's two maps of one way of parking records: parked, and parked
/// durably (seq to the operations done by then).
type ParkedMaps<'a> = (&'a mut BTreeMap<Seq, u64>, &'a mut BTreeMap<Seq, u64>);

/// One workload running against an open outbox.
struct Run<'a> {
    disk: &'a SimDisk,
    options: &'a Options,
    model: &'a mut Model,
    outbox: Outbox,
    /// Records claimed and not yet acknowledged or released.
    claimed: Vec<Seq>,
    /// Records claimed and held for the rest of the run ([`Step::Hold`]).
    held: Vec<Seq>,
    /// The attempt each record was last handed out as.
    attempt_of: BTreeMap<Seq, u32>,
    rot: u64,
}

impl Run<'_> {
    /// Runs one step: `Some(failed)`, or `None` when the run must stop (a
    /// reopen failed); `Err` for a violation seen on the way.
    fn step(&mut self, step: &Step) -> Result<Option<bool>, String> {
        let failed = match step {
            Step::Append(len) => {
                let (id, p) = self.model.new_payload(*len);
                match self.outbox.append(&p) {
                    Ok(seq) => {
                        self.model.record(seq, p, self.disk.ops())?;
                        false
                    }
                    Err(Error::QuotaExceeded { .. }) => {
                        self.model.refused.insert(id);
                        false
                    }
                    Err(_) => true,
                }
            }
            Step::AppendBatch(n, len) => {
                let payloads: Vec<Vec<u8>> =
                    (0..*n).map(|_| self.model.new_payload(*len).1).collect();
                match self.outbox.append_batch(&payloads) {
                    Ok(seqs) => {
                        let at = self.disk.ops();
                        for (seq, p) in seqs.into_iter().zip(payloads) {
                            self.model.acked.insert(seq, (p, at));
                        }
                        false
                    }
                    Err(Error::QuotaExceeded { .. }) => {
                        self.model
                            .refused
                            .extend(payloads.iter().filter_map(|p| payload_id(p)));
                        false
                    }
                    Err(_) => true,
                }
            }
            Step::AppendFreshIds(n, len) => self.append_fresh_ids(*n, *len)?,
            Step::Claim(n) => self.claim(*n)?,
            // An acknowledgement counts from the operation count *before* it: the
            // writer may start deleting segments before this thread looks again.
            Step::AckAll => {
                let at = self.disk.ops();
                let acked: Vec<Seq> = std::mem::take(&mut self.claimed);
                let failed = self.outbox.ack_many(&acked).is_err();
                if failed {
                    self.claimed = acked;
                    true
                } else {
                    self.model.consumed.extend(acked.iter().map(|&s| (s, at)));
                    self.made_durable(&acked)
                }
            }
            Step::AckOne => match self.claimed.first().copied() {
                Some(seq) => {
                    let at = self.disk.ops();
                    let failed = self.outbox.ack(seq).is_err();
                    if failed {
                        true
                    } else {
                        self.claimed.remove(0);
                        self.model.consumed.insert(seq, at);
                        self.made_durable(&[seq])
                    }
                }
                None => false,
            },
            Step::Concurrent(threads, len) => self.concurrent(*threads, *len)?,
            Step::Age => {
                let newest = || segment_names(self.disk).into_iter().max();
                let before = newest();
                std::thread::sleep(self.options.segment_age + std::time::Duration::from_millis(10));
                let failed = self.outbox.sync().is_err();
                if !failed && newest() > before {
                    self.model.age_rotations += 1;
                }
                failed
            }
            Step::ReleaseOne => match self.claimed.pop() {
                Some(seq) => self.outbox.release(seq).is_err(),
                None => false,
            },
            Step::DeadLetterOne => self.park_newest(
                |o, seq| o.dead_letter(seq, "refused by the harness"),
                |m| (&mut m.dead, &mut m.durably_dead),
            ),
            Step::DelayOne => self.park_newest(
                |o, seq| o.release_after(seq, std::time::Duration::from_secs(3600), "later"),
                |m| (&mut m.delayed, &mut m.durably_delayed),
            ),
            Step::Hold => {
                if !self.claimed.is_empty() {
                    let seq = self.claimed.remove(0);
                    self.held.push(seq);
                }
                self.outbox.sync().is_err()
            }
            Step::Reopen => return Ok(self.reopen().then_some(false)),
            Step::AppendKeyed(len, key) => {
                let (id, p) = self.model.new_payload(*len);
                self.model.key_of.insert(id, *key);
                let outcome = self
                    .outbox
                    .append_message(&crate::Message::new(&p).key(&[b'k', *key]));
                self.appended(id, p, outcome)?
            }
            Step::AppendDelayed(len) => {
                let (id, p) = self.model.new_payload(*len);
                self.model.not_before.insert(id);
                let outcome = self.outbox.append_message(
                    &crate::Message::new(&p).delay(std::time::Duration::from_secs(3600)),
                );
                self.appended(id, p, outcome)?
            }
            Step::AppendDedup(len, d) => self.append_dedup(*len, *d)?,
            Step::LeaseRunsOut => {
                if self.claimed.is_empty() {
                    false
                } else {
                    let seq = self.claimed.remove(0);
                    let attempt = self.attempt_of.get(&seq).copied().unwrap_or(1);
                    match self.outbox.extend(seq, std::time::Duration::ZERO) {
                        Ok(()) => {
                            self.model.lapsed.insert(seq, attempt);
                            false
                        }
                        Err(_) => true,
                    }
                }
            }
        };
        Ok(Some(failed))
    }

    /// Notes the outcome of the append of the new payload `id` (`p`) as a
    /// message; returns whether it failed.
    fn appended(
        &mut self,
        id: u64,
        p: Vec<u8>,
        outcome: crate::Result<crate::Appended>,
    ) -> Result<bool, String> {
        match outcome {
            Ok(a) if !a.duplicate => {
                self.model.record(a.seq, p, self.disk.ops())?;
                Ok(false)
            }
            Ok(a) => Err(format!(
                "a new payload was answered as a duplicate of {}",
                a.seq
            )),
            Err(Error::QuotaExceeded { .. }) => {
                self.model.refused.insert(id);
                Ok(false)
            }
            Err(_) => Ok(true),
        }
    }

    /// Appends the payload of the deduplication id `d` with that id (a new
    /// payload the first time). I16: once an append of the id was answered,
    /// every later one is answered with the same record, as a duplicate.
    fn append_dedup(&mut self, len: usize, d: u8) -> Result<bool, String> {
        let p = match self.model.dedup_payload.get(&d) {
            Some(p) => p.clone(),
            None => {
                let (id, p) = self.model.new_payload(len);
                self.model.dedup_of.insert(id, d);
                self.model.dedup_payload.insert(d, p.clone());
                p
            }
        };
        let outcome = self
            .outbox
            .append_message(&crate::Message::new(&p).dedup_id(&[b'd', d]));
        let a = match outcome {
            Ok(a) => a,
            // The payload may be written by a later append of the id: it is
            // not marked refused.
            Err(Error::QuotaExceeded { .. }) => return Ok(false),
            Err(_) => return Ok(true),
        };
        let at = self.disk.ops();
        match self.model.dedup_seq.get(&d) {
            Some(&(seq, _)) if a.seq != seq || !a.duplicate => Err(format!(
                "I16: deduplication id {d} answered {a:?} after it was appended as record {seq}"
            )),
            Some(_) => Ok(false),
            None => {
                if !self.model.acked.contains_key(&a.seq) {
                    self.model.record(a.seq, p, at)?;
                }
                self.model.dedup_seq.insert(d, (a.seq, at));
                Ok(false)
            }
        }
    }

    /// Appends `n` records of `len` bytes in one call, each with an id of
    /// its own never used before (its payload's number): each is new.
    fn append_fresh_ids(&mut self, n: usize, len: usize) -> Result<bool, String> {
        let made: Vec<(u64, Vec<u8>)> = (0..n).map(|_| self.model.new_payload(len)).collect();
        let ids: Vec<[u8; 9]> = made
            .iter()
            .map(|(id, _)| {
                let mut name = [b'f'; 9];
                name[1..].copy_from_slice(&id.to_le_bytes());
                name
            })
            .collect();
        let messages: Vec<crate::Message<'_>> = made
            .iter()
            .zip(&ids)
            .map(|((_, p), id)| crate::Message::new(p).dedup_id(id))
            .collect();
        let answers = match self.outbox.append_messages(&messages) {
            Ok(answers) => answers,
            Err(Error::QuotaExceeded { .. }) => {
                self.model.refused.extend(made.iter().map(|(id, _)| *id));
                return Ok(false);
            }
            Err(_) => return Ok(true),
        };
        let at = self.disk.ops();
        for (a, (_, p)) in answers.into_iter().zip(made) {
            if a.duplicate {
                return Err(format!(
                    "I16: a deduplication id never used before answered {a:?}"
                ));
            }
            self.model.record(a.seq, p, at)?;
        }
        Ok(false)
    }

    /// Parks the newest claimed record with `park` (a dead letter, a long
    /// delay), then syncs: the model learns it as parked, then as durably
    /// parked, in the two maps `maps` picks. Returns whether a call failed.
    fn park_newest(
        &mut self,
        park: impl FnOnce(&Outbox, Seq) -> crate::Result<()>,
        maps: fn(&mut Model) -> ParkedMaps<'_>,
    ) -> bool {
        let Some(seq) = self.claimed.pop() else {
            return false;
        };
        let at = self.disk.ops();
        if park(&self.outbox, seq).is_err() {
            return true;
        }
        maps(self.model).0.insert(seq, at);
        if self.outbox.sync().is_err() {
            return true;
        }
        let at = self.disk.ops();
        maps(self.model).1.insert(seq, at);
        false
    }

    /// Makes the acknowledgements of `seqs` durable with a `sync`; once it
    /// returned Ok, those records must never be delivered again. Returns
    /// whether the sync failed.
    fn made_durable(&mut self, seqs: &[Seq]) -> bool {
        if self.outbox.sync().is_err() {
            return true;
        }
        let at = self.disk.ops();
        self.model
            .durably_consumed
            .extend(seqs.iter().map(|&s| (s, at)));
        false
    }

    /// Claims up to `n` records and checks each against what was appended.
    fn claim(&mut self, n: usize) -> Result<bool, String> {
        match self.outbox.claim(n) {
            Ok(records) => {
                for r in &records {
                    if payload_id(r.payload()).is_none() {
                        return Err(format!("claim returned garbage as record {}", r.seq()));
                    }
                    if let Some((p, _)) = self.model.acked.get(&r.seq())
                        && p.as_slice() != r.payload()
                    {
                        return Err(format!("claim returned other bytes for record {}", r.seq()));
                    }
                    let id = payload_id(r.payload());
                    if self.model.delayed.contains_key(&r.seq())
                        || id.is_some_and(|id| self.model.not_before.contains(&id))
                    {
                        return Err(format!(
                            "claim returned record {} during its delay of an hour",
                            r.seq()
                        ));
                    }
                    if id.is_some_and(|id| self.model.refused.contains(&id)) {
                        return Err(format!(
                            "I17: claim returned record {}, whose append a quota refused",
                            r.seq()
                        ));
                    }
                    if let Some(k) = self.model.key(r.payload()) {
                        self.check_key_order(r.seq(), k)?;
                    }
                    if let Some(before) = self.model.lapsed.remove(&r.seq()) {
                        if r.attempt() <= before {
                            return Err(format!(
                                "record {} handed out as attempt {} after its lease ran out on attempt {before}",
                                r.seq(),
                                r.attempt()
                            ));
                        }
                        self.model.leases_expired += 1;
                    }
                    self.attempt_of.insert(r.seq(), r.attempt());
                    if self.options.max_attempts.is_some() {
                        let at = self.disk.ops();
                        let seen = self.model.attempts.entry(r.seq()).or_default();
                        if seen.iter().any(|&(a, _)| a >= r.attempt()) {
                            return Err(format!(
                                "record {} delivered as attempt {} after attempt {:?}",
                                r.seq(),
                                r.attempt(),
                                seen.last()
                            ));
                        }
                        seen.push((r.attempt(), at));
                    }
                    self.claimed.push(r.seq());
                }
                Ok(false)
            }
            // A rotten or failed read fails the claim, and releases what it
            // claimed: the queue goes on.
            Err(Error::Corrupt { .. } | Error::Io { .. })
                if self.rot > 0 || self.disk.stats().faults_injected > 0 =>
            {
                Ok(false)
            }
            Err(_) => Ok(true),
        }
    }

    /// I14 in a run: the record `seq` of key `k`, just claimed, is the only
    /// one of its key claimed (or held), and no earlier record of its key is
    /// still to deliver (appended, not acknowledged, not a dead letter).
    fn check_key_order(&self, seq: Seq, k: u8) -> Result<(), String> {
        let key_of_seq = |s: &Seq| self.model.acked.get(s).and_then(|(p, _)| self.model.key(p));
        if let Some(other) = self
            .claimed
            .iter()
            .chain(&self.held)
            .find(|s| key_of_seq(s) == Some(k))
        {
            return Err(format!(
                "I14: record {seq} of key {k} claimed while record {other} of the key is"
            ));
        }
        // Reads that rot set records aside (done, as corrupt) without the
        // model knowing: the turn then passes on. Only the first check holds.
        if self.rot > 0 {
            return Ok(());
        }
        let earlier = self.model.acked.range(..seq).find(|(s, (p, _))| {
            self.model.key(p) == Some(k)
                && !self.model.consumed.contains_key(s)
                && !self.model.dead.contains_key(s)
        });
        if let Some((s, _)) = earlier {
            return Err(format!(
                "I14: record {seq} of key {k} delivered while the earlier record {s} of the key waits"
            ));
        }
        Ok(())
    }

    /// Appends one record from each of `threads` threads at once.
    fn concurrent(&mut self, threads: usize, len: usize) -> Result<bool, String> {
        let (ids, payloads): (Vec<_>, Vec<Vec<u8>>) =
            (0..threads).map(|_| self.model.new_payload(len)).unzip();
        let batches = self.outbox.stats().batches;
        let results: Vec<Result<Seq, Error>> = std::thread::scope(|scope| {
            let outbox = &self.outbox;
            let handles: Vec<_> = payloads
                .iter()
                .map(|p| scope.spawn(move || outbox.append(p)))
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or(Err(Error::Closed)))
                .collect()
        });
        // Stamped after every thread returned: later than each append became
        // durable, which only makes the check weaker.
        let at = self.disk.ops();
        if self.outbox.stats().batches - batches < threads as u64 {
            self.model.shared_batches += 1;
        }
        let mut failed = false;
        for ((id, p), r) in ids.into_iter().zip(payloads).zip(results) {
            match r {
                Ok(seq) => self.model.record(seq, p, at)?,
                // The backlog quota refuses some of them when the others
                // filled it: refused, written nowhere, as a single append's.
                Err(Error::QuotaExceeded { .. }) => {
                    self.model.refused.insert(id);
                }
                Err(_) => failed = true,
            }
        }
        Ok(failed)
    }

    /// Closes and reopens the outbox (reads healthy while it recovers);
    /// whether both succeeded.
    fn reopen(&mut self) -> bool {
        self.model.relocated += self.outbox.stats().relocated;
        self.model.recycled += self.outbox.stats().segments_recycled;
        let closed = self.outbox.close();
        self.claimed.clear();
        // Leases and attempts live in memory (without `max_attempts`).
        self.model.lapsed.clear();
        self.attempt_of.clear();
        self.held.clear();
        self.disk.rot_reads(0);
        self.disk.fail_reads(0);
        let reopened = open(self.disk, self.options.clone());
        self.disk.rot_reads(self.rot);
        self.disk.fail_reads(self.rot / 4);
        match (closed, reopened) {
            (Ok(()), Ok(o)) => {
                self.outbox = o;
                true
            }
            _ => false,
        }
    }
}

/// What one checked recovery did.
#[derive(Clone, Copy)]
struct Verified {
    /// Records checked.
    records: u64,
    /// A torn tail was cut.
    torn: bool,
    /// Files of interrupted creations set aside (garbled headers).
    quarantined: u64,
    /// The open took frames from index checkpoints.
    checkpointed: bool,
}

/// Opens the disk after a crash and checks every invariant.
fn verify(
    disk: &SimDisk,
    options: &Options,
    model: &Model,
) -> Result<Verified, (&'static str, String)> {
    verify_with(disk, options, model, true)
}

/// [`verify`]; `again` also checks I5 and I9, which take a second recovery.
fn verify_with(
    disk: &SimDisk,
    options: &Options,
    model: &Model,
    again: bool,
) -> Result<Verified, (&'static str, String)> {
    let outbox = open(disk, options.clone())
        .map_err(|e| ("I4", format!("strict recovery refused to open: {e}")))?;
    let report = outbox.recovery_report().clone();
    if let Some(d) = &report.dropped {
        return Err(("I4", format!("recovery dropped records: {d:?}")));
    }
    // A strict open sets aside only files of interrupted creations and
    // recyclings (a header's block the crash garbled), which held no live
    // record (the records are checked below all the same).
    if let Some(q) = report.quarantined.iter().find(|q| {
        !matches!(
            q.reason,
            crate::QuarantineReason::UnfinishedCreation
                | crate::QuarantineReason::UnfinishedRecycling
        )
    }) {
        return Err(("I4", format!("strict recovery set aside {q:?}")));
    }
    let (records, attempts) =
        drain_attempts(&outbox).map_err(|e| ("I2", format!("claim failed after recovery: {e}")))?;
    if options.max_attempts.is_some() {
        check_attempts(&attempts, model)?;
    }
    let dead: BTreeMap<Seq, Vec<u8>> = outbox
        .dead_letters(usize::MAX)
        .map_err(|e| {
            (
                "I2",
                format!("listing dead letters failed after recovery: {e}"),
            )
        })?
        .iter()
        .map(|d| (d.seq(), d.payload().to_vec()))
        .collect();
    let keys = Keys::new(&records, model);
    check_records(&records, &dead, model, &keys)?;
    let behind = check_producer_fields(&records, &dead, model, &keys)?;
    check_delayed(&records, &dead, model, outbox.stats().delayed, &behind)?;
    let verified = Verified {
        records: records.len() as u64,
        torn: report.torn_tail.is_some(),
        checkpointed: report.frames_from_checkpoints > 0,
        quarantined: report.quarantined.len() as u64,
    };
    if !again {
        drop(outbox);
        return Ok(verified);
    }
    outbox
        .close()
        .map_err(|e| ("I5", format!("close after recovery failed: {e}")))?;
    check_ids_known(disk, options, model)?;
    recover_again(disk, options, &records)?;
    Ok(verified)
}

/// I1 to I3 on the records a recovery handed out: in order, each a payload the
/// workload wrote, none twice, every acknowledged append there unless the relay
/// acknowledged it.
fn check_records(
    records: &[(Seq, Vec<u8>)],
    dead: &BTreeMap<Seq, Vec<u8>>,
    model: &Model,
    keys: &Keys,
) -> Result<(), (&'static str, String)> {
    // I11: a dead letter is one the workload parked, with its bytes; one
    // parked durably is listed, and never delivered.
    for (seq, bytes) in dead {
        if !model.dead.contains_key(seq) {
            return Err((
                "I11",
                format!("record {seq} is a dead letter nobody parked"),
            ));
        }
        if model.acked.get(seq).is_some_and(|(p, _)| p != bytes) {
            return Err(("I11", format!("dead letter {seq} has other bytes")));
        }
    }
    for seq in model.durably_dead.keys() {
        if !dead.contains_key(seq) {
            return Err(("I11", format!("durable dead letter {seq} is not listed")));
        }
        if records.iter().any(|r| r.0 == *seq) {
            return Err(("I11", format!("durable dead letter {seq} was delivered")));
        }
    }
    let mut seen = BTreeSet::new();
    let mut ids = BTreeSet::new();
    let mut last = Seq::from(0);
    for (seq, bytes) in records {
        if *seq <= last {
            return Err(("I3", format!("record {seq} after record {last}")));
        }
        last = *seq;
        let Some(id) = payload_id(bytes) else {
            return Err((
                "I2",
                format!("record {seq} is not a payload the workload wrote"),
            ));
        };
        if !ids.insert(id) {
            return Err((
                "I3",
                format!("payload {id} recovered twice, again as record {seq}"),
            ));
        }
        if !model.attempted.contains(&id) {
            return Err((
                "I2",
                format!("record {seq} holds payload {id}, never appended"),
            ));
        }
        if let Some((p, _)) = model.acked.get(seq)
            && p != bytes
        {
            return Err(("I1", format!("record {seq} came back with other bytes")));
        }
        if model.durably_consumed.contains_key(seq) {
            return Err((
                "I10",
                format!("record {seq} delivered again after its acknowledgement was made durable"),
            ));
        }
        seen.insert(*seq);
    }
    for (seq, (p, _)) in &model.acked {
        if !model.consumed.contains_key(seq)
            && !seen.contains(seq)
            && !dead.contains_key(seq)
            && !model.delayed.contains_key(seq)
            && !payload_id(p).is_some_and(|id| model.not_before.contains(&id))
            && !held_by_key(*seq, keys, model)
        {
            return Err(("I1", format!("acknowledged append {seq} lost")));
        }
    }
    Ok(())
}

/// The keys of the payloads one check reads, each found once: a key is read
/// from a payload checked whole ([`payload_id`]), and the checks below ask for
/// the key of every acknowledged append against every record handed out.
struct Keys {
    /// The records handed out, in order, with their keys.
    records: Vec<(Seq, Option<u8>)>,
    /// The key of each acknowledged append that has one.
    acked: BTreeMap<Seq, u8>,
}

impl Keys {
    fn new(records: &[(Seq, Vec<u8>)], model: &Model) -> Keys {
        Keys {
            records: records.iter().map(|(s, b)| (*s, model.key(b))).collect(),
            acked: model
                .acked
                .iter()
                .filter_map(|(s, (p, _))| Some((*s, model.key(p)?)))
                .collect(),
        }
    }
}

/// Whether the acknowledged append `seq` may be held back by its key: an
/// earlier record of its key was delivered by the recovery's drain (which
/// acknowledges nothing), or waits out a delay.
fn held_by_key(seq: Seq, keys: &Keys, model: &Model) -> bool {
    let Some(&k) = keys.acked.get(&seq) else {
        return false;
    };
    keys.records
        .iter()
        .any(|(s, key)| *s < seq && *key == Some(k))
        || model
            .delayed
            .range(..seq)
            .any(|(s, _)| keys.acked.get(s) == Some(&k))
}

/// I14, I16 and I17 on what a recovery handed out (`records`, drained
/// without acknowledging anything) and the dead letters it lists: at most
/// one record of a key handed out, and none while an earlier record of its
/// key is certainly still to deliver; at most one record per deduplication
/// id, the one its append was answered with; no record whose append a quota
/// refused. Returns the records held back by their key (I1 excused them).
fn check_producer_fields(
    records: &[(Seq, Vec<u8>)],
    dead: &BTreeMap<Seq, Vec<u8>>,
    model: &Model,
    keys: &Keys,
) -> Result<BTreeSet<Seq>, (&'static str, String)> {
    let mut heads: BTreeMap<u8, Seq> = BTreeMap::new();
    let mut ids: BTreeMap<u8, Seq> = BTreeMap::new();
    for &(seq, key) in &keys.records {
        if let Some(k) = key {
            if let Some(other) = heads.insert(k, seq) {
                return Err((
                    "I14",
                    format!("records {other} and {seq} of key {k} handed out at once"),
                ));
            }
            let earlier = keys.acked.range(..seq).find(|(s, key)| {
                **key == k
                    && !model.consumed.contains_key(s)
                    && !model.dead.contains_key(s)
                    && !model.delayed.contains_key(s)
            });
            if let Some((s, _)) = earlier {
                return Err((
                    "I14",
                    format!("record {seq} of key {k} handed out before the earlier record {s}"),
                ));
            }
        }
    }
    let everything = records
        .iter()
        .map(|(s, b)| (s, b.as_slice()))
        .chain(dead.iter().map(|(s, b)| (s, b.as_slice())));
    for (seq, bytes) in everything {
        let Some(id) = payload_id(bytes) else {
            continue;
        };
        if model.refused.contains(&id) {
            return Err((
                "I17",
                format!("record {seq} was written by an append a quota refused"),
            ));
        }
        let Some(&d) = model.dedup_of.get(&id) else {
            continue;
        };
        if let Some(other) = ids.insert(d, *seq)
            && other != *seq
        {
            return Err((
                "I16",
                format!("deduplication id {d} yielded records {other} and {seq}"),
            ));
        }
        if let Some(&(first, _)) = model.dedup_seq.get(&d)
            && first != *seq
        {
            return Err((
                "I16",
                format!("deduplication id {d} answered {first}, record {seq} holds its payload"),
            ));
        }
    }
    Ok(keys
        .acked
        .keys()
        .filter(|s| held_by_key(**s, keys, model))
        .copied()
        .collect())
}

/// I16 after a crash: every deduplication id whose append was answered is
/// still known: appended again (on a copy of the disk) it is answered with
/// the same record, as a duplicate, even if that record was acknowledged
/// and deleted since.
fn check_ids_known(
    disk: &SimDisk,
    options: &Options,
    model: &Model,
) -> Result<(), (&'static str, String)> {
    if model.dedup_seq.is_empty() {
        return Ok(());
    }
    let copy = disk.fork(0x16);
    let outbox = open(&copy, options.clone())
        .map_err(|e| ("I16", format!("reopen of a copy failed: {e}")))?;
    for (&d, &(seq, _)) in &model.dedup_seq {
        let Some(p) = model.dedup_payload.get(&d) else {
            continue;
        };
        let a = outbox
            .append_message(&crate::Message::new(p).dedup_id(&[b'd', d]))
            .map_err(|e| ("I16", format!("append of id {d} again failed: {e}")))?;
        if a.seq != seq || !a.duplicate {
            return Err((
                "I16",
                format!("deduplication id {d} (record {seq}) forgotten after a crash: {a:?}"),
            ));
        }
    }
    let _ = outbox.close();
    Ok(())
}

/// I13: a record whose delayed release was made durable is not delivered
/// before its delay ends (an hour: never in a run), and every record neither
/// delivered, acknowledged nor dead is held back as delayed, one the
/// workload released with a delay (I1 for delayed records): the outbox counts
/// at least those.
fn check_delayed(
    records: &[(Seq, Vec<u8>)],
    dead: &BTreeMap<Seq, Vec<u8>>,
    model: &Model,
    delayed: u64,
    behind: &BTreeSet<Seq>,
) -> Result<(), (&'static str, String)> {
    let seen: BTreeSet<Seq> = records.iter().map(|r| r.0).collect();
    if let Some(seq) = model.durably_delayed.keys().find(|s| seen.contains(s)) {
        return Err((
            "I13",
            format!("record {seq} delivered before the end of its durable delay"),
        ));
    }
    if let Some((seq, _)) = records
        .iter()
        .find(|(_, b)| payload_id(b).is_some_and(|id| model.not_before.contains(&id)))
    {
        return Err((
            "I13",
            format!("record {seq} delivered before its not-before time"),
        ));
    }
    let held = model
        .acked
        .keys()
        .filter(|s| {
            !model.consumed.contains_key(s)
                && !seen.contains(s)
                && !dead.contains_key(s)
                && !behind.contains(s)
        })
        .count() as u64;
    // A record whose append was in doubt (not in `acked`) may have been
    // claimed after a reopen and delayed too: the count may be higher, never
    // higher than the delays the workload asked for.
    let asked = (model.delayed.len() + model.not_before.len()) as u64;
    if held > delayed || delayed > asked {
        return Err((
            "I13",
            format!(
                "{held} records held back by a delay, the outbox counts {delayed}, \
                 the workload delayed {}",
                model.delayed.len()
            ),
        ));
    }
    Ok(())
}

/// I5: a second recovery finds the same `records` and nothing to repair. I9:
/// once everything is acknowledged, every sealed segment goes, but those a
/// deletion holds back for the deduplication ids it would carry.
fn recover_again(
    disk: &SimDisk,
    options: &Options,
    records: &[(Seq, Vec<u8>)],
) -> Result<(), (&'static str, String)> {
    let seqs: Vec<Seq> = records.iter().map(|r| r.0).collect();
    let again =
        open(disk, options.clone()).map_err(|e| ("I5", format!("second recovery refused: {e}")))?;
    let second = again.recovery_report().clone();
    if second.torn_tail.is_some() || second.dropped.is_some() {
        return Err(("I5", format!("second recovery repaired again: {second:?}")));
    }
    let records2 = drain(&again).map_err(|e| ("I5", format!("claim failed: {e}")))?;
    let seqs2: Vec<Seq> = records2.iter().map(|r| r.0).collect();
    if seqs2 != seqs {
        return Err(("I5", "the second recovery found other records".to_string()));
    }
    // Acknowledged, a key's record lets the next one of the key go: drained
    // and acknowledged in turn, until nothing is left to hand out.
    let mut batch = seqs2;
    while !batch.is_empty() {
        again
            .ack_many(&batch)
            .map_err(|e| ("I9", format!("ack failed: {e}")))?;
        batch = drain(&again)
            .map_err(|e| ("I9", format!("claim failed: {e}")))?
            .iter()
            .map(|r| r.0)
            .collect();
    }
    // Dead letters keep their segments: discarded, they go too.
    let dead = again
        .dead_letters(usize::MAX)
        .map_err(|e| ("I9", format!("listing dead letters failed: {e}")))?;
    for d in &dead {
        again
            .discard(d.seq())
            .map_err(|e| ("I9", format!("discard failed: {e}")))?;
    }
    // A record delayed for an hour is live, so it may keep its segment (until
    // the log is large enough for relocation to pay). In a workload that
    // rotates by age (a 10 ms segment age), the writer may seal the active
    // segment, which holds the acknowledgements, just after the sync below
    // answered, and delete it again a moment later: a later sync is a
    // barrier after that deletion, so the check is made after up to three.
    let mut stats = again.stats();
    for _ in 0..3 {
        again
            .sync()
            .map_err(|e| ("I9", format!("sync failed: {e}")))?;
        stats = again.stats();
        if stats.segments <= 1 + stats.held_for_ids {
            break;
        }
    }
    let segments = stats.segments;
    if segments > 1 + stats.held_for_ids && stats.delayed == 0 {
        return Err((
            "I9",
            format!("{segments} segments left after everything was acknowledged"),
        ));
    }
    // A deletion held back for its ids keeps no more than its bound (five
    // times the ids' tombstones, two segments, and the active one's growth
    // since it was decided).
    let bound = 5 * 32 * stats.dedup_ids + 3 * options.segment_bytes + 65536;
    if stats.held_for_ids > 0 && stats.disk_bytes > bound {
        return Err((
            "I9",
            format!(
                "{} segments held for {} ids take {} bytes, more than {bound}",
                stats.held_for_ids, stats.dedup_ids, stats.disk_bytes
            ),
        ));
    }
    again
        .close()
        .map_err(|e| ("I9", format!("close failed: {e}")))?;
    // Held or not, every acknowledged segment is deletable: with a single
    // id remembered there is nothing to carry, and the open deletes them.
    if stats.held_for_ids > 0 && stats.delayed == 0 {
        let third = open(disk, options.clone().dedup_capacity(1))
            .map_err(|e| ("I9", format!("a third recovery refused: {e}")))?;
        third
            .sync()
            .map_err(|e| ("I9", format!("sync failed: {e}")))?;
        let left = third.stats().segments;
        third
            .close()
            .map_err(|e| ("I9", format!("close failed: {e}")))?;
        if left != 1 {
            return Err((
                "I9",
                format!("{left} segments left once no id was to be carried"),
            ));
        }
    }
    Ok(())
}

/// Claims every record `outbox` holds, acknowledging each batch before the
/// next claim, so that a key's later records are handed out too, and reads
/// every dead letter, before and after (under `max_attempts` a claim makes a
/// record past its limit a dead letter without reading it).
fn claim_every_record(outbox: &Outbox) -> Result<(), Error> {
    outbox.dead_letters(usize::MAX)?;
    loop {
        let batch: Vec<Seq> = drain(outbox)?.iter().map(|r| r.0).collect();
        if batch.is_empty() {
            break;
        }
        outbox.ack_many(&batch)?;
    }
    outbox.dead_letters(usize::MAX).map(drop)
}

/// Claims every pending record, keeping (seq, payload).
fn drain(outbox: &Outbox) -> Result<Vec<(Seq, Vec<u8>)>, Error> {
    drain_attempts(outbox).map(|(all, _)| all)
}

/// Records drained (seq, payload), and which attempt each delivery was.
type Drained = (Vec<(Seq, Vec<u8>)>, BTreeMap<Seq, u32>);

/// [`drain`], and which attempt each delivery was.
fn drain_attempts(outbox: &Outbox) -> Result<Drained, Error> {
    let mut all = Vec::new();
    let mut attempts = BTreeMap::new();
    loop {
        let got = outbox.claim(256)?;
        if got.is_empty() {
            return Ok((all, attempts));
        }
        all.extend(got.iter().map(|r| (r.seq(), r.payload().to_vec())));
        attempts.extend(got.iter().map(|r| (r.seq(), r.attempt())));
    }
}

/// I12: under `max_attempts`, attempts never decrease: a record handed out
/// as attempt k before the crash (that attempt was durable first) is
/// delivered after it as attempt k + 1 or later.
fn check_attempts(
    attempts: &BTreeMap<Seq, u32>,
    model: &Model,
) -> Result<(), (&'static str, String)> {
    for (seq, &now) in attempts {
        let before = model
            .attempts
            .get(seq)
            .and_then(|seen| seen.iter().map(|s| s.0).max());
        if let Some(before) = before
            && now <= before
        {
            return Err((
                "I12",
                format!(
                    "record {seq} delivered as attempt {now} after a crash, once attempt {before} was handed out"
                ),
            ));
        }
    }
    Ok(())
}

/// Crashes `workload` at every mutating operation, `draws` damage draws each,
/// with a crash inside recovery on some draws, and checks the invariants.
///
/// One run of the workload records the disk as it is before each mutating
/// operation; each of those is then crashed and recovered on its own.
pub fn crash_every_step(
    seed: u64,
    workload: &Workload,
    draws: u64,
    bug: Option<Bug>,
) -> Result<Figures, Violation> {
    let options = workload.options(bug);
    let mut figures = Figures::default();
    let violation = |invariant, detail, crash_point, draw| Violation {
        invariant,
        detail,
        seed,
        crash_point,
        draw,
    };
    let disk = SimDisk::new(seed);
    disk.record_snapshots();
    let mut model = Model::default();
    execute(&disk, workload, &options, &mut model).map_err(|d| violation("I2", d, u64::MAX, 0))?;
    figures.age_rotations = model.age_rotations;
    figures.shared_batches = model.shared_batches;
    figures.relocated = model.relocated;
    figures.recycled = model.recycled;
    figures.held_steps = model.held_steps;
    figures.leases_expired = model.leases_expired;
    figures.large_writes_unzeroed = disk.stats().large_writes_unzeroed;
    for (point, snapshot) in disk.take_snapshots().into_iter().enumerate() {
        let point = point as u64;
        let view = model.at(point);
        figures.crash_points += 1;
        for draw in 0..draws {
            let (d, crashed) = crash_snapshot(&snapshot, seed, point, draw, &options);
            figures.crashes_in_recovery += u64::from(crashed);
            // I5 and I9 on the first draw of each point; I1 to I4 on every one.
            let v = verify_with(&d, &options, &view, draw == 0)
                .map_err(|(i, detail)| violation(i, detail, point, draw))?;
            figures.recoveries += 1;
            figures.records_checked += v.records;
            figures.torn_tails += u64::from(v.torn);
            figures.quarantined += v.quarantined;
            figures.checkpointed += u64::from(v.checkpointed);
        }
    }
    Ok(figures)
}

/// Draws the damage of a crash at `snapshot`, and on some draws crashes the
/// first recovery too. Returns the disk to recover, and whether a recovery was
/// crashed on the way.
fn crash_snapshot(
    snapshot: &SimDisk,
    seed: u64,
    point: u64,
    draw: u64,
    options: &Options,
) -> (SimDisk, bool) {
    let d = snapshot.fork(seed ^ (point << 20) ^ draw);
    let mut rng = Rng::new(seed ^ point ^ (draw << 40));
    d.crash(crash_model(&mut rng));
    let mut crashed = false;
    // Within the open's own writes: its first twelve (the cut of a torn
    // tail, the seal, the new segment) as often as ever, and the next twelve
    // (the deletion of a fully acknowledged front: its log start, zeros,
    // fdatasync, removal or rename, directory fsync) besides.
    let within = if rng.chance(30) {
        Some(rng.below(12))
    } else if rng.chance(15) {
        Some(12 + rng.below(12))
    } else {
        None
    };
    if let Some(step) = within {
        d.crash_at(Some(d.ops() + step));
        if let Ok(o) = open(&d, options.clone()) {
            let _ = o.close();
        }
        crashed = d.is_dead();
        d.crash_at(None);
        d.crash(crash_model(&mut rng));
    }
    (d, crashed)
}

/// Replays one crash point and draw of [`crash_every_step`] and says what
/// happened: the files after the crash and the outcome. For investigating a
/// violation by its seed, crash point and draw.
pub fn replay(
    seed: u64,
    workload: &Workload,
    point: u64,
    draw: u64,
    bug: Option<Bug>,
) -> Vec<String> {
    let options = workload.options(bug);
    let mut trace = Vec::new();
    let files = |d: &SimDisk| {
        d.files(&dir())
            .iter()
            .map(|f| {
                let len = crate::io::Storage::open(d, &dir().join(f))
                    .and_then(|h| h.len())
                    .unwrap_or(0);
                format!("{f}:{len}")
            })
            .collect::<Vec<_>>()
            .join(" ")
    };
    let disk = SimDisk::new(seed);
    disk.record_snapshots();
    disk.start_trace();
    let mut model = Model::default();
    let _ = execute(&disk, workload, &options, &mut model);
    let Some(snapshot) = disk.take_snapshots().into_iter().nth(point as usize) else {
        return vec![format!("the workload has no operation {point}")];
    };
    // The operations up to the crash point, the last of them not done.
    let ops = disk.trace();
    let from = (point as usize).saturating_sub(24);
    trace.extend(
        ops.into_iter()
            .enumerate()
            .skip(from)
            .take(point as usize + 1 - from)
            .map(|(i, op)| {
                // The disk's trace names each operation `op N: ...` already.
                if i == point as usize {
                    format!("{op} (not done)")
                } else {
                    op
                }
            }),
    );
    let (d, crashed) = crash_snapshot(&snapshot, seed, point, draw, &options);
    trace.push(format!(
        "after the crash (a recovery crashed too: {crashed}): {}",
        files(&d)
    ));
    match verify(&d, &options, &model.at(point)) {
        Ok(v) => trace.push(format!(
            "verified: {} records, torn tail {}, set aside {}",
            v.records, v.torn, v.quarantined
        )),
        Err((i, detail)) => trace.push(format!("{i} violated: {detail}")),
    }
    trace
}

fn crash_model(rng: &mut Rng) -> CrashModel {
    let kept = rng.below(70);
    CrashModel {
        write_kept: kept,
        write_torn: rng.below(100 - kept),
        grown_tail: rng.below(60),
        dir_change_kept: rng.below(100),
        block_garbled: rng.below(40),
    }
}

/// The fault loop: for every mutating operation of `workload`, inject each fault
/// there, once and then persistently, and check that no append returned Ok
/// without being durable, that no write or sync followed a failed sync, and
/// that after the fault clears a reopen recovers everything and makes progress.
pub fn fault_loop(seed: u64, workload: &Workload, bug: Option<Bug>) -> Result<Figures, Violation> {
    let options = workload.options(bug);
    let mut figures = Figures::default();
    let clean = SimDisk::new(seed);
    let mut model = Model::default();
    let violation = |invariant, detail, crash_point| Violation {
        invariant,
        detail,
        seed,
        crash_point,
        draw: 0,
    };
    execute(&clean, workload, &options, &mut model).map_err(|d| violation("I2", d, u64::MAX))?;
    let total = clean.ops();
    let faults = [
        Fault::WriteEio,
        Fault::WriteEnospc,
        Fault::ShortWrite,
        Fault::SyncEio,
        Fault::SyncDirEio,
        Fault::CreateEnospc,
        Fault::SetLenEio,
    ];
    for at_op in 0..total {
        for fault in faults {
            for persistent in [false, true] {
                let disk = SimDisk::new(seed);
                disk.inject(FaultRule {
                    fault,
                    at_op,
                    persistent,
                });
                let mut model = Model::default();
                execute(&disk, workload, &options, &mut model)
                    .map_err(|d| violation("fault", d, at_op))?;
                let stats = disk.stats();
                if stats.faults_injected == 0 {
                    continue;
                }
                figures.faults += 1;
                if stats.writes_after_failed_sync > 0 || stats.syncs_after_failed_sync > 0 {
                    return Err(violation(
                        "fail-stop",
                        format!(
                            "{fault:?} at op {at_op}: the file was written or synced again after a failed sync ({stats:?})"
                        ),
                        at_op,
                    ));
                }
                let records =
                    reopen_after_fault(&disk, &options, &mut model).map_err(|(i, d)| {
                        violation(i, format!("{fault:?} at op {at_op}: {d}"), at_op)
                    })?;
                figures.records_checked += records;
            }
        }
    }
    Ok(figures)
}

/// After a fault: the fault clears and the process reopens the directory, as
/// `Poisoned` tells it to, without a crash, so recovery reads the page cache the
/// failed sync left. Appends must work again and be durable: then the power
/// goes, and everything acknowledged, before and after the reopen, must be
/// there. Returns the records checked.
fn reopen_after_fault(
    disk: &SimDisk,
    options: &Options,
    model: &mut Model,
) -> Result<u64, (&'static str, String)> {
    disk.clear_faults();
    let outbox = open(disk, options.clone()).map_err(|e| ("progress", format!("reopen: {e}")))?;
    for _ in 0..3 {
        let (_, p) = model.new_payload(40);
        let seq = outbox
            .append(&p)
            .map_err(|e| ("progress", format!("append after the reopen: {e}")))?;
        model.record(seq, p, 0).map_err(|d| ("I3", d))?;
    }
    let _ = outbox.close();
    disk.crash(CrashModel::default());
    let records = verify(disk, options, model)?.records;
    Ok(records)
}

/// Runs `workload` once with `rule` injected and returns the disk's log of
/// operations, the injected fault marked, and what the workload saw: for
/// investigating a fault-loop violation.
pub fn trace_fault(seed: u64, workload: &Workload, rule: FaultRule) -> Vec<String> {
    let options = workload.options(None);
    let disk = SimDisk::new(seed);
    disk.start_trace();
    disk.inject(rule);
    let mut model = Model::default();
    let outcome = execute(&disk, workload, &options, &mut model);
    let mut trace = disk.trace();
    trace.push(format!(
        "workload: {:?}; {:?}",
        outcome.map(|s| matches!(s, Stop::Done)),
        disk.stats()
    ));
    trace
}

/// Bit rot at rest: runs the workload, cuts the power cleanly, flips one bit in a
/// sealed segment (any but the newest file: in half of these draws a byte of one
/// of its frames, in the other half any byte of the file), or in every third
/// draw in the newest file outside its last sync group, and recovers, `draws` times, half of
/// them reading every frame at open ([`OpenCheck::EveryFrame`]), half through the
/// seal indexes. A strict recovery must refuse with `Corrupt`, or, through the
/// indexes only, a claim of the damaged record must; otherwise the outbox opens
/// with every invariant. Bit rot inside the newest segment's last sync group is
/// left out: it cannot be told from a torn write, and is cut (the documented
/// limit, held by the plan's unit tests); anywhere before it, a later group
/// proves the damaged bytes were fsynced, and nothing acknowledged may go.
pub fn bit_rot(
    seed: u64,
    workload: &Workload,
    draws: u64,
    bug: Option<Bug>,
) -> Result<Figures, Violation> {
    let options = workload.options(bug);
    let mut figures = Figures::default();
    let disk = SimDisk::new(seed);
    let mut model = Model::default();
    let violation = |invariant, detail, draw| Violation {
        invariant,
        detail,
        seed,
        crash_point: u64::MAX,
        draw,
    };
    execute(&disk, workload, &options, &mut model).map_err(|d| violation("I2", d, 0))?;
    for draw in 0..draws {
        let d = disk.fork(seed ^ draw);
        d.crash(CrashModel::default());
        let mut rng = Rng::new(seed ^ (draw << 32));
        let mut files = segment_names(&d);
        let newest = files.pop();
        let in_newest = draw % 3 == 2;
        let mut in_frame = false;
        let (file, at) = if in_newest {
            let Some(newest) = newest else {
                continue;
            };
            let file = dir().join(&newest);
            let Some(at) = before_last_group(&d, &file, &mut rng) else {
                continue;
            };
            (file, at)
        } else {
            if files.is_empty() {
                continue;
            }
            let file = dir().join(&files[rng.below(files.len() as u64) as usize]);
            let len = crate::io::Storage::open(&d, &file)
                .and_then(|f| f.len())
                .unwrap_or(0);
            if len <= 64 {
                continue;
            }
            let framed = if rng.below(2) == 0 {
                in_a_frame(&d, &file, &mut rng)
            } else {
                None
            };
            in_frame = framed.is_some();
            (file, framed.unwrap_or_else(|| 64 + rng.below(len - 64)))
        };
        d.flip_bit(&file, at, rng.below(8) as u8);
        figures.faults += 1;
        figures.newest_flips += u64::from(in_newest);
        figures.frame_flips += u64::from(in_frame);
        let check = if draw % 2 == 0 {
            OpenCheck::EveryFrame
        } else {
            OpenCheck::SealIndex
        };
        // Through the indexes, the damaged record may be one held back
        // behind its key: every record is claimed, each key's in turn (on a
        // copy of the disk, acknowledged as it goes), for the claim that
        // refuses it.
        let claimed = if check == OpenCheck::SealIndex {
            let probe = d.fork(seed ^ draw ^ 0x9e37);
            let opened = open(&probe, options.clone().open_check(check));
            opened.and_then(|o| {
                let claimed = claim_every_record(&o);
                drop(o.close());
                claimed
            })
        } else {
            Ok(())
        };
        match open(&d, options.clone().open_check(check)) {
            Err(Error::Corrupt { .. }) => continue,
            Err(e) => return Err(violation("I4", format!("unexpected error: {e}"), draw)),
            Ok(o) => {
                let claimed = drain(&o).map(drop).and(claimed);
                drop(o.close());
                match claimed {
                    Err(Error::Corrupt { .. }) if check == OpenCheck::SealIndex => continue,
                    Err(e) => {
                        return Err(violation(
                            "I4",
                            format!("a claim failed after a {check:?} recovery: {e}"),
                            draw,
                        ));
                    }
                    Ok(_) => {}
                }
            }
        }
        // The open above may have changed which file is the newest (an
        // empty active segment removed, the flipped one read whole from then
        // on): a later strict open that refuses, naming the flipped file, is
        // the "refused" outcome, not a violation. Any other refusal is.
        match open(&d, options.clone()) {
            Err(Error::Corrupt { path, .. }) if path == file => continue,
            Ok(o) => drop(o.close()),
            Err(_) => {}
        }
        let records = verify(&d, &options, &model)
            .map_err(|(i, detail)| violation(i, detail, draw))?
            .records;
        figures.records_checked += records;
        figures.recoveries += 1;
        figures.newest_harmless += u64::from(in_newest);
        figures.frame_harmless += u64::from(in_frame);
    }
    Ok(figures)
}

/// A frame of a segment file, as [`frames_of`] finds it.
struct Found {
    /// Where it starts in the file.
    at: u64,
    /// Its length in bytes.
    len: u64,
    /// Its frame's sequence number.
    seq: crate::format::seq::Seq,
    /// The first sequence number of its sync group.
    group: crate::format::seq::Seq,
}

/// Every frame of the segment file `file` that checks, in order, and the
/// file's length, walked as the writer lays frames out: one after another in
/// a sync group, each later group on a fresh block. `None` when the file or
/// its header cannot be read.
fn frames_of(disk: &SimDisk, file: &Path) -> Option<(Vec<Found>, u64)> {
    use crate::format::frame;
    use crate::format::segment::{BLOCK, FRAMES_AT, SegmentHeader};
    let f = crate::io::Storage::open(disk, file).ok()?;
    let len = f.len().ok()?;
    let mut bytes = vec![0u8; usize::try_from(len).ok()?];
    crate::io::read_exact_at(&*f, &mut bytes, 0).ok()?;
    let header = SegmentHeader::decode(&bytes).ok()?;
    let id = crate::format::seq::SegmentId(header.first_seq.get());
    let salt = frame::salt(id, header.nonce);
    let mut frames = Vec::new();
    let mut at = FRAMES_AT;
    while let Some(rest) = bytes.get(at..) {
        match frame::decode(rest, salt) {
            Ok(f) => {
                frames.push(Found {
                    at: at as u64,
                    len: f.len.max(1) as u64,
                    seq: f.header.seq,
                    group: f.header.group,
                });
                at += f.len.max(1);
            }
            Err(_) if !at.is_multiple_of(BLOCK) => at = at.next_multiple_of(BLOCK),
            Err(_) => break,
        }
    }
    Some((frames, len))
}

/// A random byte of a random frame of the segment file `file` (a sealed
/// one): its seal, a record, or any other frame. `None` when it holds no
/// frame.
fn in_a_frame(disk: &SimDisk, file: &Path, rng: &mut Rng) -> Option<u64> {
    let (frames, _) = frames_of(disk, file)?;
    if frames.is_empty() {
        return None;
    }
    let frame = &frames[rng.below(frames.len() as u64) as usize];
    Some(frame.at + rng.below(frame.len))
}

/// A random offset of the segment file `file` (an unsealed newest one) past its
/// first 64 bytes and outside its last sync group: in its header's block, in a
/// frame of an earlier group or its padding, or past its last frame. `None`
/// when it holds no frame, or its last group starts in no frame of it.
fn before_last_group(disk: &SimDisk, file: &Path, rng: &mut Rng) -> Option<u64> {
    let (frames, len) = frames_of(disk, file)?;
    let last = frames.last()?;
    let start = frames.iter().find(|f| f.seq == last.group)?.at;
    // Past the last frame: up to the file's end (the padding of its block).
    let end = last.at + last.len;
    let before = start.saturating_sub(64);
    let after = len.saturating_sub(end);
    if before + after == 0 {
        return None;
    }
    let pick = rng.below(before + after);
    Some(if pick < before {
        64 + pick
    } else {
        end + (pick - before)
    })
}

/// Rotten reads: runs the workload while reads of the open outbox return a
/// flipped bit `percent` of the time, and fail with EIO a quarter as often. A
/// claim may fail with `Corrupt` or `Io`, but must never hand out a record whose
/// bytes are not what was appended.
pub fn rotten_reads(
    seed: u64,
    workload: &Workload,
    percent: u64,
    bug: Option<Bug>,
) -> Result<Figures, Violation> {
    let options = workload.options(bug);
    let disk = SimDisk::new(seed);
    let mut model = Model::default();
    execute_rotting(&disk, workload, &options, &mut model, percent).map_err(|detail| {
        Violation {
            invariant: "I2",
            detail,
            seed,
            crash_point: u64::MAX,
            draw: 0,
        }
    })?;
    Ok(Figures {
        faults: 1,
        ..Figures::default()
    })
}

/// Checks one frame-decoder input (the fuzz target `frame_decode`): decoding
/// arbitrary bytes returns a frame or a typed error, never panics, and a frame
/// it returns lies within the input; the header, optional-field, seal index
/// and index checkpoint decoders never panic, and a checkpoint they accept
/// lists frames in order.
pub fn check_frame_bytes(data: &[u8]) {
    // The salt of segment 1 under nonce 1: the seeds' frames are made with it.
    let salt = crate::format::frame::salt(crate::format::seq::SegmentId(1), FUZZ_NONCE);
    let mut at = 0;
    while let Some(rest) = data.get(at..) {
        match crate::format::frame::decode(rest, salt) {
            Ok(frame) => {
                assert!(
                    frame.len >= crate::format::frame::FRAME_HEADER_LEN && frame.len <= rest.len()
                );
                assert!(frame.payload.len() <= crate::format::frame::RECORD_BYTES_LIMIT);
                assert!(frame.header.group <= frame.header.seq);
                at += frame.len;
            }
            Err(_) => break,
        }
    }
    if let Some((found, frame)) = crate::format::frame::find_frame_on_block(data, at, salt) {
        assert!(found >= at && found + frame.len <= data.len());
        assert_eq!(found % crate::format::segment::BLOCK, 0);
    }
    let _ = crate::format::segment::SegmentHeader::decode(data);
    let _ = crate::format::ext::decode(data);
    // The payloads of delivery-state frames, whose decoders recovery reaches
    // only through a frame whose keyed checksum holds.
    if let Ok(ranges) = crate::format::acks::decode(data) {
        assert!(ranges.iter().all(|(a, b)| a <= b));
    }
    use crate::format::delivery;
    for kind in [
        delivery::ATTEMPTS,
        delivery::RELEASE,
        delivery::DEAD_LETTER,
        delivery::REQUEUE_OR_DISCARD,
    ] {
        for change in delivery::decode(kind, data).unwrap_or_default() {
            if let delivery::Change::Release { reason, .. }
            | delivery::Change::DeadLetter { reason, .. } = change
            {
                assert!(reason.len() <= delivery::REASON_BYTES_MAX);
            }
        }
    }
    let _ = crate::format::fields::decode(data);
    let _ = crate::format::fields::decode_tombstones(data);
    let _ = crate::format::relocated::decode_ext(data);
    let _ = crate::format::seal::decode(data, data.len() as u64);
    if let Ok(cp) = crate::format::checkpoint::decode(data) {
        let frames: Vec<_> = cp.frames.iter().collect();
        for pair in frames.windows(2) {
            if let [a, b] = pair {
                assert!(u64::from(b.offset) >= a.end());
            }
        }
        // Read back as a list, each frame is what was decoded.
        for (i, f) in frames.iter().enumerate() {
            assert_eq!(cp.frames.get(i), Some(*f));
        }
    }
}

/// The nonce of the segment the `frame_decode` fuzz target's frames belong to.
pub const FUZZ_NONCE: u64 = 1;

/// A seed of the `frame_decode` fuzz target: `k + 2` frames of segment 1 under
/// [`FUZZ_NONCE`] (records of growing sizes, one with optional fields, a log
/// start, an index checkpoint, a seal), as a segment holds them; with `header`, after the segment's
/// header block.
pub fn frame_seed(k: usize, header: bool) -> Vec<u8> {
    use crate::format::ext::{self, RecordFields};
    use crate::format::frame::{self, FrameHeader, FrameKind};
    use crate::format::seal::IndexBuilder;
    use crate::format::segment::SegmentHeader;
    use crate::format::seq::SegmentId;
    let id = SegmentId(1);
    let salt = frame::salt(id, FUZZ_NONCE);
    let mut out = if header {
        SegmentHeader {
            first_seq: Seq::from(1),
            prev_seq: Seq::from(0),
            log_start: Seq::from(1),
            created_unix_ms: 0,
            nonce: FUZZ_NONCE,
            outbox_id: 7,
            checkpoint_every: 0,
        }
        .encode_block()
    } else {
        Vec::new()
    };
    let mut index = IndexBuilder::default();
    let mut seq = 1u64;
    let mut push = |out: &mut Vec<u8>, index: &mut IndexBuilder, kind, payload: &[u8], ext| {
        let at = out.len();
        frame::encode_with(
            out,
            &FrameHeader {
                kind,
                batch_end: true,
                seq: Seq::from(seq),
                group: Seq::from(seq),
                timestamp_us: seq,
            },
            ext,
            payload,
            salt,
        );
        index.push(frame::FrameSpan::new(
            at as u32,
            (out.len() - at) as u32,
            kind == FrameKind::Record,
        ));
        seq += 1;
    };
    for n in 0..=k {
        let p = payload(n as u64, 12 + 40 * n);
        push(&mut out, &mut index, FrameKind::Record, &p, &[]);
    }
    let mut fields = Vec::new();
    ext::encode(
        &RecordFields {
            key: Some(b"account-42"),
            not_before_us: Some(1),
            origin_seq: None,
            dedup_id: Some(b"order-7781"),
            carried: None,
        },
        &mut fields,
    );
    push(
        &mut out,
        &mut index,
        FrameKind::Record,
        b"with fields",
        &fields,
    );
    let start = 1u64.to_le_bytes();
    push(&mut out, &mut index, FrameKind::LogStart, &start, &[]);
    let listed = index.checkpoint(0, &[], false);
    push(
        &mut out,
        &mut index,
        crate::format::checkpoint::CHECKPOINT,
        &listed,
        &[],
    );
    let seal = index.encode(FUZZ_NONCE);
    push(&mut out, &mut index, FrameKind::Seal, seal.bytes(), &[]);
    out
}

/// Checks recovery over arbitrary segment files (the fuzz target `recovery`):
/// `data` holds up to four files, each as its length (u16, little-endian) and
/// its bytes (see [`recovery_input`]). A file long enough to hold a header is
/// named after the `first_seq` its header claims, when that number runs on
/// from the previous file's; otherwise it gets the next free number. So a real
/// log, written out by [`recovery_seed`], comes back under its own names, and
/// the fuzzer mutates logs whose seals and indexes check. Opening never panics;
/// if it succeeds, only the newest file may have been cut, and every record
/// handed out passes its checks. Returns how many records were handed out, or
/// `None` if the open was refused.
pub fn check_recovery_bytes(data: &[u8]) -> Option<u64> {
    let disk = SimDisk::new(0);
    let (files, paths) = write_recovery_input(&disk, data);
    // Recovery walks a whole file through a window: where the window finds it
    // whole, the scan is the one the whole file in memory gives.
    for (bytes, input) in files.iter().zip(&paths) {
        let name = input
            .path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("");
        if let Some(id) = crate::format::seq::SegmentId::parse(name) {
            for chunk in [48, 4096] {
                crate::log::recovery::check_window_matches_whole(id, bytes, chunk);
            }
        }
    }
    let options = Options::default().segment_bytes(1024);
    match open(&disk, options) {
        Ok(outbox) => {
            let mut handed_out = 0;
            while let Ok(records) = outbox.claim(64) {
                if records.is_empty() {
                    break;
                }
                handed_out += records.len() as u64;
            }
            // Checked once the writer has stopped: from the open on, it may
            // delete the oldest segments, fully acknowledged (its first duty).
            let _ = outbox.close();
            let deleted = outbox.stats().segments_deleted;
            check_recovery_cuts(&disk, outbox.recovery_report(), &files, &paths, deleted);
            Some(handed_out)
        }
        Err(Error::Corrupt { .. } | Error::Io { .. } | Error::UnsupportedFormat { .. }) => None,
        Err(e) => panic!("unexpected error from recovery: {e}"),
    }
}

/// Checks the offline tools over arbitrary segment files (the fuzz target
/// `offline_tools`, inputs as for [`check_recovery_bytes`]): `verify` and
/// `dump` (what `segwal verify` and `segwal dump` run) read the files, then an
/// open that checks every frame reads them. Neither tool panics, and each
/// agrees with the open: verify finds no problem exactly when the open
/// succeeds (refused as `Corrupt` or `UnsupportedFormat` otherwise), the
/// torn tail it names is the one the open cuts, its state counts are the
/// open's (backlog bytes, dead letters), and a dump from
/// the log's start of a log the open accepts ends without an error, with the
/// records' states or without. Where the open refuses the log, the repair
/// verify plans is what a lossy open of the same files drops. Returns
/// whether the open succeeded.
pub fn check_offline_tools_bytes(data: &[u8]) -> bool {
    use crate::log::recovery::dump::{DumpOptions, dump_with};
    let disk = SimDisk::new(0);
    let _ = write_recovery_input(&disk, data);
    // Files that cannot change under the tools: read again without a pause.
    let settle = std::time::Duration::ZERO;
    let verified = crate::log::recovery::verify::verify_with(&disk, &dir(), &mut |_, _| {}, settle);
    let mut failed = None;
    for states in [false, true] {
        let options = if states {
            DumpOptions::new().with_states()
        } else {
            DumpOptions::new()
        };
        let Ok(walk) = dump_with(Arc::new(disk.clone()), dir(), options, settle) else {
            continue;
        };
        for record in walk.take(1 << 20) {
            if let Err(e) = record {
                failed.get_or_insert((states, e));
                break;
            }
        }
    }
    let every_frame = Options::default()
        .segment_bytes(1024)
        .open_check(OpenCheck::EveryFrame);
    let opened = open(&disk, every_frame);
    match (&verified, &opened) {
        (Ok(v), Ok(outbox)) => {
            assert!(
                v.is_clean(),
                "verify found problems in a log an open accepts: {:?}",
                v.problems
            );
            assert_eq!(
                v.torn_tail.as_ref().map(|t| (&t.path, t.offset)),
                outbox
                    .recovery_report()
                    .torn_tail
                    .as_ref()
                    .map(|t| (&t.path, t.offset)),
                "the torn tail verify names against the one the open cut"
            );
            if let Some(counts) = &v.states {
                let stats = outbox.stats();
                assert_eq!(
                    (counts.backlog_bytes, counts.dead),
                    (stats.backlog_bytes, stats.dead_letters),
                    "verify's state counts against the open's"
                );
            }
            if let Some((states, e)) = &failed {
                panic!("a dump (states: {states}) of a log an open accepts failed: {e}");
            }
        }
        (Ok(v), Err(e @ (Error::Corrupt { .. } | Error::UnsupportedFormat { .. }))) => {
            assert!(!v.is_clean(), "verify passed a log an open refuses: {e}");
        }
        _ => {}
    }
    // What a lossy repair would drop, as verify plans it, is what a lossy
    // open of the same files drops.
    if let (Ok(v), Err(Error::Corrupt { .. })) = (&verified, &opened) {
        let again = SimDisk::new(0);
        let _ = write_recovery_input(&again, data);
        let lossy = Options::default()
            .segment_bytes(1024)
            .open_check(OpenCheck::EveryFrame)
            .recovery(crate::options::RecoveryMode::Lossy);
        if let Ok(outbox) = open(&again, lossy) {
            assert_eq!(
                v.repair.as_ref(),
                outbox.recovery_report().dropped.as_ref(),
                "the repair verify plans against what a lossy open dropped"
            );
            let _ = outbox.close();
        }
    }
    match opened {
        Ok(outbox) => {
            let _ = outbox.close();
            true
        }
        Err(_) => false,
    }
}

/// What `verify` and `dump` make of a log whose segment files the running
/// owner cuts while they read them (a seal cuts the space reserved after it):
/// each file reads as longer than it is until a read finds its end. A small
/// log (sealed segments and the newest) is written on a simulated disk, then
/// read through [`CutUnderRead`]. Returns whether `verify` found the log clean
/// and how many records `dump` read, or the error each returned.
pub fn offline_tools_on_files_cut_under_them() -> (Result<bool, String>, Result<u64, String>) {
    use crate::log::recovery::dump::{DumpOptions, dump_with};
    let disk = SimDisk::new(0);
    let outbox = match open(&disk, Options::default().segment_bytes(16 * 4096)) {
        Ok(outbox) => outbox,
        Err(e) => return (Err(e.to_string()), Err(e.to_string())),
    };
    for i in 0..40u32 {
        if let Err(e) = outbox.append(&i.to_le_bytes()) {
            return (Err(e.to_string()), Err(e.to_string()));
        }
    }
    let _ = outbox.close();
    let storage = Arc::new(CutUnderRead {
        inner: disk,
        cut: Arc::new(parking_lot::Mutex::new(BTreeSet::new())),
    });
    let settle = std::time::Duration::ZERO;
    let verified =
        crate::log::recovery::verify::verify_with(&*storage, &dir(), &mut |_, _| {}, settle)
            .map(|v| v.is_clean())
            .map_err(|e| e.to_string());
    storage.cut.lock().clear();
    let dumped = dump_with(storage, dir(), DumpOptions::new(), settle)
        .and_then(|walk| walk.map(|r| r.map(|_| 1u64)).sum::<Result<u64, Error>>())
        .map_err(|e| e.to_string());
    (verified, dumped)
}

/// `verify` (with no wait between its passes) on a log of a dozen segments
/// seen through [`GrowsPerListing`]: each listing of the directory shows one
/// segment more than the one before, so the newest file of every first
/// listing ends with a seal, as when the owner rotates between the listing
/// and the read. `Ok(true)` when the check finds the log clean.
pub fn verify_on_a_log_that_grows_between_listings() -> Result<bool, String> {
    let disk = SimDisk::new(0);
    let outbox =
        open(&disk, Options::default().segment_bytes(16 * 4096)).map_err(|e| e.to_string())?;
    while segment_names(&disk).len() < 12 {
        outbox.append(b"grows").map_err(|e| e.to_string())?;
    }
    outbox.close().map_err(|e| e.to_string())?;
    let storage = GrowsPerListing {
        inner: disk,
        shown: parking_lot::Mutex::new(2),
    };
    crate::log::recovery::verify::verify_with(
        &storage,
        &dir(),
        &mut |_, _| {},
        std::time::Duration::ZERO,
    )
    .map(|v| v.is_clean())
    .map_err(|e| e.to_string())
}

/// A view of a [`SimDisk`] whose directory listings show the oldest `shown`
/// segment files only (and every other name), one more at each listing: a
/// log that grows a segment between two listings.
#[derive(Debug)]
struct GrowsPerListing {
    inner: SimDisk,
    shown: parking_lot::Mutex<usize>,
}

impl crate::io::Storage for GrowsPerListing {
    // Everything but the listing is the disk's own: `verify` reads through
    // its read-only view, which refuses every change.
    fn create_dir(&self, path: &Path) -> std::io::Result<bool> {
        self.inner.create_dir(path)
    }
    fn list(&self, dir: &Path) -> std::io::Result<Vec<String>> {
        let mut names = self.inner.list(dir)?;
        names.sort();
        let mut shown = self.shown.lock();
        let mut segments = 0;
        names.retain(|n| {
            if crate::format::seq::SegmentId::parse(n).is_none() {
                return true;
            }
            segments += 1;
            segments <= *shown
        });
        *shown += 1;
        Ok(names)
    }
    fn create(&self, path: &Path) -> std::io::Result<Arc<dyn crate::io::StorageFile>> {
        self.inner.create(path)
    }
    fn open(&self, path: &Path) -> std::io::Result<Arc<dyn crate::io::StorageFile>> {
        self.inner.open(path)
    }
    fn open_read(&self, path: &Path) -> std::io::Result<Arc<dyn crate::io::StorageFile>> {
        self.inner.open_read(path)
    }
    fn remove(&self, path: &Path) -> std::io::Result<()> {
        self.inner.remove(path)
    }
    fn rename(&self, from: &Path, to: &Path) -> std::io::Result<()> {
        self.inner.rename(from, to)
    }
    fn sync_dir(&self, dir: &Path) -> std::io::Result<()> {
        self.inner.sync_dir(dir)
    }
    fn lock(&self, dir: &Path) -> Result<crate::io::LockGuard, crate::io::LockError> {
        self.inner.lock(dir)
    }
}

/// A read-only view of a [`SimDisk`] where each file reads as 64 KiB longer
/// than it is, until a read at or past its end finds that it is not: what a
/// reader sees when the file is cut between its measure of the length and
/// its read.
#[derive(Debug)]
struct CutUnderRead {
    inner: SimDisk,
    /// The files whose end a read has found.
    cut: Arc<parking_lot::Mutex<BTreeSet<PathBuf>>>,
}

/// A file of [`CutUnderRead`].
#[derive(Debug)]
struct LongerThanItIs {
    inner: Arc<dyn crate::io::StorageFile>,
    path: PathBuf,
    cut: Arc<parking_lot::Mutex<BTreeSet<PathBuf>>>,
}

fn read_only() -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::PermissionDenied, "read-only")
}

impl crate::io::Storage for CutUnderRead {
    fn create_dir(&self, _: &Path) -> std::io::Result<bool> {
        Err(read_only())
    }
    fn list(&self, dir: &Path) -> std::io::Result<Vec<String>> {
        self.inner.list(dir)
    }
    fn create(&self, _: &Path) -> std::io::Result<Arc<dyn crate::io::StorageFile>> {
        Err(read_only())
    }
    fn open(&self, path: &Path) -> std::io::Result<Arc<dyn crate::io::StorageFile>> {
        Ok(Arc::new(LongerThanItIs {
            inner: self.inner.open(path)?,
            path: path.to_path_buf(),
            cut: self.cut.clone(),
        }))
    }
    fn remove(&self, _: &Path) -> std::io::Result<()> {
        Err(read_only())
    }
    fn rename(&self, _: &Path, _: &Path) -> std::io::Result<()> {
        Err(read_only())
    }
    fn sync_dir(&self, _: &Path) -> std::io::Result<()> {
        Err(read_only())
    }
    fn lock(&self, _: &Path) -> Result<crate::io::LockGuard, crate::io::LockError> {
        Err(crate::io::LockError::Io(read_only()))
    }
}

impl crate::io::StorageFile for LongerThanItIs {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
        let n = self.inner.read_at(buf, offset)?;
        if n == 0 && !buf.is_empty() {
            self.cut.lock().insert(self.path.clone());
        }
        Ok(n)
    }
    fn write_at(&self, _: &[u8], _: u64) -> std::io::Result<usize> {
        Err(read_only())
    }
    fn sync_data(&self) -> std::io::Result<()> {
        Err(read_only())
    }
    fn set_len(&self, _: u64) -> std::io::Result<()> {
        Err(read_only())
    }
    fn allocate(&self, _: u64) -> std::io::Result<()> {
        Err(read_only())
    }
    fn len(&self) -> std::io::Result<u64> {
        let len = self.inner.len()?;
        if self.cut.lock().contains(&self.path) {
            Ok(len)
        } else {
            Ok(len + (64 << 10))
        }
    }
}

/// One file of a `recovery` fuzz input, as written.
struct InputFile {
    path: PathBuf,
    len: u64,
}

/// Writes the files of a `recovery` fuzz input into the outbox directory of
/// `disk`, named as [`check_recovery_bytes`] says; returns their bytes and
/// where each went.
fn write_recovery_input<'a>(disk: &SimDisk, data: &'a [u8]) -> (Vec<&'a [u8]>, Vec<InputFile>) {
    let dir = dir();
    let _ = crate::io::Storage::create_dir(disk, &dir);
    let mut files: Vec<&[u8]> = Vec::new();
    let mut rest = data;
    while files.len() < 4 && rest.len() >= 2 {
        let (len, tail) = rest.split_at(2);
        let len = usize::from(u16::from_le_bytes([len[0], len[1]])).min(tail.len());
        let (file, tail) = tail.split_at(len);
        files.push(file);
        rest = tail;
    }
    let mut paths = Vec::new();
    // The lowest name the next file may claim, and the one it gets otherwise
    // (room for a frame every 48 bytes of the file before it).
    let (mut lowest, mut next) = (1u64, 1u64);
    for bytes in &files {
        let claimed = bytes
            .get(16..24)
            .map(|b| u64::from_le_bytes(b.try_into().unwrap_or_default()))
            .filter(|&c| c >= lowest && c < 1 << 61);
        let id = crate::format::seq::SegmentId(claimed.unwrap_or(next));
        lowest = id.0 + 1;
        next = id.0 + 1 + bytes.len() as u64 / 48;
        let path = dir.join(id.file_name());
        if let Ok(f) = crate::io::Storage::create(disk, &path) {
            let _ = crate::io::write_all_at(&*f, bytes, 0);
            let _ = f.sync_data();
        }
        paths.push(InputFile {
            path,
            len: bytes.len() as u64,
        });
    }
    let _ = crate::io::Storage::sync_dir(disk, &dir);
    (files, paths)
}

/// The names of the segment files in the outbox directory of `disk`, in log
/// order (the directory also holds the owner and reserve files).
fn segment_names(disk: &SimDisk) -> Vec<String> {
    let mut names = disk.files(&dir());
    names.retain(|n| crate::format::seq::SegmentId::parse(n).is_some());
    names.sort();
    names
}

/// What recovery may have done to the files of a `recovery` fuzz input: remove
/// files (a newest file that provably holds nothing, leftovers below the log
/// start), each one reported and each one proven segwal's by its bytes; cut a torn tail, reported, only from the newest file it
/// keeps; and seal that file, cutting its preallocated space. Every other file
/// stays, at least as long as it was, but the oldest `writer_deleted` it
/// kept: the writer, once the open had started it, deleted that many segments
/// from the front of the log (fully acknowledged, each with a header that
/// checks). (The newest file it keeps may be an empty
/// segment, only zeros after its header, which becomes the active one again:
/// then the file before it is the newest holding frames.)
fn check_recovery_cuts(
    disk: &SimDisk,
    report: &RecoveryReport,
    files: &[&[u8]],
    paths: &[InputFile],
    writer_deleted: u64,
) {
    let removed = |p: &Path| report.removed.iter().any(|r| r == p);
    let kept: Vec<usize> = (0..paths.len())
        .filter(|&k| !removed(&paths[k].path))
        .collect();
    // Only zeros after the header block: an empty segment, reused as the active one.
    let frames_at = crate::format::segment::FRAMES_AT;
    let only_zeros = |k: usize| {
        files[k]
            .get(frames_at..)
            .is_none_or(|b| b.iter().all(|&x| x == 0))
    };
    let may_cut = |k: usize| match kept.as_slice() {
        [.., before, last] => k == *last || (k == *before && only_zeros(*last)),
        [last] => k == *last,
        [] => false,
    };
    if let Some(torn) = &report.torn_tail {
        assert!(
            removed(&torn.path)
                || (0..paths.len()).any(|k| paths[k].path == torn.path && may_cut(k)),
            "recovery cut {}, not the newest segment holding frames",
            torn.path.display()
        );
    }
    // Recovery never deletes a file it cannot prove it wrote: every file it
    // removed was all zeros, or began with a header that checks.
    for (k, InputFile { path, .. }) in paths.iter().enumerate() {
        let bytes = files[k];
        let proven = bytes.iter().all(|&b| b == 0)
            || crate::format::segment::SegmentHeader::decode(bytes).is_ok();
        assert!(
            !removed(path) || proven,
            "recovery removed {}, whose bytes do not prove it was segwal's",
            path.display()
        );
    }
    // The writer deletes segments from the front of the log, each with a
    // header that checks, and counts them: at most that many of the oldest
    // files recovery kept may be gone, and no later one.
    let exists = |k: usize| crate::io::Storage::open(disk, &paths[k].path).is_ok();
    let gone_front = kept.iter().take_while(|&&k| !exists(k)).count();
    assert!(
        gone_front as u64 <= writer_deleted,
        "{gone_front} of the oldest segments gone, the writer deleted {writer_deleted}"
    );
    for &k in &kept[..gone_front] {
        assert!(
            crate::format::segment::SegmentHeader::decode(files[k]).is_ok(),
            "the writer deleted {}, whose header does not check",
            paths[k].path.display()
        );
    }
    for (k, InputFile { path, len }) in paths.iter().enumerate() {
        if removed(path) || may_cut(k) || kept[..gone_front].contains(&k) {
            continue;
        }
        let now = crate::io::Storage::open(disk, path).map(|f| f.len().unwrap_or(0));
        assert!(
            now.is_ok_and(|now| now >= *len),
            "recovery cut or removed {} without saying so",
            path.display()
        );
    }
}

/// The files of the outbox directory on `disk`, oldest first, as one input of
/// the fuzz target `recovery`: each file as its length (u16, little-endian,
/// files cut to 65,535 bytes) and its bytes.
pub fn recovery_input(disk: &SimDisk) -> Vec<u8> {
    let dir = dir();
    let mut names: Vec<String> = disk.files(&dir);
    names.retain(|n| n.ends_with(crate::format::seq::SEGMENT_SUFFIX));
    names.sort();
    let mut out = Vec::new();
    for name in names.iter().take(4) {
        let Ok(file) = crate::io::Storage::open(disk, &dir.join(name)) else {
            continue;
        };
        let len = file.len().unwrap_or(0).min(u64::from(u16::MAX)) as usize;
        let mut bytes = vec![0; len];
        if crate::io::read_exact_at(&*file, &mut bytes, 0).is_err() {
            continue;
        }
        out.extend_from_slice(&(len as u16).to_le_bytes());
        out.extend_from_slice(&bytes);
    }
    out
}

/// A log written by the engine, for the `recovery` target's seed corpus: the
/// random workload `seed` on a simulated disk with small segments, then, if
/// `crash` is set, a power cut halfway through it (unsynced writes kept, lost
/// or torn), else a clean close. Its sealed segments carry seal indexes that
/// check, so the fuzzer starts from inputs that reach every path of recovery.
pub fn recovery_seed(seed: u64, crash: bool) -> Vec<u8> {
    let workload = Workload::random(seed, 40);
    let options = workload.options(None);
    let mut model = Model::default();
    let disk = SimDisk::new(seed);
    if crash {
        let probe = SimDisk::new(seed);
        let _ = execute(&probe, &workload, &options, &mut Model::default());
        disk.crash_at(Some(probe.ops() / 2));
    }
    let _ = execute(&disk, &workload, &options, &mut model);
    if crash {
        disk.crash(CrashModel::default());
    }
    recovery_input(&disk)
}

/// Runs a workload decoded from `data` with a crash point also taken from it
/// (the fuzz target `crash_ops`), and checks every invariant.
pub fn check_crash_bytes(data: &[u8]) -> Result<(), Violation> {
    let (head, rest) = data.split_at(data.len().min(3));
    let point = head.iter().fold(0u64, |a, &b| a * 256 + u64::from(b));
    let workload = Workload::from_bytes(rest);
    let options = workload.options(None);
    let disk = SimDisk::new(point);
    disk.crash_at(Some(point % 400));
    let mut model = Model::default();
    let violation = |invariant, detail| Violation {
        invariant,
        detail,
        seed: u64::MAX,
        crash_point: point % 400,
        draw: 0,
    };
    execute(&disk, &workload, &options, &mut model).map_err(|d| violation("I2", d))?;
    let mut rng = Rng::new(point);
    disk.crash(crash_model(&mut rng));
    verify(&disk, &options, &model).map_err(|(i, d)| violation(i, d))?;
    Ok(())
}

/// The path of the outbox directory on the simulated disk.
pub fn sim_dir() -> &'static Path {
    Path::new(DIR)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_check_themselves() {
        for (id, len) in [(0, 12), (7, 100), (u64::MAX, 13)] {
            assert_eq!(payload_id(&payload(id, len)), Some(id));
        }
        let mut p = payload(3, 50);
        p[30] ^= 1;
        assert_eq!(payload_id(&p), None);
        assert_eq!(payload_id(b"short"), None);
    }

    #[test]
    fn one_seed_survives_every_crash_point() {
        let workload = Workload::random(11, 25);
        let figures = crash_every_step(11, &workload, 2, None).unwrap_or_else(|v| panic!("{v}"));
        assert!(figures.crash_points > 10);
    }
}
