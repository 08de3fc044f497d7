//! [`StdStorage`]: the real file system, through `std::fs` and `libc`.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions, TryLockError};
use std::io::{self, Read, Write};
use std::ops::Range;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::{LockError, LockGuard, Storage, StorageFile};

/// The file inside an outbox directory that names the process holding its
/// lock, for the error message of a refused open. Only a hint: the lock is an
/// `flock` on the directory itself, and deleting this file changes nothing.
const OWNER_FILE: &str = "OWNER";

/// The operating system's file system.
///
/// Locking uses `flock(2)` on the directory itself, which excludes a second
/// open from another process, and a registry of the directories this process
/// holds, which excludes one from the same process (where a network file system
/// emulating `flock` with POSIX locks would not). An `OWNER` file records the
/// owner's pid so that a refused open can name it.
///
/// Once [`Storage::resolve`] has found the outbox directory, the storage holds
/// it open and reaches every file in it through that descriptor
/// (`/proc/self/fd/N/<name>`, where `/proc` is mounted): a rename of the
/// directory while the outbox is open moves the outbox with it rather than
/// splitting its log between two places. Paths keep naming the directory as it
/// was resolved, for messages.
#[derive(Debug, Default)]
pub struct StdStorage {
    home: parking_lot::Mutex<Option<Home>>,
}

/// The outbox directory, held open.
#[derive(Debug)]
struct Home {
    /// Its path as resolved at open.
    path: PathBuf,
    /// The same directory through the descriptor held on it.
    via: PathBuf,
    /// The descriptor (kept open while the storage lives).
    _handle: File,
}

impl StdStorage {
    /// The file system, not yet tied to a directory.
    pub fn new() -> StdStorage {
        StdStorage::default()
    }

    /// [`crate::owner_pid`].
    pub(crate) fn owner_pid(dir: &Path) -> Option<u32> {
        let mut text = String::new();
        open_owner(dir, false)
            .ok()?
            .take(64)
            .read_to_string(&mut text)
            .ok()?;
        text.trim().parse().ok()
    }

    /// Where to reach `path`: through the held directory if it lies in it.
    fn at<'a>(&self, path: &'a Path) -> Cow<'a, Path> {
        match &*self.home.lock() {
            Some(home) => match path.strip_prefix(&home.path) {
                Ok(rest) if rest.as_os_str().is_empty() => Cow::Owned(home.via.clone()),
                Ok(rest) => Cow::Owned(home.via.join(rest)),
                Err(_) => Cow::Borrowed(path),
            },
            None => Cow::Borrowed(path),
        }
    }
}

#[derive(Debug)]
struct StdFile {
    file: File,
}

impl Storage for StdStorage {
    fn create_dir(&self, dir: &Path) -> io::Result<bool> {
        let dir = self.at(dir);
        match fs::create_dir(&dir) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => match fs::metadata(&dir) {
                Ok(m) if m.is_dir() => Ok(false),
                Ok(_) => Err(io::Error::new(
                    io::ErrorKind::NotADirectory,
                    "it exists and is not a directory",
                )),
                // A symbolic link to nothing.
                Err(e) if e.kind() == io::ErrorKind::NotFound => Err(io::Error::new(
                    io::ErrorKind::NotADirectory,
                    "it is a symbolic link to nothing",
                )),
                Err(e) => Err(e),
            },
            // ENOTDIR from mkdir: a directory on the way is a file.
            Err(e) if e.kind() == io::ErrorKind::NotADirectory => Err(io::Error::new(
                io::ErrorKind::NotADirectory,
                "a component of its path is not a directory",
            )),
            Err(e) => Err(e),
        }
    }

    fn resolve(&self, dir: &Path) -> io::Result<PathBuf> {
        let path = fs::canonicalize(dir)?;
        let handle = File::open(&path)?;
        // `thread-self`: `/proc/self` stops resolving once the main thread has
        // exited while others run.
        let via = PathBuf::from(format!("/proc/thread-self/fd/{}", handle.as_raw_fd()));
        // Only where the descriptor can be named (Linux with /proc mounted),
        // and only for the first directory this storage serves.
        let mut home = self.home.lock();
        if home.is_none() && fs::metadata(&via).is_ok_and(|m| m.is_dir()) {
            *home = Some(Home {
                path: path.clone(),
                via,
                _handle: handle,
            });
        }
        Ok(path)
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in fs::read_dir(self.at(dir))? {
            let entry = entry?;
            // A name that is not UTF-8 is not a segment; keep it out of the listing.
            if let Ok(name) = entry.file_name().into_string() {
                names.push(name);
            }
        }
        Ok(names)
    }

    fn create(&self, path: &Path) -> io::Result<Arc<dyn StorageFile>> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(self.at(path))?;
        Ok(Arc::new(StdFile { file }))
    }

    fn open(&self, path: &Path) -> io::Result<Arc<dyn StorageFile>> {
        let file = regular(OpenOptions::new().read(true).write(true), &self.at(path))?;
        Ok(Arc::new(StdFile { file }))
    }

    fn open_read(&self, path: &Path) -> io::Result<Arc<dyn StorageFile>> {
        let file = regular(OpenOptions::new().read(true), &self.at(path))?;
        Ok(Arc::new(StdFile { file }))
    }

    fn open_own(&self, path: &Path) -> io::Result<Arc<dyn StorageFile>> {
        let path = self.at(path);
        let name = path.file_name().map_or_else(
            || path.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        );
        let file = own_file(OpenOptions::new().read(true).write(true), &path, &name)?;
        Ok(Arc::new(StdFile { file }))
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        fs::remove_file(self.at(path))
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        // `rename(2)` replaces an existing target; segwal never means to.
        let to = self.at(to);
        if fs::symlink_metadata(&to).is_ok() {
            return Err(io::Error::from(io::ErrorKind::AlreadyExists));
        }
        fs::rename(self.at(from), to)
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        File::open(self.at(dir))?.sync_all()
    }

    fn free_bytes(&self, dir: &Path) -> io::Result<Option<u64>> {
        use std::os::unix::ffi::OsStrExt;
        let path = std::ffi::CString::new(self.at(dir).as_os_str().as_bytes())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL byte in the path"))?;
        // SAFETY: `statvfs` reads the NUL-terminated path `path` owns and
        // writes only into `out`, a plain struct of integers this frame owns
        // (zero-initialised, valid for any bit pattern), for the duration of
        // the call.
        #[expect(unsafe_code, reason = "statvfs(3) has no safe wrapper in std")]
        let (rc, out) = unsafe {
            let mut out: libc::statvfs = std::mem::zeroed();
            (libc::statvfs(path.as_ptr(), &mut out), out)
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        #[allow(
            clippy::useless_conversion,
            reason = "fsblkcnt_t and c_ulong are not u64 on every target"
        )]
        let free = u64::from(out.f_bavail).saturating_mul(u64::from(out.f_frsize));
        Ok(Some(free))
    }

    fn close(&self) {
        self.home.lock().take();
    }

    fn parallel_reads(&self) -> bool {
        true
    }

    fn lock(&self, dir: &Path) -> Result<LockGuard, LockError> {
        let dir = &*self.at(dir);
        // Within one process, the directory itself is the key: `flock` on a
        // network file system may be emulated with process-wide POSIX locks,
        // which would let a second open in this process through.
        let key = fs::metadata(dir)
            .map(|m| (m.dev(), m.ino()))
            .map_err(LockError::Io)?;
        let mut held = HELD.lock();
        // An entry a parent process made before a fork is not this
        // process's: the `flock` below decides for it.
        if held.get(&key) == Some(&super::fork::current()) {
            return Err(LockError::Held {
                pid: Some(std::process::id()),
            });
        }
        // The lock is on the directory itself: a file in it could be deleted
        // (a stale-looking pid file is what cleanup scripts remove), and a
        // second open would then lock a new file of the same name.
        let handle = File::open(dir).map_err(LockError::Io)?;
        match handle.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                return Err(LockError::Held {
                    pid: StdStorage::owner_pid(dir),
                });
            }
            Err(TryLockError::Error(e)) => return Err(LockError::Io(e)),
        }
        // A directory the process may not write is refused before anything
        // is written or recovery starts: asked of the directory itself, as
        // the process's effective user (an existing OWNER can be writable in
        // a directory that is not: made read-only after the outbox was
        // created, or owned by another user), rather than poisoned at the
        // first rotation.
        may_write_in(dir).map_err(LockError::Io)?;
        // Record our pid for the error message of a refused open. Not fsynced: it
        // is a hint for humans, and the lock itself lives in the kernel.
        let record = || -> io::Result<()> {
            let mut owner = open_owner(dir, true)?;
            owner.set_len(0)?;
            writeln!(owner, "{}", std::process::id())
        };
        match record() {
            Ok(()) => {}
            // An OWNER the process may not write (another user's): refused
            // here, before recovery starts.
            Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
                return Err(LockError::Io(e));
            }
            // A full disk must not keep an outbox from opening (it may be
            // opened precisely to drain it): the pid is only a hint.
            Err(_) => {}
        }
        let generation = super::fork::watch();
        held.insert(key, generation);
        Ok(Box::new(HeldLock {
            file: handle,
            key,
            generation,
        }))
    }
}

/// Whether the process may create and remove files in the directory `dir`
/// (`faccessat` with `W_OK | X_OK` as the effective user): `PermissionDenied`
/// if not, `ReadOnlyFilesystem` on a read-only file system.
fn may_write_in(dir: &Path) -> io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL byte in the path"))?;
    // SAFETY: `faccessat` only reads the NUL-terminated path `path` owns, for
    // the duration of the call; it writes nothing of this process's memory.
    #[expect(unsafe_code, reason = "faccessat(2) has no safe wrapper in std")]
    let rc = unsafe {
        libc::faccessat(
            libc::AT_FDCWD,
            path.as_ptr(),
            libc::W_OK | libc::X_OK,
            libc::AT_EACCESS,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Opens `path` with `options` if it is a regular file (through a symbolic
/// link or not), else fails with `InvalidInput`: a FIFO, a device or a
/// directory named like a segment can neither block an open nor be read as
/// a log. Its type is asked before the open, since opening a FIFO waits for
/// a peer; not by opening with `O_NONBLOCK`, which would make the open of a
/// regular file under a lease (an NFS delegation, a Samba oplock) fail at
/// once instead of waiting for the lease to be broken. Asked again of the
/// descriptor, for a file replaced in between.
fn regular(options: &OpenOptions, path: &Path) -> io::Result<File> {
    let not_regular = || io::Error::new(io::ErrorKind::InvalidInput, "not a regular file");
    if !fs::metadata(path)?.is_file() {
        return Err(not_regular());
    }
    let file = options.open(path)?;
    if !file.metadata()?.is_file() {
        return Err(not_regular());
    }
    Ok(file)
}

/// Opens the owner file of `dir` (creating it when `write`), as a plain file
/// of its own or not at all: never through a symbolic link, which could name
/// any file of the user's (a truncation would destroy it); never a FIFO or a
/// device (opened without blocking, then refused), which could block an open
/// or read without end; never a file with another name linked to it.
fn open_owner(dir: &Path, write: bool) -> io::Result<File> {
    own_file(
        OpenOptions::new().read(!write).write(write).create(write),
        &dir.join(OWNER_FILE),
        OWNER_FILE,
    )
}

/// Opens `path` (called `name` in the error) with `options` as a plain file
/// of its own or not at all: never through a symbolic link, never a FIFO or
/// a device (opened without blocking, then refused), never a file with
/// another name linked to it. For the files segwal makes and keeps beside
/// its segments (`OWNER`, `RESERVE`), whose writes must never reach a file
/// of the user's.
fn own_file(options: &mut OpenOptions, path: &Path, name: &str) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = options
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() || meta.nlink() > 1 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{name} is not a plain file of its own"),
        ));
    }
    Ok(file)
}

/// The directories (device, inode) locked by this process, each with the
/// fork count when it was locked (`io::fork`).
static HELD: parking_lot::Mutex<BTreeMap<(u64, u64), u64>> =
    parking_lot::Mutex::new(BTreeMap::new());

/// A held `flock`. Dropping it unlocks explicitly rather than relying on the
/// close: a child process forked meanwhile (between its fork and its exec) shares
/// the open file description, and would otherwise keep the directory locked.
#[derive(Debug)]
struct HeldLock {
    file: File,
    /// The directory's (device, inode).
    key: (u64, u64),
    /// The fork count when it was taken (`io::fork`).
    generation: u64,
}

impl Drop for HeldLock {
    fn drop(&mut self) {
        // A child of the fork shares the lock with the process that took
        // it: unlocking here would release the parent's. Closing the
        // descriptor does not.
        if super::fork::current() == self.generation {
            let _ = self.file.unlock();
        }
        // Only this lock's entry: a child may since have locked the
        // directory itself, under its own count.
        let mut held = HELD.lock();
        if held.get(&self.key) == Some(&self.generation) {
            held.remove(&self.key);
        }
    }
}

impl StorageFile for StdFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.file.read_at(buf, offset)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<usize> {
        self.file.write_at(buf, offset)
    }

    fn sync_data(&self) -> io::Result<()> {
        self.file.sync_data()
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.file.set_len(len)
    }

    fn allocate(&self, len: u64) -> io::Result<()> {
        if self.len()? >= len {
            return Ok(());
        }
        let len = libc::off_t::try_from(len)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "length too large"))?;
        // SAFETY: `fallocate` on a file descriptor this `File` owns and keeps open
        // for the duration of the call, with plain integer arguments.
        #[expect(unsafe_code, reason = "fallocate(2) has no safe wrapper in std")]
        let rc = unsafe { libc::fallocate(self.file.as_raw_fd(), 0, 0, len) };
        if rc == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            // The file system cannot preallocate: the file grows as it is written.
            Some(libc::EOPNOTSUPP | libc::ENOSYS) => Ok(()),
            _ => Err(e),
        }
    }

    fn next_data(&self, offset: u64) -> io::Result<Option<Range<u64>>> {
        let len = self.len()?;
        if offset >= len {
            return Ok(None);
        }
        let Ok(from) = libc::off_t::try_from(offset) else {
            return Ok(Some(offset..len));
        };
        let fd = self.file.as_raw_fd();
        // SAFETY: `lseek` on a file descriptor this `File` owns and keeps open for
        // the duration of the call, with plain integer arguments. It moves the
        // descriptor's position, which segwal never uses (all I/O is positioned).
        #[expect(
            unsafe_code,
            reason = "lseek(2) with SEEK_DATA has no safe wrapper in std"
        )]
        let start = unsafe { libc::lseek(fd, from, libc::SEEK_DATA) };
        if start < 0 {
            let e = io::Error::last_os_error();
            return match e.raw_os_error() {
                // No data at or after `offset`: holes (or unwritten space) to the end.
                Some(libc::ENXIO) => Ok(None),
                // The file system cannot tell: everything may be data.
                _ => Ok(Some(offset..len)),
            };
        }
        // SAFETY: as above.
        #[expect(
            unsafe_code,
            reason = "lseek(2) with SEEK_HOLE has no safe wrapper in std"
        )]
        let end = unsafe { libc::lseek(fd, start, libc::SEEK_HOLE) };
        let (Ok(start), Ok(end)) = (u64::try_from(start), u64::try_from(end)) else {
            return Ok(Some(offset..len));
        };
        // The file may have grown or shrunk between the calls: clamp to what
        // was asked and what the length allows.
        let start = start.max(offset);
        if start >= len {
            return Ok(None);
        }
        let end = if end > start { end.min(len) } else { len };
        Ok(Some(start..end))
    }

    fn will_need(&self, offset: u64, len: u64) {
        let (Ok(offset), Ok(len)) = (libc::off_t::try_from(offset), libc::off_t::try_from(len))
        else {
            return;
        };
        // SAFETY: `posix_fadvise` on a file descriptor this `File` owns and
        // keeps open for the duration of the call, with plain integer
        // arguments; no memory of ours is handed over. It only starts reads
        // into the page cache: a read that fails there leaves those pages not
        // up to date, and the later positioned read reports the error (the
        // files are never mapped, so no fault can reach the process).
        #[expect(unsafe_code, reason = "posix_fadvise(2) has no safe wrapper in std")]
        let _ = unsafe {
            libc::posix_fadvise(
                self.file.as_raw_fd(),
                offset,
                len,
                libc::POSIX_FADV_WILLNEED,
            )
        };
    }

    fn allocated(&self) -> io::Result<u64> {
        // `st_blocks` counts 512-byte units, whatever the file system's block.
        Ok(self.file.metadata()?.blocks() * 512)
    }

    fn len(&self) -> io::Result<u64> {
        Ok(self.file.metadata()?.len())
    }
}

#[cfg(test)]
#[expect(clippy::indexing_slicing, reason = "tests read bytes at known offsets")]
mod tests {
    use super::*;

    #[test]
    fn next_data_covers_every_byte_written_and_nothing_past_the_end() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let path = tmp.path().join("f");
        let storage = StdStorage::new();
        let file = storage.create(&path).expect("create");
        file.allocate(1 << 20).expect("allocate");
        file.write_at(&[7; 100], 0).expect("write");
        file.write_at(&[9; 100], 600_000).expect("write");
        file.set_len(2 << 20).expect("grow");
        file.sync_data().expect("sync");
        let len = file.len().expect("len");
        let bytes = std::fs::read(&path).expect("read");
        let mut covered = vec![false; bytes.len()];
        let mut at = 0;
        while let Some(r) = file.next_data(at).expect("next_data") {
            assert!(r.start >= at && r.start < r.end && r.end <= len, "{r:?}");
            covered[r.start as usize..r.end as usize].fill(true);
            at = r.end;
        }
        for (i, &b) in bytes.iter().enumerate() {
            assert!(
                b == 0 || covered[i],
                "byte {i} holds data outside every region"
            );
        }
        assert!(covered[0] && covered[600_000]);
        assert_eq!(file.next_data(len).expect("at the end"), None);
    }
}
