//! The outbox's async methods: the same requests as the blocking ones, whose
//! waits (for room in the writer queue, for the writer's answer, for records
//! to claim) are futures woken through [`Waker`](std::task::Waker)s by the
//! writer, the notifier thread and the outbox's timer thread. No async
//! runtime is needed or assumed: any executor polls them.
//!
//! What a dropped future leaves behind (docs/GUARANTEES.md, "Async"):
//! - an append is queued in the poll that finds room in the writer queue,
//!   and from then on it is the writer's: dropping the future does not take
//!   it back, and the record is written (and durable with its batch) as if
//!   the caller had waited. Dropped before that poll, nothing is written. A
//!   caller that drops a future it polled does not know which happened: the
//!   record is *in doubt*, as after a crash, and a deduplication id
//!   ([`Message::dedup_id`](crate::Message)) makes a retry safe.
//! - a claim takes its records in one poll; dropped after it (while the
//!   attempts it counted are being made durable, under `max_attempts`), its
//!   records stay claimed until their lease runs out, as if the relay had
//!   died holding them.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use super::{Outbox, answers, appended, owned};
use crate::error::{Error, Result};
use crate::format::frame::frame_len;
use crate::format::seq::Seq;
use crate::io::reader::Record;
use crate::log::shared::{Completion, Shared, Ticket, Verdicts};
use crate::log::writer::{Payloads, Request};
use crate::message::{Appended, Message};
use crate::state::table::ClaimRun;

impl Outbox {
    /// [`append`](Outbox::append) as a future: the sequence number once the
    /// record is durable. Waits for room in the writer queue without blocking
    /// the executor's thread. Dropping the future once it was polled leaves
    /// the record in doubt: it may have been queued, and a queued record is
    /// written (see the module's notes in docs/GUARANTEES.md, "Async").
    ///
    /// ```
    /// # fn main() -> segwal::Result<()> {
    /// let dir = tempfile::tempdir().expect("temporary directory");
    /// let outbox = segwal::Outbox::open(dir.path(), segwal::Options::default())?;
    /// let seq = pollster::block_on(outbox.append_async(b"order 7781 paid"))?;
    /// assert_eq!(pollster::block_on(outbox.claim_async(1))?[0].seq(), seq);
    /// # outbox.close()?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn append_async(&self, payload: &[u8]) -> Result<Seq> {
        self.check_record(payload)?;
        let bytes = frame_len(payload.len()) as u64;
        let completion = self
            .queue_async(|| Payloads::One(payload.to_vec()), bytes)
            .await?;
        Answer(&completion).await
    }

    /// [`append_message`](Outbox::append_message) as a future: a record with
    /// an ordering key, a not-before time or a deduplication id. Dropped once
    /// polled, the message is in doubt like [`append_async`](Outbox::append_async)'s
    /// record; appending it again with the same deduplication id is safe.
    pub async fn append_message_async(&self, message: &Message<'_>) -> Result<Appended> {
        let bytes = self.check_messages(std::slice::from_ref(message))?;
        let hasher = self.handle.shared.hasher;
        let copy = || Payloads::Message(Box::new(owned(&hasher, message)));
        let completion = self.queue_async(copy, bytes).await?;
        let outcome = Answer(&completion).await;
        match (outcome, completion.take_verdicts()) {
            (Ok(_), Verdicts::One(v)) => Ok(appended(v)),
            (outcome, verdicts) => {
                answers(outcome, verdicts, std::slice::from_ref(message), &hasher)?
                    .pop()
                    .ok_or(Error::Closed)
            }
        }
    }

    /// [`sync`](Outbox::sync) as a future: every append, acknowledgement and
    /// change of delivery state made before it is durable once it resolves.
    pub async fn sync_async(&self) -> Result<()> {
        self.handle.shared.check_usable()?;
        let (completion, done) = Completion::new(&self.handle.shared.waiters);
        self.send(Request::Sync { done })?;
        Answer(&completion).await.map(|_| ())
    }

    /// [`claim`](Outbox::claim) as a future: up to `max_records` of the
    /// oldest claimable records, at once (empty when none is). It waits only
    /// when `max_attempts` is set, for the attempts it counted to be durable.
    pub async fn claim_async(&self, max_records: usize) -> Result<Vec<Record>> {
        let shared = &self.handle.shared;
        shared.check_open()?;
        let claimed = {
            let mut table = shared.table.lock();
            shared.check_open()?;
            self.claim_leased(&mut table, max_records, u64::MAX)
        };
        claimed.notices.report();
        self.hand_out_async(claimed.runs, claimed.durable_first, claimed.wake)
            .await
    }

    /// [`claim_wait`](Outbox::claim_wait) as a future: waits up to `timeout`
    /// for a record to become claimable (appended and durable, released, its
    /// delay or lease over), woken by the writer as soon as one is; an empty
    /// vector on timeout. The outbox's timer thread (started by the first
    /// wait) keeps its deadline, so no runtime's timer is needed.
    ///
    /// ```
    /// # fn main() -> segwal::Result<()> {
    /// use std::time::Duration;
    /// let dir = tempfile::tempdir().expect("temporary directory");
    /// let outbox = segwal::Outbox::open(dir.path(), segwal::Options::default())?;
    /// let none = pollster::block_on(outbox.claim_wait_async(10, Duration::from_millis(20)))?;
    /// assert!(none.is_empty());
    /// # outbox.close()?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn claim_wait_async(
        &self,
        max_records: usize,
        timeout: Duration,
    ) -> Result<Vec<Record>> {
        let (runs, durable_first, wake) = Arrival {
            outbox: self,
            max_records,
            // A timeout too long to represent waits without one.
            deadline: Instant::now().checked_add(timeout),
            timer: None,
            entry: None,
        }
        .await?;
        self.hand_out_async(runs, durable_first, wake).await
    }

    /// Queues an append of `bytes` (encoded) once the writer queue has room,
    /// copying its payloads (`copy`) only then; returns where the writer will
    /// leave its answer. Between the room taken and the request sent there is
    /// no wait, so a future dropped never holds room it did not use.
    async fn queue_async(
        &self,
        copy: impl FnOnce() -> Payloads,
        bytes: u64,
    ) -> Result<Arc<Completion>> {
        let ticket = Room {
            shared: &self.handle.shared,
            bytes,
            entry: None,
        }
        .await?;
        let (completion, done) = Completion::new(&self.handle.shared.waiters);
        self.send(Request::Append {
            payloads: copy(),
            ticket,
            done,
        })?;
        Ok(completion)
    }

    /// Makes the claim's attempts durable first if it counted them, then
    /// reads and checks its records.
    async fn hand_out_async(
        &self,
        runs: Vec<ClaimRun>,
        durable_first: bool,
        wake: bool,
    ) -> Result<Vec<Record>> {
        // Read first, as `hand_out` does.
        let records = self.read_before_hand_out(&runs, wake)?;
        if durable_first {
            let synced = self.sync_async().await;
            self.attempts_synced(&runs, self.synced_by_the_close(synced))?;
        }
        Ok(records)
    }
}

/// Room in the writer queue for a request of `bytes`.
struct Room<'a> {
    shared: &'a Arc<Shared>,
    bytes: u64,
    /// Its entry among the tasks waiting for room, once it waited.
    entry: Option<u64>,
}

impl Future for Room<'_> {
    type Output = Result<Ticket>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<Ticket>> {
        let this = &mut *self;
        Ticket::poll_take(this.shared, this.bytes, &mut this.entry, cx)
    }
}

impl Drop for Room<'_> {
    fn drop(&mut self) {
        self.shared.budget.forget_waiter(&mut self.entry);
    }
}

/// The writer's answer to one request.
struct Answer<'a>(&'a Completion);

impl Future for Answer<'_> {
    type Output = Result<Seq>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<Seq>> {
        self.0.poll(cx)
    }
}

/// Records to claim, a timeout, or the outbox closing: whichever comes first.
struct Arrival<'a> {
    outbox: &'a Outbox,
    max_records: usize,
    deadline: Option<Instant>,
    /// The timer set by the last poll, cancelled by the next (or on drop).
    timer: Option<u64>,
    /// Its entry among the tasks waiting for records, once it waited; taken
    /// out when it is dropped (done, timed out or given up).
    entry: Option<u64>,
}

impl Arrival<'_> {
    fn cancel_timer(&mut self) {
        if let (Some(id), Some(timers)) =
            (self.timer.take(), self.outbox.handle.shared.timers.get())
        {
            timers.cancel(id);
        }
    }
}

impl Future for Arrival<'_> {
    /// The records taken, whether their attempts wait for a sync, and
    /// whether the writer waits to be woken ([`Claimed`](super::Claimed)).
    type Output = Result<(Vec<ClaimRun>, bool, bool)>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        this.cancel_timer();
        let shared = &this.outbox.handle.shared;
        // In a child of a fork the table's lock may be held for ever by a
        // thread of the parent: checked before it too.
        if let Err(e) = shared.check_open() {
            return Poll::Ready(Err(e));
        }
        // Checked under the table lock, which `close` takes after marking the
        // outbox closed and before waking the tasks registered: a task either
        // sees the mark or is registered in time to be woken.
        let mut table = shared.table.lock();
        if let Err(e) = shared.check_open() {
            return Poll::Ready(Err(e));
        }
        let claimed = this
            .outbox
            .claim_leased(&mut table, this.max_records, u64::MAX);
        if !claimed.runs.is_empty() || this.max_records == 0 {
            drop(table);
            claimed.notices.report();
            return Poll::Ready(Ok((claimed.runs, claimed.durable_first, claimed.wake)));
        }
        // Nothing handed out, so nothing synced: the dead letters this claim
        // parked wait for the writer, woken once the lock is released.
        let wake_writer = |outbox: &Outbox| {
            if claimed.wake {
                outbox.nudge_writer();
            }
        };
        if this.deadline.is_some_and(|d| Instant::now() >= d) {
            drop(table);
            wake_writer(this.outbox);
            claimed.notices.report();
            return Poll::Ready(Ok((Vec::new(), false, false)));
        }
        // Registered under the table lock: records made claimable after the
        // claim above are made so under it too, and wake this task after.
        shared.arrivals.register(&mut this.entry, cx.waker());
        // Wake when the timeout ends, or when a lease or a delay runs out
        // (its record comes back): whichever is first.
        let lease_ends = table
            .next_lease_deadline()
            .and_then(|us| shared.clock.instant_at(us));
        drop(table);
        wake_writer(this.outbox);
        claimed.notices.report();
        let wake = match (this.deadline, lease_ends) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        if let Some(wake) = wake {
            match shared.timers() {
                Some(timers) => this.timer = Some(timers.wake_at(wake, cx.waker())),
                // No timer thread: poll again at once rather than miss the
                // deadline.
                None => cx.waker().wake_by_ref(),
            }
        }
        Poll::Pending
    }
}

impl Drop for Arrival<'_> {
    fn drop(&mut self) {
        self.cancel_timer();
        self.outbox
            .handle
            .shared
            .arrivals
            .deregister(&mut self.entry);
    }
}
