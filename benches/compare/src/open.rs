//! The open workload (`compare --open`): how long `Outbox::open` takes on a
//! log of a million pending records of 256 B after a crash, with the page
//! cache dropped (cold) and not (warm).
//!
//! Each open gets a log of its own: a child process (this program, run with
//! the hidden `--fill-crashed DIR`) opens a fresh outbox, appends the records
//! durably from two threads, 64 records per `append_batch` (writes of about
//! 37 KiB, so that the writer works as it does for small records, with zeros
//! ahead of its frames), and exits without closing: the newest segment is
//! left unsealed, as a crash leaves it. The parent then calls `sync`, drops
//! the page cache for a cold open (writing `3` to `/proc/sys/vm/drop_caches`,
//! which needs root; without it every open is reported warm), and times
//! `Outbox::open` alone. Cold and warm opens take turns.
//!
//! With `--open-alone` the child fills the log as a lone producer does: one
//! thread, one durable `append` a record, so every record is a sync group of
//! its own and takes a block of its own. The same records then lie in about
//! sixteen times as many bytes, over as many more segments, and the open
//! reads their indexes (written to `open-alone.md`).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use segwal::{Options, Outbox};

use crate::engines::Result;

/// Payload bytes of a record.
const RECORD_BYTES: usize = 256;
/// Records per `append_batch` call of the filling child.
const BATCH: usize = 64;
/// Threads appending in the filling child.
const FILLERS: usize = 2;
/// The open time asked for (issue "Performance, round 2"): a cold open of a
/// million pending records after a crash.
const TARGET: Duration = Duration::from_millis(50);

/// One timed open.
struct Opened {
    cold: bool,
    took: Duration,
    pending: u64,
    segments: usize,
    from_checkpoints: u64,
}

/// The child's side: fills `dir` with `records` pending records and exits
/// without closing the outbox. Never returns.
pub fn fill_crashed(dir: &Path, records: u64, alone: bool) -> ! {
    let outcome = (|| -> Result<()> {
        let outbox = Outbox::open(dir, Options::default())?;
        if alone {
            for i in 0..records {
                outbox.append(&payload(i))?;
            }
            std::mem::forget(outbox);
            return Ok(());
        }
        let per_filler = records.div_ceil(FILLERS as u64);
        std::thread::scope(|s| -> Result<()> {
            let handles: Vec<_> = (0..FILLERS as u64)
                .map(|f| {
                    let outbox = &outbox;
                    s.spawn(move || -> segwal::Result<()> {
                        let first = f * per_filler;
                        let end = (first + per_filler).min(records);
                        let mut i = first;
                        while i < end {
                            let n = (end - i).min(BATCH as u64);
                            let batch: Vec<Vec<u8>> = (i..i + n).map(payload).collect();
                            outbox.append_batch(&batch)?;
                            i += n;
                        }
                        Ok(())
                    })
                })
                .collect();
            for h in handles {
                h.join().map_err(|_| "filling thread panicked")??;
            }
            Ok(())
        })?;
        // Every append returned: every record is durable. Exit as a crash
        // would leave the files: no close, no seal, the writer stopped wherever
        // it was.
        std::mem::forget(outbox);
        Ok(())
    })();
    match outcome {
        Ok(()) => std::process::exit(0),
        Err(e) => {
            eprintln!("compare --fill-crashed: {e}");
            std::process::exit(1)
        }
    }
}

fn payload(i: u64) -> Vec<u8> {
    let mut bytes = format!("record {i} ").into_bytes();
    bytes.resize(RECORD_BYTES, b'o');
    bytes
}

/// Runs the child that fills `dir`, and waits for it.
fn fill(dir: &Path, records: u64, alone: bool) -> Result<()> {
    let exe = std::env::current_exe()?;
    let mut child = Command::new(exe);
    child
        .arg("--fill-crashed")
        .arg(dir)
        .arg("--fill-records")
        .arg(records.to_string());
    if alone {
        child.arg("--fill-alone");
    }
    let status = child.status()?;
    if !status.success() {
        return Err(format!("the filling child failed: {status}").into());
    }
    Ok(())
}

/// Writes back every dirty page, then drops the clean ones; false if this
/// process may not (not root).
fn drop_page_cache() -> bool {
    // SAFETY: sync(2) takes no arguments and cannot fail.
    unsafe { libc::sync() };
    std::fs::write("/proc/sys/vm/drop_caches", b"3\n").is_ok()
}

fn median(mut values: Vec<f64>) -> Option<f64> {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    (n > 0).then(|| (values[(n - 1) / 2] + values[n / 2]) / 2.0)
}

/// Fills and opens `rounds` crashed logs cold and as many warm, taking turns,
/// and prints (and, with `out`, writes `open.md`) the table.
/// `alone`: the child fills as a lone producer (see the module's doc).
pub fn run(quick: bool, alone: bool, rounds: usize, tmp: &Path, out: Option<&Path>) -> Result<()> {
    let records: u64 = if quick { 20_000 } else { 1_000_000 };
    let mut opened = Vec::new();
    let mut may_drop = !quick;
    for round in 0..rounds {
        // Cold first in even rounds, warm first in odd ones.
        for cold in [round % 2 == 0, round % 2 == 1] {
            let scratch = tempfile::tempdir_in(tmp)?;
            let dir: PathBuf = scratch.path().join("outbox");
            fill(&dir, records, alone)?;
            let cold = if cold && may_drop {
                may_drop = drop_page_cache();
                if !may_drop {
                    eprintln!(
                        "open: the page cache cannot be dropped here (needs root); every open is warm"
                    );
                }
                may_drop
            } else {
                // A warm open still finds the filled pages written back.
                // SAFETY: as above.
                unsafe { libc::sync() };
                false
            };
            let started = Instant::now();
            let outbox = Outbox::open(&dir, Options::default())?;
            let took = started.elapsed();
            let report = outbox.recovery_report();
            let o = Opened {
                cold,
                took,
                pending: outbox.stats().pending,
                segments: report.segments_found,
                from_checkpoints: report.frames_from_checkpoints,
            };
            if o.pending != records {
                return Err(format!(
                    "the open found {} pending records, the child appended {records}",
                    o.pending
                )
                .into());
            }
            eprintln!(
                "open after a crash, {}: {:.1} ms ({} records, {} segments, {} frames from checkpoints)",
                if o.cold { "cold" } else { "warm" },
                o.took.as_secs_f64() * 1e3,
                o.pending,
                o.segments,
                o.from_checkpoints
            );
            outbox.close()?;
            opened.push(o);
        }
    }
    let table = table(&opened, records, rounds, alone);
    println!("{table}");
    if let Some(out) = out {
        std::fs::create_dir_all(out)?;
        let name = if alone { "open-alone.md" } else { "open.md" };
        std::fs::write(out.join(name), &table)?;
    }
    Ok(())
}

fn table(opened: &[Opened], records: u64, rounds: usize, alone: bool) -> String {
    let ms = |o: &Opened| o.took.as_secs_f64() * 1e3;
    let fill = if alone {
        "one thread appending one record at a time (a block a record)"
    } else {
        "two threads appending 64 records a batch"
    };
    let mut s = format!(
        "Open after a crash: {records} pending records of {RECORD_BYTES} B, each open on a log of its own \
         filled by a child ({fill}) that exited without closing; `sync` before each open, the page cache \
         dropped before a cold one; {rounds} round(s), cold and warm taking turns. Only `Outbox::open` is \
         timed.\n\n\
         | open | ms | segments | frames from checkpoints |\n|---|--:|--:|--:|\n"
    );
    for o in opened {
        s.push_str(&format!(
            "| {} | {:.1} | {} | {} |\n",
            if o.cold { "cold" } else { "warm" },
            ms(o),
            o.segments,
            o.from_checkpoints
        ));
    }
    for cold in [true, false] {
        let times: Vec<f64> = opened.iter().filter(|o| o.cold == cold).map(ms).collect();
        let within = times
            .iter()
            .filter(|&&t| t <= TARGET.as_secs_f64() * 1e3)
            .count();
        if let Some(m) = median(times.clone()) {
            s.push_str(&format!(
                "\n{}: median {m:.1} ms, {within} of {} at or under {} ms.\n",
                if cold { "Cold" } else { "Warm" },
                times.len(),
                TARGET.as_millis()
            ));
        }
    }
    s
}
