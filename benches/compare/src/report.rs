//! The outputs: results.md (tables), results.jsonl (one object per cell),
//! throughput-256B.svg and throughput-4KiB.svg (charts), machine.md.

use std::fmt::Write as _;
use std::path::Path;

use serde::Serialize;

use crate::engines::{Kind, Result};
use crate::{Cell, DRAIN_BATCH, PRODUCERS, RECORD_BYTES, Run, Workload};

pub fn write_all(run: &Run, out: &Path) -> Result<()> {
    std::fs::write(out.join("results.md"), results_md(run))?;
    std::fs::write(out.join("results.jsonl"), results_jsonl(run)?)?;
    for &size in &RECORD_BYTES {
        let name = format!("throughput-{}.svg", size_label(size).replace(' ', ""));
        std::fs::write(out.join(name), chart_svg(run, size))?;
    }
    std::fs::write(out.join("machine.md"), machine_md(run))?;
    Ok(())
}

fn size_label(bytes: usize) -> String {
    if bytes >= 1024 && bytes.is_multiple_of(1024) {
        format!("{} KiB", bytes / 1024)
    } else {
        format!("{bytes} B")
    }
}

/// `1234567.8` as `1,234,568`.
fn grouped(x: f64) -> String {
    let digits = format!("{:.0}", x.max(0.0));
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Microseconds with a precision that suits their size.
fn micros(us: f64) -> String {
    if us < 10.0 {
        format!("{us:.1}")
    } else {
        grouped(us)
    }
}

fn engine_label(kind: Kind) -> String {
    if kind.durable() {
        kind.name().to_string()
    } else {
        format!("{} (not durable)", kind.name())
    }
}

/// `unix` seconds as `YYYY-MM-DD HH:MM UTC`.
fn date_utc(unix: u64) -> String {
    let time = std::time::UNIX_EPOCH + std::time::Duration::from_secs(unix);
    // RFC 3339 in seconds: `YYYY-MM-DDTHH:MM:SSZ`.
    let rfc3339 = humantime::format_rfc3339_seconds(time).to_string();
    format!("{} {} UTC", &rfc3339[..10], &rfc3339[11..16])
}

fn table_row(out: &mut String, cell: &Cell) {
    let s = &cell.sample;
    let ratio = cell
        .ratio_to_raw()
        .map(|r| format!("{r:.2}"))
        .unwrap_or_else(|| "–".into());
    let per_fsync = s
        .counters
        .filter(|c| c.fsyncs > 0)
        .map(|c| format!("{:.1}", c.records as f64 / c.fsyncs as f64))
        .unwrap_or_else(|| "–".into());
    let range = match (
        cell.rounds.iter().copied().reduce(f64::min),
        cell.rounds.iter().copied().reduce(f64::max),
    ) {
        (Some(lo), Some(hi)) if cell.rounds.len() > 1 => format!("{}–{}", grouped(lo), grouped(hi)),
        _ => "–".into(),
    };
    let _ = writeln!(
        out,
        "| {} | {} | {} | {} | {} | {:.1} | {} | {} | {} | {:.1} | {} | {} | {} |",
        engine_label(cell.engine),
        cell.producers,
        size_label(cell.record_bytes),
        grouped(s.records_per_s()),
        range,
        s.mb_per_s(),
        micros(s.latency.p50_us),
        micros(s.latency.p99_us),
        micros(s.latency.p999_us),
        s.cpu_us_per_record(),
        ratio,
        per_fsync,
        steal_pct(s.steal),
    );
}

/// A share of CPU time stolen, as a percentage for a table; a dash where the
/// kernel does not tell.
fn steal_pct(share: Option<f64>) -> String {
    share.map_or_else(|| "–".into(), |s| format!("{:.1}", s * 100.0))
}

const TABLE_HEAD: &str = "| engine | producers | record size | records/s | rounds' range | MB/s | p50 µs | p99 µs | p99.9 µs | CPU µs/record | ratio to raw | records/fsync | steal % |\n|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n";

fn results_md(run: &Run) -> String {
    let mut out = String::new();
    let fs = run
        .mount
        .as_ref()
        .map(|m| format!("{} ({})", m.fs_type, m.device))
        .unwrap_or_else(|| "an unknown file system".into());
    let _ = writeln!(out, "# segwal compared: durable append and drain\n");
    if run.quick {
        let _ = writeln!(
            out,
            "**A `--quick` smoke run: tiny sizes, the figures mean nothing.**\n"
        );
    }
    let _ = writeln!(
        out,
        "Measured {} by `benches/compare` in one process, {:.0} s in all, on {}; \
         the machine and its `fdatasync` latency are in [machine.md](machine.md). \
         Every cell opens its engine on a fresh directory, warms it up while \
         measuring its rate, then times a fixed number of records sized to take \
         about two seconds. Records do not compress. Each append cell ran {} \
         time(s), the engines taking turns; a row is the median round.\n",
        date_utc(run.started_unix),
        run.elapsed.as_secs_f64(),
        fs,
        run.rounds,
    );
    let _ = writeln!(
        out,
        "- **records/s, MB/s**: records (payload bytes) made durable per second of \
         wall time, all producers together, in the median round; **rounds' range**: \
         the slowest and the fastest round.\n\
         - **p50, p99, p99.9**: latency of one `append` (durable on return), or of \
         one drain batch.\n\
         - **CPU µs/record**: user plus system CPU time of the whole process \
         (`getrusage`, every thread) during the timed part, per record.\n\
         - **ratio to raw**: records/s over those of the raw limit with the same \
         producers and record size, median round over median round, in the same run.\n\
         - **records/fsync**: records per `fdatasync`, for the engines that count \
         them (segwal's count includes segment headers and directories).\n\
         - **steal %**: the share of the machine's CPU time (all its processors, \
         from /proc/stat) that the hypervisor gave to other guests during the \
         timed part: on a shared virtual machine, a cell with more than a few \
         percent measured the host's load as much as the engine.\n\
         - **raw limit**: producers queue their payload for one writer thread that \
         takes everything queued, writes it with one `pwrite` into a file \
         preallocated with `fallocate`, calls `fdatasync` once and wakes that \
         batch: no framing, no checksum, no state. What the disk allows this design.\n\
         - **raw (growing file)**: the same writer appending to a file that grows \
         with every write, as segwal's segments did before they were preallocated: \
         not a limit, a diagnostic of what file growth costs each `fdatasync`.\n\
         - **raw (overwrite)**: the same writer overwriting, round and round, a \
         64 MiB region written with zeros and synced at open, as an engine that \
         recycles zero-filled files does (okaywal; SQLite reuses its WAL file \
         after a checkpoint): each `fdatasync` carries data only. A diagnostic \
         too; on ext4 it is the faster one, see machine.md. segwal gets most of \
         the way there by writing zeros ahead of its frames into its \
         preallocated segment, so that most batches overwrite blocks in place.\n\
         - **sqlite FULL / NORMAL**: an outbox table in WAL mode, one transaction \
         per append, one shared connection. Under `synchronous=NORMAL` a commit is \
         not fsynced: it survives a process crash, **not a power loss**.\n\
         - **fjall**: insert under a big-endian u64 key, then \
         `persist(PersistMode::SyncData)`. **okaywal**: one entry of one chunk, \
         committed; its checkpoints go to `LogVoid`, which drops the entries, \
         so it writes round and round into two 1 MiB files zero-filled once \
         (what it holds after 20,000 appends of 4 KiB: 2 MiB), where segwal \
         keeps every record until it is acknowledged and, in these append-only \
         cells, writes each into new space.\n"
    );
    for &size in &RECORD_BYTES {
        let _ = writeln!(out, "## Durable append, {} records\n", size_label(size));
        let _ = writeln!(
            out,
            "![throughput against producers, {}](throughput-{}.svg)\n",
            size_label(size),
            size_label(size).replace(' ', "")
        );
        out.push_str(TABLE_HEAD);
        for cell in run
            .cells
            .iter()
            .filter(|c| c.workload == Workload::Append && c.record_bytes == size)
        {
            table_row(&mut out, cell);
        }
        out.push('\n');
    }
    let _ = writeln!(
        out,
        "## Drain: claim and acknowledge in batches of {DRAIN_BATCH}, one relay\n"
    );
    let _ = writeln!(
        out,
        "The queue is filled first (not timed), then one thread takes the oldest \
         {DRAIN_BATCH} records, reads their payloads and acknowledges them, until \
         it is empty; latency is per batch. Not like for like: segwal writes \
         acknowledgements to its log buffered (durable with its next group commit, \
         within its buffered sync interval), while SQLite deletes the rows in a \
         committed transaction (fsynced under FULL). A drain fills at most {} MiB \
         of payload, so the fastest cells take less than the two seconds aimed at.\n",
        run.drain_max_bytes >> 20
    );
    out.push_str(TABLE_HEAD);
    for cell in run.cells.iter().filter(|c| c.workload == Workload::Drain) {
        table_row(&mut out, cell);
    }
    out.push('\n');
    let _ = writeln!(
        out,
        "## One producer appending now and then: a {} ms pause before each append\n",
        crate::PACE.as_millis()
    );
    let _ = writeln!(
        out,
        "One producer sleeps {} ms, then appends one record and waits for it to be \
         durable, {} times after a few appends not timed: an outbox's producer that \
         appends once per request it serves, the engine idle in between. Latency \
         per append; the round with the median p50 (p50 of every round in brackets).\n",
        crate::PACE.as_millis(),
        run.cells
            .iter()
            .find(|c| c.workload == Workload::Paced)
            .map_or(0, |c| c.sample.records)
    );
    out.push_str(
        "| engine | record size | p50 µs | p99 µs | p99.9 µs | mean µs | CPU µs/record | rounds' p50 µs |\n\
         |---|--:|--:|--:|--:|--:|--:|--:|\n",
    );
    for cell in run.cells.iter().filter(|c| c.workload == Workload::Paced) {
        let s = &cell.sample;
        let rounds: Vec<String> = cell.rounds.iter().map(|r| format!("{r:.0}")).collect();
        let _ = writeln!(
            out,
            "| {} | {} | {:.0} | {:.0} | {:.0} | {:.0} | {:.1} | {} |",
            cell.engine.name(),
            size_label(cell.record_bytes),
            s.latency.p50_us,
            s.latency.p99_us,
            s.latency.p999_us,
            s.latency.mean_us,
            s.cpu_us_per_record(),
            rounds.join(" / "),
        );
    }
    out.push('\n');
    let _ = writeln!(
        out,
        "## End to end: durable appends while one relay drains, 256 B\n"
    );
    let _ = writeln!(
        out,
        "The producers append durably, one record at a time, while one relay \
         thread claims the oldest {DRAIN_BATCH} records, reads them and \
         acknowledges them, for the whole timed run (default settings: segwal's \
         acknowledgements are durable, buffered into its next group commit). \
         With nothing pending the relay waits the engine's way: segwal's in \
         `claim_wait` (up to 1 ms), SQLite's in a nap of 100 µs. \
         Appends/s against the same engine's append-only cell of this run.\n"
    );
    out.push_str(
        "| engine | producers | appends/s | acks/s | append-only appends/s | ratio | p50 µs | p99 µs |\n\
         |---|--:|--:|--:|--:|--:|--:|--:|\n",
    );
    for cell in run
        .cells
        .iter()
        .filter(|c| c.workload == Workload::AppendWithRelay)
    {
        let s = &cell.sample;
        let _ = writeln!(
            out,
            "| {} | {} | {:.0} | {} | {} | {} | {:.0} | {:.0} |",
            cell.engine.name(),
            cell.producers,
            s.records_per_s(),
            s.relayed_per_s()
                .map(|a| format!("{a:.0}"))
                .unwrap_or_default(),
            cell.append_only_per_s
                .map(|a| format!("{a:.0}"))
                .unwrap_or_default(),
            cell.append_only_per_s
                .map(|a| format!("{:.2}", s.records_per_s() / a))
                .unwrap_or_default(),
            s.latency.p50_us,
            s.latency.p99_us,
        );
    }
    out
}

/// A figure rounded to 3 decimals, or `None` (JSON `null`) when it is not
/// finite.
fn rounded(x: f64) -> Option<f64> {
    x.is_finite().then(|| (x * 1000.0).round() / 1000.0)
}

/// One line of results.jsonl: a cell. The keys are written in the order of
/// the fields.
#[derive(Serialize)]
struct JsonLine {
    workload: &'static str,
    engine: &'static str,
    durable: bool,
    producers: usize,
    record_bytes: usize,
    records: u64,
    wall_s: Option<f64>,
    records_per_s: Option<f64>,
    mb_per_s: Option<f64>,
    /// What a latency is of: one `append`, or one drain `batch`.
    latency_of: &'static str,
    p50_us: Option<f64>,
    p99_us: Option<f64>,
    p999_us: Option<f64>,
    mean_us: Option<f64>,
    cpu_us_per_record: Option<f64>,
    ratio_to_raw: Option<f64>,
    records_per_batch: Option<f64>,
    records_per_fsync: Option<f64>,
    rounds_records_per_s: Vec<Option<f64>>,
    /// The p50 of every round, in the order they ran (paced cells only).
    rounds_p50_us: Vec<Option<f64>>,
    relayed_per_s: Option<f64>,
    ratio_to_append_only: Option<f64>,
    /// Bytes the device wrote per record during the cell (the whole
    /// device's), where it tells.
    device_bytes_per_record: Option<f64>,
    /// The share of the machine's CPU time stolen by the hypervisor during
    /// the timed part, in percent, where the kernel tells.
    steal_pct: Option<f64>,
    quick: bool,
}

impl JsonLine {
    fn of(cell: &Cell, quick: bool) -> JsonLine {
        let s = &cell.sample;
        let per = |f: fn(&crate::engines::Counters) -> u64| {
            s.counters
                .filter(|c| f(c) > 0)
                .and_then(|c| rounded(c.records as f64 / f(&c) as f64))
        };
        JsonLine {
            workload: match cell.workload {
                Workload::Append => "append",
                Workload::Drain => "drain",
                Workload::AppendWithRelay => "append_with_relay",
                Workload::Paced => "paced",
            },
            engine: cell.engine.name(),
            durable: cell.engine.durable(),
            producers: cell.producers,
            record_bytes: cell.record_bytes,
            records: s.records,
            wall_s: rounded(s.wall.as_secs_f64()),
            records_per_s: rounded(s.records_per_s()),
            mb_per_s: rounded(s.mb_per_s()),
            latency_of: match cell.workload {
                Workload::Append | Workload::AppendWithRelay | Workload::Paced => "append",
                Workload::Drain => "batch",
            },
            p50_us: rounded(s.latency.p50_us),
            p99_us: rounded(s.latency.p99_us),
            p999_us: rounded(s.latency.p999_us),
            mean_us: rounded(s.latency.mean_us),
            cpu_us_per_record: rounded(s.cpu_us_per_record()),
            ratio_to_raw: cell.ratio_to_raw().and_then(rounded),
            records_per_batch: per(|c| c.batches),
            records_per_fsync: per(|c| c.fsyncs),
            rounds_records_per_s: match cell.workload {
                Workload::Paced => Vec::new(),
                _ => cell.rounds.iter().map(|&r| rounded(r)).collect(),
            },
            rounds_p50_us: match cell.workload {
                Workload::Paced => cell.rounds.iter().map(|&r| rounded(r)).collect(),
                _ => Vec::new(),
            },
            relayed_per_s: s.relayed_per_s().and_then(rounded),
            ratio_to_append_only: cell
                .append_only_per_s
                .and_then(|alone| rounded(s.records_per_s() / alone)),
            device_bytes_per_record: s.device_bytes_per_record().and_then(rounded),
            steal_pct: s.steal.and_then(|share| rounded(share * 100.0)),
            quick,
        }
    }
}

fn results_jsonl(run: &Run) -> Result<String> {
    let mut out = String::new();
    for cell in &run.cells {
        out.push_str(&serde_json::to_string(&JsonLine::of(cell, run.quick))?);
        out.push('\n');
    }
    Ok(out)
}

/// Colour and dash pattern of each engine's line.
fn style(kind: Kind) -> (&'static str, &'static str, f64) {
    match kind {
        Kind::Raw => ("#222222", "6 4", 2.0),
        Kind::RawGrowing => ("#999999", "6 4", 2.0),
        Kind::RawOverwrite => ("#c0392b", "6 4", 2.0),
        Kind::RawPipelined => ("#c0392b", "2 2", 2.0),
        Kind::SegwalLinger => ("#2980b9", "2 2", 2.0),
        Kind::SegwalSpin => ("#2980b9", "4 2", 2.0),
        Kind::SegwalHandoff => ("#2980b9", "1 2", 2.0),
        Kind::Segwal => ("#1f5fbf", "", 3.0),
        Kind::SegwalNewFiles => ("#1f5fbf", "8 2", 2.0),
        Kind::SegwalNoCheckpoints => ("#1f5fbf", "1 3", 2.0),
        Kind::SegwalDedup => ("#1f5fbf", "3 3", 2.0),
        Kind::SqliteFull => ("#d9730d", "", 2.0),
        Kind::SqliteNormal => ("#d9730d", "2 4", 2.0),
        Kind::Fjall => ("#2e8b3e", "", 2.0),
        Kind::Okaywal => ("#8a3ab9", "", 2.0),
    }
}

/// 1000 as `1k`, 1000000 as `1M`.
fn short(x: f64) -> String {
    if x >= 1e6 {
        format!("{}M", x / 1e6)
    } else if x >= 1e3 {
        format!("{}k", x / 1e3)
    } else {
        format!("{x}")
    }
}

/// Throughput against producers (log scale on both axes), a line per engine.
fn chart_svg(run: &Run, size: usize) -> String {
    let (w, h) = (760.0, 460.0);
    let (left, right, top, bottom) = (80.0, 210.0, 56.0, 64.0);
    let (pw, ph) = (w - left - right, h - top - bottom);
    let cells: Vec<&Cell> = run
        .cells
        .iter()
        .filter(|c| c.workload == Workload::Append && c.record_bytes == size)
        .collect();
    let rates: Vec<f64> = cells
        .iter()
        .map(|c| c.sample.records_per_s())
        .filter(|r| *r > 0.0)
        .collect();
    let lo = rates.iter().cloned().fold(f64::INFINITY, f64::min).max(1.0);
    let hi = rates.iter().cloned().fold(1.0, f64::max);
    let (y0, y1) = (
        lo.log10().floor(),
        hi.log10().ceil().max(lo.log10().floor() + 1.0),
    );
    let x_of = |producers: usize| {
        let i = PRODUCERS.iter().position(|&p| p == producers).unwrap_or(0) as f64;
        left + pw * i / (PRODUCERS.len() - 1) as f64
    };
    let y_of = |rate: f64| top + ph * (1.0 - (rate.max(1.0).log10() - y0) / (y1 - y0));

    let mut s = String::new();
    let _ = writeln!(
        s,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" \
         viewBox=\"0 0 {w} {h}\" font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\" \
         font-size=\"13\">"
    );
    let _ = writeln!(s, "<rect width=\"{w}\" height=\"{h}\" fill=\"white\"/>");
    let _ = writeln!(
        s,
        "<text x=\"{}\" y=\"26\" font-size=\"16\" font-weight=\"bold\" text-anchor=\"middle\">\
         Durable append, {} records: throughput against producers</text>",
        left + pw / 2.0,
        size_label(size)
    );
    if run.quick {
        let _ = writeln!(
            s,
            "<text x=\"{}\" y=\"44\" text-anchor=\"middle\" fill=\"#b00\">--quick smoke run: figures mean nothing</text>",
            left + pw / 2.0
        );
    }
    // Horizontal grid: 1, 2 and 5 times each power of ten, labelled at powers.
    let mut decade = y0 as i32;
    while decade <= y1 as i32 {
        for m in [1.0, 2.0, 5.0] {
            let v = m * 10f64.powi(decade);
            if v.log10() > y1 + 1e-9 {
                continue;
            }
            let y = y_of(v);
            let (stroke, width) = if m == 1.0 {
                ("#bbbbbb", 1.0)
            } else {
                ("#e6e6e6", 1.0)
            };
            let _ = writeln!(
                s,
                "<line x1=\"{left}\" y1=\"{y:.1}\" x2=\"{:.1}\" y2=\"{y:.1}\" stroke=\"{stroke}\" stroke-width=\"{width}\"/>",
                left + pw
            );
            let _ = writeln!(
                s,
                "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\" fill=\"{}\">{}</text>",
                left - 8.0,
                y + 4.0,
                if m == 1.0 { "#222" } else { "#888" },
                short(v)
            );
        }
        decade += 1;
    }
    // Vertical grid and x labels.
    for &p in &PRODUCERS {
        let x = x_of(p);
        let _ = writeln!(
            s,
            "<line x1=\"{x:.1}\" y1=\"{top}\" x2=\"{x:.1}\" y2=\"{:.1}\" stroke=\"#e6e6e6\"/>",
            top + ph
        );
        let _ = writeln!(
            s,
            "<text x=\"{x:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{p}</text>",
            top + ph + 20.0
        );
    }
    let _ = writeln!(
        s,
        "<rect x=\"{left}\" y=\"{top}\" width=\"{pw}\" height=\"{ph}\" fill=\"none\" stroke=\"#444\"/>"
    );
    let _ = writeln!(
        s,
        "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">producer threads (log scale)</text>",
        left + pw / 2.0,
        h - 18.0
    );
    let _ = writeln!(
        s,
        "<text transform=\"translate(20 {:.1}) rotate(-90)\" text-anchor=\"middle\">records/s (log scale)</text>",
        top + ph / 2.0
    );
    // A line and a legend entry per engine.
    let mut legend_y = top + 10.0;
    for kind in Kind::ALL {
        let (colour, dash, width) = style(kind);
        let points: Vec<(f64, f64)> = cells
            .iter()
            .filter(|c| c.engine == kind)
            .map(|c| (x_of(c.producers), y_of(c.sample.records_per_s())))
            .collect();
        let dash_attr = if dash.is_empty() {
            String::new()
        } else {
            format!(" stroke-dasharray=\"{dash}\"")
        };
        let path: Vec<String> = points
            .iter()
            .map(|(x, y)| format!("{x:.1},{y:.1}"))
            .collect();
        let _ = writeln!(
            s,
            "<polyline points=\"{}\" fill=\"none\" stroke=\"{colour}\" stroke-width=\"{width}\"{dash_attr}/>",
            path.join(" ")
        );
        for (x, y) in &points {
            let _ = writeln!(
                s,
                "<circle cx=\"{x:.1}\" cy=\"{y:.1}\" r=\"3.5\" fill=\"{colour}\"/>"
            );
        }
        let ly = legend_y;
        legend_y += if kind.durable() { 24.0 } else { 40.0 };
        let lx = left + pw + 16.0;
        let _ = writeln!(
            s,
            "<line x1=\"{lx:.1}\" y1=\"{ly:.1}\" x2=\"{:.1}\" y2=\"{ly:.1}\" stroke=\"{colour}\" stroke-width=\"{width}\"{dash_attr}/>",
            lx + 28.0
        );
        let _ = writeln!(
            s,
            "<circle cx=\"{:.1}\" cy=\"{ly:.1}\" r=\"3.5\" fill=\"{colour}\"/>",
            lx + 14.0
        );
        let _ = writeln!(
            s,
            "<text x=\"{:.1}\" y=\"{:.1}\">{}</text>",
            lx + 36.0,
            ly + 4.5,
            kind.name()
        );
        if !kind.durable() {
            let _ = writeln!(
                s,
                "<text x=\"{:.1}\" y=\"{:.1}\" fill=\"#b00\">not durable</text>",
                lx + 36.0,
                ly + 20.5
            );
        }
    }
    s.push_str("</svg>\n");
    s
}

/// `name = "=1.2.3"` and `name = { version = "=1.2.3", ... }` lines of this
/// crate's `[dependencies]`, as (name, version).
fn pinned_versions() -> Vec<(String, String)> {
    let manifest = include_str!("../Cargo.toml");
    let mut in_deps = false;
    let mut out = Vec::new();
    for line in manifest.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            in_deps = line == "[dependencies]";
            continue;
        }
        if !in_deps || line.starts_with('#') {
            continue;
        }
        let Some((name, rest)) = line.split_once('=') else {
            continue;
        };
        let version = match rest.split_once("\"=") {
            Some((_, v)) => v.split('"').next().unwrap_or("").to_string(),
            None if rest.contains("path") => "this repository's working tree".to_string(),
            None => rest.trim().to_string(),
        };
        out.push((name.trim().to_string(), version));
    }
    out
}

fn read_first_line(path: &str, key: &str) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    text.lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_string())
}

fn command_line(cmd: &str, args: &[&str]) -> Option<String> {
    let out = std::process::Command::new(cmd)
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Whether an ext4 device has a journal: the kernel lists each jbd2 journal in
/// /proc/fs/jbd2 as `<device>-<inode>`. Without one, `fdatasync` writes the
/// inode's metadata blocks itself instead of committing a journal transaction.
fn ext4_journal(device: &str) -> String {
    let name = device.rsplit('/').next().unwrap_or(device);
    let journals: Vec<String> = std::fs::read_dir("/proc/fs/jbd2")
        .map(|dir| {
            dir.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    if journals.iter().any(|j| j.starts_with(&format!("{name}-"))) {
        "yes (jbd2)".into()
    } else {
        format!("none: /proc/fs/jbd2 lists no journal for {name}")
    }
}

fn machine_md(run: &Run) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "# The machine of the comparison run\n");
    if run.quick {
        let _ = writeln!(
            out,
            "**A `--quick` smoke run: the figures mean nothing.**\n"
        );
    }
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let model = read_first_line("/proc/cpuinfo", "model name").unwrap_or_else(|| "unknown".into());
    let memory = read_first_line("/proc/meminfo", "MemTotal")
        .and_then(|m| m.trim_end_matches("kB").trim().parse::<f64>().ok())
        .map(|kib| format!("{:.1} GiB", kib / (1024.0 * 1024.0)))
        .unwrap_or_else(|| "unknown".into());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into());
    let _ = writeln!(out, "| | |\n|---|---|");
    let _ = writeln!(out, "| date | {} |", date_utc(run.started_unix));
    let _ = writeln!(
        out,
        "| run | {}, {} round(s) of each append cell, {:.0} s in all |",
        if run.quick { "`--quick`" } else { "full" },
        run.rounds,
        run.elapsed.as_secs_f64()
    );
    let _ = writeln!(out, "| cores | {cores} ({model}); shared with other work |");
    if let Some(share) = run.steal {
        let _ = writeln!(
            out,
            "| CPU time stolen by the hypervisor | {:.1} % of the machine's during the run (per cell: the steal % column of results.md) |",
            share * 100.0
        );
    }
    let _ = writeln!(out, "| memory | {memory} |");
    let _ = writeln!(out, "| kernel | Linux {kernel} |");
    let _ = writeln!(out, "| engine directories | `{}` |", run.tmp.display());
    match &run.mount {
        Some(m) => {
            let _ = writeln!(
                out,
                "| file system | {} on `{}`, mounted at `{}` ({}) |",
                m.fs_type, m.device, m.point, m.options
            );
            if m.fs_type == "ext4" {
                let _ = writeln!(out, "| ext4 journal | {} |", ext4_journal(&m.device));
            }
        }
        None => {
            let _ = writeln!(out, "| file system | unknown (not found in /proc/mounts) |");
        }
    }
    if let Some(rustc) = command_line("rustc", &["--version"]) {
        let _ = writeln!(out, "| compiler | {rustc} (release profile) |");
    }
    let mut engines: Vec<String> = pinned_versions()
        .into_iter()
        .map(|(name, version)| format!("{name} {version}"))
        .collect();
    engines.push(format!("SQLite {}", rusqlite::version()));
    let _ = writeln!(out, "| crates | {} |", engines.join(", "));
    if let Some(rev) = command_line("git", &["describe", "--always", "--dirty"]) {
        let _ = writeln!(out, "| segwal revision | {rev} |");
    }

    let _ = writeln!(out, "\n## fdatasync latency\n");
    let _ = writeln!(
        out,
        "Measured by the harness before the engines, in the same directory: a \
         `pwrite` of 4 KiB at the next offset, then one timed `fdatasync`, \
         repeated. A write into space preallocated with `fallocate` converts \
         *unwritten* extents, and a write at the end of a growing file changes its \
         size: either way `fdatasync` must also make that metadata durable. Into \
         blocks already written and synced, it writes data only.\n"
    );
    let _ = writeln!(
        out,
        "| file | rounds | p50 µs | p99 µs | p99.9 µs | mean µs |\n|---|--:|--:|--:|--:|--:|"
    );
    for probe in &run.probes {
        let p = &probe.fdatasync;
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} |",
            probe.kind.describe(),
            probe.iterations,
            micros(p.p50_us),
            micros(p.p99_us),
            micros(p.p999_us),
            micros(p.mean_us),
        );
    }
    out
}
