//! The async workload (`compare --async`): durable appends from P tasks on a
//! tokio runtime (`Outbox::append_async`) against P threads calling the
//! blocking `Outbox::append`, in one run, the two taking turns round after
//! round. The runtime has as many worker threads as the machine has cores
//! (tokio's default), so 64 tasks share 2 threads where the blocking side
//! has 64.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use segwal::{Options, Outbox};

use crate::engines::Result;

const RECORD_BYTES: usize = 256;

fn payload(p: usize, i: usize) -> Vec<u8> {
    let mut bytes = format!("p{p} i{i} ").into_bytes();
    bytes.resize(RECORD_BYTES, b'x');
    bytes
}

/// `producers` threads appending `per_producer` records each; records/s.
fn blocking(outbox: &Outbox, producers: usize, per_producer: usize) -> Result<f64> {
    let started = Instant::now();
    std::thread::scope(|s| -> Result<()> {
        let handles: Vec<_> = (0..producers)
            .map(|p| {
                s.spawn(move || -> segwal::Result<()> {
                    for i in 0..per_producer {
                        outbox.append(&payload(p, i))?;
                    }
                    Ok(())
                })
            })
            .collect();
        for h in handles {
            h.join().map_err(|_| "producer panicked")??;
        }
        Ok(())
    })?;
    Ok((producers * per_producer) as f64 / started.elapsed().as_secs_f64())
}

/// `producers` tasks appending `per_producer` records each; records/s.
fn tasks(outbox: &Arc<Outbox>, producers: usize, per_producer: usize) -> Result<f64> {
    let runtime = tokio::runtime::Builder::new_multi_thread().build()?;
    let started = Instant::now();
    runtime.block_on(async {
        let handles: Vec<_> = (0..producers)
            .map(|p| {
                let outbox = outbox.clone();
                tokio::spawn(async move {
                    for i in 0..per_producer {
                        outbox.append_async(&payload(p, i)).await?;
                    }
                    Ok::<(), segwal::Error>(())
                })
            })
            .collect();
        for h in handles {
            h.await.map_err(|_| "producer task panicked")??;
        }
        Ok::<(), crate::engines::Error>(())
    })?;
    Ok((producers * per_producer) as f64 / started.elapsed().as_secs_f64())
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// Runs the async workload at each producer count, `rounds` times, and
/// prints (and, with `out`, writes `async.md`) its table.
pub fn run(quick: bool, rounds: usize, tmp: &Path, out: Option<&Path>) -> Result<()> {
    let total = if quick { 4_096 } else { 256_000 };
    let mut table = format!(
        "| producers ({RECORD_BYTES} B, durable, {total} records, median of {rounds}) | blocking, threads | async, tasks | async / blocking |\n\
         |---:|---:|---:|---:|\n"
    );
    for producers in [1usize, 16, 64] {
        let per_producer = total / producers / if producers == 1 { 16 } else { 1 };
        let (mut b, mut a) = (Vec::new(), Vec::new());
        for r in 0..rounds {
            for async_first in [r % 2 == 1, r % 2 == 0] {
                let dir = tempfile::tempdir_in(tmp)?;
                let outbox = Arc::new(Outbox::open(dir.path().join("outbox"), Options::default())?);
                if async_first {
                    a.push(tasks(&outbox, producers, per_producer)?);
                } else {
                    b.push(blocking(&outbox, producers, per_producer)?);
                }
                Arc::try_unwrap(outbox)
                    .map_err(|_| "outbox still shared")?
                    .close()?;
            }
        }
        let (b, a) = (median(b), median(a));
        eprintln!("async, {producers} producers: blocking {b:.0}/s, async {a:.0}/s");
        table.push_str(&format!(
            "| {producers} | {b:.0}/s | {a:.0}/s | {:.2} |\n",
            a / b
        ));
    }
    println!("{table}");
    if let Some(out) = out {
        std::fs::create_dir_all(out)?;
        std::fs::write(out.join("async.md"), &table)?;
    }
    Ok(())
}
