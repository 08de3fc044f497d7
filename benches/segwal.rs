//! segwal's own benchmarks (criterion): durable appends from 1 to 64 producers,
//! batches, the relay's claim+ack drain, opening a log of many pending records,
//! and the state table's memory per pending record.
//!
//! `cargo bench --bench segwal` runs them; `cargo bench --bench segwal -- --test`
//! runs each once with small sizes, and so does
//! `cargo test --features cli --bench segwal -- --test` on the test profile
//! (what CI does, so they do not rot). The comparison with other engines is a
//! separate crate: `benches/compare`.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use criterion::{BatchSize, BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use segwal::{Durability, Message, OpenCheck, Options, Outbox, Seq};

/// `--test` (CI) runs every benchmark once: keep the set-ups small then.
fn quick() -> bool {
    std::env::args().any(|a| a == "--test")
}

fn open(dir: &Path) -> Outbox {
    Outbox::open(dir, Options::default()).expect("open")
}

/// Durable appends: `producers` threads share `iters` appends of `size` bytes.
fn append(c: &mut Criterion) {
    let mut group = c.benchmark_group("append");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(3));
    for size in [256usize, 4096] {
        for producers in [1usize, 4, 16, 64] {
            group.throughput(Throughput::Elements(1));
            let id = BenchmarkId::new(format!("{size}B"), format!("{producers}p"));
            group.bench_function(id, |b| {
                let tmp = tempfile::tempdir().expect("tempdir");
                let outbox = open(&tmp.path().join("o"));
                let payload = vec![7u8; size];
                b.iter_custom(|iters| {
                    let per = iters.div_ceil(producers as u64);
                    let started = Instant::now();
                    thread::scope(|s| {
                        for _ in 0..producers {
                            s.spawn(|| {
                                for _ in 0..per {
                                    outbox.append(&payload).expect("append");
                                }
                            });
                        }
                    });
                    started
                        .elapsed()
                        .mul_f64(iters as f64 / (per * producers as u64) as f64)
                });
                outbox.close().expect("close");
            });
        }
    }
    group.finish();
}

/// Durable appends of 256 bytes while a relay drains at the same time (claim
/// 256, `ack_through`, default acknowledgement durability): the end-to-end
/// workload. Compare with `append/256B` of the same run.
fn append_with_relay(c: &mut Criterion) {
    let mut group = c.benchmark_group("append_with_relay");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(3));
    for producers in [1usize, 4, 16, 64] {
        group.throughput(Throughput::Elements(1));
        let id = BenchmarkId::new("256B", format!("{producers}p"));
        group.bench_function(id, |b| {
            let tmp = tempfile::tempdir().expect("tempdir");
            let outbox = open(&tmp.path().join("o"));
            let payload = vec![7u8; 256];
            b.iter_custom(|iters| {
                let per = iters.div_ceil(producers as u64);
                let done = std::sync::atomic::AtomicBool::new(false);
                let started = Instant::now();
                let elapsed = thread::scope(|s| {
                    s.spawn(|| {
                        while !done.load(Ordering::Relaxed) {
                            let got = outbox
                                .claim_wait(256, Duration::from_millis(5))
                                .expect("claim");
                            if let Some(last) = got.last() {
                                outbox.ack_through(last.seq()).expect("ack");
                            }
                        }
                    });
                    let producers: Vec<_> = (0..producers)
                        .map(|_| {
                            s.spawn(|| {
                                for _ in 0..per {
                                    outbox.append(&payload).expect("append");
                                }
                            })
                        })
                        .collect();
                    for p in producers {
                        p.join().expect("producer");
                    }
                    let elapsed = started.elapsed();
                    done.store(true, Ordering::Relaxed);
                    elapsed
                });
                elapsed.mul_f64(iters as f64 / (per * producers as u64) as f64)
            });
            outbox.close().expect("close");
        });
    }
    group.finish();
}

/// One producer appending batches of 64 records of 256 bytes.
fn append_batch(c: &mut Criterion) {
    let mut group = c.benchmark_group("append_batch");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(3));
    group.throughput(Throughput::Elements(64));
    group.bench_function("64x256B", |b| {
        let tmp = tempfile::tempdir().expect("tempdir");
        let outbox = open(&tmp.path().join("o"));
        let batch = vec![vec![7u8; 256]; 64];
        b.iter(|| outbox.append_batch(&batch).expect("append_batch"));
        outbox.close().expect("close");
    });
    group.finish();
}

/// The relay's drain: claim 256, acknowledge them (one `ack_many` of the 256,
/// or one `ack_through` of the last), until empty. Acknowledgements are
/// written to the log by the writer: under the default
/// `ack_durability(Buffered)` each call returns at once and they are made
/// durable with the writer's next batch (few fsyncs fall inside the timed
/// window); under `ack_durability(Sync)` each call waits for its fsync, as
/// a database's commit of a delete does.
fn drain(c: &mut Criterion) {
    let mut group = c.benchmark_group("drain");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(3));
    group.throughput(Throughput::Elements(1));
    for (name, through, max_attempts, keys, ack_sync) in [
        ("claim256+ack", false, None, None, false),
        ("claim256+ack_through", true, None, None, false),
        // Every acknowledgement waits for its fsync.
        (
            "claim256+ack_through ack_durability(Sync)",
            true,
            None,
            None,
            true,
        ),
        // Every claim waits for its attempts to be fsynced.
        (
            "claim256+ack_through max_attempts",
            true,
            Some(5),
            None,
            false,
        ),
        // Records of 10,000 ordering keys, appended round robin: each claim
        // takes one record of each of 256 keys, and each acknowledgement
        // passes its key's turn to the key's next record.
        (
            "claim256+ack_through 10000 keys",
            true,
            None,
            Some(10_000),
            false,
        ),
    ] {
        drain_with(&mut group, name, through, max_attempts, keys, ack_sync);
    }
    group.finish();
}

fn drain_with(
    group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    name: &str,
    through: bool,
    max_attempts: Option<u32>,
    keys: Option<u64>,
    ack_sync: bool,
) {
    group.bench_function(name, |b| {
        let tmp = tempfile::tempdir().expect("tempdir");
        let mut options = Options::default().durability(Durability::Buffered);
        if ack_sync {
            options = options.ack_durability(Durability::Sync);
        }
        if let Some(max) = max_attempts {
            options = options.max_attempts(max);
        }
        let outbox = Outbox::open(tmp.path().join("o"), options).expect("open");
        let batch = vec![vec![7u8; 256]; 1024];
        let names: Vec<Vec<u8>> = (0..keys.unwrap_or(0))
            .map(|k| format!("account-{k}").into_bytes())
            .collect();
        b.iter_custom(|iters| {
            let mut filled = 0;
            while filled < iters {
                if names.is_empty() {
                    outbox.append_batch(&batch).expect("fill");
                } else {
                    let messages: Vec<Message<'_>> = batch
                        .iter()
                        .enumerate()
                        .map(|(i, p)| {
                            let k = (filled as usize + i) % names.len();
                            Message::new(p).key(&names[k])
                        })
                        .collect();
                    outbox.append_messages(&messages).expect("fill");
                }
                filled += batch.len() as u64;
            }
            outbox.sync().expect("sync");
            let started = Instant::now();
            let mut drained = 0u64;
            while drained < iters {
                let records = outbox.claim(256).expect("claim");
                if through {
                    let last = records.last().map(|r| r.seq()).expect("records");
                    drained += outbox.ack_through(last).expect("ack_through");
                } else {
                    let seqs: Vec<Seq> = records.iter().map(|r| r.seq()).collect();
                    outbox.ack_many(&seqs).expect("ack");
                    drained += seqs.len() as u64;
                }
            }
            let elapsed = started.elapsed();
            // Leave nothing pending for the next sample.
            loop {
                let records = outbox.claim(4096).expect("claim");
                let Some(last) = records.last() else { break };
                if keys.is_some() {
                    outbox.ack_through(last.seq()).expect("ack_through");
                }
            }
            elapsed
        });
        outbox.close().expect("close");
    });
}

/// Fills a log with `records` pending records of `size` bytes, quickly.
fn fill(dir: &Path, records: u64, size: usize) {
    let options = Options::default().durability(Durability::Buffered);
    let outbox = Outbox::open(dir, options).expect("open");
    append_all(&outbox, records, size);
    outbox.close().expect("close");
}

fn append_all(outbox: &Outbox, records: u64, size: usize) {
    let batch = vec![vec![3u8; size]; 4096];
    let mut done = 0;
    while done < records {
        let n = (records - done).min(batch.len() as u64) as usize;
        outbox.append_batch(&batch[..n]).expect("fill");
        done += n as u64;
    }
}

/// Opening (recovering) a log of many pending records: after a clean close, and
/// after a crash (the newest segment unsealed, its preallocated space unwritten),
/// under each [`OpenCheck`].
fn open_log(c: &mut Criterion) {
    let records = if quick() { 10_000 } else { 1_000_000 };
    let tmp = tempfile::tempdir().expect("tempdir");
    let closed = tmp.path().join("closed");
    fill(&closed, records, 256);
    let crashed = tmp.path().join("crashed");
    fill_and_crash(&crashed, records, 256);
    let mut group = c.benchmark_group("open");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(5));
    let torn = tmp.path().join("torn");
    copy_dir(&crashed, &torn);
    tear_newest(&torn);
    // Half of the records acknowledged (durably: closed) before the open.
    let half = tmp.path().join("half");
    fill(&half, records, 256);
    {
        let outbox = Outbox::open(&half, Options::default()).expect("open");
        let mut acked = 0;
        while acked < records / 2 {
            let got = outbox
                .claim((records / 2 - acked).min(256) as usize)
                .expect("claim");
            let last = got.last().map(|r| r.seq()).expect("records");
            acked += outbox.ack_through(last).expect("ack_through");
        }
        outbox.close().expect("close");
    }
    group.bench_function(format!("{records}x256B half acknowledged SealIndex"), |b| {
        b.iter(|| {
            let outbox = Outbox::open(&half, Options::default()).expect("open");
            assert_eq!(outbox.stats().pending, records - records / 2);
            outbox.close().expect("close");
        });
    });
    for check in [OpenCheck::SealIndex, OpenCheck::EveryFrame] {
        let options = Options::default().open_check(check);
        group.bench_function(format!("{records}x256B closed {check:?}"), |b| {
            b.iter(|| {
                let outbox = Outbox::open(&closed, options.clone()).expect("open");
                assert_eq!(outbox.stats().pending, records);
                outbox.close().expect("close");
            });
        });
        for (name, from) in [("crashed", &crashed), ("crashed torn", &torn)] {
            bench_crashed_open(
                &mut group,
                &format!("{records}x256B {name} {check:?}"),
                from,
                &options,
                records,
                tmp.path(),
            );
        }
    }
    group.finish();
    memory(&closed);
}

/// Opens a fresh copy of the crashed log `from` per iteration (the copy is not
/// timed).
fn bench_crashed_open(
    group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    name: &str,
    from: &Path,
    options: &Options,
    records: u64,
    scratch: &Path,
) {
    static COPIES: AtomicUsize = AtomicUsize::new(0);
    group.bench_function(name, |b| {
        b.iter_batched(
            || {
                let n = COPIES.fetch_add(1, Ordering::Relaxed);
                let copy = scratch.join(format!("copy-{n}"));
                copy_dir(from, &copy);
                Scratch(copy)
            },
            |copy| {
                let outbox = Outbox::open(&copy.0, options.clone()).expect("open");
                assert_eq!(outbox.stats().pending, records);
                outbox.close().expect("close");
                copy
            },
            BatchSize::PerIteration,
        );
    });
}

/// Fills a log like [`fill`], then leaves it as a crash would: the writer's
/// files as they are, the newest segment (holding the last ~40 MiB of records)
/// neither sealed nor cut back to its data.
fn fill_and_crash(dir: &Path, records: u64, size: usize) {
    let live = dir.with_extension("live");
    let options = Options::default().durability(Durability::Buffered);
    let outbox = Outbox::open(&live, options).expect("open");
    append_all(&outbox, records, size);
    outbox.sync().expect("sync");
    copy_dir(&live, dir);
    // Never closed: nothing tidies the files the copy was taken from.
    std::mem::forget(outbox);
}

/// A directory removed when dropped (outside the timed part of a benchmark).
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Copies the files of `from` into a new directory `to` as a crash leaves them:
/// each file's bytes up to its last non-zero byte are written, and the rest of
/// its length (a segment's preallocated space) is preallocated again, unwritten,
/// not written as zeros. The copy is made durable, as the files of a crashed
/// process are by the time it restarts: an open must not be timed writing back
/// the copy.
fn copy_dir(from: &Path, to: &Path) {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::FileExt;
    std::fs::create_dir(to).expect("mkdir");
    for entry in std::fs::read_dir(from).expect("read_dir") {
        let entry = entry.expect("entry");
        let bytes = std::fs::read(entry.path()).expect("read");
        let data = bytes.iter().rposition(|&b| b != 0).map_or(0, |p| p + 1);
        let file = std::fs::File::create_new(to.join(entry.file_name())).expect("create");
        file.write_all_at(&bytes[..data], 0).expect("write");
        if bytes.len() > data {
            let len = libc::off_t::try_from(bytes.len()).expect("length");
            // SAFETY: fallocate on a descriptor `file` owns and keeps open.
            let rc = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, len) };
            if rc != 0 {
                file.set_len(bytes.len() as u64).expect("extend");
            }
        }
        file.sync_all().expect("sync");
    }
}

/// Writes 64 bytes of garbage right after the data of the newest segment of
/// `dir`: a write batch torn by the crash, which recovery must look past
/// (through the preallocated space after it) before cutting it.
fn tear_newest(dir: &Path) {
    use std::os::unix::fs::FileExt;
    let mut names: Vec<_> = std::fs::read_dir(dir)
        .expect("read_dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "seg"))
        .collect();
    names.sort();
    let newest = names.pop().expect("a segment");
    let bytes = std::fs::read(&newest).expect("read");
    let data = bytes.iter().rposition(|&b| b != 0).map_or(0, |p| p + 1);
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(&newest)
        .expect("open");
    file.write_all_at(&[0xAB; 64], data as u64).expect("tear");
    file.sync_all().expect("sync");
}

/// State table memory per pending record, printed (not timed).
fn memory(dir: &Path) {
    let outbox = open(dir);
    let stats = outbox.stats();
    println!(
        "memory: {} pending records, state table {} bytes, {:.2} bytes per pending record",
        stats.pending,
        stats.state_bytes,
        stats.state_bytes as f64 / stats.pending as f64
    );
    outbox.close().expect("close");
    if !quick() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let big = tmp.path().join("o");
        fill(&big, 10_000_000, 0);
        let outbox = open(&big);
        let stats = outbox.stats();
        println!(
            "memory: {} pending records, state table {} bytes, {:.2} bytes per pending record",
            stats.pending,
            stats.state_bytes,
            stats.state_bytes as f64 / stats.pending as f64
        );
        outbox.close().expect("close");
    }
}

criterion_group!(
    benches,
    append,
    append_with_relay,
    append_batch,
    drain,
    open_log
);
criterion_main!(benches);
