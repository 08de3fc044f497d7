//! The narrow storage interface through which segwal does all of its file I/O.
//!
//! The engine never names `std::fs`: it holds an `Arc<dyn Storage>` and the
//! `Arc<dyn StorageFile>` handles it returns. [`StdStorage`] is the real file
//! system; a test can stand a simulated disk in its place with
//! `Outbox::open_with_storage` (feature `testing`). One dynamic
//! call per system call costs nothing measurable next to the system call itself.
//!
//! Contract shared by every method: an error leaves the outbox to decide what
//! happens next (a failed `write_at` or `sync_data` poisons it); implementations
//! never retry a failed sync on their own.

pub(crate) mod fork;
pub(crate) mod reader;
pub(crate) mod reserve;
pub(crate) mod segment_file;
mod std_fs;

use std::any::Any;
use std::fmt;
use std::io;
use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

pub use std_fs::StdStorage;

/// A held directory lock; dropping it releases the lock.
pub type LockGuard = Box<dyn Any + Send + Sync>;

/// Why [`Storage::lock`] failed.
#[derive(Debug)]
pub enum LockError {
    /// Another owner holds the lock.
    Held {
        /// The owner's process id, where the lock file records it.
        pid: Option<u32>,
    },
    /// The lock could not be attempted.
    Io(io::Error),
}

/// A directory of files: the operations segwal needs from a file system.
pub trait Storage: Send + Sync + fmt::Debug {
    /// Creates the directory `dir` (its parent must exist); returns whether it
    /// was created, `false` if it already was a directory. Fails with
    /// [`io::ErrorKind::NotADirectory`] if `dir` is something else, and with
    /// [`io::ErrorKind::NotFound`] if its parent does not exist.
    fn create_dir(&self, dir: &Path) -> io::Result<bool>;
    /// The absolute path of the existing directory `dir`, with no symbolic
    /// link or `..` left in it: what the outbox keeps for the rest of its
    /// life, so that a later change of the working directory cannot move it.
    fn resolve(&self, dir: &Path) -> io::Result<std::path::PathBuf> {
        Ok(dir.to_path_buf())
    }
    /// Names of the entries of `dir` (file names, not paths), in any order.
    fn list(&self, dir: &Path) -> io::Result<Vec<String>>;
    /// Creates a new, empty file for reading and writing; fails if it exists.
    fn create(&self, path: &Path) -> io::Result<Arc<dyn StorageFile>>;
    /// Opens an existing file for reading and writing.
    fn open(&self, path: &Path) -> io::Result<Arc<dyn StorageFile>>;
    /// Opens an existing file for reading only (checks that change nothing,
    /// [`crate::verify`]). By default the same as [`Storage::open`].
    fn open_read(&self, path: &Path) -> io::Result<Arc<dyn StorageFile>> {
        self.open(path)
    }
    /// Opens an existing file for reading and writing that segwal itself
    /// made and keeps (the reserve): never through a symbolic link, never a
    /// file another name is linked to, whose bytes would be someone else's.
    /// Fails for such a file: with [`io::ErrorKind::InvalidData`] for a
    /// file with another name or one that is not a regular file, with
    /// `ELOOP` for a symbolic link. By default the same as
    /// [`Storage::open`] (a storage without links).
    fn open_own(&self, path: &Path) -> io::Result<Arc<dyn StorageFile>> {
        self.open(path)
    }
    /// Removes a file. Not durable until [`Storage::sync_dir`] of its directory.
    fn remove(&self, path: &Path) -> io::Result<()>;
    /// Renames the file `from` to `to` (which must not exist), in one atomic
    /// step: a crash leaves the file under one name or the other. Not durable
    /// until [`Storage::sync_dir`] of both directories.
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    /// Makes the creation and removal of entries in `dir` durable.
    fn sync_dir(&self, dir: &Path) -> io::Result<()>;
    /// A random number, never 0: a new segment's nonce (docs/FORMAT.md). Not a
    /// file-system operation, but the one thing the engine draws at random, so
    /// that a simulated disk can draw it from its seed and stay reproducible.
    fn random_u64(&self) -> u64 {
        use std::hash::{BuildHasher, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos()),
        );
        h.finish() | 1
    }
    /// Bytes free for an unprivileged user on the file system holding `dir`,
    /// or `None` where the storage cannot tell (the free-disk floor is then
    /// not applied).
    fn free_bytes(&self, dir: &Path) -> io::Result<Option<u64>> {
        let _ = dir;
        Ok(None)
    }
    /// The outbox is closed: let go of anything held for it (a descriptor on
    /// its directory). Nothing is asked of the storage afterwards.
    fn close(&self) {}
    /// Whether reads of different files may run on two threads at once (an
    /// open scans the newest segment beside the others). A simulated disk
    /// says no, so that a run stays reproducible from its seed.
    fn parallel_reads(&self) -> bool {
        false
    }
    /// Takes an exclusive lock on `dir`, held until the guard is dropped. Must fail
    /// with [`LockError::Held`] while another guard for `dir` is alive, in this
    /// process or any other.
    fn lock(&self, dir: &Path) -> Result<LockGuard, LockError>;
}

/// An open file.
#[cfg_attr(
    feature = "testing",
    expect(
        clippy::len_without_is_empty,
        reason = "a length is a metadata call; the engine never asks for emptiness alone"
    )
)]
pub trait StorageFile: Send + Sync + fmt::Debug {
    /// Reads up to `buf.len()` bytes at `offset`; returns how many were read (0 at
    /// the end of the file).
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize>;
    /// Writes up to `buf.len()` bytes at `offset`; returns how many were written
    /// (possibly fewer).
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<usize>;
    /// Makes the file's data, and the metadata needed to read it back, durable.
    fn sync_data(&self) -> io::Result<()>;
    /// Truncates or extends the file to `len` bytes. Not durable until `sync_data`.
    fn set_len(&self, len: u64) -> io::Result<()>;
    /// Reserves space so that the file is at least `len` bytes long, the new bytes
    /// reading as zeros (`fallocate(2)`); a no-op if it is already that long. Not
    /// durable until `sync_data`. Where the file system cannot reserve space this
    /// may do nothing and succeed: the file then grows as it is written.
    fn allocate(&self, len: u64) -> io::Result<()>;
    /// The first region at or after `offset` that may hold bytes other than zeros,
    /// as a range of offsets, or `None` if every byte from `offset` to the end of
    /// the file reads as zero (`lseek(2)` with `SEEK_DATA` and `SEEK_HOLE`). A
    /// speed-up: recovery skips the preallocated space of a segment without
    /// reading it. An implementation that cannot tell returns the rest of the
    /// file, as the default does; bytes outside the regions it returns must read
    /// as zeros. Recovery trusts it only where it expects zeros: more than 4 KiB
    /// past the newest segment's last frame (docs/FORMAT.md).
    fn next_data(&self, offset: u64) -> io::Result<Option<Range<u64>>> {
        let len = self.len()?;
        Ok((offset < len).then_some(offset..len))
    }
    /// Says that the bytes `offset..offset + len` will be read soon, so that
    /// the file system can start reading them now, many at once
    /// (`posix_fadvise(2)` with `POSIX_FADV_WILLNEED`). Only a hint: the
    /// default does nothing, and an implementation ignores its own failure (a
    /// read error shows at the read itself).
    fn will_need(&self, _offset: u64, _len: u64) {}
    /// The file's current length in bytes.
    fn len(&self) -> io::Result<u64>;
    /// The bytes of storage the file takes (blocks written or reserved), which
    /// may exceed its length (space reserved past the end) or fall short of it
    /// (holes). The length, where it cannot be told.
    fn allocated(&self) -> io::Result<u64> {
        self.len()
    }
}

/// Writes all of `buf` at `offset`, looping over short writes.
pub(crate) fn write_all_at(
    file: &dyn StorageFile,
    mut buf: &[u8],
    mut offset: u64,
) -> io::Result<()> {
    while !buf.is_empty() {
        match file.write_at(buf, offset) {
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::WriteZero,
                    "write returned zero bytes",
                ));
            }
            Ok(n) => {
                buf = &buf[n..];
                offset += n as u64;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Fills `buf` from `offset`, looping over short reads. Fails with
/// `UnexpectedEof` if the file ends first.
pub(crate) fn read_exact_at(
    file: &dyn StorageFile,
    mut buf: &mut [u8],
    mut offset: u64,
) -> io::Result<()> {
    while !buf.is_empty() {
        match file.read_at(buf, offset) {
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "file ended before the expected bytes",
                ));
            }
            Ok(n) => {
                buf = &mut buf[n..];
                offset += n as u64;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
