//! The workloads: durable appends from many producer threads, a drain (claim
//! and acknowledge in batches) by one relay, both at once (the end-to-end
//! workload: producers appending while a relay drains), and one producer
//! pausing before each append.

use std::sync::Barrier;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::engines::{Counters, Engine, Queue, Result};
use crate::measure::{CpuTicks, Percentiles, cpu_time};

/// What one timed run measured.
#[derive(Clone, Debug)]
pub struct Sample {
    pub records: u64,
    pub payload_bytes: u64,
    pub wall: Duration,
    pub cpu: Duration,
    /// Per append, or per drain batch.
    pub latency: Percentiles,
    /// The engine's batches and fsyncs during the run, when it counts them.
    pub counters: Option<Counters>,
    /// Records a relay claimed and acknowledged during the run (the
    /// end-to-end workload only).
    pub relayed: Option<u64>,
    /// Bytes the device holding the engine's directory wrote during the run
    /// (the whole device's: the machine should be quiet), where it tells.
    pub device_bytes: Option<u64>,
    /// The share of the machine's CPU time the hypervisor gave to other
    /// guests during the run (0 to 1), where the kernel tells: a cell run
    /// while the host was busy elsewhere measures that, not the engine.
    pub steal: Option<f64>,
}

impl Sample {
    pub fn records_per_s(&self) -> f64 {
        self.records as f64 / self.wall.as_secs_f64()
    }

    pub fn mb_per_s(&self) -> f64 {
        self.payload_bytes as f64 / self.wall.as_secs_f64() / 1e6
    }

    pub fn cpu_us_per_record(&self) -> f64 {
        self.cpu.as_secs_f64() * 1e6 / self.records as f64
    }

    /// Device bytes written per record, where the device tells.
    pub fn device_bytes_per_record(&self) -> Option<f64> {
        self.device_bytes
            .map(|b| b as f64 / self.records.max(1) as f64)
    }

    /// Acknowledgements per second of the relay, in the end-to-end workload.
    pub fn relayed_per_s(&self) -> Option<f64> {
        self.relayed.map(|n| n as f64 / self.wall.as_secs_f64())
    }
}

/// When the producers of an append run stop.
#[derive(Clone, Copy, Debug)]
pub enum Stop {
    /// Each producer appends exactly this many records: the timed runs.
    PerProducer(u64),
    /// Each producer appends until this much time has passed: calibration and
    /// warm-up.
    After(Duration),
}

/// A payload of `size` bytes that does not compress (fjall compresses its
/// tables), different for each producer.
pub fn payload(size: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..size)
        .map(|_| {
            // xorshift64
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// How long the end-to-end workload's relay waits for records before it looks
/// whether the producers are done.
const RELAY_WAIT: Duration = Duration::from_millis(1);

/// Runs `producers` threads, each appending records of `size` bytes to
/// `engine` one at a time, each waiting for durability, until `stop`.
///
/// With `relay` = `(queue, batch)`, one relay thread drains
/// `queue` (the same engine's) in batches of `batch` for the whole run: the
/// end-to-end workload. The sample counts the appends, and in `relayed` what
/// the relay acknowledged.
pub fn append(
    engine: &dyn Engine,
    relay: Option<(&dyn Queue, usize)>,
    producers: usize,
    size: usize,
    stop: Stop,
) -> Result<Sample> {
    let start_line = Barrier::new(producers + 1 + usize::from(relay.is_some()));
    let finished = AtomicBool::new(false);
    let producers_done = AtomicBool::new(false);
    let counters_before = engine.counters();
    let (wall, cpu, steal, per_thread, relayed) = std::thread::scope(|scope| {
        let relay_thread = relay.map(|(queue, batch)| {
            let start_line = &start_line;
            let producers_done = &producers_done;
            let relay = std::thread::Builder::new().name("relay".into());
            relay
                .spawn_scoped(scope, move || -> Result<u64> {
                    start_line.wait();
                    let mut acked = 0u64;
                    // Nothing pending means the relay keeps up: it waits for
                    // records the engine's way (a polled engine naps), and
                    // looks at the end of the run at least every millisecond.
                    while !producers_done.load(Ordering::Relaxed) {
                        acked += queue.drain_wait(batch, RELAY_WAIT)? as u64;
                    }
                    Ok(acked)
                })
                .expect("the relay thread starts")
        });
        let threads: Vec<_> = (0..producers)
            .map(|p| {
                let start_line = &start_line;
                let finished = &finished;
                scope.spawn(move || -> Result<Vec<u64>> {
                    let mut record = payload(size, p as u64 + 1);
                    let mut latencies = match stop {
                        Stop::PerProducer(n) => Vec::with_capacity(n as usize),
                        Stop::After(_) => Vec::new(),
                    };
                    start_line.wait();
                    let mut i = 0u64;
                    loop {
                        match stop {
                            Stop::PerProducer(n) if i == n => break,
                            Stop::After(_) if finished.load(Ordering::Relaxed) => break,
                            _ => {}
                        }
                        // Every record differs: its producer and number lead it.
                        let stamp = (((p as u64) << 48) | i).to_le_bytes();
                        let n = stamp.len().min(size);
                        record[..n].copy_from_slice(&stamp[..n]);
                        let t = Instant::now();
                        engine.append(&record)?;
                        latencies.push(t.elapsed().as_nanos() as u64);
                        i += 1;
                    }
                    Ok(latencies)
                })
            })
            .collect();
        start_line.wait();
        let t0 = Instant::now();
        let cpu0 = cpu_time();
        let ticks0 = CpuTicks::now();
        if let Stop::After(d) = stop {
            std::thread::sleep(d);
            finished.store(true, Ordering::Relaxed);
        }
        let per_thread: Vec<Result<Vec<u64>>> = threads
            .into_iter()
            .map(|t| t.join().unwrap_or_else(|_| Err("producer panicked".into())))
            .collect();
        let wall = t0.elapsed();
        let cpu = cpu_time().saturating_sub(cpu0);
        let steal = CpuTicks::stolen_share(ticks0, CpuTicks::now());
        producers_done.store(true, Ordering::Relaxed);
        let relayed =
            relay_thread.map(|t| t.join().unwrap_or_else(|_| Err("relay panicked".into())));
        (wall, cpu, steal, per_thread, relayed)
    });
    let mut latencies = Vec::new();
    for thread in per_thread {
        latencies.extend(thread?);
    }
    let relayed = relayed.transpose()?;
    let records = latencies.len() as u64;
    let counters = match (counters_before, engine.counters()) {
        (Some(before), Some(after)) => Some(before.delta(after)),
        _ => None,
    };
    Ok(Sample {
        records,
        payload_bytes: records * size as u64,
        wall,
        cpu,
        latency: Percentiles::of(&mut latencies),
        counters,
        relayed,
        device_bytes: None,
        steal,
    })
}

/// One producer appending `count` records of `size` bytes to `engine`, each
/// waiting for durability, sleeping `pace` before each: the appends of a
/// service that writes one record per request it serves, with the engine
/// idle in between. Latency is per append; the wall time includes the
/// pauses.
pub fn paced(engine: &dyn Engine, size: usize, count: u64, pace: Duration) -> Result<Sample> {
    let mut record = payload(size, 1);
    let mut latencies = Vec::with_capacity(count as usize);
    let counters_before = engine.counters();
    let t0 = Instant::now();
    let cpu0 = cpu_time();
    let ticks0 = CpuTicks::now();
    for i in 0..count {
        if !pace.is_zero() {
            std::thread::sleep(pace);
        }
        let stamp = i.to_le_bytes();
        let n = stamp.len().min(size);
        record[..n].copy_from_slice(&stamp[..n]);
        let t = Instant::now();
        engine.append(&record)?;
        latencies.push(t.elapsed().as_nanos() as u64);
    }
    let wall = t0.elapsed();
    let cpu = cpu_time().saturating_sub(cpu0);
    let steal = CpuTicks::stolen_share(ticks0, CpuTicks::now());
    let counters = match (counters_before, engine.counters()) {
        (Some(before), Some(after)) => Some(before.delta(after)),
        _ => None,
    };
    Ok(Sample {
        records: count,
        payload_bytes: count * size as u64,
        wall,
        cpu,
        latency: Percentiles::of(&mut latencies),
        counters,
        relayed: None,
        device_bytes: None,
        steal,
    })
}

/// Fills `queue` with `count` records of `size` bytes (not timed), then times
/// one relay draining them all in batches of `batch` (claim, read, acknowledge).
pub fn drain(queue: &dyn Queue, count: u64, size: usize, batch: usize) -> Result<Sample> {
    queue.fill(&payload(size, 7), count)?;
    let mut latencies = Vec::with_capacity((count as usize).div_ceil(batch));
    let mut drained = 0u64;
    let t0 = Instant::now();
    let cpu0 = cpu_time();
    let ticks0 = CpuTicks::now();
    while drained < count {
        let t = Instant::now();
        let n = queue.drain(batch)?;
        latencies.push(t.elapsed().as_nanos() as u64);
        if n == 0 {
            return Err(format!("drain found nothing after {drained} of {count} records").into());
        }
        drained += n as u64;
    }
    let wall = t0.elapsed();
    let cpu = cpu_time().saturating_sub(cpu0);
    let steal = CpuTicks::stolen_share(ticks0, CpuTicks::now());
    if queue.drain(batch)? != 0 {
        return Err(format!("drain found more than the {count} records filled").into());
    }
    Ok(Sample {
        records: drained,
        payload_bytes: drained * size as u64,
        wall,
        cpu,
        latency: Percentiles::of(&mut latencies),
        counters: None,
        relayed: None,
        device_bytes: None,
        steal,
    })
}
