//! `segwal`: an operator's view of an outbox directory (feature `cli`).
//!
//! ```text
//! cargo install --path . --features cli
//! segwal inspect DIR [--json]
//! segwal verify DIR [--json]
//! ```
//!
//! Both commands are read-only: they never write, never take the
//! directory's lock, and work while the owner process runs.

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

fn main() -> ExitCode {
    let cli = Cli::parse();
    let (Command::Inspect { dir, json } | Command::Verify { dir, json }) = &cli.command;
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
