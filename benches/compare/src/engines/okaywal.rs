//! okaywal: one entry of one chunk per record; `commit` returns once the entry
//! is fsynced (okaywal groups concurrent commits into one `fdatasync`).
//!
//! Its checkpoints go to `LogVoid`, which keeps nothing: a checkpointed file
//! is recycled, so a run of any length writes into two 1 MiB files that were
//! zero-filled once, every `fdatasync` carrying data only. segwal keeps every
//! record until a relay acknowledges it, so an append-only cell writes all of
//! its records into new space (docs/BENCHMARKS.md, "A segment written before
//! it is needed").

use std::path::Path;

use okaywal::{LogVoid, WriteAheadLog};

use super::{Engine, Result};

pub struct Okaywal {
    wal: WriteAheadLog,
}

impl Okaywal {
    pub fn open(dir: &Path) -> Result<Okaywal> {
        // Default configuration; `LogVoid` checkpoints by dropping entries, which
        // is all a benchmark of the log itself needs.
        Ok(Okaywal {
            wal: WriteAheadLog::recover(dir, LogVoid)?,
        })
    }
}

impl Engine for Okaywal {
    fn append(&self, payload: &[u8]) -> Result<()> {
        let mut entry = self.wal.begin_entry()?;
        entry.write_chunk(payload)?;
        entry.commit()?;
        Ok(())
    }

    fn close(self: Box<Self>) -> Result<()> {
        self.wal.shutdown()?;
        Ok(())
    }
}
