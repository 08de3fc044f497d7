//! Writes a small outbox directory in the current format, for the golden
//! files of the test suite (`tests/golden/`): sealed segments, one whose
//! `LogStart` frame moved the log start past deleted segments, and the active
//! segment left by a clean close. Also writes `records.txt`, every record a
//! reopen must hand out, as `seq payload` lines.
//!
//! ```text
//! cargo run --example golden -- tests/golden/vN
//! ```
//!
//! Run once per format version: the test suite never regenerates golden files,
//! so that a format change cannot silently stop reading directories that exist.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use segwal::{Options, Outbox};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::args()
        .nth(1)
        .map(PathBuf::from)
        .ok_or("usage: golden DIR (DIR must not exist)")?;
    if dir.exists() {
        return Err(format!("{} exists: golden files are never rewritten", dir.display()).into());
    }
    write_log(&dir)?;
    let manifest = expected_records(&dir)?;
    std::fs::write(dir.join("records.txt"), manifest)?;
    // The owner file is not part of the format.
    let _ = std::fs::remove_file(dir.join("OWNER"));
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

/// What a reopen of `dir` hands out, read from a copy (a reopen seals the
/// newest segment, and the golden directory must stay as the close left it).
fn expected_records(dir: &Path) -> Result<String, Box<dyn std::error::Error>> {
    let copy = tempfile::tempdir()?;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        std::fs::copy(entry.path(), copy.path().join(entry.file_name()))?;
    }
    let outbox = Outbox::open(copy.path(), Options::default())?;
    let mut out = String::new();
    for record in outbox.claim(usize::MAX)? {
        let text = std::str::from_utf8(record.payload())?;
        writeln!(out, "{} {}", record.seq(), text)?;
    }
    outbox.close()?;
    Ok(out)
}
