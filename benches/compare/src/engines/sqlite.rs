//! SQLite as an outbox table: WAL mode, one transaction per append, drained by
//! selecting the oldest rows and deleting them in one transaction.

use std::path::Path;
use std::sync::Mutex;

use rusqlite::{Connection, TransactionBehavior};

use super::{Engine, Queue, Result};

/// The `synchronous` setting under WAL mode.
#[derive(Clone, Copy, Debug)]
pub enum Sync {
    /// Every commit fsyncs the WAL: durable on return.
    Full,
    /// Commits are written but fsynced only at checkpoints: not durable.
    Normal,
}

/// One connection shared behind a mutex: SQLite admits one writer at a time
/// anyway, and a mutex hands the turn over without the busy handler's sleeps.
pub struct Sqlite {
    conn: Mutex<Connection>,
}

const INSERT: &str = "INSERT INTO outbox (payload) VALUES (?1)";

impl Sqlite {
    pub fn open(dir: &Path, sync: Sync) -> Result<Sqlite> {
        let conn = Connection::open(dir.join("outbox.db"))?;
        let mode: String = conn.query_row("PRAGMA journal_mode=WAL", [], |row| row.get(0))?;
        if mode != "wal" {
            return Err(format!("sqlite refused WAL mode: journal_mode={mode}").into());
        }
        let level = match sync {
            Sync::Full => "FULL",
            Sync::Normal => "NORMAL",
        };
        conn.pragma_update(None, "synchronous", level)?;
        conn.execute_batch("CREATE TABLE outbox (id INTEGER PRIMARY KEY, payload BLOB NOT NULL);")?;
        Ok(Sqlite {
            conn: Mutex::new(conn),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Connection> {
        self.conn.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Engine for Sqlite {
    fn append(&self, payload: &[u8]) -> Result<()> {
        let conn = self.lock();
        conn.prepare_cached(INSERT)?.execute([payload])?;
        Ok(())
    }

    fn queue(&self) -> Option<&dyn Queue> {
        Some(self)
    }

    fn close(self: Box<Self>) -> Result<()> {
        let conn = self.conn.into_inner().unwrap_or_else(|e| e.into_inner());
        conn.close().map_err(|(_, e)| e)?;
        Ok(())
    }
}

/// Rows per transaction while filling.
const FILL_BATCH: u64 = 10_000;

impl Queue for Sqlite {
    fn fill(&self, payload: &[u8], count: u64) -> Result<()> {
        let mut conn = self.lock();
        let mut left = count;
        while left > 0 {
            let n = left.min(FILL_BATCH);
            let tx = conn.transaction()?;
            {
                let mut insert = tx.prepare_cached(INSERT)?;
                for _ in 0..n {
                    insert.execute([payload])?;
                }
            }
            tx.commit()?;
            left -= n;
        }
        Ok(())
    }

    fn drain(&self, max: usize) -> Result<usize> {
        let mut conn = self.lock();
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let mut taken = 0usize;
        let mut first = i64::MAX;
        let mut last = i64::MIN;
        {
            let mut select =
                tx.prepare_cached("SELECT id, payload FROM outbox ORDER BY id LIMIT ?1")?;
            let mut rows = select.query([max as i64])?;
            let mut bytes = 0usize;
            while let Some(row) = rows.next()? {
                let id: i64 = row.get(0)?;
                // A relay publishes the payload; reading it is the least it does.
                bytes += std::hint::black_box(row.get_ref(1)?.as_blob()?).len();
                first = first.min(id);
                last = last.max(id);
                taken += 1;
            }
            std::hint::black_box(bytes);
        }
        if taken > 0 {
            // One consumer: the oldest `taken` rows are exactly the ids in range.
            tx.prepare_cached("DELETE FROM outbox WHERE id BETWEEN ?1 AND ?2")?
                .execute([first, last])?;
        }
        tx.commit()?;
        Ok(taken)
    }
}
