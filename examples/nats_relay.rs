//! The main job into a real broker: producer threads append JSON events
//! durably while a [`Relay`] publishes them into a NATS JetStream stream
//! (created if missing: `SEGWAL_EXAMPLE`, subjects `segwal.example.*`) and
//! acknowledges each once its `PubAck` came back.
//!
//! ```text
//! nats-server -js &        # or any JetStream server or cluster
//! cargo run --release --features nats --example nats_relay -- nats://127.0.0.1:4222 [PRODUCERS] [RECORDS_PER_PRODUCER] [DIR]
//! ```
//!
//! Without DIR the outbox lives in a temporary directory, removed when the
//! run ends; a run that is killed (Ctrl-C included: the example installs no
//! handler) leaves that directory and its records behind, which no later run
//! finds. Give DIR to keep the outbox: a run killed half way is taken up by
//! the next run with the same DIR, whose relay publishes what the killed one
//! left (the broker's duplicate window drops what was published twice).
//!
//! Prints the throughput from append to `PubAck`, the latency from append to
//! `PubAck` (p50, p99), and the relay's duplicates, retries and dead letters.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant, SystemTime};

use segwal::nats::{JetStream, JetStreamOptions};
use segwal::{Message, Options, Outbox, Outcome, Publisher, Record, Relay, RelayOptions};

/// A publisher that notes, for every record the broker stored, how long
/// after its append the `PubAck` came back.
struct Timed {
    inner: JetStream,
    latencies: Arc<Mutex<Vec<Duration>>>,
}

impl Publisher for Timed {
    fn publish(&mut self, records: &[Record]) -> Vec<Outcome> {
        let outcomes = self.inner.publish(records);
        let now = SystemTime::now();
        let mut latencies = self.latencies.lock().expect("latencies");
        for (record, outcome) in records.iter().zip(&outcomes) {
            if matches!(outcome, Outcome::Stored | Outcome::Duplicate) {
                let waited = now.duration_since(record.appended_at()).unwrap_or_default();
                latencies.push(waited);
            }
        }
        outcomes
    }
}

fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("nats_relay: {e}");
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
    let mut args = std::env::args().skip(1);
    let url = args
        .next()
        .unwrap_or_else(|| "nats://127.0.0.1:4222".into());
    let producers: usize = args.next().map_or(Ok(8), |a| a.parse())?;
    let per_producer: usize = args.next().map_or(Ok(5_000), |a| a.parse())?;
    let total = producers * per_producer;

    let temp = tempfile::tempdir()?;
    let dir = args
        .next()
        .map_or_else(|| temp.path().join("outbox"), std::path::PathBuf::from);
    let outbox = Outbox::open(&dir, Options::default())?;
    let left = outbox.recovery_report().records_recovered;
    if left > 0 {
        say(format_args!(
            "{left} records an earlier run left in {} are relayed too",
            dir.display()
        ));
    }
    let options =
        JetStreamOptions::new(&url, "SEGWAL_EXAMPLE", "segwal.example.{key}").create_stream(1);
    let latencies = Arc::new(Mutex::new(Vec::with_capacity(total)));
    let publisher = Timed {
        inner: JetStream::connect(&outbox, options)?,
        latencies: latencies.clone(),
    };
    say(format_args!(
        "outbox {:032x}, relaying into {url}",
        outbox.id()
    ));

    let stop = Arc::new(AtomicBool::new(false));
    let relay = {
        let (outbox, stop) = (outbox.clone(), stop.clone());
        thread::spawn(move || Relay::new(outbox, publisher, RelayOptions::default()).run(&stop))
    };

    let started = Instant::now();
    let handles: Vec<_> = (0..producers)
        .map(|p| {
            let outbox = outbox.clone();
            thread::spawn(move || -> segwal::Result<()> {
                for i in 0..per_producer {
                    let event = format!(
                        r#"{{"type":"webhook.deliver","producer":{p},"n":{i},"url":"https://example.invalid/hooks/{i}","body":"{}"}}"#,
                        "x".repeat(96)
                    );
                    // One key per customer: each customer's events in order.
                    let key = format!("customer-{}", i % 64);
                    outbox.append_message(&Message::new(event.as_bytes()).key(key.as_bytes()))?;
                }
                Ok(())
            })
        })
        .collect();
    for h in handles {
        h.join().expect("producer thread")?;
    }
    let appended = started.elapsed();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let s = outbox.stats();
        if s.pending + s.claimed + s.delayed == 0 {
            break;
        }
        if Instant::now() > deadline {
            return Err(format!("not all records delivered within 120 s: {s:?}").into());
        }
        thread::sleep(Duration::from_millis(5));
    }
    let delivered = started.elapsed();
    stop.store(true, Ordering::Release);
    let figures = relay.join().expect("relay thread")?;
    outbox.close()?;

    let mut latencies = latencies.lock().expect("latencies").clone();
    latencies.sort();
    let pct = |q: f64| latencies[((latencies.len() as f64 - 1.0) * q) as usize];
    say(format_args!(
        "{producers} producers appended {total} records durably in {:.2} s ({:.0}/s)",
        appended.as_secs_f64(),
        total as f64 / appended.as_secs_f64()
    ));
    say(format_args!(
        "stored in the stream and acknowledged in {:.2} s: {:.0} records/s from append to PubAck",
        delivered.as_secs_f64(),
        total as f64 / delivered.as_secs_f64()
    ));
    if !latencies.is_empty() {
        say(format_args!(
            "latency from append to PubAck: p50 {:?}, p99 {:?}",
            pct(0.50),
            pct(0.99)
        ));
    }
    say(format_args!(
        "relay: {} published, {} duplicates, {} retries, {} dead letters",
        figures.published, figures.duplicates, figures.retries, figures.dead_letters
    ));
    Ok(())
}
