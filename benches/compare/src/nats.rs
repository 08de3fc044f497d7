//! The relay workload (`compare --nats URL`): records/s from append to
//! JetStream `PubAck`, against the same run's append-only figure and the
//! server's own pipelined publish rate, with the latency from append to
//! `PubAck`. Needs a JetStream server at URL (e.g. `nats-server -js`); the
//! streams it creates are deleted at the end.

use std::collections::VecDeque;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use segwal::nats::{JetStream, JetStreamOptions};
use segwal::{Options, Outbox, Outcome, Publisher, Record, Relay, RelayOptions};

use crate::engines::Result;

const RECORD_BYTES: usize = 256;
const PRODUCERS: usize = 16;

/// Figures of one round.
#[derive(Clone, Copy, Debug, Default)]
struct Round {
    append_only: f64,
    publish_only: f64,
    end_to_end: f64,
    p50: Duration,
    p99: Duration,
}

/// The relay's publisher, noting the time from append to `PubAck`.
struct Timed {
    inner: JetStream,
    latencies: Arc<Mutex<Vec<Duration>>>,
}

impl Publisher for Timed {
    fn publish(&mut self, records: &[Record]) -> Vec<Outcome> {
        let outcomes = self.inner.publish(records);
        let now = SystemTime::now();
        let mut latencies = self.latencies.lock().expect("latencies");
        for record in records {
            latencies.push(now.duration_since(record.appended_at()).unwrap_or_default());
        }
        outcomes
    }
}

fn payload(p: usize, i: usize) -> Vec<u8> {
    let mut bytes = format!("p{p} i{i} ").into_bytes();
    bytes.resize(RECORD_BYTES, b'x');
    bytes
}

/// `producers` threads appending `per_producer` records each; records/s.
fn append(outbox: &Outbox, per_producer: usize) -> Result<f64> {
    let started = Instant::now();
    std::thread::scope(|s| -> Result<()> {
        let handles: Vec<_> = (0..PRODUCERS)
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
    Ok((PRODUCERS * per_producer) as f64 / started.elapsed().as_secs_f64())
}

fn round(url: &str, tmp: &Path, n: usize, tag: &str) -> Result<Round> {
    let per_producer = n / PRODUCERS;
    let total = per_producer * PRODUCERS;
    let mut out = Round::default();

    // Append only: the outbox alone.
    {
        let dir = tempfile::tempdir_in(tmp)?;
        let outbox = Outbox::open(dir.path().join("outbox"), Options::default())?;
        out.append_only = append(&outbox, per_producer)?;
        outbox.close()?;
    }

    // The server alone: one connection, pipelined, 1024 PubAcks in flight.
    {
        let stream = format!("COMPARE_RAW_{tag}");
        let subject = format!("compare.raw.{tag}");
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        out.publish_only = runtime.block_on(async {
            let client = async_nats::connect(url).await?;
            let js = async_nats::jetstream::new(client);
            js.create_stream(async_nats::jetstream::stream::Config {
                name: stream.clone(),
                subjects: vec![subject.clone()],
                ..Default::default()
            })
            .await?;
            let started = Instant::now();
            let mut in_flight = VecDeque::with_capacity(1024);
            for i in 0..total {
                let ack = js.publish(subject.clone(), payload(0, i).into()).await?;
                in_flight.push_back(ack);
                if in_flight.len() >= 1024 {
                    in_flight.pop_front().expect("in flight").await?;
                }
            }
            for ack in in_flight {
                ack.await?;
            }
            let rate = total as f64 / started.elapsed().as_secs_f64();
            js.delete_stream(&stream).await?;
            Ok::<f64, crate::engines::Error>(rate)
        })?;
    }

    // End to end: producers append while a relay publishes and acks.
    {
        let dir = tempfile::tempdir_in(tmp)?;
        let outbox = Outbox::open(dir.path().join("outbox"), Options::default())?;
        let stream = format!("COMPARE_E2E_{tag}");
        let options =
            JetStreamOptions::new(url, &stream, &format!("compare.e2e.{tag}")).create_stream(1);
        let latencies = Arc::new(Mutex::new(Vec::with_capacity(total)));
        let publisher = Timed {
            inner: JetStream::connect(&outbox, options.clone())?,
            latencies: latencies.clone(),
        };
        let stop = AtomicBool::new(false);
        let started = Instant::now();
        let figures = std::thread::scope(|s| -> Result<_> {
            let relay = s.spawn(|| {
                Relay::new(outbox.clone(), publisher, RelayOptions::default()).run(&stop)
            });
            append(&outbox, per_producer)?;
            let deadline = Instant::now() + Duration::from_secs(300);
            loop {
                let stats = outbox.stats();
                if stats.pending + stats.claimed + stats.delayed == 0 {
                    break;
                }
                if Instant::now() > deadline {
                    return Err(format!("relay did not finish: {stats:?}").into());
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            let elapsed = started.elapsed();
            stop.store(true, Ordering::Release);
            let figures = relay.join().map_err(|_| "relay panicked")??;
            Ok((elapsed, figures))
        })?;
        let (elapsed, figures) = figures;
        if figures.published + figures.duplicates != total as u64 || figures.dead_letters > 0 {
            return Err(format!("relay figures wrong: {figures:?}").into());
        }
        out.end_to_end = total as f64 / elapsed.as_secs_f64();
        let mut latencies = latencies.lock().expect("latencies").clone();
        latencies.sort();
        let pct = |q: f64| latencies[((latencies.len() as f64 - 1.0) * q) as usize];
        out.p50 = pct(0.50);
        out.p99 = pct(0.99);
        outbox.close()?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        runtime.block_on(async {
            let js = async_nats::jetstream::new(async_nats::connect(url).await?);
            js.delete_stream(&stream).await?;
            Ok::<(), crate::engines::Error>(())
        })?;
    }
    Ok(out)
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// Runs the relay workload `rounds` times and prints (and, with `out`,
/// writes `nats.md`) its table.
pub fn run(url: &str, quick: bool, rounds: usize, tmp: &Path, out: Option<&Path>) -> Result<()> {
    let n = if quick { 4_000 } else { 200_000 };
    let mut all = Vec::new();
    for r in 0..rounds {
        let tag = format!("{}_{r}", std::process::id());
        let round = round(url, tmp, n, &tag)?;
        eprintln!("nats round {}: {round:?}", r + 1);
        all.push(round);
    }
    let append_only = median(all.iter().map(|r| r.append_only).collect());
    let publish_only = median(all.iter().map(|r| r.publish_only).collect());
    let end_to_end = median(all.iter().map(|r| r.end_to_end).collect());
    let p50 = median(all.iter().map(|r| r.p50.as_secs_f64()).collect());
    let p99 = median(all.iter().map(|r| r.p99.as_secs_f64()).collect());
    let lower = append_only.min(publish_only);
    let table = format!(
        "| {PRODUCERS} producers, {RECORD_BYTES} B, {n} records, median of {rounds} | records/s |\n\
         |---|---:|\n\
         | append only (the outbox alone) | {append_only:.0} |\n\
         | pipelined publish (the server alone, 1024 in flight) | {publish_only:.0} |\n\
         | end to end: append, relay, `PubAck`, durable ack | {end_to_end:.0} |\n\
         | end to end / lower of the two | {:.2} |\n\
         | latency append to `PubAck`, p50 / p99 | {:.2} ms / {:.2} ms |\n",
        end_to_end / lower,
        p50 * 1e3,
        p99 * 1e3
    );
    println!("{table}");
    if let Some(out) = out {
        std::fs::create_dir_all(out)?;
        std::fs::write(out.join("nats.md"), &table)?;
    }
    Ok(())
}
