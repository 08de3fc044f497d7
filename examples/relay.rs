//! The outbox pattern end to end: producer threads append events durably, a
//! relay thread claims them, "publishes" them and acknowledges them, and the
//! outbox deletes segments as they are fully acknowledged.
//!
//! ```text
//! cargo run --release --example relay [DIR] [PRODUCERS] [RECORDS_PER_PRODUCER]
//! ```
//!
//! Without DIR the outbox lives in a temporary directory. The relay loop is
//! written out by hand to show the calls; a service would run
//! [`segwal::Relay`], which also renews leases, retries and dead-letters. Like
//! it, this loop goes on past a corrupt record (`Error::Corrupt`: that record
//! is set aside, never handed out again), and it stops once the producers are
//! done and nothing is left to claim.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use segwal::{Options, Outbox, Seq};

/// At most this many producer threads.
const PRODUCERS_MAX: usize = 1024;
/// At most this many records in all (the job keeps a latency for each).
const RECORDS_MAX: usize = 100_000_000;

const USAGE: &str = "usage: relay [DIR] [PRODUCERS] [RECORDS_PER_PRODUCER] \
                     (producers 1 to 1024, records in all at most 100,000,000)";

fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("relay: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// A line on stdout; a reader that went away (`| head`) ends nothing.
fn say(line: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let _ = writeln!(std::io::stdout(), "{line}");
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // `--help`, an option, or more than three arguments: the usage.
    if args.len() > 3 || args.iter().any(|a| a.starts_with('-')) {
        return Err(USAGE.into());
    }
    let mut args = args.into_iter();
    let temp = tempfile::tempdir()?;
    let dir = args
        .next()
        .map_or_else(|| temp.path().join("outbox"), PathBuf::from);
    let count = |arg: Option<String>, default: usize, max: usize| -> Result<usize, String> {
        match arg.map(|a| a.parse::<usize>()) {
            None => Ok(default),
            Some(Ok(n)) if (1..=max).contains(&n) => Ok(n),
            Some(_) => Err(USAGE.to_owned()),
        }
    };
    let producers = count(args.next(), 8, PRODUCERS_MAX)?;
    let per_producer = count(args.next(), 5_000, RECORDS_MAX / producers)?;
    let total = producers * per_producer;

    let outbox = Outbox::open(&dir, Options::default().segment_bytes(4 << 20))?;
    let report = outbox.recovery_report();
    say(format_args!(
        "opened {} ({} segments found, {} records recovered)",
        dir.display(),
        report.segments_found,
        report.records_recovered
    ));

    // The relay: claim up to 256 records, publish them, acknowledge them.
    let producers_done = Arc::new(AtomicBool::new(false));
    let relay = {
        let outbox = outbox.clone();
        let producers_done = producers_done.clone();
        thread::spawn(move || -> segwal::Result<(u64, u64, u64)> {
            let mut delivered = 0u64;
            // The records claims could not read, each once.
            let mut unread = std::collections::BTreeSet::new();
            let mut digest = DefaultHasher::new();
            loop {
                // Read before the claim: once the producers are done, an
                // empty claim means nothing is left.
                let done = producers_done.load(Ordering::Acquire);
                let records = match outbox.claim_wait(256, Duration::from_millis(50)) {
                    Ok(records) => records,
                    // Set aside by the claim; the records after it go on.
                    Err(e @ segwal::Error::Corrupt { seq, .. }) => {
                        eprintln!("relay: {e}");
                        unread.insert(seq);
                        continue;
                    }
                    Err(e) => return Err(e),
                };
                if records.is_empty() {
                    if done {
                        break;
                    }
                    continue;
                }
                for record in &records {
                    // publish(record.payload()) would go here.
                    record.payload().hash(&mut digest);
                }
                let seqs: Vec<Seq> = records.iter().map(|r| r.seq()).collect();
                outbox.ack_many(&seqs)?;
                delivered += seqs.len() as u64;
            }
            Ok((delivered, unread.len() as u64, digest.finish()))
        })
    };

    // The producers: each append returns once its record is on stable storage.
    let started = Instant::now();
    let handles: Vec<_> = (0..producers)
        .map(|p| {
            let outbox = outbox.clone();
            thread::spawn(move || -> segwal::Result<Vec<Duration>> {
                let mut latencies = Vec::with_capacity(per_producer);
                for i in 0..per_producer {
                    let event = format!(
                        r#"{{"type":"webhook.deliver","producer":{p},"n":{i},"url":"https://example.invalid/hooks/{i}","body":"{}"}}"#,
                        "x".repeat(96)
                    );
                    let t = Instant::now();
                    outbox.append(event.as_bytes())?;
                    latencies.push(t.elapsed());
                }
                Ok(latencies)
            })
        })
        .collect();
    let mut latencies = Vec::with_capacity(total);
    for h in handles {
        latencies.extend(h.join().expect("producer thread")?);
    }
    let append_time = started.elapsed();
    producers_done.store(true, Ordering::Release);
    let (delivered, corrupt, _digest) = relay.join().expect("relay thread")?;
    let stats = outbox.stats();
    outbox.close()?;

    latencies.sort();
    let pct = |q: f64| latencies[((latencies.len() as f64 - 1.0) * q) as usize];
    say(format_args!(
        "{producers} producers appended {total} records durably in {:.2} s: {:.0} records/s",
        append_time.as_secs_f64(),
        total as f64 / append_time.as_secs_f64()
    ));
    say(format_args!(
        "append latency p50 {:?}, p99 {:?}, max {:?}",
        pct(0.50),
        pct(0.99),
        pct(1.0)
    ));
    say(format_args!(
        "{} write batches, {:.1} records per batch (group commit), {} fsyncs",
        stats.batches, stats.records_per_batch, stats.fsyncs
    ));
    say(format_args!(
        "relay delivered and acknowledged {delivered} records; {} segments deleted, {} left ({} bytes)",
        stats.segments_deleted, stats.segments, stats.disk_bytes
    ));
    if corrupt > 0 {
        // A corrupt record is set aside; one a newer build wrote is held
        // back, and met again at each lease's end.
        say(format_args!("{corrupt} records could not be read"));
    }
    // A DIR given again holds what an earlier run left: delivered too.
    if delivered + corrupt < total as u64 {
        return Err(format!("only {delivered} of {total} records delivered").into());
    }
    Ok(())
}
