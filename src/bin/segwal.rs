//! `segwal`: an operator's view of an outbox directory (feature `cli`).
//!
//! ```text
//! cargo install --path . --features cli
//! segwal inspect DIR [--json]
//! segwal verify DIR [--json]
//! segwal dump DIR [--from SEQ] [--limit N] [--format text|json|hex] [--state]
//! segwal dead-letters DIR list [--json] | requeue SEQ... [--json] | discard SEQ... [--json]
//! segwal repair DIR [--yes] [--json]
//! ```
//!
//! `inspect`, `verify` and `dump` are read-only: they never write, never
//! take the directory's lock, and work while the owner process runs.
//! `dead-letters` and `repair --yes` open the outbox, taking its lock:
//! refused, naming the owner's pid, while the owner runs (`repair` before it
//! copies anything aside).

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use segwal::{DumpedRecord, Problem, RecordState, Verification};
use serde_json::{Value, json};

/// Set when writing to stdout failed other than by its reader going away.
static OUTPUT_FAILED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// `println!` that never panics: a reader that went away (`segwal verify DIR
/// | head -1`) is no error, and the command goes on to its own exit code; any
/// other failure is said once on stderr, and the exit code is then 2.
macro_rules! outln {
    () => {
        out_line(format_args!(""))
    };
    ($($arg:tt)*) => {
        out_line(format_args!($($arg)*))
    };
}

/// `eprintln!` that never panics: a message to a stderr that is gone (`2>&1
/// | head`) is dropped.
macro_rules! errln {
    ($($arg:tt)*) => {{
        let _ = writeln!(std::io::stderr().lock(), $($arg)*);
    }};
}

/// One line of output to stdout, for [`outln!`].
fn out_line(args: std::fmt::Arguments<'_>) {
    let mut out = std::io::stdout().lock();
    let written = out
        .write_fmt(args)
        .and_then(|()| out.write_all(b"\n"))
        .and_then(|()| out.flush());
    if let Err(e) = written
        && e.kind() != std::io::ErrorKind::BrokenPipe
        && !OUTPUT_FAILED.swap(true, std::sync::atomic::Ordering::Relaxed)
    {
        errln!("segwal: writing the output: {e}");
    }
}

/// An operator's view of a segwal outbox directory.
#[derive(Parser)]
#[command(
    name = "segwal",
    version,
    about = "An operator's view of a segwal outbox directory: inspect, verify, dump, dead letters, repair",
    after_help = "Exit codes: 0 done (clean); 1 damage found, or a dead letter not changed; 2 the directory cannot be read, holds no outbox, holds what this build does not read (a newer build's frame, another format version), or is held by its running owner. docs/OPERATIONS.md in segwal's source has the details and the JSON schemas."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Segments (first and last seq, bytes, sealed or active), records by
    /// state, the oldest pending, the sealed segments live records hold,
    /// disk use, format version, outbox identity, the owner's pid and
    /// whether it runs, and any damage found. Read-only: never writes, never
    /// takes the lock, works while the owner runs. Exit 0 (damage is shown,
    /// not an exit code: `verify` gives one), 2 when the directory cannot be
    /// read or holds no outbox.
    Inspect {
        /// The outbox directory.
        dir: PathBuf,
        /// Print JSON (the schema is in docs/OPERATIONS.md).
        #[arg(long)]
        json: bool,
    },
    /// Checks every frame's checksum and every rule an open applies, changing
    /// nothing. Exit 0 when clean (a torn tail, which the next open
    /// truncates, is clean), 1 when damage is found (each problem with file,
    /// offset, seq and kind), 2 when the directory cannot be read, holds no
    /// outbox, or holds what this build does not read (a frame of a newer
    /// build, a segment of another format version). Read-only: never
    /// writes, never takes the lock, works while the owner runs.
    Verify {
        /// The outbox directory.
        dir: PathBuf,
        /// Print JSON (the schema is in docs/OPERATIONS.md).
        #[arg(long)]
        json: bool,
    },
    /// The records in seq order: seq, time (the frame's timestamp), ordering
    /// key, deduplication id, payload (JSON payloads as JSON, other text
    /// escaped), and with --state each one's state and attempts. Read-only:
    /// never writes, never takes the lock, works while the owner runs (a
    /// batch being written is where it stops). Exit 0, 1 when a frame fails
    /// its checksum (named on stderr, with file and offset, after the
    /// records before it), 2 when the directory cannot be read or the dump
    /// meets what this build does not read (a newer build's frame).
    Dump {
        /// The outbox directory.
        dir: PathBuf,
        /// Start at this seq (or the first record after it).
        #[arg(long, value_name = "SEQ")]
        from: Option<u64>,
        /// Print at most this many records.
        #[arg(long, value_name = "N")]
        limit: Option<u64>,
        /// text: one line per record; json: one JSON object per line (JSON
        /// Lines, the schema is in docs/OPERATIONS.md); hex: a hex dump of
        /// each payload.
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
        /// The same as --format json.
        #[arg(long, conflicts_with = "format")]
        json: bool,
        /// Each record's state (pending, held back by its key, delayed, dead,
        /// acknowledged) and attempts, from the state table an open would
        /// rebuild: a few bytes of memory per record, read before the first
        /// is printed. A record a running owner has claimed shows as
        /// pending: claims live only in its memory.
        #[arg(long)]
        state: bool,
    },
    /// The dead letters: list them, put some back to be delivered
    /// (requeue), or drop them for good (discard). Opens the outbox, taking
    /// its lock: refused with the owner's pid while the owner runs; like any
    /// open, it seals the newest segment and writes its own pid in `OWNER`.
    /// Exit 0, 1 when a seq given could not be changed (each named, the
    /// others done), 2 when the outbox cannot be opened.
    DeadLetters {
        /// The outbox directory.
        dir: PathBuf,
        #[command(subcommand)]
        action: DeadLetterAction,
    },
    /// The lossy recovery, for a log `verify` finds damaged: drops the
    /// damaged records and everything after them in their segment (and
    /// later segments a broken chain cuts off), printing exactly which seqs.
    /// Without --yes, only says what it would drop. Copies every damaged
    /// file into the outbox's `quarantine/` folder before repairing, so no
    /// damaged byte is lost. Takes the lock: refused while the owner runs.
    /// Exit 0 clean or repaired; 1 damage found and nothing changed: a run
    /// without --yes, which says what a repair would drop, or damage a
    /// lossy recovery cannot repair (with or without --yes; `would_drop` is
    /// null in --json); 2 when the directory cannot be read, the owner
    /// runs, the disk has no room for the copies, or it holds what this
    /// build does not read (a newer build's frame, another format version:
    /// not damage, and never dropped).
    Repair {
        /// The outbox directory.
        dir: PathBuf,
        /// Repair: without it, nothing is changed.
        #[arg(long)]
        yes: bool,
        /// Print JSON (the schema is in docs/OPERATIONS.md).
        #[arg(long)]
        json: bool,
    },
}

/// How `dump` prints records.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Format {
    Text,
    Json,
    Hex,
}

#[derive(Subcommand)]
enum DeadLetterAction {
    /// Every dead letter: seq, attempts, the reason, the payload's start.
    List {
        /// Print JSON: an array of {seq, attempts, reason, payload_bytes,
        /// payload} (payload as text when it is UTF-8, else null).
        #[arg(long)]
        json: bool,
    },
    /// Makes these dead letters pending again, ahead of newer records.
    Requeue {
        /// Sequence numbers of dead letters.
        #[arg(required = true)]
        seqs: Vec<u64>,
        /// Print JSON: {"done": [seq...], "failed": [{seq, error}]}.
        #[arg(long)]
        json: bool,
    },
    /// Acknowledges these dead letters without delivering them.
    Discard {
        /// Sequence numbers of dead letters.
        #[arg(required = true)]
        seqs: Vec<u64>,
        /// Print JSON: {"done": [seq...], "failed": [{seq, error}]}.
        #[arg(long)]
        json: bool,
    },
}

fn problem_json(p: &Problem) -> Value {
    json!({
        "file": p.path.display().to_string(),
        "offset": p.offset,
        "seq": p.seq.map(|s| s.get()),
        "kind": format!("{:?}", p.kind),
        "message": p.kind.to_string(),
    })
}

/// The running owner's `Outbox::stats()` as JSON (the same names, types and
/// units), filled from the log: what only the owner knows (its claims, its
/// counters since open, fsync latencies, its queue) is null. Null when the
/// log is too damaged for an open to plan it.
fn stats_json(v: &Verification, now: u64) -> Value {
    let Some(c) = &v.states else {
        return Value::Null;
    };
    let age = |at: Option<(segwal::Seq, u64)>| at.map(|(_, at)| now.saturating_sub(at));
    json!({
        "pending": c.pending,
        "claimed": Value::Null,
        "delayed": c.delayed,
        "blocked_keys": c.blocked_keys,
        "held_by_key": c.held_by_key,
        "dedup_ids": Value::Null,
        "duplicates": Value::Null,
        "dead_letters": c.dead,
        "claimed_expired": Value::Null,
        "backlog_bytes": c.backlog_bytes,
        "segments": v.segments.len(),
        "disk_bytes": c.disk_bytes,
        "allocated_bytes": Value::Null,
        "state_bytes": Value::Null,
        "first_seq": c.oldest_unacked.map(|(seq, _)| seq.get()),
        "last_seq": c.last_seq.map(|seq| seq.get()),
        "oldest_pending_age_us": age(c.oldest_pending),
        "oldest_unacked_age_us": age(c.oldest_unacked),
        "records_appended": Value::Null,
        "batches": Value::Null,
        "caller_batches": Value::Null,
        "fsyncs": Value::Null,
        "records_per_batch": Value::Null,
        "records_per_fsync": Value::Null,
        "segments_deleted": Value::Null,
        "segments_recycled": Value::Null,
        "held_for_ids": Value::Null,
        "held_segments": c.held_segments,
        "held_by_records": c.held_by_records,
        "relocated": Value::Null,
        "corrupt_records": Value::Null,
        "poisoned": Value::Null,
        "reserve_missing": Value::Null,
        "queued_bytes": Value::Null,
        "fsync_p50_us": Value::Null,
        "fsync_p99_us": Value::Null,
        "fsync_max_us": Value::Null,
    })
}

fn report_json(v: &Verification) -> Value {
    let segments: Vec<Value> = v
        .segments
        .iter()
        .map(|s| {
            json!({
                "file": s.path.display().to_string(),
                "first_seq": s.first_seq.get(),
                "last_seq": s.last_seq.map(|q| q.get()),
                "frames": s.frames,
                "records": s.records,
                "bytes": s.bytes,
                "sealed": s.sealed,
                "created_unix_ms": s.created_unix_ms,
                "live_records": s.live_records,
            })
        })
        .collect();
    let now = now_us();
    let states = v.states.as_ref().map(|c| {
        json!({
            "records": c.records,
            "pending": c.pending,
            "held_by_key": c.held_by_key,
            "delayed": c.delayed,
            "dead": c.dead,
            "acknowledged": c.acknowledged,
            // Claims live only in the running owner's memory.
            "claimed": Value::Null,
            "oldest_pending": c.oldest_pending.map(|(seq, at)| json!({
                "seq": seq.get(),
                "appended_unix_us": at,
                "age_us": now.saturating_sub(at),
            })),
            "held_segments": c.held_segments,
            "held_by_records": c.held_by_records,
        })
    });
    json!({
        "dir": v.dir.display().to_string(),
        "outbox_id": v.outbox_id.map(|id| format!("{id:032x}")),
        "format_version": v.format_version,
        "owner_pid": v.owner_pid,
        "owner_running": v.owner_pid.map(|pid| lock_holder(&v.dir, Some(pid)).is_some()),
        "records": v.records,
        "bytes": v.bytes,
        "segments": segments,
        "states": states,
        "stats": stats_json(v, now),
        "torn_tail": v.torn_tail.as_ref().map(problem_json),
        "problems": v.problems.iter().map(problem_json).collect::<Vec<_>>(),
        "clean": v.is_clean(),
        "default_open_accepts": v.default_open_accepts,
        "repair": v.repair.as_ref().map(|d| json!({
            "file": d.path.display().to_string(),
            "offset": d.offset,
            "first_seq": d.first.get(),
            "last_seq": d.last.map(|s| s.get()),
            "relocated_seqs": d.relocated.iter().map(|s| s.get()).collect::<Vec<_>>(),
            "acks_dropped": d.acks_dropped,
            "changes_dropped": d.changes_dropped,
            "segments_set_aside": d.segments_set_aside.iter().map(|p| p.display().to_string()).collect::<Vec<_>>(),
        })),
    })
}

/// Whether a process holds the outbox `dir` open now: whether the `flock`
/// an open takes on the directory is held, as `/proc/locks` lists it (a line
/// for the directory's inode that is no waiter's), which takes no lock.
/// `Some(pid)` of the holder as this system numbers it (an owner in another
/// pid namespace, a container, wrote its own number in `OWNER`). The pid
/// alone says nothing: after a crash or a reboot another process may have
/// it. `None` if no lock is held. Where `/proc/locks` cannot be read,
/// whether the `OWNER` pid (`owner`) exists.
fn lock_holder(dir: &std::path::Path, owner: Option<u32>) -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    let Ok(locks) = std::fs::read_to_string("/proc/locks") else {
        return owner.filter(|pid| std::path::Path::new(&format!("/proc/{pid}")).exists());
    };
    let inode = std::fs::metadata(dir).ok()?.ino();
    flock_holder(&locks, inode)
}

/// The pid `/proc/locks` (`locks`) shows holding a `flock` on `inode`.
fn flock_holder(locks: &str, inode: u64) -> Option<u32> {
    // `1: FLOCK  ADVISORY  WRITE 4242 fe:00:8052740 0 EOF`; a process
    // waiting for the lock has `->` after the number, and holds nothing.
    // The device is not compared: some file systems (btrfs subvolumes)
    // show another in `stat` than here.
    locks.lines().find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.get(1) != Some(&"FLOCK") {
            return None;
        }
        let on = fields.get(5)?.rsplit(':').next()?.parse::<u64>().ok()?;
        (on == inode).then(|| fields.get(4)?.parse::<u32>().ok())?
    })
}

/// How `inspect` says who holds the outbox open.
fn owner_line(dir: &std::path::Path, owner: Option<u32>) -> String {
    match (owner, lock_holder(dir, owner)) {
        (Some(pid), Some(holder)) if pid == holder => {
            format!("pid {pid} (running: it holds the outbox open)")
        }
        (Some(pid), Some(holder)) => {
            format!("pid {pid} (running: held open by pid {holder} as this system numbers it)")
        }
        (None, Some(holder)) => format!("- (held open by pid {holder})"),
        (Some(pid), None) => format!("pid {pid} (not running)"),
        (None, None) => "-".to_owned(),
    }
}

fn print_problem(p: &Problem) {
    let seq = p.seq.map_or_else(|| "-".to_owned(), |s| s.to_string());
    outln!(
        "  {} offset {} seq {seq}: {}",
        p.path.display(),
        p.offset,
        p.kind
    );
}

/// Whether every problem is no damage but a frame or a segment header this
/// build does not read, whose checksums hold: written by a newer build of
/// segwal, or in another format version. Real damage beside it is damage
/// (exit 1), which the build that wrote the log would find too.
fn only_not_read_here(problems: &[segwal::Problem]) -> bool {
    !problems.is_empty() && problems.iter().all(|p| p.kind.is_unknown_format())
}

/// Whether some problem, beside real damage, is what this build does not
/// read: no repair drops it (`RecoveryMode::Lossy` refuses), so the damage
/// is the writing build's to mend.
fn partly_not_read_here(problems: &[segwal::Problem]) -> bool {
    problems.iter().any(|p| p.kind.is_unknown_format()) && !only_not_read_here(problems)
}

/// What to say of a log holding both.
const DAMAGE_AND_NOT_READ_HERE: &str = "segwal: the log also holds what this build does not read (a newer build's frame, named above): no repair of this build drops it, so none is offered here; mend the damage with the build that wrote the log.";

/// What to do with a log this build does not read.
const NOT_READ_HERE: &str = "segwal: this is not damage: the log holds a frame or a segment written by another build of segwal (a newer one, or another format version), which this build does not read. Open it with the build that wrote it (drain it there before going back to this one); a repair would drop the records from there on, so this build does not offer one.";

fn inspect(v: &Verification) {
    outln!("outbox      {}", v.dir.display());
    match v.outbox_id {
        Some(id) => outln!("identity    {id:032x}"),
        None if v.segments.is_empty() => outln!("identity    - (no segment yet)"),
        None => outln!("identity    - (no segment header this build reads)"),
    }
    let unread = only_not_read_here(&v.problems);
    match v.format_version {
        Some(version) if unread => {
            outln!("format      version {version} (this build does not read all of it)")
        }
        Some(version) => outln!("format      version {version}"),
        None => outln!("format      -"),
    }
    outln!("owner       {}", owner_line(&v.dir, v.owner_pid));
    outln!(
        "records     {} in the log (acknowledged ones included until their segment goes)",
        v.records
    );
    match &v.states {
        Some(c) => {
            outln!(
                "states      {} pending, {} held back by a key, {} delayed, {} dead, {} acknowledged (still on disk), of {}",
                c.pending,
                c.held_by_key,
                c.delayed,
                c.dead,
                c.acknowledged,
                count(c.records, "record", "records")
            );
            outln!(
                "claimed     known only to the running owner (Outbox::stats): a record it claimed shows as pending"
            );
            match c.oldest_pending {
                Some((seq, at)) => outln!(
                    "oldest      pending seq {seq}, appended {} ({} ago)",
                    rfc3339(at),
                    age(now_us().saturating_sub(at))
                ),
                None => outln!("oldest      - (nothing pending)"),
            }
            outln!(
                "held        {} kept by {}",
                count(c.held_segments as u64, "sealed segment", "sealed segments"),
                count(c.held_by_records, "live record", "live records")
            );
        }
        None if unread => {
            outln!("states      - (the log holds what this build does not read: see below)")
        }
        None => outln!("states      - (the log is too damaged to plan an open)"),
    }
    outln!(
        "disk        {} bytes in {}",
        v.bytes,
        count(v.segments.len() as u64, "segment", "segments")
    );
    outln!();
    outln!(
        "{:>20} {:>20} {:>9} {:>9} {:>12}  state",
        "first seq",
        "last seq",
        "records",
        "live",
        "bytes"
    );
    for s in &v.segments {
        let last = s.last_seq.map_or_else(|| "-".to_owned(), |q| q.to_string());
        let live = s
            .live_records
            .map_or_else(|| "-".to_owned(), |n| n.to_string());
        let state = if s.sealed { "sealed" } else { "active" };
        outln!(
            "{:>20} {:>20} {:>9} {:>9} {:>12}  {state}",
            s.first_seq,
            last,
            s.records,
            live,
            s.bytes
        );
    }
    if let Some(torn) = &v.torn_tail {
        outln!();
        outln!("torn tail (the next open truncates it):");
        print_problem(torn);
    }
    if !v.problems.is_empty() {
        outln!();
        outln!(
            "damage ({}; `segwal verify` for details):",
            v.problems.len()
        );
        for p in &v.problems {
            print_problem(p);
        }
    }
}

/// The options of a command's open: the defaults, but for deduplication ids,
/// kept as long and as many as any owner may keep them. An open deletes the
/// segments it finds fully acknowledged, carrying the ids whose frames go into
/// a tombstones frame; with the default window (10 minutes) it would carry
/// only those, and the owner, reopened with a longer window, would forget the
/// others (the owner's own window applies again at its next open).
fn tool_options() -> segwal::Options {
    segwal::Options::default()
        .dedup_window(segwal::DEDUP_WINDOW_MAX)
        .dedup_capacity(segwal::DEDUP_CAPACITY_MAX)
}

/// Opens the outbox for a command that changes it; the error says who
/// holds it.
fn open(dir: &std::path::Path) -> Result<segwal::Outbox, ExitCode> {
    an_outbox(dir)?;
    segwal::Outbox::open(dir, tool_options()).map_err(|e| {
        say_open_failed(dir, &e);
        ExitCode::from(2)
    })
}

/// Refuses, exit 2, a path that holds no outbox (none, not a directory, or a
/// directory without a segment file): a command that opens the outbox
/// would create one there, and a mistyped path would then answer "0 dead
/// letters" with files made where nobody asked for them; `verify` would
/// call it clean.
fn an_outbox(dir: &std::path::Path) -> Result<(), ExitCode> {
    let refuse = |why: String| {
        errln!("segwal: {why}");
        ExitCode::from(2)
    };
    let meta = std::fs::metadata(dir)
        .map_err(|e| refuse(format!("stat directory {}: {e}", dir.display())))?;
    if !meta.is_dir() {
        return Err(refuse(format!("{}: not a directory", dir.display())));
    }
    let entries = std::fs::read_dir(dir)
        .map_err(|e| refuse(format!("list directory {}: {e}", dir.display())))?;
    let segment = |name: &str| {
        name.strip_suffix(".seg")
            .is_some_and(|n| n.len() == 20 && n.bytes().all(|b| b.is_ascii_digit()))
    };
    if entries
        .filter_map(|e| e.ok())
        .any(|e| e.file_name().to_str().is_some_and(segment))
    {
        Ok(())
    } else {
        Err(refuse(format!(
            "{} holds no outbox (no segment file): nothing changed",
            dir.display()
        )))
    }
}

/// Says why a command that changes the outbox could not open it, naming the
/// process that holds it where the error knows.
fn say_open_failed(dir: &std::path::Path, e: &segwal::Error) {
    match e {
        segwal::Error::Locked { pid, .. } => say_held(dir, *pid),
        _ => errln!("segwal: {e}"),
    }
}

/// The refusal of a command that changes the outbox while its owner runs.
fn say_held(dir: &std::path::Path, pid: Option<u32>) {
    let who = pid.map_or_else(|| "another process".to_owned(), |p| format!("process {p}"));
    errln!(
        "segwal: {} is open in {who}: stop it first (read-only commands: inspect, verify, dump)",
        dir.display()
    );
}

/// Whether a process holds the outbox open, probed without changing
/// anything: `Outbox::open` takes an exclusive `flock` on the directory
/// itself (docs/FORMAT.md, "The directory"), so a lock that cannot be taken
/// now is held by an owner. The probe lets go at once. `Some(pid)` from the
/// `OWNER` file when it names one.
fn held_by_owner(dir: &std::path::Path) -> Option<Option<u32>> {
    let handle = std::fs::File::open(dir).ok()?;
    match handle.try_lock() {
        Err(std::fs::TryLockError::WouldBlock) => Some(segwal::owner_pid(dir)),
        _ => None,
    }
}

/// `n` and what it counts, singular for one: "1 segment", "2 segments".
fn count(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// A payload's first 80 bytes as text for a listing, as `dump` prints it:
/// JSON as JSON on one line, other text escaped (UTF-8 as Rust escapes a
/// string, other bytes as `\xNN`), without the quotes.
fn preview(payload: &[u8]) -> String {
    let mut end = payload.len().min(80);
    if is_json(payload) {
        let line = one_line_shown(payload);
        end = line.len().min(80);
        while !line.is_char_boundary(end) {
            end -= 1;
        }
        // Not through a `\uXXXX` the line wrote.
        if let Some(at) = line[..end].rfind("\\u")
            && at + 6 > end
            && line.len() > end
        {
            end = at;
        }
        let more = if line.len() > end { "..." } else { "" };
        return format!("{}{more}", &line[..end]);
    }
    if let Ok(text) = std::str::from_utf8(payload) {
        while !text.is_char_boundary(end) {
            end -= 1;
        }
    }
    let quoted = quoted(&payload[..end]);
    let mut out = quoted
        .strip_prefix('"')
        .and_then(|q| q.strip_suffix('"'))
        .unwrap_or(&quoted)
        .to_owned();
    if payload.len() > end {
        out.push_str("...");
    }
    out
}

fn dead_letters(dir: &std::path::Path, action: &DeadLetterAction) -> ExitCode {
    let outbox = match open(dir) {
        Ok(outbox) => outbox,
        Err(code) => return code,
    };
    let mut failed = false;
    match action {
        DeadLetterAction::List { json } => {
            // One dead letter read at a time: a listing holds one payload,
            // however many large dead letters there are.
            let mut from = segwal::Seq::from(0);
            let mut next = || -> segwal::Result<Option<segwal::DeadLetter>> {
                let letter = outbox.dead_letters_from(from, 1)?.pop();
                if let Some(d) = &letter {
                    from = segwal::Seq::from(d.seq().get() + 1);
                }
                Ok(letter)
            };
            if !*json {
                let n = outbox.stats().dead_letters;
                outln!("{}", count(n, "dead letter", "dead letters"));
            }
            let mut first = true;
            loop {
                let d = match next() {
                    Ok(Some(d)) => d,
                    Ok(None) => break,
                    Err(e) => {
                        errln!("segwal: {e}");
                        failed = true;
                        break;
                    }
                };
                if *json {
                    let item = json!({
                        "seq": d.seq().get(),
                        "attempts": d.attempts(),
                        "reason": d.reason(),
                        "payload_bytes": d.payload().len(),
                        "payload": std::str::from_utf8(d.payload()).ok(),
                    });
                    outln!("{}{item}", if first { "[" } else { "," });
                } else {
                    let attempts = u64::from(d.attempts());
                    outln!(
                        "  seq {} after {}: {}\n    {}",
                        d.seq(),
                        count(attempts, "attempt", "attempts"),
                        d.reason().escape_debug(),
                        preview(d.payload())
                    );
                }
                first = false;
            }
            if *json && !failed {
                outln!("{}", if first { "[]" } else { "]" });
            }
        }
        DeadLetterAction::Requeue { seqs, json } | DeadLetterAction::Discard { seqs, json } => {
            let requeue = matches!(action, DeadLetterAction::Requeue { .. });
            let (mut done, mut refused) = (Vec::new(), Vec::new());
            for &seq in seqs {
                let seq = segwal::Seq::from(seq);
                let outcome = if requeue {
                    outbox.requeue(seq)
                } else {
                    outbox.discard(seq)
                };
                match outcome {
                    Ok(()) if *json => done.push(seq.get()),
                    Ok(()) => outln!("{} {seq}", if requeue { "requeued" } else { "discarded" }),
                    Err(e) => {
                        // `NotClaimed` from `requeue` and `discard` means the
                        // record is not a dead letter: said so here.
                        let why = match e {
                            segwal::Error::NotClaimed { .. } => {
                                format!("record {seq} is not a dead letter")
                            }
                            e => e.to_string(),
                        };
                        if *json {
                            refused.push(json!({ "seq": seq.get(), "error": why }));
                        } else {
                            errln!("segwal: seq {seq}: {why}");
                        }
                        failed = true;
                    }
                }
            }
            if *json {
                outln!("{}", json!({ "done": done, "failed": refused }));
            }
        }
    }
    if let Err(e) = outbox.close() {
        errln!("segwal: close: {e}");
        failed = true;
    }
    if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

/// What `repair` found and did, printed as it goes (text) or as one JSON
/// object at the end (`--json`).
struct RepairReport {
    json: bool,
    fields: serde_json::Map<String, Value>,
}

impl RepairReport {
    /// A line of text (not printed under `--json`).
    fn say(&self, line: impl std::fmt::Display) {
        if !self.json {
            outln!("{line}");
        }
    }

    /// A field of the JSON object.
    fn set(&mut self, key: &str, value: Value) {
        self.fields.insert(key.to_owned(), value);
    }

    /// Prints the JSON object (under `--json`) and returns `code`.
    fn finish(self, code: u8) -> ExitCode {
        if self.json {
            outln!("{}", Value::Object(self.fields));
        }
        ExitCode::from(code)
    }
}

/// Copies `from` into the folder `aside` under `base` (or `base.1`,
/// `base.2`, ... where a file holds the name: two repairs in one second, or
/// an operator's file), created new so that nothing there is overwritten,
/// and makes the copy durable (the file, the folder, the folder's entry):
/// the copy a repair keeps of a file it is about to cut. Returns its path.
/// A copy that fails (a full disk) is removed, so that no part of a file
/// sits in the folder under the name of a whole copy.
fn copy_durably(
    from: &std::path::Path,
    aside: &std::path::Path,
    base: &str,
) -> std::io::Result<std::path::PathBuf> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let mut source = std::fs::File::open(from)?;
    // The copy gets the file's permissions (as the umask lets it).
    let mode = source.metadata()?.permissions().mode() & 0o777;
    let (to, mut copy) = (0..)
        .map(|n| match n {
            0 => aside.join(base),
            n => aside.join(format!("{base}.{n}")),
        })
        .map(|to| {
            let file = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(mode)
                .open(&to);
            (to, file)
        })
        .find(|(_, file)| !matches!(file, Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists))
        .map(|(to, file)| file.map(|file| (to, file)))
        .unwrap_or_else(|| Err(std::io::Error::other("no free name")))?;
    let copied = std::io::copy(&mut source, &mut copy).and_then(|_| {
        copy.sync_all()?;
        for folder in to.ancestors().skip(1).take(2) {
            let folder = match folder.as_os_str().is_empty() {
                true => std::path::Path::new("."),
                false => folder,
            };
            std::fs::File::open(folder)?.sync_all()?;
        }
        Ok(())
    });
    if let Err(e) = copied {
        drop(copy);
        let _ = std::fs::remove_file(&to);
        return Err(e);
    }
    Ok(to)
}

fn repair(dir: &std::path::Path, yes: bool, json: bool) -> ExitCode {
    if let Err(code) = an_outbox(dir) {
        return code;
    }
    let found = match segwal::verify(dir) {
        Ok(v) => v,
        Err(e) => {
            errln!("segwal: {e}");
            return ExitCode::from(2);
        }
    };
    let mut out = RepairReport {
        json,
        fields: serde_json::Map::new(),
    };
    out.set("dir", found.dir.display().to_string().into());
    out.set("clean", found.is_clean().into());
    out.set(
        "problems",
        found
            .problems
            .iter()
            .map(problem_json)
            .collect::<Vec<_>>()
            .into(),
    );
    for key in [
        "would_drop",
        "copied",
        "dropped",
        "quarantined",
        "records_kept",
        "states_kept",
    ] {
        out.set(key, Value::Null);
    }
    out.set("repaired", false.into());
    out.set(
        "default_open_accepts",
        found.default_open_accepts.map_or(Value::Null, Value::from),
    );
    if found.is_clean() {
        out.say(format_args!(
            "{}: clean, nothing to repair",
            found.dir.display()
        ));
        return out.finish(0);
    }
    if only_not_read_here(&found.problems) {
        out.say("not read by this build:");
        if !json {
            for p in &found.problems {
                print_problem(p);
            }
        }
        errln!("{NOT_READ_HERE}");
        return out.finish(2);
    }
    out.say("damage found:");
    if !json {
        for p in &found.problems {
            print_problem(p);
        }
    }
    let Some(plan) = &found.repair else {
        errln!("segwal: a lossy recovery cannot repair this directory (see the damage above)");
        if partly_not_read_here(&found.problems) {
            errln!("{DAMAGE_AND_NOT_READ_HERE}");
        }
        // A file no segwal wrote, named like a segment: not the log's to
        // drop, but an operator's to move.
        for p in &found.problems {
            if p.kind == segwal::Corruption::BadSegmentName {
                errln!(
                    "segwal: {} is named like a segment but no segment is named so: move it out of the directory",
                    p.path.display()
                );
            }
        }
        return out.finish(1);
    };
    let range = dropped_range(plan.first, plan.last);
    let whole = &plan.segments_set_aside;
    let later = whole.iter().filter(|p| **p != plan.path).count();
    let damaged = if whole.contains(&plan.path) {
        "set aside whole"
    } else {
        "cut there"
    };
    out.say(format_args!(
        "a repair drops {range}: {} at offset {} ({damaged}), and {later} later segment {}",
        plan.path.display(),
        plan.offset,
        if later == 1 { "file" } else { "files" }
    ));
    if found.default_open_accepts == Some(true) {
        out.say(DEFAULT_OPEN_ACCEPTS);
    }
    if !plan.relocated.is_empty() {
        let seqs: Vec<String> = plan.relocated.iter().map(|s| s.to_string()).collect();
        out.say(format_args!(
            "and records carried forward from deleted segments: seqs {}",
            seqs.join(", ")
        ));
    }
    if let Some(line) = state_dropped(plan) {
        out.say(line);
    }
    out.set(
        "would_drop",
        json!({
            "first_seq": plan.first.get(),
            "last_seq": plan.last.map(|l| l.get()),
            "relocated_seqs": plan.relocated.iter().map(|s| s.get()).collect::<Vec<_>>(),
            "acks_dropped": plan.acks_dropped,
            "changes_dropped": plan.changes_dropped,
            "file": plan.path.display().to_string(),
            "offset": plan.offset,
            "file_set_aside_whole": whole.contains(&plan.path),
            "later_segments": whole
                .iter()
                .filter(|p| **p != plan.path)
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>(),
        }),
    );
    if !yes {
        out.say("nothing changed: run again with --yes to repair");
        return out.finish(1);
    }
    // Refused while the owner runs, before anything is copied; the lossy open
    // below refuses in turn if one started meanwhile.
    if let Some(pid) = held_by_owner(&found.dir) {
        say_held(&found.dir, pid);
        return out.finish(2);
    }
    // Every damaged file copied aside first: the repair truncates them.
    let aside = found.dir.join(segwal::QUARANTINE_DIR);
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let mut files: Vec<&std::path::Path> =
        found.problems.iter().map(|p| p.path.as_path()).collect();
    files.push(&plan.path);
    files.sort();
    files.dedup();
    let mut copied = Vec::new();
    let mut made: Vec<std::path::PathBuf> = Vec::new();
    for file in files {
        let Some(name) = file.file_name() else {
            continue;
        };
        let base = format!("{}.damaged-{stamp}", name.to_string_lossy());
        match std::fs::create_dir_all(&aside).and_then(|()| copy_durably(file, &aside, &base)) {
            Ok(to) => {
                out.say(format_args!(
                    "copied {} to {}",
                    file.display(),
                    to.display()
                ));
                copied.push(
                    json!({ "from": file.display().to_string(), "to": to.display().to_string() }),
                );
                made.push(to);
            }
            Err(e) => {
                // Refused with nothing changed: the copies this run made
                // go too, or their space would refuse the next run.
                for to in &made {
                    if std::fs::remove_file(to).is_ok() {
                        out.say(format_args!("removed {}", to.display()));
                    }
                }
                errln!(
                    "segwal: copying {} aside: {e}; nothing repaired",
                    file.display()
                );
                out.set("copied", Vec::<serde_json::Value>::new().into());
                return out.finish(2);
            }
        }
    }
    out.set("copied", copied.into());
    let options = tool_options().recovery(segwal::RecoveryMode::Lossy);
    let outbox = match segwal::Outbox::open(&found.dir, options) {
        Ok(outbox) => outbox,
        Err(e) => {
            say_open_failed(&found.dir, &e);
            return out.finish(2);
        }
    };
    let report = outbox.recovery_report().clone();
    if let Some(dropped) = &report.dropped {
        out.say(format_args!(
            "repaired: dropped {}",
            dropped_range(dropped.first, dropped.last)
        ));
        if !dropped.relocated.is_empty() {
            let seqs: Vec<String> = dropped.relocated.iter().map(|s| s.to_string()).collect();
            out.say(format_args!(
                "repaired: dropped records carried forward from deleted segments: seqs {}",
                seqs.join(", ")
            ));
        }
        if let Some(line) = state_dropped(dropped) {
            out.say(format_args!("repaired: {line}"));
        }
        out.set(
            "dropped",
            json!({
                "first_seq": dropped.first.get(),
                "last_seq": dropped.last.map(|l| l.get()),
                "relocated_seqs": dropped.relocated.iter().map(|s| s.get()).collect::<Vec<_>>(),
                "acks_dropped": dropped.acks_dropped,
                "changes_dropped": dropped.changes_dropped,
            }),
        );
    }
    let mut quarantined = Vec::new();
    for q in &report.quarantined {
        out.say(format_args!(
            "set aside {} as {}",
            q.from.display(),
            q.to.display()
        ));
        quarantined.push(
            json!({ "from": q.from.display().to_string(), "to": q.to.display().to_string() }),
        );
    }
    out.set("quarantined", quarantined.into());
    if let Err(e) = outbox.close() {
        errln!("segwal: close: {e}");
        return out.finish(2);
    }
    // What is kept, counted as `inspect` counts it, from the log as the
    // repair left it.
    match segwal::verify(&found.dir).map(|v| v.states) {
        Ok(Some(c)) => {
            out.say(format_args!(
                "{} kept: {} pending, {} held back by a key, {} delayed, {} dead, {} acknowledged (still on disk)",
                count(c.records, "record", "records"),
                c.pending,
                c.held_by_key,
                c.delayed,
                c.dead,
                c.acknowledged
            ));
            out.set("records_kept", c.records.into());
            out.set(
                "states_kept",
                json!({
                    "pending": c.pending,
                    "held_by_key": c.held_by_key,
                    "delayed": c.delayed,
                    "dead": c.dead,
                    "acknowledged": c.acknowledged,
                }),
            );
        }
        Ok(None) | Err(_) => {
            out.say(format_args!(
                "{} pending (the log could not be read again to count the others: run verify)",
                count(report.records_recovered, "record", "records")
            ));
        }
    }
    out.set("repaired", true.into());
    out.finish(0)
}

/// The line saying what a repair drops of the delivery state of the records
/// it keeps, if it drops any.
fn state_dropped(d: &segwal::Dropped) -> Option<String> {
    if d.acks_dropped == 0 && d.changes_dropped == 0 {
        return None;
    }
    Some(format!(
        "and the delivery state of records kept written in what is dropped: {} {} unacknowledged again (delivered again; a dead letter discarded there is a dead letter again), {} {} back to the state the kept frames record (a dead letter made there is pending again, one requeued there is a dead letter again, a release's delay and reason given there are gone)",
        count(
            d.acks_dropped,
            "acknowledged record",
            "acknowledged records"
        ),
        if d.acks_dropped == 1 { "is" } else { "are" },
        count(d.changes_dropped, "record", "records"),
        if d.changes_dropped == 1 { "goes" } else { "go" }
    ))
}

fn main() -> ExitCode {
    let code = run(Cli::parse());
    if OUTPUT_FAILED.load(std::sync::atomic::Ordering::Relaxed) {
        return ExitCode::from(2);
    }
    code
}

/// Runs the command `cli` names; its exit code.
fn run(cli: Cli) -> ExitCode {
    let (dir, json) = match &cli.command {
        Command::Inspect { dir, json } | Command::Verify { dir, json } => (dir, json),
        Command::Dump {
            dir,
            from,
            limit,
            format,
            json,
            state,
        } => {
            let format = if *json { Format::Json } else { *format };
            return dump(dir, *from, *limit, format, *state);
        }
        Command::DeadLetters { dir, action } => return dead_letters(dir, action),
        Command::Repair { dir, yes, json } => return repair(dir, *yes, *json),
    };
    // A mistyped path is no clean outbox.
    if let Err(code) = an_outbox(dir) {
        return code;
    }
    let label = match &cli.command {
        Command::Inspect { .. } => "inspect",
        _ => "verify",
    };
    let verification = match verify_showing_progress(dir, label) {
        Ok(v) => v,
        Err(e) => {
            errln!("segwal: {e}");
            return ExitCode::from(2);
        }
    };
    let unread = only_not_read_here(&verification.problems);
    if *json {
        outln!("{}", report_json(&verification));
    } else if matches!(cli.command, Command::Inspect { .. }) {
        inspect(&verification);
    } else {
        outln!(
            "{}: {}, {} bytes, {} checked",
            verification.dir.display(),
            count(verification.segments.len() as u64, "segment", "segments"),
            verification.bytes,
            count(verification.records, "record", "records")
        );
        if let Some(torn) = &verification.torn_tail {
            outln!("torn tail (not damage: the next open truncates it):");
            print_problem(torn);
        }
        if verification.is_clean() {
            outln!("clean");
        } else {
            if unread {
                outln!("not read by this build:");
            } else {
                outln!("damage found:");
            }
            for p in &verification.problems {
                print_problem(p);
            }
            match verification.default_open_accepts {
                Some(true) if unread => outln!("{DEFAULT_OPEN_HOLDS_BACK}"),
                Some(true) => outln!("{DEFAULT_OPEN_ACCEPTS}"),
                _ => {}
            }
        }
    }
    if unread && !*json {
        errln!("{NOT_READ_HERE}");
    } else if partly_not_read_here(&verification.problems) && !*json {
        errln!("{DAMAGE_AND_NOT_READ_HERE}");
    }
    match (
        matches!(cli.command, Command::Verify { .. }),
        verification.is_clean(),
    ) {
        (true, false) if unread => ExitCode::from(2),
        (true, false) => ExitCode::from(1),
        _ => ExitCode::SUCCESS,
    }
}

/// The seqs a lossy recovery drops, said as what they are: `last` is a
/// bound, and `None` when nothing past `first` could be read as a record
/// (a file whose header is the damage cannot be checked at all).
fn dropped_range(first: segwal::Seq, last: Option<segwal::Seq>) -> String {
    last.map_or_else(
        || format!("from seq {first} on (no record past it could be read and checked)"),
        |l| {
            if l == first {
                format!("seq {first} at most")
            } else {
                format!("seqs {first} to {l} at most")
            }
        },
    )
}

/// Said under damage that only an open checking every frame refuses.
const DEFAULT_OPEN_ACCEPTS: &str = "the default open (through seal indexes) opens this log all the same: \
the damage lies in records it does not read at open; a claim of a damaged record fails naming it \
and sets it aside, and every other record is delivered. No repair is needed to open it.";

/// [`DEFAULT_OPEN_ACCEPTS`] for a log holding what this build does not read.
const DEFAULT_OPEN_HOLDS_BACK: &str = "the default open (through seal indexes) opens this log all the same: \
what this build does not read lies in records it does not read at open; a claim of one fails naming it \
and holds it back (never set aside: the build that wrote it delivers it), and every other record is delivered \
but the later ones of its ordering key; its segment and every later one stay until then.";

/// A log at least this large gets a progress bar (on a terminal).
const PROGRESS_BYTES_MIN: u64 = 256 << 20;
/// A log of more segments than this gets a progress bar (on a terminal).
const PROGRESS_SEGMENTS_MIN: usize = 8;

/// [`segwal::verify`], with a progress bar labelled `label` (the command) on
/// stderr when stderr is a terminal and the log is large. The line fits 80
/// columns.
fn verify_showing_progress(dir: &std::path::Path, label: &str) -> segwal::Result<Verification> {
    let (segments, bytes) = segment_files(dir);
    if !std::io::stderr().is_terminal()
        || (bytes <= PROGRESS_BYTES_MIN && segments <= PROGRESS_SEGMENTS_MIN)
    {
        return segwal::verify(dir);
    }
    let bar = indicatif::ProgressBar::with_draw_target(
        Some(bytes),
        indicatif::ProgressDrawTarget::stderr(),
    );
    bar.set_style(
        indicatif::ProgressStyle::with_template(&format!(
            "{label} [{{bar:30}}] {{bytes}}/{{total_bytes}} ({{percent}}%), {{elapsed}}"
        ))
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
        .progress_chars("=> "),
    );
    let verified = segwal::verify_with_progress(dir, |done, total| {
        bar.set_length(total);
        bar.set_position(done);
    });
    bar.finish();
    verified
}

/// How many segment files `dir` holds, and their bytes (0 when unreadable:
/// the check itself reports why).
fn segment_files(dir: &std::path::Path) -> (usize, u64) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return (0, 0);
    };
    entries
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().ends_with(".seg"))
        .fold((0, 0), |(n, bytes), e| {
            (n + 1, bytes + e.metadata().map_or(0, |m| m.len()))
        })
}

/// The wall clock, µs since the Unix epoch.
fn now_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// The last second RFC 3339 can write (9999-12-31T23:59:59Z), in seconds
/// since the Unix epoch.
const RFC3339_LAST_SECOND: u64 = 253_402_300_799;

/// `us` microseconds since the Unix epoch as an RFC 3339 time in UTC, to the
/// microsecond: `2025-06-01T12:00:00.123456Z`. A time past the year 9999
/// (a frame can hold one) is printed as `unix_us:N`.
fn rfc3339(us: u64) -> String {
    if us / 1_000_000 > RFC3339_LAST_SECOND {
        return format!("unix_us:{us}");
    }
    let at = std::time::UNIX_EPOCH + std::time::Duration::from_micros(us);
    humantime::format_rfc3339_micros(at).to_string()
}

/// A duration in µs for a person, to the second: `3days 4h 5m 6s`, `12s`.
fn age(us: u64) -> String {
    humantime::format_duration(std::time::Duration::from_secs(us / 1_000_000)).to_string()
}

/// Lowercase hexadecimal digits, by value.
const HEX_DIGITS: &[u8; 16] = b"0123456789abcdef";

/// `b` as two lowercase hexadecimal digits.
fn hex_byte(b: u8) -> [u8; 2] {
    [
        HEX_DIGITS[usize::from(b >> 4)],
        HEX_DIGITS[usize::from(b & 0xf)],
    ]
}

/// `bytes` as lowercase hexadecimal digits.
fn hex(bytes: &[u8]) -> String {
    bytes
        .iter()
        .flat_map(|&b| hex_byte(b))
        .map(char::from)
        .collect()
}

/// Whether `bytes` are one JSON value that a JSON reader takes: valid JSON
/// (skipped as one value, never built: no depth limit, no number range, no
/// memory), in UTF-8, and with every `\u` escape valid Unicode (a lone
/// surrogate, `"\ud800"`, is what the grammar allows and readers refuse).
fn is_json(bytes: &[u8]) -> bool {
    std::str::from_utf8(bytes).is_ok_and(|text| {
        serde_json::from_str::<serde::de::IgnoredAny>(text).is_ok() && surrogates_paired(text)
    })
}

/// Whether every UTF-16 surrogate escaped in `json` (valid JSON: outside
/// strings there is no backslash) is a high one followed by a low one.
fn surrogates_paired(json: &str) -> bool {
    let bytes = json.as_bytes();
    let unit = |at: usize| {
        let hex = bytes.get(at..at + 4)?;
        u16::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()
    };
    let mut at = 0;
    while let Some(k) = bytes
        .get(at..)
        .and_then(|rest| rest.iter().position(|&b| b == b'\\'))
    {
        at += k;
        if bytes.get(at + 1) != Some(&b'u') {
            at += 2;
            continue;
        }
        let Some(u) = unit(at + 2) else { return false };
        at += 6;
        match u {
            0xD800..=0xDBFF => {
                let low = (bytes.get(at..at + 2) == Some(b"\\u"))
                    .then(|| unit(at + 2))
                    .flatten();
                if !low.is_some_and(|l| (0xDC00..=0xDFFF).contains(&l)) {
                    return false;
                }
                at += 6;
            }
            0xDC00..=0xDFFF => return false,
            _ => {}
        }
    }
    true
}

/// JSON that is one value, on one line: a line break in JSON can only be
/// whitespace between tokens (strings escape theirs), so it becomes a space.
/// Keys keep their order and numbers their digits.
fn one_line(json: &[u8]) -> std::borrow::Cow<'_, [u8]> {
    if json.iter().any(|&b| b == b'\n' || b == b'\r') {
        json.iter()
            .map(|&b| if b == b'\n' || b == b'\r' { b' ' } else { b })
            .collect::<Vec<u8>>()
            .into()
    } else {
        json.into()
    }
}

/// [`one_line`] for people at a terminal: the characters JSON lets a string
/// hold raw that a terminal acts on, or that hide or reorder text (DEL and
/// the other controls, the format characters: bidirectional marks and
/// overrides, zero-width characters, tags; line and paragraph separators),
/// are written as `\uXXXX` (a surrogate pair above U+FFFF), which means the
/// same inside a string, the only place they can be. `json` is valid JSON
/// (UTF-8).
fn one_line_shown(json: &[u8]) -> String {
    use std::fmt::Write as _;
    let text = String::from_utf8_lossy(json);
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            // Whitespace between tokens: strings escape theirs.
            '\n' | '\r' | '\t' => out.push(' '),
            c if c.is_control() || is_format_or_separator(c) => {
                for unit in c.encode_utf16(&mut [0u16; 2]) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out
}

/// Whether `c` is a format character (Unicode category Cf) or a line or
/// paragraph separator (Zl, Zp): invisible, or changing how the text
/// around it shows.
fn is_format_or_separator(c: char) -> bool {
    matches!(
        u32::from(c),
        0xAD | 0x600..=0x605
            | 0x61C
            | 0x6DD
            | 0x70F
            | 0x890..=0x891
            | 0x8E2
            | 0x180E
            | 0x200B..=0x200F
            | 0x2028..=0x202E
            | 0x2060..=0x2064
            | 0x2066..=0x206F
            | 0xFEFF
            | 0xFFF9..=0xFFFB
            | 0x110BD
            | 0x110CD
            | 0x13430..=0x1343F
            | 0x1BCA0..=0x1BCA3
            | 0x1D173..=0x1D17A
            | 0xE0001
            | 0xE0020..=0xE007F
    )
}

/// Bytes for a line of text: UTF-8 escaped as Rust escapes a string
/// (`\n`, `\"`, `\u{7f}`), other bytes as `\xNN`, in quotes.
fn quoted(bytes: &[u8]) -> String {
    let mut out = Vec::with_capacity(bytes.len() + 2);
    quote_into(bytes, &mut out);
    String::from_utf8(out).unwrap_or_default()
}

/// [`quoted`], appended to `out`. Printable ASCII that needs no escape (the
/// common payload) is copied as it is, without going through the formatter
/// a character at a time.
fn quote_into(bytes: &[u8], out: &mut Vec<u8>) {
    let plain = |b: &u8| (b' '..=b'~').contains(b) && !matches!(b, b'"' | b'\\' | b'\'');
    out.push(b'"');
    if bytes.iter().all(plain) {
        out.extend_from_slice(bytes);
    } else {
        let _ = match std::str::from_utf8(bytes) {
            Ok(text) => write!(out, "{}", text.escape_debug()),
            Err(_) => write!(out, "{}", bytes.escape_ascii()),
        };
    }
    out.push(b'"');
}

/// Bytes for JSON: a string when UTF-8, else `{"hex": "..."}`.
fn bytes_json(bytes: &[u8]) -> Value {
    match std::str::from_utf8(bytes) {
        Ok(text) => Value::String(text.to_owned()),
        Err(_) => json!({ "hex": hex(bytes) }),
    }
}

/// The name of a state, as `dump` prints it.
fn state_name(state: &RecordState) -> &'static str {
    match state {
        RecordState::Pending => "pending",
        RecordState::HeldByKey => "held_by_key",
        RecordState::Delayed { .. } => "delayed",
        RecordState::Dead { .. } => "dead",
        RecordState::Acknowledged => "acknowledged",
        _ => "unknown",
    }
}

/// One record as a line of text.
fn text_line(r: &DumpedRecord, out: &mut Vec<u8>) {
    use std::fmt::Write as _;
    let mut line = format!("seq={} time={}", r.seq, rfc3339(r.timestamp_us));
    if let Some(key) = &r.key {
        let _ = write!(line, " key={}", quoted(key));
    }
    if let Some(id) = &r.dedup_id {
        let _ = write!(line, " dedup_id={}", quoted(id));
    }
    if let Some(at) = r.not_before_us {
        let _ = write!(line, " not_before={}", rfc3339(at));
    }
    if r.relocated {
        line.push_str(" relocated");
    }
    if let Some(state) = &r.state {
        let _ = write!(line, " state={}", state_name(state));
        match state {
            RecordState::Delayed { not_before_us } => {
                let _ = write!(line, " until={}", rfc3339(*not_before_us));
            }
            RecordState::Dead { reason, since_us } => {
                let _ = write!(
                    line,
                    " since={} reason={}",
                    rfc3339(*since_us),
                    quoted(reason.as_bytes())
                );
            }
            _ => {}
        }
    }
    if let Some(attempts) = r.attempts {
        let _ = write!(line, " attempts={attempts}");
    }
    out.extend_from_slice(line.as_bytes());
    out.extend_from_slice(b" payload=");
    if is_json(&r.payload) {
        out.extend_from_slice(one_line_shown(&r.payload).as_bytes());
    } else {
        quote_into(&r.payload, out);
    }
    out.push(b'\n');
}

/// One record as a line of JSON (JSON Lines). Built by hand around the
/// payload, so that a JSON payload is copied as it was written.
fn json_line(r: &DumpedRecord, out: &mut Vec<u8>) {
    let file = r.path.file_name().map(|n| n.to_string_lossy().into_owned());
    let mut head = json!({
        "seq": r.seq.get(),
        "time_unix_us": r.timestamp_us,
        "key": r.key.as_deref().map(bytes_json),
        "dedup_id": r.dedup_id.as_deref().map(bytes_json),
        "not_before_unix_us": r.not_before_us,
        "segment": file,
        "offset": r.offset,
        "relocated": r.relocated,
        "payload_bytes": r.payload.len(),
    });
    if let (Some(state), Some(map)) = (&r.state, head.as_object_mut()) {
        map.insert("state".into(), state_name(state).into());
        map.insert("attempts".into(), r.attempts.into());
        match state {
            RecordState::Delayed { not_before_us } => {
                map.insert("delayed_until_unix_us".into(), (*not_before_us).into());
            }
            RecordState::Dead { reason, since_us } => {
                map.insert("dead_reason".into(), reason.as_str().into());
                map.insert("dead_since_unix_us".into(), (*since_us).into());
            }
            _ => {}
        }
    }
    let head = head.to_string();
    // The object without its closing brace, then the payload.
    out.extend_from_slice(head.strip_suffix('}').unwrap_or(&head).as_bytes());
    if is_json(&r.payload) {
        out.extend_from_slice(br#","payload_format":"json","payload":"#);
        out.extend_from_slice(&one_line(&r.payload));
    } else if let Ok(text) = std::str::from_utf8(&r.payload) {
        out.extend_from_slice(br#","payload_format":"text","payload":"#);
        out.extend_from_slice(Value::from(text).to_string().as_bytes());
    } else {
        out.extend_from_slice(br#","payload_format":"hex","payload":""#);
        out.extend_from_slice(hex(&r.payload).as_bytes());
        out.push(b'"');
    }
    out.extend_from_slice(b"}\n");
}

/// One record as a hex dump: its line of text without the payload, then 16
/// bytes a line, offset, hex and the printable ones.
fn hex_dump(r: &DumpedRecord, out: &mut Vec<u8>) {
    let mut head = Vec::new();
    let mut payload_less = r.clone();
    payload_less.payload.clear();
    text_line(&payload_less, &mut head);
    let head = String::from_utf8_lossy(&head);
    let head = head.trim_end().trim_end_matches(" payload=\"\"");
    let _ = writeln!(out, "{head} payload_bytes={}", r.payload.len());
    for (k, chunk) in r.payload.chunks(16).enumerate() {
        // The offset, eight hexadecimal digits (more for a payload past 4 GiB).
        let offset = (k as u64) * 16;
        let digits = (16 - offset.leading_zeros() as usize / 4).max(8);
        out.extend_from_slice(b"  ");
        out.extend(
            (0..digits)
                .rev()
                .map(|d| HEX_DIGITS[(offset >> (4 * d)) as usize & 0xf]),
        );
        out.push(b' ');
        for i in 0..16 {
            match chunk.get(i) {
                Some(&b) => {
                    out.push(b' ');
                    out.extend_from_slice(&hex_byte(b));
                }
                None => out.extend_from_slice(b"   "),
            }
            if i == 7 {
                out.push(b' ');
            }
        }
        out.extend_from_slice(b"  |");
        out.extend(chunk.iter().map(|&b| {
            if b.is_ascii_graphic() || b == b' ' {
                b
            } else {
                b'.'
            }
        }));
        out.extend_from_slice(b"|\n");
    }
}

/// Says why `dump` stopped: exit 1 for damage, 2 for anything else, a
/// frame this build does not read included (not damage).
fn dump_failed(e: &segwal::Error) -> ExitCode {
    errln!("segwal: {e}");
    match e {
        segwal::Error::Corrupt { kind, .. } if kind.is_unknown_format() => {
            errln!("{NOT_READ_HERE}");
            ExitCode::from(2)
        }
        segwal::Error::Corrupt { .. } => ExitCode::from(1),
        _ => ExitCode::from(2),
    }
}

/// `segwal dump`: every record from `from`, at most `limit`, in `format`.
fn dump(
    dir: &std::path::Path,
    from: Option<u64>,
    limit: Option<u64>,
    format: Format,
    state: bool,
) -> ExitCode {
    if let Err(code) = an_outbox(dir) {
        return code;
    }
    let mut options = segwal::DumpOptions::new().from(segwal::Seq::from(from.unwrap_or(0)));
    if state {
        options = options.with_states();
    }
    let records = match segwal::dump(dir, options) {
        Ok(records) => records,
        Err(e) => return dump_failed(&e),
    };
    let mut stdout = std::io::BufWriter::with_capacity(1 << 16, std::io::stdout().lock());
    let mut line = Vec::new();
    let limit = limit.map_or(usize::MAX, |n| usize::try_from(n).unwrap_or(usize::MAX));
    for record in records.take(limit) {
        let record = match record {
            Ok(record) => record,
            Err(e) => {
                let _ = stdout.flush();
                return dump_failed(&e);
            }
        };
        line.clear();
        match format {
            Format::Text => text_line(&record, &mut line),
            Format::Json => json_line(&record, &mut line),
            Format::Hex => hex_dump(&record, &mut line),
        }
        if let Err(e) = stdout.write_all(&line) {
            return output_failed(&e);
        }
    }
    match stdout.flush() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => output_failed(&e),
    }
}

/// Stdout failed: a reader that went away (`segwal dump | head`) is no
/// error; anything else is.
fn output_failed(e: &std::io::Error) -> ExitCode {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        return ExitCode::SUCCESS;
    }
    errln!("segwal: writing the output: {e}");
    ExitCode::from(2)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A command's open deletes the acknowledged front it finds and carries
    /// the ids it knows: it must know every id an owner may, whatever the
    /// owner's window and capacity (the largest any outbox takes, and the
    /// outbox opens with them).
    #[test]
    fn a_commands_open_keeps_ids_as_long_as_any_owner() {
        let options = format!("{:?}", tool_options());
        let window = format!("dedup_window: {:?}", segwal::DEDUP_WINDOW_MAX);
        let capacity = format!("dedup_capacity: {}", segwal::DEDUP_CAPACITY_MAX);
        assert!(options.contains(&window), "{options}");
        assert!(options.contains(&capacity), "{options}");
        let dir = tempfile::tempdir().expect("temporary directory");
        let outbox = segwal::Outbox::open(dir.path(), tool_options()).expect("valid options");
        outbox.close().expect("close");
    }

    #[test]
    fn times_known_by_heart() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000000Z");
        assert_eq!(rfc3339(951_782_400_000_000), "2000-02-29T00:00:00.000000Z");
        assert_eq!(
            rfc3339(1_709_251_199_999_999),
            "2024-02-29T23:59:59.999999Z"
        );
        assert_eq!(
            rfc3339(4_107_542_400_000_000),
            "2100-03-01T00:00:00.000000Z"
        );
        assert_eq!(
            rfc3339(253_402_300_799_000_001),
            "9999-12-31T23:59:59.000001Z"
        );
        // Past what RFC 3339 can write, and the largest time a frame holds:
        // printed, never a panic.
        assert_eq!(
            rfc3339(253_402_300_800_000_000),
            "unix_us:253402300800000000"
        );
        assert_eq!(rfc3339(u64::MAX), format!("unix_us:{}", u64::MAX));
    }

    /// The holder of a directory's lock, as `/proc/locks` lists it: not a
    /// process waiting for it, not a lock on another inode or of another
    /// kind, whatever pid the `OWNER` file names.
    #[test]
    fn the_lock_holder_is_read_from_proc_locks() {
        let locks = "1: POSIX  ADVISORY  WRITE 10 fe:00:77 0 EOF\n\
                     2: FLOCK  ADVISORY  WRITE 11 fe:00:78 0 EOF\n\
                     3: FLOCK  ADVISORY  WRITE 7991 fe:00:77 0 EOF\n\
                     3: -> FLOCK  ADVISORY  WRITE 12 fe:00:77 0 EOF\n";
        assert_eq!(flock_holder(locks, 77), Some(7991));
        assert_eq!(flock_holder(locks, 78), Some(11));
        let waiting = "3: -> FLOCK  ADVISORY  WRITE 12 fe:00:77 0 EOF\n";
        assert_eq!(flock_holder(waiting, 77), None);
        assert_eq!(flock_holder("", 77), None);
    }

    #[test]
    fn json_shown_at_a_terminal_escapes_what_a_terminal_would_act_on() {
        let raw = "{\"csi\":\"\u{9b}2J\",\"del\":\"a\u{7f}b\",\"bidi\":\"\u{202e}gnp.exe\",\n\"ls\":\"p\u{2028}q\",\"ok\":\"é\"}";
        assert!(is_json(raw.as_bytes()));
        let shown = one_line_shown(raw.as_bytes());
        assert_eq!(
            shown,
            r#"{"csi":"\u009b2J","del":"a\u007fb","bidi":"\u202egnp.exe", "ls":"p\u2028q","ok":"é"}"#
        );
        // Still the same JSON value.
        let a: serde_json::Value = serde_json::from_str(raw).expect("json");
        let b: serde_json::Value = serde_json::from_str(&shown).expect("json");
        assert_eq!(a, b);
        assert!(preview(raw.as_bytes()).contains("\\u009b2J"));
        // Invisible and hiding characters too; above U+FFFF as a pair.
        let hidden = "[\"a\u{61c}b\u{feff}c\u{200b}d\u{e0041}e\"]";
        let shown = one_line_shown(hidden.as_bytes());
        assert_eq!(shown, r#"["a\u061cb\ufeffc\u200bd\udb40\udc41e"]"#);
        let a: serde_json::Value = serde_json::from_str(hidden).expect("json");
        let b: serde_json::Value = serde_json::from_str(&shown).expect("json");
        assert_eq!(a, b);
        // A preview is cut on the line shown, never through an escape.
        let dels = format!("{{\"a\":\"{}\"}}", "\u{7f}".repeat(3));
        assert_eq!(preview(dels.as_bytes()), r#"{"a":"\u007f\u007f\u007f"}"#);
        let many = format!("{{\"a\":\"{}\"}}", "\u{202e}".repeat(40));
        let cut = preview(many.as_bytes());
        assert!(cut.ends_with("\\u202e..."), "{cut}");
    }

    #[test]
    fn a_dead_letters_preview_shows_json_as_dump_does() {
        assert_eq!(preview(br#"{"n": 1}"#), r#"{"n": 1}"#);
        assert_eq!(preview(b"{\"a\":\n2}"), r#"{"a": 2}"#);
        let long = format!(r#"{{"body":"{}"}}"#, "é".repeat(60));
        let shown = preview(long.as_bytes());
        assert!(shown.ends_with("...") && shown.len() <= 83, "{shown}");
        // Not JSON: escaped.
        assert_eq!(preview(b"say \"hi\"\n"), r#"say \"hi\"\n"#);
    }

    #[test]
    fn json_payloads_go_on_one_line_unchanged_but_for_line_breaks() {
        let pretty = b"{\n  \"b\": 1,\n  \"a\": \"x\\ny\"\r\n}";
        assert!(is_json(pretty));
        let line = one_line(pretty);
        assert_eq!(&*line, &b"{   \"b\": 1,   \"a\": \"x\\ny\"  }"[..]);
        assert!(is_json(&line));
        assert!(!is_json(b"order created"));
        // Not UTF-8, or a string that is not Unicode: shown as text or hex,
        // so that a line of `dump --json` is always JSON a reader takes.
        assert!(!is_json(b"\"\xff\""));
        assert!(!is_json(b"\"a\xc0\xafb\""));
        assert!(!is_json(br#""\ud800""#));
        assert!(!is_json(br#"["\udc00x"]"#));
        assert!(is_json(br#""\ud83d\ude00""#));
        assert!(is_json(br#"["\\ud800", "\u00e9\"\\"]"#));
        assert!(!is_json(br#""\ud83d\u0041""#));
        assert!(!is_json(br#""\ud83d""#));
        // Valid JSON that a Value could not hold is JSON all the same.
        assert!(is_json(b"{\"x\": 1e400}"));
        let deep = format!("{}{}", "[".repeat(300), "]".repeat(300));
        assert!(is_json(deep.as_bytes()));
        assert_eq!(quoted(b"a\"b\n"), r#""a\"b\n""#);
        assert_eq!(quoted(&[0x66, 0xff]), r#""f\xff""#);
        // The fast path and the escaping one agree on what needs escaping.
        assert_eq!(quoted(b"plain text, 42 ~"), r#""plain text, 42 ~""#);
        assert_eq!(quoted(b"it's"), r#""it\'s""#);
        assert_eq!(quoted(b"a\\b"), r#""a\\b""#);
        assert_eq!(quoted("caf\u{e9}\t".as_bytes()), "\"caf\u{e9}\\t\"");
        for b in 0..=u8::MAX {
            let slow = match std::str::from_utf8(&[b]) {
                Ok(text) => format!("\"{}\"", text.escape_debug()),
                Err(_) => format!("\"{}\"", [b].escape_ascii()),
            };
            assert_eq!(quoted(&[b]), slow, "byte {b:#04x}");
        }
        assert_eq!(age(0), "0s");
        assert_eq!(age(3_725_000_000), "1h 2m 5s");
        assert_eq!(age(90_061_500_000), "1day 1h 1m 1s");
    }
}
