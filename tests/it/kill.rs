//! Real process kills: a child process appends from several threads and is
//! killed with SIGKILL at a random moment (while it opens, or while it
//! appends); every append it saw succeed is recovered byte for byte, in order,
//! and the only records recovered beyond them are whole batches that were in
//! flight at the kill. The runs share one directory, so later runs also recover
//! what earlier kills left behind, including kills in the middle of recovery.

use std::collections::{BTreeSet, HashMap};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use segwal::sim::Rng;
use segwal::{Durability, Options, Outbox, Seq};

use crate::{drain, tmp};

/// Set in the environment of the child process: `<seed>:<run>:<directory>`.
const CHILD_ENV: &str = "SEGWAL_TEST_KILL_CHILD";
/// How many kills the test runs.
const RUNS_ENV: &str = "SEGWAL_KILL_RUNS";
/// The first seed; without it the test picks one from the clock and prints it.
const SEED_ENV: &str = "SEGWAL_KILL_SEED";
/// About 17 ms a run on two slow cores: some 20 s.
const DEFAULT_RUNS: u64 = 1000;
/// Starts every line the child reports (the test harness may print its own text
/// before it on the same line).
const MARKER: &str = "segwal-kill: ";
/// Producer threads of most children; one in four has [`MANY_PRODUCERS`].
const PRODUCERS: u64 = 4;
/// Enough producers for batches of more than 64, whose producers the writer's
/// notifier thread wakes.
const MANY_PRODUCERS: u64 = 72;
const MAX_BATCH: u64 = 4;
/// The child stops by itself after this long, should the parent never kill it.
const CHILD_LIFETIME: Duration = Duration::from_secs(20);
const SIGKILL: i32 = 9;

/// Which record a payload is: the `index`-th record of `producer` in `run`, one
/// of the `batch_len` records of the append starting at its `batch_first`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Key {
    run: u64,
    producer: u64,
    index: u64,
    batch_first: u64,
    batch_len: u64,
}

impl Key {
    /// The payload of this record: its key in text, then 0 to 1999 bytes derived
    /// from the key, so that any damaged or misplaced byte is noticed.
    fn payload(&self) -> Vec<u8> {
        let Key {
            run,
            producer,
            index,
            batch_first,
            batch_len,
        } = *self;
        let mut p =
            format!("kill {run} {producer} {index} {batch_first} {batch_len};").into_bytes();
        let mut rng = Rng::new(run ^ (producer << 56) ^ (index << 20));
        let filler = rng.below(2000);
        p.extend((0..filler).map(|_| rng.next_u64() as u8));
        p
    }

    /// The key of a payload made by [`Key::payload`]; `None` for any other bytes.
    fn parse(payload: &[u8]) -> Option<Key> {
        let end = payload.iter().position(|&b| b == b';')?;
        let text = std::str::from_utf8(&payload[..end]).ok()?;
        let mut fields = text.strip_prefix("kill ")?.split(' ');
        let mut field = || fields.next()?.parse::<u64>().ok();
        let key = Key {
            run: field()?,
            producer: field()?,
            index: field()?,
            batch_first: field()?,
            batch_len: field()?,
        };
        (key.payload() == payload).then_some(key)
    }

    /// Every record of this record's append.
    fn batch(&self) -> impl Iterator<Item = Key> {
        let key = *self;
        (key.batch_first..key.batch_first + key.batch_len).map(move |index| Key { index, ..key })
    }
}

/// How a run's child opens the outbox, derived from the run's seed so that the
/// parent knows it too.
struct RunConfig {
    segment_bytes: u64,
    durability: Durability,
    /// Whether the child also claims and acknowledges records while it appends,
    /// so that kills land in segment deletion too.
    relay: bool,
    /// Producer threads.
    producers: u64,
}

impl RunConfig {
    fn new(seed: u64) -> RunConfig {
        let mut rng = Rng::new(seed ^ 0xC0F1_6000);
        // Small segments rotate every few appends, so kills land in rotations.
        let segment_bytes = [8 << 10, 32 << 10, 256 << 10][rng.below(3) as usize];
        // A process crash loses nothing under Buffered either: the page cache
        // survives it.
        let durability = if rng.below(2) == 0 {
            Durability::Buffered
        } else {
            Durability::Sync
        };
        let relay = rng.below(3) == 0;
        let producers = if rng.below(4) == 0 {
            MANY_PRODUCERS
        } else {
            PRODUCERS
        };
        RunConfig {
            segment_bytes,
            durability,
            relay,
            producers,
        }
    }

    fn options(&self) -> Options {
        Options::default()
            .segment_bytes(self.segment_bytes)
            .durability(self.durability)
    }
}

/// Writes `text` (whole lines) to stdout and flushes it; false once the parent
/// stopped reading, so that the child stops instead of panicking.
fn report(text: &str) -> bool {
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes()).is_ok() && out.flush().is_ok()
}

/// The child half of the kill test: appends until it is killed. Without its
/// environment variable (an ordinary test run) it has nothing to do.
#[test]
fn child_process_appending_until_killed() {
    let Some(spec) = std::env::var_os(CHILD_ENV) else {
        return;
    };
    let spec = spec.into_string().expect("child spec is UTF-8");
    let mut parts = spec.splitn(3, ':');
    let seed: u64 = parts.next().and_then(|s| s.parse().ok()).expect("seed");
    let run: u64 = parts.next().and_then(|s| s.parse().ok()).expect("run");
    let dir = parts.next().expect("directory").to_owned();
    let config = RunConfig::new(seed);

    // The harness prints the test name first, without a newline.
    if !report(&format!("\n{MARKER}opening\n")) {
        return;
    }
    let outbox = Outbox::open(&dir, config.options()).expect("child open");
    let torn = u8::from(outbox.recovery_report().torn_tail.is_some());
    if !report(&format!("{MARKER}ready torn={torn}\n")) {
        return;
    }
    let stop = Arc::new(AtomicBool::new(false));
    let mut threads: Vec<_> = (0..config.producers)
        .map(|producer| {
            let outbox = outbox.clone();
            let stop = stop.clone();
            thread::spawn(move || produce(&outbox, seed, run, producer, &stop))
        })
        .collect();
    if config.relay {
        let outbox = outbox.clone();
        let stop = stop.clone();
        threads.push(thread::spawn(move || relay(&outbox, &stop)));
    }
    let started = Instant::now();
    while !stop.load(Ordering::SeqCst) && started.elapsed() < CHILD_LIFETIME {
        thread::sleep(Duration::from_millis(10));
    }
    stop.store(true, Ordering::SeqCst);
    for t in threads {
        t.join().expect("child thread");
    }
    let _ = outbox.close();
}

/// One producer of the child: appends single records and small batches, and
/// reports every acknowledged record as `ok <seq> <key>` as soon as its append
/// returned.
fn produce(outbox: &Outbox, seed: u64, run: u64, producer: u64, stop: &AtomicBool) {
    let mut rng = Rng::new(seed ^ ((producer + 1) << 40));
    let mut index = 0;
    while !stop.load(Ordering::SeqCst) {
        let batch_len = if rng.below(3) == 0 {
            1 + rng.below(MAX_BATCH)
        } else {
            1
        };
        let first = Key {
            run,
            producer,
            index,
            batch_first: index,
            batch_len,
        };
        let keys: Vec<Key> = first.batch().collect();
        let payloads: Vec<Vec<u8>> = keys.iter().map(Key::payload).collect();
        let outcome = if batch_len == 1 && rng.below(2) == 0 {
            outbox.append(&payloads[0]).map(|seq| vec![seq])
        } else {
            outbox.append_batch(&payloads)
        };
        let failed = outcome.is_err();
        let text = match outcome {
            Ok(seqs) => seqs
                .iter()
                .zip(&keys)
                .map(|(seq, k)| {
                    format!(
                        "{MARKER}ok {seq} {} {} {} {} {}\n",
                        k.run, k.producer, k.index, k.batch_first, k.batch_len
                    )
                })
                .collect::<String>(),
            Err(e) => format!("{MARKER}error {e}\n"),
        };
        if !report(&text) || failed {
            stop.store(true, Ordering::SeqCst);
            return;
        }
        index += batch_len;
    }
}

/// The child's relay: claims and acknowledges, reporting each record as
/// `acking <seq>` before acknowledging it (after the ack its segment may go).
fn relay(outbox: &Outbox, stop: &AtomicBool) {
    while !stop.load(Ordering::SeqCst) {
        let records = match outbox.claim_wait(64, Duration::from_millis(5)) {
            Ok(records) => records,
            Err(e) => {
                let _ = report(&format!("{MARKER}error relay claim: {e}\n"));
                stop.store(true, Ordering::SeqCst);
                return;
            }
        };
        let seqs: Vec<Seq> = records.iter().map(|r| r.seq()).collect();
        let text: String = seqs
            .iter()
            .map(|s| format!("{MARKER}acking {s}\n"))
            .collect();
        if !report(&text) {
            stop.store(true, Ordering::SeqCst);
            return;
        }
        if let Err(e) = outbox.ack_many(&seqs) {
            let _ = report(&format!("{MARKER}error relay ack: {e}\n"));
            stop.store(true, Ordering::SeqCst);
            return;
        }
    }
}

/// Kills and reaps the child if the parent gives up on it early (a failed
/// assertion), so that no child outlives the test.
struct Reaper(Child);

impl Drop for Reaper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Sends every complete line of `stream` (a line cut by the kill is dropped).
fn lines_of(stream: impl Read + Send + 'static) -> Receiver<String> {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let mut reader = BufReader::new(stream);
        let mut line = Vec::new();
        loop {
            line.clear();
            match reader.read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => return,
                Ok(_) if line.ends_with(b"\n") => {
                    let text = String::from_utf8_lossy(&line).trim_end().to_owned();
                    if tx.send(text).is_err() {
                        return;
                    }
                }
                Ok(_) => return,
            }
        }
    });
    rx
}

/// The part of a line after the marker, if it is one of the child's.
fn message(line: &str) -> Option<&str> {
    line.find(MARKER).map(|at| &line[at + MARKER.len()..])
}

/// When a run kills its child.
#[derive(Clone, Copy, Debug)]
enum KillAt {
    /// At once, maybe before the child even started.
    Spawn,
    /// After the child said it is opening the outbox, in recovery: this many
    /// thousandths of the time an open recently took (up to 1.5 times it).
    Opening { per_mille: u64 },
    /// Up to 30 ms after the child said the outbox is open: while it appends.
    Appending(Duration),
}

impl KillAt {
    fn choose(rng: &mut Rng, in_recovery_often: bool) -> KillAt {
        let opening = if in_recovery_often { 6 } else { 3 };
        match rng.below(10) {
            0 => KillAt::Spawn,
            n if n < opening => KillAt::Opening {
                per_mille: rng.below(1500),
            },
            _ => KillAt::Appending(Duration::from_micros(rng.below(30_000))),
        }
    }
}

/// What one child reported before it died.
#[derive(Default)]
struct ChildReport {
    /// Whether its own recovery cut a torn tail.
    torn_tail: bool,
    /// How long its open took, as the parent saw it, if it finished.
    open_time: Option<Duration>,
    /// Acknowledged appends: (seq, key), in the order the child reported them.
    ok: Vec<(u64, Key)>,
    /// Records the child's relay acknowledged, or was about to.
    acking: Vec<u64>,
    /// Its producer threads (set by the parent, from the run's seed).
    producers: u64,
}

/// Runs one child on `dir`, kills it, and returns what it reported.
/// `open_time` is about how long a child's open takes, to aim kills at it.
fn run_child(
    dir: &Path,
    seed: u64,
    run: u64,
    kill_at: KillAt,
    open_time: Duration,
    ctx: &str,
) -> ChildReport {
    let exe = crate::this_binary();
    let child = Command::new(exe)
        .args([
            "--exact",
            "kill::child_process_appending_until_killed",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, format!("{seed}:{run}:{}", dir.display()))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn child");
    let mut child = Reaper(child);
    let lines = lines_of(child.0.stdout.take().expect("child stdout"));
    let stderr = {
        let mut stream = child.0.stderr.take().expect("child stderr");
        thread::spawn(move || {
            let mut text = String::new();
            let _ = stream.read_to_string(&mut text);
            text
        })
    };
    let mut seen = Vec::new();
    // Waits for the line starting with `what`; when it came, if it came.
    let mut wait_for = |what: &str| {
        for line in lines.iter() {
            let found = message(&line).is_some_and(|m| m.starts_with(what));
            seen.push(line);
            if found {
                return Some(Instant::now());
            }
        }
        None
    };
    let mut measured = None;
    match kill_at {
        KillAt::Spawn => {}
        KillAt::Opening { per_mille } => {
            wait_for("opening");
            thread::sleep(open_time * 3 / 2 * per_mille as u32 / 1500);
        }
        KillAt::Appending(delay) => {
            let opening = wait_for("opening");
            if let (Some(opening), Some(ready)) = (opening, wait_for("ready")) {
                measured = Some(ready - opening);
            }
            thread::sleep(delay);
        }
    }
    // SIGKILL; fails only if the child already exited, which `wait` shows.
    let _ = child.0.kill();
    let status = child.0.wait().expect("wait for the child");
    seen.extend(lines.iter());
    let stderr = stderr.join().expect("stderr reader");
    assert!(
        status.signal() == Some(SIGKILL) || status.success(),
        "{ctx}: the child failed ({status}):\n{stderr}\nfiles:{}",
        listing(dir)
    );

    let mut report = ChildReport {
        open_time: measured,
        ..ChildReport::default()
    };
    for line in &seen {
        let Some(message) = message(line) else {
            continue;
        };
        let fields: Vec<&str> = message.split(' ').collect();
        match fields[..] {
            ["opening"] | ["ready", "torn=0"] => {}
            ["ready", "torn=1"] => report.torn_tail = true,
            ["ok", seq, run, producer, index, batch_first, batch_len] => {
                let n = |s: &str| s.parse::<u64>().expect("a number in an ok line");
                let key = Key {
                    run: n(run),
                    producer: n(producer),
                    index: n(index),
                    batch_first: n(batch_first),
                    batch_len: n(batch_len),
                };
                report.ok.push((n(seq), key));
            }
            ["acking", seq] => report
                .acking
                .push(seq.parse().expect("a number in an acking line")),
            _ => panic!("{ctx}: the child reported {message:?}\n{stderr}"),
        }
    }
    report
}

/// What the parent knows across runs.
#[derive(Default)]
struct Knowledge {
    /// Every sequence number ever tied to a record, and which record.
    keys: HashMap<u64, Key>,
    /// The sequence number of every record ever recovered or acknowledged.
    seqs: HashMap<Key, u64>,
    /// Records that must be recovered: acknowledged to a producer or handed out
    /// by a claim, and not acknowledged by a relay since.
    must: BTreeSet<u64>,
    /// Records a relay acknowledged (or was about to): they may be gone, also
    /// from the middle of a batch.
    acked: BTreeSet<u64>,
    /// Records whose acknowledgement is durable (the parent acknowledged them
    /// and closed cleanly): never delivered again.
    gone: BTreeSet<u64>,
}

impl Knowledge {
    /// Ties `seq` to `key`; they must not be tied to anything else.
    fn tie(&mut self, seq: u64, key: Key, ctx: &str) {
        let old = self.keys.insert(seq, key);
        assert!(
            old.is_none_or(|old| old == key),
            "{ctx}: seq {seq} was {old:?}, now {key:?}"
        );
        let old = self.seqs.insert(key, seq);
        assert!(
            old.is_none_or(|old| old == seq),
            "{ctx}: {key:?} was seq {old:?}, now seq {seq}"
        );
    }
}

/// The files of `dir` with their lengths, for a failure message.
fn listing(dir: &Path) -> String {
    let mut files: Vec<(String, u64)> = std::fs::read_dir(dir)
        .expect("read dir")
        .map(|e| {
            let e = e.expect("entry");
            let len = e.metadata().map_or(0, |m| m.len());
            (e.file_name().to_string_lossy().into_owned(), len)
        })
        .collect();
    files.sort();
    files
        .iter()
        .map(|(name, len)| format!("\n  {name}: {len} bytes"))
        .collect()
}

/// Totals printed at the end.
#[derive(Default, Debug)]
struct Totals {
    /// Children started and killed.
    runs: u64,
    /// Of them, children with [`MANY_PRODUCERS`] producers.
    runs_with_many_producers: u64,
    /// Reopens by the parent, each followed by a full check.
    checks: u64,
    /// Appends acknowledged to a child's producer, each checked at the next check.
    acknowledged_checked: u64,
    /// Records recovered that were in flight at a kill.
    in_doubt_recovered: u64,
    /// Torn tails cut by the parent's reopens.
    torn_tails_parent: u64,
    /// Torn tails cut by a child's own recovery (the run before was not checked).
    torn_tails_child: u64,
    kills_at_spawn: u64,
    kills_opening: u64,
    kills_appending: u64,
}

/// Checks what `outbox` recovered against `known` and the reports of the runs
/// since the last check; returns the recovered seqs, all claimed by `outbox`,
/// and how many of them no child had reported.
fn check_recovery(
    outbox: &Outbox,
    known: &mut Knowledge,
    runs: &[(u64, ChildReport)],
    ctx: &str,
) -> (Vec<Seq>, u64) {
    // Per producer of each run, the record after its last reported append: its
    // one append in flight at the kill starts there. (A kill can also cut the
    // report of an append short: the rest of that batch is not in `known`.)
    let mut in_flight: HashMap<(u64, u64), u64> = HashMap::new();
    for (run, report) in runs {
        for p in 0..report.producers {
            in_flight.insert((*run, p), 0);
        }
        for (_, key) in &report.ok {
            let next = in_flight.entry((*run, key.producer)).or_default();
            *next = (*next).max(key.batch_first + key.batch_len);
        }
    }
    let records = drain(outbox);
    let mut recovered = HashMap::new();
    let mut last = 0;
    let mut in_doubt = 0;
    for record in &records {
        let seq = record.seq().get();
        assert!(seq > last, "{ctx}: seq {seq} after seq {last}");
        last = seq;
        let key = Key::parse(record.payload()).unwrap_or_else(|| {
            panic!(
                "{ctx}: seq {seq} holds a payload no producer wrote: {:?}",
                String::from_utf8_lossy(&record.payload()[..record.payload().len().min(80)])
            )
        });
        if !known.keys.contains_key(&seq) {
            // Never acknowledged nor recovered before: it must be part of an
            // append in flight when the child of an unchecked run was killed.
            let next = in_flight.get(&(key.run, key.producer)).copied();
            let last_reported = next == Some(key.batch_first + key.batch_len);
            assert!(
                next == Some(key.batch_first) || last_reported,
                "{ctx}: seq {seq} is {key:?}, not an append in flight at the kill"
            );
            in_doubt += 1;
        }
        known.tie(seq, key, ctx);
        recovered.insert(key, seq);
    }
    for (key, &seq) in &recovered {
        for member in key.batch() {
            if recovered.contains_key(&member) {
                continue;
            }
            // A batch has contiguous sequence numbers, so a member's number is
            // known even when no report named it: a child's relay can claim and
            // acknowledge part of a batch before its producer reported the
            // append, and the kill can come in between.
            let member_seq = seq - key.index + member.index;
            known.tie(member_seq, member, ctx);
            assert!(
                known.acked.contains(&member_seq),
                "{ctx}: {key:?} (seq {seq}) recovered without {member:?} (seq {member_seq}) \
                 of its batch, which no relay acknowledged"
            );
        }
    }
    let back: Vec<u64> = records
        .iter()
        .map(|r| r.seq().get())
        .filter(|s| known.gone.contains(s))
        .collect();
    assert!(
        back.is_empty(),
        "{ctx}: records delivered again after a durable acknowledgement: {back:?}"
    );
    let seqs: BTreeSet<u64> = records.iter().map(|r| r.seq().get()).collect();
    let lost: Vec<u64> = known.must.difference(&seqs).copied().collect();
    assert!(lost.is_empty(), "{ctx}: durable records lost: {lost:?}");
    (records.iter().map(|r| r.seq()).collect(), in_doubt)
}

#[test]
fn acknowledged_appends_survive_sigkill_at_random_moments() {
    let runs: u64 = std::env::var(RUNS_ENV)
        .ok()
        .map(|s| s.parse().expect("SEGWAL_KILL_RUNS is a number"))
        .unwrap_or(DEFAULT_RUNS);
    let first_seed: u64 = std::env::var(SEED_ENV).ok().map_or_else(
        || {
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .expect("clock after 1970")
                .as_nanos() as u64
        },
        |s| s.parse().expect("SEGWAL_KILL_SEED is a number"),
    );
    println!("kill test: {runs} runs from seed {first_seed} ({SEED_ENV} to repeat)");
    let (_t, dir) = tmp();
    let mut known = Knowledge::default();
    let mut totals = Totals::default();
    // The runs since the parent last reopened and checked the directory.
    let mut unchecked: Vec<(u64, ChildReport)> = Vec::new();
    let mut history = String::new();
    // A running average of how long children take to open the directory.
    let mut open_time = Duration::from_millis(2);
    for run in 0..runs {
        let seed = first_seed.wrapping_add(run);
        let mut rng = Rng::new(seed);
        let config = RunConfig::new(seed);
        // After a run left its tail unrecovered, kill the next child in its own
        // recovery more often.
        let kill_at = KillAt::choose(&mut rng, !unchecked.is_empty());
        history += &format!("\n  run {run}: seed {seed}, kill {kill_at:?}");
        let ctx =
            format!("run {run} ({SEED_ENV}={first_seed}; runs since the last check:{history})");
        match kill_at {
            KillAt::Spawn => totals.kills_at_spawn += 1,
            KillAt::Opening { .. } => totals.kills_opening += 1,
            KillAt::Appending(_) => totals.kills_appending += 1,
        }
        let mut report = run_child(&dir, seed, run, kill_at, open_time, &ctx);
        report.producers = config.producers;
        if let Some(took) = report.open_time {
            open_time = (open_time * 7 + took) / 8;
        }
        totals.runs += 1;
        totals.runs_with_many_producers += u64::from(config.producers == MANY_PRODUCERS);
        totals.acknowledged_checked += report.ok.len() as u64;
        totals.torn_tails_child += u64::from(report.torn_tail);
        for &(seq, key) in &report.ok {
            assert_eq!(key.run, run, "{ctx}: the child reported another run");
            known.tie(seq, key, &ctx);
            known.must.insert(seq);
        }
        for seq in &report.acking {
            known.must.remove(seq);
            known.acked.insert(*seq);
        }
        unchecked.push((run, report));
        // Leave some kills' tails to the next child's recovery.
        if run + 1 < runs && rng.below(2) == 0 {
            continue;
        }

        let outbox = Outbox::open(&dir, config.options())
            .unwrap_or_else(|e| panic!("{ctx}: reopen after the kill: {e}{}", listing(&dir)));
        totals.checks += 1;
        totals.torn_tails_parent += u64::from(outbox.recovery_report().torn_tail.is_some());
        let (recovered, in_doubt) = check_recovery(&outbox, &mut known, &unchecked, &ctx);
        totals.in_doubt_recovered += in_doubt;
        unchecked.clear();
        history.clear();

        // Everything recovered was handed out, so it must survive until a relay
        // acknowledges it. Acknowledge none, all, or some, so that later runs
        // start from logs of different shapes, segment deletions included.
        known.must.extend(recovered.iter().map(|s| s.get()));
        let acked: Vec<Seq> = match rng.below(3) {
            0 => Vec::new(),
            1 => recovered,
            _ => recovered
                .into_iter()
                .filter(|_| rng.below(2) == 0)
                .collect(),
        };
        outbox.ack_many(&acked).expect("ack recovered records");
        for seq in &acked {
            known.must.remove(&seq.get());
            known.acked.insert(seq.get());
        }
        outbox
            .close()
            .unwrap_or_else(|e| panic!("{ctx}: close after the check: {e}"));
        // A clean close fsynced the acknowledgements.
        known.gone.extend(acked.iter().map(|s| s.get()));
    }
    // A last clean reopen: what the parent handed out and did not acknowledge
    // is still there.
    let outbox = Outbox::open(&dir, Options::default()).expect("final reopen");
    let seqs: BTreeSet<u64> = drain(&outbox).iter().map(|r| r.seq().get()).collect();
    let lost: Vec<u64> = known.must.difference(&seqs).copied().collect();
    assert!(
        lost.is_empty(),
        "records lost at the final reopen: {lost:?}"
    );
    println!("kill test totals: {totals:?}; a child's open took about {open_time:?}");
}
