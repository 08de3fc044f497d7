//! Fail stop: a failed write or fsync poisons the outbox, every waiter is woken
//! with the error, nothing is retried, and a reopen recovers what was durable.
//! The faults are injected through the storage interface.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::Duration;

use segwal::io::{LockError, LockGuard, StdStorage, Storage, StorageFile};
use segwal::{Error, Options, Outbox, Seq};

use crate::{drain, payload, small_segments, tmp};

/// Switches a test flips to make the disk misbehave.
#[derive(Debug, Default)]
struct Faults {
    fail_sync: AtomicBool,
    fail_write: AtomicBool,
    fail_sync_dir: AtomicBool,
    /// Refuse writes of zeros only (the writer's zeros ahead of its frames).
    fail_zero_writes: AtomicBool,
    zero_writes_refused: AtomicUsize,
    /// Writes of zeros only that came straight after a write of frames, with
    /// no fsync between: the zeros ahead a batch carries (an idle writer's
    /// come after an fsync).
    batch_zero_writes: AtomicUsize,
    /// Writes of zeros only, a batch's or an idle writer's.
    zero_writes: AtomicUsize,
    /// Whether the last write was of frames, and no fsync came since.
    frames_unsynced: AtomicBool,
    /// Set once any injected fault fired.
    fired: AtomicBool,
    /// Calls that reached a file after a fault fired.
    syncs_after_fault: AtomicUsize,
    writes_after_fault: AtomicUsize,
    /// While true, `sync_data` blocks until it is cleared.
    hold_syncs: Mutex<bool>,
    held: Condvar,
    syncs_waiting: AtomicUsize,
    /// Every directory fsynced, in order.
    dirs_synced: Mutex<Vec<PathBuf>>,
    /// Reads that touch these bytes fail with EIO (a bad range of the disk).
    bad_range: Mutex<Option<std::ops::Range<u64>>>,
}

impl Faults {
    fn set_hold(&self, hold: bool) {
        *self.hold_syncs.lock().expect("lock") = hold;
        self.held.notify_all();
    }
}

#[derive(Debug)]
struct FaultyStorage {
    inner: StdStorage,
    faults: Arc<Faults>,
}

#[derive(Debug)]
struct FaultyFile {
    inner: Arc<dyn StorageFile>,
    faults: Arc<Faults>,
    /// Set by `set_len`: the next sync makes a cut durable, it vouches for no
    /// written data (the writer cuts the segment back when it is poisoned).
    cut: AtomicBool,
}

fn injected(kind: io::ErrorKind, what: &str) -> io::Error {
    io::Error::new(kind, format!("injected {what} failure"))
}

impl Storage for FaultyStorage {
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
        let inner = self.inner.create(path)?;
        Ok(Arc::new(FaultyFile {
            inner,
            faults: self.faults.clone(),
            cut: AtomicBool::new(false),
        }))
    }
    fn open(&self, path: &Path) -> io::Result<Arc<dyn StorageFile>> {
        let inner = self.inner.open(path)?;
        Ok(Arc::new(FaultyFile {
            inner,
            faults: self.faults.clone(),
            cut: AtomicBool::new(false),
        }))
    }
    fn remove(&self, path: &Path) -> io::Result<()> {
        self.inner.remove(path)
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.inner.rename(from, to)
    }
    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        if self.faults.fail_sync_dir.load(Ordering::SeqCst) {
            self.faults.fired.store(true, Ordering::SeqCst);
            return Err(injected(io::ErrorKind::Other, "directory fsync"));
        }
        self.faults
            .dirs_synced
            .lock()
            .expect("lock")
            .push(dir.to_path_buf());
        self.inner.sync_dir(dir)
    }
    fn lock(&self, dir: &Path) -> Result<LockGuard, LockError> {
        self.inner.lock(dir)
    }
    fn parallel_reads(&self) -> bool {
        self.inner.parallel_reads()
    }
}

impl StorageFile for FaultyFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let bad = self.faults.bad_range.lock().expect("lock").clone();
        if bad.is_some_and(|r| offset < r.end && offset + buf.len() as u64 > r.start) {
            return Err(io::Error::from_raw_os_error(5)); // EIO
        }
        self.inner.read_at(buf, offset)
    }
    fn next_data(&self, offset: u64) -> io::Result<Option<std::ops::Range<u64>>> {
        self.inner.next_data(offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<usize> {
        let f = &self.faults;
        if f.fired.load(Ordering::SeqCst) {
            f.writes_after_fault.fetch_add(1, Ordering::SeqCst);
        }
        if f.fail_write.load(Ordering::SeqCst) {
            // A refused write of zeros only (those an idle writer writes
            // ahead of its frames) is not a fault the writer stops at.
            if !buf.iter().all(|&b| b == 0) {
                f.fired.store(true, Ordering::SeqCst);
            }
            return Err(io::Error::from_raw_os_error(28)); // ENOSPC
        }
        let zeros = buf.iter().all(|&b| b == 0);
        if f.fail_zero_writes.load(Ordering::SeqCst) && zeros {
            f.zero_writes_refused.fetch_add(1, Ordering::SeqCst);
            return Err(io::Error::from_raw_os_error(28)); // ENOSPC
        }
        if f.frames_unsynced.swap(!zeros, Ordering::SeqCst) && zeros {
            f.batch_zero_writes.fetch_add(1, Ordering::SeqCst);
        }
        if zeros {
            f.zero_writes.fetch_add(1, Ordering::SeqCst);
        }
        self.inner.write_at(buf, offset)
    }
    fn sync_data(&self) -> io::Result<()> {
        let f = &self.faults;
        f.frames_unsynced.store(false, Ordering::SeqCst);
        {
            let mut hold = f.hold_syncs.lock().expect("lock");
            f.syncs_waiting.fetch_add(1, Ordering::SeqCst);
            while *hold {
                hold = f.held.wait(hold).expect("wait");
            }
            f.syncs_waiting.fetch_sub(1, Ordering::SeqCst);
        }
        let repair = self.cut.swap(false, Ordering::SeqCst);
        if f.fired.load(Ordering::SeqCst) && !repair {
            f.syncs_after_fault.fetch_add(1, Ordering::SeqCst);
        }
        if f.fail_sync.load(Ordering::SeqCst) {
            f.fired.store(true, Ordering::SeqCst);
            return Err(injected(io::ErrorKind::Other, "fsync"));
        }
        self.inner.sync_data()
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.cut.store(true, Ordering::SeqCst);
        self.inner.set_len(len)
    }
    fn allocate(&self, len: u64) -> io::Result<()> {
        self.inner.allocate(len)
    }
    fn len(&self) -> io::Result<u64> {
        self.inner.len()
    }
}

fn faulty(dir: &Path, options: Options) -> (Outbox, Arc<Faults>) {
    let faults = Arc::new(Faults::default());
    let storage = Arc::new(FaultyStorage {
        inner: StdStorage::new(),
        faults: faults.clone(),
    });
    let outbox = Outbox::open_with_storage(dir, options, storage).expect("open");
    (outbox, faults)
}

fn active_segment(dir: &Path) -> PathBuf {
    crate::segment_files(dir).pop().expect("a segment")
}

#[test]
fn a_failed_fsync_poisons_and_wakes_every_waiter_and_is_never_retried() {
    let (_t, dir) = tmp();
    let (outbox, faults) = faulty(&dir, Options::default());
    let durable: Vec<Seq> = (0..3)
        .map(|i| outbox.append(&payload(0, i)).expect("append"))
        .collect();
    // The data's length, not the file's: the file is preallocated further.
    // Each append was a sync group of its own, on a block of its own after the
    // header's; the next write would start on the block after the last.
    let data_end = outbox.stats().disk_bytes;
    assert_eq!(data_end, 3 * 4096 + 48 + payload(0, 2).len() as u64);
    let synced_len = data_end.next_multiple_of(4096);
    faults.fail_sync.store(true, Ordering::SeqCst);
    let producers: Vec<_> = (0..8)
        .map(|p| {
            let outbox = outbox.clone();
            thread::spawn(move || outbox.append(&payload(p + 1, 0)))
        })
        .collect();
    let segment = active_segment(&dir);
    for producer in producers {
        match producer.join().expect("producer") {
            Err(Error::Poisoned { path, op, .. }) => {
                assert_eq!(path, segment);
                assert_eq!(op, "fsync");
            }
            other => panic!("expected Poisoned, got {other:?}"),
        }
    }
    assert!(matches!(
        outbox.append(b"later"),
        Err(Error::Poisoned { .. })
    ));
    assert!(matches!(outbox.sync(), Err(Error::Poisoned { .. })));
    // The bytes the failed fsync may have dropped are cut off: a reopen in this
    // process must not read them from the page cache as if they were written.
    assert_eq!(
        std::fs::metadata(&segment).expect("stat").len(),
        synced_len,
        "the unsynced tail was left in place"
    );
    assert!(outbox.stats().poisoned);
    // The durable records can still be handed to the relay.
    let claimed: Vec<Seq> = outbox
        .claim(10)
        .expect("claim")
        .iter()
        .map(|r| r.seq())
        .collect();
    assert_eq!(claimed, durable);
    outbox.ack_many(&claimed).expect("ack");
    assert!(matches!(outbox.close(), Err(Error::Poisoned { .. })));
    assert_eq!(
        faults.syncs_after_fault.load(Ordering::SeqCst),
        0,
        "an fsync was retried"
    );
    assert_eq!(
        faults.writes_after_fault.load(Ordering::SeqCst),
        0,
        "the segment was written after its fsync failed"
    );

    // Reopening recovers every acknowledged append; the failed ones are in doubt.
    let outbox = Outbox::open(&dir, Options::default()).expect("reopen");
    let recovered: Vec<Seq> = drain(&outbox).iter().map(|r| r.seq()).collect();
    assert_eq!(recovered[..3], durable[..]);
    assert!(recovered.len() <= 3 + 8);
    outbox.append(b"progress").expect("appends work again");
}

#[test]
fn a_failed_write_poisons_and_the_segment_is_never_written_again() {
    let (_t, dir) = tmp();
    let (outbox, faults) = faulty(&dir, Options::default());
    let first = outbox.append(b"durable").expect("append");
    faults.fail_write.store(true, Ordering::SeqCst);
    match outbox.append(b"no space") {
        Err(e @ Error::Poisoned { .. }) => {
            let message = e.to_string();
            assert!(message.contains("write"), "{message}");
            assert!(message.contains(&active_segment(&dir).display().to_string()));
            let source = std::error::Error::source(&e).expect("source");
            assert!(source.to_string().contains("No space left"), "{source}");
        }
        other => panic!("expected Poisoned, got {other:?}"),
    }
    faults.fail_write.store(false, Ordering::SeqCst);
    assert!(matches!(
        outbox.append(b"after"),
        Err(Error::Poisoned { .. })
    ));
    let _ = outbox.close();
    assert_eq!(faults.writes_after_fault.load(Ordering::SeqCst), 0);
    assert_eq!(faults.syncs_after_fault.load(Ordering::SeqCst), 0);
    let outbox = Outbox::open(&dir, Options::default()).expect("reopen");
    assert_eq!(drain(&outbox)[0].seq(), first);
}

/// Zeros written ahead of the frames are only a speed-up: when the disk refuses
/// them (a copy-on-write file system may not have reserved the space), appends
/// go on and nothing is lost.
#[test]
fn a_refused_write_of_zeros_ahead_does_not_poison() {
    let (_t, dir) = tmp();
    let (outbox, faults) = faulty(&dir, Options::default());
    faults.fail_zero_writes.store(true, Ordering::SeqCst);
    let seqs: Vec<Seq> = (0..5)
        .map(|i| outbox.append(&payload(0, i)).expect("append"))
        .collect();
    assert_eq!(faults.zero_writes_refused.load(Ordering::SeqCst), 1);
    outbox.close().expect("close");
    let outbox = Outbox::open(&dir, Options::default()).expect("reopen");
    let back: Vec<Seq> = drain(&outbox).iter().map(|r| r.seq()).collect();
    assert_eq!(back, seqs);
}

/// Large writes (many producers of large records: 64 KiB and more on
/// average) go into preallocated space with no zeros ahead, each byte written
/// once; small ones carry zeros ahead. Either way every record comes back
/// whole.
#[test]
fn large_writes_carry_no_zeros_ahead() {
    let (_t, dir) = tmp();
    let (outbox, faults) = faulty(&dir, Options::default());
    let zeros_ahead = || faults.batch_zero_writes.load(Ordering::SeqCst);
    let mut written: Vec<(Seq, Vec<u8>)> = Vec::new();
    for i in 0..4 {
        let p = payload(0, i);
        written.push((outbox.append(&p).expect("append"), p));
    }
    assert!(zeros_ahead() >= 1, "small appends carry zeros ahead");
    // 64 records of 4 KiB: writes of about 260 KiB each. The writer goes by
    // the moving average of its writes, past 64 KiB after a few of them.
    let large = |n: u64| -> Vec<Vec<u8>> {
        (0..64u64)
            .map(|k| {
                let mut p = vec![(n + k) as u8; 4096];
                p[..16].copy_from_slice(&[n.to_le_bytes(), k.to_le_bytes()].concat());
                p
            })
            .collect()
    };
    let mut append_large = |n: u64| {
        let batch = large(n);
        let seqs = outbox.append_batch(&batch).expect("append_batch");
        written.extend(seqs.into_iter().zip(batch));
    };
    for n in 0..8 {
        append_large(n);
    }
    let before = zeros_ahead();
    let all_before = faults.zero_writes.load(Ordering::SeqCst);
    for n in 8..24 {
        append_large(n);
    }
    assert_eq!(zeros_ahead(), before, "large writes carried zeros ahead");
    // Nor does the writer write them while idle between bursts of large
    // writes: a pause longer than its idle grace (at most 5 ms) would
    // otherwise have it write the zeros the large writes went without.
    std::thread::sleep(std::time::Duration::from_millis(100));
    assert_eq!(
        faults.zero_writes.load(Ordering::SeqCst),
        all_before,
        "zeros written ahead of large writes"
    );
    outbox.close().expect("close");
    let outbox = Outbox::open(&dir, Options::default()).expect("reopen");
    let back: Vec<(Seq, Vec<u8>)> = drain(&outbox)
        .iter()
        .map(|r| (r.seq(), r.payload().to_vec()))
        .collect();
    assert_eq!(back.len(), written.len());
    assert!(back == written, "a record came back other than written");
}

#[test]
fn a_failed_directory_fsync_at_rotation_poisons() {
    let (_t, dir) = tmp();
    let (outbox, faults) = faulty(&dir, small_segments());
    let mut durable = Vec::new();
    faults.fail_sync_dir.store(true, Ordering::SeqCst);
    let error = loop {
        match outbox.append(&[5u8; 500]) {
            Ok(seq) => durable.push(seq),
            Err(e) => break e,
        }
        assert!(durable.len() < 100, "never rotated");
    };
    assert!(
        matches!(
            error,
            Error::Poisoned {
                op: "sync directory",
                ..
            }
        ),
        "{error:?}"
    );
    let _ = outbox.close();
    let outbox = Outbox::open(&dir, small_segments()).expect("reopen");
    let recovered: Vec<Seq> = drain(&outbox).iter().map(|r| r.seq()).collect();
    assert_eq!(recovered, durable);
}

#[test]
fn claims_do_not_wait_for_an_fsync_in_progress() {
    let (_t, dir) = tmp();
    let (outbox, faults) = faulty(&dir, Options::default());
    let first = outbox.append(b"durable").expect("append");
    let producer = append_behind_a_held_fsync(&outbox, &faults, b"waits for its fsync");
    let (tx, rx) = std::sync::mpsc::channel();
    let relay = {
        let outbox = outbox.clone();
        thread::spawn(move || tx.send(outbox.claim(10)).expect("send"))
    };
    let claimed = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("claim returned while an fsync was in progress")
        .expect("claim");
    assert_eq!(
        claimed.iter().map(|r| r.seq()).collect::<Vec<_>>(),
        vec![first]
    );
    faults.set_hold(false);
    producer
        .join()
        .expect("producer")
        .expect("append completes");
    relay.join().expect("relay");
}

/// Holds every `sync_data` from now on, appends `payload` from a new thread, and
/// returns once the writer is inside the `sync_data` of that append.
fn append_behind_a_held_fsync(
    outbox: &Outbox,
    faults: &Faults,
    payload: &'static [u8],
) -> thread::JoinHandle<segwal::Result<Seq>> {
    faults.set_hold(true);
    let producer = {
        let outbox = outbox.clone();
        thread::spawn(move || outbox.append(payload))
    };
    while faults.syncs_waiting.load(Ordering::SeqCst) == 0 {
        thread::sleep(Duration::from_millis(1));
    }
    producer
}

/// The outcome of an append thread, or a failure (not a hang) if it is still
/// waiting after a minute: an answer that never came.
fn answered(producer: thread::JoinHandle<segwal::Result<Seq>>) -> segwal::Result<Seq> {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !producer.is_finished() {
        assert!(
            std::time::Instant::now() < deadline,
            "a producer was never answered"
        );
        thread::sleep(Duration::from_millis(1));
    }
    producer.join().expect("producer")
}

/// Options with a linger of half a second: once the held fsync returns, the
/// writer gathers every queued producer into one batch, even one preempted
/// between taking its share of the queue and sending its request.
fn shared_batch_options() -> Options {
    Options::default().linger(Duration::from_millis(500))
}

/// Holds the writer inside `sync_data` for an append of its own, queues `payloads`
/// behind it from one thread each, and waits until every one of them has taken
/// its share of the queue: released, they form one batch of that many producers
/// (more than 16: a batch whose producers the notifier thread wakes). The
/// outbox must have a linger ([`shared_batch_options`]), so that a producer preempted
/// between taking its share and sending still joins the batch.
fn queue_behind_a_held_fsync(
    outbox: &Outbox,
    faults: &Faults,
    payloads: &[Vec<u8>],
) -> (
    thread::JoinHandle<segwal::Result<Seq>>,
    Vec<thread::JoinHandle<segwal::Result<Seq>>>,
) {
    let held = append_behind_a_held_fsync(outbox, faults, b"held");
    let producers: Vec<_> = payloads
        .iter()
        .cloned()
        .map(|p| {
            let outbox = outbox.clone();
            thread::spawn(move || outbox.append(&p))
        })
        .collect();
    // Each queued append holds its frame's bytes (40 + payload) of the queue.
    let queued =
        40 + b"held".len() as u64 + payloads.iter().map(|p| 40 + p.len() as u64).sum::<u64>();
    while outbox.stats().queued_bytes < queued {
        thread::sleep(Duration::from_millis(1));
    }
    (held, producers)
}

#[test]
fn every_producer_of_a_shared_batch_gets_its_own_sequence_number() {
    let (_t, dir) = tmp();
    let (outbox, faults) = faulty(&dir, shared_batch_options());
    let payloads: Vec<Vec<u8>> = (0..24).map(|p| payload(p, 0)).collect();
    let (held, producers) = queue_behind_a_held_fsync(&outbox, &faults, &payloads);
    let batches = outbox.stats().batches;
    faults.set_hold(false);
    let held = answered(held).expect("held append");
    let seqs: Vec<Seq> = producers
        .into_iter()
        .map(|p| answered(p).expect("append"))
        .collect();
    assert_eq!(
        outbox.stats().batches,
        batches + 1,
        "the 24 appends were meant to share one batch"
    );
    assert_eq!(outbox.stats().queued_bytes, 0);
    // One batch: the 24 sequence numbers are the 24 after the held one, each
    // producer its own.
    let mut sorted = seqs.clone();
    sorted.sort();
    let expected: Vec<Seq> = (1..=24).map(|i| Seq::from(held.get() + i)).collect();
    assert_eq!(sorted, expected);
    outbox.close().expect("close");
    let reopened = Outbox::open(&dir, Options::default()).expect("reopen");
    let records = drain(&reopened);
    for (seq, p) in seqs.iter().zip(&payloads) {
        let record = records
            .iter()
            .find(|r| r.seq() == *seq)
            .expect("acked record");
        assert_eq!(record.payload(), p.as_slice(), "seq {seq}");
    }
}

#[test]
fn every_producer_of_a_shared_batch_gets_the_fsync_error() {
    let (_t, dir) = tmp();
    let (outbox, faults) = faulty(&dir, shared_batch_options());
    let payloads: Vec<Vec<u8>> = (0..24).map(|p| payload(p, 1)).collect();
    let (held, producers) = queue_behind_a_held_fsync(&outbox, &faults, &payloads);
    // The held fsync fails: the batch of 24 queued behind it shares the error.
    faults.fail_sync.store(true, Ordering::SeqCst);
    faults.set_hold(false);
    for producer in producers {
        match answered(producer) {
            Err(Error::Poisoned { op, .. }) => assert_eq!(op, "fsync"),
            other => panic!("expected Poisoned, got {other:?}"),
        }
    }
    assert!(matches!(answered(held), Err(Error::Poisoned { .. })));
    assert_eq!(outbox.stats().queued_bytes, 0);
    assert!(matches!(outbox.close(), Err(Error::Poisoned { .. })));
}

/// Regression: under `Durability::Buffered`, appends answered Ok but not yet
/// fsynced were cut back off the file when a later write failed (a full disk),
/// and after a reopen their numbers went to other records.
#[test]
fn under_buffered_a_failed_write_never_takes_back_an_answered_append() {
    let (_t, dir) = tmp();
    let options = Options::default()
        .durability(segwal::Durability::Buffered)
        .buffered_sync_interval(std::time::Duration::from_secs(3600));
    let (outbox, faults) = faulty(&dir, options);
    let answered: Vec<Seq> = (0..5)
        .map(|i| outbox.append(&payload(0, i)).expect("append"))
        .collect();
    faults.fail_write.store(true, Ordering::SeqCst);
    assert!(matches!(
        outbox.append(b"no space"),
        Err(Error::Poisoned { .. })
    ));
    faults.fail_write.store(false, Ordering::SeqCst);
    // Made durable before the outbox gave up: claimable now, and after a reopen.
    let claimed: Vec<Seq> = drain(&outbox).iter().map(|r| r.seq()).collect();
    assert_eq!(claimed, answered);
    let _ = outbox.close();
    assert_eq!(
        faults.writes_after_fault.load(Ordering::SeqCst),
        0,
        "the segment was written after its write failed"
    );
    let outbox = Outbox::open(&dir, Options::default()).expect("reopen");
    let recovered: Vec<Seq> = drain(&outbox).iter().map(|r| r.seq()).collect();
    assert_eq!(recovered, answered, "an answered append was taken back");
    let next = outbox.append(b"after").expect("append");
    assert!(next > answered[4], "a number answered Ok was given again");
}

/// Regression: only the immediate parent was fsynced, and only by the open that
/// created the directory; a power cut could take back the other new entries.
#[test]
fn the_directory_an_open_creates_is_made_durable_in_its_parent() {
    let t = tempfile::tempdir().expect("tempdir");
    let root = t.path().canonicalize().expect("canonical");
    let dir = root.join("outbox");
    let (outbox, faults) = faulty(&dir, Options::default());
    outbox.close().expect("close");
    let synced = faults.dirs_synced.lock().expect("lock").clone();
    assert!(synced.contains(&root), "{synced:?}");
    // A later open, which created nothing, fsyncs the parent again: it cannot
    // prove the open that created the directory lived to do it.
    let (outbox, faults) = faulty(&dir, Options::default());
    outbox.close().expect("close");
    let synced = faults.dirs_synced.lock().expect("lock").clone();
    assert!(synced.contains(&root), "{synced:?}");
    // Missing parents are not created: a typo in a path is an error, not a new
    // tree of directories (`Error::InvalidPath`, tests/it/foreign.rs).
    assert!(matches!(
        Outbox::open(root.join("a").join("outbox"), Options::default()),
        Err(Error::InvalidPath { .. })
    ));
}

/// A read error is an error value naming the file, never a signal that kills
/// the process (records are read with positioned reads, not through a memory
/// map); the record it hit is held back, the others keep flowing, and after a
/// reopen it is delivered.
#[test]
fn a_read_error_fails_one_claim_holds_its_record_back_and_the_rest_flows() {
    let (_t, dir) = tmp();
    let options = Options::default().segment_bytes(16 * 4096);
    let (outbox, faults) = faulty(&dir, options.clone());
    let seqs: Vec<Seq> = (0..40)
        .map(|i| outbox.append(&payload(0, i)).expect("append"))
        .collect();
    // The third record of the first (sealed) segment: its own block.
    *faults.bad_range.lock().expect("lock") = Some(3 * 4096..3 * 4096 + 1);
    let mut delivered = Vec::new();
    let mut failures = 0;
    loop {
        match outbox.claim(1) {
            Ok(records) if records.is_empty() => break,
            Ok(records) => {
                for r in &records {
                    assert_eq!(
                        r.payload(),
                        payload(0, delivered.len() + failures).as_slice()
                    );
                    delivered.push(r.seq());
                    outbox.ack(r.seq()).expect("ack");
                }
            }
            Err(Error::Io { path, op, .. }) => {
                assert_eq!(op, "read segment");
                assert_eq!(path, crate::segment_files(&dir)[0]);
                failures += 1;
                // The range is of the first segment's file only.
                *faults.bad_range.lock().expect("lock") = None;
            }
            Err(e) => panic!("unexpected error {e}"),
        }
    }
    assert_eq!(
        failures, 1,
        "the failing record is held back, not retried at once"
    );
    let expected: Vec<Seq> = seqs.iter().copied().filter(|&s| s != seqs[2]).collect();
    assert_eq!(delivered, expected);
    assert_eq!(outbox.stats().claimed, 1, "held back as claimed");
    outbox.close().expect("close");
    // The disk heals: the record is there, and is delivered; the others were
    // acknowledged (durably, at the close) and are not.
    let outbox = Outbox::open(&dir, options).expect("reopen");
    let again: Vec<Seq> = drain(&outbox).iter().map(|r| r.seq()).collect();
    assert_eq!(again, vec![seqs[2]]);
}

/// What a failed fsync can take back under `Durability::Buffered`, as
/// docs/GUARANTEES.md states it: the appends answered since the last successful
/// fsync. The writer cuts the file back to what that fsync made durable (the
/// page cache can no longer be trusted), so they are gone after a reopen, and
/// their numbers are assigned again, to records no relay ever saw.
#[test]
fn under_buffered_a_failed_fsync_takes_back_the_appends_since_the_last_one() {
    let (_t, dir) = tmp();
    let options = Options::default()
        .durability(segwal::Durability::Buffered)
        .buffered_sync_interval(std::time::Duration::from_secs(3600));
    let (outbox, faults) = faulty(&dir, options);
    let durable: Vec<Seq> = (0..3)
        .map(|i| outbox.append(&payload(0, i)).expect("append"))
        .collect();
    outbox.sync().expect("sync");
    let answered: Vec<Seq> = (3..6)
        .map(|i| outbox.append(&payload(0, i)).expect("append"))
        .collect();
    faults.fail_sync.store(true, Ordering::SeqCst);
    assert!(matches!(
        outbox.sync(),
        Err(Error::Poisoned { op: "fsync", .. })
    ));
    let _ = outbox.close();
    faults.fail_sync.store(false, Ordering::SeqCst);
    let outbox = Outbox::open(&dir, Options::default()).expect("reopen");
    let recovered: Vec<Seq> = drain(&outbox).iter().map(|r| r.seq()).collect();
    assert_eq!(
        recovered, durable,
        "only what the last good fsync made durable"
    );
    let next = outbox.append(b"after").expect("append");
    // The seal of the reopened segment takes one of them, the next record another.
    assert!(
        next <= answered[2],
        "the numbers of taken-back appends are given again: {next}"
    );
}

/// A panic of the writer in the middle of a batch (a bug, injected after the
/// batch's write and before its sync) tells the batch's producer that its
/// append is in doubt (`Poisoned`: it may have been written), never `Closed`
/// (which says it never reached the writer); the outbox is poisoned, later
/// appends fail with the poison, and a reopen recovers. The same on the
/// writer thread and on the thread of a producer appending alone
/// (`Options::caller_writes`).
#[test]
fn a_writer_panic_tells_its_batch_in_doubt() {
    use segwal::sim::Bug;
    for caller_writes in [true, false] {
        let (_t, dir) = tmp();
        let options = Options::default()
            .caller_writes(caller_writes)
            .inject_bug(Bug::WriterPanics);
        let outbox = Outbox::open(&dir, options).expect("open");
        let e = outbox.append(b"in doubt").expect_err("the writer panicked");
        assert!(
            matches!(e, Error::Poisoned { .. }),
            "{caller_writes}: {e:?}"
        );
        // The batch's answers are left as the panic unwinds; the writer
        // thread poisons the outbox a moment later, before its lock goes.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !outbox.stats().poisoned {
            assert!(std::time::Instant::now() < deadline, "never poisoned");
            thread::sleep(Duration::from_millis(1));
        }
        let later = outbox.append(b"after").expect_err("poisoned");
        assert!(matches!(later, Error::Poisoned { .. }), "{later:?}");
        assert!(matches!(outbox.close(), Err(Error::Poisoned { .. })));
        let outbox = Outbox::open(&dir, Options::default()).expect("reopen");
        let back = drain(&outbox);
        // In doubt: delivered or not, but nothing else.
        assert!(back.len() <= 1, "{back:?}");
        if let Some(r) = back.first() {
            assert_eq!(r.payload(), b"in doubt");
        }
        outbox.append(b"again").expect("append after the reopen");
        outbox.close().expect("close");
    }
}

/// A reason of the longest kept length, different for each `i`.
fn long_reason(i: usize) -> String {
    let mut r = format!("HTTP 503 from the broker, delivery {i}: ");
    r.extend(std::iter::repeat_n('x', segwal::REASON_BYTES_MAX - r.len()));
    r
}

#[test]
fn releases_faster_than_the_disk_wait_for_it_instead_of_piling_up() {
    // Changes of delivery state under `ack_durability(Buffered)` are answered
    // at once and written with the writer's next batch. A relay releasing
    // records with long reasons faster than the disk takes them piled them
    // up without bound (gigabytes), until the writer's one frame for them
    // passed the format's record limit and the writer thread panicked. Past a
    // bound (8 MiB of entries) the caller now waits for the writer.
    const RECORDS: usize = 12_000; // 12.5 MB of release entries
    let (_t, dir) = tmp();
    let (outbox, faults) = faulty(&dir, Options::default());
    let payloads: Vec<Vec<u8>> = (0..RECORDS).map(|i| payload(0, i)).collect();
    outbox.append_batch(&payloads).expect("append");
    let seqs: Vec<Seq> = outbox
        .claim(RECORDS)
        .expect("claim")
        .iter()
        .map(|r| r.seq())
        .collect();
    assert_eq!(seqs.len(), RECORDS);
    // The disk stalls: the writer's next fsync (an append's) waits until it
    // is let go, before any release is made.
    faults.set_hold(true);
    let appender = {
        let outbox = outbox.clone();
        thread::spawn(move || outbox.append(b"stalled"))
    };
    crate::eventually("the writer waits for its fsync", || {
        faults.syncs_waiting.load(Ordering::SeqCst) > 0
    });
    let done = Arc::new(AtomicUsize::new(0));
    let releaser = {
        let (outbox, done) = (outbox.clone(), done.clone());
        let seqs = seqs.clone();
        thread::spawn(move || {
            for (i, &seq) in seqs.iter().enumerate() {
                outbox
                    .release_after(seq, Duration::from_secs(3600), &long_reason(i))
                    .expect("release");
                done.fetch_add(1, Ordering::SeqCst);
            }
        })
    };
    // 8 MiB is 8,050 entries of 1,042 bytes.
    crate::eventually("the releases reach the bound", || {
        done.load(Ordering::SeqCst) >= 8_000
    });
    // With the disk stalled, the caller past the bound cannot return: the
    // pause only gives a caller that does not wait the time to finish.
    thread::sleep(Duration::from_millis(300));
    let made = done.load(Ordering::SeqCst);
    assert!(
        made < RECORDS,
        "all {RECORDS} releases answered while the disk was stalled"
    );
    // What waits stays near the bound (the entries, and the maps of the
    // delayed records).
    let held = outbox.stats().state_bytes;
    assert!(held < 10 << 20, "{} MiB held in memory", held >> 20);
    faults.set_hold(false);
    releaser.join().expect("releaser");
    appender.join().expect("appender").expect("append");
    assert_eq!(outbox.stats().delayed, RECORDS as u64);
    outbox.close().expect("close");
    // Every release is in the log, split over frames of bounded size.
    let outbox = Outbox::open(&dir, Options::default()).expect("reopen");
    assert_eq!(outbox.stats().delayed, RECORDS as u64);
    let pending = outbox.claim(10).expect("claim");
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0].payload(), b"stalled");
    outbox.close().expect("close");
}

#[test]
fn a_poisoned_outbox_keeps_no_changes_it_can_never_write() {
    // A poisoned outbox goes on serving claims and changes from memory so
    // that a relay can drain it; no writer writes them, and they must not
    // pile up either (before, every release and dead letter was kept).
    let (_t, dir) = tmp();
    let (outbox, faults) = faulty(&dir, Options::default());
    let payloads: Vec<Vec<u8>> = (0..2_000).map(|i| payload(0, i)).collect();
    outbox.append_batch(&payloads).expect("append");
    faults.fail_sync.store(true, Ordering::SeqCst);
    assert!(matches!(outbox.append(b"x"), Err(Error::Poisoned { .. })));
    assert!(outbox.stats().poisoned);
    let records = outbox.claim(2_000).expect("claim");
    let before = outbox.stats().state_bytes;
    for (i, r) in records.iter().enumerate() {
        if i % 2 == 0 {
            outbox
                .release_after(r.seq(), Duration::ZERO, &long_reason(i))
                .expect("release");
        } else {
            outbox.dead_letter(r.seq(), &long_reason(i)).expect("dead");
        }
    }
    let after = outbox.stats().state_bytes;
    // 2 MB of entries before the mend; the maps of 1,000 dead letters and
    // 1,000 reasons now.
    assert!(
        after < before + (256 << 10),
        "state grew from {before} to {after} bytes"
    );
    assert!(matches!(outbox.close(), Err(Error::Poisoned { .. })));
}

/// A fault at any write or sync of an open that deletes the fully
/// acknowledged segment it finds (its log start, the fdatasync, the
/// directory fsync) fails the open, as a fault of its seal does: no open
/// answers Ok with an outbox already poisoned. Nothing is written after a
/// failed sync, and the next open, after a crash or not, hands out no
/// acknowledged record.
#[test]
fn a_fault_in_the_deletion_an_open_makes_fails_the_open() {
    use segwal::sim::{CrashModel, Fault, FaultRule, SimDisk};
    let open =
        |d: &SimDisk| Outbox::open_with_storage("/outbox", Options::default(), Arc::new(d.clone()));
    let base = SimDisk::new(7);
    let outbox = open(&base).expect("open");
    for i in 0..10u32 {
        outbox.append(&i.to_le_bytes()).expect("append");
    }
    let seqs: Vec<Seq> = drain(&outbox).iter().map(|r| r.seq()).collect();
    outbox.ack_many(&seqs).expect("ack");
    outbox.close().expect("close");
    let before = base.ops();
    let traced = base.fork(1);
    let reopened = open(&traced).expect("reopen");
    assert_eq!(reopened.stats().segments_deleted, 1, "the open deletes it");
    reopened.close().expect("close");
    let steps = traced.ops() - before;
    let mut refused = 0;
    for k in 0..steps {
        for fault in [Fault::WriteEio, Fault::SyncEio, Fault::SyncDirEio] {
            let d = base.fork(2 + k);
            d.inject(FaultRule {
                fault,
                at_op: before + k,
                persistent: false,
            });
            let opened = open(&d);
            if d.stats().faults_injected == 0 {
                continue;
            }
            match opened {
                Ok(outbox) => {
                    assert!(
                        !outbox.stats().poisoned,
                        "step {k}, {fault:?}: Ok, poisoned"
                    );
                    outbox.close().expect("close");
                }
                Err(_) => refused += 1,
            }
            d.clear_faults();
            assert_eq!(d.stats().writes_after_failed_sync, 0, "step {k}, {fault:?}");
            d.crash(CrashModel::default());
            let again = open(&d).expect("the next open recovers");
            assert!(
                again.claim(100).expect("claim").is_empty(),
                "step {k}, {fault:?}"
            );
            again.close().expect("close");
        }
    }
    assert!(refused > 0, "no fault reached a step of the open");
}
