//! Integration tests of segwal, grouped by concern. One binary builds faster.

mod acks;
mod append;
mod async_api;
mod backlog;
mod checkpoints;
mod claim;
mod crash;
mod enospc;
mod faults;
mod foreign;
mod full_disk;
mod fuzz_corpus;
mod golden;
mod json;
mod kill;
mod leases;
mod lock;
mod model;
mod model_producers;
mod offline;
mod process;
mod producers;
mod recovery;
mod relay;
mod relocation;
mod retries;
mod segments;
#[path = "../support/tmpfs.rs"]
mod tmpfs;

use std::path::{Path, PathBuf};

use segwal::{Corruption, Error, Options, Outbox, Record, Seq};

/// Waits (without asserting on time) until `cond` holds; panics after a minute.
pub fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !cond() {
        assert!(
            std::time::Instant::now() < deadline,
            "never happened: {what}"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// A fresh temporary directory; the outbox lives in a subdirectory that does not
/// exist yet, so `open` also exercises directory creation.
pub fn tmp() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("temporary directory");
    let path = dir.path().join("outbox");
    (dir, path)
}

/// Makes a FIFO at `path` (a file that is not a regular one, whose open
/// would wait for a peer).
pub fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).expect("path");
    // SAFETY: `c` is a NUL-terminated path this frame owns.
    #[expect(unsafe_code, reason = "mkfifo(3) has no safe wrapper in std")]
    let rc = unsafe { libc::mkfifo(c.as_ptr(), 0o600) };
    assert_eq!(rc, 0, "mkfifo {}", path.display());
}

/// Options with small segments, so tests rotate often.
pub fn small_segments() -> Options {
    // Sixteen blocks: a header block and, appended one at a time, fifteen
    // records (each write batch starts a block of its own).
    Options::default().segment_bytes(16 * 4096)
}

/// Claims everything pending, in one list.
pub fn drain(outbox: &Outbox) -> Vec<Record> {
    let mut all = Vec::new();
    loop {
        let got = outbox.claim(1000).expect("claim");
        if got.is_empty() {
            return all;
        }
        all.extend(got);
    }
}

/// Claims and acknowledges everything pending; returns the payloads in order.
pub fn drain_ack(outbox: &Outbox) -> Vec<Vec<u8>> {
    let records = drain(outbox);
    let seqs: Vec<Seq> = records.iter().map(Record::seq).collect();
    outbox.ack_many(&seqs).expect("ack");
    records.iter().map(|r| r.payload().to_vec()).collect()
}

/// A claim refused because the record it reached failed its checks.
#[derive(Debug)]
pub struct Refused {
    pub path: PathBuf,
    pub offset: u64,
    pub seq: Option<Seq>,
    pub kind: Corruption,
}

/// Claims `batch` records at a time until none is left, acknowledging each
/// one handed out (checking its payload is `len` bytes); returns the seqs
/// delivered, in order, and every claim refused with `Error::Corrupt`. Any
/// other error fails the test.
pub fn drain_past_corruption(
    outbox: &Outbox,
    batch: usize,
    len: usize,
) -> (Vec<Seq>, Vec<Refused>) {
    let mut delivered = Vec::new();
    let mut refused = Vec::new();
    loop {
        match outbox.claim(batch) {
            Ok(records) if records.is_empty() => return (delivered, refused),
            Ok(records) => {
                for r in records {
                    assert_eq!(r.payload().len(), len);
                    delivered.push(r.seq());
                    outbox.ack(r.seq()).expect("ack");
                }
            }
            Err(Error::Corrupt {
                path,
                offset,
                seq,
                kind,
            }) => refused.push(Refused {
                path,
                offset,
                seq,
                kind,
            }),
            Err(e) => panic!("unexpected error {e}"),
        }
    }
}

/// The segment files in `dir`, sorted by name (log order).
pub fn segment_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("read dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "seg"))
        .collect();
    files.sort();
    files
}

/// A payload that names its producer and index, so a test can check each one.
pub fn payload(producer: usize, i: usize) -> Vec<u8> {
    let mut p = format!("producer {producer} record {i} ").into_bytes();
    p.resize(p.len() + (i * 7 + producer) % 300, b'a' + (i % 26) as u8);
    p
}

/// Flips every bit of the byte at `offset` of `path`, in place (never truncating
/// the file, which the outbox may have mapped).
pub fn flip_byte(path: &Path, offset: u64) {
    use std::os::unix::fs::FileExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .expect("open for damage");
    let mut byte = [0u8];
    file.read_exact_at(&mut byte, offset).expect("read byte");
    byte[0] ^= 0xFF;
    file.write_all_at(&byte, offset).expect("write byte");
}

/// This very test binary, for tests that re-execute it as a child process: even
/// if a build replaced the file since it started.
pub fn this_binary() -> PathBuf {
    let exe = Path::new("/proc/self/exe");
    if exe.exists() {
        exe.to_owned()
    } else {
        std::env::current_exe().expect("test binary")
    }
}
