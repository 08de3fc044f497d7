//! The `segwal` command, run as a person would: on real directories (clean,
//! damaged, foreign, and one being written by a running outbox), checking
//! exit codes, what it prints, and that it changes nothing.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use segwal::{Options, Outbox};

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
    // every pending record (1,500) and some acknowledged ones.
    assert_eq!(v["records"], records);
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

#[test]
fn verify_names_the_file_offset_and_seq_of_damage_and_changes_nothing() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("outbox");
    written(&dir);
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
    assert_eq!(snapshot(&dir), before, "verify changes nothing");
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
    assert_eq!(snapshot(&dir), before);

    let out = segwal(&["verify", name.to_str().expect("utf-8")]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "a file is not an outbox directory"
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a directory"));
}

#[test]
fn read_only_commands_work_while_the_owner_appends() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("outbox");
    let outbox = Outbox::open(&dir, Options::default().segment_bytes(1 << 20)).expect("open");
    let stop = std::sync::atomic::AtomicBool::new(false);
    let outputs = std::thread::scope(|s| {
        s.spawn(|| {
            let mut i = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                outbox.append(&[b'w'; 700]).expect("append while inspected");
                i += 1;
                if i.is_multiple_of(64) {
                    for r in outbox.claim(64).expect("claim") {
                        outbox.ack(r.seq()).expect("ack");
                    }
                }
            }
        });
        std::thread::sleep(Duration::from_millis(200));
        let mut outputs = Vec::new();
        for _ in 0..5 {
            outputs.push(segwal(&["verify", "--json", dir.to_str().expect("utf-8")]));
            std::thread::sleep(Duration::from_millis(50));
        }
        // Stopped before anything is asserted: a failed assertion must not
        // leave the appender running (the scope would wait for it forever).
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
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
        for payload in [&b"webhook 1"[..], b"webhook 2", b"webhook 3"] {
            outbox.append(payload).expect("append");
        }
        let records = outbox.claim(3).expect("claim");
        outbox
            .dead_letter(records[0].seq(), "HTTP 410 Gone")
            .expect("dead letter");
        outbox
            .dead_letter(records[2].seq(), "invalid URL")
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
        [records[0].seq().get(), records[2].seq().get()]
    };

    let out = segwal(&["dead-letters", d, "list", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let list = json(&out);
    let list = list.as_array().expect("array");
    assert_eq!(list.len(), 2);
    assert_eq!(list[0]["seq"], seqs[0]);
    assert_eq!(list[0]["reason"], "HTTP 410 Gone");
    assert_eq!(list[0]["payload"], "webhook 1");
    assert_eq!(list[1]["reason"], "invalid URL");

    let out = segwal(&["dead-letters", d, "requeue", &seqs[0].to_string()]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let out = segwal(&["dead-letters", d, "discard", &seqs[1].to_string()]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let out = segwal(&["dead-letters", d, "discard", "999999"]);
    assert_eq!(out.status.code(), Some(1), "an unknown seq is an error");

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

#[test]
fn repair_says_what_it_drops_then_keeps_the_damaged_file_aside() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("outbox");
    let d = dir.to_str().expect("utf-8");
    written(&dir);
    // A record in the middle of a sealed segment (the newest is the next
    // one): a repair drops from there on.
    let segs = segments(&dir);
    assert!(segs.len() >= 2, "{segs:?}");
    let sealed = segs[segs.len() - 2].clone();
    let mut bytes = std::fs::read(&sealed).expect("read");
    let at = bytes.len() / 2;
    bytes[at] ^= 0x40;
    std::fs::write(&sealed, &bytes).expect("write");
    let damaged = bytes;
    let before = snapshot(&dir);

    let out = segwal(&["repair", d]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stdout.contains("a repair drops seqs") && stdout.contains("--yes"),
        "{stdout}{stderr}"
    );
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
