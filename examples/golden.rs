//! Writes a small outbox directory in the current format, for the golden
//! files of the test suite (`tests/golden/`): sealed segments, one whose
//! `LogStart` frame moved the log start past deleted segments, and the active
//! segment left by a clean close. Also writes `records.txt`, every record a
//! reopen must hand out, as `seq payload` lines.
//!
//! ```text
//! cargo run --example golden -- tests/golden/vN
//! cargo run --example golden -- --delivery tests/golden/vN-delivery
//! cargo run --example golden -- --producers tests/golden/vN-producers
//! cargo run --example golden -- --checkpoints tests/golden/vN-checkpoints
//! ```
//!
//! With `--delivery`, the directory holds delivery state as well: acks
//! frames, a dead letter and a record delayed for a century, both carried
//! forward by relocation (kind 4 frames) out of segments since deleted.
//! `dead.txt` then lists the dead letters as `seq attempts reason|payload`
//! lines, and `delayed.txt` the number of delayed records.
//!
//! With `--producers`, the records carry what producers say: ordering keys
//! (two keys, their records held back behind each key's first), a record
//! appended not before a century from now, deduplication ids (one whose record
//! was acknowledged and its segment deleted, so a tombstones frame carries it),
//! all described in fields frames (kind 5) of sealed segments. `fields.txt`
//! then holds `delayed N`, `blocked_keys N` and `held_by_key N` lines and a
//! `key SEQ KEY` or `dedup_id SEQ ID` line per record handed out with one.
//!
//! With `--checkpoints`, the directory is what a crash leaves: the segment
//! files of an outbox still open, copied once every append had returned, the
//! newest unsealed and holding index checkpoints (kind `0x86`, one at the
//! start of every sync group past the first block).
//!
//! Run once per format version: the test suite never regenerates golden files,
//! so that a format change cannot silently stop reading directories that exist.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use segwal::{Message, Options, Outbox};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let delivery = args.first().is_some_and(|a| a == "--delivery");
    let producers = args.first().is_some_and(|a| a == "--producers");
    let checkpoints = args.first().is_some_and(|a| a == "--checkpoints");
    if delivery || producers || checkpoints {
        args.remove(0);
    }
    const USAGE: &str =
        "usage: golden [--delivery | --producers | --checkpoints] DIR (DIR must not exist)";
    if args.len() != 1 || args[0].starts_with('-') {
        return Err(USAGE.into());
    }
    let dir = PathBuf::from(&args[0]);
    if dir.exists() {
        return Err(format!("{} exists: golden files are never rewritten", dir.display()).into());
    }
    if delivery {
        write_delivery_log(&dir)?;
    } else if producers {
        write_producers_log(&dir)?;
    } else if checkpoints {
        write_crashed_log(&dir)?;
    } else {
        write_log(&dir)?;
    }
    let manifest = expected_records(&dir)?;
    std::fs::write(dir.join("records.txt"), manifest)?;
    if delivery {
        let (dead, delayed) = expected_delivery_state(&dir)?;
        std::fs::write(dir.join("dead.txt"), dead)?;
        std::fs::write(dir.join("delayed.txt"), format!("{delayed}\n"))?;
    }
    if producers {
        std::fs::write(dir.join("fields.txt"), expected_fields(&dir)?)?;
    }
    // The owner file, the reserve and a file kept for recycling are not
    // part of the format.
    let _ = std::fs::remove_file(dir.join("OWNER"));
    let _ = std::fs::remove_file(dir.join("RESERVE"));
    for entry in std::fs::read_dir(&dir)? {
        let path = entry?.path();
        if path.to_str().is_some_and(|p| p.ends_with(".seg.free")) {
            std::fs::remove_file(path)?;
        }
    }
    println!("wrote {}", dir.display());
    Ok(())
}

fn payload(n: usize) -> String {
    format!("golden record {n:04}: {}", "x".repeat(n % 50))
}

/// Small segments (four blocks: the header's and three of write batches), so
/// that a few dozen records make several of them; some acknowledged, so that
/// segments are deleted behind a `LogStart` frame; batches of several records
/// and single appends.
fn write_log(dir: &Path) -> segwal::Result<()> {
    let outbox = Outbox::open(dir, Options::default().segment_bytes(4 * 4096))?;
    for first in (0..40).step_by(10) {
        let batch: Vec<String> = (first..first + 10).map(payload).collect();
        outbox.append_batch(&batch)?;
    }
    for record in outbox.claim(32)? {
        outbox.ack(record.seq())?;
    }
    outbox.sync()?;
    let batch: Vec<String> = (40..52).map(payload).collect();
    outbox.append_batch(&batch)?;
    for n in 52..58 {
        outbox.append(payload(n).as_bytes())?;
    }
    outbox.close()
}

/// Segments of sixteen blocks, a checkpoint at every sync group past the
/// first block: single appends and batches, the first dozen records
/// acknowledged (their segment deleted), and the segment files copied while
/// the outbox is open, as a crash leaves them.
fn write_crashed_log(dir: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let live = tempfile::tempdir()?;
    let options = Options::default()
        .segment_bytes(16 * 4096)
        .checkpoint_bytes(4096);
    let outbox = Outbox::open(live.path(), options)?;
    for n in 0..12 {
        outbox.append(payload(n).as_bytes())?;
    }
    for record in outbox.claim(12)? {
        outbox.ack(record.seq())?;
    }
    outbox.sync()?;
    for first in (12..40).step_by(7) {
        let batch: Vec<String> = (first..first + 7).map(payload).collect();
        outbox.append_batch(&batch)?;
    }
    for n in 40..60 {
        outbox.append(payload(n).as_bytes())?;
    }
    std::fs::create_dir(dir)?;
    for entry in std::fs::read_dir(live.path())? {
        let entry = entry?;
        if entry.file_name().to_string_lossy().ends_with(".seg") {
            std::fs::copy(entry.path(), dir.join(entry.file_name()))?;
        }
    }
    outbox.close()?;
    Ok(())
}

/// Segments of eight blocks (relocation pays once the copies take at most
/// half a segment); a dead letter and a record delayed for a century
/// among the first records, every other record acknowledged as it comes, until
/// relocation has carried both forward and their first segments are gone;
/// then a few records left pending.
fn write_delivery_log(dir: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let outbox = Outbox::open(dir, Options::default().segment_bytes(8 * 4096))?;
    let century = std::time::Duration::from_secs(100 * 365 * 24 * 3600);
    let mut n = 0;
    while outbox.stats().relocated < 2 || n < 200 {
        if n > 5000 {
            return Err("relocation never ran".into());
        }
        let batch: Vec<String> = (n..n + 10).map(payload).collect();
        outbox.append_batch(&batch)?;
        for record in outbox.claim(10)? {
            match n {
                0 if record.payload() == payload(3).as_bytes() => {
                    outbox.dead_letter(record.seq(), "refused by the golden broker")?
                }
                0 if record.payload() == payload(6).as_bytes() => {
                    outbox.release_after(record.seq(), century, "retry in a century")?
                }
                _ => outbox.ack(record.seq())?,
            }
        }
        outbox.sync()?;
        n += 10;
    }
    let batch: Vec<String> = (n..n + 5).map(payload).collect();
    outbox.append_batch(&batch)?;
    outbox.close()?;
    Ok(())
}

/// Segments of four blocks. An id appended and acknowledged first, then
/// plain records acknowledged until its segment is deleted (a tombstones frame
/// carries the id); then keyed records of two keys, an id still pending and a
/// record not before a century from now, over several sealed segments.
fn write_producers_log(dir: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let outbox = Outbox::open(dir, Options::default().segment_bytes(4 * 4096))?;
    outbox.append_message(&Message::new(b"golden order-1 created").dedup_id(b"order-1/created"))?;
    let mut n = 0;
    while outbox.stats().segments_deleted == 0 {
        if n > 500 {
            return Err("no segment was deleted".into());
        }
        outbox.append(payload(n).as_bytes())?;
        for record in outbox.claim(10)? {
            outbox.ack(record.seq())?;
        }
        outbox.sync()?;
        n += 1;
    }
    for k in 0..12 {
        let key: &[u8] = if k % 3 == 0 {
            b"account-a"
        } else {
            b"account-b"
        };
        outbox.append_message(&Message::new(payload(1000 + k).as_bytes()).key(key))?;
    }
    outbox.append_message(&Message::new(b"golden order-2 created").dedup_id(b"order-2/created"))?;
    let century = std::time::Duration::from_secs(100 * 365 * 24 * 3600);
    outbox.append_message(&Message::new(b"golden reminder in a century").delay(century))?;
    outbox.close()?;
    Ok(())
}

/// What a reopen of `dir` says of its producers' fields, read from a copy.
fn expected_fields(dir: &Path) -> Result<String, Box<dyn std::error::Error>> {
    let (_copy, outbox) = reopen_copy(dir)?;
    let stats = outbox.stats();
    let mut out = format!(
        "delayed {}\nblocked_keys {}\nheld_by_key {}\n",
        stats.delayed, stats.blocked_keys, stats.held_by_key
    );
    for record in outbox.claim(usize::MAX)? {
        if let Some(key) = record.key() {
            writeln!(out, "key {} {}", record.seq(), std::str::from_utf8(key)?)?;
        }
        if let Some(id) = record.dedup_id() {
            writeln!(
                out,
                "dedup_id {} {}",
                record.seq(),
                std::str::from_utf8(id)?
            )?;
        }
    }
    outbox.close()?;
    Ok(out)
}

/// The dead letters (`seq attempts reason|payload` lines) and the number of
/// delayed records a reopen of `dir` finds, read from a copy.
fn expected_delivery_state(dir: &Path) -> Result<(String, u64), Box<dyn std::error::Error>> {
    let (_copy, outbox) = reopen_copy(dir)?;
    let mut out = String::new();
    for dead in outbox.dead_letters(usize::MAX)? {
        let text = std::str::from_utf8(dead.payload())?;
        writeln!(
            out,
            "{} {} {}|{}",
            dead.seq(),
            dead.attempts(),
            dead.reason(),
            text
        )?;
    }
    let delayed = outbox.stats().delayed;
    outbox.close()?;
    Ok((out, delayed))
}

/// A copy of `dir`, opened: a reopen seals the newest segment, and the golden
/// directory must stay as the close left it.
fn reopen_copy(dir: &Path) -> Result<(tempfile::TempDir, Outbox), Box<dyn std::error::Error>> {
    let copy = tempfile::tempdir()?;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        std::fs::copy(entry.path(), copy.path().join(entry.file_name()))?;
    }
    let outbox = Outbox::open(copy.path(), Options::default())?;
    Ok((copy, outbox))
}

/// What a reopen of `dir` hands out, read from a copy.
fn expected_records(dir: &Path) -> Result<String, Box<dyn std::error::Error>> {
    let (_copy, outbox) = reopen_copy(dir)?;
    let mut out = String::new();
    for record in outbox.claim(usize::MAX)? {
        let text = std::str::from_utf8(record.payload())?;
        writeln!(out, "{} {}", record.seq(), text)?;
    }
    outbox.close()?;
    Ok(out)
}
