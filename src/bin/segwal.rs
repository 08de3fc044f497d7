//! `segwal`: an operator's view of an outbox directory (feature `cli`).
//!
//! ```text
//! cargo install --path . --features cli
//! segwal inspect DIR [--json]
//! segwal verify DIR [--json]
//! segwal dead-letters DIR list [--json] | requeue SEQ... | discard SEQ...
//! segwal repair DIR [--yes]
//! ```
//!
//! `inspect` and `verify` are read-only: they never write, never take the
//! directory's lock, and work while the owner process runs. `dead-letters`
//! and `repair` open the outbox, taking its lock: refused, naming the
//! owner's pid, while the owner runs.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use segwal::{Problem, Verification};
use serde_json::{Value, json};

/// An operator's view of a segwal outbox directory.
#[derive(Parser)]
#[command(name = "segwal", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Segments (first and last seq, bytes, sealed or active), records, disk
    /// use, format version, outbox identity, the owner's pid. Read-only:
    /// never writes, never takes the lock, works while the owner runs.
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
    /// offset, seq and kind), 2 when the directory cannot be read. Read-only:
    /// never writes, never takes the lock, works while the owner runs.
    Verify {
        /// The outbox directory.
        dir: PathBuf,
        /// Print JSON (the schema is in docs/OPERATIONS.md).
        #[arg(long)]
        json: bool,
    },
    /// The dead letters: list them, put some back to be delivered
    /// (requeue), or drop them for good (discard). Opens the outbox, taking
    /// its lock: refused with the owner's pid while the owner runs.
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
    Repair {
        /// The outbox directory.
        dir: PathBuf,
        /// Repair: without it, nothing is changed.
        #[arg(long)]
        yes: bool,
    },
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
    },
    /// Acknowledges these dead letters without delivering them.
    Discard {
        /// Sequence numbers of dead letters.
        #[arg(required = true)]
        seqs: Vec<u64>,
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
            })
        })
        .collect();
    json!({
        "dir": v.dir.display().to_string(),
        "outbox_id": v.outbox_id.map(|id| format!("{id:032x}")),
        "format_version": v.format_version,
        "owner_pid": v.owner_pid,
        "owner_running": v.owner_pid.map(running),
        "records": v.records,
        "bytes": v.bytes,
        "segments": segments,
        "torn_tail": v.torn_tail.as_ref().map(problem_json),
        "problems": v.problems.iter().map(problem_json).collect::<Vec<_>>(),
        "clean": v.is_clean(),
        "repair": v.repair.as_ref().map(|d| json!({
            "file": d.path.display().to_string(),
            "offset": d.offset,
            "first_seq": d.first.get(),
            "last_seq": d.last.map(|s| s.get()),
            "segments_set_aside": d.segments_set_aside.iter().map(|p| p.display().to_string()).collect::<Vec<_>>(),
        })),
    })
}

/// Whether a process `pid` exists (the owner file names the last opener).
fn running(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

fn print_problem(p: &Problem) {
    let seq = p.seq.map_or_else(|| "-".to_owned(), |s| s.to_string());
    println!(
        "  {} offset {} seq {seq}: {}",
        p.path.display(),
        p.offset,
        p.kind
    );
}

fn inspect(v: &Verification) {
    println!("outbox      {}", v.dir.display());
    match v.outbox_id {
        Some(id) => println!("identity    {id:032x}"),
        None => println!("identity    - (no segment yet)"),
    }
    match v.format_version {
        Some(version) => println!("format      version {version}"),
        None => println!("format      -"),
    }
    match v.owner_pid {
        Some(pid) if running(pid) => println!("owner       pid {pid} (running)"),
        Some(pid) => println!("owner       pid {pid} (not running)"),
        None => println!("owner       -"),
    }
    println!(
        "records     {} in the log (acknowledged ones included until their segment goes)",
        v.records
    );
    println!(
        "disk        {} bytes in {} segments",
        v.bytes,
        v.segments.len()
    );
    println!();
    println!(
        "{:>20} {:>20} {:>9} {:>12}  state",
        "first seq", "last seq", "records", "bytes"
    );
    for s in &v.segments {
        let last = s.last_seq.map_or_else(|| "-".to_owned(), |q| q.to_string());
        let state = if s.sealed { "sealed" } else { "active" };
        println!(
            "{:>20} {:>20} {:>9} {:>12}  {state}",
            s.first_seq, last, s.records, s.bytes
        );
    }
    if let Some(torn) = &v.torn_tail {
        println!();
        println!("torn tail (the next open truncates it):");
        print_problem(torn);
    }
    if !v.problems.is_empty() {
        println!();
        println!(
            "damage ({}; `segwal verify` for details):",
            v.problems.len()
        );
        for p in &v.problems {
            print_problem(p);
        }
    }
}

/// Opens the outbox for a command that changes it; the error says who
/// holds it.
fn open(dir: &std::path::Path) -> Result<segwal::Outbox, ExitCode> {
    segwal::Outbox::open(dir, segwal::Options::default()).map_err(|e| {
        match &e {
            segwal::Error::Locked { pid: Some(pid), .. } => eprintln!(
                "segwal: {} is open in process {pid}: stop it first (read-only commands: inspect, verify)",
                dir.display()
            ),
            _ => eprintln!("segwal: {e}"),
        }
        ExitCode::from(2)
    })
}

/// A payload as text for a listing: UTF-8 escaped, at most 80 characters.
fn preview(payload: &[u8]) -> String {
    let text = String::from_utf8_lossy(&payload[..payload.len().min(80)]);
    let mut out: String = text.escape_debug().collect();
    if payload.len() > 80 {
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
        DeadLetterAction::List { json } => match outbox.dead_letters(usize::MAX) {
            Ok(letters) if *json => {
                let list: Vec<Value> = letters
                    .iter()
                    .map(|d| {
                        json!({
                            "seq": d.seq().get(),
                            "attempts": d.attempts(),
                            "reason": d.reason(),
                            "payload_bytes": d.payload().len(),
                            "payload": std::str::from_utf8(d.payload()).ok(),
                        })
                    })
                    .collect();
                println!("{}", Value::Array(list));
            }
            Ok(letters) => {
                println!("{} dead letters", letters.len());
                for d in &letters {
                    println!(
                        "  seq {} after {} attempts: {}\n    {}",
                        d.seq(),
                        d.attempts(),
                        d.reason(),
                        preview(d.payload())
                    );
                }
            }
            Err(e) => {
                eprintln!("segwal: {e}");
                failed = true;
            }
        },
        DeadLetterAction::Requeue { seqs } | DeadLetterAction::Discard { seqs } => {
            let requeue = matches!(action, DeadLetterAction::Requeue { .. });
            for &seq in seqs {
                let seq = segwal::Seq::from(seq);
                let done = if requeue {
                    outbox.requeue(seq)
                } else {
                    outbox.discard(seq)
                };
                match done {
                    Ok(()) => println!("{} {seq}", if requeue { "requeued" } else { "discarded" }),
                    Err(e) => {
                        eprintln!("segwal: seq {seq}: {e}");
                        failed = true;
                    }
                }
            }
        }
    }
    if let Err(e) = outbox.close() {
        eprintln!("segwal: close: {e}");
        failed = true;
    }
    if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

fn repair(dir: &std::path::Path, yes: bool) -> ExitCode {
    let found = match segwal::verify(dir) {
        Ok(v) => v,
        Err(e) => {
            eprintln!("segwal: {e}");
            return ExitCode::from(2);
        }
    };
    if found.is_clean() {
        println!("{}: clean, nothing to repair", found.dir.display());
        return ExitCode::SUCCESS;
    }
    println!("damage found:");
    for p in &found.problems {
        print_problem(p);
    }
    let Some(plan) = &found.repair else {
        eprintln!("segwal: a lossy recovery cannot repair this directory (see the damage above)");
        return ExitCode::from(1);
    };
    let last = plan
        .last
        .map_or_else(|| "none after it".to_owned(), |l| l.to_string());
    println!(
        "a repair drops seqs {} to {last} (from {} at offset {}), and {} later segment files",
        plan.first,
        plan.path.display(),
        plan.offset,
        plan.segments_set_aside.len()
    );
    if !yes {
        println!("nothing changed: run again with --yes to repair");
        return ExitCode::from(1);
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
    for file in files {
        let Some(name) = file.file_name() else {
            continue;
        };
        let to = aside.join(format!("{}.damaged-{stamp}", name.to_string_lossy()));
        let copied = std::fs::create_dir_all(&aside).and_then(|()| std::fs::copy(file, &to));
        match copied {
            Ok(_) => println!("copied {} to {}", file.display(), to.display()),
            Err(e) => {
                eprintln!(
                    "segwal: copying {} aside: {e}; nothing repaired",
                    file.display()
                );
                return ExitCode::from(2);
            }
        }
    }
    let options = segwal::Options::default().recovery(segwal::RecoveryMode::Lossy);
    let outbox = match segwal::Outbox::open(&found.dir, options) {
        Ok(outbox) => outbox,
        Err(e) => {
            eprintln!("segwal: {e}");
            return ExitCode::from(2);
        }
    };
    let report = outbox.recovery_report().clone();
    if let Some(dropped) = &report.dropped {
        let last = dropped
            .last
            .map_or_else(|| "none after it".to_owned(), |l| l.to_string());
        println!("repaired: dropped seqs {} to {last}", dropped.first);
    }
    for q in &report.quarantined {
        println!("set aside {} as {}", q.from.display(), q.to.display());
    }
    println!("{} records kept", report.records_recovered);
    if let Err(e) = outbox.close() {
        eprintln!("segwal: close: {e}");
        return ExitCode::from(2);
    }
    ExitCode::SUCCESS
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let (dir, json) = match &cli.command {
        Command::Inspect { dir, json } | Command::Verify { dir, json } => (dir, json),
        Command::DeadLetters { dir, action } => return dead_letters(dir, action),
        Command::Repair { dir, yes } => return repair(dir, *yes),
    };
    let verification = match segwal::verify(dir) {
        Ok(v) => v,
        Err(e) => {
            eprintln!("segwal: {e}");
            return ExitCode::from(2);
        }
    };
    if *json {
        println!("{}", report_json(&verification));
    } else if matches!(cli.command, Command::Inspect { .. }) {
        inspect(&verification);
    } else {
        println!(
            "{}: {} segments, {} bytes, {} records checked",
            verification.dir.display(),
            verification.segments.len(),
            verification.bytes,
            verification.records
        );
        if let Some(torn) = &verification.torn_tail {
            println!("torn tail (not damage: the next open truncates it):");
            print_problem(torn);
        }
        if verification.is_clean() {
            println!("clean");
        } else {
            println!("damage found:");
            for p in &verification.problems {
                print_problem(p);
            }
        }
    }
    match (
        matches!(cli.command, Command::Verify { .. }),
        verification.is_clean(),
    ) {
        (true, false) => ExitCode::from(1),
        _ => ExitCode::SUCCESS,
    }
}
