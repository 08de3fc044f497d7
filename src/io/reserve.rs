//! The reserve: disk space an outbox keeps aside so that it can always open.
//!
//! Opening writes: recovery creates the writer's active segment (its header's
//! block) and the writer seals the segment before it (its seal index), and
//! draining writes the `LogStart` frames that let acknowledged segments be
//! deleted. On a full disk those writes would fail, and a backlog that cannot be
//! opened cannot be drained, so the disk never frees. So every open that has the
//! space makes sure a `RESERVE` file of zeros is there (space reserved with
//! `fallocate`, or written where that is not supported), and an open that finds
//! the disk full removes it, after checking that its bytes are what segwal
//! wrote, and tries again. An outbox whose reserve could not be made for want
//! of space refuses appends until it can make it (the writer tries again as
//! appends come): what space is left is the next open's.

use std::io;
use std::path::Path;

use crate::io::{Storage, write_all_at};

/// The reserve's file name inside an outbox directory.
pub(crate) const RESERVE_FILE: &str = "RESERVE";

/// The reserve of an outbox whose segments are `segment_bytes` long: what a
/// new segment reserves at first (4 MiB at most), room for a header's block,
/// a seal and the first `LogStart` frames of a drain.
pub(crate) fn size(segment_bytes: u64) -> u64 {
    crate::io::segment_file::first_allocation(segment_bytes)
}

/// Whether `e` says the disk (or the user's quota) is full.
pub(crate) fn is_no_space(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(28 | 122)) || e.kind() == io::ErrorKind::StorageFull
}

/// Makes sure the reserve of `bytes` exists in `dir`; the error says why it
/// could not be made (a full disk is exactly when it cannot, and then the
/// writer keeps the space it needs free: `Writer::reserve_short`). A reserve
/// at least as long is left alone; a shorter one (an attempt a crash cut
/// between the creation and the reservation) is grown to `bytes`, never cut.
///
/// A `RESERVE` that is not a plain file of its own (a symbolic link, a file
/// with another name) is never written: that fails
/// ([`Storage::open_own`]), and the outbox keeps no reserve.
pub(crate) fn ensure(storage: &dyn Storage, dir: &Path, bytes: u64) -> io::Result<()> {
    let path = dir.join(RESERVE_FILE);
    match storage.open_own(&path) {
        Ok(file) => {
            if file.len()? >= bytes {
                return Ok(());
            }
            return fill(&*file, bytes).and_then(|()| file.sync_data());
        }
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
        Err(_) => {}
    }
    let mut created = false;
    let made = (|| -> io::Result<()> {
        let file = storage.create(&path)?;
        created = true;
        fill(&*file, bytes)?;
        file.sync_data()?;
        storage.sync_dir(dir)
    })();
    // Only a file this call created is removed: a `RESERVE` that exists but
    // cannot be opened is not segwal's to delete.
    if made.is_err() && created {
        let _ = storage.remove(&path);
        let _ = storage.sync_dir(dir);
    }
    made
}

/// Whether [`ensure`] would take space: `dir` has no `RESERVE`, or one of
/// segwal's own shorter than `bytes`. (False for one that is not segwal's
/// to write: `ensure` leaves it, and says so.)
pub(crate) fn would_grow(storage: &dyn Storage, dir: &Path, bytes: u64) -> bool {
    match storage.open_own(&dir.join(RESERVE_FILE)) {
        Ok(file) => file.len().is_ok_and(|len| len < bytes),
        Err(e) => e.kind() == io::ErrorKind::NotFound,
    }
}

/// Reserves `file` up to `bytes` (zeros past its end written where the file
/// system cannot reserve).
pub(crate) fn fill(file: &dyn crate::io::StorageFile, bytes: u64) -> io::Result<()> {
    file.allocate(bytes)?;
    let mut at = file.len()?;
    if at < bytes {
        // The file system cannot reserve: write the zeros.
        let zeros = vec![0u8; 1 << 16];
        while at < bytes {
            let n = (bytes - at).min(zeros.len() as u64) as usize;
            write_all_at(file, &zeros[..n], at)?;
            at += n as u64;
        }
    }
    Ok(())
}

/// Removes the reserve of `dir` to give its space to an open that found the
/// disk full; returns whether that freed any: an empty `RESERVE` (a crash
/// after its creation) is removed too, and freed nothing. Only a file whose every byte is
/// zero is removed, and only a plain file of its own (never a symbolic
/// link, never a name of a file that has another): segwal never deletes what
/// it cannot prove it wrote.
pub(crate) fn release(storage: &dyn Storage, dir: &Path) -> io::Result<bool> {
    let path = dir.join(RESERVE_FILE);
    let file = match storage.open_own(&path) {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
    };
    let len = file.len()?;
    let mut chunk = vec![0u8; 1 << 16];
    let mut at = 0;
    while let Some(region) = file.next_data(at)? {
        let start = region.start.max(at);
        if start >= len {
            break;
        }
        let n = (region.end.min(len).saturating_sub(start)).clamp(1, chunk.len() as u64) as usize;
        let part = &mut chunk[..n];
        crate::io::read_exact_at(&*file, part, start)?;
        if part.iter().any(|&b| b != 0) {
            return Ok(false);
        }
        at = start + n as u64;
    }
    drop(file);
    storage.remove(&path)?;
    storage.sync_dir(dir)?;
    Ok(len > 0)
}
