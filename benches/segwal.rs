//! segwal's own benchmarks (criterion): durable appends from 1 to 64 producers,
//! batches, the relay's claim+ack drain, opening a log of many pending records,
//! and the state table's memory per pending record.
//!
//! `cargo bench --bench segwal` runs them; `cargo bench --bench segwal -- --test`
//! runs each once with small sizes (what CI does, so they do not rot). The
//! comparison with other engines is a separate crate: `benches/compare`.

use std::path::Path;
use std::thread;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use segwal::{Durability, Options, Outbox, Seq};

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

/// The relay's drain: claim 256, acknowledge them, until empty.
fn drain(c: &mut Criterion) {
    let mut group = c.benchmark_group("drain");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(3));
    group.throughput(Throughput::Elements(1));
    group.bench_function("claim256+ack", |b| {
        let tmp = tempfile::tempdir().expect("tempdir");
        let options = Options::default().durability(Durability::Buffered);
        let outbox = Outbox::open(tmp.path().join("o"), options).expect("open");
        let batch = vec![vec![7u8; 256]; 1024];
        b.iter_custom(|iters| {
            let mut filled = 0;
            while filled < iters {
                outbox.append_batch(&batch).expect("fill");
                filled += batch.len() as u64;
            }
            outbox.sync().expect("sync");
            let started = Instant::now();
            let mut drained = 0u64;
            while drained < iters {
                let records = outbox.claim(256).expect("claim");
                let seqs: Vec<Seq> = records.iter().map(|r| r.seq()).collect();
                outbox.ack_many(&seqs).expect("ack");
                drained += seqs.len() as u64;
            }
            let elapsed = started.elapsed();
            // Leave nothing pending for the next sample.
            while !outbox.claim(4096).expect("claim").is_empty() {}
            elapsed
        });
        outbox.close().expect("close");
    });
    group.finish();
}

/// Fills a log with `records` pending records of `size` bytes, quickly.
fn fill(dir: &Path, records: u64, size: usize) {
    let options = Options::default().durability(Durability::Buffered);
    let outbox = Outbox::open(dir, options).expect("open");
    let batch = vec![vec![3u8; size]; 4096];
    let mut done = 0;
    while done < records {
        let n = (records - done).min(batch.len() as u64) as usize;
        outbox.append_batch(&batch[..n]).expect("fill");
        done += n as u64;
    }
    outbox.close().expect("close");
}

/// Opening (recovering) a log of many pending records, after a clean close.
fn open_log(c: &mut Criterion) {
    let records = if quick() { 10_000 } else { 1_000_000 };
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("o");
    fill(&dir, records, 256);
    let mut group = c.benchmark_group("open");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(5));
    group.bench_function(format!("{records}x256B"), |b| {
        b.iter(|| {
            let outbox = open(&dir);
            assert_eq!(outbox.stats().pending, records);
            outbox.close().expect("close");
        });
    });
    group.finish();
    memory(&dir);
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

criterion_group!(benches, append, append_batch, drain, open_log);
criterion_main!(benches);
