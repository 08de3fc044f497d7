//! A disk that fills during the engine's own duties, on the simulated disk
//! with a capacity: every write or preallocation past it fails with ENOSPC.
//! The outbox poisons, the process closes, another file takes every byte
//! left, and the outbox must still open (through its reserve) and drain.

use std::io;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use segwal::io::{LockError, LockGuard, Storage, StorageFile};
use segwal::sim::SimDisk;
use segwal::{Durability, Error, Options, Outbox, Seq};

use crate::drain;

const DIR: &str = "/outbox";
const ENOSPC: i32 = 28;

/// A simulated disk holding at most `cap` bytes of files in the outbox's
/// directory (and its quarantine folder).
#[derive(Debug, Clone)]
struct Capped {
    disk: SimDisk,
    cap: Arc<AtomicU64>,
    /// Whether it tells its free bytes (a storage may not; a user's quota
    /// is not in what the file system says).
    tells_free: bool,
    /// Whether `allocate` reserves space (a file system without `fallocate`
    /// does nothing and succeeds).
    reserves: bool,
}

impl Capped {
    fn new(seed: u64, tells_free: bool) -> Capped {
        Capped {
            disk: SimDisk::new(seed),
            cap: Arc::new(AtomicU64::new(u64::MAX)),
            tells_free,
            reserves: true,
        }
    }

    fn open(&self, options: &Options) -> segwal::Result<Outbox> {
        Outbox::open_with_storage(DIR, options.clone(), Arc::new(self.clone()))
    }

    /// The lengths of the files, by name.
    fn files(&self) -> Vec<(String, u64)> {
        let mut files = Vec::new();
        for dir in [
            PathBuf::from(DIR),
            Path::new(DIR).join(segwal::QUARANTINE_DIR),
        ] {
            for name in self.disk.files(&dir) {
                let len = self.disk.open(&dir.join(&name)).and_then(|f| f.len());
                files.push((name, len.unwrap_or(0)));
            }
        }
        files
    }

    fn used(&self) -> u64 {
        self.files().iter().map(|f| f.1).sum()
    }

    /// Leaves `room` bytes free.
    fn leave(&self, room: u64) {
        self.cap.store(self.used() + room, Ordering::SeqCst);
    }

    fn grow(&self, by: u64) -> io::Result<()> {
        if by > 0 && self.used() + by > self.cap.load(Ordering::SeqCst) {
            return Err(io::Error::from_raw_os_error(ENOSPC));
        }
        Ok(())
    }

    fn wrap(&self, file: io::Result<Arc<dyn StorageFile>>) -> io::Result<Arc<dyn StorageFile>> {
        Ok(Arc::new(CappedFile {
            file: file?,
            disk: self.clone(),
        }))
    }
}

#[derive(Debug)]
struct CappedFile {
    file: Arc<dyn StorageFile>,
    disk: Capped,
}

impl Storage for Capped {
    fn create_dir(&self, dir: &Path) -> io::Result<bool> {
        self.disk.create_dir(dir)
    }
    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        self.disk.list(dir)
    }
    fn create(&self, path: &Path) -> io::Result<Arc<dyn StorageFile>> {
        self.wrap(self.disk.create(path))
    }
    fn open(&self, path: &Path) -> io::Result<Arc<dyn StorageFile>> {
        self.wrap(self.disk.open(path))
    }
    fn remove(&self, path: &Path) -> io::Result<()> {
        self.disk.remove(path)
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.disk.rename(from, to)
    }
    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        self.disk.sync_dir(dir)
    }
    fn random_u64(&self) -> u64 {
        self.disk.random_u64()
    }
    fn free_bytes(&self, _dir: &Path) -> io::Result<Option<u64>> {
        let cap = self.cap.load(Ordering::SeqCst);
        Ok(Some(cap.saturating_sub(self.used())).filter(|_| self.tells_free))
    }
    fn lock(&self, dir: &Path) -> Result<LockGuard, LockError> {
        self.disk.lock(dir)
    }
}

impl StorageFile for CappedFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.file.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<usize> {
        let end = offset + buf.len() as u64;
        self.disk.grow(end.saturating_sub(self.file.len()?))?;
        self.file.write_at(buf, offset)
    }
    fn sync_data(&self) -> io::Result<()> {
        self.file.sync_data()
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.file.set_len(len)
    }
    fn allocate(&self, len: u64) -> io::Result<()> {
        if !self.disk.reserves {
            return Ok(());
        }
        self.disk.grow(len.saturating_sub(self.file.len()?))?;
        self.file.allocate(len)
    }
    fn next_data(&self, offset: u64) -> io::Result<Option<Range<u64>>> {
        self.file.next_data(offset)
    }
    fn len(&self) -> io::Result<u64> {
        self.file.len()
    }
}

fn payload(i: usize, len: usize) -> Vec<u8> {
    let mut p = format!("record {i};").into_bytes();
    p.resize(len, b'x');
    p
}

/// Every record appended with an answer comes back (the one in doubt may),
/// and acknowledging them all is written: nothing is left to claim after.
fn drains(outbox: &Outbox, appended: &[Seq], what: &str) {
    let got: Vec<Seq> = drain(outbox).iter().map(segwal::Record::seq).collect();
    for seq in appended {
        assert!(got.contains(seq), "{what}: record {seq} lost");
    }
    outbox
        .ack_many(&got)
        .unwrap_or_else(|e| panic!("{what}: the acknowledgements of the backlog: {e}"));
    assert!(drain(outbox).is_empty(), "{what}");
}

/// The disk fills right after a rotation made the next segment: its header
/// was written, its first frames were refused. An open then reuses that
/// empty segment, which needs no space, but the writer can write nothing
/// into it: the open must take the reserve's space for it, as for a segment
/// it creates, so that the backlog drains instead of every reopen poisoning
/// at its first acknowledgement; an append refused meanwhile must not make
/// the reserve again out of that space (whether the storage tells its free
/// bytes or not, and whether it can reserve space or only write zeros).
#[test]
fn a_disk_full_right_after_a_rotation_opens_through_the_reserve_and_drains() {
    let options = Options::default()
        .segment_bytes(64 * 1024)
        .min_free_disk_bytes(0)
        .ack_durability(Durability::Sync);
    let mut bare = 0;
    for (room, tells_free, reserves) in (160_000..260_000u64)
        .step_by(4096)
        .flat_map(|room| [(room, true, true), (room, false, true), (room, true, false)])
    {
        let disk = Capped {
            reserves,
            ..Capped::new(room, tells_free)
        };
        let outbox = disk.open(&options).expect("open");
        disk.leave(room);
        let mut appended = Vec::new();
        let error = loop {
            match outbox.append(&payload(appended.len(), 20_000)) {
                Ok(seq) => appended.push(seq),
                Err(e) => break e,
            }
            assert!(appended.len() < 1000, "the disk never filled");
        };
        assert!(matches!(error, Error::Poisoned { .. }), "{error:?}");
        let _ = outbox.close();
        let files = disk.files();
        let newest = files.iter().filter(|f| f.0.ends_with(".seg")).max();
        if newest.is_none_or(|f| f.1 != 4096) {
            continue;
        }
        bare += 1;
        // Another file takes every byte left.
        disk.leave(0);
        let what =
            format!("room {room}, tells free {tells_free}, reserves {reserves}, files {files:?}");
        let outbox = disk.open(&options).expect("reopen on the full disk");
        assert!(outbox.recovery_report().reserve_released, "{what}");
        // Refused: what the reserve gave is the drain's (and the reserve is
        // not made again out of it, now or a little later).
        for _ in 0..3 {
            assert!(
                matches!(outbox.append(b"x"), Err(Error::QuotaExceeded { .. })),
                "{what}"
            );
            std::thread::sleep(Duration::from_millis(110));
        }
        drains(&outbox, &appended, &what);
        assert!(!outbox.stats().poisoned, "{what}");
        outbox.close().expect("close");
    }
    assert!(
        bare >= 3,
        "{bare} runs left the newest segment bare at the poison"
    );
}

/// A disk nearly full, not full: the empty newest segment an open takes for
/// the writer cannot be given its whole first allocation, but has room for
/// frames. The open keeps its reserve and appends go on.
#[test]
fn a_nearly_full_disk_keeps_the_reserve_at_open() {
    let options = Options::default()
        .segment_bytes(64 * 1024)
        .min_free_disk_bytes(0);
    let disk = Capped::new(5, true);
    let outbox = disk.open(&options).expect("open");
    outbox.close().expect("close");
    assert!(disk.files().iter().any(|f| f.0 == "RESERVE"));
    disk.leave(40_000);
    for round in 0..3 {
        let outbox = disk.open(&options).expect("reopen");
        assert!(!outbox.recovery_report().reserve_released, "round {round}");
        outbox.append(b"kept").expect("append");
        outbox.close().expect("close");
    }
    let outbox = disk.open(&options).expect("reopen");
    assert_eq!(drain(&outbox).len(), 3);
    outbox.close().expect("close");
}

impl Capped {
    /// A copy of the disk as it is now, with a capacity of its own.
    fn fork(&self, seed: u64) -> Capped {
        Capped {
            disk: self.disk.fork(seed),
            cap: Arc::new(AtomicU64::new(u64::MAX)),
            tells_free: self.tells_free,
            reserves: self.reserves,
        }
    }
}

/// Appends the records `first..first + n`, each with the id `id-{i}`, in
/// calls of 500.
fn append_with_ids(outbox: &Outbox, first: usize, n: usize) -> Vec<Seq> {
    let mut seqs = Vec::new();
    let end = first + n;
    for from in (first..end).step_by(500) {
        let pays: Vec<Vec<u8>> = (from..end.min(from + 500))
            .map(|i| payload(i, 150))
            .collect();
        let ids: Vec<String> = (from..end.min(from + 500))
            .map(|i| format!("id-{i}"))
            .collect();
        let msgs: Vec<segwal::Message> = pays
            .iter()
            .zip(&ids)
            .map(|(p, id)| segwal::Message::new(p).dedup_id(id.as_bytes()))
            .collect();
        let appended = outbox.append_messages(&msgs).expect("append");
        seqs.extend(appended.iter().map(|a| a.seq));
    }
    seqs
}

/// Whether the record `i` of [`append_with_ids`], appended again, is
/// answered as the duplicate of `seq`.
fn known(outbox: &Outbox, i: usize, seq: Seq) -> bool {
    let id = format!("id-{i}");
    let p = payload(i, 150);
    let again = outbox
        .append_message(&segwal::Message::new(&p).dedup_id(id.as_bytes()))
        .expect("append again");
    again.duplicate && again.seq == seq
}

/// An open finds its one segment fully acknowledged (the open seals it) and
/// deletes it, first writing its 20,000 ids into tombstones (about 640 KB),
/// on a disk with 320 to 576 KiB left (room for the seal, not for the
/// tombstones). The deletion
/// waits instead of failing (it failed the open, and every open after it,
/// on the same disk); the ids stay known; once space is back, the timer lets
/// the deletion through, and the ids are still known after a reopen.
#[test]
fn an_open_holds_a_deletion_whose_tombstones_do_not_fit() {
    // A floor of one byte: free space is asked (a floor of 0 turns every
    // look at it off, and the write decides), nothing refused for it.
    let options = Options::default()
        .segment_bytes(8 << 20)
        .min_free_disk_bytes(1);
    let disk = Capped::new(17, true);
    let outbox = disk.open(&options).expect("open");
    let n = 20_000;
    let seqs = append_with_ids(&outbox, 0, n);
    assert_eq!(drain(&outbox).len(), n);
    outbox.ack_many(&seqs).expect("ack");
    outbox.close().expect("close");
    let segments = |d: &Capped| -> Vec<String> {
        let files = d.files().into_iter().map(|f| f.0);
        files.filter(|f| f.ends_with(".seg")).collect()
    };
    let first = segments(&disk);
    assert_eq!(first.len(), 1, "the records filled one segment");
    let mut held = 0;
    let rooms = [320u64 << 10, 576 << 10];
    for (k, (room, reserve)) in rooms
        .into_iter()
        .flat_map(|room| [(room, true), (room, false)])
        .enumerate()
    {
        let what = format!("room {room}, reserve {reserve}");
        let d = disk.fork(100 + k as u64);
        if !reserve {
            // As after an open on a disk too full to make it.
            d.disk
                .remove(&Path::new(DIR).join("RESERVE"))
                .expect("remove");
        }
        d.leave(room);
        // Held, or through where the reserve's space took the tombstones
        // (the next open then finds the segment of those tombstones, its
        // deletion held for them).
        for round in 0..2 {
            let outbox = d
                .open(&options)
                .unwrap_or_else(|e| panic!("{what}, open {round}: {e}"));
            let stats = outbox.stats();
            assert!(!stats.poisoned, "{what}");
            assert_eq!(
                stats.segments_deleted as usize + stats.held_for_ids,
                1,
                "{what}"
            );
            if round == 0 {
                held += stats.held_for_ids;
            }
            assert!(known(&outbox, 3, seqs[3]), "{what}");
            outbox.close().expect("close");
        }
        // Space comes back while the outbox is open: enough for a reserve
        // and a little, not for both the reserve and the tombstones. An
        // append asks for the missing reserve; the timer lets the deletion
        // through first (it frees more than it writes), then the reserve
        // is made with what it freed.
        let outbox = d.open(&options).expect("open");
        d.cap.fetch_add((4 << 20) + (256 << 10), Ordering::SeqCst);
        let _ = outbox.append(b"asks for the reserve");
        crate::eventually("the held deletion goes through", || {
            !segments(&d).contains(&first[0])
        });
        assert_eq!(outbox.stats().held_for_ids, 0, "{what}");
        assert!(known(&outbox, 77, seqs[77]), "{what}");
        crate::eventually("the reserve made again", || {
            let _ = outbox.append(b"asks for the reserve");
            !outbox.stats().reserve_missing
        });
        assert!(!outbox.stats().poisoned, "{what}");
        outbox.close().expect("close");
        d.cap.store(u64::MAX, Ordering::SeqCst);
        let outbox = d.open(&options).expect("reopen");
        assert!(known(&outbox, n - 1, seqs[n - 1]), "{what}");
        assert!(
            drain(&outbox)
                .iter()
                .all(|r| r.payload() == b"asks for the reserve"),
            "{what}"
        );
        outbox.close().expect("close");
    }
    assert!(held >= 4, "{held} opens held the deletion");
}

/// A disk so full that an open cannot seal its newest segment, with no
/// reserve to release (an earlier open on a disk as full could not make
/// one, or a crash left it empty) but a file kept for recycling: the open
/// removes that file and opens (it failed with ENOSPC, at every open, while
/// the spare held tens of MiB), and reports no reserve released.
#[test]
fn a_full_disk_without_a_reserve_opens_through_the_file_kept_for_recycling() {
    let options = Options::default()
        .segment_bytes(2 << 20)
        .min_free_disk_bytes(0);
    let disk = Capped::new(19, true);
    let outbox = disk.open(&options).expect("open");
    // Three segments' worth: the first, acknowledged, is kept for recycling.
    let seqs: Vec<Seq> = (0..60)
        .map(|i| outbox.append(&payload(i, 100_000)).expect("append"))
        .collect();
    let claimed: Vec<Seq> = drain(&outbox).iter().map(segwal::Record::seq).collect();
    assert_eq!(claimed, seqs);
    outbox.ack_many(&seqs[..30]).expect("ack");
    crate::eventually("the first segment kept for recycling", || {
        disk.files().iter().any(|f| f.0.ends_with(".free"))
    });
    outbox.close().expect("close");
    let mut opened = 0;
    // No reserve; or a `RESERVE` a crash left empty, which frees nothing.
    for (room, empty) in (0..(2u64 << 20))
        .step_by(64 << 10)
        .flat_map(|room| [(room, false), (room, true)])
    {
        let d = disk.fork(room);
        let reserve = Path::new(DIR).join("RESERVE");
        if empty {
            let file = d.disk.open(&reserve).expect("open the reserve");
            file.set_len(0).expect("empty the reserve");
            file.sync_data().expect("sync");
        } else {
            d.disk.remove(&reserve).expect("remove the reserve");
        }
        d.leave(room);
        let what = format!("room {room}, empty reserve {empty}, files {:?}", d.files());
        let outbox = d.open(&options).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert!(!outbox.recovery_report().reserve_released, "{what}");
        let got: Vec<Seq> = drain(&outbox).iter().map(segwal::Record::seq).collect();
        assert_eq!(got, seqs[30..], "{what}");
        if room < 1 << 20 {
            // Too little for the seal without it: the kept file went.
            let files = d.files();
            assert!(
                !files.iter().any(|f| f.0.ends_with(".free")),
                "{what}: {files:?}"
            );
        }
        outbox.close().expect("close");
        opened += 1;
    }
    assert_eq!(opened, 64);
}

/// A full disk, an open that releases the reserve, and a fully acknowledged
/// segment the open deletes: that segment's space makes the reserve again
/// at once. (The open kept it for recycling, the reserve missing, until the
/// first append; an idle outbox kept a segment's space from the next open.)
#[test]
fn a_full_disk_open_makes_its_reserve_from_the_segment_it_deletes() {
    let options = Options::default()
        .segment_bytes(64 * 1024)
        .min_free_disk_bytes(0);
    for (tells_free, reserves) in [(true, true), (false, true), (true, false)] {
        let what = format!("tells free {tells_free}, reserves {reserves}");
        let disk = Capped {
            reserves,
            ..Capped::new(6, tells_free)
        };
        let outbox = disk.open(&options).expect("open");
        for i in 0..3 {
            outbox.append(&payload(i, 15_000)).expect("append");
        }
        let seqs: Vec<Seq> = drain(&outbox).iter().map(segwal::Record::seq).collect();
        outbox.ack_many(&seqs).expect("ack");
        outbox.close().expect("close");
        disk.leave(0);
        let outbox = disk.open(&options).expect("open on the full disk");
        let report = outbox.recovery_report();
        assert!(report.reserve_released, "{what}");
        let stats = outbox.stats();
        assert_eq!(stats.segments_deleted, 1, "{what}");
        assert!(!stats.reserve_missing, "{what}");
        let files = disk.files();
        assert!(
            !files.iter().any(|f| f.0.ends_with(".free")),
            "{what}: {files:?}"
        );
        assert!(files.iter().any(|f| f.0 == "RESERVE"), "{what}: {files:?}");
        outbox.append(b"after").expect("append");
        outbox.close().expect("close");
    }
}

/// More free space never fails an open that less lets through. A disk with
/// neither a reserve nor a file kept for recycling, whose open must seal a
/// segment of 20,000 records (an index of about 160 KB): with a little over
/// 4 MiB free, the new segment's first allocation took the space and the
/// seal failed, at every open, where with less free the allocation failed
/// and the seal fit.
#[test]
fn more_free_space_never_fails_an_open() {
    let options = Options::default()
        .segment_bytes(8 << 20)
        .min_free_disk_bytes(0)
        .recycle_segments(false);
    let disk = Capped::new(23, true);
    let outbox = disk.open(&options).expect("open");
    let payloads: Vec<Vec<u8>> = (0..20_000).map(|i| payload(i, 40)).collect();
    for chunk in payloads.chunks(1000) {
        outbox.append_batch(chunk).expect("append");
    }
    outbox.close().expect("close");
    disk.disk
        .remove(&Path::new(DIR).join("RESERVE"))
        .expect("remove the reserve");
    let mut first_open = None;
    for room in (0..(6u64 << 20)).step_by(128 << 10) {
        let d = disk.fork(room);
        d.leave(room);
        let opened = d.open(&options);
        match (&opened, first_open) {
            (Ok(_), None) => first_open = Some(room),
            (Err(e), Some(from)) => panic!("room {room}: {e} (it opened with {from} free)"),
            _ => {}
        }
        if let Ok(outbox) = opened {
            assert_eq!(drain(&outbox).len(), 20_000, "room {room}");
            outbox.close().expect("close");
        }
    }
    assert!(
        first_open.is_some_and(|room| room < 1 << 20),
        "{first_open:?}"
    );
}

/// A running outbox whose deletion would write more tombstones than the
/// disk has room for waits (and goes once space is back, without a
/// reopen), whether the file system reserves the space the writer asks for
/// ahead of its frames or, without `fallocate`, reserves nothing (the
/// writer's room is then no room: it was counted as such, and the deletion
/// poisoned the outbox).
#[test]
fn a_running_deletion_waits_for_room_for_its_tombstones() {
    let options = Options::default()
        .segment_bytes(4 << 20)
        .min_free_disk_bytes(1);
    for reserves in [true, false] {
        let what = format!("reserves {reserves}");
        let disk = Capped {
            reserves,
            ..Capped::new(41, true)
        };
        let outbox = disk.open(&options).expect("open");
        let mut seqs = Vec::new();
        while outbox.stats().segments < 2 {
            seqs.extend(append_with_ids(&outbox, seqs.len(), 500));
        }
        let at_rotation = seqs.len();
        // More into the second segment, in large writes.
        seqs.extend(append_with_ids(&outbox, at_rotation, 9_000));
        assert_eq!(drain(&outbox).len(), seqs.len(), "{what}");
        disk.leave(32 << 10);
        outbox.ack_many(&seqs[..at_rotation]).expect("ack");
        if reserves {
            // The tombstones go into the space reserved for the segment.
            crate::eventually("the deletion goes through", || {
                outbox.stats().segments_deleted == 1
            });
            assert!(!outbox.stats().poisoned, "{what}");
            outbox.close().expect("close");
            continue;
        }
        crate::eventually("the deletion held", || outbox.stats().held_for_ids == 1);
        assert!(!outbox.stats().poisoned, "{what}");
        assert_eq!(outbox.stats().segments_deleted, 0, "{what}");
        disk.cap.store(u64::MAX, Ordering::SeqCst);
        crate::eventually("the held deletion goes through", || {
            outbox.stats().segments_deleted == 1
        });
        outbox.close().expect("close");
    }
}

/// An open whose first try cuts a torn tail and then finds no room to seal
/// the segment tries again, through a file kept for recycling: its report
/// still names the torn tail (the second try finds it gone).
#[test]
fn a_retried_open_reports_the_torn_tail_its_first_try_cut() {
    let options = Options::default()
        .segment_bytes(4 << 20)
        .min_free_disk_bytes(0);
    let disk = Capped::new(31, true);
    let outbox = disk.open(&options).expect("open");
    // A first segment of large records, acknowledged: kept for recycling.
    let big: Vec<Seq> = (0..45)
        .map(|i| outbox.append(&payload(i, 100_000)).expect("append"))
        .collect();
    assert_eq!(drain(&outbox).len(), 45);
    outbox.ack_many(&big).expect("ack");
    crate::eventually("the first segment kept for recycling", || {
        disk.files().iter().any(|f| f.0.ends_with(".free"))
    });
    // Then many small records: the newest segment's seal is large.
    append_with_ids(&outbox, 0, 12_000);
    outbox.close().expect("close");
    let newest = disk
        .files()
        .into_iter()
        .map(|f| f.0)
        .filter(|f| f.ends_with(".seg"))
        .max()
        .expect("a segment");
    let file = disk.disk.open(&Path::new(DIR).join(&newest)).expect("open");
    let len = file.len().expect("len");
    // A write that never completed: bytes of no frame after the last.
    file.write_at(&[0xA5u8; 3000], len).expect("torn bytes");
    disk.disk
        .remove(&Path::new(DIR).join("RESERVE"))
        .expect("remove the reserve");
    for room in (0..(1u64 << 20)).step_by(32 << 10) {
        let d = disk.fork(room);
        d.leave(room);
        let outbox = d
            .open(&options)
            .unwrap_or_else(|e| panic!("room {room}: {e}"));
        let torn = outbox.recovery_report().torn_tail.clone();
        assert!(torn.is_some_and(|t| t.offset == len), "room {room}");
        outbox.close().expect("close");
    }
}

/// An open whose deletion waits for room for its tombstones does not make
/// its missing reserve out of the space left: the space freed goes to the
/// deletion first (the reserve, here smaller than the tombstones, took it,
/// and the deletion then waited for more than was freed).
#[test]
fn an_open_whose_deletion_waits_for_space_leaves_the_reserve_missing() {
    let options = Options::default()
        .segment_bytes(8 << 20)
        .min_free_disk_bytes(1);
    let disk = Capped::new(43, true);
    let outbox = disk.open(&options).expect("open");
    let seqs = append_with_ids(&outbox, 0, 20_000);
    assert_eq!(drain(&outbox).len(), seqs.len());
    outbox.ack_many(&seqs).expect("ack");
    outbox.close().expect("close");
    disk.disk
        .remove(&Path::new(DIR).join("RESERVE"))
        .expect("remove the reserve");
    disk.leave(800 << 10);
    // Reopened with smaller segments: a reserve of 256 KiB, which the
    // space left could take, against about 700 KB of tombstones.
    let options = options.segment_bytes(256 << 10);
    let outbox = disk.open(&options).expect("open");
    let stats = outbox.stats();
    assert_eq!(stats.held_for_ids, 1);
    assert!(stats.reserve_missing);
    assert!(!disk.files().iter().any(|f| f.0 == "RESERVE"));
    disk.cap.fetch_add(200 << 10, Ordering::SeqCst);
    crate::eventually("the held deletion goes through", || {
        outbox.stats().segments_deleted == 1
    });
    crate::eventually("the reserve made again", || {
        let _ = outbox.append(b"asks for the reserve");
        !outbox.stats().reserve_missing
    });
    assert!(!outbox.stats().poisoned);
    outbox.close().expect("close");
}

/// An open that removes a newest segment holding nothing (a file system left
/// its name, not its bytes: reported as a torn tail of 0 bytes),
/// then finds no room for the segment it creates, tries again through the
/// reserve: its report still names that torn tail, which the second try
/// finds gone.
#[test]
fn a_retried_open_reports_the_empty_segment_its_first_try_removed() {
    let options = Options::default()
        .segment_bytes(1 << 20)
        .min_free_disk_bytes(0);
    let disk = Capped::new(59, true);
    let outbox = disk.open(&options).expect("open");
    let seqs: Vec<Seq> = (0..100)
        .map(|i| outbox.append(&payload(i, 1000)).expect("append"))
        .collect();
    outbox.close().expect("close");
    assert!(disk.files().iter().any(|f| f.0 == "RESERVE"));
    // The next segment's name and nothing else (a file system kept the
    // name of a rotation's file, not its length): removing it frees nothing.
    let next = seqs.last().expect("a record").get() + 1;
    let name = format!("{next:020}.seg");
    let blank = Path::new(DIR).join(&name);
    let file = disk.disk.create(&blank).expect("create");
    file.set_len(0).expect("size");
    file.sync_data().expect("sync");
    disk.disk.sync_dir(Path::new(DIR)).expect("sync dir");
    let mut released = 0;
    for room in (0..(64u64 << 10)).step_by(2 << 10) {
        let d = disk.fork(room);
        d.leave(room);
        let outbox = d
            .open(&options)
            .unwrap_or_else(|e| panic!("room {room}: {e}"));
        let report = outbox.recovery_report();
        released += usize::from(report.reserve_released);
        assert!(
            report
                .torn_tail
                .as_ref()
                .is_some_and(|t| t.offset == 0 && t.path == blank),
            "room {room}: {:?}",
            report.torn_tail
        );
        assert!(!d.files().iter().any(|f| f.0 == name), "room {room}");
        assert_eq!(drain(&outbox).len(), seqs.len(), "room {room}");
        outbox.close().expect("close");
    }
    assert!(released > 0, "no open needed the reserve");
}

/// A lossy repair on a disk too full for what it writes: the first try sets
/// the segments after the damaged one aside (renames, which take no room),
/// then finds no room for the copy of the damaged segment it keeps before
/// cutting it, and the open tries again through the reserve. The retry
/// finds the damaged segment newest, the later ones gone: its report must
/// still name what the first try set aside and the numbers they held, or
/// records are dropped with nothing naming them.
#[test]
fn a_retried_lossy_open_reports_what_its_first_try_dropped() {
    let options = Options::default()
        .segment_bytes(1 << 20)
        .min_free_disk_bytes(0);
    let disk = Capped::new(71, true);
    let outbox = disk.open(&options).expect("open");
    let seqs: Vec<Seq> = (0..300)
        .map(|i| outbox.append(&payload(i, 10_000)).expect("append"))
        .collect();
    // Ten records the repair keeps, acknowledged in the segment it drops.
    assert_eq!(drain(&outbox).len(), seqs.len());
    outbox.ack_many(&seqs[..10]).expect("ack");
    outbox.close().expect("close");
    let mut segments: Vec<String> = disk
        .files()
        .into_iter()
        .map(|f| f.0)
        .filter(|f| f.ends_with(".seg"))
        .collect();
    segments.sort();
    assert!(segments.len() >= 3, "{segments:?}");
    let damaged = Path::new(DIR).join(&segments[0]);
    let bytes = flip_in_record_30(&disk, &damaged);
    let every_frame = options.clone().open_check(segwal::OpenCheck::EveryFrame);
    assert!(matches!(
        disk.open(&every_frame),
        Err(Error::Corrupt { .. })
    ));
    let later: Vec<PathBuf> = segments[1..]
        .iter()
        .map(|name| Path::new(DIR).join(name))
        .collect();
    let lossy = options.clone().recovery(segwal::RecoveryMode::Lossy);
    // What the repair drops on a disk with room, in one try.
    let want = {
        let outbox = disk.fork(1).open(&lossy).expect("a repair with room");
        let want = outbox.recovery_report().dropped.clone().expect("a drop");
        assert_eq!(want.segments_set_aside, later);
        assert_eq!(want.acks_dropped, 10);
        want
    };
    let mut released = 0;
    // Room for everything; for nothing; and, in fine steps, around the
    // copy of the damaged segment.
    let len = bytes.len() as u64;
    for room in (0..(4u64 << 20))
        .step_by(128 << 10)
        .chain((len - (8 << 10)..len + (16 << 10)).step_by(512))
    {
        let d = disk.fork(room);
        d.leave(room);
        let (outbox, whole) = match d.open(&lossy) {
            Ok(outbox) => (outbox, true),
            Err(e) => {
                // No room for the copy even through the reserve: said, and
                // the repair done once the operator makes room.
                assert!(
                    matches!(&e, Error::Io { source, path, .. }
                        if source.raw_os_error() == Some(ENOSPC)
                            && path.starts_with(Path::new(DIR).join(segwal::QUARANTINE_DIR))),
                    "room {room}: {e}"
                );
                d.leave(16 << 20);
                let outbox = d
                    .open(&lossy)
                    .unwrap_or_else(|e| panic!("room {room}, then more: {e}"));
                (outbox, false)
            }
        };
        let report = outbox.recovery_report();
        released += usize::from(report.reserve_released);
        let dropped = report
            .dropped
            .as_ref()
            .unwrap_or_else(|| panic!("room {room}: no drop reported"));
        // What one open says of the records, whether it tried once or
        // twice, is the untroubled repair's; the numbers it bounds may reach
        // higher (the name of a segment a failed try created). It names
        // every segment it set aside, and more only where a failed try
        // created it. (An open that failed whole left the later segments
        // in `quarantine/`, and the next open never sees them.)
        assert_eq!(dropped.first, seqs[30], "room {room}");
        assert_eq!(
            (&dropped.path, dropped.offset),
            (&want.path, want.offset),
            "room {room}"
        );
        assert!(dropped.last >= want.last, "room {room}: {:?}", dropped.last);
        if whole {
            assert_eq!(dropped.cause, want.cause, "room {room}");
            assert_eq!(dropped.relocated, want.relocated, "room {room}");
            assert_eq!(
                (dropped.acks_dropped, dropped.changes_dropped),
                (want.acks_dropped, want.changes_dropped),
                "room {room}"
            );
            for path in &later {
                assert!(
                    dropped.segments_set_aside.contains(path),
                    "room {room}: {path:?} not in {:?}",
                    dropped.segments_set_aside
                );
            }
        }
        for path in &dropped.segments_set_aside {
            assert!(
                later.contains(path)
                    || report.quarantined.iter().any(|q| q.from == *path)
                        && !segments.iter().any(|s| path.ends_with(s)),
                "room {room}: {path:?}"
            );
        }
        // What `quarantine/` holds is what it says: the copy of the damaged
        // segment whole, the later segments, and at most a block of each
        // segment a failed try created (no reservation held there).
        for (name, bytes) in d.files() {
            if name.contains(".before-repair-cut") {
                assert!(!name.contains("partial"), "room {room}: {name}");
                assert_eq!(bytes, len, "room {room}: {name}");
            } else if name.contains(".dropped-by-repair")
                && !segments.iter().any(|s| name.starts_with(s.as_str()))
            {
                assert!(bytes <= 4096, "room {room}: {name} {bytes}");
            }
        }
        let got: Vec<Seq> = drain(&outbox).iter().map(segwal::Record::seq).collect();
        assert_eq!(got, seqs[..30], "room {room}");
        outbox.close().expect("close");
        // No number the dropped records held is given again.
        d.leave(16 << 20);
        let outbox = d.open(&options).expect("reopen");
        let next = outbox.append(b"after the repair").expect("append");
        assert!(Some(next) > dropped.last, "room {room}: {next}");
        outbox.close().expect("close");
    }
    assert!(released > 0, "no open needed the reserve");
}

/// A power cut at any step of a lossy repair on a disk with room for the
/// copy of the segment it cuts, and little more, leaves a disk the same
/// repair gets through as full as before: what the interrupted copy left in
/// `quarantine/` (part of the file, or the whole copy made before the cut)
/// must not take the room the next try needs.
#[test]
fn a_power_cut_inside_a_lossy_repair_on_a_full_disk_leaves_it_repairable() {
    let options = Options::default()
        .segment_bytes(1 << 20)
        .min_free_disk_bytes(0);
    let disk = Capped::new(73, true);
    let (seqs, segment) = hundred_records(&disk, &options);
    let len = flip_in_record_30(&disk, &segment).len() as u64;
    let lossy = options.clone().recovery(segwal::RecoveryMode::Lossy);
    let mut steps = 0;
    for room in [len + (8 << 10), len + (64 << 10)] {
        let d = disk.fork(room);
        d.leave(room);
        let cap = d.cap.load(Ordering::SeqCst);
        d.disk.record_snapshots();
        let outbox = d.open(&lossy).expect("the repair the power cuts interrupt");
        let snapshots = d.disk.take_snapshots();
        assert!(!outbox.recovery_report().reserve_released, "room {room}");
        outbox.close().expect("close");
        steps += snapshots.len();
        for (k, snapshot) in snapshots.iter().enumerate() {
            for (seed, model) in crash_models().into_iter().enumerate() {
                let c = Capped {
                    disk: snapshot.fork(seed as u64),
                    cap: Arc::new(AtomicU64::new(cap)),
                    tells_free: true,
                    reserves: true,
                };
                c.disk.crash(model);
                let what = format!("room {room}, power cut at step {k}, draw {seed}");
                let outbox = c
                    .open(&lossy)
                    .unwrap_or_else(|e| panic!("{what}: {e}; files {:?}", c.files()));
                let got: Vec<Seq> = drain(&outbox).iter().map(segwal::Record::seq).collect();
                assert_eq!(got, seqs[..30], "{what}");
                outbox.close().expect("close");
                // One whole copy, made once. (A part of one whose bytes a
                // power cut garbled proves nothing, and is left, named
                // partial.)
                let copies: Vec<(String, u64)> = c
                    .files()
                    .into_iter()
                    .filter(|f| f.0.contains("before-repair-cut") && !f.0.contains("partial"))
                    .collect();
                assert!(
                    copies.len() == 1 && copies[0].1 == len,
                    "{what}: {copies:?}"
                );
            }
        }
    }
    assert!(steps > 20, "{steps} steps");
}

/// A whole copy a repair finds already made (by a try that failed before
/// syncing it, or by a person's `cp`) is the copy only once it is durable:
/// after a power cut that keeps nothing unsynced, the bytes the repair cut
/// are still in `quarantine/`.
#[test]
fn a_repairs_copy_found_unsynced_is_made_durable_before_the_cut() {
    let options = Options::default()
        .segment_bytes(1 << 20)
        .min_free_disk_bytes(0);
    let disk = Capped::new(74, true);
    let (seqs, segment) = hundred_records(&disk, &options);
    let bytes = flip_in_record_30(&disk, &segment);
    let aside = Path::new(DIR).join(segwal::QUARANTINE_DIR);
    disk.disk.create_dir(&aside).expect("quarantine folder");
    disk.disk.sync_dir(Path::new(DIR)).expect("sync dir");
    let name = format!("{:020}.seg.before-repair-cut", seqs[0].get());
    let copy = disk.disk.create(&aside.join(name)).expect("create");
    copy.write_at(&bytes, 0).expect("copy");
    drop(copy);
    let lossy = options.recovery(segwal::RecoveryMode::Lossy);
    disk.open(&lossy).expect("repair").close().expect("close");
    disk.disk.crash(segwal::sim::CrashModel {
        write_kept: 0,
        write_torn: 0,
        grown_tail: 0,
        dir_change_kept: 0,
        block_garbled: 0,
    });
    let outbox = disk.open(&lossy).expect("reopen");
    let got: Vec<Seq> = drain(&outbox).iter().map(segwal::Record::seq).collect();
    assert_eq!(got, seqs[..30]);
    outbox.close().expect("close");
    let kept = disk.disk.files(&aside).into_iter().any(|n| {
        let f = disk.disk.open(&aside.join(&n)).expect("open");
        let mut b = vec![0u8; f.len().expect("len") as usize];
        f.read_at(&mut b, 0).is_ok_and(|_| b == bytes)
    });
    assert!(kept, "records 30 to 99 are in no file after the power cut");
}

/// A link named as a repair's whole copy (a symbolic link, or a second
/// name, to the segment itself) compares equal to the segment, but is no
/// copy: the cut would shorten it too. The repair makes a copy of its own.
#[test]
fn a_link_named_as_a_repairs_copy_is_not_taken_for_it() {
    for symbolic in [true, false] {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("outbox");
        let options = Options::default().segment_bytes(1 << 20);
        let outbox = Outbox::open(&dir, options.clone()).expect("open");
        let seqs: Vec<Seq> = (0..100)
            .map(|i| outbox.append(&payload(i, 1000)).expect("append"))
            .collect();
        outbox.close().expect("close");
        let segment = dir.join(format!("{:020}.seg", seqs[0].get()));
        let mut bytes = std::fs::read(&segment).expect("read");
        let at = in_record_30(&bytes);
        bytes[at] ^= 0xff;
        std::fs::write(&segment, &bytes).expect("damage");
        let aside = dir.join(segwal::QUARANTINE_DIR);
        std::fs::create_dir(&aside).expect("quarantine folder");
        let link = aside.join(format!("{:020}.seg.before-repair-cut", seqs[0].get()));
        if symbolic {
            std::os::unix::fs::symlink(&segment, &link).expect("symbolic link");
        } else {
            std::fs::hard_link(&segment, &link).expect("hard link");
        }
        let lossy = options.clone().recovery(segwal::RecoveryMode::Lossy);
        let outbox = Outbox::open(&dir, lossy).expect("repair");
        let got: Vec<Seq> = drain(&outbox).iter().map(segwal::Record::seq).collect();
        assert_eq!(got, seqs[..30], "symbolic {symbolic}");
        outbox.close().expect("close");
        let kept = std::fs::read_dir(&aside)
            .expect("list")
            .any(|e| std::fs::read(e.expect("entry").path()).is_ok_and(|b| b == bytes));
        assert!(
            kept,
            "symbolic {symbolic}: no whole copy of the cut segment"
        );
    }
}

/// The offset of a byte of record 30's payload in a segment's `bytes`
/// (records made by `payload(i, 1000)`).
fn in_record_30(bytes: &[u8]) -> usize {
    bytes
        .windows(10)
        .position(|w| w == b"record 30;")
        .expect("record 30 in the segment")
        + 500
}

/// A closed outbox on `disk` of 100 records of 1,000 bytes, in one
/// segment: their numbers, and the segment.
fn hundred_records(disk: &Capped, options: &Options) -> (Vec<Seq>, PathBuf) {
    let outbox = disk.open(options).expect("open");
    let seqs: Vec<Seq> = (0..100)
        .map(|i| outbox.append(&payload(i, 1000)).expect("append"))
        .collect();
    outbox.close().expect("close");
    let segment = Path::new(DIR).join(format!("{:020}.seg", seqs[0].get()));
    (seqs, segment)
}

/// Changes one byte of record 30's payload in the segment at `path`,
/// durably: fsynced bytes with later records after them, damage no crash
/// leaves. Returns the segment's bytes as damaged.
fn flip_in_record_30(disk: &Capped, path: &Path) -> Vec<u8> {
    let file = disk.disk.open(path).expect("open the segment");
    let mut bytes = vec![0u8; file.len().expect("len") as usize];
    file.read_at(&mut bytes, 0).expect("read");
    let at = in_record_30(&bytes);
    bytes[at] ^= 0xff;
    file.write_at(&bytes[at..=at], at as u64).expect("damage");
    file.sync_data().expect("sync");
    bytes
}

/// A power cut at any step of an open on a nearly full disk (no reserve,
/// four MiB free: the new segment's preallocation takes it all, the seal
/// then finds no room and the open tries again) leaves a disk that the
/// same open, as full as before, gets through, with every record. The new
/// segment's space was reserved before its header was durable: a header the
/// power cut garbled sent the file, preallocation and all, into
/// `quarantine/`, and no later open on that disk could create a segment.
#[test]
fn a_power_cut_inside_a_full_disk_open_leaves_it_openable() {
    let options = Options::default()
        .segment_bytes(8 << 20)
        .min_free_disk_bytes(0)
        .recycle_segments(false);
    let disk = Capped::new(61, true);
    let outbox = disk.open(&options).expect("open");
    let seqs: Vec<Seq> = (0..100)
        .map(|i| outbox.append(&payload(i, 1000)).expect("append"))
        .collect();
    outbox.close().expect("close");
    disk.disk
        .remove(&Path::new(DIR).join("RESERVE"))
        .expect("remove the reserve");
    // Durably: a power cut must not bring the reserve back.
    disk.disk.sync_dir(Path::new(DIR)).expect("sync dir");
    let d = disk.fork(1);
    d.leave(4 << 20);
    let cap = d.cap.load(Ordering::SeqCst);
    d.disk.record_snapshots();
    let outbox = d.open(&options).expect("the open the power cuts interrupt");
    let snapshots = d.disk.take_snapshots();
    drains(&outbox, &seqs, "the open without a power cut");
    outbox.close().expect("close");
    assert!(snapshots.len() > 10, "{} steps", snapshots.len());
    for (k, snapshot) in snapshots.iter().enumerate() {
        for (seed, model) in crash_models().into_iter().cycle().take(6).enumerate() {
            let c = Capped {
                disk: snapshot.fork(seed as u64),
                cap: Arc::new(AtomicU64::new(cap)),
                tells_free: true,
                reserves: true,
            };
            c.disk.crash(model);
            let what = format!("power cut at step {k}, draw {seed}");
            let outbox = c
                .open(&options)
                .unwrap_or_else(|e| panic!("{what}: {e}; files {:?}", c.files()));
            assert!(!outbox.recovery_report().reserve_released, "{what}");
            set_aside_no_more_than_a_block(&c, &what);
            drains(&outbox, &seqs, &what);
            outbox.close().expect("close");
        }
    }
}

/// The crash models the power-cut tests draw from: the default, one that
/// garbles every block under an unsynced write, one that grows every file
/// whose size outran its data with zeros or garbage.
fn crash_models() -> [segwal::sim::CrashModel; 3] {
    use segwal::sim::CrashModel;
    [
        CrashModel::default(),
        CrashModel {
            block_garbled: 100,
            ..CrashModel::default()
        },
        CrashModel {
            grown_tail: 100,
            ..CrashModel::default()
        },
    ]
}

/// Nothing larger than a block (a garbled header's) went into
/// `quarantine/`: a file that never held a frame takes no space there.
fn set_aside_no_more_than_a_block(disk: &Capped, what: &str) {
    let aside = Path::new(DIR).join(segwal::QUARANTINE_DIR);
    for name in disk.disk.files(&aside) {
        let len = disk.disk.open(&aside.join(&name)).and_then(|f| f.len());
        assert!(
            len.as_ref().is_ok_and(|&len| len <= 4096),
            "{what}: {name} set aside with {len:?} bytes"
        );
    }
}

/// The same through a file kept for recycling, with no reserve: a power
/// cut at any step of an open that removes that file to make room leaves a
/// disk the same open gets through.
#[test]
fn a_power_cut_inside_an_open_through_the_kept_file_leaves_it_openable() {
    let options = Options::default()
        .segment_bytes(2 << 20)
        .min_free_disk_bytes(0);
    let disk = Capped::new(67, true);
    let outbox = disk.open(&options).expect("open");
    let seqs: Vec<Seq> = (0..60)
        .map(|i| outbox.append(&payload(i, 100_000)).expect("append"))
        .collect();
    assert_eq!(drain(&outbox).len(), 60);
    outbox.ack_many(&seqs[..30]).expect("ack");
    crate::eventually("the first segment kept for recycling", || {
        disk.files().iter().any(|f| f.0.ends_with(".free"))
    });
    outbox.close().expect("close");
    disk.disk
        .remove(&Path::new(DIR).join("RESERVE"))
        .expect("remove the reserve");
    disk.disk.sync_dir(Path::new(DIR)).expect("sync dir");
    for room in [0, 512 << 10] {
        let d = disk.fork(room);
        d.leave(room);
        let cap = d.cap.load(Ordering::SeqCst);
        d.disk.record_snapshots();
        let outbox = d.open(&options).expect("the open the power cuts interrupt");
        let snapshots = d.disk.take_snapshots();
        drains(&outbox, &seqs[30..], "the open without a power cut");
        outbox.close().expect("close");
        for (k, snapshot) in snapshots.iter().enumerate() {
            for (seed, model) in crash_models().into_iter().cycle().take(4).enumerate() {
                let c = Capped {
                    disk: snapshot.fork(seed as u64),
                    cap: Arc::new(AtomicU64::new(cap)),
                    tells_free: true,
                    reserves: true,
                };
                c.disk.crash(model);
                let what = format!("room {room}, power cut at step {k}, draw {seed}");
                let outbox = c
                    .open(&options)
                    .unwrap_or_else(|e| panic!("{what}: {e}; files {:?}", c.files()));
                assert!(!outbox.recovery_report().reserve_released, "{what}");
                set_aside_no_more_than_a_block(&c, &what);
                drains(&outbox, &seqs[30..], &what);
                outbox.close().expect("close");
            }
        }
    }
}
