//! [`Relay`]: the loop that feeds a broker from an [`Outbox`], for any broker
//! behind the [`Publisher`] trait (docs/RELAY.md).
//!
//! A relay claims a batch, hands it to the publisher, and settles each record
//! by the publisher's [`Outcome`]: stored or duplicate, acknowledged; retry,
//! released with an exponential backoff (with jitter) and the reason; refused,
//! parked as a dead letter with the reason. A record is acknowledged only once
//! its publisher said the broker holds it, so a crash anywhere delivers it
//! again (at least once), never loses it. While a publish runs, a keeper
//! thread renews the leases of the records it holds, so a slow broker does
//! not let them go back to pending under the relay's feet.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::error::{Error, Result};
use crate::format::seq::Seq;
use crate::io::reader::Record;
use crate::outbox::Outbox;

#[cfg(feature = "nats")]
pub mod nats;

/// What became of one record a [`Publisher`] was given.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The broker stored it.
    Stored,
    /// The broker already held it (it deduplicated the publish): stored.
    Duplicate,
    /// Not stored this time (a timeout, the broker busy or unreachable): try
    /// again later. The reason goes with the record's next delivery.
    Retry(String),
    /// The broker refused it for good (too large, a schema it rejects): it
    /// becomes a dead letter with this reason.
    Refused(String),
}

/// A broker, as a relay sees it.
pub trait Publisher: Send {
    /// Publishes `records` (oldest first; records of one ordering key never
    /// more than one at a time) and returns one outcome per record, in order.
    /// Fewer outcomes than records count the missing ones as
    /// [`Outcome::Retry`]; outcomes beyond the last record are ignored.
    fn publish(&mut self, records: &[Record]) -> Vec<Outcome>;
}

impl<F> Publisher for F
where
    F: FnMut(&[Record]) -> Vec<Outcome> + Send,
{
    fn publish(&mut self, records: &[Record]) -> Vec<Outcome> {
        self(records)
    }
}

/// How a [`Relay`] runs. Built from [`RelayOptions::default()`].
#[derive(Clone, Debug)]
pub struct RelayOptions {
    pub(crate) batch: usize,
    pub(crate) wait: Duration,
    pub(crate) backoff_first: Duration,
    pub(crate) backoff_max: Duration,
    pub(crate) renew_every: Duration,
    pub(crate) renew_by: Duration,
    /// Whether [`renew_leases`](RelayOptions::renew_leases) was called:
    /// else the renewals follow the outbox's lease.
    pub(crate) renew_set: bool,
    pub(crate) sync_acks: bool,
}

impl Default for RelayOptions {
    fn default() -> RelayOptions {
        RelayOptions {
            batch: 256,
            wait: Duration::from_millis(100),
            backoff_first: Duration::from_millis(100),
            backoff_max: Duration::from_secs(60),
            renew_every: Duration::from_secs(10),
            renew_by: Duration::from_secs(30),
            renew_set: false,
            sync_acks: true,
        }
    }
}

impl RelayOptions {
    /// Records claimed and published at once, at most: the records in flight.
    /// Default 256; at least 1.
    pub fn batch(mut self, records: usize) -> RelayOptions {
        self.batch = records.max(1);
        self
    }

    /// How long a claim waits for records when none is pending, before the
    /// relay looks at its stop request again; also the pause of
    /// [`run`](Relay::run) after a claim that failed on one record (at most
    /// a second, and a quarter of the outbox's lease). Default
    /// 100 ms; at least 1 ms (a relay with nothing to do does not spin). A
    /// wait too long to represent as a deadline ([`Duration::MAX`]) waits
    /// until a record comes or the outbox closes: the stop request is then
    /// seen only after that.
    pub fn wait(mut self, wait: Duration) -> RelayOptions {
        self.wait = wait.max(Duration::from_millis(1));
        self
    }

    /// The delay before a record's second delivery after an
    /// [`Outcome::Retry`]; each later retry doubles it, up to `max`, and the
    /// delay drawn is between half of it and all of it (jitter, so that
    /// records failed together do not come back together). Defaults 100 ms
    /// and 60 s.
    pub fn backoff(mut self, first: Duration, max: Duration) -> RelayOptions {
        self.backoff_first = first;
        self.backoff_max = max.max(first);
        self
    }

    /// While a publish runs, the leases of its records are renewed every
    /// `every` by `by` ([`Outbox::extend`]). Unless this is called, a third
    /// of the outbox's [`Options::lease`](crate::Options::lease) and the
    /// lease: 10 s and 30 s under the default lease of 30 s (so a long lease
    /// is renewed as long, never cut short; a lease of 1 ms every 333 µs). `by` should exceed `every` by
    /// what a renewal may take. An `every` too long to represent as a
    /// deadline ([`Duration::MAX`]) renews nothing.
    pub fn renew_leases(mut self, every: Duration, by: Duration) -> RelayOptions {
        self.renew_every = every.max(Duration::from_millis(1));
        self.renew_by = by;
        self.renew_set = true;
        self
    }

    /// Whether a round waits for its acknowledgements to be durable
    /// ([`Outbox::sync`]) before the next round claims. Default `true`: then
    /// at most one round's records (a batch) are stored in the broker without
    /// a durable acknowledgement at any time, which bounds what a broker
    /// publisher must check for at a restart (docs/RELAY.md, "records in
    /// doubt"). The sync is group committed with the appends being written.
    /// `false` leaves acknowledgements to
    /// [`Options::ack_durability`](crate::Options::ack_durability).
    pub fn sync_acks(mut self, sync: bool) -> RelayOptions {
        self.sync_acks = sync;
        self
    }
}

/// What a relay did, and how far behind it is.
#[derive(Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct RelayStats {
    /// Records the broker stored.
    pub published: u64,
    /// Records the broker already held (acknowledged all the same).
    pub duplicates: u64,
    /// Deliveries that failed and were released to be tried again.
    pub retries: u64,
    /// Records the broker refused for good, parked as dead letters by this
    /// relay (those a claim parks under
    /// [`Options::max_attempts`](crate::Options::max_attempts) are counted in
    /// [`Stats::dead_letters`](crate::Stats::dead_letters)).
    pub dead_letters: u64,
    /// Claims that failed on one record's bytes, which [`Relay::run`] goes
    /// on past (unless the outbox's reads fail: see [`Relay::run`]):
    /// [`Error::Corrupt`] (the record is set aside, counted in
    /// [`Stats::corrupt_records`](crate::Stats::corrupt_records), never
    /// handed out; one a newer build wrote is held back instead and met
    /// again at each lease's end) or [`Error::Io`] reading it (held back
    /// until its lease runs out, then delivered again). The other records of the claim went
    /// back to pending and are published by the next rounds.
    pub unreadable: u64,
    /// Records pending in the outbox when the stats were taken.
    pub lag: u64,
    /// Age of the oldest pending record when the stats were taken.
    pub oldest_pending_age: Option<Duration>,
}

/// A relay: claims from an [`Outbox`], publishes with a [`Publisher`], and
/// settles each record by its outcome.
///
/// ```
/// use segwal::{Options, Outbox, Outcome, Record, Relay, RelayOptions};
///
/// # fn main() -> segwal::Result<()> {
/// let dir = tempfile::tempdir().expect("temporary directory");
/// let outbox = Outbox::open(dir.path(), Options::default())?;
/// outbox.append(b"event")?;
/// let publish = |records: &[Record]| records.iter().map(|_| Outcome::Stored).collect();
/// let mut relay = Relay::new(outbox.clone(), publish, RelayOptions::default());
/// assert_eq!(relay.step()?, 1);
/// assert_eq!(relay.stats().published, 1);
/// # outbox.close()?;
/// # Ok(())
/// # }
/// ```
pub struct Relay<P: Publisher> {
    outbox: Outbox,
    publisher: P,
    options: RelayOptions,
    stats: RelayStats,
    /// The records of the publish in progress, for the keeper.
    in_flight: Arc<InFlight>,
    keeper: Option<JoinHandle<()>>,
    jitter: u64,
    /// The last round's error came from its claim, on one record's bytes:
    /// [`run`](Relay::run) goes on past it.
    unreadable: bool,
}

/// Claims that failed reading a record within one lease, with no claim
/// returning records between them, at which [`Relay::run`] stops. A
/// failed read holds its record back for the lease, so failures within one
/// lease are of different records: the reads of the outbox fail, not one
/// record's; and each lease that runs out counts a delivery, so going on
/// would make dead letters of the backlog under `max_attempts`.
const READ_FAILURES_IN_A_LEASE: u32 = 3;

/// The records a publish holds, shared with the keeper thread.
#[derive(Default)]
struct InFlight {
    /// Each record's seq and the claim that handed it out: the keeper
    /// renews only this relay's own claims.
    seqs: Mutex<Vec<(Seq, u32)>>,
    wake: Condvar,
    stop: AtomicBool,
}

/// The shortest interval between renewals a relay takes by default (a third of
/// a lease of 1 ms is 333 µs).
const RENEW_EVERY_MIN: Duration = Duration::from_micros(100);

impl<P: Publisher> Relay<P> {
    /// A relay of `outbox` into `publisher`.
    pub fn new(outbox: Outbox, publisher: P, mut options: RelayOptions) -> Relay<P> {
        // Renewals follow the outbox's lease: a third of it, by it. Shorter
        // ones would cut a long lease short; longer ones come after the lease
        // ran out and renew nothing. A third of the shortest lease
        // (`Options::lease` takes 1 ms) is a third of a millisecond: the
        // first renewal must come before the claim's own lease runs out.
        let lease = outbox.lease();
        if !options.renew_set {
            options.renew_every = (lease / 3).max(RENEW_EVERY_MIN);
            options.renew_by = lease;
        }
        let jitter = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
            | 1;
        Relay {
            outbox,
            publisher,
            options,
            stats: RelayStats::default(),
            in_flight: Arc::new(InFlight::default()),
            keeper: None,
            jitter,
            unreadable: false,
        }
    }

    /// What the relay did so far, with the outbox's lag.
    pub fn stats(&self) -> RelayStats {
        let outbox = self.outbox.stats();
        RelayStats {
            lag: outbox.pending,
            oldest_pending_age: outbox.oldest_pending_age,
            ..self.stats.clone()
        }
    }

    /// One round: claims up to a batch (waiting up to [`RelayOptions::wait`]
    /// for one), publishes it, and settles every record (the
    /// acknowledgements of a round in one call, so one fsync under
    /// [`Durability::Sync`](crate::Durability::Sync) acknowledgements).
    /// Returns how many records it handled (0 when none was pending).
    /// Nothing it claimed is left claimed when it returns, unless settling it
    /// failed (the error is returned; the lease then gives the record back).
    ///
    /// A claim that failed on one record's bytes is returned as its error
    /// ([`Error::Corrupt`] or [`Error::Io`]) and counted in
    /// [`RelayStats::unreadable`]; the next round goes on with the other
    /// records. A poisoned outbox ([`Error::Poisoned`]) is returned before
    /// anything is claimed: its acknowledgements can no longer be made
    /// durable, so whatever a round published would be delivered again after
    /// the reopen.
    pub fn step(&mut self) -> Result<usize> {
        self.unreadable = false;
        self.outbox.check_usable()?;
        let records = match self
            .outbox
            .claim_wait(self.options.batch, self.options.wait)
        {
            Ok(records) => records,
            Err(e) => {
                if matches!(e, Error::Corrupt { .. } | Error::Io { .. }) {
                    self.unreadable = true;
                    self.stats.unreadable += 1;
                }
                return Err(e);
            }
        };
        if records.is_empty() {
            return Ok(0);
        }
        self.start_keeper();
        *self.in_flight.seqs.lock() = records.iter().map(|r| (r.seq(), r.claim)).collect();
        self.in_flight.wake.notify_all();
        // The keeper stops renewing when the publish returns, or when it
        // panics: then the records come back as their leases run out, rather
        // than be held for as long as the relay lives.
        let publishing = Publishing(&self.in_flight);
        let outcomes = self.publisher.publish(&records);
        drop(publishing);
        let mut outcomes = outcomes.into_iter();
        let mut stored = Vec::with_capacity(records.len());
        let mut first_error = None;
        for record in &records {
            let outcome = outcomes
                .next()
                .unwrap_or_else(|| Outcome::Retry("the publisher gave no outcome".into()));
            let settled = match outcome {
                Outcome::Stored => {
                    self.stats.published += 1;
                    stored.push(record.seq());
                    Ok(())
                }
                Outcome::Duplicate => {
                    self.stats.duplicates += 1;
                    stored.push(record.seq());
                    Ok(())
                }
                Outcome::Retry(reason) => {
                    let delay = self.backoff(record.attempt());
                    let released = self.outbox.release_record(record, delay, &reason);
                    self.stats.retries += u64::from(released.is_ok());
                    released
                }
                Outcome::Refused(reason) => {
                    let parked = self.outbox.dead_letter_record(record, &reason);
                    self.stats.dead_letters += u64::from(parked.is_ok());
                    parked
                }
            };
            // A record whose lease ran out during the publish went back to
            // pending: it is delivered again, as a later attempt, and
            // settled then. Not an error of the round.
            if let Err(e) = settled
                && first_error.is_none()
                && !matches!(e, Error::NotClaimed { .. })
            {
                first_error = Some(e);
            }
        }
        // A record whose lease ran out and was claimed again meanwhile is
        // still acknowledged (it was stored); one acknowledged already is Ok.
        // All in one call, so one fsync under `ack_durability(Sync)`; if one
        // of them went back to pending meanwhile (`ack_many` then
        // acknowledges none), one by one, leaving that one to its next
        // delivery.
        let acked = match self.outbox.ack_many(&stored) {
            Err(Error::NotClaimed { .. }) => stored
                .iter()
                .map(|seq| match self.outbox.ack(*seq) {
                    Err(Error::NotClaimed { .. }) => Ok(()),
                    other => other,
                })
                .find(Result::is_err)
                .unwrap_or(Ok(())),
            other => other,
        };
        if let Err(e) = acked
            && first_error.is_none()
        {
            first_error = Some(e);
        }
        if self.options.sync_acks
            && !stored.is_empty()
            && first_error.is_none()
            && let Err(e) = self.outbox.sync()
        {
            first_error = Some(e);
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(records.len()),
        }
    }

    /// Runs rounds until `stop` is set (checked between rounds: the round in
    /// progress finishes, so that the relay holds nothing when it returns) or
    /// an error; returns the stats.
    ///
    /// A claim that failed on one record's bytes (a checksum that does not
    /// match, a read error of the disk) does not stop it: that record is set
    /// aside or held back by the outbox, the failure is counted in
    /// [`RelayStats::unreadable`] (and reported as a `tracing` event), and
    /// after a pause ([`RelayOptions::wait`], at most a second and a quarter
    /// of the lease) the next round goes on with the other records. Read errors ([`Error::Io`]) in three claims
    /// within one [`Options::lease`](crate::Options::lease), with no claim
    /// returning records between them, end it with the last one: a failed
    /// read holds its record back for the lease, so those are three
    /// records, and the outbox's reads fail, not one record's (and under
    /// [`Options::max_attempts`](crate::Options::max_attempts) going on
    /// would make dead letters of the backlog, a lease's end counting a
    /// delivery). One record that can never be read fails at most once a
    /// lease, and does not stop it. Any other error ends it: the outbox
    /// closed or poisoned, an acknowledgement refused.
    pub fn run(&mut self, stop: &AtomicBool) -> Result<RelayStats> {
        let lease = self.outbox.lease();
        // The pause after a failure: short enough that three claims fit in
        // a lease.
        let pause = self
            .options
            .wait
            .min(Duration::from_secs(1))
            .min(lease / 4)
            .max(Duration::from_millis(1));
        // The read failures since the first of them, and when that was.
        let mut failures: Option<(Instant, u32)> = None;
        while !stop.load(Ordering::Acquire) {
            match self.step() {
                Ok(0) => {}
                Ok(_) => failures = None,
                Err(e @ Error::Io { .. }) if self.unreadable => {
                    let now = Instant::now();
                    let (first, n) = match failures {
                        Some((first, n)) if now.duration_since(first) < lease => (first, n + 1),
                        _ => (now, 1),
                    };
                    if n >= READ_FAILURES_IN_A_LEASE {
                        return Err(e);
                    }
                    failures = Some((first, n));
                    crate::event!(
                        warn,
                        error = %e,
                        "relay: a claim failed reading one record; the others go on"
                    );
                    std::thread::sleep(pause);
                }
                Err(_error) if self.unreadable => {
                    // A checksum that fails: the record is set aside, not
                    // held back, and is met once. (One a newer build wrote
                    // is held back, and met again at each lease's end.)
                    crate::event!(
                        warn,
                        error = %_error,
                        "relay: a claim failed on one record; the others go on"
                    );
                    std::thread::sleep(pause);
                }
                Err(e) => return Err(e),
            }
        }
        Ok(self.stats())
    }

    /// The delay before the next delivery after the `attempt`-th failed.
    fn backoff(&mut self, attempt: u32) -> Duration {
        let doublings = attempt.saturating_sub(1).min(30);
        let full = self
            .options
            .backoff_first
            .saturating_mul(1 << doublings)
            .min(self.options.backoff_max);
        // xorshift64: jitter, not cryptography.
        self.jitter ^= self.jitter << 13;
        self.jitter ^= self.jitter >> 7;
        self.jitter ^= self.jitter << 17;
        let fraction = 0.5 + (self.jitter % 1024) as f64 / 2048.0;
        full.mul_f64(fraction)
    }

    /// Starts the thread that renews the leases of a publish in progress.
    fn start_keeper(&mut self) {
        if self.keeper.is_some() {
            return;
        }
        let in_flight = self.in_flight.clone();
        let outbox = self.outbox.clone();
        let (every, by) = (self.options.renew_every, self.options.renew_by);
        self.keeper = std::thread::Builder::new()
            .name("segwal-relay-leases".into())
            .spawn(move || keep_leases(&in_flight, &outbox, every, by))
            .ok();
    }
}

impl<P: Publisher> Drop for Relay<P> {
    fn drop(&mut self) {
        self.in_flight.stop.store(true, Ordering::Release);
        {
            let _guard = self.in_flight.seqs.lock();
            self.in_flight.wake.notify_all();
        }
        if let Some(keeper) = self.keeper.take() {
            let _ = keeper.join();
        }
    }
}

/// A publish in progress: clears the records in flight when dropped, at its
/// end or by a panic of the publisher.
struct Publishing<'a>(&'a InFlight);

impl Drop for Publishing<'_> {
    fn drop(&mut self) {
        self.0.seqs.lock().clear();
    }
}

/// The keeper: while records are in flight, renews their leases every
/// `every` by `by`; sleeps while none is.
fn keep_leases(in_flight: &InFlight, outbox: &Outbox, every: Duration, by: Duration) {
    let mut seqs = in_flight.seqs.lock();
    while !in_flight.stop.load(Ordering::Acquire) {
        if seqs.is_empty() {
            in_flight.wake.wait(&mut seqs);
            continue;
        }
        // A renewal interval too long to represent renews nothing.
        let Some(deadline) = Instant::now().checked_add(every) else {
            in_flight.wake.wait(&mut seqs);
            continue;
        };
        let timed_out = in_flight.wake.wait_until(&mut seqs, deadline).timed_out();
        if timed_out && !seqs.is_empty() {
            let held = seqs.clone();
            drop(seqs);
            for (seq, claim) in held {
                // Settled meanwhile, or already gone back (and maybe taken
                // by another relay's claim): nothing to renew.
                let _ = outbox.extend_by(seq, Some(claim), by);
            }
            seqs = in_flight.seqs.lock();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_at_their_extremes_neither_spin_nor_overflow() {
        assert_eq!(
            RelayOptions::default().wait(Duration::ZERO).wait,
            Duration::from_millis(1)
        );
        // A renewal interval past what an `Instant` can hold renews nothing,
        // and the keeper ends when asked.
        let in_flight = Arc::new(InFlight::default());
        in_flight.seqs.lock().push((Seq::from(1), 1));
        let dir = tempfile::tempdir().expect("temporary directory");
        let outbox = Outbox::open(dir.path(), crate::Options::default()).expect("open");
        let keeper = {
            let (in_flight, outbox) = (in_flight.clone(), outbox.clone());
            std::thread::spawn(move || {
                keep_leases(&in_flight, &outbox, Duration::MAX, Duration::MAX);
            })
        };
        std::thread::sleep(Duration::from_millis(20));
        in_flight.stop.store(true, Ordering::Release);
        {
            let _guard = in_flight.seqs.lock();
            in_flight.wake.notify_all();
        }
        keeper.join().expect("the keeper ends without a panic");
        outbox.close().expect("close");
    }

    #[test]
    fn renewals_follow_the_outboxs_lease_long_or_short() {
        for (lease, every) in [
            (Duration::from_secs(2), Duration::from_millis(666)),
            (Duration::from_secs(30), Duration::from_secs(10)),
            (Duration::from_secs(300), Duration::from_secs(100)),
        ] {
            let dir = tempfile::tempdir().expect("temporary directory");
            let outbox =
                Outbox::open(dir.path(), crate::Options::default().lease(lease)).expect("open");
            let publish = |_: &[Record]| Vec::new();
            let relay = Relay::new(outbox.clone(), publish, RelayOptions::default());
            let (e, b) = (relay.options.renew_every, relay.options.renew_by);
            assert_eq!((e.as_millis(), b), (every.as_millis(), lease));
            drop(relay);
            outbox.close().expect("close");
        }
        // The shortest leases `Options::lease` takes: renewed every third of
        // the lease too, the first well before the claim's lease runs out
        // (every millisecond, a 1 ms lease's first renewal came as it ran out).
        for lease in [1, 2] {
            let dir = tempfile::tempdir().expect("temporary directory");
            let options = crate::Options::default().lease(Duration::from_millis(lease));
            let outbox = Outbox::open(dir.path(), options).expect("open");
            let publish = |_: &[Record]| Vec::new();
            let relay = Relay::new(outbox.clone(), publish, RelayOptions::default());
            let (e, b) = (relay.options.renew_every, relay.options.renew_by);
            assert_eq!(e, Duration::from_millis(lease) / 3, "lease {lease} ms");
            assert_eq!(b, Duration::from_millis(lease), "lease {lease} ms");
            drop(relay);
            outbox.close().expect("close");
        }
    }
}
