//! [`SimDisk`]: a deterministic simulated disk behind the [`Storage`] interface.
//!
//! Every file has a *live* image (what reads see) and a *durable* image (what
//! survives a crash), plus the operations issued since its last successful
//! `sync_data`. Directory entries likewise: the live namespace, and the one as of
//! each directory's last `sync_dir`. [`SimDisk::crash`] builds the disk a power
//! cut leaves: the durable state plus a random subset of the unsynced operations,
//! torn at 512-byte sectors, with grown-but-unwritten tails, and unsynced
//! creations and removals undone or not. Everything is drawn from one seed.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use crate::io::{LockError, LockGuard, Storage, StorageFile};

/// Sector size for torn writes.
pub const SECTOR: usize = 512;

/// One sector of zeros, what `next_data` compares sectors with.
static ZERO_SECTOR: [u8; SECTOR] = [0; SECTOR];

/// A small, fast, deterministic generator (xorshift64*).
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator for `seed` (any value, zero included).
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03 | 1)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A number in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next_u64() % n }
    }

    /// True with probability `percent`/100.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// A fault the disk injects at a given mutating operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// `write_at` fails with EIO and writes nothing.
    WriteEio,
    /// `write_at` fails with ENOSPC and writes nothing.
    WriteEnospc,
    /// `write_at` writes half of the buffer and returns the short count.
    ShortWrite,
    /// `sync_data` fails with EIO and, as Linux may, drops the unsynced data from
    /// what will survive a crash while reads still see it; a later sync of the
    /// same file succeeds (PostgreSQL's "fsyncgate").
    SyncEio,
    /// `sync_dir` fails with EIO.
    SyncDirEio,
    /// `create` fails with ENOSPC.
    CreateEnospc,
    /// `set_len` or `allocate` (a truncation, a seal's cut, a preallocation)
    /// fails with EIO and changes nothing.
    SetLenEio,
}

/// Which operations a fault hits.
#[derive(Clone, Copy, Debug)]
pub struct FaultRule {
    /// The fault.
    pub fault: Fault,
    /// Index of the first mutating operation it hits (0-based).
    pub at_op: u64,
    /// Keep hitting every later operation of its kind, not only the first.
    pub persistent: bool,
}

/// What a crash may do, as percentages.
#[derive(Clone, Copy, Debug)]
pub struct CrashModel {
    /// Chance that an unsynced write survives whole; the rest is split between
    /// lost entirely and torn sector by sector.
    pub write_kept: u64,
    /// Chance that an unsynced write is torn (each sector kept, lost or garbage).
    pub write_torn: u64,
    /// Chance that a file whose live size passed its durable size comes back with
    /// a grown tail of zeros or garbage where its data did not land.
    pub grown_tail: u64,
    /// Chance that an unsynced directory change (creation or removal) is kept.
    pub dir_change_kept: u64,
    /// Chance that a block (aligned, [`BLOCK`] bytes) under an unsynced write
    /// comes back as garbage whole, bytes written and fsynced before included:
    /// a drive with 4 KiB physical sectors behind 512-byte logical ones rewrites
    /// the whole sector, and a power cut in the middle can leave it unreadable.
    pub block_garbled: u64,
}

impl Default for CrashModel {
    fn default() -> CrashModel {
        CrashModel {
            write_kept: 40,
            write_torn: 30,
            grown_tail: 30,
            dir_change_kept: 50,
            block_garbled: 20,
        }
    }
}

/// Counters of what the disk saw, for the harness's checks.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DiskStats {
    /// Mutating operations performed (create, write, sync, set_len, remove,
    /// sync_dir) since the disk was made.
    pub ops: u64,
    /// Writes issued to a file after a `sync_data` of that file failed.
    pub writes_after_failed_sync: u64,
    /// `sync_data` calls issued to a file after one of its syncs failed.
    pub syncs_after_failed_sync: u64,
    /// Crashes simulated.
    pub crashes: u64,
    /// Faults injected.
    pub faults_injected: u64,
    /// Successful `sync_data` calls whose writes held a write of at least
    /// [`LARGE_WRITE`] bytes, not all zeros, reaching past every byte an
    /// earlier sync made durable, and no write of zeros only: large frames
    /// written straight into space never written, with no zeros ahead.
    pub large_writes_unzeroed: u64,
}

#[derive(Clone, Debug)]
enum Pending {
    Write { at: u64, data: Arc<[u8]> },
    SetLen(u64),
}

/// What [`DiskStats::large_writes_unzeroed`] counts as a large write.
pub const LARGE_WRITE: usize = 64 << 10;

/// A file's images are shared between the disk and its snapshots (one per
/// mutating operation while a run is recorded) and copied only when one side
/// writes: a snapshot costs a reference per file, not a copy of every file.
#[derive(Clone, Debug, Default)]
struct Inode {
    live: Arc<Vec<u8>>,
    durable: Arc<Vec<u8>>,
    pending: Vec<Pending>,
    sync_failed: bool,
    /// The end of the furthest write a successful sync made durable (cut
    /// back by a durable truncation).
    synced_to: u64,
}

#[derive(Debug)]
struct State {
    rng: Rng,
    /// Bumped by every crash: handles opened before it are dead.
    generation: u64,
    ops: u64,
    crash_at: Option<u64>,
    crashed: bool,
    faults: Vec<FaultRule>,
    /// Chance in percent that a read returns one flipped bit (not persistent).
    rot_reads: u64,
    /// Chance in percent that a read fails with EIO.
    fail_reads: u64,
    /// Reads that touch these bytes of this inode fail with EIO: a bad range
    /// of the medium.
    bad_range: Option<(u64, Range<u64>)>,
    dirs: BTreeSet<PathBuf>,
    live: BTreeMap<PathBuf, u64>,
    durable: BTreeMap<PathBuf, u64>,
    inodes: BTreeMap<u64, Inode>,
    next_inode: u64,
    locks: BTreeSet<PathBuf>,
    stats: DiskStats,
    /// Copies of the state before each mutating operation, when recording.
    snapshots: Option<Vec<State>>,
    /// A line per mutating operation, when tracing.
    trace: Option<Vec<String>>,
    /// What `free_bytes` reports: `None`, cannot tell.
    free_bytes: Option<u64>,
}

impl State {
    /// An independent copy, with its own generator, no locks held, dead where
    /// this one is dead.
    fn copy(&self, seed: u64) -> State {
        State {
            rng: Rng::new(seed),
            generation: self.generation,
            ops: self.ops,
            crash_at: self.crash_at,
            crashed: self.crashed,
            faults: self.faults.clone(),
            rot_reads: self.rot_reads,
            fail_reads: self.fail_reads,
            bad_range: self.bad_range.clone(),
            dirs: self.dirs.clone(),
            live: self.live.clone(),
            durable: self.durable.clone(),
            inodes: self.inodes.clone(),
            next_inode: self.next_inode,
            locks: BTreeSet::new(),
            stats: self.stats.clone(),
            snapshots: None,
            trace: None,
            free_bytes: self.free_bytes,
        }
    }
}

/// A simulated disk. Cheap to clone: clones share the disk.
///
/// Each clone is a handle of its own, which the outbox opened on it binds to
/// the disk's current life when it takes the directory's lock: after a
/// [`crash`](SimDisk::crash), every operation through a handle bound before
/// it fails, as a crashed process does nothing more. So a test that forgets
/// an outbox and crashes the disk cannot have that outbox's threads create,
/// rename or remove files in the disk the next open recovers. A handle never
/// used to take a lock (the test's own) is never fenced.
#[derive(Debug)]
pub struct SimDisk {
    state: Arc<Mutex<State>>,
    /// The generation this handle took a lock in, or [`UNBOUND`].
    bound: AtomicU64,
}

/// [`SimDisk::bound`] of a handle that never took a lock.
const UNBOUND: u64 = u64::MAX;

impl Clone for SimDisk {
    /// A new handle on the same disk, bound to no life of it yet.
    fn clone(&self) -> SimDisk {
        SimDisk::on(self.state.clone())
    }
}

fn crashed_error() -> io::Error {
    io::Error::other("simulated power loss: the disk is gone until the crash is resolved")
}

impl SimDisk {
    /// A handle on `state`, bound to no life of it yet.
    fn on(state: Arc<Mutex<State>>) -> SimDisk {
        SimDisk {
            state,
            bound: AtomicU64::new(UNBOUND),
        }
    }

    /// An empty disk whose random choices all derive from `seed`.
    pub fn new(seed: u64) -> SimDisk {
        SimDisk::on(Arc::new(Mutex::new(State {
            rng: Rng::new(seed),
            generation: 0,
            ops: 0,
            crash_at: None,
            crashed: false,
            faults: Vec::new(),
            rot_reads: 0,
            fail_reads: 0,
            bad_range: None,
            dirs: BTreeSet::new(),
            live: BTreeMap::new(),
            durable: BTreeMap::new(),
            inodes: BTreeMap::new(),
            next_inode: 1,
            locks: BTreeSet::new(),
            stats: DiskStats::default(),
            snapshots: None,
            trace: None,
            free_bytes: None,
        })))
    }

    /// A copy of this disk, independent from now on, with a new seed for its
    /// random choices. Used to draw several crashes from one point of a run.
    pub fn fork(&self, seed: u64) -> SimDisk {
        let s = self.state.lock();
        SimDisk::on(Arc::new(Mutex::new(s.copy(seed))))
    }

    /// Sets what the disk reports as free space (`None`: cannot tell), for
    /// the free-disk floor.
    pub fn set_free_bytes(&self, free: Option<u64>) {
        self.state.lock().free_bytes = free;
    }

    /// From now on, keep a copy of the disk as it is just before each mutating
    /// operation: the disk a crash at that operation would leave, before its
    /// damage is drawn. One run then yields every crash point.
    pub fn record_snapshots(&self) {
        self.state.lock().snapshots = Some(Vec::new());
    }

    /// The copies kept since [`record_snapshots`](SimDisk::record_snapshots), by
    /// operation number: element `i` is the disk a crash at operation `i` hits.
    pub fn take_snapshots(&self) -> Vec<SimDisk> {
        let mut s = self.state.lock();
        s.snapshots
            .take()
            .unwrap_or_default()
            .into_iter()
            .map(|state| SimDisk::on(Arc::new(Mutex::new(state))))
            .collect()
    }

    /// The disk dies at mutating operation number `op` (0-based, counted since
    /// the disk was made): that operation and every later one fail, until
    /// [`crash`](SimDisk::crash). `None` cancels.
    pub fn crash_at(&self, op: Option<u64>) {
        self.state.lock().crash_at = op;
    }

    /// Whether the disk died (a crash point was reached) and awaits `crash`.
    pub fn is_dead(&self) -> bool {
        self.state.lock().crashed
    }

    /// From now on, log every mutating operation (see [`trace`](SimDisk::trace)).
    pub fn start_trace(&self) {
        self.state.lock().trace = Some(Vec::new());
    }

    /// The operations logged since [`start_trace`](SimDisk::start_trace).
    pub fn trace(&self) -> Vec<String> {
        self.state.lock().trace.clone().unwrap_or_default()
    }

    /// Adds a fault rule.
    pub fn inject(&self, rule: FaultRule) {
        self.state.lock().faults.push(rule);
    }

    /// Removes every fault rule.
    pub fn clear_faults(&self) {
        self.state.lock().faults.clear();
    }

    /// Makes reads return a flipped bit with this chance in percent.
    pub fn rot_reads(&self, percent: u64) {
        self.state.lock().rot_reads = percent;
    }

    /// Makes reads fail with EIO with this chance in percent (not persistent).
    pub fn fail_reads(&self, percent: u64) {
        self.state.lock().fail_reads = percent;
    }

    /// From now on, every read that touches `range` of the file at `path`
    /// fails with EIO (a bad range of the medium); `false` if there is no such
    /// file.
    pub fn fail_reads_in(&self, path: &Path, range: Range<u64>) -> bool {
        let mut s = self.state.lock();
        let Some(&ino) = s.live.get(path) else {
            return false;
        };
        s.bad_range = Some((ino, range));
        true
    }

    /// Cuts the file at `path` to `len` bytes, live and durable, behind the
    /// engine's back (another program truncating it); `false` if there is no
    /// such file.
    pub fn shrink(&self, path: &Path, len: u64) -> bool {
        let mut s = self.state.lock();
        let Some(&ino) = s.live.get(path) else {
            return false;
        };
        let Some(inode) = s.inodes.get_mut(&ino) else {
            return false;
        };
        for image in [&mut inode.live, &mut inode.durable] {
            Arc::make_mut(image).truncate(len as usize);
        }
        true
    }

    /// Counters so far.
    pub fn stats(&self) -> DiskStats {
        let s = self.state.lock();
        DiskStats {
            ops: s.ops,
            ..s.stats.clone()
        }
    }

    /// Mutating operations so far.
    pub fn ops(&self) -> u64 {
        self.state.lock().ops
    }

    /// Names of the files in `dir`, as reads see them now.
    pub fn files(&self, dir: &Path) -> Vec<String> {
        let s = self.state.lock();
        s.live
            .keys()
            .filter(|p| p.parent() == Some(dir))
            .filter_map(|p| p.file_name()?.to_str().map(str::to_owned))
            .collect()
    }

    /// Flips one bit of the durable (and live) image of `path` at `offset`: bit
    /// rot at rest.
    pub fn flip_bit(&self, path: &Path, offset: u64, bit: u8) -> bool {
        let mut s = self.state.lock();
        let Some(&ino) = s.live.get(path) else {
            return false;
        };
        let Some(inode) = s.inodes.get_mut(&ino) else {
            return false;
        };
        let at = offset as usize;
        let mut flipped = false;
        for image in [&mut inode.live, &mut inode.durable] {
            if let Some(b) = Arc::make_mut(image).get_mut(at) {
                *b ^= 1 << (bit % 8);
                flipped = true;
            }
        }
        flipped
    }

    /// Simulates a power cut and the reboot after it: every handle dies, every
    /// lock is released, and the disk holds its durable state plus a random
    /// subset of what was not synced, drawn according to `model`.
    pub fn crash(&self, model: CrashModel) {
        let mut guard = self.state.lock();
        let s = &mut *guard;
        s.generation += 1;
        s.crashed = false;
        s.crash_at = None;
        s.locks.clear();
        s.stats.crashes += 1;
        // Directory entries: synced ones stay; unsynced changes are kept or not.
        let mut names: BTreeMap<PathBuf, u64> = BTreeMap::new();
        let all: BTreeSet<PathBuf> = s.live.keys().chain(s.durable.keys()).cloned().collect();
        for path in all {
            let live = s.live.get(&path).copied();
            let durable = s.durable.get(&path).copied();
            let keep = if live == durable || s.rng.chance(model.dir_change_kept) {
                live
            } else {
                durable
            };
            if let Some(ino) = keep {
                names.insert(path, ino);
            }
        }
        // File contents: durable plus a random subset of the unsynced operations.
        let mut inodes = BTreeMap::new();
        for &ino in names.values() {
            let Some(inode) = s.inodes.get(&ino) else {
                continue;
            };
            let mut image = Vec::clone(&inode.durable);
            for op in &inode.pending {
                match op {
                    Pending::Write { at, data } => {
                        let roll = s.rng.below(100);
                        if roll < model.write_kept {
                            write_into(&mut image, *at, data);
                        } else if roll < model.write_kept + model.write_torn {
                            tear_into(&mut image, *at, data, &mut s.rng);
                        }
                        if !data.is_empty() && s.rng.chance(model.block_garbled) {
                            garble_block(&mut image, *at, data.len(), &mut s.rng);
                        }
                    }
                    Pending::SetLen(len) => {
                        if s.rng.chance(50) {
                            image.resize(*len as usize, 0);
                        }
                    }
                }
            }
            if inode.live.len() > image.len() && s.rng.chance(model.grown_tail) {
                let grow = 1 + s.rng.below((inode.live.len() - image.len()) as u64) as usize;
                let garbage = s.rng.chance(50);
                for _ in 0..grow {
                    let b = if garbage { s.rng.next_u64() as u8 } else { 0 };
                    image.push(b);
                }
            }
            let synced_to = inode.synced_to.min(image.len() as u64);
            let image = Arc::new(image);
            inodes.insert(
                ino,
                Inode {
                    synced_to,
                    live: Arc::clone(&image),
                    durable: image,
                    pending: Vec::new(),
                    sync_failed: false,
                },
            );
        }
        s.durable = names.clone();
        s.live = names;
        s.inodes = inodes;
    }

    /// Counts a mutating operation, applies the crash point, and returns the
    /// fault to inject into it, if any.
    fn begin(
        &self,
        s: &mut State,
        kind: OpKind,
        what: &dyn std::fmt::Display,
    ) -> io::Result<Option<Fault>> {
        self.alive(s)?;
        let op = s.ops;
        if s.snapshots.is_some() {
            let mut copy = s.copy(op);
            // The copy is the disk at the instant of the power cut.
            copy.crashed = true;
            if let Some(list) = s.snapshots.as_mut() {
                list.push(copy);
            }
        }
        if s.crash_at == Some(op) {
            s.crashed = true;
            return Err(crashed_error());
        }
        s.ops += 1;
        if let Some(trace) = s.trace.as_mut() {
            trace.push(format!("op {op}: {what}"));
        }
        let fault = s
            .faults
            .iter()
            .find(|r| kind.matches(r.fault) && (r.at_op == op || (r.persistent && op >= r.at_op)))
            .map(|r| r.fault);
        if fault.is_some() {
            s.stats.faults_injected += 1;
        }
        Ok(fault)
    }

    /// Fails while the disk is dead, and for a handle bound to a life of the
    /// disk a crash ended.
    fn alive(&self, s: &State) -> io::Result<()> {
        let bound = self.bound.load(Ordering::Acquire);
        if s.crashed || (bound != UNBOUND && bound != s.generation) {
            return Err(crashed_error());
        }
        Ok(())
    }

    fn check_alive(s: &State, generation: u64) -> io::Result<()> {
        if s.crashed || s.generation != generation {
            return Err(crashed_error());
        }
        Ok(())
    }
}

#[derive(Clone, Copy, Debug)]
enum OpKind {
    Create,
    Write,
    Sync,
    SetLen,
    Remove,
    SyncDir,
}

impl OpKind {
    fn matches(self, fault: Fault) -> bool {
        matches!(
            (self, fault),
            (
                OpKind::Write,
                Fault::WriteEio | Fault::WriteEnospc | Fault::ShortWrite
            ) | (OpKind::Sync, Fault::SyncEio)
                | (OpKind::SyncDir, Fault::SyncDirEio)
                | (OpKind::Create, Fault::CreateEnospc)
                | (OpKind::SetLen, Fault::SetLenEio)
        )
    }
}

fn write_into(image: &mut Vec<u8>, at: u64, data: &[u8]) {
    let at = at as usize;
    if image.len() < at + data.len() {
        image.resize(at + data.len(), 0);
    }
    image[at..at + data.len()].copy_from_slice(data);
}

/// Writes `data` at `at` sector by sector: each sector lands whole, not at all,
/// or as garbage.
fn tear_into(image: &mut Vec<u8>, at: u64, data: &[u8], rng: &mut Rng) {
    let mut pos = at as usize;
    let end = pos + data.len();
    while pos < end {
        let sector_end = ((pos / SECTOR) + 1) * SECTOR;
        let chunk_end = sector_end.min(end);
        let chunk = &data[pos - at as usize..chunk_end - at as usize];
        match rng.below(3) {
            0 => write_into(image, pos as u64, chunk),
            1 => {
                let garbage: Vec<u8> = chunk.iter().map(|_| rng.next_u64() as u8).collect();
                write_into(image, pos as u64, &garbage);
            }
            _ => {}
        }
        pos = chunk_end;
    }
}

/// The block size of the drive the crash model stands for.
pub const BLOCK: usize = 4096;

/// Garbles one aligned block under a write of `len` bytes at `at`: every byte of
/// it that the file holds, and the write's own bytes in it.
fn garble_block(image: &mut Vec<u8>, at: u64, len: usize, rng: &mut Rng) {
    let first = at as usize / BLOCK;
    let last = (at as usize + len - 1) / BLOCK;
    let block = first + rng.below((last - first + 1) as u64) as usize;
    let start = block * BLOCK;
    let end = ((block + 1) * BLOCK).min(image.len().max(at as usize + len));
    if image.len() < end {
        image.resize(end, 0);
    }
    for b in &mut image[start..end] {
        *b = rng.next_u64() as u8;
    }
}

fn errno(code: i32) -> io::Error {
    io::Error::from_raw_os_error(code)
}

impl Storage for SimDisk {
    fn random_u64(&self) -> u64 {
        self.state.lock().rng.next_u64() | 1
    }

    fn free_bytes(&self, _dir: &Path) -> io::Result<Option<u64>> {
        Ok(self.state.lock().free_bytes)
    }

    fn create_dir(&self, dir: &Path) -> io::Result<bool> {
        let mut s = self.state.lock();
        self.alive(&s)?;
        // Directories are durable at once: the real file system's parent fsync is
        // tested on the real file system.
        if s.live.contains_key(dir) {
            return Err(io::Error::from(io::ErrorKind::NotADirectory));
        }
        Ok(s.dirs.insert(dir.to_path_buf()))
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        let s = self.state.lock();
        self.alive(&s)?;
        Ok(s.live
            .keys()
            .filter(|p| p.parent() == Some(dir))
            .filter_map(|p| p.file_name()?.to_str().map(str::to_owned))
            .collect())
    }

    fn create(&self, path: &Path) -> io::Result<Arc<dyn StorageFile>> {
        let mut guard = self.state.lock();
        let s = &mut *guard;
        let fault = self.begin(s, OpKind::Create, &format!("create {}", path.display()))?;
        if fault == Some(Fault::CreateEnospc) {
            return Err(errno(28));
        }
        if s.live.contains_key(path) {
            return Err(io::Error::from(io::ErrorKind::AlreadyExists));
        }
        let ino = s.next_inode;
        s.next_inode += 1;
        s.inodes.insert(ino, Inode::default());
        s.live.insert(path.to_path_buf(), ino);
        Ok(Arc::new(SimFile {
            disk: self.clone(),
            ino,
            generation: s.generation,
        }))
    }

    fn open(&self, path: &Path) -> io::Result<Arc<dyn StorageFile>> {
        let s = self.state.lock();
        self.alive(&s)?;
        let ino = *s
            .live
            .get(path)
            .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))?;
        Ok(Arc::new(SimFile {
            disk: self.clone(),
            ino,
            generation: s.generation,
        }))
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        let mut guard = self.state.lock();
        let s = &mut *guard;
        self.begin(s, OpKind::Remove, &format!("remove {}", path.display()))?;
        s.live
            .remove(path)
            .map(|_| ())
            .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut guard = self.state.lock();
        let s = &mut *guard;
        let what = format!("rename {} {}", from.display(), to.display());
        self.begin(s, OpKind::Remove, &what)?;
        if s.live.contains_key(to) {
            return Err(io::Error::from(io::ErrorKind::AlreadyExists));
        }
        let ino = s
            .live
            .remove(from)
            .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))?;
        s.live.insert(to.to_path_buf(), ino);
        Ok(())
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        let mut guard = self.state.lock();
        let s = &mut *guard;
        if self.begin(s, OpKind::SyncDir, &format!("sync_dir {}", dir.display()))?
            == Some(Fault::SyncDirEio)
        {
            return Err(errno(5));
        }
        let in_dir = |p: &PathBuf| p.parent() == Some(dir);
        s.durable.retain(|p, _| !in_dir(p));
        let live: Vec<(PathBuf, u64)> = s
            .live
            .iter()
            .filter(|(p, _)| in_dir(p))
            .map(|(p, i)| (p.clone(), *i))
            .collect();
        s.durable.extend(live);
        Ok(())
    }

    fn lock(&self, dir: &Path) -> Result<LockGuard, LockError> {
        let mut s = self.state.lock();
        if s.crashed {
            return Err(LockError::Io(crashed_error()));
        }
        if !s.locks.insert(dir.to_path_buf()) {
            return Err(LockError::Held { pid: None });
        }
        // The handle is an outbox's now, of this life of the disk: a crash
        // ends it. (A handle a test passes to a second open after a crash is
        // bound again: that open is a new process.)
        self.bound.store(s.generation, Ordering::Release);
        Ok(Box::new(SimLock {
            disk: self.clone(),
            dir: dir.to_path_buf(),
            generation: s.generation,
        }))
    }
}

/// A held lock on the simulated disk.
struct SimLock {
    disk: SimDisk,
    dir: PathBuf,
    generation: u64,
}

impl Drop for SimLock {
    fn drop(&mut self) {
        let mut s = self.disk.state.lock();
        if s.generation == self.generation {
            s.locks.remove(&self.dir);
        }
    }
}

/// An open file on the simulated disk.
#[derive(Debug)]
struct SimFile {
    disk: SimDisk,
    ino: u64,
    generation: u64,
}

impl SimFile {
    fn rot(s: &mut State, buf: &mut [u8]) {
        if !buf.is_empty() && s.rot_reads > 0 && s.rng.chance(s.rot_reads) {
            let at = s.rng.below(buf.len() as u64) as usize;
            buf[at] ^= 1 << s.rng.below(8);
        }
    }

    /// The injected read failure, if this read draws one.
    fn read_fault(s: &mut State) -> io::Result<()> {
        if s.fail_reads > 0 && s.rng.chance(s.fail_reads) {
            s.stats.faults_injected += 1;
            return Err(errno(5));
        }
        Ok(())
    }

    /// `set_len` (or, `grow_only`, `allocate`): one mutating operation, which a
    /// `SetLenEio` fault fails, changing the live length now and the durable one
    /// at the next sync.
    fn resize(&self, len: u64, op: &str, grow_only: bool) -> io::Result<()> {
        let mut guard = self.disk.state.lock();
        let s = &mut *guard;
        SimDisk::check_alive(s, self.generation)?;
        let inode = s.inodes.get(&self.ino).ok_or_else(crashed_error)?;
        if grow_only && inode.live.len() as u64 >= len {
            return Ok(());
        }
        let what = format!("{op} inode {} to {len}", self.ino);
        if self.disk.begin(s, OpKind::SetLen, &what)? == Some(Fault::SetLenEio) {
            return Err(errno(5));
        }
        let inode = s.inodes.get_mut(&self.ino).ok_or_else(crashed_error)?;
        Arc::make_mut(&mut inode.live).resize(len as usize, 0);
        inode.pending.push(Pending::SetLen(len));
        Ok(())
    }
}

impl StorageFile for SimFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let mut guard = self.disk.state.lock();
        let s = &mut *guard;
        SimDisk::check_alive(s, self.generation)?;
        Self::read_fault(s)?;
        if let Some((ino, bad)) = &s.bad_range
            && *ino == self.ino
            && offset < bad.end
            && offset + buf.len() as u64 > bad.start
        {
            return Err(errno(5));
        }
        let inode = s.inodes.get(&self.ino).ok_or_else(crashed_error)?;
        let at = offset as usize;
        if at >= inode.live.len() {
            return Ok(0);
        }
        let n = buf.len().min(inode.live.len() - at);
        buf[..n].copy_from_slice(&inode.live[at..at + n]);
        Self::rot(s, &mut buf[..n]);
        Ok(n)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<usize> {
        let mut guard = self.disk.state.lock();
        let s = &mut *guard;
        SimDisk::check_alive(s, self.generation)?;
        let what = format!("write inode {} at {offset}, {} bytes", self.ino, buf.len());
        let fault = self.disk.begin(s, OpKind::Write, &what)?;
        let inode = s.inodes.get_mut(&self.ino).ok_or_else(crashed_error)?;
        if inode.sync_failed {
            s.stats.writes_after_failed_sync += 1;
        }
        let inode = s.inodes.get_mut(&self.ino).ok_or_else(crashed_error)?;
        let data = match fault {
            Some(Fault::WriteEio) => return Err(errno(5)),
            Some(Fault::WriteEnospc) => return Err(errno(28)),
            Some(Fault::ShortWrite) if buf.len() > 1 => &buf[..buf.len() / 2],
            _ => buf,
        };
        write_into(Arc::make_mut(&mut inode.live), offset, data);
        inode.pending.push(Pending::Write {
            at: offset,
            data: Arc::from(data),
        });
        Ok(data.len())
    }

    fn sync_data(&self) -> io::Result<()> {
        let mut guard = self.disk.state.lock();
        let s = &mut *guard;
        SimDisk::check_alive(s, self.generation)?;
        let fault = self
            .disk
            .begin(s, OpKind::Sync, &format!("sync_data inode {}", self.ino))?;
        // A sync that would vouch for data written after a failed sync is what
        // fail-stop forbids; one that only makes a truncation durable repairs.
        let vouches = s.inodes.get(&self.ino).is_some_and(|i| {
            i.sync_failed && i.pending.iter().any(|p| matches!(p, Pending::Write { .. }))
        });
        if vouches {
            s.stats.syncs_after_failed_sync += 1;
        }
        let inode = s.inodes.get_mut(&self.ino).ok_or_else(crashed_error)?;
        if fault == Some(Fault::SyncEio) {
            // fsyncgate: the dirty data is dropped from what will survive, reads
            // still see it, and the next sync has nothing left to fail on. A size
            // change is inode metadata, not a dirty page: it stays pending, and a
            // failed sync with no data to drop leaves the file trustworthy.
            let dropped_data = inode
                .pending
                .iter()
                .any(|p| matches!(p, Pending::Write { .. }));
            inode
                .pending
                .retain(|p| !matches!(p, Pending::Write { .. }));
            inode.sync_failed |= dropped_data;
            return Err(errno(5));
        }
        let mut zeros_written = false;
        let mut large_past = false;
        for op in &inode.pending {
            if let Pending::Write { at, data } = op {
                if data.iter().all(|&b| b == 0) {
                    zeros_written = true;
                } else if data.len() >= LARGE_WRITE && at + data.len() as u64 > inode.synced_to {
                    large_past = true;
                }
            }
        }
        // Only what was written since the last sync reaches the durable image:
        // data dropped by a failed sync stays lost though reads still see it.
        for op in std::mem::take(&mut inode.pending) {
            match op {
                Pending::Write { at, data } => {
                    inode.synced_to = inode.synced_to.max(at + data.len() as u64);
                    write_into(Arc::make_mut(&mut inode.durable), at, &data);
                }
                Pending::SetLen(len) => {
                    inode.synced_to = inode.synced_to.min(len);
                    Arc::make_mut(&mut inode.durable).resize(len as usize, 0);
                }
            }
        }
        // Once what reads see is durable again, the file is trustworthy again.
        if inode.sync_failed && inode.live == inode.durable {
            inode.sync_failed = false;
        }
        if large_past && !zeros_written {
            s.stats.large_writes_unzeroed += 1;
        }
        Ok(())
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.resize(len, "set_len", false)
    }

    fn allocate(&self, len: u64) -> io::Result<()> {
        // Like a growing `set_len`: zeros, durable only after a sync (and a crash
        // may keep the new length or not).
        self.resize(len, "allocate", true)
    }

    /// Reports as holes the 512-byte sectors that read as zeros (a file system
    /// may report written zeros as data or as a hole; this one always says hole,
    /// so that recovery's skipping is exercised wherever zeros lie).
    fn next_data(&self, offset: u64) -> io::Result<Option<Range<u64>>> {
        let mut guard = self.disk.state.lock();
        let s = &mut *guard;
        SimDisk::check_alive(s, self.generation)?;
        Self::read_fault(s)?;
        let inode = s.inodes.get(&self.ino).ok_or_else(crashed_error)?;
        let live = &inode.live;
        let len = live.len() as u64;
        let sector = SECTOR as u64;
        let zero = |k: u64| {
            let from = (k * sector) as usize;
            let to = ((k + 1) * sector).min(len) as usize;
            // Compared with a block of zeros (a `memcmp`), not byte by byte:
            // the scan asks about every sector of every segment at each open.
            live.get(from..to)
                .is_none_or(|b| Some(b) == ZERO_SECTOR.get(..b.len()))
        };
        let sectors = len.div_ceil(sector);
        let mut k = offset / sector;
        while k < sectors && zero(k) {
            k += 1;
        }
        if k >= sectors {
            return Ok(None);
        }
        let start = (k * sector).max(offset);
        while k < sectors && !zero(k) {
            k += 1;
        }
        Ok(Some(start..(k * sector).min(len)))
    }

    fn len(&self) -> io::Result<u64> {
        let s = self.disk.state.lock();
        SimDisk::check_alive(&s, self.generation)?;
        Ok(s.inodes.get(&self.ino).map_or(0, |i| i.live.len() as u64))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn path(name: &str) -> PathBuf {
        PathBuf::from("/d").join(name)
    }

    /// A disk of seed `seed` holding `/d/a` with "durable" fsynced at offset
    /// 0, and its open handle.
    fn durable_file(seed: u64) -> (SimDisk, Arc<dyn StorageFile>) {
        let disk = SimDisk::new(seed);
        disk.create_dir(Path::new("/d")).expect("dir");
        let f = disk.create(&path("a")).expect("create");
        f.write_at(b"durable", 0).expect("write");
        f.sync_data().expect("sync");
        disk.sync_dir(Path::new("/d")).expect("sync dir");
        (disk, f)
    }

    #[test]
    fn a_handle_that_took_a_lock_does_nothing_after_a_crash() {
        let disk = SimDisk::new(1);
        disk.create_dir(Path::new("/d")).expect("dir");
        let old = disk.clone();
        let lock = old.lock(Path::new("/d")).expect("lock");
        old.create(&path("a")).expect("create");
        old.sync_dir(Path::new("/d")).expect("sync dir");
        std::mem::forget(lock);
        disk.crash(CrashModel::default());
        // The crashed process's handle: every directory operation fails.
        assert!(old.create(&path("b")).is_err());
        assert!(old.rename(&path("a"), &path("c")).is_err());
        assert!(old.remove(&path("a")).is_err());
        assert!(old.sync_dir(Path::new("/d")).is_err());
        assert!(old.list(Path::new("/d")).is_err());
        assert!(old.open(&path("a")).is_err());
        assert!(old.create_dir(Path::new("/e")).is_err());
        // The test's own handle and a new process's work.
        let new = disk.clone();
        let _lock = new.lock(Path::new("/d")).expect("lock after the crash");
        new.create(&path("b")).expect("create after the crash");
        let mut names = disk.list(Path::new("/d")).expect("list");
        names.sort();
        assert_eq!(names, ["a", "b"]);
    }

    #[test]
    fn synced_data_survives_every_crash_and_unsynced_data_may_not() {
        let mut lost = 0;
        for seed in 0..200 {
            let (disk, f) = durable_file(seed);
            // The unsynced write on the next block: nothing it can garble
            // holds a synced byte.
            f.write_at(&[7u8; 2000], BLOCK as u64).expect("write");
            disk.crash(CrashModel::default());
            let f = disk.open(&path("a")).expect("the synced file is there");
            let mut buf = [0u8; 7];
            crate::io::read_exact_at(&*f, &mut buf, 0).expect("read");
            assert_eq!(&buf, b"durable");
            if f.len().expect("len") < BLOCK as u64 + 2000 {
                lost += 1;
            }
        }
        assert!(lost > 0, "no crash ever lost unsynced data");
    }

    #[test]
    fn an_unsynced_write_can_garble_synced_bytes_in_its_block() {
        let mut garbled = 0;
        for seed in 0..200 {
            let (disk, f) = durable_file(seed);
            f.write_at(&[7u8; 100], 7)
                .expect("write into the same block");
            disk.crash(CrashModel::default());
            let f = disk.open(&path("a")).expect("the synced file is there");
            let mut buf = [0u8; 7];
            crate::io::read_exact_at(&*f, &mut buf, 0).expect("read");
            if &buf != b"durable" {
                garbled += 1;
            }
        }
        assert!(garbled > 0, "no crash ever garbled the block under a write");
    }

    #[test]
    fn an_unsynced_creation_may_vanish_and_an_unsynced_removal_may_undo() {
        let (mut vanished, mut returned) = (0, 0);
        for seed in 0..200 {
            let disk = SimDisk::new(seed);
            disk.create_dir(Path::new("/d")).expect("dir");
            let old = disk.create(&path("old")).expect("create");
            old.sync_data().expect("sync");
            disk.sync_dir(Path::new("/d")).expect("sync dir");
            disk.remove(&path("old")).expect("remove");
            let new = disk.create(&path("new")).expect("create");
            new.sync_data().expect("sync");
            disk.crash(CrashModel::default());
            let names = disk.files(Path::new("/d"));
            vanished += usize::from(!names.contains(&"new".to_string()));
            returned += usize::from(names.contains(&"old".to_string()));
        }
        assert!(vanished > 0 && returned > 0);
    }

    #[test]
    fn a_failed_sync_drops_the_data_and_the_next_sync_lies() {
        let disk = SimDisk::new(1);
        disk.create_dir(Path::new("/d")).expect("dir");
        let f = disk.create(&path("a")).expect("create"); // op 0
        disk.sync_dir(Path::new("/d")).expect("sync dir"); // op 1
        f.write_at(b"lost", 0).expect("write"); // op 2
        disk.inject(FaultRule {
            fault: Fault::SyncEio,
            at_op: 3,
            persistent: false,
        });
        assert!(f.sync_data().is_err());
        f.sync_data()
            .expect("the retry succeeds, having nothing to write");
        let mut buf = [0u8; 4];
        crate::io::read_exact_at(&*f, &mut buf, 0).expect("still readable");
        disk.crash(CrashModel {
            write_kept: 100,
            write_torn: 0,
            grown_tail: 0,
            dir_change_kept: 100,
            block_garbled: 0,
        });
        let f = disk.open(&path("a")).expect("open");
        assert_eq!(f.len().expect("len"), 0, "the data reached the disk");
    }

    #[test]
    fn the_crash_point_kills_that_operation_and_every_later_one() {
        let disk = SimDisk::new(3);
        disk.create_dir(Path::new("/d")).expect("dir");
        disk.crash_at(Some(1));
        let f = disk.create(&path("a")).expect("op 0 runs");
        assert!(f.write_at(b"x", 0).is_err());
        assert!(f.len().is_err());
        assert!(disk.is_dead());
        disk.crash(CrashModel::default());
        assert!(f.len().is_err(), "a handle from before the crash is dead");
    }
}
