//! Known bugs, injected into one outbox for the negative controls of the crash
//! harness: each must be caught, or the harness proves nothing.
//!
//! Where a bug is a wrong use of the disk, it lives behind the storage seam
//! ([`BuggyStorage`]), as the simulated disk does, and the engine's code does
//! not know of it. The others are decisions of the engine; each is consulted
//! once, at its decision point, through [`injected!`](crate::injected), which
//! is the constant `false` without the `testing` feature.

use std::fmt;
use std::io;
use std::ops::Range;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::io::{LockError, LockGuard, Storage, StorageFile};
use crate::options::Options;

/// Known bugs the crash-testing harness must catch (negative controls).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Bug {
    /// Complete producers before the batch's fsync returned.
    AckBeforeFsync,
    /// Skip the directory fsync after creating a segment (behind the storage
    /// seam: a directory fsync that follows a file's creation does nothing).
    NoDirSyncAfterCreate,
    /// Treat damage anywhere as a torn tail: cut the log there and drop the rest.
    TruncateMidLogCorruption,
    /// Treat damage in the newest segment as a torn tail whatever follows it:
    /// a later sync group, which proves the damaged bytes were fsynced, is
    /// not looked for, and the fsynced records from the damage on are cut.
    NewestDamageIsTorn,
    /// Retry a failed fsync, and believe the retry (behind the storage seam).
    RetryFailedFsync,
    /// Hand out records without checking their CRC on the read path.
    SkipReadCrc,
    /// Delete a sealed segment that still holds a pending record.
    DeleteLiveSegment,
    /// Start a sync group right where the previous one ended, inside the block
    /// that holds its fsynced bytes (format version 1's layout).
    UnalignedSyncGroups,
    /// Ignore the acks frames of the log at recovery: durable
    /// acknowledgements forgotten, their records delivered again.
    ForgetAcksAtRecovery,
    /// Ignore the dead-letter frames of the log at recovery: dead letters
    /// delivered again.
    ForgetDeadLettersAtRecovery,
    /// Leave the first record of each relocation step behind, uncopied, and
    /// let its old place go as if it had been carried forward: a live record
    /// lost when its old segment is deleted.
    RelocationDropsRecord,
    /// Count a delivery's attempt in memory only: no attempts frame is
    /// written before a record is handed out under `max_attempts`, so a
    /// crash forgets deliveries.
    AttemptsInMemoryOnly,
    /// Ignore ordering keys when new records reach the state table: a key's
    /// records are handed out together.
    IgnoreKeys,
    /// Ignore the fields frames of the log at recovery: keys, not-before
    /// times and deduplication ids forgotten by a crash.
    ForgetFieldsAtRecovery,
    /// Write no tombstones before deleting segments: a deduplication id is
    /// forgotten once its record's segment is deleted and the outbox reopens.
    ForgetTombstones,
    /// Write an append a quota refused, and answer it refused all the same.
    QuotaWritesAnyway,
    /// Rename a recycled segment's file to the new segment's name without
    /// first making its new header durable: a crash can leave the name over
    /// the old header, or over a garbled one.
    RecycleHeaderUnsynced,
    /// Write index checkpoints that list every frame as a record: an open
    /// after a crash takes the internal frames before the last checkpoint
    /// (acks, fields, log starts) for records.
    CheckpointHidesInternal,
    /// The writer panics in the middle of a batch, after its write and
    /// before its sync (a bug of any kind in the batch code). Not one for
    /// the crash harness: `faults::a_writer_panic_tells_its_batch_in_doubt`
    /// checks that every producer of the batch is told its append is in
    /// doubt (`Error::Poisoned`, never `Error::Closed`), on the writer
    /// thread and on a producer's own, and that a reopen recovers.
    WriterPanics,
}

impl Options {
    /// Injects a known bug into this outbox, for the negative controls of the
    /// crash-testing harness. Never use it for anything else.
    pub fn inject_bug(mut self, bug: Bug) -> Options {
        self.bugs.push(bug);
        self
    }
}

/// Whether `bug` is injected into the outbox configured by `options`.
pub(crate) fn injected(options: &Options, bug: Bug) -> bool {
    options.bugs.contains(&bug)
}

/// The storage an outbox configured by `options` runs on: `storage` itself, or
/// `storage` behind the bugs that live at the storage seam.
pub fn storage_for(storage: Arc<dyn Storage>, options: &Options) -> Arc<dyn Storage> {
    let no_dir_sync = injected(options, Bug::NoDirSyncAfterCreate);
    let retry_sync = injected(options, Bug::RetryFailedFsync);
    if !no_dir_sync && !retry_sync {
        return storage;
    }
    Arc::new(BuggyStorage {
        inner: storage,
        no_dir_sync,
        retry_sync,
        created: AtomicBool::new(false),
    })
}

/// A storage that makes the engine's use of the disk wrong in a known way.
pub struct BuggyStorage {
    inner: Arc<dyn Storage>,
    /// `NoDirSyncAfterCreate`: the directory fsync after a file's creation does
    /// nothing.
    no_dir_sync: bool,
    /// `RetryFailedFsync`: a failed `sync_data` is retried once, and the retry
    /// believed.
    retry_sync: bool,
    /// A file was created since the last directory fsync.
    created: AtomicBool,
}

impl fmt::Debug for BuggyStorage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BuggyStorage")
            .field("inner", &self.inner)
            .field("no_dir_sync", &self.no_dir_sync)
            .field("retry_sync", &self.retry_sync)
            .finish()
    }
}

impl Storage for BuggyStorage {
    fn create_dir(&self, dir: &Path) -> io::Result<bool> {
        self.inner.create_dir(dir)
    }
    fn resolve(&self, dir: &Path) -> io::Result<std::path::PathBuf> {
        self.inner.resolve(dir)
    }
    fn close(&self) {
        self.inner.close();
    }
    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        self.inner.list(dir)
    }
    fn create(&self, path: &Path) -> io::Result<Arc<dyn StorageFile>> {
        let file = self.inner.create(path)?;
        self.created.store(true, Ordering::Relaxed);
        Ok(self.wrap(file))
    }
    fn open(&self, path: &Path) -> io::Result<Arc<dyn StorageFile>> {
        Ok(self.wrap(self.inner.open(path)?))
    }
    fn remove(&self, path: &Path) -> io::Result<()> {
        self.inner.remove(path)
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.inner.rename(from, to)
    }
    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        if self.no_dir_sync && self.created.swap(false, Ordering::Relaxed) {
            return Ok(());
        }
        self.inner.sync_dir(dir)
    }
    fn random_u64(&self) -> u64 {
        self.inner.random_u64()
    }
    fn lock(&self, dir: &Path) -> Result<LockGuard, LockError> {
        self.inner.lock(dir)
    }
}

impl BuggyStorage {
    fn wrap(&self, file: Arc<dyn StorageFile>) -> Arc<dyn StorageFile> {
        if self.retry_sync {
            Arc::new(RetryingFile(file))
        } else {
            file
        }
    }
}

/// A file whose failed `sync_data` is retried once, the retry believed.
#[derive(Debug)]
struct RetryingFile(Arc<dyn StorageFile>);

impl StorageFile for RetryingFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.0.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<usize> {
        self.0.write_at(buf, offset)
    }
    fn sync_data(&self) -> io::Result<()> {
        self.0.sync_data().or_else(|_| self.0.sync_data())
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.0.set_len(len)
    }
    fn allocate(&self, len: u64) -> io::Result<()> {
        self.0.allocate(len)
    }
    fn next_data(&self, offset: u64) -> io::Result<Option<Range<u64>>> {
        self.0.next_data(offset)
    }
    fn len(&self) -> io::Result<u64> {
        self.0.len()
    }
}
