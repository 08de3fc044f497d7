//! The `tracing` events (feature `tracing`): each life-cycle step an
//! operator wants in the service's logs is reported, with the fields that
//! say where. A binary of its own: the recording subscriber is the process's
//! global one, and the writer thread's events reach only a global subscriber.

use std::fs::OpenOptions;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use segwal::sim::{Fault, FaultRule, SimDisk};
use segwal::{Error, OpenCheck, Options, Outbox, RecoveryMode};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Metadata, Subscriber};

/// One event: its level, its message, and its other fields as `name=value`.
#[derive(Clone, Debug)]
struct Seen {
    level: tracing::Level,
    target: String,
    message: String,
    fields: Vec<String>,
}

#[derive(Default)]
struct Recorder(Arc<Mutex<Vec<Seen>>>);

/// An outbox that the subscriber reads (`stats()`) at each event, from a
/// thread of its own, as a monitoring layer might. An event reported while
/// the outbox's lock is held keeps that read waiting until the event returns:
/// the subscriber then notes the event in `BLOCKED` (it gives up after 20 s,
/// rather than hang as a read from the event's own thread would).
static WATCHED: Mutex<Option<Outbox>> = Mutex::new(None);
static BLOCKED: Mutex<Vec<String>> = Mutex::new(Vec::new());

thread_local! {
    /// Set on the reading thread: the events its own read reports are not
    /// checked again.
    static READING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Reads `outbox.stats()` from another thread; false if the read did not
/// come back while the event was being reported.
fn reads_during_event(outbox: Outbox) -> bool {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        READING.with(|r| r.set(true));
        let _ = outbox.stats();
        let _ = tx.send(());
    });
    rx.recv_timeout(Duration::from_secs(20)).is_ok()
}

struct Fields<'a>(&'a mut Seen);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.0.message = format!("{value:?}");
        } else {
            self.0.fields.push(format!("{}={value:?}", field.name()));
        }
    }
}

impl Subscriber for Recorder {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, event: &Event<'_>) {
        let mut seen = Seen {
            level: *event.metadata().level(),
            target: event.metadata().target().to_owned(),
            message: String::new(),
            fields: Vec::new(),
        };
        event.record(&mut Fields(&mut seen));
        let watched = WATCHED.lock().expect("watched").clone();
        if let Some(outbox) = watched
            && !READING.with(|r| r.get())
            && !reads_during_event(outbox)
        {
            BLOCKED.lock().expect("blocked").push(seen.message.clone());
        }
        self.0.lock().expect("events").push(seen);
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

struct Events(Arc<Mutex<Vec<Seen>>>);

impl Events {
    /// Takes the events recorded so far whose message contains `what`.
    fn take(&self, what: &str) -> Vec<Seen> {
        let mut all = self.0.lock().expect("events");
        let (found, rest) = all.drain(..).partition(|e| e.message.contains(what));
        *all = rest;
        found
    }

    /// Waits a little for an event from another thread (the writer's).
    fn wait_for(&self, what: &str) -> Vec<Seen> {
        for _ in 0..200 {
            let found = self.take(what);
            if !found.is_empty() {
                return found;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!(
            "no event {what:?}; events: {:#?}",
            self.0.lock().expect("events")
        );
    }
}

/// Claims and acknowledges every record handed out, then waits for the
/// acknowledgements (and the deletions they allow) to be durable.
fn ack_everything(outbox: &Outbox) {
    loop {
        let batch = outbox.claim(100).expect("claim");
        if batch.is_empty() {
            break;
        }
        for r in &batch {
            outbox.ack(r.seq()).expect("ack");
        }
    }
    outbox.sync().expect("sync");
}

fn has(e: &Seen, field: &str) -> bool {
    e.fields.iter().any(|f| f.starts_with(&format!("{field}=")))
}

fn main() {
    let events = Arc::new(Mutex::new(Vec::new()));
    tracing::subscriber::set_global_default(Recorder(events.clone())).expect("subscriber");
    let events = Events(events);
    life_cycle(&events);
    poisoning(&events);
    relocation(&events);
    quarantine(&events);
    lossy_drop(&events);
    corrupt_record(&events);
    leftover(&events);
    reentrant_reads(&events);
    println!("tracing: every event seen");
}

fn life_cycle(events: &Events) {
    let tmp = tempfile::tempdir().expect("temporary directory");
    let dir = tmp.path().join("outbox");
    let options = Options::default()
        .segment_bytes(16 * 4096)
        .lease(Duration::from_millis(30))
        .max_attempts(2);
    let outbox = Outbox::open(&dir, options.clone()).expect("open");
    let opened = events.take("outbox opened");
    assert_eq!(opened.len(), 1);
    assert_eq!(opened[0].level, tracing::Level::INFO);
    assert_eq!(opened[0].target, "segwal");
    assert!(
        has(&opened[0], "dir") && has(&opened[0], "records"),
        "{opened:?}"
    );

    // Rotation: 40 records appended one by one fill more than two segments.
    for i in 0..40u32 {
        outbox.append(&i.to_le_bytes()).expect("append");
    }
    let sealed = events.wait_for("segment sealed");
    assert!(sealed.len() >= 2, "{sealed:?}");
    assert!(has(&sealed[0], "sealed") && has(&sealed[0], "last_seq"));

    // A dead letter parked by the relay.
    let first = outbox.claim(1).expect("claim");
    outbox
        .dead_letter(first[0].seq(), "422 from the webhook")
        .expect("dead letter");
    let dead = events.take("dead letter");
    assert_eq!(dead.len(), 1);
    assert!(
        dead[0]
            .fields
            .iter()
            .any(|f| f.contains("422 from the webhook")),
        "{dead:?}"
    );

    // A lease runs out twice: the second time the record is past
    // max_attempts and becomes a dead letter by itself.
    let second = outbox.claim(1).expect("claim")[0].seq();
    std::thread::sleep(Duration::from_millis(60));
    assert_eq!(outbox.claim(1).expect("claim")[0].seq(), second);
    let expired = events.take("leases ran out");
    assert_eq!(expired.len(), 1);
    assert!(
        expired[0].fields.contains(&"records=1".to_owned()),
        "{expired:?}"
    );
    std::thread::sleep(Duration::from_millis(60));
    let next = outbox.claim(1).expect("claim");
    assert_ne!(next[0].seq(), second);
    let parked = events.take("max_attempts");
    assert_eq!(parked.len(), 1, "{parked:?}");
    assert!(parked[0].fields.contains(&format!("seq={}", second.get())));
    outbox.release(next[0].seq()).expect("release");

    // Deletion: everything else acknowledged.
    ack_everything(&outbox);
    let deleted = events.wait_for("acknowledged segment deleted");
    assert!(!deleted.is_empty());
    assert!(has(&deleted[0], "path") && has(&deleted[0], "log_start"));
    // Recycling: the next rotation writes into a deleted segment's file.
    for i in 0..40u32 {
        outbox.append(&i.to_le_bytes()).expect("append");
    }
    let recycled = events.wait_for("acknowledged segment recycled");
    assert_eq!(recycled[0].level, tracing::Level::DEBUG);
    assert!(
        has(&recycled[0], "from") && has(&recycled[0], "to"),
        "{recycled:?}"
    );
    outbox.close().expect("close");
    truncation(events, &tmp.path().join("fresh"));
}

/// Truncation: a log whose newest segment ends inside its last record (a
/// write batch cut short) opens with that record cut off, and says so.
fn truncation(events: &Events, dir: &std::path::Path) {
    let outbox = Outbox::open(dir, Options::default()).expect("open");
    for i in 0..10u8 {
        outbox.append(&[i; 100]).expect("append");
    }
    outbox.close().expect("close");
    let seg = std::fs::read_dir(dir)
        .expect("read dir")
        .map(|e| e.expect("entry").path())
        .find(|p| p.extension().is_some_and(|e| e == "seg"))
        .expect("a segment");
    // The file runs on past its last frame in preallocated zeros; the last
    // record's payload (bytes of 9) ends its data.
    let bytes = std::fs::read(&seg).expect("read");
    let end = bytes
        .iter()
        .rposition(|&b| b == 9)
        .expect("the last record") as u64
        + 1;
    let f = OpenOptions::new().write(true).open(&seg).expect("open");
    f.set_len(end - 3).expect("cut");
    drop(f);
    events.take("");
    let outbox = Outbox::open(dir, Options::default()).expect("torn tail opens");
    let torn = events.take("torn tail truncated");
    assert_eq!(torn.len(), 1, "{:?}", outbox.recovery_report());
    assert_eq!(torn[0].level, tracing::Level::WARN);
    assert!(
        torn[0]
            .fields
            .iter()
            .any(|f| f.starts_with("path=") && f.contains(".seg"))
    );
    assert!(has(&torn[0], "offset"));
    assert_eq!(events.take("outbox opened").len(), 1);
    outbox.close().expect("close");
}

fn poisoning(events: &Events) {
    let disk = SimDisk::new(3);
    let outbox = Outbox::open_with_storage("/outbox", Options::default(), Arc::new(disk.clone()))
        .expect("open");
    outbox.append(b"durable").expect("append");
    disk.inject(FaultRule {
        fault: Fault::SyncEio,
        at_op: disk.ops(),
        persistent: true,
    });
    assert!(matches!(
        outbox.append(b"lost"),
        Err(Error::Poisoned { .. })
    ));
    let poisoned = events.wait_for("outbox poisoned");
    assert_eq!(poisoned.len(), 1, "poisoning is reported once");
    assert_eq!(poisoned[0].level, tracing::Level::ERROR);
    assert!(
        poisoned[0].fields.contains(&"op=\"fsync\"".to_owned()),
        "{poisoned:?}"
    );
    let _ = outbox.close();
}

/// Relocation: one dead letter in the oldest segment, everything around it
/// acknowledged, is carried forward so that its segment can go.
fn relocation(events: &Events) {
    let tmp = tempfile::tempdir().expect("temporary directory");
    let options = Options::default().segment_bytes(64 << 10);
    let outbox = Outbox::open(tmp.path(), options).expect("open");
    events.take("");
    let payload = [b'x'; 200];
    let mut dead = None;
    for _ in 0..30 {
        let batch: Vec<&[u8]> = vec![&payload[..]; 100];
        outbox.append_batch(&batch).expect("append_batch");
        for record in outbox.claim(100).expect("claim") {
            if dead.is_none() {
                dead = Some(record.seq());
                outbox
                    .dead_letter(record.seq(), "refused")
                    .expect("dead letter");
            } else {
                outbox.ack(record.seq()).expect("ack");
            }
        }
        outbox.sync().expect("sync");
    }
    let moved = events.wait_for("records carried forward");
    assert_eq!(moved[0].level, tracing::Level::INFO);
    assert!(
        has(&moved[0], "from") && moved[0].fields.iter().any(|f| f.starts_with("records=")),
        "{moved:?}"
    );
    assert!(outbox.stats().relocated >= 1);
    outbox.close().expect("close");
}

/// Quarantine: a lossy open sets a file it cannot read as a segment aside
/// (never deletes it), and says where it went.
fn quarantine(events: &Events) {
    let tmp = tempfile::tempdir().expect("temporary directory");
    let outbox = Outbox::open(tmp.path(), Options::default()).expect("open");
    outbox.append(b"kept").expect("append");
    outbox.close().expect("close");
    let foreign = tmp.path().join("00000000000000100000.seg");
    std::fs::write(&foreign, b"a file another program left here").expect("write");
    events.take("");
    let lossy = Options::default().recovery(RecoveryMode::Lossy);
    let outbox = Outbox::open(tmp.path(), lossy).expect("lossy open");
    let aside = events.take("set aside in quarantine");
    assert_eq!(aside.len(), 1, "{:?}", outbox.recovery_report());
    assert_eq!(aside[0].level, tracing::Level::WARN);
    assert!(
        aside[0]
            .fields
            .iter()
            .any(|f| f.starts_with("from=") && f.contains("00000000000000100000.seg"))
            && has(&aside[0], "to"),
        "{aside:?}"
    );
    outbox.close().expect("close");
}

/// Forty records of 200 bytes, each appended alone, in small segments
/// without index checkpoints (so each starts a block of its own), closed:
/// the options and the segment files, oldest first.
fn forty_records(dir: &std::path::Path) -> (Options, Vec<std::path::PathBuf>) {
    let options = Options::default()
        .segment_bytes(64 << 10)
        .checkpoint_bytes(0);
    let outbox = Outbox::open(dir, options.clone()).expect("open");
    for i in 0..40u8 {
        outbox.append(&[i; 200]).expect("append");
    }
    outbox.close().expect("close");
    let mut segs: Vec<_> = std::fs::read_dir(dir)
        .expect("read dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "seg"))
        .collect();
    segs.sort();
    (options, segs)
}

/// A lossy open of a log damaged in the middle drops the records from the
/// damage on, and says which, where.
fn lossy_drop(events: &Events) {
    let tmp = tempfile::tempdir().expect("temporary directory");
    let (options, segs) = forty_records(tmp.path());
    // A bit of the fifth record's payload in the oldest, sealed segment.
    let mut bytes = std::fs::read(&segs[0]).expect("read");
    let at = 4096 * 5 + 100;
    bytes[at] ^= 0x10;
    std::fs::write(&segs[0], &bytes).expect("write");
    events.take("");
    let lossy = options
        .recovery(RecoveryMode::Lossy)
        .open_check(OpenCheck::EveryFrame);
    let outbox = Outbox::open(tmp.path(), lossy).expect("lossy open");
    let dropped = events.take("lossy recovery dropped records");
    assert_eq!(dropped.len(), 1, "{:?}", outbox.recovery_report());
    assert_eq!(dropped[0].level, tracing::Level::ERROR);
    assert!(
        ["path", "offset", "first_seq", "last_seq"]
            .iter()
            .all(|f| has(&dropped[0], f)),
        "{dropped:?}"
    );
    assert!(outbox.recovery_report().dropped.is_some());
    outbox.close().expect("close");
}

/// A record whose bytes fail their checksum when a claim reads it is set
/// aside for good: its claim's caller gets the error, and the service's log
/// a warning naming it.
fn corrupt_record(events: &Events) {
    let tmp = tempfile::tempdir().expect("temporary directory");
    let (options, segs) = forty_records(tmp.path());
    // A bit of the first record's payload, in the oldest, sealed segment,
    // which the default open reads through its seal index only.
    let mut bytes = std::fs::read(&segs[0]).expect("read");
    bytes[4096 + 100] ^= 0x10;
    std::fs::write(&segs[0], &bytes).expect("write");
    let outbox = Outbox::open(tmp.path(), options).expect("open");
    events.take("");
    let failed = outbox.claim(1).expect_err("the first record is corrupt");
    assert!(matches!(failed, segwal::Error::Corrupt { .. }), "{failed}");
    let seen = events.take("corrupt record set aside");
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0].level, tracing::Level::WARN);
    assert!(seen[0].fields.iter().any(|f| f == "seq=1"), "{seen:?}");
    assert!(has(&seen[0], "error"), "{seen:?}");
    assert_eq!(outbox.claim(1).expect("the next record")[0].seq().get(), 2);
    outbox.close().expect("close");
}

/// A leftover: a fully acknowledged segment whose deletion a crash cut short
/// (the log start moved past it, the file stayed) is removed by the next
/// open, which names it. The file left behind is made by putting back a copy
/// of the oldest segment, taken before its records were acknowledged.
fn leftover(events: &Events) {
    let tmp = tempfile::tempdir().expect("temporary directory");
    let options = Options::default()
        .segment_bytes(16 * 4096)
        .recycle_segments(false);
    let outbox = Outbox::open(tmp.path(), options.clone()).expect("open");
    for i in 0..40u32 {
        outbox.append(&i.to_le_bytes()).expect("append");
    }
    let oldest = tmp.path().join("00000000000000000001.seg");
    let copy = std::fs::read(&oldest).expect("the oldest segment, sealed");
    ack_everything(&outbox);
    events.wait_for("acknowledged segment deleted");
    outbox.close().expect("close");
    assert!(!oldest.exists(), "deleted once acknowledged");
    std::fs::write(&oldest, &copy).expect("put the copy back");
    events.take("");
    let outbox = Outbox::open(tmp.path(), options).expect("reopen");
    let removed = events.take("leftover segment removed");
    assert_eq!(removed.len(), 1, "{:?}", outbox.recovery_report());
    assert_eq!(removed[0].level, tracing::Level::INFO);
    assert!(
        removed[0]
            .fields
            .iter()
            .any(|f| f.starts_with("path=") && f.contains("00000000000000000001.seg")),
        "{removed:?}"
    );
    assert!(!oldest.exists(), "removed again");
    assert_eq!(outbox.stats().pending, 0, "nothing comes back");
    outbox.close().expect("close");
}

/// A subscriber may read the outbox while an event is reported: no event is
/// reported under the outbox's lock, neither from a claim (leases run out, a
/// record parked past `max_attempts`) nor from the writer thread (records
/// carried forward).
fn reentrant_reads(events: &Events) {
    let tmp = tempfile::tempdir().expect("temporary directory");
    let options = Options::default()
        .segment_bytes(64 << 10)
        .lease(Duration::from_millis(30))
        .max_attempts(2);
    let outbox = Outbox::open(tmp.path(), options).expect("open");
    events.take("");
    *WATCHED.lock().expect("watched") = Some(outbox.clone());

    // A lease runs out twice: reported by the claims that find it so.
    outbox.append(b"never acknowledged").expect("append");
    let seq = outbox.claim(1).expect("claim")[0].seq();
    std::thread::sleep(Duration::from_millis(60));
    assert_eq!(outbox.claim(1).expect("claim")[0].seq(), seq);
    not_blocked();
    assert_eq!(events.take("leases ran out").len(), 1);
    std::thread::sleep(Duration::from_millis(60));
    assert!(outbox.claim(1).expect("claim").is_empty());
    not_blocked();
    assert_eq!(events.take("max_attempts").len(), 1);

    // Relocation: the dead letter, alone in the oldest segment, is carried
    // forward by the writer thread.
    let payload = [b'x'; 200];
    for _ in 0..30 {
        let batch: Vec<&[u8]> = vec![&payload[..]; 100];
        outbox.append_batch(&batch).expect("append_batch");
        let seqs: Vec<_> = outbox
            .claim(100)
            .expect("claim")
            .iter()
            .map(|r| r.seq())
            .collect();
        outbox.ack_many(&seqs).expect("ack");
        outbox.sync().expect("sync");
    }
    events.wait_for("records carried forward");
    not_blocked();
    *WATCHED.lock().expect("watched") = None;
    outbox.close().expect("close");
}

/// No event so far was reported under the outbox's lock.
fn not_blocked() {
    let blocked = BLOCKED.lock().expect("blocked").clone();
    assert!(
        blocked.is_empty(),
        "reported under the outbox's lock: {blocked:?}"
    );
}
