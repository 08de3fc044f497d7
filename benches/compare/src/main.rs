//! `compare`: runs the same durable-append and drain workloads, in one process
//! and side by side, on segwal, the raw limit of its design, SQLite, fjall and
//! okaywal, and writes a markdown table, JSON lines, SVG charts and a note on
//! the machine. See README.md beside Cargo.toml.

mod asyncs;
mod engines;
mod measure;
mod nats;
mod open;
mod report;
mod workload;

use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::Parser;
use engines::{Kind, Result};
use measure::{FileKind, SyncProbe};
use workload::{Sample, Stop};

/// Producer thread counts of the append workload.
const PRODUCERS: [usize; 4] = [1, 4, 16, 64];
/// Record sizes of both workloads.
const RECORD_BYTES: [usize; 2] = [256, 4096];
/// Records per claim and acknowledgement in the drain.
const DRAIN_BATCH: usize = 256;
/// Record size of the end-to-end workload, unless `--relay-bytes` says.
const RELAY_BYTES: usize = 256;

/// How big the run is.
#[derive(Clone, Debug)]
struct Plan {
    quick: bool,
    /// Time a timed cell should take.
    target: Duration,
    /// Warm-up and calibration before each append cell.
    probe: Duration,
    /// Fewest records in a timed append cell, whatever the calibration says.
    min_records: u64,
    /// Payload bytes drained in the calibration of a drain cell.
    drain_probe_bytes: u64,
    /// Most payload bytes filled for a timed drain cell.
    drain_max_bytes: u64,
    /// Rounds of each `fdatasync` probe.
    fsync_iterations: usize,
    /// The engines to run.
    engines: Vec<Kind>,
    /// The producer counts to run.
    producers: Vec<usize>,
    /// Record size of the end-to-end workload.
    relay_bytes: usize,
    /// Times each append cell is run, the engines taking turns; the median
    /// round is reported.
    rounds: usize,
    /// Appends timed in a paced cell (one producer pausing [`PACE`] before
    /// each).
    paced_records: u64,
}

impl Plan {
    fn full() -> Plan {
        Plan {
            quick: false,
            target: Duration::from_secs(2),
            probe: Duration::from_millis(300),
            min_records: 500,
            drain_probe_bytes: 8 << 20,
            drain_max_bytes: 256 << 20,
            fsync_iterations: 500,
            engines: Kind::DEFAULT.to_vec(),
            producers: PRODUCERS.to_vec(),
            relay_bytes: RELAY_BYTES,
            rounds: 3,
            paced_records: 1000,
        }
    }

    /// Tiny sizes: proves the harness builds and runs, measures nothing.
    fn quick() -> Plan {
        Plan {
            quick: true,
            target: Duration::from_millis(40),
            probe: Duration::from_millis(20),
            min_records: 16,
            drain_probe_bytes: 256 << 10,
            drain_max_bytes: 1 << 20,
            fsync_iterations: 20,
            engines: Kind::DEFAULT.to_vec(),
            producers: PRODUCERS.to_vec(),
            relay_bytes: RELAY_BYTES,
            rounds: 1,
            paced_records: 10,
        }
    }
}

/// Which workload a cell ran.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Workload {
    Append,
    Drain,
    /// Appends while one relay drains: the end-to-end workload.
    AppendWithRelay,
    /// One producer pausing [`PACE`] before each append, as an outbox's
    /// producer that appends once per request it serves.
    Paced,
}

/// The pause before each append of a paced cell.
pub const PACE: Duration = Duration::from_millis(1);

/// Appends made before a paced cell's timed ones, not timed.
const PACED_WARMUP: u64 = 20;

/// One engine, one workload, one producer count, one record size.
#[derive(Clone, Debug)]
pub struct Cell {
    pub workload: Workload,
    pub engine: Kind,
    /// Producer threads; 1 (the relay) for a drain.
    pub producers: usize,
    pub record_bytes: usize,
    /// The median round (by records/s).
    pub sample: Sample,
    /// The raw limit's records/s in the same producers and size, same run
    /// (its median round).
    pub raw_records_per_s: Option<f64>,
    /// Records/s of every round, in the order they ran.
    pub rounds: Vec<f64>,
    /// The same engine's append-only records/s in the same producers and
    /// size, same run (the end-to-end workload only).
    pub append_only_per_s: Option<f64>,
}

impl Cell {
    pub fn ratio_to_raw(&self) -> Option<f64> {
        self.raw_records_per_s
            .map(|raw| self.sample.records_per_s() / raw)
    }
}

/// Everything the report needs.
pub struct Run {
    pub quick: bool,
    pub tmp: PathBuf,
    pub mount: Option<measure::Mount>,
    pub probes: Vec<SyncProbe>,
    pub cells: Vec<Cell>,
    pub elapsed: Duration,
    pub started_unix: u64,
    /// The share of the machine's CPU time stolen by the hypervisor during
    /// the whole run, where the kernel tells.
    pub steal: Option<f64>,
    /// Most payload bytes filled for a timed drain.
    pub drain_max_bytes: u64,
    /// Rounds of each append cell.
    pub rounds: usize,
}

/// Runs the same durable-append and drain workloads, side by side, on segwal,
/// the raw limit of its design, SQLite, fjall and okaywal, and writes a
/// markdown table, JSON lines, SVG charts and a note on the machine.
#[derive(Parser, Debug)]
#[command(name = "compare")]
struct Args {
    /// tiny sizes: a smoke run that proves the harness builds and runs;
    /// writes to a temporary directory unless --out is given
    #[arg(long)]
    quick: bool,
    /// where results go (default: docs/bench of this repository)
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// where the engines' fresh directories go (default: the system
    /// temporary directory); its file system is reported
    #[arg(long, value_name = "DIR")]
    tmp: Option<PathBuf>,
    /// only the engines named (comma-separated, e.g. segwal,raw limit),
    /// skipping the drain unless an engine with a queue is named; for
    /// profiling one engine, not for results
    #[arg(long, value_name = "LIST", value_delimiter = ',', value_parser = engine_name)]
    only: Vec<String>,
    /// only these producer counts (comma-separated)
    #[arg(long, value_name = "LIST", value_delimiter = ',', value_parser = producer_count)]
    producers: Vec<usize>,
    /// run each append cell N times, the engines taking turns, and report
    /// the median round (default 3; 1 with --quick)
    #[arg(long, value_name = "N")]
    rounds: Option<NonZeroUsize>,
    /// record size of the end-to-end workload (appends while a relay
    /// drains): 256 (the default) or 4096
    #[arg(long, value_name = "BYTES", value_parser = relay_size)]
    relay_bytes: Option<usize>,
    /// only the relay workload: append to JetStream PubAck through segwal's
    /// relay, against append-only and the server's own pipelined publish
    /// rate (needs a JetStream server at URL)
    #[arg(long, value_name = "URL")]
    nats: Option<String>,
    /// only the async workload: durable appends from tasks on a tokio
    /// runtime (append_async) against as many threads (append)
    #[arg(long = "async")]
    asyncs: bool,
    /// only the open workload: `Outbox::open` of a million pending records
    /// after a crash, the page cache dropped (needs root) and not, taking
    /// turns (default 5 rounds of each; 1 with --quick, which does not drop
    /// the page cache)
    #[arg(long)]
    open: bool,
    /// with --open: the child fills the log as a lone producer does, one
    /// record per durable `append` from one thread (one sync group, so one
    /// block, a record), instead of batches of 64 from two threads
    #[arg(long, requires = "open")]
    open_alone: bool,
    /// (internal) fill DIR with --fill-records pending records in this
    /// process and exit without closing: the open workload's child
    #[arg(long, value_name = "DIR", hide = true)]
    fill_crashed: Option<PathBuf>,
    /// (internal) records the child of --fill-crashed appends
    #[arg(long, value_name = "N", hide = true, default_value_t = 0)]
    fill_records: u64,
    /// (internal) the child of --fill-crashed appends as a lone producer
    #[arg(long, hide = true)]
    fill_alone: bool,
}

/// One name of `--only`: an engine's name as the tables write it.
fn engine_name(name: &str) -> std::result::Result<String, String> {
    let name = name.trim();
    match Kind::ALL.iter().find(|k| k.name() == name) {
        Some(kind) => Ok(kind.name().to_string()),
        None => {
            let names: Vec<&str> = Kind::ALL.iter().map(|k| k.name()).collect();
            Err(format!(
                "no engine named {name:?}; the engines: {}",
                names.join(", ")
            ))
        }
    }
}

/// The size of `--relay-bytes`: one of [`RECORD_BYTES`], whose append-only
/// cell the run measures too.
fn relay_size(n: &str) -> std::result::Result<usize, String> {
    match n.trim().parse::<usize>() {
        Ok(n) if RECORD_BYTES.contains(&n) => Ok(n),
        _ => Err(format!("record sizes are among {RECORD_BYTES:?}")),
    }
}

/// One count of `--producers`: one of [`PRODUCERS`].
fn producer_count(n: &str) -> std::result::Result<usize, String> {
    match n.trim().parse::<usize>() {
        Ok(n) if PRODUCERS.contains(&n) => Ok(n),
        _ => Err(format!("producers must be among {PRODUCERS:?}")),
    }
}

fn main() {
    // A bad argument prints clap's message and exits with status 2.
    let args = Args::parse();
    if let Err(e) = run(args) {
        eprintln!("compare: {e}");
        std::process::exit(1);
    }
}

fn run(args: Args) -> Result<()> {
    if let Some(dir) = &args.fill_crashed {
        open::fill_crashed(dir, args.fill_records, args.fill_alone);
    }
    // The workloads of their own: rounds as asked, else one under --quick
    // and `full` otherwise.
    let rounds = |full: usize| {
        args.rounds
            .map_or(if args.quick { 1 } else { full }, NonZeroUsize::get)
    };
    let tmp = || args.tmp.clone().unwrap_or_else(std::env::temp_dir);
    let out = args.out.as_deref();
    if args.open {
        return open::run(args.quick, args.open_alone, rounds(5), &tmp(), out);
    }
    if let Some(url) = &args.nats {
        return nats::run(url, args.quick, rounds(3), &tmp(), out);
    }
    if args.asyncs {
        return asyncs::run(args.quick, rounds(3), &tmp(), out);
    }
    let mut plan = if args.quick {
        Plan::quick()
    } else {
        Plan::full()
    };
    if !args.only.is_empty() {
        plan.engines = Kind::ALL
            .into_iter()
            .filter(|k| args.only.iter().any(|name| name == k.name()))
            .collect();
    }
    if !args.producers.is_empty() {
        plan.producers.retain(|p| args.producers.contains(p));
    }
    if let Some(rounds) = args.rounds {
        plan.rounds = rounds.get();
    }
    if let Some(bytes) = args.relay_bytes {
        plan.relay_bytes = bytes;
    }
    let out = match args.out {
        Some(out) => out,
        // A smoke run never overwrites the committed results.
        None if plan.quick => std::env::temp_dir().join("segwal-compare-quick"),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/bench"),
    };
    let tmp_base = args.tmp.unwrap_or_else(std::env::temp_dir);
    let tmp = tmp_base.join(format!("segwal-compare-{}", std::process::id()));
    std::fs::create_dir_all(&tmp)?;
    std::fs::create_dir_all(&out)?;
    let outcome = run_in(&plan, &tmp, &out);
    let _ = std::fs::remove_dir_all(&tmp);
    outcome
}

fn run_in(plan: &Plan, tmp: &Path, out: &Path) -> Result<()> {
    let started = Instant::now();
    let ticks0 = measure::CpuTicks::now();
    let started_unix = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let mount = measure::mount_of(tmp);
    eprintln!(
        "engine directories under {} ({})",
        tmp.display(),
        mount
            .as_ref()
            .map(|m| format!("{} on {}", m.fs_type, m.point))
            .unwrap_or_else(|| "file system unknown".into())
    );

    let mut probes = Vec::new();
    for kind in FileKind::ALL {
        let probe = measure::probe_fdatasync(tmp, kind, 4096, plan.fsync_iterations)?;
        eprintln!(
            "fdatasync, {}: p50 {:.0} µs, p99 {:.0} µs",
            kind.describe(),
            probe.fdatasync.p50_us,
            probe.fdatasync.p99_us
        );
        probes.push(probe);
    }

    let mut cells = Vec::new();
    for &size in &RECORD_BYTES {
        for &producers in &plan.producers {
            // The engines take turns, round after round, so that a slow spell of
            // a shared machine falls on all of them.
            let mut samples: Vec<Vec<Sample>> = vec![Vec::new(); plan.engines.len()];
            for round in 0..plan.rounds {
                for (i, &kind) in plan.engines.iter().enumerate() {
                    let sample = append_cell(plan, tmp, kind, producers, size, round, false)?;
                    progress_round(kind, producers, size, round, plan.rounds, &sample);
                    samples[i].push(sample);
                }
            }
            let mut raw = None;
            for (&kind, samples) in plan.engines.iter().zip(samples) {
                let rounds: Vec<f64> = samples.iter().map(Sample::records_per_s).collect();
                let sample = median_round(samples);
                if kind == Kind::Raw {
                    raw = Some(sample.records_per_s());
                }
                let cell = Cell {
                    workload: Workload::Append,
                    engine: kind,
                    producers,
                    record_bytes: size,
                    raw_records_per_s: raw,
                    sample,
                    rounds,
                    append_only_per_s: None,
                };
                progress(&cell);
                cells.push(cell);
            }
        }
    }
    // One producer that pauses before each append: the engines take turns,
    // and the round with the median p50 is reported.
    for &size in &RECORD_BYTES {
        let mut samples: Vec<Vec<Sample>> = vec![Vec::new(); plan.engines.len()];
        for round in 0..plan.rounds {
            for (i, &kind) in plan.engines.iter().enumerate() {
                samples[i].push(paced_cell(plan, tmp, kind, size, round)?);
            }
        }
        for (&kind, mut samples) in plan.engines.iter().zip(samples) {
            samples.sort_by(|a, b| a.latency.p50_us.total_cmp(&b.latency.p50_us));
            let rounds: Vec<f64> = samples.iter().map(|s| s.latency.p50_us).collect();
            let cell = Cell {
                workload: Workload::Paced,
                engine: kind,
                producers: 1,
                record_bytes: size,
                sample: samples.swap_remove((samples.len() - 1) / 2),
                raw_records_per_s: None,
                rounds,
                append_only_per_s: None,
            };
            progress(&cell);
            cells.push(cell);
        }
    }
    // The end-to-end workload (256 B unless `--relay-bytes` says), each engine with a queue, appends while
    // one relay drains, against the same engine's append-only cell above.
    for &producers in &plan.producers {
        for &kind in plan.engines.iter().filter(|k| k.has_queue()) {
            let mut samples = Vec::new();
            for round in 0..plan.rounds {
                let sample =
                    append_cell(plan, tmp, kind, producers, plan.relay_bytes, round, true)?;
                progress_round(
                    kind,
                    producers,
                    plan.relay_bytes,
                    round,
                    plan.rounds,
                    &sample,
                );
                samples.push(sample);
            }
            let rounds: Vec<f64> = samples.iter().map(Sample::records_per_s).collect();
            let append_only_per_s = cells
                .iter()
                .find(|c| {
                    c.workload == Workload::Append
                        && c.engine == kind
                        && c.producers == producers
                        && c.record_bytes == plan.relay_bytes
                })
                .map(|c| c.sample.records_per_s());
            let cell = Cell {
                workload: Workload::AppendWithRelay,
                engine: kind,
                producers,
                record_bytes: plan.relay_bytes,
                sample: median_round(samples),
                raw_records_per_s: None,
                rounds,
                append_only_per_s,
            };
            progress(&cell);
            cells.push(cell);
        }
    }
    for &size in &RECORD_BYTES {
        for &kind in plan.engines.iter().filter(|k| k.has_queue()) {
            let cell = Cell {
                workload: Workload::Drain,
                engine: kind,
                producers: 1,
                record_bytes: size,
                sample: drain_cell(plan, tmp, kind, size)?,
                raw_records_per_s: None,
                rounds: Vec::new(),
                append_only_per_s: None,
            };
            progress(&cell);
            cells.push(cell);
        }
    }

    let run = Run {
        quick: plan.quick,
        tmp: tmp.to_path_buf(),
        mount,
        probes,
        cells,
        rounds: plan.rounds,
        elapsed: started.elapsed(),
        started_unix,
        steal: measure::CpuTicks::stolen_share(ticks0, measure::CpuTicks::now()),
        drain_max_bytes: plan.drain_max_bytes,
    };
    report::write_all(&run, out)?;
    eprintln!(
        "done in {:.0} s; results in {}",
        run.elapsed.as_secs_f64(),
        out.display()
    );
    Ok(())
}

/// The round with the median records/s (the lower of the two middle ones when
/// the count is even). `samples` is never empty: there is at least one round.
fn median_round(mut samples: Vec<Sample>) -> Sample {
    samples.sort_by(|a, b| a.records_per_s().total_cmp(&b.records_per_s()));
    samples.swap_remove((samples.len() - 1) / 2)
}

fn progress_round(
    kind: Kind,
    producers: usize,
    size: usize,
    round: usize,
    rounds: usize,
    s: &Sample,
) {
    if rounds > 1 {
        eprintln!(
            "  round {}/{rounds} {:>13} {:>2}p {:>4} B: {:>9.0} records/s{}",
            round + 1,
            kind.name(),
            producers,
            size,
            s.records_per_s(),
            s.steal
                .map(|share| format!(", steal {:.1} %", share * 100.0))
                .unwrap_or_default(),
        );
    }
}

/// A fresh, empty directory for one cell.
fn cell_dir(tmp: &Path, kind: Kind, what: &str) -> Result<PathBuf> {
    let slug: String = kind
        .name()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    let dir = tmp.join(format!("{slug}-{what}"));
    std::fs::create_dir(&dir)?;
    Ok(dir)
}

/// Opens `kind` on a fresh directory, warms it up while measuring its rate,
/// then times a fixed number of appends sized to take about `plan.target`;
/// with `relayed`, one relay drains the engine in batches of [`DRAIN_BATCH`]
/// during both (the end-to-end workload).
fn append_cell(
    plan: &Plan,
    tmp: &Path,
    kind: Kind,
    producers: usize,
    size: usize,
    round: usize,
    relayed: bool,
) -> Result<Sample> {
    let what = if relayed { "relay" } else { "append" };
    let dir = cell_dir(tmp, kind, &format!("{what}-{producers}p-{size}B-{round}"))?;
    let engine = kind.open(&dir)?;
    let relay = match relayed {
        true => Some((engine.queue().ok_or("engine has no queue")?, DRAIN_BATCH)),
        false => None,
    };
    let run = |stop| workload::append(&*engine, relay, producers, size, stop);
    let probe = run(Stop::After(plan.probe))?;
    let total = (probe.records_per_s() * plan.target.as_secs_f64()).max(plan.min_records as f64);
    let per_producer = (total / producers as f64).ceil() as u64;
    let device = measure::mount_of(&dir).map(|m| m.device);
    let written = || device.as_deref().and_then(measure::device_written_bytes);
    let before = written();
    let mut sample = run(Stop::PerProducer(per_producer))?;
    sample.device_bytes = before.zip(written()).map(|(a, b)| b.saturating_sub(a));
    engine.close()?;
    std::fs::remove_dir_all(&dir)?;
    Ok(sample)
}

/// Opens `kind` on a fresh directory, makes [`PACED_WARMUP`] appends, then
/// times `plan.paced_records` appends of one producer pausing [`PACE`]
/// before each.
fn paced_cell(plan: &Plan, tmp: &Path, kind: Kind, size: usize, round: usize) -> Result<Sample> {
    let dir = cell_dir(tmp, kind, &format!("paced-{size}B-{round}"))?;
    let engine = kind.open(&dir)?;
    workload::paced(&*engine, size, PACED_WARMUP, Duration::ZERO)?;
    let sample = workload::paced(&*engine, size, plan.paced_records, PACE)?;
    engine.close()?;
    std::fs::remove_dir_all(&dir)?;
    Ok(sample)
}

/// Opens `kind` on a fresh directory, drains a small fill to measure its rate,
/// then fills and times a drain sized to take about `plan.target`.
fn drain_cell(plan: &Plan, tmp: &Path, kind: Kind, size: usize) -> Result<Sample> {
    let dir = cell_dir(tmp, kind, &format!("drain-{size}B"))?;
    let engine = kind.open(&dir)?;
    let queue = engine.queue().ok_or("engine has no queue")?;
    let probe_count = (plan.drain_probe_bytes / size as u64).max(DRAIN_BATCH as u64);
    let probe = workload::drain(queue, probe_count, size, DRAIN_BATCH)?;
    let max = (plan.drain_max_bytes / size as u64).max(DRAIN_BATCH as u64);
    let count = ((probe.records_per_s() * plan.target.as_secs_f64()) as u64)
        .clamp(plan.min_records.max(DRAIN_BATCH as u64), max);
    let sample = workload::drain(queue, count, size, DRAIN_BATCH)?;
    engine.close()?;
    std::fs::remove_dir_all(&dir)?;
    Ok(sample)
}

fn progress(cell: &Cell) {
    let s = &cell.sample;
    let per_fsync = s
        .counters
        .filter(|c| c.fsyncs > 0)
        .map(|c| {
            format!(
                ", {:.1} records/batch, {:.1} records/fsync",
                c.records as f64 / c.batches.max(1) as f64,
                c.records as f64 / c.fsyncs as f64
            )
        })
        .unwrap_or_default();
    eprintln!(
        "{:?} {:>13} {:>2}p {:>4} B: {:>9.0} records/s in {:.2} s, p50 {:.0} µs, p99 {:.0} µs, {:.1} CPU µs/record{}{}{}{}{}",
        cell.workload,
        cell.engine.name(),
        cell.producers,
        cell.record_bytes,
        s.records_per_s(),
        s.wall.as_secs_f64(),
        s.latency.p50_us,
        s.latency.p99_us,
        s.cpu_us_per_record(),
        cell.ratio_to_raw()
            .map(|r| format!(", {r:.2} of raw"))
            .unwrap_or_default(),
        match (s.relayed_per_s(), cell.append_only_per_s) {
            (Some(acks), Some(alone)) => format!(
                ", {acks:.0} acks/s, {:.2} of append-only",
                s.records_per_s() / alone
            ),
            (Some(acks), None) => format!(", {acks:.0} acks/s"),
            _ => String::new(),
        },
        per_fsync,
        s.device_bytes_per_record()
            .map(|b| format!(", {:.2} device KiB/record", b / 1024.0))
            .unwrap_or_default(),
        s.steal
            .map(|share| format!(", steal {:.1} %", share * 100.0))
            .unwrap_or_default(),
    );
}
