//! [`Clock`]: the ages of records, on a clock that never steps.
//!
//! A frame carries the wall-clock time it was written (microseconds since the
//! Unix epoch), which a clock stepped back or forward would turn into a wrong
//! age. So an age is measured on the monotonic clock of this process:
//! - a record appended by this process is placed on it through the offset
//!   between the wall clock and the monotonic one when it was written. The
//!   writer notes that offset at the first batch and again whenever it moves by
//!   more than [`STEP`] (the wall clock was stepped): one entry per step, not
//!   per record;
//! - a recovered record is placed on it through the offset when the outbox was
//!   opened, and never after the open: its age at the open is the wall clock's
//!   difference, clamped at zero (a clock stepped back reads zero, not a
//!   negative age), and from then on it grows with the monotonic clock.
//!
//! A frame stamped while the wall clock read before 1970 carries 0; its record
//! is placed no earlier than the start of the offset's entry.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;

use crate::format::seq::Seq;

/// A move of the offset between the wall clock and the monotonic clock larger
/// than this is a step of the wall clock.
const STEP: i128 = 1_000_000;

/// The monotonic clock of one outbox, and the wall clock's offsets from it.
pub(crate) struct Clock {
    /// Time zero of the monotonic clock: when the outbox was opened.
    start: Instant,
    /// Wall clock minus monotonic clock at the open, in microseconds.
    open_offset: i128,
    /// The first sequence number this process may write: records below it were
    /// recovered.
    first_written: Seq,
    /// From each sequence number on (in this process), the offset at which its
    /// frames' times were written, and the monotonic time the entry began.
    epochs: Mutex<Vec<Epoch>>,
}

#[derive(Clone, Copy)]
struct Epoch {
    from: Seq,
    offset: i128,
    began: i128,
}

impl Clock {
    /// The clock of an outbox opened now, which will write from `first_written`.
    pub(crate) fn new(first_written: Seq) -> Clock {
        let start = Instant::now();
        Clock {
            start,
            open_offset: wall_us(),
            first_written,
            epochs: Mutex::new(Vec::new()),
        }
    }

    /// Microseconds on the monotonic clock.
    fn mono_us(&self) -> i128 {
        self.start.elapsed().as_micros() as i128
    }

    /// Microseconds on the monotonic clock since the outbox was opened: the
    /// time leases are measured in.
    pub(crate) fn now_us(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_micros()).unwrap_or(u64::MAX - 1)
    }

    /// The instant `us` microseconds after the open (for a waiter's deadline).
    pub(crate) fn instant_at(&self, us: u64) -> Option<Instant> {
        self.start.checked_add(Duration::from_micros(us))
    }

    /// `t` in microseconds after the open (the inverse of
    /// [`Clock::instant_at`]); 1 for an instant before the open.
    pub(crate) fn us_at(&self, t: Instant) -> u64 {
        u64::try_from(t.saturating_duration_since(self.start).as_micros())
            .unwrap_or(u64::MAX - 1)
            .max(1)
    }

    /// The deadline of a lease of `lease` granted at `now` (µs), or
    /// [`NEVER`](crate::state::leases::NEVER) for a lease too long to reach.
    pub(crate) fn lease_deadline(now: u64, lease: Duration) -> u64 {
        u64::try_from(lease.as_micros())
            .ok()
            .and_then(|l| now.checked_add(l))
            .filter(|&d| d < crate::state::leases::NEVER)
            .unwrap_or(crate::state::leases::NEVER)
    }

    /// Called by the writer before it stamps a batch starting at `first`: notes
    /// the wall clock's offset if it is the first, or if the clock was stepped.
    pub(crate) fn stamping(&self, first: Seq) {
        let mono = self.mono_us();
        let offset = wall_us() - mono;
        let mut epochs = self.epochs.lock();
        let stepped = epochs
            .last()
            .is_none_or(|e| (offset - e.offset).abs() > STEP);
        if stepped {
            epochs.push(Epoch {
                from: first,
                offset,
                began: mono,
            });
        }
    }

    /// The age of the record `seq` whose frame was stamped `stamped_us`.
    pub(crate) fn age(&self, seq: Seq, stamped_us: u64) -> Duration {
        let now = self.mono_us();
        let stamped = i128::from(stamped_us);
        let at = if seq < self.first_written {
            // Recovered: never later than the open.
            (stamped - self.open_offset).min(0)
        } else {
            let epochs = self.epochs.lock();
            match epochs.iter().rev().find(|e| e.from <= seq) {
                Some(e) => (stamped - e.offset).max(e.began).min(now),
                None => now,
            }
        };
        Duration::from_micros(u64::try_from(now - at).unwrap_or(0))
    }
}

/// The wall clock in microseconds since the Unix epoch, negative before it.
fn wall_us() -> i128 {
    match SystemTime::now().duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_micros() as i128,
        Err(e) => -(e.duration().as_micros() as i128),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_recovered_record_ages_from_its_stamp_clamped_at_zero() {
        let clock = Clock::new(Seq::from(100));
        let now = wall_us() as u64;
        let hour = 3_600_000_000u64;
        // Stamped an hour before the open: an hour old.
        let age = clock.age(Seq::from(5), now - hour);
        assert!(age > Duration::from_secs(3590) && age < Duration::from_secs(3660));
        // Stamped an hour after (a clock that was ahead): zero, not negative.
        assert!(clock.age(Seq::from(6), now + hour) < Duration::from_secs(60));
    }

    #[test]
    fn a_record_of_this_process_ignores_a_later_step_of_the_wall_clock() {
        let clock = Clock::new(Seq::from(1));
        clock.stamping(Seq::from(1));
        let stamped = wall_us() as u64;
        // What a frame stamped now reads after the wall clock moved an hour
        // back or forward is not asked of the wall clock: the age comes from
        // the monotonic clock through the offset noted when it was written.
        let age = clock.age(Seq::from(1), stamped);
        assert!(age < Duration::from_secs(60), "{age:?}");
        // A step noted later opens a new entry, for later records only.
        {
            let began = clock.mono_us();
            let mut epochs = clock.epochs.lock();
            let offset = epochs[0].offset - 3_600_000_000;
            epochs.push(Epoch {
                from: Seq::from(10),
                offset,
                began,
            });
        }
        assert!(clock.age(Seq::from(1), stamped) < Duration::from_secs(60));
        // A record written after the step was stamped an hour "earlier", and is
        // still young.
        let after = stamped - 3_600_000_000;
        assert!(clock.age(Seq::from(10), after) < Duration::from_secs(60));
        // A frame stamped 0 (a clock before 1970) is placed no earlier than its
        // entry began.
        assert!(clock.age(Seq::from(10), 0) < Duration::from_secs(60));
    }
}
