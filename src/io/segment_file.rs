//! The life of a segment file: created durably with its header, sealed, cut
//! back, removed. The one place that knows in which order those steps reach the
//! disk; the writer and recovery both go through it. The bytes themselves come
//! from the pure codecs (`format::segment`, `format::frame`, `format::seal`).
//!
//! The order, argued in docs/FORMAT.md ("Crash cases, one by one"):
//! - a new segment's header is written and fsynced under a temporary name, then
//!   the file is renamed and its directory fsynced, before any frame is written
//!   to it;
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
use crate::format::seal::SealPayload;
use crate::format::segment::{BLOCK, FRAMES_AT, SegmentHeader};
use crate::format::seq::{QUARANTINE_DIR, SegmentId, Seq};
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
    /// How far the file's bytes were written already: past the header's block
    /// for a recycled file (the segment it held before), where the writer
    /// needs no zeros ahead of its frames; [`FreshSegment::len`] otherwise.
    pub written_to: u64,
    /// Bytes between its index checkpoints, as its header says (0: none).
    pub checkpoint_every: u32,
}

impl FreshSegment {
    /// The seed of this segment's frame checksums.
    pub(crate) fn salt(&self) -> u32 {
        frame::salt(self.segment.id, self.nonce)
    }
}

/// A recycling that failed: before the file took the segment's name (the
/// writer creates a new file instead), or after (the writer fails, as when a
/// creation fails).
#[derive(Debug)]
pub(crate) enum Recycling {
    Before(Failed),
    After(Failed),
}

/// What names a segment about to be made: its header's fields but the nonce
/// and the clock.
#[derive(Clone, Copy)]
pub(crate) struct Successor {
    /// The seq of its first frame, which names it.
    pub first: Seq,
    /// The seq of the seal of the segment before it.
    pub prev_seq: Seq,
    /// The log start when it is made.
    pub log_start: Seq,
    /// The outbox's identity.
    pub outbox_id: u128,
    /// Bytes between its index checkpoints (0: none).
    pub checkpoint_every: u32,
}

impl Successor {
    /// The header of the segment it describes, with a new nonce (and so a
    /// new salt for its frames' checksums) and the time of now.
    fn header(&self, storage: &dyn Storage) -> SegmentHeader {
        SegmentHeader {
            first_seq: self.first,
            prev_seq: self.prev_seq,
            log_start: self.log_start,
            created_unix_ms: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
            nonce: storage.random_u64(),
            outbox_id: self.outbox_id,
            checkpoint_every: self.checkpoint_every,
        }
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
    pub index: SealPayload,
}

impl SegmentFile {
    /// The segment `id` of the directory `dir`.
    pub(crate) fn path_of(dir: &Path, id: SegmentId) -> PathBuf {
        dir.join(id.file_name())
    }

    /// Creates the segment `next` describes, preallocated to `preallocate` bytes where the file system
    /// can, and makes it durable. The file is created under a temporary name
    /// (`<name>.creating`), its header's block written and fsynced, and only
    /// then renamed to the segment's name and the directory fsynced; its space
    /// is reserved last (see the comment there). So a file
    /// bearing a segment's name always has a durable header, which is never
    /// written again (frames start on the next block): a segment whose header
    /// does not check was damaged, not interrupted, and recovery refuses to
    /// guess (docs/FORMAT.md, "Creating a segment"). No frame is written before
    /// this returns.
    ///
    /// On failure the temporary file is removed (best effort; recovery removes
    /// or sets aside one that is left).
    pub(crate) fn create(
        storage: &dyn Storage,
        dir: &Path,
        next: Successor,
        preallocate: u64,
    ) -> Result<FreshSegment, Failed> {
        let id = SegmentId(next.first.get());
        let path: Arc<Path> = SegmentFile::path_of(dir, id).into();
        let creating = dir.join(id.creating_name());
        let file = storage
            .create(&creating)
            .map_err(|e| Failed::new("create segment", &creating, e))?;
        let header = next.header(storage);
        let made_durable = write_all_at(&*file, &header.encode_block(), 0)
            .map_err(|e| Failed::new("write segment header", &creating, e))
            .and_then(|()| {
                file.sync_data()
                    .map_err(|e| Failed::new("sync segment header", &creating, e))
            })
            .and_then(|()| {
                storage
                    .rename(&creating, &path)
                    .map_err(|e| Failed::new("rename new segment", &creating, e))
            });
        if let Err(e) = made_durable {
            let _ = storage.remove(&creating);
            return Err(e);
        }
        let segment = SegmentFile { id, path, file };
        // Once renamed, the file is the segment: a failed directory fsync leaves
        // it to recovery, which finds it whole under either name.
        storage
            .sync_dir(dir)
            .map_err(|e| Failed::new("sync directory", dir, e))?;
        // Preallocated, an fdatasync need not make a grown size durable with
        // each batch. Only a speed-up: if space cannot be reserved, the file
        // grows as it is written and a full disk shows at the write.
        // Reserved only once the file bears the segment's name durably: a
        // `.creating` file whose header a power cut garbled, or whose grown
        // size came back without its data (bytes after the header that are
        // not zeros), cannot be proven this outbox's, and recovery sets it
        // aside whole; reserved earlier, the preallocation went with it into
        // `quarantine/`, and on a full disk no later open could create a
        // segment. Named, the file is the segment: whatever a power cut
        // leaves past its durable header is a tail recovery cuts.
        let _ = segment.file.allocate(preallocate);
        Ok(FreshSegment {
            segment,
            len: FRAMES_AT as u64,
            nonce: header.nonce,
            outbox_id: next.outbox_id,
            written_to: FRAMES_AT as u64,
            checkpoint_every: next.checkpoint_every,
        })
    }

    /// Makes the file `spare` (a fully acknowledged segment of this outbox,
    /// renamed `<name>.seg.free` durably when it was let go) the segment whose
    /// first frame will be `first`, and makes it durable: its header's block
    /// is written and fsynced while the file still bears the spare's name,
    /// and only then is it renamed to the segment's name and the directory
    /// fsynced, so that a file bearing a segment's name always has a durable
    /// header, as in [`SegmentFile::create`]. The bytes past the header's
    /// block are the old segment's until frames overwrite them: they fail
    /// the new segment's checksums, whose salt comes from a new nonce
    /// (docs/FORMAT.md, "Recycled segments").
    ///
    /// On a failure before the rename the spare is removed (best effort:
    /// recovery settles one that is left) and the caller creates a new file
    /// instead; after it, the failure is the caller's, as a failed creation
    /// would be. (`sync_header` is false only under the negative control
    /// `RecycleHeaderUnsynced`.)
    pub(crate) fn recycle(
        storage: &dyn Storage,
        dir: &Path,
        spare: &Path,
        next: Successor,
        sync_header: bool,
    ) -> Result<FreshSegment, Recycling> {
        let id = SegmentId(next.first.get());
        let path: Arc<Path> = SegmentFile::path_of(dir, id).into();
        let mut header = next.header(storage);
        let made = storage
            .open(spare)
            .map_err(|e| Failed::new("open segment to recycle", spare, e))
            .and_then(|file| {
                let len = file
                    .len()
                    .map_err(|e| Failed::new("stat segment to recycle", spare, e))?;
                // The old frames fail the new checksums because the salt
                // differs; a new nonce that happened to give the old salt
                // (once in 2^32) is drawn again.
                let mut old = vec![0u8; FRAMES_AT.min(len as usize)];
                if crate::io::read_exact_at(&*file, &mut old, 0).is_ok()
                    && let Ok(h) = SegmentHeader::decode(&old)
                {
                    let old_salt = frame::salt(SegmentId(h.first_seq.get()), h.nonce);
                    while frame::salt(id, header.nonce) == old_salt {
                        header.nonce = storage.random_u64();
                    }
                }
                write_all_at(&*file, &header.encode_block(), 0)
                    .map_err(|e| Failed::new("write segment header", spare, e))?;
                if sync_header {
                    file.sync_data()
                        .map_err(|e| Failed::new("sync segment header", spare, e))?;
                }
                storage
                    .rename(spare, &path)
                    .map_err(|e| Failed::new("rename recycled segment", spare, e))?;
                Ok((file, len))
            });
        let (file, len) = match made {
            Ok(made) => made,
            Err(e) => {
                let _ = storage.remove(spare);
                return Err(Recycling::Before(e));
            }
        };
        let segment = SegmentFile { id, path, file };
        // Renamed, the file is the segment: a failed directory fsync now is
        // the writer's failure, as in `create` (recovery finds the file whole
        // under either name).
        storage
            .sync_dir(dir)
            .map_err(|e| Recycling::After(Failed::new("sync directory", dir, e)))?;
        Ok(FreshSegment {
            segment,
            len: FRAMES_AT as u64,
            nonce: header.nonce,
            outbox_id: next.outbox_id,
            written_to: len.max(FRAMES_AT as u64),
            checkpoint_every: next.checkpoint_every,
        })
    }

    /// Writes the seal frame `seq` carrying `index` at `at` (a block boundary:
    /// every frame before it is durable), checksummed with `salt`, cuts the file
    /// just after it (a sealed segment ends with its seal: its preallocated
    /// space goes) and fsyncs. On failure the caller cuts back to `at`.
    pub(crate) fn seal(
        &self,
        at: u64,
        seq: Seq,
        index: SealPayload,
        salt: u32,
    ) -> Result<(), Failed> {
        debug_assert_eq!(at % BLOCK as u64, 0, "a seal starts a block");
        let header = FrameHeader {
            kind: FrameKind::Seal,
            batch_end: true,
            seq,
            group: seq,
            timestamp_us: now_us(),
        };
        let buf = index.into_frame(&header, salt);
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
    /// nothing that matters). Returns whether it cut, and so synced.
    pub(crate) fn trim(&self, len: u64) -> bool {
        self.file.len().is_ok_and(|l| l > len) && self.cut(len).is_ok()
    }
}

/// Moves the file `path` of `dir` into the quarantine folder, named after it and
/// `reason`, durably; returns where it went. For a file recovery must get past
/// but cannot prove it may delete.
pub(crate) fn set_aside(
    storage: &dyn Storage,
    dir: &Path,
    path: &Path,
    reason: &str,
) -> Result<PathBuf, Failed> {
    let to = aside_path(storage, dir, path, reason)?;
    storage
        .rename(path, &to)
        .map_err(|e| Failed::new("move into quarantine", path, e))?;
    sync_aside(storage, dir)?;
    Ok(to)
}

/// Copies the file `path` of `dir` whole into the quarantine folder, named after
/// it and `reason`, durably; returns the copy's path. For a file a lossy repair
/// is about to cut.
///
/// The copy is written under a name of its own (`<name>.<reason>.partial`)
/// and renamed to its name once it is whole and durable: an operator who
/// restores from the folder never takes a part of a file for the copy. One
/// that fails (a disk full before the copy's end) is removed, its space given
/// back to the repair that tries again. What an earlier repair a crash
/// interrupted left is settled first, so that a repair on a disk as full as
/// before gets through: a whole copy of the file as it is (the crash came
/// after the copy, before the cut) is the copy; a partial one whose bytes
/// are the file's first bytes holds nothing the file does not, and is
/// removed.
pub(crate) fn copy_aside(
    storage: &dyn Storage,
    dir: &Path,
    path: &Path,
    reason: &str,
) -> Result<PathBuf, Failed> {
    if let Some(whole) = earlier_copies(storage, dir, path, reason)? {
        return Ok(whole);
    }
    let to = aside_path(storage, dir, path, reason)?;
    let partial = aside_path(storage, dir, path, &format!("{reason}.partial"))?;
    let from = storage
        .open(path)
        .map_err(|e| Failed::new("open segment", path, e))?;
    let len = from
        .len()
        .map_err(|e| Failed::new("stat segment", path, e))?;
    let copy = storage
        .create(&partial)
        .map_err(|e| Failed::new("create quarantine copy", &partial, e))?;
    let copied = (|| {
        let mut buf = vec![0u8; 1 << 20];
        let mut at = 0;
        while at < len {
            let n = (len - at).min(buf.len() as u64) as usize;
            let chunk = &mut buf[..n];
            crate::io::read_exact_at(&*from, chunk, at)
                .map_err(|e| Failed::new("read segment", path, e))?;
            write_all_at(&*copy, chunk, at)
                .map_err(|e| Failed::new("write quarantine copy", &partial, e))?;
            at += n as u64;
        }
        copy.sync_data()
            .map_err(|e| Failed::new("sync quarantine copy", &partial, e))?;
        storage
            .rename(&partial, &to)
            .map_err(|e| Failed::new("rename quarantine copy", &partial, e))
    })();
    if let Err(failed) = copied {
        drop(copy);
        let _ = storage.remove(&partial);
        return Err(failed);
    }
    sync_aside(storage, dir)?;
    Ok(to)
}

/// Settles the copies of `path` an interrupted [`copy_aside`] for `reason`
/// left in the quarantine folder of `dir`: returns one that is whole and
/// equal to the file, made durable (a copy a failed try renamed but did not
/// sync, or one a person made, must not be the only copy of bytes the cut
/// removes), after removing every partial one whose bytes begin the file.
/// Only plain files of their own are read (never through a symbolic link,
/// never a file another name is linked to: a link to the segment itself
/// would compare equal, and the cut would take it too). Names it did not
/// give, files whose bytes differ, and files it cannot read or remove are
/// left.
fn earlier_copies(
    storage: &dyn Storage,
    dir: &Path,
    path: &Path,
    reason: &str,
) -> Result<Option<PathBuf>, Failed> {
    let folder = dir.join(QUARANTINE_DIR);
    let Ok(names) = storage.list(&folder) else {
        return Ok(None);
    };
    let Some(name) = path.file_name() else {
        return Ok(None);
    };
    let base = format!("{}.{reason}", name.to_string_lossy());
    let numbered = |rest: &str| {
        rest.is_empty()
            || rest
                .strip_prefix('.')
                .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    };
    let file = storage
        .open(path)
        .map_err(|e| Failed::new("open segment", path, e))?;
    let len = file
        .len()
        .map_err(|e| Failed::new("stat segment", path, e))?;
    let (mut whole, mut removed) = (None, false);
    for candidate in names {
        let Some(rest) = candidate.strip_prefix(base.as_str()) else {
            continue;
        };
        let partial = match rest.strip_prefix(".partial") {
            Some(n) if numbered(n) => true,
            _ if numbered(rest) => false,
            _ => continue,
        };
        let at = folder.join(&candidate);
        // A copy that cannot be read, or is not a file of its own, is left.
        let Ok(copy) = storage.open_own(&at) else {
            continue;
        };
        let Ok(Some(copy_len)) = begins(&*file, len, &*copy) else {
            continue;
        };
        if partial {
            // Only to win back its space: one that stays changes nothing.
            removed |= storage.remove(&at).is_ok();
        } else if copy_len == len && whole.is_none() {
            copy.sync_data()
                .map_err(|e| Failed::new("sync quarantine copy", &at, e))?;
            whole = Some(at);
        }
    }
    if whole.is_some() {
        sync_aside(storage, dir)?;
    } else if removed {
        storage
            .sync_dir(&folder)
            .map_err(|e| Failed::new("sync quarantine folder", &folder, e))?;
    }
    Ok(whole)
}

/// The length of `copy` if its bytes are the first bytes of `file` (`len`
/// long), `None` if they differ.
fn begins(file: &dyn StorageFile, len: u64, copy: &dyn StorageFile) -> io::Result<Option<u64>> {
    let copy_len = copy.len()?;
    if copy_len > len {
        return Ok(None);
    }
    let (mut ours, mut theirs) = (vec![0u8; 1 << 20], vec![0u8; 1 << 20]);
    let mut at = 0;
    while at < copy_len {
        let n = (copy_len - at).min(ours.len() as u64) as usize;
        crate::io::read_exact_at(file, &mut ours[..n], at)?;
        crate::io::read_exact_at(copy, &mut theirs[..n], at)?;
        if ours[..n] != theirs[..n] {
            return Ok(None);
        }
        at += n as u64;
    }
    Ok(Some(copy_len))
}

/// A free name in the quarantine folder of `dir` for the file `path` set aside
/// for `reason`, the folder created (durably) if need be.
fn aside_path(
    storage: &dyn Storage,
    dir: &Path,
    path: &Path,
    reason: &str,
) -> Result<PathBuf, Failed> {
    let folder = dir.join(QUARANTINE_DIR);
    let created = storage
        .create_dir(&folder)
        .map_err(|e| Failed::new("create quarantine folder", &folder, e))?;
    if created {
        storage
            .sync_dir(dir)
            .map_err(|e| Failed::new("sync directory", dir, e))?;
    }
    let taken = storage
        .list(&folder)
        .map_err(|e| Failed::new("list quarantine folder", &folder, e))?;
    let name = path
        .file_name()
        .map_or_else(|| "file".into(), |n| n.to_string_lossy().into_owned());
    let base = format!("{name}.{reason}");
    let free = (0..)
        .map(|n| {
            if n == 0 {
                base.clone()
            } else {
                format!("{base}.{n}")
            }
        })
        .find(|candidate| !taken.contains(candidate))
        .unwrap_or(base);
    Ok(folder.join(free))
}

/// Makes a move or copy into the quarantine folder durable: the folder's entry
/// first, then the directory's (a crash in between leaves the file under both
/// names, never under neither).
fn sync_aside(storage: &dyn Storage, dir: &Path) -> Result<(), Failed> {
    let folder = dir.join(QUARANTINE_DIR);
    storage
        .sync_dir(&folder)
        .map_err(|e| Failed::new("sync quarantine folder", &folder, e))?;
    storage
        .sync_dir(dir)
        .map_err(|e| Failed::new("sync directory", dir, e))
}

/// What a new segment reserves at first (4 MiB, or the segment size if
/// smaller): the writer reserves more, doubling, as frames reach the end of it
/// (so an idle outbox holds a few MiB of disk, not a whole segment), up to the
/// segment size.
pub(crate) fn first_allocation(segment_bytes: u64) -> u64 {
    segment_bytes.min(4 << 20)
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

    /// Closes every file (at close: descriptors are not kept until the last
    /// handle of the outbox is dropped).
    pub(crate) fn clear(&self) {
        self.open.lock().clear();
    }

    /// Closes the file of the segment at `path`, if open (it is deleted).
    pub(crate) fn forget(&self, path: &Path) {
        self.open.lock().retain(|(p, _)| &**p != path);
    }
}
