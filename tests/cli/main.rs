//! The `segwal` command, run as a person would: on real directories (clean,
//! damaged, foreign, and one being written by a running outbox), checking
//! exit codes, what it prints, and that it changes nothing.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use segwal::{Options, Outbox};

#[path = "../support/tmpfs.rs"]
mod tmpfs;

fn segwal(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_segwal"))
        .args(args)
        .output()
        .expect("segwal runs")
}

fn json(out: &Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout).expect("JSON on stdout")
}

/// Every file of `dir` with its bytes, to show a command changed nothing.
fn snapshot(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .expect("read dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.is_file())
        .map(|p| {
            let bytes = std::fs::read(&p).expect("read file");
            (p, bytes)
        })
        .collect();
    files.sort();
    files
}

/// An outbox of several segments, closed: 3,000 records of 1 KiB, half
/// acknowledged.
fn written(dir: &Path) -> u128 {
    let outbox = Outbox::open(dir, Options::default().segment_bytes(1 << 20)).expect("open");
    for i in 0..3_000u32 {
        let mut payload = vec![b'r'; 1024];
        payload[..4].copy_from_slice(&i.to_le_bytes());
        outbox.append(&payload).expect("append");
    }
    for record in outbox.claim(1_500).expect("claim") {
        outbox.ack(record.seq()).expect("ack");
    }
    let id = outbox.id();
    outbox.close().expect("close");
    id
}

fn segments(dir: &Path) -> Vec<PathBuf> {
    let mut segs: Vec<_> = std::fs::read_dir(dir)
        .expect("read dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "seg"))
        .collect();
    segs.sort();
    segs
}

/// Runs `read` while a thread appends records of `size` bytes to `outbox`
/// and, every `every` appends, claims up to `claim` records and acknowledges
/// them (segments go at the back too); the appender stops before `read`'s
/// answer is returned, so that a failed assertion never leaves it running.
fn while_the_owner_appends<T>(
    outbox: &Outbox,
    size: usize,
    every: u64,
    claim: usize,
    read: impl FnOnce() -> T,
) -> T {
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut i = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                outbox.append(&vec![b'w'; size]).expect("append while read");
                i += 1;
                if i.is_multiple_of(every) {
                    for r in outbox.claim(claim).expect("claim") {
                        outbox.ack(r.seq()).expect("ack");
                    }
                }
            }
        });
        std::thread::sleep(Duration::from_millis(200));
        let out = read();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        out
    })
}

#[test]
fn verify_and_inspect_a_clean_outbox() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("outbox");
    let id = written(&dir);
    let before = snapshot(&dir);

    let out = segwal(&["verify", dir.to_str().expect("utf-8")]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("clean"));

    let out = segwal(&["inspect", "--json", dir.to_str().expect("utf-8")]);
    assert_eq!(out.status.code(), Some(0));
    let v = json(&out);
    assert_eq!(v["outbox_id"], format!("{id:032x}"));
    assert_eq!(v["format_version"], 2);
    assert_eq!(v["clean"], true);
    let segs = v["segments"].as_array().expect("segments");
    assert_eq!(segs.len(), segments(&dir).len());
    assert!(segs.len() >= 2, "several segments: {}", segs.len());
    let records: u64 = segs
        .iter()
        .map(|s| s["records"].as_u64().expect("records"))
        .sum();
    // Segments whose records were all acknowledged are gone; the rest hold
    // every pending record (1,500) and some acknowledged ones. The log's
    // records are those, and any that the writer carried forward out of the
    // first segment while the claims were acknowledged one by one, whose own
    // segment is gone (whether it does depends on when it reclaims).
    assert_eq!(v["records"], v["states"]["records"]);
    let in_log = v["records"].as_u64().expect("records");
    assert!(in_log >= records, "{in_log} < {records}");
    assert!((1_500..3_000).contains(&records), "{records}");
    let last = segs.last().expect("a segment")["last_seq"]
        .as_u64()
        .expect("last seq");
    assert!(
        last >= 3_000,
        "the newest segment ends at the last append: {last}"
    );
    // Sealed segments, then the newest.
    assert!(segs[..segs.len() - 1].iter().all(|s| s["sealed"] == true));
    let text = segwal(&["inspect", dir.to_str().expect("utf-8")]);
    assert!(String::from_utf8_lossy(&text.stdout).contains(&format!("{id:032x}")));

    assert_eq!(snapshot(&dir), before, "read-only commands change nothing");
    // The outbox still opens with everything in it.
    let outbox = Outbox::open(&dir, Options::default().segment_bytes(1 << 20)).expect("reopen");
    assert_eq!(outbox.stats().pending, 1_500);
    outbox.close().expect("close");
}

/// `segwal verify DIR | head -1`: a reader that goes away ends the command
/// quietly with its own exit code; output that cannot be written for another
/// reason (a full disk) is said on stderr, exit 2. Never a panic.
#[test]
fn every_command_ends_quietly_when_its_reader_goes_away() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("outbox");
    written(&dir);
    let d = dir.to_str().expect("utf-8");
    let commands: [&[&str]; 7] = [
        &["inspect", d],
        &["inspect", "--json", d],
        &["verify", d],
        &["verify", "--json", d],
        &["dump", d],
        &["dump", "--state", "--format", "json", d],
        &["dead-letters", d, "list"],
    ];
    for args in commands {
        let out = segwal_into(args, |c, gone| c.stdout(gone));
        assert_eq!(
            out.status.code(),
            Some(0),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            out.stderr.is_empty(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        if Path::new("/dev/full").exists() {
            let full = std::fs::OpenOptions::new()
                .write(true)
                .open("/dev/full")
                .expect("/dev/full");
            let out = Command::new(env!("CARGO_BIN_EXE_segwal"))
                .args(args)
                .stdout(full)
                .output()
                .expect("segwal runs");
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(
                out.status.code(),
                Some(2),
                "{args:?} to /dev/full: {stderr}"
            );
            assert!(stderr.contains("writing the output"), "{args:?}: {stderr}");
        }
    }
    // An error said to a stderr that is gone: the exit code still says it.
    let missing = tmp.path().join("no-such-outbox");
    let missing = missing.to_str().expect("utf-8");
    for args in [["verify", missing], ["dump", missing], ["inspect", missing]] {
        let out = segwal_into(&args, |c, gone| c.stderr(gone));
        assert_eq!(out.status.code(), Some(2), "{args:?}");
    }
}

/// `segwal args` with one of its outputs, as `connect` sets it, a pipe
/// whose reader is already gone.
fn segwal_into(
    args: &[&str],
    connect: impl FnOnce(&mut Command, std::io::PipeWriter) -> &mut Command,
) -> Output {
    let (reader, writer) = std::io::pipe().expect("pipe");
    drop(reader);
    let mut command = Command::new(env!("CARGO_BIN_EXE_segwal"));
    command.args(args);
    connect(&mut command, writer).output().expect("segwal runs")
}

#[test]
fn verify_names_the_file_offset_and_seq_of_damage_and_changes_nothing() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("outbox");
    let id = written(&dir);
    // One byte of a record's payload, in the middle of the first segment.
    let first = segments(&dir)[0].clone();
    let mut bytes = std::fs::read(&first).expect("read");
    let at = 300_000;
    bytes[at] ^= 0x40;
    std::fs::write(&first, &bytes).expect("write");
    let before = snapshot(&dir);

    let out = segwal(&["verify", "--json", dir.to_str().expect("utf-8")]);
    assert_eq!(out.status.code(), Some(1), "damage exits 1: {out:?}");
    let v = json(&out);
    assert_eq!(v["clean"], false);
    // A damaged log is still this outbox's: its identity is named.
    assert_eq!(v["outbox_id"], format!("{id:032x}"));
    let problem = &v["problems"][0];
    assert_eq!(problem["file"], first.display().to_string());
    let offset = problem["offset"].as_u64().expect("offset");
    assert!(
        offset <= at as u64 && at as u64 - offset < 4096,
        "offset {offset} near {at}"
    );
    assert!(problem["seq"].as_u64().is_some(), "{problem}");
    assert!(
        problem["kind"].as_str().expect("kind").contains("Checksum"),
        "{problem}"
    );

    let text = segwal(&["verify", dir.to_str().expect("utf-8")]);
    assert_eq!(text.status.code(), Some(1));
    let stdout = String::from_utf8_lossy(&text.stdout);
    assert!(stdout.contains("damage found") && stdout.contains(&first.display().to_string()));
    let inspect = segwal(&["inspect", dir.to_str().expect("utf-8")]);
    let stdout = String::from_utf8_lossy(&inspect.stdout);
    assert!(stdout.contains(&format!("{id:032x}")), "{stdout}");
    assert_eq!(snapshot(&dir), before, "verify changes nothing");

    // Damage in a record's bytes, which the default open (through seal
    // indexes) does not read: it opens all the same, as verify says, and
    // the claim of the damaged record fails naming it.
    assert_eq!(v["default_open_accepts"], true);
    assert!(String::from_utf8_lossy(&text.stdout).contains("No repair is needed"));
    let outbox = Outbox::open(&dir, Options::default()).expect("the default open accepts it");
    let damaged = problem["seq"].as_u64().expect("seq");
    loop {
        match outbox.claim(256) {
            Ok(records) if records.is_empty() => break,
            Ok(records) => {
                assert!(records.iter().all(|r| r.seq().get() != damaged));
                for r in records {
                    outbox.ack(r.seq()).expect("ack");
                }
            }
            Err(segwal::Error::Corrupt { path, seq, .. }) => {
                assert_eq!(path, first);
                assert_eq!(seq.map(|s| s.get()), Some(damaged));
            }
            Err(e) => panic!("{e}"),
        }
    }
    outbox.close().expect("close");
}

#[test]
fn verify_refuses_a_foreign_file_and_leaves_it_alone() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("foreign");
    std::fs::create_dir(&dir).expect("dir");
    let name = dir.join("00000000000000000001.seg");
    std::fs::write(
        &name,
        b"not a segment of segwal, but named like one\n".repeat(100),
    )
    .expect("write");
    let before = snapshot(&dir);
    let out = segwal(&["verify", "--json", dir.to_str().expect("utf-8")]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let v = json(&out);
    assert_eq!(v["problems"][0]["file"], name.display().to_string());
    assert_eq!(v["problems"][0]["offset"], 0);
    assert_eq!(v["default_open_accepts"], false, "no open accepts it");
    assert_eq!(snapshot(&dir), before);

    let out = segwal(&["verify", name.to_str().expect("utf-8")]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "a file is not an outbox directory"
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a directory"));
}

/// A directory of format version 1 (the golden one) is not damage: `dump
/// --state`, which rebuilds the state table as an open would, `dump`,
/// `verify` and `repair --yes` refuse it with exit 2 and the version named,
/// and change nothing; `inspect` names the version. (Without `--state`,
/// `dump` called it damage, exit 1, until 2026-12-06; `verify` and `repair`
/// until 2026-12-07, and `inspect` showed no format, "no segment yet".)
#[test]
fn a_format_version_1_directory_is_refused_with_exit_2_not_called_damage() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("v1");
    std::fs::create_dir(&dir).expect("dir");
    let golden = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/v1");
    for entry in std::fs::read_dir(&golden).expect("golden v1") {
        let from = entry.expect("entry").path();
        std::fs::copy(&from, dir.join(from.file_name().expect("name"))).expect("copy");
    }
    let before = snapshot(&dir);
    for args in [&["dump", "--state"][..], &["dump"][..]] {
        let out = segwal(&[args, &[dir.to_str().expect("utf-8")][..]].concat());
        assert_eq!(out.status.code(), Some(2), "{args:?}: {out:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("version 1"), "{stderr}");
        assert!(out.stdout.is_empty(), "no record printed");
    }
    for args in [&["verify"][..], &["repair", "--yes"][..]] {
        let out = segwal(&[args, &[dir.to_str().expect("utf-8")][..]].concat());
        assert_eq!(out.status.code(), Some(2), "{args:?}: {out:?}");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(stdout.contains("format version 1"), "{args:?}: {stdout}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("this is not damage"), "{args:?}: {stderr}");
    }
    let out = segwal(&["inspect", dir.to_str().expect("utf-8")]);
    assert_eq!(out.status.code(), Some(0));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("format      version 1 (this build does not read all of it)"),
        "{stdout}"
    );
    assert!(!stdout.contains("no segment yet"), "{stdout}");
    let out = segwal(&["inspect", "--json", dir.to_str().expect("utf-8")]);
    assert_eq!(json(&out)["format_version"], 1);
    assert_eq!(snapshot(&dir), before);
}

#[test]
fn read_only_commands_work_while_the_owner_appends() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("outbox");
    let outbox = Outbox::open(&dir, Options::default().segment_bytes(1 << 20)).expect("open");
    let outputs = while_the_owner_appends(&outbox, 700, 64, 64, || {
        let mut outputs = Vec::new();
        for _ in 0..5 {
            outputs.push(segwal(&["verify", "--json", dir.to_str().expect("utf-8")]));
            std::thread::sleep(Duration::from_millis(50));
        }
        outputs
    });
    for out in &outputs {
        // Clean, or a batch caught half written (a torn tail): never refused
        // for the lock, never damage.
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stdout)
        );
        let v = json(out);
        assert_eq!(v["owner_pid"], std::process::id());
        assert_eq!(v["owner_running"], true);
    }
    // The owner was not disturbed.
    outbox.append(b"after").expect("append");
    outbox.close().expect("close");
}

#[test]
fn dead_letters_listed_requeued_and_discarded_and_refused_while_the_owner_runs() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("outbox");
    let d = dir.to_str().expect("utf-8");
    let seqs = {
        let outbox = Outbox::open(&dir, Options::default()).expect("open");
        for payload in [&b"webhook 1"[..], b"webhook 2", b"\xffwebhook\x003"] {
            outbox.append(payload).expect("append");
        }
        let records = outbox.claim(3).expect("claim");
        outbox
            .dead_letter(records[0].seq(), "HTTP 410 Gone")
            .expect("dead letter");
        outbox
            .dead_letter(records[2].seq(), "invalid URL\n\u{1b}[31m")
            .expect("dead letter");
        // The owner is running: commands that change the outbox are refused.
        let refused = segwal(&["dead-letters", d, "list"]);
        assert_eq!(refused.status.code(), Some(2));
        let stderr = String::from_utf8_lossy(&refused.stderr);
        assert!(
            stderr.contains(&format!("process {}", std::process::id())),
            "{stderr}"
        );
        outbox.close().expect("close");
        [
            records[0].seq().get(),
            records[2].seq().get(),
            records[1].seq().get(),
        ]
    };

    let out = segwal(&["dead-letters", d, "list", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let list = json(&out);
    let list = list.as_array().expect("array");
    assert_eq!(list.len(), 2);
    assert_eq!(list[0]["seq"], seqs[0]);
    assert_eq!(list[0]["reason"], "HTTP 410 Gone");
    assert_eq!(list[0]["payload"], "webhook 1");
    assert_eq!(list[1]["reason"], "invalid URL\n\u{1b}[31m");
    // The listing for people escapes what a reason holds (no raw newline,
    // no terminal escape) and counts the dead letters first.
    let out = segwal(&["dead-letters", d, "list"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with("2 dead letters\n"), "{text}");
    assert!(text.contains(": invalid URL\\n\\u{1b}[31m\n"), "{text}");
    assert!(!text.contains('\u{1b}'), "{text}");
    // A payload that is not UTF-8 reads as `dump` shows it.
    assert!(text.contains("    \\xffwebhook\\x003\n"), "{text}");
    assert_eq!(list[1]["payload"], serde_json::Value::Null);

    let out = segwal(&["dead-letters", d, "requeue", &seqs[0].to_string()]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    // One dead letter discarded, one seq never appended, one pending
    // record: the first is done, the others are errors, each said as what
    // it is, in the JSON.
    let out = segwal(&[
        "dead-letters",
        d,
        "discard",
        &seqs[1].to_string(),
        "999999",
        &seqs[2].to_string(),
        "--json",
    ]);
    assert_eq!(out.status.code(), Some(1), "an unknown seq is an error");
    let said = json(&out);
    assert_eq!(said["done"], serde_json::json!([seqs[1]]));
    assert_eq!(said["failed"][0]["seq"], 999999);
    let error = |i: usize| said["failed"][i]["error"].as_str().unwrap_or("").to_owned();
    assert!(error(0).contains("ever appended"), "{}", error(0));
    assert_eq!(said["failed"][1]["seq"], seqs[2]);
    assert!(error(1).contains("not a dead letter"), "{}", error(1));

    let outbox = Outbox::open(&dir, Options::default()).expect("reopen");
    let stats = outbox.stats();
    assert_eq!(stats.dead_letters, 0);
    // The requeued record and the one that never failed are pending.
    let pending: Vec<_> = outbox
        .claim(10)
        .expect("claim")
        .iter()
        .map(|r| r.payload().to_vec())
        .collect();
    assert_eq!(pending, vec![b"webhook 1".to_vec(), b"webhook 2".to_vec()]);
    outbox.close().expect("close");
}

/// `dead-letters` opens the outbox, which would create one at a mistyped
/// path, and `verify` would call an empty directory clean: a path that holds
/// no outbox is refused by every command, exit 2, and left as it was.
#[test]
fn every_command_refuses_a_path_that_holds_no_outbox_and_creates_nothing() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let missing = tmp.path().join("outbx");
    let empty = tmp.path().join("empty");
    std::fs::create_dir(&empty).expect("dir");
    for (dir, says) in [(&missing, "stat directory"), (&empty, "holds no outbox")] {
        let d = dir.to_str().expect("utf-8");
        let dead_letters = [vec!["list"], vec!["requeue", "5"], vec!["discard", "5"]]
            .map(|args| [&["dead-letters", d][..], &args[..]].concat());
        // Nor is it a clean or empty outbox to the other commands.
        let checks = [
            vec!["verify", d],
            vec!["dump", d],
            vec!["inspect", d],
            vec!["repair", d],
            vec!["repair", d, "--yes"],
        ];
        for args in dead_letters.into_iter().chain(checks) {
            let out = segwal(&args);
            assert_eq!(out.status.code(), Some(2), "{args:?}: {out:?}");
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(stderr.contains(says), "{stderr}");
        }
    }
    assert!(!missing.exists(), "no directory made at a mistyped path");
    assert_eq!(
        std::fs::read_dir(&empty).expect("list").count(),
        0,
        "nothing made in an empty directory"
    );
}

#[test]
fn repair_says_what_it_drops_then_keeps_the_damaged_file_aside() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("outbox");
    let d = dir.to_str().expect("utf-8");
    let damaged = damage_a_sealed_segment(&dir);
    let before = snapshot(&dir);

    let out = segwal(&["repair", d]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stdout.contains("a repair drops seqs") && stdout.contains("--yes"),
        "{stdout}{stderr}"
    );
    // The damage lies in a record of a sealed segment, which the default
    // open does not read: the preview says no repair is needed to open.
    assert!(stdout.contains("No repair is needed"), "{stdout}");
    assert_eq!(snapshot(&dir), before, "without --yes nothing changes");

    let out = segwal(&["repair", d, "--yes"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("repaired: dropped seqs"), "{stdout}");
    // The damaged file, byte for byte, is in the quarantine folder.
    let aside: Vec<_> = std::fs::read_dir(dir.join(segwal::QUARANTINE_DIR))
        .expect("quarantine")
        .map(|e| e.expect("entry").path())
        .collect();
    assert!(
        aside
            .iter()
            .any(|p| std::fs::read(p).expect("read") == damaged),
        "{aside:?}"
    );
    assert_eq!(
        segwal(&["verify", d]).status.code(),
        Some(0),
        "clean after the repair"
    );
    let outbox = Outbox::open(&dir, Options::default()).expect("reopen");
    assert!(outbox.stats().pending > 0);
    outbox.close().expect("close");
}

#[test]
fn repair_is_refused_while_the_owner_runs_before_anything_is_copied() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("outbox");
    let d = dir.to_str().expect("utf-8");
    // A record's frame in the oldest segment (the acknowledgements' frames
    // went into the newest, and the block after the middle is no index
    // checkpoint's: an open reads both kinds): the owner opens the damaged
    // log, since under the default `SealIndex` a sealed segment is read
    // through its index and the flipped bit waits for a claim.
    damage_sealed_segment_from_end(&dir, usize::MAX, 1);
    let outbox = Outbox::open(&dir, Options::default()).expect("open");
    let before = snapshot(&dir);
    let out = segwal(&["repair", d, "--yes"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("is open in process {}", std::process::id())),
        "{stderr}"
    );
    assert_eq!(snapshot(&dir), before, "nothing changed");
    assert!(
        !dir.join(segwal::QUARANTINE_DIR).exists(),
        "nothing copied aside"
    );
    outbox.close().expect("close");
    // Once the owner is gone the same command repairs.
    let out = segwal(&["repair", d, "--yes"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
}

/// `repair --yes` on a disk with room for its copy of the first of two
/// damaged files and half the second: refused, exit 2, nothing repaired,
/// and nothing left in `quarantine/`: no part of a file under the name of
/// a whole copy (an operator restoring from there would take it for the
/// file), and not the first copy either (its space would refuse every
/// later run). Mounts a tmpfs: root only.
#[test]
fn repair_on_a_full_disk_leaves_no_part_of_a_copy() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let built = tmp.path().join("built");
    let damaged = damage_a_sealed_segment(&built);
    // A record in the middle of the segment before it, damaged too.
    let segs = segments(&built);
    let newer = segs[segs.len() - 2].file_name().expect("a name").to_owned();
    let older = segs[segs.len() - 3].clone();
    let older_name = older.file_name().expect("a name").to_owned();
    let offsets: Vec<u64> = segwal::dump(&built, segwal::DumpOptions::new())
        .expect("dump")
        // The newer file's damage is an error the dump reads past.
        .filter_map(Result::ok)
        .filter(|r| *r.path == *older && !r.relocated)
        .map(|r| r.offset)
        .collect();
    let mut bytes = std::fs::read(&older).expect("read");
    bytes[offsets[offsets.len() / 2] as usize + 48 + 100] ^= 0x40;
    std::fs::write(&older, &bytes).expect("write");
    // The outbox moved onto a file system with room for it, for the older
    // file's copy and for half the newer's.
    let files: Vec<PathBuf> = std::fs::read_dir(&built)
        .expect("read dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.is_file())
        .collect();
    let pages: u64 = files
        .iter()
        .map(|f| std::fs::metadata(f).expect("stat").len().div_ceil(4096))
        .sum();
    let size = (pages + (bytes.len() as u64).div_ceil(4096) + damaged.len() as u64 / 2 / 4096) * 4;
    let mount_point = tmp.path().join("mnt");
    std::fs::create_dir(&mount_point).expect("mount point");
    let _tmpfs = match tmpfs::Tmpfs::mount(&mount_point, &format!("{size}k")) {
        Ok(tmpfs) => tmpfs,
        Err(why) => {
            println!("skipping: cannot mount tmpfs ({why})");
            return;
        }
    };
    let dir = mount_point.join("outbox");
    std::fs::create_dir(&dir).expect("outbox directory");
    for file in &files {
        let name = file.file_name().expect("a name");
        std::fs::copy(file, dir.join(name)).expect("copy onto the tmpfs");
    }
    let before = snapshot(&dir);
    let damaged_path = dir.join(newer);
    let out = segwal(&["repair", dir.to_str().expect("utf-8"), "--yes"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    // The older file's copy was made, the newer's found no room.
    assert!(
        stderr.contains(&format!("copying {} aside", damaged_path.display()))
            && stderr.contains("nothing repaired"),
        "{stderr}"
    );
    // ... and removed: a copy kept would refuse the next run.
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with("removed ") && l.contains(&*older_name.to_string_lossy())),
        "{stdout}"
    );
    assert_eq!(snapshot(&dir), before, "nothing repaired");
    let aside: Vec<PathBuf> = std::fs::read_dir(dir.join(segwal::QUARANTINE_DIR))
        .map(|entries| entries.map(|e| e.expect("entry").path()).collect())
        .unwrap_or_default();
    assert!(aside.is_empty(), "{aside:?}");
}

/// A closed outbox of several segments (`written`) with one bit flipped in
/// the middle of a sealed segment: a repair drops from there on. Returns the
/// damaged segment's bytes.
fn damage_a_sealed_segment(dir: &Path) -> Vec<u8> {
    damage_sealed_segment_from_end(dir, 2, 0)
}

/// As [`damage_a_sealed_segment`], in the segment `back` from the end of
/// the log (the newest, the active segment, is 1; a `back` past the oldest is
/// the oldest), in the first record at or after the block `blocks` after
/// the middle one.
fn damage_sealed_segment_from_end(dir: &Path, back: usize, blocks: usize) -> Vec<u8> {
    written(dir);
    let segs = segments(dir);
    assert!(segs.len() >= 2, "{segs:?}");
    let sealed = segs[segs.len() - back.min(segs.len())].clone();
    let mut bytes = std::fs::read(&sealed).expect("read");
    // The segment's records, found with `dump`: how the writer batched them,
    // and whether relocation wrote copies or acknowledgements among them,
    // depends on timing, so no offset is assumed (a fixed one can be
    // padding, where a flipped bit is no damage). A record not carried
    // forward where there is one: an open reads a copy's frame, which a
    // test of a log that opens must not damage.
    let records: Vec<(u64, bool)> = segwal::dump(dir, segwal::DumpOptions::new())
        .expect("dump")
        .map(|r| r.expect("record"))
        .filter(|r| *r.path == *sealed)
        .map(|r| (r.offset, r.relocated))
        .collect();
    let from = ((bytes.len() / 2 / 4096 + blocks) * 4096) as u64;
    let (offset, _) = records
        .iter()
        .find(|r| !r.1 && r.0 >= from)
        .or_else(|| records.iter().find(|r| r.0 >= from))
        .or(records.last())
        .copied()
        .expect("a record in the sealed segment");
    // 100 bytes into its payload (of 1,024).
    let at = offset as usize + 48 + 100;
    bytes[at] ^= 0x40;
    std::fs::write(&sealed, &bytes).expect("write");
    bytes
}

/// A stray file named like a segment, which no repair may drop (segwal
/// did not write it): `repair` refuses and says to move it.
#[test]
fn repair_refuses_a_stray_file_named_like_a_segment_and_says_to_move_it() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("outbox");
    written(&dir);
    let stray = dir.join("notes.seg");
    std::fs::write(&stray, b"an operator's notes\n").expect("write");
    let before = snapshot(&dir);
    let out = segwal(&["repair", dir.to_str().expect("utf-8"), "--yes"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&stray.display().to_string()) && stderr.contains("move it out"),
        "{stderr}"
    );
    assert_eq!(snapshot(&dir), before, "nothing changed");
}

#[test]
fn repair_json_says_what_it_would_drop_then_what_it_dropped() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("outbox");
    let d = dir.to_str().expect("utf-8");
    damage_a_sealed_segment(&dir);
    let before = snapshot(&dir);

    let out = segwal(&["repair", d, "--json"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let preview = json(&out);
    assert_eq!(preview["clean"], false);
    assert_eq!(preview["repaired"], false);
    assert!(!preview["problems"].as_array().expect("problems").is_empty());
    let first = preview["would_drop"]["first_seq"]
        .as_u64()
        .expect("first seq");
    // The damaged file is cut (part of it kept), not listed among the later
    // segments; the default open would have opened this log.
    let would = &preview["would_drop"];
    assert_eq!(would["file_set_aside_whole"], false);
    assert!(
        !would["later_segments"]
            .as_array()
            .expect("later")
            .contains(&would["file"]),
        "{would}"
    );
    assert_eq!(preview["default_open_accepts"], true);
    assert_eq!(snapshot(&dir), before, "without --yes nothing changes");

    let out = segwal(&["repair", d, "--yes", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let done = json(&out);
    assert_eq!(done["repaired"], true);
    assert_eq!(
        done["dropped"]["first_seq"], first,
        "it drops what it said it would"
    );
    // Relocation may carry forward the first segment's last claimed records
    // while they are acknowledged one by one (whether it does depends on
    // when the writer reclaims), but every record it carries here is
    // acknowledged after its copy is written: the acknowledgement is kept,
    // or read from what is dropped, so that none is named. The list is
    // there, and empty, both times.
    assert_eq!(
        preview["would_drop"]["relocated_seqs"],
        serde_json::json!([])
    );
    assert_eq!(done["dropped"]["relocated_seqs"], serde_json::json!([]));
    assert!(!done["copied"].as_array().expect("copied").is_empty());
    assert!(done["records_kept"].as_u64().expect("kept") > 0);

    let out = segwal(&["repair", d, "--json"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(json(&out)["clean"], true);
}

fn lines(out: &Output) -> Vec<serde_json::Value> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

fn seqs_of(records: &[serde_json::Value]) -> Vec<u64> {
    records
        .iter()
        .map(|r| r["seq"].as_u64().expect("seq"))
        .collect()
}

/// An outbox of 40 records (several segments): JSON payloads, text, bytes,
/// one with a key and an id. Returns the seq of each.
fn varied(dir: &Path) -> Vec<u64> {
    let outbox = Outbox::open(dir, Options::default().segment_bytes(1 << 20)).expect("open");
    let mut seqs = Vec::new();
    for i in 0..40u32 {
        let payload = match i % 4 {
            0 => format!("{{\"order\": {i},\n \"zeta\": 1, \"alpha\": \"a\\nb\"}}").into_bytes(),
            1 => format!("order {i} created").into_bytes(),
            2 => vec![0xff, 0x00, i as u8],
            _ => vec![b'x'; 200_000],
        };
        let seq = if i == 5 {
            outbox
                .append_message(
                    &segwal::Message::new(&payload)
                        .key(b"account-42")
                        .dedup_id(b"order-5/created"),
                )
                .expect("append")
                .seq
        } else {
            outbox.append(&payload).expect("append")
        };
        seqs.push(seq.get());
    }
    outbox.close().expect("close");
    seqs
}

#[test]
fn dump_prints_every_record_in_seq_order_from_a_seq_and_up_to_a_limit() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("outbox");
    let d = dir.to_str().expect("utf-8");
    let seqs = varied(&dir);
    // Records nobody acknowledged: none relocated, each in its place.
    assert!(segments(&dir).len() >= 2, "several segments");
    let before = snapshot(&dir);

    let out = segwal(&["dump", d, "--format", "json"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    // `--json` is the same as `--format json`, as for the other commands.
    assert_eq!(segwal(&["dump", d, "--json"]).stdout, out.stdout);
    let records = lines(&out);
    assert_eq!(seqs_of(&records), seqs, "every record once, in seq order");
    // A JSON payload is printed as JSON (on one line, its keys in their
    // order); text as a string; other bytes as hex.
    let first = &records[0];
    assert_eq!(first["payload_format"], "json");
    assert_eq!(first["payload"]["order"], 0);
    assert_eq!(first["payload"]["alpha"], "a\nb");
    let line = String::from_utf8_lossy(&out.stdout)
        .lines()
        .next()
        .map(str::to_owned);
    let line = line.expect("a line");
    assert!(
        line.find("\"zeta\"") < line.find("\"alpha\""),
        "keys in the payload's order: {line}"
    );
    assert_eq!(records[1]["payload_format"], "text");
    assert_eq!(records[1]["payload"], "order 1 created");
    assert_eq!(records[2]["payload_format"], "hex");
    assert_eq!(records[2]["payload"], "ff0002");
    assert_eq!(records[3]["payload_bytes"], 200_000);
    assert_eq!(records[5]["key"], "account-42");
    assert_eq!(records[5]["dedup_id"], "order-5/created");
    assert_eq!(records[4]["key"], serde_json::Value::Null);
    assert!(
        records[0].get("state").is_none(),
        "no state without --state"
    );
    // Times: the frames' own, microseconds since the epoch, not decreasing.
    let now_us = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_micros() as u64;
    let times: Vec<u64> = records
        .iter()
        .map(|r| r["time_unix_us"].as_u64().expect("time"))
        .collect();
    assert!(times.windows(2).all(|w| w[0] <= w[1]), "{times:?}");
    assert!(now_us - times[0] < 600_000_000, "{} {now_us}", times[0]);

    // --from and --limit.
    let from = seqs[17].to_string();
    let out = segwal(&[
        "dump", d, "--format", "json", "--from", &from, "--limit", "5",
    ]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(seqs_of(&lines(&out)), seqs[17..22].to_vec());
    // A seq between records starts at the next one.
    let out = segwal(&[
        "dump",
        d,
        "--format",
        "json",
        "--from",
        &(seqs[39] + 1).to_string(),
    ]);
    assert_eq!(lines(&out).len(), 0);

    // Text: one line per record, the time as RFC 3339, JSON as JSON.
    let out = segwal(&["dump", d, "--limit", "6"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    let text_lines: Vec<&str> = text.lines().collect();
    assert_eq!(text_lines.len(), 6, "{text}");
    assert!(
        text_lines[0].starts_with(&format!("seq={} time=20", seqs[0])),
        "{text}"
    );
    assert!(text_lines[0].contains("Z payload={"), "{text}");
    assert!(
        text_lines[1].ends_with("payload=\"order 1 created\""),
        "{text}"
    );
    assert!(
        text_lines[2].ends_with(r#"payload="\xff\x00\x02""#),
        "{text}"
    );
    assert!(
        text_lines[5].contains("key=\"account-42\" dedup_id=\"order-5/created\""),
        "{text}"
    );

    // Hex: a dump of each payload.
    let out = segwal(&["dump", d, "--format", "hex", "--limit", "1"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with(&format!("seq={} ", seqs[0])), "{text}");
    assert!(text.contains("payload_bytes=41"), "{text}");
    assert!(
        text.contains(
            "  00000000  7b 22 6f 72 64 65 72 22  3a 20 30 2c 0a 20 22 7a  |{\"order\": 0,. \"z|"
        ),
        "{text}"
    );

    assert_eq!(snapshot(&dir), before, "dump changes nothing");
    let help = segwal(&["dump", "--help"]);
    assert!(
        String::from_utf8_lossy(&help.stdout).contains("Read-only"),
        "{help:?}"
    );
}

#[test]
fn dump_state_shows_acknowledged_dead_delayed_held_and_attempts() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("outbox");
    let d = dir.to_str().expect("utf-8");
    let options = || Options::default().max_attempts(5);
    let seqs: Vec<u64> = {
        let outbox = Outbox::open(&dir, options()).expect("open");
        let mut seqs = Vec::new();
        for i in 0..6u32 {
            seqs.push(
                outbox
                    .append(format!("r{i}").as_bytes())
                    .expect("append")
                    .get(),
            );
        }
        // Two records of one key: the second waits for the first.
        for payload in [&b"k1"[..], b"k2"] {
            let m = segwal::Message::new(payload).key(b"k");
            seqs.push(outbox.append_message(&m).expect("append").seq.get());
        }
        let claimed = outbox.claim(5).expect("claim");
        assert_eq!(claimed.len(), 5);
        outbox.ack(claimed[0].seq()).expect("ack");
        outbox.ack(claimed[1].seq()).expect("ack");
        outbox
            .dead_letter(claimed[2].seq(), "HTTP 410 Gone")
            .expect("dead letter");
        outbox
            .release_after(claimed[3].seq(), Duration::from_secs(3_600), "broker down")
            .expect("release");
        // Delivered once, then released at once: pending, one attempt.
        outbox.release(claimed[4].seq()).expect("release");
        outbox.close().expect("close");
        seqs
    };

    let out = segwal(&["dump", d, "--format", "json", "--state"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let records = lines(&out);
    assert_eq!(seqs_of(&records), seqs);
    let states: Vec<&str> = records
        .iter()
        .map(|r| r["state"].as_str().expect("state"))
        .collect();
    assert_eq!(
        states,
        [
            "acknowledged",
            "acknowledged",
            "dead",
            "delayed",
            "pending",
            "pending",
            "pending",
            "held_by_key"
        ]
    );
    assert_eq!(records[2]["dead_reason"], "HTTP 410 Gone");
    assert_eq!(records[2]["attempts"], 1);
    let until = records[3]["delayed_until_unix_us"].as_u64().expect("until");
    let now_us = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_micros() as u64;
    assert!(
        (now_us + 3_500_000_000..now_us + 3_700_000_000).contains(&until),
        "an hour ahead: {until} {now_us}"
    );
    assert_eq!(records[4]["attempts"], 1, "{}", records[4]);
    assert_eq!(records[5]["attempts"], 0, "{}", records[5]);

    let text = segwal(&["dump", d, "--state"]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains(" state=dead since=20")
            && text.contains("reason=\"HTTP 410 Gone\" attempts=1"),
        "{text}"
    );
    assert!(text.contains(" state=delayed until=20"), "{text}");
    assert!(
        text.contains(" key=\"k\" state=held_by_key attempts=0"),
        "{text}"
    );
}

#[test]
fn inspect_counts_disk_bytes_as_the_owner_does() {
    // A segment with no frame yet (a new outbox's, the one an open starts
    // after sealing the last) was left out of `inspect`'s figure: 4 KiB
    // below what the owner's `Stats::disk_bytes` said a moment before.
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("outbox");
    let d = dir.to_str().expect("utf-8");
    for appended in [0u32, 20, 0] {
        let outbox = Outbox::open(&dir, Options::default()).expect("open");
        for i in 0..appended {
            outbox.append(&i.to_le_bytes()).expect("append");
        }
        let owner = outbox.stats().disk_bytes;
        outbox.close().expect("close");
        let out = segwal(&["inspect", "--json", d]);
        assert_eq!(out.status.code(), Some(0), "{out:?}");
        let v = json(&out);
        assert_eq!(v["stats"]["disk_bytes"], owner, "after {appended}: {v}");
    }
}

#[test]
fn inspect_counts_the_records_in_each_state() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("outbox");
    let d = dir.to_str().expect("utf-8");
    let mut seqs = Vec::new();
    let owner = {
        let outbox = Outbox::open(&dir, Options::default().segment_bytes(1 << 20)).expect("open");
        for i in 0..3_000u32 {
            let mut payload = vec![b'r'; 1024];
            payload[..4].copy_from_slice(&i.to_le_bytes());
            seqs.push(outbox.append(&payload).expect("append"));
        }
        for record in outbox.claim(1_500).expect("claim") {
            outbox.ack(record.seq()).expect("ack");
        }
        let two = outbox.claim(2).expect("claim");
        outbox.dead_letter(two[0].seq(), "refused").expect("dead");
        outbox
            .release_after(two[1].seq(), Duration::from_secs(600), "later")
            .expect("release");
        outbox.sync().expect("sync");
        let owner = serde_json::to_value(outbox.stats()).expect("stats as JSON");
        outbox.close().expect("close");
        owner
    };
    let out = segwal(&["inspect", "--json", d]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let v = json(&out);
    // `stats` is the owner's `Outbox::stats()` as JSON, field for field:
    // the same names, and the same values where the log knows them (what
    // only the owner knows is null).
    let stats = v["stats"].as_object().expect("stats");
    let names = |o: &serde_json::Map<String, serde_json::Value>| {
        o.keys().cloned().collect::<std::collections::BTreeSet<_>>()
    };
    assert_eq!(names(stats), names(owner.as_object().expect("object")));
    for field in [
        "pending",
        "delayed",
        "dead_letters",
        "blocked_keys",
        "held_by_key",
        "backlog_bytes",
        "first_seq",
    ] {
        assert_eq!(stats[field], owner[field], "{field}");
    }
    assert_eq!(stats["claimed"], serde_json::Value::Null);
    // Headers and frames, as the owner counts them: not the files' lengths,
    // which a running owner's reserved space would inflate.
    let disk = stats["disk_bytes"].as_u64().expect("disk bytes");
    assert!(
        disk > 0 && disk <= v["bytes"].as_u64().expect("bytes"),
        "{v}"
    );
    assert!(stats["oldest_pending_age_us"].as_u64().is_some());
    let states = &v["states"];
    assert_eq!(states["pending"], 1_498, "{states}");
    assert_eq!(states["dead"], 1);
    assert_eq!(states["delayed"], 1);
    assert_eq!(states["held_by_key"], 0);
    assert_eq!(states["claimed"], serde_json::Value::Null);
    // Acknowledged: the records on disk that are not live (some in their
    // own segments, some only as relocated copies: while the 1,500 claimed
    // records waited for their acks, relocation carried some forward).
    let records = states["records"].as_u64().expect("records");
    assert_eq!(states["acknowledged"], records - 1_500, "{states}");
    let in_place = v["records"].as_u64().expect("records");
    assert!(
        in_place > 1_500 && in_place <= records && records < 3_000,
        "{v}"
    );
    let oldest = &states["oldest_pending"];
    assert_eq!(oldest["seq"], seqs[1_502].get(), "{oldest}");
    assert!(
        oldest["age_us"].as_u64().expect("age") < 600_000_000,
        "{oldest}"
    );
    // Live records per segment add up; the sealed ones holding some are
    // the held segments.
    let segs = v["segments"].as_array().expect("segments");
    let live: Vec<u64> = segs
        .iter()
        .map(|s| s["live_records"].as_u64().expect("live"))
        .collect();
    assert_eq!(live.iter().sum::<u64>(), 1_500, "{live:?}");
    let held: Vec<u64> = segs
        .iter()
        .zip(&live)
        .filter(|(s, n)| s["sealed"] == true && **n > 0)
        .map(|(_, n)| *n)
        .collect();
    assert_eq!(states["held_segments"], held.len());
    assert_eq!(states["held_by_records"], held.iter().sum::<u64>());
    assert!(!held.is_empty());

    let text = segwal(&["inspect", d]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("1498 pending, 0 held back by a key, 1 delayed, 1 dead"),
        "{text}"
    );
    assert!(
        text.contains("claimed     known only to the running owner"),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "oldest      pending seq {}, appended 20",
            seqs[1_502]
        )),
        "{text}"
    );
}

#[test]
fn dump_of_a_damaged_log_prints_the_records_before_and_names_the_file_and_offset() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("outbox");
    let d = dir.to_str().expect("utf-8");
    written(&dir);
    let first = segments(&dir)[0].clone();
    let mut bytes = std::fs::read(&first).expect("read");
    bytes[300_000] ^= 0x40;
    std::fs::write(&first, &bytes).expect("write");
    let verified = json(&segwal(&["verify", "--json", d]));
    let problem = &verified["problems"][0];
    let (offset, seq) = (
        problem["offset"].as_u64().expect("offset"),
        problem["seq"].as_u64().expect("seq"),
    );

    let out = segwal(&["dump", d, "--format", "json"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&first.display().to_string())
            && stderr.contains(&format!("offset {offset}"))
            && stderr.contains("checksum"),
        "{stderr}"
    );
    let printed = seqs_of(&lines(&out));
    assert!(!printed.is_empty());
    assert!(
        printed.iter().all(|&s| s < seq),
        "only records before the damage"
    );
    assert_eq!(*printed.last().expect("a record"), seq - 1);

    let gone = segwal(&["dump", &format!("{d}-missing")]);
    assert_eq!(gone.status.code(), Some(2), "{gone:?}");
}

/// What an open refuses, `dump` does not pass over in silence: a segment
/// cut short (its tail and seal lost), a segment missing from the middle of
/// the chain, and a file named like a segment that is not one each end the
/// dump with exit 1 naming the file, after the records before them.
#[test]
fn dump_ends_at_a_lost_tail_a_missing_segment_or_a_foreign_file_as_an_open_would() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let build = |name: &str| {
        let dir = tmp.path().join(name);
        let outbox = Outbox::open(&dir, Options::default().segment_bytes(64 << 10)).expect("open");
        for _ in 0..300 {
            outbox.append(&[b'p'; 1000]).expect("append");
        }
        outbox.close().expect("close");
        let records: Vec<_> = segwal::dump(&dir, segwal::DumpOptions::new())
            .expect("dump")
            .map(|r| r.expect("record"))
            .collect();
        (dir, records)
    };
    let refused = |dir: &Path, file: &Path, says: &str, last: Option<u64>| {
        let out = segwal(&["dump", dir.to_str().expect("utf-8"), "--format", "json"]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert!(
            stderr.contains(&file.display().to_string()) && stderr.contains(says),
            "{stderr}"
        );
        assert_eq!(seqs_of(&lines(&out)).last().copied(), last, "{stderr}");
    };

    // The second segment cut at its fifth record: its tail and seal lost.
    let (dir, records) = build("cut");
    let second = segments(&dir)[1].clone();
    let in_second: Vec<_> = records.iter().filter(|r| *r.path == *second).collect();
    assert!(in_second.len() > 5 && segments(&dir).len() >= 3);
    let cut = &in_second[4];
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(&second)
        .expect("open");
    file.set_len(cut.offset).expect("cut");
    refused(&dir, &second, "seal", Some(cut.seq.get() - 1));

    // The second segment removed: the third does not follow the first.
    let (dir, records) = build("missing");
    let [first, second, third] = [0, 1, 2].map(|k| segments(&dir)[k].clone());
    std::fs::remove_file(&second).expect("remove");
    let last_of_first = records
        .iter()
        .filter(|r| *r.path == *first)
        .map(|r| r.seq.get())
        .max();
    refused(&dir, &third, "missing segment", last_of_first);

    // A text file named like a segment, alone.
    let dir = tmp.path().join("foreign");
    std::fs::create_dir(&dir).expect("dir");
    let name = dir.join("00000000000000000001.seg");
    std::fs::write(&name, b"not a segment\n".repeat(400)).expect("write");
    refused(&dir, &name, "magic", None);

    // An operator's notes named with the segment suffix, beside a whole log:
    // an open refuses the directory, and so does every dump.
    let (dir, _) = build("notes");
    let notes = dir.join("notes.seg");
    std::fs::write(&notes, b"hi\n").expect("write");
    refused(&dir, &notes, "segment", None);
    let out = segwal(&["dump", dir.to_str().expect("utf-8"), "--state"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("notes.seg"));
}

#[test]
fn dump_while_the_owner_appends_stops_at_what_was_written() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("outbox");
    let d = dir.to_str().expect("utf-8");
    let outbox = Outbox::open(&dir, Options::default().segment_bytes(1 << 20)).expect("open");
    let outputs = while_the_owner_appends(&outbox, 700, 64, 64, || {
        let mut outputs = Vec::new();
        for k in 0..6 {
            let state = if k % 2 == 0 {
                "--format=json"
            } else {
                "--state"
            };
            let mut args = vec!["dump", d, "--format", "json"];
            if state == "--state" {
                args.push("--state");
            }
            outputs.push(segwal(&args));
            std::thread::sleep(Duration::from_millis(30));
        }
        outputs
    });
    // A dump lists the segments, then reads them: one whose listing saw
    // only a segment that the owner then acknowledged to the end and
    // deleted (every 64 appends here, each segment about 250 records)
    // finds nothing and says so, which is right; about one dump in a
    // hundred here. Most find records.
    let mut found = 0;
    for out in &outputs {
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let seqs = seqs_of(&lines(out));
        found += usize::from(!seqs.is_empty());
        assert!(seqs.windows(2).all(|w| w[0] < w[1]), "seqs increase");
    }
    assert!(found >= 3, "only {found} of 6 dumps found records");
    outbox.close().expect("close");
}

/// `segwal verify` on a terminal (a tmux pane) and a log of more than eight
/// segments draws its progress bar on stderr.
#[test]
fn verify_on_a_terminal_shows_a_progress_bar() {
    let has_tmux = Command::new("tmux")
        .arg("-V")
        .output()
        .is_ok_and(|o| o.status.success());
    if !has_tmux {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "tmux is missing on CI (.ci/run installs it)"
        );
        eprintln!("skipped: tmux is not installed (CI installs it)");
        return;
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("outbox");
    {
        let outbox = Outbox::open(&dir, Options::default().segment_bytes(1 << 20)).expect("open");
        for _ in 0..12 {
            let batch: Vec<Vec<u8>> = (0..100).map(|_| vec![b'p'; 10_000]).collect();
            let messages: Vec<segwal::Message<'_>> =
                batch.iter().map(|p| segwal::Message::new(p)).collect();
            outbox.append_messages(&messages).expect("append");
        }
        outbox.close().expect("close");
    }
    assert!(segments(&dir).len() > 8, "{}", segments(&dir).len());
    let session = format!("segwal-progress-{}", std::process::id());
    let done = tmp.path().join("done");
    let script = format!(
        "{} verify {} > /dev/null; echo $? > {}; sleep 30",
        env!("CARGO_BIN_EXE_segwal"),
        dir.display(),
        done.display()
    );
    let started = Command::new("tmux")
        .args([
            "new-session",
            "-d",
            "-x",
            "200",
            "-y",
            "50",
            "-s",
            &session,
            &script,
        ])
        .status()
        .expect("tmux runs");
    assert!(started.success());
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !done.exists() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let pane = Command::new("tmux")
        .args(["capture-pane", "-p", "-t", &session])
        .output()
        .expect("capture");
    let _ = Command::new("tmux")
        .args(["kill-session", "-t", &session])
        .status();
    let pane = String::from_utf8_lossy(&pane.stdout);
    assert_eq!(
        std::fs::read_to_string(&done).expect("exit code").trim(),
        "0",
        "{pane}"
    );
    assert!(
        pane.contains("verify [") && pane.contains(" (100%)"),
        "{pane}"
    );
}

/// A dead letter at the start of the log keeps its segment, and every later
/// one, on disk, until the writer carries it forward (relocation) into the
/// active segment and deletes the rest: the record is then on disk only as a
/// copy, numbered below every segment. A dump prints it once, at its own
/// seq, first.
#[test]
fn dump_prints_a_relocated_record_once_at_its_own_seq() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("outbox");
    let d = dir.to_str().expect("utf-8");
    let (dead, late) = {
        let outbox = Outbox::open(&dir, Options::default().segment_bytes(1 << 20)).expect("open");
        for i in 0..3_000u32 {
            let mut payload = vec![b'r'; 1024];
            payload[..4].copy_from_slice(&i.to_le_bytes());
            outbox.append(&payload).expect("append");
        }
        let records = outbox.claim(3_000).expect("claim");
        outbox
            .dead_letter(records[0].seq(), "poison")
            .expect("dead letter");
        let rest: Vec<segwal::Seq> = records[1..].iter().map(|r| r.seq()).collect();
        outbox.ack_many(&rest).expect("ack");
        let mut late = Vec::new();
        for i in 3_000..3_010u32 {
            let mut payload = vec![b'r'; 1024];
            payload[..4].copy_from_slice(&i.to_le_bytes());
            late.push(outbox.append(&payload).expect("append").get());
        }
        let stats = outbox.stats();
        outbox.close().expect("close");
        assert!(stats.relocated >= 1, "{stats:?}");
        (records[0].seq().get(), late)
    };
    let inspected = json(&segwal(&["inspect", "--json", d]));
    let states = &inspected["states"];
    assert_eq!(states["dead"], 1, "{states}");
    assert_eq!(states["pending"], 10, "{states}");
    let oldest = inspected["segments"][0]["first_seq"]
        .as_u64()
        .expect("first seq");
    assert!(dead < oldest, "its segment is gone: {dead} {oldest}");

    let out = segwal(&["dump", d, "--format", "json", "--state"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let records = lines(&out);
    assert_eq!(records.len() as u64, states["records"], "{states}");
    let first = &records[0];
    assert_eq!(first["seq"], dead);
    assert_eq!(first["relocated"], true);
    assert_eq!(first["state"], "dead");
    assert_eq!(first["dead_reason"], "poison");
    let seqs = seqs_of(&records);
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "each once, in order");
    assert_eq!(seqs.iter().filter(|&&s| s == dead).count(), 1);
    assert!(late.iter().all(|s| seqs.contains(s)), "{seqs:?}");
    // The index each payload starts with follows the seqs: the copy holds
    // the record's own payload.
    let index = |r: &serde_json::Value| {
        let payload = r["payload"].as_str().expect("payload");
        let bytes: Vec<u8> = match r["payload_format"].as_str() {
            Some("hex") => (0..4)
                .map(|k| u8::from_str_radix(&payload[2 * k..2 * k + 2], 16).expect("hex"))
                .collect(),
            _ => payload.as_bytes()[..4].to_vec(),
        };
        u32::from_le_bytes(bytes.try_into().expect("four bytes"))
    };
    let indexes: Vec<u32> = records.iter().map(index).collect();
    assert_eq!(indexes[0], 0);
    assert!(indexes.windows(2).all(|w| w[0] < w[1]), "{indexes:?}");
    assert_eq!(*indexes.last().expect("a record"), 3_009);
    // Without --state, the same records; from a seq above the copy, not it.
    let plain = lines(&segwal(&["dump", d, "--format", "json"]));
    assert_eq!(seqs_of(&plain), seqs);
    let from = segwal(&[
        "dump",
        d,
        "--format",
        "json",
        "--from",
        &(dead + 1).to_string(),
    ]);
    assert_eq!(seqs_of(&lines(&from)), seqs[1..].to_vec());
}

/// Acknowledgements and dead letters are written after the records they
/// settle, here in a later segment: a repair that drops that segment's
/// frames keeps the records and drops what settled them. The dry run says
/// so, and the counts after the repair show it.
#[test]
fn repair_says_which_acknowledgements_and_dead_letters_of_kept_records_it_drops() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("outbox");
    let d = dir.to_str().expect("utf-8");
    let big = vec![b'b'; 700 << 10];
    let outbox = Outbox::open(&dir, Options::default().segment_bytes(1 << 20)).expect("open");
    for i in 0..10u8 {
        outbox.append(&[b's', i]).expect("append");
    }
    outbox.append(&big).expect("filler, first segment");
    // Does not fit: it starts the second segment.
    let first_of_second = outbox.append(&big).expect("second segment");
    let small = outbox.claim(10).expect("claim");
    assert_eq!(small.len(), 10);
    for r in &small[..6] {
        outbox.ack(r.seq()).expect("ack");
    }
    for r in &small[6..8] {
        outbox.dead_letter(r.seq(), "refused").expect("dead letter");
    }
    outbox.sync().expect("sync");
    outbox.append(&big).expect("third segment");
    outbox.close().expect("close");
    let (seg, offset) = segwal::dump(&dir, segwal::DumpOptions::new())
        .expect("dump")
        .map(|r| r.expect("record"))
        .find(|r| r.seq == first_of_second)
        .map(|r| (r.path.to_path_buf(), r.offset))
        .expect("the second segment's first record");
    assert_ne!(seg, segments(&dir)[0], "it starts the second segment");
    let mut bytes = std::fs::read(&seg).expect("read");
    bytes[offset as usize + 48 + 1000] ^= 0x40;
    std::fs::write(&seg, &bytes).expect("write");

    let out = segwal(&["repair", d]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("6 acknowledged records are unacknowledged again")
            && stdout.contains("2 records go back"),
        "{stdout}"
    );
    let preview = json(&segwal(&["repair", d, "--json"]));
    assert_eq!(preview["would_drop"]["first_seq"], first_of_second.get());
    assert_eq!(preview["would_drop"]["acks_dropped"], 6);
    assert_eq!(preview["would_drop"]["changes_dropped"], 2);

    let done = json(&segwal(&["repair", d, "--yes", "--json"]));
    assert_eq!(done["repaired"], true, "{done}");
    assert_eq!(done["dropped"]["acks_dropped"], 6);
    // The ten small records and the filler, all pending: none of what the
    // dropped frames settled holds.
    assert_eq!(done["records_kept"], 11, "{done}");
    assert_eq!(
        done["states_kept"],
        serde_json::json!({"pending": 11, "held_by_key": 0, "delayed": 0, "dead": 0, "acknowledged": 0})
    );
}

/// `dump --state` on a log that rotates faster than it is read: the
/// segments the owner creates during a pass are read too (as `verify`
/// reads them), never taken for a missing segment.
#[test]
fn dump_state_follows_a_log_that_rotates_while_it_is_read() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("outbox");
    let d = dir.to_str().expect("utf-8");
    let outbox = Outbox::open(&dir, Options::default().segment_bytes(8 << 10)).expect("open");
    let outputs: Vec<Output> = while_the_owner_appends(&outbox, 500, 256, 200, || {
        (0..40).map(|_| segwal(&["dump", d, "--state"])).collect()
    });
    for out in &outputs {
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    outbox.close().expect("close");
}

/// An `OWNER` file naming a process that exists but does not hold the
/// outbox (a pid reused after a crash or a reboot) is not a running owner;
/// the process holding the lock is, while it holds it.
#[test]
fn a_stale_owner_pid_is_not_taken_for_a_running_owner() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("outbox");
    let d = dir.to_str().expect("utf-8");
    let outbox = Outbox::open(&dir, Options::default()).expect("open");
    outbox.append(b"x").expect("append");
    let live = json(&segwal(&["inspect", "--json", d]));
    assert_eq!(live["owner_running"], true, "{live}");
    outbox.close().expect("close");
    // This test's own process: it exists, and no longer holds the outbox.
    let closed = json(&segwal(&["inspect", "--json", d]));
    assert_eq!(closed["owner_pid"], std::process::id());
    assert_eq!(closed["owner_running"], false, "{closed}");
    // pid 1 exists on every Linux system.
    std::fs::write(dir.join("OWNER"), b"1").expect("write OWNER");
    let out = segwal(&["inspect", d]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("owner       pid 1 (not running)"), "{text}");
}

/// A frame of kind 6 (must be understood; none this build knows), with the
/// checksums of the segment `first_seq` under `nonce`, numbered `seq`: what
/// a newer build may write (docs/FORMAT.md, "Frames", "Frame kinds").
fn newer_builds_frame(first_seq: u64, nonce: u64, seq: u64) -> Vec<u8> {
    let payload = b"from a newer build";
    let mut frame = vec![0xC5, b'W', b'F', b'R', 0, 0, 0, 0, 0, 0, 0, 0];
    frame.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    frame.extend_from_slice(&[6, 1, 0, 0]); // kind 6, batch end, no ext
    frame.extend_from_slice(&0u32.to_le_bytes()); // reserved
    frame.extend_from_slice(&seq.to_le_bytes());
    frame.extend_from_slice(&seq.to_le_bytes()); // group
    frame.extend_from_slice(&1u64.to_le_bytes()); // timestamp
    let mut salt = crc32fast::Hasher::new();
    salt.update(&nonce.to_le_bytes());
    salt.update(&first_seq.to_le_bytes());
    let salt = salt.finalize();
    let mut header_crc = crc32fast::Hasher::new_with_initial(salt);
    header_crc.update(&frame[12..48]);
    frame[8..12].copy_from_slice(&header_crc.finalize().to_le_bytes());
    frame.extend_from_slice(payload);
    let mut crc = crc32fast::Hasher::new_with_initial(salt);
    crc.update(&frame[8..]);
    frame[4..8].copy_from_slice(&crc.finalize().to_le_bytes());
    frame
}

/// Ends the newest segment `newest`, whose last record is `last`, with a
/// frame a newer build wrote, as its next write batch (on a fresh block:
/// docs/FORMAT.md, "Blocks"), checksummed with the segment's header.
fn end_with_a_newer_builds_frame(newest: &Path, last: segwal::Seq) {
    let mut bytes = std::fs::read(newest).expect("read");
    let first_seq = u64::from_le_bytes(bytes[16..24].try_into().expect("8 bytes"));
    let nonce = u64::from_le_bytes(bytes[48..56].try_into().expect("8 bytes"));
    bytes.resize(bytes.len().next_multiple_of(4096), 0);
    bytes.extend(newer_builds_frame(first_seq, nonce, last.get() + 1));
    std::fs::write(newest, &bytes).expect("write");
}

/// A log whose newest segment ends with a frame a newer build wrote is no
/// damage: `verify`, `dump` and `repair --yes` exit 2 saying so, and change
/// nothing (a repair dropped it, and the records of its batch, until
/// 2026-12-07).
#[test]
fn a_newer_builds_frame_is_not_damage_and_no_repair_drops_it() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("outbox");
    let outbox = Outbox::open(&dir, Options::default()).expect("open");
    let mut last = segwal::Seq::from(0);
    for i in 0..3 {
        last = outbox.append(format!("r{i}").as_bytes()).expect("append");
    }
    outbox.close().expect("close");
    end_with_a_newer_builds_frame(&segments(&dir).pop().expect("a segment"), last);
    let before = snapshot(&dir);
    let path = dir.to_str().expect("utf-8");
    for args in [&["verify"][..], &["dump"][..], &["repair", "--yes"][..]] {
        let out = segwal(&[args, &[path][..]].concat());
        assert_eq!(out.status.code(), Some(2), "{args:?}: {out:?}");
        let said = [out.stdout.as_slice(), &out.stderr].concat();
        let said = String::from_utf8_lossy(&said);
        assert!(
            said.contains("unsupported frame kind 0x6"),
            "{args:?}: {said}"
        );
        assert!(said.contains("this is not damage"), "{args:?}: {said}");
    }
    assert_eq!(snapshot(&dir), before);
    assert!(!dir.join("quarantine").exists());
}

/// Real damage beside a newer build's frame is damage: `verify` exits 1 and
/// says so, with a note on the newer frame, and `repair --yes` changes
/// nothing (a lossy recovery would set the newer frame's segment aside with
/// the rest; both said "not damage", exit 2, until 2026-12-07).
#[test]
fn damage_beside_a_newer_builds_frame_is_damage() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("outbox");
    let outbox = Outbox::open(&dir, Options::default().segment_bytes(64 << 10)).expect("open");
    let mut last = segwal::Seq::from(0);
    for i in 0..40u8 {
        last = outbox.append(&[i; 2000]).expect("append");
    }
    outbox.close().expect("close");
    let mut segs = segments(&dir);
    assert!(segs.len() >= 3, "{segs:?}");
    // A bit of the first record's payload, in the oldest, sealed segment.
    let oldest = segs.remove(0);
    let mut bytes = std::fs::read(&oldest).expect("read");
    bytes[4096 + 100] ^= 0x10;
    std::fs::write(&oldest, &bytes).expect("write");
    end_with_a_newer_builds_frame(&segs.pop().expect("a newest segment"), last);
    let before = snapshot(&dir);
    let path = dir.to_str().expect("utf-8");
    for args in [&["verify"][..], &["repair", "--yes"][..]] {
        let out = segwal(&[args, &[path][..]].concat());
        assert_eq!(out.status.code(), Some(1), "{args:?}: {out:?}");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(stdout.contains("damage found:"), "{args:?}: {stdout}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("this is not damage"), "{args:?}: {stderr}");
        assert!(
            stderr.contains("also holds what this build does not read"),
            "{args:?}: {stderr}"
        );
    }
    assert_eq!(snapshot(&dir), before);
    assert!(!dir.join("quarantine").exists());
}
