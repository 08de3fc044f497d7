//! fjall: one keyspace, big-endian u64 keys, the journal `fdatasync`ed after
//! every insert.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use fjall::{Database, Keyspace, KeyspaceCreateOptions, PersistMode};

use super::{Engine, Result};

pub struct Fjall {
    db: Database,
    keyspace: Keyspace,
    next_key: AtomicU64,
}

impl Fjall {
    pub fn open(dir: &Path) -> Result<Fjall> {
        let db = Database::builder(dir).open()?;
        let keyspace = db.keyspace("outbox", KeyspaceCreateOptions::default)?;
        Ok(Fjall {
            db,
            keyspace,
            next_key: AtomicU64::new(0),
        })
    }
}

impl Engine for Fjall {
    fn append(&self, payload: &[u8]) -> Result<()> {
        let key = self.next_key.fetch_add(1, Ordering::Relaxed).to_be_bytes();
        self.keyspace.insert(&key[..], payload)?;
        // The insert reached the OS; this makes it, and every insert before it,
        // durable. fjall holds its journal lock through the fdatasync.
        self.db.persist(PersistMode::SyncData)?;
        Ok(())
    }

    fn close(self: Box<Self>) -> Result<()> {
        self.db.persist(PersistMode::SyncData)?;
        drop(self);
        Ok(())
    }
}
