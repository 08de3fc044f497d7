//! The one word every blocked producer of an outbox sleeps on, so that the
//! producers of a finished batch are woken by one system call.
//!
//! Each producer's answer is in its own [`Completion`](super::shared::Completion);
//! what it sleeps on is shared: one futex word, in one of 32 lanes (the bits
//! of a futex bitset). The writer writes the lane of the batch into each
//! request it gathers ([`LaneCell::stamp`]); a producer that goes to sleep
//! before its request was gathered takes the lane of the next batch to be
//! gathered, its likely one, instead. The lane is written once, by whichever
//! comes first. A delivery leaves every answer of a batch, then bumps the
//! word and wakes the lanes of its requests with one `FUTEX_WAKE_BITSET`. A
//! producer woken for another's batch (its lane shared) goes back to sleep.
//!
//! Why not one condition variable per producer, as before: waking 20 to 60
//! producers one by one took that many `futex` calls, and the thread making
//! them was preempted by nearly every producer it woke (on two cores, 0.5
//! involuntary context switches per record at 64 producers, docs/BENCHMARKS.md,
//! "One wake-up call per batch"). One call wakes them all before the waker can
//! be preempted. Why lanes: with one lane, every delivery also woke the
//! producers queued for the next batch, a second context switch per record.
//!
//! Linux only, as the rest of the engine (`fallocate`).

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

/// The word producers sleep on, and how many sleep.
#[derive(Debug, Default)]
pub(crate) struct Waiters {
    /// Bumped after every delivery of answers; a sleeper sleeps only while it
    /// still holds the value it read before it last looked at its answer.
    word: AtomicU32,
    /// Producers inside (or entering) `FUTEX_WAIT`: a delivery with none
    /// makes no system call (a producer that spins for its answer).
    sleepers: AtomicU32,
    /// Batches the writer has gathered.
    gathered: AtomicU32,
}

/// Lanes a sleeper may be in: the bits of a futex bitset.
const LANES: u32 = 32;

/// A lane cell not yet written.
const UNSET: u32 = u32::MAX;

impl Waiters {
    /// Returns once `ready` is set, sleeping on the word meanwhile, in the
    /// lane of `lane` (written now if the writer has not yet).
    ///
    /// No wake-up is missed:
    /// - the lane cell is written once, before this sleeper reads it, and a
    ///   delivery reads it after it set `ready`: both name the same lane;
    /// - the word is read before `ready`, so a delivery that set `ready`
    ///   after that read bumps the word after it too, and `FUTEX_WAIT`
    ///   returns at once if the word moved;
    /// - a delivery that saw no sleeper came, in the total order of these
    ///   sequentially consistent operations, before this sleeper counted
    ///   itself, so its bump came before the kernel reads the word here.
    pub(crate) fn sleep_until(&self, ready: &AtomicBool, lane: &LaneCell) {
        let guess = self.gathered.load(Ordering::Relaxed).wrapping_add(1) % LANES;
        let lane = lane.settle(guess);
        loop {
            let seen = self.word.load(Ordering::SeqCst);
            if ready.load(Ordering::SeqCst) {
                return;
            }
            self.sleepers.fetch_add(1, Ordering::SeqCst);
            futex_wait(&self.word, seen, 1 << lane);
            self.sleepers.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// The lane of the batch being gathered.
    pub(crate) fn gathering(&self) -> u32 {
        self.gathered.load(Ordering::Relaxed).wrapping_add(1) % LANES
    }

    /// Marks a batch gathered: the next one is in the next lane.
    pub(crate) fn gathered(&self) {
        self.gathered.fetch_add(1, Ordering::Relaxed);
    }

    /// Wakes the sleepers in `lanes`, after their answers were left (their
    /// `ready` set) and their lanes read.
    pub(crate) fn wake(&self, lanes: Lanes) {
        self.word.fetch_add(1, Ordering::SeqCst);
        if lanes.0 != 0 && self.sleepers.load(Ordering::SeqCst) != 0 {
            futex_wake(&self.word, lanes.0);
        }
    }
}

/// The lane one request's producer sleeps in, written once: by the writer
/// when it gathers the request, or by the producer going to sleep before
/// that, whichever comes first. Any lane is correct; the right one spares
/// other sleepers a needless wake-up.
#[derive(Debug)]
pub(crate) struct LaneCell(AtomicU32);

impl Default for LaneCell {
    fn default() -> LaneCell {
        LaneCell(AtomicU32::new(UNSET))
    }
}

impl LaneCell {
    /// The writer's lane for the request, unless its producer chose first.
    pub(crate) fn stamp(&self, lane: u32) {
        let _ = self
            .0
            .compare_exchange(UNSET, lane % LANES, Ordering::SeqCst, Ordering::SeqCst);
    }

    /// The lane, writing `fallback` if none was written yet.
    pub(crate) fn settle(&self, fallback: u32) -> u32 {
        match self
            .0
            .compare_exchange(UNSET, fallback % LANES, Ordering::SeqCst, Ordering::SeqCst)
        {
            Ok(_) => fallback % LANES,
            Err(lane) => lane,
        }
    }
}

/// A set of lanes to wake.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Lanes(u32);

impl Lanes {
    /// Adds the lane of `cell`, settling it on lane 0 if it has none (a
    /// request answered before it was gathered, as at close).
    pub(crate) fn add(&mut self, cell: &LaneCell) {
        self.0 |= 1 << cell.settle(0);
    }
}

/// Sleeps while `word` holds `seen`, until a wake-up of a lane in `bits` (or
/// any signal or spurious return: the caller looks again either way).
fn futex_wait(word: &AtomicU32, seen: u32, bits: u32) {
    #[expect(unsafe_code, reason = "futex(2) has no wrapper in std")]
    // SAFETY: FUTEX_WAIT_BITSET reads the aligned u32 behind `word`, which
    // lives as long as this call (borrowed); the timeout pointer is null (no
    // timeout) and the second address is unused by this operation. The
    // result is ignored on purpose: EAGAIN (the word moved), EINTR and
    // spurious returns all send the caller back to look at its answer.
    let _ = unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT_BITSET | libc::FUTEX_PRIVATE_FLAG,
            seen,
            std::ptr::null::<libc::timespec>(),
            std::ptr::null::<u32>(),
            bits,
        )
    };
}

/// Wakes every thread sleeping on `word` in a lane of `bits`.
fn futex_wake(word: &AtomicU32, bits: u32) {
    #[expect(unsafe_code, reason = "futex(2) has no wrapper in std")]
    // SAFETY: FUTEX_WAKE_BITSET only uses the address of `word` as a key (it
    // is not written); `word` is borrowed for the call; the timeout and
    // second address arguments are unused by this operation.
    let _ = unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE_BITSET | libc::FUTEX_PRIVATE_FLAG,
            i32::MAX,
            std::ptr::null::<libc::timespec>(),
            std::ptr::null::<u32>(),
            bits,
        )
    };
}
