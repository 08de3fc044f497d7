//! The life of a segment file: created durably with its header, sealed, cut
//! back, removed. The one place that knows in which order those steps reach the
//! disk; the writer and recovery both go through it. The bytes themselves come
//! from the pure codecs (`format::segment`, `format::frame`, `format::seal`).
//!
//! The order, argued in docs/FORMAT.md ("Crash cases, one by one"):
//! - a new segment's header is fsynced, then its directory, before any frame is
//!   written to it;
//! - a seal is written after every frame before it is durable, then the file is
//!   cut just after it, then fsynced;
//! - a cut is always followed by an fsync of the file, so that nothing built on
//!   the shorter file can be undone by a power cut.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::error::Error;
use crate::format::frame::{self, FrameHeader, FrameKind};
use crate::format::segment::{BLOCK, FRAMES_AT, SegmentHeader};
use crate::format::seq::{SegmentId, Seq};
use crate::io::{Storage, StorageFile, write_all_at};

/// One segment file, open.
#[derive(Clone, Debug)]
pub(crate) struct SegmentFile {
    pub id: SegmentId,
    pub path: Arc<Path>,
    pub file: Arc<dyn StorageFile>,
}

/// A step of a segment's life that failed: which, on which file, and why. The
/// writer turns it into the poison, recovery into an error of the open.
#[derive(Debug)]
pub(crate) struct Failed {
    pub op: &'static str,
    pub path: PathBuf,
    pub source: io::Error,
}

impl Failed {
    fn new(op: &'static str, path: &Path, source: io::Error) -> Failed {
        Failed {
            op,
            path: path.to_path_buf(),
            source,
        }
    }

    /// The failure as an error of the open.
    pub(crate) fn into_error(self) -> Error {
        Error::io(self.op, self.path, self.source)
    }
}

/// An empty segment ready for the writer: its header is durable, and so is its
/// directory entry.
pub(crate) struct FreshSegment {
    pub segment: SegmentFile,
    /// Where the first frame goes: the block after the header's.
    pub len: u64,
    /// The header's nonce, repeated in the segment's seal index and keying its
    /// frames' checksums.
    pub nonce: u64,
    /// The outbox's identity, repeated in every segment.
    pub outbox_id: u128,
}

impl FreshSegment {
    /// The seed of this segment's frame checksums.
    pub(crate) fn salt(&self) -> u32 {
        frame::salt(self.segment.id, self.nonce)
    }
}

/// A seal still to be written into a segment recovery kept (it lacked one): the
/// writer writes it before anything else.
pub(crate) struct PendingSeal {
    pub segment: SegmentFile,
    /// The seed of the segment's frame checksums.
    pub salt: u32,
    /// Where the seal frame goes: just after the last frame kept.
    pub at: u64,
    /// The seal frame's sequence number.
    pub seq: Seq,
    /// Its payload: the segment's index.
    pub index: Vec<u8>,
}

impl SegmentFile {
    /// The segment `id` of the directory `dir`.
    pub(crate) fn path_of(dir: &Path, id: SegmentId) -> PathBuf {
        dir.join(id.file_name())
    }

    /// Creates the segment whose first frame will be `first`, of the outbox
    /// `outbox_id`, preallocated to `preallocate` bytes where the file system
    /// can, and makes it durable: the header's block is written and fsynced,
    /// then the directory is fsynced. No frame is written to the file before
    /// both returned, so a file whose header block is damaged and which holds
    /// nothing after it is a creation that a crash interrupted.
    ///
    /// On failure the file is cut back to nothing (best
    /// effort), so that it holds no header a power cut could take back: the
    /// next recovery removes an empty newest file.
    pub(crate) fn create(
        storage: &dyn Storage,
        dir: &Path,
        first: Seq,
        prev_seq: Seq,
        log_start: Seq,
        outbox_id: u128,
        preallocate: u64,
    ) -> Result<FreshSegment, Failed> {
        let id = SegmentId(first.get());
        let path: Arc<Path> = SegmentFile::path_of(dir, id).into();
        let file = storage
            .create(&path)
            .map_err(|e| Failed::new("create segment", &path, e))?;
        // Preallocated, an fdatasync need not make a grown size durable with each
        // batch. Only a speed-up: if space cannot be reserved, the file grows as
        // it is written and a full disk shows at the write.
        let _ = file.allocate(preallocate);
        let header = SegmentHeader {
            first_seq: first,
            prev_seq,
            log_start,
            created_unix_ms: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
            nonce: storage.random_u64(),
            outbox_id,
        };
        let segment = SegmentFile { id, path, file };
        let made_durable = write_all_at(&*segment.file, &header.encode_block(), 0)
            .map_err(|e| Failed::new("write segment header", &segment.path, e))
            .and_then(|()| {
                segment
                    .file
                    .sync_data()
                    .map_err(|e| Failed::new("sync segment header", &segment.path, e))
            })
            .and_then(|()| {
                storage
                    .sync_dir(dir)
                    .map_err(|e| Failed::new("sync directory", dir, e))
            });
        if let Err(e) = made_durable {
            segment.cut_back(0);
            return Err(e);
        }
        Ok(FreshSegment {
            segment,
            len: FRAMES_AT as u64,
            nonce: header.nonce,
            outbox_id,
        })
    }

    /// Writes the seal frame `seq` carrying `index` at `at` (a block boundary:
    /// every frame before it is durable), checksummed with `salt`, cuts the file
    /// just after it (a sealed segment ends with its seal: its preallocated
    /// space goes) and fsyncs. On failure the caller cuts back to `at`.
    pub(crate) fn seal(&self, at: u64, seq: Seq, index: &[u8], salt: u32) -> Result<(), Failed> {
        debug_assert_eq!(at % BLOCK as u64, 0, "a seal starts a block");
        let mut buf = Vec::with_capacity(frame::frame_len(index.len()));
        frame::encode(
            &mut buf,
            &FrameHeader {
                kind: FrameKind::Seal,
                batch_end: true,
                seq,
                group: seq,
                timestamp_us: now_us(),
            },
            index,
            salt,
        );
        let fail = |op| move |e| Failed::new(op, &self.path, e);
        write_all_at(&*self.file, &buf, at).map_err(fail("write seal"))?;
        self.file
            .set_len(at + buf.len() as u64)
            .map_err(fail("truncate after seal"))?;
        self.file.sync_data().map_err(fail("sync seal"))
    }

    /// Cuts the file to `len` bytes and makes the cut durable.
    pub(crate) fn cut(&self, len: u64) -> Result<(), Failed> {
        self.file
            .set_len(len)
            .map_err(|e| Failed::new("truncate segment", &self.path, e))?;
        self.file
            .sync_data()
            .map_err(|e| Failed::new("sync truncated segment", &self.path, e))
    }

    /// Cuts the file back to `len` bytes on a failure path: best effort, never
    /// retried, the error already in hand being the one that matters. A cut that
    /// fails leaves unsynced bytes that recovery fsyncs before it reads them
    /// (docs/FORMAT.md, "A failed write or fsync").
    pub(crate) fn cut_back(&self, len: u64) {
        let _ = self.cut(len);
    }

    /// Gives back the preallocated space past `len`, if any (at a clean close:
    /// everything before `len` is durable, so only zeros go; a failure changes
    /// nothing that matters).
    pub(crate) fn trim(&self, len: u64) {
        if self.file.len().is_ok_and(|l| l > len) {
            self.cut_back(len);
        }
    }
}

/// Microseconds since the Unix epoch: a frame's timestamp.
pub(crate) fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// The sealed segment files open at once, at most [`OPEN_FILES_MAX`]: a
/// backlog of thousands of segments (a long outage of the far side) must not
/// run the process out of file descriptors. The least recently used is closed
/// first (once no read holds it).
pub(crate) struct FileCache {
    storage: Arc<dyn Storage>,
    /// Least recently used first.
    open: parking_lot::Mutex<Vec<OpenFile>>,
}

/// A segment file held open by the cache: its path and its handle.
type OpenFile = (Arc<Path>, Arc<dyn StorageFile>);

/// Sealed segment files held open at once by one outbox (the active segment
/// has one more, held by the writer).
pub(crate) const OPEN_FILES_MAX: usize = 16;

impl FileCache {
    pub(crate) fn new(storage: Arc<dyn Storage>) -> FileCache {
        FileCache {
            storage,
            open: parking_lot::Mutex::new(Vec::with_capacity(OPEN_FILES_MAX)),
        }
    }

    /// The open file of the segment at `path`, opened now if it is not.
    pub(crate) fn get(&self, path: &Arc<Path>) -> io::Result<Arc<dyn StorageFile>> {
        {
            let mut open = self.open.lock();
            if let Some(k) = open.iter().position(|(p, _)| p == path) {
                // Most recently used last.
                let entry = open.remove(k);
                let file = entry.1.clone();
                open.push(entry);
                return Ok(file);
            }
        }
        // Opened outside the lock: a slow open delays no other read.
        let file = self.storage.open(path)?;
        let mut open = self.open.lock();
        if open.len() == OPEN_FILES_MAX {
            open.remove(0);
        }
        open.push((path.clone(), file.clone()));
        Ok(file)
    }

    /// Closes the file of the segment at `path`, if open (it is deleted).
    pub(crate) fn forget(&self, path: &Path) {
        self.open.lock().retain(|(p, _)| &**p != path);
    }
}
