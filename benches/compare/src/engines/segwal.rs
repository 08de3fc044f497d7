//! segwal with default options: durable on return, group commit by its writer.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use segwal::{Message, Options, Outbox, Record, Seq};

use super::{Counters, Engine, Queue, Result};

/// The linger of the `segwal linger` diagnostic: about the time 64 producers
/// woken by a batch take to queue again on two cores.
pub const LINGER: Duration = Duration::from_micros(150);

pub struct Segwal {
    outbox: Outbox,
    /// Appends messages, each with a deduplication id of its own, numbered
    /// from this counter.
    dedup: Option<AtomicU64>,
}

impl Segwal {
    pub fn open(dir: &Path) -> Result<Segwal> {
        Ok(Segwal {
            outbox: Outbox::open(dir, Options::default())?,
            dedup: None,
        })
    }

    /// With segment recycling off: every segment a new file.
    /// With a linger of [`LINGER`]: the writer waits that long after a batch's
    /// first request, so that a batch holds every producer.
    pub fn open_linger(dir: &Path) -> Result<Segwal> {
        Ok(Segwal {
            outbox: Outbox::open(dir, Options::default().linger(LINGER))?,
            dedup: None,
        })
    }

    /// With `Options::spin_wait`: a producer appending alone spins for its
    /// answer.
    pub fn open_spin(dir: &Path) -> Result<Segwal> {
        Ok(Segwal {
            outbox: Outbox::open(dir, Options::default().spin_wait(true))?,
            dedup: None,
        })
    }

    /// With `Options::caller_writes(false)`: every append goes through the
    /// writer thread, a lone producer's included.
    pub fn open_handoff(dir: &Path) -> Result<Segwal> {
        Ok(Segwal {
            outbox: Outbox::open(dir, Options::default().caller_writes(false))?,
            dedup: None,
        })
    }

    pub fn open_new_files(dir: &Path) -> Result<Segwal> {
        Ok(Segwal {
            outbox: Outbox::open(dir, Options::default().recycle_segments(false))?,
            dedup: None,
        })
    }

    /// With index checkpoints off: the newest segment read whole after a
    /// crash.
    pub fn open_no_checkpoints(dir: &Path) -> Result<Segwal> {
        Ok(Segwal {
            outbox: Outbox::open(dir, Options::default().checkpoint_bytes(0))?,
            dedup: None,
        })
    }

    pub fn open_dedup(dir: &Path) -> Result<Segwal> {
        Ok(Segwal {
            outbox: Outbox::open(dir, Options::default())?,
            dedup: Some(AtomicU64::new(0)),
        })
    }
}

impl Engine for Segwal {
    fn append(&self, payload: &[u8]) -> Result<()> {
        match &self.dedup {
            None => {
                self.outbox.append(payload)?;
            }
            Some(next) => {
                // An id like an event's, "order-<n>/created", on the stack.
                let n = next.fetch_add(1, Ordering::Relaxed);
                let mut id = [0u8; 32];
                let len = {
                    use std::io::Write as _;
                    let mut w = &mut id[..];
                    write!(w, "order-{n}/created")?;
                    32 - w.len()
                };
                let a = self
                    .outbox
                    .append_message(&Message::new(payload).dedup_id(&id[..len]))?;
                debug_assert!(!a.duplicate);
            }
        }
        Ok(())
    }

    fn counters(&self) -> Option<Counters> {
        let stats = self.outbox.stats();
        Some(Counters {
            records: stats.records_appended,
            batches: stats.batches,
            fsyncs: stats.fsyncs,
        })
    }

    fn queue(&self) -> Option<&dyn Queue> {
        Some(self)
    }

    fn close(self: Box<Self>) -> Result<()> {
        self.outbox.close()?;
        Ok(())
    }
}

/// Records per `append_batch` while filling: well under the default queue bytes.
const FILL_BATCH: u64 = 1024;

impl Queue for Segwal {
    fn fill(&self, payload: &[u8], count: u64) -> Result<()> {
        let mut left = count;
        while left > 0 {
            let n = left.min(FILL_BATCH);
            let batch: Vec<&[u8]> = (0..n).map(|_| payload).collect();
            self.outbox.append_batch(&batch)?;
            left -= n;
        }
        Ok(())
    }

    fn drain(&self, max: usize) -> Result<usize> {
        let records = self.outbox.claim(max)?;
        self.settle(records)
    }

    /// Waits in `claim_wait`, as segwal's own relay does: the writer wakes it
    /// when a batch of records becomes claimable.
    fn drain_wait(&self, max: usize, wait: Duration) -> Result<usize> {
        let records = self.outbox.claim_wait(max, wait)?;
        self.settle(records)
    }
}

impl Segwal {
    /// Reads the payloads of `records` and acknowledges them, as a relay that
    /// published them would.
    fn settle(&self, records: Vec<Record>) -> Result<usize> {
        let mut seqs: Vec<Seq> = Vec::with_capacity(records.len());
        let mut bytes = 0usize;
        for record in &records {
            // A relay publishes the payload; reading it is the least it does.
            bytes += std::hint::black_box(record.payload()).len();
            seqs.push(record.seq());
        }
        std::hint::black_box(bytes);
        drop(records);
        self.outbox.ack_many(&seqs)?;
        Ok(seqs.len())
    }
}
